// Built when Vulkan or glslc is missing: the API exists, nothing runs.
#include "backend/vulkan/vulkan_backend.h"

namespace spw {

bool vulkan_built_in() { return false; }

namespace {
Status not_built() { return Status::unavailable("Spillway was built without the Vulkan backend"); }
}  // namespace

Result<std::vector<VulkanDeviceInfo>> list_vulkan_devices() { return not_built(); }

struct VulkanBackend::Impl {
  VulkanDeviceInfo info;
  VulkanBackendOptions opts;
  FaultInjector faults;
};

VulkanBackend::VulkanBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VulkanBackend::~VulkanBackend() = default;
Result<std::shared_ptr<VulkanBackend>> VulkanBackend::create(const VulkanBackendOptions&) { return not_built(); }
std::string VulkanBackend::name() const { return "vulkan"; }
Status VulkanBackend::prepare(const Model&, int32_t, int32_t, bool, bool) { return not_built(); }
Status VulkanBackend::embed(const Model&, std::span<const TokenId>, float*) { return not_built(); }
Status VulkanBackend::forward_layers(const Model&, int32_t, int32_t, const KvSequence&, int32_t, int32_t, float*) {
  return not_built();
}
Status VulkanBackend::forward_batch(const Model&, int32_t, int32_t, std::span<const SeqSlice>, float*) {
  return not_built();
}
Status VulkanBackend::output(const Model&, const float*, int32_t, float*) { return not_built(); }
Result<std::shared_ptr<KvPool>> VulkanBackend::create_kv_pool(const KvPoolOptions&, const std::string&) {
  return not_built();
}
bool VulkanBackend::accepts_kv(const KvPool&) const { return false; }
void VulkanBackend::release_model(const Model&) {}
Status VulkanBackend::set_cpu_experts(const Model&, bool, int32_t) { return not_built(); }
const VulkanDeviceInfo& VulkanBackend::device_info() const { return impl_->info; }
const VulkanBackendOptions& VulkanBackend::options() const { return impl_->opts; }
DeviceMemoryStats VulkanBackend::memory_stats() const { return {}; }
VulkanWorkCounts VulkanBackend::work_counts() const { return {}; }
FaultInjector& VulkanBackend::faults() { return impl_->faults; }
bool VulkanBackend::healthy() const { return false; }
std::string VulkanBackend::health_reason() const { return "built without Vulkan"; }
Status VulkanBackend::reinitialize() { return not_built(); }
Status VulkanBackend::health_check() { return not_built(); }
Status VulkanBackend::op_matmul(const WeightMatrix&, const float*, int32_t, float*) { return not_built(); }
Status VulkanBackend::op_quantize(cpu::ActFormat, const float*, int64_t, int8_t*, uint32_t*) { return not_built(); }
Status VulkanBackend::op_rms_norm(const float*, const float*, int32_t, int32_t, float, float*) { return not_built(); }
Status VulkanBackend::op_swiglu(const float*, const float*, int64_t, float*) { return not_built(); }
Status VulkanBackend::op_add(float*, const float*, int64_t) { return not_built(); }
Status VulkanBackend::op_rope(float*, int32_t, int32_t, int32_t, int32_t, int32_t, float) { return not_built(); }

}  // namespace spw
