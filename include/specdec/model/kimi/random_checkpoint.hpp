// Random Kimi / DeepSeek-V3 checkpoints for tests and benchmarks: a real Hugging Face layout
// (config.json + model.safetensors, or N shards "model-0000k-of-0000N.safetensors" with
// model.safetensors.index.json {"metadata": {"total_size"}, "weight_map"}), tensors exactly as
// weights.hpp's schema names them, values deterministic from the seed.
//
//   kimi_preset_config(preset, num_layers, &json)  config.json of a preset:
//     "tiny"       flat DeepseekV3 (model_type deepseek_v3, tensors "model."): 4 layers (layer 0
//                  dense, 1..3 MoE), hidden 128, 4 MLA heads (q_lora 64, kv_lora 32, qk 16+8,
//                  v 16), 8 routed experts top-2 + 1 shared (width 32), n_group 2 / topk_group 1
//                  (group-limited routing), vocab 512, yarn factor 4. Writes in well under 1 s.
//     "kimi-k2.5"  Kimi-K2.5's nested form (model_type kimi_k25, text_config, tensors
//                  "language_model.model.") with kimi.md's real dimensions (61 layers, ~1T
//                  parameters: pass num_layers to keep it writable).
//     "kimi-k2.5-1gpu"  kimi-k2.5 with kKimi1GpuExperts (64) routed experts per layer instead of
//                  384: every per-token dimension is the real model's (so are the bytes a decode
//                  step reads at batch 1), and with INT4 experts the 61 layers fit one H200
//                  (~118 GB; generate_kimi_cuda_model draws them on the GPU, no checkpoint).
//     num_layers (optional) overrides num_hidden_layers (>= 1); layer 0 stays dense.
//   kimi_int4_quantization_config()                Kimi-K2.5's quantization_config (kimi.md).
//   write_random_checkpoint(dir, config, seed, int4, shards, progress, options)
//     `config` must not carry a quantization_config: int4 = true adds Kimi's (in text_config for
//     the nested form), which makes every routed expert INT4 (io::quantize_int4_group of the same
//     float matrix the bf16 checkpoint would hold), everything else bf16. `dir` is created and
//     must be empty (nothing is overwritten). shards in [1, number of tensors].
//   write_random_preset(dir, preset, seed, int4, shards, num_layers, progress, options)
//   KimiRandomOptions (all off by default: the checkpoint described here, byte for byte):
//     repeat_period P  0 = off. P in [2, vocab_size]: a checkpoint whose greedy next token after
//       token t < P is (t + 1) mod P whatever the context (text that repeats with period P, for
//       drafts that look text up, e.g. n-gram). Same tensors, dtypes, shapes (INT4 experts when
//       int4) and draws, except:
//       - every matrix that writes into the residual stream is zero: each attention o_proj, dense
//         MLP and shared-expert down_proj, routed expert down_proj (INT4: every q 0, scale 0); so
//         the final hidden state is the token's embedding row e_t;
//       - lm_head row v < P is kRepeatHeadNorm * e_u / |e_u|, u = (v - 1) mod P, e_u the stored
//         (bf16) embedding row; rows v >= P stay N(0, 1/H).
//       After the final norm (weights 1 + N(0, 0.1^2)) the successor's logit is about
//       kRepeatHeadNorm * sqrt(H) (45 at the tiny preset's H = 128); the row of another u gives
//       about kRepeatHeadNorm * sqrt(H) * cos(e_t, e_u) ~ kRepeatHeadNorm * N(0, 1), rows v >= P
//       about N(0, 1). After a token t >= P the next token is whichever row wins (not specified).
//       Costs P * H floats on top (the embedding's first P rows, drawn again): 4.7 GB for
//       P = vocab at Kimi-K2.5's dimensions. Errors: P outside [2, vocab_size];
//       tie_word_embeddings (lm_head is the embedding then). Nothing is written on an error.
//     config_only  write config.json (with the quantization_config int4 adds) and no tensors:
//       the model of a preset too large to write, whose weights the loader draws instead
//       (random_weights.hpp; `specdec-kimi generate / serve --random-weights SEED`). Not with
//       repeat_period.
//
// Values (per tensor an std::mt19937_64 seeded from (seed, tensor name), so a tensor does not
// depend on sharding or on the other tensors; normals by Box-Muller): embedding N(0, 1); norms
// 1 + N(0, 0.1^2); matrices [out, in] N(0, 1/in); e_score_correction_bias N(0, 0.01^2) in F32.
// Tensors are generated in windows on every core (at most 2 per thread and 2^28 values at a time;
// an INT4 linear's packed words and scales from one generated matrix) and streamed to the file in
// order; the bytes do not depend on the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/atomic_file.hpp"
#include "specdec/io/compressed_tensors.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/progress.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/random_weights.hpp"
#include "specdec/model/kimi/weights.hpp"

namespace specdec::model::kimi {

inline constexpr char const* kKimiPresets = "tiny, kimi-k2.5, kimi-k2.5-1gpu";

// Routed experts per layer of the kimi-k2.5-1gpu preset.
inline constexpr int kKimi1GpuExperts = 64;

// The norm of the lm_head rows of a repeat_period checkpoint (see the top of this file).
inline constexpr double kRepeatHeadNorm = 4.0;

// Options of write_random_checkpoint / write_random_preset (see the top of this file).
struct KimiRandomOptions {
  int repeat_period = 0;  // 0: off; else in [2, vocab_size]: greedy text repeats 0, 1, .., P - 1
  bool config_only = false;  // config.json alone: no tensors (see the top of this file)
};

// quantization_config of Kimi-K2.5 (kimi.md): INT4 group 32, only mlp.experts.* quantized.
inline nlohmann::json kimi_int4_quantization_config() {
  return nlohmann::json::parse(R"({
    "config_groups": {"group_0": {
      "input_activations": null, "output_activations": null, "targets": ["Linear"],
      "weights": {"actorder": null, "dynamic": false, "group_size": 32, "num_bits": 4,
                  "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                  "symmetric": true, "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null, "quant_method": "compressed-tensors",
    "quantization_status": "compressed"})");
}

inline Status kimi_preset_config(std::string_view preset, std::optional<int> num_layers,
                                 nlohmann::json* out) {
  using nlohmann::json;
  if (out == nullptr) return Status::InvalidArgument("kimi_preset_config: out is null");
  if (num_layers && *num_layers < 1) {
    return Status::InvalidArgument("num_layers " + std::to_string(*num_layers) +
                                   " for preset \"" + std::string(preset) + "\": must be >= 1");
  }
  try {
    if (preset == "tiny") {
      json j = json::parse(R"({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 32, "intermediate_size": 96,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 2, "topk_group": 1,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
        "routed_scaling_factor": 2.5, "vocab_size": 512, "rms_norm_eps": 1e-06,
        "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 64},
        "max_position_embeddings": 256,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
        "hidden_act": "silu", "attention_bias": false, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"})");
      if (num_layers) j["num_hidden_layers"] = *num_layers;
      *out = std::move(j);
      return Status::Ok();
    }
    if (preset == "kimi-k2.5" || preset == "kimi-k2.5-1gpu") {
      json j = json::parse(R"({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
        "tie_word_embeddings": false,
        "text_config": {
          "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
          "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64,
          "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
          "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1,
          "moe_intermediate_size": 2048, "intermediate_size": 18432,
          "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
          "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
          "routed_scaling_factor": 2.827, "vocab_size": 163840, "rms_norm_eps": 1e-05,
          "rope_theta": 50000.0,
          "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 32.0, "beta_slow": 1.0,
                           "mscale": 1.0, "mscale_all_dim": 1.0,
                           "original_max_position_embeddings": 4096},
          "max_position_embeddings": 262144,
          "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
          "hidden_act": "silu", "attention_bias": false, "torch_dtype": "bfloat16"}})");
      if (preset == "kimi-k2.5-1gpu") j["text_config"]["n_routed_experts"] = kKimi1GpuExperts;
      if (num_layers) j["text_config"]["num_hidden_layers"] = *num_layers;
      *out = std::move(j);
      return Status::Ok();
    }
  } catch (std::exception const& e) {
    return Status::Internal("kimi_preset_config: " + std::string(e.what()));
  }
  return Status::InvalidArgument("unknown preset \"" + std::string(preset) +
                                 "\" (presets: " + kKimiPresets + ")");
}

namespace detail {

// Changes a tensor's drawn float values in place before they are stored (and, for an INT4
// linear, quantized); called from several threads at once.
using ValueEdit = std::function<void(std::vector<float>*)>;

// One tensor to write: a plain tensor, or part `part` (0 packed / weight, 1 scale, 2 shape) of a
// Linear module; `given`, when set, holds the tensor's bytes (written as they are, not drawn);
// `edit`, when set, changes the drawn values (repeat_period).
struct WriteEntry {
  TensorSpec spec;
  bool is_linear = false;
  LinearSpec linear;
  int part = 0;
  std::shared_ptr<std::vector<std::byte> const> given;
  ValueEdit edit = {};
};

struct WriteListSink {
  std::vector<WriteEntry>* out;
  Status tensor(TensorSpec const& s, TensorView*) {
    out->push_back(WriteEntry{s, false, {}, 0, {}});
    return Status::Ok();
  }
  Status linear(LinearSpec const& s, LinearWeights*) {
    std::vector<TensorSpec> t = s.tensors();
    for (size_t i = 0; i < t.size(); ++i) {
      out->push_back(WriteEntry{std::move(t[i]), true, s, static_cast<int>(i), {}});
    }
    return Status::Ok();
  }
};

// n values mean + stddev * N(0, 1) (Box-Muller on std::mt19937_64, whose output the standard
// fixes, so files are identical across standard libraries).
inline std::vector<float> random_normals(uint64_t seed, std::string_view key, int64_t n,
                                         double mean, double stddev) {
  std::mt19937_64 rng(tensor_seed(seed, key));
  std::vector<float> v(static_cast<size_t>(n));
  constexpr double kTwoPi = 6.283185307179586;
  for (int64_t i = 0; i < n; i += 2) {
    double const u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double const u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;          // [0, 1)
    double const r = std::sqrt(-2.0 * std::log(u1));
    v[static_cast<size_t>(i)] = static_cast<float>(mean + stddev * r * std::cos(kTwoPi * u2));
    if (i + 1 < n) {
      v[static_cast<size_t>(i + 1)] =
          static_cast<float>(mean + stddev * r * std::sin(kTwoPi * u2));
    }
  }
  return v;
}

// The float matrix of a Linear (same for its bf16 and INT4 forms).
inline std::vector<float> random_linear(uint64_t seed, LinearSpec const& l) {
  return random_normals(seed, l.module_name + ".weight", l.out * l.in, 0.0,
                        1.0 / std::sqrt(static_cast<double>(l.in)));
}

template <class T>
void append_bytes(std::vector<T> const& v, std::vector<std::byte>* out) {
  out->resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out->data(), v.data(), out->size());
}

// The float matrix stored for a Linear entry: random_linear, then the entry's edit.
inline std::vector<float> linear_values(uint64_t seed, WriteEntry const& e) {
  std::vector<float> W = random_linear(seed, e.linear);
  if (e.edit) e.edit(&W);
  return W;
}

// The packed words and scales of an INT4 linear entry (both from one generated matrix).
inline Status generate_int4(uint64_t seed, WriteEntry const& e, std::vector<std::byte>* packed_out,
                            std::vector<std::byte>* scale_out) {
  LinearSpec const& l = e.linear;
  std::vector<float> const W = linear_values(seed, e);
  std::vector<int32_t> packed(static_cast<size_t>(l.out * (l.in / io::kInt4PerWord)));
  std::vector<uint16_t> scale(static_cast<size_t>(l.out * (l.in / l.group_size)));
  SPECDEC_RETURN_IF_ERROR(
      io::quantize_int4_group(W.data(), l.out, l.in, l.group_size, packed.data(), scale.data()));
  if (packed_out) append_bytes(packed, packed_out);
  if (scale_out) append_bytes(scale, scale_out);
  return Status::Ok();
}

inline Status generate_entry(uint64_t seed, WriteEntry const& e, std::vector<std::byte>* out) {
  if (e.given) {
    *out = *e.given;
    return Status::Ok();
  }
  if (e.is_linear && e.linear.int4) {
    LinearSpec const& l = e.linear;
    if (e.part == 2) {
      append_bytes(std::vector<int32_t>{static_cast<int32_t>(l.out), static_cast<int32_t>(l.in)},
                   out);
      return Status::Ok();
    }
    return generate_int4(seed, e, e.part == 0 ? out : nullptr, e.part == 1 ? out : nullptr);
  }
  std::vector<float> v;
  if (e.is_linear) {
    v = linear_values(seed, e);
  } else {
    int64_t const n = e.spec.bytes() / dtype_size(e.spec.dtype);
    switch (e.spec.init) {
      case TensorInit::kEmbedding: v = random_normals(seed, e.spec.name, n, 0.0, 1.0); break;
      case TensorInit::kNorm: v = random_normals(seed, e.spec.name, n, 1.0, 0.1); break;
      case TensorInit::kBias: v = random_normals(seed, e.spec.name, n, 0.0, 0.01); break;
      case TensorInit::kMatrix:
        v = random_normals(seed, e.spec.name, n, 0.0,
                           1.0 / std::sqrt(static_cast<double>(e.spec.shape.back())));
        break;
    }
    if (e.edit) e.edit(&v);
  }
  if (e.spec.dtype == Dtype::kF32) {
    append_bytes(v, out);
    return Status::Ok();
  }
  if (e.spec.dtype != Dtype::kBF16) {
    return Status::Internal("random checkpoint: tensor \"" + e.spec.name + "\" has dtype " +
                            dtype_name(e.spec.dtype) + ", expected BF16 or F32");
  }
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  append_bytes(b, out);
  return Status::Ok();
}

// Generates the bytes of entries[idx[k]] into (*bytes)[k] for every k, on up to
// hardware_concurrency threads (every tensor has its own random stream, so the values do not
// depend on the threads); the packed and scale parts of one INT4 linear share one generated
// matrix.
inline Status generate_window(uint64_t seed, std::vector<WriteEntry const*> const& entries,
                              std::vector<size_t> const& idx,
                              std::vector<std::vector<std::byte>>* bytes) {
  std::vector<std::vector<size_t>> jobs;  // positions k in idx, one job per tensor or INT4 pair
  std::map<std::string, size_t> int4_job;
  for (size_t k = 0; k < idx.size(); ++k) {
    WriteEntry const& e = *entries[idx[k]];
    if (e.is_linear && e.linear.int4 && e.part < 2) {
      auto const [it, fresh] = int4_job.try_emplace(e.linear.module_name, jobs.size());
      if (fresh) jobs.emplace_back();
      jobs[it->second].push_back(k);
    } else {
      jobs.push_back({k});
    }
  }
  bytes->assign(idx.size(), {});
  std::vector<Status> status(jobs.size());
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t j = next++; j < jobs.size(); j = next++) {
      try {
        std::vector<size_t> const& job = jobs[j];
        WriteEntry const& e = *entries[idx[job[0]]];
        if (job.size() == 2) {  // both INT4 parts
          bool const first_packed = e.part == 0;
          status[j] = generate_int4(seed, e, &(*bytes)[job[first_packed ? 0 : 1]],
                                    &(*bytes)[job[first_packed ? 1 : 0]]);
        } else {
          status[j] = generate_entry(seed, e, &(*bytes)[job[0]]);
        }
      } catch (std::exception const& ex) {
        status[j] = Status::Internal(std::string("random checkpoint: generating a tensor: ") +
                                     ex.what());
      }
    }
  };
  size_t const threads =
      std::min<size_t>(jobs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (Status const& st : status) SPECDEC_RETURN_IF_ERROR(st);
  return Status::Ok();
}

// Writes one shard: plans the header over placeholder spans, then generates the tensors in
// windows (generate_window, a bounded number of generated values at a time) and writes them in
// order (through path.tmp and a rename).
inline Status write_random_shard(std::string const& path, uint64_t seed,
                                 std::vector<WriteEntry const*> const& entries,
                                 std::map<std::string, std::string> const& metadata,
                                 io::ProgressFn const& progress, uint64_t* done, uint64_t total) {
  size_t max_bytes = 1;
  for (WriteEntry const* e : entries) max_bytes = std::max(max_bytes, size_t(e->spec.bytes()));
  // Never read or written: planning only needs spans of the right sizes.
  std::unique_ptr<std::byte[]> placeholder(new std::byte[max_bytes]);
  std::vector<io::TensorToWrite> plan;
  plan.reserve(entries.size());
  for (WriteEntry const* e : entries) {
    plan.push_back(io::TensorToWrite{e->spec.name, e->spec.dtype, e->spec.shape,
                                     {placeholder.get(), size_t(e->spec.bytes())}});
  }
  std::string prefix;
  std::vector<size_t> order;
  SPECDEC_RETURN_IF_ERROR(io::plan_safetensors(plan, metadata, path, &prefix, &order));
  io::AtomicFileWriter file(path);  // removes path.tmp on every early return
  SPECDEC_RETURN_IF_ERROR(file.open());
  bool ok = file.write(prefix.data(), prefix.size());
  // A window holds up to 2 tensors per thread and 2^28 generated values (1 GiB of floats).
  constexpr uint64_t kWindowValues = uint64_t{1} << 28;
  size_t const per_window = 2 * std::max(1u, std::thread::hardware_concurrency());
  auto values = [](WriteEntry const& e) -> uint64_t {
    if (e.is_linear) return static_cast<uint64_t>(e.linear.out * e.linear.in);
    return static_cast<uint64_t>(e.spec.bytes() / dtype_size(e.spec.dtype));
  };
  std::vector<std::vector<std::byte>> bytes;
  for (size_t w = 0; ok && w < order.size();) {
    std::vector<size_t> idx;
    uint64_t generated = 0;
    while (w < order.size() && idx.size() < per_window &&
           (idx.empty() || generated + values(*entries[order[w]]) <= kWindowValues)) {
      generated += values(*entries[order[w]]);
      idx.push_back(order[w++]);
    }
    SPECDEC_RETURN_IF_ERROR(generate_window(seed, entries, idx, &bytes));
    for (size_t k = 0; ok && k < idx.size(); ++k) {
      size_t const i = idx[k];
      if (bytes[k].size() != plan[i].bytes.size()) {
        return Status::Internal(path + ": tensor \"" + plan[i].name + "\": generated " +
                                std::to_string(bytes[k].size()) + " bytes, planned " +
                                std::to_string(plan[i].bytes.size()));
      }
      ok = file.write(bytes[k].data(), bytes[k].size());
      *done += bytes[k].size();
      if (progress) progress(*done, total, plan[i].name);
    }
  }
  return file.commit();
}

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// repeat_period P (see the top of this file): zero edits on every matrix that writes into the
// residual stream (o_proj, down_proj: the schema's only such modules) and the successor rows on
// lm_head.
inline Status set_repeat_edits(io::DeepseekV3Config const& c, int P, uint64_t seed,
                               std::vector<WriteEntry>* entries) {
  int64_t const V = c.vocab_size, H = c.hidden_size;
  if (P < 2 || P > V) {
    return Status::InvalidArgument(c.source + ": repeat_period " + std::to_string(P) +
                                   " outside [2, vocab_size " + std::to_string(V) + "]");
  }
  if (c.tie_word_embeddings) {
    return Status::InvalidArgument(
        c.source + ": repeat_period " + std::to_string(P) +
        " needs tie_word_embeddings false (a tied lm_head is the embedding itself)");
  }
  // The embedding's first P rows (a prefix of its stream) as stored, then the head rows.
  std::vector<float> emb =
      random_normals(seed, c.tensor_prefix + "embed_tokens.weight", int64_t{P} * H, 0.0, 1.0);
  for (float& x : emb) x = bf16_to_float(float_to_bf16(x));
  auto rows = std::make_shared<std::vector<float>>(emb.size());
  for (int64_t v = 0; v < P; ++v) {
    float const* e = emb.data() + ((v + P - 1) % P) * H;
    double norm = 0.0;
    for (int64_t i = 0; i < H; ++i) norm += static_cast<double>(e[i]) * e[i];
    double const k = kRepeatHeadNorm / std::sqrt(norm);
    for (int64_t i = 0; i < H; ++i) (*rows)[v * H + i] = static_cast<float>(k * e[i]);
  }
  std::shared_ptr<std::vector<float> const> const head = std::move(rows);
  std::string const lm_head = c.lm_head_prefix.substr(0, c.lm_head_prefix.size() - 1);
  int heads = 0;
  for (WriteEntry& e : *entries) {
    if (!e.is_linear) continue;
    std::string const& m = e.linear.module_name;
    if (ends_with(m, ".o_proj") || ends_with(m, ".down_proj")) {
      e.edit = [](std::vector<float>* W) { std::fill(W->begin(), W->end(), 0.0f); };
    } else if (m == lm_head) {
      e.edit = [head](std::vector<float>* W) { std::copy(head->begin(), head->end(), W->begin()); };
      ++heads;
    }
  }
  if (heads != 1) {
    return Status::Internal(c.source + ": repeat_period: " + std::to_string(heads) + " modules \"" +
                            lm_head + "\" in the schema, expected 1");
  }
  return Status::Ok();
}

inline Status write_random_checkpoint_impl(std::string const& dir, nlohmann::json config,
                                           uint64_t seed, bool int4, int shards,
                                           io::ProgressFn const& progress,
                                           KimiRandomOptions const& options) {
  namespace fs = std::filesystem;
  std::string const config_path = (fs::path(dir) / "config.json").string();
  if (!config.is_object()) {
    return Status::InvalidArgument(config_path + ": config must be a JSON object, got " +
                                   std::string(config.type_name()));
  }
  bool const nested = config.contains("text_config") && config["text_config"].is_object() &&
                      config.value("model_type", std::string()) == "kimi_k25";
  nlohmann::json& text = nested ? config["text_config"] : config;
  for (nlohmann::json const* j : {&config, &text}) {
    if (j->contains("quantization_config")) {
      return Status::InvalidArgument(
          config_path + ": the given config already has a quantization_config; pass it without "
                        "one (int4 = true adds Kimi-K2.5's)");
    }
  }
  if (int4) text["quantization_config"] = kimi_int4_quantization_config();
  io::DeepseekV3Config parsed;
  std::string const config_text = config.dump(2) + "\n";
  SPECDEC_RETURN_IF_ERROR(io::parse_config(config_text, config_path, &parsed));

  std::vector<WriteEntry> entries;
  KimiWeights scratch;
  WriteListSink sink{&entries};
  SPECDEC_RETURN_IF_ERROR(walk_kimi_schema(parsed, &scratch, sink));
  if (options.repeat_period != 0) {
    if (options.config_only) {
      return Status::InvalidArgument(dir + ": repeat_period edits the written tensors; a "
                                           "config_only checkpoint has none");
    }
    SPECDEC_RETURN_IF_ERROR(set_repeat_edits(parsed, options.repeat_period, seed, &entries));
  }
  int64_t const T = static_cast<int64_t>(entries.size());
  if (shards < 1 || shards > T) {
    return Status::InvalidArgument("shards = " + std::to_string(shards) + " for " + dir +
                                   ": must be in [1, " + std::to_string(T) +
                                   "] (the checkpoint has " + std::to_string(T) + " tensors)");
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::InvalidArgument("cannot create directory " + dir + ": " + ec.message());
  if (!fs::is_directory(dir, ec)) return Status::InvalidArgument(dir + ": not a directory");
  if (!fs::is_empty(dir, ec) || ec) {
    return Status::InvalidArgument(dir + ": directory is not empty; random checkpoints are "
                                         "written only into an empty (or new) directory");
  }
  if (options.config_only) return io::write_file_atomically(config_path, config_text);

  // Tensors to shards in schema order, by bytes, every shard non-empty.
  uint64_t total = 0;
  for (WriteEntry const& e : entries) total += static_cast<uint64_t>(e.spec.bytes());
  std::vector<std::vector<WriteEntry const*>> by_shard(static_cast<size_t>(shards));
  uint64_t cum = 0;
  int64_t prev = 0;
  for (int64_t j = 0; j < T; ++j) {
    int64_t k = total == 0 ? 0 : static_cast<int64_t>((static_cast<double>(cum) * shards) / total);
    int64_t const lo = std::max<int64_t>(j == 0 ? 0 : prev, shards - (T - j));
    int64_t const hi = j == 0 ? 0 : std::min<int64_t>(prev + 1, shards - 1);
    k = std::min(std::max(k, lo), hi);
    by_shard[static_cast<size_t>(k)].push_back(&entries[static_cast<size_t>(j)]);
    prev = k;
    cum += static_cast<uint64_t>(entries[static_cast<size_t>(j)].spec.bytes());
  }

  std::map<std::string, std::string> const metadata{{"format", "pt"}};
  uint64_t done = 0;
  if (shards == 1) {
    SPECDEC_RETURN_IF_ERROR(write_random_shard((fs::path(dir) / io::kSafetensorsSingleFile).string(),
                                               seed, by_shard[0], metadata, progress, &done,
                                               total));
  } else {
    nlohmann::json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::json::object();
    for (int k = 0; k < shards; ++k) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, shards);
      SPECDEC_RETURN_IF_ERROR(write_random_shard((fs::path(dir) / name).string(), seed,
                                                 by_shard[static_cast<size_t>(k)], metadata,
                                                 progress, &done, total));
      for (WriteEntry const* e : by_shard[static_cast<size_t>(k)]) {
        index["weight_map"][e->spec.name] = name;
      }
    }
    SPECDEC_RETURN_IF_ERROR(io::write_file_atomically(
        (fs::path(dir) / io::kSafetensorsIndexFile).string(), index.dump(2) + "\n"));
  }
  return io::write_file_atomically(config_path, config_text);
}

}  // namespace detail

// Writes a random checkpoint of `config` (a config.json object: see the top of this file) to
// `dir`. Errors name the directory / file and the problem; nothing is overwritten.
inline Status write_random_checkpoint(std::string const& dir, nlohmann::json const& config,
                                      uint64_t seed, bool int4, int shards,
                                      io::ProgressFn progress = {},
                                      KimiRandomOptions const& options = {}) {
  try {
    return detail::write_random_checkpoint_impl(dir, config, seed, int4, shards, progress, options);
  } catch (std::exception const& e) {
    return Status::Internal(dir + ": writing a random checkpoint: " + e.what());
  }
}

// The same for a preset (kimi_preset_config).
inline Status write_random_preset(std::string const& dir, std::string_view preset, uint64_t seed,
                                  bool int4, int shards, std::optional<int> num_layers = {},
                                  io::ProgressFn progress = {},
                                  KimiRandomOptions const& options = {}) {
  nlohmann::json config;
  SPECDEC_RETURN_IF_ERROR(kimi_preset_config(preset, num_layers, &config));
  return write_random_checkpoint(dir, config, seed, int4, shards, std::move(progress), options);
}

}  // namespace specdec::model::kimi
