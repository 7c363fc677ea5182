// sha256_hex against the FIPS 180-2 test vectors (appendix B).
#include "core/digest.h"

#include <gtest/gtest.h>

#include <string>

namespace spw {
namespace {

TEST(Sha256Hex, Fips180_2Vectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1'000'000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Hex, HashesEveryByteIncludingNul) {
  const std::string with_nul("a\0b", 3);
  EXPECT_NE(sha256_hex(with_nul), sha256_hex("a"));
  EXPECT_NE(sha256_hex(with_nul), sha256_hex(std::string("a\0c", 3)));
  const std::string h = sha256_hex(with_nul);
  ASSERT_EQ(h.size(), 64u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos) << h;
}

}  // namespace
}  // namespace spw
