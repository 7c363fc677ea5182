#include "core/placement.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>

namespace spw {

// gtest prints a Placement as its spec.
void PrintTo(const Placement& p, std::ostream* os) { *os << p.spec(); }

namespace {

using Kind = Placement::Kind;

TEST(Placement, ParsesAcceptedForms) {
  auto cpu = Placement::parse("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, Placement::cpu());
  EXPECT_EQ(cpu->kind, Kind::kCpu);
  EXPECT_FALSE(cpu->on_gpu());

  auto vk = Placement::parse("vulkan");
  ASSERT_TRUE(vk.ok());
  EXPECT_EQ(*vk, Placement::vulkan());
  EXPECT_EQ(vk->vulkan_device, "");
  EXPECT_TRUE(vk->on_gpu());
  EXPECT_EQ(Placement::parse("vulkan:1").value(), Placement::vulkan("1"));
  EXPECT_EQ(Placement::parse("vulkan:llvmpipe").value().vulkan_device, "llvmpipe");

  auto h = Placement::parse("hybrid:12");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->kind, Kind::kHybrid);
  EXPECT_EQ(h->gpu_layers, 12);
  EXPECT_EQ(h->vulkan_device, "");
  EXPECT_TRUE(h->on_gpu());
  EXPECT_EQ(Placement::parse("hybrid:3:1").value(), Placement::hybrid(3, "1"));
  EXPECT_EQ(Placement::parse("hybrid:007").value(), Placement::hybrid(7));
  EXPECT_FALSE(Placement::parse("hybrid:0").value().on_gpu());
}

TEST(Placement, ErrorsNameTheTextAndTheAcceptedForms) {
  for (const char* bad : {"", "gpu", "tpu", "CPU", "vulkan:", "vulkan1", "hybrid", "hybrid:", "hybrid:x", "hybrid:-1",
                          "hybrid:1:", "hybrid:1234567", " cpu", "cpu "}) {
    auto p = Placement::parse(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << bad;
    const std::string quoted = std::string("'").append(bad).append("'");
    EXPECT_NE(p.status().message().find(quoted), std::string::npos) << p.status().to_string();
    EXPECT_NE(p.status().message().find("cpu, vulkan, vulkan:INDEX, vulkan:NAME, hybrid:N or hybrid:N:INDEX"),
              std::string::npos)
        << p.status().to_string();
  }
}

TEST(Placement, SpecRoundTripsThroughParse) {
  for (const char* text : {"cpu", "vulkan", "vulkan:0", "vulkan:NVIDIA H200", "vulkan:a:b", "hybrid:0", "hybrid:12",
                           "hybrid:3:1", "hybrid:3:llvmpipe", "hybrid:999999"}) {
    auto p = Placement::parse(text);
    ASSERT_TRUE(p.ok()) << text << ": " << p.status().to_string();
    EXPECT_EQ(p->spec(), text);
    auto again = Placement::parse(p->spec());
    ASSERT_TRUE(again.ok()) << p->spec();
    EXPECT_EQ(*again, *p) << text;
  }
  for (const Placement& p : {Placement::cpu(), Placement::vulkan(), Placement::vulkan("2"), Placement::hybrid(4),
                             Placement::hybrid(4, "igpu")}) {
    EXPECT_EQ(Placement::parse(p.spec()).value(), p) << p.spec();
  }
  EXPECT_EQ(Placement::parse("hybrid:007").value().spec(), "hybrid:7");
}

TEST(Placement, NamesAreShortAndCanonical) {
  EXPECT_EQ(Placement::cpu().name(), "cpu");
  EXPECT_EQ(Placement::vulkan().name(), "vulkan");
  EXPECT_EQ(Placement::vulkan("1").name(), "vulkan");  // no selector
  EXPECT_EQ(Placement::hybrid(3).name(), "hybrid:3");
  EXPECT_EQ(Placement::hybrid(3, "1").name(), "hybrid:3");

  // As they run on a 5-layer model: one layout, one name.
  const int32_t n_layer = 5;
  auto run_name = [&](const char* text) { return Placement::parse(text).value().resolved(n_layer).name(); };
  EXPECT_EQ(run_name("cpu"), "cpu");
  EXPECT_EQ(run_name("hybrid:0"), "cpu");
  EXPECT_EQ(run_name("hybrid:0:1"), "cpu");
  EXPECT_EQ(run_name("hybrid:2"), "hybrid:2");
  EXPECT_EQ(run_name("hybrid:4:1"), "hybrid:4");
  EXPECT_EQ(run_name("hybrid:5"), "vulkan");
  EXPECT_EQ(run_name("hybrid:9"), "vulkan");
  EXPECT_EQ(run_name("vulkan:1"), "vulkan");
}

TEST(Placement, ResolvedKeepsTheDeviceAndIsIdempotent) {
  EXPECT_EQ(Placement::hybrid(0, "1").resolved(5), Placement::cpu());
  EXPECT_EQ(Placement::hybrid(9, "1").resolved(5), Placement::vulkan("1"));
  EXPECT_EQ(Placement::hybrid(2, "1").resolved(5), Placement::hybrid(2, "1"));
  EXPECT_EQ(Placement::vulkan("x").resolved(5), Placement::vulkan("x"));
  EXPECT_EQ(Placement::cpu().resolved(5), Placement::cpu());
  for (int32_t n = 0; n <= 7; ++n) {
    const Placement r = Placement::hybrid(n, "0").resolved(5);
    EXPECT_EQ(r.resolved(5), r) << n;
    EXPECT_EQ(r.gpu_layer_count(5), Placement::hybrid(n).gpu_layer_count(5)) << n;
  }
}

// "+cpu-experts" after a device form: a mixture's experts on the CPU.
TEST(Placement, CpuExpertsSuffix) {
  const auto v = Placement::parse("vulkan+cpu-experts");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->kind, Placement::Kind::kVulkan);
  EXPECT_TRUE(v->cpu_experts);
  EXPECT_EQ(v->name(), "vulkan+cpu-experts");
  EXPECT_EQ(*v, Placement::vulkan().with_cpu_experts());
  EXPECT_NE(*v, Placement::vulkan());
  for (const char* text : {"vulkan+cpu-experts", "vulkan:1+cpu-experts", "vulkan:NVIDIA+cpu-experts",
                           "hybrid:3+cpu-experts", "hybrid:3:1+cpu-experts"}) {
    const auto p = Placement::parse(text);
    ASSERT_TRUE(p.ok()) << text << ": " << p.status().to_string();
    EXPECT_TRUE(p->cpu_experts) << text;
    EXPECT_EQ(p->spec(), text);
    EXPECT_EQ(Placement::parse(p->spec()).value(), *p) << text;
  }
  EXPECT_EQ(Placement::parse("hybrid:3:1+cpu-experts")->name(), "hybrid:3+cpu-experts");
  // Resolved: kept on a device placement, gone with the device.
  EXPECT_EQ(Placement::parse("hybrid:9+cpu-experts")->resolved(5), Placement::vulkan().with_cpu_experts());
  EXPECT_EQ(Placement::parse("hybrid:0+cpu-experts")->resolved(5), Placement::cpu());
  EXPECT_EQ(Placement::cpu().with_cpu_experts(), Placement::cpu());
  for (const char* bad : {"cpu+cpu-experts", "+cpu-experts", "vulkan+cpu", "hybrid:x+cpu-experts"}) {
    const auto p = Placement::parse(bad);
    EXPECT_FALSE(p.ok()) << bad;
    EXPECT_NE(p.status().message().find("+cpu-experts"), std::string::npos) << p.status().to_string();
  }
}

// "+cpu-experts:K": only layers [0, K)'s experts on the CPU (llama.cpp's
// --n-cpu-moe K); K covering every device layer is plain +cpu-experts.
TEST(Placement, CpuExpertsOfTheFirstLayers) {
  const auto v = Placement::parse("vulkan+cpu-experts:3");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(v->cpu_experts);
  EXPECT_EQ(v->cpu_expert_layers, 3);
  EXPECT_EQ(v->name(), "vulkan+cpu-experts:3");
  EXPECT_EQ(*v, Placement::vulkan().with_cpu_experts(3));
  EXPECT_NE(*v, Placement::vulkan().with_cpu_experts());
  EXPECT_NE(*v, Placement::vulkan().with_cpu_experts(4));
  for (int32_t il : {0, 1, 2}) EXPECT_TRUE(v->experts_on_cpu(il)) << il;
  for (int32_t il : {3, 7}) EXPECT_FALSE(v->experts_on_cpu(il)) << il;
  const auto h = Placement::parse("hybrid:5:1+cpu-experts:2");
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->spec(), "hybrid:5:1+cpu-experts:2");
  EXPECT_EQ(Placement::parse(h->spec()).value(), *h);
  EXPECT_TRUE(h->experts_on_cpu(1));
  EXPECT_FALSE(h->experts_on_cpu(2));
  EXPECT_TRUE(h->experts_on_cpu(5));  // a CPU stage's layer
  EXPECT_FALSE(Placement::vulkan().experts_on_cpu(0));
  EXPECT_TRUE(Placement::cpu().experts_on_cpu(0));
  // Resolved: K at or past the device layers is every device layer's.
  EXPECT_EQ(Placement::parse("hybrid:4+cpu-experts:4")->resolved(8).name(), "hybrid:4+cpu-experts");
  EXPECT_EQ(Placement::parse("vulkan+cpu-experts:2")->resolved(8).name(), "vulkan+cpu-experts:2");
  EXPECT_EQ(Placement::parse("vulkan+cpu-experts:9")->resolved(8).name(), "vulkan+cpu-experts");
  for (const char* bad : {"vulkan+cpu-experts:0", "vulkan+cpu-experts:", "vulkan+cpu-experts:x",
                          "cpu+cpu-experts:2", "vulkan+cpu-experts:1234567", "vulkan+cpu-experts2"}) {
    const auto p = Placement::parse(bad);
    EXPECT_FALSE(p.ok()) << bad;
    EXPECT_NE(p.status().message().find("+cpu-experts:K"), std::string::npos) << p.status().to_string();
  }
}

TEST(Placement, GpuLayerCountClampsHybrid) {
  EXPECT_EQ(Placement::cpu().gpu_layer_count(5), 0);
  EXPECT_EQ(Placement::vulkan().gpu_layer_count(5), 5);
  EXPECT_EQ(Placement::vulkan("1").gpu_layer_count(32), 32);
  EXPECT_EQ(Placement::hybrid(0).gpu_layer_count(5), 0);
  EXPECT_EQ(Placement::hybrid(3).gpu_layer_count(5), 3);
  EXPECT_EQ(Placement::hybrid(5).gpu_layer_count(5), 5);
  EXPECT_EQ(Placement::hybrid(99).gpu_layer_count(5), 5);
  EXPECT_EQ(Placement::hybrid(-2).gpu_layer_count(5), 0);
  EXPECT_EQ(Placement::hybrid(3).gpu_layer_count(0), 0);
}

TEST(Placement, EqualityComparesMeaningfulFieldsOnly) {
  EXPECT_EQ(Placement::cpu(), (Placement{Placement::Kind::kCpu, "1", 3}));
  EXPECT_EQ(Placement::vulkan("1"), (Placement{Placement::Kind::kVulkan, "1", 3}));
  EXPECT_NE(Placement::vulkan("1"), Placement::vulkan("0"));
  EXPECT_NE(Placement::vulkan(), Placement::cpu());
  EXPECT_NE(Placement::hybrid(2), Placement::hybrid(3));
  EXPECT_NE(Placement::hybrid(2, "1"), Placement::hybrid(2));
  EXPECT_NE(Placement::hybrid(0), Placement::cpu());  // resolved() makes them equal
}

}  // namespace
}  // namespace spw
