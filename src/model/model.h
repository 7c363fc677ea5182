// Model: immutable llama weights bound in place from a GGUF mapping.
//
// Contract: Model::load opens the GGUF (mmap), checks general.architecture is
// one of model/arch.h's (else InvalidArgument naming it and the supported
// ones), reads and validates LlamaHparams (with the architecture's RoPE style),
// builds the tokenizer from the file's vocab, and binds every weight tensor by
// name with its expected shape and type:
//   - a missing tensor is NotFound naming it;
//   - a wrong shape is Corruption naming the tensor, expected and actual dims;
//   - a matrix type other than F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
//     Q5_K or Q6_K (the `supported` types of gguf/ggml_types.h) is
//     InvalidArgument naming the tensor and its type; norm vectors must be
//     F32 or F16;
//   - a matrix whose row length is not a multiple of its type's block (32, or
//     256 for the K types) is Corruption naming the tensor, type and block.
// Files mixing matrix types (llama.cpp's Q4_K_M puts Q6_K in output.weight
// and some attn_v / ffn_down) bind each tensor with its own type.
// The architecture's optional tensors (biases, Q/K norms, Gemma's
// post_attention_norm / post_ffw_norm) are required when it has them; a
// vision tower's tensors (v.*, mm.*) are refused by name (text-only use of
// the model works from a file without them); a mixture of experts binds ffn_gate_inp, the 3-D
// ffn_{gate,up,down}_exps ([cols, rows, n_expert], one WeightMatrix per
// expert) and, with a shared expert, ffn_{gate,up,down}_shexp and
// ffn_gate_inp_shexp (MoeWeights); the legacy per-expert tensors
// (blk.N.ffn_gate.0.weight) are InvalidArgument naming one; a fused tensor (phi3's attn_qkv, its gate+up ffn_up) is bound as
// row ranges, one WeightMatrix per part, pointing into it. rope_freqs.weight
// is bound when present; LongRoPE's rope_factors_long/short are refused
// (InvalidArgument naming the tensor). Without output.weight the
// output head is tied to token_embd.weight. Matrix
// weights are used in place from the mapping (no copy); the small norm vectors
// are converted to F32 copies. The GgufFile stays alive as long as the Model.
// Thread safety: a Model is immutable after load; share it (shared_ptr<const
// Model>) between any number of sessions and threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "tokenizer/tokenizer.h"

namespace spw {

// How a weight matrix's bytes are laid out. A Model binds every matrix as
// kGguf; the CPU backend may hold another layout of the same values
// (backend/cpu/packed_weights.h) and hands its kernels a WeightMatrix that
// says so. Every other reader (the Vulkan upload, dequantize_row) takes kGguf.
enum class WeightLayout : uint8_t {
  kGguf,      // n_rows rows of row_bytes each, as in the file
  kQ8_0x16,   // Q8_0 in groups of 16 rows, VNNI-interleaved (packed_weights.h)
  kQ4_Kx16,   // Q4_K likewise, scales and mins unpacked (packed_weights.h)
};

// The packed layouts' records: 16 rows x one block (Q8_0: 16 x 34 bytes, the
// file's) or one super-block (Q4_K: 64 bytes more than the file's 16 x 144).
inline constexpr int64_t kPackedGroupRows = 16;
inline constexpr size_t kQ8_0x16RecordBytes = 544;
inline constexpr size_t kQ4_Kx16RecordBytes = 2368;
// Rows a packing pass converts before it drops their file pages
// (backend/cpu/packed_weights.cpp): while a chunk is in flight its packed
// copy and its mapped rows are both resident, so the estimator allows two
// chunks beside a packed model's settled RSS.
inline constexpr size_t kPackChunkBytes = size_t{256} << 10;

// The packed layout of a matrix of `type` with `n_rows` rows, kGguf where the
// type has none: the CPU's AVX-512 VNNI kernels compute from it where their
// variant runs (backend/cpu/packed_weights.h), and the estimator prices it.
inline WeightLayout packed_layout(gguf::GgmlType type, int64_t n_rows) {
  if (n_rows <= 0 || n_rows % kPackedGroupRows != 0) return WeightLayout::kGguf;
  if (type == gguf::GgmlType::kQ8_0) return WeightLayout::kQ8_0x16;
  if (type == gguf::GgmlType::kQ4_K) return WeightLayout::kQ4_Kx16;
  return WeightLayout::kGguf;
}

// Bytes of a matrix of n_rows x n_cols in `layout`, whose file layout takes
// `file_bytes`.
inline uint64_t layout_bytes(WeightLayout layout, int64_t n_rows, int64_t n_cols, uint64_t file_bytes) {
  if (layout != WeightLayout::kQ4_Kx16) return file_bytes;
  return static_cast<uint64_t>(n_rows / kPackedGroupRows * (n_cols / 256)) * kQ4_Kx16RecordBytes;
}

// A 2-D weight matrix as stored: n_rows rows of n_cols elements (ggml ne[0] =
// n_cols is contiguous). `data` points into the model's mapping (kGguf).
struct WeightMatrix {
  const uint8_t* data = nullptr;
  gguf::GgmlType type = gguf::GgmlType::kF32;
  int64_t n_cols = 0;     // ne[0]
  int64_t n_rows = 0;     // ne[1]
  size_t row_bytes = 0;   // bytes of one row (of the kGguf layout: the same total in every layout)
  const std::string* name = nullptr;  // tensor name (owned by the GgufFile)
  WeightLayout layout = WeightLayout::kGguf;
  size_t nbytes() const { return row_bytes * static_cast<size_t>(n_rows); }
};

// Data a backend derives from a Model's weights and keeps as long as the
// Model lives (the CPU backend's repacked matrices), shared by every
// session of that Model. Model::extension() holds one per key.
class ModelExtension {
 public:
  virtual ~ModelExtension() = default;
};
enum class ModelExtensionKey : uint8_t { kCpuPackedWeights, kCount };

// A mixture-of-experts FFN (model/arch.h). Expert e's matrices are rows
// [e * rows, (e + 1) * rows) of the 3-D ffn_{gate,up,down}_exps tensors,
// bound as matrices of their own pointing into them (an expert's rows never
// share a block), so every kernel and layout sees plain matrices.
struct MoeWeights {
  WeightMatrix router;                       // ffn_gate_inp [n_expert rows][n_embd]
  std::vector<WeightMatrix> gate, up, down;  // n_expert each: [n_ff_exp][n_embd], ..., [n_embd][n_ff_exp]
  // qwen2moe's shared expert; n_rows 0 / empty when the architecture has none.
  WeightMatrix shared_gate, shared_up, shared_down;  // [n_ff_shexp][n_embd], ..., [n_embd][n_ff_shexp]
  std::vector<float> shared_router;                  // ffn_gate_inp_shexp [n_embd]
};

struct LlamaLayerWeights {
  std::vector<float> attn_norm;  // [n_embd]
  WeightMatrix wq;               // [n_embd_q rows][n_embd cols]
  WeightMatrix wk;               // [n_embd_kv][n_embd]
  WeightMatrix wv;               // [n_embd_kv][n_embd]
  WeightMatrix wo;               // [n_embd][n_embd_q]
  // Optional parts (model/arch.h); empty when the architecture has none.
  std::vector<float> bq, bk, bv;       // [n_embd_q], [n_embd_kv], [n_embd_kv]
  std::vector<float> q_norm, k_norm;   // [head_dim]
  // Gemma: RMSNorm weights of the attention's and the FFN's outputs.
  std::vector<float> post_attn_norm, post_ffn_norm;  // [n_embd]
  std::vector<float> ffn_norm;   // [n_embd]
  WeightMatrix w_gate;           // ffn_gate [n_ff][n_embd]
  WeightMatrix w_up;             // ffn_up   [n_ff][n_embd]
  WeightMatrix w_down;           // ffn_down [n_embd][n_ff]
  // A mixture of experts instead of w_gate/w_up/w_down (which stay empty).
  MoeWeights moe;
  bool is_moe() const { return !moe.gate.empty(); }

  // Calls f(const WeightMatrix&) for every matrix of the layer, the
  // experts' included (each expert's gate, up, down, in expert order): the
  // one list of what a backend packs, uploads or checks.
  template <typename F>
  void for_each_matrix(F&& f) const {
    for (const WeightMatrix* w : {&wq, &wk, &wv, &wo}) f(*w);
    if (!is_moe()) {
      for (const WeightMatrix* w : {&w_gate, &w_up, &w_down}) f(*w);
      return;
    }
    f(moe.router);
    for (size_t e = 0; e < moe.gate.size(); ++e) {
      f(moe.gate[e]);
      f(moe.up[e]);
      f(moe.down[e]);
    }
    if (moe.shared_gate.n_rows > 0)
      for (const WeightMatrix* w : {&moe.shared_gate, &moe.shared_up, &moe.shared_down}) f(*w);
  }
};

struct ModelLoadOptions {
  // Map the whole file resident now (MapOptions::prefault). Serving wants the
  // weights' pages in before the first request, so that a request never waits
  // on page faults and the RSS the host ledger observes already includes them
  // (the estimator counts them resident). Off only for tools that read a few
  // tensors of a large file.
  bool prefault = true;
};

class Model {
 public:
  static Result<std::shared_ptr<const Model>> load(Env& env, const std::string& path,
                                                   const ModelLoadOptions& options = {});
  static Result<std::shared_ptr<const Model>> load_from(std::unique_ptr<gguf::GgufFile> file);

  const LlamaHparams& hparams() const { return hp_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::GgufFile& file() const { return *file_; }

  const WeightMatrix& tok_embd() const { return tok_embd_; }  // [n_vocab rows][n_embd]
  const std::vector<float>& output_norm() const { return output_norm_; }
  const WeightMatrix& output() const { return output_; }      // [n_vocab][n_embd]; tied -> tok_embd
  bool output_tied() const { return output_tied_; }
  const LlamaLayerWeights& layer(int32_t i) const { return layers_[static_cast<size_t>(i)]; }
  // Llama 3's RoPE frequency factors (rope_freqs.weight, [n_rot/2]): each
  // frequency is divided by its factor. Empty when the file has none.
  const std::vector<float>& rope_freq_factors() const { return rope_freqs_; }

  // Number of weight elements over all bound tensors (tied output counted once).
  int64_t n_params() const { return n_params_; }
  // Bytes of bound tensors by ggml type name ("F32" -> bytes).
  const std::map<std::string, uint64_t>& bytes_by_type() const { return bytes_by_type_; }
  // Weight bytes one decoded token streams: all layer matrices + output head
  // (embedding lookup reads one row only); of a mixture of experts, the
  // router, n_expert_used experts (the average expert's bytes) and the
  // shared expert. Used for bandwidth estimates.
  uint64_t weight_bytes_per_token() const { return bytes_per_token_; }

  // Compatibility fingerprint: two models with equal fingerprints produce the
  // same tokens. Covers file size, a hash of all metadata and the tensor table,
  // samples of every tensor's bytes (start/middle/end), the tokenizer
  // fingerprint and the tensor types. Not a full-file hash (that would read
  // every weight at load); documented trade-off.
  const std::string& fingerprint() const { return fingerprint_; }
  uint64_t fingerprint_hash() const { return fingerprint_hash_; }

  // The extension under `key`, made by `make` on the first call (under a
  // lock: concurrent first calls make one). The weights stay immutable; an
  // extension is derived data with its own thread safety.
  template <typename Make>
  ModelExtension& extension(ModelExtensionKey key, Make make) const {
    std::lock_guard<std::mutex> lock(ext_mu_);
    auto& slot = extensions_[static_cast<size_t>(key)];
    if (!slot) slot = make();
    return *slot;
  }

 private:
  Model() = default;
  Status bind();

  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  LlamaHparams hp_;
  WeightMatrix tok_embd_;
  std::vector<float> output_norm_;
  WeightMatrix output_;
  bool output_tied_ = false;
  std::vector<LlamaLayerWeights> layers_;
  std::vector<float> rope_freqs_;
  int64_t n_params_ = 0;
  std::map<std::string, uint64_t> bytes_by_type_;
  uint64_t bytes_per_token_ = 0;
  std::string fingerprint_;
  uint64_t fingerprint_hash_ = 0;
  mutable std::mutex ext_mu_;
  mutable std::unique_ptr<ModelExtension> extensions_[static_cast<size_t>(ModelExtensionKey::kCount)];
};

}  // namespace spw
