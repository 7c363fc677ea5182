// POST /v1/embeddings' body and response (http/embeddings.h): every input
// form OpenAI defines, the refusals naming their field, base64 as the
// official clients decode it.
#include "http/embeddings.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

namespace spw::http {
namespace {

using json = nlohmann::json;

EmbeddingRequest parsed(const std::string& body) {
  EmbeddingRequest r;
  auto e = parse_embedding_request(body, r);
  EXPECT_FALSE(e.has_value()) << body << ": " << (e ? e->message : "");
  return r;
}

ApiError refused(const std::string& body) {
  EmbeddingRequest r;
  auto e = parse_embedding_request(body, r);
  EXPECT_TRUE(e.has_value()) << body;
  return e.value_or(ApiError{});
}

TEST(EmbeddingsApi, EveryInputForm) {
  EXPECT_EQ(parsed(R"({"input":"hello","model":"m"})").texts, std::vector<std::string>{"hello"});
  EXPECT_EQ(parsed(R"({"input":["a","b"]})").texts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(parsed(R"({"input":[1,2,3]})").token_ids, (std::vector<std::vector<TokenId>>{{1, 2, 3}}));
  EXPECT_EQ(parsed(R"({"input":[[1],[2,3]]})").token_ids, (std::vector<std::vector<TokenId>>{{1}, {2, 3}}));
  const EmbeddingRequest r = parsed(R"({"input":"x","encoding_format":"base64","dimensions":64,"user":"u"})");
  EXPECT_TRUE(r.base64);
  EXPECT_EQ(r.dimensions, 64);
  EXPECT_FALSE(parsed(R"({"input":"x","encoding_format":"float"})").base64);
}

TEST(EmbeddingsApi, RefusalsNameTheField) {
  EXPECT_EQ(refused(R"({"model":"m"})").param, "input");
  EXPECT_EQ(refused(R"({"input":""})").param, "input");
  EXPECT_EQ(refused(R"({"input":[]})").param, "input");
  EXPECT_EQ(refused(R"({"input":["a",""]})").message, "'input[1]': an empty string cannot be embedded");
  EXPECT_EQ(refused(R"({"input":["a",[1]]})").code, "invalid_type");
  EXPECT_EQ(refused(R"({"input":[[1],[]]})").param, "input");
  EXPECT_EQ(refused(R"({"input":[1,-2]})").code, "invalid_type");
  EXPECT_EQ(refused(R"({"input":7})").code, "invalid_type");
  EXPECT_EQ(refused(R"({"input":"x","encoding_format":"int8"})").param, "encoding_format");
  EXPECT_EQ(refused(R"({"input":"x","dimensions":0})").param, "dimensions");
  const ApiError unknown = refused(R"({"input":"x","truncate":true})");
  EXPECT_EQ(unknown.code, "unknown_parameter");
  EXPECT_EQ(unknown.param, "truncate");
  json many = {{"input", json::array()}};
  for (size_t i = 0; i <= kMaxEmbeddingInputs; ++i) many["input"].push_back("a");
  EXPECT_NE(refused(many.dump()).message.find("at most 2048"), std::string::npos);
}

TEST(EmbeddingsApi, RendersFloatsAndLittleEndianBase64) {
  serve::Embeddings e;
  e.vectors = {{1.0f, -2.5f}, {0.25f, 0.0f}};
  e.prompt_tokens = 9;
  SpillwayInfo info;
  info.path = "gpu/emb";
  const json f = json::parse(render_embeddings(e, false, "emb", info));
  EXPECT_EQ(f["object"], "list");
  EXPECT_EQ(f["model"], "emb");
  EXPECT_EQ(f["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(f["data"][1]["index"], 1);
  EXPECT_EQ(f["data"][0]["embedding"], json::parse("[1.0,-2.5]"));
  EXPECT_EQ(f["spillway"]["path"], "gpu/emb");
  const json b = json::parse(render_embeddings(e, true, "emb", info));
  // 1.0f = 00 00 80 3f, -2.5f = 00 00 20 c0 (little-endian).
  EXPECT_EQ(b["data"][0]["embedding"], "AACAPwAAIMA=");
  EXPECT_EQ(floats_base64({}), "");
}

}  // namespace
}  // namespace spw::http
