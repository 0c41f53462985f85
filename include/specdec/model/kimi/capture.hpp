// Capture of a target's hidden states and next-token distributions over whole sequences, for
// training an EAGLE-3 draft on the target's own outputs with the streams OUR forward computes
// (so training and serving cannot disagree on the layers or their order, DESIGN.md failure 2).
// One target prefill over each sequence (prompt + continuation; the continuation is the caller's:
// specdec-kimi capture generates it with SpecEngine's plain decoding) gives for every token t
//   aux row t     the residual streams of a layer set (policy/layers.hpp ids: i = after layer i,
//                 -1 = the embedding output) in the listed order: what the engine feeds the
//                 EAGLE-3 draft's fc (forward_cpu.hpp's aux rows)
//   top-k of t    the K largest entries of log_softmax(logits of t) (the distribution of token
//                 t + 1, temperature 1), by value, ties -> the lower id first
//
//   read_capture_prompts(path, config, max_new_tokens, shard, &prompts)   (parse_capture_prompts
//       on text): JSON lines, each an object with "input_ids": [ids] ("text" and any other key
//       ignored); every line is checked; lines whose 0-based index % shard.count == shard.index
//       are kept, in order
//   CaptureRows::start(config, layers [A], topk K, &rows)       empty rows for that model
//   capture_batch(CpuExecutor{}, cpu_model, sequences [S], options, &rows)
//   capture_batch(CudaExecutor{stream}, cuda_model, sequences [S], options, &rows)  (CUDA TUs)
//       appends the S sequences' rows: each a request of a fresh cache, prefilled in forwards
//       of at most options.max_forward_tokens rows (a forward may hold several sequences)
//   topk_log_softmax(logits [V], K, ids [K], logprobs [K])
//   write_capture(path, rows, metadata)     refuses an existing path; path.tmp, then a rename
//
// The file (safetensors, io/safetensors.hpp), S sequences of T_total tokens in all:
//   input_ids      I32  [T_total]         the sequences concatenated
//   seq_starts     I64  [S + 1]           sequence s = rows [seq_starts[s], seq_starts[s + 1])
//   prompt_lengths I32  [S]               the first prompt_lengths[s] rows of s are its prompt
//   line_index     I64  [S]               its 0-based line in the prompts file
//   aux_hidden     BF16 [T_total, A * H]  row t: the streams of layers[0..A) of token t
//   topk_ids       I32  [T_total, K]      top K of row t's log-softmax, descending
//   topk_logprobs  F32  [T_total, K]
//   __metadata__   format "specdec-capture-v1", layers ("1,29,57": listed order), hidden_size,
//                  vocab_size, num_hidden_layers, topk, and the caller's keys (specdec-kimi:
//                  model_path, temperature, max_new_tokens, seed, device, shard, prompts)
//
// Precision: the CPU forward is fp32 (forward_cpu.hpp); the CUDA forward rounds activations to
// bf16 at its GEMMs (forward_cuda.cuh), so its rows agree with the CPU's to about 1e-2 relative.
// aux is rounded to bf16 (nearest even), log-probabilities computed in double from fp32 logits.
// A forward's rows do not depend on the other sequences in it beyond float rounding (GEMMs and
// expert groups of other sizes), which a bf16 aux value can show as one ulp.
// The CUDA path copies each forward's [rows, V] logits to the host for the top-k.
// Memory: the rows stay on the host until write_capture, T_total * (2 A H + 8 K + 4) bytes
// (Kimi-K2.5, A = 3, K = 8: about 43 KB a token); split a large set into shards.
//
// Errors (Status naming the line or the sequence and the numbers): a prompts line that is not a
// JSON object, input_ids missing, not an array, empty or holding anything but whole numbers in
// [0, V); prompt + max_new_tokens past max_position_embeddings; a file with no lines; a shard
// outside 0 <= index < count; a layer set that is empty, repeats an id or has one outside
// [-1, L); K outside [1, V]; a sequence that is empty or whose prompt length is not in [1, T];
// rows started for another model; a non-finite logit; an existing output path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/executor.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/eagle/config.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/policy/layers.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/model/kimi/forward_cuda.cuh"
#endif

namespace specdec::model::kimi {

inline constexpr char const* kCaptureFormat = "specdec-capture-v1";

// Which lines of the prompts file one process takes: index % count == index.
struct CaptureShard {
  int index = 0;
  int count = 1;
};

struct CapturePrompt {
  int64_t line = 0;             // 0-based line of the prompts file
  std::vector<int32_t> ids;     // input_ids
};

// One sequence to capture: prompt + continuation.
struct CaptureSequence {
  int64_t line = 0;             // 0-based line of the prompts file (written as line_index)
  std::vector<int32_t> tokens;  // [T] prompt then continuation
  int32_t prompt_length = 0;    // in [1, T]
};

struct CaptureOptions {
  int page_size = 16;                // MLA cache page, in tokens
  int64_t max_forward_tokens = 1024;  // rows of one prefill forward (bounds the [rows, V] logits)
};

// The rows of the file (top of this file), appended sequence by sequence.
struct CaptureRows {
  std::vector<int> layers;  // A ids, in order
  int64_t hidden_size = 0, vocab_size = 0;
  int num_hidden_layers = 0;
  int topk = 0;
  std::vector<int32_t> input_ids;       // [T_total]
  std::vector<int64_t> seq_starts{0};   // [S + 1]
  std::vector<int32_t> prompt_lengths;  // [S]
  std::vector<int64_t> line_index;      // [S]
  std::vector<uint16_t> aux_hidden;     // [T_total, A * H] bf16 bits
  std::vector<int32_t> topk_ids;        // [T_total, K]
  std::vector<float> topk_logprobs;     // [T_total, K]

  int64_t tokens() const { return seq_starts.back(); }
  int64_t sequences() const { return static_cast<int64_t>(prompt_lengths.size()); }
  int64_t aux_width() const { return static_cast<int64_t>(layers.size()) * hidden_size; }

  // Empty rows for `config`'s model, `layers` (checked as a draft's layer set is) and top K.
  static Status start(io::DeepseekV3Config const& config, std::span<int const> layers, int topk,
                      CaptureRows* out) {
    if (out == nullptr) return Status::InvalidArgument("CaptureRows::start: out is null");
    std::vector<int> const ids(layers.begin(), layers.end());
    SPECDEC_RETURN_IF_ERROR(eagle::detail::check_layer_ids(ids, config.num_hidden_layers,
                                                           "capture layers", ""));
    if (topk < 1 || topk > config.vocab_size) {
      return Status::InvalidArgument("capture top-k " + std::to_string(topk) + " not in [1, " +
                                     std::to_string(config.vocab_size) + "] (the vocabulary)");
    }
    CaptureRows r;
    r.layers = ids;
    r.hidden_size = config.hidden_size;
    r.vocab_size = config.vocab_size;
    r.num_hidden_layers = config.num_hidden_layers;
    r.topk = topk;
    *out = std::move(r);
    return Status::Ok();
  }
};

// "1,29,57" (the metadata's form; -1 the embedding).
inline std::string capture_layers_text(std::span<int const> layers) {
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(layers[i]);
  }
  return s;
}

// The K largest entries of log_softmax(logits [V]) into ids [K] / logprobs [K], descending,
// ties -> the lower id first. Non-finite logits are an error.
inline Status topk_log_softmax(std::span<float const> logits, int k, int32_t* ids,
                               float* logprobs) {
  int64_t const V = static_cast<int64_t>(logits.size());
  if (k < 1 || k > V) {
    return Status::InvalidArgument("topk_log_softmax: k " + std::to_string(k) + " not in [1, " +
                                   std::to_string(V) + "]");
  }
  std::vector<float> best(static_cast<size_t>(k));
  int held = 0;
  for (int64_t v = 0; v < V; ++v) {
    float const x = logits[static_cast<size_t>(v)];
    if (!std::isfinite(x)) {
      return Status::InvalidArgument("topk_log_softmax: logit " + std::to_string(v) + " is " +
                                     std::to_string(x) + " (not finite)");
    }
    if (held == k && !(x > best[static_cast<size_t>(k - 1)])) continue;
    int i = held < k ? held++ : k - 1;
    for (; i > 0 && best[static_cast<size_t>(i - 1)] < x; --i) {  // equal values stay ahead
      best[static_cast<size_t>(i)] = best[static_cast<size_t>(i - 1)];
      ids[i] = ids[i - 1];
    }
    best[static_cast<size_t>(i)] = x;
    ids[i] = static_cast<int32_t>(v);
  }
  double const top = best[0];
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - top);
  double const lse = top + std::log(sum);
  for (int i = 0; i < k; ++i) {
    logprobs[i] = static_cast<float>(static_cast<double>(best[static_cast<size_t>(i)]) - lse);
  }
  return Status::Ok();
}

// Parses the prompts file's text (JSON lines; `source` names it in errors, with the 1-based line
// number) into the shard's prompts. Every line is checked, the shard's or not.
inline Status parse_capture_prompts(std::string_view text, std::string const& source,
                                    io::DeepseekV3Config const& config, int max_new_tokens,
                                    CaptureShard shard, std::vector<CapturePrompt>* out) {
  if (out == nullptr) return Status::InvalidArgument("parse_capture_prompts: out is null");
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count) {
    return Status::InvalidArgument("shard " + std::to_string(shard.index) + "/" +
                                   std::to_string(shard.count) +
                                   ": need count >= 1 and 0 <= index < count");
  }
  if (max_new_tokens < 1) {
    return Status::InvalidArgument("max_new_tokens " + std::to_string(max_new_tokens) + " < 1");
  }
  int64_t const V = config.vocab_size;
  std::vector<CapturePrompt> prompts;
  int64_t index = 0;
  for (size_t begin = 0; begin < text.size(); ++index) {
    size_t const end = std::min(text.find('\n', begin), text.size());
    std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::string const where = source + " line " + std::to_string(index + 1);
    auto bad = [&](std::string const& what) { return Status::MalformedInput(where + ": " + what); };
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      return bad("empty (every line is one JSON object with \"input_ids\")");
    }
    io::detail::Json j;
    SPECDEC_RETURN_IF_ERROR(io::detail::parse_json_object(line, where, &j));
    auto const it = j.find("input_ids");
    if (it == j.end()) return bad("no \"input_ids\" (an array of token ids)");
    if (!it->is_array()) {
      return bad("\"input_ids\" is " + io::detail::json_type_name(*it) +
                 ", not an array of token ids");
    }
    if (it->empty()) return bad("\"input_ids\" is empty");
    int64_t const T = static_cast<int64_t>(it->size());
    if (T + max_new_tokens > config.max_position_embeddings) {
      return bad(std::to_string(T) + " prompt tokens + " + std::to_string(max_new_tokens) +
                 " new tokens exceed max_position_embeddings " +
                 std::to_string(config.max_position_embeddings));
    }
    CapturePrompt p;
    p.line = index;
    p.ids.reserve(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) {
      io::detail::Json const& e = (*it)[static_cast<size_t>(i)];
      bool const in_vocab = e.is_number_unsigned() && e.get<uint64_t>() < static_cast<uint64_t>(V);
      if (!in_vocab) {
        return bad("\"input_ids\"[" + std::to_string(i) + "] = " + e.dump() +
                   (e.is_number_integer() ? " is outside the vocabulary [0, " + std::to_string(V) +
                                                ")"
                                          : " is not a token id (a whole number)"));
      }
      p.ids.push_back(static_cast<int32_t>(e.get<uint64_t>()));
    }
    if (index % shard.count == shard.index) prompts.push_back(std::move(p));
  }
  if (index == 0) return Status::MalformedInput(source + ": no lines (one JSON object a prompt)");
  *out = std::move(prompts);
  return Status::Ok();
}

// parse_capture_prompts over the file at `path`.
inline Status read_capture_prompts(std::string const& path, io::DeepseekV3Config const& config,
                                   int max_new_tokens, CaptureShard shard,
                                   std::vector<CapturePrompt>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(path + ": cannot open (missing or unreadable)");
  std::string const text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::InvalidArgument(path + ": read error");
  return parse_capture_prompts(text, path, config, max_new_tokens, shard, out);
}

namespace detail {

// The cache pages of the sequences: {total, largest}.
inline std::pair<int, int> capture_pages(std::span<CaptureSequence const> seqs, int page_size) {
  int total = 0, largest = 0;
  for (CaptureSequence const& s : seqs) {
    int const p =
        static_cast<int>(ceil_div<int64_t>(static_cast<int64_t>(s.tokens.size()), page_size));
    total += p;
    largest = std::max(largest, p);
  }
  return {total, largest};
}

// The checks of capture_batch's arguments.
inline Status check_capture(io::DeepseekV3Config const& config,
                            std::span<CaptureSequence const> seqs, CaptureOptions const& o,
                            CaptureRows const* rows) {
  std::string const fn = "capture_batch: ";
  if (rows == nullptr) return Status::InvalidArgument(fn + "rows is null");
  if (rows->topk < 1 || rows->layers.empty()) {
    return Status::InvalidArgument(fn + "rows are not started (CaptureRows::start)");
  }
  if (rows->hidden_size != config.hidden_size || rows->vocab_size != config.vocab_size ||
      rows->num_hidden_layers != config.num_hidden_layers) {
    return Status::InvalidArgument(
        fn + "rows were started for hidden " + std::to_string(rows->hidden_size) + ", vocab " +
        std::to_string(rows->vocab_size) + ", " + std::to_string(rows->num_hidden_layers) +
        " layers; the model (" + config.source + ") has " + std::to_string(config.hidden_size) +
        ", " + std::to_string(config.vocab_size) + ", " +
        std::to_string(config.num_hidden_layers));
  }
  if (o.max_forward_tokens < 1 || o.page_size < 1) {
    return Status::InvalidArgument(fn + "max_forward_tokens " +
                                   std::to_string(o.max_forward_tokens) + " and page_size " +
                                   std::to_string(o.page_size) + " must be >= 1");
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    int64_t const T = static_cast<int64_t>(seqs[s].tokens.size());
    if (T < 1 || seqs[s].prompt_length < 1 || seqs[s].prompt_length > T) {
      return Status::InvalidArgument(fn + "sequence " + std::to_string(s) + " (line " +
                                     std::to_string(seqs[s].line + 1) + ") has " +
                                     std::to_string(T) + " tokens and prompt length " +
                                     std::to_string(seqs[s].prompt_length) +
                                     ": need T >= 1 and a prompt length in [1, T]");
    }
  }
  return Status::Ok();
}

// Appends the checked, non-empty sequences' rows to *rows through
// forward(requests, counts, tokens, &logits, &aux): the host logits [rows, V] and aux
// [rows, A * H] of a prefill over requests 0..S-1 of a cache that holds them. On an error *rows
// is left as it was.
template <class Forward>
Status capture_rows(std::span<CaptureSequence const> seqs, CaptureOptions const& o,
                    CaptureRows* rows, Forward&& forward) {
  std::string const fn = "capture_batch: ";
  int64_t const V = rows->vocab_size, K = rows->topk, F = rows->aux_width();
  int64_t const base = rows->tokens();
  std::vector<int64_t> starts(seqs.size());
  int64_t total = base;
  for (size_t s = 0; s < seqs.size(); ++s) {
    starts[s] = total;
    total += static_cast<int64_t>(seqs[s].tokens.size());
  }
  CaptureRows& r = *rows;
  r.aux_hidden.resize(static_cast<size_t>(total * F));
  r.topk_ids.resize(static_cast<size_t>(total * K));
  r.topk_logprobs.resize(static_cast<size_t>(total * K));
  auto undo = [&](Status const& s) {
    r.aux_hidden.resize(static_cast<size_t>(base * F));
    r.topk_ids.resize(static_cast<size_t>(base * K));
    r.topk_logprobs.resize(static_cast<size_t>(base * K));
    return s;
  };
  // Forwards of up to max_forward_tokens rows: the next tokens of the sequences in order.
  std::vector<RequestId> ids;
  std::vector<int32_t> counts, tokens;
  std::vector<int64_t> dest;  // the file row of each piece's first token
  std::vector<float> logits, aux;
  size_t s = 0;
  int64_t done = 0;  // tokens of sequence s already forwarded
  while (s < seqs.size()) {
    ids.clear(), counts.clear(), tokens.clear(), dest.clear();
    for (int64_t budget = o.max_forward_tokens; s < seqs.size() && budget > 0;) {
      std::vector<int32_t> const& t = seqs[s].tokens;
      int64_t const take = std::min(static_cast<int64_t>(t.size()) - done, budget);
      ids.push_back(static_cast<RequestId>(s));
      counts.push_back(static_cast<int32_t>(take));
      tokens.insert(tokens.end(), t.begin() + done, t.begin() + done + take);
      dest.push_back(starts[s] + done);
      done += take;
      budget -= take;
      if (done == static_cast<int64_t>(t.size())) ++s, done = 0;
    }
    int64_t const n = static_cast<int64_t>(tokens.size());
    Status st = forward(std::span<RequestId const>(ids), std::span<int32_t const>(counts),
                        std::span<int32_t const>(tokens), &logits, &aux);
    if (st.ok() && (static_cast<int64_t>(logits.size()) != n * V ||
                    static_cast<int64_t>(aux.size()) != n * F)) {
      st = Status::Internal(fn + "the forward gave " + std::to_string(logits.size()) +
                            " logits and " + std::to_string(aux.size()) + " aux values for " +
                            std::to_string(n) + " rows");
    }
    if (!st.ok()) return undo(st);
    int64_t row = 0;
    for (size_t p = 0; p < ids.size(); ++p) {
      for (int32_t i = 0; i < counts[p]; ++i, ++row) {
        int64_t const at = dest[p] + i;
        float const* a = aux.data() + row * F;
        uint16_t* out = r.aux_hidden.data() + at * F;
        for (int64_t f = 0; f < F; ++f) out[f] = float_to_bf16(a[f]);
        std::span<float const> const row_logits(logits.data() + row * V, static_cast<size_t>(V));
        st = topk_log_softmax(row_logits, static_cast<int>(K), r.topk_ids.data() + at * K,
                              r.topk_logprobs.data() + at * K);
        if (!st.ok()) {
          size_t const q = static_cast<size_t>(ids[p]);
          return undo(st.prefixed(fn + "line " + std::to_string(seqs[q].line + 1) + ", token " +
                                  std::to_string(at - starts[q]) + ": "));
        }
      }
    }
  }
  for (CaptureSequence const& q : seqs) {
    r.input_ids.insert(r.input_ids.end(), q.tokens.begin(), q.tokens.end());
    r.seq_starts.push_back(static_cast<int64_t>(r.input_ids.size()));
    r.prompt_lengths.push_back(q.prompt_length);
    r.line_index.push_back(q.line);
  }
  return Status::Ok();
}

}  // namespace detail

// The sequences' rows through the CPU forward (one fresh cache holding them all).
inline Status capture_batch(CpuExecutor exec, KimiCpuModel const& model,
                            std::span<CaptureSequence const> seqs, CaptureOptions const& o,
                            CaptureRows* rows) {
  SPECDEC_RETURN_IF_ERROR(detail::check_capture(model.config, seqs, o, rows));
  if (seqs.empty()) return Status::Ok();
  auto const [pages, largest] = detail::capture_pages(seqs, o.page_size);
  MlaCache cache;
  SPECDEC_RETURN_IF_ERROR(MlaCache::create_for(model.config, o.page_size, std::max(pages, 1),
                                               std::max(largest, 1), &cache));
  for (size_t s = 0; s < seqs.size(); ++s) {
    SPECDEC_RETURN_IF_ERROR(cache.add_request(static_cast<RequestId>(s)));
  }
  std::vector<int> const layers = rows->layers;
  return detail::capture_rows(
      seqs, o, rows,
      [&](std::span<RequestId const> ids, std::span<int32_t const> counts,
          std::span<int32_t const> tokens, std::vector<float>* logits, std::vector<float>* aux) {
        return kimi_prefill(exec, model, &cache, ids, counts, tokens, layers, logits, aux);
      });
}

#if defined(__CUDACC__)
// The same through the CUDA forward on exec.stream; each forward's logits and aux are copied to
// the host.
inline Status capture_batch(CudaExecutor exec, KimiCudaModel& model,
                            std::span<CaptureSequence const> seqs, CaptureOptions const& o,
                            CaptureRows* rows) {
  SPECDEC_RETURN_IF_ERROR(detail::check_capture(model.config, seqs, o, rows));
  if (seqs.empty()) return Status::Ok();
  auto const [pages, largest] = detail::capture_pages(seqs, o.page_size);
  KimiCudaCache cache;
  SPECDEC_RETURN_IF_ERROR(KimiCudaCache::create_for(model.config, o.page_size,
                                                    std::max(pages, 1), std::max(largest, 1),
                                                    &cache));
  for (size_t s = 0; s < seqs.size(); ++s) {
    SPECDEC_RETURN_IF_ERROR(cache.table.add_request(static_cast<RequestId>(s)));
  }
  std::vector<int> const layers = rows->layers;
  int64_t const V = model.config.vocab_size;
  return detail::capture_rows(
      seqs, o, rows,
      [&](std::span<RequestId const> ids, std::span<int32_t const> counts,
          std::span<int32_t const> tokens, std::vector<float>* logits,
          std::vector<float>* aux) -> Status {
        CudaForwardOutput out;
        SPECDEC_RETURN_IF_ERROR(
            kimi_prefill(exec, model, &cache.table, ids, counts, tokens, layers, &out));
        if (out.vocab != V) {
          return Status::Internal("capture_batch (cuda): the forward's logits hold " +
                                  std::to_string(out.vocab) + " of " + std::to_string(V) +
                                  " vocabulary columns (a vocabulary-sharded model)");
        }
        SPECDEC_RETURN_IF_ERROR(copy_to_host(out.logits, out.tokens * V, exec.stream, logits));
        return copy_to_host(out.aux, out.tokens * out.aux_width, exec.stream, aux);
      });
}
#endif

// Writes `rows` to `path` (the file at the top), with `metadata` beside the format's own keys
// (which win). An existing `path` is refused; the bytes go through path.tmp and a rename.
inline Status write_capture(std::string const& path, CaptureRows const& rows,
                            std::map<std::string, std::string> metadata = {}) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    return Status::InvalidArgument(path + " exists: a capture never overwrites a file (remove it, "
                                          "or write another path)");
  }
  int64_t const T = rows.tokens(), S = rows.sequences(), F = rows.aux_width(), K = rows.topk;
  if (rows.layers.empty() || K < 1 || static_cast<int64_t>(rows.seq_starts.size()) != S + 1 ||
      static_cast<int64_t>(rows.line_index.size()) != S ||
      static_cast<int64_t>(rows.input_ids.size()) != T ||
      static_cast<int64_t>(rows.aux_hidden.size()) != T * F ||
      static_cast<int64_t>(rows.topk_ids.size()) != T * K ||
      static_cast<int64_t>(rows.topk_logprobs.size()) != T * K) {
    return Status::InvalidArgument("write_capture: " + path +
                                   ": the rows' arrays do not agree (CaptureRows::start, then "
                                   "capture_batch)");
  }
  auto bytes = [](auto const& v) { return std::as_bytes(std::span(v.data(), v.size())); };
  io::TensorToWrite const tensors[] = {
      {"input_ids", Dtype::kI32, {T}, bytes(rows.input_ids)},
      {"seq_starts", Dtype::kI64, {S + 1}, bytes(rows.seq_starts)},
      {"prompt_lengths", Dtype::kI32, {S}, bytes(rows.prompt_lengths)},
      {"line_index", Dtype::kI64, {S}, bytes(rows.line_index)},
      {"aux_hidden", Dtype::kBF16, {T, F}, bytes(rows.aux_hidden)},
      {"topk_ids", Dtype::kI32, {T, K}, bytes(rows.topk_ids)},
      {"topk_logprobs", Dtype::kF32, {T, K}, bytes(rows.topk_logprobs)},
  };
  metadata["format"] = kCaptureFormat;
  metadata["layers"] = capture_layers_text(rows.layers);
  metadata["hidden_size"] = std::to_string(rows.hidden_size);
  metadata["vocab_size"] = std::to_string(rows.vocab_size);
  metadata["num_hidden_layers"] = std::to_string(rows.num_hidden_layers);
  metadata["topk"] = std::to_string(rows.topk);
  return io::write_safetensors(path, tensors, metadata);
}

}  // namespace specdec::model::kimi
