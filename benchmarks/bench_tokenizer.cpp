// Tokenizer throughput on one CPU thread: tests/fixtures/tokenizer_corpus.txt repeated to about
// 1 MB (ceil(1e6 / its size) copies, as tools/tiktoken_reference/bench.js does), so the numbers
// sit beside tiktoken's own (npm, Rust core in WASM) on the same text:
//   node tools/tiktoken_reference/bench.js tests/fixtures/tokenizer_corpus.txt
// Cases:
//   encode/<encoding>[/interpreter]  Tokenizer::encode (specials allowed); encodings exported by
//                                    the ctest fixture tokenizer.reference_setup into
//                                    $SPECDEC_TIKTOKEN_REFERENCE_DIR (default: this build's
//                                    tests/tiktoken_reference; run `ctest -R tokenizer` first):
//                                    cl100k_base, o200k_base, o200k_kimi (o200k's ranks with
//                                    Kimi's pattern); interpreter: PCRE2 without its JIT
//   encode/byte_level_kimi           write_byte_level_tokenizer(512): Kimi's pattern and special
//                                    block over the 256 bytes (no merges: split + lookups)
//   decode/cl100k_base, stream/cl100k_base   Tokenizer::decode of the encoded text; StreamDecoder
//                                    fed id by id
// Counters: MB_per_s (1 MB = 1e6 bytes of UTF-8 text), ids.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "specdec/io/tokenizer.hpp"
#include "support/testing.hpp"

namespace {

namespace fs = std::filesystem;
using specdec::Status;
using specdec::io::StreamDecoder;
using specdec::io::Tokenizer;

std::string const& text() {
  static std::string const t = [] {
    std::ifstream in(fs::path(SPECDEC_TEST_FIXTURES_DIR) / "tokenizer_corpus.txt",
                     std::ios::binary);
    std::string const corpus((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    std::string out;
    if (corpus.empty()) return out;
    size_t const copies = (1000000 + corpus.size() - 1) / corpus.size();
    for (size_t i = 0; i < copies; ++i) out += corpus;
    return out;
  }();
  return t;
}

fs::path reference_dir() {
  char const* env = std::getenv("SPECDEC_TIKTOKEN_REFERENCE_DIR");
  return env != nullptr ? fs::path(env) : fs::path(SPECDEC_TIKTOKEN_REFERENCE_DIR_DEFAULT);
}

// Loaded once per (name, jit); *error set when it cannot be.
Tokenizer const* tokenizer(std::string const& name, bool jit, std::string* error) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  static specdec::testing::TempDir tmp;
  std::string const key = name + (jit ? "" : "/interpreter");
  if (auto it = loaded.find(key); it != loaded.end()) return it->second.get();
  fs::path dir = reference_dir() / name;
  if (name == "byte_level_kimi") {
    dir = tmp.path / name;
    Status s = specdec::io::write_byte_level_tokenizer(dir, 512);
    if (!s.ok()) {
      *error = s.to_string();
      return nullptr;
    }
  }
  auto t = std::make_unique<Tokenizer>();
  Status s = Tokenizer::load(dir, t.get(), jit);
  if (!s.ok()) {
    *error =
        s.to_string() + " (run `ctest -R tokenizer` first, or set SPECDEC_TIKTOKEN_REFERENCE_DIR)";
    return nullptr;
  }
  return (loaded[key] = std::move(t)).get();
}

void set_counters(benchmark::State& state, size_t ids) {
  state.counters["MB_per_s"] = benchmark::Counter(
      static_cast<double>(text().size()) * static_cast<double>(state.iterations()) / 1e6,
      benchmark::Counter::kIsRate);
  state.counters["ids"] = static_cast<double>(ids);
}

void bm_encode(benchmark::State& state, std::string const& name, bool jit) {
  std::string error;
  Tokenizer const* t = tokenizer(name, jit, &error);
  if (t == nullptr || text().empty()) {
    state.SkipWithError(t == nullptr ? error.c_str() : "empty corpus");
    return;
  }
  std::vector<int32_t> ids;
  for (auto _ : state) {
    Status s = t->encode(text(), &ids);
    if (!s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(ids.data());
  }
  set_counters(state, ids.size());
}

void bm_decode(benchmark::State& state, bool stream) {
  std::string error;
  Tokenizer const* t = tokenizer("cl100k_base", true, &error);
  if (t == nullptr || text().empty()) {
    state.SkipWithError(t == nullptr ? error.c_str() : "empty corpus");
    return;
  }
  std::vector<int32_t> ids;
  if (!t->encode(text(), &ids).ok()) {
    state.SkipWithError("encode failed");
    return;
  }
  std::string out;
  for (auto _ : state) {
    out.clear();
    if (stream) {
      StreamDecoder d(*t);
      for (int32_t id : ids) {
        if (!d.feed(id, &out).ok()) {
          state.SkipWithError("stream decode failed");
          return;
        }
      }
      d.flush(&out);
    } else if (!t->decode(ids, &out).ok()) {
      state.SkipWithError("decode failed");
      return;
    }
    benchmark::DoNotOptimize(out.data());
  }
  if (out != text()) state.SkipWithError("decode did not give the text back");
  set_counters(state, ids.size());
}

int const registered = [] {
  for (char const* name : {"cl100k_base", "o200k_base", "o200k_kimi", "byte_level_kimi"}) {
    benchmark::RegisterBenchmark((std::string("encode/") + name).c_str(), [name](
                                                                              benchmark::State& s) {
      bm_encode(s, name, true);
    })->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("encode/cl100k_base/interpreter", [](benchmark::State& s) {
    bm_encode(s, "cl100k_base", false);
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("decode/cl100k_base", [](benchmark::State& s) {
    bm_decode(s, false);
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("stream/cl100k_base", [](benchmark::State& s) {
    bm_decode(s, true);
  })->Unit(benchmark::kMillisecond);
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
