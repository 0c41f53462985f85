// sample CUDA kernels and the block-level sampling agents verify_sample reuses.
// Shapes: logits [B, V] float, config arrays [B], keys [B], tokens [B] int32, status [B] int32,
// workspace of sample_workspace_bytes(B, V): chunk partials [B, ceil(V / kSampleChunk)] and
// threshold keys [B] (device memory).
// Three launches, each leaving the rows of the others alone:
//   1. sample_chunk_partials_kernel (rows sampled greedily or with temperature alone, the common
//      case): one block of kChunkThreads per (row, chunk of kSampleChunk logits) reads its chunk
//      once into registers and leaves the chunk's argmax and its mass about its own maximum, so
//      the whole GPU streams even one row. Where sample_builds_lists, it also leaves each chunk
//      of a row with top-k <= kSampleListMaxTopK a candidate list (params.hpp);
//   2. sample_row_thresholds_kernel (rows with top-k or top-p): one thread-block cluster per row
//      (up to 16 blocks on sm_90, one block elsewhere), each block a slice of whole chunks read
//      once from memory and kept in shared memory as keys of z = l / T. Inside the cluster
//      (distributed shared memory): the row maximum; top-k (counting keys) and top-p (summing
//      weights in fixed point) each by the distance select (one histogram of the keys' distance
//      below the row maximum, then the chosen bin's keys ranked in every block), or where that bin
//      is too full or the slice is not cached, by 4 radix-select passes of 8-bit digits; then
//      every chunk's kept mass about its maximum, and the row's threshold key. A row whose chunks
//      all left lists is served by one block, the same selects over the lists alone;
//   3. sample_kernel: one block per row combines the partials (the row's maximum and mass, or its
//      argmax), picks the chunk holding u * mass and scans that chunk alone. Launches 1 and 3 use
//      programmatic dependent launch: 3's blocks are in place when the partials are done.
// No host synchronisation, allocation or host read of device data: graph-capturable.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "specdec/core/cuda.cuh"
#include "specdec/core/warp.cuh"
#include "specdec/core/math.hpp"
#include "specdec/ops/sample/params.hpp"

namespace specdec::ops {

// One block per row; 32 warps keep enough loads in flight per SM to stream a row from HBM
// (at batch >= 64 most SMs hold one row each).
constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
// Loads in flight per thread in the streaming loops.
constexpr int kSampleUnroll = 4;
// The threshold kernel: 8-bit radix digits (4 passes over a 32-bit key), at most 16 blocks per
// row (sm_90's largest cluster, beyond the portable 8), and a block keeps its slice's keys in
// shared memory while the slice is at most 3 chunks (48 KB; V = 163840 is 40 chunks: 14 blocks
// of 3). Longer slices (V above 196608) are re-read from L2 on each pass.
constexpr int kSampleRadixBins = 256;
constexpr int kSampleMaxCluster = 16;
constexpr int kSampleCachedChunks = 3;
// 512 threads (64 registers each) leave room for two blocks per SM, so a cluster of 16 needs 8
// SMs of a GPC.
constexpr int kSampleThresholdThreads = 512;

// Radix histograms of weights add integers: a weight w = exp(z - max) <= 1 counts as
// min(round(w * 2^32), 2^32 - 1) units (rounding error <= 2^-33 per token, below 2e-5 of the
// largest weight over V = 163840), and integer sums commute, so the top-p threshold, and with it
// every sampled token, is bitwise reproducible from run to run (float atomics would round in
// arrival order). A row of V <= 2^24 = kSampleMaxVocab entries sums to below 2^56 units. Blocks
// add in 32-bit shared atomics (64-bit shared atomics are compare-and-swap loops, which
// serialise on the few bins the top digit fills): each unit count is split into its high and low
// 16 bits over a segment of at most kSampleSegment keys, so neither 32-bit half can overflow,
// and the halves join in 64 bits after the segment.
constexpr float kSampleUnitScale = 4294967296.0f;  // 2^32
constexpr unsigned long long kSampleMaxUnits = 0xffffffffull;
constexpr int kSampleSegment = 1 << 16;

struct SampleShared {
  unsigned long long hist[2][kSampleRadixBins];  // the threshold kernel's, by pass parity
  uint32_t segment_high[kSampleRadixBins];       // a segment's bins: units >> 16 ...
  uint32_t segment_low[kSampleRadixBins];        // ... and units & 0xffff
  uint64_t published;  // a block's value that the rest of its cluster reads
  uint64_t scratch64[kSampleWarps];
  float part[kSampleWarps];
  float pick_target;
  int pick;
  unsigned long long pick_above;
  int32_t row_greedy;  // block_row_dist's broadcast of warp 0's TargetDist, mass and error
  float row_inv_t;
  float row_max_z;
  uint32_t row_min_key;
  float row_mass;
  int32_t row_error;
};

namespace sample_detail {

// A bin's units in two 32-bit shared counters (see kSampleUnitScale): adds u < 2^32 ...
__device__ inline void add_split_units(uint32_t* high, uint32_t* low, int bin,
                                       unsigned long long u) {
  if (u >> 16) atomicAdd(high + bin, static_cast<uint32_t>(u >> 16));
  if (u & 0xffffu) atomicAdd(low + bin, static_cast<uint32_t>(u & 0xffffu));
}
// ... and reads the bin's sum back.
__device__ inline unsigned long long split_units(uint32_t const* high, uint32_t const* low,
                                                 int bin) {
  return (static_cast<unsigned long long>(high[bin]) << 16) + low[bin];
}

// Block-wide reductions over blocks of kThreads (<= kSampleThreads); every thread gets the same
// value (same summation order everywhere).
template <int kThreads = kSampleThreads>
__device__ inline float block_sum(float v, SampleShared& sh) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.part[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += sh.part[w];
  return total;
}

template <int kThreads = kSampleThreads>
__device__ inline uint64_t block_max_u64(uint64_t v, SampleShared& sh) {
  v = warp_max_u64(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.scratch64[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t best = 0;
  for (int w = 0; w < kThreads / 32; ++w) best = sh.scratch64[w] > best ? sh.scratch64[w] : best;
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

// The TargetDist and mass S of a row from its chunk partials and its threshold key (0 without
// top-k / top-p), computed by one warp (every lane gets the same values); returns its SampleError.
__device__ inline int32_t warp_dist_from_partials(SampleChunkPartial const* parts, int chunks,
                                                  float temperature, uint32_t min_key,
                                                  TargetDist& dist, float& total) {
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
  dist.min_key = min_key;
  float local = 0.0f;
  for (int c = lane; c < chunks; c += 32) local += chunk_mass(parts[c], dist);
  total = warp_sum(local);
  return kSampleOk;
}

// Inverse-CDF draw with uniform u over a row cut into chunks of kSampleChunk: chunk_weight(c) is
// chunk c's weight (>= 0) and weight_of(v) token v's (>= 0; their sum over the chunk, up to
// rounding). Warp 0 locates the chunk holding u * total, then one pass over that chunk (4 values
// per thread) finds the token. Returns -1 when the total is 0 or rounding leaves the chosen chunk
// without a positive weight. Every thread gets the result.
template <class ChunkWeight, class WeightOf>
__device__ int32_t block_sample_chunks(int vocab, ChunkWeight&& chunk_weight,
                                       WeightOf&& weight_of, float u, SampleShared& sh) {
  static_assert(kSampleChunk == 4 * kSampleThreads, "the chunk scan gives each thread 4 values");
  __syncthreads();  // every thread has read the shared picks of earlier calls
  // Level 1, warp 0: lane t owns the chunks [t * per, (t + 1) * per).
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
  // Level 2: the chunk, 4 consecutive values per thread.
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
      found = v0 + j;  // stays the last positive value if rounding leaves no crossing
      if (left < w[j]) break;
      left -= w[j];
    }
    sh.pick = found;
  }
  __syncthreads();
  return sh.pick;
}

// Inverse-CDF draw with uniform u from dist's weights over a row, skipping the `excluded` tokens
// (distinct): block_sample_chunks with the chunk partials' masses, less the excluded tokens in
// each. Returns -1 when no weight is left or rounding leaves the chosen chunk without a positive
// weight (the caller falls back to block_sample). Every thread gets the result.
__device__ inline int32_t block_sample_chunked(float const* row, int vocab,
                                               SampleChunkPartial const* parts,
                                               TargetDist const& dist, int32_t const* excluded,
                                               int n_excluded, float u, SampleShared& sh) {
  auto weight_of = [&](int v) {
    return is_excluded(v, excluded, n_excluded) ? 0.0f : dist.weight(v, __ldg(row + v));
  };
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
  return block_sample_chunks(vocab, chunk_weight, weight_of, u, sh);
}

// Distance bins: z's distance d = max_z - z below a maximum, in kSampleDistBins bins of
// 1 / per_unit (the last also holding every d beyond, -inf and NaN). The bin falls as z rises
// (float subtraction and multiplication by a positive scale keep the order), and equal keys share
// a bin, so every key of a lower bin lies above every key of a higher one. Where a select's
// threshold lies in the last bin, its keys are binned again below their own maximum, up to
// kSampleDistRounds rounds; a key in a later round's last bin lies in every earlier round's (the
// later maximum lies in the earlier last bin and the key below it).
constexpr int kSampleDistBins = 256;
constexpr int kSampleDistRounds = 3;
__device__ inline int distance_bin(float z, float max_z, float per_unit) {
  float const scaled = (max_z - z) * per_unit;
  return scaled < kSampleDistBins - 1 ? static_cast<int>(scaled) : kSampleDistBins - 1;
}
// per_unit for bins of 1/16 of a logit at any temperature (z = logit / temperature).
__device__ inline float distance_per_unit(float temperature) { return 16.0f * temperature; }

// Block-wide exclusive prefix sum of `v` in thread order (blocks of kThreads <= 1024 threads);
// `total` gets the sum. `warp_totals` holds kThreads / 32 values.
template <int kThreads>
__device__ inline uint32_t block_exclusive_scan(uint32_t v, uint32_t* warp_totals,
                                                uint32_t& total) {
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    uint32_t const x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  __syncthreads();  // earlier readers of warp_totals are done
  if (lane == 31) warp_totals[warp] = incl;
  __syncthreads();
  uint32_t before = 0;
  total = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    before += w < warp ? warp_totals[w] : 0u;
    total += warp_totals[w];
  }
  return before + incl - v;
}

}  // namespace sample_detail

// Threads per chunk block: 16 logits each, held in registers between the max and the mass.
constexpr int kChunkThreads = kSampleChunk / 16;

// Block i of rows * chunks: row i / chunks (request row / rows_per_request), chunk i % chunks.
// Rows sampled greedily or with temperature alone: the chunk's argmax and mass. Rows of requests
// with top-k / top-p are sample_row_thresholds_kernel's; with kLists, those whose top-k fits a
// list (sample_row_lists_fit) get the chunk's argmax and candidate list (params.hpp) here, and
// the others listed = kSampleNotListed alone. Rows with invalid settings are left unwritten.
// Launched with programmatic dependent launch (core/cuda.cuh), it lets the next kernel's blocks
// launch as soon as its own have all started.
template <int kThreads, bool kLists>
__global__ void __launch_bounds__(kThreads)
    sample_chunk_partials_kernel(float const* logits, int vocab, int rows_per_request,
                                 SamplingConfig const config, SampleChunkPartial* partials,
                                 uint32_t* lists) {
  static_assert(kThreads * 16 == kSampleChunk, "16 logits per thread");
  static_assert(kThreads == sample_detail::kSampleDistBins, "a thread per distance bin");
  await_prior_kernels();
  int const chunks = sample_chunks(vocab);
  int64_t const row = blockIdx.x / chunks;
  int const chunk = static_cast<int>(blockIdx.x % chunks);
  int const b = static_cast<int>(row / rows_per_request);
  float const temperature = config.temperature_of(b);
  int32_t const top_k = config.top_k_of(b);
  if (sample_config_error(temperature, config.top_p_of(b)) != kSampleOk) return;
  bool const needs_threshold = sample_row_needs_threshold(config, b, vocab);
  bool const listed_row = kLists && needs_threshold && sample_row_lists_fit(top_k, vocab);
  if (needs_threshold && !listed_row) {
    if (kLists && threadIdx.x == 0) partials[row * chunks + chunk].listed = kSampleNotListed;
    return;
  }
  int const lo = chunk * kSampleChunk, n = min(kSampleChunk, vocab - lo);
  float const* x = logits + row * vocab + lo;
  // A full, 16-byte aligned chunk is read as float4 (thread t: quads t, t + kThreads, ...),
  // otherwise element by element (t, t + kThreads, ...); idx(i) is value i's place in the chunk
  // (computed, not held: 32 registers rather than 64).
  int const t = threadIdx.x;
  bool const quads = n == kSampleChunk && (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  auto idx = [&](int i) {
    return quads ? 4 * (t + (i >> 2) * kThreads) + (i & 3) : t + i * kThreads;
  };
  float vals[16];
  if (quads) {
    SPECDEC_UNROLL
    for (int i = 0; i < 4; ++i) {
      float4 const q = __ldg(reinterpret_cast<float4 const*>(x) + t + i * kThreads);
      vals[4 * i] = q.x, vals[4 * i + 1] = q.y, vals[4 * i + 2] = q.z, vals[4 * i + 3] = q.w;
    }
  } else {
    SPECDEC_UNROLL
    for (int i = 0; i < 16; ++i) vals[i] = idx(i) < n ? __ldg(x + idx(i)) : -INFINITY;
  }
  __shared__ uint64_t best_of_warp[kThreads / 32];
  __shared__ float mass_of_warp[kThreads / 32];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t best = 0;
  SPECDEC_UNROLL
  for (int i = 0; i < 16; ++i) {
    if (idx(i) < n) best = max(best, pack_value_index(vals[i], lo + idx(i)));
  }
  best = warp_max_u64(best);
  if (lane == 0) best_of_warp[warp] = best;
  __syncthreads();
  best = 0;
  for (int w = 0; w < kThreads / 32; ++w) best = max(best, best_of_warp[w]);
  if (kLists && listed_row) {
    // The chunk's keys by distance bin below a reference (bins of 1/16 of a logit at any
    // temperature): the list takes every bin up to the one where the count reaches min(k, n).
    // Where that is the last bin (keys far below the reference: a dominant token), every key
    // above it is listed and the last bin's keys are binned again below their own maximum, up to
    // kSampleDistRounds times.
    constexpr int kLast = sample_detail::kSampleDistBins - 1;
    __shared__ uint32_t bin_count[kThreads];
    __shared__ uint32_t warp_totals[kThreads / 32];
    __shared__ uint32_t chosen_incl;
    float const inv_t = 1.0f / temperature;
    float const per_unit = sample_detail::distance_per_unit(temperature);
    uint32_t const need = static_cast<uint32_t>(min(top_k, n));
    auto bin_of = [&](int i, float ref) {
      return sample_detail::distance_bin(vals[i] * inv_t, ref, per_unit);
    };
    uint32_t play = 0;    // bit i: value i in play (in the last bin of every round so far)
    uint32_t listed = 0;  // bit i: value i listed
    SPECDEC_UNROLL
    for (int i = 0; i < 16; ++i) play |= static_cast<uint32_t>(idx(i) < n) << i;
    float ref = unpack_value(best) * inv_t;
    uint32_t above = 0;  // keys listed by earlier rounds
    int chosen = kLast;
    for (int round = 0; round < sample_detail::kSampleDistRounds && isfinite(ref);
         ++round) {  // uniform
      bin_count[threadIdx.x] = 0;
      __syncthreads();
      SPECDEC_UNROLL
      for (int i = 0; i < 16; ++i) {
        if ((play >> i) & 1u) atomicAdd(&bin_count[bin_of(i, ref)], 1u);
      }
      __syncthreads();
      uint32_t const mine = bin_count[threadIdx.x];
      uint32_t total = 0;
      uint32_t const incl =
          sample_detail::block_exclusive_scan<kThreads>(mine, warp_totals, total) + mine;
      // Prefixes rise with the bin: the bins before the one reaching `need` are [0, chosen).
      chosen = __syncthreads_count(above + incl < need);
      if (static_cast<int>(threadIdx.x) == chosen) chosen_incl = above + incl;
      if (chosen < kLast) break;
      // Next round: the last bin's values below their own maximum; the rest are listed.
      above += total - bin_count[kLast];
      uint64_t next = 0;
      SPECDEC_UNROLL
      for (int i = 0; i < 16; ++i) {
        if (!((play >> i) & 1u)) continue;
        if (bin_of(i, ref) == kLast) {
          next = max(next, pack_value_index(vals[i] * inv_t, 0));
        } else {
          listed |= 1u << i;
          play &= ~(1u << i);
        }
      }
      next = warp_max_u64(next);
      __syncthreads();  // every thread has read bin_count; best_of_warp is free
      if (lane == 0) best_of_warp[warp] = next;
      __syncthreads();
      next = 0;
      for (int w = 0; w < kThreads / 32; ++w) next = max(next, best_of_warp[w]);
      ref = next == 0 ? -INFINITY : unpack_value(next);
    }
    __syncthreads();
    int32_t length = kSampleNotListed;
    if (chosen < kLast && chosen_incl <= static_cast<uint32_t>(kSampleListCap)) {  // uniform
      SPECDEC_UNROLL
      for (int i = 0; i < 16; ++i) {
        if (((play >> i) & 1u) && bin_of(i, ref) <= chosen) listed |= 1u << i;
      }
      uint32_t length_total = 0;
      uint32_t slot = sample_detail::block_exclusive_scan<kThreads>(__popc(listed), warp_totals,
                                                                    length_total);
      uint32_t* list = lists + (row * chunks + chunk) * kSampleListCap;
      SPECDEC_UNROLL
      for (int i = 0; i < 16; ++i) {
        if ((listed >> i) & 1u) list[slot++] = float_order_key(vals[i] * inv_t);
      }
      length = static_cast<int32_t>(length_total);
    }
    if (threadIdx.x == 0) {
      SampleChunkPartial part;
      part.argmax = best;
      part.listed = length;
      partials[row * chunks + chunk] = part;
    }
    return;
  }
  float mass = 0.0f;
  if (!sample_is_greedy(temperature)) {
    float const inv_t = 1.0f / temperature;
    float const max_z = unpack_value(best) * inv_t;
    if (max_z > -INFINITY) {
      SPECDEC_UNROLL
      for (int i = 0; i < 16; ++i) mass += idx(i) < n ? sample_exp(vals[i] * inv_t - max_z) : 0.0f;
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

// Whether a launch over `rows` rows of `vocab` builds candidate lists (both kernels' kLists).
// kAuto: where a config with top-k arrays has rows or chunks enough for the lists to pay. Measured
// on an H100 (benchmarks/RESULTS.md, "Top-k thresholds from chunk candidate lists"): at
// V = 32000 (8 chunks) lists cost 1.08-1.49x below 32 rows and gain 0.67-0.91x from 32 rows on;
// at V = 163840 (40 chunks) they gain from one row on.
enum class SampleListUse { kAuto, kNever, kAlways };
constexpr int64_t kSampleListMinRows = 32;
constexpr int kSampleListMinChunks = 16;
inline bool sample_builds_lists(SampleListUse use, SamplingConfig const& config, int64_t rows,
                                int vocab) {
  if (use == SampleListUse::kNever || config.top_k == nullptr ||
      sample_chunks(vocab) > kSampleListMaxChunks) {
    return false;
  }
  return use == SampleListUse::kAlways || rows >= kSampleListMinRows ||
         sample_chunks(vocab) >= kSampleListMinChunks;
}

// Launches sample_chunk_partials_kernel over `rows` rows (`lists`: see sample_builds_lists; the
// threshold launch that follows must be given the same).
inline Status launch_sample_chunk_partials(float const* logits, int64_t rows, int vocab,
                                           int rows_per_request, SamplingConfig const& config,
                                           void* workspace, cudaStream_t stream,
                                           SampleListUse lists = SampleListUse::kAuto) {
  int64_t const blocks = rows * sample_chunks(vocab);
  if (blocks > 0x7fffffff) {
    return Status::InvalidArgument("sample: " + std::to_string(rows) + " rows of vocab " +
                                   std::to_string(vocab) + " exceed one launch's blocks");
  }
  auto const kernel = sample_builds_lists(lists, config, rows, vocab)
                          ? sample_chunk_partials_kernel<kChunkThreads, true>
                          : sample_chunk_partials_kernel<kChunkThreads, false>;
  return launch_kernel("sample_chunk_partials_kernel", kernel,
                       dim3(static_cast<unsigned>(blocks)), kChunkThreads, 0, stream, logits,
                       vocab, rows_per_request, config,
                       static_cast<SampleChunkPartial*>(workspace),
                       sample_candidate_lists(workspace, rows, vocab));
}

namespace sample_detail {

// `slot` of block `rank` of the row's cluster (this block's own when the row has one block).
template <class T>
__device__ inline T* cluster_slot(T* slot, int rank, int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (blocks > 1) return cooperative_groups::this_cluster().map_shared_rank(slot, rank);
#endif
  return slot;
}

// A barrier over the row's blocks: the cluster, or the block alone.
__device__ inline void row_sync(int blocks) {
  if (blocks > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __trap();  // the launcher splits rows over clusters only on sm_90 and later
#endif
  } else {
    __syncthreads();
  }
}

// The max of every thread's `mine` over the row's blocks (called once per kernel); every thread
// gets it. The block's max goes through sh.published.
template <int kThreads>
__device__ uint64_t row_max_u64(uint64_t mine, int blocks, SampleShared& sh) {
  uint64_t const block_max = block_max_u64<kThreads>(mine, sh);
  if (threadIdx.x == 0) sh.published = block_max;
  row_sync(blocks);  // every block has published
  if (threadIdx.x < 32) {
    uint64_t v = static_cast<int>(threadIdx.x) < blocks
                     ? *cluster_slot(&sh.published, threadIdx.x, blocks)
                     : 0;
    v = warp_max_u64(v);
    if (threadIdx.x == 0) sh.pick_above = v;
  }
  __syncthreads();
  return sh.pick_above;
}

// The largest key K with units(key >= K) >= need_of(total) over the row (the cluster's keys;
// total: the row's units, which the first pass's bins add up to): four radix passes of 8-bit
// digits from the top. units(key) < 2^32 is a key's amount (1 to count keys);
// for_each_key_in(a, e, f) calls f(v, key) over [a, e) of the block's slice [lo, hi); `pass`
// counts passes so the two published histograms alternate. Integer bins make every block pick the
// same digits, and the chosen bin is never empty, so K is one of the row's keys. If the need
// exceeds the total, K = 0 (every key kept).
template <class ForEachKeyIn, class Units, class NeedOf>
__device__ uint32_t row_radix_select(ForEachKeyIn&& for_each_key_in, int lo, int hi,
                                     Units&& units, NeedOf&& need_of, int blocks, int& pass,
                                     SampleShared& sh) {
  int const t = threadIdx.x, lane = t & 31;
  bool const owns_bin = t < kSampleRadixBins;
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;  // units of keys above the prefix's range
  unsigned long long need = 0;
  for (int shift = 24; shift >= 0; shift -= 8, ++pass) {
    unsigned long long block_bin = 0;  // thread t < 256: bin t over the block's slice
    for (int seg = lo; seg < hi; seg += kSampleSegment) {
      if (owns_bin) sh.segment_high[t] = 0, sh.segment_low[t] = 0;
      __syncthreads();
      // Runs of one digit go in with one atomic: the top digit (sign and exponent) is the same
      // for many keys.
      uint32_t run_bin = 0;
      unsigned long long run = 0;
      auto flush = [&] { add_split_units(sh.segment_high, sh.segment_low, run_bin, run); };
      for_each_key_in(seg, min(hi, seg + kSampleSegment), [&](int, uint32_t key) {
        if ((key & mask) != prefix) return;
        uint32_t const bin = (key >> shift) & 0xffu;
        if (bin != run_bin) {
          flush();
          run_bin = bin;
          run = 0;
        }
        run += units(key);
      });
      flush();
      __syncthreads();
      if (owns_bin) {
        block_bin += split_units(sh.segment_high, sh.segment_low, t);
      }
      __syncthreads();  // read before the next segment clears
    }
    // This buffer was last read remotely two passes ago, before the previous pass's row_sync.
    unsigned long long* hist = sh.hist[pass & 1];
    if (owns_bin) hist[t] = block_bin;
    row_sync(blocks);  // every block's histogram is published
    // Thread t < 256: bin t over the row, then the suffix sum of bins >= t.
    unsigned long long bin = 0;
    if (owns_bin) {
#pragma unroll
      for (int r = 0; r < kSampleMaxCluster; ++r) {
        if (r < blocks) bin += *cluster_slot(hist + t, r, blocks);
      }
    }
    unsigned long long suffix = bin;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      unsigned long long const x = __shfl_down_sync(0xffffffffu, suffix, o);
      if (lane + o < 32) suffix += x;
    }
    if (owns_bin && lane == 0) sh.scratch64[t >> 5] = suffix;
    __syncthreads();
    if (owns_bin) {
      for (int w = (t >> 5) + 1; w < kSampleRadixBins / 32; ++w) suffix += sh.scratch64[w];
    }
    if (shift == 24) {  // the first pass sees every key: bin 0's suffix is the row's total
      if (t == 0) sh.pick_above = suffix;
      __syncthreads();
      need = need_of(sh.pick_above);
    }
    // Suffix sums fall with t, so the digits that reach `need` are [0, chosen].
    int const chosen = __syncthreads_count(owns_bin && above + suffix >= need) - 1;
    if (chosen < 0) return 0;
    if (t == chosen) sh.pick_above = above + suffix - bin;
    __syncthreads();
    prefix |= static_cast<uint32_t>(chosen) << shift;
    mask |= 0xffu << shift;
    above = sh.pick_above;
  }
  return prefix;
}

// The distance select: a histogram of the keys by their distance d = ref - z below a reference,
// first the row maximum (kSampleDistBins bins of 1 / per_unit, the last also holding every d
// beyond and -inf), finds the bin holding the threshold. Where that is the last bin and it holds
// more keys than the candidate list takes (keys far below a dominant token), its keys are binned
// again below their own maximum (distance_bin), up to kSampleDistRounds rounds. Every block then
// copies the chosen bin's keys into every block's candidate list, and each key's rank among them
// (units above it and equal to it) names the threshold. Bins are monotone in the key, so every
// key of a lower bin lies above the bin's keys. Three cluster barriers, and one more a round,
// against the four passes of row_radix_select; the keys spread over many bins where the radix
// passes' top digits (sign and exponent) gather most keys in few.
// The most keys the chosen bin may hold (the list is in every block); beyond, row_radix_select.
constexpr int kSampleCandidateCap = 1024;
constexpr uint32_t kSampleNoKey = 0xffffffffu;  // the key of +NaN: never a threshold here

struct SampleDistShared {
  // By round parity (the rest of the cluster reads a round's while this block bins the next):
  uint32_t count[2][kSampleDistBins];            // the block's keys of positive units, by bin
  unsigned long long units[2][kSampleDistBins];  // their units
  uint32_t last_max[2];                          // the block's largest key in the last bin, or 0
  uint32_t high[kSampleDistBins];                // the block's units by bin: >> 16 ...
  uint32_t low[kSampleDistBins];                 // ... and & 0xffff (as in row_radix_select)
  uint32_t cand_key[kSampleCandidateCap];        // the chosen bin's keys over the row
  uint32_t cand_units[kSampleCandidateCap];
  uint32_t threshold;  // written into every block by a block holding the threshold key
  uint32_t next_ref;   // the row's largest key in the last bin
  int fill;            // this block's keys copied so far
  int bin;             // the chosen bin
  int offset;          // this block's first place in the list
  int listed;          // the list's length
  unsigned long long above;  // units of the keys above the chosen bin
};

// The largest key K with units(key >= K) >= need_of(total) over the row, as row_radix_select
// (kCount: units(key) is 1 for every key), or kSampleNoKey when the chosen bin of the last round
// holds more than kSampleCandidateCap keys (the caller takes row_radix_select). max_z: the row
// maximum; per_unit: distance_per_unit. The block's slice [lo, hi) holds at most kSampleSegment
// keys. Every block of the row gets the same answer.
template <bool kCount, int kThreads, class ForEachKeyIn, class Units, class NeedOf>
__device__ uint32_t row_distance_select(ForEachKeyIn&& for_each_key_in, int lo, int hi,
                                        Units&& units, NeedOf&& need_of, float max_z,
                                        float per_unit, int rank, int blocks,
                                        SampleDistShared& ds, SampleShared& sh) {
  static_assert(kThreads >= kSampleDistBins, "a thread per bin");
  static_assert(kSampleCachedChunks * kSampleChunk <= kSampleSegment,
                "a cached slice's bins cannot overflow their 32-bit halves");
  constexpr int kLast = kSampleDistBins - 1;
  int const t = threadIdx.x, lane = t & 31, warp = t >> 5;
  bool const owns_bin = t < kSampleDistBins;
  if (t == 0) ds.threshold = kSampleNoKey, ds.fill = 0;
  // A round bins the keys in play, those in the last bin below play_ref (every key at first),
  // below ref. Top-p's selects take one round: its weight lies near the maximum.
  constexpr int kRounds = kCount ? kSampleDistRounds : 1;
  float ref = max_z, play_ref = INFINITY;
  unsigned long long above = 0, need = 0;  // units of the keys above those in play; the need
  for (int round = 0;; ++round) {
    int const buf = round & 1;
    if (owns_bin) ds.count[buf][t] = 0, ds.high[t] = 0, ds.low[t] = 0;
    if (t == 0) ds.last_max[buf] = 0;
    __syncthreads();
    uint32_t last_max = 0;
    for_each_key_in(lo, hi, [&](int, uint32_t key) {
      float const z = float_from_order_key(key);
      if (round > 0 && distance_bin(z, play_ref, per_unit) != kLast) return;
      unsigned long long const u = units(key);
      if (u == 0) return;
      int const bin = distance_bin(z, ref, per_unit);
      atomicAdd(&ds.count[buf][bin], 1u);
      if constexpr (!kCount) add_split_units(ds.high, ds.low, bin, u);
      if (kRounds > 1 && bin == kLast) last_max = max(last_max, key);
    });
    if constexpr (kRounds > 1) {
      uint64_t const warp_last_max = warp_max_u64(last_max);
      if (lane == 0 && warp_last_max != 0) {
        atomicMax(&ds.last_max[buf], static_cast<uint32_t>(warp_last_max));
      }
    }
    __syncthreads();
    if (owns_bin) {
      ds.units[buf][t] = kCount ? ds.count[buf][t] : split_units(ds.high, ds.low, t);
    }
    row_sync(blocks);  // every block's histogram is published
    // Thread t < bins: bin t over the row, and the keys of bin t in the blocks before this one.
    unsigned long long bin_units = 0;
    uint32_t bin_count = 0, before_me = 0;
    if (owns_bin) {
#pragma unroll
      for (int r = 0; r < kSampleMaxCluster; ++r) {
        if (r < blocks) {
          uint32_t const c = *cluster_slot(ds.count[buf] + t, r, blocks);
          bin_count += c;
          before_me += r < rank ? c : 0u;
          if constexpr (!kCount) bin_units += *cluster_slot(ds.units[buf] + t, r, blocks);
        }
      }
      if constexpr (kCount) bin_units = bin_count;
    }
    // Inclusive prefix over the bins from bin 0 (the largest keys) up, after the keys above; the
    // round's total.
    unsigned long long incl = bin_units;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      unsigned long long const x = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += x;
    }
    if (owns_bin && lane == 31) sh.scratch64[warp] = incl;
    __syncthreads();
    unsigned long long total = 0;
    for (int w = 0; w < kSampleDistBins / 32; ++w) {
      if (w < warp) incl += sh.scratch64[w];
      total += sh.scratch64[w];
    }
    incl += above;
    if (round == 0) need = need_of(total);  // the first round sees every key
    // Prefixes rise with t, so the bins reaching `need` are [chosen, bins).
    int const chosen = kSampleDistBins - __syncthreads_count(owns_bin && incl >= need);
    if (t == chosen) {
      ds.bin = chosen;
      ds.offset = static_cast<int>(before_me);
      ds.listed = static_cast<int>(bin_count);
      ds.above = incl - bin_units;
    }
    __syncthreads();
    if (chosen == kSampleDistBins) return kSampleNoKey;
    if (ds.listed <= kSampleCandidateCap) break;
    if (chosen != kLast || round + 1 == kRounds) return kSampleNoKey;
    // The next reference: the row's largest key in the last bin.
    static_assert(kSampleMaxCluster <= 32, "a lane per block of the row");
    if (warp == 0) {
      uint32_t const mine = lane < blocks ? *cluster_slot(ds.last_max + buf, lane, blocks) : 0u;
      uint64_t const m = warp_max_u64(mine);
      if (lane == 0) ds.next_ref = static_cast<uint32_t>(m);
    }
    __syncthreads();
    float const next_ref = float_from_order_key(ds.next_ref);
    if (!isfinite(next_ref)) return kSampleNoKey;
    above = ds.above;
    play_ref = ref;
    ref = next_ref;
  }
  // Every block's keys of the chosen bin into every block's list (this block's from ds.offset).
  int const bin = ds.bin, offset = ds.offset, listed = ds.listed;
  for_each_key_in(lo, hi, [&](int, uint32_t key) {
    float const z = float_from_order_key(key);
    if (distance_bin(z, ref, per_unit) != bin || distance_bin(z, play_ref, per_unit) != kLast) {
      return;
    }
    unsigned long long const u = units(key);
    if (u == 0) return;
    int const slot = offset + atomicAdd(&ds.fill, 1);
    for (int r = 0; r < blocks; ++r) {
      *cluster_slot(ds.cand_key + slot, r, blocks) = key;
      *cluster_slot(ds.cand_units + slot, r, blocks) = static_cast<uint32_t>(u);
    }
  });
  row_sync(blocks);  // every list is whole
  // A warp per key of this block: units above it and equal to it over the list. The threshold is
  // the key where the running units first reach `need`.
  unsigned long long const above_bin = ds.above;
  for (int i = offset + warp; i < offset + ds.fill; i += kThreads / 32) {
    uint32_t const key = ds.cand_key[i];
    unsigned long long greater = 0, equal = 0;
    for (int j = lane; j < listed; j += 32) {
      uint32_t const other = ds.cand_key[j];
      unsigned long long const u = ds.cand_units[j];
      greater += other > key ? u : 0ull;
      equal += other == key ? u : 0ull;
    }
    greater = warp_sum_u64(greater);
    equal = warp_sum_u64(equal);
    if (lane == 0 && above_bin + greater < need && need <= above_bin + greater + equal) {
      for (int r = 0; r < blocks; ++r) *cluster_slot(&ds.threshold, r, blocks) = key;
    }
  }
  row_sync(blocks);  // the threshold is in every block
  return ds.threshold;
}

// f(v, key) for v in [a, e) of keys held four to a uint4 from index `base` (a - base a multiple
// of 4), the block's kThreads threads striding.
template <int kThreads, class F>
__device__ inline void for_each_cached_key(uint4 const* keys4, int base, int a, int e, F&& f) {
  int const q_end = (e - base + 3) >> 2;
#pragma unroll 2
  for (int q = ((a - base) >> 2) + static_cast<int>(threadIdx.x); q < q_end; q += kThreads) {
    uint4 const k4 = keys4[q];
    int const v = base + 4 * q;
    f(v, k4.x);
    if (v + 1 < e) f(v + 1, k4.y);
    if (v + 2 < e) f(v + 2, k4.z);
    if (v + 3 < e) f(v + 3, k4.w);
  }
}

// The row's threshold key from the keys for_each_key_in(a, e, f) gives over [lo, hi) in each of
// the row's `blocks` blocks (this one `rank`): top-k (the k-th largest key), then top-p over the
// keys top-k keeps, in fixed-point weight units. Each select is the distance select where the
// keys are `cached` in shared memory and its chosen bin fits the candidate list, else the radix
// passes (`radix` is then set: their last remote reads need a closing barrier). max_z: the row's
// maximum (finite); per_unit: distance_per_unit of the row's temperature. Every block of the row
// gets the same key.
template <int kThreads, class ForEachKeyIn>
__device__ uint32_t row_threshold_key(ForEachKeyIn&& for_each_key_in, int lo, int hi, bool cached,
                                      float max_z, float per_unit, int32_t top_k, float top_p,
                                      int vocab, int rank, int blocks, bool& radix,
                                      SampleDistShared& ds, SampleShared& sh) {
  int pass = 0;
  uint32_t min_key = 0;
  // kCount: every key counts 1.
  auto select = [&](auto count, auto&& units, auto&& need_of) {
    if (cached) {
      uint32_t const key = row_distance_select<decltype(count)::value, kThreads>(
          for_each_key_in, lo, hi, units, need_of, max_z, per_unit, rank, blocks, ds, sh);
      if (key != kSampleNoKey) return key;
    }
    radix = true;
    return row_radix_select(for_each_key_in, lo, hi, units, need_of, blocks, pass, sh);
  };
  if (sample_uses_top_k(top_k, vocab)) {
    min_key = select(
        std::true_type{}, [](uint32_t) { return 1ull; },
        [&](unsigned long long) { return static_cast<unsigned long long>(top_k); });
  }
  if (sample_uses_top_p(top_p)) {
    uint32_t const top_k_key = min_key;
    auto units = [&](uint32_t key) -> unsigned long long {
      if (key < top_k_key) return 0ull;
      float const w = sample_exp(float_from_order_key(key) - max_z);
      return min(__float2ull_rn(w * kSampleUnitScale), kSampleMaxUnits);
    };
    auto need_of = [&](unsigned long long total) {
      return static_cast<unsigned long long>(
          ceil(static_cast<double>(top_p) * static_cast<double>(total)));
    };
    min_key = max(min_key, select(std::false_type{}, units, need_of));
  }
  return min_key;
}

// A listed row's threshold key (params.hpp) by one block of kThreads: the chunks' lists one after
// another in shared memory (dynamic), row_threshold_key over them, then each chunk's kept mass
// about its own maximum from its list (every kept key of a chunk is in it) into parts[c].mass.
// Out of line, with shared memory of its own, so the whole-row path keeps its code and registers.
template <int kThreads>
__device__ __noinline__ uint32_t listed_row_threshold(SampleChunkPartial* parts, int chunks,
                                                      uint32_t const* row_lists,
                                                      float temperature, int32_t top_k,
                                                      float top_p, int vocab) {
  extern __shared__ uint4 list_keys4[];
  __shared__ SampleShared sh;
  __shared__ SampleDistShared ds;
  __shared__ int list_start[kSampleListMaxChunks + 1];  // chunk c's keys: [start[c], start[c + 1])
  __shared__ uint32_t warp_totals[kThreads / 32];
  static_assert(kSampleListMaxChunks <= kThreads, "a thread per chunk");
  uint32_t* keys = reinterpret_cast<uint32_t*>(list_keys4);
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float const inv_t = 1.0f / temperature;
  {
    int const c = threadIdx.x;
    uint32_t listed = 0;
    uint32_t const start = block_exclusive_scan<kThreads>(
        c < chunks ? static_cast<uint32_t>(parts[c].listed) : 0u, warp_totals, listed);
    if (c < chunks) list_start[c] = static_cast<int>(start);
    if (c == 0) list_start[chunks] = static_cast<int>(listed);
  }
  uint64_t best = 0;
  for (int c = threadIdx.x; c < chunks; c += kThreads) best = max(best, parts[c].argmax);
  __syncthreads();
  // A warp per chunk, its loads issued together.
  constexpr int kPerLane = kSampleListCap / 32;
  for (int c = warp; c < chunks; c += kThreads / 32) {
    int const start = list_start[c], len = list_start[c + 1] - start;
    uint32_t k[kPerLane];
    SPECDEC_UNROLL
    for (int j = 0; j < kPerLane; ++j) {
      int const i = lane + 32 * j;
      k[j] = i < len ? row_lists[c * kSampleListCap + i] : 0u;
    }
    SPECDEC_UNROLL
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j < len) keys[start + lane + 32 * j] = k[j];
    }
  }
  __syncthreads();
  int const listed = list_start[chunks];
  // Every listed chunk has a finite maximum, so the row has.
  float const max_z = unpack_value(block_max_u64<kThreads>(best, sh)) * inv_t;
  auto for_each_key_in = [&](int a, int e, auto&& f) {
    for_each_cached_key<kThreads>(list_keys4, 0, a, e, f);
  };
  bool radix = false;
  uint32_t const min_key =
      row_threshold_key<kThreads>(for_each_key_in, 0, listed, true, max_z,
                                  distance_per_unit(temperature), top_k, top_p, vocab, 0, 1, radix,
                                  ds, sh);
  for (int c = warp; c < chunks; c += kThreads / 32) {
    float const chunk_max_z = unpack_value(parts[c].argmax) * inv_t;
    float mass = 0.0f;
    for (int i = list_start[c] + lane; i < list_start[c + 1]; i += 32) {
      if (keys[i] >= min_key) mass += sample_exp(float_from_order_key(keys[i]) - chunk_max_z);
    }
    mass = warp_sum(mass);
    if (lane == 0) parts[c].mass = mass;
  }
  return min_key;
}

}  // namespace sample_detail

// How the threshold kernel splits a row: `blocks` blocks (one cluster when > 1) of
// `chunks_per_block` whole chunks; `cached`: a block's keys stay in shared memory.
struct SampleThresholdSplit {
  int blocks = 1;
  int chunks_per_block = 1;
  bool cached = true;
};
inline SampleThresholdSplit sample_threshold_split(int vocab, int max_blocks) {
  SampleThresholdSplit s;
  int const chunks = sample_chunks(vocab);
  s.chunks_per_block = ceil_div(chunks, max_blocks);
  s.blocks = ceil_div(chunks, s.chunks_per_block);
  s.cached = s.chunks_per_block <= kSampleCachedChunks;
  return s;
}

// Blocks per row where the caller does not choose (devices with clusters): the largest cluster
// while the rows are few; from kSampleManyRows rows on, slices of about kSampleManyRowsChunks
// chunks re-read from L2 (V = 32000: one block, V = 163840: 4), since once the rows alone fill
// the GPU a row's cluster barriers and remote reads cost more than the parallelism they add.
// Measured on an H100 (benchmarks/RESULTS.md, "Top-k / top-p thresholds: fewer blocks a row for
// many rows"): at 128-1024 rows 0.40-0.48x (V = 32000) and 0.65-0.81x (V = 163840) of the
// largest cluster's time; at 64 rows of V = 163840 the largest cluster is still 0.75x of 4
// blocks.
constexpr int64_t kSampleManyRows = 128;
constexpr int kSampleManyRowsChunks = 10;
inline int sample_threshold_blocks(int64_t rows, int vocab) {
  if (rows < kSampleManyRows) return kSampleMaxCluster;
  return std::min(kSampleMaxCluster, ceil_div(sample_chunks(vocab), kSampleManyRowsChunks));
}

// grid.x = rows * split.blocks: block i serves row i / split.blocks (request row /
// rows_per_request), slice i % split.blocks. Runs after sample_chunk_partials_kernel over the
// same workspace. With kLists, a row whose chunks all left candidate lists (params.hpp) is served
// by its first block alone, from the lists (listed_row_threshold); the others by all its blocks
// from the logits. Dynamic shared memory: the slice's keys when split.cached, a listed row's
// lists. Rows without top-k / top-p, greedy rows and rows with invalid settings are left to
// sample_chunk_partials_kernel (or unwritten); sample_kernel reports invalid rows. Keeps
// launch_kernel's contract (core/cuda.cuh): before its programmatic wait it reads only the config
// and the logits (the op's inputs).
template <int kThreads, bool kLists>
__global__ void __launch_bounds__(kThreads, 2)
    sample_row_thresholds_kernel(float const* logits, int vocab, int rows_per_request,
                                 SamplingConfig const config, SampleThresholdSplit const split,
                                 SampleChunkPartial* partials, uint32_t* min_keys,
                                 uint32_t const* lists) {
  static_assert(kThreads >= kSampleRadixBins && kThreads <= kSampleThreads && kThreads % 32 == 0,
                "a thread per radix bin; the shared reductions hold kSampleWarps warps");
  using namespace sample_detail;
  extern __shared__ uint4 cached_keys[];  // the slice's keys, 4 per entry
  __shared__ SampleShared sh;
  __shared__ SampleDistShared ds;
  int64_t const row = blockIdx.x / split.blocks;
  int const rank = static_cast<int>(blockIdx.x % split.blocks);
  int const b = static_cast<int>(row / rows_per_request);
  float const temperature = config.temperature_of(b);
  float const top_p = config.top_p_of(b);
  int32_t const top_k = config.top_k_of(b);
  // Uniform over the row's blocks, so a whole cluster leaves together.
  bool const serves = sample_row_needs_threshold(config, b, vocab) &&
                      sample_config_error(temperature, top_p) == kSampleOk;
  int const chunks = sample_chunks(vocab);
  int const c_lo = min(chunks, rank * split.chunks_per_block);
  int const c_hi = min(chunks, c_lo + split.chunks_per_block);
  int const lo = c_lo * kSampleChunk, hi = min(vocab, c_hi * kSampleChunk);
  float const* x = logits + row * vocab;
  SampleChunkPartial* parts = partials + row * chunks;
  float const inv_t = 1.0f / temperature;
  bool const listable = kLists && sample_row_lists_fit(top_k, vocab);
  // The cached slice's logits, every load issued before any is used. The op's input, so a slice
  // that no list can serve is loaded before the programmatic wait (core/cuda.cuh).
  constexpr int kQuads = kSampleChunk / 4 / kThreads;  // float4 loads per thread per chunk
  static_assert(kQuads * 4 * kThreads == kSampleChunk, "whole float4 loads per chunk");
  float4 q[kSampleCachedChunks][kQuads];
  auto load_slice = [&] {
    bool const aligned = (reinterpret_cast<uintptr_t>(x + lo) & 15u) == 0;
    SPECDEC_UNROLL
    for (int i = 0; i < kSampleCachedChunks; ++i) {
      SPECDEC_UNROLL
      for (int k = 0; k < kQuads; ++k) {
        int const v = lo + i * kSampleChunk + 4 * (static_cast<int>(threadIdx.x) + k * kThreads);
        if (aligned && v + 3 < hi) {
          q[i][k] = __ldg(reinterpret_cast<float4 const*>(x + v));
        } else {
          q[i][k].x = v < hi ? __ldg(x + v) : 0.0f;
          q[i][k].y = v + 1 < hi ? __ldg(x + v + 1) : 0.0f;
          q[i][k].z = v + 2 < hi ? __ldg(x + v + 2) : 0.0f;
          q[i][k].w = v + 3 < hi ? __ldg(x + v + 3) : 0.0f;
        }
      }
    }
  };
  bool const loaded_early = serves && split.cached && !listable;
  if (loaded_early) load_slice();
  await_prior_kernels();
  if (!serves) return;
  // A row whose chunks all left candidate lists: its first block alone, from the lists (uniform
  // over the row's blocks, so a whole cluster leaves together).
  if (listable) {
    bool all_listed = true;
    for (int c = threadIdx.x; c < chunks; c += kThreads) {
      all_listed = all_listed && parts[c].listed >= 0;
    }
    if (__syncthreads_and(all_listed)) {
      if (rank == 0) {
        uint32_t const key = listed_row_threshold<kThreads>(
            parts, chunks, lists + row * sample_list_entries(vocab), temperature, top_k, top_p,
            vocab);
        if (threadIdx.x == 0) min_keys[row] = key;
      }
      return;
    }
  }
  // f(v, key of z_v) for v in [a, e) of the slice (a - lo a multiple of 4): from shared memory,
  // four keys per load, or re-read.
  auto for_each_key_in = [&](int a, int e, auto&& f) {
    if (split.cached) {
      for_each_cached_key<kThreads>(cached_keys, lo, a, e, f);
    } else {
      for_each_logit(x, a, e, threadIdx.x, kThreads,
                     [&](int v, float l) { f(v, float_order_key(l * inv_t)); });
    }
  };

  // 1. The slice read once: its chunks' argmaxes, its keys into shared memory; then the row
  // maximum.
  uint64_t slice_best = 0;
  if (split.cached) {
    if (!loaded_early) load_slice();
    SPECDEC_UNROLL
    for (int i = 0; i < kSampleCachedChunks; ++i) {
      uint64_t best = 0;
      SPECDEC_UNROLL
      for (int k = 0; k < kQuads; ++k) {
        int const v = lo + i * kSampleChunk + 4 * (static_cast<int>(threadIdx.x) + k * kThreads);
        float const l[4] = {q[i][k].x, q[i][k].y, q[i][k].z, q[i][k].w};
        uint32_t key[4];
        SPECDEC_UNROLL
        for (int j = 0; j < 4; ++j) {
          key[j] = float_order_key(l[j] * inv_t);
          if (v + j < hi) best = max(best, pack_value_index(l[j], v + j));
        }
        if (v < hi) cached_keys[(v - lo) >> 2] = make_uint4(key[0], key[1], key[2], key[3]);
      }
      if (c_lo + i < c_hi) {  // uniform
        best = block_max_u64<kThreads>(best, sh);
        slice_best = max(slice_best, best);
        if (threadIdx.x == 0) parts[c_lo + i].argmax = best;
      }
    }
  } else {
    for (int c = c_lo; c < c_hi; ++c) {
      uint64_t best = 0;
      for_each_logit(x, c * kSampleChunk, min(vocab, (c + 1) * kSampleChunk), threadIdx.x,
                     kThreads, [&](int v, float l) { best = max(best, pack_value_index(l, v)); });
      best = block_max_u64<kThreads>(best, sh);
      slice_best = max(slice_best, best);
      if (threadIdx.x == 0) parts[c].argmax = best;
    }
  }
  __syncthreads();  // the cached keys are complete
  float const max_z = unpack_value(row_max_u64<kThreads>(slice_best, split.blocks, sh)) * inv_t;
  uint32_t min_key = 0;
  bool radix = false;  // row_radix_select ran: its last remote reads need the closing barrier
  if (isfinite(max_z)) {  // else sample_kernel reports kSampleBadLogits from the argmaxes
    // 2-3. top-k, then top-p over the kept tokens.
    min_key = row_threshold_key<kThreads>(for_each_key_in, lo, hi, split.cached, max_z,
                                          distance_per_unit(temperature), top_k, top_p, vocab,
                                          rank, split.blocks, radix, ds, sh);
    // 4. Each chunk's kept mass about its own maximum.
    for (int c = c_lo; c < c_hi; ++c) {
      float const chunk_max_z = unpack_value(parts[c].argmax) * inv_t;
      float mass = 0.0f;
      if (chunk_max_z > -INFINITY) {
        int const a = c * kSampleChunk, e = min(vocab, a + kSampleChunk);
        for_each_key_in(a, e, [&](int, uint32_t key) {
          if (key >= min_key) mass += sample_exp(float_from_order_key(key) - chunk_max_z);
        });
      }
      mass = block_sum<kThreads>(mass, sh);
      if (threadIdx.x == 0) parts[c].mass = mass;
    }
  }
  if (rank == 0 && threadIdx.x == 0) min_keys[row] = min_key;
  // No block leaves while another still reads its shared memory (the distance select's last
  // remote access is before its closing barrier).
  if (radix || !isfinite(max_z)) row_sync(split.blocks);
}

// Launches sample_row_thresholds_kernel over `rows` rows, at most `max_blocks` blocks per row
// (0: sample_threshold_blocks where the device has clusters, else 1); nothing when the config has
// neither top-k nor top-p arrays. `lists` as given to the chunk partials launch before it.
inline Status launch_sample_row_thresholds(float const* logits, int64_t rows, int vocab,
                                           int rows_per_request, SamplingConfig const& config,
                                           void* workspace, cudaStream_t stream,
                                           int max_blocks = 0,
                                           SampleListUse lists = SampleListUse::kAuto) {
  if (config.top_k == nullptr && config.top_p == nullptr) return Status::Ok();  // no row needs it
  if (max_blocks <= 0) {
    bool clusters = false;
    SPECDEC_RETURN_IF_ERROR(current_device_has_clusters(clusters));
    max_blocks = clusters ? sample_threshold_blocks(rows, vocab) : 1;
  }
  if (max_blocks > kSampleMaxCluster) {
    return Status::InvalidArgument("sample: " + std::to_string(max_blocks) +
                                   " blocks per row exceed the largest cluster, " +
                                   std::to_string(kSampleMaxCluster));
  }
  SampleThresholdSplit const split = sample_threshold_split(vocab, max_blocks);
  int64_t const blocks = rows * split.blocks;
  if (blocks > 0x7fffffff) {
    return Status::InvalidArgument("sample: " + std::to_string(rows) + " rows of vocab " +
                                   std::to_string(vocab) + " exceed one launch's blocks");
  }
  bool const listed = sample_builds_lists(lists, config, rows, vocab);
  auto const kernel = listed ? sample_row_thresholds_kernel<kSampleThresholdThreads, true>
                             : sample_row_thresholds_kernel<kSampleThresholdThreads, false>;
  constexpr size_t kMaxSmem = size_t{kSampleCachedChunks} * kSampleChunk * sizeof(uint32_t);
  // The slice's keys, or a listed row's lists, whichever is larger.
  size_t const slice_smem = split.cached ? static_cast<size_t>(split.chunks_per_block) *
                                               kSampleChunk * sizeof(uint32_t)
                                         : 0;
  size_t const list_smem =
      listed ? static_cast<size_t>(sample_list_entries(vocab)) * sizeof(uint32_t) : 0;
  static_assert(size_t{kSampleListMaxChunks} * kSampleListCap * sizeof(uint32_t) <= kMaxSmem,
                "a row's lists fit the threshold kernel's shared memory");
  size_t const smem = std::max(slice_smem, list_smem);
  static_assert(kSampleChunk % 4 == 0, "the cached keys are stored four at a time");
  // Function attributes (no stream work): shared memory above 48 KB (always the most any launch
  // takes, so a graph captured earlier stays launchable), and clusters beyond 8.
  SPECDEC_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kMaxSmem)));
  if (split.blocks > 8) {
    SPECDEC_CUDA_TRY(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  // Launched early (programmatic dependent launch) while the rows are few: its blocks start, and
  // load their logits, during the chunk partials kernel. Measured on an H100
  // (benchmarks/RESULTS.md, "Thresholds launched early; the distance select's rounds"): 0.94-0.98x
  // below 128 rows; 128 rows of V = 32000 lost 1.24x.
  ClusterLaunch const order =
      rows < kSampleManyRows ? ClusterLaunch::kAwaits : ClusterLaunch::kInOrder;
  return launch_cluster_kernel("sample_row_thresholds_kernel", kernel,
                               dim3(static_cast<unsigned>(blocks)), kSampleThresholdThreads, smem,
                               stream, split.blocks, order, logits, vocab,
                               rows_per_request, config, split,
                               static_cast<SampleChunkPartial*>(workspace),
                               sample_min_keys(workspace, rows, vocab),
                               sample_candidate_lists(workspace, rows, vocab));
}


namespace sample_detail {

// The threshold key of row `row` of request b (0 for rows without top-k / top-p).
__device__ inline uint32_t row_min_key(SamplingConfig const& config, int b, int vocab,
                                       uint32_t const* min_keys, int64_t row) {
  return sample_row_needs_threshold(config, b, vocab) ? min_keys[row] : 0u;
}

// The TargetDist and mass S of a row of request b from its chunk partials and threshold key
// (warp 0; every thread gets the same values); returns its SampleError.
__device__ inline int32_t block_row_dist(SampleChunkPartial const* parts, int vocab,
                                         SamplingConfig const& config, int b, uint32_t min_key,
                                         TargetDist& dist, float& total, SampleShared& sh) {
  float const temperature = config.temperature_of(b);
  int32_t const error = sample_config_error(temperature, config.top_p_of(b));
  if (error != kSampleOk) return error;
  __syncthreads();  // every thread has read the shared row values of earlier calls
  if (threadIdx.x < 32) {
    TargetDist d;
    float mass;
    int32_t const e =
        warp_dist_from_partials(parts, sample_chunks(vocab), temperature, min_key, d, mass);
    if (threadIdx.x == 0) {
      sh.row_greedy = d.greedy_token;
      sh.row_inv_t = d.inv_t;
      sh.row_max_z = d.max_z;
      sh.row_min_key = d.min_key;
      sh.row_mass = mass;
      sh.row_error = e;
    }
  }
  __syncthreads();
  dist = TargetDist{};
  dist.greedy_token = sh.row_greedy;
  dist.inv_t = sh.row_inv_t;
  dist.max_z = sh.row_max_z;
  dist.min_key = sh.row_min_key;
  total = sh.row_mass;
  return sh.row_error;
}

// Inverse-CDF draw from dist's weights with the `excluded` tokens removed: chunked, falling back
// to block passes over the row where rounding leaves the chosen chunk empty; -1 when no weight
// is left.
__device__ inline int32_t block_row_sample(float const* row, int vocab, SampleChunkPartial const* parts,
                                           TargetDist const& dist, int32_t const* excluded,
                                           int n_excluded, float u, SampleShared& sh) {
  auto w = [&](int v, float l) { return dist.weight(v, l); };
  int32_t token = block_sample_chunked(row, vocab, parts, dist, excluded, n_excluded, u, sh);
  if (token < 0) token = block_sample(row, vocab, w, excluded, n_excluded, u, sh);
  return token;
}

}  // namespace sample_detail

// A template (on the block size, which must be kSampleThreads) so the kernel has inline linkage
// and the header can be included by several translation units. Launched with programmatic
// dependent launch, its blocks wait for the kernels before.
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1) sample_kernel(__grid_constant__ SampleParams const p) {
  static_assert(kThreads == kSampleThreads, "the block agents assume kSampleThreads threads");
  await_prior_kernels();
  __shared__ SampleShared sh;
  int const b = blockIdx.x;
  float const* row = p.logits + static_cast<int64_t>(b) * p.vocab;
  SampleChunkPartial const* parts =
      static_cast<SampleChunkPartial const*>(p.workspace) + static_cast<int64_t>(b) * sample_chunks(p.vocab);
  uint32_t const min_key = sample_detail::row_min_key(
      p.config, b, p.vocab, sample_min_keys(p.workspace, p.batch, p.vocab), b);
  TargetDist dist;
  float total = 0.0f;
  int32_t const error =
      sample_detail::block_row_dist(parts, p.vocab, p.config, b, min_key, dist, total, sh);
  int32_t token = -1;
  if (error == kSampleOk) {
    token = dist.greedy_token >= 0
                ? dist.greedy_token
                : sample_detail::block_row_sample(row, p.vocab, parts, dist, nullptr, 0,
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
  SPECDEC_RETURN_IF_ERROR(launch_sample_row_thresholds(p.logits, p.batch, p.vocab, 1, p.config,
                                                       p.workspace, stream));
  return launch_kernel("sample_kernel", sample_kernel<kSampleThreads>, dim3(p.batch),
                       kSampleThreads, 0, stream, p);
}

}  // namespace specdec::ops
