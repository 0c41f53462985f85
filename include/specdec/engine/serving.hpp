// ServingBackend: what a server needs of a running engine, with no model or executor type in it,
// so an HTTP front end (examples/kimi/server.cpp) compiles as plain C++ against any engine.
// engine/scheduler.hpp implements it for SpecEngine<P, Exec> (continuous batching).
//
//   submit(request, events, &id)  queues one request; its tokens arrive through events.on_tokens
//                                 as the engine commits them (one call per step that gave it
//                                 tokens, on the scheduler's thread), then events.on_finish once.
//                                 on_tokens returning false stops the request there (a stop
//                                 string matched): finish reason kStopString.
//                                 Errors at submit (nothing queued, no callback ever runs):
//                                 kInvalidArgument  the request itself (empty prompt, id outside
//                                                   the vocabulary, bad sampling values, longer
//                                                   than the context or than the whole KV cache)
//                                 kUnsupported      the server is shutting down, or the queue is
//                                                   full (ServingStats::queue_capacity)
//   cancel(id)                    a client went away: the request stops at the next step boundary,
//                                 its KV pages and draft slot are freed, on_finish(kCancelled).
//                                 Unknown or finished ids are ignored.
//   stats()                       a consistent snapshot for /metrics and the decode log
//   shutdown(cancel_running)      stops intake; queued requests finish as kCancelled; running ones
//                                 run to their end (false) or are cancelled (true); returns when
//                                 no request is left and the scheduler's thread has stopped.
//   info()                        what the server reports about itself (/get_server_info)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/engine/metrics.hpp"

namespace specdec::engine {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // >= 1 target token ids
  int max_new_tokens = 16;
  float temperature = 0.0f;  // 0: greedy, else >= ops::kSampleMinTemperature
  int32_t top_k = 0;         // -1 or 0: no top-k
  float top_p = 1.0f;        // (0, 1]; 1: no top-p
  uint64_t seed = 0;
  bool stop_at_eos = true;            // stop at the target config's eos ids
  std::vector<int32_t> stop_ids;      // further ids that stop this request (e.g. <|im_end|>)
};

enum class FinishReason {
  kEos,         // an eos id of the target's config
  kStopId,      // one of the request's stop_ids
  kLength,      // max_new_tokens
  kStopString,  // on_tokens returned false
  kCancelled,   // cancel(), or shutdown
  kError,       // the engine failed (RequestOutcome::error says how)
};

inline char const* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopId: return "stop_id";
    case FinishReason::kLength: return "length";
    case FinishReason::kStopString: return "stop_string";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

// OpenAI's finish_reason: "stop" (eos, a stop id or string), "length", or "abort" otherwise.
inline char const* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
    case FinishReason::kStopId:
    case FinishReason::kStopString: return "stop";
    case FinishReason::kLength: return "length";
    default: return "abort";
  }
}

struct RequestOutcome {
  FinishReason reason = FinishReason::kLength;
  std::string error;           // kError only
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;   // tokens delivered through on_tokens
  SpecMetrics metrics;         // this request's counters (accept length etc.)
  double queue_s = 0.0;        // submit -> admitted
  double first_token_s = 0.0;  // submit -> first token delivered (0: none)
  double total_s = 0.0;        // submit -> finished
};

struct RequestEvents {
  std::function<bool(std::span<int32_t const> tokens)> on_tokens;  // false: stop here
  std::function<void(RequestOutcome const&)> on_finish;            // exactly once
};

// A histogram with fixed upper bounds (Prometheus "le"), counts per bucket (not cumulative) plus
// one overflow bucket: counts.size() == bounds.size() + 1.
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;
  double sum = 0.0;
  int64_t count = 0;

  Histogram() = default;
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

// Counters since start (monotonic) and gauges now.
struct ServingStats {
  // Gauges.
  int64_t running = 0;         // requests in the running batch (prefilling or decoding)
  int64_t queued = 0;          // waiting for admission
  int64_t queue_capacity = 0;  // submit beyond this many queued is refused
  int64_t kv_pages_used = 0, kv_pages_total = 0, page_size = 0;
  int64_t kv_tokens = 0;       // committed tokens held in the cache by running requests
  // Counters.
  int64_t requests_submitted = 0, requests_rejected = 0;
  std::vector<int64_t> requests_finished;  // by FinishReason (index = the enum's value)
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t steps = 0;          // scheduler iterations that ran the engine
  SpecMetrics spec;           // verifies, proposed / accepted per depth, phase seconds
  Histogram accept_length;    // tokens committed per verify (per request), buckets 1..depth+1
  Histogram step_draft_s, step_verify_s, step_commit_s;  // per engine step, seconds
  Histogram time_to_first_token_s, time_per_output_token_s, e2e_request_s;
  bool cuda_graph = false;    // whether the last decode step replayed a captured CUDA graph
  int cuda_graph_batch = 0;   // the ladder size its CUDA graphs were captured for (0: none)
};

// What /get_server_info and /v1/models report.
struct ServingInfo {
  std::string model_name;          // the served model's id (/v1/models)
  std::string model_path;
  std::string speculative_config;  // describe<P>() and the draft path
  std::string speculative_algorithm;
  int speculative_num_steps = 0, speculative_eagle_topk = 0, speculative_num_draft_tokens = 1;
  std::string device;              // cpu / cuda
  int64_t context_length = 0;      // the target's max_position_embeddings
  int64_t vocab_size = 0;
  int max_running_requests = 0;
  int64_t prefill_chunk = 0;       // tokens per prefill chunk (0: whole prompts)
  std::vector<int32_t> eos_ids;    // the target config's
  bool cuda_graph = false;         // the target's decode / verify forwards replay CUDA graphs
  std::vector<int> cuda_graph_bs;  // the graph ladder the CUDA forwards pad to (empty: none)
};

class ServingBackend {
 public:
  virtual ~ServingBackend() = default;
  virtual Status submit(GenerationRequest request, RequestEvents events, uint64_t* id) = 0;
  virtual void cancel(uint64_t id) = 0;
  virtual ServingStats stats() const = 0;
  virtual void shutdown(bool cancel_running) = 0;
  virtual ServingInfo const& info() const = 0;
};

}  // namespace specdec::engine
