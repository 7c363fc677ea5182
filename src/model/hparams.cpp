#include "model/hparams.h"

#include <string>

namespace spw {

namespace {
Status bad(const char* key, int64_t value, const std::string& why) {
  return Status::invalid_argument(std::string("llama hparam ") + key + " = " + std::to_string(value) + ": " + why);
}
}  // namespace

Status LlamaHparams::validate() const {
  if (n_ctx_train <= 0) return bad("llama.context_length", n_ctx_train, "must be > 0");
  if (n_embd <= 0) return bad("llama.embedding_length", n_embd, "must be > 0");
  if (n_layer <= 0) return bad("llama.block_count", n_layer, "must be > 0");
  if (n_ff <= 0) return bad("llama.feed_forward_length", n_ff, "must be > 0");
  if (n_head <= 0) return bad("llama.attention.head_count", n_head, "must be > 0");
  if (n_embd % n_head != 0)
    return bad("llama.attention.head_count", n_head,
               "does not divide llama.embedding_length = " + std::to_string(n_embd));
  if (n_head_kv <= 0) return bad("llama.attention.head_count_kv", n_head_kv, "must be > 0");
  if (n_head % n_head_kv != 0)
    return bad("llama.attention.head_count_kv", n_head_kv,
               "does not divide llama.attention.head_count = " + std::to_string(n_head));
  if (n_rot <= 0 || n_rot % 2 != 0) return bad("llama.rope.dimension_count", n_rot, "must be even and > 0");
  if (n_rot > head_dim())
    return bad("llama.rope.dimension_count", n_rot, "exceeds head dim " + std::to_string(head_dim()));
  if (!(rope_freq_base > 0.0f))
    return Status::invalid_argument("llama hparam llama.rope.freq_base = " + std::to_string(rope_freq_base) +
                                    ": must be > 0");
  if (!(rms_eps > 0.0f) || !(rms_eps < 1.0f))
    return Status::invalid_argument("llama hparam llama.attention.layer_norm_rms_epsilon = " +
                                    std::to_string(rms_eps) + ": must be in (0, 1)");
  if (n_vocab <= 0) return bad("token_embd.weight ne[1] (n_vocab)", n_vocab, "must be > 0");
  return Status();
}

std::string LlamaHparams::to_string() const {
  return "n_ctx_train=" + std::to_string(n_ctx_train) + " n_embd=" + std::to_string(n_embd) +
         " n_layer=" + std::to_string(n_layer) + " n_ff=" + std::to_string(n_ff) +
         " n_head=" + std::to_string(n_head) + " n_head_kv=" + std::to_string(n_head_kv) +
         " n_rot=" + std::to_string(n_rot) + " rope_freq_base=" + std::to_string(rope_freq_base) +
         " rms_eps=" + std::to_string(rms_eps) + " n_vocab=" + std::to_string(n_vocab);
}

Result<LlamaHparams> read_llama_hparams(const gguf::GgufFile& f) {
  LlamaHparams hp;
  auto get_i32 = [&](const char* key, int32_t& out) -> Status {
    auto r = f.get_u32(key);
    if (!r.ok()) return r.status();
    if (*r > 0x7fffffffu) return bad(key, static_cast<int64_t>(*r), "too large");
    out = static_cast<int32_t>(*r);
    return Status();
  };
  SPW_RETURN_IF_ERROR(get_i32("llama.context_length", hp.n_ctx_train));
  SPW_RETURN_IF_ERROR(get_i32("llama.embedding_length", hp.n_embd));
  SPW_RETURN_IF_ERROR(get_i32("llama.block_count", hp.n_layer));
  SPW_RETURN_IF_ERROR(get_i32("llama.feed_forward_length", hp.n_ff));
  SPW_RETURN_IF_ERROR(get_i32("llama.attention.head_count", hp.n_head));
  hp.n_head_kv = hp.n_head;
  if (f.has("llama.attention.head_count_kv"))
    SPW_RETURN_IF_ERROR(get_i32("llama.attention.head_count_kv", hp.n_head_kv));
  hp.n_rot = hp.head_dim();
  if (f.has("llama.rope.dimension_count")) SPW_RETURN_IF_ERROR(get_i32("llama.rope.dimension_count", hp.n_rot));
  SPW_ASSIGN_OR_RETURN(hp.rope_freq_base, f.get_f32_or("llama.rope.freq_base", 10000.0f));
  SPW_ASSIGN_OR_RETURN(hp.rms_eps, f.get_f32_or("llama.attention.layer_norm_rms_epsilon", 1e-5f));
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (emb == nullptr) return Status::not_found("tensor 'token_embd.weight' not found");
  if (emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > 0x7fffffffu)
    return Status::corruption("tensor 'token_embd.weight' must be 2-D [n_embd, n_vocab]");
  hp.n_vocab = static_cast<int32_t>(emb->ne[1]);
  SPW_RETURN_IF_ERROR(hp.validate());
  return hp;
}

}  // namespace spw
