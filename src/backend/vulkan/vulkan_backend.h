// VulkanBackend: the llama forward pass as Vulkan compute shaders.
//
// Contract: implements Backend (backend/backend.h). create() opens a Vulkan
// instance and one physical device (chosen by index or name substring), a
// compute queue and the DeviceAllocator through which every byte of device
// memory goes (budget, accounting by category and owner, peaks). prepare()
// uploads the weights of the asked layers (and output head) once per model,
// through a staging buffer; sessions of the same model share them. The
// embedding lookup runs on the host (embed(): cpu::embed_tokens), so
// token_embd is uploaded only as a tied output head.
// Tensors larger than one buffer may hold (maxStorageBufferRange, 128 MiB on
// lavapipe, or options.max_buffer_bytes) are split by rows over several
// buffers (options.max_buffer_bytes can lower this for weights). K/V live in device memory: make pools with create_kv_pool() (the
// block tables and counters are unchanged; see kv/kv_cache.h).
// Batches: forward_batch runs the rows of several sequences (decode steps and
// prefill chunks mixed) in one pass over the weights, so a session group's
// batched step costs one weight pass on the device as on the CPU.
// Numerics: F32 / F16 weights use F32 FMA dot products; the quantised types
// (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) run against activations
// quantised on the device in the CPU's paired format (Q8_0 / Q8_1 / Q8_K,
// bit for bit as ggml's reference quantisers) with an exact integer dot per
// 32-element unit and the CPU's float steps (backend/cpu/quant_dot.h;
// shaders/matmul.comp says where the order differs). Types without shaders
// (those the CPU does not compute either, e.g. Q2_K, Q3_K, BF16): prepare()
// refuses a model whose asked layers / head hold one, before
// uploading anything, with Unimplemented naming the tensor and its type
// (vulkan_check_weight_types); the gateway builder asks the same of the file
// and leaves the GPU paths unbuilt.
// Mixture of experts (model/arch.h), two shapes per model
// (set_cpu_experts):
//  - experts on the device (default): the pass submits up to the router's
//    logits, reads them back, routes on the host (cpu::moe_route: the CPU's
//    choice from the same logits) and records, per chosen expert in id
//    order, a gather of its rows, gate/up, SwiGLU, down and a weighted add
//    into the residual (gather_rows.comp, scatter_add_rows.comp), so each
//    chosen expert is one matmul over all its rows of the step; Qwen2-MoE's
//    shared expert and its sigmoid gate likewise. A row's experts are added
//    in id order (the CPU: rank order), so the two backends agree within
//    float rounding, each bitwise batch-invariant.
//  - experts on the host (Placement::cpu_experts): attention on the device;
//    the pass reads the FFN norm's rows back, runs cpu::moe_ffn (router,
//    experts, shared expert) on a pool of options.host_threads threads over
//    the weights in the mapping, and goes on from the residual add. prepare()
//    uploads no router, expert or shared-expert tensor: the device holds
//    attention, norms, KV and the head -- the split llama.cpp users make by
//    hand (--n-cpu-moe), priced by the estimator as such.
// Either way one more submission and host round trip per MoE layer.
// Reductions have a fixed order per (row, token), so
// results are bitwise independent of batch size and ubatch split; they agree
// with the CPU backend within float tolerance, not bitwise.
// Errors: every device wait has a finite timeout (options.fence_timeout_ms).
// VK_TIMEOUT -> DeadlineExceeded (FailureReason kTimeout), VK_ERROR_DEVICE_LOST
// -> DeviceLost (kDeviceLost), VK_ERROR_OUT_OF_{DEVICE,HOST}_MEMORY ->
// ResourceExhausted (kDeviceOutOfMemory); after any of these the backend is
// unhealthy (healthy() false, health_reason() says why) and every call returns
// Unavailable, typed with the reason of the fault that made it so (so that
// classify() counts it as a device fault), until reinitialize() succeeds (which drops uploaded
// weights; prepare again; KV pools made before it are rejected). A request that
// would exceed the memory budget is ResourceExhausted with the numbers, before
// any driver call, and leaves the backend healthy. Nothing here crashes on a
// device error. Built without Vulkan (vulkan_built_in() false), create() and
// list_vulkan_devices() return Unavailable.
// Thread safety: one VulkanBackend may be shared by sessions on several
// threads; calls are serialised on an internal mutex (one queue). memory_stats(),
// healthy() and faults() may be called at any time.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/quant_dot.h"
#include "backend/fault_injector.h"

namespace spw {

// True when this binary was built with the Vulkan backend (not whether a
// device exists: see list_vulkan_devices()).
bool vulkan_built_in();

// Weight (matrix) types the shaders compute (one matmul and one embed
// variant each).
inline constexpr gguf::GgmlType kVulkanWeightTypes[] = {
    gguf::GgmlType::kF32,  gguf::GgmlType::kF16,  gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_0, gguf::GgmlType::kQ4_1,
    gguf::GgmlType::kQ5_0, gguf::GgmlType::kQ5_1, gguf::GgmlType::kQ4_K, gguf::GgmlType::kQ5_K, gguf::GgmlType::kQ6_K};
bool vulkan_computes_weight_type(gguf::GgmlType t);  // t is in kVulkanWeightTypes
// OK, or Unimplemented naming the matrix and its type.
Status vulkan_check_weight_type(const WeightMatrix& w);
// OK, or Unimplemented naming the first matrix whose type the shaders do not
// compute: of layers [layer_begin, layer_end) and, when asked, the output
// head (what prepare() would upload) ...
Status vulkan_check_weight_types(const Model& m, int32_t layer_begin, int32_t layer_end, bool output);
// ... or of every 2-D tensor of a file (planners that have no Model yet).
Status vulkan_check_weight_types(const gguf::GgufFile& f);

struct VulkanHeapInfo {
  uint64_t size_bytes = 0;
  bool device_local = false;
  // From VK_EXT_memory_budget; -1 when the extension is not supported.
  int64_t budget_bytes = -1;
  int64_t usage_bytes = -1;
};

struct VulkanDeviceInfo {
  uint32_t index = 0;
  std::string name;         // VkPhysicalDeviceProperties::deviceName
  std::string type;         // "discrete-gpu", "integrated-gpu", "virtual-gpu", "cpu", "other"
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::string vendor;       // "NVIDIA", "AMD", "Intel", "Mesa", ... or hex id
  std::string driver;       // driverName + driverInfo, e.g. "llvmpipe (Mesa 22.3.6 ...)"
  std::string api_version;  // "1.3.230"
  std::vector<VulkanHeapInfo> heaps;
  bool memory_budget_ext = false;  // VK_EXT_memory_budget
  bool shader_float64 = false;     // VkPhysicalDeviceFeatures::shaderFloat64 (exact Q8_0 scales; see quantize_q8_0.comp)
  bool has_compute_queue = false;
  uint32_t subgroup_size = 0;
  uint64_t max_storage_buffer_range = 0;
  uint64_t max_allocation_bytes = 0;  // maxMemoryAllocationSize (Vulkan 1.1)
};

// The largest buffer the backend makes on this device:
// min(maxStorageBufferRange, maxMemoryAllocationSize) rounded down to 32-bit
// words (shaders address words). The estimator's GpuLimits::max_buffer_bytes.
uint64_t largest_buffer_bytes(const VulkanDeviceInfo& info);

// Every physical device the loader reports. Unavailable when Vulkan is not
// built in or no loader/driver is present (the message says which); an empty
// list is returned as Unavailable too ("no Vulkan devices").
Result<std::vector<VulkanDeviceInfo>> list_vulkan_devices();

struct VulkanBackendOptions {
  // "" = first device with a compute queue; "N" = index N; otherwise the first
  // device whose name contains this substring (case-insensitive).
  std::string device;
  uint64_t memory_budget_bytes = 0;  // 0 = size of the largest device-local heap
  uint32_t fence_timeout_ms = 30000;
  // Largest buffer of one weight tensor (larger tensors are split by rows);
  // 0 = the device limit, min(maxStorageBufferRange, maxMemoryAllocationSize).
  // Tests lower it to exercise splitting.
  uint64_t max_buffer_bytes = 0;
  // Enables VK_LAYER_KHRONOS_validation when installed (also on by default in
  // builds without NDEBUG).
  bool validation = false;
  // CPU threads for the part of a pass that runs on the host: a mixture of
  // experts' routers and experts (see the contract above).
  int host_threads = 1;
};

enum class MemoryCategory : int { kWeights = 0, kKv = 1, kScratch = 2, kStaging = 3 };
inline constexpr int kMemoryCategoryCount = 4;
const char* memory_category_name(MemoryCategory c);

struct DeviceMemoryStats {
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t peak_bytes = 0;
  std::array<uint64_t, kMemoryCategoryCount> used_by_category{};
  std::array<uint64_t, kMemoryCategoryCount> peak_by_category{};
  std::map<std::string, uint64_t> used_by_owner;  // "model:<hash>", "kv:<owner>", "scratch"
  uint32_t n_allocations = 0;       // live vkAllocateMemory allocations
  uint64_t n_budget_rejections = 0;  // requests refused by the budget
  std::vector<VulkanHeapInfo> heaps;  // with budget/usage when VK_EXT_memory_budget exists
};

// What the backend has asked of the device since it was created: queue
// submissions (each one waited for on a fence) and compute dispatches. Device
// independent, so the cost of a step in host round trips and passes is
// measured the same on lavapipe and a GPU (issue 36's whole-step submission).
struct VulkanWorkCounts {
  uint64_t submissions = 0;
  uint64_t dispatches = 0;
  VulkanWorkCounts operator-(const VulkanWorkCounts& o) const {
    return {submissions - o.submissions, dispatches - o.dispatches};
  }
};

class VulkanBackend final : public Backend {
 public:
  static Result<std::shared_ptr<VulkanBackend>> create(const VulkanBackendOptions& options = {});
  ~VulkanBackend() override;
  VulkanBackend(const VulkanBackend&) = delete;
  VulkanBackend& operator=(const VulkanBackend&) = delete;

  std::string name() const override;  // "vulkan:<index>"
  Status prepare(const Model& model, int32_t layer_begin, int32_t layer_end, bool embedding,
                 bool output) override;
  Status embed(const Model& model, std::span<const TokenId> tokens, float* hidden) override;
  Status forward_layers(const Model& model, int32_t layer_begin, int32_t layer_end, const KvSequence& kv,
                        int32_t pos0, int32_t n_tokens, float* hidden) override;
  // Several sequences' rows in one pass over the weights (Backend's
  // contract): matmuls, norms and activations over all rows at once; RoPE,
  // the KV write and attention per row through a row table (position and
  // block table of the row's sequence). Each row's result is bitwise what
  // its sequence alone gives (every reduction has a fixed order per row).
  // Sequences in different KV pools run one pool after another.
  Status forward_batch(const Model& model, int32_t layer_begin, int32_t layer_end, std::span<const SeqSlice> slices,
                       float* hidden) override;
  Status output(const Model& model, const float* hidden, int32_t n_rows, float* logits) override;

  // K/V of opts' layers in device memory (category kv, owner "kv:<owner>").
  // ResourceExhausted over budget; InvalidArgument when one layer's K (or V)
  // exceeds the largest buffer.
  Result<std::shared_ptr<KvPool>> create_kv_pool(const KvPoolOptions& opts, const std::string& owner) override;
  // Only pools from this backend's create_kv_pool (since the last reinitialize).
  bool accepts_kv(const KvPool& pool) const override;

  // Frees a model's uploaded weights (call before the Model dies if the backend
  // outlives it; weights are keyed by Model address and fingerprint).
  void release_model(const Model& model);

  // Where a mixture of experts' router and experts run for `model`: on the
  // device (the default) or on the host (`on_host`, Placement::cpu_experts):
  // every layer's, or with first_layers > 0 layers [0, first_layers)'s only
  // (Placement::cpu_expert_layers; the later layers' experts on the device).
  // Set before prepare(); FailedPrecondition once layers of the model are
  // uploaded the other way (release_model first). A dense model ignores it.
  Status set_cpu_experts(const Model& model, bool on_host, int32_t first_layers = 0);

  const VulkanDeviceInfo& device_info() const;
  const VulkanBackendOptions& options() const;
  DeviceMemoryStats memory_stats() const;
  // Lock-free: readable while a step is in flight (a snapshot of either side).
  VulkanWorkCounts work_counts() const;
  FaultInjector& faults();
  bool healthy() const;
  std::string health_reason() const;  // empty when healthy
  // Tears down the device and everything on it and opens it again (the
  // FaultInjector and its armed faults stay).
  Status reinitialize();
  // A tiny real device operation (two 256-byte scratch buffers, one add
  // dispatch, a submission and a fence wait with the fence timeout, the
  // result checked; an empty submission when the budget has no room for the
  // buffers). OK when the device answered right; an armed health_fail
  // (FaultInjector) fails it with Unavailable (kUnhealthy) without touching
  // the device; an unhealthy backend answers its typed Unavailable; a device
  // error is the typed error of that call (and leaves the backend
  // unhealthy, as any call would); a wrong result is Internal (kUnhealthy)
  // and marks it unhealthy. Its allocations and submission count as events
  // for the armed faults.
  Status health_check();

  // Single ops on host data, for conformance tests and diagnostics. The weight
  // is uploaded to a temporary buffer (category scratch, owner "op").
  Status op_matmul(const WeightMatrix& w, const float* x, int32_t n_tokens, float* y);
  // n floats (a multiple of the format's block: 32, or 256 for Q8_K) quantised
  // as the matmuls' activations: qs gets n int8 codes, scales one word per
  // block: Q8_0 the fp16-rounded d as float bits, Q8_1 packHalf2x16(d, s),
  // Q8_K the float d's bits (shaders/quantize_act.comp).
  Status op_quantize(cpu::ActFormat f, const float* x, int64_t n, int8_t* qs, uint32_t* scales);
  Status op_rms_norm(const float* x, const float* weight, int32_t n, int32_t n_tokens, float eps, float* y);
  Status op_swiglu(const float* gate, const float* up, int64_t n, float* out);
  Status op_add(float* y, const float* x, int64_t n);
  Status op_rope(float* x, int32_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_rot, int32_t pos0,
                 float freq_base);

  struct Impl;

 private:
  explicit VulkanBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spw
