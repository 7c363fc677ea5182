// GGUF v3 writer. The header (KVs + tensor table) is built in memory; tensor
// bytes are streamed to a Sink one tensor at a time, with alignment padding.
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"

namespace spw::gguf {
namespace {

constexpr int kMaxWriteArrayDepth = 4;  // matches what the reader accepts

void put_bytes(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}
template <typename T>
void put(std::string* out, T x) {
  put_bytes(out, &x, sizeof x);
}
void put_string(std::string* out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

Status bad_value(const std::string& key, std::string_view why) {
  return Status::invalid_argument("gguf writer: key '" + key + "': " + std::string(why));
}

template <typename T>
Status put_unsigned(std::string* out, const Value& v, const std::string& key) {
  const uint64_t* u = std::get_if<uint64_t>(&v.v);
  if (u == nullptr) return bad_value(key, std::string(value_type_name(v.type)) + " value does not hold an unsigned integer");
  if (*u > std::numeric_limits<T>::max()) {
    return bad_value(key, std::to_string(*u) + " does not fit " + std::string(value_type_name(v.type)));
  }
  put<T>(out, static_cast<T>(*u));
  return Status::ok_status();
}

template <typename T>
Status put_signed(std::string* out, const Value& v, const std::string& key) {
  const int64_t* s = std::get_if<int64_t>(&v.v);
  if (s == nullptr) return bad_value(key, std::string(value_type_name(v.type)) + " value does not hold a signed integer");
  if (*s < std::numeric_limits<T>::min() || *s > std::numeric_limits<T>::max()) {
    return bad_value(key, std::to_string(*s) + " does not fit " + std::string(value_type_name(v.type)));
  }
  put<T>(out, static_cast<T>(*s));
  return Status::ok_status();
}

// Writes the payload of `v` (not its type tag).
Status put_value(std::string* out, const Value& v, const std::string& key, int depth) {
  switch (v.type) {
    case ValueType::kUint8: return put_unsigned<uint8_t>(out, v, key);
    case ValueType::kUint16: return put_unsigned<uint16_t>(out, v, key);
    case ValueType::kUint32: return put_unsigned<uint32_t>(out, v, key);
    case ValueType::kUint64: return put_unsigned<uint64_t>(out, v, key);
    case ValueType::kInt8: return put_signed<int8_t>(out, v, key);
    case ValueType::kInt16: return put_signed<int16_t>(out, v, key);
    case ValueType::kInt32: return put_signed<int32_t>(out, v, key);
    case ValueType::kInt64: return put_signed<int64_t>(out, v, key);
    case ValueType::kFloat32:
    case ValueType::kFloat64: {
      const double* d = std::get_if<double>(&v.v);
      if (d == nullptr) return bad_value(key, "float value does not hold a double");
      if (v.type == ValueType::kFloat32) {
        put<float>(out, static_cast<float>(*d));
      } else {
        put<double>(out, *d);
      }
      return Status::ok_status();
    }
    case ValueType::kBool: {
      const bool* b = std::get_if<bool>(&v.v);
      if (b == nullptr) return bad_value(key, "bool value does not hold a bool");
      put<uint8_t>(out, *b ? 1 : 0);
      return Status::ok_status();
    }
    case ValueType::kString: {
      const std::string* s = std::get_if<std::string>(&v.v);
      if (s == nullptr) return bad_value(key, "string value does not hold a string");
      put_string(out, *s);
      return Status::ok_status();
    }
    case ValueType::kArray: {
      const Array* a = std::get_if<Array>(&v.v);
      if (a == nullptr) return bad_value(key, "array value does not hold an Array");
      if (a->elem_type == ValueType::kArray && depth + 1 >= kMaxWriteArrayDepth) {
        return bad_value(key, "arrays nested deeper than " + std::to_string(kMaxWriteArrayDepth) + " levels");
      }
      put<uint32_t>(out, static_cast<uint32_t>(a->elem_type));
      put<uint64_t>(out, a->items.size());
      for (size_t i = 0; i < a->items.size(); ++i) {
        if (a->items[i].type != a->elem_type) {
          return bad_value(key, "array item " + std::to_string(i) + " has type " +
                                    std::string(value_type_name(a->items[i].type)) + ", array holds " +
                                    std::string(value_type_name(a->elem_type)));
        }
        SPW_RETURN_IF_ERROR(put_value(out, a->items[i], key, depth + 1));
      }
      return Status::ok_status();
    }
  }
  return bad_value(key, "unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
}

}  // namespace

void GgufWriter::set(std::string key, Value value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(value));
}

Status GgufWriter::check_tensor(const std::string& name, GgmlType type,
                                const std::vector<uint64_t>& dims, uint64_t* nbytes) const {
  const std::string tn = "gguf writer: tensor '" + name + "'";
  if (name.empty()) return Status::invalid_argument("gguf writer: empty tensor name");
  for (const auto& t : tensors_) {
    if (t.name == name) return Status::invalid_argument(tn + " added twice");
  }
  if (dims.empty() || dims.size() > static_cast<size_t>(kMaxDims)) {
    return Status::invalid_argument(tn + ": " + std::to_string(dims.size()) + " dims, need 1..4");
  }
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  if (info == nullptr) {
    return Status::invalid_argument(tn + ": unknown ggml type id " +
                                    std::to_string(static_cast<uint32_t>(type)));
  }
  uint64_t n = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 0) return Status::invalid_argument(tn + ": dim " + std::to_string(d) + " is zero");
    if (dims[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / n) {
      return Status::invalid_argument(tn + ": element count overflows");
    }
    n *= dims[d];
  }
  if (dims[0] % info->block_size != 0) {
    return Status::invalid_argument(tn + ": ne[0] = " + std::to_string(dims[0]) +
                                    " is not a multiple of " + info->name + "'s block size " +
                                    std::to_string(info->block_size));
  }
  auto nb = ggml_nbytes(static_cast<uint32_t>(type), n);
  if (!nb.ok()) return nb.status().with_context(tn);
  *nbytes = *nb;
  return Status::ok_status();
}

Status GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> dims,
                              std::string data) {
  uint64_t nbytes = 0;
  SPW_RETURN_IF_ERROR(check_tensor(name, type, dims, &nbytes));
  if (data.size() != nbytes) {
    return Status::invalid_argument("gguf writer: tensor '" + name + "' has " +
                                    std::to_string(data.size()) + " bytes of data, " +
                                    ggml_type_name(static_cast<uint32_t>(type)) + " needs " +
                                    std::to_string(nbytes));
  }
  tensors_.push_back(PendingTensor{std::move(name), type, std::move(dims), std::move(data), {}, nbytes});
  return Status::ok_status();
}

Status GgufWriter::add_tensor_streamed(std::string name, GgmlType type, std::vector<uint64_t> dims,
                                       TensorProducer produce) {
  uint64_t nbytes = 0;
  SPW_RETURN_IF_ERROR(check_tensor(name, type, dims, &nbytes));
  if (!produce) return Status::invalid_argument("gguf writer: tensor '" + name + "' has no producer");
  tensors_.push_back(PendingTensor{std::move(name), type, std::move(dims), {}, std::move(produce), nbytes});
  return Status::ok_status();
}

Result<std::string> GgufWriter::serialize_header() const {
  if (alignment_ == 0 || !std::has_single_bit(alignment_)) {
    return Status::invalid_argument("gguf writer: alignment " + std::to_string(alignment_) +
                                    " is not a nonzero power of two");
  }
  bool has_alignment_key = false;
  for (const auto& kv : kv_) {
    if (kv.first != "general.alignment") continue;
    has_alignment_key = true;
    const uint64_t* u = std::get_if<uint64_t>(&kv.second.v);
    if (kv.second.type != ValueType::kUint32 || u == nullptr || *u != alignment_) {
      return Status::invalid_argument(
          "gguf writer: key 'general.alignment' must be uint32 equal to the writer's alignment " +
          std::to_string(alignment_));
    }
  }
  const bool add_alignment_key = !has_alignment_key && alignment_ != kDefaultAlignment;

  std::string out;
  put<uint32_t>(&out, kGgufMagic);
  put<uint32_t>(&out, 3);
  put<uint64_t>(&out, tensors_.size());
  put<uint64_t>(&out, kv_.size() + (add_alignment_key ? 1 : 0));
  if (add_alignment_key) {
    put_string(&out, "general.alignment");
    put<uint32_t>(&out, static_cast<uint32_t>(ValueType::kUint32));
    put<uint32_t>(&out, alignment_);
  }
  for (const auto& [key, value] : kv_) {
    put_string(&out, key);
    put<uint32_t>(&out, static_cast<uint32_t>(value.type));
    SPW_RETURN_IF_ERROR(put_value(&out, value, key, 0));
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(&out, t.name);
    put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) put<uint64_t>(&out, d);
    put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    put<uint64_t>(&out, offset);
    offset = align_up(offset + t.nbytes, alignment_);
  }
  // Pad to the data section; a file without tensors has none (as llama.cpp's
  // vocab-only files), so a huge alignment cannot blow up an empty file.
  if (!tensors_.empty()) out.resize(align_up(out.size(), alignment_), '\0');
  return out;
}

Status GgufWriter::serialize_to(const Sink& sink) const {
  SPW_ASSIGN_OR_RETURN(std::string header, serialize_header());
  SPW_RETURN_IF_ERROR(sink(header));
  header.clear();
  header.shrink_to_fit();
  static const std::string kZeros(4096, '\0');
  std::string produced;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    std::string_view bytes = t.data;
    if (t.produce) {
      produced.clear();
      SPW_RETURN_IF_ERROR(t.produce(&produced).with_context("gguf writer: tensor '" + t.name + "'"));
      if (produced.size() != t.nbytes) {
        return Status::internal("gguf writer: producer of tensor '" + t.name + "' gave " +
                                std::to_string(produced.size()) + " bytes, expected " +
                                std::to_string(t.nbytes));
      }
      bytes = produced;
    }
    SPW_RETURN_IF_ERROR(sink(bytes));
    // Pad between tensors (not after the last: nothing follows it).
    if (i + 1 < tensors_.size()) {
      uint64_t pad = align_up(t.nbytes, alignment_) - t.nbytes;
      while (pad > 0) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, kZeros.size()));
        SPW_RETURN_IF_ERROR(sink(std::string_view(kZeros.data(), n)));
        pad -= n;
      }
    }
  }
  return Status::ok_status();
}

Result<uint64_t> GgufWriter::serialized_size() const {
  SPW_ASSIGN_OR_RETURN(std::string header, serialize_header());
  uint64_t size = header.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    size += i + 1 < tensors_.size() ? align_up(tensors_[i].nbytes, alignment_) : tensors_[i].nbytes;
  }
  return size;
}

Result<std::string> GgufWriter::serialize() const {
  std::string out;
  SPW_ASSIGN_OR_RETURN(uint64_t size, serialized_size());
  out.reserve(static_cast<size_t>(size));
  SPW_RETURN_IF_ERROR(serialize_to([&](std::string_view b) {
    out.append(b.data(), b.size());
    return Status::ok_status();
  }));
  return out;
}

Status GgufWriter::write(Env& env, const std::string& path) const {
  SPW_ASSIGN_OR_RETURN(std::string bytes, serialize());
  return env.write_file(path, bytes);
}

Status GgufWriter::write_streaming(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::io_error("cannot create '" + tmp + "': " + std::strerror(errno));
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  Status st = serialize_to([&](std::string_view b) -> Status {
    size_t off = 0;
    while (off < b.size()) {
      ssize_t n = ::write(fd, b.data() + off, b.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::io_error("cannot write '" + tmp + "': " + std::strerror(errno));
      }
      off += static_cast<size_t>(n);
    }
    return Status::ok_status();
  });
  if (!st.ok()) return fail(st);
  if (::fsync(fd) != 0) return fail(Status::io_error("cannot fsync '" + tmp + "': " + std::strerror(errno)));
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return Status::io_error("cannot close '" + tmp + "': " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::io_error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::ok_status();
}

}  // namespace spw::gguf
