#include "tests/reference/llama_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "gguf/fp16.h"
#include "gguf/ggml_types.h"

namespace spw::reference {

namespace {

using gguf::GgmlType;

std::string dims_string(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.ne[i]);
  }
  return s + "]";
}

double half_at(const uint8_t* p) { return gguf::fp16_to_fp32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// Element i of one block of a llama.cpp low-bit type, decoded from the byte
// layout (ggml-common.h's block structs), in double:
//  Q4_0 [d][16 B nibbles]: element j < 16 is the low nibble of byte j, j >= 16
//    the high nibble of byte j - 16; value d * (q - 8).
//  Q4_1 [d][m][nibbles]: d * q + m.
//  Q5_0 [d][qh u32][nibbles], Q5_1 [d][m][qh][nibbles]: bit j of qh is the
//    fifth bit of element j; d * (q - 16), or d * q + m.
//  Q4_K [d][dmin][12 B scales][128 B nibbles], Q5_K [.. scales][32 B qh][128 B]:
//    sub-block s = i / 32 has a 6-bit scale and min (s < 4: bytes s and s + 4,
//    low 6 bits; s >= 4: low / high nibble of byte s + 4, top two bits from the
//    top of bytes s - 4 / s); its codes are nibble (s % 2) of bytes
//    32 * (s / 2) + i % 32; Q5_K adds bit s of qh[i % 32] as bit 4.
//    value d * scale * q - dmin * min.
//  Q6_K [128 B ql][64 B qh][16 int8 scales][d]: element i, half h = i / 128,
//    run k = (i % 128) / 32, l = i % 32: low 4 bits from nibble k / 2 of
//    ql[64h + l + 32 (k % 2)], high 2 bits from bits 2k of qh[32h + l];
//    value d * scales[i / 16] * (q - 32).
double low_bit_value(GgmlType type, const uint8_t* b, int i) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: {
      const int off = type == GgmlType::kQ4_0 ? 2 : 4;
      const int q = i < 16 ? b[off + i] & 15 : b[off + i - 16] >> 4;
      return type == GgmlType::kQ4_0 ? half_at(b) * (q - 8) : half_at(b) * q + half_at(b + 2);
    }
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {
      const int off = type == GgmlType::kQ5_0 ? 2 : 4;
      const uint32_t qh = static_cast<uint32_t>(b[off]) | static_cast<uint32_t>(b[off + 1]) << 8 |
                          static_cast<uint32_t>(b[off + 2]) << 16 | static_cast<uint32_t>(b[off + 3]) << 24;
      int q = i < 16 ? b[off + 4 + i] & 15 : b[off + 4 + i - 16] >> 4;
      q |= static_cast<int>((qh >> i) & 1) << 4;
      return type == GgmlType::kQ5_0 ? half_at(b) * (q - 16) : half_at(b) * q + half_at(b + 2);
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const uint8_t* sc = b + 4;
      const int s = i / 32, l = i % 32;
      const int scale = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
      const int mn = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
      const uint8_t* qs = b + (type == GgmlType::kQ4_K ? 16 : 48);
      int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
      if (type == GgmlType::kQ5_K) q |= ((b[16 + l] >> s) & 1) << 4;
      return half_at(b) * scale * q - half_at(b + 2) * mn;
    }
    case GgmlType::kQ6_K: {
      const int h = i / 128, k = (i % 128) / 32, l = i % 32;
      const int lo = (b[64 * h + l + 32 * (k % 2)] >> (4 * (k / 2))) & 15;
      const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
      return half_at(b + 208) * static_cast<int8_t>(b[192 + i / 16]) * ((lo | hi << 4) - 32);
    }
    default:
      return 0;
  }
}

// Dequantises n elements starting at element `first` of tensor `t` into `out`.
// Written here rather than taken from src/gguf/quant.h on purpose: the
// reference should not share the code it is used to check.
Status dequantize(const gguf::TensorInfo& t, uint64_t first, uint64_t n, double* out) {
  switch (static_cast<GgmlType>(t.type)) {
    case GgmlType::kF32:
      for (uint64_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, t.data + 4 * (first + i), 4);
        out[i] = f;
      }
      return Status::ok_status();
    case GgmlType::kF16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * (first + i), 2);
        out[i] = gguf::fp16_to_fp32(h);
      }
      return Status::ok_status();
    case GgmlType::kQ8_0: {
      // Block of 32: fp16 scale d, then 32 int8 q; value = d * q.
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t e = first + i;
        const uint8_t* block = t.data + (e / gguf::kQ8_0BlockSize) * gguf::kQ8_0BlockBytes;
        uint16_t d;
        std::memcpy(&d, block, 2);
        const auto q = static_cast<int8_t>(block[2 + e % gguf::kQ8_0BlockSize]);
        out[i] = static_cast<double>(gguf::fp16_to_fp32(d)) * q;
      }
      return Status::ok_status();
    }
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: {
      const gguf::GgmlTypeInfo* info = gguf::ggml_type_info(t.type);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t e = first + i;
        out[i] = low_bit_value(static_cast<GgmlType>(t.type), t.data + (e / info->block_size) * info->type_size,
                               static_cast<int>(e % info->block_size));
      }
      return Status::ok_status();
    }
    default:
      return Status::invalid_argument("reference: tensor '" + t.name + "' has unsupported type " +
                                      gguf::ggml_type_name(t.type));
  }
}

void rms_norm(const std::vector<double>& x, const std::vector<double>& w, double eps, std::vector<double>& out) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  out.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * w[i];
}

// Rotates pairs (2i, 2i+1) of each head's first n_rot dims (llama.cpp
// "normal"), or with neox the pairs (i, i + n_rot/2) (GPT-NeoX, Qwen2/3, Gemma).
// pos may be fractional (a linearly scaled position).
void rope(std::vector<double>& v, int64_t n_heads, int64_t head_dim, int64_t n_rot, double base, double pos,
          bool neox) {
  for (int64_t h = 0; h < n_heads; ++h) {
    double* x = v.data() + h * head_dim;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const double theta = pos * std::pow(base, -2.0 * static_cast<double>(i) / n_rot);
      const double c = std::cos(theta), s = std::sin(theta);
      double& a = neox ? x[i] : x[2 * i];
      double& b = neox ? x[i + n_rot / 2] : x[2 * i + 1];
      const double a0 = a, b0 = b;
      a = a0 * c - b0 * s;
      b = a0 * s + b0 * c;
    }
  }
}

// RMSNorm of each head_dim-long head of v in place (Qwen3's Q/K norms).
void head_norm(std::vector<double>& v, int64_t head_dim, const std::vector<double>& w, double eps) {
  std::vector<double> head, out;
  for (size_t h0 = 0; h0 < v.size(); h0 += static_cast<size_t>(head_dim)) {
    head.assign(v.begin() + static_cast<std::ptrdiff_t>(h0), v.begin() + static_cast<std::ptrdiff_t>(h0 + head_dim));
    rms_norm(head, w, eps, out);
    std::copy(out.begin(), out.end(), v.begin() + static_cast<std::ptrdiff_t>(h0));
  }
}

void add_to(std::vector<double>& v, const std::vector<double>& b) {
  for (size_t i = 0; i < b.size(); ++i) v[i] += b[i];
}

// cap * tanh(x / cap): Gemma 2's soft-capping; cap 0 means none.
double softcap(double x, double cap) { return cap > 0 ? cap * std::tanh(x / cap) : x; }

// GELU, tanh approximation (PyTorch's gelu(approximate="tanh"), Gemma's hidden_activation).
double gelu_tanh(double a) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * a * (1.0 + std::tanh(k * (a + 0.044715 * a * a * a)));
}

}  // namespace

Result<LlamaReference::Matrix> LlamaReference::load_matrix(const gguf::GgufFile& file, const std::string& name,
                                                           int64_t cols, int64_t rows) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (t == nullptr) return Status::not_found("reference: tensor '" + name + "' not found");
  if (t->n_dims != 2 || t->ne[0] != static_cast<uint64_t>(cols) || t->ne[1] != static_cast<uint64_t>(rows)) {
    return Status::corruption("reference: tensor '" + name + "' has dims " + dims_string(*t) + ", expected [" +
                              std::to_string(cols) + ", " + std::to_string(rows) + "]");
  }
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.w.resize(static_cast<size_t>(rows * cols));
  SPW_RETURN_IF_ERROR(dequantize(*t, 0, static_cast<uint64_t>(rows * cols), m.w.data()));
  return m;
}

Result<std::vector<LlamaReference::Matrix>> LlamaReference::load_stacked(const gguf::GgufFile& file,
                                                                         const std::string& name, int64_t cols,
                                                                         int64_t rows, int64_t n) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (t == nullptr) return Status::not_found("reference: tensor '" + name + "' not found");
  if (t->n_dims != 3 || t->ne[0] != static_cast<uint64_t>(cols) || t->ne[1] != static_cast<uint64_t>(rows) ||
      t->ne[2] != static_cast<uint64_t>(n)) {
    return Status::corruption("reference: tensor '" + name + "' has dims " + dims_string(*t) + ", expected [" +
                              std::to_string(cols) + ", " + std::to_string(rows) + ", " + std::to_string(n) + "]");
  }
  std::vector<Matrix> out(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    Matrix& m = out[static_cast<size_t>(e)];
    m.rows = rows;
    m.cols = cols;
    m.w.resize(static_cast<size_t>(rows * cols));
    SPW_RETURN_IF_ERROR(dequantize(*t, static_cast<uint64_t>(e * rows * cols), static_cast<uint64_t>(rows * cols),
                                   m.w.data()));
  }
  return out;
}

LlamaReference::Matrix LlamaReference::rows_of(const Matrix& m, int64_t first, int64_t n) {
  Matrix r;
  r.rows = n;
  r.cols = m.cols;
  const auto begin = m.w.begin() + static_cast<ptrdiff_t>(first * m.cols);
  r.w.assign(begin, begin + static_cast<ptrdiff_t>(n * m.cols));
  return r;
}

Result<std::vector<double>> LlamaReference::load_vector(const gguf::GgufFile& file, const std::string& name,
                                                        int64_t n) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (t == nullptr) return Status::not_found("reference: tensor '" + name + "' not found");
  if (t->n_dims != 1 || t->ne[0] != static_cast<uint64_t>(n)) {
    return Status::corruption("reference: tensor '" + name + "' has dims " + dims_string(*t) + ", expected [" +
                              std::to_string(n) + "]");
  }
  std::vector<double> v(static_cast<size_t>(n));
  SPW_RETURN_IF_ERROR(dequantize(*t, 0, static_cast<uint64_t>(n), v.data()));
  return v;
}

Status LlamaReference::load_gemma_hparams(const gguf::GgufFile& file, const std::string& arch, bool linear_scaling,
                                          ReferenceHparams& hp) {
  const std::string a = arch + ".";
  const bool g2 = arch == "gemma2";
  hp.embd_scale = std::sqrt(static_cast<double>(hp.n_embd));
  hp.gelu = true;
  hp.post_norms = true;
  // The 27B models were trained with query_pre_attn_scalar = n_embd / n_head
  // rather than head_dim; the GGUF does not carry it, so (as llama.cpp does)
  // recognise them by depth.
  if (hp.n_layer == (g2 ? 46 : 62)) hp.attn_scale = 1.0 / std::sqrt(static_cast<double>(hp.n_embd / hp.n_head));
  const std::string window_key = a + "attention.sliding_window";
  if (file.has(window_key)) {
    SPW_ASSIGN_OR_RETURN(hp.sliding_window, file.get_i64(window_key));
  } else if (g2) {
    hp.sliding_window = 4096;  // Gemma2Config's default
  } else {
    return Status::not_found("reference: key '" + window_key + "' not found (gemma3 requires it)");
  }
  if (hp.sliding_window <= 0) {
    return Status::invalid_argument("reference: " + window_key + " " + std::to_string(hp.sliding_window) +
                                    " is not positive");
  }
  const int64_t period = g2 ? 2 : 6;  // every period-th layer (l % period == period - 1) is global
  for (int64_t l = 0; l < hp.n_layer; ++l) hp.swa_layers[static_cast<size_t>(l)] = l % period < period - 1;
  if (g2) {
    hp.attn_softcap = 50.0;
    hp.final_softcap = 30.0;
    if (file.has(a + "attn_logit_softcapping")) {
      SPW_ASSIGN_OR_RETURN(hp.attn_softcap, file.get_f64(a + "attn_logit_softcapping"));
    }
    if (file.has(a + "final_logit_softcapping")) {
      SPW_ASSIGN_OR_RETURN(hp.final_softcap, file.get_f64(a + "final_logit_softcapping"));
    }
    if (hp.attn_softcap <= 0 || hp.final_softcap <= 0) {
      return Status::invalid_argument("reference: " + a + "attn_logit_softcapping / final_logit_softcapping must be "
                                      "positive");
    }
    // Held as float by llama.cpp (and the engine): use exactly that value.
    hp.attn_softcap = static_cast<float>(hp.attn_softcap);
    hp.final_softcap = static_cast<float>(hp.final_softcap);
    return Status::ok_status();
  }
  // gemma3: local layers use their own base (Gemma3's rope_local_base_freq).
  hp.rope_freq_base_swa = 10000.0;
  if (file.has(a + "rope.freq_base_swa")) {
    SPW_ASSIGN_OR_RETURN(hp.rope_freq_base_swa, file.get_f64(a + "rope.freq_base_swa"));
    hp.rope_freq_base_swa = static_cast<float>(hp.rope_freq_base_swa);
  }
  if (linear_scaling) {
    SPW_ASSIGN_OR_RETURN(const double factor, file.get_f64(a + "rope.scaling.factor"));
    if (!(factor > 0)) {
      return Status::invalid_argument("reference: " + a + "rope.scaling.factor " + std::to_string(factor) +
                                      " is not positive");
    }
    hp.rope_freq_scale = 1.0f / static_cast<float>(factor);  // a float in llama.cpp too
  }
  return Status::ok_status();
}

Result<std::unique_ptr<LlamaReference>> LlamaReference::load(const gguf::GgufFile& file) {
  SPW_ASSIGN_OR_RETURN(std::string arch, file.get_string("general.architecture"));
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "phi3" && arch != "qwen2moe" &&
      arch != "qwen3moe" && !gemma) {
    return Status::invalid_argument("reference: architecture '" + arch +
                                    "' is not llama, qwen2, qwen3, phi3, qwen2moe, qwen3moe, gemma2 or gemma3");
  }
  const std::string a = arch + ".";
  SPW_ASSIGN_OR_RETURN(std::string scaling, file.get_string_or(a + "rope.scaling.type", "none"));
  // Gemma 3 4B+ scales the global layers' positions linearly; nothing else here does.
  const bool linear_scaling = arch == "gemma3" && scaling == "linear";
  if (scaling != "none" && !linear_scaling) {
    return Status::invalid_argument("reference: " + a + "rope.scaling.type '" + scaling + "' is not supported");
  }

  std::unique_ptr<LlamaReference> ref(new LlamaReference());
  ReferenceHparams& hp = ref->hp_;
  hp.neox = arch != "llama";
  hp.qkv_bias = arch == "qwen2" || arch == "qwen2moe";
  hp.qk_norm = arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3";
  if (file.has(a + "expert_count")) {
    SPW_ASSIGN_OR_RETURN(hp.n_expert, file.get_i64(a + "expert_count"));
  }
  if (hp.n_expert > 0) {
    SPW_ASSIGN_OR_RETURN(hp.n_expert_used, file.get_i64(a + "expert_used_count"));
    SPW_ASSIGN_OR_RETURN(hp.n_ff_exp, file.get_i64(a + "expert_feed_forward_length"));
    if (arch == "qwen2moe") {
      SPW_ASSIGN_OR_RETURN(hp.n_ff_shexp, file.get_i64(a + "expert_shared_feed_forward_length"));
    }
    hp.norm_topk = arch != "qwen2moe";
    if (file.has(a + "expert_weights_scale")) {
      SPW_ASSIGN_OR_RETURN(hp.weights_scale, file.get_f64(a + "expert_weights_scale"));
      if (hp.weights_scale == 0) hp.weights_scale = 1;
    }
    if (hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert || hp.n_ff_exp <= 0)
      return Status::invalid_argument("reference: inconsistent expert counts");
  } else if (arch == "qwen2moe" || arch == "qwen3moe") {
    return Status::invalid_argument("reference: " + arch + " without " + a + "expert_count");
  }
  SPW_ASSIGN_OR_RETURN(hp.n_embd, file.get_i64(a + "embedding_length"));
  SPW_ASSIGN_OR_RETURN(hp.n_layer, file.get_i64(a + "block_count"));
  SPW_ASSIGN_OR_RETURN(hp.n_ff, file.get_i64(a + "feed_forward_length"));  // the dense width (unused by experts)
  SPW_ASSIGN_OR_RETURN(hp.n_head, file.get_i64(a + "attention.head_count"));
  hp.n_head_kv = hp.n_head;
  if (file.has(a + "attention.head_count_kv")) {
    SPW_ASSIGN_OR_RETURN(hp.n_head_kv, file.get_i64(a + "attention.head_count_kv"));
  }
  if (hp.n_embd <= 0 || hp.n_layer <= 0 || hp.n_ff <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 ||
      hp.n_head % hp.n_head_kv != 0) {
    return Status::invalid_argument("reference: inconsistent hyper-parameters (n_embd " + std::to_string(hp.n_embd) +
                                    ", n_head " + std::to_string(hp.n_head) + ", n_head_kv " +
                                    std::to_string(hp.n_head_kv) + ")");
  }
  hp.head_dim = hp.n_embd / hp.n_head;
  if (file.has(a + "attention.key_length")) {
    SPW_ASSIGN_OR_RETURN(hp.head_dim, file.get_i64(a + "attention.key_length"));
  } else if (hp.n_embd % hp.n_head != 0) {
    return Status::invalid_argument("reference: n_head does not divide n_embd");
  }
  if (file.has(a + "attention.value_length")) {  // v heads are read as head_dim wide
    SPW_ASSIGN_OR_RETURN(const int64_t v_len, file.get_i64(a + "attention.value_length"));
    if (v_len != hp.head_dim) {
      return Status::invalid_argument("reference: " + a + "attention.value_length " + std::to_string(v_len) +
                                      " differs from the key length " + std::to_string(hp.head_dim));
    }
  }
  if (hp.head_dim <= 0) {
    return Status::invalid_argument("reference: " + a + "attention.key_length " + std::to_string(hp.head_dim) +
                                    " is not positive");
  }
  hp.n_rot = hp.head_dim;
  if (file.has(a + "rope.dimension_count")) {
    SPW_ASSIGN_OR_RETURN(hp.n_rot, file.get_i64(a + "rope.dimension_count"));
  }
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0) {
    return Status::invalid_argument("reference: " + a + "rope.dimension_count " + std::to_string(hp.n_rot) +
                                    " invalid for head_dim " + std::to_string(hp.head_dim));
  }
  if (file.has(a + "rope.freq_base")) {
    SPW_ASSIGN_OR_RETURN(hp.rope_freq_base, file.get_f64(a + "rope.freq_base"));
  }
  if (file.has(a + "attention.layer_norm_rms_epsilon")) {
    SPW_ASSIGN_OR_RETURN(hp.rms_eps, file.get_f64(a + "attention.layer_norm_rms_epsilon"));
  }
  // The engine holds these as float; use exactly that value (a no-op for the
  // usual f32 keys, a rounding for an f64 one).
  hp.rms_eps = static_cast<float>(hp.rms_eps);
  hp.rope_freq_base = static_cast<float>(hp.rope_freq_base);
  hp.rope_freq_base_swa = hp.rope_freq_base;
  hp.attn_scale = 1.0 / std::sqrt(static_cast<double>(hp.head_dim));
  hp.swa_layers.assign(static_cast<size_t>(hp.n_layer), false);
  if (gemma) SPW_RETURN_IF_ERROR(load_gemma_hparams(file, arch, linear_scaling, hp));

  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) return Status::not_found("reference: tensor 'token_embd.weight' not found");
  hp.n_vocab = static_cast<int64_t>(embd->ne[1]);
  if (hp.n_vocab <= 0) return Status::invalid_argument("reference: token_embd.weight has no rows");

  const int64_t n_embd_kv = hp.head_dim * hp.n_head_kv;
  SPW_ASSIGN_OR_RETURN(ref->tok_embd_, load_matrix(file, "token_embd.weight", hp.n_embd, hp.n_vocab));
  SPW_ASSIGN_OR_RETURN(ref->output_norm_, load_vector(file, "output_norm.weight", hp.n_embd));
  if (file.find_tensor("output.weight") != nullptr) {
    SPW_ASSIGN_OR_RETURN(ref->output_, load_matrix(file, "output.weight", hp.n_embd, hp.n_vocab));
  } else {
    ref->output_tied_ = true;
  }
  ref->layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    Layer& l = ref->layers_[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    SPW_ASSIGN_OR_RETURN(l.attn_norm, load_vector(file, p + "attn_norm.weight", hp.n_embd));
    const int64_t n_embd_q = hp.head_dim * hp.n_head;
    if (arch == "phi3" && file.find_tensor(p + "attn_qkv.weight") != nullptr) {
      SPW_ASSIGN_OR_RETURN(Matrix qkv, load_matrix(file, p + "attn_qkv.weight", hp.n_embd, n_embd_q + 2 * n_embd_kv));
      l.wq = rows_of(qkv, 0, n_embd_q);
      l.wk = rows_of(qkv, n_embd_q, n_embd_kv);
      l.wv = rows_of(qkv, n_embd_q + n_embd_kv, n_embd_kv);
    } else {
      SPW_ASSIGN_OR_RETURN(l.wq, load_matrix(file, p + "attn_q.weight", hp.n_embd, n_embd_q));
      SPW_ASSIGN_OR_RETURN(l.wk, load_matrix(file, p + "attn_k.weight", hp.n_embd, n_embd_kv));
      SPW_ASSIGN_OR_RETURN(l.wv, load_matrix(file, p + "attn_v.weight", hp.n_embd, n_embd_kv));
    }
    SPW_ASSIGN_OR_RETURN(l.wo, load_matrix(file, p + "attn_output.weight", n_embd_q, hp.n_embd));
    if (hp.qkv_bias) {
      SPW_ASSIGN_OR_RETURN(l.bq, load_vector(file, p + "attn_q.bias", n_embd_q));
      SPW_ASSIGN_OR_RETURN(l.bk, load_vector(file, p + "attn_k.bias", n_embd_kv));
      SPW_ASSIGN_OR_RETURN(l.bv, load_vector(file, p + "attn_v.bias", n_embd_kv));
    }
    if (hp.qk_norm) {
      SPW_ASSIGN_OR_RETURN(l.q_norm, load_vector(file, p + "attn_q_norm.weight", hp.head_dim));
      SPW_ASSIGN_OR_RETURN(l.k_norm, load_vector(file, p + "attn_k_norm.weight", hp.head_dim));
    }
    SPW_ASSIGN_OR_RETURN(l.ffn_norm, load_vector(file, p + "ffn_norm.weight", hp.n_embd));
    if (hp.post_norms) {
      SPW_ASSIGN_OR_RETURN(l.post_attn_norm, load_vector(file, p + "post_attention_norm.weight", hp.n_embd));
      SPW_ASSIGN_OR_RETURN(l.post_ffw_norm, load_vector(file, p + "post_ffw_norm.weight", hp.n_embd));
    }
    if (hp.n_expert > 0) {
      SPW_ASSIGN_OR_RETURN(l.router, load_matrix(file, p + "ffn_gate_inp.weight", hp.n_embd, hp.n_expert));
      SPW_ASSIGN_OR_RETURN(l.e_gate,
                           load_stacked(file, p + "ffn_gate_exps.weight", hp.n_embd, hp.n_ff_exp, hp.n_expert));
      SPW_ASSIGN_OR_RETURN(l.e_up, load_stacked(file, p + "ffn_up_exps.weight", hp.n_embd, hp.n_ff_exp, hp.n_expert));
      SPW_ASSIGN_OR_RETURN(l.e_down,
                           load_stacked(file, p + "ffn_down_exps.weight", hp.n_ff_exp, hp.n_embd, hp.n_expert));
      if (hp.n_ff_shexp > 0) {
        SPW_ASSIGN_OR_RETURN(l.s_router, load_vector(file, p + "ffn_gate_inp_shexp.weight", hp.n_embd));
        SPW_ASSIGN_OR_RETURN(l.s_gate, load_matrix(file, p + "ffn_gate_shexp.weight", hp.n_embd, hp.n_ff_shexp));
        SPW_ASSIGN_OR_RETURN(l.s_up, load_matrix(file, p + "ffn_up_shexp.weight", hp.n_embd, hp.n_ff_shexp));
        SPW_ASSIGN_OR_RETURN(l.s_down, load_matrix(file, p + "ffn_down_shexp.weight", hp.n_ff_shexp, hp.n_embd));
      }
      continue;
    }
    if (arch == "phi3") {  // Phi3MLP: gate_up_proj's output is [gate | up]
      SPW_ASSIGN_OR_RETURN(Matrix gate_up, load_matrix(file, p + "ffn_up.weight", hp.n_embd, 2 * hp.n_ff));
      l.w_gate = rows_of(gate_up, 0, hp.n_ff);
      l.w_up = rows_of(gate_up, hp.n_ff, hp.n_ff);
    } else {
      SPW_ASSIGN_OR_RETURN(l.w_gate, load_matrix(file, p + "ffn_gate.weight", hp.n_embd, hp.n_ff));
      SPW_ASSIGN_OR_RETURN(l.w_up, load_matrix(file, p + "ffn_up.weight", hp.n_embd, hp.n_ff));
    }
    SPW_ASSIGN_OR_RETURN(l.w_down, load_matrix(file, p + "ffn_down.weight", hp.n_ff, hp.n_embd));
  }
  return ref;
}

namespace {

void matvec(const std::vector<double>& w, int64_t rows, int64_t cols, const std::vector<double>& x,
            std::vector<double>& out) {
  out.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = w.data() + r * cols;
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += row[c] * x[static_cast<size_t>(c)];
    out[static_cast<size_t>(r)] = acc;
  }
}

}  // namespace

void LlamaReference::ffn(const Layer& L, const std::vector<double>& h, std::vector<double>& out) const {
  // down(silu(gate h) * up h), or gelu_tanh for gemma
  const auto swiglu_ffn = [&](const Matrix& gate, const Matrix& up, const Matrix& down, std::vector<double>& y) {
    std::vector<double> g, u;
    matvec(gate.w, gate.rows, gate.cols, h, g);
    matvec(up.w, up.rows, up.cols, h, u);
    for (size_t i = 0; i < g.size(); ++i) g[i] = (hp_.gelu ? gelu_tanh(g[i]) : g[i] / (1.0 + std::exp(-g[i]))) * u[i];
    matvec(down.w, down.rows, down.cols, g, y);
  };
  if (hp_.n_expert == 0) {
    swiglu_ffn(L.w_gate, L.w_up, L.w_down, out);
    return;
  }
  std::vector<double> p;
  matvec(L.router.w, L.router.rows, L.router.cols, h, p);
  const double mx = *std::max_element(p.begin(), p.end());
  double z = 0;
  for (double& v : p) z += v = std::exp(v - mx);
  for (double& v : p) v /= z;
  // The top k by probability (a stable sort: the lower index first on a tie).
  std::vector<int64_t> idx(p.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  idx.resize(static_cast<size_t>(hp_.n_expert_used));
  double sum = 0;
  for (int64_t e : idx) sum += p[static_cast<size_t>(e)];
  out.assign(static_cast<size_t>(hp_.n_embd), 0.0);
  std::vector<double> y;
  for (int64_t e : idx) {
    const size_t ei = static_cast<size_t>(e);
    swiglu_ffn(L.e_gate[ei], L.e_up[ei], L.e_down[ei], y);
    const double weight = (hp_.norm_topk ? p[ei] / sum : p[ei]) * hp_.weights_scale;
    for (size_t i = 0; i < out.size(); ++i) out[i] += weight * y[i];
  }
  if (hp_.n_ff_shexp > 0) {
    double dot = 0;
    for (size_t i = 0; i < h.size(); ++i) dot += L.s_router[i] * h[i];
    swiglu_ffn(L.s_gate, L.s_up, L.s_down, y);
    const double gate = 1.0 / (1.0 + std::exp(-dot));
    for (size_t i = 0; i < out.size(); ++i) out[i] += gate * y[i];
  }
}

LlamaReference::Cache LlamaReference::new_cache() const {
  Cache c;
  c.k.resize(static_cast<size_t>(hp_.n_layer));
  c.v.resize(static_cast<size_t>(hp_.n_layer));
  return c;
}

void LlamaReference::step(Cache& cache, TokenId token, std::vector<double>& logits, std::vector<double>* normed) const {
  const int64_t n_embd = hp_.n_embd, hd = hp_.head_dim, pos = cache.n_past;
  const int64_t n_embd_kv = hd * hp_.n_head_kv, group = hp_.n_head / hp_.n_head_kv;
  const double scale = hp_.attn_scale;
  const auto mv = [](const Matrix& m, const std::vector<double>& x, std::vector<double>& out) {
    matvec(m.w, m.rows, m.cols, x, out);
  };

  std::vector<double> x(tok_embd_.w.begin() + token * n_embd, tok_embd_.w.begin() + (token + 1) * n_embd);
  if (hp_.embd_scale != 1.0) {
    for (double& e : x) e *= hp_.embd_scale;
  }
  std::vector<double> h, q, k, v, attn(static_cast<size_t>(hd * hp_.n_head)), o, d, scores;
  for (int64_t li = 0; li < hp_.n_layer; ++li) {
    const Layer& L = layers_[static_cast<size_t>(li)];
    rms_norm(x, L.attn_norm, hp_.rms_eps, h);
    mv(L.wq, h, q);
    mv(L.wk, h, k);
    mv(L.wv, h, v);
    if (hp_.qkv_bias) {
      add_to(q, L.bq);
      add_to(k, L.bk);
      add_to(v, L.bv);
    }
    if (hp_.qk_norm) {
      head_norm(q, hd, L.q_norm, hp_.rms_eps);
      head_norm(k, hd, L.k_norm, hp_.rms_eps);
    }
    // A sliding layer: its own RoPE base, unscaled positions, and keys older
    // than the window masked. Otherwise the global base and position scale.
    const bool swa = hp_.swa_layers[static_cast<size_t>(li)];
    const double base = swa ? hp_.rope_freq_base_swa : hp_.rope_freq_base;
    const double rpos = static_cast<double>(pos) * (swa ? 1.0 : hp_.rope_freq_scale);
    rope(q, hp_.n_head, hd, hp_.n_rot, base, rpos, hp_.neox);
    rope(k, hp_.n_head_kv, hd, hp_.n_rot, base, rpos, hp_.neox);
    auto& kc = cache.k[static_cast<size_t>(li)];
    auto& vc = cache.v[static_cast<size_t>(li)];
    kc.insert(kc.end(), k.begin(), k.end());
    vc.insert(vc.end(), v.begin(), v.end());
    const int64_t n_kv = pos + 1;
    // Keys [t0, n_kv) are visible; a masked key is skipped outright rather than
    // given weight exp(-inf), so that it cannot touch the sums at all.
    const int64_t t0 = swa ? std::max<int64_t>(0, pos - hp_.sliding_window + 1) : 0;
    scores.assign(static_cast<size_t>(n_kv), 0.0);
    for (int64_t head = 0; head < hp_.n_head; ++head) {
      const int64_t kvh = head / group;
      const double* qh = q.data() + head * hd;
      double mx = -INFINITY;
      for (int64_t t = t0; t < n_kv; ++t) {
        const double* kt = kc.data() + t * n_embd_kv + kvh * hd;
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kt[i];
        const double s = softcap(dot * scale, hp_.attn_softcap);
        scores[static_cast<size_t>(t)] = s;
        mx = std::max(mx, s);
      }
      double z = 0;
      for (int64_t t = t0; t < n_kv; ++t) {
        double& s = scores[static_cast<size_t>(t)];
        z += s = std::exp(s - mx);
      }
      double* out = attn.data() + head * hd;
      for (int64_t i = 0; i < hd; ++i) out[i] = 0;
      for (int64_t t = t0; t < n_kv; ++t) {
        const double a = scores[static_cast<size_t>(t)] / z;
        const double* vt = vc.data() + t * n_embd_kv + kvh * hd;
        for (int64_t i = 0; i < hd; ++i) out[i] += a * vt[i];
      }
    }
    mv(L.wo, attn, o);
    if (hp_.post_norms) {
      rms_norm(o, L.post_attn_norm, hp_.rms_eps, h);
      o.swap(h);
    }
    for (int64_t i = 0; i < n_embd; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];

    rms_norm(x, L.ffn_norm, hp_.rms_eps, h);
    ffn(L, h, d);
    if (hp_.post_norms) {
      rms_norm(d, L.post_ffw_norm, hp_.rms_eps, h);
      d.swap(h);
    }
    for (int64_t i = 0; i < n_embd; ++i) x[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
  }
  rms_norm(x, output_norm_, hp_.rms_eps, h);
  if (normed) *normed = h;
  mv(output_tied_ ? tok_embd_ : output_, h, logits);
  for (double& l : logits) l = softcap(l, hp_.final_softcap);
  cache.n_past++;
}

Status LlamaReference::check_tokens(std::span<const TokenId> tokens) const {
  if (tokens.empty()) return Status::invalid_argument("reference: empty token sequence");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= hp_.n_vocab) {
      return Status::invalid_argument("reference: token " + std::to_string(tokens[i]) + " at index " +
                                      std::to_string(i) + " outside [0, " + std::to_string(hp_.n_vocab) + ")");
    }
  }
  return Status::ok_status();
}

Result<std::vector<double>> LlamaReference::forward(std::span<const TokenId> tokens) const {
  SPW_RETURN_IF_ERROR(check_tokens(tokens));
  Cache cache = new_cache();
  std::vector<double> all;
  all.reserve(tokens.size() * static_cast<size_t>(hp_.n_vocab));
  std::vector<double> logits;
  for (TokenId t : tokens) {
    step(cache, t, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

Result<std::vector<double>> LlamaReference::embed(std::span<const TokenId> tokens, int pooling) const {
  SPW_RETURN_IF_ERROR(check_tokens(tokens));
  if (pooling < 1 || pooling > 3) return Status::invalid_argument("reference: pooling must be 1, 2 or 3");
  Cache cache = new_cache();
  std::vector<double> logits, h, pooled(static_cast<size_t>(hp_.n_embd), 0.0);
  for (size_t p = 0; p < tokens.size(); ++p) {
    step(cache, tokens[p], logits, &h);
    const bool take = pooling == 1 || (pooling == 2 && p == 0) || (pooling == 3 && p + 1 == tokens.size());
    if (take) add_to(pooled, h);
  }
  if (pooling == 1) {
    for (double& v : pooled) v /= static_cast<double>(tokens.size());
  }
  double norm = 0;
  for (double v : pooled) norm += v * v;
  norm = std::sqrt(norm);
  if (norm > 0) {
    for (double& v : pooled) v /= norm;
  }
  return pooled;
}

Result<std::vector<TokenId>> LlamaReference::greedy(std::span<const TokenId> prompt, int n_new,
                                                    TokenId stop_token) const {
  SPW_RETURN_IF_ERROR(check_tokens(prompt));
  Cache cache = new_cache();
  std::vector<double> logits;
  for (TokenId t : prompt) step(cache, t, logits);
  std::vector<TokenId> out;
  for (int i = 0; i < n_new; ++i) {
    TokenId best = 0;
    for (int64_t v = 1; v < hp_.n_vocab; ++v) {
      if (logits[static_cast<size_t>(v)] > logits[static_cast<size_t>(best)]) best = static_cast<TokenId>(v);
    }
    out.push_back(best);
    if (best == stop_token) break;
    if (i + 1 < n_new) step(cache, best, logits);
  }
  return out;
}

}  // namespace spw::reference
