// Text renderings of a ServingStats snapshot (engine/serving.hpp): the Prometheus exposition a
// server returns at /metrics, and the periodic "Decode batch, ..." log line in SGLang's format, so
// dashboards and greps written for SGLang keep working. Pure functions of their inputs.
//
//   prometheus_text(stats, info)  Prometheus text format 0.0.4: per metric a "# HELP" and a
//                                 "# TYPE" line, then its samples `name{labels} value`. Every
//                                 sample carries model_name="<info.model_name>" (escaped: \\ \"
//                                 \n). Metrics, prefix specdec_:
//     gauges     num_running_reqs, num_queue_reqs, kv_pages_used, kv_pages_total, kv_tokens,
//                token_usage (kv pages used / total; 0 when total is 0), cuda_graph (0 / 1),
//                cuda_graph_batch_size (the graph ladder size the last decode step's CUDA graphs
//                were captured for; 0: none),
//                spec_accept_length, spec_accept_rate (since start, SpecMetrics' definitions)
//     counters   requests_submitted_total, requests_rejected_total,
//                requests_finished_total{reason} (one sample per FinishReason, named by
//                finish_reason_name; a reason past the end of stats.requests_finished reads 0),
//                prompt_tokens_total, generation_tokens_total, engine_steps_total,
//                spec_verify_total, spec_committed_tokens_total,
//                spec_proposed_drafts_total{position}, spec_accepted_drafts_total{position}
//                (position d = 1..size-1 of proposed_at_depth / accepted_at_depth; none when the
//                vector has no depth), phase_seconds_total{phase} (prefill draft build verify
//                commit extend)
//     histograms spec_accept_length_per_verify, step_draft_seconds, step_verify_seconds,
//                step_commit_seconds, time_to_first_token_seconds,
//                time_per_output_token_seconds, e2e_request_latency_seconds: cumulative
//                _bucket{le} lines, one per bound, then le="+Inf" (= count), _sum, _count.
//                Bounds are taken as given (a Histogram keeps them increasing); a count missing
//                from Histogram::counts (a default-constructed Histogram has none) reads 0, so an
//                empty Histogram renders one +Inf bucket of 0.
//   Numbers: integers as integers; doubles in the shortest form that reads back to the same
//   double ("0.005", "1", "2.5e-07"), infinities and NaN as +Inf, -Inf, NaN.
//
//   decode_log_window(now, at_last_log, seconds_between)  the figures of one log line: gauges
//                                 from `now`; accept length (committed / verifies), accept rate
//                                 (accepted / proposed drafts) and generation throughput (tokens
//                                 / seconds_between) over the window between two snapshots of
//                                 the same backend, from differences of their counters. A window
//                                 with no verify has accept length 0 (and no proposed draft,
//                                 accept rate 0); seconds_between <= 0 gives throughput 0.
//                                 Counters are not clamped: an `at_last_log` newer than `now`
//                                 gives negative figures, shown as they are.
//   decode_log_line(window)       "Decode batch, #running-req: 3, #token: 812, token usage: 0.04,
//                                 accept len: 2.31, accept rate: 0.44, cuda graph: False, gen
//                                 throughput (token/s): 123.45, #queue-req: 0" (one line, no
//                                 newline). #token is kv_tokens; token usage is kv pages used /
//                                 total (0 when total is 0); floats with 2 decimals. The accept
//                                 fields are always present, "accept len: 0.00" when the window
//                                 had no verify (SGLang prints 0 without speculation).
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/engine/serving.hpp"

namespace specdec::serve {

namespace detail {

// A label value inside double quotes: backslash, double quote and newline escaped.
inline std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

inline std::string format_number(int64_t v) { return std::to_string(v); }

// Shortest round-trip form; Prometheus' spellings of the non-finite values.
inline std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto const r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

inline double ratio(int64_t num, int64_t den) {
  return den != 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

// Appends the exposition of one metric family after another.
class PrometheusWriter {
 public:
  explicit PrometheusWriter(std::string_view model_name)
      : model_label_("model_name=\"" + escape_label_value(model_name) + "\"") {}

  // The "# HELP" and "# TYPE" lines that open a family (help: plain text without newlines).
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }

  // One sample; `label` / `value` name one further label (empty label: none).
  template <class T>
  void sample(std::string_view name, T v, std::string_view label = {},
              std::string_view label_value = {}) {
    out_ += name;
    out_ += '{';
    out_ += model_label_;
    if (!label.empty()) {
      out_ += ',';
      out_ += label;
      out_ += "=\"";
      out_ += escape_label_value(label_value);
      out_ += '"';
    }
    out_ += "} ";
    out_ += format_number(v);
    out_ += '\n';
  }

  template <class T>
  void gauge(std::string_view name, std::string_view help, T v) {
    family(name, "gauge", help);
    sample(name, v);
  }

  void counter(std::string_view name, std::string_view help, int64_t v) {
    family(name, "counter", help);
    sample(name, v);
  }

  void histogram(std::string const& name, std::string_view help, engine::Histogram const& h) {
    family(name, "histogram", help);
    std::string const bucket = name + "_bucket";
    int64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      if (i < h.counts.size()) cumulative += h.counts[i];
      sample(bucket, cumulative, "le", format_number(h.bounds[i]));
    }
    sample(bucket, h.count, "le", "+Inf");
    sample(name + "_sum", h.sum);
    sample(name + "_count", h.count);
  }

  std::string take() { return std::move(out_); }

 private:
  std::string model_label_;
  std::string out_;
};

}  // namespace detail

inline std::string prometheus_text(engine::ServingStats const& s, engine::ServingInfo const& info) {
  using engine::FinishReason;
  detail::PrometheusWriter w(info.model_name);

  w.gauge("specdec_num_running_reqs", "Requests in the running batch (prefilling or decoding).",
          s.running);
  w.gauge("specdec_num_queue_reqs", "Requests waiting for admission.", s.queued);
  w.gauge("specdec_kv_pages_used", "KV cache pages in use.", s.kv_pages_used);
  w.gauge("specdec_kv_pages_total", "KV cache pages in all.", s.kv_pages_total);
  w.gauge("specdec_kv_tokens", "Committed tokens held in the KV cache by running requests.",
          s.kv_tokens);
  w.gauge("specdec_token_usage", "KV cache pages used / total (0 when there are none).",
          detail::ratio(s.kv_pages_used, s.kv_pages_total));
  w.gauge("specdec_cuda_graph", "1 when the last decode step replayed a CUDA graph, else 0.",
          int64_t{s.cuda_graph ? 1 : 0});
  w.gauge("specdec_cuda_graph_batch_size",
          "The batch size (CUDA graph ladder) the last decode step's graphs were captured for; "
          "0 when it launched eagerly.",
          int64_t{s.cuda_graph_batch});

  w.counter("specdec_requests_submitted_total", "Requests submitted.", s.requests_submitted);
  w.counter("specdec_requests_rejected_total", "Requests refused at submit.", s.requests_rejected);
  w.family("specdec_requests_finished_total", "counter", "Requests finished, by finish reason.");
  for (int r = 0; r <= static_cast<int>(FinishReason::kError); ++r) {
    auto const i = static_cast<size_t>(r);
    int64_t const n = i < s.requests_finished.size() ? s.requests_finished[i] : 0;
    w.sample("specdec_requests_finished_total", n, "reason",
             engine::finish_reason_name(static_cast<FinishReason>(r)));
  }
  w.counter("specdec_prompt_tokens_total", "Prompt tokens of admitted requests.", s.prompt_tokens);
  w.counter("specdec_generation_tokens_total", "Output tokens generated.", s.generation_tokens);
  w.counter("specdec_engine_steps_total", "Scheduler iterations that ran the engine.", s.steps);
  w.counter("specdec_spec_verify_total", "Target verify forwards, one per request per step.",
            s.spec.verify_ct);
  w.counter("specdec_spec_committed_tokens_total",
            "Output tokens from verifies (accepted drafts plus the bonus token each).",
            s.spec.committed);

  w.family("specdec_spec_proposed_drafts_total", "counter",
           "Draft tokens proposed at each tree depth (position 1 = first draft).");
  for (size_t d = 1; d < s.spec.proposed_at_depth.size(); ++d) {
    w.sample("specdec_spec_proposed_drafts_total", s.spec.proposed_at_depth[d], "position",
             std::to_string(d));
  }
  w.family("specdec_spec_accepted_drafts_total", "counter",
           "Verifies whose accepted path reached each tree depth.");
  for (size_t d = 1; d < s.spec.accepted_at_depth.size(); ++d) {
    w.sample("specdec_spec_accepted_drafts_total", s.spec.accepted_at_depth[d], "position",
             std::to_string(d));
  }

  w.family("specdec_phase_seconds_total", "counter",
           "Wall-clock seconds of the batch phases, summed over requests.");
  std::pair<char const*, double> const phases[] = {
      {"prefill", s.spec.prefill_s}, {"draft", s.spec.draft_s},   {"build", s.spec.build_s},
      {"verify", s.spec.verify_s},   {"commit", s.spec.commit_s}, {"extend", s.spec.extend_s}};
  for (auto const& [phase, seconds] : phases) {
    w.sample("specdec_phase_seconds_total", seconds, "phase", phase);
  }

  w.gauge("specdec_spec_accept_length",
          "Tokens committed per verify since start, bonus included (0 before any verify).",
          s.spec.accept_length());
  w.gauge("specdec_spec_accept_rate",
          "Accepted drafts / proposed drafts since start (0 before any proposal).",
          s.spec.accept_rate());

  w.histogram("specdec_spec_accept_length_per_verify", "Tokens committed per verify.",
              s.accept_length);
  w.histogram("specdec_step_draft_seconds", "Draft phase time per engine step.", s.step_draft_s);
  w.histogram("specdec_step_verify_seconds", "Verify phase time per engine step.", s.step_verify_s);
  w.histogram("specdec_step_commit_seconds", "Commit phase time per engine step.", s.step_commit_s);
  w.histogram("specdec_time_to_first_token_seconds", "Submit to first token delivered.",
              s.time_to_first_token_s);
  w.histogram("specdec_time_per_output_token_seconds", "Decode time per output token.",
              s.time_per_output_token_s);
  w.histogram("specdec_e2e_request_latency_seconds", "Submit to finished.", s.e2e_request_s);
  return w.take();
}

// The figures of one decode log line (see decode_log_window).
struct DecodeLogWindow {
  int64_t running = 0, queued = 0, kv_tokens = 0, kv_pages_used = 0, kv_pages_total = 0;
  double accept_length = 0.0, accept_rate = 0.0;
  bool cuda_graph = false;
  double gen_tokens_per_s = 0.0;
};

inline DecodeLogWindow decode_log_window(engine::ServingStats const& now,
                                         engine::ServingStats const& at_last_log,
                                         double seconds_between) {
  DecodeLogWindow w;
  w.running = now.running;
  w.queued = now.queued;
  w.kv_tokens = now.kv_tokens;
  w.kv_pages_used = now.kv_pages_used;
  w.kv_pages_total = now.kv_pages_total;
  w.cuda_graph = now.cuda_graph;
  w.accept_length = detail::ratio(now.spec.committed - at_last_log.spec.committed,
                                  now.spec.verify_ct - at_last_log.spec.verify_ct);
  w.accept_rate = detail::ratio(now.spec.accepted() - at_last_log.spec.accepted(),
                                now.spec.proposed() - at_last_log.spec.proposed());
  if (seconds_between > 0.0) {
    w.gen_tokens_per_s =
        static_cast<double>(now.generation_tokens - at_last_log.generation_tokens) /
        seconds_between;
  }
  return w;
}

inline std::string decode_log_line(DecodeLogWindow const& w) {
  auto const print = [&w](char* buf, size_t size) {
    return std::snprintf(
        buf, size,
        "Decode batch, #running-req: %lld, #token: %lld, token usage: %.2f, accept len: %.2f, "
        "accept rate: %.2f, cuda graph: %s, gen throughput (token/s): %.2f, #queue-req: %lld",
        static_cast<long long>(w.running), static_cast<long long>(w.kv_tokens),
        detail::ratio(w.kv_pages_used, w.kv_pages_total), w.accept_length, w.accept_rate,
        w.cuda_graph ? "True" : "False", w.gen_tokens_per_s, static_cast<long long>(w.queued));
  };
  std::string line(static_cast<size_t>(print(nullptr, 0)), '\0');
  print(line.data(), line.size() + 1);  // a huge float takes as many digits as it needs
  return line;
}

}  // namespace specdec::serve
