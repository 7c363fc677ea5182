#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/json_matcher.h"
#include "grammar/json_schema.h"

namespace spw::grammar {
namespace {

std::shared_ptr<const Grammar> schema(const std::string& text) {
  auto g = compile_constraint({ConstraintKind::kJsonSchema, text});
  EXPECT_TRUE(g.ok()) << text << ": " << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

std::string refusal(const std::string& text) {
  auto g = compile_constraint({ConstraintKind::kJsonSchema, text});
  EXPECT_FALSE(g.ok()) << text << " compiled";
  if (g.ok()) return "";
  EXPECT_EQ(g.status().reason(), FailureReason::kInvalidField);
  EXPECT_EQ(g.status().field(), "response_format");
  return g.status().message();
}

// The whole document is accepted and complete.
bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& doc) {
  JsonMatcher m(g);
  return m.feed(doc) && m.complete();
}
// A valid prefix (possibly complete).
bool prefix(const std::shared_ptr<const Grammar>& g, const std::string& doc) {
  JsonMatcher m(g);
  return m.feed(doc);
}

TEST(JsonGrammar, JsonObjectAcceptsObjectsOnly) {
  auto g = *compile_constraint({ConstraintKind::kJsonObject, ""});
  EXPECT_TRUE(accepts(g, R"({})"));
  EXPECT_TRUE(accepts(g, R"( {"a": [1, -2.5e+3, true, null, {"b": "c"}], "d": false})"));
  EXPECT_FALSE(prefix(g, "["));
  EXPECT_FALSE(prefix(g, "\"a\""));
  EXPECT_FALSE(prefix(g, "1"));
  EXPECT_TRUE(prefix(g, "{\"a\""));
  EXPECT_FALSE(accepts(g, "{\"a\""));
  EXPECT_FALSE(prefix(g, "{\"a\" 1"));
  EXPECT_FALSE(prefix(g, "{,"));
  EXPECT_FALSE(prefix(g, "{\"a\":1,}"));
  EXPECT_FALSE(prefix(g, "{} "));  // nothing after the document
  EXPECT_FALSE(prefix(g, "{}{"));
}

TEST(JsonGrammar, CompletionAndWhatMayFollow) {
  auto g = *compile_constraint({ConstraintKind::kJsonObject, ""});
  JsonMatcher m(g);
  EXPECT_FALSE(m.complete());
  ASSERT_TRUE(m.feed("{\"x\":1"));
  EXPECT_FALSE(m.complete());
  ASSERT_TRUE(m.feed("}"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.can_continue());  // only the end may follow

  auto n = schema(R"({"type": "integer"})");
  JsonMatcher num(n);
  ASSERT_TRUE(num.feed("12"));
  EXPECT_TRUE(num.complete());
  EXPECT_TRUE(num.can_continue());  // more digits
}

TEST(JsonGrammar, WhitespaceIsOneSpaceOrALineBreakAndBoundedIndentation) {
  auto g = *compile_constraint({ConstraintKind::kJsonObject, ""});
  const std::string indent(kMaxIndent, ' ');
  EXPECT_TRUE(accepts(g, " {\n" + indent + "\"a\": [1,\r\n\t2 ],\n\"b\"\t:\n" + indent + "null\n}"));
  EXPECT_FALSE(prefix(g, "  {"));          // one space, not two
  EXPECT_FALSE(prefix(g, "{ \n"));        // a space, then a line break
  EXPECT_FALSE(prefix(g, "{\n\n"));       // one line break
  EXPECT_FALSE(prefix(g, "{\r "));        // \r only before \n
  EXPECT_FALSE(prefix(g, "{\n" + indent + " "));
  EXPECT_TRUE(prefix(g, "{\n" + indent + "\"a\""));
}

TEST(JsonGrammar, Types) {
  EXPECT_TRUE(accepts(schema(R"({"type": "string"})"), R"("hi")"));
  EXPECT_FALSE(prefix(schema(R"({"type": "string"})"), "1"));
  auto num = schema(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "12", "1.5", "-0.25e-7", "3E+2", "1e5"}) EXPECT_TRUE(accepts(num, ok)) << ok;
  for (const char* bad : {"01", "-", "1.", ".5", "1e", "+1", "--1", "1.e3"}) EXPECT_FALSE(accepts(num, bad)) << bad;
  auto integer = schema(R"({"type": "integer"})");
  EXPECT_TRUE(accepts(integer, "-42"));
  EXPECT_FALSE(prefix(integer, "4.2"));
  EXPECT_FALSE(prefix(integer, "4e2"));
  EXPECT_TRUE(accepts(integer, std::string(kMaxIntDigits, '9')));
  EXPECT_FALSE(prefix(integer, std::string(kMaxIntDigits + 1, '9')));
  auto b = schema(R"({"type": "boolean"})");
  EXPECT_TRUE(accepts(b, "true"));
  EXPECT_TRUE(accepts(b, "false"));
  EXPECT_FALSE(prefix(b, "null"));
  EXPECT_FALSE(accepts(b, "tru"));
  EXPECT_TRUE(accepts(schema(R"({"type": "null"})"), "null"));
  auto list = schema(R"({"type": ["string", "null", "integer"]})");
  EXPECT_TRUE(accepts(list, "null"));
  EXPECT_TRUE(accepts(list, "\"x\""));
  EXPECT_TRUE(accepts(list, "7"));
  EXPECT_FALSE(prefix(list, "t"));
  EXPECT_FALSE(prefix(list, "["));
  auto arr = schema(R"({"type": "array"})");
  EXPECT_TRUE(accepts(arr, R"([1, "a", [], {}])"));
  EXPECT_FALSE(prefix(arr, "{"));
}

TEST(JsonGrammar, PropertiesRequiredAdditional) {
  auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                      "required": ["name"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"name": "x"})"));
  EXPECT_TRUE(accepts(g, R"({"age": 3, "name": "x"})"));  // any order
  EXPECT_FALSE(accepts(g, R"({"age": 3})"));              // name is required
  EXPECT_FALSE(prefix(g, R"({"age": 3})"));               // the } itself is refused
  EXPECT_FALSE(prefix(g, R"({"nam ")"));                  // no such property
  EXPECT_FALSE(prefix(g, R"({"x)"));
  EXPECT_FALSE(prefix(g, R"({"name": "x", "name")"));     // at most once
  EXPECT_FALSE(prefix(g, R"({"name": 1)"));               // its schema
  EXPECT_FALSE(prefix(g, R"({"age": 3, "name": "x",)"));  // nothing left to add
  EXPECT_FALSE(prefix(g, R"({})"));

  auto open = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");  // absent = true
  EXPECT_TRUE(accepts(open, R"({"a": 1, "b": [true]})"));
  EXPECT_FALSE(prefix(open, R"({"a": "s")"));
  EXPECT_FALSE(prefix(open, R"({"a": 1, "a")"));

  auto typed = schema(R"({"type": "object", "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(accepts(typed, R"({"x": true, "y": false})"));
  EXPECT_FALSE(prefix(typed, R"({"x": 1)"));

  // Required but undeclared, additional allowed: a property of the additional schema.
  auto req = schema(R"({"type": "object", "required": ["k"], "additionalProperties": {"type": "null"}})");
  EXPECT_TRUE(accepts(req, R"({"k": null})"));
  EXPECT_FALSE(accepts(req, R"({"j": null})"));
}

TEST(JsonGrammar, KeysAreCanonical) {
  auto g = schema(R"({"type": "object", "properties": {"a\"b": {"type": "null"}, "é": {"type": "null"}},
                      "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"a\"b": null, "é": null})"));
  EXPECT_FALSE(prefix(g, R"({"\u00e9")"));
  auto open = *compile_constraint({ConstraintKind::kJsonObject, ""});
  EXPECT_TRUE(accepts(open, R"({"\n\u001f": 1})"));
  EXPECT_FALSE(prefix(open, R"({"\u0061)"));
  EXPECT_FALSE(prefix(open, R"({"\/)"));
}

TEST(JsonGrammar, ArraysAndItems) {
  auto g = schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
  EXPECT_FALSE(prefix(g, "[]"));
  EXPECT_TRUE(accepts(g, "[1]"));
  EXPECT_TRUE(accepts(g, "[1, 2, 3]"));
  EXPECT_FALSE(prefix(g, "[1, 2, 3,"));
  EXPECT_FALSE(prefix(g, "[\"a\""));
  EXPECT_FALSE(prefix(g, "[1,]"));
  auto empty = schema(R"({"type": "array", "maxItems": 0})");
  EXPECT_TRUE(accepts(empty, "[]"));
  EXPECT_FALSE(prefix(empty, "[1"));
}

TEST(JsonGrammar, StringsEscapesAndUtf8) {
  auto g = schema(R"({"type": "string"})");
  EXPECT_TRUE(accepts(g, R"("a\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00")"));
  EXPECT_TRUE(accepts(g, "\"caf\xC3\xA9 \xF0\x9F\x98\x80\""));
  EXPECT_FALSE(prefix(g, "\"a\nb"));     // raw control character
  EXPECT_FALSE(prefix(g, "\"\x01"));
  EXPECT_FALSE(prefix(g, R"("\x)"));     // unknown escape
  EXPECT_FALSE(prefix(g, R"("\u12G)"));
  EXPECT_FALSE(prefix(g, R"("\uDC)"));   // a low surrogate alone
  EXPECT_FALSE(prefix(g, R"("\uD83Dx)"));  // a high one without its pair
  EXPECT_FALSE(prefix(g, R"("\uD83D\u0041)"));
  EXPECT_FALSE(prefix(g, "\"\xC0\x80"));  // overlong
  EXPECT_FALSE(prefix(g, "\"\xED\xA0\x80"));  // an encoded surrogate
  EXPECT_FALSE(prefix(g, "\"\xF4\x90"));  // past U+10FFFF
  EXPECT_FALSE(prefix(g, "\"\xE2\x82\""));  // a character cut short
  EXPECT_TRUE(prefix(g, "\"\xE2\x82"));   // partial bytes of one token: fine
}

TEST(JsonGrammar, StringLengthsCountCodePoints) {
  auto g = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(prefix(g, R"("a")"));
  EXPECT_TRUE(accepts(g, R"("ab")"));
  EXPECT_TRUE(accepts(g, "\"\xC3\xA9\xF0\x9F\x98\x80\\n\""));  // 3 code points, 9 bytes
  EXPECT_TRUE(accepts(g, R"("\uD83D\uDE00a")"));               // a pair is one
  EXPECT_FALSE(prefix(g, R"("abcd)"));
  EXPECT_FALSE(prefix(g, R"("abc\n)"));
}

TEST(JsonGrammar, EnumAndConst) {
  auto g = schema(R"({"enum": ["red", "green", 1, 12, null, {"a": [1]}]})");
  for (const char* ok : {R"("red")", R"("green")", "1", "12", "null", R"({"a":[1]})"}) EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {R"("blue")", "2", "123", R"({"a": [1]})", "true"}) EXPECT_FALSE(accepts(g, bad)) << bad;
  auto c = schema(R"({"const": "x"})");
  EXPECT_TRUE(accepts(c, R"("x")"));
  EXPECT_FALSE(prefix(c, R"("y)"));
  // Members of another type than `type` are dropped.
  auto typed = schema(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(accepts(typed, R"("a")"));
  EXPECT_FALSE(prefix(typed, "1"));
  auto in_object = schema(R"({"type": "object", "properties": {"k": {"enum": [1, 12]}}, "required": ["k"],
                              "additionalProperties": false})");
  EXPECT_TRUE(accepts(in_object, R"({"k": 1})"));
  EXPECT_TRUE(accepts(in_object, R"({"k": 12 })"));
}

TEST(JsonGrammar, UnionsAnyOfOneOf) {
  auto g = schema(R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                  "additionalProperties": false},
                                 {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "null"}},
                                  "required": ["a", "b"], "additionalProperties": false}]})");
  EXPECT_TRUE(accepts(g, R"({"a": 1})"));
  EXPECT_TRUE(accepts(g, R"({"a": "s", "b": null})"));
  EXPECT_FALSE(accepts(g, R"({"a": "s"})"));
  EXPECT_FALSE(prefix(g, R"({"a": 1, "b")"));
  auto one = schema(R"({"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})");
  EXPECT_TRUE(accepts(one, "5"));
  EXPECT_TRUE(accepts(one, "\"x\""));
  EXPECT_FALSE(prefix(one, "\"xy"));
  // Nested unions are flattened.
  auto nested = schema(R"({"anyOf": [{"anyOf": [{"type": "null"}, {"type": "boolean"}]}, {"type": "integer"}]})");
  EXPECT_TRUE(accepts(nested, "null"));
  EXPECT_TRUE(accepts(nested, "true"));
  EXPECT_TRUE(accepts(nested, "3"));
}

TEST(JsonGrammar, RefsAndRecursion) {
  auto g = schema(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                 "next": {"$ref": "#/$defs/node"}}, "required": ["v"], "additionalProperties": false}},
                      "$ref": "#/$defs/node"})");
  EXPECT_TRUE(accepts(g, R"({"v": 1, "next": {"v": 2, "next": {"v": 3}}})"));
  EXPECT_TRUE(prefix(g, R"({"v": 1, "next": {"next")"));  // v may come later
  EXPECT_FALSE(accepts(g, R"({"v": 1, "next": {}})"));
  auto defs = schema(R"({"definitions": {"n": {"type": "null"}}, "type": "array", "items": {"$ref": "#/definitions/n"}})");
  EXPECT_TRUE(accepts(defs, "[null, null]"));
  auto self = schema(R"({"type": "array", "items": {"$ref": "#"}, "maxItems": 2})");
  EXPECT_TRUE(accepts(self, "[[], [[]]]"));
  EXPECT_NE(refusal(R"({"$ref": "#"})").find("cycle"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref": "#/$defs/missing"})").find("names no schema"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref": "http://x/y"})").find("not supported"), std::string::npos);
  // A required recursion has no finite document.
  EXPECT_NE(refusal(R"({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})")
                .find("no finite JSON document"),
            std::string::npos);
}

TEST(JsonGrammar, AnnotationsAreIgnored) {
  auto g = schema(R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "t", "description": "d",
                      "examples": [1], "default": 1, "$comment": "c", "type": "integer"})");
  EXPECT_TRUE(accepts(g, "1"));
}

TEST(JsonGrammar, RefusedKeywordsNameThemselvesAndTheirPointer) {
  struct Case {
    const char* schema;
    const char* want;
  } cases[] = {
      {R"({"type": "string", "pattern": "^a"})", "unsupported keyword 'pattern' at /"},
      {R"({"type": "string", "format": "date"})", "unsupported keyword 'format' at /"},
      {R"({"type": "integer", "minimum": 0})", "unsupported keyword 'minimum' at /"},
      {R"({"properties": {"a/b": {"type": "number", "multipleOf": 2}}})", "unsupported keyword 'multipleOf' at /properties/a~1b"},
      {R"({"type": "array", "items": {"uniqueItems": true}})", "unsupported keyword 'uniqueItems' at /items"},
      {R"({"allOf": [{"type": "string"}]})", "unsupported keyword 'allOf' at /"},
      {R"({"not": {}})", "unsupported keyword 'not' at /"},
      {R"({"type": "array", "prefixItems": []})", "unsupported keyword 'prefixItems' at /"},
      {R"({"patternProperties": {}})", "unsupported keyword 'patternProperties' at /"},
      {R"({"anyOf": [{"if": {}}]})", "unsupported keyword 'if' at /anyOf/0"},
      {R"({"type": "array", "items": [{"type": "string"}]})", "tuple validation"},
      {R"({"type": "integer", "anyOf": [{}]})", "beside 'anyOf'"},
      {R"({"type": "decimal"})", "unknown type 'decimal'"},
      {R"({"type": "string", "maxLength": -1})", "'maxLength' must be a non-negative integer"},
      {R"({"enum": []})", "no finite JSON document"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "no finite JSON document"},
      {R"({"type": "object", "required": ["x"], "additionalProperties": false})", "no finite JSON document"},
      {R"([1])", "must be an object or a boolean"},
      {R"({"type": )", "not valid JSON"},
  };
  for (const Case& c : cases) {
    const std::string m = refusal(c.schema);
    EXPECT_NE(m.find(c.want), std::string::npos) << c.schema << " -> " << m;
  }
}

TEST(JsonGrammar, LimitsAreRefusedByName) {
  std::string long_string(kMaxSchemaBytes + 2, 'a');  // a JSON string just over the limit
  long_string.front() = long_string.back() = '"';
  EXPECT_NE(refusal(long_string).find("kMaxSchemaBytes"), std::string::npos);
  nlohmann::json props = nlohmann::json::object();
  for (size_t i = 0; i <= kMaxProperties; ++i) props[std::string("p").append(std::to_string(i))] = {{"type", "null"}};
  EXPECT_NE(refusal(nlohmann::json{{"properties", props}}.dump()).find("kMaxProperties"), std::string::npos);
  nlohmann::json alts = nlohmann::json::array();
  for (size_t i = 0; i <= kMaxAlternatives; ++i) alts.push_back({{"const", i}});
  EXPECT_NE(refusal(nlohmann::json{{"anyOf", alts}}.dump()).find("kMaxAlternatives"), std::string::npos);
  nlohmann::json deep = {{"type", "null"}};
  for (size_t i = 0; i <= kMaxSchemaDepth; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_NE(refusal(deep.dump()).find("kMaxSchemaDepth"), std::string::npos);
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 40; ++i) big.push_back(std::string(1000, static_cast<char>('a' + i % 26)) + std::to_string(i));
  EXPECT_NE(refusal(nlohmann::json{{"enum", big}}.dump()).find("kMaxLiteralBytes"), std::string::npos);
  // Many sub-schemas: each $defs entry referenced from an array of anyOf.
  nlohmann::json defs = nlohmann::json::object();
  nlohmann::json props2 = nlohmann::json::object();
  for (int i = 0; i < 60; ++i) {
    nlohmann::json inner = nlohmann::json::object();
    // (append, not "q" + to_string: GCC 12's -Wrestrict misfires on the latter)
    for (int j = 0; j < 60; ++j) inner[std::string("q").append(std::to_string(j))] = nlohmann::json::object();
    props2[std::string("p").append(std::to_string(i))] = {{"type", "object"}, {"properties", inner}};
  }
  EXPECT_NE(refusal(nlohmann::json{{"properties", props2}}.dump()).find("kMaxNodes"), std::string::npos);
}

TEST(JsonGrammar, NestingIsBoundedOnAnyValue) {
  auto g = *compile_constraint({ConstraintKind::kJsonObject, ""});
  JsonMatcher m(g);
  ASSERT_TRUE(m.feed("{\"a\":" + std::string(kMaxDepth - 2, '[')));
  EXPECT_FALSE(JsonMatcher(g).feed("{\"a\":" + std::string(kMaxDepth, '[')));
  EXPECT_TRUE(m.can_continue());
}

// A vocabulary of pieces; the mask from the trie walk equals feeding each
// token on its own.
TEST(JsonGrammar, TrieMaskEqualsPerTokenCheck) {
  std::vector<std::string> pieces = {"", "{", "}", "\"", "\"a", "a", "ab", "\":", ":", " ", "  ", "1", "12", ".5",
                                     ",", "[", "]", "true", "tr", "null", "\\u00", "e9", "\xC3", "\xA9", "\xC3\xA9",
                                     "\n", "x\"", "\"}", "-", "", "0"};
  VocabTrie vocab(pieces);
  auto g = schema(R"({"type": "object", "properties": {"ab": {"type": "array", "items": {"type": "number"}},
                      "a": {"type": "string", "maxLength": 4}, "t": {"type": "boolean"}}, "additionalProperties": false})");
  const std::vector<std::string> prefixes = {"", "{", "{\"", "{\"a", "{\"ab\"", "{\"ab\":", "{\"ab\":[", "{\"ab\":[1",
                                             "{\"ab\":[1.", "{\"a\":\"", "{\"a\":\"\xC3", "{\"a\":\"abcd", "{\"t\":tr"};
  for (const std::string& p : prefixes) {
    JsonMatcher m(g);
    ASSERT_TRUE(m.feed(p)) << p;
    std::vector<uint64_t> mask;
    m.allowed_tokens(vocab, mask);
    for (size_t id = 0; id < pieces.size(); ++id) {
      const bool want = !pieces[id].empty() && JsonMatcher(g).feed(p + pieces[id]);
      EXPECT_EQ((mask[id / 64] >> (id % 64)) & 1, want ? 1u : 0u) << "prefix '" << p << "' token '" << pieces[id] << "'";
    }
  }
}

// A state rebuilt from the bytes (as a checkpoint's tokens rebuild it)
// equals the live one fed token by token.
TEST(JsonGrammar, RebuiltStateEqualsLiveState) {
  auto g = schema(R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                                 {"type": "object", "properties": {"a": {"type": "integer"}}}]})");
  const std::vector<std::string> tokens = {"{", "\"", "a", "\":", " ", "\"\\u", "00e", "9"};
  JsonMatcher live(g);
  std::string all;
  for (const std::string& t : tokens) {
    ASSERT_TRUE(live.feed(t)) << t;
    all += t;
    JsonMatcher rebuilt(g);
    ASSERT_TRUE(rebuilt.feed(all));
    EXPECT_TRUE(rebuilt == live) << all;
  }
  JsonMatcher other(g);
  ASSERT_TRUE(other.feed("{\"a\": 1"));
  EXPECT_FALSE(other == live);
}

// Random walks over the allowed bytes of bounded schemas always end in a
// complete document within the schema's size bound: no dead ends.
TEST(JsonGrammar, RandomWalksNeverDeadEnd) {
  const char* schemas[] = {
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}, "n": {"type": "integer"},
          "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}, "k": {"anyOf": [{"type": "null"},
          {"type": "boolean"}, {"type": "number"}]}}, "required": ["name", "n"], "additionalProperties": false})",
      R"({"type": "array", "items": {"type": "object", "properties": {"x": {"const": [1, {"y": null}]}},
          "required": ["x"], "additionalProperties": false}, "minItems": 1, "maxItems": 2})",
      R"({"type": "string", "minLength": 1, "maxLength": 2})",
  };
  std::mt19937 rng(7);
  for (const char* s : schemas) {
    auto g = schema(s);
    for (int walk = 0; walk < 200; ++walk) {
      JsonMatcher m(g);
      std::string doc;
      int steps = 0;
      while (steps++ < 2000) {
        std::vector<uint8_t> next = m.allowed_bytes();
        if (m.complete() && (next.empty() || rng() % 8 == 0)) break;
        ASSERT_FALSE(next.empty()) << "dead end after '" << doc << "'";
        const uint8_t b = next[rng() % next.size()];
        ASSERT_TRUE(m.feed(std::string(1, static_cast<char>(b))));
        doc += static_cast<char>(b);
      }
      ASSERT_TRUE(m.complete()) << doc;
      EXPECT_FALSE(nlohmann::json::parse(doc, nullptr, false).is_discarded()) << doc;
    }
  }
}

TEST(JsonGrammar, NothingToCompileIsAnError) {
  EXPECT_FALSE(compile_constraint({}).ok());
}

}  // namespace
}  // namespace spw::grammar
