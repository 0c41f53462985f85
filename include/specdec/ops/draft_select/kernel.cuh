// draft_select CUDA kernels.
//   draft_expand_kernel<kTopK>: grid (splits, K_in, B), one launch. Each block reads one chunk of
//     one branch's logits row with 16-byte loads (kUnroll in flight per thread), keeping an online
//     (max, sum of exp) per thread, updated once per group of 16 logits, and one top-kTopK of
//     (logit, draft id) keys per warp, spread over its lanes, which only logits at or above a
//     bound on its K-th best enter (few after the first group); one warp merges the warps' lists
//     (butterfly merges of sorted lists) into the workspace, and the block counts itself in with
//     an atomic. The request's last block merges its K_in * splits partials (one warp per branch)
//     into the log-sum-exp and each branch's top-kTopK children, writes the candidates (a lane
//     per child), ranks the K_in * kTopK children by score (a few threads per child, counting
//     better ones) for the next frontier and resets the counter.
//   draft_finalize_kernel: one block per request; each thread ranks its candidates by counting
//     better ones over the buffer in shared memory (O(C) each, all in parallel); the chosen get
//     their node index by counting chosen slots below them.
// Launchers do no host synchronisation, allocation or host read of device data: B, topk, step,
// steps and the vocabulary are the op's static shape (a CUDA graph holds one node per step).
// draft_finalize always, and draft_expand at batch 1, launch with programmatic dependent launch
// (core/cuda.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/core/macros.hpp"
#include "specdec/ops/draft_select/params.hpp"

namespace specdec::ops {
namespace draft_select_detail {

// 256 threads x kUnroll = 4 float4 loads in flight = 16 KiB per block per round; up to 8 blocks
// per SM cover H200 latency x bandwidth (same choice as verify_greedy's argmax).
constexpr int kExpandThreads = 256;
constexpr int kExpandUnroll = 4;
constexpr int kExpandWarps = kExpandThreads / 32;
static_assert(kExpandThreads * kExpandUnroll * 4 == kDraftExpandRoundFloats,
              "draft_expand: the host's chunks must be whole rounds of the block's loads");
// draft_finalize: candidates are ranked by 256 threads (C <= 2048: at most 8 per thread).
constexpr int kFinalizeThreads = 256;

// keys = the K largest of keys and other, two descending lists (K a power of two), descending:
// the pairwise maxima of keys and reversed other hold the K largest as a bitonic sequence, which
// log2(K) half-cleaner stages sort (compile-time indices only: no local memory).
template <int K>
__device__ __forceinline__ void merge_topk(uint64_t (&keys)[K], uint64_t const (&other)[K]) {
  static_assert((K & (K - 1)) == 0, "merge_topk: K must be a power of two");
#pragma unroll
  for (int j = 0; j < K; ++j) keys[j] = keys[j] > other[K - 1 - j] ? keys[j] : other[K - 1 - j];
#pragma unroll
  for (int half = K / 2; half > 0; half >>= 1) {
#pragma unroll
    for (int j = 0; j < K; ++j) {
      if ((j & half) == 0 && keys[j + half] > keys[j]) {
        uint64_t const t = keys[j];
        keys[j] = keys[j + half];
        keys[j + half] = t;
      }
    }
  }
}

// Warp-wide top-K of the lanes' descending lists: five butterfly rounds, each merging a lane's
// list with that of lane ^ offset (merge_topk; the two hold disjoint keys, 0 marking empty
// entries). On return every lane's `keys` holds the warp's top K, descending.
template <int K>
__device__ __forceinline__ void warp_topk(uint64_t (&keys)[K]) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    uint64_t other[K];
#pragma unroll
    for (int j = 0; j < K; ++j) other[j] = __shfl_xor_sync(0xffffffffu, keys[j], offset);
    merge_topk(keys, other);
  }
}

__device__ __forceinline__ void warp_softmax_merge(float& m, float& s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    float const m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    float const s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    draft_softmax_merge(m, s, m2, s2);
  }
}

// The K-th largest of the lanes' values (K <= 32), on every lane: a bitonic sort over the warp.
template <int K>
__device__ __forceinline__ float warp_kth_largest(float v) {
  int const lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      float const other = __shfl_xor_sync(0xffffffffu, v, j);
      bool const keep_min = ((lane & j) == 0) == ((lane & k) == 0);  // ascending by lane at the end
      v = keep_min ? fminf(v, other) : fmaxf(v, other);
    }
  }
  return __shfl_sync(0xffffffffu, v, 32 - K);
}

// A warp's running top-K of (logit, draft id) keys, spread over its lanes: lane j < K holds the
// j-th best (0: empty). A logit enters only if it is not below `floor`, a value the warp's K-th
// best is known to reach: the list's K-th value once it is full, before that the K-th largest of
// the lanes' first group maxima (K logits at least that large exist). So after the first group
// only the few logits that can still make the top K cost a warp insertion; a logit below the
// floor costs one compare.
template <int K>
struct WarpTopK {
  uint64_t key = 0;
  float floor = -INFINITY;
  bool primed = false;
};

// One group of N logits per lane (x[u] with draft id id[u], real where valid[u]) into the lane's
// online softmax (m, s: the row max so far and the sum of exp(x - m)) and the warp's top-K. All
// 32 lanes call it equally often (it shuffles).
template <int K, int N>
__device__ __forceinline__ void absorb(float const (&x)[N], int32_t const (&id)[N],
                                       bool const (&valid)[N], float& m, float& s,
                                       WarpTopK<K>& top) {
  float group_max = -INFINITY;  // fmaxf skips NaN: a NaN logit still turns s into NaN below
#pragma unroll
  for (int u = 0; u < N; ++u) group_max = valid[u] ? fmaxf(group_max, x[u]) : group_max;
  if (group_max > m) {
    s *= __expf(m - group_max);  // m = -inf: s was 0
    m = group_max;
  }
  if (m != -INFINITY) {
#pragma unroll
    for (int u = 0; u < N; ++u) s += valid[u] ? __expf(x[u] - m) : 0.0f;
  }
  if (!top.primed) {
    top.floor = warp_kth_largest<K>(group_max);
    top.primed = true;
  }
  int const lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    bool pass = valid[u] && !(x[u] < top.floor);  // NaN passes to the exact key compare
    for (unsigned ballot; (ballot = __ballot_sync(0xffffffffu, pass)) != 0;) {
      int const src = __ffs(ballot) - 1;
      uint64_t const key = __shfl_sync(0xffffffffu, pack_value_index(x[u], id[u]), src);
      if (lane == src) pass = false;
      uint64_t const above = __shfl_up_sync(0xffffffffu, top.key, 1);
      if (lane < K && key > top.key) top.key = lane == 0 || key < above ? key : above;
      uint64_t const kth = __shfl_sync(0xffffffffu, top.key, K - 1);
      if (kth != 0) top.floor = unpack_value(kth);
      pass = pass && !(x[u] < top.floor);
    }
  }
}

template <int K>
struct ExpandWorkspace {
  float2* partial;     // [B * K_in * splits] (max, sum)
  uint64_t* keys;      // [B * K_in * splits, K]
  uint32_t* arrivals_end;  // one past the counters: request b's is arrivals_end[-1 - b]

  // Blocks of request b done (the last one resets it to 0). Counted from the workspace's end, so
  // a counter's address does not depend on (B, Vd, topk): a workspace sized for the largest
  // shape serves every smaller one without stale counters.
  __device__ uint32_t* arrival(int b) const { return arrivals_end - 1 - b; }
};

template <int K>
__device__ __forceinline__ ExpandWorkspace<K> expand_workspace(DraftExpandParams const& p) {
  size_t const parts = static_cast<size_t>(p.batch) * p.topk * draft_expand_max_splits(p.vocab);
  float2* partial = static_cast<float2*>(p.workspace);
  uint64_t* keys = reinterpret_cast<uint64_t*>(partial + parts);
  return {partial, keys,
          reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(p.workspace) + p.workspace_bytes)};
}

// Run by the last block of request b: warp i merges branch i's split partials (read through L2:
// other blocks wrote them) into its log-sum-exp and top-K children and writes them to the
// candidate buffer (lane j child j); then the children are ranked by score for the next frontier.
template <int K>
__device__ __forceinline__ void expand_merge_request(DraftExpandParams const& p,
                                                     ExpandWorkspace<K> const& ws, int b, int K_in,
                                                     int splits) {
  __shared__ uint64_t s_child_key[K * K];  // (score, slot) keys of the children, index i * K + j
  __shared__ int32_t s_child_draft[K * K];
  int const tid = threadIdx.x, lane = tid & 31, i = tid >> 5;
  int const C = draft_candidate_count(K, p.steps), base = draft_step_base(K, p.step);
  if (i < K_in) {
    int64_t const row = static_cast<int64_t>(b) * K_in + i;
    float m = -INFINITY, s = 0.0f;
    uint64_t keys[K];
#pragma unroll
    for (int j = 0; j < K; ++j) keys[j] = 0;
    for (int sp = lane; sp < splits; sp += 32) {
      int64_t const part = row * splits + sp;
      float2 const ms = __ldcg(ws.partial + part);
      draft_softmax_merge(m, s, ms.x, ms.y);
      uint64_t split_keys[K];  // descending, as the split's block wrote them
#pragma unroll
      for (int j = 0; j < K; ++j) split_keys[j] = __ldcg(ws.keys + part * K + j);
      merge_topk(keys, split_keys);
    }
    warp_softmax_merge(m, s);
    warp_topk(keys);
    if (lane < K) {  // lane j writes child j
      uint64_t key = 0;
#pragma unroll
      for (int j = 0; j < K; ++j) key = j == lane ? keys[j] : key;
      int32_t const d = unpack_index(key);
      int const slot = base + i * K + lane;
      int64_t const at = static_cast<int64_t>(b) * C + slot;
      float const score =
          draft_child_score(p.frontier_scores[row], unpack_value(key), draft_log_sum_exp(m, s));
      p.cand_tokens[at] = draft_target_token(p.d2t, d);
      p.cand_scores[at] = score;
      p.cand_parent[at] = p.frontier_slots[row];
      s_child_key[i * K + lane] = pack_value_index(score, slot);
      s_child_draft[i * K + lane] = d;
    }
  }
  __syncthreads();
  // Child c's rank = the children with a larger key, counted by kRankers threads (adjacent lanes,
  // as many as there are children up to the block's share) over a share of them each.
  constexpr int kRankers = kExpandThreads / (K * K) < K * K ? kExpandThreads / (K * K) : K * K;
  static_assert(kRankers <= 32 && (kRankers & (kRankers - 1)) == 0);
  int const children = K_in * K, c = tid / kRankers;
  uint64_t const key = c < children ? s_child_key[c] : 0;
  int rank = 0;
  for (int u = tid % kRankers; u < children; u += kRankers) rank += s_child_key[u] > key ? 1 : 0;
#pragma unroll
  for (int offset = kRankers / 2; offset > 0; offset >>= 1)
    rank += __shfl_xor_sync(0xffffffffu, rank, offset);
  if (c < children && tid % kRankers == 0 && rank < K) {
    int64_t const at = static_cast<int64_t>(b) * K + rank;
    int32_t const d = s_child_draft[c];
    p.next_scores[at] = unpack_value(key);
    p.next_slots[at] = unpack_index(key);
    p.next_tokens[at] = draft_target_token(p.d2t, d);
    p.next_draft_tokens[at] = d;
    p.next_branch[at] = c / K;
  }
}

// grid (splits, K_in, B): block (split, i, b) reduces chunk `split` of branch i's logits row to a
// (max, sum) pair and its top-K keys in the workspace; the last of request b's K_in * splits
// blocks to arrive (threadfence + atomic counter) merges the request in place. One launch.
template <int K>
__global__ void __launch_bounds__(kExpandThreads)
    draft_expand_kernel(__grid_constant__ DraftExpandParams const p, int const chunk) {
  __shared__ uint64_t s_keys[kExpandWarps][K];
  __shared__ float2 s_ms[kExpandWarps];
  __shared__ bool s_last;
  await_prior_kernels();
  int const split = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
  int const K_in = gridDim.y, splits = gridDim.x, tid = threadIdx.x;
  int const Vd = p.vocab;
  int64_t const row = static_cast<int64_t>(b) * K_in + i;
  float const* x = p.logits + row * Vd;
  int const c0 = split * chunk, c1 = min(c0 + chunk, Vd);

  float m = -INFINITY, s = 0.0f;
  WarpTopK<K> top;

  // float4 body when the row is 16-byte aligned (chunks start at multiples of 4), scalar rest;
  // both loops run equally often on every thread of the block.
  bool const aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  int const vectors = aligned ? (c1 - c0) >> 2 : 0;
  float4 const* xv = reinterpret_cast<float4 const*>(x + c0);
  for (int v0 = 0; v0 < vectors; v0 += kExpandThreads * kExpandUnroll) {
    float4 v[kExpandUnroll];
#pragma unroll
    for (int u = 0; u < kExpandUnroll; ++u) {
      int const idx = v0 + u * kExpandThreads + tid;
      v[u] = idx < vectors ? __ldg(xv + idx) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float xs[4 * kExpandUnroll];
    int32_t ids[4 * kExpandUnroll];
    bool valid[4 * kExpandUnroll];
#pragma unroll
    for (int u = 0; u < kExpandUnroll; ++u) {
      int const idx = v0 + u * kExpandThreads + tid;
      float const e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        xs[4 * u + c] = e[c];
        ids[4 * u + c] = c0 + 4 * idx + c;
        valid[4 * u + c] = idx < vectors;
      }
    }
    absorb(xs, ids, valid, m, s, top);
  }
  for (int d0 = c0 + 4 * vectors; d0 < c1; d0 += kExpandThreads) {
    int const d = d0 + tid;
    bool const valid[1] = {d < c1};
    float const xs[1] = {valid[0] ? x[d] : 0.0f};
    int32_t const ids[1] = {d};
    absorb(xs, ids, valid, m, s, top);
  }

  // Block merge: the warps' lists, then warp 0 over them, into the workspace.
  int const lane = tid & 31, warp = tid >> 5;
  warp_softmax_merge(m, s);
  if (lane == 0) s_ms[warp] = make_float2(m, s);
  if (lane < K) s_keys[warp][lane] = top.key;
  __syncthreads();
  ExpandWorkspace<K> const ws = expand_workspace<K>(p);
  if (warp == 0) {
    m = -INFINITY;
    s = 0.0f;
    uint64_t keys[K];
#pragma unroll
    for (int j = 0; j < K; ++j) keys[j] = 0;
    if (lane < kExpandWarps) {
      m = s_ms[lane].x;
      s = s_ms[lane].y;
#pragma unroll
      for (int j = 0; j < K; ++j) keys[j] = s_keys[lane][j];
    }
    warp_softmax_merge(m, s);
    warp_topk(keys);
    int64_t const part = row * splits + split;
    if (lane == 0) ws.partial[part] = make_float2(m, s);
    if (lane < K) {
      uint64_t mine = 0;
#pragma unroll
      for (int j = 0; j < K; ++j) mine = j == lane ? keys[j] : mine;
      ws.keys[part * K + lane] = mine;
    }
    __threadfence();  // partials visible device-wide before this block counts as arrived
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t const arrived = atomicAdd(ws.arrival(b), 1u);
    s_last = arrived == static_cast<uint32_t>(K_in * splits - 1);
  }
  __syncthreads();
  if (!s_last) return;  // block-uniform
  __threadfence();
  expand_merge_request<K>(p, ws, b, K_in, splits);
  if (tid == 0) *ws.arrival(b) = 0;  // ready for the next launch (stream order)
}

template <int K>
Status draft_expand_launch(DraftExpandParams const& p, cudaStream_t stream) {
  int const K_in = draft_branches(K, p.step);
  int const rows = p.batch * K_in;
  int const chunk = draft_expand_chunk(rows, p.vocab);
  int const splits = ceil_div(p.vocab, chunk);
  // Programmatic dependent launch at batch 1 only: every batch-1 shape measured gained 5-7% by
  // it; at batch 8 and 64 some shapes lost 10-16% (and 17-35% before), even with the whole grid
  // resident at once (benchmarks/RESULTS.md, 2026-12-04 and 2026-12-06).
  ProgrammaticLaunchScope const batch_one(p.batch == 1);
  return launch_kernel("draft_expand_kernel", draft_expand_kernel<K>,
                       dim3(splits, K_in, p.batch), kExpandThreads, 0, stream, p, chunk);
}

// Dynamic shared memory of draft_finalize_kernel: keys [C] u64, node index [C] i32, chosen [C] u8.
inline size_t finalize_smem_bytes(int C) { return static_cast<size_t>(C) * (8 + 4 + 1); }

static __global__ void __launch_bounds__(kFinalizeThreads)
    draft_finalize_kernel(__grid_constant__ DraftFinalizeParams const p) {
  await_prior_kernels();
  extern __shared__ __align__(8) unsigned char s_raw[];
  int const C = draft_candidate_count(p.topk, p.steps), N = p.nodes;
  uint64_t* s_key = reinterpret_cast<uint64_t*>(s_raw);
  int32_t* s_node = reinterpret_cast<int32_t*>(s_key + C);
  uint8_t* s_chosen = reinterpret_cast<uint8_t*>(s_node + C);
  int const b = blockIdx.x, tid = threadIdx.x;
  int64_t const c0 = static_cast<int64_t>(b) * C, n0 = static_cast<int64_t>(b) * N;

  for (int c = tid; c < C; c += blockDim.x) s_key[c] = pack_value_index(p.cand_scores[c0 + c], c);
  __syncthreads();
  // Chosen: fewer than N-1 better candidates (keys are unique, so exactly N-1 are chosen).
  for (int c = tid; c < C; c += blockDim.x) {
    uint64_t const key = s_key[c];
    int rank = 0;
    for (int u = 0; u < C; ++u) rank += s_key[u] > key ? 1 : 0;
    s_chosen[c] = rank < N - 1 ? 1 : 0;
  }
  __syncthreads();
  // Node index of a chosen slot: 1 + chosen slots below it (slot order puts parents first).
  for (int c = tid; c < C; c += blockDim.x) {
    int below = 0;
    if (s_chosen[c]) {
      for (int u = 0; u < c; ++u) below += s_chosen[u];
    }
    s_node[c] = s_chosen[c] ? 1 + below : -1;
  }
  __syncthreads();
  bool missing = false;
  for (int c = tid; c < C; c += blockDim.x) {
    int const node = s_node[c];
    if (node < 0) continue;
    int32_t const ps = p.cand_parent[c0 + c];
    int32_t const parent = ps == -1 ? 0 : (ps >= 0 && ps < c ? s_node[ps] : -1);
    missing |= parent == -1;
    p.tokens[n0 + node] = p.cand_tokens[c0 + c];
    p.parents[n0 + node] = parent;
    p.node_slot[n0 + node] = c;
    if (p.node_scores) p.node_scores[n0 + node] = p.cand_scores[c0 + c];
  }
  missing = __syncthreads_or(missing);
  if (tid == 0) {
    p.tokens[n0] = p.root_tokens[b];
    p.parents[n0] = -1;
    p.node_slot[n0] = -1;
    if (p.node_scores) p.node_scores[n0] = 0.0f;
    p.status[b] = missing ? kDraftParentMissing : kDraftSelectOk;
  }
}

}  // namespace draft_select_detail

// Launches draft_expand on `stream` (one kernel); all pointers in p are device memory and
// p.workspace holds draft_expand_workspace_bytes(B, Vd, topk) bytes.
inline Status draft_expand_cuda(DraftExpandParams const& p, cudaStream_t stream) {
  switch (p.topk) {
    case 1:
      return draft_select_detail::draft_expand_launch<1>(p, stream);
    case 2:
      return draft_select_detail::draft_expand_launch<2>(p, stream);
    case 4:
      return draft_select_detail::draft_expand_launch<4>(p, stream);
    case 8:
      return draft_select_detail::draft_expand_launch<8>(p, stream);
    default:
      return Status::Unsupported("draft_expand: topk " + std::to_string(p.topk) +
                                 " is not compiled in: use one of " + kDraftSelectTopKList);
  }
}

// Launches draft_finalize on `stream`; all pointers in p are device memory.
inline Status draft_finalize_cuda(DraftFinalizeParams const& p, cudaStream_t stream) {
  int const C = draft_candidate_count(p.topk, p.steps);
  return launch_kernel("draft_finalize_kernel", draft_select_detail::draft_finalize_kernel,
                       dim3(p.batch), draft_select_detail::kFinalizeThreads,
                       draft_select_detail::finalize_smem_bytes(C), stream, p);
}

}  // namespace specdec::ops
