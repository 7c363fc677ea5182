#include "backend/vulkan/vulkan_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/cpu/kernel_variant.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/quant_dot.h"
#include "backend/vulkan/device_allocator.h"
#include "backend/vulkan/vk_context.h"
#include "core/timed_mutex.h"

namespace spw {
namespace vkshaders {
bool find(const char* name, const uint32_t** words, size_t* n_words);  // generated (embed_spirv.cmake)
}

bool vulkan_built_in() { return true; }

namespace {

constexpr uint32_t kWg = 64;            // local_size_x of every shader
constexpr uint32_t kMaxGroups = 65535;  // guaranteed maxComputeWorkGroupCount per dimension
constexpr uint32_t kPushBytes = 128;
constexpr uint32_t kPoolSets = 512;
constexpr uint32_t kMaxBindings = 6;
constexpr uint64_t kStagingBytes = 8ull << 20;

// The weight types with shaders, and their shader-name suffix (one matmul and
// one embed variant each: CMakeLists.txt, shaders/weights.glsl). The K types
// also have a float64 matmul, bitwise the CPU's (matmul.comp's fma_rn).
struct TypeShaders {
  gguf::GgmlType type;
  const char* matmul;
  const char* embed;
  const char* matmul_f64 = nullptr;
};
constexpr TypeShaders kTypeShaders[] = {
    {gguf::GgmlType::kF32, "matmul_f32", "embed_f32"},
    {gguf::GgmlType::kF16, "matmul_f16", "embed_f16"},
    {gguf::GgmlType::kQ8_0, "matmul_q8_0", "embed_q8_0"},
    {gguf::GgmlType::kQ4_0, "matmul_q4_0", "embed_q4_0"},
    {gguf::GgmlType::kQ4_1, "matmul_q4_1", "embed_q4_1"},
    {gguf::GgmlType::kQ5_0, "matmul_q5_0", "embed_q5_0"},
    {gguf::GgmlType::kQ5_1, "matmul_q5_1", "embed_q5_1"},
    {gguf::GgmlType::kQ4_K, "matmul_q4_k", "embed_q4_k", "matmul_q4_k_f64"},
    {gguf::GgmlType::kQ5_K, "matmul_q5_k", "embed_q5_k", "matmul_q5_k_f64"},
    {gguf::GgmlType::kQ6_K, "matmul_q6_k", "embed_q6_k", "matmul_q6_k_f64"},
};
static_assert(std::size(kTypeShaders) == std::size(kVulkanWeightTypes), "a shader pair per computed type");

// Bindings per shader; matmul_* take 4 (weights, codes/x, scales, y), embed_* 3.
uint32_t shader_bindings(const char* name) {
  static const std::map<std::string, uint32_t> fixed = {{"quantize_q8_0", 3}, {"quantize_q8_0_f64", 3},
                                                        {"quantize_q8_1", 3}, {"quantize_q8_1_f64", 3},
                                                        {"quantize_q8_k", 3}, {"quantize_q8_k_f64", 3},
                                                        {"rms_norm", 3},      {"rms_norm_f64", 3},
                                                        {"rope", 2},          {"rope_neox", 2},
                                                        {"rope_f64", 2},      {"rope_neox_f64", 2},
                                                        {"attention_f64", 6}, {"attention_f16_f64", 6},
                                                        {"add_bias", 2},      {"kv_write", 5},
                                                        {"attention", 6},     {"kv_write_f16", 5},
                                                        {"attention_f16", 6}, {"swiglu", 2},
                                                        {"swiglu_f64", 2},    {"add", 2}};
  if (auto it = fixed.find(name); it != fixed.end()) return it->second;
  for (const TypeShaders& t : kTypeShaders) {
    if (std::strcmp(t.matmul, name) == 0) return 4;
    if (t.matmul_f64 != nullptr && std::strcmp(t.matmul_f64, name) == 0) return 4;
    if (std::strcmp(t.embed, name) == 0) return 3;
  }
  return 0;
}

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
  DevMatrix wq, wk, wv, wo, gate, up, down;
};

struct ModelWeights {
  uint64_t fingerprint = 0;
  std::string owner;
  std::vector<DevLayer> layers;
  std::shared_ptr<DevMatrix> tok_embd;
  std::shared_ptr<DevMatrix> output;  // == tok_embd when tied and both are present
  DeviceBuffer output_norm;
};

struct Scratch {
  DeviceBuffer io_hidden, io_rope, io_blocks, io_tokens, io_logits;  // host-visible
  DeviceBuffer x, cur, q, k, v, att, gate, up, xq, xd, scores;       // device-local
};

const TypeShaders& type_shaders(gguf::GgmlType t) {
  for (const TypeShaders& ts : kTypeShaders)
    if (ts.type == t) return ts;
  return kTypeShaders[0];  // unreachable: upload_matrix admits only listed types
}
// matmul.comp's workgroup size (its specialization constant MM_WG) on this
// device. A GPU keeps 64. A CPU device (lavapipe) runs a workgroup as a loop
// over SIMD vectors of subgroup_size lanes and pays for each of the
// reduction's barriers: one vector per group ran the matmuls ~3x faster on
// an AVX2 EPYC (bench/PERFORMANCE.md). Powers of two from 8 to 64 only: the
// K types' passes need 8 invocations per super-block.
uint32_t matmul_workgroup(const VulkanDeviceInfo& d) {
  if (d.type != "cpu") return kWg;
  uint32_t wg = 8;
  while (wg < kWg && wg < d.subgroup_size) wg *= 2;
  return wg;
}

// The float64 variant where the device has float64 and the type one.
const char* matmul_shader(gguf::GgmlType t, bool f64) {
  const TypeShaders& ts = type_shaders(t);
  return f64 && ts.matmul_f64 != nullptr ? ts.matmul_f64 : ts.matmul;
}
const char* embed_shader(gguf::GgmlType t) { return type_shaders(t).embed; }

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return std::string(b, 8);
}

}  // namespace

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

  ~Impl() { teardown(); }

  Status init() {
    SPW_ASSIGN_OR_RETURN(ctx, VulkanContext::create(opts, &faults));
    publish(ctx);
    info = ctx->info();
    VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kPoolSets * kMaxBindings};
    VkDescriptorPoolCreateInfo pci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pci.maxSets = kPoolSets;
    pci.poolSizeCount = 1;
    pci.pPoolSizes = &ps;
    return ctx->check(vkCreateDescriptorPool(ctx->device(), &pci, nullptr, &dpool), "vkCreateDescriptorPool");
  }

  void teardown() {
    if (!ctx) return;
    publish(nullptr);
    ctx->wait_idle();
    if (ctx->in_flight()) {
      // The GPU never finished: keep every object alive (leaked with the
      // abandoned context) rather than free memory it may still use.
      for (auto& [m, w] : models) keep_forever(std::shared_ptr<ModelWeights>(w.release()));
      models.clear();
      keep_forever(std::make_shared<Scratch>(std::move(scratch)));
      keep_forever(std::make_shared<DeviceBuffer>(std::move(staging)));
      for (auto& [n, p] : pipes) {
        keep_forever_vk(p.pipe);
        keep_forever_vk(p.layout);
        keep_forever_vk(p.dsl);
        keep_forever_vk(p.module);
      }
      pipes.clear();
      keep_forever_vk(dpool);
      dpool = VK_NULL_HANDLE;
      ctx.reset();
      return;
    }
    models.clear();
    scratch = Scratch();
    staging.reset();
    VkDevice dev = ctx->device();
    for (auto& [n, p] : pipes) {
      if (p.pipe) vkDestroyPipeline(dev, p.pipe, nullptr);
      if (p.layout) vkDestroyPipelineLayout(dev, p.layout, nullptr);
      if (p.dsl) vkDestroyDescriptorSetLayout(dev, p.dsl, nullptr);
      if (p.module) vkDestroyShaderModule(dev, p.module, nullptr);
    }
    pipes.clear();
    if (dpool) vkDestroyDescriptorPool(dev, dpool, nullptr);
    dpool = VK_NULL_HANDLE;
    ctx.reset();
  }

  std::string name() const { return "vulkan:" + std::to_string(info.index); }

  Status healthy_or_error() const {
    if (!ctx) {
      return Status(StatusCode::kUnavailable, "Vulkan backend is not initialised (reinitialize failed)",
                    FailureReason::kUnhealthy);
    }
    return ctx->require_healthy();
  }

  Result<Pipeline*> pipeline(const char* sname) {
    auto it = pipes.find(sname);
    if (it != pipes.end()) return &it->second;
    const uint32_t nb = shader_bindings(sname);
    const uint32_t* words = nullptr;
    size_t n_words = 0;
    if (nb == 0 || !vkshaders::find(sname, &words, &n_words))
      return Status::internal(std::string("no embedded shader ") + sname);
    VkDevice dev = ctx->device();
    Pipeline p;
    p.n_bindings = nb;
    VkShaderModuleCreateInfo smi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    smi.codeSize = n_words * 4;
    smi.pCode = words;
    Status st = ctx->check(vkCreateShaderModule(dev, &smi, nullptr, &p.module), "vkCreateShaderModule");
    VkDescriptorSetLayoutBinding b[kMaxBindings]{};
    for (uint32_t i = 0; i < nb; ++i) {
      b[i].binding = i;
      b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      b[i].descriptorCount = 1;
      b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo dli{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    dli.bindingCount = nb;
    dli.pBindings = b;
    if (st.ok()) st = ctx->check(vkCreateDescriptorSetLayout(dev, &dli, nullptr, &p.dsl), "vkCreateDescriptorSetLayout");
    VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushBytes};
    VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &p.dsl;
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &pcr;
    if (st.ok()) st = ctx->check(vkCreatePipelineLayout(dev, &pli, nullptr, &p.layout), "vkCreatePipelineLayout");
    VkComputePipelineCreateInfo cpi{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    cpi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpi.stage.module = p.module;
    cpi.stage.pName = "main";
    // matmul.comp's MM_WG (constant_id 0); the other shaders have none.
    const uint32_t mm_wg = matmul_workgroup(info);
    const VkSpecializationMapEntry wg_entry{0, 0, sizeof mm_wg};
    const VkSpecializationInfo spec{1, &wg_entry, sizeof mm_wg, &mm_wg};
    if (std::strncmp(sname, "matmul_", 7) == 0) cpi.stage.pSpecializationInfo = &spec;
    cpi.layout = p.layout;
    if (st.ok())
      st = ctx->check(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpi, nullptr, &p.pipe), "vkCreateComputePipelines");
    auto& slot = pipes[sname];
    slot = p;  // stored even on failure so teardown destroys what was made
    if (!st.ok()) {
      if (slot.pipe == VK_NULL_HANDLE) {
        if (slot.layout) vkDestroyPipelineLayout(dev, slot.layout, nullptr);
        if (slot.dsl) vkDestroyDescriptorSetLayout(dev, slot.dsl, nullptr);
        if (slot.module) vkDestroyShaderModule(dev, slot.module, nullptr);
        pipes.erase(sname);
      }
      return st;
    }
    return &slot;
  }

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
  Status prepare(const Model& model, int32_t lb, int32_t le, bool embedding, bool output);
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
  const char* quantize_shader(cpu::ActFormat f) const {
    const bool f64 = im_.ctx->info().shader_float64;
    switch (f) {
      case cpu::ActFormat::kQ8_1: return f64 ? "quantize_q8_1_f64" : "quantize_q8_1";
      case cpu::ActFormat::kQ8_K: return f64 ? "quantize_q8_k_f64" : "quantize_q8_k";
      default: return f64 ? "quantize_q8_0_f64" : "quantize_q8_0";
    }
  }

  const char* matmul_shader(gguf::GgmlType t) const { return ::spw::matmul_shader(t, im_.ctx->info().shader_float64); }

  // RoPE and attention as this build's CPU kernels round them (rope.comp,
  // attention.comp: EXACT_F64): needs float64 on the device, and CPU kernels
  // with fused multiply-adds and the AVX2 / AVX-512 dot order.
  // The CPU's swiglu bitwise where the device has float64 (swiglu.comp).
  const char* swiglu_shader() const { return im_.ctx->info().shader_float64 ? "swiglu_f64" : "swiglu"; }

  bool exact_attention() const {
    return im_.ctx->info().shader_float64 && cpu::active_kernel_traits().fused_dot_order;
  }

  void dispatch(const char* shader, std::initializer_list<VkBuffer> bufs, const void* pc, size_t pc_size,
                uint32_t gx, uint32_t gy = 1, uint32_t gz = 1) {
    if (!st_.ok()) return;
    auto p = im_.pipeline(shader);
    if (!p.ok()) {
      st_ = p.status();
      return;
    }
    Pipeline* pl = *p;
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = im_.dpool;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &pl->dsl;
    VkDescriptorSet set = VK_NULL_HANDLE;
    VkResult r = vkAllocateDescriptorSets(im_.ctx->device(), &ai, &set);
    if (r == VK_ERROR_OUT_OF_POOL_MEMORY || r == VK_ERROR_FRAGMENTED_POOL) {
      flush();
      if (!st_.ok()) return;
      r = vkAllocateDescriptorSets(im_.ctx->device(), &ai, &set);
    }
    if (r != VK_SUCCESS) {
      st_ = im_.ctx->check(r, "vkAllocateDescriptorSets");
      return;
    }
    VkDescriptorBufferInfo bi[kMaxBindings]{};
    VkWriteDescriptorSet w[kMaxBindings]{};
    uint32_t i = 0;
    for (VkBuffer b : bufs) {
      bi[i] = {b, 0, VK_WHOLE_SIZE};
      w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
      w[i].dstSet = set;
      w[i].dstBinding = i;
      w[i].descriptorCount = 1;
      w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      w[i].pBufferInfo = &bi[i];
      ++i;
    }
    if (i != pl->n_bindings) {
      st_ = Status::internal(std::string(shader) + ": wrong number of buffers");
      return;
    }
    vkUpdateDescriptorSets(im_.ctx->device(), i, w, 0, nullptr);
    vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, pl->pipe);
    vkCmdBindDescriptorSets(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, pl->layout, 0, 1, &set, 0, nullptr);
    uint8_t pcb[kPushBytes]{};
    std::memcpy(pcb, pc, std::min<size_t>(pc_size, kPushBytes));
    vkCmdPushConstants(cb_, pl->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushBytes, pcb);
    vkCmdDispatch(cb_, gx, gy, gz);
  }

  // 1-D work of n invocations spread over a 2-D grid of 64-wide groups.
  void dispatch_flat(const char* shader, std::initializer_list<VkBuffer> bufs, const void* pc, size_t pc_size,
                     uint64_t n) {
    const uint64_t groups = std::max<uint64_t>(1, (n + kWg - 1) / kWg);
    const uint32_t gx = static_cast<uint32_t>(std::min<uint64_t>(groups, kMaxGroups));
    const uint32_t gy = static_cast<uint32_t>((groups + gx - 1) / gx);
    dispatch(shader, bufs, pc, pc_size, gx, gy, 1);
  }

  // rms_norm.comp over `rows` rows of `n` floats: one workgroup per row,
  // spread over y past the 65535-group limit.
  void rms_rows(VkBuffer x, VkBuffer w, VkBuffer y, uint64_t n, uint64_t rows, uint32_t eps_bits) {
    const uint32_t pc[3] = {static_cast<uint32_t>(n), eps_bits, static_cast<uint32_t>(rows)};
    const uint32_t gx = static_cast<uint32_t>(std::min<uint64_t>(std::max<uint64_t>(rows, 1), kMaxGroups));
    const uint32_t gy = static_cast<uint32_t>((std::max<uint64_t>(rows, 1) + gx - 1) / gx);
    // float64: the CPU's rms_norm bitwise (rms_norm.comp); else within
    // float rounding of it.
    dispatch(im_.ctx->info().shader_float64 ? "rms_norm_f64" : "rms_norm", {x, w, y}, pc, sizeof pc, gx, gy, 1);
  }

  void barrier() {
    if (!st_.ok()) return;
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                             VK_PIPELINE_STAGE_HOST_BIT,
                         0, 1, &mb, 0, nullptr, 0, nullptr);
  }

  void copy(VkBuffer src, VkBuffer dst, uint64_t bytes, uint64_t src_off = 0, uint64_t dst_off = 0) {
    if (!st_.ok() || bytes == 0) return;
    VkBufferCopy c{src_off, dst_off, bytes};
    vkCmdCopyBuffer(cb_, src, dst, 1, &c);
  }

  Status finish() {
    if (!st_.ok()) {
      if (open_) vkEndCommandBuffer(cb_);
      open_ = false;
      vkResetDescriptorPool(im_.ctx->device(), im_.dpool, 0);
      return st_;
    }
    barrier();
    submit();
    return st_;
  }

 private:
  void begin() {
    st_ = im_.ctx->require_healthy();
    if (!st_.ok()) return;
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    st_ = im_.ctx->check(vkBeginCommandBuffer(cb_, &bi), "vkBeginCommandBuffer");
    open_ = st_.ok();
  }
  void submit() {
    open_ = false;
    st_ = im_.ctx->check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer");
    if (st_.ok()) st_ = im_.ctx->submit_and_wait();
    // After a real timeout the GPU may still read the sets: leave the pool alone.
    if (!im_.ctx->in_flight()) vkResetDescriptorPool(im_.ctx->device(), im_.dpool, 0);
  }
  void flush() {
    barrier();
    submit();
    if (st_.ok()) begin();
  }

  Impl& im_;
  VkCommandBuffer cb_;
  Status st_;
  bool open_ = false;
};

Status VulkanBackend::Impl::upload(DeviceBuffer& dst, const void* src, uint64_t bytes) {
  const uint64_t chunk = std::min<uint64_t>(kStagingBytes, ctx->max_buffer_bytes());
  if (!staging.valid() || staging.size() < std::min(bytes, chunk)) {
    staging.reset();
    SPW_ASSIGN_OR_RETURN(staging, alloc(std::min(bytes, chunk), MemoryCategory::kStaging, "staging", true));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  for (uint64_t off = 0; off < bytes; off += staging.size()) {
    const uint64_t n = std::min<uint64_t>(staging.size(), bytes - off);
    std::memcpy(staging.mapped(), s + off, n);
    Recorder rec(*this);
    rec.copy(staging.buffer(), dst.buffer(), (n + 3) & ~uint64_t{3}, 0, off);
    SPW_RETURN_IF_ERROR(rec.finish());
  }
  return Status();
}

Status VulkanBackend::Impl::upload_matrix(const WeightMatrix& w, const std::string& owner, DevMatrix& out) {
  // prepare() checks first; this guards other callers (op_matmul).
  SPW_RETURN_IF_ERROR(vulkan_check_weight_type(w));
  if (w.type == gguf::GgmlType::kF16 && w.n_cols % 2 != 0)
    return Status::invalid_argument("vulkan: F16 matrix with an odd row length");
  out.type = w.type;
  out.n_rows = w.n_rows;
  out.n_cols = w.n_cols;
  out.row_bytes = w.row_bytes;
  out.chunks.clear();
  const uint64_t maxb = ctx->weight_chunk_bytes();
  const int64_t rows_per = static_cast<int64_t>(maxb / w.row_bytes);
  if (rows_per < 1) return Status::invalid_argument("vulkan: one row of " + (w.name ? *w.name : std::string("?")) +
                                                    " exceeds the largest buffer");
  for (int64_t r0 = 0; r0 < w.n_rows; r0 += rows_per) {
    DevChunk c;
    c.row0 = r0;
    c.n_rows = std::min(rows_per, w.n_rows - r0);
    const uint64_t bytes = static_cast<uint64_t>(c.n_rows) * w.row_bytes;
    SPW_ASSIGN_OR_RETURN(c.buf, alloc(bytes, MemoryCategory::kWeights, owner));
    SPW_RETURN_IF_ERROR(upload(c.buf, w.data + static_cast<size_t>(r0) * w.row_bytes, bytes));
    out.chunks.push_back(std::move(c));
  }
  return Status();
}

Status VulkanBackend::Impl::upload_vector(const std::vector<float>& v, const std::string& owner, DeviceBuffer& out) {
  SPW_ASSIGN_OR_RETURN(out, alloc(v.size() * sizeof(float), MemoryCategory::kWeights, owner));
  return upload(out, v.data(), v.size() * sizeof(float));
}

Result<ModelWeights*> VulkanBackend::Impl::weights(const Model& model) {
  auto it = models.find(&model);
  if (it == models.end() || it->second->fingerprint != model.fingerprint_hash())
    return Status::failed_precondition("model not prepared on " + name() + " (call prepare)");
  return it->second.get();
}

Status VulkanBackend::Impl::prepare(const Model& model, int32_t lb, int32_t le, bool embedding, bool output) {
  const auto& hp = model.hparams();
  if (lb < 0 || le > hp.n_layer || lb > le)
    return Status::invalid_argument(name() + ": bad layer range [" + std::to_string(lb) + ", " + std::to_string(le) + ")");
  SPW_RETURN_IF_ERROR(healthy_or_error());
  // Refuse types without shaders before anything is allocated or uploaded.
  SPW_RETURN_IF_ERROR(vulkan_check_weight_types(model, lb, le, embedding, output));
  auto& slot = models[&model];
  if (slot && slot->fingerprint != model.fingerprint_hash()) slot.reset();  // a different model at the same address
  const bool created = !slot;
  if (!slot) {
    slot = std::make_unique<ModelWeights>();
    slot->fingerprint = model.fingerprint_hash();
    slot->owner = "model:" + hex64(model.fingerprint_hash());
    slot->layers.resize(static_cast<size_t>(hp.n_layer));
  }
  ModelWeights& mw = *slot;
  // All-or-nothing per call: build into temporaries, commit on success.
  std::vector<std::pair<int32_t, DevLayer>> fresh;
  std::shared_ptr<DevMatrix> embd, out;
  DeviceBuffer out_norm;
  Status st;
  for (int32_t il = lb; st.ok() && il < le; ++il) {
    if (mw.layers[static_cast<size_t>(il)].present) continue;
    const LlamaLayerWeights& L = model.layer(il);
    DevLayer d;
    st = upload_vector(L.attn_norm, mw.owner, d.attn_norm);
    if (st.ok()) st = upload_vector(L.ffn_norm, mw.owner, d.ffn_norm);
    const std::pair<const std::vector<float>*, DeviceBuffer*> optional[] = {
        {&L.bq, &d.bq}, {&L.bk, &d.bk}, {&L.bv, &d.bv}, {&L.q_norm, &d.q_norm}, {&L.k_norm, &d.k_norm}};
    for (const auto& [v, buf] : optional)
      if (st.ok() && !v->empty()) st = upload_vector(*v, mw.owner, *buf);
    const std::pair<const WeightMatrix*, DevMatrix*> mats[] = {{&L.wq, &d.wq},     {&L.wk, &d.wk},     {&L.wv, &d.wv},
                                                               {&L.wo, &d.wo},     {&L.w_gate, &d.gate}, {&L.w_up, &d.up},
                                                               {&L.w_down, &d.down}};
    for (const auto& [w, dm] : mats)
      if (st.ok()) st = upload_matrix(*w, mw.owner, *dm);
    d.present = true;
    fresh.emplace_back(il, std::move(d));
  }
  if (st.ok() && embedding && !mw.tok_embd) {
    if (model.output_tied() && mw.output) {
      embd = mw.output;
    } else {
      embd = std::make_shared<DevMatrix>();
      st = upload_matrix(model.tok_embd(), mw.owner, *embd);
    }
  }
  if (st.ok() && output && !mw.output) {
    if (model.output_tied() && (embd || mw.tok_embd)) {
      out = embd ? embd : mw.tok_embd;
    } else {
      out = std::make_shared<DevMatrix>();
      st = upload_matrix(model.output(), mw.owner, *out);
    }
    if (st.ok()) st = upload_vector(model.output_norm(), mw.owner, out_norm);
  }
  staging.reset();  // bounded, but not kept between prepares
  if (!st.ok()) {
    if (created) models.erase(&model);
    return st;
  }
  for (auto& [il, d] : fresh) mw.layers[static_cast<size_t>(il)] = std::move(d);
  if (embd) mw.tok_embd = embd;
  if (out) {
    mw.output = out;
    mw.output_norm = std::move(out_norm);
  }
  return Status();
}

// ------------------------------------------------------------------ VulkanBackend

VulkanBackend::VulkanBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VulkanBackend::~VulkanBackend() = default;

Result<std::shared_ptr<VulkanBackend>> VulkanBackend::create(const VulkanBackendOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  SPW_RETURN_IF_ERROR(impl->init());
  return std::shared_ptr<VulkanBackend>(new VulkanBackend(std::move(impl)));
}

std::string VulkanBackend::name() const { return impl_->name(); }
const VulkanDeviceInfo& VulkanBackend::device_info() const { return impl_->info; }
const VulkanBackendOptions& VulkanBackend::options() const { return impl_->opts; }
FaultInjector& VulkanBackend::faults() { return impl_->faults; }

// These three never take the queue (impl_->mu): the allocator and the
// context's health have locks of their own, held for microseconds.
DeviceMemoryStats VulkanBackend::memory_stats() const {
  const std::shared_ptr<VulkanContext> c = impl_->published_ctx();
  return c ? c->allocator().stats() : DeviceMemoryStats{};
}

bool VulkanBackend::healthy() const {
  const std::shared_ptr<VulkanContext> c = impl_->published_ctx();
  return c && c->healthy();
}

std::string VulkanBackend::health_reason() const {
  const std::shared_ptr<VulkanContext> c = impl_->published_ctx();
  if (!c) return "not initialised";
  return c->healthy() ? std::string() : c->health_reason();
}

Status VulkanBackend::reinitialize() {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  impl_->teardown();
  return impl_->init();
}

void VulkanBackend::release_model(const Model& model) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  if (impl_->ctx) impl_->ctx->wait_idle();
  impl_->models.erase(&model);
}

Status VulkanBackend::prepare(const Model& model, int32_t lb, int32_t le, bool embedding, bool output) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  return impl_->prepare(model, lb, le, embedding, output);
}

Result<std::shared_ptr<KvPool>> VulkanBackend::create_kv_pool(const KvPoolOptions& o, const std::string& owner) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  SPW_RETURN_IF_ERROR(impl_->healthy_or_error());
  if (o.layer_end <= o.layer_begin || o.n_blocks <= 0 || o.block_tokens <= 0 || o.n_embd_kv <= 0)
    return KvPool::create_on_device(o, nullptr).status();  // the pool's own option errors
  // F16 rows are packed two halves per uint (unpackHalf2x16 in the shaders,
  // no 16-bit storage feature needed); Q8_0 is not stored on the device.
  SPW_RETURN_IF_ERROR(check_device_kv_type(o.type, o.n_embd_kv, o.head_dim > 0 ? o.head_dim : o.n_embd_kv)
                          .with_context(impl_->name()));
  auto st = std::make_unique<VulkanKvStorage>();
  st->ctx = impl_->ctx;
  st->dev_name = impl_->name();
  st->type = o.type;
  const uint64_t layer_bytes = static_cast<uint64_t>(o.n_blocks) * static_cast<uint64_t>(o.block_tokens) *
                               kv_row_bytes(o.type, static_cast<uint64_t>(o.n_embd_kv));
  if (layer_bytes > impl_->ctx->max_buffer_bytes())
    return Status::invalid_argument("KV of one layer (" + std::to_string(layer_bytes) + " bytes) exceeds the largest " +
                                    impl_->name() + " buffer (" + std::to_string(impl_->ctx->max_buffer_bytes()) +
                                    "); use fewer blocks");
  const std::string own = "kv:" + owner;
  for (int32_t l = o.layer_begin; l < o.layer_end; ++l) {
    SPW_ASSIGN_OR_RETURN(DeviceBuffer k, impl_->alloc(layer_bytes, MemoryCategory::kKv, own));
    SPW_ASSIGN_OR_RETURN(DeviceBuffer v, impl_->alloc(layer_bytes, MemoryCategory::kKv, own));
    st->k.push_back(std::move(k));
    st->v.push_back(std::move(v));
    st->total += 2 * layer_bytes;
  }
  return KvPool::create_on_device(o, std::move(st));
}

bool VulkanBackend::accepts_kv(const KvPool& pool) const {
  auto* st = dynamic_cast<const VulkanKvStorage*>(pool.device_storage());
  std::lock_guard<TimedMutex> lk(impl_->mu);
  return st != nullptr && impl_->ctx != nullptr && st->ctx == impl_->ctx;
}

Status VulkanBackend::embed(const Model& model, std::span<const TokenId> tokens, float* hidden) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  const auto& hp = model.hparams();
  for (TokenId t : tokens)
    if (t < 0 || t >= hp.n_vocab)
      return Status::invalid_argument("token id " + std::to_string(t) + " out of range [0, " +
                                      std::to_string(hp.n_vocab) + ")");
  if (tokens.empty()) return Status();
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  SPW_ASSIGN_OR_RETURN(ModelWeights * mw, im.weights(model));
  if (!mw->tok_embd) return Status::failed_precondition("embedding not prepared on " + im.name());
  const uint64_t n = tokens.size();
  const uint64_t hbytes = n * static_cast<uint64_t>(hp.n_embd) * sizeof(float);
  Scratch& s = im.scratch;
  SPW_RETURN_IF_ERROR(im.ensure(s.io_tokens, n * sizeof(int32_t), true));
  SPW_RETURN_IF_ERROR(im.ensure(s.io_hidden, hbytes, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.x, hbytes, false));
  std::memcpy(s.io_tokens.mapped(), tokens.data(), n * sizeof(int32_t));
  Impl::Recorder rec(im);
  const DevMatrix& m = *mw->tok_embd;
  for (const DevChunk& c : m.chunks) {
    const uint32_t pc[4] = {static_cast<uint32_t>(m.n_cols), static_cast<uint32_t>(c.n_rows),
                            static_cast<uint32_t>(c.row0), static_cast<uint32_t>(m.row_bytes)};
    rec.dispatch(embed_shader(m.type), {c.buf.buffer(), s.io_tokens.buffer(), s.x.buffer()}, pc, sizeof pc,
                 static_cast<uint32_t>(n));
  }
  rec.barrier();
  rec.copy(s.x.buffer(), s.io_hidden.buffer(), hbytes);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(hidden, s.io_hidden.mapped(), hbytes);
  return Status();
}

namespace {

// y[t][row0 + r] for every chunk; x is F32 [n][n_cols] or, for the quantised
// types, already quantised into (xq, xd) in the type's activation format.
void record_matmul(VulkanBackend::Impl::Recorder& rec, const DevMatrix& m, VkBuffer x, VkBuffer xq, VkBuffer xd,
                   uint32_t n_tokens, VkBuffer y, uint32_t y_stride) {
  for (const DevChunk& c : m.chunks) {
    const uint32_t pc[5] = {static_cast<uint32_t>(m.n_cols), static_cast<uint32_t>(c.n_rows),
                            static_cast<uint32_t>(c.row0), y_stride, static_cast<uint32_t>(m.row_bytes)};
    const uint32_t rows = static_cast<uint32_t>(c.n_rows);
    const uint32_t gx = std::min(rows, kMaxGroups);
    const uint32_t gz = (rows + gx - 1) / gx;
    if (cpu::act_format(m.type) != cpu::ActFormat::kFloat) {
      rec.dispatch(rec.matmul_shader(m.type), {c.buf.buffer(), xq, xd, y}, pc, sizeof pc, gx, n_tokens, gz);
    } else {
      rec.dispatch(rec.matmul_shader(m.type), {c.buf.buffer(), x, x, y}, pc, sizeof pc, gx, n_tokens, gz);
    }
  }
}

void record_quantize(VulkanBackend::Impl::Recorder& rec, cpu::ActFormat f, VkBuffer x, VkBuffer xq, VkBuffer xd,
                     uint64_t n_floats) {
  const uint64_t blocks = n_floats / static_cast<uint64_t>(cpu::act_block_elems(f));
  const uint32_t pc[1] = {static_cast<uint32_t>(blocks)};
  rec.dispatch_flat(rec.quantize_shader(f), {x, xq, xd}, pc, sizeof pc, blocks);
  rec.barrier();
}

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

}  // namespace

Status VulkanBackend::forward_layers(const Model& model, int32_t layer_begin, int32_t layer_end, const KvSequence& kv,
                                     int32_t pos0, int32_t n_tokens, float* hidden) {
  const SeqSlice one{kv, pos0, n_tokens};
  return forward_batch(model, layer_begin, layer_end, std::span<const SeqSlice>(&one, 1), hidden);
}

Status VulkanBackend::forward_batch(const Model& model, int32_t layer_begin, int32_t layer_end,
                                    std::span<const SeqSlice> slices, float* hidden) {
  const LlamaHparams& hp = model.hparams();
  SPW_RETURN_IF_ERROR(check_slices(hp, layer_begin, layer_end, slices));
  // One pass binds one K/V buffer pair per layer: sequences of different
  // pools (not the server's layout: a session group shares one pool per
  // stage) run one pool after another.
  for (const SeqSlice& sl : slices) {
    if (sl.kv.pool != slices[0].kv.pool) {
      int64_t row = 0;
      for (const SeqSlice& one : slices) {
        SPW_RETURN_IF_ERROR(forward_batch(model, layer_begin, layer_end, std::span<const SeqSlice>(&one, 1),
                                          hidden + row * hp.n_embd));
        row += one.n_tokens;
      }
      return Status();
    }
  }
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  KvPool* pool = slices[0].kv.pool;
  const auto& kvo = pool->options();
  const int32_t bt = pool->block_tokens();
  // The row table (position and block-table offset per row, kv_write.comp)
  // followed by each slice's block ids.
  std::vector<int32_t> table;
  uint64_t n = 0, max_pos = 0, n_block_ids = 0;
  for (const SeqSlice& sl : slices) {
    n += static_cast<uint64_t>(sl.n_tokens);
    max_pos = std::max<uint64_t>(max_pos, static_cast<uint64_t>(sl.pos0) + static_cast<uint64_t>(sl.n_tokens));
    n_block_ids += sl.kv.table->blocks().size();
  }
  table.reserve(2 * n + n_block_ids);
  table.resize(2 * n);
  {
    size_t row = 0;
    for (const SeqSlice& sl : slices) {
      const auto boff = static_cast<int32_t>(table.size());
      for (int32_t t = 0; t < sl.n_tokens; ++t, ++row) {
        table[2 * row] = sl.pos0 + t;
        table[2 * row + 1] = boff;
      }
      const auto& ids = sl.kv.table->blocks();
      table.insert(table.end(), ids.begin(), ids.end());
    }
  }
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  auto* kvs = dynamic_cast<VulkanKvStorage*>(pool->device_storage());
  if (kvs == nullptr || kvs->ctx != im.ctx)
    return Status::invalid_argument("forward_layers: KV pool is not in " + im.name() +
                                    " memory (make it with create_kv_pool, after the last reinitialize)");
  const bool kv_f16 = kvs->type == KvType::kF16;
  SPW_ASSIGN_OR_RETURN(ModelWeights * mw, im.weights(model));
  for (int32_t il = layer_begin; il < layer_end; ++il)
    if (!mw->layers[static_cast<size_t>(il)].present)
      return Status::failed_precondition("layer " + std::to_string(il) + " not prepared on " + im.name());
  if (layer_begin == layer_end) return Status();

  const uint64_t E = static_cast<uint64_t>(hp.n_embd), KV = static_cast<uint64_t>(hp.n_embd_kv()),
                 FF = static_cast<uint64_t>(hp.n_ff), Q = static_cast<uint64_t>(hp.n_embd_q());
  const uint32_t hd = static_cast<uint32_t>(hp.head_dim());
  const uint32_t half = static_cast<uint32_t>(hp.n_rot / 2);
  const uint64_t n_pos = max_pos;  // the longest row's positions: the scores' stride
  const uint64_t qcols = std::max({E, FF, Q});
  // Attention scratch: scores for up to `tc` tokens at a time.
  const uint64_t row_bytes = static_cast<uint64_t>(hp.n_head) * n_pos * sizeof(float);
  const uint64_t tc = std::max<uint64_t>(1, std::min<uint64_t>(n, im.ctx->max_buffer_bytes() / row_bytes));
  if (row_bytes > im.ctx->max_buffer_bytes())
    return Status::invalid_argument("forward_layers: attention scores for " + std::to_string(n_pos) +
                                    " positions exceed the largest buffer");
  Scratch& s = im.scratch;
  SPW_RETURN_IF_ERROR(im.ensure(s.io_hidden, n * E * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.io_rope, 2 * n * std::max<uint32_t>(half, 1) * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.io_blocks, table.size() * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.x, n * E * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.cur, n * E * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.q, n * Q * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.k, n * KV * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.v, n * KV * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.att, n * Q * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.gate, n * FF * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.up, n * FF * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.xq, n * (qcols / 32 + 1) * 32, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.xd, n * (qcols / 32 + 1) * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.scores, tc * row_bytes, false));

  std::memcpy(s.io_hidden.mapped(), hidden, n * E * 4);
  std::memcpy(s.io_blocks.mapped(), table.data(), table.size() * 4);
  if (half > 0) {
    // cos rows of every slice, then their sin rows (rope.comp's layout).
    float* cs = static_cast<float*>(s.io_rope.mapped());
    uint64_t row = 0;
    for (const SeqSlice& sl : slices) {
      cpu::rope_table(sl.pos0, sl.n_tokens, hp.n_rot, hp.rope_freq_base, cs + row * half, cs + (n + row) * half,
                      cpu::rope_scaling(model));
      row += static_cast<uint64_t>(sl.n_tokens);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float eps = hp.rms_eps;
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, 4);
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, 4);
  const uint32_t nt = static_cast<uint32_t>(n);

  Impl::Recorder rec(im);
  rec.copy(s.io_hidden.buffer(), s.x.buffer(), n * E * 4);
  rec.barrier();
  auto rms = [&](VkBuffer w) {
    rec.rms_rows(s.x.buffer(), w, s.cur.buffer(), E, n, eps_bits);
    rec.barrier();
  };
  auto add = [&](VkBuffer from, uint64_t count) {
    const uint32_t pc[1] = {static_cast<uint32_t>(count)};
    rec.dispatch_flat("add", {s.x.buffer(), from}, pc, sizeof pc, count);
    rec.barrier();
  };
  for (int32_t il = layer_begin; il < layer_end; ++il) {
    const DevLayer& L = mw->layers[static_cast<size_t>(il)];
    const size_t lp = static_cast<size_t>(il - kvo.layer_begin);
    rms(L.attn_norm.buffer());
    {
      MatmulInput in(rec, s.cur.buffer(), s.xq.buffer(), s.xd.buffer(), n * E);
      in.matmul(L.wq, nt, s.q.buffer(), static_cast<uint32_t>(Q));
      in.matmul(L.wk, nt, s.k.buffer(), static_cast<uint32_t>(KV));
      in.matmul(L.wv, nt, s.v.buffer(), static_cast<uint32_t>(KV));
    }
    rec.barrier();
    if (L.bq.buffer() != VK_NULL_HANDLE) {  // Qwen2
      const std::pair<VkBuffer, std::pair<VkBuffer, uint64_t>> biases[] = {
          {s.q.buffer(), {L.bq.buffer(), Q}}, {s.k.buffer(), {L.bk.buffer(), KV}}, {s.v.buffer(), {L.bv.buffer(), KV}}};
      for (const auto& [y, b] : biases) {
        const uint32_t pb[2] = {static_cast<uint32_t>(n * b.second), static_cast<uint32_t>(b.second)};
        rec.dispatch_flat("add_bias", {y, b.first}, pb, sizeof pb, n * b.second);
      }
      rec.barrier();
    }
    if (L.q_norm.buffer() != VK_NULL_HANDLE) {  // Qwen3: each head of Q and K, through att as scratch
      rec.rms_rows(s.q.buffer(), L.q_norm.buffer(), s.att.buffer(), hd, n * hp.n_head, eps_bits);
      rec.barrier();
      rec.copy(s.att.buffer(), s.q.buffer(), n * Q * 4);
      rec.barrier();
      rec.rms_rows(s.k.buffer(), L.k_norm.buffer(), s.att.buffer(), hd, n * hp.n_head_kv, eps_bits);
      rec.barrier();
      rec.copy(s.att.buffer(), s.k.buffer(), n * KV * 4);
      rec.barrier();
    }
    if (half > 0) {
      const bool neox = hp.rope_style == RopeStyle::kNeox;
      const char* rope = rec.exact_attention() ? (neox ? "rope_neox_f64" : "rope_f64") : (neox ? "rope_neox" : "rope");
      const uint32_t pq[5] = {nt, static_cast<uint32_t>(hp.n_head), hd, half, static_cast<uint32_t>(Q)};
      rec.dispatch_flat(rope, {s.q.buffer(), s.io_rope.buffer()}, pq, sizeof pq, n * hp.n_head * half);
      const uint32_t pk[5] = {nt, static_cast<uint32_t>(hp.n_head_kv), hd, half, static_cast<uint32_t>(KV)};
      rec.dispatch_flat(rope, {s.k.buffer(), s.io_rope.buffer()}, pk, sizeof pk, n * hp.n_head_kv * half);
      rec.barrier();
    }
    const uint32_t pw[3] = {nt, static_cast<uint32_t>(KV), static_cast<uint32_t>(bt)};
    // F16: one invocation per pair of halves (one uint of the cache).
    rec.dispatch_flat(kv_f16 ? "kv_write_f16" : "kv_write",
                      {s.k.buffer(), s.v.buffer(), kvs->k[lp].buffer(), kvs->v[lp].buffer(), s.io_blocks.buffer()}, pw,
                      sizeof pw, kv_f16 ? n * KV / 2 : n * KV);
    rec.barrier();
    for (uint64_t t0 = 0; t0 < n; t0 += tc) {
      const uint32_t cnt = static_cast<uint32_t>(std::min(tc, n - t0));
      const uint32_t pa[10] = {hd,
                               static_cast<uint32_t>(hp.n_head),
                               static_cast<uint32_t>(hp.n_gqa()),
                               static_cast<uint32_t>(KV),
                               static_cast<uint32_t>(bt),
                               static_cast<uint32_t>(t0),
                               static_cast<uint32_t>(n_pos),
                               static_cast<uint32_t>(Q),
                               scale_bits,
                               cpu::active_kernel_traits().dot_tail8 ? 1u : 0u};
      // The exact variant keeps four output elements per invocation.
      const char* attention = rec.exact_attention() && hd <= 4 * kWg ? (kv_f16 ? "attention_f16_f64" : "attention_f64")
                                                                     : (kv_f16 ? "attention_f16" : "attention");
      rec.dispatch(attention,
                   {s.q.buffer(), kvs->k[lp].buffer(), kvs->v[lp].buffer(), s.io_blocks.buffer(), s.scores.buffer(),
                    s.att.buffer()},
                   pa, sizeof pa, static_cast<uint32_t>(hp.n_head), cnt, 1);
      rec.barrier();
    }
    MatmulInput(rec, s.att.buffer(), s.xq.buffer(), s.xd.buffer(), n * Q).matmul(L.wo, nt, s.cur.buffer(),
                                                                                   static_cast<uint32_t>(E));
    rec.barrier();
    add(s.cur.buffer(), n * E);
    rms(L.ffn_norm.buffer());
    {
      MatmulInput in(rec, s.cur.buffer(), s.xq.buffer(), s.xd.buffer(), n * E);
      in.matmul(L.gate, nt, s.gate.buffer(), static_cast<uint32_t>(FF));
      in.matmul(L.up, nt, s.up.buffer(), static_cast<uint32_t>(FF));
    }
    rec.barrier();
    const uint32_t ps[1] = {static_cast<uint32_t>(n * FF)};
    rec.dispatch_flat(rec.swiglu_shader(), {s.gate.buffer(), s.up.buffer()}, ps, sizeof ps, n * FF);
    rec.barrier();
    MatmulInput(rec, s.gate.buffer(), s.xq.buffer(), s.xd.buffer(), n * FF)
        .matmul(L.down, nt, s.cur.buffer(), static_cast<uint32_t>(E));
    rec.barrier();
    add(s.cur.buffer(), n * E);
  }
  rec.copy(s.x.buffer(), s.io_hidden.buffer(), n * E * 4);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(hidden, s.io_hidden.mapped(), n * E * 4);
  return Status();
}

Status VulkanBackend::output(const Model& model, const float* hidden, int32_t n_rows, float* logits) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  const auto& hp = model.hparams();
  if (n_rows <= 0) return n_rows == 0 ? Status() : Status::invalid_argument("output: n_rows < 0");
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  SPW_ASSIGN_OR_RETURN(ModelWeights * mw, im.weights(model));
  if (!mw->output) return Status::failed_precondition("output head not prepared on " + im.name());
  const DevMatrix& m = *mw->output;
  const uint64_t n = static_cast<uint64_t>(n_rows), E = static_cast<uint64_t>(hp.n_embd),
                 V = static_cast<uint64_t>(hp.n_vocab);
  Scratch& s = im.scratch;
  SPW_RETURN_IF_ERROR(im.ensure(s.io_hidden, n * E * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.io_logits, n * V * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.x, n * E * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.cur, n * E * 4, false));
  if (cpu::act_format(m.type) != cpu::ActFormat::kFloat) {
    SPW_RETURN_IF_ERROR(im.ensure(s.xq, n * (E / 32 + 1) * 32, false));
    SPW_RETURN_IF_ERROR(im.ensure(s.xd, n * (E / 32 + 1) * 4, false));
  }
  std::memcpy(s.io_hidden.mapped(), hidden, n * E * 4);
  const float eps = hp.rms_eps;
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, 4);
  Impl::Recorder rec(im);
  rec.copy(s.io_hidden.buffer(), s.x.buffer(), n * E * 4);
  rec.barrier();
  rec.rms_rows(s.x.buffer(), mw->output_norm.buffer(), s.cur.buffer(), E, n, eps_bits);
  rec.barrier();
  MatmulInput(rec, s.cur.buffer(), s.xq.buffer(), s.xd.buffer(), n * E)
      .matmul(m, static_cast<uint32_t>(n), s.io_logits.buffer(), static_cast<uint32_t>(V));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(logits, s.io_logits.mapped(), n * V * 4);
  return Status();
}

// ------------------------------------------------------------------ single ops

namespace {
// Host-visible temporaries for one op, freed when it returns.
struct OpBuffers {
  std::vector<DeviceBuffer> bufs;
};
}  // namespace

Status VulkanBackend::op_matmul(const WeightMatrix& w, const float* x, int32_t n_tokens, float* y) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  if (n_tokens <= 0) return Status::invalid_argument("op_matmul: n_tokens <= 0");
  const int64_t block = cpu::act_block_elems(cpu::act_format(w.type));
  if (w.n_cols % block != 0)
    return Status::invalid_argument("op_matmul: " + std::string(gguf::ggml_type_name(static_cast<uint32_t>(w.type))) +
                                    " needs n_cols % " + std::to_string(block) + " == 0");
  DevMatrix m;
  SPW_RETURN_IF_ERROR(im.upload_matrix(w, "op", m));
  im.staging.reset();
  const uint64_t n = static_cast<uint64_t>(n_tokens);
  const uint64_t xin = n * static_cast<uint64_t>(w.n_cols) * 4, yout = n * static_cast<uint64_t>(w.n_rows) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(xin, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer by, im.alloc(yout, MemoryCategory::kScratch, "op", true));
  const uint64_t nb = static_cast<uint64_t>(w.n_cols) / 32 + 1;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bq, im.alloc(n * nb * 32, MemoryCategory::kScratch, "op"));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bd, im.alloc(n * nb * 4, MemoryCategory::kScratch, "op"));
  std::memcpy(bx.mapped(), x, xin);
  Impl::Recorder rec(im);
  MatmulInput(rec, bx.buffer(), bq.buffer(), bd.buffer(), n * static_cast<uint64_t>(w.n_cols))
      .matmul(m, static_cast<uint32_t>(n), by.buffer(), static_cast<uint32_t>(w.n_rows));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(y, by.mapped(), yout);
  return Status();
}

Status VulkanBackend::op_quantize(cpu::ActFormat f, const float* x, int64_t n, int8_t* qs, uint32_t* scales) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const int64_t block = cpu::act_block_elems(f);
  if (f == cpu::ActFormat::kFloat || n <= 0 || n % block != 0)
    return Status::invalid_argument("op_quantize: n must be a positive multiple of the format's block");
  const uint64_t un = static_cast<uint64_t>(n), nb = un / static_cast<uint64_t>(block);
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(un * 4, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bq, im.alloc(un, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bd, im.alloc(nb * 4, MemoryCategory::kScratch, "op", true));
  std::memcpy(bx.mapped(), x, un * 4);
  Impl::Recorder rec(im);
  record_quantize(rec, f, bx.buffer(), bq.buffer(), bd.buffer(), un);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(qs, bq.mapped(), un);  // little-endian packing = byte order
  std::memcpy(scales, bd.mapped(), nb * 4);
  return Status();
}

Status VulkanBackend::op_rms_norm(const float* x, const float* weight, int32_t n, int32_t n_tokens, float eps, float* y) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint64_t bytes = static_cast<uint64_t>(n) * static_cast<uint64_t>(n_tokens) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bw, im.alloc(static_cast<uint64_t>(n) * 4, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer by, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  std::memcpy(bx.mapped(), x, bytes);
  std::memcpy(bw.mapped(), weight, static_cast<size_t>(n) * 4);
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, 4);
  Impl::Recorder rec(im);
  rec.rms_rows(bx.buffer(), bw.buffer(), by.buffer(), static_cast<uint64_t>(n), static_cast<uint64_t>(n_tokens),
               eps_bits);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(y, by.mapped(), bytes);
  return Status();
}

Status VulkanBackend::op_swiglu(const float* gate, const float* up, int64_t n, float* out) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint64_t bytes = static_cast<uint64_t>(n) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bg, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bu, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  std::memcpy(bg.mapped(), gate, bytes);
  std::memcpy(bu.mapped(), up, bytes);
  const uint32_t pc[1] = {static_cast<uint32_t>(n)};
  Impl::Recorder rec(im);
  rec.dispatch_flat(rec.swiglu_shader(), {bg.buffer(), bu.buffer()}, pc, sizeof pc, static_cast<uint64_t>(n));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(out, bg.mapped(), bytes);
  return Status();
}

Status VulkanBackend::op_add(float* y, const float* x, int64_t n) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint64_t bytes = static_cast<uint64_t>(n) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer by, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  std::memcpy(by.mapped(), y, bytes);
  std::memcpy(bx.mapped(), x, bytes);
  const uint32_t pc[1] = {static_cast<uint32_t>(n)};
  Impl::Recorder rec(im);
  rec.dispatch_flat("add", {by.buffer(), bx.buffer()}, pc, sizeof pc, static_cast<uint64_t>(n));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(y, by.mapped(), bytes);
  return Status();
}

Status VulkanBackend::health_check() {
  // The injected failure is the check's own (as a wrong answer would be):
  // it touches nothing, and the device stays healthy.
  if (impl_->faults.take_health_failure()) {
    return Status(StatusCode::kUnavailable, "health check of " + name() + " failed (injected)",
                  FailureReason::kUnhealthy);
  }
  // A submission holding the queue longer than a fence wait may last is
  // hung (each of its waits ends at the fence timeout): the check says so
  // instead of joining the wait, so the prober and shutdown stay bounded.
  std::unique_lock<TimedMutex> lk(impl_->mu, std::defer_lock);
  if (!lk.try_lock_for(std::chrono::milliseconds(impl_->opts.fence_timeout_ms))) {
    return Status(StatusCode::kDeadlineExceeded,
                  "health check of " + name() + ": the queue stayed busy for the whole fence timeout (" +
                      std::to_string(impl_->opts.fence_timeout_ms) + " ms)",
                  FailureReason::kTimeout);
  }
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  constexpr int64_t kN = 64;
  std::vector<float> y(kN), x(kN);
  for (int64_t i = 0; i < kN; ++i) {
    y[static_cast<size_t>(i)] = static_cast<float>(i);
    x[static_cast<size_t>(i)] = 0.5f;
  }
  const uint64_t bytes = kN * 4;
  Result<DeviceBuffer> by = im.alloc(bytes, MemoryCategory::kScratch, "health", true);
  Result<DeviceBuffer> bx = by.ok() ? im.alloc(bytes, MemoryCategory::kScratch, "health", true) : by.status();
  if (!bx.ok()) {
    // The budget is full (no typed reason: nothing is wrong with the
    // device): check the queue and fence alone with an empty submission.
    if (bx.status().reason() != FailureReason::kNone) return bx.status();
    Impl::Recorder rec(im);
    return rec.finish();
  }
  std::memcpy(by->mapped(), y.data(), bytes);
  std::memcpy(bx->mapped(), x.data(), bytes);
  const uint32_t pc[1] = {static_cast<uint32_t>(kN)};
  Impl::Recorder rec(im);
  rec.dispatch_flat("add", {by->buffer(), bx->buffer()}, pc, sizeof pc, static_cast<uint64_t>(kN));
  SPW_RETURN_IF_ERROR(rec.finish());
  const auto* out = static_cast<const float*>(by->mapped());
  for (int64_t i = 0; i < kN; ++i) {
    if (out[i] != static_cast<float>(i) + 0.5f) {
      const std::string msg = "health check of " + name() + ": wrong result at " + std::to_string(i);
      im.ctx->mark_unhealthy(msg, FailureReason::kUnhealthy);
      return Status(StatusCode::kInternal, msg, FailureReason::kUnhealthy);
    }
  }
  return Status();
}

Status VulkanBackend::op_rope(float* x, int32_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_rot, int32_t pos0,
                              float freq_base) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint32_t half = static_cast<uint32_t>(n_rot / 2);
  const uint64_t n = static_cast<uint64_t>(n_tokens);
  const uint64_t bytes = n * static_cast<uint64_t>(n_heads) * static_cast<uint64_t>(head_dim) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bt, im.alloc(2 * n * std::max<uint32_t>(half, 1) * 4, MemoryCategory::kScratch, "op", true));
  std::memcpy(bx.mapped(), x, bytes);
  float* cs = static_cast<float*>(bt.mapped());
  cpu::rope_table(pos0, n_tokens, n_rot, freq_base, cs, cs + n * half);
  const uint32_t pc[5] = {static_cast<uint32_t>(n), static_cast<uint32_t>(n_heads), static_cast<uint32_t>(head_dim), half,
                          static_cast<uint32_t>(n_heads * head_dim)};
  Impl::Recorder rec(im);
  rec.dispatch_flat(rec.exact_attention() ? "rope_f64" : "rope", {bx.buffer(), bt.buffer()}, pc, sizeof pc,
                    n * static_cast<uint64_t>(n_heads) * half);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(x, bx.mapped(), bytes);
  return Status();
}

}  // namespace spw
