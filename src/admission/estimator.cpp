#include "admission/estimator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "model/arch.h"   // fused tensors' parts
#include "kv/kv_cache.h"    // the window plane
#include "model/model.h"  // packed_layout, layout_bytes

namespace spw::admission {

namespace {

constexpr int32_t kMaxCtx = 1 << 24;  // positions; beyond this the int32 maths of the engine is unsafe
constexpr uint64_t kF32 = sizeof(float);
// Heap bytes per tokenizer vocabulary entry beyond the piece text: the
// tokenizer's piece string object, id/score/type arrays and its piece->id
// index node. Calibrated against Model::load heap measurements
// (estimator_test ModelHeap) on SPM vocabularies; see overhead_model_heap
// (BPE vocabularies add kTokenizerBytesPerMerge).
constexpr uint64_t kTokenizerBytesPerToken = 112;
// Byte-level BPE vocabularies also keep a merge-rank index: per entry of
// tokenizer.ggml.merges its two halves as strings in a hash-map node (and the
// decoded piece per token). Measured on the tokenizer alone (mallinfo2 around
// Tokenizer::from_gguf) for the GPT-2, DeepSeek-LLM and Falcon vocabularies:
// 62-158 bytes per merge beyond the per-token term and twice the merge text;
// 100 puts the whole tokenizer estimate within 20% of the measured heap for
// all three (+18%, +16%, -19%).
constexpr uint64_t kTokenizerBytesPerMerge = 100;
// KvPool object + its shared_ptr control block (mutex, options, vectors).
constexpr uint64_t kKvPoolObject = 192;
// Session object (its vectors' headers, options) and per stage a SessionStage
// and an empty BlockTable; upper bounds of the libstdc++ sizes.
constexpr uint64_t kSessionObject = 256;
constexpr uint64_t kSessionPerStage = 96;
// matmul_fused: unit_begin table (n_outs + 1 int64, n_outs <= 3).
constexpr uint64_t kMatmulUnits = 32;
// A std::function closure of a [&] lambda handed to ThreadPool::parallel_for.
constexpr uint64_t kTaskClosure = 128;
// backend/cpu/attention.h: a worker's scratch is kAttnQueryTile rows of
// kAttnKvTile scores, head_dim outputs and a running maximum and sum; items
// are (tile of kAttnQueryTile rows, head). Mirrored here (admission does not
// link the backend); estimator_test measures the allocations against them.
constexpr uint64_t kAttnQueryTile = 32;
constexpr uint64_t kAttnKvTile = 32;
// std::map node overhead (red-black node header) in libstdc++.
constexpr uint64_t kMapNode = 32;

uint64_t round_up(uint64_t x, uint64_t a) { return a <= 1 ? x : (x + a - 1) / a * a; }

Status bad_plan(const std::string& field, int64_t value, const std::string& why) {
  return Status::invalid_argument("plan " + field + " = " + std::to_string(value) + ": " + why);
}

// Accumulates allocations of one category on one device.
struct Acc {
  const DeviceCosts* costs = nullptr;
  Amount a;
  void add(uint64_t bytes, uint64_t count = 1) {
    if (bytes == 0 || count == 0) return;
    a.bytes += bytes * count;
    a.allowance += rounding_allowance(*costs, bytes) * count;
    a.n_allocations += count;
  }
  // Closes the category: adds the percentage part.
  Amount finish(bool with_fragmentation) {
    if (with_fragmentation)
      a.allowance += static_cast<uint64_t>(std::ceil(static_cast<double>(a.bytes) * costs->fragmentation));
    return a;
  }
};

uint64_t string_heap(const std::string& s) { return s.size() > 15 ? s.size() + 1 : 0; }  // libstdc++ SSO

uint64_t value_heap(const gguf::Value& v) {
  if (const auto* s = std::get_if<std::string>(&v.v)) return string_heap(*s);
  if (const auto* a = std::get_if<gguf::Array>(&v.v)) {
    uint64_t n = a->items.size() * sizeof(gguf::Value);
    for (const auto& it : a->items) n += value_heap(it);
    return n;
  }
  return 0;
}

// Heap the host keeps for a loaded model besides the mapping: parsed metadata
// and tensor table (GgufFile), the tokenizer, the F32 norm copies.
void overhead_model_heap(const gguf::GgufFile& f, const LlamaHparams& hp, Acc& acc) {
  uint64_t meta = 0;
  for (const auto& [k, v] : f.metadata())
    meta += sizeof(std::pair<std::string, gguf::Value>) + 2 * string_heap(k) + sizeof(std::string) + 8 +
            kMapNode + value_heap(v);
  for (const auto& t : f.tensors())
    meta += sizeof(gguf::TensorInfo) + 2 * string_heap(t.name) + sizeof(std::string) + 8 + kMapNode;
  acc.add(meta);
  uint64_t tok = 0;
  if (const gguf::Value* v = f.find("tokenizer.ggml.tokens")) {
    if (const auto* a = std::get_if<gguf::Array>(&v->v)) {
      tok += a->items.size() * kTokenizerBytesPerToken;
      for (const auto& it : a->items)
        if (const auto* s = std::get_if<std::string>(&it.v)) tok += 2 * s->size();
    }
  }
  if (const gguf::Value* v = f.find("tokenizer.ggml.merges")) {
    if (const auto* a = std::get_if<gguf::Array>(&v->v)) {
      tok += a->items.size() * kTokenizerBytesPerMerge;
      for (const auto& it : a->items)
        if (const auto* s = std::get_if<std::string>(&it.v)) tok += 2 * s->size();
    }
  }
  acc.add(tok);
  // The vectors the model copies to F32: norms (attn, ffn, output, Qwen3's
  // per-head Q/K), Qwen2's Q/K/V biases, Llama 3's RoPE frequency factors,
  // Qwen2-MoE's shared-expert gate.
  for (const auto& t : f.tensors()) {
    const std::string_view name = t.name;
    if (t.n_dims == 1 && (name.ends_with("_norm.weight") || name.ends_with(".bias") || name == "rope_freqs.weight" ||
                          name.ends_with("_shexp.weight")))
      acc.add(t.ne[0] * kF32);
  }
}

// gemm.cpp's PreparedX for m activation rows against a matrix of `type`
// with `cols` columns, beyond the m row pointers (mirrors prepare_x):
//   Q8_0 weights: m*nb Q8_0 blocks (34 B) + m*nb float scales + 2*m pointers
//     (nb = cols/32), and with the kQ8_0x16 kernels (AVX-512 VNNI) m*nb int32
//     offsets (128 * each block's code sum);
//   Q4_0, Q5_0: the same Q8_0 activations + m ActRows (3 pointers each);
//   Q4_1, Q5_1: m*nb Q8_1 blocks (36 B) + 2*m*nb floats (d, s) + m ActRows;
//   Q4_K, Q5_K, Q6_K: m*(cols/256) Q8_K blocks (292 B) + m ActRows;
//   F32, F16: nothing.
// A fused call whose matrices mix Q8_0 with Q4_0/Q5_0 allocates the Q4_0 term,
// the largest, so the max over a stage's matrices still bounds it.
// The offsets exist only in the kernel variants with the kQ8_0x16 kernels
// (HostKernels::q8_0_x16). (Variant-specific scratch counted everywhere made
// the layer scratch of a Q8_0 model ~10% high on an AVX2-only AMD EPYC.)
uint64_t prepared_act_bytes(uint32_t type, uint64_t cols, uint64_t m, const HostKernels& k) {
  const uint64_t act_row = 3 * sizeof(void*);
  const uint64_t nb32 = cols / 32;
  switch (static_cast<gguf::GgmlType>(type)) {
    case gguf::GgmlType::kQ8_0:
      return m * nb32 * gguf::kQ8_0BlockBytes + m * nb32 * kF32 + 2 * m * sizeof(void*) +
             (k.q8_0_x16 ? m * nb32 * 4 : 0);
    case gguf::GgmlType::kQ4_0:
    case gguf::GgmlType::kQ5_0:
      return m * nb32 * gguf::kQ8_0BlockBytes + m * nb32 * kF32 + 2 * m * sizeof(void*) + m * act_row;
    case gguf::GgmlType::kQ4_1:
    case gguf::GgmlType::kQ5_1:
      return m * nb32 * 36 + 2 * m * nb32 * kF32 + m * act_row;
    case gguf::GgmlType::kQ4_K:
    case gguf::GgmlType::kQ5_K:
    case gguf::GgmlType::kQ6_K:
      return m * (cols / 256) * 292 + m * act_row;
    default:
      return 0;
  }
}

// Matrix tensors of layers [b, e) (only a mixture's router and experts when
// `experts_only`): (type, n_cols) pairs for the PreparedX term. An expert
// tensor (3-D) is matrices of ne[0] columns too.
uint64_t matmul_prep_bytes(const gguf::GgufFile& f, int32_t b, int32_t e, uint64_t rows_layers, const HostKernels& k,
                           bool experts_only = false) {
  uint64_t best = 0;
  auto consider = [&](const gguf::TensorInfo& t, uint64_t m) {
    if (t.n_dims < 2) return;
    best = std::max(best, m * sizeof(void*) + prepared_act_bytes(t.type, t.ne[0], m, k));
  };
  for (const auto& t : f.tensors()) {
    const int32_t l = tensor_layer(t.name);
    if (l >= b && l < e && (!experts_only || is_expert_tensor(t.name))) consider(t, rows_layers);
  }
  return best;
}

uint64_t output_prep_bytes(const gguf::GgufFile& f, uint64_t rows, const HostKernels& k) {
  const gguf::TensorInfo* t = f.find_tensor("output.weight");
  if (t == nullptr) t = f.find_tensor("token_embd.weight");
  if (t == nullptr) return 0;
  return rows * sizeof(void*) + prepared_act_bytes(t->type, t->ne[0], rows, k);
}

// VulkanBackend constants mirrored here (src/backend/vulkan/vulkan_backend.cpp).
constexpr uint64_t kVkScratchGranule = 64ull << 10;  // Impl::ensure rounding
constexpr uint64_t kVkStagingBytes = 8ull << 20;     // kStagingBytes
constexpr uint64_t kNoLimit = ~uint64_t{0} >> 2;

// DeviceAllocator::allocate's own rounding: 0 -> 4, then up to 4 bytes.
uint64_t vk_alloc_size(uint64_t bytes) { return bytes == 0 ? 4 : round_up(bytes, 4); }

// Size of a scratch buffer after Impl::ensure(bytes): 64 KiB granules, capped at
// the largest buffer but never below the request. 0 = never allocated.
uint64_t vk_scratch_size(uint64_t bytes, uint64_t max_buffer) {
  if (bytes == 0) return 0;
  uint64_t want = std::min(round_up(bytes, kVkScratchGranule), max_buffer);
  if (want < bytes) want = bytes;
  return vk_alloc_size(want);
}

// A stage's sliding-window layers kept in the window plane (kv_cache.h: the
// server's pools, engine/device_session.cpp): how many, and their blocks
// per sequence (0 and 0 when the plane saves nothing).
struct WindowPlane {
  uint64_t n_layers = 0;
  uint64_t per_seq = 0;
};
WindowPlane window_plane(const LlamaHparams& hp, const Plan& plan, const StageLayout& s) {
  const int32_t per_seq = kv_window_blocks_per_seq(hp.n_swa, plan.kv_block_tokens, plan.n_ubatch, plan.n_ctx);
  const auto n = static_cast<uint64_t>(hp.swa_layers(s.layer_begin, s.layer_end).size());
  if (per_seq == 0 || n == 0) return {};
  return {n, static_cast<uint64_t>(per_seq)};
}

// The GPU stage's buffers (see GpuTerms).
GpuTerms gpu_terms_for(const gguf::GgufFile& f, const LlamaHparams& hp, const Plan& plan, const StageLayout& s,
                       uint64_t max_buffer, uint64_t blocks_per_seq) {
  // A batched step of the path's sessions holds up to max(m, P) rows (its
  // decode tokens plus prompt chunks within m: engine/step_batcher.h), the
  // block tables of up to P sequences and one logits row per sequence.
  const uint64_t P = static_cast<uint64_t>(plan.n_parallel);
  const uint64_t m = std::max(static_cast<uint64_t>(plan.n_ubatch), P);
  const uint64_t c = static_cast<uint64_t>(plan.n_ctx);
  const uint64_t E = static_cast<uint64_t>(hp.n_embd);
  const uint64_t Q = static_cast<uint64_t>(hp.n_embd_q());
  const uint64_t KV = static_cast<uint64_t>(hp.n_embd_kv());
  // A mixture's FFN: its experts (ffn_width wide) on the device for some
  // layer of the stage, or none here (+cpu-experts[:K]).
  bool dev_experts = false;
  for (int32_t il = s.layer_begin; hp.moe() && il < s.layer_end; ++il)
    dev_experts = dev_experts || !plan.placement.experts_on_cpu(il);
  const uint64_t F =
      !hp.moe() ? static_cast<uint64_t>(hp.n_ff) : dev_experts ? static_cast<uint64_t>(hp.ffn_width()) : 0;
  const uint64_t V = static_cast<uint64_t>(hp.n_vocab);
  const uint64_t nh = static_cast<uint64_t>(hp.n_head);
  const uint64_t half = static_cast<uint64_t>(std::max(hp.n_rot / 2, 1));
  auto sz = [&](uint64_t bytes) { return vk_scratch_size(bytes, max_buffer); };
  GpuTerms g;
  uint64_t hidden_rows = 0, cur_rows = 0, xq_bytes = 0, xd_bytes = 0;
  if (s.layer_end > s.layer_begin) {
    hidden_rows = cur_rows = m;
    g.io_rope = sz(2 * m * half * kF32);
    if (hp.has_local_rope() && hp.n_rot >= 2) g.io_rope_local = g.io_rope;
    if (hp.post_norms) g.post = sz(m * E * kF32);
    // The row table (position and table offset per row), then the step's
    // sequences' block ids.
    g.io_blocks = sz((2 * m + std::min(P, m) * blocks_per_seq) * sizeof(int32_t));
    // The window plane's row table: its block ids span the context too (-1
    // where given back).
    if (window_plane(hp, plan, s).n_layers > 0) g.io_window_blocks = g.io_blocks;
    g.q = g.att = sz(m * Q * kF32);
    g.k = g.v = sz(m * KV * kF32);
    g.gate = g.up = sz(m * F * kF32);
    const uint64_t nb = std::max({E, F, Q}) / 32 + 1;
    xq_bytes = m * nb * 32;
    xd_bytes = m * nb * kF32;
    // Worst scores: a full ubatch ending at position c; chunked in tokens when
    // one ubatch's rows exceed the largest buffer (then at most max_buffer).
    const uint64_t row = nh * c * kF32;
    const uint64_t tc = std::max<uint64_t>(1, std::min<uint64_t>(m, max_buffer / std::max<uint64_t>(row, 1)));
    g.scores = tc < m ? vk_alloc_size(max_buffer) : sz(tc * row);
    if (dev_experts) {
      const uint64_t X = static_cast<uint64_t>(hp.n_expert), K = static_cast<uint64_t>(hp.n_expert_used);
      g.router = sz(m * X * kF32);
      g.io_route = sz(std::max(m * (X + 1), 2 * (m * K + m)) * 4);
      g.xg = g.yg = sz(m * E * kF32);
    }
  }
  if (s.output) {
    const uint64_t rows = plan.logits_all ? m : P;
    hidden_rows = std::max(hidden_rows, rows);
    cur_rows = std::max(cur_rows, rows);
    g.io_logits = sz(rows * V * kF32);
    const gguf::TensorInfo* head = f.find_tensor("output.weight");
    if (head == nullptr) head = f.find_tensor("token_embd.weight");
    // A quantised head (Q8_0, or Q6_K in a Q4_K_M file) quantises its input:
    // every format fits the same xq/xd (backend/vulkan: MatmulInput).
    if (head != nullptr && head->type != static_cast<uint32_t>(gguf::GgmlType::kF32) &&
        head->type != static_cast<uint32_t>(gguf::GgmlType::kF16)) {
      xq_bytes = std::max(xq_bytes, rows * (E / 32 + 1) * 32);
      xd_bytes = std::max(xd_bytes, rows * (E / 32 + 1) * kF32);
    }
  }
  g.io_hidden = g.x = sz(hidden_rows * E * kF32);
  g.cur = sz(cur_rows * E * kF32);
  g.xq = sz(xq_bytes);
  g.xd = sz(xd_bytes);
  return g;
}

// Scratch of `n_sessions` concurrent sessions on one device: each keeps its
// hidden + block tables; the phases of their passes overlap (worst case: all
// in the same phase); attention rows are `rows` in total. Buffers are added one
// by one so the rounding allowance counts each allocation.
Acc scratch_for(const ScratchTerms& t, const DeviceCosts& costs, uint64_t n_sessions) {
  Acc a;
  a.costs = &costs;
  a.add(t.hidden, n_sessions);
  a.add(t.session_state, n_sessions);
  // Only one session at a time is in a pool parallel region, so the extra
  // workers' rows count once.
  const uint64_t extra_rows = t.attention_workers - 1;
  const bool attention_larger = t.attention_row + t.task_closure > t.matmul_prep;
  const uint64_t fwd =
      t.layer_activations > 0 ? n_sessions * t.forward_phase() - (n_sessions - 1) * extra_rows * t.attention_row : 0;
  const uint64_t out = n_sessions * t.output_phase();
  const uint64_t app = n_sessions * t.append_phase();
  if (t.layer_activations > 0 && fwd >= out && fwd >= app) {
    for (uint64_t b : t.activation_buffers) a.add(b, n_sessions);
    if (attention_larger) {
      a.add(t.attention_row, n_sessions + extra_rows);
      a.add(t.task_closure, n_sessions);
    } else {
      a.add(t.matmul_prep, n_sessions);
      a.add(t.attention_row, extra_rows);
    }
    a.add(2 * t.tokens, n_sessions);
  } else if (out >= app) {
    a.add(t.output_transient, n_sessions);
    a.add(t.logits_row, n_sessions);
    a.add(2 * t.tokens, n_sessions);
  } else {
    a.add(t.logits_row, n_sessions);
    a.add(3 * t.tokens, n_sessions);
  }
  return a;
}

}  // namespace

int32_t tensor_layer(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  const char* b = name.data() + 4;
  const char* e = name.data() + name.size();
  int32_t v = -1;
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p == e || *p != '.') return -1;
  return v;
}

std::string_view device_kind_name(DeviceKind d) { return d == DeviceKind::kGpu ? "gpu" : "host"; }

uint64_t ScratchTerms::transient_peak() const {
  const uint64_t fwd = layer_activations > 0 ? forward_phase() : 0;
  return std::max({fwd, output_phase(), append_phase()});
}

namespace {
template <typename Fn>
void for_each_gpu_scratch(const GpuTerms& g, Fn fn) {
  for (uint64_t b : {g.io_hidden, g.x, g.io_rope, g.io_blocks, g.cur, g.q, g.att, g.k, g.v, g.gate, g.up,
                     g.xq, g.xd, g.scores, g.io_logits, g.router, g.io_route, g.xg, g.yg, g.post, g.io_rope_local,
                     g.io_window_blocks})
    fn(b);
}
}  // namespace

uint64_t GpuTerms::scratch() const {
  uint64_t n = 0;
  for_each_gpu_scratch(*this, [&](uint64_t b) { n += b; });
  return n;
}

uint64_t GpuTerms::n_buffers() const {
  uint64_t n = 0;
  for_each_gpu_scratch(*this, [&](uint64_t b) { n += b > 0 ? 1 : 0; });
  return n;
}

uint64_t DeviceEstimate::allowance() const {
  return weights.allowance + kv.allowance + scratch.allowance + logits.allowance + overhead.allowance;
}
uint64_t DeviceEstimate::bytes() const {
  return weights.bytes + kv.bytes + scratch.bytes + logits.bytes + overhead.bytes;
}

uint64_t RequestEstimate::total(DeviceKind d) const {
  const int i = static_cast<int>(d);
  return kv[i].with_allowance() + scratch[i].with_allowance();
}

uint64_t rounding_allowance(const DeviceCosts& c, uint64_t bytes) {
  if (bytes == 0) return 0;
  if (c.page_threshold > 0 && bytes >= c.page_threshold) return round_up(bytes, c.page_size) - bytes;
  return round_up(bytes, c.alignment) - bytes;
}

Result<std::vector<StageLayout>> plan_stages(const Plan& plan, int32_t n_layer) {
  std::vector<StageLayout> st;
  const Placement placement = plan.placement.resolved(n_layer);
  switch (placement.kind) {
    case Placement::Kind::kCpu:
    case Placement::Kind::kVulkan: {
      const DeviceKind d = placement.kind == Placement::Kind::kCpu ? DeviceKind::kHost : DeviceKind::kGpu;
      st.push_back({d, 0, n_layer, true, true});
      break;
    }
    case Placement::Kind::kHybrid: {
      // The engine's hybrid split (engine/device_session.h): layers [0, N)
      // on the GPU (its stage calls embed, whose lookup is the host's all the
      // same: cpu::embed_tokens), the rest and the output head on the host.
      // Resolved, so 1 <= N <= n_layer - 1.
      const int32_t split = placement.gpu_layers;
      st.push_back({DeviceKind::kGpu, 0, split, true, false});
      st.push_back({DeviceKind::kHost, split, n_layer, false, true});
      break;
    }
  }
  return st;
}

Result<RequestEstimate> Estimate::request(int32_t p, int32_t max_new) const {
  if (p < 0) return bad_plan("prompt_tokens", p, "must be >= 0");
  if (max_new < 0) return bad_plan("max_tokens", max_new, "must be >= 0");
  const int64_t n = static_cast<int64_t>(p) + max_new;
  if (n == 0) return bad_plan("prompt_tokens + max_tokens", 0, "must be > 0");
  if (n > plan.n_ctx)
    return bad_plan("prompt_tokens + max_tokens", n, "exceeds n_ctx = " + std::to_string(plan.n_ctx));
  RequestEstimate r;
  r.prompt_tokens = p;
  r.max_new_tokens = max_new;
  r.tokens = static_cast<int32_t>(n);
  r.blocks = (r.tokens + plan.kv_block_tokens - 1) / plan.kv_block_tokens;
  for (int d = 0; d < kNumDeviceKinds; ++d) {
    const DeviceEstimate& de = devices[d];
    if (!de.used) continue;
    const DeviceCosts& c = d == 0 ? config.host : config.gpu;
    // Blocks come from the resident pool; the per-request share carries the
    // pool's percentage allowance (no allocation of its own to round).
    // The window plane's share: the request's blocks up to its ring.
    r.kv[d].bytes = static_cast<uint64_t>(r.blocks) * de.kv_bytes_per_block +
                    std::min<uint64_t>(static_cast<uint64_t>(r.blocks), de.kv_window_blocks_per_seq) *
                        de.kv_window_bytes_per_block;
    r.kv[d].allowance = static_cast<uint64_t>(std::ceil(static_cast<double>(r.kv[d].bytes) * c.fragmentation));
    if (d != 0) continue;  // GPU scratch is resident in the backend (Estimate's scratch)
    Acc a = scratch_for(de.terms, c, 1);
    a.add(de.terms.logits);
    r.scratch[d] = a.finish(true);
  }
  return r;
}

namespace {

// The plan as the engine runs it (placement resolved, n_ctx defaulted), each
// field checked.
Result<Plan> resolve_plan(const Plan& plan_in, const LlamaHparams& hp) {
  Plan plan = plan_in;
  plan.placement = plan.placement.resolved(hp.n_layer);  // as the engine runs it
  if (plan.n_ctx == 0) plan.n_ctx = hp.n_ctx_train;
  if (plan.n_ctx <= 0 || plan.n_ctx > kMaxCtx) return bad_plan("n_ctx", plan.n_ctx, "must be in 1..2^24");
  if (plan.n_ubatch <= 0) return bad_plan("n_ubatch", plan.n_ubatch, "must be > 0");
  if (plan.n_batch <= 0) return bad_plan("n_batch", plan.n_batch, "must be > 0");
  if (plan.n_ubatch > plan.n_batch)
    return bad_plan("n_ubatch", plan.n_ubatch, "exceeds n_batch = " + std::to_string(plan.n_batch));
  if (plan.n_batch > plan.n_ctx)
    return bad_plan("n_batch", plan.n_batch, "exceeds n_ctx = " + std::to_string(plan.n_ctx));
  if (plan.n_parallel < 1 || plan.n_parallel > 4096) return bad_plan("n_parallel", plan.n_parallel, "must be 1..4096");
  if (plan.kv_blocks < 0) return bad_plan("kv_blocks", plan.kv_blocks, "must be >= 0 (0: n_parallel full contexts)");
  if (plan.n_threads < 1 || plan.n_threads > 1024) return bad_plan("n_threads", plan.n_threads, "must be 1..1024");
  if (plan.kv_block_tokens <= 0 || plan.kv_block_tokens > plan.n_ctx)
    return bad_plan("kv_block_tokens", plan.kv_block_tokens, "must be in 1..n_ctx");
  if (plan.placement.cpu_experts && !hp.moe())
    return Status::invalid_argument("plan placement " + plan.placement.name() + ": " + hp.arch +
                                    " model has no experts to put on the CPU");
  return plan;
}

// The KV type: what KvPool::create and VulkanBackend::create_kv_pool accept.
Status check_plan_kv_type(const Plan& plan, const LlamaHparams& hp, const std::vector<StageLayout>& stages) {
  const std::string kvt(kv_type_name(plan.kv_type));
  Status st = check_kv_type(plan.kv_type, hp.n_embd_kv(), hp.head_dim());
  if (!st.ok()) return Status::invalid_argument("plan kv_type: " + st.message());
  for (const auto& s : stages) {
    if (s.device != DeviceKind::kGpu) continue;
    st = check_device_kv_type(plan.kv_type, hp.n_embd_kv(), hp.head_dim());
    if (!st.ok()) return Status::invalid_argument("plan kv_type = " + kvt + ": " + st.message());
  }
  return Status::ok_status();
}

// The estimate's categories being summed, per device (index: DeviceKind).
struct DeviceAccs {
  Acc weights[kNumDeviceKinds], kv[kNumDeviceKinds], logits[kNumDeviceKinds], overhead[kNumDeviceKinds];
};

// Weights: each tensor on the device its layer (or role) runs on; returns the
// largest single upload to the GPU (the staging buffer's size rule).
uint64_t add_weights(const gguf::GgufFile& f, const LlamaHparams& hp, const Plan& plan, const EstimatorConfig& config,
                     uint64_t weight_chunk, Estimate& est, Acc (&weights)[kNumDeviceKinds]) {
  auto device_of_layer = [&](int32_t l) {
    for (const auto& s : est.stages)
      if (l >= s.layer_begin && l < s.layer_end) return s.device;
    return est.stages.front().device;
  };
  const DeviceKind out_dev = est.stages.back().device;
  const bool tied = f.find_tensor("output.weight") == nullptr;
  uint64_t largest_upload = 0;  // the GPU staging buffer's size rule
  // The rows of each part the model binds a tensor as (model/arch.h).
  const ArchSpec& arch = *find_arch(hp.arch);  // read_llama_hparams refused any other
  // A 3-D expert tensor is ne[2] matrices of ne[1] rows (model.h: MoeWeights).
  auto parts_of = [&](const gguf::TensorInfo& t) {
    if (t.n_dims == 3) return std::vector<int64_t>(t.ne[2], static_cast<int64_t>(t.ne[1]));
    return fused_parts(arch, hp, t.name, static_cast<int64_t>(std::max<uint64_t>(t.ne[1], 1)));
  };

  // Weights: exact tensor bytes. Host weights are used in place from the
  // mapping, so only a GPU copy pays per-buffer alignment. With the
  // kQ8_0x16 kernels (HostKernels::q8_0_x16) a host Q8_0 or Q4_K matrix of
  // 16k rows is a heap copy instead of its mapped pages, which go
  // (backend/cpu/packed_weights.h): the same bytes (Q4_K: 2.8% more), plus per matrix
  // about a page (the heap block's rounding, the mapping's pages shared with
  // the next tensor that stay), and a page more allowed.
  uint64_t host_packed = 0, host_packed_extra = 0;
  for (const auto& t : f.tensors()) {
    est.weights_total += t.nbytes;
    DeviceKind d;
    const int32_t l = tensor_layer(t.name);
    if (l >= 0 && l < hp.n_layer) {
      d = device_of_layer(l);
      // With +cpu-experts[:K] a mixture's router and experts (of layers
      // [0, K)) stay on the host (vulkan_backend.h).
      if (plan.placement.experts_on_cpu(l) && is_expert_tensor(t.name)) d = DeviceKind::kHost;
    }
    else if (t.name == "output.weight" || t.name == "output_norm.weight") d = out_dev;
    // token_embd (the lookup is the host's on every placement; a tied head
    // adds its copy below), rope_freqs.weight & co.: the Vulkan backend
    // uploads no others.
    else d = DeviceKind::kHost;
    // One row's bytes (a 3-D expert tensor: ne[2] parts of ne[1] rows each).
    const uint64_t row_bytes = t.nbytes / std::max<uint64_t>(t.ne[1] * (t.n_dims == 3 ? t.ne[2] : 1), 1);
    auto add_weight = [&](DeviceKind dev) {
      Acc& a = weights[static_cast<int>(dev)];
      if (dev != DeviceKind::kGpu) {
        a.a.bytes += t.nbytes;
        a.a.n_allocations += 1;
        // token_embd is a matrix the host multiplies by only as its own tied head.
        const bool matrix = t.name != "token_embd.weight" || (tied && out_dev == DeviceKind::kHost);
        if (dev != DeviceKind::kHost || !config.host_kernels.q8_0_x16 || !matrix || t.n_dims < 2) return;
        // Packed part by part (a fused tensor's parts are matrices of their own).
        const auto cols = static_cast<int64_t>(t.ne[0]);
        for (const int64_t rows : parts_of(t)) {
          const WeightLayout packed = packed_layout(static_cast<gguf::GgmlType>(t.type), rows);
          if (packed == WeightLayout::kGguf) continue;
          ++host_packed;
          const uint64_t bytes = static_cast<uint64_t>(rows) * row_bytes;
          host_packed_extra += layout_bytes(packed, rows, cols, bytes) - bytes;  // Q4_K's unpacked scales
        }
        return;
      }
      // VulkanBackend::prepare: vectors (norms) as F32 copies, matrices in
      // chunks of whole rows of at most weight_chunk bytes, one buffer each.
      if (t.n_dims < 2) {
        const uint64_t bytes = t.ne[0] * kF32;
        a.add(vk_alloc_size(bytes));
        largest_upload = std::max(largest_upload, bytes);
        return;
      }
      const uint64_t rows_per = std::max<uint64_t>(1, weight_chunk / std::max<uint64_t>(row_bytes, 1));
      // A fused tensor is uploaded part by part (model.h: its row ranges).
      for (const int64_t part : parts_of(t)) {
        const auto part_rows = static_cast<uint64_t>(part);
        for (uint64_t r0 = 0; r0 < part_rows; r0 += rows_per) {
          const uint64_t bytes = std::min(rows_per, part_rows - r0) * row_bytes;
          a.add(vk_alloc_size(bytes));
          largest_upload = std::max(largest_upload, bytes);
        }
      }
    };
    add_weight(d);
    // A tied head is token_embd's rows on the head's device (VulkanBackend::prepare uploads it as the head).
    if (t.name == "token_embd.weight" && tied && out_dev != DeviceKind::kHost) add_weight(out_dev);
  }
  // A prefaulted mapping is resident whole: the header and the tensors another
  // device holds too (the GPU's copies are uploads; the mapping stays, and is
  // what a CPU fallback of the same model runs from).
  if (plan.prefault) {
    Amount& hw = weights[0].a;
    const uint64_t mapped = round_up(f.file_size(), config.host.page_size);
    est.devices[0].mapped_other = mapped > hw.bytes ? mapped - hw.bytes : 0;
    hw.bytes = std::max(hw.bytes, mapped);
    hw.n_allocations = 1;
  }
  Amount& host = weights[static_cast<int>(DeviceKind::kHost)].a;
  // After the prefaulted mapping's max: these bytes are on the heap, beside it.
  host.bytes += host_packed * config.host.page_size + host_packed_extra;
  host.allowance += host_packed * config.host.page_size;
  // A packing pass's chunk in flight (model.h kPackChunkBytes): the prepare-
  // time peak sits above the settled RSS by up to about two (measured 0.1 to
  // 2.1 MiB, 2026-12-07; a 15M Q8_0 model's CPU case once failed its
  // accuracy row by 10 KiB without this).
  if (host_packed > 0) host.allowance += 2 * kPackChunkBytes;
  // A packed Q4_K model kept ~40-60 KiB per packed matrix of its dropped
  // pages resident (2026-12-07, 110M Q4_K_M: 4 MB of 40 MB; Q8_0 models
  // none). Not pinned down (the kernel's 64 KiB fault-around on a read near
  // a dropped range is the suspect): allowed, 64 KiB a matrix, not counted.
  if (host_packed_extra > 0) host.allowance += host_packed * (uint64_t{64} << 10);
  host.n_allocations += host_packed;
  return largest_upload;
}

// KV pools: one per stage, allocated whole by KvPool::create; on the GPU one
// K and one V buffer of kv_type rows per layer (VulkanBackend::create_kv_pool), with
// the pool's block stack and object on the host.
void add_kv_pools(const LlamaHparams& hp, const Plan& plan, uint64_t blocks_per_seq, Estimate& est,
                  Acc (&kv)[kNumDeviceKinds]) {
  const uint64_t KV = static_cast<uint64_t>(hp.n_embd_kv());
  const uint64_t P = static_cast<uint64_t>(plan.n_parallel);
  const uint64_t bt = static_cast<uint64_t>(plan.kv_block_tokens);
  for (const auto& s : est.stages) {
    const int d = static_cast<int>(s.device);
    const bool gpu = s.device == DeviceKind::kGpu;
    // The full plane's layers grow with the context; the window plane's
    // hold a ring of blocks per sequence.
    const WindowPlane w = window_plane(hp, plan, s);
    const uint64_t n_layers = static_cast<uint64_t>(s.layer_end - s.layer_begin) - w.n_layers;
    const uint64_t row = kv_row_bytes(plan.kv_type, KV);
    const uint64_t per_tok = 2 * n_layers * row;
    const uint64_t n_blocks = plan.kv_blocks > 0 ? static_cast<uint64_t>(plan.kv_blocks) : blocks_per_seq * P;
    const uint64_t n_window = plan.kv_blocks > 0 ? std::min(n_blocks, w.per_seq * P) : w.per_seq * P;
    DeviceEstimate& de = est.devices[d];
    de.kv_bytes_per_token += per_tok;
    de.kv_bytes_per_block += per_tok * bt;
    de.kv_window_bytes_per_block += 2 * w.n_layers * row * bt;
    de.kv_window_blocks_per_seq = std::max(de.kv_window_blocks_per_seq, w.per_seq);
    de.kv_storage += per_tok * bt * n_blocks + 2 * w.n_layers * row * bt * n_window;
    if (gpu) {
      if (n_layers > 0) kv[d].add(vk_alloc_size(n_blocks * bt * row), 2 * n_layers);
      if (w.n_layers > 0) kv[d].add(vk_alloc_size(n_window * bt * row), 2 * w.n_layers);
    } else {
      kv[d].add(per_tok * bt * n_blocks + 2 * w.n_layers * row * bt * n_window);
    }
    kv[0].add(n_blocks * sizeof(int32_t));  // the pool's free-block stack
    if (n_window > 0) kv[0].add(n_window * sizeof(int32_t));  // the window plane's
    kv[0].add(kKvPoolObject);
    est.kv_bytes_per_token += per_tok;
  }
}

// A GPU stage's mixture-of-experts FFNs run on the host (vulkan_backend.h):
// without a CPU stage (whose buffers are a superset, and whose stage holds
// the same shapes of matrices), the host's forward phase is that of
// VulkanBackend's host side: the rows, gate and up (ffn_width wide) and the
// mixture's scratch, and the PreparedX of the expert matrices. Priced per
// session as the CPU stage's are (the backend runs one pass at a time, so
// with several sessions this is an upper bound).
void add_host_experts_terms(const gguf::GgufFile& f, const LlamaHparams& hp, const Plan& plan,
                            const EstimatorConfig& config, Estimate& est) {
  if (!hp.moe() || !plan.placement.cpu_experts) return;
  const StageLayout* gpu = nullptr;
  for (const auto& s : est.stages) {
    if (s.layer_end <= s.layer_begin) continue;
    if (s.device == DeviceKind::kHost) return;  // a CPU stage's terms cover it
    gpu = &s;
  }
  if (gpu == nullptr) return;
  // The layers whose experts the host runs: all of the stage's, or [0, K).
  int32_t host_end = gpu->layer_begin;
  while (host_end < gpu->layer_end && plan.placement.experts_on_cpu(host_end)) ++host_end;
  if (host_end == gpu->layer_begin) return;
  const uint64_t m = static_cast<uint64_t>(plan.n_ubatch);
  const uint64_t E = static_cast<uint64_t>(hp.n_embd);
  const uint64_t F = static_cast<uint64_t>(hp.ffn_width());
  ScratchTerms& t = est.devices[0].terms;
  t.activation_buffers = {m * E * kF32, m * F * kF32, m * F * kF32,
                          static_cast<uint64_t>(moe_scratch_words(hp, static_cast<int64_t>(m))) * kF32};
  t.matmul_prep = matmul_prep_bytes(f, gpu->layer_begin, host_end, m, config.host_kernels, true) +
                  kMatmulUnits + kTaskClosure;
  t.task_closure = kTaskClosure;
  t.attention_row = 0;
  t.attention_workers = 1;
}

// Scratch, per device (terms per session; see ScratchTerms): a host stage's
// terms, a GPU stage's buffers, and the host-side session state.
void add_scratch_terms(const gguf::GgufFile& f, const LlamaHparams& hp, const Plan& plan, const EstimatorConfig& config,
                       uint64_t max_buffer, uint64_t blocks_per_seq, Estimate& est) {
  const uint64_t m = static_cast<uint64_t>(plan.n_ubatch);
  const uint64_t c = static_cast<uint64_t>(plan.n_ctx);
  const uint64_t E = static_cast<uint64_t>(hp.n_embd);
  const uint64_t Q = static_cast<uint64_t>(hp.n_embd_q());
  const uint64_t KV = static_cast<uint64_t>(hp.n_embd_kv());
  const uint64_t F = static_cast<uint64_t>(hp.ffn_width());
  const uint64_t V = static_cast<uint64_t>(hp.n_vocab);
  const uint64_t half = static_cast<uint64_t>(hp.n_rot / 2);
  const uint64_t T = static_cast<uint64_t>(plan.n_threads);
  const uint64_t out_rows = plan.logits_all ? m : 1;
  const int n_stages = static_cast<int>(est.stages.size());
  const uint64_t hd = static_cast<uint64_t>(hp.head_dim());
  const uint64_t nh = static_cast<uint64_t>(hp.n_head);
  for (const auto& s : est.stages) {
    const int d = static_cast<int>(s.device);
    if (s.device == DeviceKind::kGpu) {
      est.devices[d].gpu_terms = gpu_terms_for(f, hp, plan, s, max_buffer, blocks_per_seq);
      continue;
    }
    ScratchTerms& t = est.devices[d].terms;
    t.activation_buffers = {m * E * kF32,    m * Q * kF32,    m * Q * kF32,    m * KV * kF32,   m * KV * kF32,
                            m * F * kF32,    m * F * kF32,    m * half * kF32, m * half * kF32};
    if (hp.moe()) t.activation_buffers.push_back(static_cast<uint64_t>(moe_scratch_words(hp, int64_t(m))) * kF32);
    if (hp.has_local_rope()) {  // Gemma 3's sliding layers' RoPE rows
      t.activation_buffers.push_back(m * half * kF32);
      t.activation_buffers.push_back(m * half * kF32);
    }
    t.matmul_prep =
        matmul_prep_bytes(f, s.layer_begin, s.layer_end, m, config.host_kernels) + kMatmulUnits + kTaskClosure;
    t.task_closure = kTaskClosure;
    // Per attention worker: one scratch allocation (attention.h), whatever
    // the context, plus two tiles of this head's K and V slices dequantised
    // to F32 for a Q8_0 pool (F32 and F16 rows are read in place). The pool runs the pass when it has more
    // than one item (ceil(m / kAttnQueryTile) tiles x heads) and work >= 2^15
    // (worst ubatch: the last one of the context).
    t.attention_row = (kAttnQueryTile * (kAttnKvTile + hd + 2) +
                       (plan.kv_type == KvType::kQ8_0 ? 2 * kAttnKvTile * hd : 0)) * kF32;
    const uint64_t items = (m + kAttnQueryTile - 1) / kAttnQueryTile * nh;
    const bool parallel = T > 1 && items > 1 && m * nh * c * hd >= (1u << 15);
    t.attention_workers = parallel ? T : 1;
    if (s.output) t.output_transient = out_rows * E * kF32 + output_prep_bytes(f, out_rows, config.host_kernels);
  }
  {
    // Host-side session state: hidden_, tokens_, block tables, logits.
    ScratchTerms& h = est.devices[0].terms;
    h.hidden = m * E * kF32;
    h.session_state = kSessionObject + static_cast<uint64_t>(n_stages) * kSessionPerStage +
                      2 * static_cast<uint64_t>(n_stages) * blocks_per_seq * sizeof(int32_t);
    for (const auto& st : est.stages) {  // a window plane's block ids and spare list
      const WindowPlane w = window_plane(hp, plan, st);
      if (w.n_layers > 0) h.session_state += (blocks_per_seq + w.per_seq) * sizeof(int32_t);
    }
    h.tokens = c * sizeof(int32_t);
    h.logits_row = plan.logits_all ? 0 : V * kF32;
    h.logits = (plan.logits_all ? static_cast<uint64_t>(plan.n_batch) + 1 : 1) * V * kF32;
    est.devices[0].used = true;  // the session always lives on the host
  }
  add_host_experts_terms(f, hp, plan, config, est);
  for (auto& de : est.devices) {
    de.terms.layer_activations = 0;
    for (uint64_t b : de.terms.activation_buffers) de.terms.layer_activations += b;
  }
}

// Closes each used device's categories: scratch from its terms (the GPU's
// staging buffer counted as overhead), logits, weights, KV, fixed overhead and
// the host's model heap.
void close_devices(const gguf::GgufFile& f, const LlamaHparams& hp, const Plan& plan, const EstimatorConfig& config,
                   uint64_t largest_upload, uint64_t max_buffer, DeviceAccs& acc, Estimate& est) {
  const uint64_t P = static_cast<uint64_t>(plan.n_parallel);
  for (int d = 0; d < kNumDeviceKinds; ++d) {
    DeviceEstimate& de = est.devices[d];
    if (!de.used) continue;
    const DeviceCosts& costs = d == 0 ? config.host : config.gpu;
    const ScratchTerms& t = de.terms;
    if (d == 0) {
      de.scratch = scratch_for(t, costs, P).finish(true);
    } else {
      // The backend's persistent buffers, shared by every session on it.
      Acc a;
      a.costs = &costs;
      for_each_gpu_scratch(de.gpu_terms, [&](uint64_t b) { a.add(b); });
      de.scratch = a.finish(true);
      de.gpu_terms.staging =
          largest_upload > 0 ? vk_alloc_size(std::min(largest_upload, std::min(kVkStagingBytes, max_buffer))) : 0;
      acc.overhead[d].add(de.gpu_terms.staging);
    }
    acc.logits[d].add(t.logits, P);
    de.logits = acc.logits[d].finish(true);
    de.weights = acc.weights[d].finish(false);
    de.kv = acc.kv[d].finish(true);
    acc.overhead[d].add(costs.fixed_overhead);
    acc.overhead[d].add(costs.engine_code);
    if (d == 0) overhead_model_heap(f, hp, acc.overhead[d]);
    de.overhead = acc.overhead[d].finish(true);
  }
}

}  // namespace

Result<Estimate> estimate(const gguf::GgufFile& f, const Plan& plan_in, const EstimatorConfig& config) {
  SPW_ASSIGN_OR_RETURN(LlamaHparams hp, read_llama_hparams(f));  // refuses an unknown architecture
  SPW_ASSIGN_OR_RETURN(const Plan plan, resolve_plan(plan_in, hp));

  Estimate est;
  est.plan = plan;
  est.hparams = hp;
  est.config = config;
  SPW_ASSIGN_OR_RETURN(est.stages, plan_stages(plan, hp.n_layer));
  SPW_RETURN_IF_ERROR(check_plan_kv_type(plan, hp, est.stages));

  const uint64_t c = static_cast<uint64_t>(plan.n_ctx);
  const uint64_t blocks_per_seq = (c + static_cast<uint64_t>(plan.kv_block_tokens) - 1) /
                                  static_cast<uint64_t>(plan.kv_block_tokens);

  DeviceAccs acc;
  for (int d = 0; d < kNumDeviceKinds; ++d) {
    const DeviceCosts* costs = d == 0 ? &config.host : &config.gpu;
    acc.weights[d].costs = acc.kv[d].costs = acc.logits[d].costs = acc.overhead[d].costs = costs;
    est.devices[d].device = static_cast<DeviceKind>(d);
  }
  for (const auto& s : est.stages) est.devices[static_cast<int>(s.device)].used = true;

  const uint64_t max_buffer =
      config.gpu_limits.max_buffer_bytes > 0 ? (config.gpu_limits.max_buffer_bytes & ~uint64_t{3}) : kNoLimit;
  const uint64_t weight_chunk = config.gpu_limits.weight_chunk_bytes > 0
                                    ? std::min(max_buffer, config.gpu_limits.weight_chunk_bytes & ~uint64_t{3})
                                    : max_buffer;
  const uint64_t largest_upload = add_weights(f, hp, plan, config, weight_chunk, est, acc.weights);
  add_kv_pools(hp, plan, blocks_per_seq, est, acc.kv);
  add_scratch_terms(f, hp, plan, config, max_buffer, blocks_per_seq, est);
  close_devices(f, hp, plan, config, largest_upload, max_buffer, acc, est);
  return est;
}

}  // namespace spw::admission
