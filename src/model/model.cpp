#include "model/model.h"

#include "core/hash.h"
#include "gguf/fp16.h"
#include "model/arch.h"

#include <cassert>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace spw {

namespace {

void hash_value(Fnv1a64& h, const gguf::Value& v) {
  h.u32(static_cast<uint32_t>(v.type));
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          h.str(x);
        } else if constexpr (std::is_same_v<T, gguf::Array>) {
          h.u32(static_cast<uint32_t>(x.elem_type));
          h.u64(x.items.size());
          for (const auto& it : x.items) hash_value(h, it);
        } else if constexpr (std::is_same_v<T, bool>) {
          h.u8(x ? 1 : 0);
        } else if constexpr (std::is_same_v<T, double>) {
          uint64_t bits;
          std::memcpy(&bits, &x, sizeof bits);
          h.u64(bits);
        } else {
          h.u64(static_cast<uint64_t>(x));
        }
      },
      v.v);
}

std::string dims_str(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.ne[i]);
  }
  return s + "]";
}

bool supported_type(uint32_t type) {
  const gguf::GgmlTypeInfo* info = gguf::ggml_type_info(type);
  return info != nullptr && info->supported;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Binds weight tensors by name, checking shape and type, and counts each
// bound tensor's parameters and bytes by type into the model's totals.
struct TensorBinder {
  const gguf::GgufFile& f;
  int64_t& n_params;
  std::map<std::string, uint64_t>& bytes_by_type;

  void account(const gguf::TensorInfo& t) {
    n_params += static_cast<int64_t>(t.n_elements);
    bytes_by_type[gguf::ggml_type_name(t.type)] += t.nbytes;
  }

  Status find(const std::string& name, std::vector<uint64_t> dims, const gguf::TensorInfo** out) const {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (t == nullptr) return Status::not_found("tensor '" + name + "' not found");
    bool ok = t->n_dims == dims.size();
    for (size_t i = 0; ok && i < dims.size(); ++i) ok = t->ne[i] == dims[i];
    if (!ok) {
      std::string exp = "[";
      for (size_t i = 0; i < dims.size(); ++i) exp += (i ? ", " : "") + std::to_string(dims[i]);
      exp += "]";
      return Status::corruption("tensor '" + name + "' has shape " + dims_str(*t) + ", expected " + exp);
    }
    if (!supported_type(t->type))
      return Status::invalid_argument("tensor '" + name + "' has unsupported type " +
                                      gguf::ggml_type_name(t->type) +
                                      " (supported: F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
    *out = t;
    return Status();
  }

  Status matrix(const std::string& name, uint64_t cols, uint64_t rows, WeightMatrix& w) {
    const gguf::TensorInfo* t = nullptr;
    SPW_RETURN_IF_ERROR(find(name, {cols, rows}, &t));
    // Blocks never straddle rows (ggml requires it too): a row of a 32- or
    // 256-element block type is whole blocks.
    const uint32_t block = gguf::ggml_type_info(t->type)->block_size;
    if (cols % block != 0)
      return Status::corruption("tensor '" + name + "' is " + gguf::ggml_type_name(t->type) + " with " +
                                std::to_string(cols) + " columns, not a multiple of its block size " +
                                std::to_string(block));
    w.data = t->data;
    w.type = static_cast<gguf::GgmlType>(t->type);
    w.n_cols = static_cast<int64_t>(cols);
    w.n_rows = static_cast<int64_t>(rows);
    w.row_bytes = static_cast<size_t>(t->nbytes / rows);
    w.name = &t->name;
    account(*t);
    return Status();
  }

  // A 3-D [cols, rows, n] tensor as n matrices of `rows` rows each (the
  // experts of ffn_*_exps), accounted once.
  Status stacked(const std::string& name, uint64_t cols, uint64_t rows, uint64_t n, std::vector<WeightMatrix>& out) {
    const gguf::TensorInfo* t = nullptr;
    SPW_RETURN_IF_ERROR(find(name, {cols, rows, n}, &t));
    const uint32_t block = gguf::ggml_type_info(t->type)->block_size;
    if (cols % block != 0)
      return Status::corruption("tensor '" + name + "' is " + gguf::ggml_type_name(t->type) + " with " +
                                std::to_string(cols) + " columns, not a multiple of its block size " +
                                std::to_string(block));
    const size_t row_bytes = static_cast<size_t>(t->nbytes / (rows * n));
    out.assign(static_cast<size_t>(n), WeightMatrix{});
    for (uint64_t e = 0; e < n; ++e) {
      WeightMatrix& w = out[static_cast<size_t>(e)];
      w.data = t->data + e * rows * row_bytes;
      w.type = static_cast<gguf::GgmlType>(t->type);
      w.n_cols = static_cast<int64_t>(cols);
      w.n_rows = static_cast<int64_t>(rows);
      w.row_bytes = row_bytes;
      w.name = &t->name;
    }
    account(*t);
    return Status();
  }

  Status vector(const std::string& name, uint64_t n, std::vector<float>& out) {
    const gguf::TensorInfo* t = nullptr;
    SPW_RETURN_IF_ERROR(find(name, {n}, &t));
    out.resize(n);
    if (t->type == static_cast<uint32_t>(gguf::GgmlType::kF32)) {
      std::memcpy(out.data(), t->data, n * sizeof(float));
    } else if (t->type == static_cast<uint32_t>(gguf::GgmlType::kF16)) {
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t->data + 2 * i, 2);
        out[i] = gguf::fp16_to_fp32(h);
      }
    } else {
      return Status::invalid_argument("tensor '" + name + "' is a norm vector of type " +
                                      gguf::ggml_type_name(t->type) + "; expected F32 or F16");
    }
    account(*t);
    return Status();
  }
};

// `parts` as consecutive row ranges of the fused tensor `w` (phi3's
// attn_qkv, its gate and up in ffn_up), their rows as arch.h's fused_parts
// gives them. Rows never share a block, so each range is a matrix of its own
// in the file's layout; it keeps the tensor's name.
void bind_parts(const ArchSpec& arch, const LlamaHparams& hp, const WeightMatrix& w,
                std::initializer_list<WeightMatrix*> parts) {
  const std::vector<int64_t> rows = fused_parts(arch, hp, *w.name, w.n_rows);
  assert(rows.size() == parts.size());
  int64_t first = 0;
  size_t i = 0;
  for (WeightMatrix* part : parts) {
    *part = w;
    part->data = w.data + static_cast<size_t>(first) * w.row_bytes;
    part->n_rows = rows[i];
    first += rows[i++];
  }
}

// The file part of the fingerprint (see header): metadata, tensor table,
// sampled tensor bytes.
void hash_file(Fnv1a64& fp, const gguf::GgufFile& f) {
  fp.u64(f.file_size());
  for (const auto& [key, value] : f.metadata()) {
    fp.str(key);
    hash_value(fp, value);
  }
  for (const auto& t : f.tensors()) {
    fp.str(t.name);
    fp.u32(t.type);
    for (int d = 0; d < gguf::kMaxDims; ++d) fp.u64(t.ne[d]);
    fp.u64(t.offset);
    const uint64_t sample = 64;
    if (t.nbytes <= 3 * sample) {
      fp.bytes(t.data, static_cast<size_t>(t.nbytes));
    } else {
      fp.bytes(t.data, sample);
      fp.bytes(t.data + t.nbytes / 2, sample);
      fp.bytes(t.data + t.nbytes - sample, sample);
    }
  }
}

// A mixture of experts' tensors of the layer whose names start with `p`.
Status bind_experts(TensorBinder& binder, const LlamaHparams& hp, const std::string& p, MoeWeights& moe) {
  const gguf::GgufFile& f = binder.f;
  const uint64_t E = static_cast<uint64_t>(hp.n_embd);
  const uint64_t X = static_cast<uint64_t>(hp.n_expert);
  const uint64_t FE = static_cast<uint64_t>(hp.n_ff_exp);
  // Early Mixtral conversions stored one 2-D tensor per expert; llama.cpp
  // merges them at load. Not worth a second binding path: reconverting the
  // file (or llama-quantize, which rewrites them merged) fixes it.
  if (f.find_tensor(p + "ffn_gate.0.weight") != nullptr)
    return Status::invalid_argument(hp.arch + ": tensor '" + p +
                                    "ffn_gate.0.weight' is a legacy per-expert layout; not supported (convert the "
                                    "model again: current files store the experts as ffn_gate_exps)");
  SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_gate_inp.weight", E, X, moe.router));
  SPW_RETURN_IF_ERROR(binder.stacked(p + "ffn_gate_exps.weight", E, FE, X, moe.gate));
  SPW_RETURN_IF_ERROR(binder.stacked(p + "ffn_up_exps.weight", E, FE, X, moe.up));
  SPW_RETURN_IF_ERROR(binder.stacked(p + "ffn_down_exps.weight", FE, E, X, moe.down));
  if (hp.n_ff_shexp > 0) {
    const uint64_t FS = static_cast<uint64_t>(hp.n_ff_shexp);
    SPW_RETURN_IF_ERROR(binder.vector(p + "ffn_gate_inp_shexp.weight", E, moe.shared_router));
    SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_gate_shexp.weight", E, FS, moe.shared_gate));
    SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_up_shexp.weight", E, FS, moe.shared_up));
    SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_down_shexp.weight", FS, E, moe.shared_down));
  }
  return Status();
}

}  // namespace

Result<std::shared_ptr<const Model>> Model::load(Env& env, const std::string& path, const ModelLoadOptions& options) {
  SPW_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::open(env, path, MapOptions{options.prefault}));
  return load_from(std::move(file));
}

Result<std::shared_ptr<const Model>> Model::load_from(std::unique_ptr<gguf::GgufFile> file) {
  if (!file) return Status::invalid_argument("Model::load_from: null file");
  std::shared_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  SPW_RETURN_IF_ERROR(m->bind());
  return std::shared_ptr<const Model>(std::move(m));
}

Status Model::bind() {
  const gguf::GgufFile& f = *file_;
  SPW_ASSIGN_OR_RETURN(hp_, read_llama_hparams(f));  // refuses an architecture arch.h does not list
  const ArchSpec* spec = find_arch(hp_.arch);
  TensorBinder binder{f, n_params_, bytes_by_type_};

  const uint64_t E = static_cast<uint64_t>(hp_.n_embd);
  const uint64_t Q = static_cast<uint64_t>(hp_.n_embd_q());
  const uint64_t KV = static_cast<uint64_t>(hp_.n_embd_kv());
  const uint64_t HD = static_cast<uint64_t>(hp_.head_dim());
  const uint64_t FF = static_cast<uint64_t>(hp_.n_ff);
  const uint64_t V = static_cast<uint64_t>(hp_.n_vocab);
  SPW_RETURN_IF_ERROR(binder.matrix("token_embd.weight", E, V, tok_embd_));
  SPW_RETURN_IF_ERROR(binder.vector("output_norm.weight", E, output_norm_));
  if (f.find_tensor("output.weight") != nullptr) {
    SPW_RETURN_IF_ERROR(binder.matrix("output.weight", E, V, output_));
    output_tied_ = false;
  } else {
    output_ = tok_embd_;
    output_tied_ = true;
  }
  layers_.resize(static_cast<size_t>(hp_.n_layer));
  for (int32_t i = 0; i < hp_.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LlamaLayerWeights& L = layers_[static_cast<size_t>(i)];
    SPW_RETURN_IF_ERROR(binder.vector(p + "attn_norm.weight", E, L.attn_norm));
    if (spec->fused_qkv && f.find_tensor(p + "attn_qkv.weight") != nullptr) {
      WeightMatrix qkv;
      SPW_RETURN_IF_ERROR(binder.matrix(p + "attn_qkv.weight", E, Q + 2 * KV, qkv));
      bind_parts(*spec, hp_, qkv, {&L.wq, &L.wk, &L.wv});
    } else {
      SPW_RETURN_IF_ERROR(binder.matrix(p + "attn_q.weight", E, Q, L.wq));
      SPW_RETURN_IF_ERROR(binder.matrix(p + "attn_k.weight", E, KV, L.wk));
      SPW_RETURN_IF_ERROR(binder.matrix(p + "attn_v.weight", E, KV, L.wv));
    }
    SPW_RETURN_IF_ERROR(binder.matrix(p + "attn_output.weight", Q, E, L.wo));
    if (spec->qkv_bias) {
      SPW_RETURN_IF_ERROR(binder.vector(p + "attn_q.bias", Q, L.bq));
      SPW_RETURN_IF_ERROR(binder.vector(p + "attn_k.bias", KV, L.bk));
      SPW_RETURN_IF_ERROR(binder.vector(p + "attn_v.bias", KV, L.bv));
    }
    if (spec->qk_norm) {
      SPW_RETURN_IF_ERROR(binder.vector(p + "attn_q_norm.weight", HD, L.q_norm));
      SPW_RETURN_IF_ERROR(binder.vector(p + "attn_k_norm.weight", HD, L.k_norm));
    }
    SPW_RETURN_IF_ERROR(binder.vector(p + "ffn_norm.weight", E, L.ffn_norm));
    if (hp_.post_norms) {
      SPW_RETURN_IF_ERROR(binder.vector(p + "post_attention_norm.weight", E, L.post_attn_norm));
      SPW_RETURN_IF_ERROR(binder.vector(p + "post_ffw_norm.weight", E, L.post_ffn_norm));
    }
    if (hp_.moe()) {
      SPW_RETURN_IF_ERROR(bind_experts(binder, hp_, p, L.moe));
      const uint64_t used = static_cast<uint64_t>(hp_.n_expert_used);
      bytes_per_token_ += L.wq.nbytes() + L.wk.nbytes() + L.wv.nbytes() + L.wo.nbytes() + L.moe.router.nbytes() +
                          used * (L.moe.gate[0].nbytes() + L.moe.up[0].nbytes() + L.moe.down[0].nbytes()) +
                          L.moe.shared_gate.nbytes() + L.moe.shared_up.nbytes() + L.moe.shared_down.nbytes();
      continue;
    }
    if (spec->fused_gate_up) {
      WeightMatrix gate_up;
      SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_up.weight", E, 2 * FF, gate_up));
      bind_parts(*spec, hp_, gate_up, {&L.w_gate, &L.w_up});
    } else {
      SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_gate.weight", E, FF, L.w_gate));
      SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_up.weight", E, FF, L.w_up));
    }
    SPW_RETURN_IF_ERROR(binder.matrix(p + "ffn_down.weight", FF, E, L.w_down));
    bytes_per_token_ += L.wq.nbytes() + L.wk.nbytes() + L.wv.nbytes() + L.wo.nbytes() + L.w_gate.nbytes() +
                        L.w_up.nbytes() + L.w_down.nbytes();
  }
  bytes_per_token_ += output_.nbytes();
  // A multimodal model's image encoder and projector (llama.cpp keeps them
  // in a separate mmproj file; a merged file has them here).
  for (const auto& t : f.tensors()) {
    if (t.name.starts_with("v.") || t.name.starts_with("mm."))
      return Status::invalid_argument(hp_.arch + ": vision tower not supported (tensor '" + t.name +
                                      "'); text-only use works from the text model's file");
  }
  // Phi-3's 128k variants scale RoPE per frequency with two factor sets,
  // switched by the context length (LongRoPE), and rescale attention; none
  // of it is implemented, so such a file is refused rather than run wrong.
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    if (f.find_tensor(t) != nullptr)
      return Status::invalid_argument(hp_.arch + ": LongRoPE (tensor '" + std::string(t) +
                                      "') is not supported; the model's short-context (4k) variant works");
  }
  if (f.find_tensor("rope_freqs.weight") != nullptr) {
    SPW_RETURN_IF_ERROR(binder.vector("rope_freqs.weight", static_cast<uint64_t>(hp_.n_rot / 2), rope_freqs_));
    for (float factor : rope_freqs_) {
      if (!(factor > 0.0f)) return Status::corruption("tensor 'rope_freqs.weight' has a factor <= 0");
    }
  }

  SPW_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_gguf(f));
  tokenizer_ = std::move(tok);
  if (tokenizer_->n_vocab() > hp_.n_vocab)
    return Status::corruption("tokenizer has " + std::to_string(tokenizer_->n_vocab()) +
                              " tokens but token_embd.weight has " + std::to_string(hp_.n_vocab) + " rows");

  // Fingerprint (see header): metadata, tensor table, sampled tensor bytes.
  Fnv1a64 fp;
  hash_file(fp, f);
  std::string types_summary;
  for (const auto& [type, bytes] : bytes_by_type_) types_summary += (types_summary.empty() ? "" : ",") + type;
  const uint64_t gguf_hash = fp.value();
  fingerprint_hash_ = fp.u64(tokenizer_->fingerprint()).value();
  fingerprint_ = hp_.arch + ";size=" + std::to_string(f.file_size()) + ";gguf=" + hex64(gguf_hash) +
                 ";tok=" + hex64(tokenizer_->fingerprint()) + ";types=" + types_summary;
  return Status();
}

}  // namespace spw
