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
//             Other tensors go to the first stage. GPU: each tensor rounded up to
//             the device alignment (allowance); host weights are mapped in place.
//   kv        the KvPool(s) the plan allocates up front: per stage
//             n_parallel * ceil(n_ctx / kv_block_tokens) blocks of
//             bytes_per_block = block_tokens * 2 * n_stage_layers * n_embd_kv *
//             sizeof(kv_type) (KvPool::create allocates exactly that).
//   scratch   per-ubatch compute buffers, n_parallel sessions in flight (see
//             ScratchTerms for each term and where in the engine it comes from).
//   logits    n_vocab floats per output row (host), see ScratchTerms::logits.
//   overhead  fixed runtime overhead (configured per device) plus, on the host,
//             the model's heap: F32 copies of the norm vectors and the parsed
//             metadata/tokenizer (estimated from the metadata, see estimator.cpp).
// Every category also carries an `allowance` (fragmentation/alignment):
//   allowance = sum over its allocations of (round_up(size, alignment) - size),
//               where allocations >= page_threshold round to page_size instead
//               (glibc serves those with mmap), + fragmentation * bytes
// with alignment/page/fragmentation from DeviceCosts (weights get no percentage:
// they are exact). The allowance is the documented margin by which a measurement
// may exceed `bytes`; admission reserves bytes + allowance.
// The estimate of the GPU side (and hence of hybrid plans) mirrors the CPU
// backend's buffers and is provisional until the Vulkan allocator exists.
// Errors: general.architecture other than "llama" -> InvalidArgument naming it;
// missing/invalid hparams -> the hparams reader's error; a bad plan value
// (n_ctx <= 0 after defaulting or > 1<<24, n_ubatch > n_batch, n_parallel < 1,
// hybrid layers outside [1, n_layer-1], a request longer than n_ctx, ...) ->
// InvalidArgument naming the field and value.
// Thread safety: pure functions over immutable inputs; Estimate is a value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace spw::admission {

enum class Placement { kCpu, kGpu, kHybrid };
enum class KvType { kF32, kF16 };
enum class DeviceKind { kHost = 0, kGpu = 1 };
inline constexpr int kNumDeviceKinds = 2;

std::string_view placement_name(Placement p);
std::string_view kv_type_name(KvType t);
std::string_view device_kind_name(DeviceKind d);
size_t kv_type_size(KvType t);  // bytes per K or V element

struct Plan {
  Placement placement = Placement::kCpu;
  // Hybrid only: the last n_gpu_layers layers (and the output head) run on the
  // GPU; layers [0, n_layer - n_gpu_layers) and the embedding on the host
  // (llama.cpp's -ngl convention). 1 <= n_gpu_layers <= n_layer - 1.
  int32_t n_gpu_layers = 0;
  int32_t n_ctx = 0;         // positions per sequence; 0 = the model's context_length
  int32_t n_batch = 512;     // tokens per eval call (rows of logits when logits_all)
  int32_t n_ubatch = 64;     // tokens per forward pass (Session's n_ubatch)
  int32_t n_parallel = 1;    // sequences (sessions) evaluated concurrently
  int32_t n_threads = 1;     // CPU backend threads (one attention row buffer each)
  KvType kv_type = KvType::kF32;  // the CPU KvPool stores F32 today
  int32_t kv_block_tokens = 16;
  bool logits_all = false;   // eval_all_logits (every row) instead of eval (last row)
};

// Per-device cost model. Defaults: see EstimatorConfig.
struct DeviceCosts {
  uint64_t fixed_overhead = 0;    // runtime bytes independent of the model
  uint64_t alignment = 64;        // every allocation rounds up to this
  uint64_t page_threshold = 0;    // allocations >= this round to page_size (0: never)
  uint64_t page_size = 4096;
  double fragmentation = 0.05;    // share of dynamic bytes (kv, scratch, logits, overhead)
};

struct EstimatorConfig {
  // Host: glibc malloc; 64-byte rounding (16 B header + 16 B granularity, cache
  // line), mmap'd (page-rounded) from 128 KiB; 5% fragmentation; 8 MiB for the
  // runtime (thread stacks' touched pages, allocator arenas, I/O buffers).
  DeviceCosts host{8ull << 20, 64, 128ull << 10, 4096, 0.05};
  // GPU (provisional until the Vulkan allocator): 256-byte buffer alignment
  // (the largest minStorageBufferOffsetAlignment in practice), 10% for the
  // device allocator's sub-allocation, 128 MiB for context, pipelines,
  // descriptor pools, command buffers and staging.
  DeviceCosts gpu{128ull << 20, 256, 0, 4096, 0.10};
};

// Bytes of one category on one device plus its documented allowance.
struct Amount {
  uint64_t bytes = 0;
  uint64_t allowance = 0;
  uint64_t n_allocations = 0;
  uint64_t with_allowance() const { return bytes + allowance; }
};

// Terms of the scratch and logits categories on one device, for ONE session
// (Estimate multiplies by n_parallel where sessions are concurrent). m =
// n_ubatch, c = n_ctx, E = n_embd, KV = n_embd_kv, F = n_ff, V = n_vocab, all F32.
struct ScratchTerms {
  // Session::hidden_: m*E floats (host; a GPU stage also keeps a device copy).
  uint64_t hidden = 0;
  // CpuBackend::forward_layers per call: cur, q, att (m*E each), k, v (m*KV
  // each), gate, up (m*F each), rope cos/sin tables (m*n_rot/2 each).
  uint64_t layer_activations = 0;
  // matmul_fused's PreparedX, one alive at a time: m row pointers, and for a
  // Q8_0 matrix m*(cols/32) BlockQ8_0 (34 B) + m*(cols/32) float scales + 2*m
  // pointers; the max over the stage's matrices (cols up to max(E, F)).
  uint64_t matmul_prep = 0;
  // Attention score rows: c floats per concurrent attention worker. One session:
  // n_threads workers (the caller included). n_parallel sessions share the
  // pool (one parallel region at a time) but run small attention inline, so
  // the plan's total is (n_threads + n_parallel - 1) rows, not per session.
  uint64_t attention_row = 0;    // bytes of one row (c floats)
  // CpuBackend::output per call: cur (rows*E) + PreparedX of the head (rows =
  // 1, or m with logits_all). Not alive together with the layer terms.
  uint64_t output_transient = 0;
  // Session bookkeeping: tokens_ (c ids) and the block tables (ceil(c/bt) ids
  // per stage), doubled because a growing vector briefly holds old and new.
  uint64_t session_state = 0;
  // Logits (host): eval keeps last_logits_ (V) while the next row is computed
  // (V) -> 2V floats; eval_all_logits holds n_batch*V plus the retained row.
  uint64_t logits = 0;

  // Peak of one forward pass: max(layer_activations + matmul_prep +
  // n_threads*attention_row, output_transient).
  uint64_t transient_peak(int32_t n_threads) const;
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
  ScratchTerms terms;               // per session, this device
  uint64_t kv_bytes_per_token = 0;  // K+V of this device's layers
  uint64_t kv_bytes_per_block = 0;
  uint64_t allowance() const;
  uint64_t bytes() const;           // sum of categories without allowance
  uint64_t total() const { return bytes() + allowance(); }
};

// What one request adds on top of the resident model: its KV blocks and one
// session's scratch + logits, per device.
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
  Plan plan;  // with n_ctx defaulted
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

// Stage layout of a plan for a model with n_layer layers (InvalidArgument for a
// bad n_gpu_layers).
Result<std::vector<StageLayout>> plan_stages(const Plan& plan, int32_t n_layer);

Result<Estimate> estimate(const gguf::GgufFile& file, const Plan& plan, const EstimatorConfig& config = {});

}  // namespace spw::admission
