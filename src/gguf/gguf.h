// GGUF container: bounds-checked reader over a memory map, and a writer.
//
// Reader contract: GgufFile::open maps the file read-only and parses the header,
// every metadata key/value (all 13 value types, nested arrays), and the tensor
// table; it checks alignment, that every tensor's data lies inside the file and
// that tensors do not overlap. Any truncated, corrupt or hostile input yields a
// Corruption (malformed bytes) or InvalidArgument (unknown value/tensor type,
// unsupported version) Status whose message names the field and byte offset; it
// never crashes and never allocates more than the file could describe (counts are
// checked against the bytes remaining before anything is reserved).
// Tensor data is not copied: TensorInfo::data points into the mapping, valid
// while the GgufFile lives. A GgufFile is immutable after open and safe to share
// between threads.
// Details: versions 2 and 3 only (anything else, v1 included, is
// InvalidArgument naming the version); host must be little-endian. Corruption
// covers: bad magic; truncation anywhere; a string length, array count,
// metadata_kv_count or tensor_count larger than the bytes left could hold;
// arrays nested more than 4 deep; a bool byte other than 0/1; duplicate keys
// or tensor names; an empty tensor name; n_dims outside 1..4; a zero or
// overflowing (>= 2^63 elements or bytes) dimension; ne[0] not a multiple of
// the type's block size; `general.alignment` not an integer that is a nonzero
// power of two; a tensor offset not a multiple of the alignment; tensor data
// past the end of the file; overlapping tensors. InvalidArgument: unknown
// metadata value type or array element type (naming the key), unknown ggml
// type id (naming the id and the tensor). Messages start with "gguf '<path>': "
// and give the byte offset of the offending field. A file without tensors may
// end right after its metadata (llama.cpp's vocab-only files do); data_offset()
// is then the file size.
//
// Writer contract: GgufWriter collects metadata and tensors in insertion order
// and serialises GGUF v3 with the given alignment (default 32; when it is not
// 32, `general.alignment` is written too). Used by tests and by the
// random-model generator. Values are checked at serialisation: a Value whose
// variant does not match its `type` (or does not fit it, e.g. 300 as uint8), or
// an array item whose type differs from the array's elem_type, is
// InvalidArgument naming the key. Tensors may be given as bytes (add_tensor) or
// as a producer called during serialisation (add_tensor_streamed), so that a
// multi-GiB model never has to be held in memory: write_streaming() then needs
// only the largest single tensor in RAM. A writer is not thread-safe; a const
// writer may be serialised from one thread at a time (producers may have state).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "gguf/ggml_types.h"

namespace spw::gguf {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view value_type_name(ValueType t);

struct Value;
struct Array {
  ValueType elem_type = ValueType::kUint8;
  std::vector<Value> items;
};

// One metadata value. Integers are widened (unsigned to uint64_t, signed to
// int64_t), floats to double; `type` keeps the on-disk type.
struct Value {
  ValueType type = ValueType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> v;

  static Value u8(uint8_t x) { return {ValueType::kUint8, uint64_t{x}}; }
  static Value i8(int8_t x) { return {ValueType::kInt8, int64_t{x}}; }
  static Value u16(uint16_t x) { return {ValueType::kUint16, uint64_t{x}}; }
  static Value i16(int16_t x) { return {ValueType::kInt16, int64_t{x}}; }
  static Value u32(uint32_t x) { return {ValueType::kUint32, uint64_t{x}}; }
  static Value i64(int64_t x) { return {ValueType::kInt64, x}; }
  static Value f64(double x) { return {ValueType::kFloat64, x}; }
  static Value u64(uint64_t x) { return {ValueType::kUint64, x}; }
  static Value i32(int32_t x) { return {ValueType::kInt32, int64_t{x}}; }
  static Value f32(float x) { return {ValueType::kFloat32, double{x}}; }
  static Value boolean(bool x) { return {ValueType::kBool, x}; }
  static Value str(std::string s) { return {ValueType::kString, std::move(s)}; }
  static Value array(ValueType elem, std::vector<Value> items) {
    return {ValueType::kArray, Array{elem, std::move(items)}};
  }

  bool is_integer() const;
  bool is_float() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  uint64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] is the innermost (contiguous) dimension
  uint32_t type = 0;                       // GgmlType id
  uint64_t offset = 0;                     // relative to the data section
  uint64_t n_elements = 0;
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(Env& env, const std::string& path, const MapOptions& map = {});
  static Result<std::unique_ptr<GgufFile>> parse(std::unique_ptr<MappedFile> file);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_->size(); }
  const std::string& path() const { return file_->path(); }
  // Residency of the mapping (MappedFile::page_in / page_out).
  Status page_in() const { return file_->page_in(); }
  Status page_out() const { return file_->page_out(); }
  // page_out of the whole pages of [p, p + n), bytes of this file's mapping.
  Status page_out(const uint8_t* p, size_t n) const {
    return file_->page_out(static_cast<size_t>(p - file_->data()), n);
  }
  // Whether the pages of [p, p + n), bytes of this file's mapping, are all in memory.
  bool resident(const uint8_t* p, size_t n) const { return file_->resident(static_cast<size_t>(p - file_->data()), n); }

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters: NotFound naming the key when absent; InvalidArgument naming
  // the key, actual and expected type when the type does not fit (integers are
  // accepted from any integer type whose value fits the requested range).
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<double> get_f64(std::string_view key) const;  // any float or integer
  Result<float> get_f32(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<const Array*> get_array(std::string_view key, ValueType elem_type) const;
  // Getters with a default when the key is absent (wrong type is still an error).
  Result<uint32_t> get_u32_or(std::string_view key, uint32_t dflt) const;
  Result<float> get_f32_or(std::string_view key, float dflt) const;
  Result<bool> get_bool_or(std::string_view key, bool dflt) const;
  Result<std::string> get_string_or(std::string_view key, std::string dflt) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = kDefaultAlignment) : alignment_(alignment) {}

  // Replaces an existing key of the same name.
  void set(std::string key, Value value);
  // `data` must hold exactly ggml_nbytes(type, product of dims) bytes.
  Status add_tensor(std::string name, GgmlType type, std::vector<uint64_t> dims, std::string data);

  // Fills `out` (given empty) with exactly ggml_nbytes(type, product of dims)
  // bytes of one tensor. Called once per serialisation, in tensor order; it must
  // produce the same bytes each time if the writer is serialised twice.
  using TensorProducer = std::function<Status(std::string* out)>;
  // Declares a tensor whose bytes come from `produce` at serialisation time.
  // InvalidArgument for a duplicate/empty name, bad dims (1..4, nonzero),
  // unknown type or ne[0] not a multiple of the type's block size.
  Status add_tensor_streamed(std::string name, GgmlType type, std::vector<uint64_t> dims,
                             TensorProducer produce);

  // Receives the file's bytes in order, in pieces; an error stops serialisation.
  using Sink = std::function<Status(std::string_view bytes)>;
  Status serialize_to(const Sink& sink) const;
  // Size in bytes that serialize() will produce (InvalidArgument as serialize).
  Result<uint64_t> serialized_size() const;

  // The whole file as bytes.
  Result<std::string> serialize() const;
  // serialize() then env.write_file (atomic: tmp + fsync + rename). Holds the
  // whole file in memory.
  Status write(Env& env, const std::string& path) const;
  // Streams to `path`.tmp with POSIX I/O, fsyncs and renames over `path`; on
  // failure the tmp file is removed. Memory: one tensor at a time. This bypasses
  // Env because Env has no streaming-write API; tests that use a fake Env
  // should call write() instead.
  Status write_streaming(const std::string& path) const;

  size_t tensor_count() const { return tensors_.size(); }

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    std::string data;
    TensorProducer produce;  // set for streamed tensors; then `data` is empty
    uint64_t nbytes = 0;
  };
  Status check_tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                      uint64_t* nbytes) const;
  Result<std::string> serialize_header() const;
  uint32_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace spw::gguf
