// Tool calls: the request's `tools` as the chat templates render them, and
// the model's tool-call output parsed into OpenAI's `tool_calls`.
//
// Contract:
//  - tool_format(kind): the output format a template family's models write
//    for a call: ChatML (Qwen2.5 / Hermes) "<tool_call>\n{"name": N,
//    "arguments": {...}}\n</tool_call>" (several in a row when parallel);
//    Llama 3.x one JSON object {"name": N, "parameters": {...}} (or
//    "arguments") as the whole answer, optionally after "<|python_tag|>";
//    Mistral v3 (v3-tekken, v7-tekken) "[TOOL_CALLS] [{"name": N, "arguments":
//    {...}}, ...]" as the rest of the answer (the marker is a control token:
//    where it renders as nothing, an answer that is a JSON array of calls);
//    kNone for families without tools (chat_template_renders_tools).
//  - tool_safe_points(format): the spans inside which a generation must not be
//    split (a call's arguments come from one run; SafePointRules): ChatML's
//    "<tool_call>" ... "</tool_call>"; Llama's call from its opening `{"name"`
//    to the end of the answer (a call is the whole answer).
//  - ToolCallStream turns the generated text, fed as it comes, into content
//    that is safe to show and complete calls: text that could still become a
//    call (a prefix of "<tool_call>", a Llama answer starting with "{") is
//    held back; a call is released once whole (its closing tag, or its JSON
//    object closed), with its arguments as compact JSON text and its id
//    "call_<request id>_<index>" (Mistral: 9 letters and digits made from
//    both, as its template demands), so that the same request's calls have the
//    same ids in its replay (the journal's Idempotency-Key) and a resume.
//    Each call is released exactly once. finish() releases what is held: an
//    unterminated ChatML call whose JSON is whole is a call (models often end
//    with EOS before "</tool_call>"); anything that does not parse as a call
//    is content, as the model wrote it. parallel=false keeps the first call
//    only. Between and after calls, whitespace is dropped (it is the
//    format's, not the answer's).
// Thread safety: a ToolCallStream belongs to one response.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/checkpoint.h"
#include "tokenizer/chat_template.h"

namespace spw::http {

enum class ToolFormat { kNone, kChatML, kLlama3, kMistral };

ToolFormat tool_format(ChatTemplateKind kind);
SafePointRules tool_safe_points(ToolFormat format);

// A JSON value (text) as the reference templates' `tojson` writes it: Python's
// json.dumps with ensure_ascii=False, keys in their order, ", " and ": "
// between items (indent 0), or one item per line indented by `indent` spaces.
// The text must be valid JSON (InvalidArgument otherwise).
Result<std::string> tojson(std::string_view json_text, int indent = 0);

struct ToolCallOut {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object as compact text (OpenAI's string)
};

class ToolCallStream {
 public:
  ToolCallStream(ToolFormat format, int64_t request_id, bool parallel);

  struct Released {
    std::string content;
    std::vector<ToolCallOut> calls;
  };
  Released feed(std::string_view text);
  Released finish();
  int32_t calls_released() const { return n_calls_; }

 private:
  void release_content(std::string_view text, Released& out);
  bool take_call(std::string_view json_text, Released& out);  // false: not a call
  void scan(Released& out, bool at_end);
  void scan_mistral(Released& out, bool at_end);

  ToolFormat format_;
  int64_t request_id_;
  bool parallel_;
  std::string held_;
  bool in_call_ = false;      // ChatML: inside <tool_call>; Llama: the answer is a call
  bool decided_ = false;      // Llama, Mistral: whether the answer is a call is known
  std::string marker_;        // Mistral: "[TOOL_CALLS]" and spaces held, shown if no calls follow
  int32_t n_calls_ = 0;
};

}  // namespace spw::http
