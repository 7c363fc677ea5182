#include "core/digest.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>

namespace spw {

std::string sha256_hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // EVP_Digest is one-shot: init, update, final on a context of its own.
  // bytes.data() may be null for an empty view; libcrypto accepts (null, 0).
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1 || len != 32) {
    std::fprintf(stderr, "spillway: libcrypto failed to compute a SHA-256 digest\n");
    std::abort();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 0x0f];
  }
  return out;
}

}  // namespace spw
