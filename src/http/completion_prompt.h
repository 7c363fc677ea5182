// /v1/completions' `prompt` and `echo`: the forms a prompt may take and how an
// echoed prompt is shown.
//
// Contract: parse_completion_prompt() reads the body's "prompt" value into a
// CompletionRequest:
//  - a string, or an array of exactly one string: the prompt text (tokenized
//    by the server, BOS as the vocabulary says);
//  - an array of integers, or an array of exactly one such array: token ids,
//    the prompt tokens exactly as given (no BOS added; as OpenAI's API,
//    vLLM and llama.cpp's server take them). Each must be an integer in
//    [0, 2^31); check_prompt_tokens() then checks them against the served
//    vocabulary (a 400 naming the index, the id and the vocabulary's size);
//    at most kMaxPromptTokenIds ids;
//  - a batch (an array of two or more strings or token-id arrays): a 400
//    (param "prompt", code "unsupported_parameter") saying this server takes
//    one prompt per request and to send N requests;
//  - anything else (a number, an object, a mixed array, nested deeper): a
//    400 invalid_type naming the element; empty (a "" string, [], [[]]): a
//    400 "must not be empty"; text over kMaxPromptBytes: a 400 naming the limit.
// Every error has param "prompt" (an element's: "prompt[i]" or
// "prompt[0][i]" in the message).
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "http/openai.h"

namespace spw::http {

// Token ids one prompt may have: about as many tokens as kMaxPromptBytes of
// text holds (~4 bytes a token), more than any local context.
inline constexpr size_t kMaxPromptTokenIds = 2 * 1024 * 1024;

std::optional<ApiError> parse_completion_prompt(const nlohmann::ordered_json& prompt, CompletionRequest& out);

// A token-id prompt's ids below n_vocab (nullopt when it is text or they are).
std::optional<ApiError> check_prompt_tokens(const CompletionRequest& r, int32_t n_vocab);

}  // namespace spw::http
