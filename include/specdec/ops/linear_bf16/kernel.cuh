// linear_bf16 CUDA kernel: y [T, out] = beta y + x [T, in] W^T, T <= 8, on tensor cores.
// Block (x, b) owns 16 output rows of product b (batched: params.hpp), two groups of 8. Its 8
// warps (16 where the grid gives no SM more than one block: twice the loads in flight, q_a +
// kv_a's 132 blocks 0.84x the time) split k into chunks of one row group and 64 columns: chunk j
// is group j % 2, columns 64 (j / 2) ..; warp w takes chunks w, w + 8, ... (the stride is the
// warp count, even, so a warp keeps one group).
// A chunk is two loads of 4 rows x 128 contiguous bytes (lane l: row l / 8 of the group's first
// or last 4, columns 8 (l % 8) .. + 7). Loads of 8 rows x 64 bytes took 1.02-1.10x the time on an
// H100 (benchmarks/RESULTS.md, "The GEMVs' loads 128 bytes a row").
// One pair of mma.sync m16n8k16 per chunk and 4 tokens (bf16 operands, fp32 accumulators). A's
// row g (lane l = 4 g + c) is row g / 2 of a load, column half h = g % 2, i.e. columns 32 h + 8 c
// .. + 7: its logical k 2c, 2c + 1 / 2c + 8, 2c + 9 stand for physical columns 32 h + 8 c + 0, 1
// / + 2, 3 (the second mma: + 4 .. 7). The permutation depends on h, so B's columns come in
// pairs: column n = 2 t + h holds token t's x in half h's order, loaded by lane (g = n, c) from
// the columns its own weights came from. C[g][n] is a partial sum of a row's half h exactly where
// n % 2 == g % 2 (the other entries mix the halves and are dropped), and a shuffle adds the two
// halves. Tokens 4..7 take a second mma pair on the same weights.
// Every load is one 16-byte vector (no shared-memory staging, no conversions). Weights are
// streamed (L1::no_allocate); x (at most 8 x in bf16) stays in L1 for the block's warps.
// The warps' partial sums meet in shared memory and are added in warp order: a fixed order, so
// a rerun gives the same bits. No host synchronisation or allocation: graph-capturable.
// Launched with programmatic dependent launch (core/cuda.cuh): with w_constant each warp's first
// weight loads are issued before the kernel waits for the one before it.
// Measured (benchmarks/RESULTS.md): ahead of cuBLAS on Kimi's narrow decode shapes; on the
// lm_head 0.975x its time on an H100 (1.05x on the H200 before the 128-byte loads; gemm_bf16
// keeps the lm_head on cuBLAS until an H200 says otherwise). Splitting k over thread-block
// clusters (fuller last waves) was tried and measured slower on every shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/warp.cuh"
#include "specdec/ops/linear_bf16/params.hpp"

namespace specdec::ops {
namespace linear_bf16_detail {

constexpr int kRows = 16;        // output rows per block: two groups of 8 (the mma's M)
constexpr int kNarrowWarps = 8;  // warps per block, splitting k
constexpr int kWideWarps = 16;   // ... where the grid leaves an SM at most one block
constexpr int kUnroll = 4;       // chunks in flight per warp (4 x 1 KB of weights)
constexpr int kWindow = 64;      // columns per chunk (8 lanes x 8 per row)
constexpr int kTokenGroup = 4;   // tokens per mma pair (B's 8 columns: 4 tokens x 2 halves)

__device__ __forceinline__ uint4 load_streaming(uint16_t const* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    linear_bf16_kernel(__grid_constant__ LinearBf16Params const p) {
  static_assert(kWarps % 2 == 0, "a warp keeps one row group: the chunk stride must be even");
  __shared__ float partial[kWarps][8 * 8];  // [warp][row of the group * 8 + token]
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int const g = lane >> 2, c = lane & 3, r = lane >> 3, col = 8 * (lane & 7);
  int const group = warp & 1;
  int64_t const rows0 = static_cast<int64_t>(blockIdx.x) * kRows + 8 * group;
  int const batch = blockIdx.y;
  bool const has_a = rows0 + r < p.out, has_b = rows0 + 4 + r < p.out;
  uint16_t const* wa = p.w + batch * p.w_batch + (rows0 + r) * p.in + col;
  uint16_t const* wb = wa + 4 * p.in;
  // Lane l's x: token l / 8 (+ 4 in the second group), the columns of its weights.
  uint16_t const* xg = p.x + batch * p.x_batch + static_cast<int64_t>(r) * p.ldx + col;
  bool const has_x0 = r < p.tokens, has_x1 = r + kTokenGroup < p.tokens;
  bool const two_groups = p.tokens > kTokenGroup;  // block-uniform
  int64_t const chunks = 2 * ((p.in + kWindow - 1) / kWindow);
  float acc[2][2][4] = {};  // [token group][mma of the pair][fragment]
  uint4 const zero = make_uint4(0, 0, 0, 0);
  uint4 a[kUnroll], b[kUnroll], x0[kUnroll], x1[kUnroll];
  // Chunk j's columns start at kWindow (j / 2); this lane's 8 of them lie inside in or not at all.
  auto at = [&](int64_t j) { return (j >> 1) * kWindow; };
  auto in_k = [&](int64_t j) { return j < chunks && at(j) + col < p.in; };
  auto load_weights = [&](int64_t j0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t const j = j0 + u * kWarps;
      a[u] = in_k(j) && has_a ? load_streaming(wa + at(j)) : zero;
      b[u] = in_k(j) && has_b ? load_streaming(wb + at(j)) : zero;
    }
  };
  // With w_constant the first weights are in flight while the kernel before this one finishes
  // (nothing on the stream writes them); x and y, and otherwise w, only after it.
  if (p.w_constant) load_weights(warp);
  await_prior_kernels();
  for (int64_t j0 = warp; j0 < chunks; j0 += kWarps * kUnroll) {
    if (j0 != warp || !p.w_constant) load_weights(j0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t const j = j0 + u * kWarps;
      uint4 const* xp = reinterpret_cast<uint4 const*>(xg + at(j));
      x0[u] = in_k(j) && has_x0 ? __ldg(xp) : zero;
      if (two_groups) {
        x1[u] = in_k(j) && has_x1 ? __ldg(reinterpret_cast<uint4 const*>(
                                        xg + kTokenGroup * p.ldx + at(j)))
                                  : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j0 + u * kWarps >= chunks) break;  // warp-uniform: every lane runs each mma
      mma_bf16_16816(acc[0][0], a[u].x, b[u].x, a[u].y, b[u].y, x0[u].x, x0[u].y);
      mma_bf16_16816(acc[0][1], a[u].z, b[u].z, a[u].w, b[u].w, x0[u].z, x0[u].w);
      if (two_groups) {
        mma_bf16_16816(acc[1][0], a[u].x, b[u].x, a[u].y, b[u].y, x1[u].x, x1[u].y);
        mma_bf16_16816(acc[1][1], a[u].z, b[u].z, a[u].w, b[u].w, x1[u].z, x1[u].w);
      }
    }
  }
  // Lane (g, c) holds C[g][2c + i] (i = 0, 1) and C[g + 8][2c + i]: rows g / 2 and 4 + g / 2 of
  // the group, token c of the token group, half i of the chunk. Keep half g % 2 and add the
  // partner lane's (g ^ 1) other half; lanes of even g then hold the rows' sums.
  int const h = g & 1;
#pragma unroll
  for (int tg = 0; tg < 2; ++tg) {
    float const* d0 = acc[tg][0];
    float const* d1 = acc[tg][1];
    float lo = h ? d0[1] + d1[1] : d0[0] + d1[0];
    float hi = h ? d0[3] + d1[3] : d0[2] + d1[2];
    lo += __shfl_xor_sync(0xffffffffu, lo, 4);
    hi += __shfl_xor_sync(0xffffffffu, hi, 4);
    if (h == 0) {
      int const token = kTokenGroup * tg + c;
      partial[warp][(g >> 1) * 8 + token] = lo;
      partial[warp][(4 + (g >> 1)) * 8 + token] = hi;
    }
  }
  __syncthreads();
  if (threadIdx.x >= kRows * 8) return;
  // Thread i: row (i / 8) % 8 of group i / 64, token i % 8; the group's warps in warp order.
  int const out_group = threadIdx.x >> 6, row_in = (threadIdx.x >> 3) & 7, token = threadIdx.x & 7;
  float sum = 0.0f;
#pragma unroll
  for (int w = out_group; w < kWarps; w += 2) sum += partial[w][row_in * 8 + token];
  int64_t const row = static_cast<int64_t>(blockIdx.x) * kRows + 8 * out_group + row_in;
  if (row < p.out && token < p.tokens) linear_bf16_store(p, batch, token, row, sum);
}

}  // namespace linear_bf16_detail

inline Status linear_bf16_cuda(LinearBf16Params const& p, cudaStream_t stream) {
  using namespace linear_bf16_detail;
  int64_t const blocks = (p.out + kRows - 1) / kRows;
  dim3 const grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.batch));
  int sms = 0;
  SPECDEC_RETURN_IF_ERROR(current_device_attribute(cudaDevAttrMultiProcessorCount, sms));
  if (blocks * p.batch <= sms) {
    return launch_kernel("linear_bf16_kernel<16>", linear_bf16_kernel<kWideWarps>, grid,
                         kWideWarps * 32, 0, stream, p);
  }
  return launch_kernel("linear_bf16_kernel<8>", linear_bf16_kernel<kNarrowWarps>, grid,
                       kNarrowWarps * 32, 0, stream, p);
}

}  // namespace specdec::ops
