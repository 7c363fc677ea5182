#include "tools/modelgen/echo_llama.h"
#include "tools/modelgen/random_llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

namespace spw::modelgen {
namespace {

using gguf::GgmlType;
using gguf::Value;

// An F32 tensor of dims {n_cols, n_rows} (ne[0] first), zero but for what
// `fill(data)` sets; data[r * n_cols + c] is row r, column c. Generated when
// the file is written.
Status add_f32_tensor(gguf::GgufWriter& w, const std::string& name, std::vector<uint64_t> dims,
                      std::function<void(float*)> fill) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return w.add_tensor_streamed(name, GgmlType::kF32, std::move(dims),
                               [n, fill = std::move(fill)](std::string* out) -> Status {
                                 std::vector<float> v(static_cast<size_t>(n), 0.0f);
                                 fill(v.data());
                                 out->resize(v.size() * sizeof(float));
                                 std::memcpy(out->data(), v.data(), out->size());
                                 return Status::ok_status();
                               });
}

}  // namespace

Status validate_echo_llama_spec(const EchoLlamaSpec& s) {
  auto bad = [](const std::string& m) { return Status::invalid_argument("echo llama spec: " + m); };
  if (s.n_ctx < 2) return bad("n_ctx " + std::to_string(s.n_ctx) + " must be at least 2");
  if (s.period == 0 || s.period >= s.n_ctx) {
    return bad("period " + std::to_string(s.period) + " must be in [1, n_ctx " + std::to_string(s.n_ctx) + ")");
  }
  if (!(s.rms_eps > 0.0f) || !(s.rope_freq_base > 0.0f)) {
    return bad("rms_eps and rope_freq_base must be positive");
  }
  if (s.vocab_path.empty()) return bad("vocab_path is empty");
  return Status::ok_status();
}

Result<gguf::GgufWriter> echo_llama_writer(Env& env, const EchoLlamaSpec& s, EchoLlamaStats* stats) {
  SPW_RETURN_IF_ERROR(validate_echo_llama_spec(s));
  SPW_ASSIGN_OR_RETURN(auto vocab, gguf::GgufFile::open(env, s.vocab_path));
  SPW_ASSIGN_OR_RETURN(const gguf::Array* tokens,
                       vocab->get_array("tokenizer.ggml.tokens", gguf::ValueType::kString));
  if (tokens->items.empty()) {
    return Status::corruption("vocab '" + s.vocab_path + "': tokenizer.ggml.tokens is empty");
  }
  const uint64_t n_vocab = tokens->items.size();
  if (n_vocab > kEchoMaxVocab) {
    return Status::invalid_argument("echo llama spec: vocab '" + s.vocab_path + "' has " +
                                    std::to_string(n_vocab) + " tokens; an echo model needs n_embd > n_vocab, "
                                    "so at most " + std::to_string(kEchoMaxVocab) +
                                    " (e.g. models/stories260K.gguf, 512)");
  }
  const uint32_t hd = kEchoHeadDim;
  const uint32_t n_pairs = hd / 2;
  const uint32_t n_head = static_cast<uint32_t>((n_vocab + 1 + hd - 1) / hd);
  const uint64_t e = static_cast<uint64_t>(n_head) * hd;
  const uint64_t c_dim = n_vocab;  // the constant dimension
  const uint32_t period = s.period;

  // RMSNorm of e_t + e_C (norm weights 1): both entries become xc.
  const double xc = 1.0 / std::sqrt(2.0 / static_cast<double>(e) + static_cast<double>(s.rms_eps));
  const double kq_scale = 1.0 / std::sqrt(static_cast<double>(hd));
  // theta_i as the engine's rope_table computes it (double, from the F32 base).
  std::vector<double> theta(n_pairs);
  for (uint32_t i = 0; i < n_pairs; ++i) {
    theta[i] = std::pow(static_cast<double>(s.rope_freq_base), -2.0 * i / static_cast<double>(hd));
  }
  // Score(m - n) = a^2 kq_scale sum_i cos(theta_i * (m - n - (L-1))): peak at
  // offset 0; the drop at offset d is a^2 kq_scale sum_i (1 - cos(theta_i d)).
  // Offsets inside the context: d in [-(L-1), n_ctx - L] (even in d).
  const int64_t max_offset = std::max<int64_t>(period - 1, static_cast<int64_t>(s.n_ctx) - period);
  double min_drop = 0;
  int64_t worst = 0;
  for (int64_t d = 1; d <= max_offset; ++d) {
    double f = 0;
    for (uint32_t i = 0; i < n_pairs; ++i) f += 1.0 - std::cos(theta[i] * static_cast<double>(d));
    if (worst == 0 || f < min_drop) {
      min_drop = f;
      worst = d;
    }
  }
  if (worst != 0 && min_drop < 1e-3 * n_pairs) {
    return Status::invalid_argument("echo llama spec: with rope_freq_base " + std::to_string(s.rope_freq_base) +
                                    " the attention cannot tell offset " + std::to_string(worst) +
                                    " from the period inside n_ctx " + std::to_string(s.n_ctx) +
                                    "; use a smaller n_ctx");
  }
  // worst == 0 only when the context has no other offset (n_ctx 2, L 1).
  const double a2 = worst == 0 ? 1.0 : kEchoAttentionMargin / (kq_scale * min_drop);
  const double a = std::sqrt(a2);
  // Output gain: the worst case is t' != t (residual e_t + e_C + R e_t').
  const double r = kEchoResidual;
  const double rms = std::sqrt((2.0 + r * r) / static_cast<double>(e) + static_cast<double>(s.rms_eps));
  const double gain = kEchoOutputGap * rms / (r - 1.0);

  gguf::GgufWriter w;
  w.set("general.architecture", Value::str("llama"));
  w.set("general.name", Value::str("spillway-echo-llama-period" + std::to_string(period)));
  w.set("general.file_type", Value::u32(0));
  w.set("llama.vocab_size", Value::u32(static_cast<uint32_t>(n_vocab)));
  w.set("llama.context_length", Value::u32(s.n_ctx));
  w.set("llama.embedding_length", Value::u32(static_cast<uint32_t>(e)));
  w.set("llama.block_count", Value::u32(1));
  w.set("llama.feed_forward_length", Value::u32(kEchoFfn));
  w.set("llama.attention.head_count", Value::u32(n_head));
  w.set("llama.attention.head_count_kv", Value::u32(n_head));
  w.set("llama.rope.dimension_count", Value::u32(hd));
  w.set("llama.rope.freq_base", Value::f32(s.rope_freq_base));
  w.set("llama.attention.layer_norm_rms_epsilon", Value::f32(s.rms_eps));
  for (const auto& [key, value] : vocab->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);
  }

  const uint64_t v = n_vocab;
  auto ones = [](float* d, uint64_t n) { std::fill(d, d + n, 1.0f); };
  auto diagonal = [v, e](float value) {
    return [v, e, value](float* d) {
      for (uint64_t j = 0; j < v; ++j) d[j * e + j] = value;
    };
  };
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, "token_embd.weight", {e, v}, [v, e, c_dim](float* d) {
    for (uint64_t t = 0; t < v; ++t) {
      d[t * e + t] = 1.0f;
      d[t * e + c_dim] = 1.0f;
    }
  }));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, "output_norm.weight", {e}, [=](float* d) { ones(d, e); }));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, "output.weight", {e, v}, diagonal(static_cast<float>(gain))));
  const std::string p = "blk.0.";
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "attn_norm.weight", {e}, [=](float* d) { ones(d, e); }));
  // q pair i = a (cos phi_i, sin phi_i), phi_i = -theta_i (L-1); k pair i = (a, 0).
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "attn_q.weight", {e, e}, [=](float* d) {
    for (uint32_t h = 0; h < n_head; ++h) {
      for (uint32_t i = 0; i < n_pairs; ++i) {
        const double phi = -theta[i] * static_cast<double>(period - 1);
        const uint64_t row = static_cast<uint64_t>(h) * hd + 2 * i;
        d[row * e + c_dim] = static_cast<float>(a * std::cos(phi) / xc);
        d[(row + 1) * e + c_dim] = static_cast<float>(a * std::sin(phi) / xc);
      }
    }
  }));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "attn_k.weight", {e, e}, [=](float* d) {
    for (uint32_t h = 0; h < n_head; ++h) {
      for (uint32_t i = 0; i < n_pairs; ++i) {
        const uint64_t row = static_cast<uint64_t>(h) * hd + 2 * i;
        d[row * e + c_dim] = static_cast<float>(a / xc);
      }
    }
  }));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "attn_v.weight", {e, e}, diagonal(1.0f)));
  SPW_RETURN_IF_ERROR(
      add_f32_tensor(w, p + "attn_output.weight", {e, e}, diagonal(static_cast<float>(r / xc))));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "ffn_norm.weight", {e}, [=](float* d) { ones(d, e); }));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "ffn_gate.weight", {e, kEchoFfn}, [](float*) {}));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "ffn_up.weight", {e, kEchoFfn}, [](float*) {}));
  SPW_RETURN_IF_ERROR(add_f32_tensor(w, p + "ffn_down.weight", {kEchoFfn, e}, [](float*) {}));

  if (stats != nullptr) {
    stats->n_vocab = static_cast<uint32_t>(n_vocab);
    stats->n_embd = static_cast<uint32_t>(e);
    stats->n_head = n_head;
    stats->attention_margin = worst == 0 ? 0.0 : a2 * kq_scale * min_drop;
    stats->runner_up_offset = worst;
    stats->q_k_magnitude = a;
    stats->output_gain = gain;
    stats->n_params = 2 * v * e + e + 2 * e + 4 * e * e + 3 * e * kEchoFfn;
    SPW_ASSIGN_OR_RETURN(stats->file_size, w.serialized_size());
  }
  return w;
}

Status write_echo_llama(Env& env, const std::string& out_path, const EchoLlamaSpec& spec) {
  SPW_ASSIGN_OR_RETURN(gguf::GgufWriter w, echo_llama_writer(env, spec));
  return write_generated_model(env, out_path, w);
}

Result<std::string> make_echo_llama(Env& env, const EchoLlamaSpec& spec) {
  SPW_ASSIGN_OR_RETURN(gguf::GgufWriter w, echo_llama_writer(env, spec));
  return w.serialize();
}

Result<std::string> make_echo_llama(const EchoLlamaSpec& spec) {
  return make_echo_llama(Env::default_env(), spec);
}

}  // namespace spw::modelgen
