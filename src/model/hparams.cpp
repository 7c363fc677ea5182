#include "model/hparams.h"

#include "model/arch.h"

#include <cmath>
#include <string>

namespace spw {

namespace {
// More than any released model (DeepSeek-V3 and Kimi K2: 256 and 384); a
// bound so that a hostile header cannot size the router's buffers.
constexpr int32_t kMaxExperts = 1024;

Status bad(const std::string& key, int64_t value, const std::string& why) {
  return Status::invalid_argument("hparam " + key + " = " + std::to_string(value) + ": " + why);
}

// Gemma's keys (see the header), after the common ones.
Status read_gemma(const gguf::GgufFile& f, const ArchSpec& spec, LlamaHparams& hp) {
  const auto key = [&](const char* k) { return hp.arch + "." + k; };
  hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
  hp.post_norms = true;
  hp.ffn_gelu = true;
  hp.swa_period = spec.swa_period;
  if (spec.softcap) {
    SPW_ASSIGN_OR_RETURN(hp.attn_softcap, f.get_f32_or(key("attn_logit_softcapping"), 50.0f));
    SPW_ASSIGN_OR_RETURN(hp.final_softcap, f.get_f32_or(key("final_logit_softcapping"), 30.0f));
  }
  if (!f.has(key("attention.sliding_window")) && spec.swa_local_rope)
    return Status::not_found("key '" + key("attention.sliding_window") + "' not found");
  uint32_t window = 4096;  // Gemma 2's, which its early files do not write
  if (f.has(key("attention.sliding_window"))) {
    SPW_ASSIGN_OR_RETURN(window, f.get_u32(key("attention.sliding_window")));
  }
  if (window == 0 || window > 0x7fffffffu)
    return bad(key("attention.sliding_window"), static_cast<int64_t>(window), "must be in [1, 2^31)");
  hp.n_swa = static_cast<int32_t>(window);
  if (spec.swa_local_rope) {
    SPW_ASSIGN_OR_RETURN(hp.rope_freq_base_swa, f.get_f32_or(key("rope.freq_base_swa"), 10000.0f));
  }
  if (hp.n_layer == spec.wide_query_scale_layers)
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head));
  return Status();
}
}  // namespace

Status LlamaHparams::validate() const {
  const auto key = [&](const char* k) { return arch + "." + k; };
  if (n_ctx_train <= 0) return bad(key("context_length"), n_ctx_train, "must be > 0");
  if (n_embd <= 0) return bad(key("embedding_length"), n_embd, "must be > 0");
  if (n_layer <= 0) return bad(key("block_count"), n_layer, "must be > 0");
  if (n_ff <= 0) return bad(key("feed_forward_length"), n_ff, "must be > 0");
  if (n_head <= 0) return bad(key("attention.head_count"), n_head, "must be > 0");
  if (n_head_kv <= 0) return bad(key("attention.head_count_kv"), n_head_kv, "must be > 0");
  if (n_embd_head < 0) return bad(key("attention.key_length"), n_embd_head, "must be > 0");
  if (n_embd_head == 0 && n_embd % n_head != 0)
    return bad(key("attention.head_count"), n_head, "does not divide " + key("embedding_length") + " = " +
               std::to_string(n_embd) + " (and no attention.key_length)");
  if (n_head % n_head_kv != 0)
    return bad(key("attention.head_count_kv"), n_head_kv,
               "does not divide " + key("attention.head_count") + " = " + std::to_string(n_head));
  if (n_rot <= 0 || n_rot % 2 != 0) return bad(key("rope.dimension_count"), n_rot, "must be even and > 0");
  if (n_rot > head_dim())
    return bad(key("rope.dimension_count"), n_rot, "exceeds head dim " + std::to_string(head_dim()));
  if (!(rope_freq_base > 0.0f))
    return Status::invalid_argument("hparam " + key("rope.freq_base") + " = " + std::to_string(rope_freq_base) +
                                    ": must be > 0");
  if (!(rope_freq_scale > 0.0f) || !(rope_freq_scale <= 1.0f))
    return Status::invalid_argument("hparam " + key("rope.scaling.factor") + " = " +
                                    std::to_string(1.0f / rope_freq_scale) + ": must be >= 1");
  if (!(rms_eps > 0.0f) || !(rms_eps < 1.0f))
    return Status::invalid_argument("hparam " + key("attention.layer_norm_rms_epsilon") + " = " +
                                    std::to_string(rms_eps) + ": must be in (0, 1)");
  if (n_vocab <= 0) return bad("token_embd.weight ne[1] (n_vocab)", n_vocab, "must be > 0");
  if (n_swa < 0) return bad(key("attention.sliding_window"), n_swa, "must be > 0");
  for (const auto& [k, v] : {std::pair{"attn_logit_softcapping", attn_softcap}, {"final_logit_softcapping",
                                                                                  final_softcap}}) {
    if (!(v >= 0.0f) || !std::isfinite(v))
      return Status::invalid_argument("hparam " + key(k) + " = " + std::to_string(v) + ": must be >= 0");
  }
  if (!(rope_freq_base_swa >= 0.0f))
    return Status::invalid_argument("hparam " + key("rope.freq_base_swa") + " = " +
                                    std::to_string(rope_freq_base_swa) + ": must be > 0");
  if (n_expert < 0 || n_expert > kMaxExperts)
    return bad(key("expert_count"), n_expert, "must be in [0, " + std::to_string(kMaxExperts) + "]");
  if (n_expert > 0) {
    if (n_expert_used <= 0 || n_expert_used > n_expert)
      return bad(key("expert_used_count"), n_expert_used,
                 "must be in [1, expert_count = " + std::to_string(n_expert) + "]");
    if (n_ff_exp <= 0) return bad(key("expert_feed_forward_length"), n_ff_exp, "must be > 0");
    if (n_ff_shexp < 0) return bad(key("expert_shared_feed_forward_length"), n_ff_shexp, "must be >= 0");
  }
  return Status();
}

std::string LlamaHparams::to_string() const {
  return "arch=" + arch + " n_ctx_train=" + std::to_string(n_ctx_train) + " n_embd=" + std::to_string(n_embd) +
         " n_layer=" + std::to_string(n_layer) + " n_ff=" + std::to_string(n_ff) +
         " n_head=" + std::to_string(n_head) + " n_head_kv=" + std::to_string(n_head_kv) +
         " head_dim=" + std::to_string(head_dim()) + " n_rot=" + std::to_string(n_rot) +
         " rope=" + (rope_style == RopeStyle::kNeox ? "neox" : "normal") +
         " rope_freq_base=" + std::to_string(rope_freq_base) + " rope_freq_scale=" + std::to_string(rope_freq_scale) +
         " rms_eps=" + std::to_string(rms_eps) + " n_vocab=" + std::to_string(n_vocab) +
         (moe() ? " n_expert=" + std::to_string(n_expert) + " n_expert_used=" + std::to_string(n_expert_used) +
                      " n_ff_exp=" + std::to_string(n_ff_exp) + " n_ff_shexp=" + std::to_string(n_ff_shexp)
                : "") +
         (n_swa > 0 ? " n_swa=" + std::to_string(n_swa) + " swa_period=" + std::to_string(swa_period) : "") +
         (attn_softcap > 0.0f ? " attn_softcap=" + std::to_string(attn_softcap) : "") +
         (final_softcap > 0.0f ? " final_softcap=" + std::to_string(final_softcap) : "");
}

float LlamaHparams::kq_scale() const {
  return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim()));
}

std::string_view pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kNone: return "none";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
    case Pooling::kLast: return "last";
    case Pooling::kRank: return "rank";
  }
  return "none";
}

Result<LlamaHparams> read_llama_hparams(const gguf::GgufFile& f) {
  LlamaHparams hp;
  SPW_ASSIGN_OR_RETURN(hp.arch, f.get_string("general.architecture"));
  const ArchSpec* spec = find_arch(hp.arch);
  if (spec == nullptr) {
    return Status::invalid_argument("unsupported architecture '" + hp.arch + "' (general.architecture); supported: " +
                                    supported_arch_names());
  }
  hp.rope_style = spec->rope_style;
  const auto key = [&](const char* k) { return hp.arch + "." + k; };
  auto get_i32 = [&](const std::string& k, int32_t& out) -> Status {
    auto r = f.get_u32(k);
    if (!r.ok()) return r.status();
    if (*r > 0x7fffffffu) return bad(k, static_cast<int64_t>(*r), "too large");
    out = static_cast<int32_t>(*r);
    return Status();
  };
  SPW_RETURN_IF_ERROR(get_i32(key("context_length"), hp.n_ctx_train));
  SPW_RETURN_IF_ERROR(get_i32(key("embedding_length"), hp.n_embd));
  SPW_RETURN_IF_ERROR(get_i32(key("block_count"), hp.n_layer));
  if (f.has(key("expert_count"))) SPW_RETURN_IF_ERROR(get_i32(key("expert_count"), hp.n_expert));
  if (spec->moe == MoeKind::kNone) {
    hp.n_expert = 0;  // a stray key on a dense architecture is not a mixture
  } else if (spec->moe == MoeKind::kRequired && hp.n_expert == 0) {
    return Status::invalid_argument(hp.arch + ": " + key("expert_count") +
                                    " is missing or 0; this architecture is a mixture of experts");
  }
  if (f.has(key("feed_forward_length")) || !hp.moe())
    SPW_RETURN_IF_ERROR(get_i32(key("feed_forward_length"), hp.n_ff));
  if (hp.moe()) {
    SPW_RETURN_IF_ERROR(get_i32(key("expert_used_count"), hp.n_expert_used));
    if (f.has(key("expert_feed_forward_length"))) {
      SPW_RETURN_IF_ERROR(get_i32(key("expert_feed_forward_length"), hp.n_ff_exp));
    } else if (hp.n_ff > 0) {
      hp.n_ff_exp = spec->moe == MoeKind::kRequired && hp.n_expert_used > 0 ? hp.n_ff / hp.n_expert_used : hp.n_ff;
    } else {
      return Status::not_found("key '" + key("expert_feed_forward_length") + "' not found");
    }
    if (hp.n_ff == 0) hp.n_ff = hp.n_ff_exp;
    if (spec->shared_expert) {
      hp.n_ff_shexp = hp.n_ff;
      if (f.has(key("expert_shared_feed_forward_length")))
        SPW_RETURN_IF_ERROR(get_i32(key("expert_shared_feed_forward_length"), hp.n_ff_shexp));
      if (hp.n_ff_shexp == 0) return bad(key("expert_shared_feed_forward_length"), 0, "must be > 0");
    }
    hp.moe_norm_topk = spec->moe_norm_topk;
    if (const gguf::Value* v = f.find(key("expert_weights_norm")); v != nullptr) {
      if (const bool* b = std::get_if<bool>(&v->v)) hp.moe_norm_topk = *b;
    }
    SPW_ASSIGN_OR_RETURN(hp.moe_weights_scale, f.get_f32_or(key("expert_weights_scale"), 1.0f));
    if (hp.moe_weights_scale == 0.0f) hp.moe_weights_scale = 1.0f;  // llama.cpp's "unset"
    if (!(hp.moe_weights_scale > 0.0f) || !std::isfinite(hp.moe_weights_scale))
      return Status::invalid_argument("hparam " + key("expert_weights_scale") + " = " +
                                      std::to_string(hp.moe_weights_scale) + ": must be > 0");
    if (f.has(key("expert_gating_func"))) {
      int32_t g = 0;
      SPW_RETURN_IF_ERROR(get_i32(key("expert_gating_func"), g));
      if (g != 1)
        return bad(key("expert_gating_func"), g, "not supported (1, softmax, is; 2 is DeepSeek's sigmoid)");
    }
  }
  SPW_RETURN_IF_ERROR(get_i32(key("attention.head_count"), hp.n_head));
  hp.n_head_kv = hp.n_head;
  if (f.has(key("attention.head_count_kv")))
    SPW_RETURN_IF_ERROR(get_i32(key("attention.head_count_kv"), hp.n_head_kv));
  if (f.has(key("attention.key_length"))) SPW_RETURN_IF_ERROR(get_i32(key("attention.key_length"), hp.n_embd_head));
  if (f.has(key("attention.value_length"))) {
    int32_t v = 0;
    SPW_RETURN_IF_ERROR(get_i32(key("attention.value_length"), v));
    if (v != hp.head_dim()) {
      return bad(key("attention.value_length"), v,
                 "differs from the key length " + std::to_string(hp.head_dim()) + " (not supported)");
    }
  }
  hp.n_rot = hp.head_dim();
  if (f.has(key("rope.dimension_count"))) SPW_RETURN_IF_ERROR(get_i32(key("rope.dimension_count"), hp.n_rot));
  SPW_ASSIGN_OR_RETURN(hp.rope_freq_base, f.get_f32_or(key("rope.freq_base"), 10000.0f));
  SPW_ASSIGN_OR_RETURN(hp.rms_eps, f.get_f32_or(key("attention.layer_norm_rms_epsilon"), 1e-5f));
  if (f.has(key("pooling_type"))) {
    int32_t pt = 0;
    SPW_RETURN_IF_ERROR(get_i32(key("pooling_type"), pt));
    if (pt > 4) return bad(key("pooling_type"), pt, "unknown (0 none, 1 mean, 2 cls, 3 last, 4 rank)");
    hp.pooling = static_cast<Pooling>(pt);
  }
  if (const gguf::Value* v = f.find(key("attention.causal")); v != nullptr) {
    if (const bool* b = std::get_if<bool>(&v->v)) hp.causal = *b;
  }
  // RoPE scaling: linear is a position scale; Llama 3's per-frequency factors
  // come as a tensor (bound by the model); the rest is refused by name.
  std::string scaling = "none";
  if (f.has(key("rope.scaling.type"))) {
    SPW_ASSIGN_OR_RETURN(scaling, f.get_string(key("rope.scaling.type")));
  }
  float factor = 1.0f;
  SPW_ASSIGN_OR_RETURN(factor, f.get_f32_or(key("rope.scaling.factor"), 1.0f));
  if (f.has(key("rope.scale_linear"))) {
    SPW_ASSIGN_OR_RETURN(factor, f.get_f32_or(key("rope.scale_linear"), 1.0f));
    if (scaling == "none") scaling = "linear";
  }
  if (scaling == "linear") {
    if (!(factor >= 1.0f)) {
      return Status::invalid_argument("hparam " + key("rope.scaling.factor") + " = " + std::to_string(factor) +
                                      ": must be >= 1");
    }
    hp.rope_freq_scale = 1.0f / factor;
  } else if (scaling != "none" && scaling != "llama3") {
    return Status::invalid_argument("RoPE scaling '" + scaling + "' (" + key("rope.scaling.type") +
                                    ") is not supported; supported: none, linear, llama3");
  }
  if (spec->gemma_style) {
    SPW_RETURN_IF_ERROR(read_gemma(f, *spec, hp));
  }
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (emb == nullptr) return Status::not_found("tensor 'token_embd.weight' not found");
  if (emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > 0x7fffffffu)
    return Status::corruption("tensor 'token_embd.weight' must be 2-D [n_embd, n_vocab]");
  hp.n_vocab = static_cast<int32_t>(emb->ne[1]);
  SPW_RETURN_IF_ERROR(hp.validate());
  return hp;
}

}  // namespace spw
