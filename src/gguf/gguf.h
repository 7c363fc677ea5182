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
//
// Writer contract: GgufWriter collects metadata and tensors in insertion order
// and serialises GGUF v3 with the given alignment (default 32). Used by tests and
// by the random-model generator.
#pragma once

#include <cstdint>
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

  static Value u32(uint32_t x) { return {ValueType::kUint32, uint64_t{x}}; }
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
  static Result<std::unique_ptr<GgufFile>> open(Env& env, const std::string& path);
  static Result<std::unique_ptr<GgufFile>> parse(std::unique_ptr<MappedFile> file);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_->size(); }
  const std::string& path() const { return file_->path(); }

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

  // The whole file as bytes.
  Result<std::string> serialize() const;
  Status write(Env& env, const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    std::string data;
  };
  uint32_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace spw::gguf
