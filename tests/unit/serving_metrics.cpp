// serve/metrics_text.hpp: the Prometheus exposition read back by an independent parser written
// here (line grammar, HELP and TYPE before samples, label escaping, histogram invariants) and
// compared with values worked out by hand from the inputs; the SGLang decode log line written
// out by hand, its window differences, the no-verify window and its field order.
#include <doctest/doctest.h>

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "specdec/serve/metrics_text.hpp"

namespace {

using specdec::engine::Histogram;
using specdec::engine::ServingInfo;
using specdec::engine::ServingStats;
using specdec::serve::decode_log_line;
using specdec::serve::decode_log_window;
using specdec::serve::DecodeLogWindow;
using specdec::serve::prometheus_text;

// ---- A small reader of the Prometheus text format 0.0.4 (the subset a server writes: HELP,
// TYPE, samples without timestamps). It records every deviation as an error.

using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  std::string family;
  Labels labels;  // unescaped
  std::string raw_value;
  double value = 0.0;
};

struct Family {
  std::string help, type;
  bool has_help = false, has_type = false;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, Family> families;
  std::vector<std::string> family_order;
  std::vector<std::string> errors;
};

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) {
  return is_name_start(c) || std::isdigit(static_cast<unsigned char>(c));
}
bool is_metric_name(std::string const& s) {
  if (s.empty() || !(is_name_start(s[0]) || s[0] == ':')) return false;
  for (char c : s) {
    if (!(is_name_char(c) || c == ':')) return false;
  }
  return true;
}

// "3", "-1.5e-07", "+Inf", "-Inf", "NaN".
bool parse_value(std::string const& s, double* v) {
  if (s == "+Inf") return *v = std::numeric_limits<double>::infinity(), true;
  if (s == "-Inf") return *v = -std::numeric_limits<double>::infinity(), true;
  if (s == "NaN") return *v = std::numeric_limits<double>::quiet_NaN(), true;
  static std::regex const number(R"([-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?)");
  if (!std::regex_match(s, number)) return false;
  *v = std::strtod(s.c_str(), nullptr);
  return true;
}

// `name{a="x",b="y"} value` -> sample; false with *why on a malformed line.
bool parse_sample(std::string const& line, Sample* out, std::string* why) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  out->name = line.substr(0, i);
  if (!is_metric_name(out->name)) return *why = "bad metric name", false;
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      if (i >= line.size()) return *why = "unterminated labels", false;
      if (line[i] == '}') {
        ++i;
        break;
      }
      size_t const start = i;
      while (i < line.size() && is_name_char(line[i])) ++i;
      std::string const key = line.substr(start, i - start);
      if (key.empty() || !is_name_start(key[0])) return *why = "bad label name", false;
      if (i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
        return *why = "label without =\"", false;
      }
      i += 2;
      std::string value;
      while (true) {
        if (i >= line.size()) return *why = "unterminated label value", false;
        char const c = line[i++];
        if (c == '"') break;
        if (c != '\\') {
          value += c;
          continue;
        }
        if (i >= line.size()) return *why = "dangling backslash", false;
        char const e = line[i++];
        if (e == '\\') {
          value += '\\';
        } else if (e == '"') {
          value += '"';
        } else if (e == 'n') {
          value += '\n';
        } else {
          return *why = "unknown escape", false;
        }
      }
      if (!out->labels.emplace(key, value).second) return *why = "duplicate label", false;
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  if (i >= line.size() || line[i] != ' ') return *why = "no space before the value", false;
  out->raw_value = line.substr(i + 1);
  if (!parse_value(out->raw_value, &out->value)) return *why = "bad value (or a timestamp)", false;
  return true;
}

Exposition parse_exposition(std::string const& text) {
  Exposition x;
  auto error = [&x](size_t line_no, std::string const& why) {
    x.errors.push_back("line " + std::to_string(line_no) + ": " + why);
  };
  if (text.empty() || text.back() != '\n') error(0, "text does not end in a newline");
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  std::string current;           // the family whose samples are being read
  std::set<std::string> closed;  // families whose samples have ended
  std::map<std::string, size_t> sample_count;
  for (size_t n = 0; n < lines.size(); ++n) {
    std::string const& line = lines[n];
    size_t const line_no = n + 1;
    if (line.empty()) {
      error(line_no, "empty line");
    } else if (line.rfind("# HELP ", 0) == 0) {
      std::string const rest = line.substr(7);
      size_t const sp = rest.find(' ');
      std::string const name = rest.substr(0, sp);
      if (!is_metric_name(name)) error(line_no, "HELP of a bad name");
      if (x.families.count(name)) error(line_no, "second HELP for " + name);
      Family& f = x.families[name];
      f.has_help = true;
      f.help = sp == std::string::npos ? "" : rest.substr(sp + 1);
      x.family_order.push_back(name);
    } else if (line.rfind("# TYPE ", 0) == 0) {
      std::string const rest = line.substr(7);
      size_t const sp = rest.find(' ');
      std::string const name = rest.substr(0, sp);
      std::string const type = sp == std::string::npos ? "" : rest.substr(sp + 1);
      auto it = x.families.find(name);
      if (it == x.families.end() || !it->second.has_help) {
        error(line_no, "TYPE before HELP for " + name);
        continue;
      }
      if (it->second.has_type) error(line_no, "second TYPE for " + name);
      if (sample_count[name]) error(line_no, "TYPE after samples of " + name);
      if (type != "counter" && type != "gauge" && type != "histogram") {
        error(line_no, "unknown type " + type);
      }
      it->second.has_type = true;
      it->second.type = type;
    } else if (line[0] == '#') {
      error(line_no, "unexpected comment");
    } else {
      Sample s;
      std::string why;
      if (!parse_sample(line, &s, &why)) {
        error(line_no, why + ": " + line);
        continue;
      }
      // The family: the name itself (counter, gauge) or a histogram's base.
      auto declared = [&x](std::string const& name) {
        auto it = x.families.find(name);
        return it != x.families.end() && it->second.has_type ? &it->second : nullptr;
      };
      Family const* f = declared(s.name);
      if (f && f->type != "histogram") {
        s.family = s.name;
      } else {
        for (std::string suffix : {"_bucket", "_sum", "_count"}) {
          if (s.name.size() > suffix.size() &&
              s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            std::string const base = s.name.substr(0, s.name.size() - suffix.size());
            Family const* h = declared(base);
            if (h && h->type == "histogram") s.family = base;
          }
        }
      }
      if (s.family.empty()) {
        error(line_no, "sample without HELP and TYPE before it: " + s.name);
        continue;
      }
      if (s.family != current) {
        if (closed.count(s.family)) error(line_no, "samples of " + s.family + " interleaved");
        if (!current.empty()) closed.insert(current);
        current = s.family;
      }
      ++sample_count[s.family];
      x.samples.push_back(std::move(s));
    }
  }
  return x;
}

// The one sample `name` whose labels other than model_name are `labels`.
Sample const* find_sample(Exposition const& x, std::string const& name, Labels const& labels = {}) {
  Sample const* found = nullptr;
  int matches = 0;
  for (Sample const& s : x.samples) {
    Labels rest = s.labels;
    rest.erase("model_name");
    if (s.name == name && rest == labels) {
      found = &s;
      ++matches;
    }
  }
  CHECK_MESSAGE(matches == 1, name << ": " << matches << " samples");
  return matches == 1 ? found : nullptr;
}

double value_of(Exposition const& x, std::string const& name, Labels const& labels = {}) {
  Sample const* s = find_sample(x, name, labels);
  return s ? s->value : std::numeric_limits<double>::quiet_NaN();
}

std::vector<Sample const*> samples_of(Exposition const& x, std::string const& name) {
  std::vector<Sample const*> out;
  for (Sample const& s : x.samples) {
    if (s.name == name) out.push_back(&s);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> const kFamilies = {
    {"specdec_num_running_reqs", "gauge"},
    {"specdec_num_queue_reqs", "gauge"},
    {"specdec_kv_pages_used", "gauge"},
    {"specdec_kv_pages_total", "gauge"},
    {"specdec_kv_tokens", "gauge"},
    {"specdec_token_usage", "gauge"},
    {"specdec_cuda_graph", "gauge"},
    {"specdec_cuda_graph_batch_size", "gauge"},
    {"specdec_requests_submitted_total", "counter"},
    {"specdec_requests_rejected_total", "counter"},
    {"specdec_requests_finished_total", "counter"},
    {"specdec_prompt_tokens_total", "counter"},
    {"specdec_generation_tokens_total", "counter"},
    {"specdec_engine_steps_total", "counter"},
    {"specdec_spec_verify_total", "counter"},
    {"specdec_spec_committed_tokens_total", "counter"},
    {"specdec_spec_proposed_drafts_total", "counter"},
    {"specdec_spec_accepted_drafts_total", "counter"},
    {"specdec_phase_seconds_total", "counter"},
    {"specdec_spec_accept_length", "gauge"},
    {"specdec_spec_accept_rate", "gauge"},
    {"specdec_spec_accept_length_per_verify", "histogram"},
    {"specdec_step_draft_seconds", "histogram"},
    {"specdec_step_verify_seconds", "histogram"},
    {"specdec_step_commit_seconds", "histogram"},
    {"specdec_time_to_first_token_seconds", "histogram"},
    {"specdec_time_per_output_token_seconds", "histogram"},
    {"specdec_e2e_request_latency_seconds", "histogram"},
};

// What every exposition must satisfy, whatever the stats: it parses, exactly the families above
// with their types, every sample labelled with the model, counters named *_total, histograms
// with increasing le ending at +Inf, cumulative non-decreasing buckets, +Inf == _count, and
// buckets, _sum, _count in that order.
void check_valid(Exposition const& x, std::string const& model_name) {
  for (std::string const& e : x.errors) FAIL_CHECK(e);
  CHECK(x.errors.empty());
  REQUIRE(x.family_order.size() == kFamilies.size());
  for (size_t i = 0; i < kFamilies.size(); ++i) {
    auto const& [name, type] = kFamilies[i];
    CAPTURE(name);
    CHECK(x.family_order[i] == name);
    auto it = x.families.find(name);
    REQUIRE(it != x.families.end());
    CHECK(it->second.has_help);
    CHECK(!it->second.help.empty());
    CHECK(it->second.has_type);
    CHECK(it->second.type == type);
    if (type == "counter") CHECK(name.size() > 6);
    if (type == "counter") CHECK(name.substr(name.size() - 6) == "_total");
  }
  for (Sample const& s : x.samples) {
    CAPTURE(s.name);
    auto it = s.labels.find("model_name");
    REQUIRE(it != s.labels.end());
    CHECK(it->second == model_name);
    std::string const& type = x.families.at(s.family).type;
    if (type != "histogram") CHECK(s.name == s.family);
    if (s.name.size() > 7 && s.name.substr(s.name.size() - 7) == "_bucket") {
      CHECK(s.labels.count("le") == 1);
    } else {
      CHECK(s.labels.count("le") == 0);
    }
  }
  for (auto const& [name, type] : kFamilies) {
    if (type != "histogram") continue;
    CAPTURE(name);
    std::vector<std::string> order;
    for (Sample const& s : x.samples) {
      if (s.family == name) order.push_back(s.name.substr(name.size()));
    }
    REQUIRE(order.size() >= 3);
    for (size_t i = 0; i + 2 < order.size(); ++i) CHECK(order[i] == "_bucket");
    CHECK(order[order.size() - 2] == "_sum");
    CHECK(order.back() == "_count");
    auto const buckets = samples_of(x, name + "_bucket");
    REQUIRE(!buckets.empty());
    CHECK(buckets.back()->labels.at("le") == "+Inf");
    double last_le = -std::numeric_limits<double>::infinity();
    double last_count = 0.0;
    for (Sample const* b : buckets) {
      double le = 0.0;
      REQUIRE(parse_value(b->labels.at("le"), &le));
      CHECK(le > last_le);
      CHECK(b->value >= last_count);
      last_le = le;
      last_count = b->value;
    }
    CHECK(buckets.back()->value == value_of(x, name + "_count"));
  }
}

struct HistogramExpectation {
  std::vector<std::string> le;      // as written, "+Inf" last
  std::vector<int64_t> cumulative;  // one per le
  double sum;
  int64_t count;
};

void check_histogram(Exposition const& x, std::string const& name, HistogramExpectation const& e) {
  CAPTURE(name);
  auto const buckets = samples_of(x, name + "_bucket");
  REQUIRE(buckets.size() == e.le.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    CHECK(buckets[i]->labels.at("le") == e.le[i]);
    CHECK(buckets[i]->raw_value == std::to_string(e.cumulative[i]));
  }
  CHECK(value_of(x, name + "_sum") == e.sum);
  CHECK(find_sample(x, name + "_count")->raw_value == std::to_string(e.count));
}

// A model name that needs every escape.
std::string const kModelName = "kimi \"k2.5\" C:\\models\nline two";

// Stats with every field set; the expected figures are worked out beside each.
ServingStats populated_stats() {
  ServingStats s;
  s.running = 3;
  s.queued = 2;
  s.queue_capacity = 64;
  s.kv_pages_used = 10;
  s.kv_pages_total = 40;  // token usage 0.25
  s.page_size = 64;
  s.kv_tokens = 600;
  s.requests_submitted = 20;
  s.requests_rejected = 1;
  s.requests_finished = {5, 2, 4};  // eos, stop_id, length; stop_string, cancelled, error absent
  s.prompt_tokens = 1234;
  s.generation_tokens = 5678;
  s.steps = 300;
  // Three verifies: proposed depths 1,2,3,1,2 / 1,2,3 / 1,2,3 -> proposed per depth 4 4 3;
  // accepted 2, 0, 3 -> verifies reaching depth 1: 2, depth 2: 2, depth 3: 1; committed
  // 3 + 1 + 4 = 8. reserve_depth(4) adds depth 4 with zeros.
  s.spec.record_verify({1, 2, 3, 1, 2}, 2, 3);
  s.spec.record_verify({1, 2, 3}, 0, 1);
  s.spec.record_verify({1, 2, 3}, 3, 4);
  s.spec.reserve_depth(4);
  s.spec.prefill_s = 0.5;
  s.spec.draft_s = 0.25;
  s.spec.build_s = 0.125;
  s.spec.verify_s = 1.75;
  s.spec.commit_s = 0.0625;
  s.spec.extend_s = 0.3;
  s.accept_length = Histogram({1, 2, 3, 4, 5});
  for (double v : {3.0, 1.0, 4.0}) s.accept_length.observe(v);
  s.step_draft_s = Histogram({0.005, 0.01, 0.1});
  for (double v : {0.004, 0.02, 0.5}) s.step_draft_s.observe(v);
  s.step_verify_s = Histogram(std::vector<double>{});  // no bounds: only the +Inf bucket
  for (double v : {0.7, 0.7}) s.step_verify_s.observe(v);
  // step_commit_s stays default-constructed: no bounds, no counts.
  s.time_to_first_token_s = Histogram({0.1, 1, 10});
  for (double v : {0.05, 1.0, 2.0, 20.0}) s.time_to_first_token_s.observe(v);  // 1.0 is in le=1
  s.time_per_output_token_s = Histogram({0.01, 0.1});
  s.time_per_output_token_s.observe(0.1);
  s.e2e_request_s = Histogram({1e-7, 2.5, 1e9});
  s.e2e_request_s.observe(3.0);
  s.cuda_graph = true;
  s.cuda_graph_batch = 8;
  return s;
}

}  // namespace

TEST_CASE("prometheus_text: every line parses and every family is declared before its samples") {
  ServingInfo info;
  info.model_name = kModelName;
  std::string const text = prometheus_text(populated_stats(), info);
  Exposition const x = parse_exposition(text);
  check_valid(x, kModelName);
  CHECK(x.samples.size() > 50);
}

TEST_CASE("prometheus_text: gauges and counters equal the stats") {
  ServingInfo info;
  info.model_name = "kimi-k2.5";
  Exposition const x = parse_exposition(prometheus_text(populated_stats(), info));
  check_valid(x, "kimi-k2.5");

  std::vector<std::pair<std::string, std::string>> const integers = {
      {"specdec_num_running_reqs", "3"},
      {"specdec_num_queue_reqs", "2"},
      {"specdec_kv_pages_used", "10"},
      {"specdec_kv_pages_total", "40"},
      {"specdec_kv_tokens", "600"},
      {"specdec_cuda_graph", "1"},
      {"specdec_cuda_graph_batch_size", "8"},
      {"specdec_requests_submitted_total", "20"},
      {"specdec_requests_rejected_total", "1"},
      {"specdec_prompt_tokens_total", "1234"},
      {"specdec_generation_tokens_total", "5678"},
      {"specdec_engine_steps_total", "300"},
      {"specdec_spec_verify_total", "3"},
      {"specdec_spec_committed_tokens_total", "8"},
  };
  for (auto const& [name, raw] : integers) {
    CAPTURE(name);
    Sample const* s = find_sample(x, name);
    REQUIRE(s);
    CHECK(s->raw_value == raw);  // integers written as integers
  }
  CHECK(value_of(x, "specdec_token_usage") == 0.25);
  CHECK(value_of(x, "specdec_spec_accept_length") == 8.0 / 3.0);
  CHECK(value_of(x, "specdec_spec_accept_rate") == 5.0 / 11.0);  // (2+2+1) / (4+4+3)

  std::vector<std::pair<std::string, std::string>> const finished = {
      {"eos", "5"},         {"stop_id", "2"},   {"length", "4"},
      {"stop_string", "0"}, {"cancelled", "0"}, {"error", "0"}};
  CHECK(samples_of(x, "specdec_requests_finished_total").size() == finished.size());
  for (auto const& [reason, raw] : finished) {
    CAPTURE(reason);
    Sample const* s = find_sample(x, "specdec_requests_finished_total", {{"reason", reason}});
    REQUIRE(s);
    CHECK(s->raw_value == raw);
  }

  std::vector<std::pair<std::string, double>> const phases = {{"prefill", 0.5},   {"draft", 0.25},
                                                              {"build", 0.125},   {"verify", 1.75},
                                                              {"commit", 0.0625}, {"extend", 0.3}};
  CHECK(samples_of(x, "specdec_phase_seconds_total").size() == phases.size());
  for (auto const& [phase, seconds] : phases) {
    CAPTURE(phase);
    CHECK(value_of(x, "specdec_phase_seconds_total", {{"phase", phase}}) == seconds);
  }
  CHECK(find_sample(x, "specdec_phase_seconds_total", {{"phase", "extend"}})->raw_value == "0.3");
}

TEST_CASE("prometheus_text: one proposed and one accepted sample per draft position") {
  ServingInfo info;
  info.model_name = "m";
  Exposition const x = parse_exposition(prometheus_text(populated_stats(), info));
  check_valid(x, "m");
  std::vector<std::string> const proposed = {"4", "4", "3", "0"};  // positions 1..4
  std::vector<std::string> const accepted = {"2", "2", "1", "0"};
  CHECK(samples_of(x, "specdec_spec_proposed_drafts_total").size() == 4);
  CHECK(samples_of(x, "specdec_spec_accepted_drafts_total").size() == 4);
  for (size_t d = 1; d <= 4; ++d) {
    CAPTURE(d);
    Labels const position = {{"position", std::to_string(d)}};
    Sample const* p = find_sample(x, "specdec_spec_proposed_drafts_total", position);
    Sample const* a = find_sample(x, "specdec_spec_accepted_drafts_total", position);
    REQUIRE(p);
    REQUIRE(a);
    CHECK(p->raw_value == proposed[d - 1]);
    CHECK(a->raw_value == accepted[d - 1]);
  }
}

TEST_CASE("prometheus_text: histograms are cumulative with +Inf == _count and the right _sum") {
  ServingInfo info;
  info.model_name = "m";
  Exposition const x = parse_exposition(prometheus_text(populated_stats(), info));
  check_valid(x, "m");
  // 3, 1, 4 over bounds 1..5: per bucket 1 0 1 1 0 (+ 0 over) -> cumulative 1 1 2 3 3, +Inf 3.
  check_histogram(x, "specdec_spec_accept_length_per_verify",
                  {{"1", "2", "3", "4", "5", "+Inf"}, {1, 1, 2, 3, 3, 3}, 3.0 + 1.0 + 4.0, 3});
  // 0.004 <= 0.005; 0.02 in (0.01, 0.1]; 0.5 over.
  check_histogram(x, "specdec_step_draft_seconds",
                  {{"0.005", "0.01", "0.1", "+Inf"}, {1, 1, 2, 3}, 0.004 + 0.02 + 0.5, 3});
  check_histogram(x, "specdec_step_verify_seconds", {{"+Inf"}, {2}, 0.7 + 0.7, 2});
  check_histogram(x, "specdec_step_commit_seconds", {{"+Inf"}, {0}, 0.0, 0});
  // 0.05 <= 0.1; 1.0 <= 1 (le is inclusive); 2.0 <= 10; 20 over.
  check_histogram(x, "specdec_time_to_first_token_seconds",
                  {{"0.1", "1", "10", "+Inf"}, {1, 2, 3, 4}, 0.05 + 1.0 + 2.0 + 20.0, 4});
  check_histogram(x, "specdec_time_per_output_token_seconds",
                  {{"0.01", "0.1", "+Inf"}, {0, 1, 1}, 0.1, 1});
  check_histogram(x, "specdec_e2e_request_latency_seconds",
                  {{"1e-07", "2.5", "1e+09", "+Inf"}, {0, 0, 1, 1}, 3.0, 1});
}

TEST_CASE("prometheus_text: a model name with a quote, a backslash and a newline is escaped") {
  ServingInfo info;
  info.model_name = kModelName;
  std::string const text = prometheus_text(populated_stats(), info);
  CHECK(text.find("model_name=\"kimi \\\"k2.5\\\" C:\\\\models\\nline two\"") != std::string::npos);
  // No raw newline inside a label: every line is a comment or starts with a metric name.
  for (size_t start = 0; start < text.size();) {
    size_t const end = text.find('\n', start);
    REQUIRE(end != std::string::npos);
    std::string const line = text.substr(start, end - start);
    CAPTURE(line);
    CHECK((line.rfind("# ", 0) == 0 || line.rfind("specdec_", 0) == 0));
    start = end + 1;
  }
  Exposition const x = parse_exposition(text);
  check_valid(x, kModelName);  // the parser unescapes back to the original name
}

TEST_CASE("prometheus_text: a default-constructed ServingStats renders validly") {
  ServingInfo info;  // empty model name
  Exposition const x = parse_exposition(prometheus_text(ServingStats{}, info));
  check_valid(x, "");
  CHECK(value_of(x, "specdec_token_usage") == 0.0);  // no pages: 0, not NaN
  CHECK(value_of(x, "specdec_spec_accept_length") == 0.0);
  CHECK(value_of(x, "specdec_spec_accept_rate") == 0.0);
  CHECK(value_of(x, "specdec_cuda_graph") == 0.0);
  CHECK(samples_of(x, "specdec_requests_finished_total").size() == 6);
  for (Sample const* s : samples_of(x, "specdec_requests_finished_total")) CHECK(s->value == 0.0);
  CHECK(samples_of(x, "specdec_spec_proposed_drafts_total").empty());
  CHECK(samples_of(x, "specdec_spec_accepted_drafts_total").empty());
  for (auto const& [name, type] : kFamilies) {
    if (type == "histogram") check_histogram(x, name, {{"+Inf"}, {0}, 0.0, 0});
  }
}

TEST_CASE("prometheus_text: non-finite and tiny doubles are written so Prometheus reads them") {
  ServingStats s;
  s.spec.draft_s = std::numeric_limits<double>::infinity();
  s.spec.build_s = std::numeric_limits<double>::quiet_NaN();
  s.spec.verify_s = 1e-300;
  s.spec.commit_s = 123456789.125;
  ServingInfo info;
  info.model_name = "m";
  Exposition const x = parse_exposition(prometheus_text(s, info));
  check_valid(x, "m");
  CHECK(find_sample(x, "specdec_phase_seconds_total", {{"phase", "draft"}})->raw_value == "+Inf");
  CHECK(find_sample(x, "specdec_phase_seconds_total", {{"phase", "build"}})->raw_value == "NaN");
  CHECK(value_of(x, "specdec_phase_seconds_total", {{"phase", "verify"}}) == 1e-300);
  CHECK(value_of(x, "specdec_phase_seconds_total", {{"phase", "commit"}}) == 123456789.125);
}

TEST_CASE("decode_log_line: SGLang's line for hand-worked figures") {
  DecodeLogWindow w;
  w.running = 3;
  w.queued = 0;
  w.kv_tokens = 812;
  w.kv_pages_used = 3;
  w.kv_pages_total = 64;     // 0.046875 -> 0.05
  w.accept_length = 2.3125;  // -> 2.31
  w.accept_rate = 0.4375;    // -> 0.44
  w.cuda_graph = false;
  w.gen_tokens_per_s = 123.456;  // -> 123.46
  CHECK(decode_log_line(w) ==
        "Decode batch, #running-req: 3, #token: 812, token usage: 0.05, accept len: 2.31, "
        "accept rate: 0.44, cuda graph: False, gen throughput (token/s): 123.46, #queue-req: 0");
  w.cuda_graph = true;
  w.queued = 17;
  w.kv_pages_total = 0;  // no pages: usage 0.00
  CHECK(decode_log_line(w) ==
        "Decode batch, #running-req: 3, #token: 812, token usage: 0.00, accept len: 2.31, "
        "accept rate: 0.44, cuda graph: True, gen throughput (token/s): 123.46, #queue-req: 17");
  w.gen_tokens_per_s = 1e20;  // long numbers are written in full, not cut
  CHECK(decode_log_line(w) ==
        "Decode batch, #running-req: 3, #token: 812, token usage: 0.00, accept len: 2.31, "
        "accept rate: 0.44, cuda graph: True, gen throughput (token/s): "
        "100000000000000000000.00, #queue-req: 17");
}

TEST_CASE("decode_log_window: figures over the window between two snapshots") {
  ServingStats last;
  last.running = 9;
  last.queued = 4;
  last.kv_tokens = 100;
  last.generation_tokens = 100;
  last.spec.record_verify({1, 2, 3}, 2, 3);
  last.spec.record_verify({1, 2, 3}, 2, 3);
  ServingStats now = last;
  now.running = 5;
  now.queued = 1;
  now.kv_tokens = 900;
  now.kv_pages_used = 15;
  now.kv_pages_total = 100;
  now.cuda_graph = true;
  now.generation_tokens = 150;
  // The window: 3 verifies committing 4 + 1 + 2 = 7; drafts proposed 3 + 3 + 2 = 8, accepted
  // 3 + 0 + 1 = 4. Since start (not the window) it would be 13 / 5 and 8 / 14.
  now.spec.record_verify({1, 2, 3}, 3, 4);
  now.spec.record_verify({1, 2, 3}, 0, 1);
  now.spec.record_verify({1, 2}, 1, 2);
  DecodeLogWindow const w = decode_log_window(now, last, 2.0);
  CHECK(w.running == 5);
  CHECK(w.queued == 1);
  CHECK(w.kv_tokens == 900);
  CHECK(w.kv_pages_used == 15);
  CHECK(w.kv_pages_total == 100);
  CHECK(w.cuda_graph);
  CHECK(w.accept_length == 7.0 / 3.0);
  CHECK(w.accept_rate == 0.5);
  CHECK(w.gen_tokens_per_s == 25.0);  // 50 tokens in 2 s
  CHECK(decode_log_line(w) ==
        "Decode batch, #running-req: 5, #token: 900, token usage: 0.15, accept len: 2.33, "
        "accept rate: 0.50, cuda graph: True, gen throughput (token/s): 25.00, #queue-req: 1");
}

TEST_CASE("decode_log_window: a window without a verify prints accept len 0.00") {
  // Decided: with no verify in the window (idle, or only prefills ran) the accept figures are 0,
  // as SGLang prints 0 without speculation, rather than NaN or the figure since start.
  ServingStats last;
  last.spec.record_verify({1, 2}, 2, 3);
  last.generation_tokens = 40;
  ServingStats now = last;
  now.generation_tokens = 52;  // prefills gave first tokens, no verify ran
  now.running = 2;
  DecodeLogWindow w = decode_log_window(now, last, 4.0);
  CHECK(w.accept_length == 0.0);
  CHECK(w.accept_rate == 0.0);
  CHECK(w.gen_tokens_per_s == 3.0);
  CHECK(decode_log_line(w) ==
        "Decode batch, #running-req: 2, #token: 0, token usage: 0.00, accept len: 0.00, "
        "accept rate: 0.00, cuda graph: False, gen throughput (token/s): 3.00, #queue-req: 0");
  // No time between the snapshots: throughput 0, not infinite.
  w = decode_log_window(now, last, 0.0);
  CHECK(w.gen_tokens_per_s == 0.0);
  w = decode_log_window(now, last, -1.0);
  CHECK(w.gen_tokens_per_s == 0.0);
}

TEST_CASE("decode_log_line: fields in SGLang's order, as its log parsers match them") {
  std::regex const sglang(
      R"(^Decode batch, #running-req: (\d+), #token: (\d+), token usage: (\d+\.\d\d), )"
      R"(accept len: (\d+\.\d\d), accept rate: (\d+\.\d\d), cuda graph: (True|False), )"
      R"(gen throughput \(token/s\): (\d+\.\d\d), #queue-req: (\d+)$)");
  ServingStats const now = populated_stats();
  ServingStats const last;
  for (double seconds : {0.0, 0.5, 10.0}) {
    std::string const line = decode_log_line(decode_log_window(now, last, seconds));
    CAPTURE(line);
    std::smatch m;
    REQUIRE(std::regex_match(line, m, sglang));
    CHECK(m[1] == "3");
    CHECK(m[2] == "600");
    CHECK(m[3] == "0.25");
    CHECK(m[4] == "2.67");  // 8 / 3
    CHECK(m[5] == "0.45");  // 5 / 11
    CHECK(m[6] == "True");
    CHECK(m[8] == "2");
  }
  CHECK(std::regex_match(decode_log_line(DecodeLogWindow{}), sglang));
}
