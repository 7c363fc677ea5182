#include "http/tool_calls.h"

#include <nlohmann/json.hpp>

#include "core/hash.h"

namespace spw::http {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";

// Mistral's templates insist on call ids of 9 letters and digits: one made
// from the request id and the call's index (so a replay has the same ids).
std::string mistral_call_id(int64_t request_id, int32_t index) {
  uint64_t state = static_cast<uint64_t>(request_id) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index);
  uint64_t x = splitmix64(state);
  constexpr std::string_view kAlnum = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::string id(9, '0');
  for (char& ch : id) {
    ch = kAlnum[x % kAlnum.size()];
    x /= kAlnum.size();
  }
  return id;
}

void py_dump(const ojson& j, int indent, int level, std::string& out) {
  const auto newline = [&](int lv) {
    if (indent > 0) {
      out += '\n';
      out.append(static_cast<size_t>(indent * lv), ' ');
    }
  };
  const std::string_view sep = indent > 0 ? "," : ", ";
  if (j.is_object()) {
    if (j.empty()) {
      out += "{}";
      return;
    }
    out += "{";
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += sep;
      first = false;
      newline(level + 1);
      out += json_quote(it.key()) + ": ";
      py_dump(it.value(), indent, level + 1, out);
    }
    newline(level);
    out += "}";
  } else if (j.is_array()) {
    if (j.empty()) {
      out += "[]";
      return;
    }
    out += "[";
    for (size_t i = 0; i < j.size(); ++i) {
      if (i > 0) out += sep;
      newline(level + 1);
      py_dump(j[i], indent, level + 1, out);
    }
    newline(level);
    out += "]";
  } else if (j.is_string()) {
    out += json_quote(j.get_ref<const std::string&>());
  } else {
    out += j.dump();  // numbers, booleans, null: the same text in both
  }
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim_space(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// An answer that may open with a marker token (Llama's <|python_tag|>,
// Mistral's [TOOL_CALLS]): skips the leading whitespace of `s`, then the marker
// and the whitespace after it. kWait while what is held could still become the
// marker.
enum class Opening { kWait, kMarker, kPlain };
Opening skip_opening(std::string_view& s, std::string_view marker, bool at_end) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  if (s.starts_with(marker)) {
    s.remove_prefix(marker.size());
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    return Opening::kMarker;
  }
  if (!s.empty() && marker.starts_with(s) && !at_end) return Opening::kWait;
  return Opening::kPlain;
}

// The end of the JSON object or array that starts at s[0] ('{' or '['): one
// past its closing bracket, or npos while it is not closed; strings and
// escapes respected.
size_t object_end(std::string_view s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if ((c == '}' || c == ']') && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

}  // namespace

Result<std::string> tojson(std::string_view json_text, int indent) {
  ojson j = ojson::parse(json_text, nullptr, false);
  if (j.is_discarded()) return Status::invalid_argument("not valid JSON");
  std::string out;
  py_dump(j, indent, 0, out);
  return out;
}

ToolFormat tool_format(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML:
      return ToolFormat::kChatML;
    case ChatTemplateKind::kLlama3:
      return ToolFormat::kLlama3;
    case ChatTemplateKind::kMistralV3:
    case ChatTemplateKind::kMistralV3Tekken:
    case ChatTemplateKind::kMistralV7Tekken:
      return ToolFormat::kMistral;
    default:
      return ToolFormat::kNone;
  }
}

SafePointRules tool_safe_points(ToolFormat format) {
  SafePointRules r;
  if (format == ToolFormat::kChatML) r.spans.push_back({std::string(kOpen), std::string(kClose)});
  // A Llama call is the whole answer: no close.
  if (format == ToolFormat::kLlama3) r.spans.push_back({"{\"name\"", ""});
  // Mistral's calls are the rest of the answer too, after the control token
  // when it shows, or from the array of calls when it does not.
  if (format == ToolFormat::kMistral) {
    r.spans.push_back({std::string(kMistralCalls), ""});
    r.spans.push_back({"[{\"name\"", ""});
  }
  return r;
}

ToolCallStream::ToolCallStream(ToolFormat format, int64_t request_id, bool parallel)
    : format_(format), request_id_(request_id), parallel_(parallel) {}

void ToolCallStream::release_content(std::string_view text, Released& out) {
  // Whitespace around calls is the format's.
  if (n_calls_ > 0) text = trim_space(text);
  out.content += text;
}

bool ToolCallStream::take_call(std::string_view json_text, Released& out) {
  ojson j = ojson::parse(trim_space(json_text), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto name = j.find("name");
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  if (args != j.end() && !args->is_object()) return false;
  // Released once; with parallel=false only the first (the rest is dropped,
  // not shown as text: it was a call).
  if (parallel_ || n_calls_ == 0) {
    ToolCallOut c;
    c.id = format_ == ToolFormat::kMistral ? mistral_call_id(request_id_, n_calls_)
                                           : "call_" + std::to_string(request_id_) + "_" + std::to_string(n_calls_);
    c.name = name->get<std::string>();
    c.arguments = args == j.end() ? "{}" : args->dump();
    out.calls.push_back(std::move(c));
  }
  ++n_calls_;
  return true;
}

void ToolCallStream::scan(Released& out, bool at_end) {
  if (format_ == ToolFormat::kNone) {
    out.content += held_;
    held_.clear();
    return;
  }
  if (format_ == ToolFormat::kLlama3) {
    if (!decided_) {
      std::string_view s = held_;
      if (skip_opening(s, kPythonTag, at_end) == Opening::kWait) return;
      if (s.empty() && !at_end) return;
      decided_ = true;
      in_call_ = !s.empty() && s.front() == '{';
      if (in_call_) held_ = std::string(s);
    }
    if (!in_call_) {
      release_content(held_, out);  // after a call, whitespace is the format's
      held_.clear();
      return;
    }
    const size_t end = object_end(held_);
    if (end == std::string_view::npos && !at_end) return;
    if (end != std::string_view::npos && take_call(std::string_view(held_).substr(0, end), out)) {
      held_.erase(0, end);
      release_content(held_, out);  // after the call: only whitespace shows nothing
      held_.clear();
      in_call_ = false;
      return;
    }
    if (!at_end) return;
    out.content += held_;  // not a call: the model's text as it wrote it
    held_.clear();
    return;
  }
  if (format_ == ToolFormat::kMistral) {
    scan_mistral(out, at_end);
    return;
  }
  // ChatML: <tool_call> ... </tool_call>, possibly several.
  for (;;) {
    if (!in_call_) {
      const size_t open = held_.find(kOpen);
      if (open == std::string::npos) {
        const size_t keep = at_end ? 0 : partial_suffix(held_, kOpen);
        // Whitespace after a call may precede another: hold it until known.
        size_t cut = held_.size() - keep;
        if (n_calls_ > 0 && !at_end) {
          while (cut > 0 && is_space(held_[cut - 1])) --cut;
        }
        release_content(std::string_view(held_).substr(0, cut), out);
        held_.erase(0, cut);
        return;
      }
      release_content(std::string_view(held_).substr(0, open), out);
      held_.erase(0, open);
      in_call_ = true;
    }
    // The JSON object first (a "</tool_call>" inside its strings is text),
    // then the closing tag after it.
    size_t from = kOpen.size();
    while (from < held_.size() && is_space(held_[from])) ++from;
    if (from < held_.size() && held_[from] == '{') {
      const size_t end = object_end(std::string_view(held_).substr(from));
      if (end == std::string_view::npos && !at_end) return;
      if (end != std::string_view::npos) from += end;
    }
    const size_t close = held_.find(kClose, from);
    if (close == std::string::npos) {
      if (!at_end) return;
      // Ended inside a call: a call if its JSON is whole, else text.
      if (!take_call(std::string_view(held_).substr(kOpen.size()), out)) out.content += held_;
      held_.clear();
      in_call_ = false;
      return;
    }
    const std::string_view body = std::string_view(held_).substr(kOpen.size(), close - kOpen.size());
    const size_t after = close + kClose.size();
    if (!take_call(body, out)) out.content += held_.substr(0, after);  // not a call: as written
    held_.erase(0, after);
    in_call_ = false;
  }
}

// Mistral: the answer is calls when it starts with "[TOOL_CALLS]" (the
// control token, where the vocabulary's text shows) or, without it (a
// control token renders as nothing), with a JSON array; the array's objects
// are the calls ({"name", "arguments"}; a model-written "id" is replaced by
// ours). Anything else, or an array that is not all calls, is content as written.
void ToolCallStream::scan_mistral(Released& out, bool at_end) {
  if (!decided_) {
    std::string_view s = held_;
    const Opening opening = skip_opening(s, kMistralCalls, at_end);
    if (opening == Opening::kWait || (s.empty() && !at_end)) return;
    decided_ = true;
    // After the marker, what follows is calls (or shown as written).
    in_call_ = opening == Opening::kMarker || (!s.empty() && s.front() == '[');
    if (!in_call_) {
      out.content += held_;
      held_.clear();
      return;
    }
    marker_ = held_.substr(0, held_.size() - s.size());
    held_ = std::string(s);
  }
  if (!in_call_) {
    release_content(held_, out);  // after calls, whitespace is the format's
    held_.clear();
    return;
  }
  const size_t end = !held_.empty() && held_.front() == '[' ? object_end(held_) : std::string_view::npos;
  if (end == std::string_view::npos && !at_end) return;
  if (end != std::string_view::npos) {
    ojson arr = ojson::parse(std::string_view(held_).substr(0, end), nullptr, false);
    bool all_calls = arr.is_array() && !arr.empty();
    if (all_calls) {
      for (const ojson& c : arr) {
        auto name = c.is_object() ? c.find("name") : c.end();
        auto args = c.is_object() ? c.find("arguments") : c.end();
        all_calls = all_calls && c.is_object() && name != c.end() && name->is_string() &&
                    !name->get_ref<const std::string&>().empty() && (args == c.end() || args->is_object());
      }
    }
    if (all_calls) {
      for (const ojson& c : arr) {
        ojson call = ojson::object();
        call["name"] = c["name"];
        call["arguments"] = c.contains("arguments") ? c["arguments"] : ojson::object();
        take_call(call.dump(), out);
      }
      held_.erase(0, end);
      release_content(held_, out);  // after the calls: whitespace shows nothing
      held_.clear();
      marker_.clear();
      in_call_ = false;
      return;
    }
  }
  if (!at_end && end == std::string_view::npos) return;
  out.content += marker_ + held_;  // not calls: the model's text as it wrote it
  marker_.clear();
  held_.clear();
  in_call_ = false;
}

ToolCallStream::Released ToolCallStream::feed(std::string_view text) {
  Released out;
  held_ += text;
  scan(out, false);
  return out;
}

ToolCallStream::Released ToolCallStream::finish() {
  Released out;
  scan(out, true);
  return out;
}

}  // namespace spw::http
