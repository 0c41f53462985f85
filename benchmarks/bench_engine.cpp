// SpecEngine<P, Exec> end to end on tiny Kimi targets: one greedy request of kNewTokens tokens
// after one prompt, plainly (NONE) and with n-gram chains of 3 and 5 nodes (NGRAM, root included),
// on two targets:
//   repeatP  the tiny preset written with repeat_period kPeriod (model/kimi/random_checkpoint.hpp):
//            its greedy text is 0, 1, .., kPeriod - 1, 0, .. whatever the context, so prompt
//            lookup drafts right once the prompt holds a period;
//   random   the plain tiny preset, whose greedy text does not follow the prompt's cycle: the cost
//            of proposing drafts that the target mostly rejects.
// Executors: cpu (SpecEngine<P, CpuExecutor>, always) and, when this file is compiled as CUDA
// (benchmarks/CMakeLists.txt does so in CUDA builds), cuda (SpecEngine<P, CudaExecutor> on the
// default stream; an error "no CUDA device" where there is none).
// Prompt: one period then 0 1 2 3 (kPeriod + 4 tokens). Wall time per generate (engine creation
// included; checkpoints written and loaded once). Counters:
//   tokens_per_s     kNewTokens / wall time
//   accept_length    tokens per verify (SpecMetrics::accept_length of the runs: the first token,
//                    from the prefill, is not counted)
//   speedup_vs_none  t_none / t, t_none the median of kNoneRuns NONE runs on the same target and
//                    executor, measured once in this process before the first case that needs it
//                    (the NONE cases report it too: their distance from 1 is the noise)
//   efficiency       speedup_vs_none / accept_length (DESIGN.md "Measuring")
//   verify_us        the verify phase per verify (SpecMetrics::verify_s / verify_ct). On the CPU
//                    executor a verify of N nodes costs about N times one of 1 node (the tiny
//                    weights sit in cache: the work is per token), so the speedup stays far below
//                    the accept length there.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/engine/spec_engine.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "specdec/policy/spec_policy.hpp"
#include "support/testing.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/model/kimi/forward_cuda.cuh"
#endif

namespace {

using namespace specdec;
namespace kimi = specdec::model::kimi;

constexpr int kPeriod = 32;
constexpr int kNewTokens = 128;
constexpr int kNoneRuns = 11;
// NONE runs before t_none's (with one run of warm-up the first target's t_none came out 1.3-1.4x
// its NONE case's time on a 2-core x86 host: cold allocator and caches).
constexpr double kWarmupSeconds = 0.3;

enum class Which { kRepeat, kRandom };

struct Target {
  io::DeepseekV3Config config;
  io::SafetensorsCheckpoint ckpt;
  kimi::KimiWeights weights;
  kimi::KimiCpuModel cpu;
  Status status = Status::Ok();
#if defined(__CUDACC__)
  kimi::KimiCudaModel gpu;
  bool gpu_loaded = false;
#endif
};

// The two targets, written into one temporary directory and loaded on first use.
struct Targets {
  testing::TempDir tmp;
  std::map<Which, std::unique_ptr<Target>> loaded;

  Target* get(Which w) {
    auto& t = loaded[w];
    if (t) return t.get();
    t = std::make_unique<Target>();
    int const period = w == Which::kRepeat ? kPeriod : 0;
    std::string const dir = tmp.file(w == Which::kRepeat ? "repeat" : "random");
    t->status = [&]() -> Status {
      SPECDEC_RETURN_IF_ERROR(kimi::write_random_preset(dir, "tiny", /*seed=*/1, /*int4=*/false,
                                                        /*shards=*/1, {}, {},
                                                        kimi::KimiRandomOptions{period}));
      SPECDEC_RETURN_IF_ERROR(io::load_config(dir, &t->config));
      SPECDEC_RETURN_IF_ERROR(io::SafetensorsCheckpoint::open(dir, &t->ckpt));
      SPECDEC_RETURN_IF_ERROR(kimi::load_kimi_weights(t->ckpt, t->config, &t->weights));
      return kimi::load_kimi_cpu_model(t->weights, t->config, &t->cpu);
    }();
    return t.get();
  }
};

Targets& targets() {
  static Targets t;
  return t;
}

using None = SpecPolicy<NoDraft, Layers<>, NoTree, Eager>;
template <int Nodes>
using NGramNodes = SpecPolicy<NGram, Layers<>, Chain<Nodes - 1>, Eager>;
template <class Exec>  // the same for every policy
using TargetModel = typename engine::SpecEngine<None, Exec>::TargetModel;

// The target model of executor Exec (loaded on first use).
template <class Exec>
Status model_for(Which w, TargetModel<Exec>** out) {
  Target* t = targets().get(w);
  SPECDEC_RETURN_IF_ERROR(t->status);
  if constexpr (std::is_same_v<Exec, CpuExecutor>) {
    *out = &t->cpu;
  } else {
#if defined(__CUDACC__)
    if (!cuda_device_available()) return Status::Unsupported("no CUDA device");
    if (!t->gpu_loaded) {
      SPECDEC_RETURN_IF_ERROR(kimi::load_kimi_cuda_model(t->weights, t->config, &t->gpu));
      t->gpu_loaded = true;
    }
    *out = &t->gpu;
#endif
  }
  return Status::Ok();
}

engine::GenerationRequest request() {
  engine::GenerationRequest r;
  for (int i = 0; i < kPeriod + 4; ++i) r.prompt.push_back(i % kPeriod);
  r.max_new_tokens = kNewTokens;
  r.stop_at_eos = false;
  return r;
}

// One generate through a fresh engine: wall seconds.
template <class P, class Exec>
Status generate_once(TargetModel<Exec>* target, engine::SpecMetrics* total, double* seconds) {
  using Engine = engine::SpecEngine<P, Exec>;
  auto const start = std::chrono::steady_clock::now();
  Engine e;
  SPECDEC_RETURN_IF_ERROR(Engine::create(target, nullptr, {}, &e));
  engine::GenerationRequest const r = request();
  std::vector<engine::GenerationResult> out;
  SPECDEC_RETURN_IF_ERROR(e.generate({&r, 1}, &out, total));
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (out.size() != 1 || out[0].output_ids.size() != static_cast<size_t>(kNewTokens)) {
    return Status::Internal("bench_engine: expected one result of " + std::to_string(kNewTokens) +
                            " tokens");
  }
  return Status::Ok();
}

// t_none of a target on Exec, measured once.
template <class Exec>
Status none_seconds(Which w, double* out) {
  static std::map<Which, double> measured;
  if (auto it = measured.find(w); it != measured.end()) {
    *out = it->second;
    return Status::Ok();
  }
  TargetModel<Exec>* target = nullptr;
  SPECDEC_RETURN_IF_ERROR(model_for<Exec>(w, &target));
  engine::SpecMetrics unused;
  double x = 0.0;
  for (double warm = 0.0; warm < kWarmupSeconds; warm += x) {
    SPECDEC_RETURN_IF_ERROR((generate_once<None, Exec>(target, &unused, &x)));
  }
  std::vector<double> s(kNoneRuns);
  for (double& y : s) SPECDEC_RETURN_IF_ERROR((generate_once<None, Exec>(target, &unused, &y)));
  std::sort(s.begin(), s.end());
  *out = measured[w] = s[s.size() / 2];
  return Status::Ok();
}

template <class P, class Exec>
void BM_engine(benchmark::State& state, Which w) {
  double t_none = 0.0;
  TargetModel<Exec>* target = nullptr;
  Status s = none_seconds<Exec>(w, &t_none);
  if (s.ok()) s = model_for<Exec>(w, &target);
  if (!s.ok()) {
    state.SkipWithError(s.to_string().c_str());
    return;
  }
  engine::SpecMetrics total;
  double sum = 0.0;
  for (auto _ : state) {
    engine::SpecMetrics run;
    double seconds = 0.0;
    s = generate_once<P, Exec>(target, &run, &seconds);
    if (!s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      return;
    }
    sum += seconds;
    total.merge(run);
  }
  double const mean = sum / static_cast<double>(state.iterations());
  double const accept = total.accept_length();
  state.counters["tokens_per_s"] = kNewTokens / mean;
  state.counters["accept_length"] = accept;
  state.counters["speedup_vs_none"] = t_none / mean;
  state.counters["efficiency"] = accept > 0.0 ? t_none / mean / accept : 0.0;
  state.counters["verify_us"] = total.verify_ct ? 1e6 * total.verify_s / total.verify_ct : 0.0;
}

template <class Exec>
void add_cases(std::string const& exec) {
  auto add = [&]<class P>(P, std::string const& name, Which w) {
    benchmark::RegisterBenchmark(("BM_engine/" + exec + "/" + name).c_str(), BM_engine<P, Exec>, w)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  std::string const repeat = "repeat" + std::to_string(kPeriod) + "/";
  add(None{}, repeat + "NONE", Which::kRepeat);
  add(NGramNodes<3>{}, repeat + "NGRAM_nodes3", Which::kRepeat);
  add(NGramNodes<5>{}, repeat + "NGRAM_nodes5", Which::kRepeat);
  add(None{}, "random/NONE", Which::kRandom);
  add(NGramNodes<5>{}, "random/NGRAM_nodes5", Which::kRandom);
}

[[maybe_unused]] bool const registered = [] {
  add_cases<CpuExecutor>("cpu");
#if defined(__CUDACC__)
  add_cases<CudaExecutor>("cuda");
#endif
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
