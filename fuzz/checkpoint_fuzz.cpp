// libFuzzer target for the checkpoint parser.
//
// Any input must parse or fail with a status, never crash; a checkpoint that
// parses must re-serialise to exactly the input bytes (the format has one
// encoding per value, so parse is the inverse of serialize). Each input is tried
// twice: raw, and as a payload wrapped in a valid header and checksum, so the
// fuzzer reaches the field parsers instead of stopping at the checksum.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/hash.h"
#include "engine/checkpoint.h"

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}


void check_round_trip(std::string_view bytes) {
  auto parsed = spw::parse_checkpoint(bytes);
  if (!parsed.ok()) return;
  if (spw::serialize_checkpoint(*parsed) != bytes) {
    std::fprintf(stderr, "property violated: serialize(parse(bytes)) != bytes\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view payload(reinterpret_cast<const char*>(data), size);
  check_round_trip(payload);
  std::string wrapped("SPWCKPT", 8);  // includes the terminating NUL of the magic
  put_le(wrapped, spw::Checkpoint::kVersion, 4);
  put_le(wrapped, payload.size(), 8);
  wrapped.append(payload);
  put_le(wrapped, spw::fnv1a64(payload), 8);
  check_round_trip(wrapped);
  return 0;
}
