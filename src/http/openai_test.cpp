#include "http/openai.h"
#include "http/completion_prompt.h"

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
      {R"({"prompt":["a","b"]})", "prompt", "a batch of 2 prompts"},
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
      {R"({"prompt":"a","n":0})", "n", "[1, 16]"},
      {R"({"prompt":"a","n":17})", "n", "[1, 16]"},
      {R"({"prompt":"a","n":2,"best_of":1})", "best_of", ">= n"},
      {R"({"prompt":"a","n":2,"best_of":3})", "best_of", "best_of > n is not supported"},
      {R"({"prompt":"a","n":2,"echo":true})", "echo", "n > 1"},
      {R"({"prompt":"a","model":5})", "model", "string"},
      {R"({"prompt":"a","echo":"yes"})", "echo", "boolean"},
      {R"({"prompt":"a","logprobs":6})", "logprobs", "[0, 5]"},
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
            "tools[0].function");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})").param, "max_tokens");
}

// ---- Strict parsing: one JSON value, nothing after it ----

TEST(OpenAiStrict, TrailingBytesAfterTheValueAre400) {
  using namespace std::string_literals;
  struct Case {
    std::string body;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"prompt":"a"} x)", "byte offset 15"},
      {R"({"prompt":"a"}{"x":1})", "byte offset 14"},
      // nlohmann's lexer takes a NUL for the end of input: without the check
      // this parsed as {"prompt":"a"} and the rest was dropped.
      {"{\"prompt\":\"a\"}\0{\"x\":1}"s, "NUL byte at byte offset 14"},
      {"{\"prompt\":\"a\"}\0"s, "NUL byte at byte offset 14"},
      {"{\"prompt\":\"a\0b\"}"s, "NUL byte at byte offset 12"},
      {"\0"s, "NUL byte at byte offset 0"},
  };
  for (const Case& c : cases) {
    CompletionRequest r;
    auto e = parse_completion_request(c.body, r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->code, "invalid_json") << c.body;
    EXPECT_NE(e->message.find(c.needle), std::string::npos) << e->message;
  }
  // The message says what is wrong: a whole value, then more.
  EXPECT_NE(completion_error(R"({"prompt":"a"} x)").message.find("data after the JSON value"), std::string::npos);
  EXPECT_NE(completion_error(R"({"prompt":"a"} 12)").message.find("data after the JSON value"), std::string::npos);
  EXPECT_EQ(completion_error(R"({"prompt":"a" x})").message.find("data after the JSON value"), std::string::npos);
  // The same for chat (one parser; resume, reservation and fault bodies:
  // spillway_api_test).
  ChatRequest chat;
  auto ce = parse_chat_request("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}\0{}"s, chat);
  ASSERT_TRUE(ce.has_value());
  EXPECT_EQ(ce->code, "invalid_json");
  // Whitespace after the value is JSON, not trailing data.
  CompletionRequest ok;
  EXPECT_FALSE(parse_completion_request("{\"prompt\":\"a\"} \r\n\t ", ok).has_value());
  EXPECT_EQ(ok.prompt, "a");
}

TEST(OpenAiStrict, InvalidUtf8Is400WithTheOffset) {
  const std::pair<std::string, size_t> cases[] = {
      {"{\"prompt\":\"\xff\"}", 11},
      {"{\"prompt\":\"\xc0\xaf\"}", 11},          // overlong '/'
      {"{\"prompt\":\"ab\xed\xa0\x80\"}", 13},    // a surrogate
      {"{\"prompt\":\"\xf4\x90\x80\x80\"}", 11},  // past U+10FFFF
      {"{\"prompt\":\"a\"}\xe2\x82", 14},         // cut short at the end
      {"{\"prompt\":\"\x80\"}", 11},              // a lone continuation byte
  };
  for (const auto& [body, offset] : cases) {
    ApiError e = completion_error(body);
    EXPECT_EQ(e.code, "invalid_json");
    EXPECT_NE(e.message.find("invalid UTF-8 at byte offset " + std::to_string(offset)), std::string::npos)
        << e.message;
  }
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request("{\"prompt\":\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9d\x84\x9e\"}", r).has_value());
  EXPECT_EQ(r.prompt, "h\xc3\xa9llo \xe2\x82\xac \xf0\x9d\x84\x9e");
}

TEST(OpenAiStrict, SyntaxErrorsNameTheOffset) {
  ApiError e = completion_error(R"({"prompt": tru})");
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("byte offset"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("syntax error"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("last read"), std::string::npos) << e.message;
}

// ---- Errors quote only a short excerpt of the input ----

TEST(OpenAiStrict, InputExcerptIsShortAndSaysHowLong) {
  EXPECT_EQ(input_excerpt("short"), "short");
  EXPECT_EQ(input_excerpt(std::string(40, 'x')), std::string(40, 'x'));
  EXPECT_EQ(input_excerpt(std::string(41, 'x')), std::string(40, 'x') + "... (41 bytes)");
  // Never splits a UTF-8 character: 30 two-byte characters cut at 41 bytes
  // keep 20 whole ones.
  std::string accents;
  for (int i = 0; i < 30; ++i) accents += "\xc3\xa9";
  const std::string cut = input_excerpt(accents, 41);
  EXPECT_EQ(cut.substr(0, cut.find("...")).size(), 40u);
  EXPECT_NE(cut.find("(60 bytes)"), std::string::npos);
}

TEST(OpenAiStrict, HugeBodiesGetSmallErrors) {
  const std::string big(5 * 1024 * 1024, 'a');
  const std::string bodies[] = {
      // Invalid JSON whose last token is 5 MB (nlohmann's message quotes it).
      "{\"prompt\":\"" + big,
      "{\"prompt\":\"" + big + "\" x}",
      "{\"prompt\":" + big + "}",
      // A 5 MB number: out of range, and its exception quotes it.
      "{\"prompt\":\"a\",\"temperature\":1" + std::string(5 * 1024 * 1024, '0') + "}",
      // Wrong-typed or refused values that are 5 MB long.
      "{\"prompt\":\"a\",\"temperature\":\"" + big + "\"}",
      "{\"prompt\":\"a\",\"service_tier\":\"" + big + "\"}",
      "{\"prompt\":\"a\",\"logit_bias\":{\"" + big + "\":1}}",
      "{\"prompt\":\"a\",\"stream_options\":{\"" + big + "\":1}}",
      // A 5 MB unknown field name (also the error's param).
      "{\"prompt\":\"a\",\"" + big + "\":1}",
  };
  for (const std::string& body : bodies) {
    ApiError e = completion_error(body);
    EXPECT_EQ(e.http_status, 400);
    const std::string rendered = render_error(e, "model");
    EXPECT_LT(rendered.size(), 2048u) << rendered.substr(0, 300);
    EXPECT_TRUE(json::accept(rendered));
  }
  ApiError role = chat_error("{\"messages\":[{\"role\":\"" + big + "\",\"content\":\"x\"}]}");
  EXPECT_EQ(role.param, "messages[0].role");
  EXPECT_LT(render_error(role).size(), 2048u);
  EXPECT_NE(role.message.find("(5242880 bytes)"), std::string::npos) << role.message;
}

TEST(OpenAiRender, ErrorMessageAndParamAreBounded) {
  ApiError e;
  e.message = std::string(100000, 'm');
  e.param = std::string(100000, 'p');
  const json j = json::parse(render_error(e));
  const std::string message = j["error"]["message"];
  EXPECT_LE(message.size(), kMaxErrorMessageBytes + 24);
  EXPECT_NE(message.find("(100000 bytes)"), std::string::npos);
  EXPECT_LE(j["error"]["param"].get<std::string>().size(), kMaxParamBytes + 24);
  admission::Decision d;
  d.kind = admission::DecisionKind::kReject;
  d.http_status = 503;
  EXPECT_LT(render_refusal(e, "m", d).size(), 2048u);
}

// ---- Unknown fields are refused, never ignored ----

TEST(OpenAiStrict, UnknownFieldsAreRefused) {
  ApiError e = completion_error(R"({"prompt":"a","max_token":5})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "unknown_parameter");
  EXPECT_EQ(e.param, "max_token");
  EXPECT_NE(e.message.find("Unrecognized request argument supplied: max_token"), std::string::npos) << e.message;
  // The message lists what the endpoint takes, whole (not cut by the bound).
  EXPECT_NE(e.message.find("max_completion_tokens"), std::string::npos) << e.message;
  EXPECT_LE(e.message.size(), kMaxErrorMessageBytes);
  // Fields of the other endpoint are unknown here.
  EXPECT_EQ(completion_error(R"({"prompt":"a","messages":[]})").param, "messages");
  EXPECT_EQ(completion_error(R"({"prompt":"a","tool_choice":"none"})").code, "unknown_parameter");
  ApiError c = chat_error(R"({"messages":[{"role":"user","content":"x"}],"prompt":"a"})");
  EXPECT_EQ(c.code, "unknown_parameter");
  EXPECT_EQ(c.param, "prompt");
  EXPECT_LE(c.message.size(), kMaxErrorMessageBytes);
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"functions":[]})").param, "functions");
  // The longest list (chat's) with the longest excerpt of a name is whole.
  ApiError long_name =
      chat_error(json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {std::string(5000, 'k'), 1}}.dump());
  EXPECT_LE(long_name.message.size(), kMaxErrorMessageBytes);
  EXPECT_NE(long_name.message.find("keep_alive)"), std::string::npos) << long_name.message;
  // vLLM's other parameters are unknown here, named as such.
  for (const char* vllm : {"use_beam_search", "include_stop_str_in_output", "allowed_token_ids", "bad_words",
                           "spaces_between_special_tokens", "prompt_logprobs", "guided_json"}) {
    ApiError v = completion_error(std::string(R"({"prompt":"a",")") + vllm + "\":null}");
    EXPECT_EQ(v.code, "unknown_parameter") << vllm;
    EXPECT_EQ(v.param, vllm);
    EXPECT_NE(v.message.find("repetition_penalty"), std::string::npos) << v.message;
  }
  // Nested: stream_options has one key.
  ApiError so = completion_error(R"({"prompt":"a","stream_options":{"include_usage":true,"chunk":1}})");
  EXPECT_EQ(so.code, "unknown_parameter");
  EXPECT_EQ(so.param, "stream_options.chunk");
}

// Every listed field is one the parser reads: null (the default) passes.
TEST(OpenAiStrict, EveryAcceptedFieldIsAcceptedAsNull) {
  for (std::string_view f : kSharedGenerationFields) {
    CompletionRequest r;
    const std::string body = R"({"prompt":"a",")" + std::string(f) + R"(":null})";
    auto e = parse_completion_request(body, r);
    EXPECT_FALSE(e.has_value()) << body << " -> " << e->message;
    ChatRequest c;
    const std::string cbody = R"({"messages":[{"role":"user","content":"x"}],")" + std::string(f) + R"(":null})";
    auto ce = parse_chat_request(cbody, c);
    EXPECT_FALSE(ce.has_value()) << cbody << " -> " << ce->message;
  }
  for (std::string_view f : kCompletionOnlyFields) {
    if (f == "prompt") continue;
    CompletionRequest r;
    EXPECT_FALSE(parse_completion_request(R"({"prompt":"a",")" + std::string(f) + R"(":null})", r).has_value()) << f;
  }
  for (std::string_view f : kChatOnlyFields) {
    if (f == "messages") continue;
    ChatRequest c;
    EXPECT_FALSE(
        parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],")" + std::string(f) + R"(":null})", c)
            .has_value())
        << f;
  }
}

TEST(OpenAiStrict, MetadataFieldsAreAcceptedAndChangeNothing) {
  ChatRequest c;
  auto e = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"user":"u1","metadata":{"k":"v"},"store":false,)"
      R"("service_tier":"auto","parallel_tool_calls":true,"tool_choice":"none",)"
      R"("stream_options":{"include_usage":true},"stream":true})",
      c);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_TRUE(c.sampling.include_usage);
  CompletionRequest r;
  ASSERT_FALSE(
      parse_completion_request(R"({"prompt":"a","service_tier":"default","store":null,"metadata":{}})", r).has_value());

  struct Case {
    const char* body;
    const char* param;
    const char* code;
  };
  const Case cases[] = {
      {R"({"prompt":"a","store":true})", "store", "unsupported_parameter"},
      {R"({"prompt":"a","service_tier":"flex"})", "service_tier", "unsupported_parameter"},
      {R"({"prompt":"a","metadata":5})", "metadata", "invalid_type"},
      {R"({"prompt":"a","user":7})", "user", "invalid_type"},
  };
  for (const Case& k : cases) {
    ApiError err = completion_error(k.body);
    EXPECT_EQ(err.param, k.param) << k.body;
    EXPECT_EQ(err.code, k.code) << k.body;
  }
  const std::string chat_prefix = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(chat_error(chat_prefix + R"("tool_choice":"required"})").code, "unsupported_parameter");
  EXPECT_EQ(chat_error(chat_prefix + R"("tool_choice":{"type":"function"}})").code, "unsupported_parameter");
  EXPECT_EQ(chat_error(chat_prefix + R"("parallel_tool_calls":"yes"})").code, "invalid_type");
}

// ---- max_completion_tokens, penalties, logit_bias ----

TEST(OpenAiParse, MaxCompletionTokensOnBothEndpoints) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","max_completion_tokens":7})", r).has_value());
  EXPECT_EQ(r.sampling.max_tokens, 7);
  CompletionRequest same;
  ASSERT_FALSE(
      parse_completion_request(R"({"prompt":"a","max_tokens":9,"max_completion_tokens":9})", same).has_value());
  EXPECT_EQ(same.sampling.max_tokens, 9);
  ApiError differ = completion_error(R"({"prompt":"a","max_tokens":9,"max_completion_tokens":8})");
  EXPECT_EQ(differ.param, "max_completion_tokens");
  EXPECT_NE(differ.message.find("differ"), std::string::npos) << differ.message;
  EXPECT_EQ(completion_error(R"({"prompt":"a","max_completion_tokens":0})").param, "max_completion_tokens");
  EXPECT_EQ(completion_error(R"({"prompt":"a","max_completion_tokens":"5"})").code, "invalid_type");
  const std::string chat_prefix = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(chat_error(chat_prefix + R"("max_tokens":3,"max_completion_tokens":4})").param, "max_completion_tokens");
  ChatRequest c;
  ASSERT_FALSE(parse_chat_request(chat_prefix + R"("max_tokens":4,"max_completion_tokens":4})", c).has_value());
  EXPECT_EQ(c.sampling.max_tokens, 4);
}

// A cost limit's refusal: 400, the param, and a message naming the limit and
// the size sent.
void expect_over_limit(const ApiError& e, const std::string& param, size_t limit, size_t got) {
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, param);
  EXPECT_NE(e.message.find("at most " + std::to_string(limit) + " bytes"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("got " + std::to_string(got) + " bytes"), std::string::npos) << e.message;
}

TEST(OpenAiLimits, StopStringBytes) {
  CompletionRequest r;
  const std::string at_limit(kMaxStopBytes, 's');
  ASSERT_FALSE(parse_completion_request(json{{"prompt", "a"}, {"stop", at_limit}}.dump(), r).has_value());
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{at_limit});
  const std::string over(kMaxStopBytes + 1, 's');
  expect_over_limit(completion_error(json{{"prompt", "a"}, {"stop", over}}.dump()), "stop", kMaxStopBytes,
                    kMaxStopBytes + 1);
  // In an array the string is named by its index, on both endpoints.
  expect_over_limit(completion_error(json{{"prompt", "a"}, {"stop", {"x", over}}}.dump()), "stop[1]", kMaxStopBytes,
                    kMaxStopBytes + 1);
  expect_over_limit(chat_error(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stop", {over}}}.dump()),
                    "stop[0]", kMaxStopBytes, kMaxStopBytes + 1);
}

TEST(OpenAiLimits, StopStringsTogether) {
  static_assert(kMaxStopTotalBytes % kMaxStopBytes == 0 && kMaxStopTotalBytes / kMaxStopBytes < kMaxStop);
  std::vector<std::string> stops(kMaxStopTotalBytes / kMaxStopBytes, std::string(kMaxStopBytes, 's'));
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(json{{"prompt", "a"}, {"stop", stops}}.dump(), r).has_value());
  EXPECT_EQ(r.sampling.stop, stops);
  stops.push_back("x");
  expect_over_limit(completion_error(json{{"prompt", "a"}, {"stop", stops}}.dump()), "stop", kMaxStopTotalBytes,
                    kMaxStopTotalBytes + 1);
  // The count limit still holds on its own.
  const std::vector<std::string> many(kMaxStop + 1, "x");
  const ApiError e = completion_error(json{{"prompt", "a"}, {"stop", many}}.dump());
  EXPECT_EQ(e.param, "stop");
  EXPECT_NE(e.message.find("at most " + std::to_string(kMaxStop) + " strings"), std::string::npos) << e.message;
}

TEST(OpenAiLimits, SixteenMegabyteStopStringsAreRefused) {
  // The hostile request: 16 stop strings of 1 MB with max_tokens 2000.
  const std::vector<std::string> stops(16, std::string(1 << 20, 'z'));
  const ApiError e = completion_error(json{{"prompt", "a"}, {"max_tokens", 2000}, {"stop", stops}}.dump());
  expect_over_limit(e, "stop[0]", kMaxStopBytes, size_t{1} << 20);
  EXPECT_LE(e.message.size(), kMaxErrorMessageBytes);  // none of the 16 MB comes back
}

TEST(OpenAiLimits, ToolsBytes) {
  // One tool whose compact JSON array is exactly the limit, padded in its description.
  const auto body = [](size_t tools_bytes) {
    json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"description", ""}}}}});
    const size_t base = tools.dump().size();
    tools[0]["function"]["description"] = std::string(tools_bytes - base, 'd');
    EXPECT_EQ(tools.dump().size(), tools_bytes);
    return json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}}.dump();
  };
  ChatRequest r;
  const auto ok = parse_chat_request(body(kMaxToolsBytes), r);
  ASSERT_FALSE(ok.has_value()) << ok->message;
  EXPECT_EQ(r.tools.size(), 1u);
  expect_over_limit(chat_error(body(kMaxToolsBytes + 1)), "tools", kMaxToolsBytes, kMaxToolsBytes + 1);
}

TEST(OpenAiLimits, PromptBytes) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(json{{"prompt", std::string(kMaxPromptBytes, 'p')}}.dump(), r).has_value());
  EXPECT_EQ(r.prompt.size(), kMaxPromptBytes);
  expect_over_limit(completion_error(json{{"prompt", std::string(kMaxPromptBytes + 1, 'p')}}.dump()), "prompt",
                    kMaxPromptBytes, kMaxPromptBytes + 1);
  // Chat: the messages' text together (content parts and tool-call
  // arguments count; the limit is on all of it, not each message).
  const auto chat = [](size_t total) {
    const std::string args = R"({"q":"x"})";
    const size_t rest = total - args.size() - 1;
    return json{{"messages",
                 {{{"role", "system"}, {"content", std::string(rest / 2, 's')}},
                  {{"role", "user"}, {"content", {{{"type", "text"}, {"text", std::string(rest - rest / 2, 'u')}}}}},
                  {{"role", "assistant"},
                   {"tool_calls",
                    {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", args}}}}}}},
                  {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "r"}}}}}
        .dump();
  };
  ChatRequest c;
  const auto ok = parse_chat_request(chat(kMaxPromptBytes), c);
  ASSERT_FALSE(ok.has_value()) << ok->message;
  expect_over_limit(chat_error(chat(kMaxPromptBytes + 1)), "messages", kMaxPromptBytes, kMaxPromptBytes + 1);
}

TEST(OpenAiParse, FrequencyAndPresencePenaltiesAreReadInTheirRange) {
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    const auto value = [&](const std::string& v) {
      CompletionRequest r;
      const std::string body = std::string(R"({"prompt":"a",")") + key + "\":" + v + "}";
      auto e = parse_completion_request(body, r);
      EXPECT_FALSE(e.has_value()) << body << ": " << e->message;
      return std::string(key) == "frequency_penalty" ? r.sampling.frequency_penalty : r.sampling.presence_penalty;
    };
    EXPECT_EQ(value("0.5"), 0.5f);
    EXPECT_EQ(value("-2"), -2.0f);
    EXPECT_EQ(value("2"), 2.0f);
    EXPECT_EQ(value("0"), 0.0f);
    EXPECT_FALSE(value("null").has_value());
    for (const char* out : {"2.01", "-2.5", "100"}) {
      ApiError e = completion_error(std::string(R"({"prompt":"a",")") + key + "\":" + out + "}");
      EXPECT_EQ(e.http_status, 400);
      EXPECT_EQ(e.param, key);
      EXPECT_EQ(e.code, "invalid_value");
      EXPECT_NE(e.message.find("must be in [-2.0, 2.0]"), std::string::npos) << e.message;
    }
    EXPECT_EQ(completion_error(std::string(R"({"prompt":"a",")") + key + "\":\"x\"}").code, "invalid_type");
    ChatRequest c;
    ASSERT_FALSE(parse_chat_request(std::string(R"({"messages":[{"role":"user","content":"x"}],")") + key +
                                        "\":-1}",
                                    c)
                     .has_value());
    EXPECT_EQ(std::string(key) == "frequency_penalty" ? c.sampling.frequency_penalty : c.sampling.presence_penalty,
              -1.0f);
  }
}

TEST(OpenAiParse, LogitBiasIsReadSortedByToken) {
  for (const char* none : {"null", "{}"}) {
    CompletionRequest r;
    EXPECT_FALSE(parse_completion_request(std::string(R"({"prompt":"a","logit_bias":)") + none + "}", r).has_value())
        << none;
    EXPECT_TRUE(r.sampling.logit_bias.empty());
  }
  CompletionRequest r;
  ASSERT_FALSE(
      parse_completion_request(R"({"prompt":"a","logit_bias":{"50256":-100,"7":2.5,"0":100}})", r).has_value());
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<LogitBias>{{0, 100.0f}, {7, 2.5f}, {50256, -100.0f}}));
  ChatRequest c;
  ASSERT_FALSE(
      parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":-1}})", c).has_value());
  EXPECT_EQ(c.sampling.logit_bias, (std::vector<LogitBias>{{1, -1.0f}}));
  struct Case {
    const char* value;
    const char* code;
  };
  const Case bad_values[] = {
      {R"({"abc":1})", "invalid_value"},      {R"({"-1":1})", "invalid_value"},
      {R"({"":1})", "invalid_value"},         {R"({"99999999999":1})", "invalid_value"},
      {R"({"2147483648":1})", "invalid_value"}, {R"({"1":101})", "invalid_value"},
      {R"({"1":-100.5})", "invalid_value"},   {R"({"1":500})", "invalid_value"},
      {R"({"1.5":1})", "invalid_value"},      {R"({"7":1,"007":2})", "invalid_value"},
      {R"({"1":"x"})", "invalid_type"},       {R"([1,2])", "invalid_type"},
      {R"("x")", "invalid_type"},
  };
  for (const Case& c : bad_values) {
    ApiError b = completion_error(std::string(R"({"prompt":"a","logit_bias":)") + c.value + "}");
    EXPECT_EQ(b.http_status, 400) << c.value;
    EXPECT_EQ(b.param, "logit_bias") << c.value;
    EXPECT_EQ(b.code, c.code) << c.value << " -> " << b.message;
  }
}

TEST(OpenAiLimits, LogitBiasEntries) {
  json at_limit = json::object();
  for (size_t i = 0; i < kMaxLogitBias; ++i) at_limit[std::to_string(i)] = -1;
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(json{{"prompt", "a"}, {"logit_bias", at_limit}}.dump(), r).has_value());
  EXPECT_EQ(r.sampling.logit_bias.size(), kMaxLogitBias);
  json over = at_limit;
  over[std::to_string(kMaxLogitBias)] = 1;
  const ApiError e = completion_error(json{{"prompt", "a"}, {"logit_bias", over}}.dump());
  EXPECT_EQ(e.param, "logit_bias");
  EXPECT_NE(e.message.find("at most " + std::to_string(kMaxLogitBias) + " entries, got " +
                           std::to_string(kMaxLogitBias + 1)),
            std::string::npos)
      << e.message;
}

// Token ids are checked against the served model's vocabulary once it is
// known (the server calls check_token_ids after parsing).
TEST(OpenAiParse, TokenIdsAreCheckedAgainstTheVocabulary) {
  CompletionRequest r;
  ASSERT_FALSE(
      parse_completion_request(R"({"prompt":"a","logit_bias":{"511":1,"3":2},"stop_token_ids":[2,511]})", r)
          .has_value());
  EXPECT_FALSE(check_token_ids(r.sampling, 512).has_value());
  auto e = check_token_ids(r.sampling, 511);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "logit_bias");
  EXPECT_NE(e->message.find("token 511"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("511 tokens"), std::string::npos) << e->message;
  r.sampling.logit_bias.clear();
  e = check_token_ids(r.sampling, 511);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "stop_token_ids[1]");
}

// vLLM's spellings of what the engine does.
TEST(OpenAiParse, VllmParameters) {
  CompletionRequest r;
  auto e = parse_completion_request(
      R"({"prompt":"a","max_tokens":10,"repetition_penalty":1.2,"ignore_eos":true,"min_tokens":4,)"
      R"("stop_token_ids":[13,2],"skip_special_tokens":true})",
      r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_FLOAT_EQ(*r.sampling.repeat_penalty, 1.2f);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_EQ(r.sampling.min_tokens, 4);
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<TokenId>{13, 2}));
  CompletionRequest none;
  ASSERT_FALSE(parse_completion_request(
                   R"({"prompt":"a","ignore_eos":null,"min_tokens":null,"stop_token_ids":null,"skip_special_tokens":null})",
                   none)
                   .has_value());
  EXPECT_FALSE(none.sampling.ignore_eos);
  EXPECT_FALSE(none.sampling.min_tokens.has_value());
  EXPECT_TRUE(none.sampling.stop_token_ids.empty());
  // repetition_penalty is repeat_penalty: the same value twice is fine.
  CompletionRequest both;
  ASSERT_FALSE(
      parse_completion_request(R"({"prompt":"a","repeat_penalty":1.3,"repetition_penalty":1.3})", both).has_value());
  EXPECT_FLOAT_EQ(*both.sampling.repeat_penalty, 1.3f);
  const std::string chat_prefix = R"({"messages":[{"role":"user","content":"x"}],)";
  ChatRequest c;
  ASSERT_FALSE(parse_chat_request(chat_prefix + R"("min_tokens":2,"stop_token_ids":[5]})", c).has_value());
  EXPECT_EQ(c.sampling.min_tokens, 2);
  EXPECT_EQ(c.sampling.stop_token_ids, std::vector<TokenId>{5});

  struct Case {
    std::string body;
    const char* param;
    const char* code;
  };
  const Case cases[] = {
      {R"({"prompt":"a","repeat_penalty":1.3,"repetition_penalty":1.2})", "repetition_penalty", "invalid_value"},
      {R"({"prompt":"a","repetition_penalty":0})", "repetition_penalty", "invalid_value"},
      {R"({"prompt":"a","repetition_penalty":"1"})", "repetition_penalty", "invalid_type"},
      {R"({"prompt":"a","ignore_eos":1})", "ignore_eos", "invalid_type"},
      {R"({"prompt":"a","min_tokens":-1})", "min_tokens", "invalid_value"},
      {R"({"prompt":"a","min_tokens":1.5})", "min_tokens", "invalid_type"},
      {R"({"prompt":"a","max_tokens":3,"min_tokens":4})", "min_tokens", "invalid_value"},
      {R"({"prompt":"a","stop_token_ids":5})", "stop_token_ids", "invalid_type"},
      {R"({"prompt":"a","stop_token_ids":[1,-2]})", "stop_token_ids[1]", "invalid_value"},
      {R"({"prompt":"a","stop_token_ids":[1,"2"]})", "stop_token_ids[1]", "invalid_type"},
      {R"({"prompt":"a","stop_token_ids":[2147483648]})", "stop_token_ids[0]", "invalid_value"},
      {R"({"prompt":"a","skip_special_tokens":false})", "skip_special_tokens", "unsupported_parameter"},
      {R"({"prompt":"a","skip_special_tokens":"yes"})", "skip_special_tokens", "invalid_type"},
  };
  for (const Case& k : cases) {
    ApiError b = completion_error(k.body);
    EXPECT_EQ(b.http_status, 400) << k.body;
    EXPECT_EQ(b.param, k.param) << k.body << " -> " << b.message;
    EXPECT_EQ(b.code, k.code) << k.body << " -> " << b.message;
  }
  EXPECT_NE(completion_error(R"({"prompt":"a","skip_special_tokens":false})").message.find("never writes special"),
            std::string::npos);
  std::vector<int> many(kMaxStopTokenIds + 1, 1);
  EXPECT_EQ(completion_error(json{{"prompt", "a"}, {"stop_token_ids", many}}.dump()).param, "stop_token_ids");
  many.pop_back();
  CompletionRequest at_limit;
  EXPECT_FALSE(parse_completion_request(json{{"prompt", "a"}, {"stop_token_ids", many}}.dump(), at_limit).has_value());
}

// seed: the integers a JSON number holds exactly, negative ones as their
// bits; outside that range a 400 naming seed and the range.
TEST(OpenAiParse, SeedIsAJsonSafeInteger) {
  constexpr uint64_t kMax = (uint64_t{1} << 53) - 1;
  CompletionRequest hi;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","seed":9007199254740991})", hi).has_value());
  EXPECT_EQ(hi.sampling.seed, kMax);
  CompletionRequest lo;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","seed":-9007199254740991})", lo).has_value());
  EXPECT_EQ(lo.sampling.seed, ~kMax + 1) << "two's complement of -(2^53 - 1)";
  CompletionRequest zero;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","seed":0})", zero).has_value());
  EXPECT_EQ(zero.sampling.seed, 0u);
  for (const char* seed : {"9007199254740992", "-9007199254740992", "18446744073709551615", "-9223372036854775808"}) {
    const ApiError e = completion_error(std::string(R"({"prompt":"a","seed":)") + seed + "}");
    EXPECT_EQ(e.http_status, 400) << seed;
    EXPECT_EQ(e.type, "invalid_request_error") << seed;
    EXPECT_EQ(e.param, "seed") << seed;
    EXPECT_NE(e.message.find("[-9007199254740991, 9007199254740991]"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find(seed), std::string::npos) << "names the value: " << e.message;
  }
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"}],"seed":9007199254740992})").param, "seed");
  EXPECT_EQ(completion_error(R"({"prompt":"a","seed":1.5})").param, "seed");
}

// logprobs: completions' integer in [0, 5]; chat's boolean with top_logprobs
// in [0, 20], which needs logprobs true.
TEST(OpenAiParse, LogprobsRanges) {
  for (int n : {0, 1, 5}) {
    CompletionRequest r;
    auto e = parse_completion_request(R"({"prompt":"a","logprobs":)" + std::to_string(n) + "}", r);
    ASSERT_FALSE(e.has_value()) << e->message;
    EXPECT_EQ(r.sampling.logprobs, n);
  }
  for (const char* none :
       {R"({"prompt":"a"})", R"({"prompt":"a","logprobs":null})", R"({"prompt":"a","logprobs":false})"}) {
    CompletionRequest r;
    ASSERT_FALSE(parse_completion_request(none, r).has_value()) << none;
    EXPECT_FALSE(r.sampling.logprobs.has_value()) << none;
  }
  struct Case {
    std::string body;
    const char* param;
    const char* code;
  };
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  const Case cases[] = {
      {R"({"prompt":"a","logprobs":-1})", "logprobs", "invalid_value"},
      {R"({"prompt":"a","logprobs":6})", "logprobs", "invalid_value"},
      {R"({"prompt":"a","logprobs":true})", "logprobs", "invalid_type"},
      {R"({"prompt":"a","logprobs":1.5})", "logprobs", "invalid_type"},
      {R"({"prompt":"a","logprobs":"2"})", "logprobs", "invalid_type"},
      {chat + R"("logprobs":1})", "logprobs", "invalid_type"},
      {chat + R"("top_logprobs":2})", "top_logprobs", "invalid_value"},
      {chat + R"("top_logprobs":0})", "top_logprobs", "invalid_value"},
      {chat + R"("logprobs":false,"top_logprobs":3})", "top_logprobs", "invalid_value"},
      {chat + R"("logprobs":true,"top_logprobs":21})", "top_logprobs", "invalid_value"},
      {chat + R"("logprobs":true,"top_logprobs":-1})", "top_logprobs", "invalid_value"},
      {chat + R"("logprobs":true,"top_logprobs":"3"})", "top_logprobs", "invalid_type"},
  };
  for (const Case& c : cases) {
    ApiError e;
    if (c.body.starts_with(R"({"prompt")")) {
      e = completion_error(c.body);
    } else {
      e = chat_error(c.body);
    }
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body << " -> " << e.message;
  }
  EXPECT_NE(chat_error(chat + R"("top_logprobs":2})").message.find("\"logprobs\": true"), std::string::npos);
  ChatRequest a;
  ASSERT_FALSE(parse_chat_request(chat + R"("logprobs":true})", a).has_value());
  EXPECT_EQ(a.sampling.logprobs, 0);
  ChatRequest b;
  ASSERT_FALSE(parse_chat_request(chat + R"("logprobs":true,"top_logprobs":20})", b).has_value());
  EXPECT_EQ(b.sampling.logprobs, 20);
  ChatRequest c;
  ASSERT_FALSE(parse_chat_request(chat + R"("logprobs":false,"top_logprobs":null})", c).has_value());
  EXPECT_FALSE(c.sampling.logprobs.has_value());
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

PieceLogprob piece(TokenId id, double logprob, std::string bytes) {
  PieceLogprob p;
  p.id = id;
  p.logprob = logprob;
  p.piece = std::move(bytes);
  return p;
}
TokenLogprobs entry(int32_t index, PieceLogprob token, std::vector<PieceLogprob> top) {
  TokenLogprobs e;
  e.index = index;
  e.token = std::move(token);
  e.top = std::move(top);
  return e;
}
// Entries as the engine gives them: "Hi" (two alternatives), " \xC3" (the
// first byte of "é"), "\xA9!" (its second byte and "!").
std::vector<TokenLogprobs> sample_entries() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<TokenLogprobs> out;
  out.push_back(entry(0, piece(7, -0.25, "Hi"), {piece(7, -0.25, "Hi"), piece(9, -1.5, "Hey")}));
  out.push_back(entry(1, piece(300, -2.0, " \xC3"), {piece(12, -0.5, " a"), piece(300, -2.0, " \xC3")}));
  // Two alternatives of one text.
  out.push_back(entry(2, piece(301, -inf, "\xA9!"), {piece(5, -0.1, "!"), piece(6, -0.2, "!")}));
  return out;
}

TEST(OpenAiRender, CompletionLogprobsListTokensTheirAlternativesAndOffsets) {
  CompletionResult r;
  r.text = "Hi \xC3\xA9!";
  r.logprobs = ChoiceLogprobs{sample_entries(), /*text_offset=*/4};
  const json lp = json::parse(render_completion(r))["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({"Hi", " \xEF\xBF\xBD", "\xEF\xBF\xBD!"})) << "lossy text of partial characters";
  EXPECT_EQ(lp["token_logprobs"], json::array({-0.25, -2.0, -9999.0})) << "-inf as -9999";
  EXPECT_EQ(lp["text_offset"], json::array({4, 6, 8})) << "characters, from the prompt's start";
  EXPECT_EQ(lp["top_logprobs"][0], json({{"Hi", -0.25}, {"Hey", -1.5}}));
  EXPECT_EQ(lp["top_logprobs"][2], json({{"!", -0.1}, {"\xEF\xBF\xBD!", -9999.0}}))
      << "a repeated text keeps the likelier value; the chosen token is always a key";
  // The alternatives are listed most likely first (as OpenAI does), not by
  // key: "Hi" (-0.25) before "Hey" (-1.5).
  const auto ordered = nlohmann::ordered_json::parse(render_completion(r))["choices"][0]["logprobs"]["top_logprobs"][0];
  ASSERT_EQ(ordered.size(), 2u);
  EXPECT_EQ(ordered.begin().key(), "Hi");
  // Responses list their fields as written: id first.
  EXPECT_EQ(nlohmann::ordered_json::parse(render_completion(r)).begin().key(), "id");
  // Asked, nothing listed: an empty object, not null; not asked: null.
  r.logprobs = ChoiceLogprobs{};
  EXPECT_EQ(json::parse(render_completion(r))["choices"][0]["logprobs"]["tokens"], json::array());
  EXPECT_EQ(json::parse(render_chat_completion(r))["choices"][0]["logprobs"]["content"], json::array());
  r.logprobs.reset();
  EXPECT_TRUE(json::parse(render_completion(r))["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(json::parse(render_chat_completion(r))["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiRender, ChatLogprobsCarryExactBytes) {
  CompletionResult r;
  r.logprobs = ChoiceLogprobs{sample_entries(), 0};
  const json lp = json::parse(render_chat_completion(r))["choices"][0]["logprobs"];
  EXPECT_TRUE(lp["refusal"].is_null());
  ASSERT_EQ(lp["content"].size(), 3u);
  const json& b = lp["content"][1];
  EXPECT_EQ(b["token"], " \xEF\xBF\xBD");
  EXPECT_EQ(b["bytes"], json::array({0x20, 0xC3}));
  EXPECT_EQ(b["logprob"], -2.0);
  EXPECT_EQ(b["top_logprobs"][0], json({{"token", " a"}, {"logprob", -0.5}, {"bytes", json::array({0x20, 0x61})}}));
  EXPECT_EQ(lp["content"][2]["bytes"], json::array({0xA9, 0x21}));
  EXPECT_EQ(lp["content"][2]["top_logprobs"].size(), 2u) << "chat lists every alternative";
  // A chunk carries its own entries; one without any has null.
  ChunkFields f;
  const ChoiceLogprobs one{{sample_entries()[0]}, 0};
  f.text = "Hi";
  f.logprobs = &one;
  const json chunk = json::parse(render_chat_chunk(f));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
  const json cchunk = json::parse(render_completion_chunk(f));
  EXPECT_EQ(cchunk["choices"][0]["logprobs"]["tokens"], json::array({"Hi"}));
  f.logprobs = nullptr;
  EXPECT_TRUE(json::parse(render_chat_chunk(f))["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(json::parse(render_completion_chunk(f))["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(count_chars("Hi \xC3\xA9!"), 5);
}

// response_format: text is free text; json_object and json_schema become the
// engine's constraint (the schema compiled once here to refuse it early).
TEST(OpenAiResponseFormat, TextJsonObjectAndJsonSchemaParse) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","response_format":{"type":"text"}})", r).has_value());
  EXPECT_FALSE(r.sampling.constraint.active());
  CompletionRequest o;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","response_format":{"type":"json_object"}})", o).has_value());
  EXPECT_EQ(o.sampling.constraint.kind, grammar::ConstraintKind::kJsonObject);
  ChatRequest c;
  auto e = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":)"
      R"({"name":"p","strict":true,"description":"d","schema":{"type":"object","properties":{"n":{"type":"integer"}},)"
      R"("required":["n"],"additionalProperties":false}}}})",
      c);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(c.sampling.constraint.kind, grammar::ConstraintKind::kJsonSchema);
  EXPECT_EQ(json::parse(c.sampling.constraint.schema)["required"][0], "n");
  CompletionRequest none;
  ASSERT_FALSE(parse_completion_request(
                   R"({"prompt":"a","response_format":{"type":"json_schema","json_schema":{"name":"any"}}})", none)
                   .has_value());
  EXPECT_EQ(none.sampling.constraint.schema, "{}");
}

TEST(OpenAiResponseFormat, RefusalsNameTheFieldAndTheKeyword) {
  struct Case {
    std::string rf;
    std::string extra;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"("json")", "", "response_format", "must be an object"},
      {R"({"type":"xml"})", "", "response_format.type", "json_schema"},
      {R"({"type":"json_object","schema":{}})", "", "response_format.schema", "Unrecognized"},
      {R"({"type":"json_schema"})", "", "response_format.json_schema", "must be an object"},
      {R"({"type":"json_schema","json_schema":{"schema":{}}})", "", "response_format.json_schema.name", "name"},
      {R"({"type":"json_schema","json_schema":{"name":"x","strict":1}})", "", "response_format.json_schema.strict",
       "boolean"},
      {R"({"type":"json_schema","json_schema":{"name":"x","other":1}})", "", "response_format.json_schema.other",
       "Unrecognized"},
      {R"({"type":"json_schema","json_schema":{"name":"x","schema":{"properties":{"d":{"type":"string","format":"date"}}}}})",
       "", "response_format", "unsupported keyword 'format' at /properties/d"},
      {R"({"type":"json_object"})", R"(,"ignore_eos":true)", "ignore_eos", "response_format"},
      {R"({"type":"json_object"})", R"(,"min_tokens":2)", "min_tokens", "response_format"},
  };
  for (const Case& c : cases) {
    CompletionRequest r;
    const std::string body = R"({"prompt":"a","response_format":)" + c.rf + c.extra + "}";
    auto e = parse_completion_request(body, r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, c.param) << body << " -> " << e->message;
    EXPECT_NE(e->message.find(c.message), std::string::npos) << body << " -> " << e->message;
  }
  ChatRequest chat;
  auto e = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},)"
      R"("tools":[{"type":"function","function":{"name":"f"}}]})",
      chat);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "response_format");
}

// "prompt" as token ids (one list, or a list holding one list): the ids as
// sent, no text; echo read as a boolean.
TEST(OpenAiPrompt, TokenIdsAreRead) {
  for (const char* body : {R"({"prompt":[1,9038,2501]})", R"({"prompt":[[1,9038,2501]]})"}) {
    CompletionRequest r;
    auto e = parse_completion_request(body, r);
    ASSERT_FALSE(e.has_value()) << body << ": " << e->message;
    ASSERT_TRUE(r.prompt_tokens.has_value()) << body;
    EXPECT_EQ(*r.prompt_tokens, (std::vector<TokenId>{1, 9038, 2501})) << body;
    EXPECT_TRUE(r.prompt.empty()) << body;
    EXPECT_FALSE(r.echo);
    EXPECT_FALSE(check_prompt_tokens(r, 32000).has_value());
  }
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":["hi"],"echo":true})", r).has_value());
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_FALSE(r.prompt_tokens.has_value());
  EXPECT_TRUE(r.echo);
  ASSERT_FALSE(parse_completion_request(R"({"prompt":[0],"echo":false})", r).has_value());
  EXPECT_EQ(*r.prompt_tokens, std::vector<TokenId>{0});
  EXPECT_FALSE(r.echo);
  ASSERT_FALSE(parse_completion_request(R"({"prompt":[2147483647]})", r).has_value());
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","echo":null})", r).has_value());
  EXPECT_FALSE(r.echo);
}

// Every refusal of a prompt names "prompt" and says what is wrong: types,
// empty forms, ranges, batches; the vocabulary check names the index.
TEST(OpenAiPrompt, RefusalsNameTheProblem) {
  struct Case {
    const char* body;
    const char* code;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"prompt":[]})", "invalid_value", "must not be empty"},
      {R"({"prompt":[[]]})", "invalid_value", "must not be empty"},
      {R"({"prompt":[""]})", "invalid_value", "must not be empty"},
      {R"({"prompt":[1,-2]})", "invalid_value", "'prompt[1]': token id -2 is negative"},
      {R"({"prompt":[1,2.5]})", "invalid_type", "'prompt[1]' must be an integer"},
      {R"({"prompt":[1.0]})", "invalid_type", "integer"},
      {R"({"prompt":[4294967296]})", "invalid_value", "outside any vocabulary"},
      {R"({"prompt":[[1,-3]]})", "invalid_value", "'prompt[0][1]'"},
      {R"({"prompt":[1,"a"]})", "invalid_type", "array of token ids"},
      {R"({"prompt":["a",1]})", "invalid_type", "array of token ids"},
      {R"({"prompt":[[1],"a"]})", "unsupported_parameter", "a batch of 2 prompts"},
      {R"({"prompt":[[1,2],[3]]})", "unsupported_parameter", "send 2 requests"},
      {R"({"prompt":["a","b","c"]})", "unsupported_parameter", "this server takes one prompt per request; send 3"},
      {R"({"prompt":[[1,[2]]]})", "invalid_type", "'prompt[0]' must be an array of integer token ids"},
      {R"({"prompt":[{"a":1}]})", "invalid_type", "object"},
      {R"({"prompt":[true]})", "invalid_type", "boolean"},
      {R"({"prompt":{"text":"a"}})", "invalid_type", "got object"},
      {R"({"prompt":7})", "invalid_type", "got number"},
  };
  for (const Case& c : cases) {
    ApiError e = completion_error(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, "prompt") << c.body;
    EXPECT_EQ(e.code, c.code) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.needle), std::string::npos) << c.body << " -> " << e.message;
  }
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":[5,511,512,3]})", r).has_value());
  std::optional<ApiError> e = check_prompt_tokens(r, 512);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("'prompt[2]': token id 512 is past the vocabulary of 512 tokens"), std::string::npos)
      << e->message;
  EXPECT_FALSE(check_prompt_tokens(r, 513).has_value());
  // Text prompts have nothing to check.
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a"})", r).has_value());
  EXPECT_FALSE(check_prompt_tokens(r, 1).has_value());
}

TEST(OpenAiPrompt, TooManyTokenIdsAreRefusedByName) {
  std::string body = R"({"prompt":[)";
  body.reserve(2 * kMaxPromptTokenIds + 32);
  for (size_t i = 0; i <= kMaxPromptTokenIds; ++i) body += i == 0 ? "1" : ",1";
  body += "]}";
  ApiError e = completion_error(body);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(e.message.find("at most " + std::to_string(kMaxPromptTokenIds) + " token ids"), std::string::npos)
      << e.message;
}

// An echoed prompt's first entry has no log-probability: null, and null
// alternatives; the offsets count every entry's characters from 0.
TEST(OpenAiRender, EchoedPromptEntriesStartWithNull) {
  CompletionResult r;
  r.id = "cmpl-1";
  r.text = "Once upon";
  ChoiceLogprobs lp;
  TokenLogprobs first;
  first.index = 0;
  first.token = {1, std::numeric_limits<double>::quiet_NaN(), ""};
  TokenLogprobs second;
  second.index = 1;
  second.token = {2, -1.5, "Once"};
  second.top = {{2, -1.5, "Once"}, {3, -2.0, "The"}};
  TokenLogprobs third;
  third.index = 0;
  third.token = {4, -0.5, " upon"};
  lp.entries = {first, second, third};
  lp.text_offset = 0;
  r.logprobs = lp;
  json j = json::parse(render_completion(r));
  const json& l = j["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json::array({"", "Once", " upon"}));
  EXPECT_TRUE(l["token_logprobs"][0].is_null());
  EXPECT_TRUE(l["top_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(l["token_logprobs"][1].get<double>(), -1.5);
  EXPECT_DOUBLE_EQ(l["top_logprobs"][1]["The"].get<double>(), -2.0);
  EXPECT_EQ(l["text_offset"], json::array({0, 0, 4}));
}


TEST(OpenAiParse, NChoices) {
  CompletionRequest c;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a","n":3,"best_of":3})", c).has_value());
  EXPECT_EQ(c.sampling.n, 3);
  CompletionRequest one;
  ASSERT_FALSE(parse_completion_request(R"({"prompt":"a"})", one).has_value());
  EXPECT_EQ(one.sampling.n, 1);
  ChatRequest r;
  ASSERT_FALSE(parse_chat_request(R"({"messages":[{"role":"user","content":"hi"}],"n":16})", r).has_value());
  EXPECT_EQ(r.sampling.n, 16);
  ApiError e = chat_error(
      R"({"messages":[{"role":"user","content":"hi"}],"n":2,"tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "n");
  EXPECT_NE(e.message.find("tools"), std::string::npos) << e.message;
}

TEST(OpenAiRender, NChoicesByIndex) {
  CompletionResult r;
  r.id = "cmpl-1";
  r.text = "a";
  r.finish_reason = "stop";
  r.prompt_tokens = 3;
  r.completion_tokens = 9;
  r.more_choices.push_back({"bb", "length", std::nullopt});
  r.more_choices.push_back({"ccc", "stop", std::nullopt});
  json j = json::parse(render_completion(r));
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["choices"][1]["text"], "bb");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][2]["text"], "ccc");
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);
  json c = json::parse(render_chat_completion(r));
  ASSERT_EQ(c["choices"].size(), 3u);
  EXPECT_EQ(c["choices"][2]["index"], 2);
  EXPECT_EQ(c["choices"][2]["message"]["content"], "ccc");
  EXPECT_EQ(c["choices"][2]["message"]["role"], "assistant");
  ChunkFields f;
  f.id = "cmpl-1";
  f.text = "x";
  f.index = 2;
  EXPECT_EQ(json::parse(render_completion_chunk(f))["choices"][0]["index"], 2);
  EXPECT_EQ(json::parse(render_chat_chunk(f))["choices"][0]["index"], 2);
}

}  // namespace
}  // namespace spw::http
