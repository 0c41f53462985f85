// The CUDA executor's Kimi-K2.5 / DeepseekV3 forward: the same model, batches and cache
// bookkeeping as the CPU executor (forward_cpu.hpp's top comment; the checks are forward_plan.hpp's,
// shared), on one GPU.
//   load_kimi_cuda_model(weights, config, &model)      device copy of the checkpoint (bf16 as
//                                                       stored, INT4 experts packed as stored)
//   generate_kimi_cuda_model(config, seed, shard, comm, &model)
//                                                       the same with random weights drawn on the
//                                                       device (random_device.cuh), no checkpoint
//   KimiCudaCache::create_for(config, page_size, num_pages, max_pages_per_request, &cache)
//                                                       MlaCache bookkeeping over device entries
//   kimi_prefill / kimi_decode / kimi_verify(CudaExecutor{stream}, model, &cache.table, ...,
//                                            aux_layers, &out[, LogitsMode])
//                                                       decode / verify also [, graph ladder]
//   kimi_verify_device_tree(..., nodes, DeviceTree{tokens, positions, mask}, ...)
//                                                       a verify whose tree is on the device
// Arguments are the CPU executor's (host spans); the outputs stay on the device:
//   out.logits [T, V] fp32, out.aux [T, |aux_layers| * H] fp32 (device pointers into the model's
//   scratch, valid until the model's next forward; copy_to_host copies them); with
//   LogitsMode::kArgmax (forward_plan.hpp) out.argmax [T] int32 and out.logits only this rank's
//   vocabulary slice [T, out.vocab = vocab.size()].
// The host waits for the forward only to upload the batch's metadata (positions, cache rows,
// page tables, masks); the math is queued on the stream, launched kernel by kernel or, with
// model.graphs on, replayed from a CUDA graph captured for the forward's ForwardShape.
// kimi_decode / kimi_verify take a graph ladder (policy/graph.hpp; last argument, default none):
// a batch of B requests runs padded to the smallest ladder size >= B, and above the largest size
// eagerly, never captured (cuda_forward).
//
// Per layer (T tokens; bf16 GEMMs (gemm_bf16: ops::linear_bf16 up to 8 rows, cuBLAS beyond) take
// bf16 inputs and accumulate in fp32, so the activations entering a GEMM are rounded to bf16 as
// in a bf16 inference engine):
//   xn = rms(x, input_layernorm) (fp32 -> bf16); q = xn q_proj^T or q_b(rms(xn q_a^T)) (fp32)
//   kva = xn kv_a^T; cache row of each token = [rms(kva[:c], kv_a_layernorm) | rope(kva[c:])]
//   qabs[t, h] = [q_nope_h W_UK_h (one strided-batched GEMM over heads) | rope(q_pe_h)]
//   lat = ops::mla_attention(qabs, cache) [T, nh, c]; o_h = lat_h W_UV_h^T (gemm_bf16 batched
//         over the heads, bf16)
//   x += o o_proj^T (the GEMM accumulates into x)
//   xn = rms(x, post_attention_layernorm) (fp32 and bf16)
//   dense: x += down(silu(xn gate^T) * (xn up^T))   (gate / up one GEMM over stacked weights,
//          as are q_a / kv_a: the loader places each pair in one block)
//   MoE:   router logits = xn gate^T in fp32 (on an fp32 copy of gate: expert choice must not
//          hinge on bf16 rounding) and ops::moe_route's routing (up to 8 tokens one launch,
//          cuda::router_logits_route; else SGEMM and ops::moe_route),
//          ops::moe_experts (fp32 xn, bf16 or INT4 experts) and the shared experts as dense,
//          both added into x (tensor parallel: into y, summed over the ranks, then x += y);
//          up to kSharedExpertsSideMaxTokens tokens the shared experts run on the model's side
//          stream beside the router and the routed experts, joined before their sum is added
// then logits = rms(x, norm) lm_head^T (fp32). aux: the residual stream x after the listed layers.
// Versus the CPU executor (fp32 everywhere): logits agree to bf16 activation rounding (about 1e-2
// relative at the tiny preset), greedy tokens where the top-2 gap exceeds that.
// The kernels of this file and of the ops it calls run with programmatic dependent launch
// (core/cuda.cuh; forwards of up to kProgrammaticLaunchMaxTokens tokens): each may start while the
// one before it finishes; cuBLAS's do not.
//
// Memory: the weights as stored (bf16 2 bytes / parameter, INT4 experts 0.5625), plus fp32 copies
// of the routers and the scratch (grows with the largest batch seen). Kimi-K2.5 whole needs about
// 600 GB: one GPU holds the tiny preset or a few layers; all of it needs tensor parallel over
// several GPUs (load_kimi_cuda_model with a TpShard and the rank's NCCL communicator).
//
// Errors: everything forward_plan.hpp checks; a cache whose entries are not device memory; a
// linear outside the routed experts stored as INT4 (the dense GEMMs are bf16); mixed bf16 / INT4
// experts in one layer; CUDA and cuBLAS failures, named with the call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "specdec/core/convert.cuh"
#include "specdec/core/cuda.cuh"
#include "specdec/core/cuda_graph.cuh"
#include "specdec/core/status.hpp"
#include "specdec/dist/nccl.cuh"
#include "specdec/io/hf_config.hpp"
#include "specdec/model/kimi/forward_plan.hpp"
#include "specdec/model/kimi/forward_reference.hpp"
#include "specdec/model/kimi/layer_kernels.cuh"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/model/kimi/random_device.cuh"
#include "specdec/model/kimi/shard.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "specdec/ops/linear_bf16/linear_bf16.hpp"
#include "specdec/ops/mla_attention/mla_attention.hpp"
#include "specdec/ops/moe_experts/moe_experts.hpp"
#include "specdec/ops/moe_route/moe_route.hpp"
#include "specdec/policy/graph.hpp"

namespace specdec::model::kimi {

inline Status cublas_status(cublasStatus_t s, char const* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::CudaError(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

struct CudaMlp {
  uint16_t const* gate_proj = nullptr;  // bf16 [I, H]
  uint16_t const* up_proj = nullptr;    // bf16 [I, H] = gate_proj + I * H (one GEMM for both)
  uint16_t const* down_proj = nullptr;  // bf16 [H, I]
  int64_t inter = 0;
};

struct CudaLayer {
  uint16_t const* input_layernorm = nullptr;           // [H]
  uint16_t const* post_attention_layernorm = nullptr;  // [H]
  bool q_lora = false;
  uint16_t const* q_a_proj = nullptr;       // [ql, H], kv_a_proj_with_mqa right after it
  uint16_t const* q_a_layernorm = nullptr;  // [ql]
  uint16_t const* q_b_proj = nullptr;       // [nh*qk, ql]
  uint16_t const* q_proj = nullptr;         // [nh*qk, H]
  uint16_t const* kv_a_proj_with_mqa = nullptr;  // [c+r, H]
  uint16_t const* kv_a_layernorm = nullptr;      // [c]
  uint16_t const* kv_b_proj = nullptr;           // [nh*(dq+dv), c]
  uint16_t const* o_proj = nullptr;              // [H, nh*dv]
  bool moe = false;
  CudaMlp mlp;                         // dense
  float const* gate = nullptr;         // fp32 [E, H]       (moe)
  float const* bias = nullptr;         // fp32 [E] or null  (moe)
  bool has_shared_experts = false;
  CudaMlp shared_experts;
  ops::MoeExpertWeights experts;       // device pointer tables of the experts held (moe)
};

// Forwards of up to this many tokens run a MoE layer's shared experts on the model's side stream,
// beside the routed experts (cuda_mlp). Measured on the kimi-k2.5-1gpu preset (graph replays,
// benchmarks/RESULTS.md): 3-4% faster at 1-8 tokens, 1% at 16, 2% slower at 32.
constexpr int64_t kSharedExpertsSideMaxTokens = 16;

// The workspace each cuBLAS handle is given once, so that it never allocates inside a forward (a
// graph capture): the target's and the draft's (model/eagle/forward_cuda.cuh).
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// A cuBLAS handle that owns its workspace (kCublasWorkspaceBytes, set once): two handles' GEMMs
// may run at the same time on two streams. Empty until create().
class CublasHandle {
 public:
  // `what` names the owner in the error messages.
  static Status create(std::string const& what, CublasHandle* out) {
    cublasHandle_t h = nullptr;
    SPECDEC_RETURN_IF_ERROR(cublas_status(cublasCreate(&h), "cublasCreate").prefixed(what));
    out->handle_.reset(h);
    out->workspace_ = DeviceBuffer<uint8_t>(kCublasWorkspaceBytes);
    if (out->workspace_.data() == nullptr) {
      return Status::CudaError(what + "cudaMalloc of a cuBLAS workspace failed");
    }
    return cublas_status(cublasSetWorkspace(h, out->workspace_.data(), kCublasWorkspaceBytes),
                         "cublasSetWorkspace")
        .prefixed(what);
  }
  cublasHandle_t get() const { return handle_.get(); }

 private:
  struct Deleter {
    void operator()(cublasHandle_t h) const { cublasDestroy(h); }
  };
  DeviceBuffer<uint8_t> workspace_;  // declared first: freed after the handle
  std::unique_ptr<cublasContext, Deleter> handle_;
};

class KimiCudaModel;
namespace detail {
// What a captured forward bakes in (core/cuda_graph.cuh's key): sizes, grid bounds, the batch
// metadata's layout, the cache (its entries and geometry: a cache freed and another made at the
// same address must not match); the batch's values are read from the device at replay.
struct ForwardShape {
  int64_t tokens = 0, batch = 0, meta_ints = 0;
  int max_pages = 0, words = 0;
  int64_t max_slots = 0;
  bool tree = false;
  LogitsMode mode = LogitsMode::kFull;
  std::vector<int> aux_layers;
  float const* cache = nullptr;
  int page_size = 0, num_pages = 0;
  bool operator==(ForwardShape const&) const = default;
};
Status load_cuda_model_impl(KimiWeights const&, io::DeepseekV3Config const&, dist::TpShard const&,
                            dist::NcclCommunicator*, KimiRandomWeights const*, KimiCudaModel*);
}  // namespace detail

// Device weights and the per-forward scratch of one model on one GPU. Move-only. A
// tensor-parallel rank holds its shard (dist/shard.hpp; the CPU model's, forward_cpu.hpp): nh ->
// heads, widths / P, experts, lm_head rows vocab; its forward sums the partial outputs through
// comm (NCCL, on the forward's stream) and gathers the logits' vocabulary slices.
class KimiCudaModel {
 public:
  io::DeepseekV3Config config;
  std::vector<double> inv_freq;  // host copy of rope_inv_freq(config)
  uint16_t const* embed_tokens = nullptr;  // bf16 [V, H]
  uint16_t const* lm_head = nullptr;       // bf16 [vocab.size(), H]
  uint16_t const* norm = nullptr;          // bf16 [H]
  double const* inv_freq_device = nullptr;  // [r/2]
  std::vector<CudaLayer> layers;
  uint64_t weight_bytes = 0;
  dist::TpShard shard;
  dist::NcclCommunicator* comm = nullptr;  // null: size 1 without NCCL
  int64_t heads = 0;                       // attention heads held
  dist::Range experts;                     // routed experts held
  dist::Range vocab;                       // lm_head rows held
  int64_t expert_width = 0;                // width of each routed expert held (I or I / P)

  // Decode and verify forwards captured as CUDA graphs, one per detail::ForwardShape (prefill
  // stays eager); capacity 0 (the default) runs every forward eagerly. Captured and eager
  // forwards give the same bits (same kernels, same order); a graph saves the host's per-kernel
  // launch work (~25 kernels per layer) and the gaps between kernels. Needs a created stream.
  GraphCache<detail::ForwardShape> graphs;
  // Decode / verify forwards given a graph ladder (cuda_forward) that ran padded, and that ran
  // above it (eagerly).
  int64_t padded_forwards = 0, above_ladder_forwards = 0;

  KimiCudaModel() = default;
  KimiCudaModel(KimiCudaModel&&) = default;
  KimiCudaModel& operator=(KimiCudaModel&&) = default;

  cublasHandle_t cublas() const { return cublas_.get(); }
  bool loaded() const { return cublas_.get() != nullptr; }
  // A second stream, with its own cuBLAS handle (bound to it, with its own workspace) and the
  // two events that fork work onto it and join it back: a MoE layer's shared experts run there
  // beside the router and the routed experts (cuda_mlp). Inside a graph capture the fork and the
  // join become the graph's edges.
  cudaStream_t side_stream() const { return side_stream_.get(); }
  cublasHandle_t side_cublas() const { return side_cublas_.get(); }
  cudaEvent_t fork_event() const { return fork_event_.get(); }
  cudaEvent_t join_event() const { return join_event_.get(); }
  // The counter cuda::router_logits_route's blocks arrive on (0 between launches; the forwards
  // of one model run one at a time).
  unsigned* router_arrivals() const { return router_arrivals_.data(); }

  // Scratch of a forward over T tokens; grown, never shrunk.
  struct Scratch {
    float *x, *xn, *q, *qa, *kva, *qabs, *lat, *g, *router, *moe_y, *moe_w, *logits, *aux;
    float* shared_y;  // [T, H]: the shared experts' output when they run on the side stream
    float *part, *gathered;  // tensor parallel: a partial output [T, H]; logits slices [P, T, V/P]
    uint64_t *keys, *keys_all;  // row argmax keys [T], every rank's [P, T] (LogitsMode::kArgmax)
    int32_t* argmax;            // [T]
    uint16_t *xn_bf, *q_bf, *qa_bf, *lat_bf, *o_bf, *h_bf;
    int32_t* ids;
    int32_t* meta;  // the batch's int32 metadata (forward_cuda's BatchMeta)
    void* moe_workspace;
    void* attention_workspace;
  };

 private:
  struct StreamDeleter {
    void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
  };
  struct EventDeleter {
    void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
  };
  CublasHandle cublas_;
  DeviceBuffer<uint8_t> arena_;  // the weights
  std::unique_ptr<CUstream_st, StreamDeleter> side_stream_;
  CublasHandle side_cublas_;
  std::unique_ptr<CUevent_st, EventDeleter> fork_event_, join_event_;
  DeviceBuffer<unsigned> router_arrivals_;
  DeviceBuffer<uint8_t> scratch_arena_;
  size_t scratch_bytes_ = 0;

  friend Status detail::load_cuda_model_impl(KimiWeights const&, io::DeepseekV3Config const&,
                                             dist::TpShard const&, dist::NcclCommunicator*,
                                             KimiRandomWeights const*, KimiCudaModel*);
  friend Status reserve_scratch(KimiCudaModel&, int64_t, int, int64_t, int64_t, Scratch*);
};

// The MLA cache of a CUDA model: MlaCache bookkeeping (table) over device entries. Move-only.
struct KimiCudaCache {
  DeviceBuffer<float> entries;
  MlaCache table;

  static Status create_for(io::DeepseekV3Config const& c, int page_size, int num_pages,
                           int max_pages_per_request, KimiCudaCache* out) {
    if (out == nullptr) return Status::InvalidArgument("KimiCudaCache::create_for: out is null");
    int64_t const floats = MlaCache::floats_needed(c.num_hidden_layers, c.kv_lora_rank,
                                                   c.qk_rope_head_dim, page_size, num_pages);
    if (page_size < 1 || num_pages < 1 || floats <= 0) {
      return Status::InvalidArgument("KimiCudaCache::create_for: page_size " +
                                     std::to_string(page_size) + " and num_pages " +
                                     std::to_string(num_pages) + " must be >= 1");
    }
    KimiCudaCache c2;
    c2.entries = DeviceBuffer<float>(static_cast<size_t>(floats));
    if (c2.entries.data() == nullptr) {
      return Status::CudaError("KimiCudaCache::create_for: cudaMalloc of " +
                               std::to_string(floats * 4) + " bytes of cache entries failed");
    }
    SPECDEC_CUDA_TRY(cudaMemset(c2.entries.data(), 0, static_cast<size_t>(floats) * 4));
    SPECDEC_RETURN_IF_ERROR(MlaCache::create_external(
        c2.entries.data(), floats, c.num_hidden_layers, c.kv_lora_rank, c.qk_rope_head_dim,
        page_size, num_pages, max_pages_per_request, &c2.table));
    *out = std::move(c2);
    return Status::Ok();
  }
};

// A verify's tree already on the device (kimi_verify_device_tree): tokens [B*N], positions
// [B*N] and ancestor-or-self mask rows [B*N, ceil(N/32)], request after request, as tree_build
// writes them.
struct DeviceTree {
  int32_t const* tokens = nullptr;
  int32_t const* positions = nullptr;
  uint32_t const* mask = nullptr;
};

// A forward's outputs, on the device (the model's scratch: valid until its next forward).
struct CudaForwardOutput {
  float const* logits = nullptr;  // [T, V] ([T, vocab] with LogitsMode::kArgmax)
  int32_t const* argmax = nullptr;  // [T] (LogitsMode::kArgmax), else null
  float const* aux = nullptr;     // [T, |aux_layers| * H] or null
  int64_t tokens = 0;
  int64_t vocab = 0;
  int64_t aux_width = 0;  // |aux_layers| * H
};

// Copies `count` floats from the device (e.g. out.logits) to *host, waiting for `stream`.
inline Status copy_to_host(float const* device, int64_t count, cudaStream_t stream,
                           std::vector<float>* host) {
  host->resize(static_cast<size_t>(count));
  if (count == 0) return Status::Ok();
  SPECDEC_CUDA_TRY(cudaMemcpyAsync(host->data(), device, static_cast<size_t>(count) * 4,
                                   cudaMemcpyDeviceToHost, stream));
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize (copy_to_host)");
}

namespace detail {

// Bump allocator over one device allocation: first a sizing pass (base == nullptr), then the real.
struct DeviceCarver {
  uint8_t* base = nullptr;
  size_t used = 0;
  template <class T>
  T* take(int64_t count) {
    size_t const at = (used + 255) & ~size_t{255};
    used = at + static_cast<size_t>(std::max<int64_t>(count, 0)) * sizeof(T);
    return base ? reinterpret_cast<T*>(base + at) : nullptr;
  }
};

// A model's per-call scratch (*arena, *bytes long) made at least `needed` bytes: to the larger
// of `needed` and 1.5x its size, so rising sizes reallocate a few times only; never shrunk.
// cudaFree + cudaMalloc synchronise. *moved: whether the old arena was freed (whatever pointed
// into it, e.g. a captured graph, is stale), also when the new allocation fails.
inline Status grow_scratch(DeviceBuffer<uint8_t>* arena, size_t* bytes, size_t needed,
                           std::string const& what, bool* moved) {
  *moved = false;
  if (needed <= *bytes) return Status::Ok();
  size_t const size = std::max(needed, *bytes + *bytes / 2);
  *arena = DeviceBuffer<uint8_t>();
  *moved = true;
  *arena = DeviceBuffer<uint8_t>(size);
  if (arena->data() == nullptr) {
    *bytes = 0;
    return Status::CudaError(what + ": cudaMalloc of " + std::to_string(size) +
                             " bytes of scratch failed");
  }
  *bytes = size;
  return Status::Ok();
}

}  // namespace detail

// Device copy of the part of `weights` (bound for `config`) that tensor-parallel rank shard.rank
// holds (all of it at size 1), read from only those bytes of the checkpoint: one allocation for
// all the tensors, routers also as fp32, expert pointer tables for ops::moe_experts. At
// shard.size > 1, `comm` is that rank's NCCL communicator on this GPU (kept by the model; may be
// null at size 1).
namespace detail {
inline Status load_cuda_model_impl(KimiWeights const& w, io::DeepseekV3Config const& c,
                                   dist::TpShard const& shard, dist::NcclCommunicator* comm,
                                   KimiRandomWeights const* random, KimiCudaModel* out) {
  std::string const fn = std::string(random ? "generate_kimi_cuda_model (" : "load_kimi_cuda_model (") + c.source +
                         (shard.size > 1 ? ", rank " + std::to_string(shard.rank) + " of " +
                                               std::to_string(shard.size)
                                         : "") +
                         "): ";
  if (out == nullptr) return Status::InvalidArgument(fn + "out is null");
  SPECDEC_RETURN_IF_ERROR(detail::check_model_supported(w, c, fn));
  SPECDEC_RETURN_IF_ERROR(check_shard_communicator(shard, comm).prefixed(fn));
  ShardRanges R;
  SPECDEC_RETURN_IF_ERROR(shard_ranges(w, c, shard, &R).prefixed(fn));
  int const L = c.num_hidden_layers;
  int64_t const H = c.hidden_size, E = c.n_routed_experts, V = c.vocab_size;
  int64_t const nh = c.num_attention_heads, dq = c.qk_nope_head_dim, r = c.qk_rope_head_dim;
  int64_t const dv = c.v_head_dim, ckv = c.kv_lora_rank, qk = dq + r;
  int64_t const h0 = R.heads.begin, h1 = R.heads.end;
  KimiCudaModel m;
  m.config = c;
  m.shard = shard;
  m.comm = comm;  // may be null at size 1; given at size 1, the partial-output path runs
  m.heads = R.heads.size();
  m.experts = R.experts;
  m.vocab = R.vocab;
  m.expert_width = R.expert_width.size();
  SPECDEC_RETURN_IF_ERROR(rope_inv_freq(c, &m.inv_freq).prefixed(fn));

  // Two passes over the same walk: sizing (carver.base null, nothing copied), then copying.
  // A copy is `height` rows of `width` bytes, `pitch` bytes apart in the source (a shard's
  // block of a row-major matrix), packed in the destination.
  struct Pending {
    void* dst;
    void const* src;
    size_t width, pitch, height;
  };
  std::vector<Pending> copies;
  // A block of a tensor without bytes (random weights): drawn on the device instead of copied.
  struct Fill {
    void* dst;
    RandomDraw draw;
    int64_t cols, r0, r1, c0, c1;
  };
  std::vector<Fill> fills;
  // An INT4 expert's packed matrix [rows, cols/8], put in ops::moe_experts' tiled order once
  // copied or drawn.
  struct Tiling {
    int32_t* packed;
    int64_t rows, cols;
  };
  std::vector<Tiling> tilings;
  Status missing = Status::Ok();  // a view without bytes and no draw for it
  auto draw_of = [&](TensorView const& v) -> RandomDraw const* {
    RandomDraw const* d = random ? random->draw(v.name) : nullptr;
    if (d == nullptr && missing.ok()) {
      missing = Status::InvalidArgument(fn + "tensor \"" + std::string(v.name) +
                                        "\" holds no bytes (weights not loaded?)");
    }
    return d;
  };
  std::vector<std::vector<float>> floats_keep;  // fp32 conversions kept alive until copied
  std::vector<std::vector<uintptr_t>> tables_keep;
  detail::DeviceCarver carver;
  // Rows [r0, r1) x columns [c0, c1) of the row-major [*, cols] tensor v (elements of T), copied
  // (or drawn) into d, packed.
  auto into = [&]<class T>(TensorView const& v, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                           int64_t c1, T* d) -> void {
    if (carver.base && v.bytes.empty()) {
      if (RandomDraw const* draw = draw_of(v)) fills.push_back({d, *draw, cols, r0, r1, c0, c1});
    } else if (carver.base) {
      copies.push_back({d, v.bytes.data() + (r0 * cols + c0) * int64_t{sizeof(T)},
                        static_cast<size_t>(c1 - c0) * sizeof(T),
                        static_cast<size_t>(cols) * sizeof(T), static_cast<size_t>(r1 - r0)});
    }
  };
  // The same into a block of its own.
  auto block = [&]<class T>(TensorView const& v, int64_t rows, int64_t cols, int64_t r0,
                            int64_t r1, int64_t c0, int64_t c1, T** dst) -> void {
    T* d = carver.take<T>((r1 - r0) * (c1 - c0));
    into(v, cols, r0, r1, c0, c1, d);
    (void)rows;
    *dst = d;
  };
  auto check_bf16 = [&](TensorView const& v, int64_t rows, int64_t cols,
                        std::string const& what) -> Status {
    if (v.dtype != Dtype::kBF16 || v.numel() != rows * cols) {
      return Status::Unsupported(fn + what + " is " + std::string(dtype_name(v.dtype)) + " " +
                                 io::format_shape(v.shape) + ": the CUDA executor reads bf16 [" +
                                 std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
    return Status::Ok();
  };
  auto bf16_block = [&](TensorView const& v, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                        int64_t c0, int64_t c1, std::string const& what,
                        uint16_t const** dst) -> Status {
    SPECDEC_RETURN_IF_ERROR(check_bf16(v, rows, cols, what));
    uint16_t* d = nullptr;
    block(v, rows, cols, r0, r1, c0, c1, &d);
    *dst = d;
    return Status::Ok();
  };
  auto bf16 = [&](TensorView const& v, std::string const& what, uint16_t const** dst) -> Status {
    int64_t const n = v.numel();
    return bf16_block(v, 1, n, 0, 1, 0, n, what, dst);
  };
  // Rows [r0, r1) x columns [c0, c1) of the bf16 linear lw [o, i].
  auto linear = [&](LinearWeights const& lw, int64_t o, int64_t i, int64_t r0, int64_t r1,
                    int64_t c0, int64_t c1, std::string const& what,
                    uint16_t const** dst) -> Status {
    if (lw.int4) {
      return Status::Unsupported(fn + what + " is INT4; the CUDA executor reads INT4 only for the "
                                 "routed experts (list the module in quantization_config.ignore)");
    }
    return bf16_block(lw.weight, o, i, r0, r1, c0, c1, what, dst);
  };
  auto whole = [&](LinearWeights const& lw, std::string const& what, uint16_t const** dst) {
    return linear(lw, lw.out, lw.in, 0, lw.out, 0, lw.in, what, dst);
  };
  // Rows [a0, a1) of the bf16 linear a [ao, in] and rows [b0, b1) of b [bo, in] stacked in one
  // block (one GEMM computes both): *da its first row, *db = *da + (a1 - a0) * in.
  auto stacked = [&](LinearWeights const& a, int64_t ao, int64_t a0, int64_t a1,
                     std::string const& a_what, LinearWeights const& b, int64_t bo, int64_t b0,
                     int64_t b1, std::string const& b_what, int64_t in, uint16_t const** da,
                     uint16_t const** db) -> Status {
    for (auto const& [lw, what] : {std::pair{&a, &a_what}, std::pair{&b, &b_what}}) {
      if (lw->int4) {
        return Status::Unsupported(fn + *what + " is INT4; the CUDA executor reads INT4 only for "
                                   "the routed experts (list the module in "
                                   "quantization_config.ignore)");
      }
    }
    SPECDEC_RETURN_IF_ERROR(check_bf16(a.weight, ao, in, a_what));
    SPECDEC_RETURN_IF_ERROR(check_bf16(b.weight, bo, in, b_what));
    uint16_t* d = carver.take<uint16_t>((a1 - a0 + b1 - b0) * in);
    into(a.weight, in, a0, a1, 0, in, d);
    into(b.weight, in, b0, b1, 0, in, d ? d + (a1 - a0) * in : nullptr);
    *da = d;
    *db = d ? d + (a1 - a0) * in : nullptr;
    return Status::Ok();
  };
  auto f32 = [&](TensorView const& v, int64_t n, std::string const& what,
                 float const** dst) -> Status {
    if (v.bytes.empty()) {  // random weights: drawn in fp32 on the device
      float* d = carver.take<float>(n);
      if (carver.base) {
        if (RandomDraw const* draw = draw_of(v)) {
          RandomDraw f = *draw;
          if (f.kind == RandomDraw::Kind::kBf16) f.kind = RandomDraw::Kind::kBf16Widened;
          fills.push_back({d, f, n, 0, 1, 0, n});
        }
      }
      *dst = d;
      return Status::Ok();
    }
    std::vector<float> f;
    SPECDEC_RETURN_IF_ERROR(detail::view_to_float(v, n, what, &f).prefixed(fn));
    float* d = carver.take<float>(n);
    if (carver.base) {
      floats_keep.push_back(std::move(f));
      copies.push_back({d, floats_keep.back().data(), static_cast<size_t>(n) * 4,
                        static_cast<size_t>(n) * 4, 1});
    }
    *dst = d;
    return Status::Ok();
  };
  // gate / up rows (stacked: up_proj = gate_proj + part * H) and down columns `part` of a bf16
  // MLP of width inter.
  auto mlp = [&](MlpWeights const& mw, int64_t inter, dist::Range part, std::string const& p,
                 CudaMlp* o) -> Status {
    o->inter = part.size();
    SPECDEC_RETURN_IF_ERROR(stacked(mw.gate_proj, inter, part.begin, part.end, p + ".gate_proj",
                                    mw.up_proj, inter, part.begin, part.end, p + ".up_proj", H,
                                    &o->gate_proj, &o->up_proj));
    return linear(mw.down_proj, H, inter, 0, H, part.begin, part.end, p + ".down_proj",
                  &o->down_proj);
  };
  // A device array of E pointers (as T const* const*), filled from `ptrs` once the arena exists.
  auto table = [&]<class T>(std::vector<uintptr_t> ptrs, T const* const** dst) -> void {
    uintptr_t* d = carver.take<uintptr_t>(static_cast<int64_t>(ptrs.size()));
    if (carver.base) {
      tables_keep.push_back(std::move(ptrs));
      size_t const bytes = tables_keep.back().size() * sizeof(uintptr_t);
      copies.push_back({d, tables_keep.back().data(), bytes, bytes, 1});
    }
    *dst = reinterpret_cast<T const* const*>(d);
  };

  auto walk = [&]() -> Status {
    m.layers.assign(static_cast<size_t>(L), CudaLayer{});
    SPECDEC_RETURN_IF_ERROR(bf16(w.embed_tokens, "embed_tokens", &m.embed_tokens));
    SPECDEC_RETURN_IF_ERROR(
        bf16_block(w.lm_head, V, H, R.vocab.begin, R.vocab.end, 0, H, "lm_head", &m.lm_head));
    SPECDEC_RETURN_IF_ERROR(bf16(w.norm, "norm", &m.norm));
    double* inv = carver.take<double>(static_cast<int64_t>(m.inv_freq.size()));
    if (carver.base) {
      copies.push_back({inv, m.inv_freq.data(), m.inv_freq.size() * 8, m.inv_freq.size() * 8, 1});
    }
    m.inv_freq_device = inv;
    for (int li = 0; li < L; ++li) {
      LayerWeights const& l = w.layers[static_cast<size_t>(li)];
      CudaLayer& o = m.layers[static_cast<size_t>(li)];
      std::string const p = "layers." + std::to_string(li) + ".";
      std::string const a = p + "self_attn.";
      SPECDEC_RETURN_IF_ERROR(bf16(l.input_layernorm, p + "input_layernorm", &o.input_layernorm));
      SPECDEC_RETURN_IF_ERROR(bf16(l.post_attention_layernorm, p + "post_attention_layernorm",
                                   &o.post_attention_layernorm));
      o.q_lora = l.q_lora;
      if (l.q_lora) {  // q_a_proj and kv_a_proj_with_mqa stacked: both read xn
        int64_t const ql = *c.q_lora_rank;
        SPECDEC_RETURN_IF_ERROR(stacked(l.q_a_proj, ql, 0, ql, a + "q_a_proj",
                                        l.kv_a_proj_with_mqa, ckv + r, 0, ckv + r,
                                        a + "kv_a_proj_with_mqa", H, &o.q_a_proj,
                                        &o.kv_a_proj_with_mqa));
        SPECDEC_RETURN_IF_ERROR(bf16(l.q_a_layernorm, a + "q_a_layernorm", &o.q_a_layernorm));
        SPECDEC_RETURN_IF_ERROR(linear(l.q_b_proj, nh * qk, ql, h0 * qk, h1 * qk, 0, ql,
                                       a + "q_b_proj", &o.q_b_proj));
      } else {
        SPECDEC_RETURN_IF_ERROR(
            linear(l.q_proj, nh * qk, H, h0 * qk, h1 * qk, 0, H, a + "q_proj", &o.q_proj));
        SPECDEC_RETURN_IF_ERROR(
            whole(l.kv_a_proj_with_mqa, a + "kv_a_proj_with_mqa", &o.kv_a_proj_with_mqa));
      }
      SPECDEC_RETURN_IF_ERROR(bf16(l.kv_a_layernorm, a + "kv_a_layernorm", &o.kv_a_layernorm));
      SPECDEC_RETURN_IF_ERROR(linear(l.kv_b_proj, nh * (dq + dv), ckv, h0 * (dq + dv),
                                     h1 * (dq + dv), 0, ckv, a + "kv_b_proj", &o.kv_b_proj));
      SPECDEC_RETURN_IF_ERROR(
          linear(l.o_proj, H, nh * dv, 0, H, h0 * dv, h1 * dv, a + "o_proj", &o.o_proj));
      o.moe = l.moe;
      if (!l.moe) {
        SPECDEC_RETURN_IF_ERROR(mlp(l.mlp, c.intermediate_size, R.dense, p + "mlp", &o.mlp));
        continue;
      }
      SPECDEC_RETURN_IF_ERROR(f32(l.gate, E * H, p + "mlp.gate.weight", &o.gate));
      if (l.has_correction_bias) {
        SPECDEC_RETURN_IF_ERROR(
            f32(l.e_score_correction_bias, E, p + "mlp.gate.e_score_correction_bias", &o.bias));
      }
      o.has_shared_experts = l.has_shared_experts;
      if (l.has_shared_experts) {
        SPECDEC_RETURN_IF_ERROR(mlp(l.shared_experts,
                                    int64_t{c.n_shared_experts} * c.moe_intermediate_size, R.shared,
                                    p + "mlp.shared_experts", &o.shared_experts));
      }
      bool const int4 = l.experts[0].gate_proj.int4;
      o.experts = ops::MoeExpertWeights{};
      o.experts.int4 = int4;
      o.experts.group_size = int4 ? l.experts[0].gate_proj.group_size : 0;
      std::vector<uintptr_t> t[6];
      int64_t const M = c.moe_intermediate_size, m0 = R.expert_width.begin;
      int64_t const m1 = R.expert_width.end;
      for (int64_t e = R.experts.begin; e < R.experts.end; ++e) {
        MlpWeights const& x = l.experts[static_cast<size_t>(e)];
        std::string const pe = p + "mlp.experts." + std::to_string(e);
        LinearWeights const* lin[3] = {&x.gate_proj, &x.up_proj, &x.down_proj};
        char const* names[3] = {".gate_proj", ".up_proj", ".down_proj"};
        for (int k = 0; k < 3; ++k) {
          if (lin[k]->int4 != int4 || (int4 && lin[k]->group_size != o.experts.group_size)) {
            return Status::Unsupported(fn + pe + names[k] + " is " +
                                       (lin[k]->int4 ? "INT4" : "bf16") + " but " + p +
                                       "mlp.experts.0.gate_proj is " + (int4 ? "INT4" : "bf16") +
                                       " (one format and group size per layer)");
          }
          // gate / up: rows [m0, m1) of [M, H]; down: columns [m0, m1) of [H, M]
          bool const down = k == 2;
          int64_t const o_n = down ? H : M, i_n = down ? M : H;
          int64_t const r0 = down ? 0 : m0, r1 = down ? H : m1, c0 = down ? m0 : 0;
          int64_t const c1 = down ? m1 : H;
          if (int4) {
            int64_t const g = o.experts.group_size;
            TensorView const& pk = lin[k]->weight_packed;
            TensorView const& sc = lin[k]->weight_scale;
            if (pk.numel() != o_n * (i_n / 8) || sc.numel() != o_n * (i_n / g)) {
              return Status::Unsupported(fn + pe + names[k] + ": INT4 tensors of " +
                                         io::format_shape(pk.shape) + " / " +
                                         io::format_shape(sc.shape) + ", expected [" +
                                         std::to_string(o_n) + ", " + std::to_string(i_n) +
                                         "] in groups of " + std::to_string(g));
            }
            int32_t* dp = nullptr;
            uint16_t* ds = nullptr;
            block(pk, o_n, i_n / 8, r0, r1, c0 / 8, c1 / 8, &dp);
            block(sc, o_n, i_n / g, r0, r1, c0 / g, c1 / g, &ds);
            if (carver.base) tilings.push_back({dp, r1 - r0, c1 - c0});
            t[2 * k].push_back(reinterpret_cast<uintptr_t>(dp));
            t[2 * k + 1].push_back(reinterpret_cast<uintptr_t>(ds));
          } else {
            uint16_t const* d = nullptr;
            SPECDEC_RETURN_IF_ERROR(linear(*lin[k], o_n, i_n, r0, r1, c0, c1, pe + names[k], &d));
            t[2 * k].push_back(reinterpret_cast<uintptr_t>(d));
          }
        }
      }
      if (int4) {
        table(t[0], &o.experts.gate_packed);
        table(t[1], &o.experts.gate_scale);
        table(t[2], &o.experts.up_packed);
        table(t[3], &o.experts.up_scale);
        table(t[4], &o.experts.down_packed);
        table(t[5], &o.experts.down_scale);
      } else {
        table(t[0], &o.experts.gate);
        table(t[2], &o.experts.up);
        table(t[4], &o.experts.down);
      }
    }
    return Status::Ok();
  };
  SPECDEC_RETURN_IF_ERROR(walk());  // sizing
  m.arena_ = DeviceBuffer<uint8_t>(carver.used);
  if (m.arena_.data() == nullptr) {
    return Status::CudaError(fn + "cudaMalloc of " + std::to_string(carver.used) +
                             " bytes of weights failed (does the model fit this GPU?)");
  }
  m.weight_bytes = carver.used;
  carver = detail::DeviceCarver{m.arena_.data(), 0};
  SPECDEC_RETURN_IF_ERROR(walk());  // the device addresses, and the copies to make
  SPECDEC_RETURN_IF_ERROR(missing);
  for (auto const& cp : copies) {
    SPECDEC_CUDA_TRY(cudaMemcpy2D(cp.dst, cp.width, cp.src, cp.pitch, cp.width, cp.height,
                                  cudaMemcpyHostToDevice));
  }
  for (Fill const& f : fills) {
    SPECDEC_RETURN_IF_ERROR(
        fill_random_block(f.dst, f.draw, f.cols, f.r0, f.r1, f.c0, f.c1, nullptr).prefixed(fn));
  }
  if (!tilings.empty()) {  // in place, through a scratch copy of the largest matrix
    int64_t words = 0;
    for (Tiling const& t : tilings) words = std::max(words, t.rows * (t.cols / 8));
    DeviceBuffer<int32_t> row_major(static_cast<size_t>(words));
    if (row_major.data() == nullptr) {
      return Status::CudaError(fn + "cudaMalloc of " + std::to_string(words * 4) +
                               " bytes to tile the INT4 experts failed");
    }
    for (Tiling const& t : tilings) {
      SPECDEC_CUDA_TRY(cudaMemcpyAsync(row_major.data(), t.packed,
                                       static_cast<size_t>(t.rows * (t.cols / 8)) * 4,
                                       cudaMemcpyDeviceToDevice, nullptr));
      SPECDEC_RETURN_IF_ERROR(ops::moe_experts_tile_int4(CudaExecutor{nullptr}, row_major.data(),
                                                         t.rows, t.cols, t.packed)
                                  .prefixed(fn));
    }
  }
  SPECDEC_CUDA_TRY(cudaDeviceSynchronize());
  SPECDEC_RETURN_IF_ERROR(CublasHandle::create(fn, &m.cublas_));
  SPECDEC_RETURN_IF_ERROR(CublasHandle::create(fn, &m.side_cublas_));
  cudaStream_t side = nullptr;
  SPECDEC_CUDA_TRY(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  m.side_stream_.reset(side);
  SPECDEC_RETURN_IF_ERROR(
      cublas_status(cublasSetStream(m.side_cublas_.get(), side), "cublasSetStream (side)"));
  for (auto* e : {&m.fork_event_, &m.join_event_}) {
    cudaEvent_t event = nullptr;
    SPECDEC_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    e->reset(event);
  }
  m.router_arrivals_ = DeviceBuffer<unsigned>(1);
  if (m.router_arrivals_.data() == nullptr) {
    return Status::CudaError(fn + "cudaMalloc of the router's arrivals counter failed");
  }
  SPECDEC_RETURN_IF_ERROR(m.router_arrivals_.fill_bytes(0));
  *out = std::move(m);
  return Status::Ok();
}

}  // namespace detail

inline Status load_kimi_cuda_model(KimiWeights const& w, io::DeepseekV3Config const& c,
                                   dist::TpShard const& shard, dist::NcclCommunicator* comm,
                                   KimiCudaModel* out) {
  return detail::load_cuda_model_impl(w, c, shard, comm, nullptr, out);
}

inline Status load_kimi_cuda_model(KimiWeights const& w, io::DeepseekV3Config const& c,
                                   KimiCudaModel* out) {
  return load_kimi_cuda_model(w, c, dist::TpShard{}, nullptr, out);
}

// The model of `config` with random weights drawn on the device from `seed` (random_device.cuh:
// no checkpoint, no host copy of the weights; the same values at every tensor-parallel size),
// sharded as load_kimi_cuda_model shards a checkpoint.
inline Status generate_kimi_cuda_model(io::DeepseekV3Config const& c, uint64_t seed,
                                       dist::TpShard const& shard, dist::NcclCommunicator* comm,
                                       KimiCudaModel* out) {
  KimiRandomWeights random;
  SPECDEC_RETURN_IF_ERROR(KimiRandomWeights::create(c, seed, &random)
                              .prefixed("generate_kimi_cuda_model (" + c.source + "): "));
  return detail::load_cuda_model_impl(random.weights, c, shard, comm, &random, out);
}

// Makes *s point at scratch for T tokens, A aux layers, a batch of B requests with metadata of
// `meta_ints` int32 values and an attention over at most max_slots slots.
inline Status reserve_scratch(KimiCudaModel& m, int64_t T, int A, int64_t meta_ints,
                              int64_t max_slots, KimiCudaModel::Scratch* s) {
  io::DeepseekV3Config const& c = m.config;
  int64_t const H = c.hidden_size, V = c.vocab_size, nh = m.heads;
  int64_t const qk = c.qk_nope_head_dim + c.qk_rope_head_dim, ckv = c.kv_lora_rank;
  int64_t const W = ckv + c.qk_rope_head_dim, dv = c.v_head_dim, E = c.n_routed_experts;
  int64_t const ql = c.q_lora_rank.value_or(0), K = c.num_experts_per_tok;
  int64_t const inter = std::max<int64_t>(
      {c.intermediate_size, int64_t{c.n_shared_experts} * c.moe_intermediate_size, 1});
  bool const tp = m.comm != nullptr;
  size_t const moe_ws = ops::moe_experts_workspace_bytes(
      static_cast<int>(T), static_cast<int>(K), static_cast<int>(m.experts.size()),
      static_cast<int>(H), static_cast<int>(m.expert_width));
  size_t const att_ws = ops::mla_attention_workspace_bytes(
      static_cast<int>(T), static_cast<int>(nh), static_cast<int>(ckv), static_cast<int>(max_slots));
  auto carve = [&](detail::DeviceCarver& cv) {
    s->x = cv.take<float>(T * H);
    s->xn = cv.take<float>(T * H);
    s->q = cv.take<float>(T * nh * qk);
    s->qa = cv.take<float>(T * (ql + W));  // [T, ql + W]: q_a | kv_a, one GEMM's output
    s->kva = s->qa ? s->qa + ql : nullptr;
    s->qabs = cv.take<float>(T * nh * W);
    s->lat = cv.take<float>(T * nh * ckv);
    s->g = cv.take<float>(T * 2 * inter);  // [T, 2 I]: gate | up, one GEMM's output
    s->router = cv.take<float>(T * E);
    s->moe_y = cv.take<float>(T * H);
    s->shared_y = cv.take<float>(std::min(T, kSharedExpertsSideMaxTokens) * H);
    s->moe_w = cv.take<float>(T * K);
    s->logits = cv.take<float>(T * V);
    s->aux = cv.take<float>(T * A * H);
    s->part = tp ? cv.take<float>(T * H) : nullptr;
    s->gathered = tp && m.vocab.size() != V ? cv.take<float>(T * V) : nullptr;
    s->keys = cv.take<uint64_t>(T);
    s->keys_all = cv.take<uint64_t>(T * (m.comm ? m.comm->size() : 1));
    s->argmax = cv.take<int32_t>(T);
    s->xn_bf = cv.take<uint16_t>(T * H);
    s->q_bf = cv.take<uint16_t>(T * nh * qk);
    s->qa_bf = cv.take<uint16_t>(T * ql);
    s->lat_bf = cv.take<uint16_t>(T * nh * ckv);
    s->o_bf = cv.take<uint16_t>(T * nh * dv);
    s->h_bf = cv.take<uint16_t>(T * inter);
    s->ids = cv.take<int32_t>(T * K);
    s->meta = cv.take<int32_t>(meta_ints);
    s->moe_workspace = cv.take<uint8_t>(static_cast<int64_t>(moe_ws));
    s->attention_workspace = cv.take<uint8_t>(static_cast<int64_t>(att_ws));
  };
  detail::DeviceCarver sizing;
  carve(sizing);
  bool moved = false;
  Status const grown = detail::grow_scratch(&m.scratch_arena_, &m.scratch_bytes_, sizing.used,
                                            "kimi forward (cuda)", &moved);
  if (moved) m.graphs.clear();  // they point into the old scratch
  SPECDEC_RETURN_IF_ERROR(grown);
  detail::DeviceCarver real{m.scratch_arena_.data(), 0};
  carve(real);
  return Status::Ok();
}

namespace detail {

// The widest weight gemm_bf16 gives ops::linear_bf16: up to here (Kimi's q_a, q_b, the shared
// expert, o_proj 112 MiB) it runs with programmatic dependent launch, its first weight loads
// overlapping the kernel before it, and beats cuBLAS (6-13% at T <= 8 on the narrow ones alone);
// lm_head (2.35 GB) stays on cuBLAS: 3-6% faster on the H200 before linear_bf16's 128-byte loads,
// 2.5% slower on an H100 after them, the H200 not remeasured (benchmarks/RESULTS.md).
constexpr int64_t kLinearBf16MaxWeightBytes = int64_t{128} << 20;

// A batch of gemm_bf16 products (e.g. one per attention head): product b reads X + b x and
// W + b w and writes Y + b y (element offsets).
struct GemmBatch {
  int count = 1;
  int64_t x = 0, w = 0, y = 0;
};

// Y [T, out] (row stride ldy, fp32 or bf16) = X [T, in] (bf16, row stride ldx) W^T, W bf16
// [out, in] model weights (never written by stream work: ops::linear_bf16's w_constant); beta 1
// accumulates into an fp32 Y; `batch` products of these shapes. Up to kLinearBf16MaxTokens rows
// (decode, verify) of weights up to kLinearBf16MaxWeightBytes run ops::linear_bf16 where its
// alignment holds; the rest cuBLAS (strided-batched for a batch).
inline Status gemm_bf16(cublasHandle_t h, int64_t T, int64_t out, int64_t in, uint16_t const* X,
                        int64_t ldx, uint16_t const* Wt, void* Y, cudaDataType_t ytype,
                        int64_t ldy, float beta, char const* what, GemmBatch batch = {}) {
  if (T == 0) return Status::Ok();
  if (T <= ops::kLinearBf16MaxTokens && 2 * out * in * batch.count <= kLinearBf16MaxWeightBytes) {
    ops::LinearBf16Params lp;
    lp.x = X;
    lp.ldx = ldx;
    lp.w = Wt;
    lp.tokens = static_cast<int>(T);
    lp.out = out;
    lp.in = in;
    lp.y = Y;
    lp.y_bf16 = ytype == CUDA_R_16BF;
    lp.ldy = ldy;
    lp.beta = beta;
    lp.batch = batch.count;
    lp.x_batch = batch.x;
    lp.w_batch = batch.w;
    lp.y_batch = batch.y;
    lp.w_constant = true;  // model weights
    if (ops::linear_bf16_error(lp).empty()) {
      cudaStream_t stream = nullptr;
      SPECDEC_RETURN_IF_ERROR(cublas_status(cublasGetStream(h, &stream), what));
      return ops::linear_bf16(CudaExecutor{stream}, lp);
    }
  }
  float const alpha = 1.0f;
  if (batch.count == 1) {
    return cublas_status(
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(T),
                     static_cast<int>(in), &alpha, Wt, CUDA_R_16BF, static_cast<int>(in), X,
                     CUDA_R_16BF, static_cast<int>(ldx), &beta, Y, ytype, static_cast<int>(ldy),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        what);
  }
  return cublas_status(
      cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
                                 static_cast<int>(T), static_cast<int>(in), &alpha, Wt,
                                 CUDA_R_16BF, static_cast<int>(in), batch.w, X, CUDA_R_16BF,
                                 static_cast<int>(ldx), batch.x, &beta, Y, ytype,
                                 static_cast<int>(ldy), batch.y, batch.count, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
      what);
}

// The batch's int32 metadata, laid out in one upload. The attention's bounds are rounded up
// (slots to kSlotBucket, page-table columns to kPageBucket; unused columns hold -1) so that a
// request's decode keeps one ForwardShape, and one captured graph, for kSlotBucket tokens; the
// forward rounds them the same way with or without graphs.
struct BatchMeta {
  static constexpr int64_t kSlotBucket = 256;
  static constexpr int kPageBucket = 8;
  std::vector<int32_t> host;
  int64_t num_tokens = 0, batch = 0;  // rows and requests, filler included
  int64_t tokens = 0, positions = 0, rows = 0, token_request = 0, token_index = 0, base = 0,
          page_table = 0, mask = 0;
  int max_pages = 0;       // page-table columns: the most pages a request holds, rounded up
  int words = 0;           // mask words per token (verify)
  int64_t max_slots = 1;   // the largest base + count, rounded up: the attention's slot bound
};

// Filler requests appended to a batch (cuda_forward's graph ladder): `requests` of `tokens`
// rows each, on cache page `page`.
struct BatchPadding {
  int64_t requests = 0, tokens = 0;
  int32_t page = -1;
};

inline Status build_meta(MlaCache const& cache, ForwardPlan const& plan, BatchPadding const& pad,
                         BatchMeta* m) {
  int64_t const T0 = plan.num_tokens(), B0 = static_cast<int64_t>(plan.segments.size());
  int64_t const T = T0 + pad.requests * pad.tokens, B = B0 + pad.requests;
  m->num_tokens = T;
  m->batch = B;
  int max_pages = 1;
  for (ForwardSegment const& s : plan.segments) {
    std::span<int32_t const> pages;
    SPECDEC_RETURN_IF_ERROR(cache.pages(s.id, &pages));
    max_pages = std::max(max_pages, static_cast<int>(pages.size()));
    m->max_slots = std::max(m->max_slots, s.base + s.count);
  }
  if (int64_t{cache.num_pages()} * cache.page_size() > (int64_t{1} << 31) - 1) {
    return Status::Unsupported("kimi forward (cuda): " + std::to_string(cache.num_pages()) +
                               " pages x " + std::to_string(cache.page_size()) +
                               " slots exceed the int32 cache rows");
  }
  m->max_pages = (max_pages + BatchMeta::kPageBucket - 1) / BatchMeta::kPageBucket *
                 BatchMeta::kPageBucket;
  m->max_slots = (m->max_slots + BatchMeta::kSlotBucket - 1) / BatchMeta::kSlotBucket *
                 BatchMeta::kSlotBucket;
  m->words = plan.words;
  int64_t at = 0;
  auto region = [&](int64_t n) { int64_t const r = at; at += n; return r; };
  m->tokens = region(T);
  m->positions = region(T);
  m->rows = region(T);
  m->token_request = region(T);
  m->token_index = region(T);
  m->base = region(B);
  m->page_table = region(B * m->max_pages);
  int const words = std::max(plan.words, 1);
  m->mask = region(plan.mask.empty() ? 0 : T * words);
  m->host.assign(static_cast<size_t>(at), -1);
  int32_t* h = m->host.data();
  for (int64_t b = 0; b < B0; ++b) {
    ForwardSegment const& s = plan.segments[static_cast<size_t>(b)];
    std::span<int32_t const> pages;
    SPECDEC_RETURN_IF_ERROR(cache.pages(s.id, &pages));
    std::copy(pages.begin(), pages.end(), h + m->page_table + b * m->max_pages);
    h[m->base + b] = static_cast<int32_t>(s.base);
    for (int64_t i = 0; i < s.count; ++i) {
      int64_t const t = s.first + i;
      h[m->tokens + t] = plan.tokens[static_cast<size_t>(t)];
      h[m->positions + t] = static_cast<int32_t>(plan.positions[static_cast<size_t>(t)]);
      h[m->rows + t] = static_cast<int32_t>(s.rows[static_cast<size_t>(s.base + i)]);
      h[m->token_request + t] = static_cast<int32_t>(b);
      h[m->token_index + t] = static_cast<int32_t>(i);
    }
  }
  std::copy(plan.mask.begin(), plan.mask.end(), reinterpret_cast<uint32_t*>(h + m->mask));
  // Filler rows: every page-table column on the padding page, token i at slot i (row page * ps +
  // i % ps), position i, seeing only itself in a tree.
  int64_t const ps = cache.page_size();
  for (int64_t b = B0; b < B; ++b) {
    std::fill_n(h + m->page_table + b * m->max_pages, m->max_pages, pad.page);
    h[m->base + b] = 0;
    for (int64_t i = 0; i < pad.tokens; ++i) {
      int64_t const t = T0 + (b - B0) * pad.tokens + i;
      h[m->tokens + t] = 0;
      h[m->positions + t] = static_cast<int32_t>(i);
      h[m->rows + t] = static_cast<int32_t>(pad.page * ps + i % ps);
      h[m->token_request + t] = static_cast<int32_t>(b);
      h[m->token_index + t] = static_cast<int32_t>(i);
      if (!plan.mask.empty()) {
        uint32_t* row = reinterpret_cast<uint32_t*>(h + m->mask) + t * words;
        std::fill_n(row, words, 0u);
        row[i / 32] = uint32_t{1} << (i % 32);
      }
    }
  }
  return Status::Ok();
}

// y = beta y + down(silu(xn gate^T) * (xn up^T)) over T tokens, y [T, H] fp32, on the stream
// cuBLAS handle h is bound to (scratch: s.g, s.h_bf).
inline Status cuda_swiglu(cublasHandle_t h, CudaMlp const& w, int64_t T, int64_t H,
                          KimiCudaModel::Scratch const& s, float* y, float beta) {
  int64_t const I = w.inter;
  cudaStream_t stream = nullptr;
  SPECDEC_RETURN_IF_ERROR(cublas_status(cublasGetStream(h, &stream), "cublasGetStream"));
  // gate and up in one GEMM (up_proj = gate_proj + I * H): s.g [T, 2 I] = [g | u]
  SPECDEC_RETURN_IF_ERROR(gemm_bf16(h, T, 2 * I, H, s.xn_bf, H, w.gate_proj, s.g, CUDA_R_32F,
                                    2 * I, 0.0f, "gemm gate_proj + up_proj (stacked)"));
  SPECDEC_RETURN_IF_ERROR(cuda::silu_mul_bf16(s.g, s.g + I, T, I, 2 * I, s.h_bf, stream));
  return gemm_bf16(h, T, H, I, s.h_bf, I, w.down_proj, y, CUDA_R_32F, H, beta, "gemm down_proj");
}

// The tensor-parallel sum of `part` [T, H] (this rank's partial output) added to x; at size 1
// part is x itself and there is nothing to do.
inline Status cuda_reduce_into_x(KimiCudaModel const& m, int64_t T, float* part,
                                 KimiCudaModel::Scratch const& s, cudaStream_t stream) {
  if (part == s.x) return Status::Ok();
  int64_t const H = m.config.hidden_size;
  if (m.comm != nullptr) SPECDEC_RETURN_IF_ERROR(m.comm->all_reduce_sum(part, T * H));
  return cuda::add_into(s.x, part, T * H, stream);
}

inline Status cuda_attention(KimiCudaModel const& m, int li, MlaCache* cache, BatchMeta const& bm,
                             int32_t const* meta, int64_t T, int64_t B, bool tree,
                             KimiCudaModel::Scratch const& s, cudaStream_t stream) {
  io::DeepseekV3Config const& c = m.config;
  CudaLayer const& l = m.layers[static_cast<size_t>(li)];
  int64_t const H = c.hidden_size, nh = m.heads, dq = c.qk_nope_head_dim;
  int64_t const r = c.qk_rope_head_dim, dv = c.v_head_dim, ckv = c.kv_lora_rank;
  int64_t const qk = dq + r, W = ckv + r;
  double const eps = c.rms_norm_eps;
  cublasHandle_t const h = m.cublas();
  // s.qa [T, QA = ql + W] = [q_a | kv_a] (q_lora: one GEMM over the stacked weights).
  int64_t const ql = c.q_lora_rank.value_or(0), QA = ql + W;
  float* layer = cache->layer(li);
  int32_t const* positions = meta + bm.positions;
  // One launch: bf16 rms(q_a) (q_lora) and the tokens' cache entries [rms(c_kv) | rope(k_pe)].
  cuda::MlaLatentRows lr;
  lr.qa = s.qa;
  lr.stride = QA;
  lr.tokens = T;
  lr.q_lora = static_cast<int>(ql);
  lr.q_norm = l.q_a_layernorm;
  lr.qa_bf = s.qa_bf;
  lr.kv_lora = static_cast<int>(ckv);
  lr.kv_norm = l.kv_a_layernorm;
  lr.cache = layer;
  lr.cache_stride = W;
  lr.rows = meta + bm.rows;
  lr.pairs = static_cast<int>(r / 2);
  lr.positions = positions;
  lr.inv_freq = m.inv_freq_device;
  lr.cos_sin_scale = c.rope_cos_sin_scale();
  lr.eps = eps;
  if (l.q_lora) {
    SPECDEC_RETURN_IF_ERROR(gemm_bf16(h, T, QA, H, s.xn_bf, H, l.q_a_proj, s.qa, CUDA_R_32F, QA,
                                      0.0f, "gemm q_a_proj + kv_a_proj_with_mqa (stacked)"));
    SPECDEC_RETURN_IF_ERROR(cuda::mla_latent_rows(lr, stream));
    SPECDEC_RETURN_IF_ERROR(gemm_bf16(h, T, nh * qk, ql, s.qa_bf, ql, l.q_b_proj, s.q, CUDA_R_32F,
                                      nh * qk, 0.0f, "gemm q_b_proj"));
  } else {
    SPECDEC_RETURN_IF_ERROR(gemm_bf16(h, T, nh * qk, H, s.xn_bf, H, l.q_proj, s.q, CUDA_R_32F,
                                      nh * qk, 0.0f, "gemm q_proj"));
    SPECDEC_RETURN_IF_ERROR(gemm_bf16(h, T, W, H, s.xn_bf, H, l.kv_a_proj_with_mqa, s.kva,
                                      CUDA_R_32F, QA, 0.0f, "gemm kv_a_proj_with_mqa"));
    SPECDEC_RETURN_IF_ERROR(cuda::mla_latent_rows(lr, stream));
  }
  // One launch: bf16 q_nope (W_UK's operand) and qabs[t, h, c:] = rope(q_pe_h).
  cuda::QueryRows qr;
  qr.q = s.q;
  qr.q_bf = s.q_bf;
  qr.qabs = s.qabs;
  qr.qabs_head_stride = W;
  qr.pe_at = ckv;
  qr.tokens = T;
  qr.heads = static_cast<int>(nh);
  qr.nope = static_cast<int>(dq);
  qr.pairs = static_cast<int>(r / 2);
  qr.positions = positions;
  qr.inv_freq = m.inv_freq_device;
  qr.cos_sin_scale = c.rope_cos_sin_scale();
  SPECDEC_RETURN_IF_ERROR(cuda::query_rows(qr, stream));
  float const one = 1.0f, zero = 0.0f;
  // Column-major view, per head h: qabs_h^T [c, T] = W_UK_h^T [c, dq] q_nope_h^T [dq, T].
  SPECDEC_RETURN_IF_ERROR(cublas_status(
      cublasGemmStridedBatchedEx(
          h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(ckv), static_cast<int>(T),
          static_cast<int>(dq), &one, l.kv_b_proj, CUDA_R_16BF, static_cast<int>(ckv),
          (dq + dv) * ckv, s.q_bf, CUDA_R_16BF, static_cast<int>(nh * qk), qk, &zero, s.qabs,
          CUDA_R_32F, static_cast<int>(nh * W), W, static_cast<int>(nh), CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT),
      "gemm absorbed q (W_UK)"));
  ops::MlaAttentionParams ap;
  ap.q = s.qabs;
  ap.cache = layer;
  ap.tokens = static_cast<int>(T);
  ap.heads = static_cast<int>(nh);
  ap.kv_lora_rank = static_cast<int>(ckv);
  ap.rope_dim = static_cast<int>(r);
  ap.scale = static_cast<float>(c.softmax_scale());
  ap.token_request = meta + bm.token_request;
  ap.token_index = meta + bm.token_index;
  ap.batch = static_cast<int>(B);
  ap.base = meta + bm.base;
  ap.page_table = meta + bm.page_table;
  ap.max_pages = bm.max_pages;
  ap.page_size = cache->page_size();
  ap.num_pages = cache->num_pages();
  ap.mask = tree ? reinterpret_cast<uint32_t const*>(meta + bm.mask) : nullptr;
  ap.words = tree ? bm.words : 0;
  ap.max_slots = static_cast<int>(bm.max_slots);
  ap.out = s.lat;
  ap.workspace = s.attention_workspace;
  ap.workspace_bytes = ops::mla_attention_workspace_bytes(ap.tokens, ap.heads, ap.kv_lora_rank,
                                                          ap.max_slots);
  SPECDEC_RETURN_IF_ERROR(ops::mla_attention(CudaExecutor{stream}, ap));
  SPECDEC_RETURN_IF_ERROR(to_bf16_cuda(s.lat, T * nh * ckv, s.lat_bf, stream));
  // Per head h: o_h [T, dv] = lat_h [T, c] W_UV_h^T (bf16 out), one batch over the heads.
  SPECDEC_RETURN_IF_ERROR(gemm_bf16(h, T, dv, ckv, s.lat_bf, nh * ckv, l.kv_b_proj + dq * ckv,
                                    s.o_bf, CUDA_R_16BF, nh * dv, 0.0f,
                                    "gemm attention output (W_UV)",
                                    {static_cast<int>(nh), ckv, (dq + dv) * ckv, dv}));
  // x += o o_proj^T (tensor parallel: this rank's heads' share, summed over the ranks)
  float* const part = m.comm ? s.part : s.x;
  SPECDEC_RETURN_IF_ERROR(gemm_bf16(h, T, H, nh * dv, s.o_bf, nh * dv, l.o_proj, part, CUDA_R_32F,
                                    H, m.comm ? 0.0f : 1.0f, "gemm o_proj"));
  return cuda_reduce_into_x(m, T, part, s, stream);
}

inline Status cuda_mlp(KimiCudaModel const& m, int li, int64_t T, KimiCudaModel::Scratch const& s,
                       cudaStream_t stream) {
  io::DeepseekV3Config const& c = m.config;
  CudaLayer const& l = m.layers[static_cast<size_t>(li)];
  if (!l.moe) {
    float* const part = m.comm ? s.part : s.x;
    SPECDEC_RETURN_IF_ERROR(
        cuda_swiglu(m.cublas(), l.mlp, T, c.hidden_size, s, part, m.comm ? 0.0f : 1.0f));
    return cuda_reduce_into_x(m, T, part, s, stream);
  }
  int64_t const H = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  float const one = 1.0f, zero = 0.0f;
  // With few tokens the shared experts run on the side stream, into s.shared_y, while the router,
  // moe_route and the routed experts run on this one: the router's chain of small kernels leaves
  // the HBM idle and the routed experts' streams leave it short of its bandwidth, which the shared
  // experts' weights fill. The routed experts' last kernel (their weighted sum into y) waits for
  // the side stream and adds s.shared_y after the sum (moe_experts' addend): the same float adds
  // in the same order as the shared down projection accumulating into y after the routed experts
  // (as it still does above the bound).
  bool const side = l.has_shared_experts && T <= kSharedExpertsSideMaxTokens;
  if (side) {
    SPECDEC_CUDA_TRY(cudaEventRecord(m.fork_event(), stream));
    SPECDEC_CUDA_TRY(cudaStreamWaitEvent(m.side_stream(), m.fork_event(), 0));
    SPECDEC_RETURN_IF_ERROR(
        cuda_swiglu(m.side_cublas(), l.shared_experts, T, H, s, s.shared_y, 0.0f));
    SPECDEC_CUDA_TRY(cudaEventRecord(m.join_event(), m.side_stream()));
  }
  // Router logits [T, E] in fp32 and the routing: a decode's or verify's few tokens in one
  // kernel (router_logits_route: its last block routes); else the logits by router_logits (few
  // tokens, too many experts for the routing's shared memory) or as a GEMM (column-major
  // logits^T [E, T] = gate [E, H] xn^T), then moe_route.
  ops::MoeRouteParams rp;
  rp.logits = s.router;
  rp.bias = l.bias;
  rp.tokens = static_cast<int>(T);
  rp.experts = static_cast<int>(E);
  rp.n_group = c.n_group;
  rp.topk_group = c.topk_group;
  rp.top_k = static_cast<int>(K);
  rp.norm = c.norm_topk_prob;
  rp.scale = static_cast<float>(c.routed_scaling_factor);
  rp.ids = s.ids;
  rp.weights = s.moe_w;
  if (cuda::router_logits_route_fits(T, H, s.xn, l.gate, E, K)) {
    SPECDEC_RETURN_IF_ERROR(
        cuda::router_logits_route(s.xn, l.gate, H, s.router, rp, m.router_arrivals(), stream));
  } else {
    if (cuda::router_logits_fits(T, H, s.xn, l.gate)) {
      SPECDEC_RETURN_IF_ERROR(cuda::router_logits(s.xn, l.gate, T, E, H, s.router, stream));
    } else {
      SPECDEC_RETURN_IF_ERROR(cublas_status(
          cublasSgemm(m.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(E),
                      static_cast<int>(T), static_cast<int>(H), &one, l.gate,
                      static_cast<int>(H), s.xn, static_cast<int>(H), &zero, s.router,
                      static_cast<int>(E)),
          "sgemm router"));
    }
    SPECDEC_RETURN_IF_ERROR(ops::moe_route(CudaExecutor{stream}, rp));
  }
  if (m.experts.size() != E) {  // expert parallel: ids of this rank's experts, -1 for the others'
    SPECDEC_RETURN_IF_ERROR(
        cuda::localize_expert_ids(s.ids, T * K, m.experts.begin, m.experts.end, stream));
  }
  ops::MoeExpertsParams ep;
  ep.x = s.xn;
  ep.ids = s.ids;
  ep.weights = s.moe_w;
  ep.tokens = static_cast<int>(T);
  ep.hidden = static_cast<int>(H);
  ep.inter = static_cast<int>(m.expert_width);
  ep.experts = static_cast<int>(m.experts.size());
  ep.top_k = static_cast<int>(K);
  ep.w = l.experts;
  // One GPU: the routed and the shared experts add straight into the residual stream x; tensor
  // parallel: into moe_y, summed over the ranks, then added to x.
  float* const y = m.comm ? s.moe_y : s.x;
  ep.y = y;
  ep.accumulate = m.comm == nullptr;
  ep.x_bf16 = s.xn_bf;  // the post-attention norm's bf16 copy of xn
  if (side) {  // the experts' last kernel adds the side stream's s.shared_y, once it is written
    ep.addend = s.shared_y;
    ep.addend_ready = m.join_event();
  }
  ep.workspace = s.moe_workspace;
  ep.workspace_bytes =
      ops::moe_experts_workspace_bytes(ep.tokens, ep.top_k, ep.experts, ep.hidden, ep.inter);
  SPECDEC_RETURN_IF_ERROR(ops::moe_experts(CudaExecutor{stream}, ep));
  if (!side && l.has_shared_experts) {
    SPECDEC_RETURN_IF_ERROR(cuda_swiglu(m.cublas(), l.shared_experts, T, H, s, y, 1.0f));
  }
  return cuda_reduce_into_x(m, T, y, s, stream);
}

// Forwards of up to this many tokens launch their kernels with programmatic dependent launch
// (core/cuda.cuh); larger ones plainly. Measured on the kimi-k2.5-1gpu preset (graph replays,
// benchmarks/RESULTS.md): 2% faster at 1 token, 0.2-1.4% at 2-32, but 7% slower at 64 tokens.
constexpr int64_t kProgrammaticLaunchMaxTokens = 32;

// The forward's work after the metadata upload, all of it queued on `stream` and reading the
// batch from s.meta: what a graph captures.
inline Status cuda_forward_queue(KimiCudaModel& m, MlaCache* cache, BatchMeta const& bm,
                                 ForwardShape const& shape, KimiCudaModel::Scratch const& s,
                                 cudaStream_t stream) {
  io::DeepseekV3Config const& c = m.config;
  int64_t const T = shape.tokens, H = c.hidden_size, V = c.vocab_size, B = shape.batch;
  int const A = static_cast<int>(shape.aux_layers.size());
  ProgrammaticLaunchScope const overlap(T <= kProgrammaticLaunchMaxTokens);
  SPECDEC_RETURN_IF_ERROR(cublas_status(cublasSetStream(m.cublas(), stream), "cublasSetStream"));
  if (m.comm != nullptr) m.comm->bind_stream(stream);
  auto capture = [&](int id) -> Status {
    for (int a = 0; a < A; ++a) {
      if (shape.aux_layers[static_cast<size_t>(a)] != id) continue;
      SPECDEC_CUDA_TRY(cudaMemcpy2DAsync(s.aux + a * H, static_cast<size_t>(A * H) * 4, s.x,
                                         static_cast<size_t>(H) * 4, static_cast<size_t>(H) * 4,
                                         static_cast<size_t>(T), cudaMemcpyDeviceToDevice, stream));
    }
    return Status::Ok();
  };
  SPECDEC_RETURN_IF_ERROR(cuda::embed_rows(m.embed_tokens, s.meta + bm.tokens, T, H, s.x, stream));
  SPECDEC_RETURN_IF_ERROR(capture(kEmbedding));
  for (int li = 0; li < c.num_hidden_layers; ++li) {
    CudaLayer const& l = m.layers[static_cast<size_t>(li)];
    SPECDEC_RETURN_IF_ERROR(cuda::rms_norm_rows(s.x, H, l.input_layernorm, T, static_cast<int>(H),
                                                c.rms_norm_eps, nullptr, 0, nullptr, s.xn_bf, H,
                                                stream));
    SPECDEC_RETURN_IF_ERROR(cuda_attention(m, li, cache, bm, s.meta, T, B, shape.tree, s, stream));
    SPECDEC_RETURN_IF_ERROR(cuda::rms_norm_rows(s.x, H, l.post_attention_layernorm, T,
                                                static_cast<int>(H), c.rms_norm_eps, s.xn, H,
                                                nullptr, s.xn_bf, H, stream));
    SPECDEC_RETURN_IF_ERROR(cuda_mlp(m, li, T, s, stream));
    SPECDEC_RETURN_IF_ERROR(capture(li));
  }
  SPECDEC_RETURN_IF_ERROR(cuda::rms_norm_rows(s.x, H, m.norm, T, static_cast<int>(H),
                                              c.rms_norm_eps, nullptr, 0, nullptr, s.xn_bf, H,
                                              stream));
  int64_t const Vp = m.vocab.size();
  SPECDEC_RETURN_IF_ERROR(gemm_bf16(m.cublas(), T, Vp, H, s.xn_bf, H, m.lm_head, s.logits,
                                    CUDA_R_32F, Vp, 0.0f, "gemm lm_head"));
  // kArgmax: one key per row from every rank, never the [T, V] logits.
  if (shape.mode == LogitsMode::kArgmax) {
    int64_t const P = m.comm ? m.comm->size() : 1;
    SPECDEC_RETURN_IF_ERROR(cuda::row_argmax_keys(s.logits, T, Vp, m.vocab.begin, s.keys, stream));
    if (m.comm) {
      SPECDEC_RETURN_IF_ERROR(m.comm->all_gather_bytes(reinterpret_cast<std::byte const*>(s.keys),
                                                       T * 8,
                                                       reinterpret_cast<std::byte*>(s.keys_all)));
    }
    return cuda::argmax_of_keys(m.comm ? s.keys_all : s.keys, P, T, s.argmax, stream);
  }
  if (Vp != V) {  // the ranks' slices [T, V / P], gathered [P, T, V / P], laid out [T, V]
    SPECDEC_RETURN_IF_ERROR(m.comm->all_gather(s.logits, T * Vp, s.gathered));
    for (int q = 0; q < m.shard.size; ++q) {
      SPECDEC_CUDA_TRY(cudaMemcpy2DAsync(s.logits + q * Vp, static_cast<size_t>(V) * 4,
                                         s.gathered + q * T * Vp, static_cast<size_t>(Vp) * 4,
                                         static_cast<size_t>(Vp) * 4, static_cast<size_t>(T),
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }
  return Status::Ok();
}

// The graph ladder (policy/graph.hpp: GraphLadder's sizes, strictly increasing, >= 1; empty:
// none). A decode or verify forward of B requests with B <= the largest size runs as a batch of
// the smallest size >= B: each added request is filler (token 0 at positions 0.., as many tokens
// as a real one, written to and read from MlaCache::padding_page, attending only to itself), its
// outputs not returned. So a few shapes serve every batch size, and a padded forward gives the
// same bits captured or eager. Above the largest size the forward runs its B requests eagerly,
// never captured. Without a ladder nothing is padded, and every decode / verify shape is captured
// (when model.graphs is on). Prefill chunks are never padded nor captured. `padding_page`: the
// cache's (MlaCache::padding_page), taken by the caller when there is a ladder.
inline Status cuda_forward(KimiCudaModel& m, MlaCache* cache, ForwardPlan const& plan,
                           std::span<int const> aux_layers, LogitsMode mode,
                           std::span<int const> ladder, int32_t padding_page, cudaStream_t stream,
                           CudaForwardOutput* out, DeviceTree const* tree = nullptr) {
  int64_t const T = plan.num_tokens(), H = m.config.hidden_size;
  int64_t const B = static_cast<int64_t>(plan.segments.size());
  int const A = static_cast<int>(aux_layers.size());
  // The graph ladder: pad to the smallest size >= B, or run eagerly above the largest.
  bool const step = plan.kind != ForwardKind::kPrefill;
  int const rung = step && !ladder.empty()
                       ? graph_bucket(ladder.data(), static_cast<int>(ladder.size()),
                                      static_cast<int>(B))
                       : -1;
  BatchPadding pad;
  if (rung > B) {
    pad.requests = rung - B;
    pad.tokens = T / B;  // decode 1, verify N: every request has as many
    pad.page = padding_page;
  }
  bool const captured = step && (ladder.empty() || rung > 0);
  BatchMeta bm;
  SPECDEC_RETURN_IF_ERROR(build_meta(*cache, plan, pad, &bm));
  int64_t const Tp = bm.num_tokens;
  KimiCudaModel::Scratch s{};
  SPECDEC_RETURN_IF_ERROR(
      reserve_scratch(m, Tp, A, static_cast<int64_t>(bm.host.size()), bm.max_slots, &s));
  SPECDEC_CUDA_TRY(cudaMemcpyAsync(s.meta, bm.host.data(), bm.host.size() * 4,
                                   cudaMemcpyHostToDevice, stream));
  if (tree != nullptr) {  // the tree's rows over the plan's placeholder, filler rows kept
    for (auto [to, from, n] : {std::tuple{bm.tokens, tree->tokens, T},
                               std::tuple{bm.positions, tree->positions, T},
                               std::tuple{bm.mask, reinterpret_cast<int32_t const*>(tree->mask),
                                          T * bm.words}}) {
      SPECDEC_CUDA_TRY(cudaMemcpyAsync(s.meta + to, from, static_cast<size_t>(n) * 4,
                                       cudaMemcpyDeviceToDevice, stream));
    }
  }
  ForwardShape shape;
  shape.tokens = Tp;
  shape.batch = bm.batch;
  shape.meta_ints = static_cast<int64_t>(bm.host.size());
  shape.max_pages = bm.max_pages;
  shape.words = bm.words;
  shape.max_slots = bm.max_slots;
  shape.tree = plan.kind == ForwardKind::kVerify;
  shape.mode = mode;
  shape.aux_layers.assign(aux_layers.begin(), aux_layers.end());
  shape.cache = cache->layer(0);
  shape.page_size = cache->page_size();
  shape.num_pages = cache->num_pages();
  auto queue = [&] { return cuda_forward_queue(m, cache, bm, shape, s, stream); };
  // Prefill chunks are eager: their shapes rarely repeat, and each would evict a step's graph.
  SPECDEC_RETURN_IF_ERROR(captured ? m.graphs.run(shape, stream, queue) : queue());
  m.padded_forwards += pad.requests > 0;
  m.above_ladder_forwards += step && !ladder.empty() && rung < 0;
  out->argmax = mode == LogitsMode::kArgmax ? s.argmax : nullptr;
  out->vocab = mode == LogitsMode::kArgmax ? m.vocab.size() : m.config.vocab_size;
  out->logits = s.logits;
  out->aux = A > 0 ? s.aux : nullptr;
  out->tokens = T;
  out->aux_width = A * H;
  return Status::Ok();
}

inline Status cuda_check(std::string const& fn, KimiCudaModel const& m, MlaCache const* cache,
                         CudaForwardOutput const* out) {
  if (out == nullptr) return Status::InvalidArgument(fn + "out is null");
  if (!m.loaded() || m.heads <= 0) {
    return Status::InvalidArgument(fn + "the model is not loaded (load_kimi_cuda_model)");
  }
  if (cache == nullptr) return Status::InvalidArgument(fn + "cache is null");
  cudaPointerAttributes attr{};
  if (!cache->external() || cudaPointerGetAttributes(&attr, cache->entries()) != cudaSuccess ||
      attr.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return Status::InvalidArgument(fn + "the cache's entries are not device memory: use "
                                   "KimiCudaCache::create_for (a host MlaCache is the CPU executor's)");
  }
  return Status::Ok();
}

template <class Plan>
Status cuda_run(std::string const& fn, KimiCudaModel& m, MlaCache* cache,
                std::span<int const> aux_layers, LogitsMode mode, std::span<int const> ladder,
                cudaStream_t stream, CudaForwardOutput* out, Plan&& plan_fn,
                DeviceTree const* tree = nullptr) {
  try {
    SPECDEC_RETURN_IF_ERROR(cuda_check(fn, m, cache, out));
    if (!ladder.empty() && graph_ladder_error(ladder) != GraphLadderError::kOk) {
      return Status::InvalidArgument(fn + "graph ladder " + format_layers(ladder) +
                                     ": batch sizes must be >= 1 and strictly increasing");
    }
    int32_t page = -1;  // the filler rows' page, taken before the plan reserves any
    if (!ladder.empty()) SPECDEC_RETURN_IF_ERROR(cache->padding_page(&page));
    ForwardPlan plan;
    SPECDEC_RETURN_IF_ERROR(plan_fn(&plan));
    SPECDEC_RETURN_IF_ERROR(
        cuda_forward(m, cache, plan, aux_layers, mode, ladder, page, stream, out, tree)
            .prefixed(fn));
    return finish_forward(cache, plan);
  } catch (std::exception const& e) {
    return Status::Internal(fn + e.what());
  }
}

}  // namespace detail

// Prefill, decode and tree verify: the CPU executor's contracts (forward_cpu.hpp), outputs on the
// device (CudaForwardOutput).
inline Status kimi_prefill(CudaExecutor e, KimiCudaModel& model, MlaCache* cache,
                           std::span<RequestId const> requests, std::span<int32_t const> counts,
                           std::span<int32_t const> tokens, std::span<int const> aux_layers,
                           CudaForwardOutput* out, LogitsMode mode = LogitsMode::kFull) {
  std::string const fn = "kimi_prefill (cuda): ";
  return detail::cuda_run(fn, model, cache, aux_layers, mode, {}, e.stream, out,
                          [&](ForwardPlan* p) {
    return plan_prefill(fn, model.config, cache, requests, counts, tokens, aux_layers, p);
  });
}

inline Status kimi_decode(CudaExecutor e, KimiCudaModel& model, MlaCache* cache,
                          std::span<RequestId const> requests, std::span<int32_t const> tokens,
                          std::span<int const> aux_layers, CudaForwardOutput* out,
                          LogitsMode mode = LogitsMode::kFull,
                          std::span<int const> graph_ladder = {}) {
  std::string const fn = "kimi_decode (cuda): ";
  return detail::cuda_run(fn, model, cache, aux_layers, mode, graph_ladder, e.stream, out,
                          [&](ForwardPlan* p) {
    return plan_decode(fn, model.config, cache, requests, tokens, aux_layers, p);
  });
}

inline Status kimi_verify(CudaExecutor e, KimiCudaModel& model, MlaCache* cache,
                          std::span<RequestId const> requests, int nodes,
                          std::span<int32_t const> tokens, std::span<int32_t const> positions,
                          std::span<uint32_t const> mask, std::span<int const> aux_layers,
                          CudaForwardOutput* out, LogitsMode mode = LogitsMode::kFull,
                          std::span<int const> graph_ladder = {}) {
  std::string const fn = "kimi_verify (cuda): ";
  return detail::cuda_run(fn, model, cache, aux_layers, mode, graph_ladder, e.stream, out,
                          [&](ForwardPlan* p) {
    return plan_verify(fn, model.config, cache, requests, nodes, tokens, positions, mask,
                       aux_layers, p);
  });
}

// kimi_verify over a tree that lives on the device (the engine's device-resident step: the
// draft proposed it and tree_build laid it out without the host seeing it). The host plans the
// forward with a placeholder of the same size (every node a child of the root: positions length
// + 1, so the same bounds hold), whose token, position and mask rows the tree's replace on the
// stream before the forward runs. Not checked on the host, so the caller vouches for them: tokens
// in [0, vocab), positions length + depth, rows a tree's (tree_build's status says so, on the
// device).
inline Status kimi_verify_device_tree(CudaExecutor e, KimiCudaModel& model, MlaCache* cache,
                                      std::span<RequestId const> requests, int nodes,
                                      DeviceTree const& tree, std::span<int const> aux_layers,
                                      CudaForwardOutput* out, LogitsMode mode = LogitsMode::kFull,
                                      std::span<int const> graph_ladder = {}) {
  std::string const fn = "kimi_verify_device_tree (cuda): ";
  if (tree.tokens == nullptr || tree.positions == nullptr || tree.mask == nullptr) {
    return Status::InvalidArgument(fn + "the device tree's tokens, positions and mask are needed");
  }
  if (nodes < 1) return Status::InvalidArgument(fn + "nodes N = " + std::to_string(nodes) + " < 1");
  size_t const B = requests.size(), N = static_cast<size_t>(nodes);
  int const W = mask_words(nodes);
  std::vector<int32_t> tokens(B * N, 0), positions(B * N);
  std::vector<uint32_t> mask(B * N * static_cast<size_t>(W), 0u);
  for (size_t b = 0; b < B; ++b) {
    int64_t length = 0;
    if (cache != nullptr && cache->has_request(requests[b])) {
      SPECDEC_RETURN_IF_ERROR(cache->length(requests[b], &length));
    }
    for (size_t i = 0; i < N; ++i) {
      positions[b * N + i] = static_cast<int32_t>(length + (i > 0));
      uint32_t* row = &mask[(b * N + i) * static_cast<size_t>(W)];
      row[0] |= 1u;
      row[i >> 5] |= 1u << (i & 31);
    }
  }
  return detail::cuda_run(
      fn, model, cache, aux_layers, mode, graph_ladder, e.stream, out,
      [&](ForwardPlan* p) {
        return plan_verify(fn, model.config, cache, requests, nodes, tokens, positions, mask,
                           aux_layers, p);
      },
      &tree);
}

}  // namespace specdec::model::kimi
