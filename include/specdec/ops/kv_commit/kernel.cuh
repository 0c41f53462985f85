// kv_commit CUDA kernel. Grid (column chunk, layer, request); each block checks its request's
// moves (every block recomputes the same checks, so no inter-block communication), loads the
// accepted source rows of its column chunk into registers, __syncthreads, then stores them to
// the destination rows: all loads of a request's chunk precede any store, so the overlapping
// ranges (path [0, 2, 3] moves 2 -> 1 and 3 -> 2) are safe. Rows are copied as raw bytes with the
// widest access (16 down to 1 bytes) that the row size, cache base and layer stride allow.
// Block (chunk 0, layer 0) writes status [B] and seq_len_out [B].
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/kv_commit/params.hpp"

namespace specdec::ops {
namespace kv_commit_detail {

// 128 threads x kItems vectors in registers: a block stages at most 1024 vectors (16 KiB of
// 16-byte accesses). Registers rather than shared memory keep 16 blocks per SM resident; the
// first version staged in 32 KiB of shared memory and reached only 0.5 TB/s at batch 256 on H200
// (occupancy-bound), see bench_kv_commit.
constexpr int kThreads = 128;
constexpr int kItems = 8;
constexpr int kStageVectors = kThreads * kItems;

template <class Vec>
__global__ void __launch_bounds__(kThreads)
    kv_commit_kernel(__grid_constant__ KvCommitParams const p, int const chunk_vectors) {
  await_prior_kernels();
  extern __shared__ int64_t move_rows[];  // [P] source rows, then [P] destination rows
  __shared__ int code_s;
  int const b = blockIdx.z, layer = blockIdx.y, chunk = blockIdx.x, tid = threadIdx.x;
  int const cap = p.acceptance.path_capacity;
  if (tid == 0) code_s = kKvCommitOk;
  // Every thread checks the request and its share of the moves (loads issued together).
  int code = kv_commit_check_request(p, b);
  int const n = code == kKvCommitOk ? p.acceptance.num_accepted[b] : 0;
  for (int k = 1 + tid; k <= n; k += kThreads) {
    int64_t src = 0, dst = 0;
    int32_t const c = kv_commit_check_move(p, b, k, src, dst);
    move_rows[k] = src;
    move_rows[cap + k] = dst;
    code = c > code ? c : code;
  }
  __syncthreads();  // code_s initialised
  if (code != kKvCommitOk) atomicMax(&code_s, code);
  __syncthreads();
  code = code_s;
  if (layer == 0 && chunk == 0 && tid == 0) {
    p.status[b] = code;
    if (p.seq_len_out) p.seq_len_out[b] = code == kKvCommitOk ? p.prefix_len[b] + n + 1 : -1;
  }
  if (code != kKvCommitOk || n == 0) return;  // uniform over the block
  int64_t const row_vectors = kv_commit_row_bytes(p) / static_cast<int64_t>(sizeof(Vec));
  int64_t const col0 = static_cast<int64_t>(chunk) * chunk_vectors;
  int const cols = static_cast<int>(min(static_cast<int64_t>(chunk_vectors), row_vectors - col0));
  int const items = n * cols;  // <= kStageVectors by the launcher's choice of chunk_vectors
  Vec* base =
      reinterpret_cast<Vec*>(static_cast<unsigned char*>(p.cache) + layer * p.layer_stride_bytes);
  Vec buffer[kItems];
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    int const item = tid + r * kThreads;
    if (item < items) {
      int const k = 1 + item / cols, c = item % cols;
      if (move_rows[k] != move_rows[cap + k])
        buffer[r] = base[move_rows[k] * row_vectors + col0 + c];
    }
  }
  __syncthreads();  // every load of the block precedes any store: overlapping moves are safe
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    int const item = tid + r * kThreads;
    if (item < items) {
      int const k = 1 + item / cols, c = item % cols;
      if (move_rows[k] != move_rows[cap + k])
        base[move_rows[cap + k] * row_vectors + col0 + c] = buffer[r];
    }
  }
}

template <class Vec>
Status launch(KvCommitParams const& p, cudaStream_t stream) {
  int64_t const row_vectors = kv_commit_row_bytes(p) / static_cast<int64_t>(sizeof(Vec));
  int const max_moves = p.acceptance.path_capacity - 1 > 0 ? p.acceptance.path_capacity - 1 : 1;
  // Widest chunk whose moves fit the stage, then balanced so the last chunk is not a sliver.
  int64_t const widest = std::max<int64_t>(1, kStageVectors / max_moves);
  int64_t const chunks = (row_vectors + widest - 1) / widest;
  int64_t const chunk = (row_vectors + chunks - 1) / chunks;
  if (chunks > 0x7fffffff || p.num_layers > 65535 || p.batch > 65535) {
    return Status::InvalidArgument("kv_commit: grid too large (chunks " + std::to_string(chunks) +
                                   ", layers " + std::to_string(p.num_layers) + ", batch " +
                                   std::to_string(p.batch) +
                                   "); at most 65535 layers and requests");
  }
  size_t const shared = 2 * sizeof(int64_t) * static_cast<size_t>(p.acceptance.path_capacity);
  dim3 const grid(static_cast<unsigned>(chunks), p.num_layers, p.batch);
  return launch_kernel("kv_commit_kernel", kv_commit_kernel<Vec>, grid, kThreads, shared, stream,
                       p, static_cast<int>(chunk));
}

}  // namespace kv_commit_detail

inline Status kv_commit_cuda(KvCommitParams const& p, cudaStream_t stream) {
  namespace d = kv_commit_detail;
  // Widest power-of-two access dividing the row size, the cache address and the layer stride.
  uint64_t const bits = static_cast<uint64_t>(kv_commit_row_bytes(p)) |
                        reinterpret_cast<uintptr_t>(p.cache) |
                        static_cast<uint64_t>(p.num_layers > 1 ? p.layer_stride_bytes : 0);
  if (bits % 16 == 0) return d::launch<uint4>(p, stream);
  if (bits % 8 == 0) return d::launch<uint2>(p, stream);
  if (bits % 4 == 0) return d::launch<uint32_t>(p, stream);
  if (bits % 2 == 0) return d::launch<uint16_t>(p, stream);
  return d::launch<uint8_t>(p, stream);
}

}  // namespace specdec::ops
