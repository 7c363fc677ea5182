#include "http/completion_prompt.h"

#include <algorithm>
#include <climits>

#include <nlohmann/json.hpp>

namespace spw::http {
namespace {

using json = nlohmann::ordered_json;

ApiError prompt_error(std::string message, std::string code = "invalid_value") {
  ApiError e;
  e.http_status = 400;
  e.param = "prompt";
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

bool is_token_list(const json& v) {
  return v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number(); });
}

// `ids` (an array of numbers) into out.prompt_tokens; `where` names it in
// messages ("prompt" or "prompt[0]").
std::optional<ApiError> read_ids(const json& ids, const std::string& where, CompletionRequest& out) {
  if (ids.size() > kMaxPromptTokenIds) {
    return prompt_error("'" + where + "' may have at most " + std::to_string(kMaxPromptTokenIds) +
                        " token ids, got " + std::to_string(ids.size()));
  }
  std::vector<TokenId> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& v = ids[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (v.is_number_float()) {
      return prompt_error("'" + at + "' must be an integer token id, got " + v.dump(), "invalid_type");
    }
    if (v.is_number_integer() && v.get<int64_t>() < 0) {
      return prompt_error("'" + at + "': token id " + v.dump() + " is negative");
    }
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) {
      return prompt_error("'" + at + "': token id " + v.dump() + " is outside any vocabulary");
    }
    tokens.push_back(static_cast<TokenId>(v.get<uint64_t>()));
  }
  out.prompt_tokens = std::move(tokens);
  return std::nullopt;
}

std::string batch_message(size_t n) {
  return "'prompt' is a batch of " + std::to_string(n) +
         " prompts: this server takes one prompt per request; send " + std::to_string(n) +
         " requests (a one-element array is one prompt)";
}

}  // namespace

std::optional<ApiError> parse_completion_prompt(const json& p, CompletionRequest& out) {
  out.prompt.clear();
  out.prompt_tokens.reset();
  if (p.is_string()) {
    out.prompt = p.get<std::string>();
  } else if (!p.is_array()) {
    return prompt_error("'prompt' must be a string, an array of token ids, or an array of one of those, got " +
                            std::string(p.type_name()),
                        "invalid_type");
  } else if (p.empty()) {
    return prompt_error("'prompt' must not be empty");
  } else if (is_token_list(p)) {
    if (auto e = read_ids(p, "prompt", out)) return e;
  } else if (p.size() > 1 && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_string() || x.is_array(); })) {
    return prompt_error(batch_message(p.size()), "unsupported_parameter");
  } else if (p.size() != 1) {
    return prompt_error("'prompt' must be a string, an array of token ids, or an array of one of those; its "
                        "elements mix " + std::string(p[0].type_name()) + " with other types",
                        "invalid_type");
  } else if (p[0].is_string()) {
    out.prompt = p[0].get<std::string>();
  } else if (p[0].is_array()) {
    if (p[0].empty()) return prompt_error("'prompt[0]' must not be empty");
    if (!is_token_list(p[0])) {
      return prompt_error("'prompt[0]' must be an array of integer token ids", "invalid_type");
    }
    if (auto e = read_ids(p[0], "prompt[0]", out)) return e;
  } else {
    return prompt_error("'prompt' must be a string, an array of token ids, or an array of one of those; its "
                        "element is " + std::string(p[0].type_name()),
                        "invalid_type");
  }
  if (!out.prompt_tokens) {
    if (out.prompt.empty()) return prompt_error("'prompt' must not be empty");
    if (out.prompt.size() > kMaxPromptBytes) {
      return prompt_error("'prompt' may be at most " + std::to_string(kMaxPromptBytes) + " bytes, got " +
                          std::to_string(out.prompt.size()) + " bytes");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> check_prompt_tokens(const CompletionRequest& r, int32_t n_vocab) {
  if (!r.prompt_tokens) return std::nullopt;
  const std::vector<TokenId>& ids = *r.prompt_tokens;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= n_vocab) {
      return prompt_error("'prompt[" + std::to_string(i) + "]': token id " + std::to_string(ids[i]) +
                          " is past the vocabulary of " + std::to_string(n_vocab) + " tokens (ids 0 to " +
                          std::to_string(n_vocab - 1) + ")");
    }
  }
  return std::nullopt;
}

}  // namespace spw::http
