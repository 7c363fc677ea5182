// The Vulkan backend's internals, shared by its sources; not a public header
// (vulkan_backend.h is the contract):
//   vulkan_backend.cpp    the device's setup and teardown, weight uploads and
//                         the Backend calls around them (KV pools, health)
//   vulkan_pipelines.cpp  shaders and pipelines, and the Recorder that
//                         records dispatches (with the matmul helpers below)
//   vulkan_forward.cpp    the forward pass: embed, forward_batch, output
//   vulkan_ops.cpp        the single ops and the health check
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/kernel_variant.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/thread_pool.h"
#include "backend/vulkan/device_allocator.h"
#include "backend/vulkan/vk_context.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/timed_mutex.h"

namespace spw {

// The backend's own types and constants. In a namespace of their own rather
// than an anonymous one: VulkanBackend::Impl, one type in every source, holds
// them, and the generic names (Pipeline, Scratch) must not meet another spw
// type of that name. The using-declarations below let the sources name them
// unqualified.
namespace vulkan_internal {

constexpr uint32_t kWg = 64;            // local_size_x of every shader
constexpr uint32_t kMaxGroups = 65535;  // guaranteed maxComputeWorkGroupCount per dimension
constexpr uint32_t kPushBytes = 128;
// matmul.comp's token tile (MM_TT) for several tokens: the tokens of a
// prompt chunk one workgroup applies each weight unit to (a single token
// takes tile 1). At most the smallest workgroup (8, matmul_workgroup):
// invocation k writes token k of the tile.
constexpr uint32_t kMatmulTokenTile = 8;
constexpr uint32_t kPoolSets = 512;
constexpr uint32_t kMaxBindings = 6;
constexpr uint64_t kStagingBytes = 8ull << 20;

struct Pipeline {
  VkShaderModule module = VK_NULL_HANDLE;
  VkDescriptorSetLayout dsl = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipe = VK_NULL_HANDLE;
  uint32_t n_bindings = 0;
};

struct DevChunk {
  DeviceBuffer buf;
  int64_t row0 = 0;
  int64_t n_rows = 0;
};

struct DevMatrix {
  gguf::GgmlType type = gguf::GgmlType::kF32;
  int64_t n_rows = 0, n_cols = 0;
  size_t row_bytes = 0;
  std::vector<DevChunk> chunks;
};

struct DevLayer {
  bool present = false;
  DeviceBuffer attn_norm, ffn_norm;
  DeviceBuffer bq, bk, bv, q_norm, k_norm;  // the architecture's optional parts (model/arch.h)
  DeviceBuffer post_attn_norm, post_ffn_norm;  // Gemma
  DevMatrix wq, wk, wv, wo, gate, up, down;
  // A mixture of experts: gate/up/down stay empty; the router and experts
  // are on the device (moe_router, the e_* per expert, the shared expert's
  // s_* with its gate as a one-row matrix) or, with host_experts, on the host
  // (vulkan_backend.h).
  bool host_experts = false;
  DevMatrix moe_router, s_gate, s_up, s_down, s_router;
  std::vector<DevMatrix> e_gate, e_up, e_down;
  bool device_experts() const { return !e_gate.empty(); }
};

struct ModelWeights {
  uint64_t fingerprint = 0;
  std::string owner;
  std::vector<DevLayer> layers;
  std::unique_ptr<DevMatrix> output;  // token_embd's rows when the head is tied
  DeviceBuffer output_norm;
};

struct Scratch {
  // io_rope_local: the sliding layers' own RoPE table (Gemma 3).
  // io_window_blocks: the row table and block ids of the window plane (KvPool).
  DeviceBuffer io_hidden, io_rope, io_rope_local, io_blocks, io_window_blocks, io_logits;  // host-visible
  DeviceBuffer x, cur, q, k, v, att, gate, up, xq, xd, scores;       // device-local
  DeviceBuffer post;  // Gemma: a sublayer's output after its post-norm
  // Device experts: the router's logits (and the shared expert's gate),
  // one expert's gathered rows and outputs; io_route carries the logits to
  // the host and the routing table back.
  DeviceBuffer router, xg, yg, io_route;
};

// The float64 variant where the device has float64 and the type one.
const char* matmul_shader(gguf::GgmlType t, bool f64);

}  // namespace vulkan_internal

using vulkan_internal::DevChunk;
using vulkan_internal::DevLayer;
using vulkan_internal::DevMatrix;
using vulkan_internal::kMaxBindings;
using vulkan_internal::kMatmulTokenTile;
using vulkan_internal::kMaxGroups;
using vulkan_internal::kPoolSets;
using vulkan_internal::kPushBytes;
using vulkan_internal::kStagingBytes;
using vulkan_internal::kWg;
using vulkan_internal::matmul_shader;
using vulkan_internal::ModelWeights;
using vulkan_internal::Pipeline;
using vulkan_internal::Scratch;

// K/V of a pool's layers: per layer one K and one V buffer of
// [n_blocks][block_tokens][n_embd_kv] floats. Holds the context alive so the
// buffers can always be freed, even after the backend reinitialised.
class VulkanKvStorage final : public KvDeviceStorage {
 public:
  std::shared_ptr<VulkanContext> ctx;  // declared first: destroyed last
  std::string dev_name;
  KvType type = KvType::kF32;  // f32: floats; f16: two halves per uint (low first)
  std::vector<DeviceBuffer> k, v;
  size_t total = 0;
  std::string device_name() const override { return dev_name; }
  size_t bytes() const override { return total; }
};

struct VulkanBackend::Impl {
  VulkanBackendOptions opts;
  FaultInjector faults;
  // The queue: every call that records, submits or changes device state
  // holds it, for as long as its submissions run. Timed so that a health
  // check gives up on a queue that a hung submission holds.
  mutable TimedMutex mu;
  std::shared_ptr<VulkanContext> ctx;  // declared before everything allocated from it
  // `ctx` as the readers that never touch the queue see it (memory_stats,
  // healthy, health_reason: status, health and admission read them from the
  // front end, which must never wait behind a submission). Set under both
  // locks, read under ctx_mu alone.
  mutable std::mutex ctx_mu;
  std::shared_ptr<VulkanContext> published;
  void publish(std::shared_ptr<VulkanContext> c) {
    std::lock_guard<std::mutex> lk(ctx_mu);
    published = std::move(c);
  }
  std::shared_ptr<VulkanContext> published_ctx() const {
    std::lock_guard<std::mutex> lk(ctx_mu);
    return published;
  }
  VulkanDeviceInfo info;
  VkDescriptorPool dpool = VK_NULL_HANDLE;
  std::map<std::string, Pipeline> pipes;
  std::map<const Model*, std::unique_ptr<ModelWeights>> models;
  Scratch scratch;
  DeviceBuffer staging;
  // The host side of a pass (a mixture of experts' FFNs): made by the first
  // prepare of such a model, opts.host_threads threads.
  std::unique_ptr<ThreadPool> host_pool;
  // set_cpu_experts: the models whose experts stay on the host, and of
  // which layers (0: all; k: [0, k)).
  struct HostExperts {
    uint64_t fingerprint = 0;
    int32_t first_layers = 0;
  };
  std::map<const Model*, HostExperts> cpu_experts;
  bool experts_on_host(const Model& m, int32_t il) const {
    auto it = cpu_experts.find(&m);
    return it != cpu_experts.end() && it->second.fingerprint == m.fingerprint_hash() &&
           (it->second.first_layers <= 0 || il < it->second.first_layers);
  }
  // work_counts(): written by the Recorder under `mu`, read without it.
  std::atomic<uint64_t> n_submissions{0};
  std::atomic<uint64_t> n_dispatches{0};

  ~Impl() { teardown(); }

  Status init();

  void teardown();

  std::string name() const { return "vulkan:" + std::to_string(info.index); }

  Status healthy_or_error() const {
    if (!ctx) {
      return Status(StatusCode::kUnavailable, "Vulkan backend is not initialised (reinitialize failed)",
                    FailureReason::kUnhealthy);
    }
    return ctx->require_healthy();
  }

  // Made on first use (vulkan_pipelines.cpp); token_tile is matmul.comp's
  // MM_TT (1 for every other shader).
  Result<Pipeline*> pipeline(const char* sname, uint32_t token_tile = 1);

  Result<DeviceBuffer> alloc(uint64_t bytes, MemoryCategory c, const std::string& owner, bool host_visible = false) {
    return ctx->allocator().allocate(bytes, c, owner, host_visible);
  }

  // Grows `b` to at least `bytes` (rounded up to 64 KiB to avoid regrowing for every batch size).
  Status ensure(DeviceBuffer& b, uint64_t bytes, bool host_visible) {
    if (b.valid() && b.size() >= bytes) return Status();
    b.reset();
    uint64_t want = (bytes + 65535) & ~uint64_t{65535};
    want = std::min(want, ctx->max_buffer_bytes());
    if (want < bytes) want = bytes;
    SPW_ASSIGN_OR_RETURN(b, alloc(want, MemoryCategory::kScratch, "scratch", host_visible));
    return Status();
  }

  class Recorder;
  Status upload(DeviceBuffer& dst, const void* src, uint64_t bytes);
  Status upload_matrix(const WeightMatrix& w, const std::string& owner, DevMatrix& out);
  Status upload_vector(const std::vector<float>& v, const std::string& owner, DeviceBuffer& out);
  Status upload_experts(const MoeWeights& w, const std::string& owner, DevLayer& d);
  Status prepare(const Model& model, int32_t lb, int32_t le, bool output);
  Result<ModelWeights*> weights(const Model& model);
};

// Records dispatches into the context's command buffer. On descriptor-pool
// exhaustion it submits what it has, waits, resets the pool and goes on (all
// state lives in device buffers, so splitting a submission changes nothing).
// The first error sticks; later calls do nothing; finish() returns it.
class VulkanBackend::Impl::Recorder {
 public:
  explicit Recorder(Impl& im) : im_(im), cb_(im.ctx->command_buffer()) { begin(); }

  // The activation quantiser of format f: the float64 variants divide
  // exactly, as ggml's CPU code does; without float64 the float ones may
  // differ by an ulp in a rare scale (then the equivalence probe is what
  // catches it).
  const char* quantize_shader(cpu::ActFormat f) const;

  const char* matmul_shader(gguf::GgmlType t) const { return ::spw::matmul_shader(t, im_.ctx->info().shader_float64); }

  // RoPE and attention as this build's CPU kernels round them (rope.comp,
  // attention.comp: EXACT_F64): needs float64 on the device, and CPU kernels
  // with fused multiply-adds and the AVX2 / AVX-512 dot order.
  // The CPU's swiglu bitwise where the device has float64 (swiglu.comp).
  const char* swiglu_shader() const { return im_.ctx->info().shader_float64 ? "swiglu_f64" : "swiglu"; }
  // Gemma's GELU gate likewise (geglu.comp).
  const char* geglu_shader() const { return im_.ctx->info().shader_float64 ? "geglu_f64" : "geglu"; }

  bool exact_attention() const {
    return im_.ctx->info().shader_float64 && cpu::active_kernel_traits().fused_dot_order;
  }

  void dispatch(const char* shader, std::initializer_list<VkBuffer> bufs, const void* pc, size_t pc_size,
                uint32_t gx, uint32_t gy = 1, uint32_t gz = 1, uint32_t token_tile = 1);

  // 1-D work of n invocations spread over a 2-D grid of 64-wide groups.
  void dispatch_flat(const char* shader, std::initializer_list<VkBuffer> bufs, const void* pc, size_t pc_size,
                     uint64_t n);

  // rms_norm.comp over `rows` rows of `n` floats: one workgroup per row,
  // spread over y past the 65535-group limit.
  void rms_rows(VkBuffer x, VkBuffer w, VkBuffer y, uint64_t n, uint64_t rows, uint32_t eps_bits);

  void barrier();

  void copy(VkBuffer src, VkBuffer dst, uint64_t bytes, uint64_t src_off = 0, uint64_t dst_off = 0);

  Status finish();

 private:
  void begin();
  void submit();
  void flush();

  Impl& im_;
  VkCommandBuffer cb_;
  Status st_;
  bool open_ = false;
};

namespace vulkan_internal {

// y[t][row0 + r] for every chunk; x is F32 [n][n_cols] or, for the quantised
// types, already quantised into (xq, xd) in the type's activation format.
void record_matmul(VulkanBackend::Impl::Recorder& rec, const DevMatrix& m, VkBuffer x, VkBuffer xq, VkBuffer xd,
                   uint32_t n_tokens, VkBuffer y, uint32_t y_stride);

void record_quantize(VulkanBackend::Impl::Recorder& rec, cpu::ActFormat f, VkBuffer x, VkBuffer xq, VkBuffer xd,
                     uint64_t n_floats);

// The matmuls reading one input x ([n_tokens][n_cols] floats): x is quantised
// into (xq, xd) when a matrix needs a format other than the one there, so a
// group sharing a format (Q4_K and Q6_K in a Q4_K_M layer, or all-Q8_0) pays
// one quantisation, and an odd mix still computes each matrix as the CPU does.
// One (xq, xd) pair serves every format (Q8_1 packs d and s into xd's word;
// Q8_K has one scale per 256), so the scratch does not grow with the mix.
class MatmulInput {
 public:
  MatmulInput(VulkanBackend::Impl::Recorder& rec, VkBuffer x, VkBuffer xq, VkBuffer xd, uint64_t n_floats)
      : rec_(rec), x_(x), xq_(xq), xd_(xd), n_floats_(n_floats) {}
  void matmul(const DevMatrix& m, uint32_t n_tokens, VkBuffer y, uint32_t y_stride) {
    const cpu::ActFormat f = cpu::act_format(m.type);
    if (f != cpu::ActFormat::kFloat && f != held_) {
      if (held_ != cpu::ActFormat::kFloat) rec_.barrier();  // the previous format's readers finish first
      record_quantize(rec_, f, x_, xq_, xd_, n_floats_);
      held_ = f;
    }
    record_matmul(rec_, m, x_, xq_, xd_, n_tokens, y, y_stride);
  }

 private:
  VulkanBackend::Impl::Recorder& rec_;
  VkBuffer x_, xq_, xd_;
  uint64_t n_floats_;
  cpu::ActFormat held_ = cpu::ActFormat::kFloat;
};

}  // namespace vulkan_internal

using vulkan_internal::MatmulInput;
using vulkan_internal::record_matmul;
using vulkan_internal::record_quantize;

}  // namespace spw
