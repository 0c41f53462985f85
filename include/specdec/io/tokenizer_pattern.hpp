// SplitPattern: the pre-tokenizer split of tiktoken BPE. A regular expression written for
// tiktoken (Rust's regex / fancy-regex syntax) is translated for PCRE2 and compiled 8-bit, UTF +
// UCP, anchored, and JIT-compiled where PCRE2 has a JIT (jit() says whether it runs; jit_error()
// says why not). split(text, f) calls f(piece) for consecutive matches that cover all of `text`
// (valid UTF-8): the pieces tiktoken's find_iter yields. A pattern that leaves text unmatched
// (which tiktoken would silently drop) or matches empty text is an error at split time naming the
// byte.
//
// translate_tiktoken_pattern rewrites what PCRE2 reads differently, every other construct passes
// through unchanged:
//   class set operations  [A&&B] intersection, [A--B] difference (Rust regex). PCRE2 has no set
//                         operations before 10.45 (and then only under an option): it reads "&&["
//                         as literal characters and closes the class early, a different pattern
//                         and no error. One character of the set, with a lookahead:
//                           [A&&[^B]] -> (?:(?![B])[A])     [A&&B] -> (?:(?=B)[A])
//                           [A--B]    -> (?:(?!B)[A])       ~~ (symmetric difference): kUnsupported
//                         Kimi: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
//                           ->  (?:(?![\p{sc:Han}])[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])
//   nested classes        [a[bc]] (a union in Rust) -> (?:[a]|[bc]); a negated class holding one
//                         of the above -> (?:(?!X)(?s:.)), X the positive set.
//   \p{Script}, \P{...}   Rust: the Script property. PCRE2 >= 10.40: Script_Extensions, which puts
//                         CJK punctuation ("。", "，", "「") in \p{Han}, so Kimi's [\p{Han}]+ would
//                         swallow it. A name PCRE2 knows as a script becomes \p{sc:Name}.
// Not translated (no tokenizer we know uses them): \w \b (different Unicode sets), $ (Rust: end of
// text only), \u escapes. PCRE2 10.42 has Unicode 14 tables: characters assigned later are
// unassigned to it (\p{L} misses them) where tiktoken's Rust tables know them.
//
// kKimiPattern is Kimi-K2 / K2.5's pat_str (tokenization_kimi.py) verbatim, in tiktoken syntax.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"

namespace specdec::io {

// Kimi-K2.5's split pattern: alternatives in order (kimi.md "Tokenizer").
inline constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

namespace detail {

// PCRE2's message for an error code.
inline std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int const n = pcre2_get_error_message(code, buf, sizeof(buf));
  if (n < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<char const*>(buf), static_cast<size_t>(n));
}

// Whether PCRE2 knows `name` as a script (\p{sc:name} compiles).
inline bool pcre2_is_script(std::string_view name) {
  if (name.empty() || name.find_first_of(":=") != std::string_view::npos) return false;
  std::string const probe = "\\p{sc:" + std::string(name) + "}";
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(probe.data()), probe.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (code == nullptr) return false;
  pcre2_code_free(code);
  return true;
}

// One character of a set, in PCRE2 syntax: `[body]` / `[^body]` while `simple`, else `expr`.
struct CharSet {
  bool simple = true;
  bool negated = false;
  std::string body;
  std::string expr;

  std::string pcre2() const { return simple ? (negated ? "[^" : "[") + body + "]" : expr; }
  // A lookahead that holds where the next character is in the set (want) or is not (!want).
  std::string lookahead(bool want) const {
    if (simple && negated) return (want ? "(?![" : "(?=[") + body + "])";
    return (want ? "(?=" : "(?!") + pcre2() + ")";
  }
};

class PatternTranslator {
 public:
  explicit PatternTranslator(std::string_view pat) : pat_(pat) {}

  Status run(std::string* out) {
    std::string res;
    while (pos_ < pat_.size()) {
      char const c = pat_[pos_];
      if (c == '\\') {
        SPECDEC_RETURN_IF_ERROR(escape(&res));
      } else if (c == '[') {
        CharSet set;
        SPECDEC_RETURN_IF_ERROR(char_class(&set));
        res += set.pcre2();
      } else {
        res += c;
        ++pos_;
      }
    }
    *out = std::move(res);
    return Status::Ok();
  }

 private:
  Status error(StatusCode code, size_t at, std::string const& what) const {
    return Status(code, "split pattern: " + what + " at offset " + std::to_string(at) + " of \"" +
                            std::string(pat_) + "\"");
  }

  // At '\\': appends the escape, translated (\p{Script} -> \p{sc:Script}); \Q..\E verbatim.
  Status escape(std::string* res) {
    size_t const start = pos_;
    if (pos_ + 1 >= pat_.size()) return error(StatusCode::kMalformedInput, start, "trailing '\\'");
    char const e = pat_[pos_ + 1];
    if (e == 'Q') {
      size_t const end = pat_.find("\\E", pos_ + 2);
      size_t const stop = end == std::string_view::npos ? pat_.size() : end + 2;
      res->append(pat_.substr(pos_, stop - pos_));
      pos_ = stop;
      return Status::Ok();
    }
    if ((e == 'p' || e == 'P') && pos_ + 2 < pat_.size()) {
      std::string_view name;
      size_t stop = 0;
      if (pat_[pos_ + 2] == '{') {
        size_t const close = pat_.find('}', pos_ + 3);
        if (close == std::string_view::npos) {
          return error(StatusCode::kMalformedInput, start, "unterminated \\p{");
        }
        name = pat_.substr(pos_ + 3, close - pos_ - 3);
        stop = close + 1;
      } else {
        name = pat_.substr(pos_ + 2, 1);
        stop = pos_ + 3;
      }
      if (name.size() > 1 && pcre2_is_script(name)) {
        *res += '\\';
        *res += e;
        *res += "{sc:" + std::string(name) + "}";
      } else {
        res->append(pat_.substr(pos_, stop - pos_));
      }
      pos_ = stop;
      return Status::Ok();
    }
    res->append(pat_.substr(pos_, 2));
    pos_ += 2;
    return Status::Ok();
  }

  // At '[': parses a class (Rust syntax: nested classes, && -- ~~) into *set.
  Status char_class(CharSet* set) {
    size_t const start = pos_;
    ++pos_;
    bool negated = false;
    if (pos_ < pat_.size() && pat_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    CharSet acc;
    bool have_acc = false;
    char op = 0;  // pending operator: '&', '-' or 0
    bool first = true;
    while (true) {
      CharSet operand;
      SPECDEC_RETURN_IF_ERROR(class_union(first, &operand));
      first = false;
      if (!have_acc) {
        acc = std::move(operand);
        have_acc = true;
      } else {
        CharSet combined;
        combined.simple = false;
        combined.expr = "(?:" + operand.lookahead(op == '&') + acc.pcre2() + ")";
        acc = std::move(combined);
      }
      if (pos_ >= pat_.size()) {
        return error(StatusCode::kMalformedInput, start, "unterminated character class");
      }
      if (pat_[pos_] == ']') {
        ++pos_;
        break;
      }
      std::string_view const two = pat_.substr(pos_, 2);
      if (two == "~~") {
        return error(StatusCode::kUnsupported, pos_,
                     "class symmetric difference '~~' has no PCRE2 translation");
      }
      op = two == "&&" ? '&' : '-';
      pos_ += 2;
    }
    if (negated) {
      if (acc.simple) {
        acc.negated = !acc.negated;
      } else {
        acc.expr = "(?:(?!" + acc.expr + ")(?s:.))";
      }
    }
    *set = std::move(acc);
    return Status::Ok();
  }

  // One operand of a class: items up to ']' or an operator (&&, --, ~~), unions of nested classes.
  Status class_union(bool first, CharSet* out) {
    size_t const start = pos_;
    std::string body;
    std::vector<CharSet> nested;
    bool empty = true;
    while (pos_ < pat_.size()) {
      char const c = pat_[pos_];
      std::string_view const two = pat_.substr(pos_, 2);
      if (c == ']' && !(first && empty)) break;
      if (!empty && (two == "&&" || two == "--" || two == "~~")) break;
      empty = false;
      if (c == ']') {  // first in the class: a literal
        body += "\\]";
        ++pos_;
      } else if (c == '\\') {
        SPECDEC_RETURN_IF_ERROR(escape(&body));
      } else if (c == '[' && two == "[:") {  // POSIX class [:name:], verbatim
        size_t const close = pat_.find(":]", pos_ + 2);
        if (close == std::string_view::npos) {
          return error(StatusCode::kMalformedInput, pos_, "unterminated POSIX class '[:'");
        }
        body.append(pat_.substr(pos_, close + 2 - pos_));
        pos_ = close + 2;
      } else if (c == '[') {
        nested.emplace_back();
        SPECDEC_RETURN_IF_ERROR(char_class(&nested.back()));
      } else {
        body += c;
        ++pos_;
      }
    }
    if (empty) return error(StatusCode::kMalformedInput, start, "empty class operand");
    if (nested.empty()) {
      out->body = std::move(body);
      return Status::Ok();
    }
    if (body.empty() && nested.size() == 1) {  // [[^x]]: the nested class itself
      *out = std::move(nested.front());
      return Status::Ok();
    }
    out->simple = false;
    std::string alt = body.empty() ? std::string() : "[" + body + "]";
    for (auto const& n : nested) alt += (alt.empty() ? "" : "|") + n.pcre2();
    out->expr = "(?:" + alt + ")";
    return Status::Ok();
  }

  std::string_view pat_;
  size_t pos_ = 0;
};

}  // namespace detail

// tiktoken (Rust regex) pattern -> the same pattern for PCRE2 (see the top of this file).
// Errors: kMalformedInput (an unterminated class or escape), kUnsupported ('~~').
inline Status translate_tiktoken_pattern(std::string_view pattern, std::string* pcre2_pattern) {
  return detail::PatternTranslator(pattern).run(pcre2_pattern);
}

class SplitPattern {
 public:
  SplitPattern() = default;

  // Translates and compiles `pattern` (tiktoken syntax) into *out. use_jit false: the interpreter
  // only (tests). Errors name PCRE2's message and the offset in the translated pattern.
  static Status compile(std::string_view pattern, SplitPattern* out, bool use_jit = true) {
    SplitPattern p;
    p.source_ = std::string(pattern);
    SPECDEC_RETURN_IF_ERROR(translate_tiktoken_pattern(pattern, &p.pcre2_source_));
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.pcre2_source_.data()), p.pcre2_source_.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
    if (code == nullptr) {
      return Status::InvalidArgument(
          "split pattern: PCRE2 refuses it: " + detail::pcre2_message(err) + " at offset " +
          std::to_string(off) + " of \"" + p.pcre2_source_ + "\"" +
          (p.pcre2_source_ == p.source_ ? std::string()
                                        : " (translated from \"" + p.source_ + "\")"));
    }
    p.code_.reset(code);
    if (!use_jit) {
      p.jit_error_ = "JIT not requested";
    } else {
      uint32_t have_jit = 0;
      pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
      if (have_jit == 0) {
        p.jit_error_ = "this PCRE2 is built without JIT";
      } else {
        int const rc = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
        if (rc == 0) {
          p.jit_ = true;
        } else {
          p.jit_error_ = "pcre2_jit_compile: " + detail::pcre2_message(rc);
        }
      }
    }
    *out = std::move(p);
    return Status::Ok();
  }

  bool compiled() const { return code_ != nullptr; }
  std::string const& source() const { return source_; }              // as given (tiktoken)
  std::string const& pcre2_source() const { return pcre2_source_; }  // as compiled
  bool jit() const { return jit_; }
  std::string const& jit_error() const { return jit_error_; }  // empty when jit()

  // Calls on_piece(std::string_view) for each match, in order; the pieces cover `text`, which
  // must be valid UTF-8 (not checked here). Errors: a position where nothing matches, an empty
  // match, or PCRE2's match error (e.g. a JIT stack limit), each with the byte offset.
  template <class F>
  Status split(std::string_view text, F&& on_piece) const {
    if (code_ == nullptr) return Status::InvalidArgument("split pattern: not compiled");
    if (text.empty()) return Status::Ok();
    std::unique_ptr<pcre2_match_data, MatchDataFree> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    std::unique_ptr<pcre2_match_context, MatchContextFree> mctx(
        pcre2_match_context_create(nullptr));
    std::unique_ptr<pcre2_jit_stack, JitStackFree> stack;
    if (md == nullptr || mctx == nullptr) return Status::Internal("split pattern: out of memory");
    if (jit_) {
      // JIT backtracking over a repeated group (Kimi's (?:(?!..)[..])*) takes stack per repeat.
      stack.reset(pcre2_jit_stack_create(32 * 1024, kJitStackMax, nullptr));
      if (stack == nullptr) return Status::Internal("split pattern: cannot allocate a JIT stack");
      pcre2_jit_stack_assign(mctx.get(), nullptr, stack.get());
    }
    pcre2_set_heap_limit(mctx.get(), kHeapLimitKiB);
    pcre2_set_match_limit(mctx.get(), 0xFFFFFFFFu);
    pcre2_set_depth_limit(mctx.get(), 0xFFFFFFFFu);
    auto const* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      int const rc = pcre2_match(code_.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                 md.get(), mctx.get());
      if (rc == PCRE2_ERROR_NOMATCH) {
        return Status::InvalidArgument("split pattern \"" + source_ +
                                       "\" matches nothing at byte " + std::to_string(pos) +
                                       " of the text (\"" + std::string(text.substr(pos, 16)) +
                                       "\"): the pattern must cover every character");
      }
      if (rc < 0) {
        return Status::Internal("split pattern: PCRE2 match error at byte " + std::to_string(pos) +
                                ": " + detail::pcre2_message(rc));
      }
      PCRE2_SIZE const* ov = pcre2_get_ovector_pointer(md.get());
      size_t const end = ov[1];
      if (ov[0] != pos || end <= pos) {
        return Status::InvalidArgument("split pattern \"" + source_ +
                                       "\" matches empty text at byte " + std::to_string(pos) +
                                       ": every match must consume text");
      }
      on_piece(text.substr(pos, end - pos));
      pos = end;
    }
    return Status::Ok();
  }

 private:
  static constexpr size_t kJitStackMax = size_t{256} << 20;  // reserved, touched as used
  static constexpr uint32_t kHeapLimitKiB = 1u << 20;        // 1 GiB for the interpreter

  struct CodeFree {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  struct MatchDataFree {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
  };
  struct MatchContextFree {
    void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
  };
  struct JitStackFree {
    void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
  };

  std::string source_;
  std::string pcre2_source_;
  std::unique_ptr<pcre2_code, CodeFree> code_;
  bool jit_ = false;
  std::string jit_error_;
};

}  // namespace specdec::io
