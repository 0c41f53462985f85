// The engine's target on the CUDA executor: the Kimi CUDA forward (model/kimi/forward_cuda.cuh)
// over a device MLA cache, and the CUDA kernels of sample / verify / kv_commit / commit_tokens on
// its device logits. The same calls as CpuTarget (engine/target_cpu.hpp), except for the aux
// rows; the arrays they take and give are host arrays: the small per-step arrays (tree, links,
// sampling, stops, acceptance, page tables) are copied to the device on the executor's stream
// and the results read back (the host waits once per call: accept_commit's upload, verify,
// kv_commit and commit_tokens, read-back are one round trip; verify itself returns without
// waiting, its forward queued before them), while logits stay on the device. A
// vocabulary-sharded target keeps only the argmax of an all-greedy batch, as CpuTarget does.
//   build_device_tree(ids [B], N, tokens, parents [B, N] device, P) / verify_device_tree /
//   accept_commit_device(ids, sampling, stops, &acceptance, extra device words, &also)
//       the engine's device-resident step: the tree never comes to the host (tree_build and
//       kimi_verify_device_tree on the device), and the one read-back holds the acceptance,
//       the commit record and `extra` (the draft's proposal status)
//   set_graph_ladder(sizes)   the policy's graph ladder (policy/graph.hpp; before create_cache):
//       verify forwards run padded to it and eagerly above it (model/kimi/forward_cuda.cuh's
//       cuda_forward); create_cache adds one page for the filler rows
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
#include "specdec/ops/commit_tokens/commit_tokens.hpp"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "specdec/ops/sample/sample.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"
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

  void set_graph_ladder(std::span<int const> batch_sizes) { ladder_ = batch_sizes; }

  // With a graph ladder the cache holds one page more than total_pages: the padded forwards'
  // filler page, taken at once, so that requests still have total_pages.
  Status create_cache(int page_size, int total_pages, int max_pages_per_request) {
    int const extra = ladder_.empty() ? 0 : 1;
    SPECDEC_RETURN_IF_ERROR(model::kimi::KimiCudaCache::create_for(
        model_->config, page_size, total_pages + extra, max_pages_per_request, &cache_));
    int32_t page = -1;
    return extra ? cache_.table.padding_page(&page) : Status::Ok();
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
                                                     logits_mode(all_greedy), ladder_));
    return Status::Ok();  // queued: accept_commit queues behind it and waits once for both
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

  // verify_greedy / verify_sample, then kv_commit reading the acceptance on the device and
  // ops::commit_tokens stopping the requests there, in one round trip: the tree, its links,
  // kv_commit's page table / prefix lengths and the stops go up as one copy; the acceptance,
  // the new lengths, the statuses and the commit record (*record) come back as one, after one
  // wait.
  // A sampling failure is reported after kv_commit ran on the device; the host's cache
  // bookkeeping is then unchanged (the rows it moved lie past every committed prefix).
  Status accept_commit(std::span<RequestId const> ids, TreeInput const& tree,
                       TreeLinks const& links, BatchSampling const& s, BatchStops const& stops,
                       Acceptance const& out, std::vector<int32_t>* record) {
    return accept_commit_on(ids, tree, links, true, s, out, &stops, {}, record);
  }

  // The device-resident step: build_device_tree lays out the draft's tree (tokens / parents
  // [B, N], device) with tree_build on the device (prefix lengths from the cache, path
  // capacity P); verify_device_tree runs kimi_verify_device_tree over it; both queued without
  // a wait. The tree stays here for accept_commit_device.
  Status build_device_tree(std::span<RequestId const> ids, int nodes, int32_t const* tokens,
                           int32_t const* parents, int path_capacity) {
    size_t const B = ids.size(), BN = B * static_cast<size_t>(nodes);
    size_t const W = static_cast<size_t>(mask_words(nodes)), P = static_cast<size_t>(path_capacity);
    std::vector<int32_t> prefix(B);
    for (size_t b = 0; b < B; ++b) {
      int64_t length = 0;
      SPECDEC_RETURN_IF_ERROR(cache_.table.length(ids[b], &length));
      prefix[b] = static_cast<int32_t>(length);
    }
    int32_t* d_prefix = nullptr;
    SPECDEC_RETURN_IF_ERROR(prefix_.put(prefix, exec_.stream, &d_prefix));
    // [mask BN W | depth | positions | first_child | next_sibling BN each | leaf_paths BN P |
    // leaf_count B | tree_status B]
    SPECDEC_RETURN_IF_ERROR(tree_.reserve(BN * (W + 4 + P) + 2 * B));
    int32_t* t = tree_.data();
    ops::TreeBuildParams tb;
    tb.tree = TreeInput{tokens, parents, nullptr, static_cast<int>(B), nodes};
    tb.prefix_len = d_prefix;
    tb.out.mask = reinterpret_cast<uint32_t*>(t);
    tb.out.depth = t + BN * W;
    tb.out.positions = tb.out.depth + BN;
    tb.out.first_child = tb.out.positions + BN;
    tb.out.next_sibling = tb.out.first_child + BN;
    tb.out.leaf_paths = tb.out.next_sibling + BN;
    tb.out.leaf_count = tb.out.leaf_paths + BN * P;
    tb.out.tree_status = tb.out.leaf_count + B;
    tb.out.path_capacity = path_capacity;
    SPECDEC_RETURN_IF_ERROR(ops::tree_build(exec_, tb));
    device_ids_.assign(ids.begin(), ids.end());
    device_tree_ = tb.tree;
    device_links_ = TreeLinks{tb.out.depth, tb.out.first_child, tb.out.next_sibling,
                              tb.out.tree_status};
    forward_tree_ = model::kimi::DeviceTree{tokens, tb.out.positions, tb.out.mask};
    return Status::Ok();
  }
  Status verify_device_tree(std::span<int const> aux_layers, bool all_greedy) {
    return model::kimi::kimi_verify_device_tree(exec_, *model_, &cache_.table, device_ids_,
                                                device_tree_.nodes, forward_tree_, aux_layers,
                                                &out_, logits_mode(all_greedy), ladder_);
  }

  // accept_commit over build_device_tree's tree, then ops::commit_tokens with the batch's
  // stops, in the step's one read-back: the acceptance into `out` and, into *also_host, [the
  // commit record [B, commit_record_width(P)] | the device words `extra`] (the proposal's
  // status and error record): what the step commits, not the tree. A tree_build failure is
  // the first error reported.
  Status accept_commit_device(std::span<RequestId const> ids, BatchSampling const& s,
                              BatchStops const& stops, Acceptance const& out,
                              std::span<int32_t const> extra, std::vector<int32_t>* also_host) {
    if (!std::equal(ids.begin(), ids.end(), device_ids_.begin(), device_ids_.end())) {
      return Status::Internal("CudaTarget::accept_commit_device: the batch is not the one of "
                              "the last build_device_tree");
    }
    std::span<int32_t const> const also[] = {extra};
    return accept_commit_on(ids, device_tree_, device_links_, false, s, out, &stops, also,
                            also_host);
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
  // Forwards replayed from a CUDA graph so far (KimiCudaModel::graphs).
  int64_t graph_replays() const { return model_->graphs.replays(); }
  // Whether the forwards are captured (KimiCudaModel::graphs on).
  bool graphs_on() const { return model_->graphs.capacity() > 0; }

 private:
  // accept_commit's work over a tree whose arrays are host arrays (`tree_on_host`: they go up
  // with kv_commit's page table) or device arrays, and with `stops` ops::commit_tokens after
  // kv_commit. The download: the acceptance, the new lengths, the statuses (kv_commit's, the
  // sampler's, the tree's), then into *also_host the commit record (with stops) and the
  // device words of `also`. Errors in order: the tree's status, the sampler's, kv_commit's.
  Status accept_commit_on(std::span<RequestId const> ids, TreeInput const& tree,
                          TreeLinks const& links, bool tree_on_host, BatchSampling const& s,
                          Acceptance const& out, BatchStops const* stops,
                          std::span<std::span<int32_t const> const> also,
                          std::vector<int32_t>* also_host) {
    size_t const B = static_cast<size_t>(tree.batch), BN = B * static_cast<size_t>(tree.nodes);
    size_t const P = static_cast<size_t>(out.path_capacity);
    if (out_.argmax != nullptr) SPECDEC_RETURN_IF_ERROR(check_argmax_batch("CudaTarget", s));
    std::vector<int32_t> table, prefix;
    ops::KvCommitParams kc;
    SPECDEC_RETURN_IF_ERROR(cache_.table.kv_commit_params(ids, &table, &prefix, &kc));
    // The upload: [page table | prefix lengths], after a host tree [tokens | parents |
    // node_count? | depth | first_child | next_sibling | tree_status].
    upload_.clear();
    auto append = [&](int32_t const* host, size_t n) {
      size_t const at = upload_.size();
      upload_.insert(upload_.end(), host, host + n);
      return at;
    };
    TreeInput d_tree = tree;
    TreeLinks d_links = links;
    size_t at_tokens = 0, at_parents = 0, at_count = 0, at_depth = 0, at_first = 0, at_next = 0,
           at_status = 0;
    if (tree_on_host) {
      at_tokens = append(tree.tokens, BN);
      at_parents = append(tree.parents, BN);
      at_count = tree.node_count != nullptr ? append(tree.node_count, B) : 0;
      at_depth = append(links.depth, BN);
      at_first = append(links.first_child, BN);
      at_next = append(links.next_sibling, BN);
      at_status = append(links.tree_status, B);
    }
    size_t const at_table = append(table.data(), table.size());
    size_t const at_prefix = append(prefix.data(), prefix.size());
    std::vector<int32_t> const stop_words = stops ? stops->flat() : std::vector<int32_t>{};
    size_t const at_stops = append(stop_words.data(), stop_words.size());
    int32_t* up = nullptr;
    SPECDEC_RETURN_IF_ERROR(upload_device_.put(upload_, exec_.stream, &up));
    if (tree_on_host) {
      d_tree.tokens = up + at_tokens;
      d_tree.parents = up + at_parents;
      if (tree.node_count != nullptr) d_tree.node_count = up + at_count;
      d_links = TreeLinks{up + at_depth, up + at_first, up + at_next, up + at_status};
    }
    // The download: [path B x P | num_accepted | next_token | seq_len | commit status |
    // sample status | tree status | also...].
    size_t const results = B * P + 6 * B;
    size_t const record_words =
        stops ? B * static_cast<size_t>(ops::commit_record_width(out.path_capacity)) : 0;
    size_t also_words = record_words;
    for (std::span<int32_t const> a : also) also_words += a.size();
    SPECDEC_RETURN_IF_ERROR(results_.reserve(results + also_words));
    int32_t* const r = results_.data();
    int32_t* const seq_len = r + B * P + 2 * B;
    int32_t* const commit_status = seq_len + B;
    int32_t* const sample_status = commit_status + B;
    int32_t* const tree_status = sample_status + B;
    Acceptance const d_out{r, r + B * P, r + B * P + B, out.path_capacity};
    int const V = static_cast<int>(model_->config.vocab_size);
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
      p.status = sample_status;
      size_t const ws = ops::verify_sample_workspace_bytes(tree.batch, tree.nodes, V);
      SPECDEC_RETURN_IF_ERROR(workspace_.reserve((ws + 7) / 8));
      p.workspace = workspace_.data();
      p.workspace_bytes = ws;
      SPECDEC_RETURN_IF_ERROR(ops::verify_sample(exec_, p));
    }
    kc.page_table = up + at_table;
    kc.prefix_len = up + at_prefix;
    kc.acceptance = d_out;
    kc.seq_len_out = seq_len;
    kc.status = commit_status;
    SPECDEC_RETURN_IF_ERROR(ops::kv_commit(exec_, kc));
    SPECDEC_CUDA_TRY(cudaMemcpyAsync(tree_status, d_links.tree_status, B * 4,
                                     cudaMemcpyDeviceToDevice, exec_.stream));
    if (stops != nullptr) {
      SPECDEC_RETURN_IF_ERROR(ops::commit_tokens(
          exec_, stops->params(d_tree, d_links.depth, d_out, up + at_stops, r + results)));
    }
    int32_t* to = r + results + record_words;
    for (std::span<int32_t const> a : also) {
      if (a.empty()) continue;
      SPECDEC_CUDA_TRY(cudaMemcpyAsync(to, a.data(), a.size() * 4, cudaMemcpyDeviceToDevice,
                                       exec_.stream));
      to += a.size();
    }
    download_.resize(results + also_words);
    SPECDEC_RETURN_IF_ERROR(results_.get(download_.data(), download_.size(), exec_.stream));
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    int32_t const* h = download_.data();
    std::copy_n(h, B * P, out.accepted_path);
    std::copy_n(h + B * P, B, out.num_accepted);
    std::copy_n(h + B * P + B, B, out.next_token);
    if (also_host != nullptr) also_host->assign(h + results, h + results + also_words);
    SPECDEC_RETURN_IF_ERROR(check_tree_status(h + B * P + 5 * B, tree.batch));
    if (!s.all_greedy) {
      SPECDEC_RETURN_IF_ERROR(ops::check_sample_status(h + B * P + 4 * B, tree.batch));
    }
    std::span<int32_t const> const lengths(h + B * P + 2 * B, B), statuses(h + B * P + 3 * B, B);
    return finish_commit(ids, statuses, lengths, &cache_.table);
  }

  model::kimi::LogitsMode logits_mode(bool all_greedy) const {
    return logits_mode_for(all_greedy, model_->vocab.size() != model_->config.vocab_size);
  }
  // The host waits for a prefill forward, so that the engine's prefill time (the host's) holds
  // its GPU work. A verify is not waited for (the engine's step clock times it on the stream).
  Status finish_forward() {
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    return Status::Ok();
  }

  // The batch's sampling settings on the device. top_k / top_p stay nullptr (the ops' "none",
  // so they launch no threshold kernel) when no request of the batch has one: every top_k <= 0
  // and every top_p exactly 1, the values that mean "none" row by row; any other value, an
  // invalid one included, goes up for the kernels to apply or report.
  Status put_sampling(BatchSampling const& s, ops::SamplingConfig* config, RandomKeys* keys) {
    float* f = nullptr;
    SPECDEC_RETURN_IF_ERROR(temperature_.put(s.temperature, exec_.stream, &f));
    config->temperature = f;
    config->top_p = nullptr;
    if (std::any_of(s.top_p.begin(), s.top_p.end(), [](float p) { return p != 1.0f; })) {
      SPECDEC_RETURN_IF_ERROR(top_p_.put(s.top_p, exec_.stream, &f));
      config->top_p = f;
    }
    config->top_k = nullptr;
    if (std::any_of(s.top_k.begin(), s.top_k.end(), [](int32_t k) { return k > 0; })) {
      int32_t* k = nullptr;
      SPECDEC_RETURN_IF_ERROR(top_k_.put(s.top_k, exec_.stream, &k));
      config->top_k = k;
    }
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
  std::span<int const> ladder_;  // the policy's (static storage); empty: no padding
  model::kimi::KimiCudaCache cache_;
  model::kimi::CudaForwardOutput out_;
  detail::Staging<float> picked_, temperature_, top_p_, aux_gathered_;
  detail::Staging<int32_t> tokens_, status_, top_k_, argmax_, upload_device_, results_, prefix_,
      tree_;
  // build_device_tree's batch and tree (device arrays)
  std::vector<RequestId> device_ids_;
  TreeInput device_tree_;
  TreeLinks device_links_;
  model::kimi::DeviceTree forward_tree_;
  std::vector<int32_t> upload_, download_;
  detail::Staging<uint64_t> seed_, workspace_;
  detail::Staging<int64_t> aux_index_;
  detail::Staging<uint32_t> step_, request_id_;
};

}  // namespace specdec::engine
