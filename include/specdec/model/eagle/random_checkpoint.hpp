// Random EAGLE-family draft checkpoints for tests and benchmarks: config.json +
// model.safetensors in the layout of `architecture` (config.hpp; weights.hpp's draft_schema):
// EAGLE-3 (SpecForge, "LlamaForCausalLMEagle3", the default) for a layer set, or EAGLE-1/2
// ("LlamaForCausalLMEagle": fc [H, 2H] + fc.bias, layers.0.*, no lm_head; `layers` must be empty),
// for a given target config, values deterministic from the seed.
//
//   write_random_draft(dir, target, layers, seed, options, architecture)
//
// Sizes: H = Ht = target.hidden_size; V = target.vocab_size; rms_norm_eps, rope_theta and
// max_position_embeddings the target's (rope unscaled). Options (0 = derived):
//   draft_vocab_size  Vd in [1, V]; 0 = V
//   num_heads         0 = the largest divisor of H that is <= min(64, max(1, H / 32))
//                     (H = 128: 4 heads; H = 7168: 64)
//   num_kv_heads      0 = 8 when heads >= 16, else max(1, heads / 2), lowered until it divides
//                     heads (H = 128: 2; H = 7168: 8)
//   head_dim          0 = H / heads (H = 128: 32; H = 7168: 112); written to config.json
//   intermediate_size 0 = target.intermediate_size (its dense MLP width; tiny: 96)
//   with_embedding    write embed_tokens.weight [V, H] (else the draft reads the target's)
//   with_fc_bias      EAGLE-1/2: write fc.bias [H] (SafeAILab's and SGLang's fc has a bias)
// EAGLE-3 only: draft_vocab_size, target_hidden_size and eagle_config (the layer set) in
// config.json; EAGLE-1/2 writes none of them (Vd = V, Ht = H).
//
// Values: model/kimi/random_checkpoint.hpp's streams and shard writer (per tensor an
// std::mt19937_64 seeded from (seed, name), Box-Muller normals, generated on every core): matrices
// [out, in] N(0, 1/in) (so a row's output has the input's scale and logits are O(1)), norms
// 1 + N(0, 0.1^2), embedding N(0, 1), fc.bias N(0, 0.01^2), all BF16. d2t / t2d: Vd == V gives
// the identity (d2t 0, t2d all true); Vd < V a subset of Vd target ids drawn by a partial
// Fisher-Yates shuffle on the seed's stream "d2t", sorted ascending, d2t[d] = id_d - d, t2d true
// exactly there. `dir` is created and must be empty (nothing is overwritten). Errors name the
// directory and the problem: a layer set that is empty, invalid or out of the target's range, Vd
// outside [1, V], heads / kv heads / head_dim that do not fit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/atomic_file.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/eagle/config.hpp"
#include "specdec/model/eagle/weights.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/policy/layers.hpp"

namespace specdec::model::eagle {

struct DraftRandomOptions {
  int draft_vocab_size = 0;  // 0 = the target's vocab_size
  bool with_embedding = false;
  int num_heads = 0;          // 0 = derived (top of file)
  int num_kv_heads = 0;       // 0 = derived
  int head_dim = 0;           // 0 = hidden / heads
  int intermediate_size = 0;  // 0 = target.intermediate_size
  bool with_fc_bias = true;   // EAGLE-1/2 only
};

namespace detail {

// The draft's config.json for `target` (see the top of this file for the derived sizes).
inline Status random_eagle3_config(io::DeepseekV3Config const& target, std::span<int const> layers,
                                   DraftRandomOptions const& o, std::string const& architecture,
                                   nlohmann::json* out) {
  int const H = target.hidden_size, V = target.vocab_size;
  std::string const fn = "write_random_draft: ";
  bool const eagle3 = !is_one_of(architecture, {kEagleArchitecture, kEagleArchitectureVllm});
  if (eagle3) {
    SPECDEC_RETURN_IF_ERROR(check_layer_ids(std::vector<int>(layers.begin(), layers.end()),
                                            target.num_hidden_layers, fn + "layers", ""));
  } else if (!layers.empty()) {
    return Status::InvalidArgument(fn + "layers " + format_layers(layers) + " given for " +
                                   architecture +
                                   ": an EAGLE-1/2 draft reads the target's last hidden state, "
                                   "not a layer set (write an EAGLE-3 draft for a layer set)");
  }
  if (!eagle3 && o.draft_vocab_size != 0 && o.draft_vocab_size != V) {
    return Status::InvalidArgument(fn + "draft_vocab_size " + std::to_string(o.draft_vocab_size) +
                                   ": an EAGLE-1/2 draft predicts in the target's vocabulary of " +
                                   std::to_string(V));
  }
  int const Vd = o.draft_vocab_size ? o.draft_vocab_size : V;
  if (Vd < 1 || Vd > V) {
    return Status::InvalidArgument(fn + "draft_vocab_size " + std::to_string(Vd) +
                                   " must be in [1, vocab_size " + std::to_string(V) + "]");
  }
  int heads = o.num_heads;
  if (heads == 0) {
    int const cap = std::min(64, std::max(1, H / 32));
    for (heads = cap; H % heads != 0; --heads) {
    }
  }
  int kv = o.num_kv_heads;
  if (kv == 0 && heads >= 1) {
    for (kv = heads >= 16 ? 8 : std::max(1, heads / 2); heads % kv != 0; --kv) {
    }
  }
  if (heads < 1 || kv < 1 || heads % kv != 0) {
    return Status::InvalidArgument(fn + "num_heads " + std::to_string(heads) + " / num_kv_heads " +
                                   std::to_string(kv) + ": both >= 1, kv heads dividing heads");
  }
  int hd = o.head_dim;
  if (hd == 0) {
    if (H % heads != 0) {
      return Status::InvalidArgument(fn + "hidden " + std::to_string(H) + " is not divisible by " +
                                     std::to_string(heads) + " heads: give head_dim");
    }
    hd = H / heads;
  }
  if (hd < 2 || hd % 2 != 0) {
    return Status::InvalidArgument(fn + "head_dim " + std::to_string(hd) + " must be even, >= 2");
  }
  int const inter = o.intermediate_size ? o.intermediate_size : target.intermediate_size;
  if (inter < 1) {
    return Status::InvalidArgument(fn + "intermediate_size " + std::to_string(inter) +
                                   " must be >= 1");
  }
  nlohmann::json j;
  j["architectures"] = {architecture};
  j["model_type"] = "llama";
  j["num_hidden_layers"] = 1;
  j["hidden_size"] = H;
  j["intermediate_size"] = inter;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv;
  j["head_dim"] = hd;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = target.rms_norm_eps;
  j["rope_theta"] = target.rope_theta;
  j["rope_scaling"] = nullptr;
  j["max_position_embeddings"] = target.max_position_embeddings;
  j["vocab_size"] = V;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "bfloat16";
  if (eagle3) {
    j["draft_vocab_size"] = Vd;
    j["target_hidden_size"] = H;
    j["eagle_config"] = {
        {"eagle_aux_hidden_state_layer_ids", std::vector<int>(layers.begin(), layers.end())},
        {"use_aux_hidden_state", true}};
  }
  *out = std::move(j);
  return Status::Ok();
}

// d2t [Vd] and t2d [V] bytes (see the top of this file).
inline void random_vocab_maps(uint64_t seed, int64_t V, int64_t Vd, std::vector<std::byte>* d2t,
                              std::vector<std::byte>* t2d) {
  std::vector<int64_t> ids(static_cast<size_t>(V));
  for (int64_t t = 0; t < V; ++t) ids[static_cast<size_t>(t)] = t;
  if (Vd < V) {
    std::mt19937_64 rng(kimi::detail::tensor_seed(seed, "d2t"));
    for (int64_t i = 0; i < Vd; ++i) {
      int64_t const pick = i + static_cast<int64_t>(rng() % static_cast<uint64_t>(V - i));
      std::swap(ids[static_cast<size_t>(i)], ids[static_cast<size_t>(pick)]);
    }
    ids.resize(static_cast<size_t>(Vd));
    std::sort(ids.begin(), ids.end());
  }
  std::vector<int64_t> off(static_cast<size_t>(Vd));
  std::vector<uint8_t> mark(static_cast<size_t>(V), 0);
  for (int64_t d = 0; d < Vd; ++d) {
    off[static_cast<size_t>(d)] = ids[static_cast<size_t>(d)] - d;
    mark[static_cast<size_t>(ids[static_cast<size_t>(d)])] = 1;
  }
  kimi::detail::append_bytes(off, d2t);
  kimi::detail::append_bytes(mark, t2d);
}

inline Status write_random_eagle3_impl(std::string const& dir, io::DeepseekV3Config const& target,
                                       std::span<int const> layers, uint64_t seed,
                                       DraftRandomOptions const& options,
                                       std::string const& architecture) {
  namespace fs = std::filesystem;
  nlohmann::json j;
  SPECDEC_RETURN_IF_ERROR(random_eagle3_config(target, layers, options, architecture, &j));
  std::string const config_path = (fs::path(dir) / "config.json").string();
  std::string const text = j.dump(2) + "\n";
  // The schema of what is written, from the config as the loader reads it.
  DraftConfig c;
  SPECDEC_RETURN_IF_ERROR(parse_draft_config(j.dump(), config_path, target.num_hidden_layers, &c));

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::InvalidArgument("cannot create directory " + dir + ": " + ec.message());
  if (!fs::is_directory(dir, ec)) return Status::InvalidArgument(dir + ": not a directory");
  if (!fs::is_empty(dir, ec) || ec) {
    return Status::InvalidArgument(dir +
                                   ": directory is not empty; random checkpoints are "
                                   "written only into an empty (or new) directory");
  }

  auto d2t = std::make_shared<std::vector<std::byte>>();
  auto t2d = std::make_shared<std::vector<std::byte>>();
  random_vocab_maps(seed, c.vocab_size, c.draft_vocab_size, d2t.get(), t2d.get());
  std::vector<kimi::detail::WriteEntry> entries;
  uint64_t total = 0;
  for (DraftTensorSpec const& s :
       draft_schema(c, options.with_embedding, !c.eagle3() && options.with_fc_bias)) {
    kimi::TensorInit const init = s.name == kDraftEmbedTokens ? kimi::TensorInit::kEmbedding
                                  : s.name == kDraftFcBias    ? kimi::TensorInit::kBias
                                  : s.norm                    ? kimi::TensorInit::kNorm
                                                              : kimi::TensorInit::kMatrix;
    kimi::detail::WriteEntry e{kimi::TensorSpec{s.name, s.dtype, s.shape, init}, false, {}, 0, {}};
    if (s.name == "d2t") e.given = d2t;
    if (s.name == "t2d") e.given = t2d;
    total += static_cast<uint64_t>(e.spec.bytes());
    entries.push_back(std::move(e));
  }
  std::vector<kimi::detail::WriteEntry const*> shard;
  for (auto const& e : entries) shard.push_back(&e);
  uint64_t done = 0;
  SPECDEC_RETURN_IF_ERROR(
      kimi::detail::write_random_shard((fs::path(dir) / io::kSafetensorsSingleFile).string(), seed,
                                       shard, {{"format", "pt"}}, {}, &done, total));
  return io::write_file_atomically(config_path, text);
}

}  // namespace detail

// Writes a random draft for `target` into `dir`: EAGLE-3 reading `layers` (policy/layers.hpp
// ids, in order), or EAGLE-1/2 (`layers` empty) when `architecture` names one (top of this file).
inline Status write_random_draft(std::string const& dir, io::DeepseekV3Config const& target,
                                 std::span<int const> layers, uint64_t seed,
                                 DraftRandomOptions const& options = {},
                                 std::string const& architecture = kEagle3Architecture) {
  try {
    return detail::write_random_eagle3_impl(dir, target, layers, seed, options, architecture);
  } catch (std::exception const& e) {
    return Status::Internal(dir + ": writing a random draft: " + e.what());
  }
}

}  // namespace specdec::model::eagle
