// POST /v1/embeddings in OpenAI's format: the request's parsing and the
// response's rendering (the handler is server_embeddings.cpp).
//
// Contract: parse_embedding_request(body, out) reads {"input", "model",
// "encoding_format", "dimensions", "user"} strictly (other fields 400
// unknown_parameter): input is a string, an array of strings, an array of
// token ids (one input) or an array of such arrays; at most kMaxEmbeddingInputs
// inputs, none empty; encoding_format "float" (default) or "base64" (each
// vector's float32 values, little-endian, base64-encoded as OpenAI's
// clients decode them); dimensions a positive integer (the handler refuses
// it unless it is the model's own width: these models have no shortened
// form); 400 naming the field otherwise.
// render_embeddings() writes {"object":"list","data":[{"object":
// "embedding","index","embedding"}],"model","usage":{"prompt_tokens",
// "total_tokens"},"spillway":{...}}.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/openai.h"
#include "serve/scheduler.h"

namespace spw::http {

inline constexpr size_t kMaxEmbeddingInputs = 2048;  // OpenAI's limit per request

struct EmbeddingRequest {
  std::string model;
  std::vector<std::string> texts;               // string inputs
  std::vector<std::vector<TokenId>> token_ids;  // token-id inputs (one form per request)
  bool base64 = false;
  std::optional<int64_t> dimensions;
};

std::optional<ApiError> parse_embedding_request(std::string_view body, EmbeddingRequest& out);
std::string render_embeddings(const serve::Embeddings& e, bool base64, const std::string& model,
                              const SpillwayInfo& info);
// Float32 values as OpenAI's base64 encoding_format: little-endian bytes, base64.
std::string floats_base64(const std::vector<float>& v);

}  // namespace spw::http
