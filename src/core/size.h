// Byte sizes as people write them, for flags and config files.
//
// Contract: parse_byte_size() accepts a number (integer or decimal) with an
// optional K/M/G/T suffix in powers of 1024 and an optional trailing "iB" or
// "B" ("512M", "1.5GiB", "64 MiB", "1048576", "7b"), case-insensitive,
// surrounding and inner spaces allowed; the result is rounded to a whole
// byte. InvalidArgument naming the text otherwise (a sign, another suffix,
// more than 2^64 - 1), and for zero unless allow_zero. The flags
// (--device-memory, --host-budget, ...) and drill scenarios share it, so one
// text means one size everywhere.
// Thread safety: pure.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace spw {

Result<uint64_t> parse_byte_size(std::string_view text, bool allow_zero = false);

}  // namespace spw
