// Byte sizes as people write them, for flags and config files.
//
// Contract: parse_byte_size() accepts a number (integer or decimal) with an
// optional K/M/G/T suffix in powers of 1024 and an optional trailing "iB" or
// "B" ("512M", "1.5GiB", "64 MiB", "1048576", "7b"), case-insensitive,
// surrounding and inner spaces allowed; the result is rounded to a whole
// byte. InvalidArgument naming the text otherwise (a sign, another suffix,
// more than kMaxByteSize), and for zero unless allow_zero. The flags
// (--device-memory, --host-budget, ...), the config file, the HTTP API's size
// fields (reservations) and drill scenarios share it, so one text means one
// size everywhere.
// check_byte_size() is the same domain rule for a size that arrived as a
// number (a JSON integer): InvalidArgument naming `what` above kMaxByteSize
// or, unless allow_zero, at zero.
// Why a domain far below 2^64: every ledger adds sizes up (reservations,
// co-tenants, observed use). With each size at most 2^50 (1 PiB, beyond any
// memory a machine has), sums of millions of them cannot wrap, so no client
// can declare a size that turns a total into a small number.
// format_byte_size() is the one way sizes are written for people (messages,
// logs, the CLI, reports): whole bytes below 1 KiB ("512 B"), else binary
// units with three significant digits ("1.13 MiB", "25.4 MiB", "972 MiB",
// "8.00 GiB"). Exact figures go in JSON and metrics as byte counts instead.
// Thread safety: pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace spw {

inline constexpr uint64_t kMaxByteSize = uint64_t{1} << 50;  // 1 PiB

Result<uint64_t> parse_byte_size(std::string_view text, bool allow_zero = false);
Status check_byte_size(uint64_t bytes, std::string_view what, bool allow_zero = false);
std::string format_byte_size(uint64_t bytes);

}  // namespace spw
