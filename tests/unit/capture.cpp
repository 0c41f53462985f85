// model/kimi/capture.hpp: the top-k log-softmax on hand-worked rows (ties -> lower id); the
// prompts file's checks (every bad line named by number) and shards (together: every line once);
// capture_batch's rows against a fresh kimi_prefill of each sequence alone (aux to bf16 rounding,
// top-k = the sorted log-softmax of its logits), over forwards that split and join sequences; the
// layer order kept (2,0 swaps the halves of 0,2 bit for bit); a greedy continuation's top-1 is its
// next token; write_capture's file read back exactly, an existing path refused.
#include "specdec/model/kimi/capture.hpp"
#include "specdec/model/kimi/generate.hpp"
#include "support/kimi_model.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace kimi = specdec::model::kimi;
using specdec::CpuExecutor;
using specdec::Status;
using specdec::StatusCode;
using specdec::testing::check_error;
using specdec::testing::TempDir;

using Loaded = specdec::testing::TinyKimiCpu;

void load(TempDir const& tmp, Loaded* m) {
  specdec::testing::load_tiny_kimi_cpu(tmp.path / "ckpt", 3, m);
}

kimi::CaptureRows start(Loaded const& m, std::vector<int> const& layers, int topk) {
  kimi::CaptureRows rows;
  Status const s = kimi::CaptureRows::start(m.tiny.config, layers, topk, &rows);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return rows;
}

void capture(Loaded const& m, std::vector<kimi::CaptureSequence> const& seqs,
             int64_t max_forward_tokens, kimi::CaptureRows* rows) {
  kimi::CaptureOptions o;
  o.max_forward_tokens = max_forward_tokens;
  Status const s = kimi::capture_batch(CpuExecutor{}, m.model, seqs, o, rows);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

// Logits [T, V] and aux [T, |layers| * H] of one sequence prefilled alone.
void fresh_prefill(Loaded const& m, std::vector<int32_t> const& tokens,
                   std::vector<int> const& layers, std::vector<float>* logits,
                   std::vector<float>* aux) {
  kimi::MlaCache cache;
  int const pages = static_cast<int>((tokens.size() + 15) / 16);
  REQUIRE(kimi::MlaCache::create_for(m.tiny.config, 16, pages, pages, &cache).ok());
  REQUIRE(cache.add_request(0).ok());
  kimi::RequestId const id = 0;
  int32_t const count = static_cast<int32_t>(tokens.size());
  Status const s = kimi::kimi_prefill(CpuExecutor{}, m.model, &cache, {&id, 1}, {&count, 1},
                                      tokens, layers, logits, aux);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

kimi::CaptureSequence sequence(int64_t line, std::vector<int32_t> tokens, int32_t prompt) {
  kimi::CaptureSequence q;
  q.line = line;
  q.tokens = std::move(tokens);
  q.prompt_length = prompt;
  return q;
}

std::vector<kimi::CapturePrompt> parse(std::string const& text,
                                       specdec::io::DeepseekV3Config const& c,
                                       kimi::CaptureShard shard = {}, Status* status = nullptr) {
  std::vector<kimi::CapturePrompt> out;
  Status const s = kimi::parse_capture_prompts(text, "p.jsonl", c, 8, shard, &out);
  if (status != nullptr) {
    *status = s;
  } else {
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  return out;
}

}  // namespace

TEST_CASE("capture: top-k of the log-softmax, hand-worked, ties to the lower id") {
  std::vector<float> const logits = {1.0f, 3.0f, 3.0f, 0.0f, 2.0f};
  double const lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + 1.0 + std::exp(2.0));
  int32_t ids[5];
  float lp[5];
  REQUIRE(kimi::topk_log_softmax(logits, 3, ids, lp).ok());
  CHECK(ids[0] == 1);
  CHECK(ids[1] == 2);
  CHECK(ids[2] == 4);
  CHECK(lp[0] == doctest::Approx(3.0 - lse).epsilon(1e-6));
  CHECK(lp[1] == doctest::Approx(3.0 - lse).epsilon(1e-6));
  CHECK(lp[2] == doctest::Approx(2.0 - lse).epsilon(1e-6));
  // K = V: the whole distribution, sorted; it sums to 1.
  REQUIRE(kimi::topk_log_softmax(logits, 5, ids, lp).ok());
  std::vector<int32_t> const want = {1, 2, 4, 0, 3};
  double sum = 0.0;
  for (int i = 0; i < 5; ++i) {
    CHECK(ids[i] == want[static_cast<size_t>(i)]);
    sum += std::exp(double(lp[i]));
  }
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
  // All equal: ids in order.
  std::vector<float> const flat(6, 0.5f);
  REQUIRE(kimi::topk_log_softmax(flat, 4, ids, lp).ok());
  for (int i = 0; i < 4; ++i) CHECK(ids[i] == i);
  CHECK(lp[3] == doctest::Approx(-std::log(6.0)).epsilon(1e-6));
  check_error(kimi::topk_log_softmax(logits, 0, ids, lp), StatusCode::kInvalidArgument,
              {"k 0 not in [1, 5]"});
  check_error(kimi::topk_log_softmax(logits, 6, ids, lp), StatusCode::kInvalidArgument,
              {"k 6 not in [1, 5]"});
  std::vector<float> bad = logits;
  bad[3] = std::nanf("");
  check_error(kimi::topk_log_softmax(bad, 2, ids, lp), StatusCode::kInvalidArgument,
              {"logit 3", "not finite"});
}

TEST_CASE("capture: the prompts file, its errors by line, and shards") {
  specdec::io::DeepseekV3Config c;
  c.vocab_size = 512;
  c.max_position_embeddings = 32;
  c.num_hidden_layers = 4;
  std::string const text =
      "{\"input_ids\": [1, 2, 3], \"text\": \"ignored\"}\n"
      "{\"id\": 7, \"input_ids\": [511]}\r\n"
      "{\"input_ids\": [0, 0, 5, 6]}\n"
      "{\"input_ids\": [9]}\n"
      "{\"input_ids\": [4, 4]}";  // no newline at the end
  std::vector<kimi::CapturePrompt> const all = parse(text, c);
  REQUIRE(all.size() == 5);
  CHECK(all[0].ids == std::vector<int32_t>{1, 2, 3});
  CHECK(all[1].ids == std::vector<int32_t>{511});
  CHECK(all[4].ids == std::vector<int32_t>{4, 4});
  for (size_t i = 0; i < all.size(); ++i) CHECK(all[i].line == static_cast<int64_t>(i));
  // Shards 0/2 and 1/2 (and 0..2 of 3): every line exactly once, in order within a shard.
  for (int count : {2, 3}) {
    std::vector<int64_t> seen;
    for (int index = 0; index < count; ++index) {
      std::vector<kimi::CapturePrompt> const part = parse(text, c, {index, count});
      for (size_t i = 0; i < part.size(); ++i) {
        CHECK(part[i].line % count == index);
        CHECK(part[i].ids == all[static_cast<size_t>(part[i].line)].ids);
        if (i > 0) CHECK(part[i].line > part[i - 1].line);
        seen.push_back(part[i].line);
      }
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4});
  }
  // A shard that gets no line is not an error (its file holds no sequence).
  CHECK(parse("{\"input_ids\": [1]}\n", c, {1, 2}).empty());

  struct Bad {
    std::string line2;
    std::vector<std::string> parts;
  };
  std::vector<Bad> const cases = {
      {"[1, 2]", {"p.jsonl line 2", "top level must be an object, got array"}},
      {"{\"input_ids\": [1, 2]", {"p.jsonl line 2", "not valid JSON"}},
      {"{\"text\": \"hi\"}", {"p.jsonl line 2", "no \"input_ids\""}},
      {"{\"input_ids\": \"1,2\"}", {"line 2", "\"input_ids\" is string, not an array"}},
      {"{\"input_ids\": []}", {"line 2", "\"input_ids\" is empty"}},
      {"{\"input_ids\": [1, 1.5]}", {"line 2", "\"input_ids\"[1] = 1.5 is not a token id"}},
      {"{\"input_ids\": [true]}", {"line 2", "\"input_ids\"[0] = true is not a token id"}},
      {"{\"input_ids\": [3, -1]}", {"line 2", "[1] = -1 is outside the vocabulary [0, 512)"}},
      {"{\"input_ids\": [512]}", {"line 2", "[0] = 512 is outside the vocabulary [0, 512)"}},
      {"{\"input_ids\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25]}",
       {"line 2", "25 prompt tokens + 8 new tokens exceed max_position_embeddings 32"}},
      {"  ", {"line 2", "empty"}},
  };
  for (Bad const& b : cases) {
    CAPTURE(b.line2);
    Status s;
    // Line 2 is checked whichever shard takes it.
    parse("{\"input_ids\": [1]}\n" + b.line2 + "\n{\"input_ids\": [2]}\n", c, {0, 2}, &s);
    check_error(s, StatusCode::kMalformedInput, b.parts);
  }
  Status s;
  parse("", c, {}, &s);
  check_error(s, StatusCode::kMalformedInput, {"p.jsonl: no lines"});
  parse(text, c, {2, 2}, &s);
  check_error(s, StatusCode::kInvalidArgument, {"shard 2/2", "0 <= index < count"});
  std::vector<kimi::CapturePrompt> out;
  check_error(kimi::read_capture_prompts("/nonexistent/p.jsonl", c, 8, {}, &out),
              StatusCode::kInvalidArgument, {"/nonexistent/p.jsonl: cannot open"});
}

TEST_CASE("capture: rows equal a fresh prefill of each sequence, however the forwards split") {
  TempDir tmp;
  Loaded m;
  load(tmp, &m);
  int64_t const H = m.tiny.config.hidden_size, V = m.tiny.config.vocab_size;
  std::mt19937 rng(11);
  std::vector<kimi::CaptureSequence> const seqs = {
      sequence(4, specdec::testing::random_tokens(rng, 5, 512), 2),
      sequence(9, specdec::testing::random_tokens(rng, 17, 512), 10),
      sequence(12, specdec::testing::random_tokens(rng, 9, 512), 9)};
  std::vector<int> const layers = {2, -1, 0};
  int const K = 6;
  int64_t const F = 3 * H;
  // 7 rows a forward (sequences split and joined), and one forward for everything.
  for (int64_t chunk : {int64_t{7}, int64_t{1024}}) {
    CAPTURE(chunk);
    kimi::CaptureRows rows = start(m, layers, K);
    capture(m, {seqs.begin(), seqs.begin() + 1}, chunk, &rows);  // two calls append
    capture(m, {seqs.begin() + 1, seqs.end()}, chunk, &rows);
    REQUIRE(rows.sequences() == 3);
    CHECK(rows.seq_starts == std::vector<int64_t>{0, 5, 22, 31});
    CHECK(rows.prompt_lengths == std::vector<int32_t>{2, 10, 9});
    CHECK(rows.line_index == std::vector<int64_t>{4, 9, 12});
    REQUIRE(rows.aux_hidden.size() == static_cast<size_t>(31 * F));
    REQUIRE(rows.topk_ids.size() == static_cast<size_t>(31 * K));
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<int32_t> const& t = seqs[s].tokens;
      int64_t const T = static_cast<int64_t>(t.size()), at = rows.seq_starts[s];
      CHECK(std::equal(t.begin(), t.end(), rows.input_ids.begin() + at));
      std::vector<float> logits, aux;
      fresh_prefill(m, t, layers, &logits, &aux);
      double worst = 0.0, scale = 0.0;
      for (int64_t i = 0; i < T * F; ++i) scale = std::max(scale, std::fabs(double(aux[i])));
      for (int64_t i = 0; i < T * F; ++i) {
        double const want = aux[static_cast<size_t>(i)];
        double const got = specdec::bf16_to_float(rows.aux_hidden[static_cast<size_t>(at * F + i)]);
        // bf16 keeps 8 significant bits: half an ulp is 2^-9 relative (2^-8 with margin), plus
        // float noise between forwards of different row counts.
        worst = std::max(worst, std::fabs(got - want) - std::fabs(want) / 256.0 - 1e-5 * scale);
      }
      CHECK_MESSAGE(worst <= 0.0, "sequence ", s, ": aux off by ", worst, " past bf16 rounding");
      for (int64_t r = 0; r < T; ++r) {
        float const* row = logits.data() + r * V;
        double const top = *std::max_element(row, row + V);
        double sum = 0.0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - top);
        double const lse = top + std::log(sum);
        std::vector<int32_t> order(static_cast<size_t>(V));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        int32_t const* ids = rows.topk_ids.data() + (at + r) * K;
        float const* lp = rows.topk_logprobs.data() + (at + r) * K;
        double mass = 0.0;
        for (int k = 0; k < K; ++k) {
          CHECK(ids[k] == order[static_cast<size_t>(k)]);
          CHECK(lp[k] == doctest::Approx(row[order[static_cast<size_t>(k)]] - lse).epsilon(1e-4));
          if (k > 0) CHECK(lp[k] <= lp[k - 1]);
          mass += std::exp(double(lp[k]));
        }
        CHECK(mass <= 1.0 + 1e-6);
      }
    }
  }
}

TEST_CASE("capture: the layer order is kept (2,0 swaps the halves of 0,2)") {
  TempDir tmp;
  Loaded m;
  load(tmp, &m);
  int64_t const H = m.tiny.config.hidden_size;
  std::mt19937 rng(5);
  std::vector<kimi::CaptureSequence> const seqs = {
      sequence(0, specdec::testing::random_tokens(rng, 11, 512), 4)};
  kimi::CaptureRows a = start(m, {0, 2}, 2), b = start(m, {2, 0}, 2), c = start(m, {0}, 2);
  capture(m, seqs, 1024, &a);
  capture(m, seqs, 1024, &b);
  capture(m, seqs, 1024, &c);
  bool differ = false;
  for (int64_t t = 0; t < 11; ++t) {
    uint16_t const* ra = a.aux_hidden.data() + t * 2 * H;
    uint16_t const* rb = b.aux_hidden.data() + t * 2 * H;
    uint16_t const* rc = c.aux_hidden.data() + t * H;
    CHECK(std::equal(ra, ra + H, rb + H));
    CHECK(std::equal(ra + H, ra + 2 * H, rb));
    CHECK(std::equal(ra, ra + H, rc));
    differ = differ || !std::equal(ra, ra + H, ra + H);
  }
  CHECK_MESSAGE(differ, "layers 0 and 2 gave the same streams: the swap would prove nothing");
  CHECK(a.topk_ids == b.topk_ids);
}

TEST_CASE("capture: a greedy continuation's top-1 is its next token") {
  TempDir tmp;
  Loaded m;
  load(tmp, &m);
  std::vector<int32_t> const prompt = {7, 300, 12, 7};
  kimi::GenerateOptions o;
  o.max_new_tokens = 14;
  o.stop_at_eos = false;
  kimi::GenerateResult g;
  Status s = kimi::kimi_generate(CpuExecutor{}, m.model, m.tiny.config, prompt, o, &g);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), g.output_ids.begin(), g.output_ids.end());
  kimi::CaptureRows rows = start(m, {1}, 3);
  capture(m, {sequence(0, tokens, 4)}, 5, &rows);
  int const K = 3;
  for (size_t t = prompt.size() - 1; t + 1 < tokens.size(); ++t) {
    CAPTURE(t);
    CHECK(rows.topk_ids[t * K] == tokens[t + 1]);
  }
}

TEST_CASE("capture: write_capture's file reads back exactly; an existing path is refused") {
  TempDir tmp;
  Loaded m;
  load(tmp, &m);
  std::mt19937 rng(2);
  kimi::CaptureRows rows = start(m, {-1, 3}, 4);
  capture(m,
          {sequence(1, specdec::testing::random_tokens(rng, 6, 512), 3),
           sequence(3, specdec::testing::random_tokens(rng, 3, 512), 1)},
          4, &rows);
  std::string const path = tmp.file("cap.safetensors");
  Status s = kimi::write_capture(path, rows, {{"model_path", "/m"}, {"format", "not this"}});
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(!std::filesystem::exists(path + ".tmp"));
  specdec::io::SafetensorsFile f;
  s = specdec::io::SafetensorsFile::open(path, &f);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  int64_t const H = m.tiny.config.hidden_size;
  auto expect = [&](char const* name, specdec::Dtype dtype, std::vector<int64_t> shape,
                    auto const& values) {
    CAPTURE(name);
    auto const t = f.find(name);
    REQUIRE(t.has_value());
    CHECK(t->dtype == dtype);
    CHECK(t->shape == shape);
    REQUIRE(t->bytes.size() == values.size() * sizeof(values[0]));
    CHECK(std::memcmp(t->bytes.data(), values.data(), t->bytes.size()) == 0);
  };
  expect("input_ids", specdec::Dtype::kI32, {9}, rows.input_ids);
  expect("seq_starts", specdec::Dtype::kI64, {3}, rows.seq_starts);
  expect("prompt_lengths", specdec::Dtype::kI32, {2}, rows.prompt_lengths);
  expect("line_index", specdec::Dtype::kI64, {2}, rows.line_index);
  expect("aux_hidden", specdec::Dtype::kBF16, {9, 2 * H}, rows.aux_hidden);
  expect("topk_ids", specdec::Dtype::kI32, {9, 4}, rows.topk_ids);
  expect("topk_logprobs", specdec::Dtype::kF32, {9, 4}, rows.topk_logprobs);
  CHECK(f.size() == 7);
  auto const& md = f.metadata();
  CHECK(md.at("format") == "specdec-capture-v1");
  CHECK(md.at("layers") == "-1,3");
  CHECK(md.at("hidden_size") == std::to_string(H));
  CHECK(md.at("vocab_size") == "512");
  CHECK(md.at("num_hidden_layers") == "4");
  CHECK(md.at("topk") == "4");
  CHECK(md.at("model_path") == "/m");
  s = kimi::write_capture(path, rows);
  check_error(s, StatusCode::kInvalidArgument, {path + " exists", "never overwrites"});
}

TEST_CASE("capture: bad layers, top-k and sequences are refused, the rows kept") {
  TempDir tmp;
  Loaded m;
  load(tmp, &m);
  kimi::CaptureRows rows;
  auto const& c = m.tiny.config;
  check_error(kimi::CaptureRows::start(c, std::vector<int>{0, 4}, 8, &rows),
              StatusCode::kInvalidArgument, {"[0,4] has id 4 >= the target's 4 layers"});
  check_error(kimi::CaptureRows::start(c, std::vector<int>{1, 1}, 8, &rows),
              StatusCode::kInvalidArgument, {"[1,1] lists a layer twice"});
  check_error(kimi::CaptureRows::start(c, std::vector<int>{-2}, 8, &rows),
              StatusCode::kInvalidArgument, {"below -1"});
  check_error(kimi::CaptureRows::start(c, std::vector<int>{}, 8, &rows),
              StatusCode::kInvalidArgument, {"capture layers is empty"});
  check_error(kimi::CaptureRows::start(c, std::vector<int>{0}, 0, &rows),
              StatusCode::kInvalidArgument, {"top-k 0 not in [1, 512]"});
  check_error(kimi::CaptureRows::start(c, std::vector<int>{0}, 513, &rows),
              StatusCode::kInvalidArgument, {"top-k 513 not in [1, 512]"});
  rows = start(m, {0}, 2);
  capture(m, {sequence(0, {5, 6, 7}, 1)}, 1024, &rows);
  kimi::CaptureRows const before = rows;
  kimi::CaptureOptions o;
  auto same = [&] {
    CHECK(rows.input_ids == before.input_ids);
    CHECK(rows.seq_starts == before.seq_starts);
    CHECK(rows.aux_hidden == before.aux_hidden);
    CHECK(rows.topk_ids == before.topk_ids);
  };
  std::vector<kimi::CaptureSequence> bad = {sequence(0, {5}, 1), sequence(6, {5, 6}, 0)};
  check_error(kimi::capture_batch(CpuExecutor{}, m.model, bad, o, &rows),
              StatusCode::kInvalidArgument,
              {"sequence 1 (line 7) has 2 tokens and prompt length 0"});
  same();
  // An id outside the vocabulary fails in the forward, after the rows grew: they shrink back.
  bad = {sequence(0, {5, 6}, 1), sequence(1, {5, 600}, 1)};
  check_error(kimi::capture_batch(CpuExecutor{}, m.model, bad, o, &rows),
              StatusCode::kInvalidArgument, {"600 not in [0, vocab_size 512)"});
  same();
  kimi::CaptureRows unstarted;
  check_error(kimi::capture_batch(CpuExecutor{}, m.model, bad, o, &unstarted),
              StatusCode::kInvalidArgument, {"not started"});
}
