// moe_route parameters: DeepseekV3 / Kimi-K2.5 group-limited top-k routing of T tokens
// (transformers' DeepseekV3MoE.route_tokens_to_experts), from the router's logits.
//
//   logits  [T, E] float   gate.weight . x per token
//   bias    [E] float      e_score_correction_bias, or nullptr (= 0)
//   ids     [T, top_k] int32, weights [T, top_k] float   written
//
// Per token (moe_route_reference in reference.hpp is the rule, shared by the model's forwards):
//   s_e = moe_router_score(logit_e) = sigmoid in double, rounded to float
//   b_e = s_e + bias_e (selection only). Experts form n_group groups of E / n_group consecutive
//   ids; group score = sum of the 2 largest b in the group; the topk_group best groups are kept
//   (ties: lower group index); b of experts in other groups becomes 0.0 (transformers'
//   masked_fill value, not -inf); the top_k largest masked b are chosen (ties: lower id).
//   ids = those experts by decreasing masked b; weights = s[ids] (unbiased), divided by
//   (their sum + 1e-20, summed in double in id order) when norm, times scale.
// Needs E % n_group == 0, E / n_group >= 2, 1 <= topk_group <= n_group,
// 1 <= top_k <= topk_group * E / n_group; the CUDA kernel also E <= kMoeRouteMaxExperts,
// n_group <= 32 and top_k <= kMoeRouteMaxTopK (checked for both executors: one contract).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"

namespace specdec::ops {

constexpr int kMoeRouteMaxExperts = 1024;  // one warp per token holds them in shared memory
constexpr int kMoeRouteMaxTopK = 64;

struct MoeRouteParams {
  float const* logits = nullptr;  // [T, E]
  float const* bias = nullptr;    // [E] or nullptr
  int tokens = 0;                 // T
  int experts = 0;                // E
  int n_group = 1;
  int topk_group = 1;
  int top_k = 1;
  bool norm = true;               // norm_topk_prob
  float scale = 1.0f;             // routed_scaling_factor
  int32_t* ids = nullptr;         // [T, top_k]
  float* weights = nullptr;       // [T, top_k]
};

// The router score of one logit: sigmoid computed in double, rounded to float (the forwards and
// the kernel use this one definition).
SPECDEC_HD inline float moe_router_score(float logit) {
  return static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logit))));
}

// The shape rules shared by the per-token reference and the op; "" when they hold.
inline std::string moe_route_shape_error(int experts, int n_group, int topk_group, int top_k) {
  if (experts < 1) return "experts " + std::to_string(experts) + " < 1";
  if (n_group < 1 || experts % n_group != 0) {
    return "n_group " + std::to_string(n_group) + " does not divide the " +
           std::to_string(experts) + " experts";
  }
  int const per = experts / n_group;
  if (per < 2) {
    return "n_group " + std::to_string(n_group) + " leaves " + std::to_string(per) +
           " expert(s) per group; the group score needs 2";
  }
  if (topk_group < 1 || topk_group > n_group) {
    return "topk_group " + std::to_string(topk_group) + " not in [1, n_group " +
           std::to_string(n_group) + "]";
  }
  if (top_k < 1 || top_k > topk_group * per) {
    return "top_k " + std::to_string(top_k) + " not in [1, " + std::to_string(topk_group * per) +
           "] (experts in topk_group groups)";
  }
  return "";
}

inline Status validate(MoeRouteParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("moe_route: " + m); };
  if (p.tokens < 0) return bad("tokens " + std::to_string(p.tokens) + " < 0");
  std::string const shape = moe_route_shape_error(p.experts, p.n_group, p.topk_group, p.top_k);
  if (!shape.empty()) return bad(shape);
  if (p.experts > kMoeRouteMaxExperts) {
    return bad("experts " + std::to_string(p.experts) + " > " +
               std::to_string(kMoeRouteMaxExperts) + " (the kernel's per-warp shared memory)");
  }
  if (p.n_group > 32) return bad("n_group " + std::to_string(p.n_group) + " > 32 (one lane per group)");
  if (p.top_k > kMoeRouteMaxTopK) {
    return bad("top_k " + std::to_string(p.top_k) + " > " + std::to_string(kMoeRouteMaxTopK));
  }
  if (!(std::isfinite(p.scale))) return bad("scale (routed_scaling_factor) is not finite");
  if (p.tokens > 0 && (!p.logits || !p.ids || !p.weights)) {
    return bad("logits, ids and weights must not be null: pass [T, E] logits and [T, top_k] outputs");
  }
  return Status::Ok();
}

}  // namespace specdec::ops
