// Histogram: counts of observations in fixed, increasing upper bounds, plus
// their sum, in the shape Prometheus exposes (cumulative buckets, +Inf).
//
// Contract: bounds are set at construction (strictly increasing, finite);
// observe(x) counts x in the first bucket whose bound is >= x (the +Inf
// bucket past the last) and adds x to the sum; NaN is ignored. cumulative()
// returns, per bound and then +Inf, how many observations were <= it.
// Thread safety: none; the owner serialises (the scheduler observes under
// its lock and hands out copies).
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace spw {

class Histogram {
 public:
  Histogram() = default;
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

  void observe(double x) {
    if (std::isnan(x) || counts_.empty()) return;
    size_t i = 0;
    while (i < bounds_.size() && x > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += x;
    ++count_;
  }

  const std::vector<double>& bounds() const { return bounds_; }
  std::vector<uint64_t> cumulative() const {
    std::vector<uint64_t> out(counts_.size(), 0);
    uint64_t run = 0;
    for (size_t i = 0; i < counts_.size(); ++i) out[i] = run += counts_[i];
    return out;
  }
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

  // Bounds from `first`, each `factor` times the previous, `n` of them.
  static std::vector<double> exponential(double first, double factor, int n) {
    std::vector<double> b;
    double v = first;
    for (int i = 0; i < n; ++i, v *= factor) b.push_back(v);
    return b;
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), +Inf last
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace spw
