#include "http/tool_calls.h"

#include <cctype>

#include <gtest/gtest.h>

#include "http/openai.h"

namespace spw::http {
namespace {

// Everything a stream releases for `text` fed in pieces of `step` bytes.
ToolCallStream::Released run(ToolFormat f, std::string_view text, size_t step, bool parallel = true) {
  ToolCallStream s(f, 42, parallel);
  ToolCallStream::Released all;
  auto add = [&](ToolCallStream::Released r) {
    all.content += r.content;
    for (auto& c : r.calls) all.calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += step) add(s.feed(text.substr(i, step)));
  add(s.finish());
  return all;
}

TEST(ToolJson, WritesAsPythonsJsonDumps) {
  // Keys in the client's order, ", " / ": ", non-ASCII as is, escapes as
  // json.dumps(ensure_ascii=False) writes them.
  EXPECT_EQ(tojson(R"({"b":1,"a":[true,null,"x\ny"],"é":{},"l":[]})").value(),
            R"({"b": 1, "a": [true, null, "x\ny"], "é": {}, "l": []})");
  EXPECT_EQ(tojson(R"({"a":{"b":[1,2]},"c":"d"})", 4).value(),
            "{\n    \"a\": {\n        \"b\": [\n            1,\n            2\n        ]\n    },\n    \"c\": \"d\"\n}");
  EXPECT_EQ(tojson(R"({"x":1.5,"y":-3})").value(), R"({"x": 1.5, "y": -3})");
  EXPECT_FALSE(tojson("{nope").ok());
}

TEST(ToolCallStream, ChatMLCallsAreReleasedWholeOnceWhateverTheChunking) {
  const std::string text =
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2]}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n";
  for (size_t step : {1, 2, 3, 7, 1000}) {
    auto r = run(ToolFormat::kChatML, text, step);
    EXPECT_EQ(r.content, "Checking.\n") << step;
    ASSERT_EQ(r.calls.size(), 2u) << step;
    EXPECT_EQ(r.calls[0].id, "call_42_0");
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","n":[1,2]})");
    EXPECT_EQ(r.calls[1].id, "call_42_1");
    EXPECT_EQ(r.calls[1].arguments, "{}");
  }
  // parallel_tool_calls=false: the first call only.
  auto one = run(ToolFormat::kChatML, text, 5, false);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
}

TEST(ToolCallStream, ChatMLHoldsOnlyWhatCouldBecomeACall) {
  ToolCallStream s(ToolFormat::kChatML, 1, true);
  EXPECT_EQ(s.feed("Hello <tool").content, "Hello ");  // "<tool" may open a call
  EXPECT_EQ(s.feed("box> world").content, "<toolbox> world");  // it did not
  // A closing tag inside the arguments' strings does not end the call.
  auto open = s.feed("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"</tool_call>\"}");
  EXPECT_EQ(open.content, "");
  EXPECT_TRUE(open.calls.empty());
  auto closed = s.feed("}\n</tool_call>");
  ASSERT_EQ(closed.calls.size(), 1u);
  EXPECT_EQ(closed.calls[0].arguments, R"({"a":"</tool_call>"})");
  // A JSON that is not a call: shown as the model wrote it.
  auto bad = run(ToolFormat::kChatML, "<tool_call>not json</tool_call> tail", 4);
  EXPECT_EQ(bad.content, "<tool_call>not json</tool_call> tail");
  EXPECT_TRUE(bad.calls.empty());
  // Ended (EOS) before the closing tag with the JSON whole: a call.
  auto eos = run(ToolFormat::kChatML, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}}\n", 3);
  ASSERT_EQ(eos.calls.size(), 1u);
  EXPECT_EQ(eos.content, "");
  // Cut by max_tokens inside the JSON: text, not a call.
  auto cut = run(ToolFormat::kChatML, "<tool_call>\n{\"name\": \"f\", \"argu", 3);
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "<tool_call>\n{\"name\": \"f\", \"argu");
}

TEST(ToolCallStream, Llama3AnswerThatIsOneJsonObjectIsACall) {
  for (size_t step : {1, 4, 100}) {
    auto r = run(ToolFormat::kLlama3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", step);
    EXPECT_EQ(r.content, "") << step;
    ASSERT_EQ(r.calls.size(), 1u) << step;
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris"})");
    auto tagged = run(ToolFormat::kLlama3, "<|python_tag|>{\"name\": \"now\", \"arguments\": {}}\n \n", step);
    EXPECT_EQ(tagged.content, "") << step;  // whitespace after the call is the format's
    ASSERT_EQ(tagged.calls.size(), 1u) << step;
    EXPECT_EQ(tagged.calls[0].name, "now");
  }
  // Prose streams at once; JSON that is not a call comes back as written.
  ToolCallStream s(ToolFormat::kLlama3, 7, true);
  EXPECT_EQ(s.feed("The weather {is} fine").content, "The weather {is} fine");
  auto other = run(ToolFormat::kLlama3, "{\"answer\": 42}", 2);
  EXPECT_TRUE(other.calls.empty());
  EXPECT_EQ(other.content, "{\"answer\": 42}");
}

TEST(ToolCallStream, MistralCallsAfterTheMarkerOrAsABareArray) {
  const std::string calls =
      "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris ]}\"}}, {\"name\": \"now\", "
      "\"arguments\": {}, \"id\": \"model0001\"}]";
  for (size_t step : {1, 3, 7, 1000}) {
    // The control token's text where the vocabulary shows it, and where it
    // renders as nothing (SentencePiece's space before the array).
    for (const std::string& text : {"[TOOL_CALLS] " + calls, " " + calls, "[TOOL_CALLS]" + calls + "\n"}) {
      auto r = run(ToolFormat::kMistral, text, step);
      EXPECT_EQ(r.content, "") << step << text;
      ASSERT_EQ(r.calls.size(), 2u) << step << text;
      EXPECT_EQ(r.calls[0].name, "get_weather");
      EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris ]}"})");  // brackets in strings are text
      EXPECT_EQ(r.calls[1].name, "now");
      EXPECT_EQ(r.calls[1].arguments, "{}");
      // Ids: 9 letters and digits (the template refuses others), ours not the
      // model's, the same for the same request, different per call.
      for (const auto& c : r.calls) {
        ASSERT_EQ(c.id.size(), 9u) << c.id;
        for (char ch : c.id) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch))) << c.id;
      }
      EXPECT_NE(r.calls[0].id, r.calls[1].id);
      EXPECT_NE(r.calls[1].id, "model0001");
      EXPECT_EQ(r.calls[0].id, run(ToolFormat::kMistral, text, 1000).calls[0].id);
    }
  }
  EXPECT_NE(run(ToolFormat::kMistral, " " + calls, 5).calls[0].id,
            [&] {
              ToolCallStream other(ToolFormat::kMistral, 43, true);
              auto r = other.feed(" " + calls);
              return r.calls.empty() ? std::string() : r.calls[0].id;
            }());
  // parallel=false: the first call only.
  EXPECT_EQ(run(ToolFormat::kMistral, calls, 4, false).calls.size(), 1u);
  // Prose is shown at once; a bracket that is not calls comes back as written,
  // the marker with it.
  ToolCallStream s(ToolFormat::kMistral, 7, true);
  EXPECT_EQ(s.feed("It is 21 C [approx").content, "It is 21 C [approx");
  for (const char* text : {"[1, 2, 3] are the numbers", "[TOOL_CALLS] not json", "[TOOL_CALLS] [{\"x\": 1}]",
                           "[unclosed"}) {
    auto r = run(ToolFormat::kMistral, text, 2);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // Cut by max_tokens inside the array: text, never half a call.
  auto cut = run(ToolFormat::kMistral, "[TOOL_CALLS] [{\"name\": \"now\", \"argu", 3);
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "[TOOL_CALLS] [{\"name\": \"now\", \"argu");
}

TEST(ToolCallStream, FormatsFollowTheTemplateFamilies) {
  // Mistral Small 3.x (v7-tekken) writes v3's "[TOOL_CALLS][...]"; v7
  // (Large-2411) renders no tools, so it has no call format either.
  EXPECT_EQ(tool_format(ChatTemplateKind::kMistralV7Tekken), ToolFormat::kMistral);
  EXPECT_EQ(tool_format(ChatTemplateKind::kMistralV3), ToolFormat::kMistral);
  EXPECT_EQ(tool_format(ChatTemplateKind::kMistralV7), ToolFormat::kNone);
  EXPECT_EQ(tool_format(ChatTemplateKind::kGemma), ToolFormat::kNone);
}

TEST(ToolCallStream, SafePointSpansCoverACallInProgress) {
  const SafePointRules chatml = tool_safe_points(ToolFormat::kChatML);
  ASSERT_EQ(chatml.spans.size(), 1u);
  EXPECT_EQ(chatml.spans[0].open, "<tool_call>");
  EXPECT_EQ(chatml.spans[0].close, "</tool_call>");
  Checkpoint cp;
  cp.text = "Sure.\n<tool_call>\n{\"name\": \"f\", \"argum";
  EXPECT_EQ(check_safe_point(cp, chatml).reason(), FailureReason::kNotSafePoint);
  cp.text += "ents\": {}}\n</tool_call>";
  EXPECT_TRUE(check_safe_point(cp, chatml).ok());
  const SafePointRules llama = tool_safe_points(ToolFormat::kLlama3);
  cp.text = "{\"name\": \"f\", \"parameters\": {}}";
  EXPECT_EQ(check_safe_point(cp, llama).reason(), FailureReason::kNotSafePoint);
  const SafePointRules mistral = tool_safe_points(ToolFormat::kMistral);
  for (const char* t : {"[TOOL_CALLS] [{\"name\": \"f\"", " [{\"name\": \"f\", \"arguments\": {}}]"}) {
    cp.text = t;
    EXPECT_EQ(check_safe_point(cp, mistral).reason(), FailureReason::kNotSafePoint) << t;
  }
  cp.text = "It is 21 C [approx.]";
  EXPECT_TRUE(check_safe_point(cp, mistral).ok());
  EXPECT_TRUE(tool_safe_points(ToolFormat::kNone).empty());
}

}  // namespace
}  // namespace spw::http
