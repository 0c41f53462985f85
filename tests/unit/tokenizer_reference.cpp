// tokenizer_reference: our Tokenizer against tiktoken itself. The ctest fixture
// tokenizer.reference_setup (tests/tiktoken_reference.cmake) installs the npm package `tiktoken`
// (tiktoken's Rust core in WASM), exports cl100k_base, o200k_base and o200k_kimi (o200k's ranks
// with Kimi's pattern, verbatim: the proof of its PCRE2 translation) into
// $SPECDEC_TIKTOKEN_REFERENCE_DIR/<encoding>/ in our format, and encodes the corpus
// tests/fixtures/tokenizer_corpus.txt plus generated stress texts with the reference
// (<encoding>/corpus_ids.json). Here, for each encoding, JIT and interpreter: encode and
// encode_ordinary give the reference's ids exactly, decode gives the text back, and streaming the
// ids gives the text. Where npm or its registry is unavailable the fixture writes SKIPPED with the
// reason and this test prints TIKTOKEN_REFERENCE_SKIPPED (ctest reports it skipped).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "specdec/io/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using specdec::Status;
using specdec::io::StreamDecoder;
using specdec::io::Tokenizer;

std::string read_file(fs::path const& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// "" when equal, else where and how the id lists first differ.
std::string first_difference(std::vector<int32_t> const& got, std::vector<int32_t> const& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "";
  auto at = [](std::vector<int32_t> const& v, size_t k) {
    return k < v.size() ? std::to_string(v[k]) : std::string("(end)");
  };
  return "first difference at index " + std::to_string(i) + ": ours " + at(got, i) + ", tiktoken " +
         at(want, i) + " (lengths " + std::to_string(got.size()) + " / " +
         std::to_string(want.size()) + ")";
}

TEST_CASE(
    "tokenizer_reference: ids identical to tiktoken for cl100k_base, o200k_base, Kimi's pattern") {
  char const* env = std::getenv("SPECDEC_TIKTOKEN_REFERENCE_DIR");
  if (env == nullptr) {
    std::printf(
        "tokenizer_reference: SPECDEC_TIKTOKEN_REFERENCE_DIR is not set, nothing compared; run it "
        "through ctest (ctest -R tokenizer_reference), whose fixture exports the encodings\n");
    return;
  }
  fs::path const root = env;
  if (fs::exists(root / "SKIPPED")) {
    std::printf("TIKTOKEN_REFERENCE_SKIPPED: %s\n", read_file(root / "SKIPPED").c_str());
    return;
  }
  std::string const corpus =
      read_file(fs::path(SPECDEC_TEST_FIXTURES_DIR) / "tokenizer_corpus.txt");
  REQUIRE(corpus.size() > 1000);
  for (std::string const encoding : {"cl100k_base", "o200k_base", "o200k_kimi"}) {
    CAPTURE(encoding);
    fs::path const dir = root / encoding;
    std::ifstream ids_file(dir / "corpus_ids.json");
    REQUIRE_MESSAGE(ids_file.good(), "missing ", (dir / "corpus_ids.json").string(),
                    ": the tokenizer.reference_setup fixture did not run");
    nlohmann::json const ref = nlohmann::json::parse(ids_file);
    REQUIRE(ref.at("cases").size() >= 9);
    CHECK(ref.at("cases").at(0).at("text").get<std::string>() == corpus);
    for (bool const jit : {true, false}) {
      CAPTURE(jit);
      Tokenizer t;
      Status s = Tokenizer::load(dir, &t, jit);
      REQUIRE_MESSAGE(s.ok(), s.to_string());
      CHECK(t.pattern().jit() == jit);
      if (encoding == "o200k_kimi") CHECK(t.pattern().source() == specdec::io::kKimiPattern);
      size_t compared = 0;
      for (auto const& c : ref.at("cases")) {
        std::string const name = c.at("name").get<std::string>();
        std::string const text = c.at("text").get<std::string>();
        auto const want = c.at("ids").get<std::vector<int32_t>>();
        auto const want_ordinary = c.at("ordinary").get<std::vector<int32_t>>();
        CAPTURE(name);
        std::vector<int32_t> ids, ordinary;
        s = t.encode(text, &ids);
        REQUIRE_MESSAGE(s.ok(), s.to_string());
        s = t.encode_ordinary(text, &ordinary);
        REQUIRE_MESSAGE(s.ok(), s.to_string());
        CHECK_MESSAGE(ids == want, first_difference(ids, want));
        CHECK_MESSAGE(ordinary == want_ordinary, first_difference(ordinary, want_ordinary));
        std::string back;
        REQUIRE(t.decode(ids, &back).ok());
        CHECK(back == text);
        REQUIRE(t.decode(ordinary, &back).ok());
        CHECK(back == text);
        StreamDecoder d(t);
        std::string streamed;
        for (int32_t id : ids) REQUIRE(d.feed(id, &streamed).ok());
        d.flush(&streamed);
        CHECK(streamed == text);
        compared += ids.size();
      }
      std::printf("tokenizer_reference: %s (%s): %zu ids identical over %zu cases\n",
                  encoding.c_str(), jit ? "JIT" : "interpreter", compared, ref.at("cases").size());
    }
  }
}

}  // namespace
