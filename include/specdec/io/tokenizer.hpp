// Tokenizer: tiktoken byte-level BPE (Kimi-K2.5's, OpenAI's cl100k_base / o200k_base), text <->
// token ids, identical to tiktoken's own encoder; plus Kimi's chat template and streaming decode.
//
// Directory (Tokenizer::load):
//   tiktoken.model          one token a line, "<base64 bytes> <rank>", rank = id; ranks exactly
//                           0..N-1, each once, each byte string once, all 256 single bytes present
//                           (empty lines and a trailing '\r' are ignored, like tiktoken's loader)
//   tokenizer_config.json   added_tokens_decoder {"<id>": {"content": "<|im_end|>", ...}}: the
//                           special tokens (every entry, like tokenization_kimi.py; ids >= N);
//                           optional "pat_str": the split pattern (tiktoken syntax), default
//                           kKimiPattern (tokenizer_pattern.hpp: how it is translated for PCRE2)
// Ids are int32_t in [0, vocab_size()), vocab_size() = max(N, largest special id + 1); ids between
// N and the specials that no special has are not in the vocabulary (decode names them).
//
// Encoding (text: valid UTF-8, else an error naming the byte):
//   encode            special tokens' texts are matched whole before the split, leftmost first,
//                     the longest at one position (tiktoken's encode(allowed_special="all"))
//   encode_ordinary   special texts are plain text (tiktoken's encode_ordinary)
//   Each piece of the split pattern that is a token maps to it; any other is byte-pair merged:
//   repeatedly merge the adjacent pair whose concatenation has the lowest rank, the leftmost of
//   equal ranks (tiktoken's _byte_pair_merge; pieces of kHeapMergeMin bytes or more use a heap
//   with the same order, O(n log n)).
// Decoding: decode (the bytes, exactly), decode_text (UTF-8, each maximal invalid subsequence one
// U+FFFD, as Python's errors="replace"), StreamDecoder (ids one by one -> complete UTF-8 text
// only; an incomplete multi-byte tail is held back until its bytes arrive or flush()).
// Chat (Kimi): render_kimi_chat / Tokenizer::encode_chat; stop_ids() = <|im_end|>, [EOS].
// write_byte_level_tokenizer (io/tokenizer_files.hpp, included here; it needs no PCRE2) writes a
// 256-byte vocabulary with Kimi's special tokens for random test checkpoints. Nothing here
// throws; errors are Status naming the file, line, id or byte.
// A loaded Tokenizer is immutable: encode / decode are const, keep no cache, and may run on many
// threads at once (each call allocates its own PCRE2 match data and JIT stack).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/io/json_text.hpp"
#include "specdec/io/tokenizer_files.hpp"
#include "specdec/io/tokenizer_pattern.hpp"

namespace specdec::io {

// A chat message; role "system" | "user" | "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

// Pieces this long or longer merge with the heap (same result as the linear scan; see the top).
// Evidence: cl100k_base's ranks, pieces of random letters, one core of a 2-core x86 host:
// linear / heap 102 / 111 ns per byte at 128 bytes, 124 / 114 at 192, 237 / 135 at 512.
inline constexpr size_t kHeapMergeMin = 192;

namespace detail {

inline constexpr uint32_t kNone = 0xFFFFFFFFu;

// The UTF-8 sequence at p[0..n), n >= 1: > 0 the length of a complete valid sequence; 0 a valid
// but incomplete prefix (n too short); < 0 minus the length of the maximal invalid subpart.
inline int utf8_step(unsigned char const* p, size_t n) {
  unsigned const c = p[0];
  if (c < 0x80) return 1;
  int need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= n) return 0;
    unsigned const b = p[k];
    if (b < lo || b > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

// The offset of the first byte that is not part of valid UTF-8, or npos.
inline size_t utf8_invalid_at(std::string_view s) {
  auto const* p = reinterpret_cast<unsigned char const*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    int const k = utf8_step(p + i, s.size() - i);
    if (k <= 0) return i;
    i += static_cast<size_t>(k);
  }
  return std::string_view::npos;
}

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends the complete UTF-8 of bytes[0..n) to *text, each maximal invalid subpart as U+FFFD;
// returns how many bytes it consumed: all but a trailing valid incomplete prefix when !final.
inline size_t utf8_emit(std::string_view bytes, bool final, std::string* text) {
  auto const* p = reinterpret_cast<unsigned char const*>(bytes.data());
  size_t i = 0, run = 0;  // [run, i): valid bytes not yet appended
  while (i < bytes.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    int const k = utf8_step(p + i, bytes.size() - i);
    if (k > 0) {
      i += static_cast<size_t>(k);
      continue;
    }
    text->append(bytes.substr(run, i - run));
    if (k == 0) {
      if (!final) return i;
      text->append(kReplacement);
      return bytes.size();
    }
    text->append(kReplacement);
    i += static_cast<size_t>(-k);
    run = i;
  }
  text->append(bytes.substr(run));
  return bytes.size();
}

// The n <= 8 bytes at p, little-endian in a word (zero above), without a memcpy call.
inline uint64_t load_upto8(unsigned char const* p, size_t n) {
  if (n >= 4) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + n - 4, 4);
    return uint64_t{lo} | (uint64_t{hi} << (8 * (n - 4)));
  }
  if (n == 0) return 0;
  return uint64_t{p[0]} | (uint64_t{p[n >> 1]} << (8 * (n >> 1))) |
         (uint64_t{p[n - 1]} << (8 * (n - 1)));
}

inline uint64_t hash_bytes(std::string_view s) {
  auto const* p = reinterpret_cast<unsigned char const*>(s.data());
  size_t const n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  size_t i = 0;
  for (; i + 8 < n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  h = (h ^ load_upto8(p + i, n - i)) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 32);
}

// Byte string -> value (open addressing, linear probing; keys live in one arena). A slot holds
// the hash's high 32 bits beside the entry index, so a probe that misses reads only the slots.
// Entry i is the i-th inserted key: key(i) gives it back.
class ByteStringMap {
 public:
  void reserve(size_t n) {
    entries_.reserve(n);
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    if (cap > slots_.size()) rehash(cap);
  }
  size_t size() const { return entries_.size(); }

  // kNone if the key is present (the map is unchanged), else the new entry's index.
  uint32_t insert(std::string_view key, uint32_t value) {
    if (2 * (entries_.size() + 1) > slots_.size()) rehash(std::max<size_t>(16, 2 * slots_.size()));
    if (find_entry(key) != kNone) return kNone;
    uint32_t const index = static_cast<uint32_t>(entries_.size());
    entries_.push_back({static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()),
                        value, head(key)});
    arena_.append(key);
    place(hash_bytes(key), index);
    return index;
  }

  // The entry index of `key`, or kNone.
  uint32_t find_entry(std::string_view key) const {
    if (slots_.empty()) return kNone;
    uint64_t const h = hash_bytes(key);
    uint64_t const tag = h & 0xFFFFFFFF00000000ull;
    uint64_t const first = head(key);
    size_t slot = static_cast<size_t>(h) & mask_;
    while (uint64_t const s = slots_[slot]) {
      if ((s & 0xFFFFFFFF00000000ull) == tag) {
        uint32_t const index = static_cast<uint32_t>(s) - 1;
        Entry const& e = entries_[index];
        if (e.length == key.size() && e.head == first &&
            (key.size() <= 8 ||
             std::memcmp(arena_.data() + e.offset + 8, key.data() + 8, key.size() - 8) == 0)) {
          return index;
        }
      }
      slot = (slot + 1) & mask_;
    }
    return kNone;
  }
  // The value of `key`, or kNone.
  uint32_t find(std::string_view key) const {
    uint32_t const i = find_entry(key);
    return i == kNone ? kNone : entries_[i].value;
  }
  std::string_view key(uint32_t entry) const { return key_of(entries_[entry]); }
  uint32_t value(uint32_t entry) const { return entries_[entry].value; }

 private:
  struct Entry {
    uint32_t offset, length, value;
    uint64_t head;  // the first (up to) 8 bytes
  };
  static uint64_t head(std::string_view key) {
    return load_upto8(reinterpret_cast<unsigned char const*>(key.data()),
                      std::min<size_t>(key.size(), 8));
  }
  std::string_view key_of(Entry const& e) const { return {arena_.data() + e.offset, e.length}; }
  void place(uint64_t h, uint32_t index) {
    size_t slot = static_cast<size_t>(h) & mask_;
    while (slots_[slot] != 0) slot = (slot + 1) & mask_;
    slots_[slot] = (h & 0xFFFFFFFF00000000ull) | (uint64_t{index} + 1);
  }
  void rehash(size_t cap) {
    slots_.assign(cap, 0);
    mask_ = cap - 1;
    for (size_t i = 0; i < entries_.size(); ++i) {
      place(hash_bytes(key_of(entries_[i])), static_cast<uint32_t>(i));
    }
  }

  std::string arena_;
  std::vector<Entry> entries_;
  std::vector<uint64_t> slots_;  // (hash >> 32) << 32 | (entry index + 1); 0 empty
  size_t mask_ = 0;
};

// tiktoken's _byte_pair_merge, as written there: parts[i] = (start, rank of the pair starting at
// parts[i]); merge the lowest rank (leftmost of equals) until no pair is a token. Appends the
// ranks of the final parts of `piece` (2+ bytes) to *out; `parts` is scratch.
inline void bpe_merge_linear(ByteStringMap const& ranks, std::string_view piece,
                             std::vector<std::pair<uint32_t, uint32_t>>& parts,
                             std::vector<int32_t>* out) {
  size_t const n = piece.size();
  parts.clear();
  uint32_t min_rank = kNone;
  size_t min_i = 0;
  for (size_t i = 0; i + 1 < n; ++i) {
    uint32_t const r = ranks.find(piece.substr(i, 2));
    if (r < min_rank) min_rank = r, min_i = i;
    parts.emplace_back(static_cast<uint32_t>(i), r);
  }
  parts.emplace_back(static_cast<uint32_t>(n - 1), kNone);
  parts.emplace_back(static_cast<uint32_t>(n), kNone);
  auto const rank_at = [&](size_t i) {
    if (i + 3 >= parts.size()) return kNone;
    return ranks.find(piece.substr(parts[i].first, parts[i + 3].first - parts[i].first));
  };
  while (min_rank != kNone) {
    size_t const i = min_i;
    if (i > 0) parts[i - 1].second = rank_at(i - 1);
    parts[i].second = rank_at(i);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    min_rank = kNone;
    for (size_t j = 0; j + 1 < parts.size(); ++j) {
      if (parts[j].second < min_rank) min_rank = parts[j].second, min_i = j;
    }
  }
  for (size_t j = 0; j + 1 < parts.size(); ++j) {
    out->push_back(static_cast<int32_t>(
        ranks.find(piece.substr(parts[j].first, parts[j + 1].first - parts[j].first))));
  }
}

// The same merges in the same order with a min-heap of (rank, start, end) over a linked list of
// parts: O(n log n) for long pieces. A heap entry is current while the part starting at `start`
// is alive and it and its right neighbour end at `end` (the bytes, hence the rank, are fixed).
inline void bpe_merge_heap(ByteStringMap const& ranks, std::string_view piece,
                           std::vector<int32_t>* out) {
  using Entry = std::tuple<uint32_t, uint32_t, uint32_t>;  // rank, start, end
  uint32_t const n = static_cast<uint32_t>(piece.size());
  std::vector<uint32_t> end(n), prev(n);  // by start; end[s] == 0: s is merged away
  for (uint32_t i = 0; i < n; ++i) end[i] = i + 1, prev[i] = i - 1;  // prev[0]: unused
  std::vector<Entry> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(std::greater<Entry>(),
                                                                           std::move(heap_storage));
  auto const push = [&](uint32_t s, uint32_t e) {
    uint32_t const r = ranks.find(piece.substr(s, e - s));
    if (r != kNone) heap.emplace(r, s, e);
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i, i + 2);
  while (!heap.empty()) {
    auto const [r, s, e] = heap.top();
    heap.pop();
    (void)r;
    if (end[s] == 0 || end[s] >= e) continue;
    uint32_t const mid = end[s];
    if (end[mid] != e) continue;
    end[s] = e;
    end[mid] = 0;
    if (e < n) prev[e] = s;
    if (s > 0) push(prev[s], e);
    if (e < n) push(s, end[e]);
  }
  for (uint32_t s = 0; s < n; s = end[s]) {
    out->push_back(static_cast<int32_t>(ranks.find(piece.substr(s, end[s] - s))));
  }
}

inline std::string quote_bytes(std::string_view s, size_t max = 40) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    unsigned char const c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == '"' || c == '\\' || c >= 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max) out += "...";
  return out + "\"";
}

// Strict standard base64 (RFC 4648 alphabet, '=' padding to a multiple of 4).
inline bool base64_decode(std::string_view in, std::string* out) {
  static constexpr auto kTable = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    char const* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(a[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = in[in.size() - 2] == '=' ? 2 : 1;
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    bool const last = i + 4 == in.size();
    for (size_t k = 0; k < 4; ++k) {
      char const c = in[i + k];
      int d = 0;
      if (last && k >= 4 - pad) {
        if (c != '=') return false;
      } else {
        d = kTable[static_cast<unsigned char>(c)];
        if (d < 0) return false;
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out->push_back(static_cast<char>(v >> 16));
    if (!last || pad < 2) out->push_back(static_cast<char>((v >> 8) & 0xFF));
    if (!last || pad < 1) out->push_back(static_cast<char>(v & 0xFF));
  }
  return true;
}

inline Status read_text_file(std::filesystem::path const& path, std::string_view what,
                             std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::InvalidArgument(path.string() + ": cannot open " + std::string(what) +
                                   " (missing or unreadable)");
  }
  text->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::InvalidArgument(path.string() + ": read error");
  return Status::Ok();
}

}  // namespace detail

// Parses tiktoken.model text into tokens[rank] (`file` names it in errors).
inline Status parse_tiktoken_model(std::string_view text, std::string const& file,
                                   std::vector<std::string>* tokens) {
  size_t lines = 0;
  for (size_t i = 0; i < text.size();) {
    size_t const nl = text.find('\n', i);
    size_t const stop = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(i, stop - i);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) ++lines;
    i = stop + 1;
  }
  if (lines == 0) return Status::MalformedInput(file + ": no tokens (an empty file)");
  if (lines > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::MalformedInput(file + ": " + std::to_string(lines) + " tokens: too many");
  }
  std::vector<std::string> by_rank(lines);
  std::vector<uint32_t> line_of(lines, 0);
  detail::ByteStringMap seen;
  seen.reserve(lines);
  std::string bytes;
  size_t line_no = 0;
  for (size_t i = 0; i < text.size();) {
    size_t const nl = text.find('\n', i);
    size_t const stop = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(i, stop - i);
    i = stop + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    std::string const where = file + " line " + std::to_string(line_no) + ": ";
    size_t const sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
      return Status::MalformedInput(where + "expected \"<base64 bytes> <rank>\", got " +
                                    detail::quote_bytes(line));
    }
    std::string_view const b64 = line.substr(0, sp), rank_text = line.substr(sp + 1);
    if (!detail::base64_decode(b64, &bytes)) {
      return Status::MalformedInput(where + "malformed base64 " + detail::quote_bytes(b64));
    }
    uint64_t rank = 0;
    bool digits = !rank_text.empty() && rank_text.size() <= 10;
    for (char c : rank_text) {
      if (c < '0' || c > '9') digits = false;
      if (digits) rank = rank * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!digits) {
      return Status::MalformedInput(where + "rank " + detail::quote_bytes(rank_text) +
                                    " is not a non-negative integer");
    }
    if (rank >= lines) {
      return Status::MalformedInput(where + "rank " + std::to_string(rank) + " outside 0.." +
                                    std::to_string(lines - 1) + ": the file's " +
                                    std::to_string(lines) +
                                    " tokens must have the contiguous ranks 0..N-1 (rank = id)");
    }
    if (line_of[rank] != 0) {
      return Status::MalformedInput(where + "duplicate rank " + std::to_string(rank) +
                                    " (first on line " + std::to_string(line_of[rank]) + ")");
    }
    uint32_t const entry = seen.insert(bytes, static_cast<uint32_t>(rank));
    if (entry == detail::kNone) {
      uint32_t const other = seen.find(bytes);
      return Status::MalformedInput(where + "token " + detail::quote_bytes(bytes) + " (base64 " +
                                    std::string(b64) + ") already has rank " +
                                    std::to_string(other) + " (line " +
                                    std::to_string(line_of[other]) + ")");
    }
    line_of[rank] = static_cast<uint32_t>(line_no);
    by_rank[rank] = bytes;
  }
  *tokens = std::move(by_rank);
  return Status::Ok();
}

// Parses tokenizer_config.json text: added_tokens_decoder -> *specials (sorted by id), "pat_str"
// -> *pat_str (empty optional when absent).
inline Status parse_tokenizer_config(std::string_view text, std::string const& file,
                                     std::vector<SpecialToken>* specials,
                                     std::optional<std::string>* pat_str) {
  using nlohmann::json;
  json j;
  SPECDEC_RETURN_IF_ERROR(parse_json_no_duplicates(text, file, &j));
  if (!j.is_object()) return Status::MalformedInput(file + ": not a JSON object");
  specials->clear();
  pat_str->reset();
  if (auto it = j.find("pat_str"); it != j.end()) {
    if (!it->is_string() || it->get_ref<std::string const&>().empty()) {
      return Status::MalformedInput(file + ": \"pat_str\" must be a non-empty string, got " +
                                    it->dump());
    }
    *pat_str = it->get<std::string>();
  }
  auto it = j.find("added_tokens_decoder");
  if (it == j.end()) return Status::Ok();
  if (!it->is_object()) {
    return Status::MalformedInput(file + ": \"added_tokens_decoder\" must be an object");
  }
  for (auto const& [key, value] : it->items()) {
    std::string const where = file + ": added_tokens_decoder[\"" + key + "\"]";
    int64_t id = 0;
    bool ok = !key.empty() && key.size() <= 10;
    for (char c : key) {
      if (c < '0' || c > '9') ok = false;
      if (ok) id = id * 10 + (c - '0');
    }
    if (!ok || id > std::numeric_limits<int32_t>::max()) {
      return Status::MalformedInput(where + ": the key is not a token id (a non-negative integer)");
    }
    if (!value.is_object()) return Status::MalformedInput(where + ": not an object");
    auto c = value.find("content");
    if (c == value.end() || !c->is_string() || c->get_ref<std::string const&>().empty()) {
      return Status::MalformedInput(where + ": \"content\" must be a non-empty string");
    }
    if (auto s = value.find("special"); s != value.end() && !s->is_boolean()) {
      return Status::MalformedInput(where + ": \"special\" must be true or false");
    }
    specials->push_back({c->get<std::string>(), static_cast<int32_t>(id)});
  }
  std::sort(specials->begin(), specials->end(),
            [](SpecialToken const& a, SpecialToken const& b) { return a.id < b.id; });
  return Status::Ok();
}

class Tokenizer {
 public:
  Tokenizer() = default;

  // Builds from tokens[rank] (the mergeable byte strings), special tokens (ids >= tokens.size())
  // and a split pattern (tiktoken syntax). use_jit false: PCRE2's interpreter (tests).
  static Status build(std::vector<std::string> const& tokens,
                      std::vector<SpecialToken> const& specials, std::string_view pattern,
                      Tokenizer* out, bool use_jit = true) {
    if (out == nullptr) return Status::InvalidArgument("Tokenizer::build: out is null");
    Tokenizer t;
    if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return Status::InvalidArgument("tokenizer: " + std::to_string(tokens.size()) +
                                     " tokens: too many for int32 ids");
    }
    t.num_ranks_ = static_cast<int32_t>(tokens.size());
    t.ranks_.reserve(tokens.size());
    for (size_t r = 0; r < tokens.size(); ++r) {
      if (tokens[r].empty()) {
        return Status::MalformedInput("tokenizer: rank " + std::to_string(r) + " is empty bytes");
      }
      if (t.ranks_.insert(tokens[r], static_cast<uint32_t>(r)) == detail::kNone) {
        return Status::MalformedInput(
            "tokenizer: token " + detail::quote_bytes(tokens[r]) + " has two ranks: " +
            std::to_string(t.ranks_.find(tokens[r])) + " and " + std::to_string(r));
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (t.ranks_.find(std::string(1, static_cast<char>(b))) == detail::kNone) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "0x%02x", b);
        return Status::MalformedInput(std::string("tokenizer: no token for the byte ") + buf +
                                      ": byte-level BPE needs all 256 single bytes");
      }
    }
    int64_t vocab = t.num_ranks_;
    t.specials_.reserve(specials.size());
    t.special_ids_.reserve(specials.size());
    for (auto const& s : specials) {
      std::string const what = "tokenizer: special token " + detail::quote_bytes(s.content) +
                               " (id " + std::to_string(s.id) + ")";
      if (s.id < t.num_ranks_) {
        return Status::MalformedInput(what + " collides with rank " + std::to_string(s.id) +
                                      " of the BPE tokens (ranks 0.." +
                                      std::to_string(t.num_ranks_ - 1) + ")");
      }
      if (s.id == std::numeric_limits<int32_t>::max()) {
        return Status::MalformedInput(what + ": ids must be below 2^31 - 1");
      }
      if (s.content.empty()) return Status::MalformedInput(what + ": empty content");
      if (size_t const bad = detail::utf8_invalid_at(s.content); bad != std::string_view::npos) {
        return Status::MalformedInput(what + ": content is not valid UTF-8 at byte " +
                                      std::to_string(bad));
      }
      uint32_t const entry = t.specials_.insert(s.content, static_cast<uint32_t>(s.id));
      if (entry == detail::kNone) {
        return Status::MalformedInput(what + ": content already has id " +
                                      std::to_string(t.specials_.find(s.content)));
      }
      t.special_ids_.emplace_back(s.id, entry);
      t.special_first_byte_[static_cast<unsigned char>(s.content[0])] = true;
      t.special_lengths_.push_back(s.content.size());
      vocab = std::max<int64_t>(vocab, int64_t{s.id} + 1);
    }
    std::sort(t.special_ids_.begin(), t.special_ids_.end());
    for (size_t i = 1; i < t.special_ids_.size(); ++i) {
      if (t.special_ids_[i].first == t.special_ids_[i - 1].first) {
        return Status::MalformedInput(
            "tokenizer: special tokens " +
            detail::quote_bytes(t.specials_.key(t.special_ids_[i - 1].second)) + " and " +
            detail::quote_bytes(t.specials_.key(t.special_ids_[i].second)) + " share the id " +
            std::to_string(t.special_ids_[i].first));
      }
    }
    std::sort(t.special_lengths_.begin(), t.special_lengths_.end(), std::greater<>());
    t.special_lengths_.erase(std::unique(t.special_lengths_.begin(), t.special_lengths_.end()),
                             t.special_lengths_.end());
    t.vocab_size_ = static_cast<int32_t>(vocab);
    SPECDEC_RETURN_IF_ERROR(SplitPattern::compile(pattern, &t.pattern_, use_jit));
    *out = std::move(t);
    return Status::Ok();
  }

  // Loads dir/tiktoken.model and dir/tokenizer_config.json (see the top of this file).
  static Status load(std::filesystem::path const& dir, Tokenizer* out, bool use_jit = true) {
    if (out == nullptr) return Status::InvalidArgument("Tokenizer::load: out is null");
    std::string text;
    std::vector<std::string> tokens;
    std::filesystem::path const model = dir / "tiktoken.model";
    SPECDEC_RETURN_IF_ERROR(detail::read_text_file(model, "the tokenizer's ranks", &text));
    SPECDEC_RETURN_IF_ERROR(parse_tiktoken_model(text, model.string(), &tokens));
    std::filesystem::path const config = dir / "tokenizer_config.json";
    SPECDEC_RETURN_IF_ERROR(detail::read_text_file(config, "the tokenizer config", &text));
    std::vector<SpecialToken> specials;
    std::optional<std::string> pat;
    SPECDEC_RETURN_IF_ERROR(parse_tokenizer_config(text, config.string(), &specials, &pat));
    return build(tokens, specials, pat ? std::string_view(*pat) : kKimiPattern, out, use_jit)
        .prefixed(dir.string() + ": ");
  }

  int32_t vocab_size() const { return vocab_size_; }
  int32_t num_ranks() const { return num_ranks_; }  // mergeable tokens: ids 0..num_ranks()-1
  size_t num_special() const { return specials_.size(); }
  SplitPattern const& pattern() const { return pattern_; }

  // The id of a special token's text, e.g. "<|im_end|>".
  std::optional<int32_t> special_id(std::string_view content) const {
    uint32_t const id = specials_.find(content);
    return id == detail::kNone ? std::nullopt : std::optional<int32_t>(static_cast<int32_t>(id));
  }
  bool is_special(int32_t id) const { return special_entry(id) != detail::kNone; }
  // The rank of a byte string that is one mergeable token (tiktoken's encode_single_token).
  std::optional<int32_t> rank_of(std::string_view bytes) const {
    uint32_t const r = ranks_.find(bytes);
    return r == detail::kNone ? std::nullopt : std::optional<int32_t>(static_cast<int32_t>(r));
  }
  // The ids generation stops at: <|im_end|> and [EOS], those present, in that order.
  std::vector<int32_t> stop_ids() const {
    std::vector<int32_t> ids;
    for (std::string_view s : {"<|im_end|>", "[EOS]"}) {
      if (auto id = special_id(s)) ids.push_back(*id);
    }
    return ids;
  }

  // The bytes of one id (a special token: its text).
  Status token_bytes(int32_t id, std::string_view* bytes) const {
    if (id >= 0 && id < num_ranks_) {
      *bytes = ranks_.key(static_cast<uint32_t>(id));
      return Status::Ok();
    }
    if (id >= num_ranks_ && id < vocab_size_) {
      uint32_t const s = special_entry(id);
      if (s != detail::kNone) {
        *bytes = specials_.key(s);
        return Status::Ok();
      }
      return Status::InvalidArgument("token id " + std::to_string(id) +
                                     " is not in the vocabulary: no token has it (ranks 0.." +
                                     std::to_string(num_ranks_ - 1) + ", " +
                                     std::to_string(specials_.size()) + " special tokens below " +
                                     std::to_string(vocab_size_) + ")");
    }
    return Status::InvalidArgument("token id " + std::to_string(id) +
                                   " is outside the vocabulary [0, " + std::to_string(vocab_size_) +
                                   ")");
  }

  // Text -> ids with special tokens matched (tiktoken encode(allowed_special="all")).
  Status encode(std::string_view text, std::vector<int32_t>* ids) const {
    return encode_impl(text, /*specials=*/true, ids);
  }
  // Text -> ids, special tokens' texts encoded as plain text (tiktoken encode_ordinary).
  Status encode_ordinary(std::string_view text, std::vector<int32_t>* ids) const {
    return encode_impl(text, /*specials=*/false, ids);
  }

  // Ids -> their bytes, concatenated (may end inside a UTF-8 character).
  Status decode(std::span<int32_t const> ids, std::string* bytes) const {
    bytes->clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      std::string_view b;
      if (ids[i] >= 0 && ids[i] < num_ranks_) {
        b = ranks_.key(static_cast<uint32_t>(ids[i]));
      } else if (Status s = token_bytes(ids[i], &b); !s.ok()) {
        return s.prefixed("decode: ids[" + std::to_string(i) + "]: ");
      }
      bytes->append(b);
    }
    return Status::Ok();
  }
  // Ids -> UTF-8 text, each maximal invalid byte sequence as U+FFFD.
  Status decode_text(std::span<int32_t const> ids, std::string* text) const {
    std::string bytes;
    SPECDEC_RETURN_IF_ERROR(decode(ids, &bytes));
    text->clear();
    detail::utf8_emit(bytes, /*final=*/true, text);
    return Status::Ok();
  }

  // Kimi's chat template, tokenized: the markers as special ids, roles and contents with
  // encode_ordinary (so a message cannot inject a special token; for contents without special
  // texts the ids equal encode(render_kimi_chat(...))).
  Status encode_chat(std::span<ChatMessage const> messages, bool add_generation_prompt,
                     std::vector<int32_t>* ids) const;

 private:
  // The specials_ entry of a special token's id, or kNone.
  uint32_t special_entry(int32_t id) const {
    auto it = std::lower_bound(special_ids_.begin(), special_ids_.end(),
                               std::pair<int32_t, uint32_t>(id, 0));
    return it != special_ids_.end() && it->first == id ? it->second : detail::kNone;
  }

  Status encode_impl(std::string_view text, bool with_specials, std::vector<int32_t>* ids) const {
    if (ids == nullptr) return Status::InvalidArgument("encode: ids is null");
    ids->clear();
    if (!pattern_.compiled()) return Status::InvalidArgument("encode: the tokenizer is not loaded");
    if (size_t const bad = detail::utf8_invalid_at(text); bad != std::string_view::npos) {
      return Status::InvalidArgument("encode: the text is not valid UTF-8 at byte " +
                                     std::to_string(bad) + " (" +
                                     detail::quote_bytes(text.substr(bad, 4)) + ")");
    }
    std::vector<std::pair<uint32_t, uint32_t>> parts;
    size_t start = 0;
    while (true) {
      size_t pos = text.size(), len = 0;
      uint32_t special = detail::kNone;
      if (with_specials && specials_.size() > 0) find_special(text, start, &pos, &len, &special);
      SPECDEC_RETURN_IF_ERROR(encode_segment(text.substr(start, pos - start), parts, ids)
                                  .prefixed("encode: at byte " + std::to_string(start) + ": "));
      if (special == detail::kNone) break;
      ids->push_back(static_cast<int32_t>(special));
      start = pos + len;
    }
    return Status::Ok();
  }

  // The leftmost special text at or after `from` (the longest there): *pos, *len, *id.
  void find_special(std::string_view text, size_t from, size_t* pos, size_t* len,
                    uint32_t* id) const {
    auto const* p = reinterpret_cast<unsigned char const*>(text.data());
    for (size_t i = from; i < text.size(); ++i) {
      if (!special_first_byte_[p[i]]) continue;
      for (size_t l : special_lengths_) {
        if (l > text.size() - i) continue;
        uint32_t const v = specials_.find(text.substr(i, l));
        if (v != detail::kNone) {
          *pos = i, *len = l, *id = v;
          return;
        }
      }
    }
  }

  Status encode_segment(std::string_view segment, std::vector<std::pair<uint32_t, uint32_t>>& parts,
                        std::vector<int32_t>* ids) const {
    return pattern_.split(segment, [&](std::string_view piece) {
      uint32_t const r = ranks_.find(piece);
      if (r != detail::kNone) {
        ids->push_back(static_cast<int32_t>(r));
      } else if (piece.size() < kHeapMergeMin) {
        detail::bpe_merge_linear(ranks_, piece, parts, ids);
      } else {
        detail::bpe_merge_heap(ranks_, piece, ids);
      }
    });
  }

  detail::ByteStringMap ranks_;                            // bytes -> rank; entry r is rank r
  detail::ByteStringMap specials_;                         // content -> id
  std::vector<std::pair<int32_t, uint32_t>> special_ids_;  // (id, specials_ entry), by id
  std::array<bool, 256> special_first_byte_{};
  std::vector<size_t> special_lengths_;  // distinct, longest first
  int32_t num_ranks_ = 0;
  int32_t vocab_size_ = 0;
  SplitPattern pattern_;
};

// Kimi's chat template as text: per message <|im_system|> | <|im_user|> | <|im_assistant|>, the
// role, <|im_middle|>, the content, <|im_end|>; then, with add_generation_prompt,
// <|im_assistant|>assistant<|im_middle|>. No default system prompt is added.
inline Status render_kimi_chat(std::span<ChatMessage const> messages, bool add_generation_prompt,
                               std::string* text) {
  text->clear();
  for (size_t i = 0; i < messages.size(); ++i) {
    ChatMessage const& m = messages[i];
    char const* marker = m.role == "system"      ? "<|im_system|>"
                         : m.role == "user"      ? "<|im_user|>"
                         : m.role == "assistant" ? "<|im_assistant|>"
                                                 : nullptr;
    if (marker == nullptr) {
      return Status::InvalidArgument("chat message " + std::to_string(i) + ": role " +
                                     detail::quote_bytes(m.role) +
                                     " is not one of system, user, assistant");
    }
    *text += marker;
    *text += m.role;
    *text += "<|im_middle|>";
    *text += m.content;
    *text += "<|im_end|>";
  }
  if (add_generation_prompt) *text += "<|im_assistant|>assistant<|im_middle|>";
  return Status::Ok();
}

inline Status Tokenizer::encode_chat(std::span<ChatMessage const> messages,
                                     bool add_generation_prompt, std::vector<int32_t>* ids) const {
  if (ids == nullptr) return Status::InvalidArgument("encode_chat: ids is null");
  ids->clear();
  auto const need = [&](std::string_view s, int32_t* id) {
    auto v = special_id(s);
    if (!v) {
      return Status::InvalidArgument("encode_chat: the tokenizer has no special token " +
                                     std::string(s) + " (Kimi's chat template needs it)");
    }
    *id = *v;
    return Status::Ok();
  };
  int32_t im_system = 0, im_user = 0, im_assistant = 0, im_middle = 0, im_end = 0;
  SPECDEC_RETURN_IF_ERROR(need("<|im_system|>", &im_system));
  SPECDEC_RETURN_IF_ERROR(need("<|im_user|>", &im_user));
  SPECDEC_RETURN_IF_ERROR(need("<|im_assistant|>", &im_assistant));
  SPECDEC_RETURN_IF_ERROR(need("<|im_middle|>", &im_middle));
  SPECDEC_RETURN_IF_ERROR(need("<|im_end|>", &im_end));
  std::vector<int32_t> part;
  auto const append = [&](std::string_view s, std::string const& what) {
    SPECDEC_RETURN_IF_ERROR(encode_ordinary(s, &part).prefixed(what));
    ids->insert(ids->end(), part.begin(), part.end());
    return Status::Ok();
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    ChatMessage const& m = messages[i];
    int32_t const marker = m.role == "system"      ? im_system
                           : m.role == "user"      ? im_user
                           : m.role == "assistant" ? im_assistant
                                                   : -1;
    std::string const what = "chat message " + std::to_string(i) + ": ";
    if (marker < 0) {
      return Status::InvalidArgument(what + "role " + detail::quote_bytes(m.role) +
                                     " is not one of system, user, assistant");
    }
    ids->push_back(marker);
    SPECDEC_RETURN_IF_ERROR(append(m.role, what));
    ids->push_back(im_middle);
    SPECDEC_RETURN_IF_ERROR(append(m.content, what + "content: "));
    ids->push_back(im_end);
  }
  if (add_generation_prompt) {
    ids->push_back(im_assistant);
    SPECDEC_RETURN_IF_ERROR(append("assistant", "generation prompt: "));
    ids->push_back(im_middle);
  }
  return Status::Ok();
}

// Streaming detokenization: feed ids one at a time; each call appends only complete UTF-8 text
// (bytes that can never be valid as U+FFFD) and holds back an incomplete multi-byte tail (at most
// 3 bytes) until the ids completing it arrive; flush() ends the stream (a held tail -> U+FFFD).
// Over any id sequence, the concatenated output equals decode_text of the whole sequence.
// skip_special: special tokens (e.g. <|im_end|>) emit nothing. The tokenizer must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer const& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  Status feed(int32_t id, std::string* text) {
    std::string_view bytes;
    if (Status s = tokenizer_->token_bytes(id, &bytes); !s.ok()) {
      return s.prefixed("stream decode: ");
    }
    if (skip_special_ && tokenizer_->is_special(id)) return Status::Ok();
    pending_.append(bytes);
    size_t const used = detail::utf8_emit(pending_, /*final=*/false, text);
    pending_.erase(0, used);
    return Status::Ok();
  }
  void flush(std::string* text) {
    detail::utf8_emit(pending_, /*final=*/true, text);
    pending_.clear();
  }
  size_t pending() const { return pending_.size(); }  // bytes held back

 private:
  Tokenizer const* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace specdec::io
