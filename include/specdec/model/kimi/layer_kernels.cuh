// The Kimi CUDA forward's element-wise and per-row kernels (model/kimi/forward_cuda.cuh), each the
// GPU form of a CPU rule in forward_reference.hpp (the "kimi layer kernels" cases of
// tests/cuda/kimi_forward_cuda.cu compare them):
//   embed_rows      x [T, H] fp32 = embedding rows (bf16 [V, H]) of tokens [T]
//   rms_norm_rows   rms_norm_reference per row: x [T, n] (row stride) with a bf16 weight [n] ->
//                   fp32 out (row stride, or row out_rows[t] when given: cache rows) and / or
//                   bf16 out; the sum of squares and the scaling in double, as the reference
//   mla_latent_rows the q_a / kv_a GEMM's rows -> bf16 rms(q_a) and the cache entries [rms(c_kv)
//                   | rope(k_pe)] in one launch (rope: rope_interleaved_reference, angles
//                   position * inv_freq in double)
//   query_rows      q rows -> bf16 nope parts and the roped pe parts in the absorbed query
//   silu_mul_bf16   h [T, I] bf16 = silu(g) * u from fp32 g, u rows `stride` floats apart (silu
//                   as forward_reference's; a stacked gate / up GEMM's output: u = g + I, 2 I)
//   add_into        x [n] += part [n] (fp32: a tensor-parallel partial sum into the residual)
//   router_logits   logits [T, E] = x [T, H] gate^T, fp32 x and gate [E, H], T <= kRouterMaxTokens:
//                   one block per expert, every token (the fp32 router of a decode / verify step
//                   in one launch; a GEMM library runs T = 1 as a dot and a reduction kernel)
//   router_logits_route  the same, and the block that finishes last routes the tokens
//                   (ops::moe_route's rule and device code) into ids / weights [T, top_k]: one
//                   launch fewer on the MoE layer's chain of small kernels
//   localize_expert_ids  ids [n] := local_expert_id(id, begin, end): an expert-parallel rank's
//                   index of a routed expert it holds, -1 (ops::moe_experts skips it) otherwise
//   row_argmax_keys row_argmax_keys_reference: keys [T] of logits [T, n] holding ids
//                   [first, first + n); argmax_of_keys: argmax_of_keys_reference over keys [P, T]
// router_logits is compared with a double-precision dot product, router_logits_route with
// router_logits + moe_route bit for bit.
// Every launcher takes a stream, never synchronises and returns the launch status; every kernel
// is launched with programmatic dependent launch (core/cuda.cuh's launch_kernel). The norms and
// the router load their weights before they wait for the kernel before them, so a row's wait is
// one round of L2 latency for the activations, not one of HBM latency for the weights (measured,
// benchmarks/RESULTS.md: verify chain 4 14.93 -> 14.58 ms, decode B=1 12.68 -> 12.64).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/warp.cuh"
#include "specdec/ops/moe_route/kernel.cuh"
#include "specdec/ops/moe_route/params.hpp"

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
  await_prior_kernels();
  int64_t const t = blockIdx.x;
  uint16_t const* row = table + static_cast<int64_t>(tokens[t]) * H;
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) x[t * H + j] = bf16_to_float(row[j]);
}

inline Status embed_rows(uint16_t const* table, int32_t const* tokens, int64_t T, int64_t H,
                         float* x, cudaStream_t stream) {
  if (T == 0) return Status::Ok();
  return launch_kernel("embed_rows", embed_rows_kernel, static_cast<unsigned>(T), kNormThreads, 0,
                       stream, table, tokens, H, x);
}

// out = rms_scaled(x, weight, inv) (core/math.hpp); written as fp32 and / or bf16.
__device__ __forceinline__ void rms_norm_store(float xj, uint16_t wj, double inv, float* yr,
                                               uint16_t* br, int j) {
  float const y = rms_scaled(xj, bf16_to_float(wj), inv);
  if (yr) yr[j] = y;
  if (br) br[j] = float_to_bf16(y);
}

// A thread's elements threadIdx.x + i * kNormThreads of a norm weight of n <= kNormCached values
// (rms_norm_row's cached layout; longer rows read the weight as they go). A kernel loads them
// before it waits for the one before it: nothing on the stream writes a weight.
struct NormWeightShare {
  uint16_t w[kNormPerThread];
};
__device__ __forceinline__ NormWeightShare load_norm_weight(uint16_t const* __restrict__ weight,
                                                            int n) {
  NormWeightShare share{};
  if (n > kNormCached) return share;
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    int const j = threadIdx.x + i * kNormThreads;
    share.w[i] = j < n ? weight[j] : uint16_t{0};
  }
  return share;
}

// One block normalises one row of n values (every thread of the block calls it, with its share
// of the weight from load_norm_weight(weight, n)): yr (fp32, nullptr: none) and br (bf16,
// nullptr: none) receive it.
__device__ __forceinline__ void rms_norm_row(float const* __restrict__ xr,
                                             uint16_t const* __restrict__ weight,
                                             NormWeightShare const& wv, int n, double eps,
                                             float* yr, uint16_t* br) {
  __shared__ double partial[kNormThreads / 32];
  bool const cached = n <= kNormCached;
  float xv[kNormPerThread];
  double ss = 0.0;
  if (cached) {
#pragma unroll
    for (int i = 0; i < kNormPerThread; ++i) {
      int const j = threadIdx.x + i * kNormThreads;
      xv[i] = j < n ? xr[j] : 0.0f;
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
  double const inv = rms_inverse(total, n, eps);
  if (cached) {
#pragma unroll
    for (int i = 0; i < kNormPerThread; ++i) {
      int const j = threadIdx.x + i * kNormThreads;
      if (j < n) rms_norm_store(xv[i], wv.w[i], inv, yr, br, j);
    }
  } else {
#pragma unroll 4
    for (int j = threadIdx.x; j < n; j += kNormThreads) {
      rms_norm_store(xr[j], weight[j], inv, yr, br, j);
    }
  }
}

static __global__ void __launch_bounds__(kNormThreads)
    rms_norm_rows_kernel(float const* __restrict__ x, int64_t x_stride,
                         uint16_t const* __restrict__ weight, int n, double eps, float* out,
                         int64_t out_stride, int32_t const* __restrict__ out_rows,
                         uint16_t* out_bf16, int64_t bf16_stride) {
  NormWeightShare const wv = load_norm_weight(weight, n);
  await_prior_kernels();
  int64_t const t = blockIdx.x;
  float* yr = out ? out + (out_rows ? static_cast<int64_t>(out_rows[t]) : t) * out_stride : nullptr;
  uint16_t* br = out_bf16 ? out_bf16 + t * bf16_stride : nullptr;
  rms_norm_row(x + t * x_stride, weight, wv, n, eps, yr, br);
}

// rows T of n values: x row t at x + t * x_stride; fp32 out row at out + (out_rows ? out_rows[t]
// : t) * out_stride (nullptr: none); bf16 out row at out_bf16 + t * bf16_stride (nullptr: none).
inline Status rms_norm_rows(float const* x, int64_t x_stride, uint16_t const* weight, int64_t T,
                            int n, double eps, float* out, int64_t out_stride,
                            int32_t const* out_rows, uint16_t* out_bf16, int64_t bf16_stride,
                            cudaStream_t stream) {
  if (T == 0) return Status::Ok();
  return launch_kernel("rms_norm_rows", rms_norm_rows_kernel, static_cast<unsigned>(T),
                       kNormThreads, 0, stream, x, x_stride, weight, n, eps, out, out_stride,
                       out_rows, out_bf16, bf16_stride);
}

// dst[0..1] = the pair src[0..1] rotated by position * inv_freq (in double), scaled.
__device__ __forceinline__ void rope_pair(float const* src, float* dst, int32_t position,
                                          double inv_freq, double cos_sin_scale) {
  double const a = static_cast<double>(position) * inv_freq;
  double sn = 0.0, cs = 0.0;
  sincos(a, &sn, &cs);
  cs *= cos_sin_scale;
  sn *= cos_sin_scale;
  double const x0 = src[0], x1 = src[1];
  dst[0] = static_cast<float>(x0 * cs - x1 * sn);
  dst[1] = static_cast<float>(x1 * cs + x0 * sn);
}

static __global__ void silu_mul_bf16_kernel(float const* __restrict__ g, float const* __restrict__ u,
                                            int64_t cols, int64_t stride, int64_t n,
                                            uint16_t* __restrict__ h) {
  await_prior_kernels();
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t const at = (i / cols) * stride + i % cols;
  h[i] = float_to_bf16(silu_times(g[at], u[at]));
}

inline Status silu_mul_bf16(float const* g, float const* u, int64_t rows, int64_t cols,
                            int64_t stride, uint16_t* h, cudaStream_t stream) {
  int64_t const n = rows * cols;
  if (n == 0) return Status::Ok();
  return launch_kernel("silu_mul_bf16", silu_mul_bf16_kernel,
                       static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream, g, u,
                       cols, stride, n, h);
}

// The q_a / kv_a GEMM's output rows to the attention's inputs, in one launch (rms_norm_rows'
// rule and rope_pair's, forward_cuda.cuh's order):
//   q_lora > 0, block t < T:  qa_bf[t, :q_lora] = bf16 rms(qa[t, :q_lora], q_norm)
//   block (q_lora > 0 ? T : 0) + t:  cache row rows[t] = [rms(qa[t, q_lora : q_lora + c],
//       kv_norm) | rope(qa[t, q_lora + c : q_lora + c + 2 pairs], positions[t])] (fp32)
struct MlaLatentRows {
  float const* qa = nullptr;  // [T, stride]
  int64_t stride = 0;
  int64_t tokens = 0;
  int q_lora = 0;                      // 0: no q_a (the q_proj form)
  uint16_t const* q_norm = nullptr;    // [q_lora] bf16
  uint16_t* qa_bf = nullptr;           // [T, q_lora]
  int kv_lora = 0;                     // c
  uint16_t const* kv_norm = nullptr;   // [c] bf16
  float* cache = nullptr;              // rows of cache_stride floats
  int64_t cache_stride = 0;
  int32_t const* rows = nullptr;       // [T] cache row of each token
  int pairs = 0;                       // r / 2
  int32_t const* positions = nullptr;  // [T]
  double const* inv_freq = nullptr;    // [pairs]
  double cos_sin_scale = 1.0;
  double eps = 0.0;
};

static __global__ void __launch_bounds__(kNormThreads) mla_latent_rows_kernel(MlaLatentRows p) {
  int64_t const q_blocks = p.q_lora > 0 ? p.tokens : 0;
  bool const q_block = blockIdx.x < q_blocks;
  NormWeightShare const wv = load_norm_weight(q_block ? p.q_norm : p.kv_norm,
                                              q_block ? p.q_lora : p.kv_lora);
  await_prior_kernels();
  if (q_block) {
    int64_t const t = blockIdx.x;
    rms_norm_row(p.qa + t * p.stride, p.q_norm, wv, p.q_lora, p.eps, nullptr,
                 p.qa_bf + t * p.q_lora);
    return;
  }
  int64_t const t = blockIdx.x - q_blocks;
  float const* in = p.qa + t * p.stride + p.q_lora;
  float* row = p.cache + static_cast<int64_t>(p.rows[t]) * p.cache_stride;
  rms_norm_row(in, p.kv_norm, wv, p.kv_lora, p.eps, row, nullptr);
  for (int k = threadIdx.x; k < p.pairs; k += blockDim.x) {
    rope_pair(in + p.kv_lora + 2 * k, row + p.kv_lora + 2 * k, p.positions[t], p.inv_freq[k],
              p.cos_sin_scale);
  }
}

inline Status mla_latent_rows(MlaLatentRows const& p, cudaStream_t stream) {
  if (p.tokens == 0) return Status::Ok();
  int64_t const blocks = (p.q_lora > 0 ? 2 : 1) * p.tokens;
  return launch_kernel("mla_latent_rows", mla_latent_rows_kernel, static_cast<unsigned>(blocks),
                       kNormThreads, 0, stream, p);
}

// The queries of T tokens after q_b (or q_proj), in one launch: q [T, heads, nope + 2 pairs]
// fp32 -> q_bf [T, heads, nope + 2 pairs] bf16 of the nope parts (the pe parts' bf16 are not
// written) and qabs[t, h, pe_at : pe_at + 2 pairs] (row of qabs_head_stride floats per head,
// heads qabs_head_stride apart, tokens heads * qabs_head_stride) = rope(q_pe, positions[t]).
struct QueryRows {
  float const* q = nullptr;
  uint16_t* q_bf = nullptr;
  float* qabs = nullptr;
  int64_t qabs_head_stride = 0;
  int64_t pe_at = 0;
  int64_t tokens = 0;
  int heads = 0;
  int nope = 0;                        // even
  int pairs = 0;
  int32_t const* positions = nullptr;  // [T]
  double const* inv_freq = nullptr;    // [pairs]
  double cos_sin_scale = 1.0;
};

// Thread i: pair i of the token-major q (a nope pair to bf16, or a pe pair roped).
static __global__ void query_rows_kernel(QueryRows p) {
  await_prior_kernels();
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int const per_head = p.nope / 2 + p.pairs;
  if (i >= p.tokens * p.heads * per_head) return;
  int64_t const th = i / per_head;  // t * heads + h
  int const k = static_cast<int>(i - th * per_head);
  float const* src = p.q + 2 * i;
  if (k < p.nope / 2) {
    p.q_bf[2 * i] = float_to_bf16(src[0]);
    p.q_bf[2 * i + 1] = float_to_bf16(src[1]);
    return;
  }
  int const pr = k - p.nope / 2;
  rope_pair(src, p.qabs + th * p.qabs_head_stride + p.pe_at + 2 * pr, p.positions[th / p.heads],
            p.inv_freq[pr], p.cos_sin_scale);
}

inline Status query_rows(QueryRows const& p, cudaStream_t stream) {
  if (p.nope % 2 != 0) {
    return Status::InvalidArgument("query_rows: nope " + std::to_string(p.nope) +
                                   " is odd (the kernel converts pairs)");
  }
  int64_t const n = p.tokens * p.heads * (p.nope / 2 + p.pairs);
  if (n == 0) return Status::Ok();
  return launch_kernel("query_rows", query_rows_kernel,
                       static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream, p);
}

static __global__ void add_into_kernel(float* __restrict__ x, float const* __restrict__ part,
                                       int64_t n) {
  await_prior_kernels();
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += part[i];
}

inline Status add_into(float* x, float const* part, int64_t n, cudaStream_t stream) {
  if (n == 0) return Status::Ok();
  return launch_kernel("add_into", add_into_kernel,
                       static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream, x, part,
                       n);
}

constexpr int kRouterMaxTokens = 8;
constexpr int kRouterWarps = 8;
constexpr int kRouterEarly = 8;  // float4 of its gate row a thread loads before the wait

// Block e: expert e's row over its 8 warps (thread i takes float4 columns i, i + 256, ...; all
// loads of a 7168-wide row in flight at once), each token's sum per thread in column order, a
// butterfly over each warp, then the warps' sums in warp order: a fixed order.
// kRoute (router_logits_route): then each block counts itself in `arrivals` (after a fence that
// publishes its logits), and the block that arrives last routes the T tokens, warp t token t
// (ops::moe_route_token, the moe_route kernel's rule and code: the same ids and weights), in
// dynamic shared memory, and sets arrivals back to 0 for the next launch.
template <bool kRoute>
__global__ void __launch_bounds__(kRouterWarps * 32)
    router_logits_kernel(float const* __restrict__ x, float const* __restrict__ gate, int T,
                         int64_t E, int64_t H, float* logits,
                         __grid_constant__ ops::MoeRouteParams const route, unsigned* arrivals) {
  __shared__ float partial[kRouterWarps][kRouterMaxTokens];
  int64_t const e = blockIdx.x;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float4 const* g4 = reinterpret_cast<float4 const*>(gate + e * H);
  int64_t const H4 = H / 4;
  // The row's first kRouterEarly float4 per thread (all of a row up to 8192 wide) are loaded
  // before the wait: the gate is a weight, which nothing on the stream writes.
  float4 early[kRouterEarly];
#pragma unroll
  for (int u = 0; u < kRouterEarly; ++u) {
    int64_t const k = threadIdx.x + u * kRouterWarps * 32;
    early[u] = k < H4 ? __ldcs(g4 + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  await_prior_kernels();
  float sum[kRouterMaxTokens] = {};
  auto add = [&](int64_t k, float4 const w) {
#pragma unroll
    for (int t = 0; t < kRouterMaxTokens; ++t) {
      if (t >= T) break;
      float4 const v = __ldg(reinterpret_cast<float4 const*>(x + t * H) + k);
      sum[t] = fmaf(v.x, w.x, fmaf(v.y, w.y, fmaf(v.z, w.z, fmaf(v.w, w.w, sum[t]))));
    }
  };
#pragma unroll
  for (int u = 0; u < kRouterEarly; ++u) {
    int64_t const k = threadIdx.x + u * kRouterWarps * 32;
    if (k < H4) add(k, early[u]);
  }
#pragma unroll 4
  for (int64_t k = threadIdx.x + kRouterEarly * kRouterWarps * 32; k < H4;
       k += kRouterWarps * 32) {
    add(k, __ldcs(g4 + k));
  }
#pragma unroll
  for (int t = 0; t < kRouterMaxTokens; ++t) {
    if (t >= T) break;
    float const v = warp_sum(sum[t]);
    if (lane == 0) partial[warp][t] = v;
  }
  __syncthreads();
  if (threadIdx.x < T) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kRouterWarps; ++w) total += partial[w][threadIdx.x];
    logits[threadIdx.x * E + e] = total;
  }
  if constexpr (kRoute) {
    __shared__ bool last;
    __threadfence();  // this block's logits are visible before its arrival counts
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) + 1u == gridDim.x;
    __syncthreads();
    if (!last) return;
    __threadfence();  // every block's logits, before they are read
    extern __shared__ float route_shared[];  // per token: score [E], b [E], picked [top_k]
    if (warp < T) {
      float* const mine = route_shared + warp * (2 * E + route.top_k);
      ops::moe_route_token(route, warp, mine, mine + E, reinterpret_cast<int32_t*>(mine + 2 * E),
                           lane);
    }
    if (threadIdx.x == 0) *arrivals = 0u;
  }
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
  return launch_kernel("router_logits", router_logits_kernel<false>, static_cast<unsigned>(E),
                       kRouterWarps * 32, 0, stream, x, gate, static_cast<int>(T), E, H, logits,
                       ops::MoeRouteParams{}, static_cast<unsigned*>(nullptr));
}

// The last block's shared memory in router_logits_route: per token score and b [E] and the
// picked ids [top_k].
inline size_t router_route_shared_bytes(int64_t T, int64_t E, int64_t top_k) {
  return static_cast<size_t>(T * (2 * E + top_k)) * sizeof(float);
}
constexpr size_t kRouterRouteMaxShared = 48 * 1024;  // without opting in to more

// Whether router_logits_route takes the shape: router_logits', and the routing's shared memory.
inline bool router_logits_route_fits(int64_t T, int64_t H, float const* x, float const* gate,
                                     int64_t E, int64_t top_k) {
  return router_logits_fits(T, H, x, gate) &&
         router_route_shared_bytes(T, E, top_k) <= kRouterRouteMaxShared;
}

// router_logits then ops::moe_route in one launch: the logits go to `logits` [T, E] (which
// route.logits is set to), route.tokens / experts are T / E; arrivals: one device counter, 0
// before the first launch (each launch leaves it 0). Launches on one counter must not overlap.
inline Status router_logits_route(float const* x, float const* gate, int64_t H, float* logits,
                                  ops::MoeRouteParams route, unsigned* arrivals,
                                  cudaStream_t stream) {
  route.logits = logits;
  SPECDEC_RETURN_IF_ERROR(ops::validate(route));
  int64_t const T = route.tokens, E = route.experts;
  if (!router_logits_route_fits(T, H, x, gate, E, route.top_k) || arrivals == nullptr) {
    return Status::InvalidArgument(
        "router_logits_route: " + std::to_string(T) + " tokens x hidden " + std::to_string(H) +
        ", " + std::to_string(E) + " experts, top-" + std::to_string(route.top_k) +
        (arrivals == nullptr ? ": no arrivals counter"
                             : " (needs T <= " + std::to_string(kRouterMaxTokens) +
                                   ", H % 4 == 0, 16-byte aligned x and gate, T (2 E + top_k) "
                                   "floats of shared memory <= 48 KiB)"));
  }
  return launch_kernel("router_logits_route", router_logits_kernel<true>,
                       static_cast<unsigned>(E), kRouterWarps * 32,
                       router_route_shared_bytes(T, E, route.top_k), stream, x, gate,
                       static_cast<int>(T), E, H, logits, route, arrivals);
}

// An expert-parallel rank holds experts [begin, end): expert id is its local expert id - begin;
// any other is -1, an id ops::moe_experts's kernels skip (the rank holding it adds its share).
__host__ __device__ constexpr int32_t local_expert_id(int32_t id, int64_t begin, int64_t end) {
  return id >= begin && id < end ? static_cast<int32_t>(id - begin) : -1;
}

static __global__ void localize_expert_ids_kernel(int32_t* ids, int64_t n, int64_t begin,
                                                  int64_t end) {
  await_prior_kernels();
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) ids[i] = local_expert_id(ids[i], begin, end);
}

inline Status localize_expert_ids(int32_t* ids, int64_t n, int64_t begin, int64_t end,
                                  cudaStream_t stream) {
  if (n == 0) return Status::Ok();
  return launch_kernel("localize_expert_ids", localize_expert_ids_kernel,
                       static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream, ids, n,
                       begin, end);
}

// One block per row: the max of pack_value_index over the row, then across warps.
constexpr int kArgmaxKeyThreads = 256;

SPECDEC_HD inline uint64_t max_key(uint64_t a, uint64_t b) { return a > b ? a : b; }

static __global__ void __launch_bounds__(kArgmaxKeyThreads)
    row_argmax_keys_kernel(float const* __restrict__ logits, int64_t n, int64_t first,
                           uint64_t* __restrict__ keys) {
  await_prior_kernels();
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
  return launch_kernel("row_argmax_keys", row_argmax_keys_kernel, static_cast<unsigned>(T),
                       kArgmaxKeyThreads, 0, stream, logits, n, first, keys);
}

static __global__ void argmax_of_keys_kernel(uint64_t const* __restrict__ keys, int64_t P,
                                             int64_t T, int32_t* __restrict__ argmax) {
  await_prior_kernels();
  int64_t const t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  uint64_t best = 0;
  for (int64_t q = 0; q < P; ++q) best = max_key(best, keys[q * T + t]);
  argmax[t] = unpack_index(best);
}

inline Status argmax_of_keys(uint64_t const* keys, int64_t P, int64_t T, int32_t* argmax,
                             cudaStream_t stream) {
  if (T == 0) return Status::Ok();
  return launch_kernel("argmax_of_keys", argmax_of_keys_kernel,
                       static_cast<unsigned>(ceil_div<int64_t>(T, 128)), 128, 0, stream, keys, P, T,
                       argmax);
}

}  // namespace specdec::model::kimi::cuda
