#include "gguf/ggml_types.h"

#include <array>

namespace spw::gguf {
namespace {

// Indexed by ggml type id; ids 4 and 5 (the removed Q4_2/Q4_3) have no entry.
// Sizes follow ggml's block structs (QK_K = 256 for the K and IQ families).
constexpr uint32_t kNumTypes = 31;
struct Entry {
  bool valid;
  GgmlTypeInfo info;
};
constexpr std::array<Entry, kNumTypes> kTypes = {{
    {true, {"F32", 1, 4, true}},         // 0
    {true, {"F16", 1, 2, true}},         // 1
    {true, {"Q4_0", 32, 18, true}},      // 2
    {true, {"Q4_1", 32, 20, true}},      // 3
    {false, {nullptr, 0, 0, false}},     // 4 (removed Q4_2)
    {false, {nullptr, 0, 0, false}},     // 5 (removed Q4_3)
    {true, {"Q5_0", 32, 22, true}},      // 6
    {true, {"Q5_1", 32, 24, true}},      // 7
    {true, {"Q8_0", 32, 34, true}},      // 8
    {true, {"Q8_1", 32, 36, false}},     // 9
    {true, {"Q2_K", 256, 84, false}},    // 10
    {true, {"Q3_K", 256, 110, false}},   // 11
    {true, {"Q4_K", 256, 144, true}},    // 12
    {true, {"Q5_K", 256, 176, true}},    // 13
    {true, {"Q6_K", 256, 210, true}},    // 14
    {true, {"Q8_K", 256, 292, false}},   // 15
    {true, {"IQ2_XXS", 256, 66, false}}, // 16
    {true, {"IQ2_XS", 256, 74, false}},  // 17
    {true, {"IQ3_XXS", 256, 98, false}}, // 18
    {true, {"IQ1_S", 256, 50, false}},   // 19
    {true, {"IQ4_NL", 32, 18, false}},   // 20
    {true, {"IQ3_S", 256, 110, false}},  // 21
    {true, {"IQ2_S", 256, 82, false}},   // 22
    {true, {"IQ4_XS", 256, 136, false}}, // 23
    {true, {"I8", 1, 1, false}},         // 24
    {true, {"I16", 1, 2, false}},        // 25
    {true, {"I32", 1, 4, false}},        // 26
    {true, {"I64", 1, 8, false}},        // 27
    {true, {"F64", 1, 8, false}},        // 28
    {true, {"IQ1_M", 256, 56, false}},   // 29
    {true, {"BF16", 1, 2, false}},       // 30
}};

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  if (type >= kNumTypes || !kTypes[type].valid) return nullptr;
  return &kTypes[type].info;
}

std::string ggml_type_name(uint32_t type) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (info == nullptr) return "unknown(" + std::to_string(type) + ")";
  return info->name;
}

Result<uint64_t> ggml_nbytes(uint32_t type, uint64_t n_elements) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (info == nullptr) {
    return Status::invalid_argument("ggml type id " + std::to_string(type) + " is not a known type");
  }
  if (n_elements % info->block_size != 0) {
    return Status::invalid_argument(std::to_string(n_elements) + " elements of " + info->name +
                                    " is not a multiple of its block size " +
                                    std::to_string(info->block_size));
  }
  uint64_t blocks = n_elements / info->block_size;
  if (blocks != 0 && info->type_size > UINT64_MAX / blocks) {
    return Status::corruption(std::to_string(n_elements) + " elements of " + info->name +
                              " overflow a 64-bit byte count");
  }
  return blocks * info->type_size;
}

}  // namespace spw::gguf
