// libFuzzer target for the GGUF reader (and writer, as an oracle).
//
// For every input: parse it; on success read every metadata value and every
// byte of every tensor (so ASan sees any pointer the reader got wrong), call the
// typed getters, then check a round-trip property: re-serialising the parsed
// file with GgufWriter and parsing that again must succeed and re-serialise to
// the same bytes. A violated property aborts, which libFuzzer reports.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gguf/gguf.h"

namespace {

using namespace spw::gguf;

uint64_t g_sink = 0;  // keeps the reads from being optimised away

void touch(const Value& v) {
  g_sink += static_cast<uint32_t>(v.type);
  if (const auto* s = std::get_if<std::string>(&v.v)) {
    for (char c : *s) g_sink += static_cast<unsigned char>(c);
  } else if (const auto* a = std::get_if<Array>(&v.v)) {
    for (const Value& item : a->items) touch(item);
  } else if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    g_sink += *u;
  } else if (const auto* i = std::get_if<int64_t>(&v.v)) {
    g_sink += static_cast<uint64_t>(*i);
  } else if (const auto* b = std::get_if<bool>(&v.v)) {
    g_sink += *b;
  }
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "gguf_fuzz property violated: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Rebuilds a writer holding exactly what `f` holds. Returns false when the
// writer legitimately refuses it (e.g. general.alignment stored as a non-uint32).
bool rebuild(const GgufFile& f, GgufWriter* w) {
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.alignment") {
      if (value.type != ValueType::kUint32) return false;
      continue;  // the writer adds it from its own alignment
    }
    w->set(key, value);
  }
  for (const TensorInfo& t : f.tensors()) {
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    spw::Status s = w->add_tensor(t.name, static_cast<GgmlType>(t.type), dims,
                                  std::string(reinterpret_cast<const char*>(t.data), t.nbytes));
    if (!s.ok()) fail("writer refused a tensor the reader accepted", s.to_string());
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = GgufFile::parse(spw::make_memory_file(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.gguf"));
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) fail("error without message", "");
    return 0;
  }
  const GgufFile& f = **parsed;
  for (const auto& [key, value] : f.metadata()) {
    touch(value);
    (void)f.get_u64(key);
    (void)f.get_u32(key);
    (void)f.get_i64(key);
    (void)f.get_f64(key);
    (void)f.get_bool(key);
    (void)f.get_string(key);
    (void)f.get_array(key, ValueType::kString);
    if (f.find(key) != &value) fail("find() does not return the listed value", key);
  }
  for (const TensorInfo& t : f.tensors()) {
    if (f.data_offset() + t.offset + t.nbytes > f.file_size()) fail("tensor past end", t.name);
    for (uint64_t i = 0; i < t.nbytes; ++i) g_sink += t.data[i];
    if (f.find_tensor(t.name) != &t) fail("find_tensor() mismatch", t.name);
  }

  GgufWriter w1(f.alignment());
  if (!rebuild(f, &w1)) return 0;
  auto bytes1 = w1.serialize();
  if (!bytes1.ok()) fail("writer refused what the reader accepted", bytes1.status().to_string());
  auto again = GgufFile::parse(spw::make_memory_file(*bytes1, "roundtrip.gguf"));
  if (!again.ok()) fail("reader refused the writer's output", again.status().to_string());
  if ((*again)->tensors().size() != f.tensors().size()) fail("tensor count changed", "");
  GgufWriter w2((*again)->alignment());
  if (!rebuild(**again, &w2)) fail("second rebuild refused", "");
  auto bytes2 = w2.serialize();
  if (!bytes2.ok() || *bytes2 != *bytes1) fail("re-serialisation is not stable", "");
  return 0;
}
