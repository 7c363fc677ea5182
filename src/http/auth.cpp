#include "http/auth.h"

#include <algorithm>

#include "core/digest.h"

namespace spw::http {
namespace {

constexpr std::string_view kSpecPrefix = "sha256:";
constexpr size_t kSha256HexChars = 64;

bool is_key_char(char c) { return c >= 0x21 && c <= 0x7E; }

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Not a secret: 48 bits of the key's hash name it in logs and the journal.
std::string owner_of(std::string_view hex) { return "key-" + std::string(hex.substr(0, 12)); }

}  // namespace

bool constant_time_equal(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

Status check_api_key_rules(std::string_view key, std::string_view what) {
  // Positions and lengths only: the key itself must not reach a log.
  if (key.size() < kMinApiKeyChars) {
    return Status::invalid_argument(std::string(what) + " must be at least " + std::to_string(kMinApiKeyChars) +
                                    " characters long (this one has " + std::to_string(key.size()) + ")");
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (!is_key_char(key[i])) {
      return Status::invalid_argument(std::string(what) + " must be printable ASCII without spaces (character " +
                                      std::to_string(i + 1) + " of " + std::to_string(key.size()) + " is not)");
    }
  }
  return Status::ok_status();
}

std::string hash_key_spec(std::string_view key) { return std::string(kSpecPrefix) + sha256_hex(key); }

void ApiKeys::add_digest(std::string hex) {
  for (const Entry& e : keys_) {
    if (e.sha256_hex == hex) return;  // the same key twice: one entry, one owner
  }
  std::string owner = owner_of(hex);
  keys_.push_back({std::move(hex), std::move(owner)});
}

Status ApiKeys::add_key(std::string_view key) {
  if (Status s = check_api_key_rules(key); !s.ok()) return s;
  add_digest(sha256_hex(key));
  return Status::ok_status();
}

Status ApiKeys::add_hash(std::string_view spec) {
  // The spec is not quoted back either: a key pasted here by mistake would be.
  const bool ok = spec.size() == kSpecPrefix.size() + kSha256HexChars && spec.starts_with(kSpecPrefix) &&
                  std::all_of(spec.begin() + static_cast<std::ptrdiff_t>(kSpecPrefix.size()), spec.end(), is_hex);
  if (!ok) {
    return Status::invalid_argument(
        "an API key hash must be \"sha256:\" followed by 64 hex characters, as `spillway hash-key` prints it "
        "(this one has " +
        std::to_string(spec.size()) + " characters" +
        (spec.starts_with(kSpecPrefix) ? ")" : " and does not start with \"sha256:\")"));
  }
  std::string hex(spec.substr(kSpecPrefix.size()));
  std::transform(hex.begin(), hex.end(), hex.begin(), ascii_lower);
  add_digest(std::move(hex));
  return Status::ok_status();
}

std::optional<std::string_view> bearer_token(std::string_view header) {
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (ascii_lower(header[i]) != kScheme[i]) return std::nullopt;
  }
  std::string_view token = header.substr(kScheme.size());
  const size_t spaces = token.find_first_not_of(' ');
  if (spaces == 0 || spaces == std::string_view::npos) return std::nullopt;  // "Bearerx..." or no token
  token.remove_prefix(spaces);
  if (!std::all_of(token.begin(), token.end(), is_key_char)) return std::nullopt;
  return token;
}

KeyCheck ApiKeys::check(std::string_view header) const {
  KeyCheck out;
  if (header.empty()) return out;  // kNone
  out.kind = KeyCheck::kMalformed;
  const std::optional<std::string_view> bearer = bearer_token(header);
  if (!bearer) return out;
  const std::string_view token = *bearer;

  // Every stored hash is compared, whatever matched before: the time says
  // nothing about which key matched or how far a guess got.
  const std::string digest = sha256_hex(token);
  size_t match = 0;
  unsigned found = 0;
  for (size_t i = 0; i < keys_.size(); ++i) {
    const unsigned eq = constant_time_equal(digest, keys_[i].sha256_hex) ? 1u : 0u;
    const size_t mask = static_cast<size_t>(0) - eq;  // all ones when equal
    match = (i & mask) | (match & ~mask);
    found |= eq;
  }
  if (found == 0) {
    out.kind = KeyCheck::kInvalid;
    return out;
  }
  out.kind = KeyCheck::kValid;
  out.owner = keys_[match].owner;
  return out;
}

}  // namespace spw::http
