// Which weight types the Vulkan shaders compute, shared by the real backend
// and the stub (so planners can ask without a device).
#include <algorithm>
#include <iterator>
#include <string>

#include "backend/vulkan/vulkan_backend.h"

namespace spw {

bool vulkan_computes_weight_type(gguf::GgmlType t) {
  return std::find(std::begin(kVulkanWeightTypes), std::end(kVulkanWeightTypes), t) != std::end(kVulkanWeightTypes);
}

namespace {
Status refuse(const std::string& tensor, uint32_t type) {
  return Status::unimplemented("vulkan: tensor '" + tensor + "' is " + gguf::ggml_type_name(type) +
                               "; the Vulkan backend computes F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K "
                               "and Q6_K weights only");
}
}  // namespace

Status vulkan_check_weight_type(const WeightMatrix& w) {
  if (vulkan_computes_weight_type(w.type)) return Status();
  return refuse(w.name != nullptr ? *w.name : std::string("?"), static_cast<uint32_t>(w.type));
}

Status vulkan_check_weight_types(const Model& m, int32_t layer_begin, int32_t layer_end, bool output) {
  for (int32_t il = layer_begin; il < layer_end && il < m.hparams().n_layer; ++il) {
    Status st;
    m.layer(il).for_each_matrix([&](const WeightMatrix& w) {
      if (st.ok()) st = vulkan_check_weight_type(w);
    });
    SPW_RETURN_IF_ERROR(st);
  }
  if (output) SPW_RETURN_IF_ERROR(vulkan_check_weight_type(m.output()));
  return Status();
}

Status vulkan_check_weight_types(const gguf::GgufFile& f) {
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.n_dims == 2 && !vulkan_computes_weight_type(static_cast<gguf::GgmlType>(t.type))) return refuse(t.name, t.type);
  }
  return Status();
}

}  // namespace spw
