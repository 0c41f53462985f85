// Kimi / DeepSeek-V3 CPU reference forward (model/kimi/forward_reference.hpp): RMSNorm, YaRN
// inv_freq for Kimi-K2.5's config, interleaved RoPE and group-limited MoE routing on hand-worked
// numbers; on the tiny random preset: causality, relative-position invariance of start_position,
// aux capture (embedding rows exact, last layer -> norm -> lm_head = logits), INT4 vs bf16
// checkpoints from the same seed, and every input error.
#include "specdec/model/kimi/forward_reference.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "support/kimi_model.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace kimi = specdec::model::kimi;
using nlohmann::json;
using specdec::Status;
using specdec::StatusCode;
using specdec::io::DeepseekV3Config;
using specdec::testing::load_tiny_kimi;
using specdec::testing::TempDir;
using specdec::testing::TinyKimi;

using specdec::testing::check_error;
using specdec::testing::contains;

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 97 + 13) % 512);
  return t;
}

float bf16_at(specdec::io::TensorView const& v, int64_t i) {
  uint16_t b;
  std::memcpy(&b, v.bytes.data() + 2 * i, 2);
  return specdec::bf16_to_float(b);
}

}  // namespace

TEST_CASE("kimi_forward: rms_norm_reference on a hand-worked vector") {
  // x = [3, 4]: mean(x^2) = 12.5; eps 0.5 -> 1/sqrt(13) ; w = [1, 2].
  std::vector<float> x{3.0f, 4.0f}, w{1.0f, 2.0f}, out(2);
  REQUIRE(kimi::rms_norm_reference(x, w, 0.5, out).ok());
  CHECK(out[0] == doctest::Approx(3.0 / std::sqrt(13.0)).epsilon(1e-6));   // 0.832050
  CHECK(out[1] == doctest::Approx(8.0 / std::sqrt(13.0)).epsilon(1e-6));   // 2.218801
  CHECK(out[0] == doctest::Approx(0.832050).epsilon(1e-5));
  // x = [1, 1, 1, 1], eps 1e-6 -> ~1 each.
  std::vector<float> y{1, 1, 1, 1}, w4{1, 1, 1, 1}, o4(4);
  REQUIRE(kimi::rms_norm_reference(y, w4, 1e-6, o4).ok());
  for (float v : o4) CHECK(v == doctest::Approx(1.0 / std::sqrt(1.0 + 1e-6)).epsilon(1e-7));
  check_error(kimi::rms_norm_reference(x, w4, 0.5, out), StatusCode::kInvalidArgument,
              {"rms_norm_reference", "weight 4"});
  check_error(kimi::rms_norm_reference(x, w, 0.0, out), StatusCode::kInvalidArgument, {"eps"});
}

TEST_CASE("kimi_forward: YaRN inv_freq for Kimi-K2.5's config, by hand") {
  json j;
  REQUIRE(kimi::kimi_preset_config("kimi-k2.5", 2, &j).ok());
  DeepseekV3Config c;
  REQUIRE(specdec::io::parse_config(j.dump(), "k25/config.json", &c).ok());
  std::vector<double> inv;
  REQUIRE(kimi::rope_inv_freq(c, &inv).ok());
  REQUIRE(inv.size() == 32);
  // d = 64, theta = 50000, orig = 4096, factor 64, beta_fast 32, beta_slow 1.
  // ln 50000 = 10.819778; cd(b) = 64 ln(4096 / (2 pi b)) / (2 * 10.819778):
  //   cd(32) = 64 * ln(20.37183) / 21.639557 = 64 * 3.014152 / 21.639557 = 8.9145 -> low = 8
  //   cd(1)  = 64 * ln(651.8986) / 21.639557 = 64 * 6.479865 / 21.639557 = 19.1646 -> high = 20
  // extra_i = 50000^(-i/32); ramp_i = clamp((i - 8) / 12, 0, 1); inv = extra (1 - ramp + ramp/64)
  //   i = 0:  1
  //   i = 8:  50000^-0.25 = 1 / 14.953488 = 0.0668740 (ramp 0: pure extrapolation)
  //   i = 14: ramp 0.5: 50000^-0.4375 = 0.00879429, * (0.5 + 0.5/64 = 0.5078125) = 0.00446585
  //   i = 20: ramp 1: 50000^-0.625 / 64 = 0.00115649 / 64 = 1.80702e-5
  //   i = 31: 50000^-0.96875 / 64 = 2.80461e-5 / 64 = 4.38221e-7
  CHECK(inv[0] == doctest::Approx(1.0).epsilon(1e-12));
  CHECK(inv[8] == doctest::Approx(0.0668740).epsilon(1e-5));
  CHECK(inv[14] == doctest::Approx(0.00446585).epsilon(1e-5));
  CHECK(inv[20] == doctest::Approx(1.80702e-5).epsilon(1e-5));
  CHECK(inv[31] == doctest::Approx(4.38221e-7).epsilon(1e-5));
  // i = 7 is still pure extrapolation, i = 9 has ramp 1/12.
  CHECK(inv[7] == doctest::Approx(std::pow(50000.0, -7.0 / 32)).epsilon(1e-12));
  double const e9 = std::pow(50000.0, -9.0 / 32);
  CHECK(inv[9] == doctest::Approx(e9 * (11.0 / 12 + 1.0 / (12 * 64))).epsilon(1e-12));
  // Kimi: cos / sin unscaled (mscale == mscale_all_dim), softmax scale 192^-0.5 * 1.415888^2.
  CHECK(c.rope_cos_sin_scale() == doctest::Approx(1.0));
  CHECK(c.softmax_scale() == doctest::Approx(0.1446796).epsilon(1e-6));

  // No rope_scaling: plain 1 / theta^(2i/d).
  c.rope_scaling.reset();
  REQUIRE(kimi::rope_inv_freq(c, &inv).ok());
  CHECK(inv[8] == doctest::Approx(0.0668740).epsilon(1e-5));
  CHECK(inv[31] == doctest::Approx(2.80461e-5).epsilon(1e-5));

  // factor disagreeing with max_position_embeddings / original: refused, not picked silently.
  j["text_config"]["max_position_embeddings"] = 131072;
  REQUIRE(specdec::io::parse_config(j.dump(), "k25/config.json", &c).ok());
  check_error(kimi::rope_inv_freq(c, &inv), StatusCode::kUnsupported,
              {"k25/config.json", "rope_scaling.factor", "original_max_position_embeddings"});
  check_error(kimi::rope_inv_freq(c, nullptr), StatusCode::kInvalidArgument, {"null"});
}

TEST_CASE("kimi_forward: interleaved RoPE on hand-worked pairs") {
  // inv_freq [pi/2, pi]: at position 1 pair 0 turns 90 degrees, pair 1 turns 180 degrees.
  double const pi = 3.14159265358979323846;
  std::vector<double> inv{pi / 2, pi};
  std::vector<float> x{1.0f, 2.0f, 3.0f, 4.0f};
  REQUIRE(kimi::rope_interleaved_reference(x, 1, inv, 1.0).ok());
  // (1, 2) -> (1 cos90 - 2 sin90, 2 cos90 + 1 sin90) = (-2, 1); (3, 4) -> (-3, -4).
  CHECK(x[0] == doctest::Approx(-2.0));
  CHECK(x[1] == doctest::Approx(1.0));
  CHECK(x[2] == doctest::Approx(-3.0));
  CHECK(x[3] == doctest::Approx(-4.0));
  // Position 0 is the identity times the cos/sin scale.
  std::vector<float> y{1.0f, 2.0f, 3.0f, 4.0f};
  REQUIRE(kimi::rope_interleaved_reference(y, 0, inv, 2.0).ok());
  CHECK(y == std::vector<float>{2.0f, 4.0f, 6.0f, 8.0f});
  std::vector<float> odd{1.0f, 2.0f, 3.0f};
  check_error(kimi::rope_interleaved_reference(odd, 0, inv, 1.0), StatusCode::kInvalidArgument,
              {"rope_interleaved_reference", "3 values"});
}

TEST_CASE("kimi_forward: moe_route_reference, group-limited, by hand") {
  std::vector<int32_t> ids;
  std::vector<float> w;
  SUBCASE("the single best expert sits in a group that is not kept") {
    // groups {0..3} and {4..7}; group score = sum of its top 2:
    //   g0 = 0.95 + 0.10 = 1.05, g1 = 0.60 + 0.55 = 1.15 -> keep g1 only (topk_group 1).
    // top-2 in g1: 4 (0.60), 5 (0.55); weights 0.60/1.15 * 2.5 = 1.304348, 0.55/1.15 * 2.5 =
    // 1.195652. Expert 0 (0.95, the global best) is not chosen.
    std::vector<float> s{0.95f, 0.10f, 0.10f, 0.10f, 0.60f, 0.55f, 0.50f, 0.20f};
    REQUIRE(kimi::moe_route_reference(s, {}, 2, 1, 2, true, 2.5f, &ids, &w).ok());
    CHECK(ids == std::vector<int32_t>{4, 5});
    REQUIRE(w.size() == 2);
    CHECK(w[0] == doctest::Approx(1.304348).epsilon(1e-5));
    CHECK(w[1] == doctest::Approx(1.195652).epsilon(1e-5));
    // n_group 1: plain top-2 = 0 (0.95), 4 (0.60); weights 0.95/1.55, 0.60/1.55 (scale 1).
    REQUIRE(kimi::moe_route_reference(s, {}, 1, 1, 2, true, 1.0f, &ids, &w).ok());
    CHECK(ids == std::vector<int32_t>{0, 4});
    CHECK(w[0] == doctest::Approx(0.612903).epsilon(1e-5));
    CHECK(w[1] == doctest::Approx(0.387097).epsilon(1e-5));
    // Both groups kept (topk_group 2) is the same as n_group 1.
    REQUIRE(kimi::moe_route_reference(s, {}, 2, 2, 2, true, 1.0f, &ids, &w).ok());
    CHECK(ids == std::vector<int32_t>{0, 4});
  }
  SUBCASE("bias selects, unbiased scores weigh; norm off") {
    // s = [0.5, 0.4, 0.3, 0.2], bias [0, 0, 0.25, 0] -> selection [0.5, 0.4, 0.55, 0.2]:
    // top-2 = 2, 0. norm: 0.3/0.8 = 0.375, 0.5/0.8 = 0.625 (scale 1). Without norm, scale 2:
    // 0.6, 1.0.
    std::vector<float> s{0.5f, 0.4f, 0.3f, 0.2f}, b{0.0f, 0.0f, 0.25f, 0.0f};
    REQUIRE(kimi::moe_route_reference(s, b, 1, 1, 2, true, 1.0f, &ids, &w).ok());
    CHECK(ids == std::vector<int32_t>{2, 0});
    CHECK(w[0] == doctest::Approx(0.375));
    CHECK(w[1] == doctest::Approx(0.625));
    REQUIRE(kimi::moe_route_reference(s, b, 1, 1, 2, false, 2.0f, &ids, &w).ok());
    CHECK(w[0] == doctest::Approx(0.6));
    CHECK(w[1] == doctest::Approx(1.0));
    // The bias also moves group scores: groups {0,1} = 0.9, {2,3} = 0.75 + ... with bias
    // [0, 0, 0.5, 0.5]: {2,3} = 0.8 + 0.7 = 1.5 > 0.9 -> group 1 kept, ids 2, 3; weights from
    // unbiased 0.3, 0.2 -> 0.6, 0.4.
    std::vector<float> b2{0.0f, 0.0f, 0.5f, 0.5f};
    REQUIRE(kimi::moe_route_reference(s, b2, 2, 1, 2, true, 1.0f, &ids, &w).ok());
    CHECK(ids == std::vector<int32_t>{2, 3});
    CHECK(w[0] == doctest::Approx(0.6));
    CHECK(w[1] == doctest::Approx(0.4));
  }
  SUBCASE("errors") {
    std::vector<float> s(8, 0.5f), b3(3, 0.0f);
    check_error(kimi::moe_route_reference(s, {}, 3, 1, 2, true, 1.0f, &ids, &w),
                StatusCode::kInvalidArgument, {"moe_route_reference", "n_group 3"});
    check_error(kimi::moe_route_reference(s, {}, 8, 1, 1, true, 1.0f, &ids, &w),
                StatusCode::kInvalidArgument, {"needs 2"});
    check_error(kimi::moe_route_reference(s, {}, 2, 3, 2, true, 1.0f, &ids, &w),
                StatusCode::kInvalidArgument, {"topk_group 3"});
    check_error(kimi::moe_route_reference(s, {}, 2, 1, 5, true, 1.0f, &ids, &w),
                StatusCode::kInvalidArgument, {"top_k 5", "[1, 4]"});
    check_error(kimi::moe_route_reference(s, b3, 2, 1, 2, true, 1.0f, &ids, &w),
                StatusCode::kInvalidArgument, {"bias has 3"});
    check_error(kimi::moe_route_reference(s, {}, 2, 1, 2, true, 1.0f, nullptr, &w),
                StatusCode::kInvalidArgument, {"null"});
    check_error(kimi::moe_route_reference({}, {}, 1, 1, 1, true, 1.0f, &ids, &w),
                StatusCode::kInvalidArgument, {"empty"});
  }
}

TEST_CASE("kimi_forward: tiny preset forward invariants") {
  TempDir tmp;
  TinyKimi m;
  load_tiny_kimi(tmp.path / "bf16", false, 11, &m);
  int64_t const V = m.config.vocab_size, H = m.config.hidden_size;
  int const L = m.config.num_hidden_layers;
  std::vector<int32_t> const tokens = some_tokens(10);
  std::vector<float> logits, aux;

  SUBCASE("finite, non-trivial logits; causality") {
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, {}, &logits, nullptr).ok());
    REQUIRE(logits.size() == size_t(10 * V));
    float mx = 0.0f;
    for (float v : logits) {
      REQUIRE(std::isfinite(v));
      mx = std::max(mx, std::fabs(v));
    }
    CHECK(mx > 0.1f);
    // Rows differ between positions.
    CHECK(std::vector<float>(logits.begin(), logits.begin() + V) !=
          std::vector<float>(logits.begin() + V, logits.begin() + 2 * V));
    std::vector<float> prefix;
    std::span<int32_t const> first6(tokens.data(), 6);
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, first6, 0, {}, &prefix, nullptr).ok());
    REQUIRE(prefix.size() == size_t(6 * V));
    CHECK(std::equal(prefix.begin(), prefix.end(), logits.begin()));  // bit for bit
    // Changing a later token changes later rows only.
    std::vector<int32_t> t2 = tokens;
    t2[7] = (t2[7] + 1) % 512;
    std::vector<float> l2;
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, t2, 0, {}, &l2, nullptr).ok());
    CHECK(std::equal(l2.begin(), l2.begin() + 7 * V, logits.begin()));
    CHECK(!std::equal(l2.begin() + 7 * V, l2.end(), logits.begin() + 7 * V));
  }

  SUBCASE("start_position: same start identical, shifted start equal up to rounding") {
    // RoPE encodes only relative positions (q_m . k_n depends on m - n), so shifting every
    // position by the same amount leaves logits equal in exact arithmetic; a forward that rotated
    // q and k with different positions (or only one of them) would break this. In float the
    // rotation angles differ, so not bit for bit.
    std::vector<float> a, b, c;
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, tokens, 5, {}, &a, nullptr).ok());
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, tokens, 5, {}, &b, nullptr).ok());
    CHECK(a == b);
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, {}, &c, nullptr).ok());
    float maxd = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) maxd = std::max(maxd, std::fabs(a[i] - c[i]));
    CHECK(maxd < 1e-3f);
    CHECK(a != c);  // the position did reach the rotation
  }

  SUBCASE("aux capture: embedding rows exact, last layer -> norm -> lm_head = logits") {
    std::vector<int> const ids{L - 1, specdec::kEmbedding, 1};
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, ids, &logits, &aux).ok());
    REQUIRE(aux.size() == size_t(10 * 3 * H));
    for (int64_t t = 0; t < 10; ++t) {
      for (int64_t j = 0; j < H; ++j) {
        float const e = bf16_at(m.weights.embed_tokens, tokens[t] * H + j);
        REQUIRE(aux[(t * 3 + 1) * H + j] == e);  // exactly
      }
    }
    // Layer 1's output differs from the embedding and from the last layer's.
    CHECK(aux[(0 * 3 + 2) * H] != aux[(0 * 3 + 1) * H]);
    CHECK(aux[(0 * 3 + 2) * H] != aux[(0 * 3 + 0) * H]);
    std::vector<float> nw(H), xn(H);
    for (int64_t j = 0; j < H; ++j) nw[j] = bf16_at(m.weights.norm, j);
    for (int64_t t = 0; t < 10; ++t) {
      std::span<float const> last(aux.data() + (t * 3 + 0) * H, H);
      REQUIRE(kimi::rms_norm_reference(last, nw, m.config.rms_norm_eps, xn).ok());
      for (int64_t v = 0; v < V; ++v) {
        double acc = 0.0;
        for (int64_t j = 0; j < H; ++j) acc += double(bf16_at(m.weights.lm_head, v * H + j)) * xn[j];
        REQUIRE(logits[t * V + v] == doctest::Approx(acc).epsilon(1e-6).scale(1.0));
      }
    }
    // Same capture in another order: same vectors, reordered.
    std::vector<float> aux2, l2;
    std::vector<int> const ids2{1, L - 1};
    REQUIRE(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, ids2, &l2, &aux2).ok());
    CHECK(l2 == logits);
    for (int64_t t = 0; t < 10; ++t) {
      CHECK(std::equal(aux2.begin() + (t * 2 + 0) * H, aux2.begin() + (t * 2 + 1) * H,
                       aux.begin() + (t * 3 + 2) * H));
      CHECK(std::equal(aux2.begin() + (t * 2 + 1) * H, aux2.begin() + (t * 2 + 2) * H,
                       aux.begin() + (t * 3 + 0) * H));
    }
  }

  SUBCASE("input errors name the argument") {
    std::vector<int32_t> bad = tokens;
    bad[3] = 512;
    check_error(kimi::kimi_forward_reference(m.weights, m.config, bad, 0, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"tokens[3] = 512", "vocab_size 512", "config.json"});
    bad[3] = -1;
    check_error(kimi::kimi_forward_reference(m.weights, m.config, bad, 0, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"tokens[3] = -1"});
    check_error(kimi::kimi_forward_reference(m.weights, m.config, {}, 0, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"tokens is empty"});
    check_error(kimi::kimi_forward_reference(m.weights, m.config, tokens, -1, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"start_position", "max_position_embeddings 256"});
    check_error(kimi::kimi_forward_reference(m.weights, m.config, tokens, 250, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"[250, 260)", "max_position_embeddings 256"});
    std::vector<int> a1{L};
    check_error(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, a1, &logits, &aux),
                StatusCode::kInvalidArgument, {"aux_layers[0] = 4", "[kEmbedding -1, 4)"});
    std::vector<int> a2{0, -2};
    check_error(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, a2, &logits, &aux),
                StatusCode::kInvalidArgument, {"aux_layers[1] = -2"});
    std::vector<int> a3{2, 0, 2};
    check_error(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, a3, &logits, &aux),
                StatusCode::kInvalidArgument, {"aux_layers[2] = 2", "repeats aux_layers[0]"});
    check_error(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, a3, &logits, nullptr),
                StatusCode::kInvalidArgument, {"aux is null"});
    check_error(kimi::kimi_forward_reference(m.weights, m.config, tokens, 0, {}, nullptr, nullptr),
                StatusCode::kInvalidArgument, {"logits is null"});
    // Weights that do not belong to the config.
    kimi::KimiWeights empty;
    check_error(kimi::kimi_forward_reference(empty, m.config, tokens, 0, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"weights have 0 layers", "num_hidden_layers is 4"});
    kimi::KimiWeights broken = m.weights;
    broken.layers[2].kv_b_proj.weight = broken.layers[2].kv_a_layernorm;
    check_error(kimi::kimi_forward_reference(broken, m.config, tokens, 0, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"layers.2.self_attn.kv_b_proj", "kv_a_layernorm"});
    // Routers transformers' DeepseekV3 does not implement.
    DeepseekV3Config c = m.config;
    c.scoring_func = specdec::io::ScoringFunc::kSoftmax;
    check_error(kimi::kimi_forward_reference(m.weights, c, tokens, 0, {}, &logits, nullptr),
                StatusCode::kUnsupported, {"scoring_func \"softmax\""});
    c = m.config;
    c.topk_method = specdec::io::TopkMethod::kGreedy;
    check_error(kimi::kimi_forward_reference(m.weights, c, tokens, 0, {}, &logits, nullptr),
                StatusCode::kUnsupported, {"topk_method \"greedy\""});
  }
}

TEST_CASE("kimi_forward: INT4 experts vs bf16 experts from the same seed") {
  // Both checkpoints hold the same float matrices (random_checkpoint.hpp); the INT4 one rounds
  // each routed-expert weight to q * scale, scale = max|W_group| / 7 (group 32): uniform rounding
  // error of rms step / sqrt(12), about 0.09-0.10 of the weights' rms for Gaussian weights (the
  // max of 32 normals is ~2.1 sigma). Everything else (attention, dense / shared MLPs, router,
  // lm_head) is the same bf16. Bounds used (measured over seeds 1, 2, 3, 5, 11 in brackets):
  //   layer 0 (dense) output: bit for bit equal (no INT4 tensor involved);
  //   layer 1 (first MoE layer, same input so same routing): rms of the output difference over
  //     rms of the layer's update (output - input) <= 0.25 [0.13-0.15] over all tokens and
  //     <= 0.30 per token [<= 0.21] (three quantised matrices in a row: ~sqrt(3) * 0.1);
  //   logits after the 3 MoE layers, where routing can flip: relative rms <= 0.5 [0.16-0.35],
  //     argmax agreeing at >= 5 of 10 positions [5-7] (chance: 1 / 512).
  // A wrong nibble order, offset or scale index gives errors of order 1 and fails all of these.
  TempDir tmp;
  TinyKimi a, b;
  load_tiny_kimi(tmp.path / "bf16", false, 5, &a);
  load_tiny_kimi(tmp.path / "int4", true, 5, &b);
  REQUIRE(!a.weights.experts_int4);
  REQUIRE(b.weights.experts_int4);
  std::vector<int32_t> const tokens = some_tokens(10);
  std::vector<int> const ids{0, 1};
  std::vector<float> la, lb, xa, xb;
  REQUIRE(kimi::kimi_forward_reference(a.weights, a.config, tokens, 0, ids, &la, &xa).ok());
  REQUIRE(kimi::kimi_forward_reference(b.weights, b.config, tokens, 0, ids, &lb, &xb).ok());
  REQUIRE(la.size() == lb.size());
  int64_t const V = a.config.vocab_size, H = a.config.hidden_size;
  double num = 0.0, den = 0.0, worst = 0.0;
  for (int64_t t = 0; t < 10; ++t) {
    double nt = 0.0, dt = 0.0;
    for (int64_t j = 0; j < H; ++j) {
      REQUIRE(xa[(t * 2 + 0) * H + j] == xb[(t * 2 + 0) * H + j]);
      double const update = double(xa[(t * 2 + 1) * H + j]) - xa[(t * 2 + 0) * H + j];
      double const err = double(xb[(t * 2 + 1) * H + j]) - xa[(t * 2 + 1) * H + j];
      nt += err * err;
      dt += update * update;
    }
    num += nt;
    den += dt;
    worst = std::max(worst, std::sqrt(nt / dt));
  }
  double ln = 0.0, ld = 0.0;
  for (size_t i = 0; i < la.size(); ++i) {
    ln += double(la[i] - lb[i]) * (la[i] - lb[i]);
    ld += double(la[i]) * la[i];
  }
  int same_argmax = 0;
  for (int t = 0; t < 10; ++t) {
    auto ra = std::max_element(la.begin() + t * V, la.begin() + (t + 1) * V) - la.begin();
    auto rb = std::max_element(lb.begin() + t * V, lb.begin() + (t + 1) * V) - lb.begin();
    same_argmax += ra == rb;
  }
  MESSAGE("int4 vs bf16: layer 1 rel err ", std::sqrt(num / den), " (worst token ", worst,
          "), logits rel rms ", std::sqrt(ln / ld), ", argmax agree ", same_argmax, "/10");
  CHECK(num > 0.0);  // the INT4 path was really taken
  CHECK(std::sqrt(num / den) <= 0.25);
  CHECK(worst <= 0.30);
  CHECK(std::sqrt(ln / ld) <= 0.5);
  CHECK(same_argmax >= 5);
}
