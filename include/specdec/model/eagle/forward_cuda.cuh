// The CUDA executor's EAGLE-family draft: forward_cpu.hpp's model, cache semantics, calls and
// errors (its first comment is the definition: both kinds, extend / step, what an entry sees) on
// one GPU.
//   load_draft_cuda_model(dir, target_config, CudaTargetTensors, policy_kind, policy_layers,
//                         policy_what, &model)
//       reads and checks the draft with config.hpp's / weights.hpp's public functions (the CPU
//       loader's checks, not a copy of them) and uploads every weight once as bf16 (F16 / F32
//       tensors are rounded to bf16 on the host, round to nearest even; BF16 copied as stored).
//   CudaTargetTensors / cuda_target_tensors_of(KimiCudaModel)
//       the target's tensors the draft reads, as DEVICE pointers to bf16 (taken, not copied, not
//       owned: they must outlive the draft): embedding [V, Ht] (a draft without
//       embed_tokens.weight), lm_head [V, Ht] and final norm [Ht] + its eps (EAGLE-1/2).
//   DraftCudaCache::create_for(config, max_requests, max_length, max_scratch, &cache)
//       committed K (roped) / V [max_length, nkv * hd] fp32 per request slot and scratch K / V
//       [max_scratch, nkv * hd] per slot, all allocated here (no allocation per call); requests,
//       lengths and the scratch tree (parent, depth per entry) are host metadata.
//       cache.padding_slot(&slot) takes one slot for good for the filler rows of padded calls.
//   draft_extend / draft_step(CudaExecutor{stream}, model, &cache, ...)
//       the CPU calls' arguments and meaning; the big arrays are spans of DEVICE memory:
//       tokens, features [T, F], parent_hidden [B * K, H] in; hidden [.., H], logits [.., Vd]
//       out (fp32, the caller's buffers, sizes exact). requests, counts, parent_scratch (in) and
//       scratch_index (out) stay on the host: the host owns the tree and builds each row's
//       ancestor list from them. draft_extend's DraftPadding and DraftTreeStep::padding run a
//       batch padded with filler rows on the padding slot (a CUDA graph per padded size).
//   draft_tree_step(CudaExecutor{stream}, model, &cache, requests, DraftTreeStep)
//       step s of a proposal whose tree lives on the device (the engine's proposal loop): the
//       rows' parents are the previous step's branch choices next_branch [B * K] (device, as
//       ops::draft_expand writes them), so nothing is read back and the loop can be captured
//       as one CUDA graph. The call's metadata is built on the device by draft_tree_rows
//       (oracle: draft_step's host metadata, which tests/cuda/eagle_draft_cuda.cu compares).
//   draft_device_errors(CudaExecutor, model)
//       the tokens check, which runs on the device (see Errors).
//   reserve_draft_scratch(model, rows, max_chain)
//       sizes the model's per-call scratch up front (else it grows on the first larger call;
//       model.scratch_generation() counts the growths, which move what a captured graph reads).
//
// Per call (n rows; bf16 GEMMs are cuBLAS with fp32 accumulation, so every activation entering
// a GEMM is rounded to bf16, as in kimi/forward_cuda.cuh):
//   tokens checked into a scratch copy (a token outside [0, V) reads row 0, recorded on the device)
//   EAGLE-3    extend: h = fc(bf16(features)) into the residual; step: residual = parent_hidden
//              x = bf16([rms(embed(t), input_layernorm) | rms(h, hidden_norm)]) [n, 2H]
//   EAGLE-1/2  x = fc(bf16([embed(t) | h])) + fc.bias into the residual, h = rms(feature, target
//              final norm) (extend) or parent_hidden (step); x = bf16(residual)
//   qkv = x [q_proj; k_proj; v_proj]^T (one GEMM over the stacked weights) [n, Q + 2W] fp32
//   NeoX rope (angles in double, rope_neox_reference's) on q in place and on k into the cache
//   row of the entry (extend: committed row length + i; step: scratch index); v copied there
//   attention per (row, head): the row's visible entries (committed [0, c) + its ancestor list
//   of scratch indices, self included), GQA, fp32 online softmax with max subtraction
//   residual += bf16(o) o_proj^T; residual += down(silu(gate n) * up n), n = bf16(rms(residual))
//   hidden = residual (extend: the last row of each request, gathered); logits = bf16(rms(hidden,
//   norm)) lm_head^T (EAGLE-3) or bf16(hidden) target lm_head^T (EAGLE-1/2), straight into the
//   caller's logits.
// Versus the CPU executor (fp32 everywhere): the same to bf16 activation rounding
// (tests/cuda/eagle_draft_cuda.cu states the bound); integers (scratch indices, lengths) exact.
//
// Synchronisation: none in draft_extend / draft_step, which queue everything on the stream.
// The host writes the call's int32 metadata (positions, cache rows, slots, visible counts,
// ancestor lists) into a pageable vector and queues one cudaMemcpyAsync of it (the driver stages
// it and returns; it may wait when its staging buffer is busy). Loading, cache creation and
// scratch growth (cudaMalloc / cudaFree) synchronise; draft_device_errors waits for the stream
// (it reads a device word). Calls on one model or cache must be ordered on one stream: the
// scratch and the cache rows are reused by the next call.
//
// Errors (Status naming the function and the numbers, as the CPU executor's): model not loaded,
// cache width not the model's, unknown or repeated request, counts < 1 or not adding up, any span
// of the wrong size, a device span that is not device memory, parent_scratch outside [-1, scratch
// size), a position past max_position_embeddings, the cache's capacity (max_length committed /
// max_scratch scratch entries per request) exceeded; all checked on the host before anything is
// queued, so a failed call changes neither the cache nor the outputs. A CUDA / cuBLAS failure
// returns kCudaError; the outputs are then undefined, the cache bookkeeping unchanged.
// Tokens live on the device, so their range is checked there: a token outside [0, V) is read as
// token 0 (no out-of-bounds read) and the first one is recorded; draft_device_errors reports it
// ("draft_step (cuda): tokens[3] = 600 is outside the target vocabulary [0, 512)") and clears it.
// At load: everything the CPU loader checks, a target tensor the draft needs that is missing or
// not device memory, head_dim > kDraftMaxHeadDim.
//
// Memory: the draft's weights as bf16 (weight_bytes; the target's tensors are not copied), the
// cache 2 x 4 x max_requests x (max_length + max_scratch) x nkv x hd bytes, the scratch (grows
// with the largest call; reserve_draft_scratch sizes it).
//
// Public API (namespace specdec::model::eagle): CudaTargetTensors, cuda_target_tensors_of,
// DraftCudaModel, load_draft_cuda_model, reserve_draft_scratch, DraftCudaCache, draft_extend
// (and its parts: DraftExtendCall, prepare_ / enqueue_ / finish_draft_extend), draft_step,
// DraftTreeStep, check_draft_tree, draft_tree_step, draft_device_errors; kernels in
// eagle::cuda (rope_neox_rows, copy_rows, check_tokens, draft_attention, draft_tree_rows).
#pragma once

#include <cublas_v2.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/convert.cuh"
#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/warp.cuh"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/eagle/config.hpp"
#include "specdec/model/eagle/forward_cpu.hpp"
#include "specdec/model/eagle/weights.hpp"
#include "specdec/model/kimi/forward_cuda.cuh"
#include "specdec/model/kimi/layer_kernels.cuh"
#include "specdec/policy/draft.hpp"

namespace specdec::model::eagle {

// The attention kernel keeps a head in registers (head_dim / 32 floats per lane).
inline constexpr int kDraftMaxHeadDim = 256;

// ---------------------------------------------------------------------------------------------
// Kernels (the CPU rules they follow: forward_cpu.hpp's draft_forward).

namespace cuda {

// rope_neox_reference on [T, heads] vectors of 2 * half floats: in -> out (strided; out row
// out_rows[t] when given), angle position * inv_freq in double; in == out allowed.
struct RopeNeoxRows {
  float const* in = nullptr;  // vector (t, h) at in + t * in_token_stride + h * in_head_stride
  int64_t in_token_stride = 0, in_head_stride = 0;
  float* out = nullptr;  // at out + (out_rows ? out_rows[t] : t) * out_token_stride + h * ...
  int64_t out_token_stride = 0, out_head_stride = 0;
  int32_t const* out_rows = nullptr;
  int64_t tokens = 0;
  int heads = 1;
  int half = 0;                        // head_dim / 2
  int32_t const* positions = nullptr;  // [T]
  double const* inv_freq = nullptr;    // [half]
};

static __global__ void rope_neox_rows_kernel(__grid_constant__ RopeNeoxRows const p) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t const per_token = static_cast<int64_t>(p.heads) * p.half;
  if (i >= p.tokens * per_token) return;
  int64_t const t = i / per_token;
  int const h = static_cast<int>((i % per_token) / p.half), k = static_cast<int>(i % p.half);
  float const* src = p.in + t * p.in_token_stride + h * p.in_head_stride;
  int64_t const orow = p.out_rows ? static_cast<int64_t>(p.out_rows[t]) : t;
  float* dst = p.out + orow * p.out_token_stride + h * p.out_head_stride;
  double const a = static_cast<double>(p.positions[t]) * p.inv_freq[k];
  double sn = 0.0, cs = 0.0;
  sincos(a, &sn, &cs);
  double const x1 = src[k], x2 = src[k + p.half];
  dst[k] = static_cast<float>(x1 * cs - x2 * sn);
  dst[k + p.half] = static_cast<float>(x2 * cs + x1 * sn);
}

inline Status rope_neox_rows(RopeNeoxRows const& p, cudaStream_t stream) {
  int64_t const n = p.tokens * p.heads * p.half;
  if (n == 0) return Status::Ok();
  rope_neox_rows_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(p);
  return cuda_launch_status("rope_neox_rows");
}

// dst row (dst_rows ? dst_rows[r] : r) = src row (src_rows ? src_rows[r] : r), `width` values,
// for r < rows; In / Out float (fp32) or uint16_t (bf16, rounded to nearest even on the way in).
// src_stride 0 broadcasts one row (a bias).
template <class In, class Out>
struct CopyRows {
  In const* src = nullptr;
  int64_t src_stride = 0;
  int32_t const* src_rows = nullptr;
  Out* dst = nullptr;
  int64_t dst_stride = 0;
  int32_t const* dst_rows = nullptr;
  int64_t rows = 0, width = 0;
};

__device__ __forceinline__ float load_value(float x) { return x; }
__device__ __forceinline__ float load_value(uint16_t x) { return bf16_to_float(x); }
__device__ __forceinline__ void store_value(float v, float* y) { *y = v; }
__device__ __forceinline__ void store_value(float v, uint16_t* y) { *y = float_to_bf16(v); }

template <class In, class Out>
__global__ void copy_rows_kernel(__grid_constant__ CopyRows<In, Out> const p) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.rows * p.width) return;
  int64_t const r = i / p.width, j = i % p.width;
  int64_t const sr = p.src_rows ? static_cast<int64_t>(p.src_rows[r]) : r;
  int64_t const dr = p.dst_rows ? static_cast<int64_t>(p.dst_rows[r]) : r;
  store_value(load_value(p.src[sr * p.src_stride + j]), p.dst + dr * p.dst_stride + j);
}

template <class In, class Out>
Status copy_rows(CopyRows<In, Out> const& p, cudaStream_t stream) {
  int64_t const n = p.rows * p.width;
  if (n == 0) return Status::Ok();
  copy_rows_kernel<In, Out>
      <<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(p);
  return cuda_launch_status("copy_rows");
}

// out[i] = tokens[i] when in [0, vocab), else 0, and then the first such i is recorded:
// record = {call, i, tokens[i]} (record[0] 0 = nothing recorded; the first writer wins).
static __global__ void check_tokens_kernel(int32_t const* __restrict__ tokens, int64_t n,
                                           int32_t vocab, int32_t call, int32_t* __restrict__ out,
                                           int32_t* record) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int32_t const t = tokens[i];
  bool const ok = t >= 0 && t < vocab;
  out[i] = ok ? t : 0;
  if (!ok && atomicCAS(record, 0, call) == 0) {
    record[1] = static_cast<int32_t>(i);
    record[2] = t;
  }
}

inline Status check_tokens(int32_t const* tokens, int64_t n, int32_t vocab, int32_t call,
                           int32_t* out, int32_t* record, cudaStream_t stream) {
  if (n == 0) return Status::Ok();
  check_tokens_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(
      tokens, n, vocab, call, out, record);
  return cuda_launch_status("check_tokens");
}

// Attention of one draft layer over the cache (forward_cpu.hpp: o_h = sum_u softmax_u(q_h .
// k_{u,g(h)} * scale) v_{u,g(h)}). Row r sees committed rows [0, committed[r]) of slot[r] and the
// scratch entries anc[anc_begin[r] .. anc_begin[r + 1]) of that slot (root first, self last).
struct DraftAttentionParams {
  float const* q = nullptr;  // row r, head h at q + r * q_stride + h * head_dim (roped)
  int64_t q_stride = 0;
  float const* k = nullptr;  // committed [slots * max_length, kv_heads * head_dim] (roped)
  float const* v = nullptr;
  float const* scratch_k = nullptr;  // [slots * max_scratch, kv_heads * head_dim]
  float const* scratch_v = nullptr;
  int64_t max_length = 0, max_scratch = 0;
  int32_t const* slot = nullptr;       // [rows]
  int32_t const* committed = nullptr;  // [rows]
  int32_t const* anc_begin = nullptr;  // [rows + 1]
  int32_t const* anc = nullptr;        // scratch indices
  int rows = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0.0f;    // 1 / sqrt(head_dim)
  float* out = nullptr;  // [rows, heads * head_dim]
};

// Blocks: one thread-block cluster of `split` blocks per (row, head) (split 1: one block), the
// row's visible entries cut into `split` equal ranges, one per block. A block's kAttentionWarps
// warps take kAttentionUnroll entries at a time each (lanes split head_dim, the dot products
// reduced over the warp), so a warp has that many K and V rows in flight, and keep an online
// softmax (running max, sum, output). The warps' states merge in the block, the blocks' states
// in the cluster's rank 0 through distributed shared memory. A row's entries are a serial chain
// of loads per warp, so a long context needs the split: at 1024 entries one block of 4 warps
// made each warp wait on 256 dependent rounds of memory latency.
constexpr int kAttentionWarps = 4;
constexpr int kDimsPerLane = kDraftMaxHeadDim / 32;
constexpr int kAttentionUnroll = 4;
constexpr int kAttentionMaxSplit = 8;          // the portable cluster size
constexpr int64_t kAttentionTargetBlocks = 1024;  // about 8 blocks per SM on an H200
constexpr int64_t kAttentionMinEntries = 64;   // per block, before a row is split further

// kDims = dimensions per lane: head_dim <= 32 * kDims.
template <int kDims>
__global__ void __launch_bounds__(kAttentionWarps * 32)
    draft_attention_kernel(__grid_constant__ DraftAttentionParams const p, int split) {
  __shared__ float s_max[kAttentionWarps], s_sum[kAttentionWarps];
  __shared__ float s_out[kAttentionWarps][32 * kDims];
  __shared__ float s_block_max, s_block_sum;
  int const r = static_cast<int>(blockIdx.x) / split, rank = static_cast<int>(blockIdx.x) % split;
  int const h = blockIdx.y;
  int const warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  int const hd = p.head_dim;
  int64_t const W = static_cast<int64_t>(p.kv_heads) * hd;
  int64_t const col = static_cast<int64_t>(h / (p.heads / p.kv_heads)) * hd;
  float const* qr = p.q + r * p.q_stride + static_cast<int64_t>(h) * hd;
  float q[kDims], acc[kDims];
#pragma unroll
  for (int j = 0; j < kDims; ++j) {
    int const d = lane + 32 * j;
    q[j] = d < hd ? qr[d] : 0.0f;
    acc[j] = 0.0f;
  }
  int64_t const slot = p.slot[r];
  int const committed = p.committed[r], a0 = p.anc_begin[r];
  int const total = committed + (p.anc_begin[r + 1] - a0);
  int const per_block = (total + split - 1) / split;
  int const begin = min(total, rank * per_block), end = min(total, begin + per_block);
  float m = -INFINITY, l = 0.0f;
  for (int u0 = begin + warp * kAttentionUnroll; u0 < end;
       u0 += kAttentionWarps * kAttentionUnroll) {
    float kv[kAttentionUnroll][kDims], vv[kAttentionUnroll][kDims], s[kAttentionUnroll];
#pragma unroll
    for (int i = 0; i < kAttentionUnroll; ++i) {
      int const u = u0 + i;
      bool const live = u < end;
      int64_t const row = !live           ? 0
                          : u < committed ? slot * p.max_length + u
                                          : slot * p.max_scratch + p.anc[a0 + (u - committed)];
      float const* kr = (u < committed ? p.k : p.scratch_k) + row * W + col;
      float const* vr = (u < committed ? p.v : p.scratch_v) + row * W + col;
#pragma unroll
      for (int j = 0; j < kDims; ++j) {
        int const d = lane + 32 * j;
        bool const in = live && d < hd;
        kv[i][j] = in ? kr[d] : 0.0f;
        vv[i][j] = in ? vr[d] : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kAttentionUnroll; ++i) {
      s[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < kDims; ++j) s[i] += q[j] * kv[i][j];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
      for (int i = 0; i < kAttentionUnroll; ++i) {
        s[i] += __shfl_xor_sync(0xffffffffu, s[i], offset);
      }
    }
    float m_new = m;
#pragma unroll
    for (int i = 0; i < kAttentionUnroll; ++i) {
      s[i] = u0 + i < end ? s[i] * p.scale : -INFINITY;
      m_new = fmaxf(m_new, s[i]);
    }
    float const keep = expf(m - m_new);  // 0 for the first entries (m = -inf)
    l *= keep;
#pragma unroll
    for (int j = 0; j < kDims; ++j) acc[j] *= keep;
#pragma unroll
    for (int i = 0; i < kAttentionUnroll; ++i) {
      float const e = expf(s[i] - m_new);  // 0 past the end (s = -inf)
      l += e;
#pragma unroll
      for (int j = 0; j < kDims; ++j) acc[j] += e * vv[i][j];
    }
    m = m_new;
  }
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kDims; ++j) s_out[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  // Warp 0 merges the block's warps into (mm, sum, o); its lanes keep their own dimensions.
  float mm = -INFINITY, sum = 0.0f;
  float o[kDims] = {};
  if (warp == 0) {
    for (int w = 0; w < kAttentionWarps; ++w) mm = fmaxf(mm, s_max[w]);
    for (int w = 0; w < kAttentionWarps; ++w) {
      if (s_sum[w] == 0.0f) continue;  // a warp that saw no entry
      float const c = expf(s_max[w] - mm);
      sum += s_sum[w] * c;
#pragma unroll
      for (int j = 0; j < kDims; ++j) o[j] += s_out[w][lane + 32 * j] * c;
    }
  }
  if (split > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __syncthreads();  // the block's state goes into row 0 of s_out after the merge read it
    if (warp == 0) {
      if (lane == 0) {
        s_block_max = mm;
        s_block_sum = sum;
      }
#pragma unroll
      for (int j = 0; j < kDims; ++j) s_out[0][lane + 32 * j] = o[j];
    }
    cluster.sync();  // every block's state is written
    if (rank == 0 && warp == 0) {
      for (int b = 1; b < split; ++b) {
        float const bsum = *cluster.map_shared_rank(&s_block_sum, b);
        if (bsum == 0.0f) continue;  // a block whose range was empty
        float const bmax = *cluster.map_shared_rank(&s_block_max, b);
        float const* bout = cluster.map_shared_rank(&s_out[0][0], b);
        float const mx = fmaxf(mm, bmax);
        float const c_own = expf(mm - mx), c_other = expf(bmax - mx);
        sum = sum * c_own + bsum * c_other;
#pragma unroll
        for (int j = 0; j < kDims; ++j) o[j] = o[j] * c_own + bout[lane + 32 * j] * c_other;
        mm = mx;
      }
    }
    cluster.sync();  // no block leaves while rank 0 still reads its shared memory
#else
    __trap();  // the launcher only splits rows on devices with clusters (sm_90+)
#endif
  }
  if (rank != 0 || warp != 0) return;
  float* orow = p.out + static_cast<int64_t>(r) * p.heads * hd + static_cast<int64_t>(h) * hd;
#pragma unroll
  for (int j = 0; j < kDims; ++j) {
    int const d = lane + 32 * j;
    if (d < hd) orow[d] = o[j] / sum;
  }
}

// Blocks per (row, head): powers of two up to kAttentionMaxSplit while the grid is small and
// the longest visible range (max_entries = the cache's max_length + max_scratch) is long. Fixed
// by the call's shape, not by its lengths, so a captured graph serves every length.
inline int draft_attention_split(int64_t rows, int heads, int64_t max_entries, bool clusters) {
  if (!clusters) return 1;
  int split = 1;
  while (split < kAttentionMaxSplit && rows * heads * split * 2 <= kAttentionTargetBlocks &&
         max_entries >= kAttentionMinEntries * split * 2) {
    split *= 2;
  }
  return split;
}

inline Status draft_attention(DraftAttentionParams const& p, cudaStream_t stream) {
  if (p.rows == 0) return Status::Ok();
  bool clusters = false;
  SPECDEC_RETURN_IF_ERROR(current_device_has_clusters(clusters));
  int const split =
      draft_attention_split(p.rows, p.heads, p.max_length + p.max_scratch, clusters);
  dim3 const grid(static_cast<unsigned>(p.rows * split), static_cast<unsigned>(p.heads));
  auto const kernel =
      p.head_dim <= 128 ? draft_attention_kernel<4> : draft_attention_kernel<kDimsPerLane>;
  return launch_cluster_kernel("draft_attention", kernel, grid, kAttentionWarps * 32, 0, stream,
                               split, ClusterLaunch::kInOrder, p, split);
}

// The metadata of proposal step `step` >= 1 when the proposal's tree lives on the device
// (draft_tree_step): row r = b * K + j continues branch next_branch[r] of the previous step
// (request b's branch index there; 0 at step 1, whose only branch is the committed prefix) as
// scratch entry e = (step - 1) * K + j of slot slots[b], at depth step - 1, so
//   parent          -1 at step 1, else (step - 2) * K + next_branch[r]; kept in
//                   tree_parent[slot * max_scratch + e] for the later steps' chains
//   positions[r]    lengths[b] + step - 1        kv_rows[r]   slot * max_scratch + e
//   slot[r]         slots[b]                     committed[r] lengths[b]
//   anc_begin[r]    r * step (anc_begin[rows] = rows * step), anc[r * step ..] the chain of
//                   scratch indices root first, self (e) last
//   source_rows[r]  the row of the parent's hidden: slots[b] at step 1 (the slot's last extend
//                   row), else b * K + next_branch[r] (the previous step's output row)
// draft_step builds the same metadata on the host from its parent_scratch (the oracle).
struct DraftTreeRowsParams {
  int32_t const* slots = nullptr;        // [B]
  int32_t const* lengths = nullptr;      // [B] committed entries
  int32_t const* next_branch = nullptr;  // [B * K], read at step >= 2
  int32_t* tree_parent = nullptr;        // [slots * max_scratch]
  int64_t max_scratch = 0;
  int rows = 0, branches = 0, step = 0;  // rows = B * K
  int32_t *positions = nullptr, *kv_rows = nullptr, *slot = nullptr, *committed = nullptr,
          *anc_begin = nullptr, *anc = nullptr, *source_rows = nullptr;
};

static __global__ void draft_tree_rows_kernel(__grid_constant__ DraftTreeRowsParams const p) {
  int const r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r > p.rows) return;
  int const s = p.step, K = p.branches;
  if (r == p.rows) {
    p.anc_begin[r] = r * s;
    return;
  }
  int const b = r / K, j = r % K;
  int32_t const slot = p.slots[b], length = p.lengths[b];
  int32_t const branch = s == 1 ? 0 : p.next_branch[r];
  int32_t const parent = s == 1 ? -1 : (s - 2) * K + branch;
  int32_t const entry = (s - 1) * K + j;
  int32_t* const tree = p.tree_parent + static_cast<int64_t>(slot) * p.max_scratch;
  tree[entry] = parent;
  p.positions[r] = length + s - 1;
  p.kv_rows[r] = static_cast<int32_t>(slot * p.max_scratch + entry);
  p.slot[r] = slot;
  p.committed[r] = length;
  p.anc_begin[r] = r * s;
  int32_t* const chain = p.anc + static_cast<int64_t>(r) * s;
  chain[s - 1] = entry;
  int32_t a = parent;
  for (int d = s - 2; d >= 0; --d) {  // earlier steps' entries, written by earlier launches
    chain[d] = a;
    a = tree[a];
  }
  p.source_rows[r] = s == 1 ? slot : b * K + branch;
}

inline Status draft_tree_rows(DraftTreeRowsParams const& p, cudaStream_t stream) {
  int const threads = 128, blocks = (p.rows + 1 + threads - 1) / threads;
  draft_tree_rows_kernel<<<blocks, threads, 0, stream>>>(p);
  return cuda_launch_status("draft_tree_rows");
}

}  // namespace cuda

// ---------------------------------------------------------------------------------------------
// Model.

// The target's tensors a draft reads: DEVICE pointers to bf16, not owned (they must outlive the
// draft). embedding: a draft without embed_tokens.weight; lm_head, final_norm (+ eps): EAGLE-1/2.
struct CudaTargetTensors {
  uint16_t const* embedding = nullptr;   // [V, Ht]
  uint16_t const* lm_head = nullptr;     // [V, Ht]
  uint16_t const* final_norm = nullptr;  // [Ht]
  double final_norm_eps = 0.0;
};

inline CudaTargetTensors cuda_target_tensors_of(kimi::KimiCudaModel const& m) {
  // lm_head null when the target holds a vocabulary slice (tensor parallel, not replicate_lm_head)
  bool const whole = m.vocab.size() == m.config.vocab_size;
  return {m.embed_tokens, whole ? m.lm_head : nullptr, m.norm, m.config.rms_norm_eps};
}

class DraftCudaModel;
namespace detail {
inline int32_t* draft_error_record(DraftCudaModel& m);
}  // namespace detail

// Device weights (bf16) and the per-call scratch of one draft on one GPU. Move-only.
class DraftCudaModel {
 public:
  DraftConfig config;
  uint16_t const* fc = nullptr;                        // [H, fc_in_width]
  uint16_t const* fc_bias = nullptr;                   // [H] or null (EAGLE-1/2 only)
  uint16_t const* hidden_norm = nullptr;               // [H] (EAGLE-3)
  uint16_t const* input_layernorm = nullptr;           // [H] (EAGLE-3)
  uint16_t const* norm = nullptr;                      // [H] (EAGLE-3)
  uint16_t const* post_attention_layernorm = nullptr;  // [H]
  // [Q + 2W, A]: q_proj, k_proj, v_proj stacked (A = attention_in_width): one GEMM.
  uint16_t const* qkv_proj = nullptr;
  uint16_t const* o_proj = nullptr;     // [H, Q]
  uint16_t const* gate_proj = nullptr;  // [I, H]
  uint16_t const* up_proj = nullptr;    // [I, H]
  uint16_t const* down_proj = nullptr;  // [H, I]
  uint16_t const* lm_head = nullptr;  // [Vd, H]: the draft's (EAGLE-3) or the target's (EAGLE-1/2)
  uint16_t const* embedding = nullptr;  // [V, H]: the draft's embed_tokens or the target's
  bool has_embedding = false;           // the draft has its own embed_tokens.weight
  CudaTargetTensors target;             // what this draft reads of the target (NOT owned)
  std::vector<int> feature_layers;      // config.feature_layers()
  std::vector<int64_t> d2t;             // [Vd] host: target id = d + d2t[d]
  std::vector<uint8_t> t2d;             // [V] host
  int64_t const* d2t_device = nullptr;  // [Vd] (ops::draft_expand's d2t)
  std::vector<double> inv_freq;         // [hd / 2] host
  double const* inv_freq_device = nullptr;
  uint64_t weight_bytes = 0;  // device bytes of the draft's own weights

  DraftCudaModel() = default;
  DraftCudaModel(DraftCudaModel&&) = default;
  DraftCudaModel& operator=(DraftCudaModel&&) = default;

  int64_t hidden() const { return config.hidden_size; }
  int64_t vocab() const { return config.vocab_size; }
  int64_t draft_vocab() const { return config.draft_vocab_size; }
  int64_t feature_width() const { return config.feature_width(); }
  int64_t kv_width() const { return config.kv_width(); }
  DraftKind kind() const { return config.kind; }
  std::span<int const> layers() const { return config.layers; }
  int64_t draft_to_target(int64_t d) const { return d + d2t[static_cast<size_t>(d)]; }
  bool loaded() const { return cublas_.get() != nullptr; }
  cublasHandle_t cublas() const { return cublas_.get(); }
  // How often the per-call scratch has grown (moved): a CUDA graph captured over the draft's
  // calls is valid while this stays the same.
  uint64_t scratch_generation() const { return scratch_generation_; }
  // The engine's per-step draft work (engine/spec_engine.hpp: the proposal, one graph per batch
  // size, and the extend after a verify, one per batch size and entry count; with a graph
  // ladder one of each per ladder size) kept as CUDA graphs, up to this many of each (0:
  // launched from the host), and how many runs replayed one so far.
  size_t step_graphs = 0;
  int64_t graph_replays = 0;
  // Given a graph ladder: the engine's proposals and extends after a verify that ran padded
  // (filler requests or entries), and that ran above the ladder (eagerly).
  int64_t padded_calls = 0, above_ladder_calls = 0;
  // The engine's proposals left on the device (its device-resident step) and those read back
  // to the host (a host wait inside the step).
  int64_t device_proposals = 0, host_proposals = 0;

  // Scratch of one call over n rows (see reserve_draft_scratch).
  struct Scratch {
    int32_t* tokens;  // [n] checked copy of the call's tokens
    int32_t* meta;    // the call's int32 metadata (detail::RowsMeta)
    float *residual, *embed, *qkv, *attn, *gate, *up;
    uint16_t *in_bf, *x_bf, *o_bf, *h_bf;
  };

 private:
  kimi::CublasHandle cublas_;  // its workspace set once: no allocation in a captured proposal
  DeviceBuffer<uint8_t> arena_;  // the weights, d2t, inv_freq, the error record
  DeviceBuffer<uint8_t> scratch_arena_;
  size_t scratch_bytes_ = 0;
  uint64_t scratch_generation_ = 0;
  int32_t* error_record_ = nullptr;  // {call (0 none, 1 extend, 2 step), index, token, 0}

  friend Status load_draft_cuda_model(std::string const&, io::DeepseekV3Config const&,
                                      CudaTargetTensors const&, DraftKind, std::span<int const>,
                                      std::string_view, DraftCudaModel*);
  friend Status draft_scratch(DraftCudaModel&, int64_t, int64_t, Scratch*);
  friend Status draft_device_errors(CudaExecutor, DraftCudaModel&);
  friend int32_t* detail::draft_error_record(DraftCudaModel&);
};

namespace detail {

inline int32_t* draft_error_record(DraftCudaModel& m) { return m.error_record_; }

inline Status check_device_memory(std::string const& fn, std::string const& what, void const* p) {
  cudaPointerAttributes a{};
  cudaError_t const err = cudaPointerGetAttributes(&a, p);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: not a sticky error
    return Status::InvalidArgument(fn + what + " is not device memory (cudaPointerGetAttributes: " +
                                   cudaGetErrorName(err) + ")");
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
    return Status::InvalidArgument(fn + what + " is not device memory (" +
                                   (a.type == cudaMemoryTypeHost ? "pinned host" : "host") +
                                   " memory): the CUDA executor reads device memory here");
  }
  return Status::Ok();
}

inline Status load_cuda_impl(std::string const& dir, io::DeepseekV3Config const& target,
                             CudaTargetTensors const& tt, DraftKind policy_kind,
                             std::span<int const> policy_layers, std::string_view policy_what,
                             DraftConfig* config, io::SafetensorsCheckpoint* ckpt,
                             DraftWeights* w) {
  DraftConfig& c = *config;
  SPECDEC_RETURN_IF_ERROR(read_draft_config(dir, target.num_hidden_layers, &c));
  SPECDEC_RETURN_IF_ERROR(check_draft_config_fits(c, policy_kind, policy_layers, policy_what));
  SPECDEC_RETURN_IF_ERROR(check_draft_target(c, target));
  if (!c.eagle3() &&
      (tt.lm_head == nullptr || tt.final_norm == nullptr || !(tt.final_norm_eps > 0.0))) {
    return Status::InvalidArgument(
        dir +
        ": an EAGLE-1/2 draft reads the target's lm_head and final norm (with its eps > 0; a "
        "tensor-parallel target holds its whole lm_head only with TpShard::replicate_lm_head); "
        "pass them in CudaTargetTensors (cuda_target_tensors_of)");
  }
  std::pair<uint16_t const*, char const*> const given[] = {{tt.embedding, "target embedding"},
                                                           {tt.lm_head, "target lm_head"},
                                                           {tt.final_norm, "target final norm"}};
  for (auto const& [p, what] : given) {
    if (p != nullptr) SPECDEC_RETURN_IF_ERROR(check_device_memory(dir + ": ", what, p));
  }
  if (c.head_dim > kDraftMaxHeadDim) {
    return Status::Unsupported(c.source + ": head_dim " + std::to_string(c.head_dim) + " > " +
                               std::to_string(kDraftMaxHeadDim) +
                               ", the CUDA draft attention's limit (kDraftMaxHeadDim)");
  }
  SPECDEC_RETURN_IF_ERROR(io::SafetensorsCheckpoint::open(dir, ckpt));
  return load_draft_weights(*ckpt, c, tt.embedding != nullptr, w);
}

}  // namespace detail

// Reads the draft in `dir` for the target `target` under the policy (`policy_kind`,
// `policy_layers`, `policy_what`), with the checks load_draft_cpu_model runs (read_draft_config,
// check_draft_config_fits, check_draft_target, load_draft_weights), and uploads it (one
// allocation). `target_tensors`: device pointers (cuda_target_tensors_of(KimiCudaModel)); the
// model keeps those it needs.
inline Status load_draft_cuda_model(std::string const& dir, io::DeepseekV3Config const& target,
                                    CudaTargetTensors const& target_tensors, DraftKind policy_kind,
                                    std::span<int const> policy_layers,
                                    std::string_view policy_what, DraftCudaModel* out) {
  std::string const fn = "load_draft_cuda_model: ";
  if (out == nullptr) return Status::InvalidArgument(fn + "out is null");
  return kimi::detail::cpu_guard(fn, [&]() -> Status {
    DraftConfig c;
    io::SafetensorsCheckpoint ckpt;
    DraftWeights w;
    SPECDEC_RETURN_IF_ERROR(detail::load_cuda_impl(dir, target, target_tensors, policy_kind,
                                                   policy_layers, policy_what, &c, &ckpt, &w)
                                .prefixed(fn));
    int64_t const Q = c.q_width(), W = c.kv_width(), A = c.attention_in_width();
    DraftCudaModel m;
    m.config = c;
    m.target = target_tensors;
    m.feature_layers = c.feature_layers();
    m.inv_freq = rope_neox_inv_freq(c.head_dim, c.rope_theta);
    m.has_embedding = w.has_embedding;

    // Two passes over one walk (kimi's loader): sizing (carver.base null), then the copies.
    struct Pending {
      void* dst;
      void const* src;
      size_t bytes;
    };
    std::vector<Pending> copies;
    std::vector<std::vector<uint16_t>> keep;  // bf16 conversions of F16 / F32 tensors
    kimi::detail::DeviceCarver carver;
    // The bf16 values of `v` at `dst` (pass 2 only).
    auto put = [&](TensorView const& v, uint16_t* dst) -> Status {
      if (carver.base == nullptr) return Status::Ok();
      if (v.dtype == Dtype::kBF16) {
        copies.push_back({dst, v.bytes.data(), v.bytes.size()});
        return Status::Ok();
      }
      std::vector<float> f;
      SPECDEC_RETURN_IF_ERROR(detail::floats_of(v, &f).prefixed(fn));
      std::vector<uint16_t> b(f.size());
      for (size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
      keep.push_back(std::move(b));
      copies.push_back({dst, keep.back().data(), keep.back().size() * 2});
      return Status::Ok();
    };
    auto tensor = [&](TensorView const& v, uint16_t const** dst) -> Status {
      uint16_t* d = carver.take<uint16_t>(v.numel());
      *dst = d;
      return put(v, d);
    };
    auto walk = [&]() -> Status {
      SPECDEC_RETURN_IF_ERROR(tensor(w.fc, &m.fc));
      if (w.has_fc_bias) SPECDEC_RETURN_IF_ERROR(tensor(w.fc_bias, &m.fc_bias));
      if (c.eagle3()) {
        SPECDEC_RETURN_IF_ERROR(tensor(w.hidden_norm, &m.hidden_norm));
        SPECDEC_RETURN_IF_ERROR(tensor(w.input_layernorm, &m.input_layernorm));
        SPECDEC_RETURN_IF_ERROR(tensor(w.norm, &m.norm));
        SPECDEC_RETURN_IF_ERROR(tensor(w.lm_head, &m.lm_head));
      } else {
        m.lm_head = target_tensors.lm_head;
      }
      SPECDEC_RETURN_IF_ERROR(tensor(w.post_attention_layernorm, &m.post_attention_layernorm));
      uint16_t* qkv = carver.take<uint16_t>((Q + 2 * W) * A);
      m.qkv_proj = qkv;
      SPECDEC_RETURN_IF_ERROR(put(w.q_proj, qkv));
      SPECDEC_RETURN_IF_ERROR(put(w.k_proj, qkv ? qkv + Q * A : nullptr));
      SPECDEC_RETURN_IF_ERROR(put(w.v_proj, qkv ? qkv + (Q + W) * A : nullptr));
      SPECDEC_RETURN_IF_ERROR(tensor(w.o_proj, &m.o_proj));
      SPECDEC_RETURN_IF_ERROR(tensor(w.gate_proj, &m.gate_proj));
      SPECDEC_RETURN_IF_ERROR(tensor(w.up_proj, &m.up_proj));
      SPECDEC_RETURN_IF_ERROR(tensor(w.down_proj, &m.down_proj));
      if (w.has_embedding) {
        SPECDEC_RETURN_IF_ERROR(tensor(w.embed_tokens, &m.embedding));
      } else {
        m.embedding = target_tensors.embedding;
      }
      int64_t* d2t = carver.take<int64_t>(static_cast<int64_t>(w.d2t.size()));
      if (carver.base) copies.push_back({d2t, w.d2t.data(), w.d2t.size() * 8});
      m.d2t_device = d2t;
      double* inv = carver.take<double>(static_cast<int64_t>(m.inv_freq.size()));
      if (carver.base) copies.push_back({inv, m.inv_freq.data(), m.inv_freq.size() * 8});
      m.inv_freq_device = inv;
      m.error_record_ = carver.take<int32_t>(4);
      return Status::Ok();
    };
    SPECDEC_RETURN_IF_ERROR(walk());  // sizing
    m.arena_ = DeviceBuffer<uint8_t>(carver.used);
    if (m.arena_.data() == nullptr) {
      return Status::CudaError(fn + dir + ": cudaMalloc of " + std::to_string(carver.used) +
                               " bytes of draft weights failed");
    }
    m.weight_bytes = carver.used;
    carver = kimi::detail::DeviceCarver{m.arena_.data(), 0};
    SPECDEC_RETURN_IF_ERROR(walk());  // the device addresses, and the copies to make
    for (Pending const& cp : copies) {
      SPECDEC_CUDA_TRY(cudaMemcpy(cp.dst, cp.src, cp.bytes, cudaMemcpyHostToDevice));
    }
    SPECDEC_CUDA_TRY(cudaMemset(m.error_record_, 0, 4 * sizeof(int32_t)));
    m.d2t = std::move(w.d2t);
    m.t2d = std::move(w.t2d);
    SPECDEC_RETURN_IF_ERROR(kimi::CublasHandle::create(fn, &m.cublas_));
    *out = std::move(m);
    return Status::Ok();
  });
}

// (The calls' internal step.) Makes *s point at scratch for a call of n rows and `meta_ints` int32
// metadata values; grows the model's scratch (cudaFree + cudaMalloc: synchronising) when it is too
// small, never shrinks it.
inline Status draft_scratch(DraftCudaModel& m, int64_t n, int64_t meta_ints,
                            DraftCudaModel::Scratch* s) {
  DraftConfig const& c = m.config;
  int64_t const H = c.hidden_size, Q = c.q_width(), W = c.kv_width(), I = c.intermediate_size;
  int64_t const in_width = std::max(c.feature_width(), 2 * H);
  auto carve = [&](kimi::detail::DeviceCarver& cv) {
    s->tokens = cv.take<int32_t>(n);
    s->meta = cv.take<int32_t>(meta_ints);
    s->residual = cv.take<float>(n * H);
    s->embed = cv.take<float>(n * H);
    s->qkv = cv.take<float>(n * (Q + 2 * W));
    s->attn = cv.take<float>(n * Q);
    s->gate = cv.take<float>(n * I);
    s->up = cv.take<float>(n * I);
    s->in_bf = cv.take<uint16_t>(n * in_width);
    s->x_bf = cv.take<uint16_t>(n * H);
    s->o_bf = cv.take<uint16_t>(n * Q);
    s->h_bf = cv.take<uint16_t>(n * I);
  };
  kimi::detail::DeviceCarver sizing;
  carve(sizing);
  bool moved = false;
  Status const grown = kimi::detail::grow_scratch(&m.scratch_arena_, &m.scratch_bytes_,
                                                  sizing.used, "draft forward (cuda)", &moved);
  if (moved) ++m.scratch_generation_;
  SPECDEC_RETURN_IF_ERROR(grown);
  kimi::detail::DeviceCarver real{m.scratch_arena_.data(), 0};
  carve(real);
  return Status::Ok();
}

namespace detail {

// int32 metadata values of a call of n rows over B requests with `ancestors` ancestor-list
// entries in all (the layout of RowsMeta).
inline int64_t meta_ints(int64_t n, int64_t B, int64_t ancestors) {
  return 6 * n + 1 + B + ancestors;
}

}  // namespace detail

// Sizes the model's scratch for calls of up to `rows` rows (an extend's sum of counts, or a
// step's batch x branches) whose scratch entries have ancestor chains (self included) of at most
// `max_chain` entries (the number of draft steps of a proposal), so that later calls allocate
// nothing.
inline Status reserve_draft_scratch(DraftCudaModel& model, int64_t rows, int64_t max_chain) {
  if (!model.loaded()) {
    return Status::InvalidArgument(
        "reserve_draft_scratch: the model is not loaded (load_draft_cuda_model)");
  }
  if (rows < 1 || max_chain < 1) {
    return Status::InvalidArgument("reserve_draft_scratch: rows " + std::to_string(rows) +
                                   " and max_chain " + std::to_string(max_chain) + " must be >= 1");
  }
  DraftCudaModel::Scratch s{};
  return draft_scratch(model, rows, detail::meta_ints(rows, rows, rows * max_chain), &s);
}

// ---------------------------------------------------------------------------------------------
// Cache.

// Host metadata of one request of a DraftCudaCache (its slot's rows: committed [0, length),
// scratch [0, scratch_size)).
struct DraftCudaSequence {
  int slot = 0;
  int64_t length = 0;
  std::vector<int32_t> scratch_parent;  // [S]: -1 or an earlier scratch index
  std::vector<int32_t> scratch_depth;   // [S]: position = length + depth
  int64_t scratch_size() const { return static_cast<int64_t>(scratch_parent.size()); }
  void clear_scratch() {
    scratch_parent.clear();
    scratch_depth.clear();
  }
};

// Device K / V of the draft for up to max_requests requests (one slot each): committed entries
// [max_length] and scratch entries [max_scratch] per slot, allocated at creation; the requests,
// their lengths and their scratch trees (parent, depth of every entry) are host metadata.
// Move-only.
class DraftCudaCache : public DraftRequests<DraftCudaSequence> {
 public:
  using Sequence = DraftCudaSequence;
  DraftCudaCache() : DraftRequests("DraftCudaCache") {}

  // Entries of kv_width = nkv * hd floats (K and V each), zeroed.
  static Status create(int64_t kv_width, int max_requests, int64_t max_length, int64_t max_scratch,
                       DraftCudaCache* out) {
    std::string const fn = "DraftCudaCache::create: ";
    if (out == nullptr) return Status::InvalidArgument(fn + "out is null");
    if (kv_width < 1 || max_requests < 1 || max_length < 1 || max_scratch < 1) {
      return Status::InvalidArgument(
          fn + "kv_width " + std::to_string(kv_width) + ", max_requests " +
          std::to_string(max_requests) + ", max_length " + std::to_string(max_length) +
          " and max_scratch " + std::to_string(max_scratch) + " must be >= 1");
    }
    int64_t const rows = int64_t{max_requests} * std::max(max_length, max_scratch);
    if (rows > (int64_t{1} << 31) - 1) {
      return Status::Unsupported(fn + std::to_string(max_requests) + " requests x " +
                                 std::to_string(std::max(max_length, max_scratch)) +
                                 " entries exceed the int32 cache rows");
    }
    DraftCudaCache c;
    c.width_ = kv_width;
    c.max_length_ = max_length;
    c.max_scratch_ = max_scratch;
    size_t const committed = static_cast<size_t>(max_requests * max_length * kv_width);
    size_t const scratch = static_cast<size_t>(max_requests * max_scratch * kv_width);
    c.k_ = DeviceBuffer<float>(committed);
    c.v_ = DeviceBuffer<float>(committed);
    c.scratch_k_ = DeviceBuffer<float>(scratch);
    c.scratch_v_ = DeviceBuffer<float>(scratch);
    c.tree_parent_ = DeviceBuffer<int32_t>(static_cast<size_t>(max_requests * max_scratch));
    if (!c.k_.data() || !c.v_.data() || !c.scratch_k_.data() || !c.scratch_v_.data() ||
        !c.tree_parent_.data()) {
      return Status::CudaError(fn + "cudaMalloc of " + std::to_string(8 * (committed + scratch)) +
                               " bytes of draft K / V failed");
    }
    SPECDEC_RETURN_IF_ERROR(c.k_.fill_bytes(0));
    SPECDEC_RETURN_IF_ERROR(c.v_.fill_bytes(0));
    SPECDEC_RETURN_IF_ERROR(c.scratch_k_.fill_bytes(0));
    SPECDEC_RETURN_IF_ERROR(c.scratch_v_.fill_bytes(0));
    for (int s = max_requests - 1; s >= 0; --s) c.free_slots_.push_back(s);
    *out = std::move(c);
    return Status::Ok();
  }
  static Status create_for(DraftConfig const& config, int max_requests, int64_t max_length,
                           int64_t max_scratch, DraftCudaCache* out) {
    return create(config.kv_width(), max_requests, max_length, max_scratch, out);
  }

  int64_t kv_width() const { return width_; }
  int max_requests() const {
    return static_cast<int>(free_slots_.size() + seqs_.size()) + (padding_slot_ >= 0);
  }
  int64_t max_length() const { return max_length_; }
  int64_t max_scratch() const { return max_scratch_; }

  Status add_request(RequestId id) {
    if (has_request(id)) return already_added(id);
    if (free_slots_.empty()) {
      return Status::InvalidArgument("DraftCudaCache: no free slot for request " +
                                     std::to_string(id) + ": all " + std::to_string(seqs_.size()) +
                                     " slots are in use (free_request, or create with more "
                                     "max_requests)");
    }
    Sequence s;
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    seqs_.emplace(id, std::move(s));
    return Status::Ok();
  }
  // The slot of the filler rows of padded calls (draft_extend's / draft_tree_step's `padding`: a
  // batch padded to its graph ladder's size). The first call takes the lowest free slot for
  // good; later calls return the same slot. No request ever holds it; its length stays 0 (the
  // filler rows write its committed row 0 and its scratch, all of them the same values). No
  // free slot: an error, and nothing changes.
  Status padding_slot(int* out) {
    if (padding_slot_ < 0) {
      if (free_slots_.empty()) {
        return Status::InvalidArgument(
            "DraftCudaCache: no free slot for the filler rows of a padded call: all " +
            std::to_string(seqs_.size()) +
            " slots are in use (free_request, or create with one more max_requests)");
      }
      padding_slot_ = free_slots_.back();
      free_slots_.pop_back();
    }
    *out = padding_slot_;
    return Status::Ok();
  }
  // The padding slot, or -1 before padding_slot was first called.
  int padding_slot() const { return padding_slot_; }

  Status free_request(RequestId id) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return unknown(id);
    free_slots_.push_back(it->second.slot);
    seqs_.erase(it);
    return Status::Ok();
  }
  // Slot s's committed row u at (s * max_length + u) * kv_width, scratch entry a at
  // (s * max_scratch + a) * kv_width.
  float* k() const { return k_.data(); }
  float* v() const { return v_.data(); }
  float* scratch_k() const { return scratch_k_.data(); }
  float* scratch_v() const { return scratch_v_.data(); }
  // [max_requests * max_scratch]: the parent of each scratch entry of a tree on the device
  // (draft_tree_step's; the host's draft_step keeps its tree in the Sequence instead).
  int32_t* tree_parent() const { return tree_parent_.data(); }

 private:
  int64_t width_ = 0, max_length_ = 0, max_scratch_ = 0;
  DeviceBuffer<float> k_, v_, scratch_k_, scratch_v_;
  DeviceBuffer<int32_t> tree_parent_;
  std::vector<int> free_slots_;  // lowest slot last
  int padding_slot_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Forward.

namespace detail {

// One call's int32 metadata in one upload (or built on the device: draft_tree_step): per row its
// position, cache row (committed or scratch array), slot, visible committed count, ancestor-list
// range and parent hidden row (draft_tree_step); the ancestor lists; per request its last row
// (extend).
struct RowsMeta {
  std::vector<int32_t> host;
  int64_t positions = 0, kv_rows = 0, slot = 0, committed = 0, anc_begin = 0, sources = 0,
          last_rows = 0, anc = 0;
  void layout(int64_t n, int64_t B, int64_t ancestors) {
    int64_t at = 0;
    auto region = [&](int64_t k) {
      int64_t const r = at;
      at += k;
      return r;
    };
    positions = region(n);
    kv_rows = region(n);
    slot = region(n);
    committed = region(n);
    anc_begin = region(n + 1);
    sources = region(n);
    last_rows = region(B);
    anc = region(ancestors);
    host.assign(static_cast<size_t>(at), 0);
  }
  int32_t& at(int64_t region, int64_t i) { return host[static_cast<size_t>(region + i)]; }
};

// The rows of one call once validated: n rows, the incoming hidden and where the residual stream
// lives, the metadata.
struct CallRows {
  int64_t n = 0;
  bool step = false;                // K / V to the scratch arrays (else committed)
  bool meta_on_device = false;      // the metadata is already in the scratch (draft_tree_step)
  float const* features = nullptr;  // extend: [n, F]
  float const* parent = nullptr;    // step: [n, H]
  float* residual = nullptr;        // [n, H]: h'' at the end
  RowsMeta meta;
};

// Size, then device memory (a non-empty span).
template <class T>
Status check_span(std::string const& fn, char const* what, std::span<T> got, int64_t want,
                  std::string const& why) {
  if (static_cast<int64_t>(got.size()) != want) {
    return Status::InvalidArgument(
        size_mismatch(fn, what, std::span<T const>(got.data(), got.size()), want, why));
  }
  if (want > 0) return check_device_memory(fn, what, got.data());
  return Status::Ok();
}

// A padded call's filler counts (DraftPadding, DraftTreeStep::padding): not negative, filler
// requests only with filler entries to end on, the cache's padding slot taken.
inline Status check_padding(std::string const& fn, DraftCudaCache const& cache, int64_t requests,
                            int64_t entries) {
  if (requests == 0 && entries == 0) return Status::Ok();
  if (requests < 0 || entries < 0 || (requests > 0 && entries == 0)) {
    return Status::InvalidArgument(fn + "padding of " + std::to_string(requests) +
                                   " filler requests and " + std::to_string(entries) +
                                   " filler entries: both must be >= 0, and filler requests "
                                   "need filler entries");
  }
  if (cache.padding_slot() < 0) {
    return Status::InvalidArgument(fn + "a padded call needs the cache's padding slot "
                                        "(DraftCudaCache::padding_slot)");
  }
  return Status::Ok();
}

// h'' of the call's rows into rows.residual (see the top of the file), after the tokens are
// checked into s.tokens and the metadata uploaded.
inline Status draft_forward_cuda(DraftCudaModel& m, DraftCudaCache* cache, CallRows const& rows,
                                 std::span<int32_t const> tokens, int32_t call,
                                 DraftCudaModel::Scratch const& s, cudaStream_t stream) {
  DraftConfig const& c = m.config;
  int64_t const n = rows.n, H = c.hidden_size, Q = c.q_width(), W = c.kv_width();
  int64_t const I = c.intermediate_size, F = c.feature_width(), A = c.attention_in_width();
  int64_t const QKV = Q + 2 * W, hd = c.head_dim;
  double const eps = c.rms_norm_eps;
  cublasHandle_t const h = m.cublas();
  RowsMeta const& meta = rows.meta;
  if (!rows.meta_on_device) {
    SPECDEC_CUDA_TRY(cudaMemcpyAsync(s.meta, meta.host.data(),
                                     meta.host.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                     stream));
  }
  SPECDEC_RETURN_IF_ERROR(kimi::cublas_status(cublasSetStream(h, stream), "cublasSetStream"));
  SPECDEC_RETURN_IF_ERROR(cuda::check_tokens(tokens.data(), n, static_cast<int32_t>(c.vocab_size),
                                             call, s.tokens, draft_error_record(m), stream));
  float* res = rows.residual;
  uint16_t const* x_in = nullptr;  // the attention input [n, A] bf16
  if (c.eagle3()) {
    float const* h_in = rows.parent;
    if (rows.step) {
      if (res != rows.parent) {
        SPECDEC_CUDA_TRY(cudaMemcpyAsync(res, rows.parent, static_cast<size_t>(n * H) * 4,
                                         cudaMemcpyDeviceToDevice, stream));
      }
    } else {  // h = fc(feature), the residual too
      SPECDEC_RETURN_IF_ERROR(to_bf16_cuda(rows.features, n * F, s.in_bf, stream));
      SPECDEC_RETURN_IF_ERROR(kimi::detail::gemm_bf16(h, n, H, F, s.in_bf, F, m.fc, res, CUDA_R_32F,
                                                      H, 0.0f, "gemm fc"));
      h_in = res;
    }
    SPECDEC_RETURN_IF_ERROR(kimi::cuda::embed_rows(m.embedding, s.tokens, n, H, s.embed, stream));
    SPECDEC_RETURN_IF_ERROR(kimi::cuda::rms_norm_rows(s.embed, H, m.input_layernorm, n,
                                                      static_cast<int>(H), eps, nullptr, 0, nullptr,
                                                      s.in_bf, 2 * H, stream));
    SPECDEC_RETURN_IF_ERROR(kimi::cuda::rms_norm_rows(h_in, H, m.hidden_norm, n,
                                                      static_cast<int>(H), eps, nullptr, 0, nullptr,
                                                      s.in_bf + H, 2 * H, stream));
    x_in = s.in_bf;
  } else {
    // in_bf = [embed(t) | h] bf16 [n, 2H].
    cuda::CopyRows<uint16_t, uint16_t> e;
    e.src = m.embedding;
    e.src_stride = H;
    e.src_rows = s.tokens;
    e.dst = s.in_bf;
    e.dst_stride = 2 * H;
    e.rows = n;
    e.width = H;
    SPECDEC_RETURN_IF_ERROR(cuda::copy_rows(e, stream));
    if (rows.step) {
      cuda::CopyRows<float, uint16_t> ph;
      ph.src = rows.parent;
      ph.src_stride = H;
      ph.dst = s.in_bf + H;
      ph.dst_stride = 2 * H;
      ph.rows = n;
      ph.width = H;
      SPECDEC_RETURN_IF_ERROR(cuda::copy_rows(ph, stream));
    } else {  // h = rms(feature, the target's final norm)
      SPECDEC_RETURN_IF_ERROR(kimi::cuda::rms_norm_rows(
          rows.features, F, m.target.final_norm, n, static_cast<int>(H), m.target.final_norm_eps,
          nullptr, 0, nullptr, s.in_bf + H, 2 * H, stream));
    }
    float beta = 0.0f;
    if (m.fc_bias != nullptr) {  // residual = bias, then += fc([e | h])
      cuda::CopyRows<uint16_t, float> b;
      b.src = m.fc_bias;
      b.src_stride = 0;
      b.dst = res;
      b.dst_stride = H;
      b.rows = n;
      b.width = H;
      SPECDEC_RETURN_IF_ERROR(cuda::copy_rows(b, stream));
      beta = 1.0f;
    }
    SPECDEC_RETURN_IF_ERROR(kimi::detail::gemm_bf16(h, n, H, 2 * H, s.in_bf, 2 * H, m.fc, res,
                                                    CUDA_R_32F, H, beta, "gemm fc"));
    SPECDEC_RETURN_IF_ERROR(to_bf16_cuda(res, n * H, s.x_bf, stream));
    x_in = s.x_bf;
  }

  // q, k, v; rope; K and V into the entries' cache rows.
  SPECDEC_RETURN_IF_ERROR(kimi::detail::gemm_bf16(h, n, QKV, A, x_in, A, m.qkv_proj, s.qkv,
                                                  CUDA_R_32F, QKV, 0.0f, "gemm qkv_proj"));
  int32_t const* positions = s.meta + meta.positions;
  int32_t const* kv_rows = s.meta + meta.kv_rows;
  float* cache_k = rows.step ? cache->scratch_k() : cache->k();
  float* cache_v = rows.step ? cache->scratch_v() : cache->v();
  cuda::RopeNeoxRows rope;
  rope.in = s.qkv;
  rope.in_token_stride = QKV;
  rope.in_head_stride = hd;
  rope.out = s.qkv;
  rope.out_token_stride = QKV;
  rope.out_head_stride = hd;
  rope.tokens = n;
  rope.heads = c.num_attention_heads;
  rope.half = static_cast<int>(hd / 2);
  rope.positions = positions;
  rope.inv_freq = m.inv_freq_device;
  SPECDEC_RETURN_IF_ERROR(cuda::rope_neox_rows(rope, stream));
  rope.in = s.qkv + Q;
  rope.out = cache_k;
  rope.out_token_stride = W;
  rope.out_rows = kv_rows;
  rope.heads = c.num_key_value_heads;
  SPECDEC_RETURN_IF_ERROR(cuda::rope_neox_rows(rope, stream));
  cuda::CopyRows<float, float> vc;
  vc.src = s.qkv + Q + W;
  vc.src_stride = QKV;
  vc.dst = cache_v;
  vc.dst_stride = W;
  vc.dst_rows = kv_rows;
  vc.rows = n;
  vc.width = W;
  SPECDEC_RETURN_IF_ERROR(cuda::copy_rows(vc, stream));

  cuda::DraftAttentionParams ap;
  ap.q = s.qkv;
  ap.q_stride = QKV;
  ap.k = cache->k();
  ap.v = cache->v();
  ap.scratch_k = cache->scratch_k();
  ap.scratch_v = cache->scratch_v();
  ap.max_length = cache->max_length();
  ap.max_scratch = cache->max_scratch();
  ap.slot = s.meta + meta.slot;
  ap.committed = s.meta + meta.committed;
  ap.anc_begin = s.meta + meta.anc_begin;
  ap.anc = s.meta + meta.anc;
  ap.rows = static_cast<int>(n);
  ap.heads = c.num_attention_heads;
  ap.kv_heads = c.num_key_value_heads;
  ap.head_dim = c.head_dim;
  ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  ap.out = s.attn;
  SPECDEC_RETURN_IF_ERROR(cuda::draft_attention(ap, stream));
  SPECDEC_RETURN_IF_ERROR(to_bf16_cuda(s.attn, n * Q, s.o_bf, stream));
  SPECDEC_RETURN_IF_ERROR(kimi::detail::gemm_bf16(h, n, H, Q, s.o_bf, Q, m.o_proj, res, CUDA_R_32F,
                                                  H, 1.0f, "gemm o_proj"));

  // residual += down(silu(gate n) * up n), n = rms(residual, post_attention_layernorm).
  SPECDEC_RETURN_IF_ERROR(kimi::cuda::rms_norm_rows(res, H, m.post_attention_layernorm, n,
                                                    static_cast<int>(H), eps, nullptr, 0, nullptr,
                                                    s.x_bf, H, stream));
  SPECDEC_RETURN_IF_ERROR(kimi::detail::gemm_bf16(h, n, I, H, s.x_bf, H, m.gate_proj, s.gate,
                                                  CUDA_R_32F, I, 0.0f, "gemm gate_proj"));
  SPECDEC_RETURN_IF_ERROR(kimi::detail::gemm_bf16(h, n, I, H, s.x_bf, H, m.up_proj, s.up,
                                                  CUDA_R_32F, I, 0.0f, "gemm up_proj"));
  SPECDEC_RETURN_IF_ERROR(kimi::cuda::silu_mul_bf16(s.gate, s.up, n, I, I, s.h_bf, stream));
  return kimi::detail::gemm_bf16(h, n, H, I, s.h_bf, I, m.down_proj, res, CUDA_R_32F, H, 1.0f,
                                 "gemm down_proj");
}

// logits [rows, Vd] = lm_head(rms(hidden, norm)) (EAGLE-3) or the target's lm_head(hidden).
inline Status draft_logits_cuda(DraftCudaModel& m, float const* hidden, int64_t rows, float* logits,
                                DraftCudaModel::Scratch const& s, cudaStream_t stream) {
  DraftConfig const& c = m.config;
  int64_t const H = c.hidden_size, Vd = c.draft_vocab_size;
  if (c.eagle3()) {
    SPECDEC_RETURN_IF_ERROR(kimi::cuda::rms_norm_rows(hidden, H, m.norm, rows, static_cast<int>(H),
                                                      c.rms_norm_eps, nullptr, 0, nullptr, s.x_bf,
                                                      H, stream));
  } else {
    SPECDEC_RETURN_IF_ERROR(to_bf16_cuda(hidden, rows * H, s.x_bf, stream));
  }
  return kimi::detail::gemm_bf16(m.cublas(), rows, Vd, H, s.x_bf, H, m.lm_head, logits, CUDA_R_32F,
                                 Vd, 0.0f, "gemm lm_head");
}

}  // namespace detail

// Committed entries (draft_extend (cpu)'s contract): request requests[b] gets counts[b] >= 1
// entries (tokens and features in order: request 0's, then request 1's, ...) at positions
// length + i; its length advances by counts[b] and its scratch is cleared. Device spans: tokens
// [sum counts], features [sum counts, F], hidden_last [B, H] and logits_last [B, Vd] (the last
// entry's h'' and draft logits per request). requests and counts are host spans.
// In three parts, for a caller that replays the stream work from a CUDA graph (the engine):
//   prepare_draft_extend   the host's checks, the rows' metadata uploaded into the call's
//                          scratch (on the stream: the one host-to-device copy), *call filled;
//                          changes nothing on a failed check
//   enqueue_draft_extend   the stream work only (capturable): the forward, the last rows, the
//                          logits; what it reads and writes is fixed by the call's sizes (B, sum
//                          counts), its spans and model.scratch_generation()
//   finish_draft_extend    the bookkeeping: lengths advance, scratches clear
// `padding` (a batch padded to its graph ladder's size, whose captured work then serves every
// batch of that size): `entries` filler entries after the requests' (tokens and features hold
// them), each at position 0 of cache->padding_slot() (committed row 0, seeing itself alone), and
// `requests` filler requests after the batch's, whose last row is the last filler entry
// (hidden_last and logits_last hold their rows). Nothing of a filler is kept: the padding slot's
// length stays 0. The real rows' results are those of the unpadded call up to the GEMMs' bf16
// rounding order.
struct DraftPadding {
  int64_t requests = 0, entries = 0;
};
struct DraftExtendCall {
  detail::CallRows rows;
  int64_t outputs = 0;  // rows of hidden_last / logits_last: the batch and its filler requests
  DraftCudaModel::Scratch scratch{};
  std::vector<DraftCudaCache::Sequence*> seqs;
  std::vector<int32_t> counts;
  std::span<int32_t const> tokens;
  float* hidden_last = nullptr;
  float* logits_last = nullptr;
};

inline Status prepare_draft_extend(CudaExecutor e, DraftCudaModel& model, DraftCudaCache* cache,
                                   std::span<RequestId const> requests,
                                   std::span<int32_t const> counts,
                                   std::span<int32_t const> tokens,
                                   std::span<float const> features, std::span<float> hidden_last,
                                   std::span<float> logits_last, DraftExtendCall* call,
                                   DraftPadding padding = {}) {
  std::string const fn = "draft_extend (cuda): ";
  return kimi::detail::cpu_guard(fn, [&]() -> Status {
    SPECDEC_RETURN_IF_ERROR(
        detail::check_batch(fn, model, cache, requests, "load_draft_cuda_model", "DraftCudaCache"));
    SPECDEC_RETURN_IF_ERROR(detail::check_padding(fn, *cache, padding.requests, padding.entries));
    int64_t const B = static_cast<int64_t>(requests.size()), H = model.hidden();
    int64_t const F = model.feature_width(), Vd = model.draft_vocab();
    int64_t T = 0;
    SPECDEC_RETURN_IF_ERROR(detail::extend_entries(fn, counts, B, &T));
    int64_t const rows = T + padding.entries, outputs = B + padding.requests;
    std::string const entries_why =
        "sum of counts" + (padding.entries ? " + " + std::to_string(padding.entries) + " filler"
                                           : std::string());
    SPECDEC_RETURN_IF_ERROR(detail::check_span(fn, "tokens", tokens, rows, entries_why));
    SPECDEC_RETURN_IF_ERROR(detail::check_span(
        fn, "features", features, rows * F,
        entries_why + " " + std::to_string(rows) + " x feature width " + std::to_string(F) +
            " = |target streams " + format_layers(model.feature_layers) + "| x target hidden " +
            std::to_string(model.config.target_hidden_size)));
    std::string const batch_why =
        "batch " + std::to_string(B) +
        (padding.requests ? " + " + std::to_string(padding.requests) + " filler" : std::string());
    SPECDEC_RETURN_IF_ERROR(detail::check_span(fn, "hidden_last", hidden_last, outputs * H,
                                               batch_why + " x hidden " + std::to_string(H)));
    SPECDEC_RETURN_IF_ERROR(
        detail::check_span(fn, "logits_last", logits_last, outputs * Vd,
                           batch_why + " x draft vocabulary " + std::to_string(Vd)));
    DraftExtendCall c;
    c.rows.n = rows;
    c.outputs = outputs;
    c.rows.features = features.data();
    c.rows.meta.layout(rows, outputs, 0);
    detail::RowsMeta& mt = c.rows.meta;
    c.seqs.resize(static_cast<size_t>(B));
    for (int64_t b = 0, first = 0; b < B; first += counts[b], ++b) {
      DraftCudaCache::Sequence* seq = cache->find(requests[b]);
      c.seqs[static_cast<size_t>(b)] = seq;
      SPECDEC_RETURN_IF_ERROR(
          detail::check_position(fn, model, requests[b], seq->length + counts[b] - 1));
      if (seq->length + counts[b] > cache->max_length()) {
        return Status::InvalidArgument(
            fn + "request " + std::to_string(requests[b]) + ": length " +
            std::to_string(seq->length) + " + " + std::to_string(counts[b]) +
            " entries exceed the cache's capacity of " + std::to_string(cache->max_length()) +
            " committed entries per request (DraftCudaCache::create max_length)");
      }
      for (int64_t i = 0; i < counts[b]; ++i) {
        int64_t const r = first + i;
        mt.at(mt.positions, r) = static_cast<int32_t>(seq->length + i);
        mt.at(mt.kv_rows, r) =
            static_cast<int32_t>(seq->slot * cache->max_length() + seq->length + i);
        mt.at(mt.slot, r) = seq->slot;
        mt.at(mt.committed, r) = static_cast<int32_t>(seq->length + i + 1);  // self included
      }
      mt.at(mt.last_rows, b) = static_cast<int32_t>(first + counts[b] - 1);
    }
    int const filler_slot = cache->padding_slot();
    for (int64_t r = T; r < rows; ++r) {
      mt.at(mt.positions, r) = 0;
      mt.at(mt.kv_rows, r) = static_cast<int32_t>(filler_slot * cache->max_length());
      mt.at(mt.slot, r) = filler_slot;
      mt.at(mt.committed, r) = 1;
    }
    for (int64_t b = B; b < outputs; ++b) mt.at(mt.last_rows, b) = static_cast<int32_t>(rows - 1);
    SPECDEC_RETURN_IF_ERROR(
        draft_scratch(model, rows, detail::meta_ints(rows, outputs, 0), &c.scratch));
    SPECDEC_CUDA_TRY(cudaMemcpyAsync(c.scratch.meta, mt.host.data(),
                                     mt.host.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                     e.stream));
    c.rows.meta_on_device = true;
    c.rows.residual = c.scratch.residual;
    c.counts.assign(counts.begin(), counts.end());
    c.tokens = tokens;
    c.hidden_last = hidden_last.data();
    c.logits_last = logits_last.data();
    *call = std::move(c);
    return Status::Ok();
  });
}

inline Status enqueue_draft_extend(CudaExecutor e, DraftCudaModel& model, DraftCudaCache* cache,
                                   DraftExtendCall const& c) {
  int64_t const B = c.outputs, H = model.hidden();
  DraftCudaModel::Scratch const& s = c.scratch;
  SPECDEC_RETURN_IF_ERROR(
      detail::draft_forward_cuda(model, cache, c.rows, c.tokens, /*call=*/1, s, e.stream));
  cuda::CopyRows<float, float> last;
  last.src = s.residual;
  last.src_stride = H;
  last.src_rows = s.meta + c.rows.meta.last_rows;
  last.dst = c.hidden_last;
  last.dst_stride = H;
  last.rows = B;
  last.width = H;
  SPECDEC_RETURN_IF_ERROR(cuda::copy_rows(last, e.stream));
  return detail::draft_logits_cuda(model, c.hidden_last, B, c.logits_last, s, e.stream);
}

inline void finish_draft_extend(DraftExtendCall const& c) {
  for (size_t b = 0; b < c.seqs.size(); ++b) {
    c.seqs[b]->length += c.counts[b];
    c.seqs[b]->clear_scratch();
  }
}

inline Status draft_extend(CudaExecutor e, DraftCudaModel& model, DraftCudaCache* cache,
                           std::span<RequestId const> requests, std::span<int32_t const> counts,
                           std::span<int32_t const> tokens, std::span<float const> features,
                           std::span<float> hidden_last, std::span<float> logits_last,
                           DraftPadding padding = {}) {
  DraftExtendCall call;
  SPECDEC_RETURN_IF_ERROR(prepare_draft_extend(e, model, cache, requests, counts, tokens,
                                               features, hidden_last, logits_last, &call,
                                               padding));
  SPECDEC_RETURN_IF_ERROR(kimi::detail::cpu_guard(
      "draft_extend (cuda): ", [&] { return enqueue_draft_extend(e, model, cache, call); }));
  finish_draft_extend(call);
  return Status::Ok();
}

// Scratch entries (draft_step (cpu)'s contract): row r = b * K + j continues parent_scratch[r]
// (a scratch index of requests[b], or -1 = right after its committed prefix) with token
// tokens[r] (a target id) from the parent's hidden parent_hidden [r, H]. Device spans: tokens
// [B * K], parent_hidden [B * K, H], hidden [B * K, H], logits [B * K, Vd] (hidden may be
// parent_hidden: the step runs in place). Host: requests, parent_scratch [B * K], *scratch_index
// [B * K] (the new entries' scratch indices, for the next step's parent_scratch).
inline Status draft_step(CudaExecutor e, DraftCudaModel& model, DraftCudaCache* cache,
                         std::span<RequestId const> requests, int branches,
                         std::span<int32_t const> tokens, std::span<float const> parent_hidden,
                         std::span<int32_t const> parent_scratch, std::span<float> hidden,
                         std::span<float> logits, std::vector<int32_t>* scratch_index) {
  std::string const fn = "draft_step (cuda): ";
  return kimi::detail::cpu_guard(fn, [&]() -> Status {
    SPECDEC_RETURN_IF_ERROR(
        detail::check_batch(fn, model, cache, requests, "load_draft_cuda_model", "DraftCudaCache"));
    if (scratch_index == nullptr) return Status::InvalidArgument(fn + "scratch_index is null");
    if (branches < 1) {
      return Status::InvalidArgument(fn + "branches " + std::to_string(branches) + " must be >= 1");
    }
    int64_t const B = static_cast<int64_t>(requests.size()), K = branches, BK = B * K;
    int64_t const H = model.hidden(), Vd = model.draft_vocab();
    std::string const rows_why = "batch " + std::to_string(B) + " x branches " + std::to_string(K);
    SPECDEC_RETURN_IF_ERROR(detail::check_span(fn, "tokens", tokens, BK, rows_why));
    if (static_cast<int64_t>(parent_scratch.size()) != BK) {
      return Status::InvalidArgument(
          detail::size_mismatch(fn, "parent_scratch", parent_scratch, BK, rows_why));
    }
    SPECDEC_RETURN_IF_ERROR(detail::check_span(fn, "parent_hidden", parent_hidden, BK * H,
                                               rows_why + " x hidden " + std::to_string(H)));
    SPECDEC_RETURN_IF_ERROR(detail::check_span(fn, "hidden", hidden, BK * H,
                                               rows_why + " x hidden " + std::to_string(H)));
    SPECDEC_RETURN_IF_ERROR(detail::check_span(
        fn, "logits", logits, BK * Vd, rows_why + " x draft vocabulary " + std::to_string(Vd)));
    // Depth, position and ancestor chain (root first, self last) of every row.
    std::vector<DraftCudaCache::Sequence*> seqs(static_cast<size_t>(B));
    std::vector<int32_t> depth(static_cast<size_t>(BK)), chain_begin(static_cast<size_t>(BK + 1));
    std::vector<int32_t> chains, chain;
    for (int64_t b = 0; b < B; ++b) {
      DraftCudaCache::Sequence* seq = cache->find(requests[b]);
      seqs[static_cast<size_t>(b)] = seq;
      int64_t const S = seq->scratch_size();
      if (S + K > cache->max_scratch()) {
        return Status::InvalidArgument(
            fn + "request " + std::to_string(requests[b]) + ": " + std::to_string(S) +
            " scratch entries + " + std::to_string(K) +
            " branches exceed the cache's capacity of " + std::to_string(cache->max_scratch()) +
            " scratch entries per request (DraftCudaCache::create max_scratch)");
      }
      for (int64_t j = 0; j < K; ++j) {
        int64_t const r = b * K + j;
        int32_t const p = parent_scratch[r];
        if (p < -1 || p >= S) {
          return Status::InvalidArgument(
              fn + "parent_scratch[" + std::to_string(r) + "] = " + std::to_string(p) +
              " is outside [-1, " + std::to_string(S) + "): request " +
              std::to_string(requests[b]) + " has " + std::to_string(S) + " scratch entries");
        }
        depth[r] = p < 0 ? 0 : seq->scratch_depth[static_cast<size_t>(p)] + 1;
        SPECDEC_RETURN_IF_ERROR(
            detail::check_position(fn, model, requests[b], seq->length + depth[r]));
        chain.clear();
        for (int32_t a = p; a >= 0; a = seq->scratch_parent[static_cast<size_t>(a)]) {
          chain.push_back(a);
        }
        chain_begin[r] = static_cast<int32_t>(chains.size());
        chains.insert(chains.end(), chain.rbegin(), chain.rend());
        chains.push_back(static_cast<int32_t>(S + j));  // self
      }
    }
    chain_begin[BK] = static_cast<int32_t>(chains.size());
    detail::CallRows rows;
    rows.n = BK;
    rows.step = true;
    rows.parent = parent_hidden.data();
    rows.residual = hidden.data();
    rows.meta.layout(BK, B, static_cast<int64_t>(chains.size()));
    detail::RowsMeta& mt = rows.meta;
    for (int64_t b = 0; b < B; ++b) {
      DraftCudaCache::Sequence const* seq = seqs[static_cast<size_t>(b)];
      for (int64_t j = 0; j < K; ++j) {
        int64_t const r = b * K + j;
        mt.at(mt.positions, r) = static_cast<int32_t>(seq->length + depth[r]);
        mt.at(mt.kv_rows, r) =
            static_cast<int32_t>(seq->slot * cache->max_scratch() + seq->scratch_size() + j);
        mt.at(mt.slot, r) = seq->slot;
        mt.at(mt.committed, r) = static_cast<int32_t>(seq->length);
      }
    }
    std::copy(chain_begin.begin(), chain_begin.end(), mt.host.begin() + mt.anc_begin);
    std::copy(chains.begin(), chains.end(), mt.host.begin() + mt.anc);
    DraftCudaModel::Scratch s{};
    SPECDEC_RETURN_IF_ERROR(draft_scratch(
        model, BK, detail::meta_ints(BK, B, static_cast<int64_t>(chains.size())), &s));
    SPECDEC_RETURN_IF_ERROR(
        detail::draft_forward_cuda(model, cache, rows, tokens, /*call=*/2, s, e.stream));
    SPECDEC_RETURN_IF_ERROR(
        detail::draft_logits_cuda(model, hidden.data(), BK, logits.data(), s, e.stream));
    std::vector<int32_t> index(static_cast<size_t>(BK));
    for (int64_t b = 0; b < B; ++b) {
      DraftCudaCache::Sequence* seq = seqs[static_cast<size_t>(b)];
      int32_t const S = static_cast<int32_t>(seq->scratch_size());
      for (int64_t j = 0; j < K; ++j) {
        int64_t const r = b * K + j;
        index[r] = S + static_cast<int32_t>(j);
        seq->scratch_parent.push_back(parent_scratch[r]);
        seq->scratch_depth.push_back(depth[r]);
      }
    }
    *scratch_index = std::move(index);
    return Status::Ok();
  });
}

// Step `step` (1 .. steps - 1) of a proposal whose tree lives on the device: requests[b] in cache
// slot slots[b] with lengths[b] committed entries (device copies of the cache's host values,
// which the caller keeps in step), K = branches rows each. Row r = b * K + j takes token
// tokens[r] (a target id) and continues branch next_branch[r] of step - 1 (read at step >= 2;
// at step 1 every row continues the committed prefix) from the parent's hidden row of
// source_hidden (step 1: [slots, H], the row of the slot's last extend; else [B * K, H], the
// previous step's hidden), gathered into parent_hidden [B * K, H] (which must not overlap it);
// hidden [B * K, H] and logits [B * K, Vd] out (hidden may be source_hidden's storage: the
// gather finishes before the forward writes). Row r becomes scratch entry
// (step - 1) * K + j of its slot (cuda::draft_tree_rows states the metadata). All pointers are
// device memory; nothing is read back, allocated (once reserve_draft_scratch sized the
// scratch for B * K rows and chains of `steps`) or kept on the host: the host's scratch tree of
// the requests is left as it was, and the next draft_extend clears both. A proposal's steps run
// in order 1, 2, ...; a new step 1 starts a new tree.
struct DraftTreeStep {
  int step = 0, branches = 0;
  // Filler requests after `requests` (a batch padded to its graph ladder's size): slots and
  // lengths hold them (cache->padding_slot() and 0) and every array below their rows; they
  // share the padding slot's scratch, writing the same values there.
  int padding = 0;
  int32_t const* slots = nullptr;        // [B] (B: the requests and the fillers)
  int32_t const* lengths = nullptr;      // [B]
  int32_t const* next_branch = nullptr;  // [B * K]
  int32_t const* tokens = nullptr;       // [B * K]
  float const* source_hidden = nullptr;
  float* parent_hidden = nullptr;  // [B * K, H]
  float* hidden = nullptr;         // [B * K, H]
  float* logits = nullptr;         // [B * K, Vd]
};

// The host's checks of a proposal of `steps` steps of `branches` rows per request on the device
// (draft_tree_step checks them again at each call; a caller replaying a captured proposal runs
// this before each replay): every request known, its tree within the cache's scratch, its last
// position lengths + steps - 2 within max_position_embeddings.
inline Status check_draft_tree(DraftCudaModel const& model, DraftCudaCache const& cache,
                               std::span<RequestId const> requests, int steps, int branches) {
  std::string const fn = "draft_tree_step (cuda): ";
  SPECDEC_RETURN_IF_ERROR(
      detail::check_batch(fn, model, &cache, requests, "load_draft_cuda_model", "DraftCudaCache"));
  if (steps < 2 || branches < 1) {
    return Status::InvalidArgument(fn + "steps " + std::to_string(steps) + " must be >= 2 and " +
                                   "branches " + std::to_string(branches) + " >= 1");
  }
  if (int64_t{steps - 1} * branches > cache.max_scratch()) {
    return Status::InvalidArgument(
        fn + std::to_string(steps - 1) + " steps x " + std::to_string(branches) +
        " branches exceed the cache's capacity of " + std::to_string(cache.max_scratch()) +
        " scratch entries per request (DraftCudaCache::create max_scratch)");
  }
  for (RequestId id : requests) {
    SPECDEC_RETURN_IF_ERROR(
        detail::check_position(fn, model, id, cache.find(id)->length + steps - 2));
  }
  return Status::Ok();
}

inline Status draft_tree_step(CudaExecutor e, DraftCudaModel& model, DraftCudaCache* cache,
                              std::span<RequestId const> requests, DraftTreeStep const& t) {
  std::string const fn = "draft_tree_step (cuda): ";
  return kimi::detail::cpu_guard(fn, [&]() -> Status {
    if (cache == nullptr) return Status::InvalidArgument(fn + "cache is null");
    if (t.step < 1) {
      return Status::InvalidArgument(fn + "step " + std::to_string(t.step) + " must be >= 1");
    }
    SPECDEC_RETURN_IF_ERROR(check_draft_tree(model, *cache, requests, t.step + 1, t.branches));
    SPECDEC_RETURN_IF_ERROR(detail::check_padding(fn, *cache, t.padding, t.padding));
    int64_t const B = static_cast<int64_t>(requests.size()) + t.padding, K = t.branches,
                  BK = B * K;
    int64_t const H = model.hidden();
    for (auto [what, p] : {std::pair<char const*, void const*>{"slots", t.slots},
                           {"lengths", t.lengths},
                           {"tokens", t.tokens},
                           {"source_hidden", t.source_hidden},
                           {"parent_hidden", t.parent_hidden},
                           {"hidden", t.hidden},
                           {"logits", t.logits}}) {
      SPECDEC_RETURN_IF_ERROR(detail::check_device_memory(fn, what, p));
    }
    if (t.step >= 2) {
      SPECDEC_RETURN_IF_ERROR(detail::check_device_memory(fn, "next_branch", t.next_branch));
    }
    detail::CallRows rows;
    rows.n = BK;
    rows.step = true;
    rows.meta_on_device = true;
    rows.parent = t.parent_hidden;
    rows.residual = t.hidden;
    rows.meta.layout(BK, B, BK * t.step);
    detail::RowsMeta const& mt = rows.meta;
    DraftCudaModel::Scratch s{};
    SPECDEC_RETURN_IF_ERROR(draft_scratch(model, BK, detail::meta_ints(BK, B, BK * t.step), &s));
    cuda::DraftTreeRowsParams p;
    p.slots = t.slots;
    p.lengths = t.lengths;
    p.next_branch = t.next_branch;
    p.tree_parent = cache->tree_parent();
    p.max_scratch = cache->max_scratch();
    p.rows = static_cast<int>(BK);
    p.branches = t.branches;
    p.step = t.step;
    p.positions = s.meta + mt.positions;
    p.kv_rows = s.meta + mt.kv_rows;
    p.slot = s.meta + mt.slot;
    p.committed = s.meta + mt.committed;
    p.anc_begin = s.meta + mt.anc_begin;
    p.anc = s.meta + mt.anc;
    p.source_rows = s.meta + mt.sources;
    SPECDEC_RETURN_IF_ERROR(cuda::draft_tree_rows(p, e.stream));
    cuda::CopyRows<float, float> gather;
    gather.src = t.source_hidden;
    gather.src_stride = H;
    gather.src_rows = p.source_rows;
    gather.dst = t.parent_hidden;
    gather.dst_stride = H;
    gather.rows = BK;
    gather.width = H;
    SPECDEC_RETURN_IF_ERROR(cuda::copy_rows(gather, e.stream));
    SPECDEC_RETURN_IF_ERROR(detail::draft_forward_cuda(
        model, cache, rows, {t.tokens, static_cast<size_t>(BK)}, /*call=*/2, s, e.stream));
    return detail::draft_logits_cuda(model, t.hidden, BK, t.logits, s, e.stream);
  });
}

// The first token outside [0, V) that a draft_extend / draft_step of `model` met on the device
// since the last call of this function (InvalidArgument naming the call, the index and the
// value), cleared by reading it. Waits for e.stream: the one host read of the forward.
inline Status draft_device_errors(CudaExecutor e, DraftCudaModel& model) {
  std::string const fn = "draft_device_errors: ";
  if (!model.loaded()) {
    return Status::InvalidArgument(fn + "the model is not loaded (load_draft_cuda_model)");
  }
  int32_t record[4] = {0, 0, 0, 0};
  SPECDEC_CUDA_TRY(cudaMemcpyAsync(record, model.error_record_, sizeof record,
                                   cudaMemcpyDeviceToHost, e.stream));
  SPECDEC_CUDA_TRY(cudaStreamSynchronize(e.stream));
  if (record[0] == 0) return Status::Ok();
  SPECDEC_CUDA_TRY(cudaMemsetAsync(model.error_record_, 0, sizeof record, e.stream));
  std::string const call = record[0] == 1 ? "draft_extend (cuda): " : "draft_step (cuda): ";
  return Status::InvalidArgument(
      call + "tokens[" + std::to_string(record[1]) + "] = " + std::to_string(record[2]) +
      " is outside the target vocabulary [0, " + std::to_string(model.vocab()) +
      ") (found on the device; that call read token 0 in its place, so its outputs for the row "
      "are meaningless)");
}

}  // namespace specdec::model::eagle
