// Plain (non-speculative) generation with the Kimi forward of the CPU executor
// (model/kimi/forward_cpu.hpp) or, in CUDA translation units, the CUDA executor (forward_cuda.cuh),
// over a paged MLA cache: prefill the prompt, then decode one token
// at a time. Each new token is drawn by ops::sample from the last logits row: greedy at
// temperature 0, else temperature sampling with Philox keyed on (seed, request 0, step = index of
// the new token), so a seed reproduces its output.
//   kimi_generate(CpuExecutor{}, cpu_model, config, input_ids [T], options, &result)
//   kimi_generate(CudaExecutor{stream}, cuda_model, input_ids [T], options, &result)
//   result.output_ids [<= max_new_tokens]: stops early after an eos id of config.json unless
//   options.stop_at_eos is false (then exactly max_new_tokens, like a fixed-length benchmark).
// Timing: prefill_seconds (the prompt's forward and the first token's draw), decode_seconds (the
// rest); tokens_per_s = output tokens / (prefill + decode) seconds, decode_tokens_per_s = tokens
// after the first / decode_seconds.
// Errors name the option: empty prompt, a prompt id outside the vocabulary, max_new_tokens < 1,
// a prompt plus new tokens past max_position_embeddings, a temperature that is negative, not
// finite or above 0 and below ops::kSampleMinTemperature, page_size < 1.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/executor.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/ops/sample/sample.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/model/kimi/forward_cuda.cuh"
#endif

namespace specdec::model::kimi {

struct GenerateOptions {
  int max_new_tokens = 16;
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 0;
  bool stop_at_eos = true;
  int page_size = 16;        // MLA cache page, in tokens
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  bool stopped_at_eos = false;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  double tokens_per_s = 0.0;
  double decode_tokens_per_s = 0.0;
};

namespace detail {

// The checks every executor's generate makes; "" when the options hold.
inline Status check_generate(io::DeepseekV3Config const& config, std::span<int32_t const> input_ids,
                             GenerateOptions const& o, GenerateResult const* out) {
  auto bad = [](std::string m) { return Status::InvalidArgument("generate: " + m); };
  if (out == nullptr) return bad("result is null");
  int64_t const T = static_cast<int64_t>(input_ids.size()), V = config.vocab_size;
  if (T < 1) return bad("the prompt (input ids) is empty");
  for (int64_t i = 0; i < T; ++i) {
    if (input_ids[i] < 0 || input_ids[i] >= V) {
      return bad("input id " + std::to_string(input_ids[i]) + " at index " + std::to_string(i) +
                 " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
  }
  if (o.max_new_tokens < 1) {
    return bad("max_new_tokens " + std::to_string(o.max_new_tokens) + " < 1");
  }
  if (T + o.max_new_tokens > config.max_position_embeddings) {
    return bad(std::to_string(T) + " prompt tokens + " + std::to_string(o.max_new_tokens) +
               " new tokens exceed max_position_embeddings " +
               std::to_string(config.max_position_embeddings));
  }
  if (ops::sample_config_error(o.temperature, 1.0f) != ops::kSampleOk ||
      o.temperature < 0.0f) {
    return bad("temperature " + float_text(o.temperature) +
               " is neither 0 (greedy) nor a finite value >= " +
               float_text(ops::kSampleMinTemperature));
  }
  if (o.page_size < 1) return bad("page_size " + std::to_string(o.page_size) + " < 1");
  return Status::Ok();
}

// The cache pages one request of input_ids + max_new_tokens needs.
inline int generate_pages(std::span<int32_t const> input_ids, GenerateOptions const& o) {
  return static_cast<int>(
      ceil_div<int64_t>(static_cast<int64_t>(input_ids.size()) + o.max_new_tokens, o.page_size));
}

// The loop of every executor: prefill(&token) runs the prompt and draws the first token,
// decode(step, &token) feeds `token` and draws the step-th; timing as the top of this file says.
template <class Prefill, class Decode>
Status generate_loop(io::DeepseekV3Config const& config, GenerateOptions const& o,
                     Prefill&& prefill, Decode&& decode, GenerateResult* out) {
  auto is_eos = [&](int32_t t) {
    for (int64_t e : config.eos_token_ids) {
      if (e == t) return true;
    }
    return false;
  };
  GenerateResult r;
  using Clock = std::chrono::steady_clock;
  auto const start = Clock::now();
  int32_t token = -1;
  SPECDEC_RETURN_IF_ERROR(prefill(&token));
  r.output_ids.push_back(token);
  auto const prefilled = Clock::now();
  while (static_cast<int>(r.output_ids.size()) < o.max_new_tokens &&
         !(o.stop_at_eos && is_eos(token))) {
    SPECDEC_RETURN_IF_ERROR(decode(static_cast<uint32_t>(r.output_ids.size()), &token));
    r.output_ids.push_back(token);
  }
  auto const done = Clock::now();
  r.stopped_at_eos = o.stop_at_eos && is_eos(token);
  r.prefill_seconds = std::chrono::duration<double>(prefilled - start).count();
  r.decode_seconds = std::chrono::duration<double>(done - prefilled).count();
  double const total = r.prefill_seconds + r.decode_seconds;
  r.tokens_per_s = total > 0.0 ? static_cast<double>(r.output_ids.size()) / total : 0.0;
  r.decode_tokens_per_s =
      r.decode_seconds > 0.0 ? static_cast<double>(r.output_ids.size() - 1) / r.decode_seconds : 0.0;
  *out = std::move(r);
  return Status::Ok();
}

}  // namespace detail

inline Status kimi_generate(CpuExecutor exec, KimiCpuModel const& model,
                            io::DeepseekV3Config const& config,
                            std::span<int32_t const> input_ids, GenerateOptions const& o,
                            GenerateResult* out) {
  SPECDEC_RETURN_IF_ERROR(detail::check_generate(config, input_ids, o, out));
  int64_t const V = config.vocab_size;
  int const pages = detail::generate_pages(input_ids, o);
  MlaCache cache;
  SPECDEC_RETURN_IF_ERROR(MlaCache::create_for(config, o.page_size, pages, pages, &cache));
  RequestId const id = 0;
  SPECDEC_RETURN_IF_ERROR(cache.add_request(id));
  std::span<RequestId const> const ids(&id, 1);

  // One draw from the last row of `logits` for the `step`-th new token.
  std::vector<float> logits;
  float const temperature = o.temperature;
  uint64_t const seed = o.seed;
  auto draw = [&](uint32_t step, int32_t* token) {
    int32_t status = 0;
    ops::SampleParams p;
    p.logits = logits.data() + logits.size() - static_cast<size_t>(V);
    p.batch = 1;
    p.vocab = static_cast<int>(V);
    p.config.temperature = &temperature;
    p.keys.seed = &seed;
    p.keys.step = &step;
    p.tokens = token;
    p.status = &status;
    SPECDEC_RETURN_IF_ERROR(ops::sample(exec, p));
    return ops::check_sample_status(&status, 1);
  };
  int32_t const count = static_cast<int32_t>(input_ids.size());
  auto prefill = [&](int32_t* token) {
    SPECDEC_RETURN_IF_ERROR(kimi_prefill(exec, model, &cache, ids,
                                         std::span<int32_t const>(&count, 1), input_ids, {},
                                         &logits, nullptr));
    return draw(0, token);
  };
  auto decode = [&](uint32_t step, int32_t* token) {
    SPECDEC_RETURN_IF_ERROR(kimi_decode(exec, model, &cache, ids,
                                        std::span<int32_t const>(token, 1), {}, &logits, nullptr));
    return draw(step, token);
  };
  return detail::generate_loop(config, o, prefill, decode, out);
}

#if defined(__CUDACC__)
// The same on one GPU: the forward and the draw (ops::sample's CUDA kernel on the last logits
// row) on `exec.stream`; the host waits once per token to read it back.
inline Status kimi_generate(CudaExecutor exec, KimiCudaModel& model,
                            std::span<int32_t const> input_ids, GenerateOptions const& o,
                            GenerateResult* out) {
  io::DeepseekV3Config const& config = model.config;
  SPECDEC_RETURN_IF_ERROR(detail::check_generate(config, input_ids, o, out));
  int64_t const V = config.vocab_size;
  int const pages = detail::generate_pages(input_ids, o);
  KimiCudaCache cache;
  SPECDEC_RETURN_IF_ERROR(KimiCudaCache::create_for(config, o.page_size, pages, pages, &cache));
  RequestId const id = 0;
  SPECDEC_RETURN_IF_ERROR(cache.table.add_request(id));
  std::span<RequestId const> const ids(&id, 1);

  // Device scalars of the draw: [temperature][seed][step][token][status], and its workspace.
  struct Scalars {
    float temperature;
    uint32_t step;
    uint64_t seed;
    int32_t token;
    int32_t status;
  };
  DeviceBuffer<Scalars> dev(1);
  DeviceBuffer<uint8_t> workspace(ops::sample_workspace_bytes(1, static_cast<int>(V)));
  if (dev.data() == nullptr || (workspace.data() == nullptr && workspace.size() > 0)) {
    return Status::CudaError("generate (cuda): cudaMalloc of the sampling scalars failed");
  }
  Scalars host{o.temperature, 0, o.seed, -1, 0};
  SPECDEC_CUDA_TRY(cudaMemcpy(dev.data(), &host, sizeof host, cudaMemcpyHostToDevice));
  CudaForwardOutput fwd;
  auto draw = [&](uint32_t step, int32_t* token) -> Status {
    SPECDEC_CUDA_TRY(cudaMemcpyAsync(&dev.data()->step, &step, sizeof step, cudaMemcpyHostToDevice,
                                     exec.stream));
    ops::SampleParams p;
    p.logits = fwd.logits + (fwd.tokens - 1) * V;
    p.batch = 1;
    p.vocab = static_cast<int>(V);
    p.config.temperature = &dev.data()->temperature;
    p.keys.seed = &dev.data()->seed;
    p.keys.step = &dev.data()->step;
    p.tokens = &dev.data()->token;
    p.status = &dev.data()->status;
    p.workspace = workspace.data();
    p.workspace_bytes = workspace.size();
    SPECDEC_RETURN_IF_ERROR(ops::sample(exec, p));
    Scalars back{};
    SPECDEC_CUDA_TRY(cudaMemcpyAsync(&back, dev.data(), sizeof back, cudaMemcpyDeviceToHost,
                                     exec.stream));
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec.stream));
    SPECDEC_RETURN_IF_ERROR(ops::check_sample_status(&back.status, 1));
    *token = back.token;
    return Status::Ok();
  };
  int32_t const count = static_cast<int32_t>(input_ids.size());
  auto prefill = [&](int32_t* token) {
    SPECDEC_RETURN_IF_ERROR(kimi_prefill(exec, model, &cache.table, ids,
                                         std::span<int32_t const>(&count, 1), input_ids, {}, &fwd));
    return draw(0, token);
  };
  auto decode = [&](uint32_t step, int32_t* token) {
    SPECDEC_RETURN_IF_ERROR(kimi_decode(exec, model, &cache.table, ids,
                                        std::span<int32_t const>(token, 1), {}, &fwd));
    return draw(step, token);
  };
  return detail::generate_loop(config, o, prefill, decode, out);
}
#endif

}  // namespace specdec::model::kimi
