// Parts of the Vulkan backend that need no device (built with or without
// Vulkan): --device-memory parsing, the fault injector, device-
// resident KV pools (through a fake storage) and the stub's behaviour.
#include <gtest/gtest.h>

#include "backend/vulkan/device_spec.h"
#include "backend/fault_injector.h"
#include "backend/vulkan/vulkan_backend.h"
#include "kv/kv_cache.h"

namespace spw {
namespace {

TEST(DeviceSpec, ParsesMemorySizes) {
  EXPECT_EQ(*parse_memory_size("512M"), 512ull << 20);
  EXPECT_EQ(*parse_memory_size("512MiB"), 512ull << 20);
  EXPECT_EQ(*parse_memory_size("2g"), 2ull << 30);
  EXPECT_EQ(*parse_memory_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*parse_memory_size("4096"), 4096u);
  EXPECT_EQ(*parse_memory_size("64KB"), 64u << 10);
  for (const char* bad : {"", "0", "-1M", "12Q", "M", "1.5GiBs"})
    EXPECT_EQ(parse_memory_size(bad).status().code(), StatusCode::kInvalidArgument) << bad;
}

TEST(FaultInjector, EachFaultFiresOnceWhenArmed) {
  FaultInjector f;
  EXPECT_FALSE(f.armed());
  EXPECT_FALSE(f.take_allocation_failure());
  EXPECT_FALSE(f.take_device_lost());
  EXPECT_FALSE(f.take_fence_timeout());
  f.fail_allocation(2);
  EXPECT_TRUE(f.armed());
  EXPECT_FALSE(f.take_allocation_failure());
  EXPECT_FALSE(f.take_allocation_failure());
  EXPECT_TRUE(f.take_allocation_failure());  // the third
  EXPECT_FALSE(f.take_allocation_failure());
  f.device_lost_at_next_submit();
  f.fence_timeout_at_next_wait();
  EXPECT_TRUE(f.take_device_lost());
  EXPECT_FALSE(f.take_device_lost());
  f.disarm();
  EXPECT_FALSE(f.take_fence_timeout());
  EXPECT_FALSE(f.armed());
}

class FakeStorage : public KvDeviceStorage {
 public:
  std::string device_name() const override { return "fake:0"; }
  size_t bytes() const override { return 1234; }
};

TEST(DeviceKvPool, SameAccountingAsHostPoolNoHostStorage) {
  KvPoolOptions o;
  o.layer_begin = 1;
  o.layer_end = 3;
  o.n_embd_kv = 8;
  o.block_tokens = 4;
  o.n_blocks = 3;
  auto dev = KvPool::create_on_device(o, std::make_unique<FakeStorage>());
  auto host = KvPool::create(o);
  ASSERT_TRUE(dev.ok() && host.ok());
  EXPECT_FALSE((*dev)->on_host());
  EXPECT_TRUE((*host)->on_host());
  EXPECT_EQ((*dev)->device_storage()->device_name(), "fake:0");
  EXPECT_EQ((*dev)->k(0, 0), nullptr);
  EXPECT_NE((*host)->k(0, 0), nullptr);
  EXPECT_EQ((*dev)->bytes_per_token(), (*host)->bytes_per_token());
  BlockTable td, th;
  ASSERT_TRUE((*dev)->reserve(td, 9).ok());
  ASSERT_TRUE((*host)->reserve(th, 9).ok());
  EXPECT_EQ(td.blocks(), th.blocks());
  EXPECT_EQ((*dev)->reserve(td, 13).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(td.blocks().size(), 3u);
  (*dev)->release(td);
  (*host)->release(th);
  EXPECT_EQ((*dev)->blocks_free(), 3);
  EXPECT_EQ(KvPool::create_on_device(o, nullptr).status().code(), StatusCode::kInvalidArgument);
  o.n_blocks = 0;
  EXPECT_EQ(KvPool::create_on_device(o, std::make_unique<FakeStorage>()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(VulkanStub, BuiltInFlagMatchesCompileDefinition) {
  EXPECT_EQ(vulkan_built_in(), SPILLWAY_HAVE_VULKAN == 1);
  if (!vulkan_built_in()) {
    EXPECT_EQ(VulkanBackend::create().status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(list_vulkan_devices().status().code(), StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace spw
