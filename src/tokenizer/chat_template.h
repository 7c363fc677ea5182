// Chat templates: turn a list of messages into one prompt string.
//
// Contract: detect_chat_template() recognises the common families from the text
// of `tokenizer.chat_template` by the markers llama.cpp's
// llm_chat_detect_template uses, in its order: "<|im_start|>" -> ChatML, or
// Phi-4 when it has "<|im_sep|>";
// "[INST]" -> Llama-2 when the template has "<<SYS>>", otherwise a Mistral
// variant ("' [INST] ' + system_message" -> Mistral "v1"; "[AVAILABLE_TOOLS]"
// without " [INST]" -> Mistral "v3", or "v3-tekken" when it writes "\"[INST]\""
// with no space; plain "[INST]" -> the original Mistral-7B-Instruct template;
// "[SYSTEM_PROMPT]" first of all -> Mistral "v7", see below); "<|assistant|>"
// with "<|end|>" -> Phi-3 (which one: below); "<|user|>" with an end-of-turn token
// (eos_token, "</s>", "<|endoftext|>") -> Zephyr; "<start_of_turn>" -> Gemma;
// "<|start_header_id|>" and "<|end_header_id|>" -> Llama-3. A template text that
// is exactly one of the names below selects that family. Relatives that would
// render differently (GLM, Falcon-3) and anything else
// are NotFound, with a message that says to pass --chat-template NAME and lists
// the names. chat_template_from_name() maps user-facing names ("chatml",
// "llama2", "llama3", "zephyr", "mistral" (= "mistral-v1"), "mistral-v3",
// "mistral-v3-tekken", "mistral-legacy", "gemma", "mistral-v7",
// "mistral-v7-tekken", "phi3", "phi3-legacy", "phi4-mini", "phi4") and rejects
// others with InvalidArgument listing the valid names.
//
// Phi-3 detection: a template with no system turn at all is the April 2024
// Phi-3-mini one (phi3-legacy); one that writes a newline after the role
// marker ("<|user|>\n") is Phi-3 (June 2024) or Phi-3.5 (phi3); the rest,
// the role marker straight before the content, are Phi-4-mini's (phi4-mini).
// llama.cpp renders all three as its one "phi3" layout.
//
// Mistral v7 detection: llama.cpp's llm_chat_detect_template maps every
// template with "[SYSTEM_PROMPT]" to its "mistral-v7" (spaces after the control
// tokens) and reaches "mistral-v7-tekken" only by name, so without --jinja it
// renders Mistral Small 3.x (tekken) with spaces its template does not write.
// Here the same marker selects the v7 family and the template's own spacing
// picks the variant: "[INST] " or "[SYSTEM_PROMPT] " (a space after the
// token, as Mistral-Large-Instruct-2411's v7 writes) -> mistral-v7; neither
// (Mistral-Small-24B-Instruct-2501, Mistral-Small-3.1 and 3.2)
// -> mistral-v7-tekken.
//
// apply_chat_template() renders exactly what the reference Jinja template of the
// family renders (HF transformers semantics), including the BOS text where the
// template writes bos_token (so tokenize the result with add_bos=false and
// parse_special=true). Families and references:
//   chatml          OpenHermes/Qwen-style; no BOS; generation prompt "<|im_start|>assistant\n".
//   llama2          meta-llama/Llama-2-*-chat; "<s>[INST] <<SYS>>\n..\n<</SYS>>\n\n.. [/INST] .. </s>";
//                   no generation prompt (the reference has none).
//   llama3          Meta-Llama-3-*-Instruct; content trimmed; BOS "<|begin_of_text|>".
//                   (3.1+ templates add a dated system preamble that is not reproduced.)
//   zephyr          HuggingFaceH4/zephyr-7b-beta, TinyLlama-Chat; "<|role|>\n..</s>\n".
//   mistral         Mistral "v1": "<s> [INST] sys\n\nuser [/INST] answer</s> [INST] ..".
//   mistral-v3      Mistral "v3": "<s>[INST] user[/INST] answer</s>[INST] sys\n\nlast[/INST]".
//   mistral-legacy  original Mistral-7B-Instruct: "<s>[INST] user [/INST]answer</s>[INST] ..".
//   mistral-v3-tekken  Mistral-Nemo-Instruct-2407: v3 without the spaces:
//                   "<s>[INST]user[/INST]answer</s>[INST]sys\n\nlast[/INST]" (answer untrimmed).
//   gemma           Gemma 1-3; system folded into the first user turn as Gemma 3 does.
//   mistral-v7      Mistral "v7" (Mistral-Large-Instruct-2411), rendered as llama.cpp's
//                   built-in (non-jinja) renderer does, plus the template's BOS:
//                   "<s>[SYSTEM_PROMPT] sys[/SYSTEM_PROMPT][INST] user[/INST] answer</s>[INST] ..";
//                   each message where it stands (a system message anywhere
//                   becomes a [SYSTEM_PROMPT] block), content untrimmed. This is
//                   also exactly what Mistral-Large-Instruct-2411's template
//                   renders (tested against jinja2), with or without a system message.
//   phi3            Phi-3 (June 2024), Phi-3.5-mini: "<|role|>\n" content "<|end|>\n" per
//                   message (a system message with empty content is skipped);
//                   generation prompt "<|assistant|>\n", else eos_token ("<|endoftext|>").
//   phi3-legacy     Phi-3-mini (April 2024): BOS, then per user message "<|user|>\n"
//                   content "<|end|>\n<|assistant|>\n", per assistant message
//                   content "<|end|>\n". The reference has no system turn and
//                   drops system messages; so does this. No separate generation prompt.
//   phi4-mini       Phi-4-mini: "<|role|>" content "<|end|>" per message, no newlines;
//                   generation prompt "<|assistant|>", else eos_token.
//   phi4            Phi-4: "<|im_start|>role<|im_sep|>" content "<|im_end|>";
//                   generation prompt "<|im_start|>assistant<|im_sep|>".
//   mistral-v7-tekken  Mistral Small 3 / 3.1 / 3.2 (tekken vocabulary): v7 without
//                   the spaces: "<s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]user[/INST]answer</s>".
//                   With a leading system message this is exactly what the
//                   published templates render (tested against jinja2).
//   The published Mistral Small 3.x templates also write a default system
//   message when the conversation has none ("You are Mistral Small 3, ...
//   Your knowledge base was last updated on 2023-10-01. ...", to which 3.0 and
//   3.1 add "The current date is " + strftime_now("%Y-%m-%d")). Spillway, like llama.cpp without
//   --jinja, does not inject it: a conversation without a system message
//   renders with no [SYSTEM_PROMPT] block at all (the prompt then does not
//   depend on the day, so it renders the same after every resume). Clients
//   that want the model's default persona send it as the system message.
// Mistral/Llama-2/Gemma have no generation prompt of their own except Gemma's
// "<start_of_turn>model\n"; add_generation_prompt is ignored where the
// reference ignores it.
// Roles are "system", "user", "assistant"; any other is InvalidArgument naming
// it. Families that take a system prompt only as the first message (all but
// ChatML, Llama-3, Zephyr and Mistral v7) reject one elsewhere with InvalidArgument. Role
// alternation is not enforced (the references raise; we render as they would).
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw {

enum class ChatTemplateKind {
  kChatML,
  kLlama2,
  kLlama3,
  kZephyr,
  kMistral,
  kGemma,
  kMistralV3,
  kMistralLegacy,
  kMistralV3Tekken,
  kMistralV7,
  kMistralV7Tekken,
  kPhi3,
  kPhi3Legacy,
  kPhi4Mini,
  kPhi4,
};

// A tool call in an assistant message of the conversation (OpenAI's
// tool_calls[].function): the arguments as the reference templates' `tojson`
// renders the arguments object (Python json.dumps: ", " and ": " separators,
// keys in the client's order, non-ASCII as is).
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments_json;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ChatToolCall> tool_calls = {};  // role "assistant" only
  std::string tool_call_id = {};         // role "tool": the call it answers
};

// A tool the model may call (OpenAI's tools[] entry, {"type": "function",
// "function": {...}}), as the reference templates' `tojson` renders it:
// compact (Python's default separators) and with indent=4.
struct ChatTool {
  // One member of the tool's "function" object, in the client's order, as
  // Mistral's template writes it: a string as its raw text (the template
  // pastes it between quotes, unescaped), anything else through tojson.
  struct Field {
    std::string key;
    bool is_string = false;
    std::string text;
  };
  std::string name;
  std::string json;
  std::string json_indent4;
  std::vector<Field> function_fields = {};
};

// Tools and tool-call messages (role "tool", assistant tool_calls) are
// rendered by the families that define them, exactly as their reference
// templates do:
//   chatml  Qwen2.5-Instruct's template: a system turn with the request's
//           system message (Qwen's own default system line is not added:
//           this family is generic ChatML), then "# Tools" with each tool's
//           JSON inside <tools></tools> and the <tool_call> instructions;
//           assistant calls as "<tool_call>\n{\"name\": ..., \"arguments\":
//           ...}\n</tool_call>"; consecutive tool results in one user turn
//           inside <tool_response></tool_response>.
//   llama3  Llama-3.2-Instruct's template (3.1 and 3.3 render the same for
//           custom tools): the dated system header ("Environment: ipython",
//           "Cutting Knowledge Date: December 2023", "Today Date: 26 Jul
//           2024", the template's own default, so that a prompt renders the
//           same on every day and after every resume), the tools (indent=4)
//           and instructions in the first user message, an assistant call as
//           {"name": ..., "parameters": ...} (one call per message, as the
//           reference insists), tool results as ipython turns (content
//           through tojson, as the reference's `is iterable` test does for a
//           string).
//   mistral-v3 / mistral-v3-tekken  Mistral-7B-Instruct-v0.3's template and
//           Mistral-Nemo-Instruct-2407's (the same with no space after the
//           control tokens): "[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]" before
//           the last user message (each tool {"type": "function", "function":
//           {...}} from function_fields, "return" left out), assistant calls
//           as "[TOOL_CALLS] [{"name": N, "arguments": {...}, "id": I}, ...]"
//           + EOS, tool results as "[TOOL_RESULTS] {"content": C, "call_id":
//           I}[/TOOL_RESULTS]" (C pasted as is). Call ids must be 9 characters
//           (the reference raises otherwise; InvalidArgument here).
//   mistral-v7-tekken  Mistral-Small-3.1-24B-Instruct-2503's template: the
//           v3 forms with a space after [AVAILABLE_TOOLS], [TOOL_CALLS] and
//           [TOOL_RESULTS] (tekken or not), the system message after the
//           template's fixed parallel-call preamble and "\n\n" in the
//           [SYSTEM_PROMPT] block (the preamble alone without a system
//           message; the template would use its dated default there), call
//           ids of 9 or more characters cut to their last 9 (shorter:
//           InvalidArgument, the reference raises).
// Other families: tools, tool_calls or a "tool" message are InvalidArgument
// naming the family (they define no tool format Spillway renders). That
// includes mistral-v7 (Mistral-Large-2411): no published v7 template with
// tools was available to check a rendering against.
bool chat_template_renders_tools(ChatTemplateKind kind);

// bos_token / eos_token as the template sees them. Unset means the family's
// usual text: "<s>"/"</s>" (Llama-2, Mistral, Zephyr eos), "<|begin_of_text|>"
// (Llama-3), "<bos>" (Gemma). Pass the vocab's own texts when they differ
// (e.g. StableLM-Zephyr's "<|endoftext|>"), or "" to leave BOS out.
struct ChatSpecialTexts {
  std::optional<std::string> bos;
  std::optional<std::string> eos;
};

std::string_view chat_template_name(ChatTemplateKind kind);
Result<ChatTemplateKind> detect_chat_template(std::string_view template_text);
Result<ChatTemplateKind> chat_template_from_name(std::string_view name);
// `add_generation_prompt` appends the assistant turn opener. An unknown role is
// InvalidArgument naming it; a role the family cannot express (e.g. system for
// Gemma) is folded the way the reference template does.
Result<std::string> apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt);
Result<std::string> apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt, const ChatSpecialTexts& special);
Result<std::string> apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt, const ChatSpecialTexts& special,
                                        const std::vector<ChatTool>& tools);

// A string as JSON (Python json.dumps with ensure_ascii=False: quotes,
// backslash and control characters escaped, everything else as is).
std::string json_quote(std::string_view s);

}  // namespace spw
