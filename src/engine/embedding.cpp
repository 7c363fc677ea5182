#include "engine/embedding.h"

#include <cmath>
#include <string>

namespace spw {

Status embedding_support(const LlamaHparams& hp) {
  if (hp.pooling != Pooling::kMean && hp.pooling != Pooling::kCls && hp.pooling != Pooling::kLast) {
    return Status::invalid_argument("the model declares no pooling type for embeddings (" + hp.arch +
                                    ".pooling_type is " + std::string(pooling_name(hp.pooling)) +
                                    "; mean, cls or last are served)");
  }
  if (!hp.causal) {
    return Status::invalid_argument("the model's attention is not causal (" + hp.arch +
                                    ".attention.causal = false); this engine computes causal attention only");
  }
  return Status::ok_status();
}

Result<std::vector<float>> embed_tokens(Session& session, std::span<const TokenId> tokens, Pooling pooling) {
  if (tokens.empty()) return Status::invalid_argument("embedding: no tokens");
  if (pooling != Pooling::kMean && pooling != Pooling::kCls && pooling != Pooling::kLast) {
    return Status::invalid_argument("embedding: pooling " + std::string(pooling_name(pooling)) + " is not served");
  }
  const LlamaHparams& hp = session.model().hparams();
  const auto E = static_cast<size_t>(hp.n_embd);
  const std::vector<float>& w = session.model().output_norm();
  const auto n = static_cast<int32_t>(tokens.size());
  std::vector<double> acc(E, 0.0);
  std::vector<double> row(E);
  // One row through the output norm, in double: x / sqrt(mean(x^2) + eps) * w.
  auto normed = [&](const float* x) {
    double ss = 0;
    for (size_t i = 0; i < E; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(E) + static_cast<double>(hp.rms_eps));
    for (size_t i = 0; i < E; ++i) row[i] = static_cast<double>(x[i]) * scale * (w.empty() ? 1.0 : w[i]);
  };
  session.set_row_hidden_sink([&](int32_t first_pos, int32_t rows, std::span<const float> hidden) {
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t pos = first_pos + r;
      const bool take = pooling == Pooling::kMean || (pooling == Pooling::kCls && pos == 0) ||
                        (pooling == Pooling::kLast && pos == n - 1);
      if (!take) continue;
      normed(hidden.data() + static_cast<size_t>(r) * E);
      for (size_t i = 0; i < E; ++i) acc[i] += row[i];
    }
  });
  Status st = session.truncate(0);
  if (st.ok()) {
    auto r = session.eval(tokens);
    if (!r.ok()) st = r.status();
  }
  session.set_row_hidden_sink(nullptr);
  SPW_RETURN_IF_ERROR(st);
  if (pooling == Pooling::kMean) {
    for (double& v : acc) v /= static_cast<double>(n);
  }
  double norm = 0;
  for (double v : acc) norm += v * v;
  norm = std::sqrt(norm);
  std::vector<float> out(E);
  for (size_t i = 0; i < E; ++i) out[i] = static_cast<float>(norm > 0 ? acc[i] / norm : 0.0);
  return out;
}

}  // namespace spw
