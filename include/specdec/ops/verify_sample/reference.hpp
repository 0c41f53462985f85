// verify_sample CPU reference: the tree walk of params.hpp in plain loops (double accumulation).
// Shapes: tokens [B, N], links [B, N], logits [B, N, V], draft_probs [B, N, V] or nullptr,
// accepted_path [B, P], num_accepted [B], next_token [B], status [B] (host memory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "specdec/ops/sample/reference.hpp"
#include "specdec/ops/verify_sample/params.hpp"

namespace specdec::ops {

inline Status verify_sample_reference(VerifySampleParams const& p) {
  int const N = p.tree.nodes, V = p.vocab, P = p.out.path_capacity;
  for (int b = 0; b < p.tree.batch; ++b) {
    int32_t* path = p.out.accepted_path + static_cast<int64_t>(b) * P;
    std::fill(path, path + P, -1);
    path[0] = 0;
    p.out.num_accepted[b] = 0;
    p.out.next_token[b] = -1;
    int32_t status = p.links.tree_status[b] != kTreeOk ? kSampleBadTree : kSampleOk;
    int32_t const count = p.tree.count(b);
    if (count < 1 || count > N) status = kSampleBadTree;
    int32_t const* tokens = p.tree.tokens + static_cast<int64_t>(b) * N;
    int32_t const* first_child = p.links.first_child + static_cast<int64_t>(b) * N;
    int32_t const* next_sibling = p.links.next_sibling + static_cast<int64_t>(b) * N;
    int len = 1, n = 0;
    int32_t next_token = -1;
    while (status == kSampleOk) {
      float const* row = p.logits + (static_cast<int64_t>(b) * N + n) * V;
      TargetDist dist;
      status = target_dist_reference(row, V, p.config.temperature_of(b), p.config.top_k_of(b),
                                     p.config.top_p_of(b), dist);
      if (status != kSampleOk) break;
      auto w = [&](int v) -> double { return dist.weight(v, row[v]); };
      double total = 0.0;
      for (int v = 0; v < V; ++v) total += w(v);
      int32_t const child0 = len < P ? first_child[n] : -1;
      int accepted = -1;
      float const u_final = p.keys.uniform(b, static_cast<uint32_t>(n), 1);
      if (p.draft_probs == nullptr) {
        std::vector<int32_t> rejected;  // distinct rejected tokens
        double rejected_mass = 0.0;
        for (int32_t c = child0, after = n; c != -1; after = c, c = next_sibling[c]) {
          if (!verify_sample_link_ok(c, after, count)) {
            status = kSampleBadTree;
            break;
          }
          int32_t const x = tokens[c];
          if (std::find(rejected.begin(), rejected.end(), x) != rejected.end()) continue;
          double const wx = (x >= 0 && x < V) ? w(x) : 0.0;
          float const u = p.keys.uniform(b, static_cast<uint32_t>(c), 0);
          if (static_cast<double>(u) * (total - rejected_mass) < wx) {
            accepted = c;
            break;
          }
          rejected.push_back(x);
          rejected_mass += wx;
        }
        if (status != kSampleOk) break;
        if (accepted < 0) {
          next_token = inverse_cdf_reference(
              V,
              [&](int v) {
                return std::find(rejected.begin(), rejected.end(), v) != rejected.end() ? 0.0
                                                                                       : w(v);
              },
              u_final);
          if (next_token < 0) next_token = inverse_cdf_reference(V, w, u_final);
        }
      } else {
        float const* q = p.draft_probs + (static_cast<int64_t>(b) * N + n) * V;
        double c_mass = 0.0, residual_mass = total;
        auto residual = [&](int v) -> double { return std::max(w(v) - c_mass * q[v], 0.0); };
        for (int32_t c = child0, after = n; c != -1; after = c, c = next_sibling[c]) {
          if (!verify_sample_link_ok(c, after, count)) {
            status = kSampleBadTree;
            break;
          }
          int32_t const x = tokens[c];
          double const qx = (x >= 0 && x < V) ? q[x] : 0.0;
          double const rx = (x >= 0 && x < V) ? residual(x) : 0.0;
          float const u = p.keys.uniform(b, static_cast<uint32_t>(c), 0);
          if (static_cast<double>(u) * residual_mass * qx < rx) {
            accepted = c;
            break;
          }
          c_mass += residual_mass;
          residual_mass = 0.0;
          for (int v = 0; v < V; ++v) residual_mass += residual(v);
        }
        if (status != kSampleOk) break;
        if (accepted < 0) {
          next_token = inverse_cdf_reference(V, residual, u_final);
          if (next_token < 0) next_token = inverse_cdf_reference(V, w, u_final);
        }
      }
      if (accepted < 0) break;
      path[len++] = accepted;
      n = accepted;
    }
    p.status[b] = status;
    if (status != kSampleOk) {
      std::fill(path + 1, path + P, -1);
      continue;
    }
    p.out.num_accepted[b] = len - 1;
    p.out.next_token[b] = next_token;
  }
  return Status::Ok();
}

}  // namespace specdec::ops
