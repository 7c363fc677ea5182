// GGUF reader. Every read goes through Cursor, which checks the bytes remaining
// first, so no input can make the parser read outside the mapping.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"

namespace spw::gguf {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

// Nesting deeper than this is refused: real files use at most one level, and a
// bound keeps hostile input from recursing the stack away.
constexpr int kMaxArrayDepth = 4;

std::string at(uint64_t off) { return " (at byte offset " + std::to_string(off) + ")"; }

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kFloat64); }

// Fewest bytes one element of `t` can occupy; used to reject counts that the
// remaining bytes cannot possibly hold before anything is reserved.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool: return 1;
    case ValueType::kUint16:
    case ValueType::kInt16: return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32: return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64: return 8;
    case ValueType::kString: return 8;  // u64 length
    case ValueType::kArray: return 12;  // u32 elem type + u64 count
  }
  return 1;
}

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status need(uint64_t n, std::string_view what) const {
    if (remaining() < n) {
      return Status::corruption("truncated: " + std::string(what) + " needs " + std::to_string(n) +
                                " bytes but only " + std::to_string(remaining()) + " remain" +
                                at(pos_));
    }
    return Status::ok_status();
  }

  template <typename T>
  Status read(T* out, std::string_view what) {
    SPW_RETURN_IF_ERROR(need(sizeof(T), what));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok_status();
  }

  Status read_string(std::string* out, std::string_view what) {
    const uint64_t start = pos_;
    uint64_t len = 0;
    SPW_RETURN_IF_ERROR(read(&len, std::string(what) + " (string length)"));
    if (len > remaining()) {
      pos_ = start;
      return Status::corruption(std::string(what) + ": string length " + std::to_string(len) +
                                " exceeds the " + std::to_string(remaining()) +
                                " bytes after it" + at(start));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return Status::ok_status();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

Status read_value(Cursor& c, ValueType t, Value* out, const std::string& key, int depth);

Status read_array(Cursor& c, Value* out, const std::string& key, int depth) {
  const uint64_t start = c.pos();
  uint32_t elem = 0;
  SPW_RETURN_IF_ERROR(c.read(&elem, "key '" + key + "' array element type"));
  if (!known_value_type(elem)) {
    return Status::invalid_argument("key '" + key + "': unknown array element value type " +
                                    std::to_string(elem) + at(start));
  }
  const ValueType et = static_cast<ValueType>(elem);
  if (et == ValueType::kArray && depth + 1 >= kMaxArrayDepth) {
    return Status::corruption("key '" + key + "': arrays nested deeper than " +
                              std::to_string(kMaxArrayDepth) + " levels" + at(start));
  }
  uint64_t count = 0;
  const uint64_t count_pos = c.pos();
  SPW_RETURN_IF_ERROR(c.read(&count, "key '" + key + "' array count"));
  if (count > c.remaining() / min_encoded_size(et)) {
    return Status::corruption("key '" + key + "': array count " + std::to_string(count) + " of " +
                              std::string(value_type_name(et)) + " cannot fit in the " +
                              std::to_string(c.remaining()) + " bytes remaining" + at(count_pos));
  }
  Array arr;
  arr.elem_type = et;
  arr.items.resize(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    SPW_RETURN_IF_ERROR(read_value(c, et, &arr.items[i], key, depth + 1));
  }
  out->type = ValueType::kArray;
  out->v = std::move(arr);
  return Status::ok_status();
}

template <typename T, typename W>
Status read_scalar(Cursor& c, ValueType t, Value* out, const std::string& key) {
  T x{};
  SPW_RETURN_IF_ERROR(c.read(&x, "key '" + key + "' value"));
  out->type = t;
  out->v = static_cast<W>(x);
  return Status::ok_status();
}

Status read_value(Cursor& c, ValueType t, Value* out, const std::string& key, int depth) {
  switch (t) {
    case ValueType::kUint8: return read_scalar<uint8_t, uint64_t>(c, t, out, key);
    case ValueType::kInt8: return read_scalar<int8_t, int64_t>(c, t, out, key);
    case ValueType::kUint16: return read_scalar<uint16_t, uint64_t>(c, t, out, key);
    case ValueType::kInt16: return read_scalar<int16_t, int64_t>(c, t, out, key);
    case ValueType::kUint32: return read_scalar<uint32_t, uint64_t>(c, t, out, key);
    case ValueType::kInt32: return read_scalar<int32_t, int64_t>(c, t, out, key);
    case ValueType::kUint64: return read_scalar<uint64_t, uint64_t>(c, t, out, key);
    case ValueType::kInt64: return read_scalar<int64_t, int64_t>(c, t, out, key);
    case ValueType::kFloat32: return read_scalar<float, double>(c, t, out, key);
    case ValueType::kFloat64: return read_scalar<double, double>(c, t, out, key);
    case ValueType::kBool: {
      const uint64_t p = c.pos();
      uint8_t b = 0;
      SPW_RETURN_IF_ERROR(c.read(&b, "key '" + key + "' value"));
      if (b > 1) {
        return Status::corruption("key '" + key + "': bool byte is " + std::to_string(b) +
                                  ", not 0 or 1" + at(p));
      }
      out->type = t;
      out->v = b == 1;
      return Status::ok_status();
    }
    case ValueType::kString: {
      std::string s;
      SPW_RETURN_IF_ERROR(c.read_string(&s, "key '" + key + "' value"));
      out->type = t;
      out->v = std::move(s);
      return Status::ok_status();
    }
    case ValueType::kArray: return read_array(c, out, key, depth);
  }
  return Status::invalid_argument("key '" + key + "': unknown value type " +
                                  std::to_string(static_cast<uint32_t>(t)) + at(c.pos()));
}

std::string dims_string(const TensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.ne[i]);
  }
  return s + "]";
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kUint8: return "uint8";
    case ValueType::kInt8: return "int8";
    case ValueType::kUint16: return "uint16";
    case ValueType::kInt16: return "int16";
    case ValueType::kUint32: return "uint32";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "uint64";
    case ValueType::kInt64: return "int64";
    case ValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64: return true;
    default: return false;
  }
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(Env& env, const std::string& path, const MapOptions& map) {
  SPW_ASSIGN_OR_RETURN(auto mapped, env.map_file(path, map));
  return parse(std::move(mapped));
}

namespace {

// The header: magic, version and the two counts, each count checked against
// the bytes that remain.
Status read_header(Cursor& c, const std::string& ctx, uint32_t* version, uint64_t* n_tensors_out, uint64_t* n_kv_out) {
  uint32_t magic = 0;
  SPW_RETURN_IF_ERROR(c.read(&magic, "magic").with_context(ctx));
  if (magic != kGgufMagic) {
    char m[4];
    std::memcpy(m, &magic, 4);
    std::string shown;
    for (char ch : m) shown += (ch >= 32 && ch < 127) ? ch : '?';
    return Status::corruption("bad magic '" + shown + "', expected 'GGUF'" + at(0)).with_context(ctx);
  }
  SPW_RETURN_IF_ERROR(c.read(version, "version").with_context(ctx));
  if (*version != 2 && *version != 3) {
    return Status::invalid_argument("unsupported GGUF version " + std::to_string(*version) +
                                    " (only 2 and 3 are read)" + at(4))
        .with_context(ctx);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  SPW_RETURN_IF_ERROR(c.read(&n_tensors, "tensor_count").with_context(ctx));
  SPW_RETURN_IF_ERROR(c.read(&n_kv, "metadata_kv_count").with_context(ctx));
  // A KV is at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
  // least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
  if (n_kv > c.remaining() / 13) {
    return Status::corruption("metadata_kv_count " + std::to_string(n_kv) + " cannot fit in the " +
                              std::to_string(c.remaining()) + " bytes remaining" + at(16))
        .with_context(ctx);
  }
  if (n_tensors > c.remaining() / 32) {
    return Status::corruption("tensor_count " + std::to_string(n_tensors) + " cannot fit in the " +
                              std::to_string(c.remaining()) + " bytes remaining" + at(8))
        .with_context(ctx);
  }
  *n_tensors_out = n_tensors;
  *n_kv_out = n_kv;
  return Status::ok_status();
}

using NameIndex = std::map<std::string, size_t, std::less<>>;

// The n_kv metadata entries, in file order, each key once.
Status read_metadata(Cursor& c, const std::string& ctx, uint64_t n_kv, std::vector<std::pair<std::string, Value>>& kv,
                     NameIndex& kv_index) {
  kv.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t kv_pos = c.pos();
    std::string key;
    SPW_RETURN_IF_ERROR(
        c.read_string(&key, "key of metadata entry #" + std::to_string(i)).with_context(ctx));
    if (kv_index.count(key) != 0) {
      return Status::corruption("duplicate metadata key '" + key + "'" + at(kv_pos)).with_context(ctx);
    }
    const uint64_t type_pos = c.pos();
    uint32_t type = 0;
    SPW_RETURN_IF_ERROR(c.read(&type, "key '" + key + "' value type").with_context(ctx));
    if (!known_value_type(type)) {
      return Status::invalid_argument("key '" + key + "': unknown value type " +
                                      std::to_string(type) + at(type_pos))
          .with_context(ctx);
    }
    Value v;
    SPW_RETURN_IF_ERROR(read_value(c, static_cast<ValueType>(type), &v, key, 0).with_context(ctx));
    kv_index.emplace(key, kv.size());
    kv.emplace_back(std::move(key), std::move(v));
  }
  return Status::ok_status();
}

// general.alignment, when the file sets it: a nonzero power of two that fits
// 32 bits.
Status read_alignment(const Value* a, const std::string& ctx, uint32_t* alignment) {
  const uint64_t* u = std::get_if<uint64_t>(&a->v);
  const int64_t* s = std::get_if<int64_t>(&a->v);
  uint64_t al = 0;
  bool ok = a->is_integer();
  if (ok && u != nullptr) al = *u;
  if (ok && s != nullptr) {
    ok = *s > 0;
    al = ok ? static_cast<uint64_t>(*s) : 0;
  }
  if (!ok || al == 0 || al > UINT32_MAX || !std::has_single_bit(al)) {
    std::string shown = a->is_integer() ? std::to_string(al) : std::string(value_type_name(a->type));
    return Status::corruption("key 'general.alignment' must be a nonzero power of two, got " + shown)
        .with_context(ctx);
  }
  *alignment = static_cast<uint32_t>(al);
  return Status::ok_status();
}

// Tensor info #i: a new nonempty name, 1..kMaxDims nonzero dims whose element
// count stays below 2^63, a known type whose blocks tile ne[0], an aligned
// data offset. Where the data lies is checked once the data section is known.
Status read_tensor_info(Cursor& c, const std::string& ctx, uint64_t i, uint32_t alignment,
                        const NameIndex& tensor_index, TensorInfo& t) {
  const uint64_t info_pos = c.pos();
  SPW_RETURN_IF_ERROR(
      c.read_string(&t.name, "name of tensor #" + std::to_string(i)).with_context(ctx));
  const std::string tn = "tensor '" + t.name + "'";
  if (t.name.empty()) {
    return Status::corruption("tensor #" + std::to_string(i) + " has an empty name" + at(info_pos))
        .with_context(ctx);
  }
  if (tensor_index.count(t.name) != 0) {
    return Status::corruption("duplicate " + tn + at(info_pos)).with_context(ctx);
  }
  const uint64_t dims_pos = c.pos();
  SPW_RETURN_IF_ERROR(c.read(&t.n_dims, tn + " n_dims").with_context(ctx));
  if (t.n_dims == 0 || t.n_dims > static_cast<uint32_t>(kMaxDims)) {
    return Status::corruption(tn + ": n_dims " + std::to_string(t.n_dims) + " is not in 1.." +
                              std::to_string(kMaxDims) + at(dims_pos))
        .with_context(ctx);
  }
  uint64_t n = 1;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    const uint64_t ne_pos = c.pos();
    SPW_RETURN_IF_ERROR(c.read(&t.ne[d], tn + " ne[" + std::to_string(d) + "]").with_context(ctx));
    if (t.ne[d] == 0) {
      return Status::corruption(tn + ": ne[" + std::to_string(d) + "] is zero" + at(ne_pos))
          .with_context(ctx);
    }
    // ggml indexes with int64_t, so the element count must stay below 2^63.
    if (t.ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / n) {
      return Status::corruption(tn + ": element count overflows at ne[" + std::to_string(d) +
                                "] = " + std::to_string(t.ne[d]) + at(ne_pos))
          .with_context(ctx);
    }
    n *= t.ne[d];
  }
  t.n_elements = n;
  const uint64_t type_pos = c.pos();
  SPW_RETURN_IF_ERROR(c.read(&t.type, tn + " type").with_context(ctx));
  const GgmlTypeInfo* info = ggml_type_info(t.type);
  if (info == nullptr) {
    return Status::invalid_argument(tn + ": unknown ggml type id " + std::to_string(t.type) +
                                    at(type_pos))
        .with_context(ctx);
  }
  if (t.ne[0] % info->block_size != 0) {
    return Status::corruption(tn + ": ne[0] = " + std::to_string(t.ne[0]) +
                              " is not a multiple of " + info->name + "'s block size " +
                              std::to_string(info->block_size) + at(dims_pos))
        .with_context(ctx);
  }
  auto nbytes = ggml_nbytes(t.type, n);
  if (!nbytes.ok()) {
    return Status::corruption(tn + ": " + nbytes.status().message() + at(type_pos)).with_context(ctx);
  }
  t.nbytes = *nbytes;
  const uint64_t off_pos = c.pos();
  SPW_RETURN_IF_ERROR(c.read(&t.offset, tn + " offset").with_context(ctx));
  if (t.offset % alignment != 0) {
    return Status::corruption(tn + ": data offset " + std::to_string(t.offset) +
                              " is not a multiple of the alignment " +
                              std::to_string(alignment) + at(off_pos))
        .with_context(ctx);
  }
  return Status::ok_status();
}

// Each tensor's data inside the data section (pointed at from `base`), and no
// two tensors' data overlapping.
Status place_tensor_data(std::vector<TensorInfo>& tensors, const uint8_t* base, uint64_t data_offset,
                         uint64_t data_size, const std::string& ctx) {
  for (TensorInfo& t : tensors) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return Status::corruption("tensor '" + t.name + "' " + ggml_type_name(t.type) + " " +
                                dims_string(t) + ": data [" + std::to_string(t.offset) + ", +" +
                                std::to_string(t.nbytes) + ") ends past the " +
                                std::to_string(data_size) + "-byte data section (file offset " +
                                std::to_string(data_offset + t.offset) + ")")
          .with_context(ctx);
    }
    t.data = base + data_offset + t.offset;
  }

  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return tensors[x].offset < tensors[y].offset;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& prev = tensors[order[i - 1]];
    const TensorInfo& cur = tensors[order[i]];
    if (prev.offset + prev.nbytes > cur.offset) {
      return Status::corruption("tensor '" + cur.name + "' data at offset " +
                                std::to_string(cur.offset) + " overlaps tensor '" + prev.name +
                                "' [" + std::to_string(prev.offset) + ", " +
                                std::to_string(prev.offset + prev.nbytes) + ") (file offset " +
                                std::to_string(data_offset + cur.offset) + ")")
          .with_context(ctx);
    }
  }
  return Status::ok_status();
}

}  // namespace

Result<std::unique_ptr<GgufFile>> GgufFile::parse(std::unique_ptr<MappedFile> file) {
  if (file == nullptr) return Status::invalid_argument("gguf: null file");
  const std::string ctx = "gguf '" + file->path() + "'";
  std::unique_ptr<GgufFile> g(new GgufFile());
  const uint8_t* base = file->data();
  const uint64_t size = file->size();
  Cursor c(base, static_cast<size_t>(size));

  uint64_t n_tensors = 0, n_kv = 0;
  SPW_RETURN_IF_ERROR(read_header(c, ctx, &g->version_, &n_tensors, &n_kv));
  SPW_RETURN_IF_ERROR(read_metadata(c, ctx, n_kv, g->kv_, g->kv_index_));
  if (const Value* a = g->find("general.alignment")) {
    SPW_RETURN_IF_ERROR(read_alignment(a, ctx, &g->alignment_));
  }

  g->tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    SPW_RETURN_IF_ERROR(read_tensor_info(c, ctx, i, g->alignment_, g->tensor_index_, t));
    g->tensor_index_.emplace(t.name, g->tensors_.size());
    g->tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment. A file with
  // no tensors may end before that padding (vocab-only files do).
  const uint64_t a = g->alignment_;
  const uint64_t data_offset = (c.pos() + a - 1) / a * a;  // pos <= size < 2^63: no overflow
  if (data_offset > size && !g->tensors_.empty()) {
    return Status::corruption("data section at " + std::to_string(data_offset) +
                              " starts past the end of the " + std::to_string(size) + "-byte file")
        .with_context(ctx);
  }
  g->data_offset_ = std::min(data_offset, size);
  const uint64_t data_size = size - g->data_offset_;
  SPW_RETURN_IF_ERROR(place_tensor_data(g->tensors_, base, g->data_offset_, data_size, ctx));

  g->file_ = std::move(file);
  return g;
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status missing(std::string_view key) {
  return Status::not_found("metadata key '" + std::string(key) + "' not found");
}

Status wrong_type(std::string_view key, const Value& v, std::string_view expected) {
  return Status::invalid_argument("metadata key '" + std::string(key) + "' has type " +
                                  std::string(value_type_name(v.type)) + ", expected " +
                                  std::string(expected));
}

// Integer value as a signed/unsigned pair, for range checks.
bool as_u64(const Value& v, uint64_t* out) {
  if (!v.is_integer()) return false;
  if (auto* u = std::get_if<uint64_t>(&v.v)) {
    *out = *u;
    return true;
  }
  if (auto* s = std::get_if<int64_t>(&v.v); s && *s >= 0) {
    *out = static_cast<uint64_t>(*s);
    return true;
  }
  return false;
}

bool as_i64(const Value& v, int64_t* out) {
  if (!v.is_integer()) return false;
  if (auto* s = std::get_if<int64_t>(&v.v)) {
    *out = *s;
    return true;
  }
  if (auto* u = std::get_if<uint64_t>(&v.v);
      u && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    *out = static_cast<int64_t>(*u);
    return true;
  }
  return false;
}

}  // namespace

Result<uint64_t> GgufFile::get_u64(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  uint64_t x = 0;
  if (!as_u64(*v, &x)) return wrong_type(key, *v, "a non-negative integer");
  return x;
}

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  uint64_t x = 0;
  if (!as_u64(*v, &x) || x > UINT32_MAX) return wrong_type(key, *v, "an integer in uint32 range");
  return static_cast<uint32_t>(x);
}

Result<int64_t> GgufFile::get_i64(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  int64_t x = 0;
  if (!as_i64(*v, &x)) return wrong_type(key, *v, "an integer in int64 range");
  return x;
}

Result<double> GgufFile::get_f64(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (auto* d = std::get_if<double>(&v->v)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v->v); u && v->is_integer()) return static_cast<double>(*u);
  if (auto* s = std::get_if<int64_t>(&v->v); s && v->is_integer()) return static_cast<double>(*s);
  return wrong_type(key, *v, "a float or integer");
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  SPW_ASSIGN_OR_RETURN(double d, get_f64(key));
  return static_cast<float>(d);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (auto* b = std::get_if<bool>(&v->v); b && v->type == ValueType::kBool) return *b;
  return wrong_type(key, *v, "bool");
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (auto* s = std::get_if<std::string>(&v->v); s && v->type == ValueType::kString) return *s;
  return wrong_type(key, *v, "string");
}

Result<const Array*> GgufFile::get_array(std::string_view key, ValueType elem_type) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  const Array* a = std::get_if<Array>(&v->v);
  if (a == nullptr || v->type != ValueType::kArray) {
    return wrong_type(key, *v, "array of " + std::string(value_type_name(elem_type)));
  }
  if (a->elem_type != elem_type) {
    return Status::invalid_argument("metadata key '" + std::string(key) + "' is an array of " +
                                    std::string(value_type_name(a->elem_type)) + ", expected array of " +
                                    std::string(value_type_name(elem_type)));
  }
  return a;
}

Result<uint32_t> GgufFile::get_u32_or(std::string_view key, uint32_t dflt) const {
  if (!has(key)) return dflt;
  return get_u32(key);
}

Result<float> GgufFile::get_f32_or(std::string_view key, float dflt) const {
  if (!has(key)) return dflt;
  return get_f32(key);
}

Result<bool> GgufFile::get_bool_or(std::string_view key, bool dflt) const {
  if (!has(key)) return dflt;
  return get_bool(key);
}

Result<std::string> GgufFile::get_string_or(std::string_view key, std::string dflt) const {
  if (!has(key)) return dflt;
  return get_string(key);
}

}  // namespace spw::gguf
