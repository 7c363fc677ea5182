#include "http/auth.h"

#include <gtest/gtest.h>

#include "core/digest.h"

namespace spw::http {
namespace {

constexpr std::string_view kKeyA = "spw-alpha-0123456789abcdef";
constexpr std::string_view kKeyB = "spw-bravo-fedcba9876543210";

std::string bearer(std::string_view key) { return "Bearer " + std::string(key); }

TEST(ApiKeys, ValidInvalidMalformedNone) {
  ApiKeys keys;
  EXPECT_TRUE(keys.empty());
  ASSERT_TRUE(keys.add_key(kKeyA).ok());
  EXPECT_FALSE(keys.empty());
  EXPECT_EQ(keys.size(), 1u);

  KeyCheck ok = keys.check(bearer(kKeyA));
  EXPECT_EQ(ok.kind, KeyCheck::kValid);
  EXPECT_EQ(ok.owner, "key-" + sha256_hex(kKeyA).substr(0, 12));

  EXPECT_EQ(keys.check(bearer(kKeyB)).kind, KeyCheck::kInvalid);
  EXPECT_TRUE(keys.check(bearer(kKeyB)).owner.empty());
  // One byte off, a prefix, the key with more after it: all invalid.
  std::string off(kKeyA);
  off.back() = 'x';
  EXPECT_EQ(keys.check(bearer(off)).kind, KeyCheck::kInvalid);
  EXPECT_EQ(keys.check(bearer(kKeyA.substr(0, 20))).kind, KeyCheck::kInvalid);
  EXPECT_EQ(keys.check(bearer(std::string(kKeyA) + "z")).kind, KeyCheck::kInvalid);
  // Short tokens are checked like any other (invalid, not malformed).
  EXPECT_EQ(keys.check("Bearer abc").kind, KeyCheck::kInvalid);

  EXPECT_EQ(keys.check("").kind, KeyCheck::kNone);
  const std::string key(kKeyA);
  const std::string malformed[] = {"Bearer",           "Bearer ",          "Bearer    ",        "Basic " + key,
                                   "Bearer" + key,     "Bearer\t" + key,   "Bearer " + key + " extra", key,
                                   "Bearer a\x01" "bc", "Token " + key};
  for (const std::string& h : malformed) {
    EXPECT_EQ(keys.check(h).kind, KeyCheck::kMalformed) << h;
  }
}

TEST(ApiKeys, SchemeIsCaseInsensitiveAndSpacesMayRepeat) {
  ApiKeys keys;
  ASSERT_TRUE(keys.add_key(kKeyA).ok());
  for (const char* scheme : {"Bearer ", "bearer ", "BEARER ", "bEaReR ", "Bearer    "}) {
    EXPECT_EQ(keys.check(scheme + std::string(kKeyA)).kind, KeyCheck::kValid) << scheme;
  }
}

TEST(ApiKeys, TwoKeysTwoOwners) {
  ApiKeys keys;
  ASSERT_TRUE(keys.add_key(kKeyA).ok());
  ASSERT_TRUE(keys.add_key(kKeyB).ok());
  EXPECT_EQ(keys.size(), 2u);
  KeyCheck a = keys.check(bearer(kKeyA));
  KeyCheck b = keys.check(bearer(kKeyB));
  ASSERT_EQ(a.kind, KeyCheck::kValid);
  ASSERT_EQ(b.kind, KeyCheck::kValid);
  EXPECT_NE(a.owner, b.owner);
  // Stable: the same label every time, and in another set.
  EXPECT_EQ(keys.check(bearer(kKeyA)).owner, a.owner);
  ApiKeys other;
  ASSERT_TRUE(other.add_key(kKeyB).ok());
  EXPECT_EQ(other.check(bearer(kKeyB)).owner, b.owner);
  // A key given twice is one key.
  ASSERT_TRUE(keys.add_key(kKeyA).ok());
  EXPECT_EQ(keys.size(), 2u);
}

TEST(ApiKeys, HashesFromSpecs) {
  const std::string spec = hash_key_spec(kKeyA);
  EXPECT_EQ(spec, "sha256:" + sha256_hex(kKeyA));
  EXPECT_EQ(spec.size(), 7u + 64u);

  ApiKeys keys;
  ASSERT_TRUE(keys.add_hash(spec).ok());
  KeyCheck c = keys.check(bearer(kKeyA));
  EXPECT_EQ(c.kind, KeyCheck::kValid);
  EXPECT_EQ(keys.check(bearer(kKeyB)).kind, KeyCheck::kInvalid);

  // The same owner whether the key came as a key or as its hash; hex case
  // does not matter; a hash of a key already held adds nothing.
  ApiKeys by_key;
  ASSERT_TRUE(by_key.add_key(kKeyA).ok());
  EXPECT_EQ(by_key.check(bearer(kKeyA)).owner, c.owner);
  ApiKeys upper;
  std::string up = spec;
  for (size_t i = 7; i < up.size(); ++i) up[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(up[i])));
  ASSERT_TRUE(upper.add_hash(up).ok());
  EXPECT_EQ(upper.check(bearer(kKeyA)).owner, c.owner);
  ASSERT_TRUE(by_key.add_hash(spec).ok());
  EXPECT_EQ(by_key.size(), 1u);
}

TEST(ApiKeys, BadKeysAreRefusedNamingTheRule) {
  ApiKeys keys;
  Status short_key = keys.add_key("short-key");
  EXPECT_EQ(short_key.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_key.message().find("at least 16"), std::string::npos) << short_key.message();
  EXPECT_EQ(short_key.message().find("short-key"), std::string::npos) << "the key must not be quoted";

  Status space = keys.add_key("has a space in the key");
  EXPECT_EQ(space.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(space.message().find("printable ASCII without spaces"), std::string::npos) << space.message();
  EXPECT_NE(space.message().find("character 4"), std::string::npos) << space.message();
  EXPECT_EQ(keys.add_key("0123456789abcdef\n").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(keys.add_key("0123456789abcd\xc3\xa9").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(keys.add_key("").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(keys.empty());
  EXPECT_TRUE(check_api_key_rules("0123456789abcdef").ok());  // exactly 16
}

TEST(ApiKeys, BadSpecsAreRefusedNamingTheFormat) {
  ApiKeys keys;
  const std::string good = hash_key_spec(kKeyA);
  const std::string bad[] = {
      "",
      std::string(kKeyA),                        // the key itself, pasted by mistake
      good.substr(7),                            // no prefix
      "SHA256:" + good.substr(7),                // the prefix is lowercase
      "sha512:" + good.substr(7),
      good.substr(0, good.size() - 1),           // 63 hex
      good + "0",                                // 65 hex
      "sha256:" + std::string(63, '0') + "g",    // not hex
      " " + good,
  };
  for (const std::string& spec : bad) {
    Status s = keys.add_hash(spec);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(s.message().find("\"sha256:\" followed by 64 hex characters"), std::string::npos) << s.message();
    if (!spec.empty()) {
      EXPECT_EQ(s.message().find(spec), std::string::npos) << "the spec must not be quoted";
    }
  }
  EXPECT_TRUE(keys.empty());
}

TEST(ApiKeys, OwnerLabelNeverContainsTheKey) {
  // Keys that are themselves hex (like a hash's own characters) included.
  const std::string keys_to_try[] = {std::string(kKeyA), std::string(kKeyB), sha256_hex("x").substr(0, 16),
                                     "key-0123456789abcdef", std::string(64, 'a')};
  for (const std::string& key : keys_to_try) {
    ApiKeys keys;
    ASSERT_TRUE(keys.add_key(key).ok()) << key;
    const KeyCheck c = keys.check(bearer(key));
    ASSERT_EQ(c.kind, KeyCheck::kValid);
    EXPECT_EQ(c.owner.size(), 4u + 12u);
    EXPECT_TRUE(c.owner.starts_with("key-"));
    EXPECT_EQ(c.owner.find(key), std::string::npos);
    EXPECT_EQ(key.find(c.owner.substr(4)), std::string::npos) << "no 12-character run of the key";
  }
}

TEST(ConstantTimeEqual, ComparesWholeStrings) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "ab"));
  EXPECT_FALSE(constant_time_equal("ab", "abc"));
  EXPECT_FALSE(constant_time_equal("", "a"));
  EXPECT_FALSE(constant_time_equal(std::string_view("a\0", 2), "a"));  // a NUL is a byte like any other
}

}  // namespace
}  // namespace spw::http

namespace spw::http {
namespace {

// The one bearer parser, which the admin token shares with the API keys.
TEST(BearerToken, SchemeCaseInsensitiveSpacesThenAPrintableToken) {
  EXPECT_EQ(bearer_token("Bearer abc"), std::optional<std::string_view>("abc"));
  EXPECT_EQ(bearer_token("bearer   abc"), std::optional<std::string_view>("abc"));
  EXPECT_EQ(bearer_token("BEARER x-y_z.1"), std::optional<std::string_view>("x-y_z.1"));
  EXPECT_EQ(bearer_token("Bearerabc"), std::nullopt);
  EXPECT_EQ(bearer_token("Bearer "), std::nullopt);
  EXPECT_EQ(bearer_token("Bearer a b"), std::nullopt);
  EXPECT_EQ(bearer_token("Basic abc"), std::nullopt);
  EXPECT_EQ(bearer_token(""), std::nullopt);
}

}  // namespace
}  // namespace spw::http
