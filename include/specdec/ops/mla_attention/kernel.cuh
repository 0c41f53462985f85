// mla_attention CUDA kernels: flash-decoding over the paged latent cache on tensor cores
// (params.hpp has the rule, the shapes and the plan). All heads of a token read the same cache
// rows (MQA in latent space), so one block serves a group of kGroup = 16 heads (the mma's M; rows
// past the last head are zeros) of one token over one chunk of its candidate slots:
//   grid  T * groups * chunks blocks of 256 threads (8 warps); block id = (t * chunks + chunk) *
//         groups + g, so the groups of one chunk run side by side and share the rows in L2
//   operands  fp32 q and cache rows are split into bf16 pairs hi + lo (core/warp.cuh
//         split_bf16x2) and every product is Ah Bh + Ah Bl + Al Bh on mma.sync m16n8k16 with fp32
//         accumulators: near-fp32 results at tensor-core speed (the fp32 FMA work, 64 heads x
//         1088 per slot, bound the CUDA-core kernel this replaces)
//   registers  each warp holds the split q fragments of its k-steps (k-step s = columns 16 s ..
//         16 s + 15 of W, padded with zeros to Wk = roundup(W, 16); warp w takes s = w, w + 8, ..)
//   smem  stage [kTile, W] fp32 (cp.async destination), khi / klo [kTile, Wk + 8] bf16 (the
//         split tile; rows padded so ldmatrix reads are conflict-free), score parts [8 warps,
//         kGroup, kTile + 8] fp32, phi / plo [kGroup, kTile + 8] bf16 (split probabilities),
//         per-head rescale factors, running (max, sum), row flags: 167 KB at W = 576
//   per tile of 32 slots:
//     1. wait for the staged tile, split it into khi / klo (zeros past W), then issue the next
//        tile's cp.async copies into stage (16-byte copies, lane over the row; rows of
//        invisible, invalid or out-of-chunk slots are zero-filled and flagged invalid), so the
//        next tile loads while this one is computed
//     2. scores: warp w, over its k-steps, S_w [16, 32] = q K^T (4 n-tiles of 8 slots, K
//        fragments by ldmatrix), written to its score part
//     3. softmax: warp w owns heads 2 w, 2 w + 1; lane = slot; s = the 8 parts summed in warp
//        order; online max / sum in registers; p split into phi / plo, the rescale alpha stored
//     4. context: warp w owns columns 64 w .. 64 w + 63 of c (8 n-tiles): acc = alpha acc + P V
//        (V fragments by ldmatrix.trans of the tile's first c columns)
//   end: chunks == 1: out = acc / sum; else (acc, max, sum) to the workspace and
//   mla_attention_combine_kernel (one block per (token, head)) merges the chunks in a fixed
//   order (4 interleaved parts, each in chunk order, then the parts in order).
// Tokens of one request (prefill, verify) each read the request's rows again: blocks are per
// token. ptxas (nvcc 13.0, sm_90, -Xptxas -v): chunk kernel 159 registers, combine 50, no spills;
// dynamic shared memory opted in above 48 KB before each launch.
// No host synchronisation or allocation: graph-capturable (the grid depends on T, heads and
// max_slots only; each token's split of its own slots is computed on the device).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/warp.cuh"
#include "specdec/ops/mla_attention/params.hpp"

namespace specdec::ops {
namespace mla_attention_detail {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = kMlaAttentionTile;    // 32 slots: one per lane in the softmax
constexpr int kGroup = kMlaAttentionGroup;  // 16 heads: the mma's M
constexpr int kRowPad = 8;                  // bf16 / fp32 padding after each smem row
constexpr int kMaxKSteps = (kMlaAttentionMaxWidth + 15) / 16;
constexpr int kWarpKSteps = (kMaxKSteps + kWarps - 1) / kWarps;  // q fragments per warp
constexpr int kHeadsPerWarp = kGroup / kWarps;                    // softmax heads per warp
constexpr int kWarpColumns = kMlaAttentionMaxLatent / kWarps;     // context columns per warp
constexpr int kCombineColumns = kMlaAttentionMaxLatent / 4;  // one float4 column per thread
constexpr int kCombineParts = 4;  // the chunks split 4 ways, parts merged in order
constexpr int kCombineThreads = kCombineColumns * kCombineParts;
static_assert(kTile == 32, "the softmax maps one lane to one slot of a tile; 4 n-tiles of 8");
static_assert(kGroup == 16 && kGroup % kWarps == 0, "one m16 tile of heads, whole heads per warp");
static_assert(kWarpColumns == 64, "each warp's context is 4 pairs of n-tiles");
static_assert(kTile % kWarps == 0 && kTile / kWarps <= 32, "whole rows per warp when staging");

// The block's shared memory at entry width W (bytes, every region 16-byte aligned).
struct SmemLayout {
  int width = 0, kwidth = 0, krow = 0;  // W, Wk = roundup(W, 16), khi / klo row stride (Wk + 8)
  size_t stage = 0, khi = 0, klo = 0, score = 0, phi = 0, plo = 0, alpha = 0, ml = 0, valid = 0;
  size_t bytes = 0;
  __host__ __device__ explicit SmemLayout(int w) : width(w), kwidth((w + 15) / 16 * 16) {
    krow = kwidth + kRowPad;
    size_t at = 0;
    auto take = [&at](size_t n) {
      size_t const here = at;
      at += (n + 15) / 16 * 16;
      return here;
    };
    stage = take(size_t{4} * kTile * width);
    khi = take(size_t{2} * kTile * krow);
    klo = take(size_t{2} * kTile * krow);
    score = take(size_t{4} * kWarps * kGroup * (kTile + kRowPad));
    phi = take(size_t{2} * kGroup * (kTile + kRowPad));
    plo = take(size_t{2} * kGroup * (kTile + kRowPad));
    alpha = take(size_t{4} * kGroup);
    ml = take(size_t{4} * 2 * kGroup);
    valid = take(size_t{4} * 2 * kTile);
    bytes = at;
  }
};

__device__ __forceinline__ void cp_async16(void* smem, void const* gmem, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned const s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_bytes)
               : "memory");
#else
  *static_cast<float4*>(smem) =
      src_bytes ? *static_cast<float4 const*>(gmem) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float warp_max_f(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ __forceinline__ void fma4(float4& acc, float p, float4 k) {
  acc.x = fmaf(p, k.x, acc.x);
  acc.y = fmaf(p, k.y, acc.y);
  acc.z = fmaf(p, k.z, acc.z);
  acc.w = fmaf(p, k.w, acc.w);
}

// What a block knows about its token.
struct TokenView {
  int t, b, i;
  int base;
  int64_t n;  // candidate slots base + i + 1 (0 for a token whose request or index is invalid)
};

__device__ __forceinline__ TokenView token_view(MlaAttentionParams const& p, int t) {
  TokenView v;
  v.t = t;
  v.b = p.token_request[t];
  v.i = p.token_index[t];
  v.base = 0;
  v.n = 0;
  if (v.b >= 0 && v.b < p.batch && v.i >= 0) {
    v.base = p.base[v.b];
    v.n = v.base < 0 ? 0 : int64_t{v.base} + v.i + 1;
  }
  return v;
}

// Slots per chunk of a token with n candidates: max(tile, roundup(ceil(n / chunks), tile)).
__device__ __forceinline__ int64_t chunk_slots(int64_t n, int chunks) {
  int64_t const per = (n + chunks - 1) / chunks;
  int64_t const rounded = (per + kTile - 1) / kTile * kTile;
  return rounded > kTile ? rounded : kTile;
}

// Row of slot u (< n) of the token, or -1 when it is invisible or has no valid page.
__device__ __forceinline__ int64_t slot_row(MlaAttentionParams const& p, TokenView const& v,
                                            int64_t u) {
  if (u >= v.base) {
    int64_t const j = u - v.base;  // j <= i as u < n
    if (p.mask) {
      if ((j >> 5) >= p.words) return -1;
      uint32_t const word = p.mask[static_cast<int64_t>(v.t) * p.words + (j >> 5)];
      if (!((word >> (j & 31)) & 1u)) return -1;
    }
  }
  int64_t const k = u / p.page_size;
  if (k >= p.max_pages) return -1;
  int32_t const page = p.page_table[static_cast<int64_t>(v.b) * p.max_pages + k];
  if (page < 0 || page >= p.num_pages) return -1;
  return int64_t{page} * p.page_size + (u - k * p.page_size);
}

// Issues the cp.async copies of tile slots [s0, s0 + kTile) into dst [kTile, W]; rows past `end`,
// invisible or invalid are zero-filled and flagged 0 in valid [kTile]. Warp w copies rows w + 8 i,
// whose cache rows its lanes i resolve first (one round of mask and page-table loads per warp).
__device__ __forceinline__ void stage_tile(MlaAttentionParams const& p, TokenView const& v,
                                           int64_t s0, int64_t end, int W, float* dst,
                                           int* valid) {
  constexpr int kRowsPerWarp = kTile / kWarps;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31, W4 = W >> 2;
  int64_t resolved = -1;
  if (lane < kRowsPerWarp) {
    int64_t const u = s0 + warp + kWarps * lane;
    resolved = u < end ? slot_row(p, v, u) : -1;
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    int const r = warp + kWarps * i;
    int64_t const row = __shfl_sync(0xffffffffu, resolved, i);
    float const* src = row >= 0 ? p.cache + row * W : p.cache;  // a valid address either way
    int const bytes = row >= 0 ? 16 : 0;                           // 0: zero fill, nothing read
    float* d = dst + r * W;
    for (int col = lane; col < W4; col += 32) {
      cp_async16(d + 4 * col, src + (row >= 0 ? 4 * col : 0), bytes);
    }
    if (lane == 0) valid[r] = row >= 0 ? 1 : 0;
  }
}

// The staged fp32 tile [kTile, W] split into khi / klo [kTile, krow] bf16 (columns W .. Wk - 1
// zero), and its row flags copied to valid_now.
__device__ __forceinline__ void split_tile(SmemLayout const& L, float const* stage,
                                           __nv_bfloat16* khi, __nv_bfloat16* klo,
                                           int const* valid_staged, int* valid_now) {
  int const quads = L.kwidth >> 2;
  for (int e = threadIdx.x; e < kTile * quads; e += kThreads) {
    int const row = e / quads, col = (e - row * quads) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (col < L.width) x = *reinterpret_cast<float4 const*>(stage + row * L.width + col);
    uint2 hi, lo;
    split_bf16x2(x.x, x.y, hi.x, lo.x);
    split_bf16x2(x.z, x.w, hi.y, lo.y);
    *reinterpret_cast<uint2*>(khi + row * L.krow + col) = hi;
    *reinterpret_cast<uint2*>(klo + row * L.krow + col) = lo;
  }
  if (threadIdx.x < kTile) valid_now[threadIdx.x] = valid_staged[threadIdx.x];
}

// One block: token t, head group g (kGroup heads), chunk `chunk` of the token's candidate slots.
static __global__ void __launch_bounds__(kThreads, 1)
    mla_attention_chunk_kernel(__grid_constant__ MlaAttentionParams const p,
                               MlaAttentionPlan const plan) {
  await_prior_kernels();
  extern __shared__ float4 smem4[];
  int const W = p.kv_lora_rank + p.rope_dim, c = p.kv_lora_rank;
  SmemLayout const L(W);
  char* const base = reinterpret_cast<char*>(smem4);
  float* const stage = reinterpret_cast<float*>(base + L.stage);
  auto* const khi = reinterpret_cast<__nv_bfloat16*>(base + L.khi);
  auto* const klo = reinterpret_cast<__nv_bfloat16*>(base + L.klo);
  float* const score_s = reinterpret_cast<float*>(base + L.score);  // [kWarps, kGroup, kTile + 8]
  auto* const phi = reinterpret_cast<__nv_bfloat16*>(base + L.phi);  // [kGroup, kTile + 8]
  auto* const plo = reinterpret_cast<__nv_bfloat16*>(base + L.plo);
  float* const alpha_s = reinterpret_cast<float*>(base + L.alpha);  // [kGroup]
  float* const ml_s = reinterpret_cast<float*>(base + L.ml);        // [2, kGroup]: max, sum
  int* const valid_s = reinterpret_cast<int*>(base + L.valid);      // [2, kTile]: staged, now
  constexpr int kScoreRow = kTile + kRowPad, kProbRow = kTile + kRowPad;

  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int const gq = lane >> 2, qq = lane & 3;  // fragment row g and quad position q
  int const g = static_cast<int>(blockIdx.x % plan.groups);
  int64_t const rest = blockIdx.x / plan.groups;
  int const chunk = static_cast<int>(rest % plan.chunks);
  int const t = static_cast<int>(rest / plan.chunks);
  TokenView const v = token_view(p, t);
  int64_t const L_slots = chunk_slots(v.n, plan.chunks);
  int64_t const start = chunk * L_slots;
  // Context columns of this warp: n-tile pairs 16 j .. 16 j + 15 past 64 w, while below c.
  int const col_base = warp * kWarpColumns;
  int const pairs = c <= col_base ? 0 : (c - col_base + 15) / 16 < 4 ? (c - col_base + 15) / 16 : 4;
  if (start >= v.n) {
    // No slot here. Chunk partials of such chunks are never read; a lone chunk (n == 0: an invalid
    // token) writes zeros.
    if (plan.chunks == 1) {
      for (int e = tid; e < kGroup * c; e += kThreads) {
        int const h = g * kGroup + e / c;
        if (h < p.heads) p.out[(static_cast<int64_t>(t) * p.heads + g * kGroup) * c + e] = 0.0f;
      }
    }
    return;
  }
  int64_t const end = start + L_slots < v.n ? start + L_slots : v.n;
  int const ntiles = static_cast<int>((end - start + kTile - 1) / kTile);

  stage_tile(p, v, start, end, W, stage, valid_s);
  cp_async_commit();

  // This warp's q fragments, times scale, split: k-step s = warp + kWarps i (rows past the last
  // head and columns past W are zero).
  int const ksteps = L.kwidth / 16;
  uint32_t qhi[kWarpKSteps][4], qlo[kWarpKSteps][4];
  {
    float2 qv[kWarpKSteps][4];
#pragma unroll
    for (int i = 0; i < kWarpKSteps; ++i) {
      int const k0 = (warp + kWarps * i) * 16;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        int const h = g * kGroup + gq + (r & 1) * 8, col = k0 + 2 * qq + (r >> 1) * 8;
        qv[i][r] = make_float2(0.f, 0.f);
        if (h < p.heads && col < W) {
          qv[i][r] = *reinterpret_cast<float2 const*>(
              p.q + (static_cast<int64_t>(t) * p.heads + h) * W + col);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kWarpKSteps; ++i) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        split_bf16x2(qv[i][r].x * p.scale, qv[i][r].y * p.scale, qhi[i][r], qlo[i][r]);
      }
    }
  }

  float m_run[kHeadsPerWarp], l_run[kHeadsPerWarp];
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j) {
    m_run[j] = -INFINITY;
    l_run[j] = 0.0f;
  }
  float acc[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int x = 0; x < 4; ++x) acc[n][x] = 0.0f;
  }

  for (int k = 0; k < ntiles; ++k) {
    int64_t const s0 = start + static_cast<int64_t>(k) * kTile;
    cp_async_wait_all();
    __syncthreads();  // tile k staged; every warp is done with tile k - 1's khi / klo and p
    split_tile(L, stage, khi, klo, valid_s, valid_s + kTile);
    __syncthreads();  // khi / klo hold tile k; stage is free
    if (k + 1 < ntiles) stage_tile(p, v, s0 + kTile, end, W, stage, valid_s);
    cp_async_commit();

    // 2. This warp's part of the scores: S_w [16 heads, 32 slots] over its k-steps.
    {
      float sacc[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int x = 0; x < 4; ++x) sacc[n][x] = 0.0f;
      }
      // ldmatrix rows: lane l -> slot (l / 16) * 8 + l % 8 (+ 16 for the second half), column
      // k0 + ((l / 8) % 2) * 8: matrices (slots 0-7, k lo), (0-7, k hi), (8-15, k lo),
      // (8-15, k hi).
      int const lrow = (lane >> 4) * 8 + (lane & 7), lcol = ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int i = 0; i < kWarpKSteps; ++i) {
        int const s = warp + kWarps * i;
        if (s >= ksteps) break;  // warp-uniform
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          int const off = (half * 16 + lrow) * L.krow + s * 16 + lcol;
          uint32_t bh[4], bl[4];
          ldmatrix_x4(bh, khi + off);
          ldmatrix_x4(bl, klo + off);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            mma_bf16_16816_split(sacc[half * 2 + n], qhi[i], qlo[i], bh[2 * n], bh[2 * n + 1],
                                 bl[2 * n], bl[2 * n + 1]);
          }
        }
      }
      float* const part = score_s + warp * kGroup * kScoreRow;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        int const slot = n * 8 + 2 * qq;
        *reinterpret_cast<float2*>(part + gq * kScoreRow + slot) =
            make_float2(sacc[n][0], sacc[n][1]);
        *reinterpret_cast<float2*>(part + (gq + 8) * kScoreRow + slot) =
            make_float2(sacc[n][2], sacc[n][3]);
      }
    }
    __syncthreads();

    // 3. Online softmax: warp w owns heads kHeadsPerWarp w + j; lane = slot.
    {
      bool const vis = valid_s[kTile + lane] != 0;
#pragma unroll
      for (int j = 0; j < kHeadsPerWarp; ++j) {
        int const hl = warp * kHeadsPerWarp + j;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += score_s[(w * kGroup + hl) * kScoreRow + lane];
        s = vis ? s : -INFINITY;
        float const m_new = fmaxf(m_run[j], warp_max_f(s));
        float alpha = 1.0f, prob = 0.0f;
        if (m_new != -INFINITY) {  // warp-uniform
          alpha = expf(m_run[j] - m_new);  // 0 while m_run is -inf
          prob = vis ? expf(s - m_new) : 0.0f;
        }
        l_run[j] = l_run[j] * alpha + warp_sum(prob);
        m_run[j] = m_new;
        __nv_bfloat16 const ph = __float2bfloat16_rn(prob);
        phi[hl * kProbRow + lane] = ph;
        plo[hl * kProbRow + lane] = __float2bfloat16_rn(prob - __bfloat162float(ph));
        if (lane == 0) alpha_s[hl] = alpha;
      }
    }
    __syncthreads();

    // 4. Context: acc = alpha acc + P V over this warp's columns.
    if (pairs > 0) {  // warp-uniform
      float const a_lo = alpha_s[gq], a_hi = alpha_s[gq + 8];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        acc[n][0] *= a_lo;
        acc[n][1] *= a_lo;
        acc[n][2] *= a_hi;
        acc[n][3] *= a_hi;
      }
      // ldmatrix.trans rows: lane l -> slot k0 + l % 8 + ((l / 8) % 2) * 8, column
      // n0 + (l / 16) * 8: matrices (k lo, n-tile 0), (k hi, n-tile 0), (k lo, n-tile 1),
      // (k hi, n-tile 1).
      int const vrow = (lane & 7) + ((lane >> 3) & 1) * 8, vcol = (lane >> 4) * 8;
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks) {
        int const k0 = ks * 16;
        uint32_t ah[4], al[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          int const at = (gq + (r & 1) * 8) * kProbRow + k0 + 2 * qq + (r >> 1) * 8;
          ah[r] = *reinterpret_cast<uint32_t const*>(phi + at);
          al[r] = *reinterpret_cast<uint32_t const*>(plo + at);
        }
#pragma unroll
        for (int pr = 0; pr < 4; ++pr) {
          if (pr >= pairs) break;  // warp-uniform
          int const off = (k0 + vrow) * L.krow + col_base + pr * 16 + vcol;
          uint32_t bh[4], bl[4];
          ldmatrix_x4_trans(bh, khi + off);
          ldmatrix_x4_trans(bl, klo + off);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            mma_bf16_16816_split(acc[pr * 2 + n], ah, al, bh[2 * n], bh[2 * n + 1], bl[2 * n],
                                 bl[2 * n + 1]);
          }
        }
      }
    }
  }

  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kHeadsPerWarp; ++j) {
      ml_s[warp * kHeadsPerWarp + j] = m_run[j];
      ml_s[kGroup + warp * kHeadsPerWarp + j] = l_run[j];
    }
  }
  __syncthreads();
  // This lane's accumulators: heads gq, gq + 8 (row half r), columns col_base + 8 n + 2 qq, + 1.
  int64_t const partials = static_cast<int64_t>(p.tokens) * plan.groups * plan.chunks;
  int64_t const pidx = (static_cast<int64_t>(t) * plan.groups + g) * plan.chunks + chunk;
  float* const workspace = static_cast<float*>(p.workspace);
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    int const col = col_base + 8 * n + 2 * qq;
    if (n >= 2 * pairs || col >= c) continue;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int const hl = gq + 8 * r, h = g * kGroup + hl;
      float2 o = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
      if (plan.chunks == 1) {
        if (h >= p.heads) continue;
        float const l = ml_s[kGroup + hl];
        o = l > 0.0f ? make_float2(o.x / l, o.y / l) : make_float2(0.f, 0.f);
        *reinterpret_cast<float2*>(p.out + (static_cast<int64_t>(t) * p.heads + h) * c + col) = o;
      } else {
        // Partial of (t, g, chunk): acc [kGroup, c] in the first region.
        *reinterpret_cast<float2*>(workspace + (pidx * kGroup + hl) * c + col) = o;
      }
    }
  }
  if (plan.chunks == 1) return;
  // (max, sum) [kGroup, 2] in the second region.
  float* const wml = workspace + partials * kGroup * c + pidx * kGroup * 2;
  if (tid < kGroup) {
    wml[2 * tid] = ml_s[tid];
    wml[2 * tid + 1] = ml_s[kGroup + tid];
  }
}

// One block per (token, head): merges the token's used chunks. Thread (part, column) takes the
// chunks k = part, part + kCombineParts, ... of one float4 column in one pass (so a decode's ~33
// chunks are ~9 rounds of independent loads per thread, not 33), keeping a running maximum and
// rescaling its sum and column when the maximum grows; the parts' (maximum, sum, column) meet in
// shared memory and are merged in part order. The order depends on (T, heads, max_slots) only.
static __global__ void __launch_bounds__(kCombineThreads)
    mla_attention_combine_kernel(__grid_constant__ MlaAttentionParams const p,
                                 MlaAttentionPlan const plan) {
  await_prior_kernels();
  __shared__ float s_max[kCombineParts], s_sum[kCombineParts];
  __shared__ float4 s_o[kCombineParts][kCombineColumns];
  int const t = static_cast<int>(blockIdx.x / p.heads), h = static_cast<int>(blockIdx.x % p.heads);
  int const G = plan.group, g = h / G, hl = h - g * G;
  int const c4 = p.kv_lora_rank >> 2;
  int const part = threadIdx.x / kCombineColumns, col4 = threadIdx.x % kCombineColumns;
  TokenView const v = token_view(p, t);
  int64_t used = 0;
  if (v.n > 0) {
    int64_t const L = chunk_slots(v.n, plan.chunks);
    used = (v.n + L - 1) / L;
    if (used > plan.chunks) used = plan.chunks;
  }
  int64_t const partials = static_cast<int64_t>(p.tokens) * plan.groups * plan.chunks;
  int64_t const first = (static_cast<int64_t>(t) * plan.groups + g) * plan.chunks;
  float const* const wml =
      reinterpret_cast<float const*>(p.workspace) + partials * G * p.kv_lora_rank;
  float4 const* const wacc = reinterpret_cast<float4 const*>(p.workspace);
  float mx = -INFINITY, sum = 0.0f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  if (col4 < c4) {
#pragma unroll 4
    for (int64_t k = part; k < used; k += kCombineParts) {
      float const m = wml[((first + k) * G + hl) * 2];
      float const l = wml[((first + k) * G + hl) * 2 + 1];
      float4 const a = wacc[((first + k) * G + hl) * c4 + col4];
      if (m == -INFINITY) continue;  // a chunk without a visible slot adds nothing
      if (m > mx) {
        float const rescale = expf(mx - m);  // 0 while mx is -inf
        sum *= rescale;
        o = make_float4(o.x * rescale, o.y * rescale, o.z * rescale, o.w * rescale);
        mx = m;
      }
      float const w = expf(m - mx);
      sum = fmaf(l, w, sum);
      fma4(o, w, a);
    }
  }
  if (col4 == 0) {
    s_max[part] = mx;
    s_sum[part] = sum;
  }
  s_o[part][col4] = o;
  __syncthreads();
  if (part != 0 || col4 >= c4) return;
  float top = s_max[0];
#pragma unroll
  for (int q = 1; q < kCombineParts; ++q) top = fmaxf(top, s_max[q]);
  float total = 0.0f;
  o = make_float4(0.f, 0.f, 0.f, 0.f);
  if (top != -INFINITY) {  // else no visible slot: zeros
#pragma unroll
    for (int q = 0; q < kCombineParts; ++q) {
      if (s_max[q] == -INFINITY) continue;
      float const w = expf(s_max[q] - top);
      total = fmaf(s_sum[q], w, total);
      fma4(o, w, s_o[q][col4]);
    }
    o = make_float4(o.x / total, o.y / total, o.z / total, o.w / total);
  }
  reinterpret_cast<float4*>(p.out)[(static_cast<int64_t>(t) * p.heads + h) * c4 + col4] = o;
}

}  // namespace mla_attention_detail

inline Status mla_attention_cuda(MlaAttentionParams const& p, cudaStream_t stream) {
  namespace d = mla_attention_detail;
  if (p.tokens == 0) return Status::Ok();
  MlaAttentionPlan const plan = mla_attention_plan(p.tokens, p.heads, p.max_slots);
  int64_t const blocks = static_cast<int64_t>(p.tokens) * plan.groups * plan.chunks;
  if (blocks > INT_MAX || static_cast<int64_t>(p.tokens) * p.heads > INT_MAX) {
    return Status::InvalidArgument("mla_attention: " + std::to_string(p.tokens) + " tokens x " +
                                   std::to_string(p.heads) + " heads exceed the grid limit");
  }
  size_t const smem = d::SmemLayout(p.kv_lora_rank + p.rope_dim).bytes;
  auto const kernel = d::mla_attention_chunk_kernel;
  if (smem > 48 * 1024) {
    // Above the default 48 KB per block: opt in (a function attribute, no stream work).
    SPECDEC_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  }
  SPECDEC_RETURN_IF_ERROR(launch_kernel("mla_attention_chunk_kernel", kernel,
                                        static_cast<unsigned>(blocks), d::kThreads, smem, stream,
                                        p, plan));
  if (plan.chunks == 1) return Status::Ok();
  return launch_kernel("mla_attention_combine_kernel", d::mla_attention_combine_kernel,
                       static_cast<unsigned>(static_cast<int64_t>(p.tokens) * p.heads),
                       d::kCombineThreads, 0, stream, p, plan);
}

}  // namespace specdec::ops
