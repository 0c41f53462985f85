// specdec_bench_kimi_step: one forward step of a Kimi-K2.5-shaped model on one H200, each beside
// its memory floor, in one run (scripts/device_run.sh step). The model is the kimi-k2.5-1gpu preset
// (model/kimi/random_checkpoint.hpp: Kimi-K2.5's real dimensions, 61 layers, hidden 7168, MLA 64
// heads, top-8 of 64 routed experts per layer in INT4 group 32, bf16 elsewhere, vocab 163840;
// ~118 GB) with random weights drawn on the GPU (generate_kimi_cuda_model: nothing on disk). Every
// request holds --context committed cache slots of random entries (appended without a prefill: a
// 61-layer prefill of 32 x 1024 tokens would take minutes); after each call the requests are
// truncated back to --context, so every call sees the same cache.
// Steps (T = tokens of the forward; LogitsMode::kFull, as the one-GPU engine runs a greedy batch):
//   decode B=1, 8, 32       kimi_decode, one token for each of B requests (T = B)
//   verify chain N          kimi_verify at batch 1, N = 2, 4, 8, 16 nodes in a chain (root
//                           included; node i's parent i - 1)
//   verify tree N (k-ary)   kimi_verify at batch 1 of breadth-first top-k trees, node i's parent
//                           (i - 1) / k: N = 16, k = 4 (levels 1+4+11); N = 32, k = 4
//                           (1+4+16+11); N = 64, k = 8 (1+8+55)
// Verify positions are context + depth, the mask the packed ancestor-or-self rows tree_build
// writes (ops/tree_build/params.hpp's helpers).
// Time: CUDA events around one forward call, median / min / max over --reps calls after 3
// warm-up calls, twice: eager (the host launches every kernel; "host ms" is the median time until
// the call returns, close to the event time when the launches, not the GPU, are the bound) and
// replaying the forward captured once as a CUDA graph (KimiCudaModel::graphs; the metadata upload
// stays outside the graph, in the timed span), both with programmatic dependent launch
// (core/cuda.cuh), then the graph captured without it ("no PDL"). Floor and ratios use the
// graph's time.
// Floor = bytes the forward must read / the device-to-device copy bandwidth measured in the same
// run (bench_copy_floor.cu's: a 1 GiB cudaMemcpyAsync, bytes read + written, median). Bytes read =
// model.weight_bytes - the whole embedding table - every routed expert + T embedding rows +
// E (1 - (1 - k/E)^T) experts per MoE layer (the expected distinct experts T tokens choose, k of
// E each, under uniform random routing: an estimate; exactly k at T = 1) x the bytes of one expert
// (INT4 [out, in]: out * in / 2 packed + out * (in / group) * 2 scale bytes) + the cache rows
// attention reads (fp32 entries of kv_lora_rank + rope = 576 floats per token and layer; each
// request its context and its own tokens). The logits written are not counted.
// Ratios: each step's time / decode B=1's, and projected speedups accept_length x t(decode B=1) /
// t(verify) for accept lengths 1.5 .. 4 (the verify alone).
// The speculative step (--spec-tokens N > 0, default 32; needs the 61 layers of the EAGLE-3 layer
// set 1, 29, 57): a random Kimi-size EAGLE-3 draft (fc 21504 -> 7168, one layer, vocabulary
// 32000; written to a temporary directory, loaded, the directory removed) and SpecEngine, as
// specdec-kimi serves: plain decoding (NONE) and the EAGLE-3 chain of 3 (3 draft steps, tree,
// verify of 4, accept, commit, draft extend), padded to the graph ladder and replayed from CUDA
// graphs, one greedy request with a prompt of --context random tokens generating N tokens,
// --spec-runs timed runs after an untimed one. Per phase (SpecMetrics' CUDA events) the time per
// step beside its floor (the draft's forwards: its weights; the verify and the plain step: the
// byte model above), the whole step of each, their ratio, and the projection's last row:
// accept_length x t(plain step) / t(chain step), the draft included.
// Output: the configuration, weight generation time and model.weight_bytes, then markdown tables
// on stdout (also --markdown FILE) and every number as JSON (--json FILE).
// --profile-decode B runs none of that: after warm-up calls, one eager decode of batch B between
// cudaProfilerStart and cudaProfilerStop, then exits (scripts/device_run.sh profile: a per-kernel
// time table of the whole forward from ncu, scripts/kernel_profile.py).
//   specdec_bench_kimi_step [--num-layers N] [--context C] [--reps R] [--seed S]
//                           [--spec-tokens N] [--spec-runs R] [--json FILE] [--markdown FILE]
//                           [--profile-decode B]
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dispatch.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/model/eagle/forward_cuda.cuh"
#include "specdec/model/eagle/random_checkpoint.hpp"
#include "specdec/model/kimi/forward_cuda.cuh"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/random_device.cuh"
#include "specdec/ops/tree_build/params.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

using specdec::Status;
using specdec::bench::check_cuda;
namespace io = specdec::io;
namespace kimi = specdec::model::kimi;

constexpr char kPreset[] = "kimi-k2.5-1gpu";
constexpr int kWarmupCalls = 3;
constexpr int kPageSize = 64;
constexpr int kMaxBatch = 32;  // requests in the cache: the largest decode batch
constexpr int kMaxNodes = 64;  // slots each request may grow by: the largest verify
constexpr size_t kCopyBytes = size_t{1} << 30;
constexpr double kAcceptLengths[] = {1.5, 2.0, 2.5, 3.0, 3.5, 4.0};
constexpr uint64_t kCacheDrawKey = 0x6b762d6361636865ull;  // mixed with --seed

struct Options {
  std::optional<int> num_layers;  // the preset's 61 when unset
  int context = 1024;
  int reps = 20;
  uint64_t seed = 1;
  int spec_tokens = 32;    // tokens each engine run generates (0: no speculative step)
  int spec_runs = 3;       // timed engine runs of each policy (after one untimed)
  int profile_decode = 0;  // > 0: profile one eager decode of this batch and exit
  std::string json_path, markdown_path;
  std::vector<std::string> steps;  // --steps: the step shapes to time by key (empty: all)
};

template <class... Args>
std::string format(char const* fmt, Args... args) {
  int const n = std::snprintf(nullptr, 0, fmt, args...);
  std::string s(static_cast<size_t>(std::max(n, 0)), '\0');
  std::snprintf(s.data(), s.size() + 1, fmt, args...);
  return s;
}

void require(Status const& s, char const* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "specdec_bench_kimi_step: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

constexpr char kUsage[] =
    "usage: specdec_bench_kimi_step [--num-layers N] [--context C] [--reps R] [--seed S] "
    "[--spec-tokens N] [--spec-runs R] [--json FILE] [--markdown FILE] [--profile-decode B]\n"
    "  [--steps KEY,KEY,...]: time only these step shapes (decode1 decode8 decode32 chain2 chain4\n"
    "  chain8 chain16 tree16 tree32 tree64; decode1 always, the ratios' denominator)\n";

[[noreturn]] void usage(char const* problem) {
  std::fprintf(stderr, "specdec_bench_kimi_step: %s\n%s", problem, kUsage);
  std::exit(2);
}

Options parse_flags(int argc, char** argv) {
  Options o;
  auto integer = [&](int& i, long long lo, long long hi) -> long long {
    std::string const flag = argv[i];
    if (i + 1 >= argc) usage((flag + " needs a value").c_str());
    char* end = nullptr;
    long long const v = std::strtoll(argv[++i], &end, 10);
    if (*argv[i] == '\0' || *end != '\0' || v < lo || v > hi) {
      usage((flag + " " + argv[i] + ": want an integer in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]")
                .c_str());
    }
    return v;
  };
  auto text = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage((std::string(argv[i]) + " needs a value").c_str());
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (a == "--num-layers") {
      o.num_layers = static_cast<int>(integer(i, 1, 1000));
    } else if (a == "--context") {
      o.context = static_cast<int>(integer(i, 0, 1 << 20));
    } else if (a == "--reps") {
      o.reps = static_cast<int>(integer(i, 1, 100000));
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(integer(i, 0, INT64_MAX));
    } else if (a == "--spec-tokens") {
      o.spec_tokens = static_cast<int>(integer(i, 0, 4096));
    } else if (a == "--spec-runs") {
      o.spec_runs = static_cast<int>(integer(i, 1, 1000));
    } else if (a == "--profile-decode") {
      o.profile_decode = static_cast<int>(integer(i, 1, kMaxBatch));
    } else if (a == "--json") {
      o.json_path = text(i);
    } else if (a == "--markdown") {
      o.markdown_path = text(i);
    } else if (a == "--steps") {
      std::string const list = text(i);
      for (size_t b = 0; b <= list.size();) {
        size_t const e = std::min(list.find(',', b), list.size());
        o.steps.push_back(list.substr(b, e - b));
        b = e + 1;
      }
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  return o;
}

// The preset's config with Kimi-K2.5's INT4 experts (in text_config, where
// write_random_checkpoint puts it for the nested form).
io::DeepseekV3Config preset_config(Options const& o) {
  nlohmann::json j;
  require(kimi::kimi_preset_config(kPreset, o.num_layers, &j), "kimi_preset_config");
  j["text_config"]["quantization_config"] = kimi::kimi_int4_quantization_config();
  io::DeepseekV3Config c;
  require(io::parse_config(j.dump(), kPreset, &c), "parse_config");
  return c;
}

// What one forward over T tokens must read, from the config and the model's weight bytes.
struct ByteModel {
  uint64_t weight_bytes = 0;     // model.weight_bytes (the device arena)
  uint64_t embedding_bytes = 0;  // the whole table [V, H] bf16
  uint64_t expert_bytes = 0;     // one routed expert: gate, up [M, H], down [H, M]
  uint64_t routed_bytes = 0;     // every routed expert of every MoE layer
  uint64_t rest_bytes = 0;       // weight_bytes - embedding - routed: read whole by every forward
  uint64_t embedding_row_bytes = 0;
  uint64_t cache_row_bytes = 0;  // one token's cache entries over all layers (fp32)
  int experts = 0, top_k = 0, moe_layers = 0;

  static uint64_t linear_bytes(io::DeepseekV3Config const& c, int64_t out, int64_t in) {
    if (!c.quantization) return static_cast<uint64_t>(out * in * 2);
    int64_t const g = c.quantization->group_size;
    return static_cast<uint64_t>(out * in / 2 + out * (in / g) * 2);
  }

  static ByteModel of(io::DeepseekV3Config const& c, uint64_t weight_bytes) {
    ByteModel b;
    int64_t const H = c.hidden_size, M = c.moe_intermediate_size;
    b.weight_bytes = weight_bytes;
    b.embedding_row_bytes = static_cast<uint64_t>(H) * 2;
    b.embedding_bytes = static_cast<uint64_t>(c.vocab_size) * b.embedding_row_bytes;
    b.expert_bytes = 2 * linear_bytes(c, M, H) + linear_bytes(c, H, M);
    b.experts = c.n_routed_experts;
    b.top_k = c.num_experts_per_tok;
    b.moe_layers = c.num_moe_layers();
    b.routed_bytes = b.expert_bytes * static_cast<uint64_t>(b.experts) * b.moe_layers;
    b.cache_row_bytes = static_cast<uint64_t>(c.num_hidden_layers) *
                        (c.kv_lora_rank + c.qk_rope_head_dim) * sizeof(float);
    if (b.embedding_bytes + b.routed_bytes > weight_bytes) {
      require(Status::Internal(format("embedding %llu + routed experts %llu bytes exceed the "
                                      "model's %llu weight bytes",
                                      (unsigned long long)b.embedding_bytes,
                                      (unsigned long long)b.routed_bytes,
                                      (unsigned long long)weight_bytes)),
              "byte model");
    }
    b.rest_bytes = weight_bytes - b.embedding_bytes - b.routed_bytes;
    return b;
  }
  // Expected distinct experts per MoE layer when T tokens each choose k of E uniformly.
  double distinct_experts(int64_t tokens) const {
    double const E = experts;
    return E * (1.0 - std::pow(1.0 - top_k / E, static_cast<double>(tokens)));
  }
  // Bytes read by a forward over `tokens` tokens whose attention reads `cache_rows` cache slots.
  double bytes(int64_t tokens, int64_t cache_rows) const {
    return static_cast<double>(rest_bytes) + static_cast<double>(tokens * embedding_row_bytes) +
           distinct_experts(tokens) * static_cast<double>(expert_bytes) * moe_layers +
           static_cast<double>(cache_rows) * static_cast<double>(cache_row_bytes);
  }
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  double host_ms = 0;  // median time until the call returned on the host
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times `call` (which enqueues work on `stream`) with CUDA events, kWarmupCalls untimed calls then
// `reps` timed ones; `reset` runs after each call, outside the timed span.
template <class Call, class Reset>
Timing time_calls(cudaStream_t stream, int reps, Call&& call, Reset&& reset) {
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> device_ms, host_ms;
  for (int i = 0; i < kWarmupCalls + reps; ++i) {
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
    auto const t0 = std::chrono::steady_clock::now();
    call();
    auto const t1 = std::chrono::steady_clock::now();
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "the timed call");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    reset();
    if (i < kWarmupCalls) continue;
    device_ms.push_back(ms);
    host_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  check_cuda(cudaEventDestroy(start), "cudaEventDestroy");
  check_cuda(cudaEventDestroy(stop), "cudaEventDestroy");
  Timing t;
  t.median_ms = median(device_ms);
  t.min_ms = *std::min_element(device_ms.begin(), device_ms.end());
  t.max_ms = *std::max_element(device_ms.begin(), device_ms.end());
  t.host_ms = median(host_ms);
  return t;
}

nlohmann::json to_json(Timing const& t) {
  return {{"median_ms", t.median_ms},
          {"min_ms", t.min_ms},
          {"max_ms", t.max_ms},
          {"host_ms", t.host_ms}};
}

// The memory floor's bandwidth: bytes read + written per second by a 1 GiB device-to-device copy.
struct CopyFloor {
  Timing time;
  double bytes_per_s = 0;
};

CopyFloor measure_copy_floor(cudaStream_t stream, int reps) {
  specdec::DeviceBuffer<unsigned char> src(kCopyBytes), dst(kCopyBytes);
  if (src.data() == nullptr || dst.data() == nullptr) {
    require(Status::CudaError("cudaMalloc of 2 x 1 GiB failed"), "copy floor");
  }
  check_cuda(cudaMemset(src.data(), 0x5a, kCopyBytes), "cudaMemset");
  CopyFloor f;
  f.time = time_calls(
      stream, reps,
      [&] {
        check_cuda(
            cudaMemcpyAsync(dst.data(), src.data(), kCopyBytes, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
      },
      [] {});
  f.bytes_per_s = 2.0 * kCopyBytes / (f.time.median_ms * 1e-3);
  return f;
}

// One timed step: a decode of `batch` requests, or a verify at batch 1 of the tree `parents`.
struct StepShape {
  std::string name;
  std::string key;               // --steps' name: decode1, chain4, tree64, ...
  bool verify = false;
  int batch = 1;                 // requests
  int nodes = 1;                 // tokens per request
  std::vector<int32_t> parents;  // verify: parents[0] = -1, parents[i] < i
  std::string levels;            // verify: nodes per depth, e.g. "1+4+11"
  int depth = 0;                 // verify: the deepest node's depth
  int64_t tokens() const { return int64_t{batch} * nodes; }
  // Most tokens one verify of this shape can commit: the accepted path root..leaf.
  int max_accept() const { return depth + 1; }
};

StepShape decode_shape(int batch) {
  StepShape s;
  s.name = "decode B=" + std::to_string(batch);
  s.key = "decode" + std::to_string(batch);
  s.batch = batch;
  return s;
}

// The breadth-first tree of `nodes` nodes in which every node has `branching` children (node i's
// parent (i - 1) / branching; branching 1 is a chain).
StepShape verify_shape(int nodes, int branching) {
  StepShape s;
  s.verify = true;
  s.nodes = nodes;
  s.parents.assign(static_cast<size_t>(nodes), -1);
  std::vector<int> per_depth;
  for (int i = 0; i < nodes; ++i) {
    if (i > 0) s.parents[static_cast<size_t>(i)] = (i - 1) / branching;
    int const d = specdec::ops::tree_node_depth(s.parents.data(), i);
    if (d >= static_cast<int>(per_depth.size())) per_depth.push_back(0);
    ++per_depth[static_cast<size_t>(d)];
    s.depth = std::max(s.depth, d);
  }
  for (size_t d = 0; d < per_depth.size(); ++d) {
    s.levels += (d ? "+" : "") + std::to_string(per_depth[d]);
  }
  s.name = branching == 1 ? "verify chain " + std::to_string(nodes)
                          : "verify tree " + std::to_string(nodes) + " (" +
                                std::to_string(branching) + "-ary " + s.levels + ")";
  s.key = (branching == 1 ? "chain" : "tree") + std::to_string(nodes);
  return s;
}

// The step shapes the bench times: every one, or those --steps names (decode B=1 always); an
// unknown key is a usage error, reported before the model is generated.
std::vector<StepShape> step_shapes(Options const& o) {
  std::vector<StepShape> shapes = {decode_shape(1), decode_shape(8), decode_shape(32)};
  for (int n : {2, 4, 8, 16}) shapes.push_back(verify_shape(n, 1));
  shapes.push_back(verify_shape(16, 4));
  shapes.push_back(verify_shape(32, 4));
  shapes.push_back(verify_shape(64, 8));
  auto listed = [&](std::string const& key) {
    return std::find(o.steps.begin(), o.steps.end(), key) != o.steps.end();
  };
  for (std::string const& key : o.steps) {
    auto const has = [&](StepShape const& s) { return s.key == key; };
    if (std::none_of(shapes.begin(), shapes.end(), has)) {
      usage(("--steps: no step shape '" + key + "'").c_str());
    }
  }
  if (!o.steps.empty()) {
    std::erase_if(shapes, [&](StepShape const& s) { return s.key != "decode1" && !listed(s.key); });
  }
  return shapes;
}

struct StepResult {
  StepShape shape;
  Timing eager;  // every kernel launched by the host
  Timing time;   // the forward replayed as a CUDA graph (KimiCudaModel::graphs)
  Timing plain;  // the same graph captured without programmatic dependent launch
  int64_t cache_rows = 0;  // cache slots attention reads (every request's context + own tokens)
  double experts_per_layer = 0, bytes = 0, floor_ms = 0;
};

// One step's inputs (random tokens; verify positions context + depth and ancestor-or-self
// masks) and its forward on requests 0.. of `cache` (each holding `context` committed slots).
class StepCall {
 public:
  StepCall(StepShape const& shape, kimi::KimiCudaModel& model, kimi::KimiCudaCache& cache,
           int context, specdec::testing::Rng& rng, cudaStream_t stream)
      : shape_(shape), model_(model), cache_(cache), context_(context), exec_{stream} {
    int64_t const V = model.config.vocab_size;
    for (int b = 0; b < shape.batch; ++b) ids_.push_back(b);
    // Token ids uniform in [0, V) (tests/support/kimi_model.hpp's random_tokens, which a binary
    // without doctest cannot include).
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(V - 1));
    tokens_.resize(static_cast<size_t>(shape.tokens()));
    for (int32_t& t : tokens_) t = token(rng);
    if (!shape.verify) return;
    int const words = specdec::mask_words(shape.nodes);
    mask_.assign(static_cast<size_t>(shape.nodes * words), 0u);
    for (int i = 0; i < shape.nodes; ++i) {
      specdec::ops::tree_write_mask_row(shape.parents.data(), i, words,
                                        mask_.data() + static_cast<size_t>(i * words));
      positions_.push_back(context + specdec::ops::tree_node_depth(shape.parents.data(), i));
    }
  }
  void forward() {
    if (shape_.verify) {
      require(kimi::kimi_verify(exec_, model_, &cache_.table, ids_, shape_.nodes, tokens_,
                                positions_, mask_, {}, &out_, kimi::LogitsMode::kFull),
              shape_.name.c_str());
    } else {
      require(kimi::kimi_decode(exec_, model_, &cache_.table, ids_, tokens_, {}, &out_,
                                kimi::LogitsMode::kFull),
              shape_.name.c_str());
    }
  }
  // Decode appended a slot, verify staged its nodes: truncating to the context undoes either.
  void back_to_context() {
    for (kimi::RequestId id : ids_) {
      require(cache_.table.truncate(id, context_), "MlaCache::truncate");
    }
  }

 private:
  StepShape const& shape_;
  kimi::KimiCudaModel& model_;
  kimi::KimiCudaCache& cache_;
  int context_;
  specdec::CudaExecutor exec_;
  std::vector<kimi::RequestId> ids_;
  std::vector<int32_t> tokens_, positions_;
  std::vector<uint32_t> mask_;
  kimi::CudaForwardOutput out_;
};

// Runs `shape` on requests 0.. of `cache` (each holding `context` committed slots), `reps` times.
StepResult run_step(StepShape const& shape, kimi::KimiCudaModel& model, kimi::KimiCudaCache& cache,
                    int context, int reps, specdec::testing::Rng& rng, cudaStream_t stream) {
  StepCall call(shape, model, cache, context, rng, stream);
  auto forward = [&] { call.forward(); };
  auto back_to_context = [&] { call.back_to_context(); };
  StepResult r;
  r.shape = shape;
  model.graphs.set_capacity(0);
  r.eager = time_calls(stream, reps, forward, back_to_context);
  model.graphs.set_capacity(1);  // the first warm-up call captures, the rest replay
  int64_t const replays_before = model.graphs.replays();
  r.time = time_calls(stream, reps, forward, back_to_context);
  if (model.graphs.replays() - replays_before < reps) {
    require(Status::Internal("the graph was not replayed"), shape.name.c_str());
  }
  model.graphs.set_capacity(0);
  specdec::set_programmatic_launch(false);
  model.graphs.set_capacity(1);
  r.plain = time_calls(stream, reps, forward, back_to_context);
  model.graphs.set_capacity(0);
  specdec::set_programmatic_launch(true);
  r.cache_rows = int64_t{shape.batch} * (context + shape.nodes);
  return r;
}

// --profile-decode B: kWarmupCalls eager decodes of batch B, then one more between
// cudaProfilerStart and cudaProfilerStop, for a profiler started with profiling off (ncu
// --profile-from-start off): every kernel of one whole forward, launched by the host.
void profile_decode(int batch, kimi::KimiCudaModel& model, kimi::KimiCudaCache& cache,
                    int context, specdec::testing::Rng& rng, cudaStream_t stream) {
  StepShape const shape = decode_shape(batch);
  StepCall call(shape, model, cache, context, rng, stream);
  model.graphs.set_capacity(0);
  for (int i = 0; i <= kWarmupCalls; ++i) {
    bool const profiled = i == kWarmupCalls;
    if (profiled) check_cuda(cudaProfilerStart(), "cudaProfilerStart");
    call.forward();
    check_cuda(cudaStreamSynchronize(stream), shape.name.c_str());
    if (profiled) check_cuda(cudaProfilerStop(), "cudaProfilerStop");
    call.back_to_context();
  }
  std::printf("profiled: one eager %s forward between cudaProfilerStart and cudaProfilerStop\n",
              shape.name.c_str());
}

// ---- The speculative step through SpecEngine ----
// specdec-kimi's served policies: plain decoding and the EAGLE-3 chain of 3 (3 draft steps, 4
// verified nodes) on Kimi-K2.5's layer set, both padded to the graph ladder and replayed from
// CUDA graphs as specdec-kimi serves them.
using PlainPolicy = specdec::KimiK25NoDraft<specdec::KimiK25GraphLadder>;
using ChainPolicy = specdec::KimiK25Eagle3Chain<specdec::KimiK25GraphLadder>;
constexpr int kDraftVocab = 32000;  // the Kimi-size EAGLE-3 draft's vocabulary
constexpr size_t kGraphShapes = 16;  // forward / proposal / extend graphs kept (as specdec-kimi)

// One step's phases, ms per verify (SpecMetrics: CUDA events on the engine's stream).
struct Phases {
  double draft = 0, build = 0, verify = 0, commit = 0, extend = 0;
  double sum() const { return draft + build + verify + commit + extend; }
};

struct EngineRun {
  std::string name;
  Phases ms;             // each phase's median over the timed runs
  double step_ms = 0;    // median over the runs of the phases' sum
  double wall_ms = 0;    // median over the runs of (generate's wall time - prefill) / verifies
  int64_t verifies = 0;  // per run
  double accept_length = 0;
  std::vector<int32_t> output;  // the last run's tokens
};

// `runs` + 1 generate calls of SpecEngine<P> for one greedy request (`prompt`, exactly
// `new_tokens` tokens); the first is untimed (it captures the graphs).
template <class P>
EngineRun run_engine(char const* name, kimi::KimiCudaModel& model,
                     specdec::model::eagle::DraftCudaModel* draft,
                     std::vector<int32_t> const& prompt, int new_tokens, int runs,
                     cudaStream_t stream) {
  using Engine = specdec::engine::SpecEngine<P, specdec::CudaExecutor>;
  model.graphs.set_capacity(kGraphShapes);
  if (draft != nullptr) draft->step_graphs = kGraphShapes;
  Engine engine;
  require(Engine::create(&model, Engine::kDraftsWithModel ? draft : nullptr, {}, &engine,
                         specdec::CudaExecutor{stream}),
          name);
  specdec::engine::GenerationRequest request;
  request.prompt = prompt;
  request.max_new_tokens = new_tokens;
  request.stop_at_eos = false;  // temperature 0: greedy, exactly new_tokens tokens
  std::vector<double> per_phase[5], steps, walls;
  EngineRun r;
  r.name = name;
  for (int run = 0; run <= runs; ++run) {
    std::vector<specdec::engine::GenerationResult> out;
    specdec::engine::SpecMetrics m;
    auto const t0 = std::chrono::steady_clock::now();
    require(engine.generate(std::span(&request, 1), &out, &m), name);
    double const wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (m.verify_ct < 2) require(Status::Internal("fewer than 2 verifies"), name);
    r.verifies = m.verify_ct;
    r.accept_length = m.accept_length();
    r.output = out.front().output_ids;
    if (run == 0) continue;
    double const per_verify = 1e3 / static_cast<double>(m.verify_ct);
    // A request's last verify ends it: no extend follows it.
    Phases const p{m.draft_s * per_verify, m.build_s * per_verify, m.verify_s * per_verify,
                   m.commit_s * per_verify,
                   m.extend_s * 1e3 / static_cast<double>(m.verify_ct - 1)};
    double const values[] = {p.draft, p.build, p.verify, p.commit, p.extend};
    for (int i = 0; i < 5; ++i) per_phase[i].push_back(values[i]);
    steps.push_back(p.sum());
    walls.push_back((wall_s - m.prefill_s) * per_verify);
  }
  model.graphs.set_capacity(0);
  if (draft != nullptr) draft->step_graphs = 0;
  r.ms = Phases{median(per_phase[0]), median(per_phase[1]), median(per_phase[2]),
                median(per_phase[3]), median(per_phase[4])};
  r.step_ms = median(steps);
  r.wall_ms = median(walls);
  return r;
}

// A random Kimi-size EAGLE-3 draft for ChainPolicy (fc 21504 -> 7168, one layer, vocabulary
// 32000), written to a fresh temporary directory, loaded onto the GPU, the directory removed.
void make_draft(io::DeepseekV3Config const& config, kimi::KimiCudaModel const& model,
                uint64_t seed, specdec::model::eagle::DraftCudaModel* draft, double* seconds) {
  namespace eagle = specdec::model::eagle;
  namespace fs = std::filesystem;
  auto const t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::path const dir = fs::temp_directory_path(ec) / format("specdec_bench_kimi_step_draft_%llu",
                                                            (unsigned long long)seed);
  if (ec) require(Status::Internal("no temporary directory: " + ec.message()), "draft");
  fs::remove_all(dir, ec);  // a previous run's, if it stopped before removing it
  eagle::DraftRandomOptions options;
  options.draft_vocab_size = kDraftVocab;
  require(eagle::write_random_draft(dir.string(), config, ChainPolicy::Layers::ids(), seed,
                                    options),
          "write_random_draft");
  Status const loaded = eagle::load_draft_cuda_model(
      dir.string(), config, eagle::cuda_target_tensors_of(model), ChainPolicy::kKind,
      ChainPolicy::Layers::ids(), specdec::describe<ChainPolicy>(), draft);
  fs::remove_all(dir, ec);
  require(loaded, "load_draft_cuda_model");
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What the draft's forwards must read: a proposal step's forward reads the decoder layer and
// the lm_head (its weights less fc, and less its own embedding table if it has one: it reads
// rows of it); the extend's also reads fc. The draft's KV rows (8 heads x 112 x 2 fp32 per
// token) are under 0.1% of it at these contexts and are not counted.
struct DraftBytes {
  double forward = 0, extend = 0;
  static DraftBytes of(specdec::model::eagle::DraftCudaModel const& d) {
    double const fc = 2.0 * static_cast<double>(d.hidden()) *
                      static_cast<double>(d.config.fc_in_width());
    double const table = d.has_embedding ? 2.0 * static_cast<double>(d.vocab()) *
                                               static_cast<double>(d.hidden())
                                         : 0.0;
    DraftBytes b;
    b.forward = static_cast<double>(d.weight_bytes) - fc - table;
    b.extend = b.forward + fc;
    return b;
  }
};

// The speculative step's table: each phase of the chain step and the plain step beside the
// floor of what it must read.
struct SpecStep {
  EngineRun plain, chain;
  double draft_setup_s = 0;
  uint64_t draft_weight_bytes = 0;
  DraftBytes draft_bytes;
  int64_t fc_in = 0, hidden = 0;
  int prompt_tokens = 0, new_tokens = 0, runs = 0, draft_forwards = 0;
  int64_t mid_context = 0;  // the cache a mid-generation step reads: prompt + new_tokens / 2
  bool same_tokens = false;
  int first_difference = -1;
  // Floors (ms) and bytes of: the propose's draft forwards, the extend, the verify of kNodes, the
  // whole chain step, and the plain step.
  double propose_bytes = 0, extend_bytes = 0, verify_bytes = 0, chain_bytes = 0, plain_bytes = 0;
};

SpecStep run_spec_step(Options const& o, io::DeepseekV3Config const& config,
                       kimi::KimiCudaModel& model, ByteModel const& bm, specdec::testing::Rng& rng,
                       cudaStream_t stream) {
  SpecStep s;
  specdec::model::eagle::DraftCudaModel draft;
  make_draft(config, model, o.seed + 1, &draft, &s.draft_setup_s);
  s.draft_weight_bytes = draft.weight_bytes;
  std::printf("draft: random EAGLE-3 (%s), %llu weight bytes, written and loaded in %.1f s\n",
              specdec::describe<ChainPolicy>().c_str(), (unsigned long long)draft.weight_bytes,
              s.draft_setup_s);
  std::fflush(stdout);
  s.prompt_tokens = std::max(o.context, 1);
  s.new_tokens = o.spec_tokens;
  s.runs = o.spec_runs;
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(s.prompt_tokens));
  for (int32_t& t : prompt) t = token(rng);
  s.plain = run_engine<PlainPolicy>("plain decoding (NONE)", model, nullptr, prompt,
                                    s.new_tokens, o.spec_runs, stream);
  s.chain = run_engine<ChainPolicy>("EAGLE-3 chain 3", model, &draft, prompt, s.new_tokens,
                                    o.spec_runs, stream);
  s.same_tokens = s.plain.output == s.chain.output;
  for (size_t i = 0; i < std::min(s.plain.output.size(), s.chain.output.size()); ++i) {
    if (s.plain.output[i] != s.chain.output[i]) {
      s.first_difference = static_cast<int>(i);
      break;
    }
  }
  // Step 0 of a proposal reads the logits of the last extend; each later step runs a forward.
  s.draft_forwards = ChainPolicy::kSteps - 1;
  s.draft_bytes = DraftBytes::of(draft);
  s.fc_in = draft.config.fc_in_width();
  s.hidden = draft.hidden();
  s.mid_context = s.prompt_tokens + s.new_tokens / 2;
  int64_t const mid_context = s.mid_context;
  s.propose_bytes = s.draft_forwards * s.draft_bytes.forward;
  s.extend_bytes = s.draft_bytes.extend;
  s.verify_bytes = bm.bytes(ChainPolicy::kNodes, mid_context + ChainPolicy::kNodes);
  s.chain_bytes = s.propose_bytes + s.extend_bytes + s.verify_bytes;
  s.plain_bytes = bm.bytes(1, mid_context + 1);
  return s;
}

std::string gb(double bytes) { return format("%.2f", bytes * 1e-9); }

struct Report {
  std::string markdown;
  nlohmann::json json;
};

// The speculative step's markdown (appended to *md) and JSON.
nlohmann::json spec_step_section(SpecStep const& s, CopyFloor const& copy, std::string* md) {
  std::string const output =
      s.same_tokens ? "the same tokens as plain decoding"
                    : format("differs from plain decoding from token %d (a near-tie of the "
                             "verify's bf16 GEMMs against the decode's, or a fault)",
                             s.first_difference);
  *md += format(
      "\n### The speculative step through SpecEngine (EAGLE-3 chain 3 against plain decoding)\n\n"
      "- one greedy request: a prompt of %d random tokens, %d new tokens; each policy's generate "
      "run %d times after an untimed run (it captures the graphs); medians over the runs\n"
      "- draft: a random Kimi-size EAGLE-3 (fc %lld -> %lld, one layer, vocabulary %d; %s GB of "
      "weights, written and loaded in %.1f s); it accepts next to nothing (accept length %.3f): "
      "a step's cost does not depend on what it accepts\n"
      "- output: %s\n"
      "- ms per step: SpecMetrics' phases (CUDA events on the engine's stream) per verify, the "
      "extend per extend (a request's last verify has none); wall = (generate's wall time - "
      "prefill) / verifies, host gaps included\n"
      "- floor = bytes read / copy floor: a draft forward reads the draft's weights less fc (%s "
      "GB), the extend with fc (%s GB); the verify of %d nodes and the plain step as the table "
      "above, at context %lld\n\n",
      s.prompt_tokens, s.new_tokens, s.runs, (long long)s.fc_in, (long long)s.hidden, kDraftVocab,
      gb(double(s.draft_weight_bytes)).c_str(), s.draft_setup_s, s.chain.accept_length,
      output.c_str(), gb(s.draft_bytes.forward).c_str(), gb(s.draft_bytes.extend).c_str(),
      ChainPolicy::kNodes, (long long)s.mid_context);
  *md += "| phase | ms per step | bytes GB | floor ms | floor / time | time / plain step |\n";
  *md += "|---|---:|---:|---:|---:|---:|\n";
  nlohmann::json rows = nlohmann::json::array();
  auto row = [&](std::string const& name, double ms, double bytes) {
    double const ratio = ms / s.plain.step_ms;
    nlohmann::json j = {{"name", name}, {"ms", ms}, {"time_over_plain_step", ratio}};
    if (bytes > 0) {
      double const floor = bytes / copy.bytes_per_s * 1e3;
      *md += format("| %s | %.3f | %s | %.3f | %.3f | %.3f |\n", name.c_str(), ms,
                    gb(bytes).c_str(), floor, floor / ms, ratio);
      j["bytes"] = bytes;
      j["floor_ms"] = floor;
      j["fraction_of_floor"] = floor / ms;
    } else {
      *md += format("| %s | %.3f | - | - | - | %.3f |\n", name.c_str(), ms, ratio);
    }
    rows.push_back(std::move(j));
  };
  Phases const& c = s.chain.ms;
  row(format("draft: propose, %d steps (%d draft forwards, draft_expand, draft_finalize)",
             ChainPolicy::kSteps, s.draft_forwards),
      c.draft, s.propose_bytes);
  row("draft: one step (propose / draft forwards)", c.draft / s.draft_forwards,
      s.draft_bytes.forward);
  row("tree_build", c.build, 0);
  row(format("verify of %d nodes + accept", ChainPolicy::kNodes), c.verify, s.verify_bytes);
  row("commit (kv_commit, commit_tokens, the read-back)", c.commit, 0);
  row("draft: extend (fc + one forward)", c.extend, s.extend_bytes);
  row("**EAGLE-3 chain 3 step**", s.chain.step_ms, s.chain_bytes);
  row("EAGLE-3 chain 3 step, wall", s.chain.wall_ms, s.chain_bytes);
  row("**plain step (NONE)**", s.plain.step_ms, s.plain_bytes);
  row("plain step, wall", s.plain.wall_ms, s.plain_bytes);
  double const ratio = s.chain.step_ms / s.plain.step_ms;
  *md += format(
      "\nOne EAGLE-3 chain 3 step = **%.3fx** one plain step (wall: %.3fx): it pays from an "
      "accept length of %.2f; at 2.1, %.2fx.\n",
      ratio, s.chain.wall_ms / s.plain.wall_ms, ratio, 2.1 / ratio);
  auto run_json = [](EngineRun const& r) {
    return nlohmann::json{{"name", r.name},
                          {"phases_ms",
                           {{"draft", r.ms.draft},
                            {"build", r.ms.build},
                            {"verify", r.ms.verify},
                            {"commit", r.ms.commit},
                            {"extend", r.ms.extend}}},
                          {"step_ms", r.step_ms},
                          {"wall_ms", r.wall_ms},
                          {"verifies", r.verifies},
                          {"accept_length", r.accept_length}};
  };
  return {{"prompt_tokens", s.prompt_tokens},
          {"new_tokens", s.new_tokens},
          {"runs", s.runs},
          {"context_for_floors", s.mid_context},
          {"draft_weight_bytes", s.draft_weight_bytes},
          {"draft_forward_bytes", s.draft_bytes.forward},
          {"draft_extend_bytes", s.draft_bytes.extend},
          {"draft_setup_s", s.draft_setup_s},
          {"same_tokens", s.same_tokens},
          {"first_difference", s.first_difference},
          {"plain", run_json(s.plain)},
          {"chain", run_json(s.chain)},
          {"rows", std::move(rows)},
          {"chain_over_plain", ratio},
          {"chain_over_plain_wall", s.chain.wall_ms / s.plain.wall_ms}};
}

Report report(Options const& o, io::DeepseekV3Config const& c, ByteModel const& bm,
              double generation_s, uint64_t cache_bytes, CopyFloor const& copy,
              std::vector<StepResult> const& steps, SpecStep const* spec) {
  Report rep;
  std::string& md = rep.markdown;
  double const decode_ms = steps.front().time.median_ms;  // decode B=1
  md += "## Kimi-K2.5-shaped forward step on one GPU (specdec_bench_kimi_step)\n\n";
  md += io::describe(c) + "\n\n";
  md +=
      format("- context %d tokens per request; %d timed calls after %d warm-up calls; seed %llu\n",
             o.context, o.reps, kWarmupCalls, (unsigned long long)o.seed);
  md += format(
      "- weights %s GB (model.weight_bytes %llu) drawn on the GPU in %.1f s: routed "
      "experts %s GB (%d x %d MoE layers x %.2f MB), embedding %s GB, the rest %s GB\n",
      gb(double(bm.weight_bytes)).c_str(), (unsigned long long)bm.weight_bytes, generation_s,
      gb(double(bm.routed_bytes)).c_str(), bm.experts, bm.moe_layers, bm.expert_bytes * 1e-6,
      gb(double(bm.embedding_bytes)).c_str(), gb(double(bm.rest_bytes)).c_str());
  md += format(
      "- KV cache %s GB of fp32 entries; copy floor %.0f GB/s (cudaMemcpyAsync device to "
      "device of 1 GiB, bytes read + written, median)\n",
      gb(double(cache_bytes)).c_str(), copy.bytes_per_s * 1e-9);
  md +=
      "- floor = bytes the forward must read / copy floor: the weights less the embedding table "
      "and the routed experts, + T embedding rows, + E(1 - (1 - k/E)^T) experts per MoE layer "
      "(expected distinct experts of T tokens: an estimate for random routing), + the cache "
      "rows attention reads (each request's context + its own tokens)\n";
  md +=
      "- time: CUDA events around one forward call (LogitsMode::kFull), the metadata upload "
      "included: eager (the host launches every kernel; host ms = time until the call returns) "
      "and graph (the forward captured once as a CUDA graph, then replayed: "
      "KimiCudaModel::graphs), "
      "both with programmatic dependent launch; no PDL = the graph captured without it; "
      "min / max, floor and ratios are the graph's\n\n";
  md +=
      "| step | T | eager ms | host ms | graph no PDL ms | graph ms | min ms | max ms | "
      "experts / layer | bytes GB | floor ms | floor / time | time / decode B=1 |\n";
  md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  nlohmann::json js = nlohmann::json::array();
  for (StepResult const& r : steps) {
    Timing const& t = r.time;
    double const fraction = r.floor_ms / t.median_ms, ratio = t.median_ms / decode_ms;
    md += format(
        "| %s | %lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %s | %.3f | %.3f | "
        "%.3f |\n",
        r.shape.name.c_str(), (long long)r.shape.tokens(), r.eager.median_ms, r.eager.host_ms,
        r.plain.median_ms, t.median_ms, t.min_ms, t.max_ms, r.experts_per_layer,
        gb(r.bytes).c_str(), r.floor_ms,
        fraction, ratio);
    nlohmann::json s = {{"name", r.shape.name},
                        {"kind", r.shape.verify ? "verify" : "decode"},
                        {"batch", r.shape.batch},
                        {"nodes", r.shape.nodes},
                        {"tokens", r.shape.tokens()},
                        {"eager", to_json(r.eager)},
                        {"graph_no_pdl", to_json(r.plain)},
                        {"time", to_json(t)},
                        {"cache_rows", r.cache_rows},
                        {"cache_bytes_read", double(r.cache_rows) * double(bm.cache_row_bytes)},
                        {"expected_experts_per_layer", r.experts_per_layer},
                        {"bytes", r.bytes},
                        {"floor_ms", r.floor_ms},
                        {"fraction_of_floor", fraction},
                        {"time_over_decode_b1", ratio}};
    if (r.shape.verify) {
      s["parents"] = r.shape.parents;
      s["levels"] = r.shape.levels;
      s["depth"] = r.shape.depth;
    }
    js.push_back(std::move(s));
  }
  nlohmann::json spec_json = nullptr;
  if (spec != nullptr) spec_json = spec_step_section(*spec, copy, &md);
  md += format(
      "\nProjected speedup at batch 1 = accept length x t(decode B=1) / t(verify): the verify "
      "alone, the draft's cost not included%s; \"-\": more tokens than one verify of the shape "
      "can accept (its depth + 1).\n\n",
      spec != nullptr ? "; the last row is measured whole: accept length x t(plain step) / "
                        "t(EAGLE-3 chain 3 step), both through SpecEngine (table above)"
                      : "");
  md += "| verify | max accept |";
  for (double a : kAcceptLengths) md += format(" %.1f |", a);
  md += "\n|---|---:|";
  for (size_t i = 0; i < std::size(kAcceptLengths); ++i) md += "---:|";
  md += "\n";
  nlohmann::json projection = nlohmann::json::array();
  for (StepResult const& r : steps) {
    if (!r.shape.verify) continue;
    md += format("| %s | %d |", r.shape.name.c_str(), r.shape.max_accept());
    nlohmann::json speedups = nlohmann::json::array();
    for (double a : kAcceptLengths) {
      if (a > r.shape.max_accept()) {
        md += " - |";
        speedups.push_back(nullptr);
        continue;
      }
      double const x = a * decode_ms / r.time.median_ms;
      md += format(" %.2f |", x);
      speedups.push_back(x);
    }
    md += "\n";
    projection.push_back({{"name", r.shape.name},
                          {"max_accept", r.shape.max_accept()},
                          {"speedup", std::move(speedups)}});
  }
  if (spec != nullptr) {
    int const max_accept = ChainPolicy::kSteps + 1;
    md += format("| EAGLE-3 chain 3, whole step (draft included) | %d |", max_accept);
    nlohmann::json speedups = nlohmann::json::array();
    for (double a : kAcceptLengths) {
      if (a > max_accept) {
        md += " - |";
        speedups.push_back(nullptr);
        continue;
      }
      double const x = a * spec->plain.step_ms / spec->chain.step_ms;
      md += format(" %.2f |", x);
      speedups.push_back(x);
    }
    md += "\n";
    projection.push_back({{"name", "EAGLE-3 chain 3, whole step (draft included)"},
                          {"max_accept", max_accept},
                          {"speedup", std::move(speedups)}});
  }
  rep.json = {
      {"preset", kPreset},
      {"config", io::describe(c)},
      {"num_layers", c.num_hidden_layers},
      {"context", o.context},
      {"reps", o.reps},
      {"warmup_calls", kWarmupCalls},
      {"seed", o.seed},
      {"logits_mode", "full"},
      {"weight_generation_s", generation_s},
      {"weight_bytes", bm.weight_bytes},
      {"embedding_bytes", bm.embedding_bytes},
      {"expert_bytes", bm.expert_bytes},
      {"routed_expert_bytes", bm.routed_bytes},
      {"rest_bytes", bm.rest_bytes},
      {"cache_row_bytes", bm.cache_row_bytes},
      {"kv_cache_bytes", cache_bytes},
      {"copy_floor",
       {{"bytes", kCopyBytes}, {"time", to_json(copy.time)}, {"bytes_per_s", copy.bytes_per_s}}},
      {"steps", std::move(js)},
      {"speculative_step", std::move(spec_json)},
      {"projection", {{"accept_lengths", kAcceptLengths}, {"rows", std::move(projection)}}},
      {"notes",
       {"bytes: rest + T embedding rows + expected distinct experts x expert bytes x MoE layers + "
        "cache rows read; expected distinct experts E(1 - (1 - k/E)^T) is an estimate for random "
        "routing",
        "eager: CUDA events around one forward call launched by the host; time: the same call "
        "replaying the forward captured as a CUDA graph (floor and ratios use it); both with "
        "programmatic dependent launch, graph_no_pdl the graph captured without it",
        "projection: accept_length x t(decode B=1) / t(verify), the draft's cost not included; "
        "the whole-step row: accept_length x t(plain step) / t(EAGLE-3 chain 3 step) through "
        "SpecEngine; null where the accept length exceeds the shape's depth + 1"}}};
  return rep;
}

void write_file(std::string const& path, std::string const& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) require(Status::InvalidArgument("cannot write " + path), "output");
}

}  // namespace

int main(int argc, char** argv) {
  Options const o = parse_flags(argc, argv);
  std::vector<StepShape> const shapes = step_shapes(o);
  if (!specdec::cuda_device_available()) {
    std::printf("no CUDA device: specdec_bench_kimi_step not run\n");
    return 0;
  }
  io::DeepseekV3Config const config = preset_config(o);
  if (int64_t{o.context} + kMaxNodes > config.max_position_embeddings) {
    usage(format("--context %d: context + %d must not exceed max_position_embeddings %lld",
                 o.context, kMaxNodes, (long long)config.max_position_embeddings)
              .c_str());
  }
  std::printf(
      "specdec_bench_kimi_step: preset %s: %s; context %d, reps %d (+%d warm-up), seed "
      "%llu\n",
      kPreset, io::describe(config).c_str(), o.context, o.reps, kWarmupCalls,
      (unsigned long long)o.seed);
  std::fflush(stdout);
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  CopyFloor const copy = measure_copy_floor(stream, o.reps);  // before the weights fill the GPU
  std::printf("copy floor: %.0f GB/s (1 GiB device to device, read + written, median)\n",
              copy.bytes_per_s * 1e-9);

  kimi::KimiCudaModel model;
  auto const t0 = std::chrono::steady_clock::now();
  require(kimi::generate_kimi_cuda_model(config, o.seed, specdec::dist::TpShard{}, nullptr, &model),
          "generate_kimi_cuda_model");
  double const generation_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ByteModel const bm = ByteModel::of(config, model.weight_bytes);
  std::printf("weights: model.weight_bytes %llu (%.2f GB) generated on the GPU in %.1f s\n",
              (unsigned long long)model.weight_bytes, model.weight_bytes * 1e-9, generation_s);

  // The cache: kMaxBatch requests of up to context + kMaxNodes slots, every entry random.
  int const pages_per_request = (o.context + kMaxNodes + kPageSize - 1) / kPageSize;
  int const num_pages = kMaxBatch * pages_per_request;
  kimi::KimiCudaCache cache;
  require(kimi::KimiCudaCache::create_for(config, kPageSize, num_pages, pages_per_request, &cache),
          "KimiCudaCache::create_for");
  uint64_t const cache_bytes = cache.entries.size() * sizeof(float);
  std::printf(
      "KV cache: %d requests x %d slots (%d pages of %d) x %d layers x %llu B = %llu B "
      "(%.2f GB)\n",
      kMaxBatch, pages_per_request * kPageSize, pages_per_request, kPageSize,
      config.num_hidden_layers, (unsigned long long)(bm.cache_row_bytes / config.num_hidden_layers),
      (unsigned long long)cache_bytes, cache_bytes * 1e-9);
  int64_t const floats = static_cast<int64_t>(cache.entries.size());
  require(kimi::fill_random_block(cache.entries.data(),
                                  kimi::RandomDraw{kimi::RandomDraw::Kind::kF32, 0.0f,
                                                   std::sqrt(3.0f), o.seed ^ kCacheDrawKey},
                                  floats, 0, 1, 0, floats, stream),
          "fill the cache entries");
  check_cuda(cudaStreamSynchronize(stream), "fill the cache entries");
  for (int b = 0; b < kMaxBatch; ++b) {
    require(cache.table.add_request(b), "MlaCache::add_request");
    require(cache.table.append(b, o.context), "MlaCache::append");  // reserves the pages
  }
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  std::printf("GPU memory: %.2f GB free of %.2f GB\n", free_bytes * 1e-9, total_bytes * 1e-9);

  specdec::testing::Rng rng(o.seed);
  if (o.profile_decode > 0) {
    profile_decode(o.profile_decode, model, cache, o.context, rng, stream);
    check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    return 0;
  }
  std::vector<StepResult> steps;
  for (StepShape const& shape : shapes) {
    StepResult r = run_step(shape, model, cache, o.context, o.reps, rng, stream);
    r.experts_per_layer = bm.distinct_experts(shape.tokens());
    r.bytes = bm.bytes(shape.tokens(), r.cache_rows);
    r.floor_ms = r.bytes / copy.bytes_per_s * 1e3;
    std::printf("%s: eager %.3f ms, graph no PDL %.3f ms, graph %.3f ms (medians)\n",
                shape.name.c_str(), r.eager.median_ms, r.plain.median_ms, r.time.median_ms);
    std::fflush(stdout);
    steps.push_back(std::move(r));
  }
  std::optional<SpecStep> spec;
  int const deepest_layer = ChainPolicy::Layers::ids().back();
  if (o.spec_tokens == 0) {
    std::printf("speculative step: not run (--spec-tokens 0)\n");
  } else if (deepest_layer >= config.num_hidden_layers) {
    std::printf("speculative step: not run (the EAGLE-3 layer set %s needs more than %d layers)\n",
                specdec::format_layers(ChainPolicy::Layers::ids()).c_str(),
                config.num_hidden_layers);
  } else {
    spec = run_spec_step(o, config, model, bm, rng, stream);
    std::printf("speculative step: EAGLE-3 chain 3 %.3f ms, plain %.3f ms (medians)\n",
                spec->chain.step_ms, spec->plain.step_ms);
  }
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");

  Report const rep =
      report(o, config, bm, generation_s, cache_bytes, copy, steps, spec ? &*spec : nullptr);
  std::printf("\n%s", rep.markdown.c_str());
  if (!o.markdown_path.empty()) write_file(o.markdown_path, rep.markdown);
  if (!o.json_path.empty()) write_file(o.json_path, rep.json.dump(2) + "\n");
  return 0;
}
