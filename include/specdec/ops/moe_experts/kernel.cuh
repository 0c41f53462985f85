// moe_experts CUDA kernels: routed-expert SwiGLU for T tokens x top_k experts (params.hpp has the
// contract). The weight stream is the cost (Kimi-K2.5 INT4: 24.8 MB per expert), so each routed
// expert's weights are read ONCE per launch however many tokens chose it (per 8 tokens of it on
// the INT4 path, per kTileTokens on the bf16 path; more tokens re-read them from L2). Launches
// with grids fixed by (T, K, E, H, I), never by the routing: no host sync, no allocation,
// graph-capturable.
//   1. group   (1 block, 8 warps): a counting sort of the N = T*K assignments a = t*K + k by
//      expert, stable in a. Warp w counts its contiguous segment of assignments per expert in
//      shared memory (__match_any_sync, no atomics), warp 0 scans the counts into offsets [E + 1],
//      per-warp start positions and the list of active experts (increasing id, -1 padded), then
//      every warp scatters its segment in order into sorted [N]. Ids outside [0, E) are left out.
//      With N <= kInWarpAssignments (a decode's or a short verify's): not launched; every
//      warp of the expert kernels finds the same order itself from the N ids, one per lane
//      (slot_view: its slot's expert = the slot-th smallest distinct id, the expert's sorted
//      positions = the count of smaller ids onwards, its assignments in increasing a), one
//      kernel fewer on the router's chain.
//   INT4 experts, on tensor cores (mma.sync m16n8k16, bf16 operands, fp32 accumulation):
//   2. to_bf16: x [T, H] -> xb [T, H] bf16 (core/convert.cuh: round to nearest even), skipped
//      where the caller passes x_bf16 (the same values), which gate / up then read instead.
//   3. int4_mma<gate_up> grid (ceil(I / 16), S = min(E, N) slots) x 4 warps: block (x, s) takes
//      the s-th active expert (exits at once past the active count) and rows 16x .. 16x + 15 of
//      gate and of up; its 4 warps split H into 128-column chunks (split K) and the block sums
//      their accumulators in shared memory in warp order; h = silu(g) * u is written as bf16
//      (workspace h, by sorted position).
//   4. int4_mma<down> grid (ceil(H / 128), S) x 4 warps: warp w takes 32 rows of down_e (two
//      16-row tiles) over all of I, reading h, and writes out[a, j] for each assignment a.
//   Per warp and 128-column chunk (lane = 4 g + q): lane q of each quad loads slot q of its rows
//   g and g + 8 of each of its two 16-row tiles (one 128-bit load per row: 4 words; the packed
//   words are in params.hpp's tiled order, so each of these loads reads 512 contiguous bytes per
//   warp), the scales of its 4 words (row-major) and the operand columns of its 4 words (token
//   g's: 4 x 128 bits of x's bf16 for gate / up, h for down, as they lie in memory); the next
//   chunk's loads are issued before this chunk is used (two chunk buffers in registers). In a
//   full chunk word j of slot q holds columns 32 j + 8 q .., in a partial last chunk columns
//   32 q + 8 j .. (params.hpp); a lane past the reduction's end reads the chunk's first slot with
//   scale 0, so it adds exactly 0. Every tile's 16 rows exist (hidden and inter are multiples of
//   32).
//   Dequantisation of a word (8 nibbles n0..n7): (w >> 4i) & 0x000F000F | 0x43004300 (one LOP3,
//   int4_pair_base) is the bf16 pair (128 + n_i, 128 + n_{i+4}), i < 4; minus 136 (one HFMA2) is
//   (n - 8) exactly. The tiled order's nibble order (params.hpp) puts columns 2i, 2i + 1 in
//   nibbles i, i + 4, so pair i is the weights of columns (2i, 2i + 1), and the operand's 32-bit
//   register i of the word is that column pair too. Fragments: any order of the reduction
//   columns works if A and B agree, so the 16 columns of an mma are, for lane quad position q,
//   pairs of its word j: mma 1 of word j takes A = pairs 0, 1 of rows g, g + 8 and B = token g's
//   registers 0, 1 of word j, mma 2 pairs and registers 2, 3. Accumulator lane (g, q) holds rows
//   g, g + 8 x tokens 2q, 2q + 1. Two forms:
//   - scales after the mma (kAfter: params.hpp's moe_int4_scales_after_mma, Kimi's matrices):
//     word j of the quad's 4 lanes is 32 columns of one group, so word j's two mmas sum (n - 8) x
//     from a zero accumulator (bf16 products, exact in the fp32 sum), and the group's scales
//     (rows g, g + 8) multiply that sum into the accumulator: 4 FFMA a tile and word, where the
//     other form spends 16 HMUL2.
//   - weights rounded (any other group or width): (n - 8) times the word's scale is the weight
//     rounded to bf16 once (one HMUL2 a pair), and the mmas accumulate across words.
//   Numerics: the bf16 GEMM of the dense layers (x and h rounded to bf16, fp32 sums) on the exact
//   weights (kAfter) or on the weights rounded to bf16; reference.hpp's bf16_operands mode is its
//   oracle. ptxas's registers: at the kernel.
//   bf16 experts, on CUDA cores (fp32 math on the exact bf16 values):
//   2'. rows<gate/up> grid (ceil(I / 8), S): block (x, s) takes the s-th active expert and 8
//      rows n of I; each of its 8 warps owns one row of gate AND the same row of up. The block
//      walks the expert's tokens in tiles of up to kTileTokens (8) and H in chunks of kChunk
//      (1024) columns: the tile's x rows are staged in shared memory (fp32, 4 floats of padding
//      after every 32 so 128-bit reads do not conflict), each lane converts its stretch of every
//      owned weight row ONCE per chunk (4 loads of 8 bf16) and FMAs it against every token of the
//      tile; the next chunk's weights are loaded before the current one is used (register double
//      buffering). After the last chunk a warp-shuffle sum gives g and u, and lane 0 writes
//      h[pos, n] = silu(g) * u (float) for each sorted position pos of the tile.
//   3'. rows<down> grid (ceil(H / 16), S): the same over down_e [H, I] reading h, 2 rows of down
//      per warp, writing out[a, j] for each assignment a.
//   last: combine grid (ceil(T*H/4 / 256)): y[t, j..j+3] (+)= sum_k weights[t, k] * out[t*K + k,
//      j..] in k order (float; deterministic, no atomics), then + addend[t, j..] where given;
//      slots with an id outside [0, E) add 0. With addend_ready the stream waits for that event
//      right before this kernel, so work on another stream that writes addend overlaps the rest.
//   tile_int4 (at load, not per step): a packed matrix into the tiled order (words moved, each
//      word's nibbles reordered), one thread per 128-bit piece (reads coalesced, its 4 words'
//      writes scattered), out of place.
// Every kernel is launched with programmatic dependent launch (core/cuda.cuh's launch_kernel).
// bf16 path: rows of a block past the matrix's end are clamped for the loads and not written;
// columns past the end (H or I not a multiple of the chunk) load zeros.
// Shapes: x [T, H], ids / weights [T, K], y [T, H], expert tables as params.hpp says, workspace
// moe_experts_workspace_bytes(T, K, E, H, I) (device memory).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "specdec/core/convert.cuh"
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
  float* h;          // [N, I] by sorted position (INT4: bf16)
  void* xb;          // [T, H] bf16 (INT4): the workspace's, or the caller's x_bf16
  float* out;        // [N, H] by assignment
  int slots;         // min(E, N)
  bool in_warp;      // N <= kInWarpAssignments: offsets / active / sorted are not written; the
                     // expert kernels group the ids themselves (slot_view)
};

// Up to this many assignments (one per lane) the expert kernels group them in a warp.
constexpr int kInWarpAssignments = 32;

// Slot `slot`'s expert e (-1: fewer active experts than slots), its sorted positions [begin, end)
// and, in_warp, its assignments as a lane mask (bit a: ids[a] == e). Called by whole warps.
struct SlotView {
  int e = -1, begin = 0, end = 0;
  unsigned members = 0;
};

__device__ __forceinline__ SlotView slot_view(MoeExpertsParams const& p, Plan const& plan,
                                              int slot, int lane) {
  SlotView v;
  if (!plan.in_warp) {
    v.e = plan.active[slot];
    if (v.e >= 0) {
      v.begin = plan.offsets[v.e];
      v.end = plan.offsets[v.e + 1];
    }
    return v;
  }
  // The group kernel's order, from the ids in the lanes: distinct valid ids ranked by value.
  int const n = p.tokens * p.top_k;
  int32_t id = lane < n ? p.ids[lane] : -1;
  bool const valid = id >= 0 && id < p.experts;
  if (!valid) id = -1;
  unsigned const same = __match_any_sync(0xffffffffu, id);
  unsigned const firsts = __ballot_sync(0xffffffffu, valid && (same & ((1u << lane) - 1u)) == 0);
  int rank = 0;  // distinct valid ids below this lane's
  for (unsigned f = firsts; f != 0; f &= f - 1) {
    rank += __shfl_sync(0xffffffffu, id, __ffs(f) - 1) < id ? 1 : 0;
  }
  unsigned const owner = __ballot_sync(0xffffffffu, ((firsts >> lane) & 1u) && rank == slot);
  if (owner == 0) return v;
  v.e = __shfl_sync(0xffffffffu, id, __ffs(owner) - 1);
  v.members = __ballot_sync(0xffffffffu, id == v.e);
  v.begin = __popc(__ballot_sync(0xffffffffu, valid && id < v.e));
  v.end = v.begin + __popc(v.members);
  return v;
}

// The assignment at sorted position pos of the slot (begin <= pos < end).
__device__ __forceinline__ int assignment_at(Plan const& plan, SlotView const& v, int pos) {
  return plan.in_warp ? static_cast<int>(__fns(v.members, 0, pos - v.begin + 1)) : plan.sorted[pos];
}

// Shared-memory index of chunk column c: 4 floats of padding after every 32 columns, so lanes
// 32 (INT4) or 8 (bf16) columns apart read distinct banks with 128-bit loads.
__device__ __forceinline__ int padded(int c) { return c + ((c >> 5) << 2); }

__device__ __forceinline__ uint32_t word_of(uint4 const& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// ---- bf16 experts on CUDA cores ----
// A lane's columns in a chunk are kVecs vectors of kColsPerVec; vector v starts at chunk column
// vec_col(v, lane) and splits into kUnits units of 4 columns (one 128-bit read of x per token).

struct Bf16Format {
  static constexpr int kColsPerVec = 8;  // one uint4 = 8 bf16
  static constexpr int kVecs = kChunk / (32 * kColsPerVec);
  static constexpr int kUnits = 2;       // 4 columns each
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
  __device__ static void load(Matrix const& m, int n, int base, int cols, int lane, Regs& out) {
    uint16_t const* row = m.data + static_cast<int64_t>(n) * cols;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      int const c = base + vec_col(v, lane);
      out.v[v] = c < cols ? __ldg(reinterpret_cast<uint4 const*>(row + c))
                          : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  // The 4 values of unit u of vector v.
  __device__ static void unit(Regs const& r, int v, int u, float (&q)[4]) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      uint32_t const word = word_of(r.v[v], 2 * u + m);  // elements 4u + 2m (low half), + 1
      q[2 * m] = __uint_as_float(word << 16);
      q[2 * m + 1] = __uint_as_float(word & 0xFFFF0000u);
    }
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
#pragma unroll
      for (int r = 0; r < kW; ++r) Fmt::unit(wr[r], v, u, q[r]);
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
            acc[r][t] += d;
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
  await_prior_kernels();
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

// ---- 2'. / 3'. bf16: rows of gate and up (h), or of down (out), for one active expert ----
template <class Fmt, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2)
    moe_experts_rows_kernel(__grid_constant__ MoeExpertsParams const p,
                            __grid_constant__ Plan const plan) {
  await_prior_kernels();
  constexpr int kRowsPerMat = kGateUp ? Fmt::kGateUpRows : Fmt::kDownRows;
  constexpr int kMats = kGateUp ? 2 : 1;
  constexpr int kW = kMats * kRowsPerMat;  // weight rows per warp: [gate rows][up rows] or [down]
  constexpr int kBlockRows = kWarps * kRowsPerMat;
  __shared__ __align__(16) float xs[kTileTokens][kChunkPadded];

  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  SlotView const slot = slot_view(p, plan, static_cast<int>(blockIdx.y), lane);
  int const e = slot.e;
  if (e < 0) return;  // fewer active experts than slots: the whole block leaves
  int const begin = slot.begin, end = slot.end;
  int const rows = kGateUp ? p.inter : p.hidden;  // output rows of each matrix
  int const cols = kGateUp ? p.hidden : p.inter;  // reduction length
  int const row0 = blockIdx.x * kBlockRows + warp * kRowsPerMat;

  typename Fmt::Matrix mat[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) mat[m] = Fmt::matrix(p.w, kGateUp ? m : 2, e);
  int const nchunks = (cols + kChunk - 1) / kChunk;
  int const iters = (end - begin + kTileTokens - 1) / kTileTokens * nchunks;
  // Weight row r of the warp (r = m * kRowsPerMat + i: row row0 + i of matrix m) in the chunk at
  // column `at`; rows past the end load the last row and are never written.
  auto load_rows = [&](int at, typename Fmt::Regs (&regs)[kW]) {
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int i = 0; i < kRowsPerMat; ++i) {
        Fmt::load(mat[m], min(row0 + i, rows - 1), at, cols, lane, regs[m * kRowsPerMat + i]);
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
      float const* src =
          kGateUp ? p.x + static_cast<int64_t>(assignment_at(plan, slot, t0 + t) / p.top_k) * cols
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
                plan.out[static_cast<int64_t>(assignment_at(plan, slot, t0 + t)) * p.hidden + n] =
                    d;
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

// ---- INT4 experts on tensor cores (2. to_bf16, 3. / 4. int4_mma) ----
constexpr int kMmaWarps = 4;                   // per block
constexpr int kMmaChunk = 128;                 // columns per warp pass: 4 quad lanes x 32
constexpr int kMmaTileRows = 16;               // rows of an A tile (mma M)
constexpr int kMmaTokens = 8;                  // tokens per pass (mma N)
constexpr int kDownRowsPerWarp = 2 * kMmaTileRows;
static_assert(kMmaTileRows == kMoeInt4BandRows && kMmaChunk == 32 * kMoeInt4ChunkPieces,
              "an mma tile's rows are a band of the tiled order, a warp pass is one of its chunks");

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// The bits of the bf16 pair (128, 128), in a register the compiler cannot see the value of: each
// kernel makes it once (int4_pair_base()) and dequant_word ORs it in. With both constants
// visible, the compiler split (w & mask) | base into two LOP3s, one per constant: 64 more
// instructions per 128-column chunk and lane (~400 in all), where instruction issue is one of
// the kernels' limits (benchmarks/RESULTS.md: 0.95x at one token without them).
__device__ __forceinline__ uint32_t int4_pair_base() {
  uint32_t base = 0x43004300u;
  asm("" : "+r"(base));
  return base;
}

// The 4 bf16 pairs (nibble i, nibble i + 4) of packed word `word`, i < 4, as nibble - 8 (exact):
// in the tiled order's nibble order, columns (2i, 2i + 1). base: int4_pair_base().
__device__ __forceinline__ void int4_word_pairs(uint32_t word, uint32_t base,
                                                __nv_bfloat162 (&pairs)[4]) {
  uint32_t const one_bits = 0x3F803F80u, minus136_bits = 0xC308C308u;  // (1, 1), (-136, -136)
  __nv_bfloat162 const one = *reinterpret_cast<__nv_bfloat162 const*>(&one_bits);
  __nv_bfloat162 const minus136 = *reinterpret_cast<__nv_bfloat162 const*>(&minus136_bits);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t bits;  // ((word >> 4 i) & 0x000F000F) | base: 128 + n, one LOP3
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(bits) : "r"(word >> (4 * i)), "n"(0x000F000F),
        "r"(base));
    pairs[i] = __hfma2(*reinterpret_cast<__nv_bfloat162 const*>(&bits), one, minus136);
  }
}

// A bf16 scale's bits (low or high half of a register) as a float.
__device__ __forceinline__ float bf16_low_float(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_high_float(uint32_t v) {
  return __uint_as_float(v & 0xFFFF0000u);
}

// One warp's loads for one 128-column chunk: packed words of its two A tiles (rows g and g + 8
// of each), their scales and token g's operand. kAfter: the 4 words' groups' scales of each row
// as two bf16 pairs (words 0, 1 and 2, 3); otherwise each word's scale as a bf16 pair (s, s), 0
// past the matrix's end, so those columns contribute exactly 0.
template <bool kAfter>
struct Int4Chunk {
  uint4 w[2][2];                    // [tile][row g / g + 8]
  uint32_t s[2][2][kAfter ? 2 : 4];
  uint4 b[4];                       // word j's 8 operand values
};

// 3. (kGateUp: tiles = gate and up rows 16 blockIdx.x .., split K over the warps) and
// 4. (!kGateUp: tiles = down rows 32 (4 blockIdx.x + warp) .. + 31, all of I). kAfter: the
// matrices have moe_int4_scales_after_mma (the launch checks it).
// ptxas (nvcc 13, sm_90, -O3): 128 / 127 registers (gate_up / down) in both forms, no spills.
template <bool kGateUp, bool kAfter>
__global__ void __launch_bounds__(kMmaWarps * 32, 4)
    moe_experts_int4_mma_kernel(__grid_constant__ MoeExpertsParams const p,
                                __grid_constant__ Plan const plan) {
  await_prior_kernels();
  __shared__ float partial[kGateUp ? kMmaWarps : 1][32][8];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  SlotView const slot = slot_view(p, plan, static_cast<int>(blockIdx.y), lane);
  int const e = slot.e;
  if (e < 0) return;  // fewer active experts than slots: the whole block leaves
  int const begin = slot.begin, end = slot.end;
  int const rows = kGateUp ? p.inter : p.hidden;  // output rows of each matrix
  int const cols = kGateUp ? p.hidden : p.inter;  // reduction length
  int const group = p.w.group_size;
  int const row0 = kGateUp ? blockIdx.x * kMmaTileRows
                           : (blockIdx.x * kMmaWarps + warp) * kDownRowsPerWarp;
  if (!kGateUp && row0 >= rows) return;  // no barrier below on this path
  int const pieces = cols / 32;           // 128-bit pieces per packed row
  uint32_t const pair_base = int4_pair_base();

  // Tile m: its band of the tiled packed matrix (rows row0_m .. + 15), and the lane's scale
  // rows g, g + 8 (row-major).
  uint4 const* band[2];
  uint16_t const* scales[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    int32_t const* base = kGateUp ? (m == 0 ? p.w.gate_packed[e] : p.w.up_packed[e])
                                  : p.w.down_packed[e];
    uint16_t const* sbase = kGateUp ? (m == 0 ? p.w.gate_scale[e] : p.w.up_scale[e])
                                    : p.w.down_scale[e];
    int const row_m = row0 + (kGateUp ? 0 : m * kMmaTileRows);
    band[m] = reinterpret_cast<uint4 const*>(base) + static_cast<int64_t>(row_m) * pieces;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      scales[m][h] = sbase + static_cast<int64_t>(row_m + g + 8 * h) * (cols / group);
    }
  }
  int const nchunks = (cols + kMmaChunk - 1) / kMmaChunk;
  int const per_warp = kGateUp ? (nchunks + kMmaWarps - 1) / kMmaWarps : nchunks;
  int const ch0 = kGateUp ? min(nchunks, warp * per_warp) : 0;
  int const ch1 = min(nchunks, ch0 + per_warp);
  int const full_chunks = cols / kMmaChunk;
  // Chunk ch's loads (the tiled order, params.hpp: the chunk's w slots a row, row by row). A
  // full chunk (every chunk with kAfter) loads from offsets fixed per lane; in a partial last
  // chunk a lane past the end reads the chunk's first slot of its row and column 0 of the
  // operand, with scale 0 (no branches).
  auto load_chunk = [&](uint4 const* operand, int ch, Int4Chunk<kAfter>& c) {
    int const first = ch * (kMoeInt4BandRows * kMoeInt4ChunkPieces);
    bool const full = kAfter || ch < full_chunks;  // warp-uniform
    int const w = full ? kMoeInt4ChunkPieces : moe_int4_chunk_width(pieces, ch);
    bool const in = full || 32 * q < cols - ch * kMmaChunk;
    int const at = first + g * w + (in ? q : 0);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) c.w[m][h] = __ldg(band[m] + at + 8 * h * w);
    }
    if constexpr (kAfter) {  // groups 4 ch .. 4 ch + 3; word j's columns 128 ch + 32 j + 8 q
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint2 const v = __ldg(reinterpret_cast<uint2 const*>(scales[m][h] + 4 * ch));
          c.s[m][h][0] = v.x;
          c.s[m][h][1] = v.y;
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) c.b[j] = __ldg(operand + 16 * ch + 4 * j + q);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int const col = !in ? 0 : full ? ch * kMmaChunk + 32 * j + 8 * q
                                       : ch * kMmaChunk + 32 * q + 8 * j;
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t const bits = __ldg(scales[m][h] + col / group);
            c.s[m][h][j] = in ? bits * 0x10001u : 0u;
          }
        }
        c.b[j] = __ldg(operand + col / 8);
      }
    }
  };
  // acc[m] += tile m's rows x the chunk's operand columns.
  auto mma_chunk = [&](Int4Chunk<kAfter> const& c, float (&acc)[2][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        __nv_bfloat162 a[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int4_word_pairs(word_of(c.w[m][h], j), pair_base, a[h]);
          if constexpr (!kAfter) {
            __nv_bfloat162 const s2 = *reinterpret_cast<__nv_bfloat162 const*>(&c.s[m][h][j]);
#pragma unroll
            for (int i = 0; i < 4; ++i) a[h][i] = __hmul2(a[h][i], s2);
          }
        }
        float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float(&d)[4] = kAfter ? zero : acc[m];
        mma_bf16_16816(d, bf16x2_bits(a[0][0]), bf16x2_bits(a[1][0]), bf16x2_bits(a[0][1]),
                       bf16x2_bits(a[1][1]), c.b[j].x, c.b[j].y);
        mma_bf16_16816(d, bf16x2_bits(a[0][2]), bf16x2_bits(a[1][2]), bf16x2_bits(a[0][3]),
                       bf16x2_bits(a[1][3]), c.b[j].z, c.b[j].w);
        if constexpr (kAfter) {  // group j's scales of rows g (d 0, 1) and g + 8 (d 2, 3)
          uint32_t const s0 = c.s[m][0][j >> 1], s1 = c.s[m][1][j >> 1];
          float const sg = (j & 1) ? bf16_high_float(s0) : bf16_low_float(s0);
          float const sg8 = (j & 1) ? bf16_high_float(s1) : bf16_low_float(s1);
          acc[m][0] = fmaf(sg, d[0], acc[m][0]);
          acc[m][1] = fmaf(sg, d[1], acc[m][1]);
          acc[m][2] = fmaf(sg8, d[2], acc[m][2]);
          acc[m][3] = fmaf(sg8, d[3], acc[m][3]);
        }
      }
    }
  };

  __nv_bfloat16 const* const xb = reinterpret_cast<__nv_bfloat16 const*>(plan.xb);
  __nv_bfloat16* const hb = reinterpret_cast<__nv_bfloat16*>(plan.h);
  for (int t0 = begin; t0 < end; t0 += kMmaTokens) {
    int const ntok = min(kMmaTokens, end - t0);
    // Token g's operand row: xb by token, or h by sorted position. Past the tile's tokens, the
    // first token's (its accumulator column is computed and never written).
    int const pos = t0 + (g < ntok ? g : 0);
    uint4 const* const operand = reinterpret_cast<uint4 const*>(
        kGateUp ? xb + static_cast<int64_t>(assignment_at(plan, slot, pos) / p.top_k) * cols
                : hb + static_cast<int64_t>(pos) * cols);
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    Int4Chunk<kAfter> even, odd;  // ping-pong: one is used while the next is loaded
    if (ch0 < ch1) load_chunk(operand, ch0, even);
    for (int ch = ch0; ch < ch1; ch += 2) {
      if (ch + 1 < ch1) load_chunk(operand, ch + 1, odd);
      mma_chunk(even, acc);
      if (ch + 1 >= ch1) break;
      if (ch + 2 < ch1) load_chunk(operand, ch + 2, even);
      mma_chunk(odd, acc);
    }
    // Accumulator j of tile m: row g + 8 (j >> 1), token 2q + (j & 1).
    if constexpr (kGateUp) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        partial[warp][lane][j] = acc[0][j];
        partial[warp][lane][4 + j] = acc[1][j];
      }
      __syncthreads();
      if (warp == 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float gv = 0.0f, uv = 0.0f;
#pragma unroll
          for (int w = 0; w < kMmaWarps; ++w) {
            gv += partial[w][lane][j];
            uv += partial[w][lane][4 + j];
          }
          int const n = row0 + g + 8 * (j >> 1), tok = 2 * q + (j & 1);
          if (tok < ntok && n < rows) {
            hb[static_cast<int64_t>(t0 + tok) * rows + n] =
                __float2bfloat16_rn(silu(gv) * uv);
          }
        }
      }
      __syncthreads();  // partial is reused by the next token tile
    } else {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int const n = row0 + m * kMmaTileRows + g + 8 * (j >> 1), tok = 2 * q + (j & 1);
          if (tok < ntok && n < rows) {
            plan.out[static_cast<int64_t>(assignment_at(plan, slot, t0 + tok)) * rows + n] =
                acc[m][j];
          }
        }
      }
    }
  }
}

template <bool kGateUp>
inline Status moe_experts_launch_int4_mma(MoeExpertsParams const& p, Plan const& plan,
                                          cudaStream_t stream) {
  dim3 const grid = kGateUp ? dim3(ceil_div(p.inter, kMmaTileRows), plan.slots)
                            : dim3(ceil_div(p.hidden, kMmaWarps * kDownRowsPerWarp), plan.slots);
  char const* const name = kGateUp ? "moe_experts_int4_mma_kernel<gate_up>"
                                   : "moe_experts_int4_mma_kernel<down>";
  return moe_int4_scales_after_mma(kGateUp ? p.hidden : p.inter, p.w.group_size)
             ? launch_kernel(name, moe_experts_int4_mma_kernel<kGateUp, true>, grid,
                             kMmaWarps * 32, 0, stream, p, plan)
             : launch_kernel(name, moe_experts_int4_mma_kernel<kGateUp, false>, grid,
                             kMmaWarps * 32, 0, stream, p, plan);
}

// ---- tile_int4: a packed matrix into the tiled order ----
static __global__ void moe_experts_tile_int4_kernel(uint4 const* src, int64_t rows, int64_t cols,
                                                    uint32_t* dst) {
  await_prior_kernels();
  int64_t const pieces = cols / 32, n = rows * pieces;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint4 const v = src[i];
    int64_t const r = i / pieces, k = (i % pieces) * 4;  // the piece's first word in its row
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      dst[moe_int4_tiled_word(cols, r, k + j)] = moe_int4_pair_nibbles(word_of(v, j));
    }
  }
}

// ---- last: y = sum_k weights * out, in k order ----
static __global__ void __launch_bounds__(kCombineThreads)
    moe_experts_combine_kernel(__grid_constant__ MoeExpertsParams const p,
                               __grid_constant__ Plan const plan) {
  await_prior_kernels();
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
  float4* const y = reinterpret_cast<float4*>(p.y + t * p.hidden + c);
  if (p.accumulate) {
    float4 const old = *y;
    acc = make_float4(old.x + acc.x, old.y + acc.y, old.z + acc.z, old.w + acc.w);
  }
  if (p.addend) {
    float4 const add = *reinterpret_cast<float4 const*>(p.addend + t * p.hidden + c);
    acc = make_float4(acc.x + add.x, acc.y + add.y, acc.z + add.z, acc.w + add.w);
  }
  *y = acc;
}

template <class Fmt>
inline Status moe_experts_launch_rows(MoeExpertsParams const& p, Plan const& plan,
                                      cudaStream_t stream) {
  dim3 const gate_up_grid(ceil_div(p.inter, kWarps * Fmt::kGateUpRows), plan.slots);
  SPECDEC_RETURN_IF_ERROR(launch_kernel("moe_experts_rows_kernel<gate_up>",
                                        moe_experts_rows_kernel<Fmt, true>, gate_up_grid, kThreads,
                                        0, stream, p, plan));
  dim3 const down_grid(ceil_div(p.hidden, kWarps * Fmt::kDownRows), plan.slots);
  return launch_kernel("moe_experts_rows_kernel<down>", moe_experts_rows_kernel<Fmt, false>,
                       down_grid, kThreads, 0, stream, p, plan);
}

}  // namespace moe_experts_detail

// dst = src [rows, cols/8] in the tiled order (validate_int4_tiling holds); both device memory,
// 16-byte aligned.
inline Status moe_experts_tile_int4_cuda(int32_t const* src, int64_t rows, int64_t cols,
                                         int32_t* dst, cudaStream_t stream) {
  int64_t const n = rows * (cols / 32);
  if (n == 0) return Status::Ok();
  auto const blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  return launch_kernel("moe_experts_tile_int4_kernel",
                       moe_experts_detail::moe_experts_tile_int4_kernel, blocks, 256, 0, stream,
                       reinterpret_cast<uint4 const*>(src), rows, cols,
                       reinterpret_cast<uint32_t*>(dst));
}

inline Status moe_experts_cuda(MoeExpertsParams const& p, cudaStream_t stream) {
  namespace d = moe_experts_detail;
  // The stream waits for addend_ready once in every launch (a captured graph then always joins
  // the stream that records it): right before the combine, or here when nothing runs.
  auto await_addend = [&]() -> Status {
    if (p.addend_ready) {
      SPECDEC_CUDA_TRY(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(p.addend_ready), 0));
    }
    return Status::Ok();
  };
  if (p.tokens == 0) return await_addend();
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
  plan.xb = ws + l.xb;
  plan.slots = std::min(p.experts, n);
  plan.in_warp = n <= d::kInWarpAssignments;
  if (!plan.in_warp) {
    SPECDEC_RETURN_IF_ERROR(launch_kernel("moe_experts_group_kernel", d::moe_experts_group_kernel,
                                          1, d::kGroupWarps * 32, 0, stream, p, plan));
  }
  if (p.w.int4) {
    if (p.x_bf16) {
      plan.xb = const_cast<uint16_t*>(p.x_bf16);  // read only
    } else {
      SPECDEC_RETURN_IF_ERROR(to_bf16_cuda(p.x, static_cast<int64_t>(p.tokens) * p.hidden,
                                           static_cast<uint16_t*>(plan.xb), stream));
    }
    SPECDEC_RETURN_IF_ERROR(d::moe_experts_launch_int4_mma<true>(p, plan, stream));
    SPECDEC_RETURN_IF_ERROR(d::moe_experts_launch_int4_mma<false>(p, plan, stream));
  } else {
    SPECDEC_RETURN_IF_ERROR(d::moe_experts_launch_rows<d::Bf16Format>(p, plan, stream));
  }
  int64_t const quads = static_cast<int64_t>(p.tokens) * (p.hidden / 4);
  auto const blocks = static_cast<unsigned>((quads + d::kCombineThreads - 1) / d::kCombineThreads);
  SPECDEC_RETURN_IF_ERROR(await_addend());
  return launch_kernel("moe_experts_combine_kernel", d::moe_experts_combine_kernel, blocks,
                       d::kCombineThreads, 0, stream, p, plan);
}

}  // namespace specdec::ops
