// linear_bf16 CUDA kernel: y [T, out] = beta y + x [T, in] W^T, T <= 8, on tensor cores.
// Block (x, b) owns 16 output rows of product b (batched: params.hpp); its 8 warps (16 where the
// grid gives no SM more than one block: twice the loads in flight, q_a + kv_a's 132 blocks 0.84x
// the time) split k into 32-column chunks (warp w takes chunks w, w + 8, ...: the stride is the
// warp count), each chunk one pair of mma.sync m16n8k16
// (bf16 operands, fp32 accumulators):
// A = the 16 weight rows, B = x^T with the T tokens as its 8 columns (the rest zero).
// Lane (g = lane / 4, c = lane % 4) loads 16 bytes of weight rows g and g + 8 and of token g's x,
// all at columns 32 j + 8 c .. + 7: the fragment's logical k 2c, 2c + 1 / 2c + 8, 2c + 9 then
// stand for physical columns 8c, 8c + 1 / 8c + 2, 8c + 3 (the second mma: + 4), one permutation
// of k applied to A and B alike, so the dot products are unchanged and every load is one
// coalesced 16-byte vector (no shared-memory staging, no conversions). Weights are streamed
// (L1::no_allocate); x (at most 8 x in bf16) stays in L1 for the block's warps.
// The warps' partial sums meet in shared memory and are added in warp order: a fixed order, so
// a rerun gives the same bits. No host synchronisation or allocation: graph-capturable.
// Launched with programmatic dependent launch (core/cuda.cuh): with w_constant each warp's first
// weight loads are issued before the kernel waits for the one before it.
// Measured (benchmarks/RESULTS.md): ahead of cuBLAS on Kimi's narrow decode shapes, 3-6% behind
// it on the widest (o_proj, lm_head). Splitting k over thread-block clusters (fuller last waves)
// was tried and measured slower on every shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/warp.cuh"
#include "specdec/ops/linear_bf16/params.hpp"

namespace specdec::ops {
namespace linear_bf16_detail {

constexpr int kRows = 16;    // output rows per block (the mma's M)
constexpr int kNarrowWarps = 8;  // warps per block, splitting k
constexpr int kWideWarps = 16;   // ... where the grid leaves an SM at most one block
constexpr int kUnroll = 4;   // chunks in flight per warp (4 x 1 KB of weights)
constexpr int kChunk = 32;   // columns per warp per chunk (4 lanes x 8)

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
  __shared__ float partial[kWarps][32 * 4];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int const g = lane >> 2, c = lane & 3;
  int64_t const row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  int const batch = blockIdx.y;
  bool const has_a = row0 + g < p.out, has_b = row0 + g + 8 < p.out, has_x = g < p.tokens;
  uint16_t const* wa = p.w + batch * p.w_batch + (row0 + g) * p.in + 8 * c;
  uint16_t const* wb = wa + 8 * p.in;
  uint16_t const* xg = p.x + batch * p.x_batch + static_cast<int64_t>(g) * p.ldx + 8 * c;
  int64_t const chunks = (p.in + kChunk - 1) / kChunk;
  float acc[2][4] = {};
  uint4 const zero = make_uint4(0, 0, 0, 0);
  uint4 a[kUnroll], b[kUnroll], xv[kUnroll];
  auto in_k = [&](int64_t j) { return j < chunks && j * kChunk + 8 * c < p.in; };
  auto load_weights = [&](int64_t j0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t const j = j0 + u * kWarps;
      a[u] = in_k(j) && has_a ? load_streaming(wa + j * kChunk) : zero;
      b[u] = in_k(j) && has_b ? load_streaming(wb + j * kChunk) : zero;
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
      xv[u] = in_k(j) && has_x ? __ldg(reinterpret_cast<uint4 const*>(xg + j * kChunk)) : zero;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j0 + u * kWarps >= chunks) break;  // warp-uniform: every lane runs each mma
      mma_bf16_16816(acc[0], a[u].x, b[u].x, a[u].y, b[u].y, xv[u].x, xv[u].y);
      mma_bf16_16816(acc[1], a[u].z, b[u].z, a[u].w, b[u].w, xv[u].z, xv[u].w);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) partial[warp][lane * 4 + i] = acc[0][i] + acc[1][i];
  __syncthreads();
  if (threadIdx.x >= 32 * 4) return;
  // Thread (lane l, i): C[g + 8 (i / 2)][2c + i % 2] of lane l = (g, c).
  int const l = threadIdx.x >> 2, i = threadIdx.x & 3;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += partial[w][threadIdx.x];
  int64_t const row = row0 + (l >> 2) + 8 * (i >> 1);
  int const token = 2 * (l & 3) + (i & 1);
  if (row < p.out && token < p.tokens) linear_bf16_store(p, batch, token, row, sum);
}

}  // namespace linear_bf16_detail

inline Status linear_bf16_cuda(LinearBf16Params const& p, cudaStream_t stream) {
  using namespace linear_bf16_detail;
  int64_t const blocks = (p.out + kRows - 1) / kRows;
  dim3 const grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.batch));
  int device = 0, sms = 0;
  SPECDEC_CUDA_TRY(cudaGetDevice(&device));
  SPECDEC_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (blocks * p.batch <= sms) {
    return launch_kernel("linear_bf16_kernel<16>", linear_bf16_kernel<kWideWarps>, grid,
                         kWideWarps * 32, 0, stream, p);
  }
  return launch_kernel("linear_bf16_kernel<8>", linear_bf16_kernel<kNarrowWarps>, grid,
                       kNarrowWarps * 32, 0, stream, p);
}

}  // namespace specdec::ops
