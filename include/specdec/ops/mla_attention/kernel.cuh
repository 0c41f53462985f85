// mla_attention CUDA kernels: flash-decoding over the paged latent cache (params.hpp has the rule,
// the shapes and the plan). All heads of a token read the same cache rows (MQA in latent space),
// so one block serves a group of G heads (G = 8 when heads <= 8, else 16) of one token over one
// chunk of its candidate slots:
//   grid  T * groups * chunks blocks of 256 threads (8 warps); block id = (t * chunks + chunk) *
//         groups + g, so the groups of one chunk run side by side and share the rows in L2
//   smem  q of the group [G, W] (times scale), two tiles of 32 rows [2, 32, W] (cp.async double
//         buffer: tile k+1 loads while tile k is computed), scores [2, G, 32], probabilities
//         [32, G], per-head rescale factors: 190 KB for G = 16, W = 576 (one block per SM)
//   per tile of 32 slots:
//     1. stage: warp w copies rows w, w + 8, ... (16-byte cp.async, lane over the row); rows of
//        invisible, invalid or out-of-chunk slots are zero-filled and flagged invalid
//     2. scores: warp = 8 slots x one half of W; lane = (8 column lanes) x (4 lane groups), each
//        lane a 4-head x LS-slot register tile over its columns (LS = 8 for G = 16, 4 for G = 8),
//        reduced over the 8 column lanes by a transposing butterfly (each lane keeps LS/2 sums)
//     3. softmax: warp w owns heads w (+ 8); lane = slot; online max / sum in registers, p and the
//        rescale factor alpha to shared memory
//     4. context: thread = (head half, float4 column of c): acc[G/2] float4 *= alpha, += p * row
//   end: chunks == 1: out = acc / sum; else (acc, max, sum) to the workspace and
//   mla_attention_combine_kernel (one block per (token, head)) merges the chunks in a fixed
//   order (4 interleaved parts, each in chunk order, then the parts in order).
// Tokens of one request (prefill, verify) each read the request's rows again: blocks are per
// token; sharing key tiles between a request's tokens (a [N * heads, W] x [W, slots] product on
// tensor cores) is the next step for prefill and verify. The fp32 FMA work (~1100 FMA per slot
// and head) bounds the Kimi shapes before HBM does: see benchmarks/bench_mla_attention.cu (not yet
// measured on the H200). ptxas (nvcc 13.0, sm_90, -Xptxas -v): chunk kernel G = 16 168 registers,
// G = 8 110, combine 32, no spills; dynamic shared memory at W = 576 190,912 bytes (G = 16) and
// 169,312 (G = 8), opted in above 48 KB before each launch.
// No host synchronisation or allocation: graph-capturable (the grid depends on T, heads and
// max_slots only; each token's split of its own slots is computed on the device).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/mla_attention/params.hpp"

namespace specdec::ops {
namespace mla_attention_detail {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = kMlaAttentionTile;  // 32 slots: one per lane in the softmax
constexpr int kCombineColumns = kMlaAttentionMaxLatent / 4;  // one float4 column per thread
constexpr int kCombineParts = 4;  // the chunks split 4 ways, parts merged in order
constexpr int kCombineThreads = kCombineColumns * kCombineParts;
static_assert(kTile == 32, "the softmax maps one lane to one slot of a tile");
static_assert(kMlaAttentionMaxLatent / 4 == kThreads / 2, "two head halves of c / 4 column threads");

// Shared memory of one block: floats [G W | 2 kTile W | 2 G kTile | kTile G | G | 2 G], then
// int [2 kTile] row flags.
inline size_t smem_bytes(int group, int width) {
  size_t const floats = static_cast<size_t>(group) * width + size_t{2} * kTile * width +
                        size_t{3} * group * kTile + size_t{3} * group;
  return floats * sizeof(float) + size_t{2} * kTile * sizeof(int);
}

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
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float dot4(float acc, float4 a, float4 b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}
__device__ __forceinline__ void fma4(float4& acc, float p, float4 k) {
  acc.x = fmaf(p, k.x, acc.x);
  acc.y = fmaf(p, k.y, acc.y);
  acc.z = fmaf(p, k.z, acc.z);
  acc.w = fmaf(p, k.w, acc.w);
}

// Sums v[0, N) over the 8 lanes of an aligned lane group (lane bits 0..2 = ks) by a transposing
// butterfly: after the steps with offsets 4, 2, 1 the lane keeps N / 8 sums, v[k] = the group sum
// of original value (N / 8) * ks + k.
template <int N>
__device__ __forceinline__ void reduce8_transpose(float (&v)[N], int ks) {
  static_assert(N % 8 == 0, "N values over 8 lanes");
  bool const hi4 = (ks & 4) != 0;
#pragma unroll
  for (int k = 0; k < N / 2; ++k) {
    float const send = hi4 ? v[k] : v[k + N / 2];
    float const keep = hi4 ? v[k + N / 2] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
  bool const hi2 = (ks & 2) != 0;
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    float const send = hi2 ? v[k] : v[k + N / 4];
    float const keep = hi2 ? v[k + N / 4] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
  }
  bool const hi1 = (ks & 1) != 0;
#pragma unroll
  for (int k = 0; k < N / 8; ++k) {
    float const send = hi1 ? v[k] : v[k + N / 8];
    float const keep = hi1 ? v[k + N / 8] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
  }
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
// invisible or invalid are zero-filled and flagged 0 in valid [kTile].
__device__ __forceinline__ void stage_tile(MlaAttentionParams const& p, TokenView const& v,
                                           int64_t s0, int64_t end, int W, float* dst,
                                           int* valid) {
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31, W4 = W >> 2;
  for (int r = warp; r < kTile; r += kWarps) {
    int64_t const u = s0 + r;
    int64_t const row = u < end ? slot_row(p, v, u) : -1;
    float const* src = row >= 0 ? p.cache + row * W : p.cache;  // a valid address either way
    int const bytes = row >= 0 ? 16 : 0;                           // 0: zero fill, nothing read
    float* d = dst + r * W;
    for (int col = lane; col < W4; col += 32) {
      cp_async16(d + 4 * col, src + (row >= 0 ? 4 * col : 0), bytes);
    }
    if (lane == 0) valid[r] = row >= 0 ? 1 : 0;
  }
}

// One block: token t, head group g (G heads), chunk `chunk` of the token's candidate slots.
template <int G>
static __global__ void __launch_bounds__(kThreads, 1)
    mla_attention_chunk_kernel(__grid_constant__ MlaAttentionParams const p,
                               MlaAttentionPlan const plan) {
  await_prior_kernels();
  static_assert(G == 8 || G == 16, "head groups of 8 or 16");
  constexpr int HQ = G / 4;       // head quads in the group
  constexpr int LS = 2 * HQ;      // slots per lane in the score tile
  constexpr int NV = 4 * LS;      // score values per lane: 4 heads x LS slots
  constexpr int HPT = G / 2;      // heads per thread in the context
  constexpr int kOwned = G / kWarps;  // heads whose softmax state a warp holds

  extern __shared__ float4 smem4[];
  int const W = p.kv_lora_rank + p.rope_dim, W4 = W >> 2, c4 = p.kv_lora_rank >> 2;
  float* const q_s = reinterpret_cast<float*>(smem4);  // [G, W]
  float* const k_s = q_s + G * W;                       // [2, kTile, W]
  float* const score_s = k_s + 2 * kTile * W;           // [2 W-halves, G, kTile]
  float* const prob_s = score_s + 2 * G * kTile;        // [kTile, G]
  float* const alpha_s = prob_s + kTile * G;            // [G]
  float* const ml_s = alpha_s + G;                      // [2, G]: max, sum
  int* const valid_s = reinterpret_cast<int*>(ml_s + 2 * G);  // [2, kTile]

  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int const g = static_cast<int>(blockIdx.x % plan.groups);
  int64_t const rest = blockIdx.x / plan.groups;
  int const chunk = static_cast<int>(rest % plan.chunks);
  int const t = static_cast<int>(rest / plan.chunks);
  TokenView const v = token_view(p, t);
  int64_t const L = chunk_slots(v.n, plan.chunks);
  int64_t const start = chunk * L;
  int const hh = tid >> 7, col4 = tid & 127;  // context: head half, float4 column
  if (start >= v.n) {
    // No slot here. Chunk partials of such chunks are never read; a lone chunk (n == 0: an invalid
    // token) writes zeros.
    if (plan.chunks == 1 && col4 < c4) {
      for (int a = 0; a < HPT; ++a) {
        int const h = g * G + hh * HPT + a;
        if (h < p.heads) {
          reinterpret_cast<float4*>(p.out)[(static_cast<int64_t>(t) * p.heads + h) * c4 + col4] =
              make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
    }
    return;
  }
  int64_t const end = start + L < v.n ? start + L : v.n;
  int const ntiles = static_cast<int>((end - start + kTile - 1) / kTile);

  stage_tile(p, v, start, end, W, k_s, valid_s);
  cp_async_commit();
  {  // q of the group, times scale (zeros for heads past the last)
    float4* const q4 = reinterpret_cast<float4*>(q_s);
    for (int e = tid; e < G * W4; e += kThreads) {
      int const hl = e / W4, col = e - hl * W4, h = g * G + hl;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (h < p.heads) {
        x = reinterpret_cast<float4 const*>(p.q)[(static_cast<int64_t>(t) * p.heads + h) * W4 + col];
        x.x *= p.scale;
        x.y *= p.scale;
        x.z *= p.scale;
        x.w *= p.scale;
      }
      q4[e] = x;
    }
  }

  float m_run[kOwned], l_run[kOwned];
#pragma unroll
  for (int j = 0; j < kOwned; ++j) {
    m_run[j] = -INFINITY;
    l_run[j] = 0.0f;
  }
  float4 acc[HPT];
#pragma unroll
  for (int a = 0; a < HPT; ++a) acc[a] = make_float4(0.f, 0.f, 0.f, 0.f);

  // Score lane layout (step 2).
  int const ks = lane & 7, lg = lane >> 3;
  int const hq = lg % HQ, sub = lg / HQ;
  int const slot0 = (warp & 3) * 8 + sub * LS;
  int const half = (W4 + 1) >> 1, wh = warp >> 2;
  int const col_lo = wh * half, col_hi = col_lo + half < W4 ? col_lo + half : W4;

  for (int k = 0; k < ntiles; ++k) {
    int const buf = k & 1;
    int64_t const s0 = start + static_cast<int64_t>(k) * kTile;
    cp_async_wait_all();
    __syncthreads();  // tile k (and q) visible; every thread is done with tile k - 1
    if (k + 1 < ntiles) {
      stage_tile(p, v, s0 + kTile, end, W, k_s + (buf ^ 1) * kTile * W, valid_s + (buf ^ 1) * kTile);
    }
    cp_async_commit();

    // 2. Partial scores over this warp's half of W.
    {
      float4 const* const qa = reinterpret_cast<float4 const*>(q_s) + hq * 4 * W4;
      float4 const* const kb = reinterpret_cast<float4 const*>(k_s + buf * kTile * W) + slot0 * W4;
      float sv[NV];
#pragma unroll
      for (int x = 0; x < NV; ++x) sv[x] = 0.0f;
      for (int col = col_lo + ks; col < col_hi; col += 8) {
        float4 qv[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) qv[a] = qa[a * W4 + col];
#pragma unroll
        for (int ss = 0; ss < LS; ++ss) {
          float4 const kv = kb[ss * W4 + col];
#pragma unroll
          for (int a = 0; a < 4; ++a) sv[a * LS + ss] = dot4(sv[a * LS + ss], qv[a], kv);
        }
      }
      reduce8_transpose<NV>(sv, ks);
      // Lane ks holds values (LS / 2) ks + kk: head (ks >> 1) of the quad, slot (ks & 1) LS / 2 + kk.
      int const hl = hq * 4 + (ks >> 1);
      int const slot = slot0 + (ks & 1) * (LS / 2);
      float* const dst = score_s + (wh * G + hl) * kTile + slot;
#pragma unroll
      for (int kk = 0; kk < LS / 2; ++kk) dst[kk] = sv[kk];
    }
    __syncthreads();

    // 3. Online softmax: warp w owns heads w + kWarps j; lane = slot.
    {
      bool const vis = valid_s[buf * kTile + lane] != 0;
#pragma unroll
      for (int j = 0; j < kOwned; ++j) {
        int const hl = warp + kWarps * j;
        float const s =
            vis ? score_s[hl * kTile + lane] + score_s[(G + hl) * kTile + lane] : -INFINITY;
        float const m_new = fmaxf(m_run[j], warp_max_f(s));
        float alpha = 1.0f, prob = 0.0f;
        if (m_new != -INFINITY) {  // warp-uniform
          alpha = expf(m_run[j] - m_new);  // 0 while m_run is -inf
          prob = vis ? expf(s - m_new) : 0.0f;
        }
        l_run[j] = l_run[j] * alpha + warp_sum_f(prob);
        m_run[j] = m_new;
        prob_s[lane * G + hl] = prob;
        if (lane == 0) alpha_s[hl] = alpha;
      }
    }
    __syncthreads();

    // 4. Context: acc = alpha acc + sum_s p_s row_s[0:c].
    if (col4 < c4) {
#pragma unroll
      for (int a = 0; a < HPT; ++a) {
        float const al = alpha_s[hh * HPT + a];
        acc[a].x *= al;
        acc[a].y *= al;
        acc[a].z *= al;
        acc[a].w *= al;
      }
      float4 const* const kb = reinterpret_cast<float4 const*>(k_s + buf * kTile * W) + col4;
#pragma unroll 4
      for (int s = 0; s < kTile; ++s) {
        float4 const kv = kb[s * W4];
        float4 const* const pp = reinterpret_cast<float4 const*>(prob_s + s * G + hh * HPT);
#pragma unroll
        for (int a4 = 0; a4 < HPT / 4; ++a4) {
          float4 const pr = pp[a4];
          fma4(acc[a4 * 4 + 0], pr.x, kv);
          fma4(acc[a4 * 4 + 1], pr.y, kv);
          fma4(acc[a4 * 4 + 2], pr.z, kv);
          fma4(acc[a4 * 4 + 3], pr.w, kv);
        }
      }
    }
  }

  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kOwned; ++j) {
      ml_s[warp + kWarps * j] = m_run[j];
      ml_s[G + warp + kWarps * j] = l_run[j];
    }
  }
  __syncthreads();
  if (plan.chunks == 1) {
    if (col4 < c4) {
#pragma unroll
      for (int a = 0; a < HPT; ++a) {
        int const hl = hh * HPT + a, h = g * G + hl;
        if (h >= p.heads) continue;
        float const l = ml_s[G + hl];
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        if (l > 0.0f) o = make_float4(acc[a].x / l, acc[a].y / l, acc[a].z / l, acc[a].w / l);
        reinterpret_cast<float4*>(p.out)[(static_cast<int64_t>(t) * p.heads + h) * c4 + col4] = o;
      }
    }
    return;
  }
  // Partial of (t, g, chunk): acc [G, c] in the first region, (max, sum) [G, 2] in the second.
  int64_t const partials = static_cast<int64_t>(p.tokens) * plan.groups * plan.chunks;
  int64_t const pidx = (static_cast<int64_t>(t) * plan.groups + g) * plan.chunks + chunk;
  float4* const wacc = reinterpret_cast<float4*>(p.workspace) + pidx * G * c4;
  if (col4 < c4) {
#pragma unroll
    for (int a = 0; a < HPT; ++a) wacc[(hh * HPT + a) * c4 + col4] = acc[a];
  }
  float* const wml =
      reinterpret_cast<float*>(p.workspace) + partials * G * p.kv_lora_rank + pidx * G * 2;
  if (tid < G) {
    wml[2 * tid] = ml_s[tid];
    wml[2 * tid + 1] = ml_s[G + tid];
  }
}

// One block per (token, head): merges the token's used chunks. Thread (part, column) takes the
// chunks k = part, part + kCombineParts, ... of one float4 column (so a decode's ~33 chunks are
// ~9 dependent rounds of loads per thread, not 33); the parts' maxima, weight sums and columns
// meet in shared memory and are merged in part order. The order depends on (T, heads,
// max_slots) only.
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
  // The part's maximum (every column thread of the part computes the same), then the block's.
  float mx = -INFINITY;
#pragma unroll 4
  for (int64_t k = part; k < used; k += kCombineParts) {
    mx = fmaxf(mx, wml[((first + k) * G + hl) * 2]);
  }
  if (col4 == 0) s_max[part] = mx;
  __syncthreads();
  mx = s_max[0];
#pragma unroll
  for (int q = 1; q < kCombineParts; ++q) mx = fmaxf(mx, s_max[q]);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum = 0.0f;
  if (mx != -INFINITY && col4 < c4) {
#pragma unroll 4
    for (int64_t k = part; k < used; k += kCombineParts) {
      float const m = wml[((first + k) * G + hl) * 2];
      float const l = wml[((first + k) * G + hl) * 2 + 1];
      float const w = expf(m - mx);  // 0 for a chunk without a visible slot (m = -inf)
      sum = fmaf(l, w, sum);
      float4 const a = wacc[((first + k) * G + hl) * c4 + col4];
      fma4(o, w, a);
    }
  }
  if (col4 == 0) s_sum[part] = sum;
  s_o[part][col4] = o;
  __syncthreads();
  if (part != 0 || col4 >= c4) return;
  float total = s_sum[0];
  o = s_o[0][col4];
#pragma unroll
  for (int q = 1; q < kCombineParts; ++q) {
    total += s_sum[q];
    float4 const b = s_o[q][col4];
    o = make_float4(o.x + b.x, o.y + b.y, o.z + b.z, o.w + b.w);
  }
  if (mx != -INFINITY) o = make_float4(o.x / total, o.y / total, o.z / total, o.w / total);
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
  int const width = p.kv_lora_rank + p.rope_dim;
  size_t const smem = d::smem_bytes(plan.group, width);
  auto const kernel = plan.group == 8 ? d::mla_attention_chunk_kernel<8>
                                      : d::mla_attention_chunk_kernel<16>;
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
