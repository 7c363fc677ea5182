// API keys for the OpenAI-compatible routes: which bearer tokens are accepted
// and whom a request is counted against.
//
// Contract: an ApiKeys holds the SHA-256 of each accepted key, never the key
// itself (a key given as --api-key is hashed at once; a config file holds
// only "sha256:<hex>", which `spillway hash-key` prints, so that the file is
// not a secret). check() takes an Authorization header value:
//   - empty: kNone (no credentials offered);
//   - not "Bearer <token>" (scheme case-insensitive, then one space or more,
//     then a token of printable ASCII without spaces): kMalformed;
//   - a token whose SHA-256 equals a stored one: kValid, with `owner` the
//     key's label; else kInvalid.
// The token's hash is compared with EVERY stored hash, each in constant
// time, with no early exit: how long a check takes depends on the token's
// length and the number of keys, not on which key (if any) it matched nor on
// how many leading bytes matched.
// Owner labels: "key-" + the first 12 hex characters of the key's SHA-256;
// stable (the same whether the key was added as a key or as its hash), not
// secret (48 bits of a hash say nothing usable about the key), and never the
// key itself. Keys added twice are kept once (a config file and the command
// line may both name one).
// Errors (add_key / add_hash): InvalidArgument naming the rule or format
// broken; the message never quotes the key (error text reaches logs).
// Thread safety: const methods are safe concurrently; add_* must not race
// with anything (fill the set at startup, then share it read-only).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw::http {

// The token of an Authorization header "Bearer <token>" (scheme
// case-insensitive, one space or more, printable ASCII without spaces);
// nullopt when the header is not of that form. The one parser of bearer
// tokens: API keys (ApiKeys::check) and the admin token use it.
std::optional<std::string_view> bearer_token(std::string_view header);

// The shortest key add_key() takes: 16 characters are ~96 bits of a random
// printable key, beyond online guessing.
inline constexpr size_t kMinApiKeyChars = 16;

// Equal strings, in a time that depends only on the lengths (a secret must
// not leak through how soon a wrong guess is refused).
bool constant_time_equal(std::string_view a, std::string_view b);

// OK when `key` may be an API key: at least kMinApiKeyChars characters, all
// printable ASCII (0x21..0x7E: no spaces or control characters, which a
// bearer header could not carry intact). Else InvalidArgument naming the rule
// and `what` the secret is ("an API key", "the admin token": the admin
// token is a bearer secret too, with more power, so the same rules).
Status check_api_key_rules(std::string_view key, std::string_view what = "an API key");

// "sha256:<64 lowercase hex>" of `key`: the form add_hash() reads and a serve
// config file holds (`api-key-hash = "sha256:..."`).
std::string hash_key_spec(std::string_view key);

struct KeyCheck {
  enum Kind { kNone, kValid, kInvalid, kMalformed } kind = kNone;
  std::string owner;  // set when kValid
};

class ApiKeys {
 public:
  // A plain key (from --api-key); check_api_key_rules() must pass.
  Status add_key(std::string_view key);
  // "sha256:" followed by 64 hex characters (either case).
  Status add_hash(std::string_view spec);
  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }

  KeyCheck check(std::string_view authorization_header_value) const;

 private:
  struct Entry {
    std::string sha256_hex;  // 64 lowercase hex characters
    std::string owner;
  };
  void add_digest(std::string hex);
  std::vector<Entry> keys_;
};

}  // namespace spw::http
