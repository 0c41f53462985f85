// The engine's target on the CUDA executor: the Kimi CUDA forward (model/kimi/forward_cuda.cuh)
// over a device MLA cache, and the CUDA kernels of sample / verify / kv_commit on its device
// logits. The same calls as CpuTarget (engine/target_cpu.hpp), except for the aux rows; the arrays
// they take and give are host arrays: the small per-step arrays (tree, links, sampling,
// acceptance, page tables) are copied to the device on the executor's stream and the results read
// back (the host waits once per call), while logits stay on the device. A vocabulary-sharded
// target keeps only the argmax of an all-greedy batch, as CpuTarget does.
//   gather_aux_rows(rows [R] host, &features)   the last forward's aux rows gathered ON THE
//       DEVICE into a buffer of the target's [R, aux_width] (valid until the next gather; the
//       CUDA EAGLE draft reads it there, nothing is copied to the host)
// detail::gather_rows: dst row i = src row rows[i]; detail::scatter_rows: dst row rows[i] = src
// row i (device rows and arrays), on a stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/engine/batch.hpp"
#include "specdec/model/kimi/forward_cuda.cuh"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "specdec/ops/sample/sample.hpp"
#include "specdec/ops/verify_greedy/verify_greedy.hpp"
#include "specdec/ops/verify_sample/verify_sample.hpp"

namespace specdec::engine {

namespace detail {

// A device array that grows to the largest size asked of it; put() copies host values in on the
// stream and returns the device pointer, get() copies device values out.
template <class T>
class Staging {
 public:
  Status reserve(size_t count) {
    if (count <= buffer_.size()) return Status::Ok();
    buffer_ = DeviceBuffer<T>(count);
    if (buffer_.data() == nullptr) {
      return Status::CudaError("engine staging: cudaMalloc of " +
                               std::to_string(count * sizeof(T)) + " bytes failed");
    }
    return Status::Ok();
  }
  Status put(T const* host, size_t count, cudaStream_t stream, T** device) {
    SPECDEC_RETURN_IF_ERROR(reserve(count));
    if (count > 0) {
      SPECDEC_CUDA_TRY(
          cudaMemcpyAsync(buffer_.data(), host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    }
    *device = buffer_.data();
    return Status::Ok();
  }
  Status put(std::vector<T> const& host, cudaStream_t stream, T** device) {
    return put(host.data(), host.size(), stream, device);
  }
  Status get(T* host, size_t count, cudaStream_t stream) const {
    if (count > 0) {
      SPECDEC_CUDA_TRY(
          cudaMemcpyAsync(host, buffer_.data(), count * sizeof(T), cudaMemcpyDeviceToHost, stream));
    }
    return Status::Ok();
  }
  T* data() const { return buffer_.data(); }

 private:
  DeviceBuffer<T> buffer_;
};

// Row copies, `width` floats each, count rows (device arrays; rows distinct when scattering):
//   kScatter false (gather_rows):  dst row i       = src row rows[i]
//   kScatter true  (scatter_rows): dst row rows[i] = src row i
template <bool kScatter>
__global__ void copy_rows_kernel(float const* __restrict__ src, int64_t const* __restrict__ rows,
                                 int64_t count, int64_t width, float* __restrict__ dst) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * width) return;
  int64_t const r = i / width, j = i % width;
  if constexpr (kScatter) {
    dst[rows[r] * width + j] = src[i];
  } else {
    dst[i] = src[rows[r] * width + j];
  }
}

template <bool kScatter>
Status copy_rows(float const* src, int64_t const* rows, int64_t count, int64_t width, float* dst,
                 cudaStream_t stream) {
  int64_t const n = count * width;
  if (n == 0) return Status::Ok();
  copy_rows_kernel<kScatter><<<static_cast<unsigned>(ceil_div<int64_t>(n, 256)), 256, 0, stream>>>(
      src, rows, count, width, dst);
  return cuda_launch_status(kScatter ? "engine scatter_rows" : "engine gather_rows");
}

inline Status gather_rows(float const* src, int64_t const* rows, int64_t count, int64_t width,
                          float* dst, cudaStream_t stream) {
  return copy_rows<false>(src, rows, count, width, dst, stream);
}
inline Status scatter_rows(float const* src, int64_t const* rows, int64_t count, int64_t width,
                           float* dst, cudaStream_t stream) {
  return copy_rows<true>(src, rows, count, width, dst, stream);
}

}  // namespace detail

class CudaTarget {
 public:
  using Model = model::kimi::KimiCudaModel;
  using RequestId = model::kimi::RequestId;

  CudaTarget(Model* model, CudaExecutor exec) : model_(model), exec_(exec) {}

  io::DeepseekV3Config const& config() const { return model_->config; }
  model::kimi::MlaCache& table() { return cache_.table; }

  Status create_cache(int page_size, int total_pages, int max_pages_per_request) {
    return model::kimi::KimiCudaCache::create_for(model_->config, page_size, total_pages,
                                                  max_pages_per_request, &cache_);
  }

  Status prefill(std::span<RequestId const> ids, std::span<int32_t const> counts,
                 std::span<int32_t const> tokens, std::span<int const> aux_layers,
                 bool all_greedy) {
    SPECDEC_RETURN_IF_ERROR(model::kimi::kimi_prefill(exec_, *model_, &cache_.table, ids, counts,
                                                      tokens, aux_layers, &out_,
                                                      logits_mode(all_greedy)));
    return finish_forward();
  }

  Status verify(std::span<RequestId const> ids, int nodes, std::span<int32_t const> tokens,
                std::span<int32_t const> positions, std::span<uint32_t const> mask,
                std::span<int const> aux_layers, bool all_greedy) {
    SPECDEC_RETURN_IF_ERROR(model::kimi::kimi_verify(exec_, *model_, &cache_.table, ids, nodes,
                                                     tokens, positions, mask, aux_layers, &out_,
                                                     logits_mode(all_greedy)));
    return finish_forward();
  }

  Status sample_rows(std::span<int64_t const> rows, BatchSampling const& s,
                     std::vector<int32_t>* tokens) {
    int64_t const V = model_->config.vocab_size;
    int const B = static_cast<int>(rows.size());
    if (out_.argmax != nullptr) {  // an all-greedy batch on a vocabulary-sharded target
      SPECDEC_RETURN_IF_ERROR(check_argmax_batch("CudaTarget", s));
      std::vector<int32_t> all(static_cast<size_t>(out_.tokens));
      SPECDEC_CUDA_TRY(cudaMemcpyAsync(all.data(), out_.argmax, all.size() * 4,
                                       cudaMemcpyDeviceToHost, exec_.stream));
      SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
      tokens->resize(rows.size());
      for (size_t b = 0; b < rows.size(); ++b) (*tokens)[b] = all[static_cast<size_t>(rows[b])];
      return Status::Ok();
    }
    SPECDEC_RETURN_IF_ERROR(picked_.reserve(static_cast<size_t>(B * V)));
    for (int b = 0; b < B; ++b) {
      SPECDEC_CUDA_TRY(
          cudaMemcpyAsync(picked_.data() + b * V, out_.logits + rows[static_cast<size_t>(b)] * V,
                          static_cast<size_t>(V) * 4, cudaMemcpyDeviceToDevice, exec_.stream));
    }
    ops::SampleParams p;
    p.logits = picked_.data();
    p.batch = B;
    p.vocab = static_cast<int>(V);
    SPECDEC_RETURN_IF_ERROR(put_sampling(s, &p.config, &p.keys));
    SPECDEC_RETURN_IF_ERROR(tokens_.reserve(static_cast<size_t>(B)));
    SPECDEC_RETURN_IF_ERROR(status_.reserve(static_cast<size_t>(B)));
    size_t const ws = ops::sample_workspace_bytes(B, static_cast<int>(V));
    SPECDEC_RETURN_IF_ERROR(workspace_.reserve((ws + 7) / 8));
    p.tokens = tokens_.data();
    p.status = status_.data();
    p.workspace = workspace_.data();
    p.workspace_bytes = ws;
    SPECDEC_RETURN_IF_ERROR(ops::sample(exec_, p));
    tokens->assign(static_cast<size_t>(B), -1);
    std::vector<int32_t> status(static_cast<size_t>(B));
    SPECDEC_RETURN_IF_ERROR(tokens_.get(tokens->data(), static_cast<size_t>(B), exec_.stream));
    SPECDEC_RETURN_IF_ERROR(status_.get(status.data(), static_cast<size_t>(B), exec_.stream));
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    return ops::check_sample_status(status.data(), B);
  }

  Status accept(TreeInput const& tree, TreeLinks const& links, BatchSampling const& s,
                Acceptance const& out) {
    size_t const B = static_cast<size_t>(tree.batch), BN = B * static_cast<size_t>(tree.nodes);
    size_t const P = static_cast<size_t>(out.path_capacity);
    // Device copies of the tree and links (host arrays of the caller).
    TreeInput d_tree = tree;
    TreeLinks d_links;
    int32_t* d = nullptr;
    SPECDEC_RETURN_IF_ERROR(tree_tokens_.put(tree.tokens, BN, exec_.stream, &d));
    d_tree.tokens = d;
    SPECDEC_RETURN_IF_ERROR(tree_parents_.put(tree.parents, BN, exec_.stream, &d));
    d_tree.parents = d;
    if (tree.node_count != nullptr) {
      SPECDEC_RETURN_IF_ERROR(node_count_.put(tree.node_count, B, exec_.stream, &d));
      d_tree.node_count = d;
    }
    SPECDEC_RETURN_IF_ERROR(depth_.put(links.depth, BN, exec_.stream, &d));
    d_links.depth = d;
    SPECDEC_RETURN_IF_ERROR(first_child_.put(links.first_child, BN, exec_.stream, &d));
    d_links.first_child = d;
    SPECDEC_RETURN_IF_ERROR(next_sibling_.put(links.next_sibling, BN, exec_.stream, &d));
    d_links.next_sibling = d;
    SPECDEC_RETURN_IF_ERROR(tree_status_.put(links.tree_status, B, exec_.stream, &d));
    d_links.tree_status = d;
    SPECDEC_RETURN_IF_ERROR(path_.reserve(B * P));
    SPECDEC_RETURN_IF_ERROR(num_accepted_.reserve(B));
    SPECDEC_RETURN_IF_ERROR(next_token_.reserve(B));
    Acceptance const d_out{path_.data(), num_accepted_.data(), next_token_.data(),
                           out.path_capacity};
    int const V = static_cast<int>(model_->config.vocab_size);
    std::vector<int32_t> status(B, ops::kSampleOk);
    if (out_.argmax != nullptr) SPECDEC_RETURN_IF_ERROR(check_argmax_batch("CudaTarget", s));
    if (s.all_greedy) {
      SPECDEC_RETURN_IF_ERROR(argmax_.reserve(BN));
      ops::VerifyGreedyParams p;
      p.tree = d_tree;
      p.links = d_links;
      p.logits = out_.argmax ? nullptr : out_.logits;
      p.target_argmax = out_.argmax;
      p.vocab = V;
      p.argmax_scratch = argmax_.data();
      p.out = d_out;
      SPECDEC_RETURN_IF_ERROR(ops::verify_greedy(exec_, p));
    } else {
      ops::VerifySampleParams p;
      p.tree = d_tree;
      p.links = d_links;
      p.logits = out_.logits;
      p.vocab = V;
      SPECDEC_RETURN_IF_ERROR(put_sampling(s, &p.config, &p.keys));
      p.out = d_out;
      SPECDEC_RETURN_IF_ERROR(status_.reserve(B));
      p.status = status_.data();
      size_t const ws = ops::verify_sample_workspace_bytes(tree.batch, tree.nodes, V);
      SPECDEC_RETURN_IF_ERROR(workspace_.reserve((ws + 7) / 8));
      p.workspace = workspace_.data();
      p.workspace_bytes = ws;
      SPECDEC_RETURN_IF_ERROR(ops::verify_sample(exec_, p));
      SPECDEC_RETURN_IF_ERROR(status_.get(status.data(), B, exec_.stream));
    }
    SPECDEC_RETURN_IF_ERROR(path_.get(out.accepted_path, B * P, exec_.stream));
    SPECDEC_RETURN_IF_ERROR(num_accepted_.get(out.num_accepted, B, exec_.stream));
    SPECDEC_RETURN_IF_ERROR(next_token_.get(out.next_token, B, exec_.stream));
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    return ops::check_sample_status(status.data(), tree.batch);
  }

  // kv_commit on the device entries, reading the acceptance already on the device (accept()).
  Status commit(std::span<RequestId const> ids, Acceptance const& acceptance) {
    std::vector<int32_t> table, prefix, seq_len(ids.size()), status(ids.size());
    ops::KvCommitParams p;
    SPECDEC_RETURN_IF_ERROR(cache_.table.kv_commit_params(ids, &table, &prefix, &p));
    int32_t* d = nullptr;
    SPECDEC_RETURN_IF_ERROR(page_table_.put(table, exec_.stream, &d));
    p.page_table = d;
    SPECDEC_RETURN_IF_ERROR(prefix_.put(prefix, exec_.stream, &d));
    p.prefix_len = d;
    p.acceptance = Acceptance{path_.data(), num_accepted_.data(), next_token_.data(),
                              acceptance.path_capacity};
    SPECDEC_RETURN_IF_ERROR(seq_len_.reserve(ids.size()));
    SPECDEC_RETURN_IF_ERROR(status_.reserve(ids.size()));
    p.seq_len_out = seq_len_.data();
    p.status = status_.data();
    SPECDEC_RETURN_IF_ERROR(ops::kv_commit(exec_, p));
    SPECDEC_RETURN_IF_ERROR(seq_len_.get(seq_len.data(), ids.size(), exec_.stream));
    SPECDEC_RETURN_IF_ERROR(status_.get(status.data(), ids.size(), exec_.stream));
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    return finish_commit(ids, status, seq_len, &cache_.table);
  }

  // The last forward's aux rows `rows` (host indices into its rows) gathered on the device:
  // *features = [rows.size(), aux_width] device floats, valid until the next call.
  Status gather_aux_rows(std::span<int64_t const> rows, std::span<float const>* features) {
    int64_t const F = out_.aux_width, n = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < n; ++i) {
      if (rows[i] < 0 || rows[i] >= out_.tokens) {
        return Status::Internal("CudaTarget::gather_aux_rows: rows[" + std::to_string(i) + "] = " +
                                std::to_string(rows[i]) + " is outside the last forward's " +
                                std::to_string(out_.tokens) + " rows");
      }
    }
    int64_t* d_rows = nullptr;
    SPECDEC_RETURN_IF_ERROR(aux_index_.put(rows.data(), rows.size(), exec_.stream, &d_rows));
    SPECDEC_RETURN_IF_ERROR(
        aux_gathered_.reserve(static_cast<size_t>(std::max<int64_t>(n * F, 1))));
    SPECDEC_RETURN_IF_ERROR(
        detail::gather_rows(out_.aux, d_rows, n, F, aux_gathered_.data(), exec_.stream));
    *features = {aux_gathered_.data(), static_cast<size_t>(n * F)};
    return Status::Ok();
  }

  int64_t aux_width() const { return out_.aux_width; }

 private:
  model::kimi::LogitsMode logits_mode(bool all_greedy) const {
    return logits_mode_for(all_greedy, model_->vocab.size() != model_->config.vocab_size);
  }
  // The host waits for the forward, so that the engine's phase times (verify, then accept +
  // commit) each hold their own GPU work; the step reads the acceptance back right after anyway.
  Status finish_forward() {
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    return Status::Ok();
  }

  Status put_sampling(BatchSampling const& s, ops::SamplingConfig* config, RandomKeys* keys) {
    float* f = nullptr;
    SPECDEC_RETURN_IF_ERROR(temperature_.put(s.temperature, exec_.stream, &f));
    config->temperature = f;
    SPECDEC_RETURN_IF_ERROR(top_p_.put(s.top_p, exec_.stream, &f));
    config->top_p = f;
    int32_t* k = nullptr;
    SPECDEC_RETURN_IF_ERROR(top_k_.put(s.top_k, exec_.stream, &k));
    config->top_k = k;
    uint64_t* seed = nullptr;
    SPECDEC_RETURN_IF_ERROR(seed_.put(s.seed, exec_.stream, &seed));
    uint32_t *step = nullptr, *id = nullptr;
    SPECDEC_RETURN_IF_ERROR(step_.put(s.step, exec_.stream, &step));
    SPECDEC_RETURN_IF_ERROR(request_id_.put(s.request_id, exec_.stream, &id));
    *keys = RandomKeys{seed, step, id};
    return Status::Ok();
  }

  Model* model_;
  CudaExecutor exec_;
  model::kimi::KimiCudaCache cache_;
  model::kimi::CudaForwardOutput out_;
  detail::Staging<float> picked_, temperature_, top_p_, aux_gathered_;
  detail::Staging<int32_t> tokens_, status_, top_k_, tree_tokens_, tree_parents_, node_count_,
      depth_, first_child_, next_sibling_, tree_status_, path_, num_accepted_, next_token_, argmax_,
      page_table_, prefix_, seq_len_;
  detail::Staging<uint64_t> seed_, workspace_;
  detail::Staging<int64_t> aux_index_;
  detail::Staging<uint32_t> step_, request_id_;
};

}  // namespace specdec::engine
