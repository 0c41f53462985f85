// moe_experts CUDA kernels: routed-expert SwiGLU for T tokens x top_k experts (params.hpp has the
// contract). The weight stream is the cost (Kimi-K2.5 INT4: 24.8 MB per expert), so each routed
// expert's weights are read ONCE per launch however many tokens chose it. Four launches, grids
// fixed by (T, K, E, H, I), never by the routing: no host sync, no allocation, graph-capturable.
//   1. group   (1 block, 8 warps): a counting sort of the N = T*K assignments a = t*K + k by
//      expert, stable in a. Warp w counts its contiguous segment of assignments per expert in
//      shared memory (__match_any_sync, no atomics), warp 0 scans the counts into offsets [E + 1],
//      per-warp start positions and the list of active experts (increasing id, -1 padded), then
//      every warp scatters its segment in order into sorted [N]. Ids outside [0, E) are left out.
//   2. rows<gate/up> grid (ceil(I / (8 R)), S = min(E, N) slots): block (x, s) takes the s-th
//      active expert (exits at once past the active count) and 8 R rows n of I; each of its 8
//      warps owns R rows of gate AND the same R rows of up (R = 2 INT4, 1 bf16). The block walks the expert's tokens in tiles of
//      up to kTileTokens (8) and H in chunks of kChunk (1024) columns: the tile's x rows are staged
//      in shared memory (fp32, 4 floats of padding after every 32 so 128-bit reads do not conflict),
//      each lane dequantises its stretch of every owned weight row ONCE per chunk (one 128-bit
//      load of 4 packed words = 32 columns, or 4 loads of 8 bf16) and FMAs it against every token
//      of the tile; the next chunk's weights are loaded before the current one is used (register
//      double buffering). After the last chunk a warp-shuffle sum gives g and u, and lane 0
//      writes h[pos, n] = silu(g) * u for each sorted position pos of the tile.
//   3. rows<down> grid (ceil(H / (8 R')), S): the same agent over down_e [H, I] reading h,
//      R' rows of down per warp (R' = 4 INT4, 2 bf16), writing out[a, j] for each assignment a.
//   4. combine grid (ceil(T*H/4 / 256)): y[t, j..j+3] = sum_k weights[t, k] * out[t*K + k, j..]
//      in k order (float; deterministic, no atomics); slots with an id outside [0, E) add 0.
// Rows of a block past the matrix's end are clamped for the loads and not written. INT4 dequant:
// a nibble n becomes float(0x4B000000 | n) - (2^23 + 8) = n - 8 exactly (a byte permute and a
// subtraction); the partial dot of every 4 columns is multiplied by its group's scale once per
// token. Everything accumulates in float; the reference (reference.hpp) accumulates in double,
// hence the tests' tolerance.
// Registers (nvcc 13, sm_90, -O3): __launch_bounds__(256, 2) holds all four rows kernels at 128
// registers without spills, so two blocks (16 warps, 2 x 36 KB of shared memory) share an SM and
// each INT4 warp keeps up to 2 x 4 rows x 512 B of weights in flight.
// Shapes: x [T, H], ids / weights [T, K], y [T, H], expert tables as params.hpp says, workspace
// moe_experts_workspace_bytes(T, K, E, H, I) (device memory).
// Prefill runs on CUDA cores (no tensor cores); a tile re-reads its block's weight rows from L2 per
// tile of 8 tokens.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/math.hpp"
#include "specdec/core/warp.cuh"
#include "specdec/ops/moe_experts/params.hpp"

namespace specdec::ops {
namespace moe_experts_detail {

constexpr int kWarps = 8;  // per rows block
constexpr int kThreads = kWarps * 32;
constexpr int kTileTokens = 8;                      // tokens staged per pass over the weights
constexpr int kChunk = 1024;                        // reduction columns staged per pass
constexpr int kChunkPadded = kChunk + kChunk / 8;   // + 4 floats after every 32: 1152
constexpr int kGroupWarps = 8;
constexpr int kCombineThreads = 256;

// Typed views of the workspace and launch constants.
struct Plan {
  int32_t* offsets;  // [E + 1]
  int32_t* active;   // [slots]
  int32_t* sorted;   // [N]
  float* h;          // [N, I] by sorted position
  float* out;        // [N, H] by assignment
  int slots;         // min(E, N)
  int group_shift;   // log2(group_size) when it is a power of two, else -1 (INT4)
};

// Shared-memory index of chunk column c: 4 floats of padding after every 32 columns, so lanes
// 32 (INT4) or 8 (bf16) columns apart read distinct banks with 128-bit loads.
__device__ __forceinline__ int padded(int c) { return c + ((c >> 5) << 2); }

__device__ __forceinline__ uint32_t word_of(uint4 const& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// Byte j (a nibble value 0..15) of x, minus 8, as a float: 0x4B0000nn is 2^23 + n exactly.
__device__ __forceinline__ float int4_value(uint32_t x, uint32_t j) {
  return __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7650u | j)) - 8388616.0f;
}

// ---- Weight formats: one row of one matrix, its per-chunk registers, and dequantisation ----
// A lane's columns in a chunk are kVecs vectors of kColsPerVec; vector v starts at chunk column
// vec_col(v, lane) and splits into kUnits units of 4 columns (one 128-bit read of x per token).

struct Int4Format {
  static constexpr int kColsPerVec = 32;  // one uint4 = 4 packed words
  static constexpr int kVecs = kChunk / (32 * kColsPerVec);
  static constexpr int kUnits = 8;        // 4 columns each: half a word
  static constexpr bool kScaled = true;
  static constexpr int kGateUpRows = 2;  // rows of gate (and of up) per warp
  static constexpr int kDownRows = 4;    // rows of down per warp
  static_assert(kVecs == 1, "the INT4 row loads assume one 128-bit vector per lane per chunk");
  struct Matrix {             // one expert's [rows, cols]
    int32_t const* packed;    // [rows, cols / 8]
    uint16_t const* scale;    // [rows, cols / G]
  };
  struct Regs {
    uint4 v;       // 4 words = 32 nibbles
    uint32_t s01;  // bf16 scales of words 0 (low half) and 1 (high half)
    uint32_t s23;  // of words 2 and 3
  };
  // which: 0 gate, 1 up, 2 down.
  __device__ static Matrix matrix(MoeExpertWeights const& w, int which, int e) {
    int32_t const* const* packed = which == 0 ? w.gate_packed : which == 1 ? w.up_packed : w.down_packed;
    uint16_t const* const* scale = which == 0 ? w.gate_scale : which == 1 ? w.up_scale : w.down_scale;
    return {packed[e], scale[e]};
  }
  __device__ static int vec_col(int, int lane) { return lane * kColsPerVec; }
  // The lane's vector of row n in the chunk starting at column `base` (zeros past `cols`).
  __device__ static void load(Matrix const& m, int n, int base, int cols, int lane, int group,
                              int shift, Regs& out) {
    int const c = base + vec_col(0, lane);
    if (c < cols) {
      int32_t const* packed = m.packed + static_cast<int64_t>(n) * (cols / 8);
      uint16_t const* scale = m.scale + static_cast<int64_t>(n) * (cols / group);
      out.v = __ldg(reinterpret_cast<uint4 const*>(packed + c / 8));
      uint32_t s[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        int const col = c + 8 * u;
        s[u] = __ldg(scale + (shift >= 0 ? col >> shift : col / group));
      }
      out.s01 = s[0] | (s[1] << 16);
      out.s23 = s[2] | (s[3] << 16);
    } else {
      out.v = make_uint4(0u, 0u, 0u, 0u);
      out.s01 = out.s23 = 0u;
    }
  }
  // The 4 values of unit u (nibbles 4(u%2) .. +3 of word u/2) without their scale, and the scale.
  __device__ static float unit(Regs const& r, int, int u, float (&q)[4]) {
    int const w = u >> 1;
    uint32_t const word = word_of(r.v, w);
    uint32_t const lo = word & 0x0F0F0F0Fu;         // byte j = nibble 2j
    uint32_t const hi = (word >> 4) & 0x0F0F0F0Fu;  // byte j = nibble 2j + 1
    uint32_t const j = 2u * static_cast<uint32_t>(u & 1);
    q[0] = int4_value(lo, j);
    q[1] = int4_value(hi, j);
    q[2] = int4_value(lo, j + 1);
    q[3] = int4_value(hi, j + 1);
    uint32_t const s = w < 2 ? r.s01 : r.s23;
    return __uint_as_float((w & 1) ? (s & 0xFFFF0000u) : (s << 16));
  }
};

struct Bf16Format {
  static constexpr int kColsPerVec = 8;  // one uint4 = 8 bf16
  static constexpr int kVecs = kChunk / (32 * kColsPerVec);
  static constexpr int kUnits = 2;       // 4 columns each
  static constexpr bool kScaled = false;
  static constexpr int kGateUpRows = 1;
  static constexpr int kDownRows = 2;
  struct Matrix {
    uint16_t const* data;  // [rows, cols]
  };
  struct Regs {
    uint4 v[kVecs];
  };
  __device__ static Matrix matrix(MoeExpertWeights const& w, int which, int e) {
    uint16_t const* const* table = which == 0 ? w.gate : which == 1 ? w.up : w.down;
    return {table[e]};
  }
  // Lanes interleave: vector v of lane l covers chunk columns (32 v + l) * 8 .. + 8.
  __device__ static int vec_col(int v, int lane) { return (v * 32 + lane) * kColsPerVec; }
  __device__ static void load(Matrix const& m, int n, int base, int cols, int lane, int, int,
                              Regs& out) {
    uint16_t const* row = m.data + static_cast<int64_t>(n) * cols;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      int const c = base + vec_col(v, lane);
      out.v[v] = c < cols ? __ldg(reinterpret_cast<uint4 const*>(row + c))
                          : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __device__ static float unit(Regs const& r, int v, int u, float (&q)[4]) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      uint32_t const word = word_of(r.v[v], 2 * u + m);  // elements 4u + 2m (low half), + 1
      q[2 * m] = __uint_as_float(word << 16);
      q[2 * m + 1] = __uint_as_float(word & 0xFFFF0000u);
    }
    return 1.0f;
  }
};

// acc[r][t] += row r's chunk . x_t's chunk, for the lane's columns (chunk_cols valid columns).
template <class Fmt, int kW>
__device__ __forceinline__ void accumulate_chunk(typename Fmt::Regs const (&wr)[kW],
                                                 float const (*xs)[kChunkPadded], int chunk_cols,
                                                 int lane, int ntok,
                                                 float (&acc)[kW][kTileTokens]) {
#pragma unroll
  for (int v = 0; v < Fmt::kVecs; ++v) {
    int const cl = Fmt::vec_col(v, lane);
    if (cl >= chunk_cols) continue;
#pragma unroll
    for (int u = 0; u < Fmt::kUnits; ++u) {
      float q[kW][4];
      float s[kW];
#pragma unroll
      for (int r = 0; r < kW; ++r) s[r] = Fmt::unit(wr[r], v, u, q[r]);
      float const* xu = &xs[0][padded(cl + 4 * u)];
#pragma unroll
      for (int t = 0; t < kTileTokens; ++t) {
        if (t < ntok) {
          float4 const a = *reinterpret_cast<float4 const*>(xu + t * kChunkPadded);
#pragma unroll
          for (int r = 0; r < kW; ++r) {
            float d = q[r][0] * a.x;
            d = fmaf(q[r][1], a.y, d);
            d = fmaf(q[r][2], a.z, d);
            d = fmaf(q[r][3], a.w, d);
            acc[r][t] = Fmt::kScaled ? fmaf(s[r], d, acc[r][t]) : acc[r][t] + d;
          }
        }
      }
    }
  }
}

// ---- 1. Group the assignments by expert ----
static __global__ void __launch_bounds__(kGroupWarps * 32)
    moe_experts_group_kernel(__grid_constant__ MoeExpertsParams const p,
                             __grid_constant__ Plan const plan) {
  __shared__ int32_t s_count[kGroupWarps][kMoeExpertsMaxExperts];  // per warp: count, then cursor
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int const E = p.experts;
  int64_t const n = static_cast<int64_t>(p.tokens) * p.top_k;
  int64_t const seg = (n + kGroupWarps - 1) / kGroupWarps;
  int64_t const seg_begin = warp * seg < n ? warp * seg : n;
  int64_t const seg_end = (warp + 1) * seg < n ? (warp + 1) * seg : n;
  for (int i = threadIdx.x; i < kGroupWarps * E; i += kGroupWarps * 32) s_count[i / E][i % E] = 0;
  __syncthreads();
  // The expert of assignment a, or -1 (past the segment, or an id outside [0, E)).
  auto expert_of = [&](int64_t a) {
    if (a >= seg_end) return -1;
    int32_t const id = p.ids[a];
    return (id >= 0 && id < E) ? static_cast<int>(id) : -1;
  };
  unsigned const below = (1u << lane) - 1u;
  for (int64_t j = seg_begin; j < seg_end; j += 32) {
    int const e = expert_of(j + lane);
    unsigned const same = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (same & below) == 0) s_count[warp][e] += __popc(same);
    __syncwarp();
  }
  __syncthreads();
  if (warp == 0) {
    int carry = 0, carry_active = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      int const e = e0 + lane;
      int total = 0;
      if (e < E) {
#pragma unroll
        for (int w = 0; w < kGroupWarps; ++w) total += s_count[w][e];
      }
      int const flag = total > 0 ? 1 : 0;
      int incl = total, incl_active = flag;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        int const a = __shfl_up_sync(0xffffffffu, incl, o);
        int const b = __shfl_up_sync(0xffffffffu, incl_active, o);
        if (lane >= o) {
          incl += a;
          incl_active += b;
        }
      }
      if (e < E) {
        int run = carry + incl - total;
        plan.offsets[e] = run;
#pragma unroll
        for (int w = 0; w < kGroupWarps; ++w) {
          int const c = s_count[w][e];
          s_count[w][e] = run;
          run += c;
        }
        if (flag) plan.active[carry_active + incl_active - 1] = e;
      }
      carry += __shfl_sync(0xffffffffu, incl, 31);
      carry_active += __shfl_sync(0xffffffffu, incl_active, 31);
    }
    if (lane == 0) plan.offsets[E] = carry;
    for (int s = carry_active + lane; s < plan.slots; s += 32) plan.active[s] = -1;
  }
  __syncthreads();
  for (int64_t j = seg_begin; j < seg_end; j += 32) {
    int const e = expert_of(j + lane);
    unsigned const same = __match_any_sync(0xffffffffu, e);
    int const rank = __popc(same & below);
    int const pos = e >= 0 ? s_count[warp][e] + rank : 0;
    __syncwarp();
    if (e >= 0) {
      plan.sorted[pos] = static_cast<int32_t>(j + lane);
      if (rank == 0) s_count[warp][e] += __popc(same);
    }
    __syncwarp();
  }
}

// ---- 2. / 3. Rows of gate and up (h), or of down (out), for one active expert ----
template <class Fmt, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2)
    moe_experts_rows_kernel(__grid_constant__ MoeExpertsParams const p,
                            __grid_constant__ Plan const plan) {
  constexpr int kRowsPerMat = kGateUp ? Fmt::kGateUpRows : Fmt::kDownRows;
  constexpr int kMats = kGateUp ? 2 : 1;
  constexpr int kW = kMats * kRowsPerMat;  // weight rows per warp: [gate rows][up rows] or [down]
  constexpr int kBlockRows = kWarps * kRowsPerMat;
  __shared__ __align__(16) float xs[kTileTokens][kChunkPadded];

  int const e = plan.active[blockIdx.y];
  if (e < 0) return;  // fewer active experts than slots: the whole block leaves
  int const begin = plan.offsets[e], end = plan.offsets[e + 1];
  int const rows = kGateUp ? p.inter : p.hidden;  // output rows of each matrix
  int const cols = kGateUp ? p.hidden : p.inter;  // reduction length
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int const row0 = blockIdx.x * kBlockRows + warp * kRowsPerMat;

  typename Fmt::Matrix mat[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) mat[m] = Fmt::matrix(p.w, kGateUp ? m : 2, e);
  int const group = p.w.group_size, shift = plan.group_shift;
  int const nchunks = (cols + kChunk - 1) / kChunk;
  int const iters = (end - begin + kTileTokens - 1) / kTileTokens * nchunks;
  // Weight row r of the warp (r = m * kRowsPerMat + i: row row0 + i of matrix m) in the chunk at
  // column `at`; rows past the end load the last row and are never written.
  auto load_rows = [&](int at, typename Fmt::Regs (&regs)[kW]) {
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int i = 0; i < kRowsPerMat; ++i) {
        Fmt::load(mat[m], min(row0 + i, rows - 1), at, cols, lane, group, shift,
                  regs[m * kRowsPerMat + i]);
      }
    }
  };

  typename Fmt::Regs cur[kW], next[kW];
  load_rows(0, cur);
  float acc[kW][kTileTokens];
#pragma unroll
  for (int r = 0; r < kW; ++r) {
#pragma unroll
    for (int t = 0; t < kTileTokens; ++t) acc[r][t] = 0.0f;
  }

  int chunk = 0, t0 = begin;  // current chunk of columns, first sorted position of the tile
  for (int it = 0; it < iters; ++it) {
    int const base = chunk * kChunk;
    bool const last_chunk = chunk + 1 == nchunks;
    if (it + 1 < iters) {  // the next pass's weights (next chunk, or chunk 0 of the next tile)
      load_rows(last_chunk ? 0 : base + kChunk, next);
    }
    int const ntok = min(kTileTokens, end - t0);
    int const chunk_cols = min(kChunk, cols - base);
    __syncthreads();  // every warp is done with the previous chunk's xs
    for (int t = 0; t < ntok; ++t) {
      float const* src = kGateUp ? p.x + static_cast<int64_t>(plan.sorted[t0 + t] / p.top_k) * cols
                                 : plan.h + static_cast<int64_t>(t0 + t) * cols;
      for (int c = threadIdx.x * 4; c < chunk_cols; c += kThreads * 4) {
        *reinterpret_cast<float4*>(&xs[t][padded(c)]) =
            *reinterpret_cast<float4 const*>(src + base + c);
      }
    }
    __syncthreads();
    accumulate_chunk<Fmt, kW>(cur, xs, chunk_cols, lane, ntok, acc);
    if (last_chunk) {
#pragma unroll
      for (int r = 0; r < kRowsPerMat; ++r) {
        int const n = row0 + r;
#pragma unroll
        for (int t = 0; t < kTileTokens; ++t) {
          if (t < ntok) {  // uniform over the warp
            if constexpr (kGateUp) {
              float const g = warp_sum(acc[r][t]);
              float const u = warp_sum(acc[kRowsPerMat + r][t]);
              if (lane == 0 && n < rows) {
                plan.h[static_cast<int64_t>(t0 + t) * p.inter + n] = silu(g) * u;
              }
            } else {
              float const d = warp_sum(acc[r][t]);
              if (lane == 0 && n < rows) {
                plan.out[static_cast<int64_t>(plan.sorted[t0 + t]) * p.hidden + n] = d;
              }
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kW; ++r) {
#pragma unroll
        for (int t = 0; t < kTileTokens; ++t) acc[r][t] = 0.0f;
      }
      chunk = 0;
      t0 += kTileTokens;
    } else {
      ++chunk;
    }
    if (it + 1 < iters) {
#pragma unroll
      for (int r = 0; r < kW; ++r) cur[r] = next[r];
    }
  }
}

// ---- 4. y = sum_k weights * out, in k order ----
static __global__ void __launch_bounds__(kCombineThreads)
    moe_experts_combine_kernel(__grid_constant__ MoeExpertsParams const p,
                               __grid_constant__ Plan const plan) {
  int64_t const per_token = p.hidden / 4;
  int64_t const i = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(p.tokens) * per_token) return;
  int64_t const t = i / per_token;
  int64_t const c = (i - t * per_token) * 4;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int k = 0; k < p.top_k; ++k) {
    int64_t const a = t * p.top_k + k;
    int32_t const e = p.ids[a];
    if (e < 0 || e >= p.experts) continue;  // skipped assignment: contributes 0
    float const w = p.weights[a];
    float4 const o = *reinterpret_cast<float4 const*>(plan.out + a * p.hidden + c);
    acc.x = fmaf(w, o.x, acc.x);
    acc.y = fmaf(w, o.y, acc.y);
    acc.z = fmaf(w, o.z, acc.z);
    acc.w = fmaf(w, o.w, acc.w);
  }
  *reinterpret_cast<float4*>(p.y + t * p.hidden + c) = acc;
}

template <class Fmt>
inline Status moe_experts_launch_rows(MoeExpertsParams const& p, Plan const& plan,
                                      cudaStream_t stream) {
  dim3 const gate_up_grid(ceil_div(p.inter, kWarps * Fmt::kGateUpRows), plan.slots);
  moe_experts_rows_kernel<Fmt, true><<<gate_up_grid, kThreads, 0, stream>>>(p, plan);
  SPECDEC_RETURN_IF_ERROR(cuda_launch_status("moe_experts_rows_kernel<gate_up>"));
  dim3 const down_grid(ceil_div(p.hidden, kWarps * Fmt::kDownRows), plan.slots);
  moe_experts_rows_kernel<Fmt, false><<<down_grid, kThreads, 0, stream>>>(p, plan);
  return cuda_launch_status("moe_experts_rows_kernel<down>");
}

}  // namespace moe_experts_detail

inline Status moe_experts_cuda(MoeExpertsParams const& p, cudaStream_t stream) {
  namespace d = moe_experts_detail;
  if (p.tokens == 0) return Status::Ok();
  MoeExpertsWorkspaceLayout const l =
      moe_experts_workspace_layout(p.tokens, p.top_k, p.experts, p.hidden, p.inter);
  char* const ws = static_cast<char*>(p.workspace);
  int const n = p.tokens * p.top_k;
  d::Plan plan;
  plan.offsets = reinterpret_cast<int32_t*>(ws + l.offsets);
  plan.active = reinterpret_cast<int32_t*>(ws + l.active);
  plan.sorted = reinterpret_cast<int32_t*>(ws + l.sorted);
  plan.h = reinterpret_cast<float*>(ws + l.h);
  plan.out = reinterpret_cast<float*>(ws + l.out);
  plan.slots = std::min(p.experts, n);
  plan.group_shift = -1;
  if (p.w.int4) {
    for (int s = 0; s < 31; ++s) {
      if ((1 << s) == p.w.group_size) plan.group_shift = s;
    }
  }
  d::moe_experts_group_kernel<<<1, d::kGroupWarps * 32, 0, stream>>>(p, plan);
  SPECDEC_RETURN_IF_ERROR(cuda_launch_status("moe_experts_group_kernel"));
  if (p.w.int4) {
    SPECDEC_RETURN_IF_ERROR(d::moe_experts_launch_rows<d::Int4Format>(p, plan, stream));
  } else {
    SPECDEC_RETURN_IF_ERROR(d::moe_experts_launch_rows<d::Bf16Format>(p, plan, stream));
  }
  int64_t const quads = static_cast<int64_t>(p.tokens) * (p.hidden / 4);
  auto const blocks = static_cast<unsigned>((quads + d::kCombineThreads - 1) / d::kCombineThreads);
  d::moe_experts_combine_kernel<<<blocks, d::kCombineThreads, 0, stream>>>(p, plan);
  return cuda_launch_status("moe_experts_combine_kernel");
}

}  // namespace specdec::ops
