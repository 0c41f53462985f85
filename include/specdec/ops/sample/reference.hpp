// sample CPU reference: the target distribution of a logit row (greedy / temperature / top-k /
// top-p, as defined in params.hpp) and inverse-CDF sampling from it, in plain loops.
// Shapes: logits [B, V] float, config arrays [B], tokens [B] int32, status [B] int32 (host memory).
// target_dist_reference and inverse_cdf_reference are also the oracle verify_sample builds on.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "specdec/ops/sample/params.hpp"

namespace specdec::ops {

// Builds the TargetDist of one row of V logits; returns its SampleError (dist unusable unless
// kSampleOk).
inline int32_t target_dist_reference(float const* row, int vocab, float temperature,
                                     int32_t top_k, float top_p, TargetDist& dist) {
  dist = TargetDist{};
  int32_t const config_error = sample_config_error(temperature, top_p);
  if (config_error != kSampleOk) return config_error;
  if (sample_is_greedy(temperature)) {
    uint64_t best = 0;
    for (int v = 0; v < vocab; ++v) best = std::max(best, pack_value_index(row[v], v));
    if (!std::isfinite(unpack_value(best))) return kSampleBadLogits;
    dist.greedy_token = unpack_index(best);
    return kSampleOk;
  }
  dist.inv_t = 1.0f / temperature;
  uint32_t max_key = 0;
  for (int v = 0; v < vocab; ++v) max_key = std::max(max_key, float_order_key(row[v] * dist.inv_t));
  dist.max_z = float_from_order_key(max_key);
  if (!std::isfinite(dist.max_z)) return kSampleBadLogits;
  dist.min_key = 0;
  if (sample_uses_top_k(top_k, vocab)) {
    std::vector<uint32_t> keys(static_cast<size_t>(vocab));
    for (int v = 0; v < vocab; ++v) keys[v] = float_order_key(row[v] * dist.inv_t);
    std::nth_element(keys.begin(), keys.begin() + (top_k - 1), keys.end(), std::greater<>());
    dist.min_key = keys[top_k - 1];
  }
  if (sample_uses_top_p(top_p)) {
    // Kept (key, weight) pairs by decreasing key; walk groups of equal key.
    std::vector<std::pair<uint32_t, double>> kept;
    double total = 0.0;
    for (int v = 0; v < vocab; ++v) {
      uint32_t const key = float_order_key(row[v] * dist.inv_t);
      if (key >= dist.min_key) {
        double const w = dist.weight(v, row[v]);
        kept.emplace_back(key, w);
        total += w;
      }
    }
    std::sort(kept.begin(), kept.end(), [](auto const& a, auto const& b) { return a.first > b.first; });
    double const target = static_cast<double>(top_p) * total;
    double mass = 0.0;
    for (size_t i = 0; i < kept.size();) {
      size_t j = i;
      while (j < kept.size() && kept[j].first == kept[i].first) mass += kept[j++].second;
      if (mass >= target) {
        dist.min_key = kept[i].first;
        break;
      }
      i = j;
    }
  }
  return kSampleOk;
}

// Inverse-CDF draw over weights weight(v) >= 0, v in [0, V): the first v whose inclusive prefix sum
// exceeds u * total; if none (rounding), the last v with a positive weight; -1 if the total is 0.
template <class Weight>
int32_t inverse_cdf_reference(int vocab, Weight&& weight, float u) {
  double total = 0.0;
  int32_t last_positive = -1;
  for (int v = 0; v < vocab; ++v) {
    double const w = weight(v);
    total += w;
    if (w > 0.0) last_positive = v;
  }
  if (!(total > 0.0)) return -1;
  double const target = static_cast<double>(u) * total;
  double prefix = 0.0;
  for (int v = 0; v < vocab; ++v) {
    prefix += weight(v);
    if (prefix > target) return v;
  }
  return last_positive;
}

inline Status sample_reference(SampleParams const& p) {
  for (int b = 0; b < p.batch; ++b) {
    float const* row = p.logits + static_cast<int64_t>(b) * p.vocab;
    TargetDist dist;
    int32_t const error = target_dist_reference(row, p.vocab, p.config.temperature_of(b),
                                                p.config.top_k_of(b), p.config.top_p_of(b), dist);
    p.status[b] = error;
    if (error != kSampleOk) {
      p.tokens[b] = -1;
      continue;
    }
    float const u = p.keys.uniform(b, 0, 0);
    p.tokens[b] = inverse_cdf_reference(p.vocab, [&](int v) { return dist.weight(v, row[v]); }, u);
  }
  return Status::Ok();
}

}  // namespace specdec::ops
