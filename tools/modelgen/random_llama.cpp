#include "tools/modelgen/random_llama.h"

#include "model/arch.h"

#include "core/hash.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

#include "gguf/quant.h"

namespace spw::modelgen {
namespace {

using gguf::GgmlType;
using gguf::Value;


// llama_ftype of general.file_type (llama.h). A pure K type is labelled with
// the closest llama.cpp ftype (Q4_K_S / Q5_K_S / Q6_K).
uint32_t file_type_of(const RandomLlamaSpec& s) {
  if (s.mix == RandomLlamaMix::kQ4_K_M) return 15;
  if (s.mix == RandomLlamaMix::kQ5_K_M) return 17;
  switch (s.type) {
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kQ4_1: return 3;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kQ5_0: return 8;
    case GgmlType::kQ5_1: return 9;
    case GgmlType::kQ4_K: return 14;
    case GgmlType::kQ5_K: return 16;
    case GgmlType::kQ6_K: return 18;
    default: return 0;
  }
}

std::string type_label(const RandomLlamaSpec& s) {
  if (s.mix == RandomLlamaMix::kQ4_K_M) return "q4_k_m";
  if (s.mix == RandomLlamaMix::kQ5_K_M) return "q5_k_m";
  std::string l = gguf::ggml_type_name(static_cast<uint32_t>(s.type));
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l;
}

// llama.cpp's layer choice for the extra bits of Q4_K_M / Q5_K_M.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// llama.cpp's fallback for rows a K type's 256-block does not divide.
GgmlType k_fallback(GgmlType t, uint64_t ne0) {
  if (ne0 % 256 == 0) return t;
  const GgmlType f = t == GgmlType::kQ4_K ? GgmlType::kQ5_0 : t == GgmlType::kQ5_K ? GgmlType::kQ5_1 : GgmlType::kQ8_0;
  return ne0 % 32 == 0 ? f : GgmlType::kF16;
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

GgmlType random_llama_tensor_type(const RandomLlamaSpec& s, const std::string& name, uint32_t layer, uint64_t ne0) {
  if (s.mix == RandomLlamaMix::kNone) return s.type;
  const GgmlType base = s.mix == RandomLlamaMix::kQ4_K_M ? GgmlType::kQ4_K : GgmlType::kQ5_K;
  const bool head = name == "output.weight" || (random_llama_tied(s) && name == "token_embd.weight");
  if (head) return ne0 % 256 == 0 ? GgmlType::kQ6_K : GgmlType::kQ8_0;
  const bool more = (name.ends_with(".attn_v.weight") || name.find(".ffn_down") != std::string::npos) &&
                    use_more_bits(static_cast<int>(layer), static_cast<int>(s.n_layer));
  return k_fallback(more ? GgmlType::kQ6_K : base, ne0);
}

namespace {
uint32_t expert_ff(const RandomLlamaSpec& s) { return s.n_ff_exp > 0 ? s.n_ff_exp : s.n_ff; }
uint32_t shared_ff(const RandomLlamaSpec& s) { return s.n_ff_shexp > 0 ? s.n_ff_shexp : s.n_ff; }
uint32_t experts_used(const RandomLlamaSpec& s) { return s.n_expert_used > 0 ? s.n_expert_used : 2; }
}  // namespace

bool random_llama_tied(const RandomLlamaSpec& s) {
  const ArchSpec* a = find_arch(s.arch);
  return s.tied_output || (a != nullptr && a->gemma_style);
}

Status validate_random_llama_spec(const RandomLlamaSpec& s) {
  auto bad = [](const std::string& m) { return Status::invalid_argument("random llama spec: " + m); };
  if (s.n_embd == 0 || s.n_layer == 0 || s.n_head == 0 || s.n_head_kv == 0 || s.n_ff == 0 ||
      s.n_ctx == 0) {
    return bad("n_embd, n_layer, n_head, n_head_kv, n_ff and n_ctx must all be nonzero");
  }
  if (find_arch(s.arch) == nullptr) {
    return bad("arch '" + s.arch + "' is not one of " + supported_arch_names());
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
  if (s.rope_dims % 2 != 0 || s.rope_dims > hd)
    return bad("rope_dims " + std::to_string(s.rope_dims) + " must be even and at most the head dim " +
               std::to_string(hd));
  if (s.mix == RandomLlamaMix::kNone) {
    if (!gguf::has_reference_codec(s.type)) {
      return bad("type " + gguf::ggml_type_name(static_cast<uint32_t>(s.type)) +
                 " has no quantiser (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
    }
    const uint32_t block = gguf::ggml_type_info(static_cast<uint32_t>(s.type))->block_size;
    if (s.n_embd % block != 0 || s.n_ff % block != 0) {
      return bad(gguf::ggml_type_name(static_cast<uint32_t>(s.type)) + " needs n_embd and n_ff to be multiples of " +
                 std::to_string(block) + " (got " + std::to_string(s.n_embd) + ", " + std::to_string(s.n_ff) + ")");
    }
    if ((hd * s.n_head) % block != 0) {
      return bad(gguf::ggml_type_name(static_cast<uint32_t>(s.type)) + " needs head_dim * n_head (attn_output's rows) "
                 "to be a multiple of " + std::to_string(block));
    }
  }
  if (!(s.rms_eps > 0.0f) || !(s.rope_freq_base > 0.0f)) {
    return bad("rms_eps and rope_freq_base must be positive");
  }
  const ArchSpec& arch = *find_arch(s.arch);
  if (arch.moe == MoeKind::kRequired && s.n_expert == 0) return bad(s.arch + " needs n_expert > 0");
  if (arch.moe == MoeKind::kNone && s.n_expert > 0) return bad(s.arch + " has no experts (n_expert must be 0)");
  if (s.n_expert > 0) {
    const uint32_t used = s.n_expert_used > 0 ? s.n_expert_used : 2;
    if (used > s.n_expert)
      return bad("n_expert_used " + std::to_string(used) + " exceeds n_expert " + std::to_string(s.n_expert));
    if (s.mix == RandomLlamaMix::kNone) {
      const uint32_t block = gguf::ggml_type_info(static_cast<uint32_t>(s.type))->block_size;
      if (expert_ff(s) % block != 0 || shared_ff(s) % block != 0)
        return bad("n_ff_exp and n_ff_shexp must be multiples of the type's block " + std::to_string(block));
    }
  }
  if (arch.gemma_style && arch.swa_local_rope && s.sliding_window == 0)
    return bad(s.arch + " needs sliding_window > 0 (attention.sliding_window)");
  if (!(s.attn_softcap >= 0.0f) || !(s.final_softcap >= 0.0f) || !(s.rope_scale_linear >= 0.0f))
    return bad("attn_softcap, final_softcap and rope_scale_linear must be >= 0");
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
  uint64_t per_layer = 2 * e + 2 * e * e_q + 2 * e * e_kv;
  if (s.n_expert == 0) per_layer += 3 * e * s.n_ff;
  if (const ArchSpec* a = find_arch(s.arch)) {
    if (a->qkv_bias) per_layer += e_q + 2 * e_kv;
    if (a->qk_norm) per_layer += 2 * hd;
    if (a->gemma_style) per_layer += 2 * e;
    if (s.n_expert > 0) {
      per_layer += e * s.n_expert + uint64_t{s.n_expert} * 3 * e * expert_ff(s);
      if (a->shared_expert) per_layer += e + 3 * e * shared_ff(s);
    }
  }
  return n_vocab * e * (random_llama_tied(s) ? 1 : 2) + e + s.n_layer * per_layer;
}

Result<gguf::GgufWriter> random_llama_writer(Env& env, const RandomLlamaSpec& s,
                                             RandomLlamaStats* stats) {
  SPW_RETURN_IF_ERROR(validate_random_llama_spec(s));
  const ArchSpec& arch = *find_arch(s.arch);  // the spec's optional tensors
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
                           std::to_string(s.n_layer) + "-" + type_label(s) + "-seed" +
                           std::to_string(s.seed);
  w.set("general.architecture", Value::str(s.arch));
  w.set("general.name", Value::str(name));
  w.set("general.file_type", Value::u32(file_type_of(s)));
  if (file_type_of(s) > 1) w.set("general.quantization_version", Value::u32(2));
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
  w.set(a + "rope.dimension_count", Value::u32(s.rope_dims > 0 ? s.rope_dims : head_dim));
  w.set(a + "rope.freq_base", Value::f32(s.rope_freq_base));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(s.rms_eps));
  if (s.pooling_type > 0) w.set(a + "pooling_type", Value::u32(s.pooling_type));
  if (s.sliding_window > 0) w.set(a + "attention.sliding_window", Value::u32(s.sliding_window));
  if (s.attn_softcap > 0.0f) w.set(a + "attn_logit_softcapping", Value::f32(s.attn_softcap));
  if (s.final_softcap > 0.0f) w.set(a + "final_logit_softcapping", Value::f32(s.final_softcap));
  if (s.rope_scale_linear > 1.0f) {
    w.set(a + "rope.scaling.type", Value::str("linear"));
    w.set(a + "rope.scaling.factor", Value::f32(s.rope_scale_linear));
  }
  if (s.n_expert > 0) {
    w.set(a + "expert_count", Value::u32(s.n_expert));
    w.set(a + "expert_used_count", Value::u32(experts_used(s)));
    w.set(a + "expert_feed_forward_length", Value::u32(expert_ff(s)));
    if (arch.shared_expert) w.set(a + "expert_shared_feed_forward_length", Value::u32(shared_ff(s)));
    if (s.expert_weights_scale > 0.0f) w.set(a + "expert_weights_scale", Value::f32(s.expert_weights_scale));
  }
  for (const auto& [key, value] : vocab->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);
  }

  const float kStd = 0.02f;
  const float kResidualStd = kStd / std::sqrt(2.0f * static_cast<float>(s.n_layer));
  const float kNormNoise = 0.01f;
  const uint64_t e = s.n_embd;
  // Matrices get their type from the spec (pure or mixed); norms are F32.
  auto matrix = [&](const std::string& n, uint32_t layer, std::vector<uint64_t> dims, float stddev) {
    const GgmlType t = random_llama_tensor_type(s, n, layer, dims[0]);
    return add_random_tensor(w, s.seed, n, t, std::move(dims), 0.0f, stddev);
  };
  SPW_RETURN_IF_ERROR(matrix("token_embd.weight", 0, {e, n_vocab}, kStd));
  SPW_RETURN_IF_ERROR(
      add_random_tensor(w, s.seed, "output_norm.weight", GgmlType::kF32, {e}, 1.0f, kNormNoise));
  if (!random_llama_tied(s)) {
    SPW_RETURN_IF_ERROR(matrix("output.weight", 0, {e, n_vocab}, kStd));
  }
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    SPW_RETURN_IF_ERROR(
        add_random_tensor(w, s.seed, p + "attn_norm.weight", GgmlType::kF32, {e}, 1.0f, kNormNoise));
    if (arch.fused_qkv) {
      SPW_RETURN_IF_ERROR(matrix(p + "attn_qkv.weight", l, {e, uint64_t{n_embd_q} + 2 * n_embd_kv}, kStd));
    } else {
      SPW_RETURN_IF_ERROR(matrix(p + "attn_q.weight", l, {e, n_embd_q}, kStd));
      SPW_RETURN_IF_ERROR(matrix(p + "attn_k.weight", l, {e, n_embd_kv}, kStd));
      SPW_RETURN_IF_ERROR(matrix(p + "attn_v.weight", l, {e, n_embd_kv}, kStd));
    }
    if (arch.qkv_bias) {
      const std::pair<const char*, uint64_t> biases[] = {{"attn_q.bias", n_embd_q}, {"attn_k.bias", n_embd_kv},
                                                          {"attn_v.bias", n_embd_kv}};
      for (const auto& [bn, len] : biases)
        SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + bn, GgmlType::kF32, {len}, 0.0f, kStd));
    }
    if (arch.qk_norm) {
      for (const char* nn : {"attn_q_norm.weight", "attn_k_norm.weight"})
        SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + nn, GgmlType::kF32, {head_dim}, 1.0f, kNormNoise));
    }
    SPW_RETURN_IF_ERROR(matrix(p + "attn_output.weight", l, {n_embd_q, e}, kResidualStd));
    SPW_RETURN_IF_ERROR(
        add_random_tensor(w, s.seed, p + "ffn_norm.weight", GgmlType::kF32, {e}, 1.0f, kNormNoise));
    if (arch.gemma_style) {
      for (const char* nn : {"post_attention_norm.weight", "post_ffw_norm.weight"})
        SPW_RETURN_IF_ERROR(add_random_tensor(w, s.seed, p + nn, GgmlType::kF32, {e}, 1.0f, kNormNoise));
    }
    if (s.n_expert > 0) {
      const uint64_t x = s.n_expert, fe = expert_ff(s);
      // A trained router is decisive (its logits spread over a few units);
      // at std 0.02 every expert would get nearly the same probability and
      // the choice would hang on float noise, which no real model does.
      const float router_std = 2.0f / std::sqrt(static_cast<float>(e));
      SPW_RETURN_IF_ERROR(
          add_random_tensor(w, s.seed, p + "ffn_gate_inp.weight", GgmlType::kF32, {e, x}, 0.0f, router_std));
      SPW_RETURN_IF_ERROR(matrix(p + "ffn_gate_exps.weight", l, {e, fe, x}, kStd));
      SPW_RETURN_IF_ERROR(matrix(p + "ffn_up_exps.weight", l, {e, fe, x}, kStd));
      SPW_RETURN_IF_ERROR(matrix(p + "ffn_down_exps.weight", l, {fe, e, x}, kResidualStd));
      if (arch.shared_expert) {
        const uint64_t fs = shared_ff(s);
        SPW_RETURN_IF_ERROR(
            add_random_tensor(w, s.seed, p + "ffn_gate_inp_shexp.weight", GgmlType::kF32, {e}, 0.0f, kStd));
        SPW_RETURN_IF_ERROR(matrix(p + "ffn_gate_shexp.weight", l, {e, fs}, kStd));
        SPW_RETURN_IF_ERROR(matrix(p + "ffn_up_shexp.weight", l, {e, fs}, kStd));
        SPW_RETURN_IF_ERROR(matrix(p + "ffn_down_shexp.weight", l, {fs, e}, kResidualStd));
      }
      continue;
    }
    if (arch.fused_gate_up) {
      SPW_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", l, {e, 2 * uint64_t{s.n_ff}}, kStd));
    } else {
      SPW_RETURN_IF_ERROR(matrix(p + "ffn_gate.weight", l, {e, s.n_ff}, kStd));
      SPW_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", l, {e, s.n_ff}, kStd));
    }
    SPW_RETURN_IF_ERROR(matrix(p + "ffn_down.weight", l, {s.n_ff, e}, kResidualStd));
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
