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
//   router_logits   logits [T, E] = x [T, H] gate^T, fp32 x and gate [E, H], T <= kRouterMaxTokens:
//                   one block per expert, every token (the fp32 router of a decode / verify step
//                   in one launch; a GEMM library runs T = 1 as a dot and a reduction kernel)
//   localize_expert_ids  ids [n] := local_expert_id(id, begin, end): an expert-parallel rank's
//                   index of a routed expert it holds, -1 (ops::moe_experts skips it) otherwise
//   row_argmax_keys row_argmax_keys_reference: keys [T] of logits [T, n] holding ids
//                   [first, first + n); argmax_of_keys: argmax_of_keys_reference over keys [P, T]
// Every launcher takes a stream, never synchronises and returns the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/warp.cuh"

namespace specdec::model::kimi::cuda {

// embed_rows, rms_norm_rows: one block of 1024 threads per row. rms_norm_rows holds a row of up
// to kNormCached values in registers (kNormCached / 1024 per thread), its x and weight loads all
// issued at once: one round of memory latency before the reduction, none after (reloading x and
// the weight after the reduction cost 7.5 us per 7168-wide row); longer rows loop twice.
constexpr int kNormThreads = 1024;
constexpr int kNormPerThread = 8;
constexpr int kNormCached = kNormThreads * kNormPerThread;

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

// out = weight * (x * inv) in double, rounded to float; written as fp32 and / or bf16.
__device__ __forceinline__ void rms_norm_store(float xj, uint16_t wj, double inv, float* yr,
                                               uint16_t* br, int j) {
  float const y = static_cast<float>(static_cast<double>(bf16_to_float(wj)) *
                                     (static_cast<double>(xj) * inv));
  if (yr) yr[j] = y;
  if (br) br[j] = float_to_bf16(y);
}

static __global__ void __launch_bounds__(kNormThreads)
    rms_norm_rows_kernel(float const* __restrict__ x, int64_t x_stride,
                         uint16_t const* __restrict__ weight, int n, double eps, float* out,
                         int64_t out_stride, int32_t const* __restrict__ out_rows,
                         uint16_t* out_bf16, int64_t bf16_stride) {
  __shared__ double partial[kNormThreads / 32];
  int64_t const t = blockIdx.x;
  float const* xr = x + t * x_stride;
  bool const cached = n <= kNormCached;
  float xv[kNormPerThread];
  uint16_t wv[kNormPerThread];
  double ss = 0.0;
  if (cached) {
#pragma unroll
    for (int i = 0; i < kNormPerThread; ++i) {
      int const j = threadIdx.x + i * kNormThreads;
      xv[i] = j < n ? xr[j] : 0.0f;
      wv[i] = j < n ? weight[j] : uint16_t{0};
    }
#pragma unroll
    for (int i = 0; i < kNormPerThread; ++i) ss += static_cast<double>(xv[i]) * xv[i];
  } else {
#pragma unroll 4
    for (int j = threadIdx.x; j < n; j += kNormThreads) ss += static_cast<double>(xr[j]) * xr[j];
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  double const inv = 1.0 / sqrt(total / n + eps);
  float* yr = out ? out + (out_rows ? static_cast<int64_t>(out_rows[t]) : t) * out_stride : nullptr;
  uint16_t* br = out_bf16 ? out_bf16 + t * bf16_stride : nullptr;
  if (cached) {
#pragma unroll
    for (int i = 0; i < kNormPerThread; ++i) {
      int const j = threadIdx.x + i * kNormThreads;
      if (j < n) rms_norm_store(xv[i], wv[i], inv, yr, br, j);
    }
  } else {
#pragma unroll 4
    for (int j = threadIdx.x; j < n; j += kNormThreads) {
      rms_norm_store(xr[j], weight[j], inv, yr, br, j);
    }
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

constexpr int kRouterMaxTokens = 8;
constexpr int kRouterWarps = 8;

// Block e: expert e's row over its 8 warps (thread i takes float4 columns i, i + 256, ...; all
// loads of a 7168-wide row in flight at once), each token's sum per thread in column order, a
// butterfly over each warp, then the warps' sums in warp order: a fixed order.
static __global__ void __launch_bounds__(kRouterWarps * 32)
    router_logits_kernel(float const* __restrict__ x, float const* __restrict__ gate, int T,
                         int64_t E, int64_t H, float* __restrict__ logits) {
  __shared__ float partial[kRouterWarps][kRouterMaxTokens];
  int64_t const e = blockIdx.x;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float4 const* g4 = reinterpret_cast<float4 const*>(gate + e * H);
  float sum[kRouterMaxTokens] = {};
  int64_t const H4 = H / 4;
#pragma unroll 4
  for (int64_t k = threadIdx.x; k < H4; k += kRouterWarps * 32) {
    float4 const w = __ldcs(g4 + k);
#pragma unroll
    for (int t = 0; t < kRouterMaxTokens; ++t) {
      if (t >= T) break;
      float4 const v = __ldg(reinterpret_cast<float4 const*>(x + t * H) + k);
      sum[t] = fmaf(v.x, w.x, fmaf(v.y, w.y, fmaf(v.z, w.z, fmaf(v.w, w.w, sum[t]))));
    }
  }
#pragma unroll
  for (int t = 0; t < kRouterMaxTokens; ++t) {
    if (t >= T) break;
    float const v = warp_sum(sum[t]);
    if (lane == 0) partial[warp][t] = v;
  }
  __syncthreads();
  if (threadIdx.x >= T) return;
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kRouterWarps; ++w) total += partial[w][threadIdx.x];
  logits[threadIdx.x * E + e] = total;
}

// Whether router_logits takes the shape (else a GEMM): few tokens, 16-byte rows.
inline bool router_logits_fits(int64_t T, int64_t H, float const* x, float const* gate) {
  return T >= 1 && T <= kRouterMaxTokens && H % 4 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(gate) % 16 == 0;
}

inline Status router_logits(float const* x, float const* gate, int64_t T, int64_t E, int64_t H,
                            float* logits, cudaStream_t stream) {
  if (!router_logits_fits(T, H, x, gate)) {
    return Status::InvalidArgument("router_logits: " + std::to_string(T) + " tokens x hidden " +
                                   std::to_string(H) + " (needs T <= " +
                                   std::to_string(kRouterMaxTokens) +
                                   ", H % 4 == 0, 16-byte aligned x and gate)");
  }
  router_logits_kernel<<<static_cast<unsigned>(E), kRouterWarps * 32, 0, stream>>>(
      x, gate, static_cast<int>(T), E, H, logits);
  return cuda_launch_status("router_logits");
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
