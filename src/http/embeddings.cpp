#include "http/embeddings.h"

#include <openssl/evp.h>

#include <bit>
#include <cstring>

#include "http/json_fields.h"

namespace spw::http {
namespace {

using json_fields::bad;
using json_fields::json;
using json_fields::wrong_type;

constexpr std::string_view kEmbeddingFields[] = {"input", "model", "encoding_format", "dimensions", "user"};

// One token-id array; a 400 naming input[index] otherwise.
std::optional<ApiError> token_array(const json& arr, const std::string& where, std::vector<TokenId>& out) {
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      return bad("input", "'" + where + "[" + std::to_string(i) + "]': a token id must be an integer in [0, 2^31)",
                 "invalid_type");
    }
    out.push_back(static_cast<TokenId>(t.get<int64_t>()));
  }
  if (out.empty()) return bad("input", "'" + where + "': an empty token array cannot be embedded");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_embedding_request(std::string_view body, EmbeddingRequest& out) {
  json obj;
  SPW_TRY_FIELD(json_fields::parse_object(body, obj));
  SPW_TRY_FIELD(json_fields::refuse_unknown(obj, "/v1/embeddings", {kEmbeddingFields}));
  std::optional<std::string> model, format, user;
  SPW_TRY_FIELD(json_fields::get_string(obj, "model", model));
  SPW_TRY_FIELD(json_fields::get_string(obj, "encoding_format", format));
  SPW_TRY_FIELD(json_fields::get_string(obj, "user", user));
  if (model) out.model = *model;
  if (format && *format != "float" && *format != "base64") {
    return bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\", got \"" + input_excerpt(*format) +
                                      "\"");
  }
  out.base64 = format && *format == "base64";
  std::optional<int64_t> dims;
  SPW_TRY_FIELD(json_fields::get_int(obj, "dimensions", dims));
  if (dims && *dims < 1) return bad("dimensions", "'dimensions' must be >= 1, got " + std::to_string(*dims));
  out.dimensions = dims;

  auto it = obj.find("input");
  if (it == obj.end() || it->is_null()) return bad("input", "'input' is required");
  const json& in = *it;
  if (in.is_string()) {
    if (in.get<std::string>().empty()) return bad("input", "'input': an empty string cannot be embedded");
    out.texts.push_back(in.get<std::string>());
    return std::nullopt;
  }
  if (!in.is_array()) return wrong_type("input", "a string, an array of strings or an array of token ids", in);
  if (in.empty()) return bad("input", "'input' must not be an empty array");
  if (in.size() > kMaxEmbeddingInputs) {
    return bad("input", "'input' holds " + std::to_string(in.size()) + " inputs; at most " +
                            std::to_string(kMaxEmbeddingInputs) + " per request");
  }
  if (in[0].is_number_integer()) {  // one input as token ids
    std::vector<TokenId> ids;
    SPW_TRY_FIELD(token_array(in, "input", ids));
    out.token_ids.push_back(std::move(ids));
    return std::nullopt;
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string where = "input[" + std::to_string(i) + "]";
    const bool text = in[0].is_string();
    if (text && in[i].is_string()) {
      if (in[i].get<std::string>().empty()) return bad("input", "'" + where + "': an empty string cannot be embedded");
      out.texts.push_back(in[i].get<std::string>());
    } else if (!text && in[i].is_array()) {
      std::vector<TokenId> ids;
      SPW_TRY_FIELD(token_array(in[i], where, ids));
      out.token_ids.push_back(std::move(ids));
    } else {
      return bad("input", "'" + where + "': every input of one request must be of one form (strings, or arrays of "
                          "token ids)", "invalid_type");
    }
  }
  return std::nullopt;
}

std::string floats_base64(const std::vector<float>& v) {
  std::string raw(v.size() * sizeof(float), '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits = std::bit_cast<uint32_t>(v[i]);
    for (int b = 0; b < 4; ++b) raw[i * 4 + static_cast<size_t>(b)] = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  std::string out(4 * ((raw.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(raw.data()), static_cast<int>(raw.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string render_embeddings(const serve::Embeddings& e, bool base64, const std::string& model,
                              const SpillwayInfo& info) {
  json data = json::array();
  for (size_t i = 0; i < e.vectors.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      item["embedding"] = floats_base64(e.vectors[i]);
    } else {
      item["embedding"] = e.vectors[i];
    }
    data.push_back(std::move(item));
  }
  json j = {{"object", "list"},
            {"data", std::move(data)},
            {"model", model},
            {"usage", {{"prompt_tokens", e.prompt_tokens}, {"total_tokens", e.prompt_tokens}}},
            {"spillway", json_fields::spillway_json(info)}};
  return json_fields::dump(j);
}

}  // namespace spw::http
