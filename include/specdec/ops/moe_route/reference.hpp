// moe_route CPU reference (plain loops): moe_route_reference routes one token from its router
// scores (the rule of params.hpp, also called by model/kimi's forwards); moe_route_cpu routes
// T tokens from logits [T, E] into ids / weights [T, top_k].
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/ops/moe_route/params.hpp"

namespace specdec::ops {

// One token: scores [E] (router scores, not logits), bias [E] or empty.
inline Status moe_route_reference(std::span<float const> scores, std::span<float const> bias,
                                  int n_group, int topk_group, int top_k, bool norm, float scale,
                                  std::vector<int32_t>* ids, std::vector<float>* weights) {
  auto bad = [](std::string m) { return Status::InvalidArgument("moe_route_reference: " + m); };
  if (ids == nullptr || weights == nullptr) return bad("ids and weights must not be null");
  int64_t const E = static_cast<int64_t>(scores.size());
  if (E < 1) return bad("scores is empty");
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != E) {
    return bad("bias has " + std::to_string(bias.size()) + " values, scores " + std::to_string(E));
  }
  std::string const shape = moe_route_shape_error(static_cast<int>(E), n_group, topk_group, top_k);
  if (!shape.empty()) return bad(shape);
  int64_t const per = E / n_group;
  std::vector<float> b(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) b[e] = scores[e] + (bias.empty() ? 0.0f : bias[e]);
  std::vector<float> group_score(static_cast<size_t>(n_group));
  for (int g = 0; g < n_group; ++g) {
    std::vector<float> v(b.begin() + g * per, b.begin() + (g + 1) * per);
    std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
    group_score[static_cast<size_t>(g)] = v[0] + v[1];
  }
  std::vector<int> gorder(static_cast<size_t>(n_group));
  std::iota(gorder.begin(), gorder.end(), 0);
  std::stable_sort(gorder.begin(), gorder.end(),
                   [&](int a, int c) { return group_score[a] > group_score[c]; });
  std::vector<bool> kept(static_cast<size_t>(n_group), false);
  for (int k = 0; k < topk_group; ++k) kept[static_cast<size_t>(gorder[k])] = true;
  for (int64_t e = 0; e < E; ++e) {
    if (!kept[static_cast<size_t>(e / per)]) b[e] = 0.0f;
  }
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return b[a] > b[c]; });
  ids->assign(order.begin(), order.begin() + top_k);
  weights->assign(static_cast<size_t>(top_k), 0.0f);
  double sum = 0.0;
  for (int k = 0; k < top_k; ++k) sum += scores[(*ids)[k]];
  for (int k = 0; k < top_k; ++k) {
    double w = scores[(*ids)[k]];
    if (norm) w /= sum + 1e-20;
    (*weights)[k] = static_cast<float>(w * scale);
  }
  return Status::Ok();
}

// T tokens from logits (params.hpp).
inline Status moe_route_cpu(MoeRouteParams const& p) {
  int const E = p.experts, K = p.top_k;
  std::vector<float> scores(static_cast<size_t>(E));
  std::span<float const> const bias =
      p.bias ? std::span<float const>(p.bias, static_cast<size_t>(E)) : std::span<float const>();
  std::vector<int32_t> ids;
  std::vector<float> w;
  for (int t = 0; t < p.tokens; ++t) {
    for (int e = 0; e < E; ++e) scores[e] = moe_router_score(p.logits[static_cast<int64_t>(t) * E + e]);
    SPECDEC_RETURN_IF_ERROR(moe_route_reference(scores, bias, p.n_group, p.topk_group, K, p.norm,
                                                p.scale, &ids, &w));
    std::copy(ids.begin(), ids.end(), p.ids + static_cast<int64_t>(t) * K);
    std::copy(w.begin(), w.end(), p.weights + static_cast<int64_t>(t) * K);
  }
  return Status::Ok();
}

}  // namespace specdec::ops
