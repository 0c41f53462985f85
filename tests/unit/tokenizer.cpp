// tokenizer: tiktoken BPE on hand-made vocabularies (the 256 bytes plus a few merges, results
// worked out by hand in comments), the heap merge against the linear one and a plain reference on
// random vocabularies, special tokens, streaming decode on split multi-byte characters, Kimi's chat
// template (text and ids), the byte-level tokenizer writer, the pattern translation (Kimi's
// pattern, class operations, \p{Han} as a script), pat_str against the default, and every error:
// files, lines, JSON, patterns, ids, text. (Identity with tiktoken itself:
// tokenizer_reference.cpp.)
#include "specdec/io/tokenizer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/status_checks.hpp"
#include "support/testing.hpp"

namespace {

namespace fs = std::filesystem;
using specdec::Status;
using specdec::StatusCode;
using specdec::io::ChatMessage;
using specdec::io::SpecialToken;
using specdec::io::SplitPattern;
using specdec::io::StreamDecoder;
using specdec::io::Tokenizer;
using specdec::testing::check_error;
using specdec::testing::TempDir;

// The 256 single bytes as ranks 0..255 (rank = byte value), then `merges` as ranks 256, 257, ..
std::vector<std::string> byte_vocab(std::vector<std::string> const& merges = {}) {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  t.insert(t.end(), merges.begin(), merges.end());
  return t;
}

Tokenizer make(std::vector<std::string> const& merges,
               std::vector<SpecialToken> const& specials = {},
               std::string_view pattern = specdec::io::kKimiPattern) {
  Tokenizer t;
  Status s = Tokenizer::build(byte_vocab(merges), specials, pattern, &t);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return t;
}

std::vector<int32_t> encode(Tokenizer const& t, std::string_view text) {
  std::vector<int32_t> ids;
  Status s = t.encode(text, &ids);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return ids;
}

std::vector<int32_t> bytes_ids(std::string_view text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::vector<std::string> pieces(SplitPattern const& p, std::string_view text) {
  std::vector<std::string> out;
  Status s = p.split(text, [&](std::string_view piece) { out.emplace_back(piece); });
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return out;
}

void write_file(fs::path const& path, std::string const& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// A directory with the 256 bytes, `extra` lines appended to tiktoken.model, and `config`.
void write_dir(fs::path const& dir, std::string const& model, std::string const& config) {
  fs::create_directories(dir);
  write_file(dir / "tiktoken.model", model);
  write_file(dir / "tokenizer_config.json", config);
}

std::string byte_model() {
  std::string m;
  for (int b = 0; b < 256; ++b) {
    m += specdec::io::detail::base64_encode(std::string(1, static_cast<char>(b))) + " " +
         std::to_string(b) + "\n";
  }
  return m;
}

// tiktoken's merge written plainly on strings: the independent reference for the two fast ones.
std::vector<int32_t> plain_bpe(std::map<std::string, int32_t> const& ranks,
                               std::string const& piece) {
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT32_MAX) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  std::vector<int32_t> ids;
  for (auto const& p : parts) ids.push_back(ranks.at(p));
  return ids;
}

TEST_CASE("tokenizer: merge order is the lowest rank of the concatenation, leftmost of equals") {
  // "bc" 256, "ab" 257, "cd" 258, "bcd" 259. "abcd": pairs ab 257, bc 256, cd 258 -> bc first
  // -> a|bc|d: a+bc "abc" is no token, bc+d "bcd" 259 -> a|bcd: "abcd" is no token -> [97, 259].
  // Merging left to right (ab first) would give [257, 258].
  Tokenizer t = make({"bc", "ab", "cd", "bcd"});
  CHECK(encode(t, "abcd") == std::vector<int32_t>{97, 259});
  // "aa" 256: "aaa" -> aa|a (the leftmost of two equal pairs), "aaaa" -> aa|a|a -> aa|aa.
  Tokenizer u = make({"aa"});
  CHECK(encode(u, "aaa") == std::vector<int32_t>{256, 97});
  CHECK(encode(u, "aaaa") == std::vector<int32_t>{256, 256});
  // A merge's rank is the concatenation's: "xy" 256, "yz" 257, "xyz" 258 -> "xyz" maps directly;
  // "wxyz": pairs wx -, xy 256, yz 257 -> w|xy|z -> xy+z "xyz" 258 -> [119, 258].
  Tokenizer v = make({"xy", "yz", "xyz"});
  CHECK(encode(v, "xyz") == std::vector<int32_t>{258});
  CHECK(encode(v, "wxyz") == std::vector<int32_t>{119, 258});
}

TEST_CASE("tokenizer: a piece that is a token maps directly, without reachable merges") {
  // "hello" 256 has no merge path from its bytes; as a whole piece it is one id.
  Tokenizer t = make({"hello"});
  CHECK(encode(t, "hello") == std::vector<int32_t>{256});
  // " hello" is one piece of Kimi's pattern and no token: bytes (no pair is a token).
  CHECK(encode(t, " hello") == bytes_ids(" hello"));
  CHECK(encode(t, "hello hello") == std::vector<int32_t>{256, 32, 104, 101, 108, 108, 111});
}

TEST_CASE("tokenizer: heap merge == linear merge == plain reference on random vocabularies") {
  std::mt19937_64 rng(20240601);
  for (int vocab_case = 0; vocab_case < 6; ++vocab_case) {
    // Merges of existing tokens over a 3-letter alphabet, in random order: many equal-rank ties
    // and pairs that only merge after their neighbours have.
    std::vector<std::string> tokens = byte_vocab();
    std::map<std::string, int32_t> ranks;
    for (size_t r = 0; r < tokens.size(); ++r) ranks[tokens[r]] = static_cast<int32_t>(r);
    std::vector<std::string> pool = {"a", "b", "c"};
    while (tokens.size() < 256 + 150) {
      std::string const s = pool[rng() % pool.size()] + pool[rng() % pool.size()];
      if (s.size() > 12 || ranks.count(s)) continue;
      ranks[s] = static_cast<int32_t>(tokens.size());
      tokens.push_back(s);
      pool.push_back(s);
    }
    Tokenizer t;
    REQUIRE(Tokenizer::build(tokens, {}, "[abc]+", &t).ok());
    specdec::io::detail::ByteStringMap map;
    for (size_t r = 0; r < tokens.size(); ++r) map.insert(tokens[r], static_cast<uint32_t>(r));
    std::vector<std::pair<uint32_t, uint32_t>> scratch;
    for (int n = 2; n < 400; n += 1 + static_cast<int>(rng() % 13)) {
      std::string piece;
      for (int i = 0; i < n; ++i) piece += "abc"[rng() % 3];
      std::vector<int32_t> linear, heap;
      specdec::io::detail::bpe_merge_linear(map, piece, scratch, &linear);
      specdec::io::detail::bpe_merge_heap(map, piece, &heap);
      std::vector<int32_t> const plain = plain_bpe(ranks, piece);
      CAPTURE(piece);
      CHECK(linear == plain);
      CHECK(heap == plain);
      // encode: a whole token maps directly, else the same merges.
      std::vector<int32_t> const want =
          ranks.count(piece) ? std::vector<int32_t>{ranks.at(piece)} : plain;
      CHECK(encode(t, piece) == want);
    }
  }
}

TEST_CASE("tokenizer: special tokens are matched whole by encode, plain text to encode_ordinary") {
  Tokenizer t = make({}, {{"<|x|>", 300}, {"<|x|>y", 301}, {"<|y|>", 302}});
  CHECK(t.vocab_size() == 303);
  CHECK(t.num_special() == 3);
  CHECK(encode(t, "a<|y|>b") == std::vector<int32_t>{97, 302, 98});
  // Longest at one position; leftmost first.
  CHECK(encode(t, "<|x|>yz") == std::vector<int32_t>{301, 122});
  CHECK(encode(t, "<|x|>z") == std::vector<int32_t>{300, 122});
  CHECK(encode(t, "q<|y|><|x|>") == std::vector<int32_t>{113, 302, 300});
  CHECK(encode(t, "<|y|>") == std::vector<int32_t>{302});
  CHECK(encode(t, "").empty());
  // A broken special is text.
  CHECK(encode(t, "<|y|") == bytes_ids("<|y|"));
  // The segments around a special are split on their own (tiktoken slices the text there).
  CHECK(encode(t, "a <|y|> b") == std::vector<int32_t>{97, 32, 302, 32, 98});
  std::vector<int32_t> ids;
  REQUIRE(t.encode_ordinary("a<|y|>b", &ids).ok());
  CHECK(ids == bytes_ids("a<|y|>b"));
  CHECK(t.special_id("<|y|>") == 302);
  CHECK_FALSE(t.special_id("<|z|>").has_value());
  CHECK(t.is_special(300));
  CHECK_FALSE(t.is_special(97));
  CHECK_FALSE(t.is_special(299));
  std::string bytes;
  REQUIRE(t.decode(std::vector<int32_t>{97, 302, 98}, &bytes).ok());
  CHECK(bytes == "a<|y|>b");
}

TEST_CASE("tokenizer: streaming decode holds back a split multi-byte character") {
  // "é" = C3 A9; "x" + the first two bytes of U+1F600 (F0 9F 98 80) as one token, the rest + "y".
  Tokenizer t = make({"x\xF0\x9F", "\x98\x80y"}, {{"<|end|>", 300}});
  StreamDecoder d(t);
  std::string out;
  REQUIRE(d.feed(0xC3, &out).ok());
  CHECK(out.empty());
  CHECK(d.pending() == 1);
  REQUIRE(d.feed(0xA9, &out).ok());
  CHECK(out == "\xC3\xA9");
  CHECK(d.pending() == 0);
  out.clear();
  REQUIRE(d.feed(256, &out).ok());
  CHECK(out == "x");
  REQUIRE(d.feed(257, &out).ok());
  CHECK(out == "x\xF0\x9F\x98\x80y");
  // Bytes that can never be valid come out at once as U+FFFD; a special token as its text.
  out.clear();
  REQUIRE(d.feed(0xFF, &out).ok());
  REQUIRE(d.feed(300, &out).ok());
  CHECK(out == "\xEF\xBF\xBD<|end|>");
  // A tail cut off by the end of the stream: flush gives one U+FFFD for it.
  out.clear();
  REQUIRE(d.feed(0xE4, &out).ok());
  REQUIRE(d.feed(0xBD, &out).ok());
  CHECK(out.empty());
  d.flush(&out);
  CHECK(out == "\xEF\xBF\xBD");
  CHECK(d.pending() == 0);
  // skip_special: specials emit nothing.
  StreamDecoder quiet(t, /*skip_special=*/true);
  out.clear();
  REQUIRE(quiet.feed(104, &out).ok());
  REQUIRE(quiet.feed(300, &out).ok());
  CHECK(out == "h");
}

TEST_CASE("tokenizer: decode_text replaces each maximal invalid subsequence (Python's 'replace')") {
  Tokenizer t = make({});
  auto text = [&](std::string const& bytes) {
    std::string out;
    REQUIRE(t.decode_text(bytes_ids(bytes), &out).ok());
    return out;
  };
  std::string const r = "\xEF\xBF\xBD";
  CHECK(text("a\x80z") == "a" + r + "z");
  CHECK(text("\xE0\x80") == r + r);                  // E0 needs A0..BF next
  CHECK(text("\xED\xA0\x80") == r + r + r);          // a surrogate
  CHECK(text("\xF0\x9F\x98") == r);                  // truncated at the end: one
  CHECK(text("\xF0\x9F\x98z") == r + "z");           // truncated by a non-continuation: one
  CHECK(text("\xC0\xAF") == r + r);                  // overlong
  CHECK(text("\xF4\x90\x80\x80") == r + r + r + r);  // above U+10FFFF
  CHECK(text("ok \xE6\x97\xA5") == "ok \xE6\x97\xA5");
}

TEST_CASE("tokenizer: streaming output == decode_text over random id sequences") {
  // Tokens holding whole, partial and invalid UTF-8.
  Tokenizer t =
      make({"\xE4\xBD", "\xA0\xE5\xA5", "\xBD!", "\xF0\x9F\x98\x80", "ab\xC3"}, {{"<|s|>", 300}});
  std::vector<int32_t> alphabet = {97,   0xC3, 0xA9, 0xE4, 0xBD, 0xA0, 0xF0, 0x9F,
                                   0x80, 0xFF, 256,  257,  258,  259,  260,  300};
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids(rng() % 20);
    for (auto& id : ids) id = alphabet[rng() % alphabet.size()];
    std::string whole, streamed;
    REQUIRE(t.decode_text(ids, &whole).ok());
    StreamDecoder d(t);
    for (int32_t id : ids) {
      std::string piece;
      REQUIRE(d.feed(id, &piece).ok());
      CHECK(specdec::io::detail::utf8_invalid_at(piece) == std::string_view::npos);
      CHECK(d.pending() <= 3);
      streamed += piece;
    }
    d.flush(&streamed);
    CAPTURE(trial);
    CHECK(streamed == whole);
  }
}

TEST_CASE("tokenizer: Kimi's chat template, text and ids; stop ids") {
  TempDir tmp;
  REQUIRE(specdec::io::write_byte_level_tokenizer(tmp.path, 512).ok());
  Tokenizer t;
  Status s = Tokenizer::load(tmp.path, &t);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<ChatMessage> const messages = {
      {"system", "Be brief."}, {"user", "hi"}, {"assistant", "ok"}, {"user", "again"}};
  std::string text;
  REQUIRE(specdec::io::render_kimi_chat(messages, true, &text).ok());
  CHECK(text ==
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>ok<|im_end|>"
        "<|im_user|>user<|im_middle|>again<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>");
  std::vector<int32_t> ids;
  REQUIRE(t.encode_chat(messages, true, &ids).ok());
  CHECK(ids == encode(t, text));
  // By hand (vocab 512: <|im_end|> 258, <|im_user|> 259, <|im_assistant|> 260, <|im_middle|> 273).
  std::vector<ChatMessage> const one = {{"user", "hi"}};
  REQUIRE(t.encode_chat(one, true, &ids).ok());
  std::vector<int32_t> want = {259};
  for (int32_t c : bytes_ids("user")) want.push_back(c);
  want.insert(want.end(), {273, 'h', 'i', 258, 260});
  for (int32_t c : bytes_ids("assistant")) want.push_back(c);
  want.push_back(273);
  CHECK(ids == want);
  REQUIRE(t.encode_chat(one, false, &ids).ok());
  CHECK(ids == std::vector<int32_t>(want.begin(), want.begin() + 9));
  // A message cannot inject a special token: its text is plain text.
  std::vector<ChatMessage> const inject = {{"user", "<|im_end|>"}};
  REQUIRE(t.encode_chat(inject, false, &ids).ok());
  CHECK(std::count(ids.begin(), ids.end(), 258) == 1);
  CHECK(t.stop_ids() == std::vector<int32_t>{258, 257});
  check_error(t.encode_chat(std::vector<ChatMessage>{{"user", "a"}, {"tool", "b"}}, true, &ids),
              StatusCode::kInvalidArgument,
              {"chat message 1", "\"tool\"", "system, user, assistant"});
  check_error(specdec::io::render_kimi_chat(std::vector<ChatMessage>{{"robot", "b"}}, true, &text),
              StatusCode::kInvalidArgument, {"chat message 0", "\"robot\""});
  check_error(t.encode_chat(std::vector<ChatMessage>{{"user", "bad \xFF"}}, true, &ids),
              StatusCode::kInvalidArgument, {"chat message 0: content", "UTF-8 at byte 4"});
  Tokenizer plain = make({});
  check_error(plain.encode_chat(one, true, &ids), StatusCode::kInvalidArgument,
              {"no special token <|im_system|>"});
  CHECK(plain.stop_ids().empty());
}

TEST_CASE("tokenizer: write_byte_level_tokenizer places Kimi's special block at the top") {
  TempDir tmp;
  Tokenizer t;
  REQUIRE(specdec::io::write_byte_level_tokenizer(tmp.path / "v512", 512).ok());
  REQUIRE(Tokenizer::load(tmp.path / "v512", &t).ok());
  CHECK(t.vocab_size() == 512);
  CHECK(t.num_ranks() == 256);
  CHECK(t.special_id("[BOS]") == 256);
  CHECK(t.special_id("[EOS]") == 257);
  CHECK(t.special_id("<|im_end|>") == 258);
  CHECK(t.special_id("<|im_system|>") == 266);
  CHECK(t.special_id("<|im_middle|>") == 273);
  CHECK(t.special_id("<think>") == 278);
  CHECK(t.special_id("</think>") == 279);
  CHECK(t.special_id("[PAD]") == 511);
  CHECK(t.special_id("<|reserved_token_300|>") == 300);
  CHECK(t.pattern().source() == specdec::io::kKimiPattern);
  // Every id decodes; text is one id per byte.
  for (int32_t id = 0; id < 512; ++id) {
    std::string_view b;
    REQUIRE(t.token_bytes(id, &b).ok());
  }
  CHECK(encode(t, "héllo 你好") == bytes_ids("héllo 你好"));
  // vocab 1000: reserved ids fill 256..743, the block sits at 744..999.
  REQUIRE(specdec::io::write_byte_level_tokenizer(tmp.path / "v1000", 1000).ok());
  REQUIRE(Tokenizer::load(tmp.path / "v1000", &t).ok());
  CHECK(t.vocab_size() == 1000);
  CHECK(t.special_id("[BOS]") == 744);
  CHECK(t.special_id("[PAD]") == 999);
  CHECK(t.special_id("<|reserved_token_256|>") == 256);
  // Kimi's own vocabulary size gives Kimi's own ids.
  std::vector<SpecialToken> specials;
  REQUIRE(specdec::io::byte_level_special_tokens(163840, &specials).ok());
  CHECK(specials.size() == 163840 - 256);
  for (auto const& k : specdec::io::kimi_named_special_tokens()) {
    CHECK(specials[static_cast<size_t>(k.id - 256)].content == k.content);
  }
  check_error(specdec::io::write_byte_level_tokenizer(tmp.path / "v511", 511),
              StatusCode::kInvalidArgument, {"vocab_size 511", ">= 512"});
  CHECK_FALSE(fs::exists(tmp.path / "v511"));
}

TEST_CASE("tokenizer: Kimi's pattern translated for PCRE2 (class intersection, Han as a script)") {
  std::string out;
  REQUIRE(specdec::io::translate_tiktoken_pattern(specdec::io::kKimiPattern, &out).ok());
  CHECK(out == R"([\p{sc:Han}]+)"
               R"(|[^\r\n\p{L}\p{N}]?(?:(?![\p{sc:Han}])[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*)"
               R"((?:(?![\p{sc:Han}])[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
               R"(|[^\r\n\p{L}\p{N}]?(?:(?![\p{sc:Han}])[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+)"
               R"((?:(?![\p{sc:Han}])[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
               R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  SplitPattern p;
  REQUIRE(SplitPattern::compile(specdec::io::kKimiPattern, &p).ok());
  // Han runs split from other letters; CJK punctuation (Script_Extensions Han, Script Common)
  // is not Han: "，" stands alone, "。" leads the next word as any punctuation does;
  // contractions stay with their word; digits in threes.
  CHECK(pieces(p, "你好，世界。Hello世界 they'll 1234567") ==
        std::vector<std::string>{"你好", "，", "世界", "。Hello", "世界", " they'll", " ", "123",
                                 "456", "7"});
  CHECK(pieces(p, "ÉCOLE école  \n\n x") ==
        std::vector<std::string>{"ÉCOLE", " école", "  \n\n", " x"});
  // PCRE2's own \p{Han} (Script_Extensions) would have taken "。" and "「」" (not "，").
  SplitPattern sc, scx;
  REQUIRE(SplitPattern::compile(R"([\p{Han}]+|\S|\s+)", &sc).ok());
  REQUIRE(SplitPattern::compile(R"([\p{scx:Han}]+|\S|\s+)", &scx).ok());
  CHECK(pieces(sc, "世界。「引」") == std::vector<std::string>{"世界", "。", "「", "引", "」"});
  CHECK(pieces(scx, "世界。「引」") == std::vector<std::string>{"世界。「引」"});
}

TEST_CASE("tokenizer: pattern translation of class operations and properties") {
  auto tr = [](std::string_view pat) {
    std::string out;
    Status s = specdec::io::translate_tiktoken_pattern(pat, &out);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    return out;
  };
  CHECK(tr(R"(\p{L}+|\pN|[^\s\p{L}])") == R"(\p{L}+|\pN|[^\s\p{L}])");  // unchanged
  CHECK(tr(R"(\p{Greek}\P{Cyrillic}[\p{Latin}x])") ==
        R"(\p{sc:Greek}\P{sc:Cyrillic}[\p{sc:Latin}x])");
  CHECK(tr("[a-z&&[^aeiou]]") == "(?:(?![aeiou])[a-z])");
  CHECK(tr("[a-z&&[b-d]]") == "(?:(?=[b-d])[a-z])");
  CHECK(tr("[a-z--[aeiou]]") == "(?:(?![aeiou])[a-z])");
  CHECK(tr("[a[xy]]") == "(?:[a]|[xy])");
  CHECK(tr("[^a[xy]]") == "(?:(?!(?:[a]|[xy]))(?s:.))");
  CHECK(tr("[]a]") == "[\\]a]");
  CHECK(tr("[[:alpha:]-]") == "[[:alpha:]-]");
  CHECK(tr(R"(\Q[&&]\E)") == R"(\Q[&&]\E)");
  // Behaviour, not just text: consonants only.
  SplitPattern p;
  REQUIRE(SplitPattern::compile("[a-z&&[^aeiou]]+|[^a-z&&[^aeiou]]", &p).ok());
  CHECK(pieces(p, "strength!a") == std::vector<std::string>{"str", "e", "ngth", "!", "a"});
  std::string out;
  check_error(specdec::io::translate_tiktoken_pattern("[a~~b]", &out), StatusCode::kUnsupported,
              {"'~~'", "offset 2"});
  check_error(specdec::io::translate_tiktoken_pattern("x[ab", &out), StatusCode::kMalformedInput,
              {"unterminated character class", "offset 1"});
  check_error(specdec::io::translate_tiktoken_pattern(R"(\p{Han)", &out),
              StatusCode::kMalformedInput, {"unterminated \\p{"});
}

TEST_CASE("tokenizer: pat_str in tokenizer_config.json replaces Kimi's default pattern") {
  TempDir tmp;
  write_dir(tmp.path / "default", byte_model(), "{}");
  write_dir(tmp.path / "custom", byte_model(), R"({"pat_str": "\\S+|\\s+"})");
  Tokenizer a, b;
  REQUIRE(Tokenizer::load(tmp.path / "default", &a).ok());
  REQUIRE(Tokenizer::load(tmp.path / "custom", &b).ok());
  CHECK(a.pattern().source() == specdec::io::kKimiPattern);
  CHECK(b.pattern().source() == R"(\S+|\s+)");
  std::string_view const text = "it's 2024, ok";
  CHECK(pieces(a.pattern(), text) == std::vector<std::string>{"it's", " ", "202", "4", ",", " ok"});
  CHECK(pieces(b.pattern(), text) == std::vector<std::string>{"it's", " ", "2024,", " ", "ok"});
  CHECK(a.num_special() == 0);
  CHECK(a.vocab_size() == 256);
}

TEST_CASE("tokenizer: JIT is recorded; the interpreter gives the same pieces on long runs") {
  SplitPattern jit, interp;
  REQUIRE(SplitPattern::compile(specdec::io::kKimiPattern, &jit).ok());
  REQUIRE(SplitPattern::compile(specdec::io::kKimiPattern, &interp, /*use_jit=*/false).ok());
  CHECK_MESSAGE(jit.jit(), "PCRE2 JIT unavailable: ", jit.jit_error());
  CHECK(jit.jit_error().empty() == jit.jit());
  CHECK_FALSE(interp.jit());
  CHECK(interp.jit_error() == "JIT not requested");
  // Runs long enough to need a large JIT stack for the repeated lookahead groups.
  std::string upper;
  for (int i = 0; i < 100000; ++i) upper += "\xD0\x96";  // Cyrillic Ж
  std::string const text = upper + "\xD0\xB6 " + std::string(100000, ' ') + "x" +
                           std::string(50000, '\n') + std::string(30000, '7');
  std::vector<std::string> const want = pieces(interp, text);
  CHECK(pieces(jit, text) == want);
  REQUIRE(want.size() >= 4);
  CHECK(want[0] == upper + "\xD0\xB6");
  // 1 MB of one letter: one piece, byte-level ids.
  Tokenizer t = make({});
  std::string const big(1 << 20, 'q');
  CHECK(encode(t, big).size() == big.size());
}

TEST_CASE("tokenizer: tiktoken.model errors name the file, the line and the problem") {
  TempDir tmp;
  auto load_model = [&](std::string const& model) {
    fs::path const dir = tmp.path / std::to_string(std::hash<std::string>()(model));
    write_dir(dir, model, "{}");
    Tokenizer t;
    return Tokenizer::load(dir, &t);
  };
  std::string const m = byte_model();  // lines 1..256
  check_error(load_model(m + "YWI= 256\n!!!! 257\n"), StatusCode::kMalformedInput,
              {"tiktoken.model line 258", "malformed base64", "!!!!"});
  check_error(load_model(m + "YWI 256\n"), StatusCode::kMalformedInput,
              {"line 257", "malformed base64"});
  check_error(load_model(m + "YWI= x1\n"), StatusCode::kMalformedInput,
              {"line 257", "rank \"x1\"", "not a non-negative integer"});
  check_error(load_model(m + "YWI=\n"), StatusCode::kMalformedInput,
              {"line 257", "expected \"<base64 bytes> <rank>\""});
  check_error(load_model(m + "YWI= 256 7\n"), StatusCode::kMalformedInput,
              {"line 257", "expected"});
  check_error(load_model(m + "YWI= 5\n"), StatusCode::kMalformedInput,
              {"line 257", "duplicate rank 5", "first on line 6"});
  check_error(load_model(m + "YWI= 300\n"), StatusCode::kMalformedInput,
              {"line 257", "rank 300 outside 0..256", "contiguous"});
  check_error(load_model(m + "YQ== 256\n"), StatusCode::kMalformedInput,
              {"line 257", "token \"a\"", "already has rank 97", "line 98"});
  // The byte 0x41 ('A', base64 QQ==) missing: its rank 65 line dropped, ranks renumbered.
  std::string no_a;
  for (int b = 0, r = 0; b < 256; ++b) {
    if (b == 0x41) continue;
    no_a += specdec::io::detail::base64_encode(std::string(1, static_cast<char>(b))) + " " +
            std::to_string(r++) + "\n";
  }
  check_error(load_model(no_a), StatusCode::kMalformedInput, {"no token for the byte 0x41"});
  check_error(load_model("\n\n"), StatusCode::kMalformedInput, {"no tokens"});
  // CRLF lines and blank lines are fine.
  std::string crlf;
  for (int b = 0; b < 256; ++b) {
    crlf += specdec::io::detail::base64_encode(std::string(1, static_cast<char>(b))) + " " +
            std::to_string(b) + "\r\n\r\n";
  }
  CHECK(load_model(crlf).ok());
  Tokenizer t;
  check_error(Tokenizer::load(tmp.path / "nowhere", &t), StatusCode::kInvalidArgument,
              {"nowhere/tiktoken.model", "cannot open", "missing"});
  fs::create_directories(tmp.path / "noconfig");
  write_file(tmp.path / "noconfig" / "tiktoken.model", m);
  check_error(Tokenizer::load(tmp.path / "noconfig", &t), StatusCode::kInvalidArgument,
              {"noconfig/tokenizer_config.json", "cannot open"});
}

TEST_CASE("tokenizer: tokenizer_config.json and special-token errors") {
  TempDir tmp;
  int n = 0;
  auto load_config = [&](std::string const& config) {
    fs::path const dir = tmp.path / std::to_string(n++);
    write_dir(dir, byte_model(), config);
    Tokenizer t;
    return Tokenizer::load(dir, &t);
  };
  check_error(load_config("{\"added_tokens_decoder\": "), StatusCode::kMalformedInput,
              {"tokenizer_config.json", "not valid JSON"});
  check_error(load_config("[]"), StatusCode::kMalformedInput, {"not a JSON object"});
  check_error(load_config(R"({"added_tokens_decoder": {"300": {"content": "<|a|>"},
                                                       "300": {"content": "<|b|>"}}})"),
              StatusCode::kMalformedInput,
              {"tokenizer_config.json: duplicate key \"300\" in a nested object"});
  check_error(load_config(R"({"added_tokens_decoder": []})"), StatusCode::kMalformedInput,
              {"\"added_tokens_decoder\" must be an object"});
  check_error(load_config(R"({"added_tokens_decoder": {"x1": {"content": "<a>"}}})"),
              StatusCode::kMalformedInput, {"added_tokens_decoder[\"x1\"]", "not a token id"});
  check_error(load_config(R"({"added_tokens_decoder": {"300": {"special": true}}})"),
              StatusCode::kMalformedInput, {"[\"300\"]", "\"content\" must be a non-empty string"});
  check_error(load_config(R"({"added_tokens_decoder": {"300": {"content": "<a>", "special": 1}}})"),
              StatusCode::kMalformedInput, {"\"special\" must be true or false"});
  check_error(load_config(R"({"added_tokens_decoder": {"100": {"content": "<a>"}}})"),
              StatusCode::kMalformedInput,
              {"special token \"<a>\" (id 100)", "collides with rank"});
  check_error(load_config(R"({"added_tokens_decoder": {"300": {"content": "<a>"},
                                                       "301": {"content": "<a>"}}})"),
              StatusCode::kMalformedInput, {"\"<a>\" (id 301)", "already has id 300"});
  check_error(load_config(R"({"pat_str": 7})"), StatusCode::kMalformedInput,
              {"\"pat_str\" must be a non-empty string"});
  // Two specials on one id (only reachable through build: JSON keys are unique).
  Tokenizer t;
  check_error(Tokenizer::build(byte_vocab(), {{"<a>", 300}, {"<b>", 300}}, "\\S+|\\s+", &t),
              StatusCode::kMalformedInput, {"\"<a>\" and \"<b>\" share the id 300"});
  check_error(Tokenizer::build(byte_vocab({"ab", "ab"}), {}, "\\S+|\\s+", &t),
              StatusCode::kMalformedInput, {"token \"ab\" has two ranks: 256 and 257"});
  check_error(Tokenizer::build(byte_vocab(), {{"bad\xFF", 300}}, "\\S+|\\s+", &t),
              StatusCode::kMalformedInput, {"not valid UTF-8 at byte 3"});
}

TEST_CASE("tokenizer: patterns PCRE2 refuses, or that leave text uncovered, are named") {
  TempDir tmp;
  write_dir(tmp.path / "bad", byte_model(), R"({"pat_str": "(ab"})");
  Tokenizer t;
  check_error(Tokenizer::load(tmp.path / "bad", &t), StatusCode::kInvalidArgument,
              {"PCRE2 refuses it", "missing closing parenthesis", "offset 3", "\"(ab\""});
  // A translated pattern names both forms.
  check_error(Tokenizer::build(byte_vocab(), {}, R"([\p{Greek}&&[a]](?<x)", &t),
              StatusCode::kInvalidArgument, {"PCRE2 refuses", "translated from"});
  Tokenizer a = make({}, {}, "a+|b");
  std::vector<int32_t> ids;
  check_error(a.encode("aac", &ids), StatusCode::kInvalidArgument,
              {"matches nothing at byte 2", "\"c\"", "must cover every character"});
  check_error(a.encode("xx<", &ids), StatusCode::kInvalidArgument, {"matches nothing at byte 0"});
  Tokenizer e = make({}, {}, "a*");
  check_error(e.encode("b", &ids), StatusCode::kInvalidArgument, {"matches empty text at byte 0"});
}

TEST_CASE("tokenizer: ids outside the vocabulary and invalid UTF-8 text are named") {
  Tokenizer t = make({"ab"}, {{"<|s|>", 300}});
  std::string bytes;
  check_error(t.decode(std::vector<int32_t>{97, 303}, &bytes), StatusCode::kInvalidArgument,
              {"decode: ids[1]", "token id 303", "outside the vocabulary [0, 301)"});
  check_error(t.decode(std::vector<int32_t>{-1}, &bytes), StatusCode::kInvalidArgument,
              {"token id -1", "outside"});
  check_error(t.decode(std::vector<int32_t>{280}, &bytes), StatusCode::kInvalidArgument,
              {"token id 280", "not in the vocabulary", "ranks 0..256"});
  StreamDecoder d(t);
  std::string out;
  check_error(d.feed(1000, &out), StatusCode::kInvalidArgument, {"stream decode", "token id 1000"});
  std::vector<int32_t> ids;
  check_error(t.encode("a\xC3(", &ids), StatusCode::kInvalidArgument,
              {"not valid UTF-8 at byte 1"});
  check_error(t.encode_ordinary("\xED\xA0\x80", &ids), StatusCode::kInvalidArgument,
              {"not valid UTF-8 at byte 0"});
  CHECK(t.rank_of("ab") == 256);
  CHECK_FALSE(t.rank_of("abc").has_value());
}

}  // namespace
