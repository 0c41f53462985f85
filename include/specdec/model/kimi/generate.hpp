// Plain (non-speculative) generation with the CPU executor's Kimi forward
// (model/kimi/forward_cpu.hpp) over its paged MLA cache: prefill the prompt, then decode one token
// at a time. Each new token is drawn by ops::sample from the last logits row: greedy at
// temperature 0, else temperature sampling with Philox keyed on (seed, request 0, step = index of
// the new token), so a seed reproduces its output.
//   kimi_generate(CpuExecutor{}, model, config, input_ids [T], options, &result)
//   result.output_ids [<= max_new_tokens]: stops early after an eos id of config.json unless
//   options.stop_at_eos is false (then exactly max_new_tokens, like a fixed-length benchmark).
// Timing: prefill_seconds (the prompt's forward and the first token's draw), decode_seconds (the
// rest); tokens_per_s = output tokens / (prefill + decode) seconds, decode_tokens_per_s = tokens
// after the first / decode_seconds.
// Errors name the option: empty prompt, a prompt id outside the vocabulary, max_new_tokens < 1,
// a prompt plus new tokens past max_position_embeddings, a negative or non-finite temperature,
// page_size < 1.
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

inline Status kimi_generate(CpuExecutor exec, KimiCpuModel const& model,
                            io::DeepseekV3Config const& config,
                            std::span<int32_t const> input_ids, GenerateOptions const& o,
                            GenerateResult* out) {
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
  if (!(o.temperature >= 0.0f) || std::isinf(o.temperature)) {
    return bad("temperature " + std::to_string(o.temperature) +
               " is not a finite value >= 0 (0 means greedy)");
  }
  if (o.page_size < 1) return bad("page_size " + std::to_string(o.page_size) + " < 1");

  int64_t const slots = T + o.max_new_tokens;
  int const pages = static_cast<int>(ceil_div<int64_t>(slots, o.page_size));
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
  auto is_eos = [&](int32_t t) {
    for (int64_t e : config.eos_token_ids) {
      if (e == t) return true;
    }
    return false;
  };

  GenerateResult r;
  using Clock = std::chrono::steady_clock;
  auto const start = Clock::now();
  int32_t const count = static_cast<int32_t>(T);
  SPECDEC_RETURN_IF_ERROR(kimi_prefill(exec, model, &cache, ids, std::span<int32_t const>(&count, 1),
                                       input_ids, {}, &logits, nullptr));
  int32_t token = -1;
  SPECDEC_RETURN_IF_ERROR(draw(0, &token));
  r.output_ids.push_back(token);
  auto const prefilled = Clock::now();
  while (static_cast<int>(r.output_ids.size()) < o.max_new_tokens &&
         !(o.stop_at_eos && is_eos(token))) {
    SPECDEC_RETURN_IF_ERROR(
        kimi_decode(exec, model, &cache, ids, std::span<int32_t const>(&token, 1), {}, &logits, nullptr));
    SPECDEC_RETURN_IF_ERROR(draw(static_cast<uint32_t>(r.output_ids.size()), &token));
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

}  // namespace specdec::model::kimi
