// Message digests of request bodies.
//
// Contract: sha256_hex(bytes) is the SHA-256 (FIPS 180-4) of the bytes, NUL
// bytes included, as 64 lowercase hex characters. It comes from OpenSSL's
// libcrypto (EVP), not from a hand-written implementation: the journal
// compares request bodies by it (an Idempotency-Key reused with another body
// must be caught however the bodies were chosen, which a non-cryptographic
// hash such as core/hash.h's FNV-1a cannot promise against a hostile client)
// and keeps it in place of the body of a refused request.
// Failure: none the caller can act on; libcrypto failing to hash (out of
// memory) aborts the process, since no digest means no safe comparison.
// Thread safety: pure; safe from any thread.
#pragma once

#include <string>
#include <string_view>

namespace spw {

std::string sha256_hex(std::string_view bytes);

}  // namespace spw
