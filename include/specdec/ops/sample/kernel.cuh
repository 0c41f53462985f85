// sample CUDA kernels and the block-level sampling agents verify_sample reuses.
// Shapes: logits [B, V] float, config arrays [B], keys [B], tokens [B] int32, status [B] int32,
// workspace [B, ceil(V / kSampleChunk)] SampleChunkPartial (device memory).
// Rows sampled greedily or with temperature alone (the common case) take two launches:
//   1. sample_chunk_partials_kernel: one block of kChunkThreads per (row, chunk of kSampleChunk
//      logits) reads its chunk once into registers and leaves the chunk's argmax and its mass
//      about its own maximum, so the whole GPU streams even one row;
//   2. sample_kernel: one block per row combines the partials (the row's maximum and mass, or its
//      argmax), picks the chunk holding u * mass and scans that chunk alone.
// Rows with top-k or top-p keep one block of kSampleThreads on the whole row (the row, <= 640 KB
// at V = 163840, stays in L2 between the block's passes):
//   a. row maximum of z = l / T
//   b. top-k: 3 radix-select passes (11/11/10-bit digits) counting keys of z
//   c. top-p: a mass pass, then 3 radix-select passes summing weights per digit
//   d. inverse CDF: per-warp segment sums (one pass), then the crossing segment split over the 32
//      warps, then one warp scans the crossing sub-segment element by element.
// No host synchronisation, allocation or host read of device data: graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/core/warp.cuh"
#include "specdec/core/math.hpp"
#include "specdec/ops/sample/params.hpp"

namespace specdec::ops {

// One block per row; 32 warps keep enough loads in flight per SM to stream a row from HBM
// (at batch >= 64 most SMs hold one row each).
constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kSampleRadixBins = 2048;  // 11-bit digits: 3 passes over a 32-bit key
// Loads in flight per thread in the streaming loops.
constexpr int kSampleUnroll = 4;

// Radix histograms accumulate in 64-bit fixed point (units of 2^-39): integer atomics commute, so
// the top-k / top-p thresholds, and with them every sampled token, are bitwise reproducible from
// run to run (float atomics would round in arrival order). Each amount is at most 1 (a weight
// exp(z - max), or a count), so a row of V <= 2^24 = kSampleMaxVocab entries sums to at most
// 2^63 units and cannot overflow (2^40 units would wrap to 0 at V = 2^24 when every key lands in
// one bin).
constexpr float kSampleHistScale = 549755813888.0f;  // 2^39

struct SampleShared {
  unsigned long long hist[kSampleRadixBins];  // fixed point, kSampleHistScale units
  uint64_t scratch64[kSampleWarps];
  float part[kSampleWarps];
  float pick_target;
  int pick;
  int32_t row_greedy;  // block_row_dist's broadcast of warp 0's TargetDist (min_key 0), mass, error
  float row_inv_t;
  float row_max_z;
  float row_mass;
  int32_t row_error;
};

namespace sample_detail {

// A fixed-point histogram bin as a float mass.
__device__ inline float hist_mass(unsigned long long bin) {
  return __ull2float_rn(bin) * (1.0f / kSampleHistScale);
}

// Block-wide reductions; every thread gets the same value (same summation order everywhere).
__device__ inline float block_sum(float v, SampleShared& sh) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.part[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kSampleWarps; ++w) total += sh.part[w];
  return total;
}

__device__ inline uint64_t block_max_u64(uint64_t v, SampleShared& sh) {
  v = warp_max_u64(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.scratch64[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t best = 0;
  for (int w = 0; w < kSampleWarps; ++w) best = sh.scratch64[w] > best ? sh.scratch64[w] : best;
  return best;
}

// Calls f(v, logit) for v in [lo, hi) of `row`, lanes of `group` threads (rank `rank`) striding.
// 16-byte loads when the row and lo are 16-byte aligned.
template <class F>
__device__ inline void for_each_logit(float const* row, int lo, int hi, int rank, int group, F&& f) {
  bool const aligned = ((reinterpret_cast<uintptr_t>(row + lo) & 15u) == 0);
  if (aligned) {
    int const n4 = (hi - lo) >> 2;
    float4 const* row4 = reinterpret_cast<float4 const*>(row + lo);
#pragma unroll kSampleUnroll
    for (int i = rank; i < n4; i += group) {
      float4 const x = __ldg(row4 + i);
      int const v = lo + 4 * i;
      f(v, x.x);
      f(v + 1, x.y);
      f(v + 2, x.z);
      f(v + 3, x.w);
    }
    for (int v = lo + 4 * n4 + rank; v < hi; v += group) f(v, __ldg(row + v));
  } else {
#pragma unroll kSampleUnroll
    for (int v = lo + rank; v < hi; v += group) f(v, __ldg(row + v));
  }
}

// Largest key K with sum_{v eligible, key_v >= K} amount_v >= target, by three radix passes.
// `classify(v, logit, key, amount)` returns whether v takes part and sets its key and amount.
template <class Classify>
__device__ uint32_t block_radix_threshold(float const* row, int vocab, Classify&& classify,
                                          float target, SampleShared& sh) {
  uint32_t prefix = 0, prefix_mask = 0;
  float above = 0.0f;
  int const lane = threadIdx.x & 31;
  for (int pass = 0; pass < 3; ++pass) {
    int const bits = pass == 2 ? 10 : 11;  // digits 31..21, 20..10, 9..0
    int const shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    uint32_t const digit_mask = (1u << bits) - 1u;
    int const bins = 1 << bits;
    __syncthreads();
    for (int i = threadIdx.x; i < bins; i += kSampleThreads) sh.hist[i] = 0;
    __syncthreads();
    for_each_logit(row, 0, vocab, threadIdx.x, kSampleThreads, [&](int v, float l) {
      uint32_t key;
      float amount;
      if (classify(v, l, key, amount) && (key & prefix_mask) == prefix && amount > 0.0f) {
        atomicAdd(&sh.hist[(key >> shift) & digit_mask], __float2ull_rn(amount * kSampleHistScale));
      }
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      int const per = bins / 32;
      float lane_mass = 0.0f;
      for (int i = 0; i < per; ++i) lane_mass += hist_mass(sh.hist[lane * per + i]);
      // Suffix sums over lanes (from the top).
      float suffix = lane_mass;
      for (int o = 1; o < 32; o <<= 1) {
        float const t = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32) suffix += t;
      }
      unsigned const ok = __ballot_sync(0xffffffffu, above + suffix >= target);
      int const chosen_lane = ok ? 31 - __clz(ok) : 0;  // none (rounding): keep everything
      float const lane_above = __shfl_sync(0xffffffffu, suffix - lane_mass, chosen_lane);
      if (lane == chosen_lane) {
        float acc = above + lane_above;
        int bin = lane * per + per - 1;
        for (; bin > lane * per; --bin) {
          if (acc + hist_mass(sh.hist[bin]) >= target) break;
          acc += hist_mass(sh.hist[bin]);
        }
        sh.pick = bin;
        sh.pick_target = acc;
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.pick) << shift;
    prefix_mask |= digit_mask << shift;
    above = sh.pick_target;
  }
  return prefix;
}

// Builds the TargetDist of a row (every thread gets the same one); returns its SampleError.
__device__ inline int32_t block_target_dist(float const* row, int vocab, float temperature,
                                            int32_t top_k, float top_p, TargetDist& dist,
                                            SampleShared& sh) {
  dist = TargetDist{};
  int32_t const error = sample_config_error(temperature, top_p);
  if (error != kSampleOk) return error;
  if (sample_is_greedy(temperature)) {
    uint64_t best = 0;
    for_each_logit(row, 0, vocab, threadIdx.x, kSampleThreads, [&](int v, float l) {
      uint64_t const k = pack_value_index(l, v);
      best = k > best ? k : best;
    });
    best = block_max_u64(best, sh);
    if (!isfinite(unpack_value(best))) return kSampleBadLogits;
    dist.greedy_token = unpack_index(best);
    return kSampleOk;
  }
  float const inv_t = 1.0f / temperature;
  dist.inv_t = inv_t;
  uint32_t max_key = 0;
  for_each_logit(row, 0, vocab, threadIdx.x, kSampleThreads,
                 [&](int, float l) { max_key = max(max_key, float_order_key(l * inv_t)); });
  max_key = static_cast<uint32_t>(block_max_u64(max_key, sh));
  dist.max_z = float_from_order_key(max_key);
  if (!isfinite(dist.max_z)) return kSampleBadLogits;
  if (sample_uses_top_k(top_k, vocab)) {
    dist.min_key = block_radix_threshold(
        row, vocab,
        [&](int, float l, uint32_t& key, float& amount) {
          key = float_order_key(l * inv_t);
          amount = 1.0f;
          return true;
        },
        static_cast<float>(top_k), sh);
  }
  if (sample_uses_top_p(top_p)) {
    TargetDist const topk_dist = dist;
    float local = 0.0f;
    for_each_logit(row, 0, vocab, threadIdx.x, kSampleThreads,
                   [&](int v, float l) { local += topk_dist.weight(v, l); });
    float const total = block_sum(local, sh);
    uint32_t const k = block_radix_threshold(
        row, vocab,
        [&](int v, float l, uint32_t& key, float& amount) {
          key = float_order_key(l * inv_t);
          amount = topk_dist.weight(v, l);
          return key >= topk_dist.min_key;
        },
        top_p * total, sh);
    dist.min_key = max(dist.min_key, k);
  }
  return kSampleOk;
}

// Sum over the row of weight(v, logit) (every thread gets it).
template <class Weight>
__device__ float block_weight_sum(float const* row, int vocab, Weight&& weight, SampleShared& sh) {
  float local = 0.0f;
  for_each_logit(row, 0, vocab, threadIdx.x, kSampleThreads,
                 [&](int v, float l) { local += weight(v, l); });
  return block_sum(local, sh);
}

__device__ inline bool is_excluded(int v, int32_t const* excluded, int n_excluded) {
  for (int i = 0; i < n_excluded; ++i) {
    if (excluded[i] == v) return true;
  }
  return false;
}

// The token of largest positive weight outside `excluded` (ties to the smaller id), -1 if none.
// The fallback when float rounding leaves an excluded-token inverse CDF without a crossing: the
// answer stays inside the residual's support.
template <class Weight>
__device__ int32_t block_argmax_weight(float const* row, int vocab, Weight&& weight,
                                       int32_t const* excluded, int n_excluded, SampleShared& sh) {
  uint64_t best = 0;
  for_each_logit(row, 0, vocab, threadIdx.x, kSampleThreads, [&](int v, float l) {
    float const w = weight(v, l);
    if (w > 0.0f && !is_excluded(v, excluded, n_excluded)) {
      uint64_t const key = pack_value_index(w, v);
      best = key > best ? key : best;
    }
  });
  best = block_max_u64(best, sh);
  return best == 0 ? -1 : unpack_index(best);
}

// Sum of weight over [lo, hi) computed by one warp, minus the excluded tokens inside the range.
template <class Weight>
__device__ float warp_range_sum(float const* row, int lo, int hi, Weight& weight,
                                int32_t const* excluded, int n_excluded) {
  int const lane = threadIdx.x & 31;
  float s = 0.0f;
  for_each_logit(row, lo, hi, lane, 32, [&](int v, float l) { s += weight(v, l); });
  for (int i = lane; i < n_excluded; i += 32) {
    int const x = excluded[i];
    if (x >= lo && x < hi) s -= weight(x, __ldg(row + x));
  }
  s = warp_sum(s);
  return s > 0.0f ? s : 0.0f;
}

// Warp 0 picks the first part whose inclusive prefix exceeds `target` (else the last positive
// part) and stores it and the target left inside it in sh.pick / sh.pick_target.
__device__ inline void pick_part(float target, SampleShared& sh) {
  if (threadIdx.x < 32) {
    int const lane = threadIdx.x;
    float const mine = sh.part[lane];
    float incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
      float const t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    unsigned const crossed = __ballot_sync(0xffffffffu, incl > target);
    unsigned const positive = __ballot_sync(0xffffffffu, mine > 0.0f);
    int const chosen = crossed ? __ffs(crossed) - 1 : (positive ? 31 - __clz(positive) : 0);
    float const before = __shfl_sync(0xffffffffu, incl - mine, chosen);
    if (lane == 0) {
      sh.pick = chosen;
      sh.pick_target = target - before;
    }
  }
  __syncthreads();
}

// Inverse-CDF draw with uniform u from weight(v, logit) over [0, vocab), skipping the `excluded`
// tokens (shared or global memory, distinct). Returns -1 when the total weight is 0. Every thread
// gets the result.
template <class Weight>
__device__ int32_t block_sample(float const* row, int vocab, Weight&& weight,
                                int32_t const* excluded, int n_excluded, float u,
                                SampleShared& sh) {
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Level 1: one segment per warp (a multiple of 4 elements, so segments stay 16-byte aligned).
  int const seg = ((ceil_div(vocab, kSampleWarps) + 3) / 4) * 4;
  int const lo1 = min(vocab, warp * seg), hi1 = min(vocab, lo1 + seg);
  float const s1 = warp_range_sum(row, lo1, hi1, weight, excluded, n_excluded);
  __syncthreads();
  if (lane == 0) sh.part[warp] = s1;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kSampleWarps; ++w) total += sh.part[w];
  if (!(total > 0.0f)) return -1;
  pick_part(u * total, sh);
  int const seg_lo = min(vocab, sh.pick * seg), seg_hi = min(vocab, seg_lo + seg);
  float const target2 = sh.pick_target;
  // Level 2: the chosen segment over the 32 warps.
  int const sub = ceil_div(seg_hi - seg_lo, kSampleWarps);
  int const lo2 = min(seg_hi, seg_lo + warp * sub), hi2 = min(seg_hi, lo2 + sub);
  float const s2 = warp_range_sum(row, lo2, hi2, weight, excluded, n_excluded);
  __syncthreads();
  if (lane == 0) sh.part[warp] = s2;
  __syncthreads();
  pick_part(target2, sh);
  int const sub_lo = min(seg_hi, seg_lo + sh.pick * sub), sub_hi = min(seg_hi, sub_lo + sub);
  float const target3 = sh.pick_target;
  __syncthreads();
  // Level 3: warp 0 scans the chosen sub-segment element by element.
  if (warp == 0) {
    float running = 0.0f;
    int found = -1, last_positive = -1;
    for (int base = sub_lo; base < sub_hi && found < 0; base += 32) {
      int const v = base + lane;
      float w = 0.0f;
      if (v < sub_hi && !is_excluded(v, excluded, n_excluded)) w = weight(v, __ldg(row + v));
      float incl = w;
      for (int o = 1; o < 32; o <<= 1) {
        float const t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      unsigned const crossed = __ballot_sync(0xffffffffu, running + incl > target3);
      unsigned const positive = __ballot_sync(0xffffffffu, w > 0.0f);
      if (crossed) found = base + __ffs(crossed) - 1;
      if (positive) last_positive = base + 31 - __clz(positive);
      running += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) sh.pick = found >= 0 ? found : last_positive;
  }
  __syncthreads();
  return sh.pick;
}

// Every thread passes `mine`; afterwards sh.pick is the first thread whose inclusive prefix (in
// thread order) exceeds `target`, else the last thread with mine > 0 (else 0), and sh.pick_target
// is `target` minus the prefix before that thread.
__device__ inline void block_pick_thread(float mine, float target, SampleShared& sh) {
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    float const t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  __syncthreads();
  if (lane == 31) sh.part[warp] = incl;
  __syncthreads();
  pick_part(target, sh);
  int const chosen_warp = sh.pick;
  float const warp_target = sh.pick_target;
  __syncthreads();  // everyone has read the warp pick before it is overwritten
  if (warp == chosen_warp) {
    unsigned const crossed = __ballot_sync(0xffffffffu, incl > warp_target);
    unsigned const positive = __ballot_sync(0xffffffffu, mine > 0.0f);
    int const chosen = crossed ? __ffs(crossed) - 1 : (positive ? 31 - __clz(positive) : 0);
    float const before = __shfl_sync(0xffffffffu, incl - mine, chosen);
    if (lane == 0) {
      sh.pick = chosen_warp * 32 + chosen;
      sh.pick_target = warp_target - before;
    }
  }
  __syncthreads();
}

// The mass of chunk `c` in units of the row's weights (dist.max_z): its mass about its own
// maximum, rescaled. A chunk of -inf logits has mass 0.
__device__ inline float chunk_mass(SampleChunkPartial const& part, TargetDist const& dist) {
  float const chunk_max_z = unpack_value(part.argmax) * dist.inv_t;
  return part.mass > 0.0f ? part.mass * sample_exp(chunk_max_z - dist.max_z) : 0.0f;
}

// The TargetDist and mass S of a row sampled greedily or with temperature alone, from its chunk
// partials, computed by one warp (every lane gets the same values); returns its SampleError.
__device__ inline int32_t warp_dist_from_partials(SampleChunkPartial const* parts, int chunks,
                                                  float temperature, TargetDist& dist,
                                                  float& total) {
  int const lane = threadIdx.x & 31;
  dist = TargetDist{};
  total = 0.0f;
  uint64_t best = 0;
  for (int c = lane; c < chunks; c += 32) best = max(best, parts[c].argmax);
  best = warp_max_u64(best);
  float const max_logit = unpack_value(best);
  if (!isfinite(max_logit)) return kSampleBadLogits;
  if (sample_is_greedy(temperature)) {
    dist.greedy_token = unpack_index(best);
    total = 1.0f;
    return kSampleOk;
  }
  dist.inv_t = 1.0f / temperature;
  dist.max_z = max_logit * dist.inv_t;
  if (!isfinite(dist.max_z)) return kSampleBadLogits;
  float local = 0.0f;
  for (int c = lane; c < chunks; c += 32) local += chunk_mass(parts[c], dist);
  total = warp_sum(local);
  return kSampleOk;
}

// Inverse-CDF draw with uniform u from dist's weights over a row, skipping the `excluded` tokens
// (distinct): the chunk partials locate the chunk holding u * mass, then one pass over that
// chunk (4 logits per thread) finds the token. Returns -1 when no weight is left or rounding
// leaves the chosen chunk without a positive weight (the caller falls back to block_sample).
// Every thread gets the result.
__device__ inline int32_t block_sample_chunked(float const* row, int vocab,
                                               SampleChunkPartial const* parts,
                                               TargetDist const& dist, int32_t const* excluded,
                                               int n_excluded, float u, SampleShared& sh) {
  static_assert(kSampleChunk == 4 * kSampleThreads, "the chunk scan gives each thread 4 logits");
  auto weight_of = [&](int v) {
    return is_excluded(v, excluded, n_excluded) ? 0.0f : dist.weight(v, __ldg(row + v));
  };
  // Level 1, warp 0: lane t owns the chunks [t * per, (t + 1) * per), less their excluded tokens.
  auto chunk_weight = [&](int c) {
    float w = chunk_mass(parts[c], dist);
    for (int i = 0; i < n_excluded; ++i) {
      int const x = excluded[i];
      if (x >= c * kSampleChunk && x < (c + 1) * kSampleChunk && x < vocab) {
        w -= dist.weight(x, __ldg(row + x));
      }
    }
    return w > 0.0f ? w : 0.0f;
  };
  __syncthreads();  // every thread has read the shared picks of earlier calls
  if (threadIdx.x < 32) {
    int const lane = threadIdx.x;
    int const chunks = sample_chunks(vocab);
    int const per = ceil_div(chunks, 32);
    int const c_lo = min(chunks, lane * per), c_hi = min(chunks, c_lo + per);
    float mine = 0.0f;
    for (int c = c_lo; c < c_hi; ++c) mine += chunk_weight(c);
    float incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
      float const t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    float const total = __shfl_sync(0xffffffffu, incl, 31);
    float const target = u * total;
    unsigned const crossed = __ballot_sync(0xffffffffu, incl > target);
    unsigned const positive = __ballot_sync(0xffffffffu, mine > 0.0f);
    int const owner = !(total > 0.0f) ? -1 : (crossed ? __ffs(crossed) - 1 : 31 - __clz(positive));
    if (owner < 0 && lane == 0) sh.pick = -1;
    if (lane == owner) {
      float left = target - (incl - mine);
      int chosen = -1;
      for (int c = c_lo; c < c_hi; ++c) {
        float const w = chunk_weight(c);
        if (!(w > 0.0f)) continue;
        chosen = c;  // stays the last positive chunk if rounding leaves no crossing
        if (left < w) break;
        left -= w;
      }
      sh.pick = chosen;
      sh.pick_target = left;
    }
  }
  __syncthreads();
  int const chunk = sh.pick;
  float left = sh.pick_target;
  if (chunk < 0) return -1;
  // Level 2: the chunk, 4 consecutive logits per thread.
  int const v0 = chunk * kSampleChunk + 4 * static_cast<int>(threadIdx.x);
  float w[4];
  float mine2 = 0.0f;
  SPECDEC_UNROLL
  for (int j = 0; j < 4; ++j) {
    w[j] = v0 + j < vocab ? weight_of(v0 + j) : 0.0f;
    mine2 += w[j];
  }
  block_pick_thread(mine2, left, sh);
  int const token_owner = sh.pick;
  left = sh.pick_target;
  __syncthreads();
  if (static_cast<int>(threadIdx.x) == token_owner) {
    int found = -1;
    for (int j = 0; j < 4; ++j) {
      if (!(w[j] > 0.0f)) continue;
      found = v0 + j;  // stays the last positive logit if rounding leaves no crossing
      if (left < w[j]) break;
      left -= w[j];
    }
    sh.pick = found;
  }
  __syncthreads();
  return sh.pick;
}

}  // namespace sample_detail

// Whether a request's rows take the chunked path (greedy, or temperature alone).
SPECDEC_HD inline bool sample_row_is_chunked(SamplingConfig const& config, int b, int vocab) {
  return !sample_uses_top_k(config.top_k_of(b), vocab) && !sample_uses_top_p(config.top_p_of(b));
}

// Threads per chunk block: 16 logits each, held in registers between the max and the mass.
constexpr int kChunkThreads = kSampleChunk / 16;

// Block i of rows * chunks: row i / chunks (request row / rows_per_request), chunk i % chunks.
// Rows of requests that take the one-block path, or with invalid settings, are left unwritten.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    sample_chunk_partials_kernel(float const* logits, int vocab, int rows_per_request,
                                 SamplingConfig const config, SampleChunkPartial* partials) {
  static_assert(kThreads * 16 == kSampleChunk, "16 logits per thread");
  int const chunks = sample_chunks(vocab);
  int64_t const row = blockIdx.x / chunks;
  int const chunk = static_cast<int>(blockIdx.x % chunks);
  int const b = static_cast<int>(row / rows_per_request);
  float const temperature = config.temperature_of(b);
  if (!sample_row_is_chunked(config, b, vocab) ||
      sample_config_error(temperature, config.top_p_of(b)) != kSampleOk) {
    return;
  }
  int const lo = chunk * kSampleChunk, n = min(kSampleChunk, vocab - lo);
  float const* x = logits + row * vocab + lo;
  float vals[16];
  int idx[16];
  if (n == kSampleChunk && (reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    SPECDEC_UNROLL
    for (int i = 0; i < 4; ++i) {
      int const j = static_cast<int>(threadIdx.x) + i * kThreads;
      float4 const q = __ldg(reinterpret_cast<float4 const*>(x) + j);
      vals[4 * i] = q.x, vals[4 * i + 1] = q.y, vals[4 * i + 2] = q.z, vals[4 * i + 3] = q.w;
      SPECDEC_UNROLL
      for (int k = 0; k < 4; ++k) idx[4 * i + k] = 4 * j + k;
    }
  } else {
    SPECDEC_UNROLL
    for (int i = 0; i < 16; ++i) {
      idx[i] = static_cast<int>(threadIdx.x) + i * kThreads;
      vals[i] = idx[i] < n ? __ldg(x + idx[i]) : -INFINITY;
    }
  }
  __shared__ uint64_t best_of_warp[kThreads / 32];
  __shared__ float mass_of_warp[kThreads / 32];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t best = 0;
  SPECDEC_UNROLL
  for (int i = 0; i < 16; ++i) {
    if (idx[i] < n) best = max(best, pack_value_index(vals[i], lo + idx[i]));
  }
  best = warp_max_u64(best);
  if (lane == 0) best_of_warp[warp] = best;
  __syncthreads();
  best = 0;
  for (int w = 0; w < kThreads / 32; ++w) best = max(best, best_of_warp[w]);
  float mass = 0.0f;
  if (!sample_is_greedy(temperature)) {
    float const inv_t = 1.0f / temperature;
    float const max_z = unpack_value(best) * inv_t;
    if (max_z > -INFINITY) {
      SPECDEC_UNROLL
      for (int i = 0; i < 16; ++i) mass += idx[i] < n ? sample_exp(vals[i] * inv_t - max_z) : 0.0f;
    }
    mass = warp_sum(mass);
    if (lane == 0) mass_of_warp[warp] = mass;
    __syncthreads();
    mass = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) mass += mass_of_warp[w];
  }
  if (threadIdx.x == 0) {
    SampleChunkPartial part;
    part.argmax = best;
    part.mass = mass;
    partials[row * chunks + chunk] = part;
  }
}

// Launches sample_chunk_partials_kernel over `rows` rows.
inline Status launch_sample_chunk_partials(float const* logits, int64_t rows, int vocab,
                                           int rows_per_request, SamplingConfig const& config,
                                           void* workspace, cudaStream_t stream) {
  int64_t const blocks = rows * sample_chunks(vocab);
  if (blocks > 0x7fffffff) {
    return Status::InvalidArgument("sample: " + std::to_string(rows) + " rows of vocab " +
                                   std::to_string(vocab) + " exceed one launch's blocks");
  }
  sample_chunk_partials_kernel<kChunkThreads><<<static_cast<unsigned>(blocks), kChunkThreads, 0, stream>>>(
      logits, vocab, rows_per_request, config, static_cast<SampleChunkPartial*>(workspace));
  return cuda_launch_status("sample_chunk_partials_kernel");
}

namespace sample_detail {

// The TargetDist and mass S of row `row` of request b: from its chunk partials (warp 0) where the
// request takes the chunked path, else by the one-block passes over the row. Every thread gets
// the same values.
__device__ inline int32_t block_row_dist(float const* row, int vocab, SampleChunkPartial const* parts,
                                         SamplingConfig const& config, int b, TargetDist& dist,
                                         float& total, SampleShared& sh) {
  float const temperature = config.temperature_of(b);
  if (sample_row_is_chunked(config, b, vocab)) {
    int32_t const error = sample_config_error(temperature, config.top_p_of(b));
    if (error != kSampleOk) return error;
    __syncthreads();  // every thread has read the shared row values of earlier calls
    if (threadIdx.x < 32) {
      TargetDist d;
      float mass;
      int32_t const e = warp_dist_from_partials(parts, sample_chunks(vocab), temperature, d, mass);
      if (threadIdx.x == 0) {
        sh.row_greedy = d.greedy_token;
        sh.row_inv_t = d.inv_t;
        sh.row_max_z = d.max_z;
        sh.row_mass = mass;
        sh.row_error = e;
      }
    }
    __syncthreads();
    dist = TargetDist{};
    dist.greedy_token = sh.row_greedy;
    dist.inv_t = sh.row_inv_t;
    dist.max_z = sh.row_max_z;
    total = sh.row_mass;
    return sh.row_error;
  }
  int32_t const error = block_target_dist(row, vocab, temperature, config.top_k_of(b),
                                          config.top_p_of(b), dist, sh);
  total = 0.0f;
  if (error == kSampleOk) {
    total = block_weight_sum(row, vocab, [&](int v, float l) { return dist.weight(v, l); }, sh);
  }
  return error;
}

// Inverse-CDF draw from dist's weights with the `excluded` tokens removed: chunked where the row
// took the chunked path, else block passes; -1 when no weight is left.
__device__ inline int32_t block_row_sample(float const* row, int vocab, SampleChunkPartial const* parts,
                                           bool chunked, TargetDist const& dist,
                                           int32_t const* excluded, int n_excluded, float u,
                                           SampleShared& sh) {
  auto w = [&](int v, float l) { return dist.weight(v, l); };
  int32_t token = -1;
  if (chunked) token = block_sample_chunked(row, vocab, parts, dist, excluded, n_excluded, u, sh);
  if (token < 0) token = block_sample(row, vocab, w, excluded, n_excluded, u, sh);
  return token;
}

}  // namespace sample_detail

// A template (on the block size, which must be kSampleThreads) so the kernel has inline linkage
// and the header can be included by several translation units.
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1) sample_kernel(__grid_constant__ SampleParams const p) {
  static_assert(kThreads == kSampleThreads, "the block agents assume kSampleThreads threads");
  __shared__ SampleShared sh;
  int const b = blockIdx.x;
  float const* row = p.logits + static_cast<int64_t>(b) * p.vocab;
  SampleChunkPartial const* parts =
      static_cast<SampleChunkPartial const*>(p.workspace) + static_cast<int64_t>(b) * sample_chunks(p.vocab);
  bool const chunked = sample_row_is_chunked(p.config, b, p.vocab);
  TargetDist dist;
  float total = 0.0f;
  int32_t const error = chunked
      ? sample_detail::block_row_dist(row, p.vocab, parts, p.config, b, dist, total, sh)
      : sample_detail::block_target_dist(row, p.vocab, p.config.temperature_of(b),
                                         p.config.top_k_of(b), p.config.top_p_of(b), dist, sh);
  int32_t token = -1;
  if (error == kSampleOk) {
    token = dist.greedy_token >= 0
                ? dist.greedy_token
                : sample_detail::block_row_sample(row, p.vocab, parts, chunked, dist, nullptr, 0,
                                                  p.keys.uniform(b, 0, 0), sh);
  }
  if (threadIdx.x == 0) {
    p.tokens[b] = token;
    p.status[b] = error;
  }
}

inline Status sample_cuda(SampleParams const& p, cudaStream_t stream) {
  SPECDEC_RETURN_IF_ERROR(launch_sample_chunk_partials(p.logits, p.batch, p.vocab, 1, p.config,
                                                       p.workspace, stream));
  sample_kernel<kSampleThreads><<<p.batch, kSampleThreads, 0, stream>>>(p);
  return cuda_launch_status("sample_kernel");
}

}  // namespace specdec::ops
