#include "http/openai.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace spw::http {
namespace {

using nlohmann::json;

ApiError completion_error(const std::string& body) {
  CompletionRequest r;
  auto e = parse_completion_request(body, r);
  EXPECT_TRUE(e.has_value()) << body;
  return e.value_or(ApiError{});
}

ApiError chat_error(const std::string& body) {
  ChatRequest r;
  auto e = parse_chat_request(body, r);
  EXPECT_TRUE(e.has_value()) << body;
  return e.value_or(ApiError{});
}

TEST(OpenAiParse, CompletionFieldsAreRead) {
  CompletionRequest r;
  auto e = parse_completion_request(
      R"({"model":"m","prompt":"Once upon a time","max_tokens":20,"temperature":0,"top_p":0.9,"top_k":5,)"
      R"("min_p":0.1,"repeat_penalty":1.1,"seed":42,"stop":["\n","The end"],"stream":true,)"
      R"("stream_options":{"include_usage":true},"user":"someone","n":1})",
      r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "Once upon a time");
  EXPECT_EQ(r.sampling.max_tokens, 20);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(*r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(*r.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"\n", "The end"}));
  EXPECT_TRUE(r.sampling.stream);
  EXPECT_TRUE(r.sampling.include_usage);
}

TEST(OpenAiParse, StopMayBeAStringAndPromptASingletonArray) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":["hi"],"stop":"x"})", r).has_value());
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"x"});
  EXPECT_FALSE(r.sampling.max_tokens.has_value());
  EXPECT_FALSE(r.sampling.stream);
}

TEST(OpenAiParse, NegativeSeedKeepsItsBits) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","seed":-1})", r).has_value());
  EXPECT_EQ(r.sampling.seed, ~uint64_t{0});
}

TEST(OpenAiParse, InvalidJsonIs400) {
  ApiError e = completion_error("{\"prompt\": ");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("not valid JSON"), std::string::npos);
  EXPECT_EQ(completion_error("[1,2]").code, "invalid_json");
  EXPECT_EQ(completion_error("").code, "invalid_json");
}

TEST(OpenAiParse, BadFieldsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* needle;
  };
  const Case cases[] = {
      {R"({})", "prompt", "required"},
      {R"({"prompt":""})", "prompt", "empty"},
      {R"({"prompt":7})", "prompt", "string"},
      {R"({"prompt":["a","b"]})", "prompt", "one string"},
      {R"({"prompt":"a","max_tokens":-5})", "max_tokens", ">= 1"},
      {R"({"prompt":"a","max_tokens":0})", "max_tokens", ">= 1"},
      {R"({"prompt":"a","max_tokens":"10"})", "max_tokens", "integer"},
      {R"({"prompt":"a","max_tokens":2.5})", "max_tokens", "integer"},
      {R"({"prompt":"a","temperature":"NaN"})", "temperature", "number"},
      {R"({"prompt":"a","temperature":-0.1})", "temperature", "[0"},
      {R"({"prompt":"a","temperature":true})", "temperature", "number"},
      {R"({"prompt":"a","top_p":1.5})", "top_p", "top_p"},
      {R"({"prompt":"a","top_k":-1})", "top_k", ">= 0"},
      {R"({"prompt":"a","min_p":2})", "min_p", "min_p"},
      {R"({"prompt":"a","repeat_penalty":0})", "repeat_penalty", "repeat_penalty"},
      {R"({"prompt":"a","seed":"x"})", "seed", "integer"},
      {R"({"prompt":"a","stop":5})", "stop", "string"},
      {R"({"prompt":"a","stop":["ok",3]})", "stop[1]", "string"},
      {R"({"prompt":"a","stream":"yes"})", "stream", "boolean"},
      {R"({"prompt":"a","n":2})", "n", "n=1"},
      {R"({"prompt":"a","model":5})", "model", "string"},
      {R"({"prompt":"a","echo":true})", "echo", "not supported"},
      {R"({"prompt":"a","logprobs":5})", "logprobs", "not supported"},
      {R"({"prompt":"a","stream_options":{"include_usage":1}})", "stream_options.include_usage", "boolean"},
  };
  for (const Case& c : cases) {
    ApiError e = completion_error(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.needle), std::string::npos) << c.body << " -> " << e.message;
  }
}

TEST(OpenAiParse, HugeNumbersAreRejectedNotInfinite) {
  // 1e999 overflows a double: either the parser or the finiteness check must refuse it.
  ApiError e = completion_error(R"({"prompt":"a","temperature":1e999})");
  EXPECT_EQ(e.http_status, 400);
}

TEST(OpenAiParse, ChatMessages) {
  ChatRequest r;
  auto e = parse_chat_request(
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"},)"
      R"({"type":"text","text":" there"}]},{"role":"assistant","content":null},{"role":"developer","content":"x"}],)"
      R"("max_completion_tokens":7})",
      r);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[3].role, "system");
  EXPECT_EQ(r.sampling.max_tokens, 7);
}

TEST(OpenAiParse, BadChatMessages) {
  EXPECT_EQ(chat_error(R"({})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages":[5]})").param, "messages[0]");
  EXPECT_EQ(chat_error(R"({"messages":[{"content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"robot","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})").param,
            "messages[0].content[0]");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})").param,
            "tools");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})").param, "max_tokens");
}

// The mapping follows the typed reason and field, never the message text.
TEST(OpenAiStatus, MapsReasonsToHttp) {
  const Status queue_full(StatusCode::kResourceExhausted, "anything", FailureReason::kQueueFull);
  EXPECT_EQ(api_error_from_status(queue_full).http_status, 429);
  EXPECT_EQ(api_error_from_status(queue_full).code, "queue_full");
  // Same words, no reason: the generic code, not a guess from the text.
  EXPECT_EQ(api_error_from_status(Status::resource_exhausted("request queue is full")).code, "resource_exhausted");
  EXPECT_EQ(api_error_from_status(Status::unavailable("x")).http_status, 503);
  EXPECT_EQ(api_error_from_status(Status::internal("x")).http_status, 500);
  ApiError e = api_error_from_status(
      Status(StatusCode::kInvalidArgument, "900 tokens is too long", FailureReason::kContextFull, "prompt"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(api_error_from_status(invalid_field("top_p", "top_p must be >= 0")).param, "top_p");
  const Status no_path(StatusCode::kUnavailable, "no path", FailureReason::kNoPath);
  EXPECT_EQ(api_error_from_status(no_path).http_status, 503);
  EXPECT_EQ(api_error_from_status(no_path).code, "no_path");
  // Cancelled is 499: not a status OpenAI clients retry on their own.
  EXPECT_EQ(api_error_from_status(Status(StatusCode::kCancelled, "x", FailureReason::kCancelled)).http_status, 499);
}

TEST(OpenAiRender, ErrorShape) {
  ApiError e;
  e.message = "bad";
  e.param = "prompt";
  json j = json::parse(render_error(e));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "prompt");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiRender, CompletionCarriesUsageAndSpillway) {
  CompletionResult r;
  r.id = "cmpl-1";
  r.created = 5;
  r.model = "stories";
  r.text = "Lily \xff";  // a stray byte must not break rendering
  r.finish_reason = "length";
  r.prompt_tokens = 3;
  r.completion_tokens = 4;
  r.spillway.model = "stories";
  r.spillway.limits.n_ctx = 512;
  r.spillway.limits.max_tokens = 509;
  r.spillway.limits.max_tokens_requested = 1000;
  r.spillway.limits.max_tokens_clamped = true;
  json j = json::parse(render_completion(r));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
  EXPECT_EQ(j["spillway"]["placement"], "cpu");
  EXPECT_EQ(j["spillway"]["limits"]["max_tokens_clamped"], true);
  EXPECT_EQ(j["spillway"]["limits"]["max_tokens"], 509);
  json c = json::parse(render_chat_completion(r));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["role"], "assistant");
}

TEST(OpenAiRender, ChunksAndSse) {
  ChunkFields f;
  f.id = "chatcmpl-1";
  f.model = "m";
  f.role_delta = true;
  json first = json::parse(render_chat_chunk(f));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("spillway"));
  f.role_delta = false;
  f.finish_reason = "stop";
  SpillwayInfo info;
  f.spillway = &info;
  json last = json::parse(render_chat_chunk(f));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["spillway"]["placement"], "cpu");
  EXPECT_EQ(sse_data("{}"), "data: {}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

admission::Decision shrink_decision() {
  admission::Decision d;
  d.kind = admission::DecisionKind::kShrink;
  d.path_index = 0;
  d.path = "gpu";
  d.reason = "shrunk to 64 tokens: 12 KV blocks free on gpu";
  d.http_status = 200;
  d.n_ctx = 512;
  d.prompt_tokens = 9;
  d.max_tokens = 64;
  d.max_tokens_requested = 400;
  d.shrunk = true;
  d.kv_blocks = 5;
  d.queue_position = 2;
  d.timing = {0.25, 0.5, std::numeric_limits<double>::infinity()};
  d.pressure = 0.75;
  d.verdicts = {{"gpu", true, "fits", {}}, {"cpu", false, "queue full (4 of 4)", {}}};
  return d;
}

TEST(OpenAiRender, DecisionCarriesItsReasonAndFigures) {
  const json j = json::parse(render_decision(shrink_decision()));
  EXPECT_EQ(j["kind"], "shrink");
  EXPECT_EQ(j["path"], "gpu");
  EXPECT_EQ(j["reason"], "shrunk to 64 tokens: 12 KV blocks free on gpu");
  EXPECT_TRUE(j["failure"].is_null());
  EXPECT_EQ(j["http_status"], 200);
  EXPECT_FALSE(j.contains("retry_after_s")) << "admitted: nothing to retry";
  EXPECT_EQ(j["limits"]["n_ctx"], 512);
  EXPECT_EQ(j["limits"]["prompt_tokens"], 9);
  EXPECT_EQ(j["limits"]["max_tokens"], 64);
  EXPECT_EQ(j["limits"]["max_tokens_requested"], 400);
  EXPECT_EQ(j["limits"]["shrunk"], true);
  EXPECT_EQ(j["limits"]["kv_blocks"], 5);
  EXPECT_EQ(j["queue_position"], 2);
  EXPECT_DOUBLE_EQ(j["estimated_delay_ms"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(j["predicted_ttft_ms"].get<double>(), 500.0);
  EXPECT_TRUE(j["predicted_total_ms"].is_null()) << "unknown, not infinite";
  EXPECT_DOUBLE_EQ(j["pressure"].get<double>(), 0.75);
  ASSERT_EQ(j["verdicts"].size(), 2u);
  EXPECT_EQ(j["verdicts"][1], json({{"path", "cpu"}, {"eligible", false}, {"reason", "queue full (4 of 4)"}}));

  admission::Decision reject;  // kReject by default
  reject.reason = "every path's queue is full";
  reject.failure = FailureReason::kQueueFull;
  reject.http_status = 429;
  reject.retry_after_s = 3.5;
  const json r = json::parse(render_decision(reject));
  EXPECT_EQ(r["kind"], "reject");
  EXPECT_TRUE(r["path"].is_null());
  EXPECT_EQ(r["failure"], "queue_full");
  EXPECT_EQ(r["http_status"], 429);
  EXPECT_DOUBLE_EQ(r["retry_after_s"].get<double>(), 3.5);
  reject.failure = FailureReason::kNoPath;
  reject.http_status = 503;
  EXPECT_TRUE(json::parse(render_decision(reject))["retry_after_s"].is_null()) << "only a full queue has an ETA";
}

TEST(OpenAiRender, RequestRecordShowsTheStoredAdmission) {
  journal::Record r;
  r.id = 3;
  r.state = journal::RequestState::kDone;
  const json none = json::parse(render_request_record(r));
  ASSERT_TRUE(none.contains("admission"));
  EXPECT_TRUE(none["admission"].is_null());
  r.admission = render_decision(shrink_decision());
  const json with = json::parse(render_request_record(r));
  EXPECT_EQ(with["admission"], json::parse(r.admission)) << "an object, not a string holding one";
  r.admission = "{truncated";
  EXPECT_TRUE(json::parse(render_request_record(r))["admission"].is_null());
}

}  // namespace
}  // namespace spw::http
