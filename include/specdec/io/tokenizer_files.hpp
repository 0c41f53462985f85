// The tokenizer's files without the tokenizer: what io/tokenizer.hpp reads, written here for
// random test checkpoints. Needs no PCRE2 (only the split, in tokenizer.hpp, does), so a build
// without it still writes a tokenizer that a build with it serves.
//
//   write_byte_level_tokenizer(dir, vocab_size)
//     dir/tiktoken.model         the 256 single bytes, "<base64 byte> <rank>", rank = byte value
//     dir/tokenizer_config.json  added_tokens_decoder: Kimi's 256-id special block moved to the
//                                top of [0, vocab_size) (byte_level_special_tokens), bos / eos /
//                                pad_token; no pat_str (Kimi's pattern)
//   byte_level_special_tokens(vocab_size) / kimi_named_special_tokens(): the special tokens.
// vocab_size in [512, 2^31 - 1]. Nothing here throws; errors are Status naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <ios>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "specdec/core/status.hpp"

namespace specdec::io {

struct SpecialToken {
  std::string content;  // e.g. "<|im_end|>"; non-empty, valid UTF-8
  int32_t id = 0;
};

namespace detail {

inline std::string base64_encode(std::string_view in) {
  char const* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    if (i + 2 < in.size()) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i + 2]));
    out += a[(v >> 18) & 63];
    out += a[(v >> 12) & 63];
    out += i + 1 < in.size() ? a[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? a[v & 63] : '=';
  }
  return out;
}

}  // namespace detail

// Kimi-K2.5's named special tokens at their ids (kimi.md "Tokenizer"; the block 163584..163839).
inline std::vector<SpecialToken> kimi_named_special_tokens() {
  return {{"[BOS]", 163584},
          {"[EOS]", 163585},
          {"<|im_end|>", 163586},
          {"<|im_user|>", 163587},
          {"<|im_assistant|>", 163588},
          {"<|im_system|>", 163594},
          {"<|im_middle|>", 163601},
          {"<think>", 163606},
          {"</think>", 163607},
          {"[PAD]", 163839}};
}

// The special tokens of write_byte_level_tokenizer for `vocab_size`: Kimi's 256-id special block
// moved to the top, id = kimi_id - 163840 + vocab_size (so vocab_size 163840 gives Kimi's own
// ids; 512: [BOS] 256, [EOS] 257, <|im_end|> 258, [PAD] 511), and every id in [256, vocab_size)
// without a named token as "<|reserved_token_<id>|>" (Kimi's name for its unused specials), so
// every id a random model emits decodes. vocab_size must be in [512, 2^31 - 1].
inline Status byte_level_special_tokens(int64_t vocab_size, std::vector<SpecialToken>* out) {
  constexpr int64_t kKimiVocab = 163840, kBlock = 256;
  if (vocab_size < 256 + kBlock || vocab_size > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(
        "byte-level tokenizer: vocab_size " + std::to_string(vocab_size) +
        " does not fit: it needs 256 byte ids + Kimi's 256-id special block, >= 512 (and < 2^31)");
  }
  out->clear();
  std::vector<std::string> names(static_cast<size_t>(vocab_size - 256));
  for (auto const& s : kimi_named_special_tokens()) {
    names[static_cast<size_t>(s.id - kKimiVocab + vocab_size - 256)] = s.content;
  }
  out->reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    int32_t const id = static_cast<int32_t>(256 + i);
    out->push_back(
        {names[i].empty() ? "<|reserved_token_" + std::to_string(id) + "|>" : names[i], id});
  }
  return Status::Ok();
}

// Writes dir/tiktoken.model (the 256 single bytes, rank = byte value) and
// dir/tokenizer_config.json (byte_level_special_tokens(vocab_size); no pat_str: Kimi's pattern),
// creating dir. Loads with Tokenizer::load into vocab_size() == vocab_size; text encodes one id
// per byte.
inline Status write_byte_level_tokenizer(std::filesystem::path const& dir, int64_t vocab_size) {
  std::vector<SpecialToken> specials;
  SPECDEC_RETURN_IF_ERROR(byte_level_special_tokens(vocab_size, &specials));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::InvalidArgument(dir.string() + ": cannot create: " + ec.message());
  std::string model;
  for (int b = 0; b < 256; ++b) {
    model += detail::base64_encode(std::string(1, static_cast<char>(b)));
    model += ' ' + std::to_string(b) + '\n';
  }
  std::string config = "{\n  \"added_tokens_decoder\": {\n";
  for (size_t i = 0; i < specials.size(); ++i) {
    config += "    \"" + std::to_string(specials[i].id) +
              "\": {\"content\": " + nlohmann::json(specials[i].content).dump() +
              ", \"special\": true}" + (i + 1 < specials.size() ? ",\n" : "\n");
  }
  config +=
      "  },\n  \"bos_token\": \"[BOS]\",\n  \"eos_token\": \"[EOS]\",\n"
      "  \"pad_token\": \"[PAD]\"\n}\n";
  auto const write = [&](char const* name, std::string const& text) {
    std::filesystem::path const path = dir / name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) return Status::InvalidArgument(path.string() + ": cannot open for writing");
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) return Status::InvalidArgument(path.string() + ": write error");
    return Status::Ok();
  };
  SPECDEC_RETURN_IF_ERROR(write("tiktoken.model", model));
  SPECDEC_RETURN_IF_ERROR(write("tokenizer_config.json", config));
  return Status::Ok();
}

}  // namespace specdec::io
