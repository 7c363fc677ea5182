// `spillway hash-key [--generate]`: the line a serve config file holds for an
// API key, `api-key-hash = "sha256:..."`, so that the file is not a secret.
// The key comes from stdin (one line; never from argv, which other users can
// read in /proc and shells keep in history), or --generate makes a fresh one
// and prints it once: Spillway keeps only its hash.
// Exit codes: 0 printed; 2 no key or one that breaks a rule (the message
// names the rule, never the key); 1 no random source for --generate.
#include <unistd.h>

#include <array>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <random>
#include <string>

#include "app/commands.h"
#include "http/auth.h"

namespace spw::app {
namespace {

struct HashKeyOptions {
  bool generate = false;
};

// RFC 4648 section 5, without padding: 32 bytes -> 43 characters.
std::string base64url(const unsigned char* data, size_t n) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    acc = (acc << 8) | data[i];
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kAlphabet[(acc >> bits) & 0x3F];
    }
  }
  if (bits > 0) out += kAlphabet[(acc << (6 - bits)) & 0x3F];
  return out;
}

// "spw-" + 256 random bits: far past guessing, and recognisable in a leak scan.
std::string generate_key() {
  std::random_device rd;  // the OS's source (getrandom / /dev/urandom); throws when there is none
  std::array<unsigned char, 32> bytes{};
  for (size_t i = 0; i < bytes.size(); i += 4) {
    const uint32_t r = rd();
    for (size_t k = 0; k < 4; ++k) bytes[i + k] = static_cast<unsigned char>(r >> (8 * k));
  }
  return "spw-" + base64url(bytes.data(), bytes.size());
}

int run_hash_key(const HashKeyOptions& o) {
  if (o.generate) {
    std::string key;
    try {
      key = generate_key();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "spillway hash-key: no random source for --generate: %s\n", e.what());
      return 1;
    }
    std::printf("# The API key, shown this once (Spillway keeps only its hash); give it to the client:\n%s\n",
                key.c_str());
    std::printf("# For the serve config file (--config):\napi-key-hash = \"%s\"\n", http::hash_key_spec(key).c_str());
    return 0;
  }
  if (isatty(STDIN_FILENO)) std::fprintf(stderr, "API key (one line, then Enter): ");
  std::string line;
  std::getline(std::cin, line);
  // One line: anything after the first newline is a mistake (two keys, a
  // file with more in it), not part of the key.
  const bool more = std::cin.good() && std::cin.peek() != std::char_traits<char>::eof();
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) {
    std::fprintf(stderr, "spillway hash-key: no key on stdin (pipe one line in, or use --generate)\n");
    return 2;
  }
  if (more) {
    std::fprintf(stderr, "spillway hash-key: stdin holds more than one line; give the key alone\n");
    return 2;
  }
  if (Status s = http::check_api_key_rules(line); !s.ok()) {
    std::fprintf(stderr, "spillway hash-key: %s\n", s.message().c_str());
    return 2;
  }
  std::printf("api-key-hash = \"%s\"\n", http::hash_key_spec(line).c_str());
  return 0;
}

}  // namespace

void add_hash_key(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<HashKeyOptions>();
  CLI::App* sub = app.add_subcommand(
      "hash-key", "Print the api-key-hash line for a serve config file, for a key read from stdin or generated");
  sub->add_flag("--generate", o->generate, "Make a fresh random key (printed once) instead of reading one");
  sub->callback([o, &exit_code] { exit_code = run_hash_key(*o); });
}

}  // namespace spw::app
