// Memory estimator: what a model + serving plan will need, by category and device,
// computed from the GGUF header alone (hparams + tensor table; no weight bytes are
// read), so admission control can decide before anything is allocated.
//
// Contract: estimate(file, plan, config) validates the plan against the model and
// returns an Estimate with, for each device (host, gpu), bytes per category:
//   weights   exact tensor-table bytes of the tensors that device holds. Layer
//             tensors (blk.N.*) go to the device running layer N; token_embd to
//             the embedding device (first stage); output_norm/output to the last
//             stage; a tied head (no output.weight) on a different device than
//             the embedding needs token_embd there too, so it is counted twice.
//             Other tensors go to the first stage (to the host when that is the
//             GPU: the Vulkan backend uploads nothing else). With
//             Plan::prefault (the default, as Model::load maps) the host's
//             figure is instead the whole mapping, page-rounded: every byte of
//             the file is resident whatever the placement (mapped_other says
//             how much of it the host does not compute with). GPU: what
//             VulkanBackend::prepare uploads, one buffer per tensor or per row
//             chunk (GpuLimits::weight_chunk_bytes), 1-D norms as F32 copies;
//             each buffer rounded up to the device alignment (allowance); host
//             weights are mapped in place.
//   kv        the KvPool(s) the plan allocates up front: per stage
//             Plan::kv_blocks, or n_parallel * ceil(n_ctx / kv_block_tokens), blocks of
//             bytes_per_block = block_tokens * 2 * n_stage_layers *
//             kv_row_bytes(kv_type, n_embd_kv) (4, 2 or 34/32 bytes an element
//             for f32, f16, q8_0; KvPool::create allocates exactly that as one
//             array), plus the pool's free-block stack (4 B per block) and object.
//             GPU (VulkanBackend::create_kv_pool): one K and one V buffer per
//             layer of n_blocks * block_tokens * kv_row_bytes(kv_type, n_embd_kv)
//             (f32 or f16: halves packed two per uint); the block stack and
//             pool object are host heap and counted in the host's kv.
//             Sliding-window layers (Gemma), where the window saves memory
//             (kv_window_blocks_per_seq > 0): their blocks are the window
//             plane's, n_parallel * kv_window_blocks_per_seq (capped by
//             Plan::kv_blocks) instead of the context's.
//   scratch   host: per-ubatch compute buffers, n_parallel sessions in flight
//             (a batched step of B <= n_parallel sequences holds at most
//             max(n_ubatch, B) rows: decode tokens plus prompt chunks, never
//             more than the B ubatches it stands for; checked by
//             bench/estimator_accuracy, whose parallel cases run every eval
//             through a batcher, prompts included)
//             (see ScratchTerms for each term and where in the engine it comes
//             from). GPU: the VulkanBackend's persistent Scratch buffers (see
//             GpuTerms), one set per backend (calls are serialised and every
//             session of the backend reuses them), sized for a batched step of
//             the n_parallel sessions.
//   logits    n_vocab floats per output row (host), see ScratchTerms::logits.
//             GPU: 0 (the device logits buffer is scratch, GpuTerms::io_logits).
//   overhead  fixed runtime overhead (configured per device) plus, on the host,
//             the model's heap: F32 copies of the norm vectors and the parsed
//             metadata/tokenizer (estimated from the metadata, see estimator.cpp);
//             on the GPU, the staging buffer weights are uploaded through
//             (GpuTerms::staging; alive only during prepare, but counted against
//             the device budget then).
// Every category also carries an `allowance` (fragmentation/alignment):
//   allowance = sum over its allocations of (round_up(size, alignment) - size),
//               where allocations >= page_threshold round to page_size instead
//               (glibc serves those with mmap), + fragmentation * bytes
// with alignment/page/fragmentation from DeviceCosts (weights get no percentage:
// they are exact). The allowance is the documented margin by which a measurement
// may exceed `bytes`; admission reserves bytes + allowance.
// GPU figures mirror the Vulkan backend's DeviceAllocator accounting (what
// VulkanBackend::memory_stats() reports per category: weights, kv, scratch and
// staging peaks), checked on lavapipe by estimator_vulkan_test. Driver-internal
// objects (pipelines, descriptor pool, command buffer) do not go through the
// allocator and are only covered by DeviceCosts::fixed_overhead.
// Placement: Plan::placement is resolved for the model (Placement::resolved)
// before anything is sized, as the engine runs it: hybrid:0 is estimated as
// cpu, hybrid:N with N >= n_layer as vulkan; Estimate::plan holds the
// resolved placement, so its name() is what serve reports.
// Errors: general.architecture other than "llama" -> InvalidArgument naming it;
// missing/invalid hparams -> the hparams reader's error; a bad plan value
// (n_ctx <= 0 after defaulting or > 1<<24, n_ubatch > n_batch, n_parallel < 1,
// a request longer than n_ctx, ...) -> InvalidArgument naming the field and
// value.
// Thread safety: pure functions over immutable inputs; Estimate is a value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/kv_type.h"
#include "core/placement.h"
#include "core/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace spw::admission {

// The KV element type is the engine's (core/kv_type.h), so a plan and the
// pools it describes spell it alike.
using spw::KvType;
using spw::kv_type_name;
enum class DeviceKind { kHost = 0, kGpu = 1 };
inline constexpr int kNumDeviceKinds = 2;

std::string_view device_kind_name(DeviceKind d);

// The layer a tensor belongs to by its GGUF name ("blk.N.*" -> N), or -1.
int32_t tensor_layer(const std::string& name);

struct Plan {
  // Where the layers run, as `--device` says (core/placement.h): cpu; vulkan
  // (every layer and the head on the GPU); hybrid:N, the first N layers on
  // the GPU, the remaining layers and the output head on the host, as the
  // engine places them (engine/device_session.h). The embedding lookup is the
  // host's on every placement (cpu::embed_tokens). Resolved for the model
  // (see Placement above); the Vulkan device selector is not used.
  spw::Placement placement = spw::Placement::cpu();
  int32_t n_ctx = 0;         // positions per sequence; 0 = the model's context_length
  int32_t n_batch = 512;     // tokens per eval call (rows of logits when logits_all)
  int32_t n_ubatch = 64;     // tokens per forward pass (Session's n_ubatch)
  int32_t n_parallel = 1;    // sequences (sessions) evaluated concurrently
  int32_t n_threads = 1;     // CPU backend threads (one attention row buffer each)
  // The KvPools' element type (KvPoolOptions::type), on every stage. The
  // library default is f32; `spillway serve` and the CLI default to f16.
  // q8_0 is CPU only (the Vulkan backend refuses it) and needs n_embd_kv and
  // head_dim multiples of 32; a plan against either is InvalidArgument.
  KvType kv_type = KvType::kF32;
  int32_t kv_block_tokens = 16;
  // KV pool capacity in blocks per stage; 0 = n_parallel full contexts (the
  // server's default, `serve --kv-blocks 0`).
  int32_t kv_blocks = 0;
  bool logits_all = false;   // eval_all_logits (every row) instead of eval (last row)
  // The model file is mapped prefaulted (ModelLoadOptions::prefault, the
  // default): the host holds the whole mapping resident, see `weights`.
  bool prefault = true;
};

// Per-device cost model. Defaults: see EstimatorConfig.
struct DeviceCosts {
  uint64_t fixed_overhead = 0;    // runtime bytes independent of the model
  uint64_t alignment = 64;        // every allocation rounds up to this
  uint64_t page_threshold = 0;    // allocations >= this round to page_size (0: never)
  uint64_t page_size = 4096;
  double fragmentation = 0.05;    // share of dynamic bytes (kv, scratch, logits, overhead)
  // Host: file-backed pages of code (this binary, libstdc++, the kernels'
  // ISA path) first touched when a model is loaded and run; they are not yet
  // in a baseline observed before loading. Part of `overhead`.
  uint64_t engine_code = 0;
};

// Limits of the Vulkan device the GPU side is sized for (VulkanContext's).
struct GpuLimits {
  // Largest buffer: min(maxStorageBufferRange, maxMemoryAllocationSize) & ~3.
  // Caps scratch buffers (the attention scores then run in token chunks).
  // 0 = no limit (the scores estimate is then the unchunked, larger figure).
  uint64_t max_buffer_bytes = 0;
  // Largest buffer of one weight tensor (VulkanBackendOptions::max_buffer_bytes;
  // larger tensors are split by rows). 0 = max_buffer_bytes.
  uint64_t weight_chunk_bytes = 0;
};

// What the host's kernels allocate that depends on the CPU kernel variant
// running them (backend/cpu/kernel_variant.h; admission does not include the
// backend, so whoever builds the config copies it from
// cpu::active_kernel_traits()).
struct HostKernels {
  // matmul's Q8_0 kernels take the kQ8_0x16 layout (the AVX-512 VNNI
  // variants): their activations carry m*(cols/32) more int32 (128 * sum of
  // each block's codes). The packed weights are the file's bytes, resident
  // instead of the mapping's pages (backend/cpu/packed_weights.h), so the
  // weights term does not change for Q8_0; Q4_K's packed records are 2.8%
  // larger (scales and mins unpacked).
  bool q8_0_x16 = false;
};

struct EstimatorConfig {
  // Host: glibc malloc; 64-byte rounding (16 B header + 16 B granularity, cache
  // line), mmap'd (page-rounded) from 128 KiB; 5% fragmentation. The fixed
  // overhead is the process before any model is loaded (binary, libraries,
  // allocator arenas, stacks): `spillway estimate` and the accuracy benchmark
  // set it to the RSS they observe; 8 MiB when nothing was observed. Engine
  // code: 1.5 MiB (what bench/estimator_accuracy leaves unexplained by the
  // categories on one thread: 0.83-0.94 MiB until 2026-12-04, 1.35-1.48 MiB once
  // the binary grew by the low-bit kernels, BPE and the architectures; x86-64).
  DeviceCosts host{8ull << 20, 64, 128ull << 10, 4096, 0.05, 3ull << 19};
  // GPU: every DeviceAllocator buffer is its own VkDeviceMemory of the size the
  // driver's vkGetBufferMemoryRequirements reports, so there is no
  // sub-allocation to fragment (0%); the allowance is the driver rounding a
  // buffer up to its alignment, 256 bytes (the largest minStorageBuffer-
  // OffsetAlignment in practice; lavapipe reports the requested size). No fixed
  // overhead: the driver's own objects do not count against the allocator's
  // budget; raise it to reserve for them on a shared heap.
  DeviceCosts gpu{0, 256, 0, 4096, 0.0};
  GpuLimits gpu_limits;
  HostKernels host_kernels;
};

// Bytes of one category on one device plus its documented allowance.
struct Amount {
  uint64_t bytes = 0;
  uint64_t allowance = 0;
  uint64_t n_allocations = 0;
  uint64_t with_allowance() const { return bytes + allowance; }
};

// Terms of the scratch and logits categories on one device, for ONE session
// (Estimate scales them to n_parallel sessions). m = n_ubatch, c = n_ctx, E =
// n_embd, KV = n_embd_kv, F = n_ff, V = n_vocab; activations are F32.
// A session's peak is the largest of three phases that never overlap:
//   forward  layer_activations + max(matmul_prep, attention_row + task_closure)
//            + (attention_workers - 1) * attention_row + 2 * tokens
//            (one forward_layers call; its matmuls and its attention do not
//            overlap, and pool workers hold one attention scratch each)
//   output   output_transient + logits_row + 2 * tokens (head; the new row)
//   append   logits_row + 3 * tokens         (tokens_ grows: old + new arrays)
// on top of what the session always holds: hidden + session_state (+ logits).
struct ScratchTerms {
  // Session::hidden_: m*E floats (host; a GPU stage also keeps a device copy).
  uint64_t hidden = 0;
  // The Session object and its stage/table vectors (a constant), and the
  // block-table ids, ceil(c/bt) per stage, doubled: KvPool::reserve
  // reallocates a table (old + new alive).
  uint64_t session_state = 0;
  // Session::tokens_ at full context: c ids. A vector that grows keeps up to
  // 2x its size, and 3x while it reallocates.
  uint64_t tokens = 0;
  // CpuBackend::forward_layers per call: cur (m*E), q, att (m*Q each), k, v
  // (m*KV each), gate, up (m*F each, F the widest FFN a layer computes:
  // LlamaHparams::ffn_width), rope cos/sin tables (m*n_rot/2 each), and for a
  // mixture of experts its scratch (moe_scratch_words), for Gemma 3 the
  // sliding layers' own cos/sin tables (m*n_rot/2 each). A GPU stage whose
  // mixture-of-experts FFNs run on the host (backend/vulkan/vulkan_backend.h),
  // without a CPU stage, holds the host side's instead: the rows, gate, up
  // and the mixture's scratch. activation_buffers lists the allocations
  // (their rounding is the allowance); layer_activations is their sum.
  uint64_t layer_activations = 0;
  std::vector<uint64_t> activation_buffers;
  // kernels' matmul_fused PreparedX, one alive at a time: m row pointers, and
  // the quantised activations of the matrix's type: for Q8_0 m*(cols/32)
  // BlockQ8_0 (34 B) + as many float scales + 2*m pointers; Q4_0/Q5_0 that
  // plus m ActRows (24 B); Q4_1/Q5_1 m*(cols/32) Q8_1 blocks (36 B) + two
  // floats each + m ActRows; K types m*(cols/256) Q8_K blocks (292 B) + m
  // ActRows (estimator.cpp prepared_act_bytes); the max over the stage's
  // matrices (cols = E or F); plus its unit table (4 x 8 B) and a thread-pool
  // task closure.
  uint64_t matmul_prep = 0;
  // A std::function closure handed to the thread pool (heap-allocated when the
  // lambda's captures exceed the small buffer); a constant upper bound.
  uint64_t task_closure = 0;
  // Attention (backend/cpu/attention.h): one scratch per concurrent worker,
  // 32 * (32 + head_dim + 2) floats whatever the context (a tile of 32 query
  // rows' scores over 32 positions, their outputs, running maxima and sums),
  // plus 2 * 32 * head_dim floats (a K and a V tile dequantised to F32) for a
  // Q8_0 pool (F32 and F16 rows are read in place). The backend runs attention on its thread pool only
  // when m*n_head*c*head_dim >= 2^15 and the pass has more than one (32-row
  // tile, head) item; otherwise inline on one thread.
  uint64_t attention_row = 0;      // bytes of one worker's scratch
  uint64_t attention_workers = 1;  // n_threads when parallel, else 1
  // CpuBackend::output per call: cur (rows*E) + PreparedX of the head, rows =
  // 1 (eval) or m (eval_all_logits).
  uint64_t output_transient = 0;
  // eval: the new logits row (V floats) computed while the last one is kept;
  // eval_all_logits writes into the caller's array (0).
  uint64_t logits_row = 0;
  // The logits category: what the session keeps between calls. eval: the
  // last row (V floats); eval_all_logits: n_batch rows + the last row.
  uint64_t logits = 0;

  uint64_t forward_phase() const {
    return layer_activations + std::max(matmul_prep, attention_row + task_closure) +
           (attention_workers - 1) * attention_row + 2 * tokens;
  }
  uint64_t output_phase() const { return output_transient + logits_row + 2 * tokens; }
  uint64_t append_phase() const { return logits_row + 3 * tokens; }
  uint64_t transient_peak() const;
  // One session's scratch category: hidden + session_state + transient_peak().
  uint64_t session_scratch() const { return hidden + session_state + transient_peak(); }
};

// Buffers of the VulkanBackend on the GPU (bytes each, as the allocator
// accounts them). m = the rows of one pass: max(n_ubatch, P) with P =
// n_parallel (a batched step: every session's decode token plus prompt chunks
// within n_ubatch, engine/step_batcher.h), c = n_ctx, E/KV/F/V as
// ScratchTerms, bt = kv_block_tokens. Scratch buffers only grow (Impl::ensure frees the old one
// first and allocates round_up(request, 64 KiB), capped at max_buffer_bytes but
// never below the request), each to the largest request of the run, so the
// category's peak is the sum of their largest sizes: the requests below at
// their worst case, a ubatch of m tokens ending at position c. Buffers a stage
// does not use are 0.
struct GpuTerms {
  // io_hidden and x (m*E floats: forward_layers' and output's input and
  // residual). The embedding lookup is the host's (cpu::embed_tokens): no
  // device buffer.
  uint64_t io_hidden = 0;
  uint64_t x = 0;
  // forward_batch: io_rope (2*m*max(n_rot/2, 1) floats), io_blocks (a row
  // table of 2*m ids, then the block tables of min(P, m) sequences, ceil(c/bt)
  // ids each), cur, q, att (m*E), k, v (m*KV), gate, up (m*F), the
  // quantised activations xq (m*(max(E,F)/32+1)*32 B) and xd (a quarter of that;
  // both allocated whatever the weight type, one pair for every format), and scores: n_head*c floats per token
  // for tc = min(m, max_buffer / (n_head*c*4)) tokens at a time.
  uint64_t io_rope = 0;
  uint64_t io_blocks = 0;
  uint64_t cur = 0, q = 0, att = 0, k = 0, v = 0, gate = 0, up = 0;
  uint64_t xq = 0, xd = 0;
  uint64_t scores = 0;
  // output (head on the GPU): io_logits, rows*V floats (rows = P, one per
  // sequence of a batched step, or m with logits_all); cur and, for a quantised head, xq/xd for rows*E are covered above
  // (forward's are at least as large) or sized here when larger.
  uint64_t io_logits = 0;
  // A mixture of experts on the device (not with +cpu-experts): router
  // (m*n_expert floats: its logits), io_route (host-visible: max(m*(n_expert
  // + 1), 2*(m*n_expert_used + m)) 4-byte words: the logits out, the routing
  // table in), xg and yg (m*E: an expert's gathered rows and outputs); gate
  // and up are then m*ffn_width, and xq/xd cover it. With +cpu-experts the
  // device holds no FFN buffer at all (gate, up 0).
  uint64_t router = 0, io_route = 0, xg = 0, yg = 0;
  // Gemma: post (m*E floats: a sublayer's output after its post-norm) and,
  // for Gemma 3's sliding layers, io_rope_local (host-visible, as io_rope).
  uint64_t post = 0, io_rope_local = 0;
  // A window plane's row table and block ids (host-visible; io_blocks' size).
  uint64_t io_window_blocks = 0;
  // Staging (category staging): upload() keeps one host-visible buffer of
  // min(largest upload, 8 MiB, max_buffer) bytes (rounded to 4), the largest
  // weight buffer of prepare, then frees it.
  uint64_t staging = 0;
  uint64_t n_buffers() const;
  uint64_t scratch() const;  // sum of the scratch buffers (not staging)
};

struct StageLayout {
  DeviceKind device = DeviceKind::kHost;
  int32_t layer_begin = 0;
  int32_t layer_end = 0;
  bool embedding = false;
  bool output = false;
};

struct DeviceEstimate {
  DeviceKind device = DeviceKind::kHost;
  bool used = false;  // the plan places something on this device
  Amount weights;
  Amount kv;
  Amount scratch;
  Amount logits;
  Amount overhead;
  ScratchTerms terms;               // per session, this device (host only; zero on the GPU)
  GpuTerms gpu_terms;               // GPU only
  uint64_t kv_bytes_per_token = 0;  // K+V of this device's layers
  uint64_t kv_bytes_per_block = 0;
  uint64_t kv_storage = 0;          // K/V arrays alone (n_blocks * bytes_per_block, + the window plane's)
  // Sliding-window layers in the window plane (kv_cache.h): their K+V of one
  // block, and the ring of blocks a sequence holds at most; a request's kv
  // is its blocks times kv_bytes_per_block plus min(blocks, that ring) times
  // kv_window_bytes_per_block. 0 without a window plane.
  uint64_t kv_window_bytes_per_block = 0;
  uint64_t kv_window_blocks_per_seq = 0;
  // Host, prefaulted mapping: the part of `weights` that is not tensors this
  // device computes with (header, padding, tensors another device holds).
  uint64_t mapped_other = 0;
  uint64_t allowance() const;
  uint64_t bytes() const;           // sum of categories without allowance
  uint64_t total() const { return bytes() + allowance(); }
};

// What one request adds on top of the resident model, per device: its KV blocks
// and one session's scratch + logits (the CPU backend allocates scratch per
// call, so it is per request, not resident; the GPU's scratch buffers are
// resident in the backend and already in Estimate's scratch, so the GPU's
// per-request scratch is 0). Where the KV pool is allocated up
// front for the plan (the CPU engine today: Estimate's kv), the blocks are
// already inside that and the admission check for them is the pool's free
// blocks; reserve `kv` in a ledger only for a pool that grows on demand.
struct RequestEstimate {
  int32_t prompt_tokens = 0;
  int32_t max_new_tokens = 0;
  int32_t tokens = 0;   // prompt + max new
  int32_t blocks = 0;   // per stage: ceil(tokens / kv_block_tokens)
  Amount kv[kNumDeviceKinds];
  Amount scratch[kNumDeviceKinds];  // one session's scratch + logits
  uint64_t total(DeviceKind d) const;
};

struct Estimate {
  Plan plan;  // with n_ctx defaulted and the placement resolved
  LlamaHparams hparams;
  EstimatorConfig config;
  std::vector<StageLayout> stages;
  DeviceEstimate devices[kNumDeviceKinds];
  uint64_t weights_total = 0;        // all tensor-table bytes (each tensor once)
  uint64_t kv_bytes_per_token = 0;   // all layers
  const DeviceEstimate& host() const { return devices[0]; }
  const DeviceEstimate& gpu() const { return devices[1]; }
  uint64_t total() const { return devices[0].total() + devices[1].total(); }

  // The KV + scratch a request of P prompt tokens and up to M new tokens adds
  // (block-rounded). InvalidArgument if P < 0, M < 0, P + M == 0 or > n_ctx.
  Result<RequestEstimate> request(int32_t prompt_tokens, int32_t max_new_tokens) const;
};

// The allowance rule above, for `bytes` in allocations of the given sizes.
uint64_t rounding_allowance(const DeviceCosts& costs, uint64_t allocation_bytes);

// Stage layout of a plan for a model with n_layer layers, its placement
// resolved first (so hybrid:0 is one host stage). Never fails today.
Result<std::vector<StageLayout>> plan_stages(const Plan& plan, int32_t n_layer);

Result<Estimate> estimate(const gguf::GgufFile& file, const Plan& plan, const EstimatorConfig& config = {});

}  // namespace spw::admission
