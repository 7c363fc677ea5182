#include "gateway/composition.h"

#include <cmath>
#include <filesystem>

#include "admission/estimator.h"
#include "backend/vulkan/vulkan_backend.h"
#include "device/cgroup.h"
#include "device/host_memory.h"
#include "serve/fan_out_observer.h"

namespace spw::gateway {

Status check_options(const GatewayOptions& o) {
  if (o.parallel < 1) return invalid_field("parallel", "parallel must be >= 1, got " + std::to_string(o.parallel));
  if (o.cpu_parallel < 1) {
    return invalid_field("cpu-parallel", "cpu-parallel must be >= 1, got " + std::to_string(o.cpu_parallel));
  }
  if (o.queue < 0 || o.cpu_queue < 0) return invalid_field("queue", "queue and cpu-queue must be >= 0");
  if (o.ctx < 0 || o.cpu_ctx < 0 || o.kv_blocks < 0) {
    return invalid_field("ctx", "ctx, cpu-ctx and kv-blocks must be >= 0");
  }
  if (!(o.pressure_threshold > 0) || !(o.max_delay_s >= 0) || o.min_shrink_tokens < 1 || !(o.observe_interval_s >= 0)) {
    return invalid_field("pressure-threshold",
                         "pressure-threshold must be > 0, max-delay-s and observe-interval-s >= 0, "
                         "min-shrink-tokens >= 1");
  }
  if (!std::isfinite(o.keep_alive_s) || !(o.min_residency_s >= 0) || !std::isfinite(o.min_residency_s)) {
    return invalid_field("keep-alive", "keep-alive must be a finite number of seconds (< 0: forever) and "
                                       "min-residency-s finite and >= 0");
  }
  if (!(o.recovery_budget_ms >= 0)) return invalid_field("recovery-budget-ms", "recovery-budget-ms must be >= 0");
  if (o.offload_layers < 0 || o.offload_queue < 0) {
    return invalid_field("offload-layers", "offload-layers and offload-queue must be >= 0");
  }
  if (Result<BreakerOptions> b = breaker_options(o); !b.ok()) return b.status();
  if (!(o.health_interval_s >= 0)) {
    return invalid_field("health-interval-s",
                         "health-interval-s must be >= 0 (0: off), got " + std::to_string(o.health_interval_s));
  }
  if (!(o.host_bandwidth >= 0) || !(o.device_bandwidth >= 0) || !std::isfinite(o.host_bandwidth) ||
      !std::isfinite(o.device_bandwidth)) {
    return invalid_field("host-bandwidth", "host-bandwidth and device-bandwidth must be finite and >= 0 (0: measured)");
  }
  if (!(o.health_timeout_s > 0)) {
    return invalid_field("health-timeout-s", "health-timeout-s must be > 0, got " + std::to_string(o.health_timeout_s));
  }
  if (o.kv_type == KvType::kQ8_0 && o.device.on_gpu()) {
    return invalid_field(
        "kv-type", "kv-type q8_0 is CPU only (the Vulkan backend stores f32 or f16), got device " + o.device.spec());
  }
  return Status::ok_status();
}

Result<admission::HostReadings> host_readings(Env& env) {
  const device::HostMemory hm = device::HostMemoryProbe(env).read();
  if (!hm.mem_available_bytes.known()) {
    return Status::unavailable("host memory budget: MemAvailable unknown: " + hm.mem_available_bytes.reason());
  }
  admission::HostReadings r;
  r.mem_available = hm.mem_available_bytes.value();
  const device::CgroupMemory cg = device::CgroupProbe(env).read();
  if (cg.effective_max.known() && !cg.effective_max.value().unlimited && cg.current_bytes.known()) {
    r.cgroup_max = cg.effective_max.value().bytes;
    r.cgroup_current = cg.current_bytes.value();
  }
  return r;
}

Result<std::shared_ptr<admission::HostLedger>> make_host_ledger(Env& env, const GatewayOptions& o) {
  admission::HostBudgetPolicy hpol;
  hpol.mem_available_share = o.host_memory_share;
  if (o.host_budget) hpol.cap_bytes = *o.host_budget;
  SPW_ASSIGN_OR_RETURN(admission::HostReadings readings, host_readings(env));
  SPW_ASSIGN_OR_RETURN(auto hl, admission::HostLedger::create("host", hpol, readings));
  return std::shared_ptr<admission::HostLedger>(std::move(hl));
}

Result<std::shared_ptr<journal::Journal>> open_journal(Env& env, const GatewayOptions& o) {
  if (o.journal == "none") return std::shared_ptr<journal::Journal>();
  std::string path = o.journal;
  if (path.empty()) {
    SPW_ASSIGN_OR_RETURN(path, default_journal_path());
  }
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return Status::io_error("journal folder " + parent.string() + ": " + ec.message());
  journal::JournalOptions jo;
  jo.retention_ms = static_cast<int64_t>(o.journal_retention_hours * 3600 * 1000);
  jo.max_bytes = o.journal_max_bytes;
  jo.max_body_bytes_kept = o.journal_max_body_bytes;
  SPW_ASSIGN_OR_RETURN(std::unique_ptr<journal::Journal> j, journal::Journal::open(env, path, jo));
  return std::shared_ptr<journal::Journal>(std::move(j));
}

Result<BreakerOptions> breaker_options(const GatewayOptions& o) {
  BreakerOptions b;
  b.consecutive_failures = o.breaker_consecutive_failures;
  b.failure_share = o.breaker_failure_share;
  b.min_requests = o.breaker_min_requests;
  b.window_s = o.breaker_window_s;
  b.base_cooldown_s = o.breaker_cooldown_s;
  b.max_cooldown_s = o.breaker_max_cooldown_s;
  b.probes = o.breaker_probes;
  const Status st = validate_breaker_options(b);
  if (st.ok()) return b;
  const std::string& f = st.field();
  const std::string key = f == "consecutive_failures" ? "breaker-consecutive-failures"
                          : f == "failure_share"      ? "breaker-failure-share"
                          : f == "min_requests"       ? "breaker-min-requests"
                          : f == "window_s"           ? "breaker-window-s"
                          : f == "base_cooldown_s"    ? "breaker-cooldown-s"
                          : f == "max_cooldown_s"     ? "breaker-max-cooldown-s"
                          : f == "probes"             ? "breaker-probes"
                                                      : "breaker-" + f;
  return invalid_field(key, key + ": " + st.message());
}

std::shared_ptr<DeviceControl> make_device_control(Env& env, const std::shared_ptr<VulkanBackend>& vulkan) {
  DeviceHooks hooks;
  hooks.name = vulkan->name();
  std::weak_ptr<VulkanBackend> weak_vk = vulkan;
  hooks.health_check = [weak_vk] {
    auto vk = weak_vk.lock();
    return vk ? vk->health_check()
              : Status(StatusCode::kUnavailable, "the Vulkan backend is gone", FailureReason::kUnhealthy);
  };
  hooks.healthy = [weak_vk] {
    auto vk = weak_vk.lock();
    return vk && vk->healthy();
  };
  hooks.reinitialize = [weak_vk] {
    auto vk = weak_vk.lock();
    return vk ? vk->reinitialize()
              : Status(StatusCode::kUnavailable, "the Vulkan backend is gone", FailureReason::kUnhealthy);
  };
  hooks.faults = &vulkan->faults();
  return std::make_shared<DeviceControl>(env, std::move(hooks));
}

std::shared_ptr<serve::RequestObserver> path_observer(std::shared_ptr<serve::RequestObserver> journal,
                                                      std::shared_ptr<CircuitBreaker> breaker) {
  return serve::FanOutObserver::make(
      {std::move(journal), breaker ? std::make_shared<BreakerObserver>(std::move(breaker)) : nullptr});
}

GatewayPolicy gateway_policy(const GatewayOptions& o) {
  GatewayPolicy policy;
  policy.admission.pressure_threshold = o.pressure_threshold;
  policy.admission.max_delay_s = o.max_delay_s;
  policy.admission.allow_shrink = o.allow_shrink;
  policy.admission.min_shrink_tokens = o.min_shrink_tokens;
  policy.observe_interval_s = o.observe_interval_s;
  policy.overflow = o.overflow;
  policy.health_interval_s = o.health_interval_s;
  policy.health_timeout_s = o.health_timeout_s;
  policy.reservation_max_share = o.reservation_max_share;
  return policy;
}

PathShape path_shape(const GatewayOptions& o, admission::PathRole role, int32_t first_ctx) {
  switch (role) {
    case admission::PathRole::kFallback:
      return {o.cpu_parallel, o.cpu_queue, o.cpu_ctx > 0 ? o.cpu_ctx : first_ctx};
    case admission::PathRole::kOffload:
      return {1, o.offload_queue, first_ctx};
    default:
      return {o.parallel, o.queue, first_ctx};
  }
}

int32_t wanted_kv_blocks(const GatewayOptions& o, admission::PathRole role, const PathShape& shape) {
  if (role == admission::PathRole::kPrimary && o.kv_blocks > 0) return o.kv_blocks;
  return shape.workers * admission::kv_blocks_for(shape.ctx, kBlockTokens);
}

serve::SchedulerOptions scheduler_options(const GatewayOptions& o, const std::string& path, const PathShape& shape,
                                          std::shared_ptr<serve::RequestObserver> observer) {
  serve::SchedulerOptions so;
  so.queue_capacity = shape.queue;
  so.n_ctx = shape.ctx;
  so.kv_block_tokens = kBlockTokens;
  so.checkpoint_every = o.checkpoint_every;
  so.path = path;
  so.observer = std::move(observer);
  return so;
}

}  // namespace spw::gateway
