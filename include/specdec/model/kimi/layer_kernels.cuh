// The Kimi CUDA forward's element-wise and per-row kernels (model/kimi/forward_cuda.cuh), each the
// GPU form of a CPU rule in forward_reference.hpp (tests/cuda/kimi_layer_kernels.cu compares
// them):
//   embed_rows      x [T, H] fp32 = embedding rows (bf16 [V, H]) of tokens [T]
//   rms_norm_rows   rms_norm_reference per row: x [T, n] (row stride) with a bf16 weight [n] ->
//                   fp32 out (row stride, or row out_rows[t] when given: cache rows) and / or
//                   bf16 out; the sum of squares and the scaling in double, as the reference
//   rope_rows       rope_interleaved_reference on [T, heads] vectors of 2 * pairs floats, in ->
//                   out (strided; out row out_rows[t] when given), angles position * inv_freq in
//                   double; in == out allowed
//   silu_mul_bf16   h [T, I] bf16 = silu(g) * u from fp32 g, u rows `stride` floats apart (silu
//                   as forward_reference's; a stacked gate / up GEMM's output: u = g + I, 2 I)
//   to_bf16         bf16 copy of fp32 values (round to nearest even, core/dtype.hpp)
//   localize_expert_ids  ids [n] := local_expert_id(id, begin, end): an expert-parallel rank's
//                   index of a routed expert it holds, -1 (ops::moe_experts skips it) otherwise
//   row_argmax_keys row_argmax_keys_reference: keys [T] of logits [T, n] holding ids
//                   [first, first + n); argmax_of_keys: argmax_of_keys_reference over keys [P, T]
// Every launcher takes a stream, never synchronises and returns the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/core/math.hpp"

namespace specdec::model::kimi::cuda {

// embed_rows, rms_norm_rows: one block of 1024 threads per row with 4 loads in flight per thread,
// so a 7168-wide row is 2 rounds of memory latency (a 256-thread loop waited ~28 times: 12 us).
constexpr int kNormThreads = 1024;

static __global__ void embed_rows_kernel(uint16_t const* __restrict__ table,
                                         int32_t const* __restrict__ tokens, int64_t H,
                                         float* __restrict__ x) {
  int64_t const t = blockIdx.x;
  uint16_t const* row = table + static_cast<int64_t>(tokens[t]) * H;
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) x[t * H + j] = bf16_to_float(row[j]);
}

inline Status embed_rows(uint16_t const* table, int32_t const* tokens, int64_t T, int64_t H,
                         float* x, cudaStream_t stream) {
  if (T == 0) return Status::Ok();
  embed_rows_kernel<<<static_cast<unsigned>(T), kNormThreads, 0, stream>>>(table, tokens, H, x);
  return cuda_launch_status("embed_rows");
}

static __global__ void rms_norm_rows_kernel(float const* __restrict__ x, int64_t x_stride,
                                            uint16_t const* __restrict__ weight, int n, double eps,
                                            float* out, int64_t out_stride,
                                            int32_t const* __restrict__ out_rows,
                                            uint16_t* out_bf16, int64_t bf16_stride) {
  __shared__ double partial[kNormThreads / 32];
  int64_t const t = blockIdx.x;
  float const* xr = x + t * x_stride;
  double ss = 0.0;
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += blockDim.x) ss += static_cast<double>(xr[j]) * xr[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += partial[w];
  double const inv = 1.0 / sqrt(total / n + eps);
  float* yr = out ? out + (out_rows ? static_cast<int64_t>(out_rows[t]) : t) * out_stride : nullptr;
  uint16_t* br = out_bf16 ? out_bf16 + t * bf16_stride : nullptr;
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float const y = static_cast<float>(static_cast<double>(bf16_to_float(weight[j])) *
                                       (static_cast<double>(xr[j]) * inv));
    if (yr) yr[j] = y;
    if (br) br[j] = float_to_bf16(y);
  }
}

// rows T of n values: x row t at x + t * x_stride; fp32 out row at out + (out_rows ? out_rows[t]
// : t) * out_stride (nullptr: none); bf16 out row at out_bf16 + t * bf16_stride (nullptr: none).
inline Status rms_norm_rows(float const* x, int64_t x_stride, uint16_t const* weight, int64_t T,
                            int n, double eps, float* out, int64_t out_stride,
                            int32_t const* out_rows, uint16_t* out_bf16, int64_t bf16_stride,
                            cudaStream_t stream) {
  if (T == 0) return Status::Ok();
  rms_norm_rows_kernel<<<static_cast<unsigned>(T), kNormThreads, 0, stream>>>(
      x, x_stride, weight, n, eps, out, out_stride, out_rows, out_bf16, bf16_stride);
  return cuda_launch_status("rms_norm_rows");
}

struct RopeRows {
  float const* in = nullptr;  // vector (t, h) at in + t * in_token_stride + h * in_head_stride
  int64_t in_token_stride = 0, in_head_stride = 0;
  float* out = nullptr;  // at out + (out_rows ? out_rows[t] : t) * out_token_stride + h * ...
  int64_t out_token_stride = 0, out_head_stride = 0;
  int32_t const* out_rows = nullptr;
  int64_t tokens = 0;
  int heads = 1;
  int pairs = 0;                      // r / 2
  int32_t const* positions = nullptr;  // [T]
  double const* inv_freq = nullptr;    // [pairs]
  double cos_sin_scale = 1.0;
};

static __global__ void rope_rows_kernel(RopeRows p) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t const per_token = static_cast<int64_t>(p.heads) * p.pairs;
  if (i >= p.tokens * per_token) return;
  int64_t const t = i / per_token;
  int const h = static_cast<int>((i % per_token) / p.pairs), k = static_cast<int>(i % p.pairs);
  float const* src = p.in + t * p.in_token_stride + h * p.in_head_stride + 2 * k;
  int64_t const orow = p.out_rows ? static_cast<int64_t>(p.out_rows[t]) : t;
  float* dst = p.out + orow * p.out_token_stride + h * p.out_head_stride + 2 * k;
  double const a = static_cast<double>(p.positions[t]) * p.inv_freq[k];
  double sn = 0.0, cs = 0.0;
  sincos(a, &sn, &cs);
  cs *= p.cos_sin_scale;
  sn *= p.cos_sin_scale;
  double const x0 = src[0], x1 = src[1];
  dst[0] = static_cast<float>(x0 * cs - x1 * sn);
  dst[1] = static_cast<float>(x1 * cs + x0 * sn);
}

inline Status rope_rows(RopeRows const& p, cudaStream_t stream) {
  int64_t const n = p.tokens * p.heads * p.pairs;
  if (n == 0) return Status::Ok();
  rope_rows_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(p);
  return cuda_launch_status("rope_rows");
}

static __global__ void silu_mul_bf16_kernel(float const* __restrict__ g, float const* __restrict__ u,
                                            int64_t cols, int64_t stride, int64_t n,
                                            uint16_t* __restrict__ h) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t const at = (i / cols) * stride + i % cols;
  float const v = g[at];
  float const s = static_cast<float>(v / (1.0 + exp(-static_cast<double>(v))));
  h[i] = float_to_bf16(s * u[at]);
}

inline Status silu_mul_bf16(float const* g, float const* u, int64_t rows, int64_t cols,
                            int64_t stride, uint16_t* h, cudaStream_t stream) {
  int64_t const n = rows * cols;
  if (n == 0) return Status::Ok();
  silu_mul_bf16_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(
      g, u, cols, stride, n, h);
  return cuda_launch_status("silu_mul_bf16");
}

static __global__ void to_bf16_kernel(float const* __restrict__ x, int64_t n,
                                      uint16_t* __restrict__ y) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = float_to_bf16(x[i]);
}

inline Status to_bf16(float const* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (n == 0) return Status::Ok();
  to_bf16_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(x, n, y);
  return cuda_launch_status("to_bf16");
}

// An expert-parallel rank holds experts [begin, end): expert id is its local expert id - begin;
// any other is -1, an id ops::moe_experts's kernels skip (the rank holding it adds its share).
__host__ __device__ constexpr int32_t local_expert_id(int32_t id, int64_t begin, int64_t end) {
  return id >= begin && id < end ? static_cast<int32_t>(id - begin) : -1;
}

static __global__ void localize_expert_ids_kernel(int32_t* ids, int64_t n, int64_t begin,
                                                  int64_t end) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) ids[i] = local_expert_id(ids[i], begin, end);
}

inline Status localize_expert_ids(int32_t* ids, int64_t n, int64_t begin, int64_t end,
                                  cudaStream_t stream) {
  if (n == 0) return Status::Ok();
  localize_expert_ids_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(
      ids, n, begin, end);
  return cuda_launch_status("localize_expert_ids");
}

// One block per row: the max of pack_value_index over the row, then across warps.
constexpr int kArgmaxKeyThreads = 256;

SPECDEC_HD inline uint64_t max_key(uint64_t a, uint64_t b) { return a > b ? a : b; }

static __global__ void __launch_bounds__(kArgmaxKeyThreads)
    row_argmax_keys_kernel(float const* __restrict__ logits, int64_t n, int64_t first,
                           uint64_t* __restrict__ keys) {
  float const* row = logits + static_cast<int64_t>(blockIdx.x) * n;
  uint64_t best = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    best = max_key(best, pack_value_index(row[j], static_cast<int32_t>(first + j)));
  }
  for (int o = 16; o > 0; o >>= 1) best = max_key(best, __shfl_xor_sync(0xffffffffu, best, o));
  __shared__ uint64_t warp_best[kArgmaxKeyThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = threadIdx.x < kArgmaxKeyThreads / 32 ? warp_best[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1) best = max_key(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (threadIdx.x == 0) keys[blockIdx.x] = best;
  }
}

inline Status row_argmax_keys(float const* logits, int64_t T, int64_t n, int64_t first,
                              uint64_t* keys, cudaStream_t stream) {
  if (T == 0) return Status::Ok();
  row_argmax_keys_kernel<<<static_cast<unsigned>(T), kArgmaxKeyThreads, 0, stream>>>(logits, n,
                                                                                      first, keys);
  return cuda_launch_status("row_argmax_keys");
}

static __global__ void argmax_of_keys_kernel(uint64_t const* __restrict__ keys, int64_t P,
                                             int64_t T, int32_t* __restrict__ argmax) {
  int64_t const t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  uint64_t best = 0;
  for (int64_t q = 0; q < P; ++q) best = max_key(best, keys[q * T + t]);
  argmax[t] = unpack_index(best);
}

inline Status argmax_of_keys(uint64_t const* keys, int64_t P, int64_t T, int32_t* argmax,
                             cudaStream_t stream) {
  if (T == 0) return Status::Ok();
  argmax_of_keys_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(T, 128)), 128, 0, stream>>>(
      keys, P, T, argmax);
  return cuda_launch_status("argmax_of_keys");
}

}  // namespace specdec::model::kimi::cuda
