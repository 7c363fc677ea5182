// Shaders, pipelines and recording: the embedded SPIR-V modules by name,
// their pipelines (made on first use, kept until teardown), and the Recorder
// that records dispatches into the context's command buffer, with the matmul
// helpers every pass records through (vulkan_backend_internal.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "backend/vulkan/vulkan_backend_internal.h"

namespace spw {
namespace vkshaders {
bool find(const char* name, const uint32_t** words, size_t* n_words);  // generated (embed_spirv.cmake)
}

namespace {

// The weight types with shaders, and their matmul variant (one each:
// CMakeLists.txt, shaders/weights.glsl). The K types also have a float64
// matmul, bitwise the CPU's (matmul.comp's fma_rn). (The embedding lookup is
// the host's: cpu::embed_tokens.)
struct TypeShaders {
  gguf::GgmlType type;
  const char* matmul;
  const char* matmul_f64 = nullptr;
};
constexpr TypeShaders kTypeShaders[] = {
    {gguf::GgmlType::kF32, "matmul_f32"},
    {gguf::GgmlType::kF16, "matmul_f16"},
    {gguf::GgmlType::kQ8_0, "matmul_q8_0"},
    {gguf::GgmlType::kQ4_0, "matmul_q4_0"},
    {gguf::GgmlType::kQ4_1, "matmul_q4_1"},
    {gguf::GgmlType::kQ5_0, "matmul_q5_0"},
    {gguf::GgmlType::kQ5_1, "matmul_q5_1"},
    {gguf::GgmlType::kQ4_K, "matmul_q4_k", "matmul_q4_k_f64"},
    {gguf::GgmlType::kQ5_K, "matmul_q5_k", "matmul_q5_k_f64"},
    {gguf::GgmlType::kQ6_K, "matmul_q6_k", "matmul_q6_k_f64"},
};
static_assert(std::size(kTypeShaders) == std::size(kVulkanWeightTypes), "a matmul shader per computed type");

// Bindings per shader; matmul_* take 4 (weights, codes/x, scales, y).
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
                                                        {"swiglu_f64", 2},    {"add", 2},
                                                        {"gather_rows", 3},   {"scatter_add_rows", 3},
                                                        {"geglu", 2},         {"geglu_f64", 2}};
  if (auto it = fixed.find(name); it != fixed.end()) return it->second;
  for (const TypeShaders& t : kTypeShaders) {
    if (std::strcmp(t.matmul, name) == 0) return 4;
    if (t.matmul_f64 != nullptr && std::strcmp(t.matmul_f64, name) == 0) return 4;
  }
  return 0;
}

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

}  // namespace

namespace vulkan_internal {

const char* matmul_shader(gguf::GgmlType t, bool f64) {
  const TypeShaders& ts = type_shaders(t);
  return f64 && ts.matmul_f64 != nullptr ? ts.matmul_f64 : ts.matmul;
}

}  // namespace vulkan_internal

// ------------------------------------------------------------------ pipelines

Result<Pipeline*> VulkanBackend::Impl::pipeline(const char* sname, uint32_t token_tile) {
  // One pipeline per shader and token tile (only the matmuls have tiles).
  const std::string key = token_tile == 1 ? std::string(sname) : std::string(sname) + "/t" + std::to_string(token_tile);
  auto it = pipes.find(key);
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
  // matmul.comp's MM_WG and MM_TT (constant_id 0 and 1); the other shaders
  // have none.
  const uint32_t mm_consts[2] = {matmul_workgroup(info), token_tile};
  const VkSpecializationMapEntry mm_entries[2] = {{0, 0, sizeof(uint32_t)}, {1, sizeof(uint32_t), sizeof(uint32_t)}};
  const VkSpecializationInfo spec{2, mm_entries, sizeof mm_consts, mm_consts};
  if (std::strncmp(sname, "matmul_", 7) == 0) cpi.stage.pSpecializationInfo = &spec;
  cpi.layout = p.layout;
  if (st.ok())
    st = ctx->check(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpi, nullptr, &p.pipe),
                    "vkCreateComputePipelines");
  auto& slot = pipes[key];
  slot = p;  // stored even on failure so teardown destroys what was made
  if (!st.ok()) {
    if (slot.pipe == VK_NULL_HANDLE) {
      if (slot.layout) vkDestroyPipelineLayout(dev, slot.layout, nullptr);
      if (slot.dsl) vkDestroyDescriptorSetLayout(dev, slot.dsl, nullptr);
      if (slot.module) vkDestroyShaderModule(dev, slot.module, nullptr);
      pipes.erase(key);
    }
    return st;
  }
  return &slot;
}

// ------------------------------------------------------------------ Recorder

const char* VulkanBackend::Impl::Recorder::quantize_shader(cpu::ActFormat f) const {
  const bool f64 = im_.ctx->info().shader_float64;
  switch (f) {
    case cpu::ActFormat::kQ8_1: return f64 ? "quantize_q8_1_f64" : "quantize_q8_1";
    case cpu::ActFormat::kQ8_K: return f64 ? "quantize_q8_k_f64" : "quantize_q8_k";
    default: return f64 ? "quantize_q8_0_f64" : "quantize_q8_0";
  }
}

void VulkanBackend::Impl::Recorder::dispatch(const char* shader, std::initializer_list<VkBuffer> bufs,
                                             const void* pc, size_t pc_size, uint32_t gx, uint32_t gy, uint32_t gz,
                                             uint32_t token_tile) {
  if (!st_.ok()) return;
  auto p = im_.pipeline(shader, token_tile);
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
  im_.n_dispatches.fetch_add(1, std::memory_order_relaxed);
}

void VulkanBackend::Impl::Recorder::dispatch_flat(const char* shader, std::initializer_list<VkBuffer> bufs,
                                                  const void* pc, size_t pc_size, uint64_t n) {
  const uint64_t groups = std::max<uint64_t>(1, (n + kWg - 1) / kWg);
  const uint32_t gx = static_cast<uint32_t>(std::min<uint64_t>(groups, kMaxGroups));
  const uint32_t gy = static_cast<uint32_t>((groups + gx - 1) / gx);
  dispatch(shader, bufs, pc, pc_size, gx, gy, 1);
}

void VulkanBackend::Impl::Recorder::rms_rows(VkBuffer x, VkBuffer w, VkBuffer y, uint64_t n, uint64_t rows,
                                             uint32_t eps_bits) {
  const uint32_t pc[3] = {static_cast<uint32_t>(n), eps_bits, static_cast<uint32_t>(rows)};
  const uint32_t gx = static_cast<uint32_t>(std::min<uint64_t>(std::max<uint64_t>(rows, 1), kMaxGroups));
  const uint32_t gy = static_cast<uint32_t>((std::max<uint64_t>(rows, 1) + gx - 1) / gx);
  // float64: the CPU's rms_norm bitwise (rms_norm.comp); else within
  // float rounding of it.
  dispatch(im_.ctx->info().shader_float64 ? "rms_norm_f64" : "rms_norm", {x, w, y}, pc, sizeof pc, gx, gy, 1);
}

void VulkanBackend::Impl::Recorder::barrier() {
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

void VulkanBackend::Impl::Recorder::copy(VkBuffer src, VkBuffer dst, uint64_t bytes, uint64_t src_off,
                                         uint64_t dst_off) {
  if (!st_.ok() || bytes == 0) return;
  VkBufferCopy c{src_off, dst_off, bytes};
  vkCmdCopyBuffer(cb_, src, dst, 1, &c);
}

Status VulkanBackend::Impl::Recorder::finish() {
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

void VulkanBackend::Impl::Recorder::begin() {
  st_ = im_.ctx->require_healthy();
  if (!st_.ok()) return;
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  st_ = im_.ctx->check(vkBeginCommandBuffer(cb_, &bi), "vkBeginCommandBuffer");
  open_ = st_.ok();
}

void VulkanBackend::Impl::Recorder::submit() {
  open_ = false;
  st_ = im_.ctx->check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer");
  if (st_.ok()) {
    im_.n_submissions.fetch_add(1, std::memory_order_relaxed);
    st_ = im_.ctx->submit_and_wait();
  }
  // After a real timeout the GPU may still read the sets: leave the pool alone.
  if (!im_.ctx->in_flight()) vkResetDescriptorPool(im_.ctx->device(), im_.dpool, 0);
}

void VulkanBackend::Impl::Recorder::flush() {
  barrier();
  submit();
  if (st_.ok()) begin();
}

// ------------------------------------------------------------------ matmul helpers

namespace vulkan_internal {

void record_matmul(VulkanBackend::Impl::Recorder& rec, const DevMatrix& m, VkBuffer x, VkBuffer xq, VkBuffer xd,
                   uint32_t n_tokens, VkBuffer y, uint32_t y_stride) {
  // A decode step's single token takes the untiled pipeline: with a tile,
  // the per-token loops and shared rows it would not use cost ~2x on lavapipe.
  // Every tile computes each token the same way, so the choice changes no
  // result (batch invariance).
  const uint32_t tile = n_tokens == 1 ? 1 : kMatmulTokenTile;
  for (const DevChunk& c : m.chunks) {
    const uint32_t pc[6] = {static_cast<uint32_t>(m.n_cols), static_cast<uint32_t>(c.n_rows),
                            static_cast<uint32_t>(c.row0),   y_stride,
                            static_cast<uint32_t>(m.row_bytes), n_tokens};
    const uint32_t rows = static_cast<uint32_t>(c.n_rows);
    const uint32_t gx = std::min(rows, kMaxGroups);
    const uint32_t gy = (n_tokens + tile - 1) / tile;
    const uint32_t gz = (rows + gx - 1) / gx;
    if (cpu::act_format(m.type) != cpu::ActFormat::kFloat) {
      rec.dispatch(rec.matmul_shader(m.type), {c.buf.buffer(), xq, xd, y}, pc, sizeof pc, gx, gy, gz, tile);
    } else {
      rec.dispatch(rec.matmul_shader(m.type), {c.buf.buffer(), x, x, y}, pc, sizeof pc, gx, gy, gz, tile);
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

}  // namespace vulkan_internal

}  // namespace spw
