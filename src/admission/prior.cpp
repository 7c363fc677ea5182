#include "admission/prior.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "gguf/ggml_types.h"

namespace spw::admission {
KernelRates reference_kernel_rates() {
  KernelRates r;
  r.bytes_per_s[static_cast<uint32_t>(gguf::GgmlType::kQ4_K)] = 9.9e9;
  r.bytes_per_s[static_cast<uint32_t>(gguf::GgmlType::kQ5_K)] = 9.9e9;
  r.bytes_per_s[static_cast<uint32_t>(gguf::GgmlType::kQ6_K)] = 17.3e9;
  return r;
}

double kernel_seconds(const StreamShare& s, const KernelRates& rates) {
  if (s.device != DeviceKind::kHost) return 0;
  const double threads = std::max(1, s.threads);
  double seconds = 0;
  for (const TypeBytes& tb : s.matrix_bytes) {
    const double rate = rates.rate(tb.ggml_type);
    if (rate > 0) seconds += static_cast<double>(tb.bytes) / (rate * threads);
  }
  return seconds;
}

std::vector<StreamShare> stream_shares(const gguf::GgufFile& file, const Estimate& est) {
  std::vector<StreamShare> shares;
  if (est.stages.empty()) return shares;
  auto share = [&](DeviceKind d) -> StreamShare& {
    for (StreamShare& s : shares)
      if (s.device == d) return s;
    StreamShare fresh;
    fresh.device = d;
    fresh.threads = std::max(1, est.plan.n_threads);
    shares.push_back(std::move(fresh));
    return shares.back();
  };
  auto device_of_layer = [&](int32_t l) {
    for (const StageLayout& s : est.stages)
      if (l >= s.layer_begin && l < s.layer_end) return s.device;
    return est.stages.front().device;
  };
  // The stages' order: the first stage's device first, as a token passes.
  for (const StageLayout& s : est.stages) (void)share(s.device);
  const DeviceKind emb_dev = est.stages.front().device;
  const DeviceKind out_dev = est.stages.back().device;
  const bool tied = file.find_tensor("output.weight") == nullptr;
  auto add = [&](DeviceKind d, const gguf::TensorInfo& t, uint64_t bytes) {
    StreamShare& s = share(d);
    s.weight_bytes += bytes;
    if (t.n_dims < 2) return;  // a norm's vector: no matvec
    auto it = std::find_if(s.matrix_bytes.begin(), s.matrix_bytes.end(),
                           [&](const TypeBytes& tb) { return tb.ggml_type == t.type; });
    if (it == s.matrix_bytes.end()) it = s.matrix_bytes.insert(s.matrix_bytes.end(), TypeBytes{t.type, 0});
    it->bytes += bytes;
  };
  for (const gguf::TensorInfo& t : file.tensors()) {
    const int32_t l = tensor_layer(t.name);
    if (l >= 0 && l < est.hparams.n_layer) {
      add(device_of_layer(l), t, t.nbytes);
    } else if (t.name == "output.weight" || t.name == "output_norm.weight") {
      add(out_dev, t, t.nbytes);
    } else if (t.name == "token_embd.weight") {
      // A lookup reads one row; tied, the output head reads it all.
      const uint64_t rows = t.n_dims >= 2 ? std::max<uint64_t>(t.ne[1], 1) : 1;
      share(emb_dev).weight_bytes += t.nbytes / rows;
      if (tied) add(out_dev, t, t.nbytes);
    }
  }
  for (StreamShare& s : shares) s.kv_bytes_per_position = est.devices[static_cast<int>(s.device)].kv_bytes_per_token;
  return shares;
}

Result<PathRates> prior_rates(const std::vector<StreamShare>& shares, const PriorConstants& c) {
  if (!(c.step_overhead_s >= 0) || !std::isfinite(c.step_overhead_s)) {
    return Status::invalid_argument("rate prior: step_overhead_s must be finite and >= 0");
  }
  if (!(c.prefill_per_decode > 0) || !std::isfinite(c.prefill_per_decode)) {
    return Status::invalid_argument("rate prior: prefill_per_decode must be finite and > 0");
  }
  if (!(c.decode_bandwidth_share > 0) || !(c.decode_bandwidth_share <= 1)) {
    return Status::invalid_argument("rate prior: decode_bandwidth_share must be in (0, 1]");
  }
  double stream_s = 0, per_pos_s = 0;
  uint64_t bytes = 0;
  for (const StreamShare& s : shares) {
    if (!(s.bandwidth > 0) || !std::isfinite(s.bandwidth)) {
      return Status::invalid_argument("rate prior: no bandwidth for the " + std::string(device_kind_name(s.device)) +
                                      " share");
    }
    if (!(s.compute_s >= 0) || !std::isfinite(s.compute_s)) {
      return Status::invalid_argument("rate prior: compute_s must be finite and >= 0");
    }
    const double bw = s.bandwidth * c.decode_bandwidth_share;
    stream_s += std::max(static_cast<double>(s.weight_bytes) / bw, s.compute_s);
    per_pos_s += static_cast<double>(s.kv_bytes_per_position) / bw;
    bytes += s.weight_bytes;
  }
  if (bytes == 0) return Status::invalid_argument("rate prior: a decode step streams no weight bytes");
  PathRates r;
  r.decode_tps = 1.0 / (c.step_overhead_s + stream_s);
  r.decode_s_per_pos = per_pos_s;
  r.prefill_tps = c.prefill_per_decode * r.decode_tps;
  r.prefill_s_per_pos = 0;
  r.completion_share = 1.0;
  r.samples = 0;
  r.measured = false;
  return r;
}

}  // namespace spw::admission
