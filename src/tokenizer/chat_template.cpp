// Chat template detection and rendering (see chat_template.h).
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <cstdio>

#include <array>

namespace spw {
namespace {

struct KindName {
  ChatTemplateKind kind;
  std::string_view name;
};

// Canonical names first; aliases after (chat_template_name returns the first).
constexpr std::array<KindName, 18> kNames = {{
    {ChatTemplateKind::kChatML, "chatml"},
    {ChatTemplateKind::kLlama2, "llama2"},
    {ChatTemplateKind::kLlama3, "llama3"},
    {ChatTemplateKind::kZephyr, "zephyr"},
    {ChatTemplateKind::kMistral, "mistral"},
    {ChatTemplateKind::kMistralV3, "mistral-v3"},
    {ChatTemplateKind::kMistralLegacy, "mistral-legacy"},
    {ChatTemplateKind::kMistralV3Tekken, "mistral-v3-tekken"},
    {ChatTemplateKind::kGemma, "gemma"},
    {ChatTemplateKind::kMistralV7, "mistral-v7"},
    {ChatTemplateKind::kMistralV7Tekken, "mistral-v7-tekken"},
    {ChatTemplateKind::kPhi3, "phi3"},
    {ChatTemplateKind::kPhi3Legacy, "phi3-legacy"},
    {ChatTemplateKind::kPhi4Mini, "phi4-mini"},
    {ChatTemplateKind::kPhi4, "phi4"},
    {ChatTemplateKind::kMistral, "mistral-v1"},
    {ChatTemplateKind::kLlama2, "llama2-sys"},
    {ChatTemplateKind::kGemma, "gemma3"},
}};

std::string valid_names() {
  std::string s;
  for (const auto& kn : kNames) {
    if (!s.empty()) s += ", ";
    s += kn.name;
  }
  return s;
}

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

// Python str.strip() / Jinja trim for the ASCII whitespace these templates meet.
std::string_view trim(std::string_view s) {
  constexpr std::string_view kWs = " \t\n\r\v\f";
  size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(kWs);
  return s.substr(b, e - b + 1);
}

Status unsupported_template(std::string_view family) {
  return Status::not_found("chat template looks like " + std::string(family) +
                           ", which is not supported; pass --chat-template NAME with one of: " + valid_names());
}

Status check_roles(const std::vector<ChatMessage>& messages, bool system_only_first, std::string_view family,
                   bool tools = false) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (!tools && (r == "tool" || !messages[i].tool_calls.empty())) {
      return Status::invalid_argument("chat message " + std::to_string(i) + ": the " + std::string(family) +
                                      " template has no tool-call format Spillway renders (chatml, llama3, "
                                      "mistral-v3 and mistral-v7-tekken do)");
    }
    if (tools && r == "tool") continue;
    if (r != "system" && r != "user" && r != "assistant") {
      return Status::invalid_argument("chat message " + std::to_string(i) + " has unknown role '" + r +
                                      "' (expected system, user or assistant)");
    }
    if (system_only_first && r == "system" && i != 0) {
      return Status::invalid_argument("chat message " + std::to_string(i) + ": the " + std::string(family) +
                                      " template only accepts a system message as the first message");
    }
  }
  return Status::ok_status();
}

std::string default_bos(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kLlama3:
      return "<|begin_of_text|>";
    case ChatTemplateKind::kGemma:
      return "<bos>";
    case ChatTemplateKind::kChatML:
    case ChatTemplateKind::kZephyr:
    case ChatTemplateKind::kPhi3:
    case ChatTemplateKind::kPhi4Mini:
    case ChatTemplateKind::kPhi4:
      return "";
    default:
      return "<s>";
  }
}

std::string default_eos(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kLlama3:
      return "<|eot_id|>";
    case ChatTemplateKind::kGemma:
      return "<eos>";
    case ChatTemplateKind::kChatML:
    case ChatTemplateKind::kPhi4:
      return "<|im_end|>";
    case ChatTemplateKind::kPhi3:
    case ChatTemplateKind::kPhi3Legacy:
    case ChatTemplateKind::kPhi4Mini:
      return "<|endoftext|>";
    default:
      return "</s>";
  }
}

}  // namespace

std::string_view chat_template_name(ChatTemplateKind kind) {
  for (const auto& kn : kNames) {
    if (kn.kind == kind) return kn.name;
  }
  return "unknown";
}

Result<ChatTemplateKind> chat_template_from_name(std::string_view name) {
  for (const auto& kn : kNames) {
    if (kn.name == name) return kn.kind;
  }
  return Status::invalid_argument("unknown chat template name '" + std::string(name) + "'; valid names: " +
                                  valid_names());
}

// Markers and order follow llama.cpp's llm_chat_detect_template, restricted to
// the families rendered here; near relatives that would render differently
// (GLM, Falcon-3 style) are NotFound rather than guessed. The departures, the
// v7 spacing check and the three Phi-3 layouts, are explained in the header.
Result<ChatTemplateKind> detect_chat_template(std::string_view t) {
  if (auto by_name = chat_template_from_name(t); by_name.ok()) return by_name.value();
  if (t.empty()) {
    return Status::not_found("the model has no chat template (tokenizer.chat_template); pass --chat-template NAME "
                             "with one of: " + valid_names());
  }
  if (contains(t, "<|im_start|>")) {
    if (contains(t, "<|im_sep|>")) return ChatTemplateKind::kPhi4;
    return ChatTemplateKind::kChatML;
  }
  if (t.substr(0, 7) == "mistral" || contains(t, "[INST]")) {
    if (contains(t, "[SYSTEM_PROMPT]")) {
      // v7 writes a space after its control tokens, tekken none.
      if (contains(t, "[INST] ") || contains(t, "[SYSTEM_PROMPT] ")) return ChatTemplateKind::kMistralV7;
      return ChatTemplateKind::kMistralV7Tekken;
    }
    if (contains(t, "' [INST] ' + system_message") || contains(t, "[AVAILABLE_TOOLS]")) {
      if (contains(t, " [INST]")) return ChatTemplateKind::kMistral;  // official "v1"
      if (contains(t, "\"[INST]\"")) return ChatTemplateKind::kMistralV3Tekken;
      return ChatTemplateKind::kMistralV3;
    }
    // The Llama-2 family marks the system prompt with <<SYS>>; the [INST]
    // templates without it are Mistral's original (pre-"v1") one.
    if (contains(t, "<<SYS>>")) return ChatTemplateKind::kLlama2;
    return ChatTemplateKind::kMistralLegacy;
  }
  if (contains(t, "<|assistant|>") && contains(t, "<|end|>")) {
    if (!contains(t, "system")) return ChatTemplateKind::kPhi3Legacy;
    // The newline after the role marker, escaped in the Jinja source or not.
    if (contains(t, "|>\\n") || contains(t, "|>\n")) return ChatTemplateKind::kPhi3;
    return ChatTemplateKind::kPhi4Mini;
  }
  if (contains(t, "[gMASK]")) return unsupported_template("ChatGLM");
  if (contains(t, "<|user|>")) {
    // Zephyr (HuggingFaceH4/zephyr, TinyLlama-Chat, StableLM-Zephyr) closes each
    // turn with eos_token ("</s>" or "<|endoftext|>"); without that it is
    // GLM-Edge/Falcon-3 style, which differs.
    if (contains(t, "eos_token") || contains(t, "</s>") || contains(t, "<|endoftext|>")) {
      return ChatTemplateKind::kZephyr;
    }
    return unsupported_template("a <|user|> template without end-of-turn tokens (GLM-Edge/Falcon-3)");
  }
  if (contains(t, "<start_of_turn>")) return ChatTemplateKind::kGemma;
  if (contains(t, "<|start_header_id|>") && contains(t, "<|end_header_id|>")) return ChatTemplateKind::kLlama3;
  return Status::not_found("chat template not recognised (none of the ChatML, Llama-2, Llama-3, Zephyr, Mistral or "
                           "Gemma markers found); pass --chat-template NAME with one of: " + valid_names());
}

Result<std::string> apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) {
  return apply_chat_template(kind, messages, add_generation_prompt, ChatSpecialTexts{});
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

bool chat_template_renders_tools(ChatTemplateKind kind) {
  return kind == ChatTemplateKind::kChatML || kind == ChatTemplateKind::kLlama3 ||
         kind == ChatTemplateKind::kMistralV3 || kind == ChatTemplateKind::kMistralV3Tekken ||
         kind == ChatTemplateKind::kMistralV7Tekken;
}

namespace {

// Qwen2.5-Instruct's template (see the header).
Result<std::string> chatml_with_tools(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                      const std::vector<ChatTool>& tools) {
  SPW_RETURN_IF_ERROR(check_roles(messages, false, "chatml", true));
  std::string out;
  const bool leading_system = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    out += "<|im_start|>system\n";
    if (leading_system) out += messages[0].content;
    out += "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
           "with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ChatTool& t : tools) out += "\n" + t.json;
    out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n";
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" && i == 0) {
      // In the tools block above; without tools, as every plain message.
      if (tools.empty()) out += "<|im_start|>system\n" + m.content + "<|im_end|>\n";
    } else if (m.role != "tool" && m.tool_calls.empty()) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) out += "\n" + m.content;
      for (const ChatToolCall& c : m.tool_calls) {
        out += "\n<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + c.arguments_json + "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else {  // tool: consecutive results share one user turn
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Llama-3.2-Instruct's template (see the header).
Result<std::string> llama3_with_tools(const std::vector<ChatMessage>& all, bool add_generation_prompt,
                                      const std::vector<ChatTool>& tools, const std::string& bos) {
  SPW_RETURN_IF_ERROR(check_roles(all, false, "llama3", true));
  std::string out = bos;
  size_t next = 0;
  std::string system;
  if (!all.empty() && all[0].role == "system") {
    system = std::string(trim(all[0].content));
    next = 1;
  }
  const bool with_tools = !tools.empty();
  if (with_tools) {
    out += "<|start_header_id|>system<|end_header_id|>\n\n";
    out += "Environment: ipython\n";
    out += "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
    out += system + "<|eot_id|>";
    if (next >= all.size()) {
      return Status::invalid_argument("the llama3 template puts the tools in the first user message, and there is none");
    }
    out += "<|start_header_id|>user<|end_header_id|>\n\n";
    out += "Given the following functions, please respond with a JSON for a function call with its proper arguments "
           "that best answers the given prompt.\n\n";
    out += "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
           "value}.Do not use variables.\n\n";
    for (const ChatTool& t : tools) out += t.json_indent4 + "\n\n";
    out += std::string(trim(all[next].content)) + "<|eot_id|>";
    ++next;
  } else if (next == 1) {
    // Without tools the family renders as Meta-Llama-3's template does.
    out += "<|start_header_id|>system<|end_header_id|>\n\n" + system + "<|eot_id|>";
  }
  for (size_t i = next; i < all.size(); ++i) {
    const ChatMessage& m = all[i];
    if (m.role == "tool") {
      out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + json_quote(m.content) + "<|eot_id|>";
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) {
        return Status::invalid_argument("chat message " + std::to_string(i) + " has " +
                                        std::to_string(m.tool_calls.size()) +
                                        " tool calls; the llama3 template renders one per assistant message");
      }
      const ChatToolCall& c = m.tool_calls[0];
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + c.name + "\", \"parameters\": " +
             c.arguments_json + "}<|eot_id|>";
    } else {
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + std::string(trim(m.content)) + "<|eot_id|>";
    }
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// The Mistral templates' tools block: each tool {"type": "function",
// "function": {...}} from function_fields, "return" left out; `sp` after the
// opening token.
std::string mistral_tools_block(const std::vector<ChatTool>& tools, const std::string& sp) {
  std::string out = "[AVAILABLE_TOOLS]" + sp + "[";
  for (size_t t = 0; t < tools.size(); ++t) {
    out += "{\"type\": \"function\", \"function\": {";
    bool first_field = true;
    for (const ChatTool::Field& f : tools[t].function_fields) {
      if (f.key == "return") continue;
      if (!first_field) out += ", ";
      first_field = false;
      out += "\"" + f.key + "\": " + (f.is_string ? "\"" + f.text + "\"" : f.text);
    }
    out += "}}";
    out += t + 1 < tools.size() ? ", " : "]";
  }
  return out + "[/AVAILABLE_TOOLS]";
}

// One call as the Mistral templates write it: tojson of {"name",
// "arguments"} without its closing brace, then the id.
std::string mistral_call(const ChatToolCall& call, std::string_view id) {
  return "{\"name\": " + json_quote(call.name) + ", \"arguments\": " + call.arguments_json + ", \"id\": \"" +
         std::string(id) + "\"}";
}

// The last user message: the Mistral templates put the tools before it, and
// before any earlier one that equals it (they compare the messages by value).
const ChatMessage* last_user_message(const std::vector<ChatMessage>& messages, size_t first) {
  const ChatMessage* last_user = nullptr;
  for (size_t i = first; i < messages.size(); ++i) {
    if (messages[i].role == "user") last_user = &messages[i];
  }
  return last_user;
}

bool is_last_user(const ChatMessage& m, const ChatMessage* last_user) {
  return last_user != nullptr && m.content == last_user->content && m.tool_call_id == last_user->tool_call_id;
}

// Mistral-7B-Instruct-v0.3's template, or Mistral-Nemo's with `tekken` (see
// the header). Roles: an optional first system message, then user, assistant
// (plain or with calls) and tool messages in any order, as the reference
// renders them (its alternation check skips calls and results; not enforced).
Result<std::string> mistral_v3_with_tools(const std::vector<ChatMessage>& messages, const std::vector<ChatTool>& tools,
                                          const std::string& bos, const std::string& eos, bool tekken) {
  const char* family = tekken ? "mistral-v3-tekken" : "mistral-v3";
  SPW_RETURN_IF_ERROR(check_roles(messages, true, family, true));
  const std::string sp = tekken ? "" : " ";
  const bool leading_system = !messages.empty() && messages[0].role == "system";
  const size_t first = leading_system ? 1 : 0;
  const ChatMessage* last_user = last_user_message(messages, first);
  const auto check_id = [&](const std::string& id, size_t i) -> Status {
    if (id.size() == 9) return Status::ok_status();
    return Status::invalid_argument("chat message " + std::to_string(i) + ": the " + family +
                                    " template needs tool call ids of 9 characters, got '" + id + "'");
  };
  std::string out = bos;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      if (!tools.empty() && is_last_user(m, last_user)) out += mistral_tools_block(tools, sp);
      if (i + 1 == messages.size() && leading_system) {
        out += "[INST]" + sp + messages[0].content + "\n\n" + m.content + "[/INST]";
      } else {
        out += "[INST]" + sp + m.content + "[/INST]";
      }
    } else if (!m.tool_calls.empty()) {
      out += "[TOOL_CALLS]" + sp + "[";
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        const ChatToolCall& call = m.tool_calls[c];
        SPW_RETURN_IF_ERROR(check_id(call.id, i));
        out += mistral_call(call, call.id);
        out += c + 1 < m.tool_calls.size() ? ", " : "]" + eos;
      }
    } else if (m.role == "assistant") {
      out += tekken ? m.content : " " + std::string(trim(m.content));
      out += eos;
    } else {  // tool
      SPW_RETURN_IF_ERROR(check_id(m.tool_call_id, i));
      out += "[TOOL_RESULTS]" + sp + "{\"content\": " + m.content + ", \"call_id\": \"" + m.tool_call_id +
             "\"}[/TOOL_RESULTS]";
    }
  }
  return out;
}

// The system preamble Mistral Small 3.1's template adds when there are tools.
constexpr std::string_view kMistralV7ToolPreamble =
    "You are a helpful assistant that can call tools. If you call one or more tools, format them in a single JSON "
    "array or objects, where each object is a tool call, not as separate objects outside of an array or multiple "
    "arrays. Use the format [{\"name\": tool call name, \"arguments\": tool call arguments}, additional tool calls] "
    "if you call more than one tool. If you call tools, do not attempt to interpret them or otherwise provide a "
    "response until you receive a tool call result that you can interpret for the user.";

// Mistral v7 (see the header). Without tools and tool messages this is
// llama.cpp's built-in renderer: every message in place, no generation
// prompt ("[/INST]" opens the answer), no default system message. With them
// (tekken only; the caller refuses them for v7), Mistral Small 3.1's
// template: the preamble above joins the system block (alone when there is
// no system message, the template's own branch for that case), the tools go
// before the last user message, a space after [AVAILABLE_TOOLS],
// [TOOL_CALLS] and [TOOL_RESULTS] even in tekken, and call ids of 9 or more
// characters are cut to their last 9 (shorter: the reference raises;
// InvalidArgument here). A later system message stays in place as in the
// plain path (Small 3.2's template does the same; 3.1's raises).
Result<std::string> mistral_v7(const std::vector<ChatMessage>& messages, const std::vector<ChatTool>& tools,
                               const std::string& bos, const std::string& eos, bool tekken) {
  const std::string family = tekken ? "mistral-v7-tekken" : "mistral-v7";
  SPW_RETURN_IF_ERROR(check_roles(messages, false, family, true));
  const std::string sp = tekken ? "" : " ";
  const bool leading_system = !messages.empty() && messages[0].role == "system";
  const size_t first = leading_system ? 1 : 0;
  std::string out = bos;
  if (!tools.empty()) {
    out += "[SYSTEM_PROMPT]" + sp + std::string(kMistralV7ToolPreamble);
    if (leading_system) out += "\n\n" + messages[0].content;
    out += "[/SYSTEM_PROMPT]";
  } else if (leading_system) {
    out += "[SYSTEM_PROMPT]" + sp + messages[0].content + "[/SYSTEM_PROMPT]";
  }
  const ChatMessage* last_user = last_user_message(messages, first);
  const auto last9 = [&](const std::string& id, size_t i) -> Result<std::string> {
    if (id.size() >= 9) return id.substr(id.size() - 9);
    return Status::invalid_argument("chat message " + std::to_string(i) + ": the " + family +
                                    " template needs tool call ids of at least 9 characters, got '" + id + "'");
  };
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      out += "[SYSTEM_PROMPT]" + sp + m.content + "[/SYSTEM_PROMPT]";
    } else if (m.role == "user") {
      if (!tools.empty() && is_last_user(m, last_user)) out += mistral_tools_block(tools, " ");
      out += "[INST]" + sp + m.content + "[/INST]";
    } else if (!m.tool_calls.empty()) {
      out += "[TOOL_CALLS] [";
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        SPW_ASSIGN_OR_RETURN(std::string id, last9(m.tool_calls[c].id, i));
        out += mistral_call(m.tool_calls[c], id);
        out += c + 1 < m.tool_calls.size() ? ", " : "]" + eos;
      }
    } else if (m.role == "assistant") {
      out += sp + m.content + eos;
    } else {  // tool
      SPW_ASSIGN_OR_RETURN(std::string id, last9(m.tool_call_id, i));
      out += "[TOOL_RESULTS] {\"content\": " + m.content + ", \"call_id\": \"" + id + "\"}[/TOOL_RESULTS]";
    }
  }
  return out;
}

bool uses_tools(const std::vector<ChatMessage>& messages, const std::vector<ChatTool>& tools) {
  if (!tools.empty()) return true;
  return std::any_of(messages.begin(), messages.end(),
                     [](const ChatMessage& m) { return m.role == "tool" || !m.tool_calls.empty(); });
}

}  // namespace

Result<std::string> apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt, const ChatSpecialTexts& special,
                                        const std::vector<ChatTool>& tools) {
  if (uses_tools(messages, tools)) {
    if (kind == ChatTemplateKind::kChatML) return chatml_with_tools(messages, add_generation_prompt, tools);
    if (kind == ChatTemplateKind::kLlama3) {
      return llama3_with_tools(messages, add_generation_prompt, tools,
                               special.bos ? *special.bos : default_bos(kind));
    }
    if (kind == ChatTemplateKind::kMistralV3 || kind == ChatTemplateKind::kMistralV3Tekken) {
      return mistral_v3_with_tools(messages, tools, special.bos ? *special.bos : default_bos(kind),
                                   special.eos ? *special.eos : default_eos(kind),
                                   kind == ChatTemplateKind::kMistralV3Tekken);
    }
    if (kind == ChatTemplateKind::kMistralV7Tekken) {
      return mistral_v7(messages, tools, special.bos ? *special.bos : default_bos(kind),
                        special.eos ? *special.eos : default_eos(kind), true);
    }
    return Status::invalid_argument("the " + std::string(chat_template_name(kind)) +
                                    " template has no tool-call format Spillway renders (chatml, llama3, "
                                    "mistral-v3 and mistral-v7-tekken do)");
  }
  return apply_chat_template(kind, messages, add_generation_prompt, special);
}

Result<std::string> apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt, const ChatSpecialTexts& special) {
  const std::string bos = special.bos ? *special.bos : default_bos(kind);
  const std::string eos = special.eos ? *special.eos : default_eos(kind);
  std::string out;

  // Families that take the system prompt out of messages[0] and render the rest.
  const bool leading_system = !messages.empty() && messages[0].role == "system";
  const std::string_view system = leading_system ? std::string_view(messages[0].content) : std::string_view();
  const size_t first = leading_system ? 1 : 0;

  switch (kind) {
    case ChatTemplateKind::kChatML: {
      SPW_RETURN_IF_ERROR(check_roles(messages, false, "chatml"));
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    }
    case ChatTemplateKind::kLlama3: {
      SPW_RETURN_IF_ERROR(check_roles(messages, false, "llama3"));
      out += bos;
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        out += trim(m.content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case ChatTemplateKind::kZephyr: {
      SPW_RETURN_IF_ERROR(check_roles(messages, false, "zephyr"));
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + eos + "\n";
      // The reference emits the opener inside the loop (loop.last), so an
      // empty conversation gets nothing.
      if (add_generation_prompt && !messages.empty()) out += "<|assistant|>\n";
      return out;
    }
    case ChatTemplateKind::kPhi3:
    case ChatTemplateKind::kPhi4Mini: {
      const bool phi3 = kind == ChatTemplateKind::kPhi3;
      SPW_RETURN_IF_ERROR(check_roles(messages, false, phi3 ? "phi3" : "phi4-mini"));
      const std::string nl = phi3 ? "\n" : "";
      for (const auto& m : messages) {
        if (phi3 && m.role == "system" && m.content.empty()) continue;
        out += "<|" + m.role + "|>" + nl + m.content + "<|end|>" + nl;
      }
      out += add_generation_prompt ? "<|assistant|>" + nl : eos;
      return out;
    }
    case ChatTemplateKind::kPhi3Legacy: {
      SPW_RETURN_IF_ERROR(check_roles(messages, false, "phi3-legacy"));
      out += bos;
      for (const auto& m : messages) {
        if (m.role == "user") out += "<|user|>\n" + m.content + "<|end|>\n<|assistant|>\n";
        if (m.role == "assistant") out += m.content + "<|end|>\n";
      }
      return out;
    }
    case ChatTemplateKind::kPhi4: {
      SPW_RETURN_IF_ERROR(check_roles(messages, false, "phi4"));
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "<|im_sep|>" + m.content + "<|im_end|>";
      if (add_generation_prompt) out += "<|im_start|>assistant<|im_sep|>";
      return out;
    }
    case ChatTemplateKind::kLlama2: {
      // meta-llama/Llama-2-*-chat: system folded into the first turn inside
      // <<SYS>>; user/assistant stripped; BOS before every [INST]. The
      // reference has no generation prompt ("[/INST]" already opens it).
      SPW_RETURN_IF_ERROR(check_roles(messages, true, "llama2"));
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        std::string content = m.content;
        if (i == first && leading_system) {
          content = "<<SYS>>\n" + std::string(system) + "\n<</SYS>>\n\n" + m.content;
        }
        if (m.role == "user") {
          out += bos + "[INST] ";
          out += trim(content);
          out += " [/INST]";
        } else {
          out += " ";
          out += trim(content);
          out += " " + eos;
        }
      }
      return out;
    }
    case ChatTemplateKind::kMistral: {
      // Mistral's official "v1" template (Mistral-7B-Instruct v0.1/v0.2 today):
      // system prepended to the first user turn.
      SPW_RETURN_IF_ERROR(check_roles(messages, true, "mistral"));
      out += bos;
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role == "user") {
          if (i == first && leading_system) {
            out += " [INST] " + std::string(system) + "\n\n" + m.content + " [/INST]";
          } else {
            out += " [INST] " + m.content + " [/INST]";
          }
        } else {
          out += " " + m.content + eos;
        }
      }
      return out;
    }
    case ChatTemplateKind::kMistralV3:
    case ChatTemplateKind::kMistralV3Tekken: {
      // Mistral "v3" (Mistral-7B-Instruct-v0.3) and "v3-tekken" (Nemo):
      // system prepended to the LAST message when it is a user turn (dropped
      // otherwise, as the reference does); v3's answers trimmed. Without
      // tools, the tools renderer is the reference's plain path.
      const bool tekken = kind == ChatTemplateKind::kMistralV3Tekken;
      SPW_RETURN_IF_ERROR(check_roles(messages, true, tekken ? "mistral-v3-tekken" : "mistral-v3"));
      return mistral_v3_with_tools(messages, {}, bos, eos, tekken);
    }
    case ChatTemplateKind::kMistralV7:
    case ChatTemplateKind::kMistralV7Tekken: {
      // llama.cpp's built-in v7 renderer; tool messages were refused above.
      const bool tekken = kind == ChatTemplateKind::kMistralV7Tekken;
      SPW_RETURN_IF_ERROR(check_roles(messages, false, chat_template_name(kind)));
      return mistral_v7(messages, {}, bos, eos, tekken);
    }
    case ChatTemplateKind::kMistralLegacy: {
      // The original Mistral-7B-Instruct template. It rejects a system
      // message; we fold it into the first user turn as "v1" does.
      SPW_RETURN_IF_ERROR(check_roles(messages, true, "mistral-legacy"));
      out += bos;
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role == "user") {
          std::string content = (i == first && leading_system) ? std::string(system) + "\n\n" + m.content : m.content;
          out += "[INST] " + content + " [/INST]";
        } else {
          out += m.content + eos;
        }
      }
      return out;
    }
    case ChatTemplateKind::kGemma: {
      // Gemma: assistant is "model"; content trimmed. Gemma 1/2 reject a system
      // message; Gemma 3's template folds it (untrimmed, plus "\n\n") into the
      // first turn, which is what we do.
      SPW_RETURN_IF_ERROR(check_roles(messages, true, "gemma"));
      out += bos;
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        out += "<start_of_turn>";
        out += m.role == "assistant" ? "model" : m.role;
        out += "\n";
        if (i == first && leading_system) out += std::string(system) + "\n\n";
        out += trim(m.content);
        out += "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      return out;
    }
  }
  return Status::invalid_argument("unknown chat template kind");
}

}  // namespace spw
