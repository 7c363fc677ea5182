#include "tools/modelgen/random_llama.h"

#include "core/hash.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gguf/quant.h"

namespace spw::modelgen {
namespace {

using gguf::GgmlType;
using gguf::Value;


uint32_t file_type_of(GgmlType t) {
  switch (t) {
    case GgmlType::kF16: return 1;
    case GgmlType::kQ8_0: return 7;
    default: return 0;
  }
}

const char* type_label(GgmlType t) {
  switch (t) {
    case GgmlType::kF16: return "f16";
    case GgmlType::kQ8_0: return "q8_0";
    default: return "f32";
  }
}

// Adds a tensor whose values are mean + std * noise, generated and encoded one
// row (ne[0] elements) at a time so no F32 copy of the tensor exists.
Status add_random_tensor(gguf::GgufWriter& w, uint64_t seed, const std::string& name, GgmlType type,
                         std::vector<uint64_t> dims, float mean, float stddev) {
  const uint64_t row = dims[0];
  uint64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
  const uint64_t row_bytes = *gguf::ggml_nbytes(static_cast<uint32_t>(type), row);
  return w.add_tensor_streamed(
      name, type, std::move(dims),
      [=](std::string* out) -> Status {
        out->resize(static_cast<size_t>(rows * row_bytes));
        WeightStream ws(seed, name);
        std::vector<float> buf(static_cast<size_t>(row));
        for (uint64_t r = 0; r < rows; ++r) {
          for (float& x : buf) {
            const float z = ws.next_normal() * stddev;
            x = mean + z;
          }
          SPW_RETURN_IF_ERROR(
              gguf::quantize_row(type, buf.data(), out->data() + r * row_bytes, buf.size()));
        }
        return Status::ok_status();
      });
}

}  // namespace

WeightStream::WeightStream(uint64_t seed, std::string_view tensor_name) {
  state_ = seed ^ fnv1a64(tensor_name);
  splitmix64(state_);  // decorrelate nearby seeds
}

float WeightStream::next_normal() {
  // Irwin-Hall with four 16-bit uniforms: exact integer sum, mean 4*32767.5,
  // variance ~ 4 * 65536^2 / 12, so (sum - mean) * sqrt(3) / 65536 has var ~1.
  const uint64_t r = splitmix64(state_);
  const int64_t s = static_cast<int64_t>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) +
                                         (r >> 48));
  constexpr float kScale = 1.7320508075688772f / 65536.0f;
  return static_cast<float>(2 * s - 262140) * (0.5f * kScale);
}

Status validate_random_llama_spec(const RandomLlamaSpec& s) {
  auto bad = [](const std::string& m) { return Status::invalid_argument("random llama spec: " + m); };
  if (s.n_embd == 0 || s.n_layer == 0 || s.n_head == 0 || s.n_head_kv == 0 || s.n_ff == 0 ||
      s.n_ctx == 0) {
    return bad("n_embd, n_layer, n_head, n_head_kv, n_ff and n_ctx must all be nonzero");
  }
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3") {
    return bad("arch '" + s.arch + "' is not llama, qwen2 or qwen3");
  }
  if (s.head_dim == 0 && s.n_embd % s.n_head != 0) {
    return bad("n_embd " + std::to_string(s.n_embd) + " is not divisible by n_head " +
               std::to_string(s.n_head));
  }
  if (s.n_head % s.n_head_kv != 0) {
    return bad("n_head " + std::to_string(s.n_head) + " is not divisible by n_head_kv " +
               std::to_string(s.n_head_kv));
  }
  const uint32_t hd = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
  if (hd % 2 != 0) return bad("head dim " + std::to_string(hd) + " must be even for RoPE");
  if (s.type == GgmlType::kQ8_0 && (hd * s.n_head) % 32 != 0) {
    return bad("Q8_0 needs head_dim * n_head to be a multiple of 32");
  }
  if (s.type != GgmlType::kF32 && s.type != GgmlType::kF16 && s.type != GgmlType::kQ8_0) {
    return bad("type " + gguf::ggml_type_name(static_cast<uint32_t>(s.type)) +
               " is not F32, F16 or Q8_0");
  }
  if (s.type == GgmlType::kQ8_0 && (s.n_embd % 32 != 0 || s.n_ff % 32 != 0)) {
    return bad("Q8_0 needs n_embd and n_ff to be multiples of 32 (got " + std::to_string(s.n_embd) +
               ", " + std::to_string(s.n_ff) + ")");
  }
  if (!(s.rms_eps > 0.0f) || !(s.rope_freq_base > 0.0f)) {
    return bad("rms_eps and rope_freq_base must be positive");
  }
  if (s.vocab_path.empty()) return bad("vocab_path is empty");
  return Status::ok_status();
}

namespace {
uint64_t head_dim_of(const RandomLlamaSpec& s) { return s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head; }
}  // namespace

uint64_t random_llama_param_count(const RandomLlamaSpec& s, uint64_t n_vocab) {
  const uint64_t e = s.n_embd;
  const uint64_t hd = head_dim_of(s);
  const uint64_t e_q = hd * s.n_head;
  const uint64_t e_kv = hd * s.n_head_kv;
  uint64_t per_layer = 2 * e + 2 * e * e_q + 2 * e * e_kv + 3 * e * s.n_ff;
  if (s.arch == "qwen2") per_layer += e_q + 2 * e_kv;
  if (s.arch == "qwen3") per_layer += 2 * hd;
  return n_vocab * e * (s.tied_output ? 1 : 2) + e + s.n_layer * per_layer;
}

Result<gguf::GgufWriter> random_llama_writer(Env& env, const RandomLlamaSpec& s,
                                             RandomLlamaStats* stats) {
  SPW_RETURN_IF_ERROR(validate_random_llama_spec(s));
  SPW_ASSIGN_OR_RETURN(auto vocab, gguf::GgufFile::open(env, s.vocab_path));
  SPW_ASSIGN_OR_RETURN(const gguf::Array* tokens,
                       vocab->get_array("tokenizer.ggml.tokens", gguf::ValueType::kString));
  if (tokens->items.empty()) {
    return Status::corruption("vocab '" + s.vocab_path + "': tokenizer.ggml.tokens is empty");
  }
  const uint64_t n_vocab = tokens->items.size();
  const uint32_t head_dim = static_cast<uint32_t>(head_dim_of(s));
  const uint32_t n_embd_q = head_dim * s.n_head;
  const uint32_t n_embd_kv = head_dim * s.n_head_kv;

  gguf::GgufWriter w;
  const std::string name = "spillway-random-" + s.arch + "-" + std::to_string(s.n_embd) + "x" +
                           std::to_string(s.n_layer) + "-" + type_label(s.type) + "-seed" +
                           std::to_string(s.seed);
  w.set("general.architecture", Value::str(s.arch));
  w.set("general.name", Value::str(name));
  w.set("general.file_type", Value::u32(file_type_of(s.type)));
  if (s.type == GgmlType::kQ8_0) w.set("general.quantization_version", Value::u32(2));
  const std::string a = s.arch + ".";
  w.set(a + "vocab_size", Value::u32(static_cast<uint32_t>(n_vocab)));
  w.set(a + "context_length", Value::u32(s.n_ctx));
  w.set(a + "embedding_length", Value::u32(s.n_embd));
  w.set(a + "block_count", Value::u32(s.n_layer));
  w.set(a + "feed_forward_length", Value::u32(s.n_ff));
  w.set(a + "attention.head_count", Value::u32(s.n_head));
  w.set(a + "attention.head_count_kv", Value::u32(s.n_head_kv));
  if (s.head_dim > 0) {
    w.set(a + "attention.key_length", Value::u32(head_dim));
    w.set(a + "attention.value_length", Value::u32(head_dim));
  }
  w.set(a + "rope.dimension_count", Value::u32(head_dim));
  w.set(a + "rope.freq_base", Value::f32(s.rope_freq_base));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(s.rms_eps));
  for (const auto& [key, value] : vocab->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);
  }

  const float kStd = 0.02f;
  const float kResidualStd = kStd / std::sqrt(2.0f * static_cast<float>(s.n_layer));
  const float kNormNoise = 0.01f;
  const uint64_t e = s.n_embd;
  const GgmlType t = s.type;
  SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, "token_embd.weight", t, {e, n_vocab}, 0.0f, kStd));
  SPW_RETURN_IF_ERROR(
      add_random_tensor(w, s.seed, "output_norm.weight", GgmlType::kF32, {e}, 1.0f, kNormNoise));
  if (!s.tied_output) {
    SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, "output.weight", t, {e, n_vocab}, 0.0f, kStd));
  }
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    SPW_RETURN_IF_ERROR(
        add_random_tensor(w, s.seed, p + "attn_norm.weight", GgmlType::kF32, {e}, 1.0f, kNormNoise));
    SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + "attn_q.weight", t, {e, n_embd_q}, 0.0f, kStd));
    SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + "attn_k.weight", t, {e, n_embd_kv}, 0.0f, kStd));
    SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + "attn_v.weight", t, {e, n_embd_kv}, 0.0f, kStd));
    if (s.arch == "qwen2") {
      const std::pair<const char*, uint64_t> biases[] = {{"attn_q.bias", n_embd_q}, {"attn_k.bias", n_embd_kv},
                                                          {"attn_v.bias", n_embd_kv}};
      for (const auto& [bn, len] : biases)
        SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + bn, GgmlType::kF32, {len}, 0.0f, kStd));
    }
    if (s.arch == "qwen3") {
      for (const char* nn : {"attn_q_norm.weight", "attn_k_norm.weight"})
        SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + nn, GgmlType::kF32, {head_dim}, 1.0f, kNormNoise));
    }
    SPW_RETURN_IF_ERROR(
        add_random_tensor(w, s.seed, p + "attn_output.weight", t, {n_embd_q, e}, 0.0f, kResidualStd));
    SPW_RETURN_IF_ERROR(
        add_random_tensor(w, s.seed, p + "ffn_norm.weight", GgmlType::kF32, {e}, 1.0f, kNormNoise));
    SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + "ffn_gate.weight", t, {e, s.n_ff}, 0.0f, kStd));
    SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + "ffn_up.weight", t, {e, s.n_ff}, 0.0f, kStd));
    SPW_RETURN_IF_ERROR(
        add_random_tensor(w, s.seed, p + "ffn_down.weight", t, {s.n_ff, e}, 0.0f, kResidualStd));
  }
  if (stats != nullptr) {
    stats->n_vocab = static_cast<uint32_t>(n_vocab);
    stats->n_params = random_llama_param_count(s, n_vocab);
    SPW_ASSIGN_OR_RETURN(stats->file_size, w.serialized_size());
  }
  return w;
}

Status write_generated_model(Env& env, const std::string& out_path, gguf::GgufWriter& writer) {
  if (&env == &Env::default_env()) return writer.write_streaming(out_path);
  return writer.write(env, out_path);
}

Status write_random_llama(Env& env, const std::string& out_path, const RandomLlamaSpec& spec) {
  SPW_ASSIGN_OR_RETURN(gguf::GgufWriter w, random_llama_writer(env, spec));
  return write_generated_model(env, out_path, w);
}

Result<std::string> make_random_llama(Env& env, const RandomLlamaSpec& spec) {
  SPW_ASSIGN_OR_RETURN(gguf::GgufWriter w, random_llama_writer(env, spec));
  return w.serialize();
}

Result<std::string> make_random_llama(const RandomLlamaSpec& spec) {
  return make_random_llama(Env::default_env(), spec);
}

}  // namespace spw::modelgen
