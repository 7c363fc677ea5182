#include "engine/device_session.h"

#include <gtest/gtest.h>

#include "engine/engine_test_util.h"
#include "engine/generate.h"

namespace spw {
namespace {

std::vector<TokenId> greedy_tokens(Session& s, const Model& m, int n) {
  GenerateOptions go;
  go.max_tokens = n;
  go.sampler.temperature = 0.0f;
  go.ignore_eos = true;
  auto r = generate(s, m.tokenizer().encode("Once upon a time", true), go);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->tokens : std::vector<TokenId>{};
}

// Vulkan forms need a device (lavapipe in CI); skip with the reason otherwise.
bool vulkan_available(std::string* why) {
  auto devices = list_vulkan_devices();
  if (!devices.ok()) {
    *why = devices.status().to_string();
    return false;
  }
  if (devices->empty()) {
    *why = "no Vulkan device";
    return false;
  }
  return true;
}

DeviceSessionOptions options_for(const std::string& spec, uint64_t budget = 0) {
  DeviceSessionOptions o;
  o.device = parse_device_spec(spec).value();
  o.device_memory_bytes = budget;
  o.n_ctx = 128;
  return o;
}

TEST(DeviceSessionTest, CpuPlacement) {
  auto model = testing::stories();
  auto ds = open_device_session(model, options_for("cpu"));
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  EXPECT_EQ(ds->placement, "cpu");
  EXPECT_NE(ds->cpu, nullptr);
  EXPECT_EQ(ds->vulkan, nullptr);
  EXPECT_EQ(ds->session->n_ctx(), 128);
}

TEST(DeviceSessionTest, VulkanAndHybridGiveTheCpuTokens) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto model = testing::stories();
  auto cpu = open_device_session(model, options_for("cpu"));
  ASSERT_TRUE(cpu.ok());
  const std::vector<TokenId> expected = greedy_tokens(*cpu->session, *model, 16);
  ASSERT_EQ(expected.size(), 16u);
  for (const std::string spec : {"vulkan", "hybrid:2", "hybrid:0", "hybrid:99"}) {
    auto ds = open_device_session(model, options_for(spec));
    ASSERT_TRUE(ds.ok()) << spec << ": " << ds.status().to_string();
    EXPECT_EQ(greedy_tokens(*ds->session, *model, 16), expected) << spec << " on " << ds->placement;
    if (spec == "hybrid:2") {
      EXPECT_NE(ds->placement.find("layers 0-1"), std::string::npos) << ds->placement;
      EXPECT_NE(ds->placement.find("2-4 cpu"), std::string::npos) << ds->placement;
      EXPECT_NE(ds->cpu, nullptr);
      EXPECT_NE(ds->vulkan, nullptr);
    }
    if (spec == "hybrid:0") EXPECT_EQ(ds->placement, "cpu");  // N = 0: nothing on the GPU
    if (spec == "hybrid:99") EXPECT_EQ(ds->cpu, nullptr);     // N clamped to n_layer
  }
}

TEST(DeviceSessionTest, BudgetTooSmallForTheWeightsIsResourceExhausted) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto model = testing::stories();  // 1.1 MB of weights
  auto ds = open_device_session(model, options_for("vulkan", 256 * 1024));
  if (ds.ok()) {
    // Weights upload lazily at the first eval; the budget must refuse them then.
    auto r = ds->session->eval(model->tokenizer().encode("Once", true));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  } else {
    EXPECT_EQ(ds.status().code(), StatusCode::kResourceExhausted) << ds.status().to_string();
  }
}

}  // namespace
}  // namespace spw
