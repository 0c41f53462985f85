// sample parameters and the target distribution shared by `sample` and `verify_sample`.
//
// Per request b of B with vocabulary V:
//   logits        [B, V] float   one row of target logits per request
//   config        SamplingConfig temperature [B] float, top_k [B] int32, top_p [B] float
//   keys          RandomKeys     seed [B], step [B], request_id [B] or nullptr
//   tokens        [B] int32      written: the sampled token, -1 when status[b] != 0
//   status        [B] int32      written: SampleError of request b (kSampleOk when sampled)
//
// The target distribution p of a logit row l (the definition the CPU reference and the kernels
// both implement; "key" is float_order_key, so float order is the unsigned order of keys):
//   * T = temperature[b] <= 0: greedy. p is one-hot at argmax_v l_v (ties: smallest token id).
//     A positive T below kSampleMinTemperature is refused (kSampleBadTemperature): 1 / T would
//     scale ordinary logits past the float range.
//   * otherwise z_v = l_v * (1 / T) (the float reciprocal, then a float multiply), m = max_v z_v.
//     - top-k: k = top_k[b]; 0 < k < V keeps v with key(z_v) >= K_k, the k-th largest key
//       (ties at the threshold are kept, so possibly more than k tokens); k <= 0 or k >= V keeps
//       every token.
//     - weights w_v = exp(z_v - m) for kept v, 0 otherwise; S = sum_v w_v; p_v = w_v / S.
//     - top-p: P = top_p[b]; P < 1 keeps, among the kept, v with key(z_v) >= K_p where K_p is
//       the largest key K among kept tokens with sum_{kept w : key(z_w) >= K} w_w >= P * S (ties
//       at the threshold kept); P == 1 keeps every kept token. Weights outside are zeroed and p
//       renormalised.
//     Order by z (not by p) makes the thresholds independent of exp's rounding.
// Sampling from p with one uniform u in [0, 1): the first v (token order) whose inclusive prefix
// sum of w exceeds u * sum_v w_v; if rounding leaves no such v, the last v with w_v > 0. The CPU
// reference accumulates in double, the kernel in float: they agree except where u * sum lies
// within float rounding of a prefix boundary (and, for top-p, where P * S lies within rounding of
// a partial mass).
// `sample` draws u = keys.uniform(b, 0, 0).
//
// Invalid per-request values are device data and are never clamped: NaN or +inf temperature, a
// positive temperature below kSampleMinTemperature, top_p NaN, <= 0 or > 1, and a row whose
// (scaled) maximum is not finite (NaN, +inf, or every logit -inf) write status[b] != 0 and
// token -1.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/status.hpp"

namespace specdec::ops {

// The smallest positive temperature: z = l / T stays finite for every logit |l| < 3.4e32. Below
// it (and above 0, which means greedy) a temperature is refused, never rounded to greedy.
constexpr float kSampleMinTemperature = 1e-6f;

// Per-request result of sample / verify_sample, written to their status [B] arrays.
enum SampleError : int32_t {
  kSampleOk = 0,
  kSampleBadTemperature = 1,  // temperature is NaN, +inf or in (0, kSampleMinTemperature)
  kSampleBadTopP = 2,         // top_p is NaN or outside (0, 1]
  kSampleBadLogits = 3,       // a used logit row's (scaled) maximum is NaN or infinite
  kSampleBadTree = 4,         // verify_sample: tree_status != 0 or broken links; request skipped
};

inline const char* sample_error_name(int32_t code) {
  switch (code) {
    case kSampleOk: return "ok";
    case kSampleBadTemperature:
      return "temperature is NaN, +inf or above 0 and below 1e-6 (0 means greedy)";
    case kSampleBadTopP: return "top_p is NaN or outside (0, 1]";
    case kSampleBadLogits: return "logit row maximum is NaN or infinite (or every logit is -inf)";
    case kSampleBadTree: return "malformed tree (tree_status != 0): request skipped";
  }
  return "unknown sample error";
}

// Host-side: turns a downloaded status array into a Status naming the first bad request.
inline Status check_sample_status(int32_t const* status, int batch) {
  for (int b = 0; b < batch; ++b) {
    if (status[b] != kSampleOk) {
      return Status::InvalidArgument("request " + std::to_string(b) + ": " +
                                     sample_error_name(status[b]));
    }
  }
  return Status::Ok();
}

// Per-request sampling settings; arrays in the executor's memory.
struct SamplingConfig {
  float const* temperature = nullptr;  // [B] float; <= 0 greedy (required)
  int32_t const* top_k = nullptr;      // [B] int32; <= 0 or >= V: no top-k; nullptr: no top-k
  float const* top_p = nullptr;        // [B] float in (0, 1]; 1: no top-p; nullptr: no top-p

  SPECDEC_HD float temperature_of(int b) const { return temperature[b]; }
  SPECDEC_HD int32_t top_k_of(int b) const { return top_k ? top_k[b] : 0; }
  SPECDEC_HD float top_p_of(int b) const { return top_p ? top_p[b] : 1.0f; }
};

struct SampleParams {
  float const* logits = nullptr;  // [B, V] float
  int batch = 0;                  // B
  int vocab = 0;                  // V
  SamplingConfig config;          // temperature [B], top_k [B] or nullptr, top_p [B] or nullptr
  RandomKeys keys;                // seed [B], step [B], request_id [B] or nullptr
  int32_t* tokens = nullptr;      // [B] int32, written
  int32_t* status = nullptr;      // [B] int32, written (SampleError)
  void* workspace = nullptr;      // CUDA only: sample_workspace_bytes(B, V) bytes, 8-byte aligned
  size_t workspace_bytes = 0;     //   (no initial contents needed)
};

// ---- The CUDA path's workspace: chunk partials, threshold keys and candidate lists ----
// The kernels cut every row into chunks of kSampleChunk logits that separate blocks reduce at
// once (one multiprocessor streaming a whole 640 KB row would bound batch-1 latency). Each chunk
// leaves its packed argmax (pack_value_index of the logit) and, for rows sampled with a
// temperature, its mass sum_v w_v exp(max_z - m_c) about its own maximum m_c = logit max * (1 / T)
// (w: the row's weights, zero below the top-k / top-p threshold). Rows with top-k or top-p also
// leave their threshold key (TargetDist::min_key).
// A row with top-k k <= kSampleListMaxTopK (and at most kSampleListMaxChunks chunks) also leaves,
// per chunk, a candidate list: the chunk's keys at and above its k-th largest (a few more: whole
// distance bins), at most kSampleListCap of them. The row's top-k lies in the union of its
// chunks' lists, and so does every key top-p can keep after it, so the threshold follows from the
// lists alone. `listed` is the list's length, or kSampleNotListed (the chunk overflowed, or the
// row takes the threshold kernel's passes over the whole row).
// Layout: partials [rows, C] SampleChunkPartial (C = ceil(V / kSampleChunk)), min_keys [rows]
// uint32, then lists [rows, C, kSampleListCap] uint32 where C <= kSampleListMaxChunks.
constexpr int kSampleChunk = 4096;
constexpr int kSampleListCap = 128;
constexpr int kSampleListMaxTopK = 64;
constexpr int kSampleListMaxChunks = 96;  // V <= 393216: a row's lists fit one block's 48 KB
constexpr int32_t kSampleNotListed = -1;
struct SampleChunkPartial {
  uint64_t argmax = 0;
  float mass = 0.0f;
  int32_t listed = kSampleNotListed;
};
SPECDEC_HD inline int sample_chunks(int vocab) { return ceil_div(vocab, kSampleChunk); }
// List entries a row reserves: kSampleListCap per chunk where the row can be listed, else none.
SPECDEC_HD inline int64_t sample_list_entries(int vocab) {
  int const chunks = sample_chunks(vocab);
  return chunks <= kSampleListMaxChunks ? int64_t{chunks} * kSampleListCap : 0;
}
// Bytes of workspace for `rows` logit rows of `vocab` (sample: rows = B; verify_sample: B * N).
SPECDEC_HD inline size_t sample_workspace_bytes(int64_t rows, int vocab) {
  size_t const per_row = static_cast<size_t>(sample_chunks(vocab)) * sizeof(SampleChunkPartial) +
                         sizeof(uint32_t) +
                         static_cast<size_t>(sample_list_entries(vocab)) * sizeof(uint32_t);
  return static_cast<size_t>(rows) * per_row;
}
// The workspace's min_keys [rows] array ...
SPECDEC_HD inline uint32_t* sample_min_keys(void* workspace, int64_t rows, int vocab) {
  return reinterpret_cast<uint32_t*>(static_cast<SampleChunkPartial*>(workspace) +
                                     rows * sample_chunks(vocab));
}
// ... and its lists [rows, sample_list_entries(V)].
SPECDEC_HD inline uint32_t* sample_candidate_lists(void* workspace, int64_t rows, int vocab) {
  return sample_min_keys(workspace, rows, vocab) + rows;
}
// A workspace of `bytes` where `need` are needed (`how`: the call that gives `need`).
inline Status validate_sample_workspace(void const* workspace, size_t bytes, size_t need,
                                        char const* op, char const* how) {
  if (!workspace || bytes < need) {
    return Status::InvalidArgument(std::string(op) + ": workspace of " + std::to_string(bytes) +
                                   " bytes < " + std::to_string(need) + " needed: allocate " + how);
  }
  if (reinterpret_cast<uintptr_t>(workspace) % alignof(SampleChunkPartial) != 0) {
    return Status::InvalidArgument(std::string(op) + ": workspace is not 8-byte aligned");
  }
  return Status::Ok();
}

// ---- Arithmetic shared by the CPU references and the kernels ----

// The per-request settings' error, or kSampleOk.
SPECDEC_HD inline int32_t sample_config_error(float temperature, float top_p) {
  if (temperature != temperature || temperature == INFINITY ||
      (temperature > 0.0f && temperature < kSampleMinTemperature)) {
    return kSampleBadTemperature;
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return kSampleBadTopP;  // NaN fails too
  return kSampleOk;
}

SPECDEC_HD inline bool sample_is_greedy(float temperature) { return temperature <= 0.0f; }

// exp(x) for x <= 0: the device uses the fast exponential (ex2.approx; relative error ~1e-6 over
// the range that matters), the host the libm one.
SPECDEC_HD inline float sample_exp(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  return std::exp(x);
#endif
}

// Greedy rows: the max over pack_value_index(z, token) (core/math.hpp), ties to the smaller id.

// The target distribution of one row, reduced to what a weight lookup needs.
//   greedy_token >= 0: one-hot at greedy_token (weight 1).
//   otherwise w_v = exp(l_v * inv_t - max_z) when key(l_v * inv_t) >= min_key, else 0.
struct TargetDist {
  int32_t greedy_token = -1;
  float inv_t = 1.0f;
  float max_z = 0.0f;
  uint32_t min_key = 0;

  SPECDEC_HD float weight(int32_t v, float logit) const {
    if (greedy_token >= 0) return v == greedy_token ? 1.0f : 0.0f;
    float const z = logit * inv_t;
    return float_order_key(z) >= min_key ? sample_exp(z - max_z) : 0.0f;
  }
};

// Whether top-k with k = top_k prunes anything over a vocabulary of V.
SPECDEC_HD inline bool sample_uses_top_k(int32_t top_k, int vocab) {
  return top_k > 0 && top_k < vocab;
}
SPECDEC_HD inline bool sample_uses_top_p(float top_p) { return top_p < 1.0f; }

// Whether a top-k row's threshold can come from chunk candidate lists (see the workspace).
SPECDEC_HD inline bool sample_row_lists_fit(int32_t top_k, int vocab) {
  return sample_uses_top_k(top_k, vocab) && top_k <= kSampleListMaxTopK &&
         sample_chunks(vocab) <= kSampleListMaxChunks;
}

// Whether request b's rows need the threshold kernel: sampled (not greedy) with top-k or top-p.
// Greedy rows ignore top-k / top-p; the others take the chunk partials alone.
SPECDEC_HD inline bool sample_row_needs_threshold(SamplingConfig const& config, int b, int vocab) {
  return !sample_is_greedy(config.temperature_of(b)) &&
         (sample_uses_top_k(config.top_k_of(b), vocab) || sample_uses_top_p(config.top_p_of(b)));
}

// The acceptance test of the deterministic-draft (target-only) rule, without division:
// accept iff u < w_x / (S - R)  <=>  u * (S - R) < w_x, with R the rejected siblings' weight.
// A token of weight 0 is never accepted, even when rounding leaves S - R slightly negative.
SPECDEC_HD inline bool sample_accept_deterministic(float u, float remaining_mass, float w_x) {
  return w_x > 0.0f && u * remaining_mass < w_x;
}

// The acceptance test of the sampled-draft (SpecInfer) rule in weight units:
// r_k(x) / q(x) = max(w_x - C q_x, 0) / (M q_x); accept iff u * M * q_x < max(w_x - C q_x, 0).
SPECDEC_HD inline float sample_residual_weight(float w, float q, float c) {
  float const r = w - c * q;
  return r > 0.0f ? r : 0.0f;
}
SPECDEC_HD inline bool sample_accept_sampled(float u, float residual_mass, float q_x,
                                             float residual_x) {
  return u * residual_mass * q_x < residual_x;
}

inline Status validate_sampling_config(SamplingConfig const& c, char const* op) {
  if (!c.temperature) {
    return Status::InvalidArgument(std::string(op) +
                                   ": config.temperature is null: pass a [B] float array "
                                   "(<= 0 for greedy requests)");
  }
  return Status::Ok();
}

inline Status validate_random_keys(RandomKeys const& k, char const* op) {
  if (!k.seed) return Status::InvalidArgument(std::string(op) + ": keys.seed is null: pass [B] uint64 seeds");
  if (!k.step) return Status::InvalidArgument(std::string(op) + ": keys.step is null: pass [B] uint32 steps");
  return Status::Ok();
}

// The largest vocabulary the kernels' index arithmetic supports.
constexpr int kSampleMaxVocab = 1 << 24;

inline Status validate(SampleParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("sample: " + m); };
  if (p.batch < 1) return bad("batch " + std::to_string(p.batch) + " < 1");
  if (p.vocab < 1 || p.vocab > kSampleMaxVocab) {
    return bad("vocab " + std::to_string(p.vocab) + " outside [1, " +
               std::to_string(kSampleMaxVocab) + "]");
  }
  if (!p.logits) return bad("logits is null: pass the [B, V] logits");
  if (!p.tokens) return bad("tokens is null: pass a [B] int32 output");
  if (!p.status) return bad("status is null: pass a [B] int32 output");
  SPECDEC_RETURN_IF_ERROR(validate_sampling_config(p.config, "sample"));
  SPECDEC_RETURN_IF_ERROR(validate_random_keys(p.keys, "sample"));
  return Status::Ok();
}

// The CUDA path's extra requirement: a workspace of sample_workspace_bytes(B, V).
inline Status validate_workspace(SampleParams const& p) {
  return validate_sample_workspace(p.workspace, p.workspace_bytes,
                                   sample_workspace_bytes(p.batch, p.vocab), "sample",
                                   "sample_workspace_bytes(batch, vocab)");
}

}  // namespace specdec::ops
