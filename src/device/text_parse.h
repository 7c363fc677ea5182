// Strict parsers for the text formats of procfs, sysfs and cgroupfs, and the
// fake-root path join every probe uses.
//
// Contract: parsers accept exactly the documented format (surrounding ASCII
// whitespace allowed) and return InvalidArgument naming the offending text
// otherwise: no partial numbers ("12abc"), no sign, no overflow. They never
// throw and never read past the given view.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "core/status.h"
#include "device/reading.h"

namespace spw::device {

// "/" + "/proc/meminfo" -> "/proc/meminfo"; "/tmp/root/" + "/proc/x" ->
// "/tmp/root/proc/x". `abs_path` must start with '/'.
std::string join_root(std::string_view root, std::string_view abs_path);

std::string_view trim(std::string_view s);

// Unsigned decimal, e.g. "4096\n". Rejects empty, signs, garbage, overflow.
Result<uint64_t> parse_u64(std::string_view text);
// Hexadecimal with a "0x" prefix, e.g. "0x1002\n" (sysfs vendor/device ids).
Result<uint64_t> parse_hex_u64(std::string_view text);
// cgroup v2 limit file: "max" or an unsigned decimal.
Result<ByteLimit> parse_cgroup_limit(std::string_view text);

// "Key:   value" lines (/proc/meminfo, /proc/self/status) -> key -> trimmed
// value ("24683568 kB"). Lines without ':' are ignored; the first occurrence of
// a key wins.
std::map<std::string, std::string, std::less<>> parse_colon_lines(std::string_view text);
// "key value" lines (memory.events, memory.stat, memory.oom_control).
std::map<std::string, std::string, std::less<>> parse_space_lines(std::string_view text);

// "24683568 kB" -> bytes. InvalidArgument when the unit is not "kB", the
// number is malformed, or bytes overflow 64 bits.
Result<uint64_t> parse_kb_value(std::string_view value);

// Looks `key` up in a parse_colon_lines map and converts its "N kB" value.
// Unknown reasons name `source` and the key.
Reading<uint64_t> kb_field(const std::map<std::string, std::string, std::less<>>& fields,
                           std::string_view key, const std::string& source);

}  // namespace spw::device
