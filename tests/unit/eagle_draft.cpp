// The EAGLE-family drafts (model/eagle: config.hpp, weights.hpp, forward_cpu.hpp,
// random_checkpoint.hpp) for the tiny random Kimi target (tests/support/kimi_model.hpp, 4 layers,
// hidden 128, vocab 512): EAGLE-3 over the layer set [-1, 1, 3] and EAGLE-1/2 (extend and draft
// steps against the reference, the layout checks): a random draft written and loaded back (shapes,
// vocabulary maps, determinism); extend + draft steps against an independent plain-loop reference
// written here (double accumulation, weights read from the safetensors directly); tree attention (a
// branch's output equals its path drafted alone in a fresh cache and does not move when its
// siblings change); every loading error and every forward argument error by message, and that a
// failed call changes nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "specdec/model/eagle/config.hpp"
#include "specdec/model/eagle/forward_cpu.hpp"
#include "specdec/model/eagle/random_checkpoint.hpp"
#include "specdec/model/eagle/weights.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/forward_reference.hpp"
#include "support/kimi_model.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

namespace {

namespace eagle = specdec::model::eagle;
namespace kimi = specdec::model::kimi;
namespace io = specdec::io;
using specdec::CpuExecutor;
using specdec::DraftKind;
using specdec::Dtype;
using specdec::Status;
using specdec::StatusCode;
using specdec::testing::check_error;
using specdec::testing::load_tiny_kimi;
using specdec::testing::random_tokens;
using specdec::testing::Rng;
using specdec::testing::TempDir;
using specdec::testing::TinyKimi;
namespace fs = std::filesystem;

// Tolerance of the forward against the reference, relative to the largest |value| of the rows
// compared. Both read the same bf16 weights; the executor computes in fp32 (Eigen float
// accumulation), the reference in double. Observed: 5e-7 (hidden and logits, worst row).
constexpr double kTol = 1e-4;
// A branch drafted in a tree against the same path drafted alone: the same arithmetic on rows of
// different batches (Eigen may block the products differently), so float rounding at most.
constexpr double kSameTol = 1e-5;

std::vector<int> const kLayers{specdec::kEmbedding, 1, 3};
constexpr int kDraftVocab = 200;
std::string const kPolicy = "EAGLE3 layers=[-1,1,3] (test)";

// The tiny target (bf16), its CPU model (for its embedding) and a random draft for it.
struct Setup {
  TempDir tmp;
  TinyKimi target;
  kimi::KimiCpuModel target_cpu;
  std::string dir;     // the draft
  bool eagle3 = true;  // else EAGLE-1/2

  explicit Setup(eagle::DraftRandomOptions options = {kDraftVocab},
                 std::string const& arch = eagle::kEagle3Architecture, uint64_t seed = 11) {
    load_tiny_kimi(tmp.path / "target", /*int4=*/false, 5, &target);
    Status s = kimi::load_kimi_cpu_model(target.weights, target.config, &target_cpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    dir = (tmp.path / "draft").string();
    eagle3 = arch != eagle::kEagleArchitecture;
    s = eagle::write_random_draft(dir, target.config, eagle3 ? kLayers : std::vector<int>{}, seed,
                                  options, arch);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  float const* embedding() const { return target_cpu.embed_tokens.data(); }
  Status load(eagle::DraftCpuModel* m, std::vector<int> const& layers = kLayers,
              DraftKind kind = DraftKind::kEagle3, bool with_target_tensors = true) const {
    eagle::TargetTensors const t =
        with_target_tensors ? eagle::target_tensors_of(target_cpu) : eagle::TargetTensors{};
    return eagle::load_draft_cpu_model(dir, target.config, t, kind, layers, kPolicy, m);
  }
  void edit_config(std::function<void(nlohmann::json&)> const& f) const {
    fs::path const p = fs::path(dir) / "config.json";
    nlohmann::json j;
    {
      std::ifstream in(p);
      j = nlohmann::json::parse(in);
    }
    f(j);
    std::ofstream(p) << j.dump(2);
  }
};

struct OwnedTensor {
  Dtype dtype = Dtype::kBF16;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};
using TensorMap = std::map<std::string, OwnedTensor>;

// Rewrites dir/model.safetensors after `f` edits its tensors.
void edit_tensors(std::string const& dir, std::function<void(TensorMap&)> const& f) {
  std::string const path = (fs::path(dir) / io::kSafetensorsSingleFile).string();
  TensorMap t;
  {
    io::SafetensorsFile file;
    Status const s = io::SafetensorsFile::open(path, &file);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    for (std::string_view n : file.names()) {
      io::TensorView const v = *file.find(n);
      t[std::string(n)] = {v.dtype, v.shape, {v.bytes.begin(), v.bytes.end()}};
    }
  }
  f(t);
  std::vector<io::TensorToWrite> w;
  for (auto const& [name, o] : t) w.push_back({name, o.dtype, o.shape, o.bytes});
  Status const s = io::write_safetensors(path, w);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

template <class T>
std::vector<T> values_of(OwnedTensor const& o) {
  std::vector<T> v(o.bytes.size() / sizeof(T));
  std::memcpy(v.data(), o.bytes.data(), o.bytes.size());
  return v;
}
template <class T>
void set_values(OwnedTensor* o, std::vector<T> const& v) {
  o->bytes.resize(v.size() * sizeof(T));
  std::memcpy(o->bytes.data(), v.data(), o->bytes.size());
  o->shape = {static_cast<int64_t>(v.size())};
}

// ---------------------------------------------------------------------------------------------
// The reference: straightforward Llama math in double, weights read from the files.

std::vector<double> to_double(io::TensorView const& v) {
  std::vector<double> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (v.dtype == Dtype::kF32) {
      float f;
      std::memcpy(&f, v.bytes.data() + 4 * i, 4);
      out[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, v.bytes.data() + 2 * i, 2);
      out[i] = v.dtype == Dtype::kBF16 ? specdec::bf16_to_float(b) : specdec::fp16_to_float(b);
    }
  }
  return out;
}

struct RefKv {
  std::vector<double> k, v;  // [nkv * hd] each, k roped
};
struct RefOut {
  std::vector<double> hidden, logits;
  RefKv kv;
};

// Both kinds: EAGLE-3 (midlayer.*, its own lm_head and norm) and EAGLE-1/2 (layers.0.*, fc over
// [embedding | hidden] with its bias, the target's lm_head; features final-normed with the
// target's norm).
struct Ref {
  eagle::DraftConfig c;
  int64_t H = 0, F = 0, I = 0, nh = 0, nkv = 0, hd = 0, Vd = 0, A = 0;
  std::vector<double> fc, fc_bias, hnorm, inorm, pnorm, fnorm, wq, wk, wv, wo, wg, wu, wd, lm,
      embed, target_norm;
  double target_eps = 0.0;

  Ref(std::string const& dir, TinyKimi const& target) {
    Status s = eagle::read_draft_config(dir, target.config.num_hidden_layers, &c);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    io::SafetensorsCheckpoint ck;
    s = io::SafetensorsCheckpoint::open(dir, &ck);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    auto get = [&](char const* name) {
      std::optional<io::TensorView> v = ck.find(name);
      REQUIRE_MESSAGE(v.has_value(), name);
      return to_double(*v);
    };
    H = c.hidden_size, F = c.feature_width(), I = c.intermediate_size, nh = c.num_attention_heads;
    nkv = c.num_key_value_heads, hd = c.head_dim, Vd = c.draft_vocab_size;
    bool const e3 = c.kind == DraftKind::kEagle3;
    A = e3 ? 2 * H : H;
    std::string const layer = e3 ? "midlayer." : "layers.0.";
    auto get_layer = [&](std::string const& name) { return get((layer + name).c_str()); };
    fc = get("fc.weight");
    pnorm = get_layer("post_attention_layernorm.weight");
    wq = get_layer("self_attn.q_proj.weight");
    wk = get_layer("self_attn.k_proj.weight");
    wv = get_layer("self_attn.v_proj.weight");
    wo = get_layer("self_attn.o_proj.weight");
    wg = get_layer("mlp.gate_proj.weight");
    wu = get_layer("mlp.up_proj.weight");
    wd = get_layer("mlp.down_proj.weight");
    if (e3) {
      hnorm = get("midlayer.hidden_norm.weight");
      inorm = get("midlayer.input_layernorm.weight");
      fnorm = get("norm.weight");
      lm = get("lm_head.weight");
    } else {
      if (ck.contains("fc.bias")) fc_bias = get("fc.bias");
      lm = to_double(target.weights.lm_head);
      target_norm = to_double(target.weights.norm);
      target_eps = target.config.rms_norm_eps;
    }
    embed = ck.contains("embed_tokens.weight") ? get("embed_tokens.weight")
                                               : to_double(target.weights.embed_tokens);
  }

  static std::vector<double> matvec(std::vector<double> const& W, int64_t out, int64_t in,
                                    std::vector<double> const& x) {
    REQUIRE(int64_t(x.size()) == in);
    std::vector<double> y(static_cast<size_t>(out), 0.0);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) y[o] += W[o * in + i] * x[i];
    }
    return y;
  }
  std::vector<double> rms(std::vector<double> const& x, std::vector<double> const& w,
                          double eps = 0.0) const {
    double ss = 0.0;
    for (double v : x) ss += v * v;
    double const inv = 1.0 / std::sqrt(ss / double(x.size()) + (eps > 0.0 ? eps : c.rms_norm_eps));
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
    return y;
  }
  // Rotate-half rope on one head of `x` starting at `off`.
  void rope(std::vector<double>* x, int64_t off, int64_t pos) const {
    int64_t const half = hd / 2;
    for (int64_t i = 0; i < half; ++i) {
      double const a = double(pos) * std::pow(c.rope_theta, -2.0 * double(i) / double(hd));
      double const x1 = (*x)[off + i], x2 = (*x)[off + i + half];
      (*x)[off + i] = x1 * std::cos(a) - x2 * std::sin(a);
      (*x)[off + i + half] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
  // An extend entry's incoming hidden: EAGLE-3 fc(feature), EAGLE-1/2 the final-normed feature.
  std::vector<double> incoming(float const* feature) const {
    std::vector<double> const f(feature, feature + F);
    if (c.kind == DraftKind::kEagle3) return matvec(fc, H, F, f);
    return rms(f, target_norm, target_eps);
  }
  // One entry: token, incoming hidden h, position, the entries it sees before itself.
  RefOut step(int32_t token, std::vector<double> const& h, int64_t pos,
              std::vector<RefKv const*> const& before) const {
    std::vector<double> e(embed.begin() + token * H, embed.begin() + (token + 1) * H);
    std::vector<double> x, residual = h;
    if (c.kind == DraftKind::kEagle3) {
      x = rms(e, inorm);
      std::vector<double> const hn = rms(h, hnorm);
      x.insert(x.end(), hn.begin(), hn.end());
    } else {
      std::vector<double> eh = e;
      eh.insert(eh.end(), h.begin(), h.end());
      x = matvec(fc, H, 2 * H, eh);
      for (size_t i = 0; i < fc_bias.size(); ++i) x[i] += fc_bias[i];
      residual = x;
    }
    std::vector<double> q = matvec(wq, nh * hd, A, x);
    RefOut out;
    out.kv.k = matvec(wk, nkv * hd, A, x);
    out.kv.v = matvec(wv, nkv * hd, A, x);
    for (int64_t j = 0; j < nh; ++j) rope(&q, j * hd, pos);
    for (int64_t g = 0; g < nkv; ++g) rope(&out.kv.k, g * hd, pos);
    std::vector<RefKv const*> seen = before;
    seen.push_back(&out.kv);
    std::vector<double> o(static_cast<size_t>(nh * hd), 0.0);
    for (int64_t j = 0; j < nh; ++j) {
      int64_t const g = j / (nh / nkv);
      std::vector<double> s;
      double mx = -1e300;
      for (RefKv const* u : seen) {
        double d = 0.0;
        for (int64_t i = 0; i < hd; ++i) d += q[j * hd + i] * u->k[g * hd + i];
        s.push_back(d / std::sqrt(double(hd)));
        mx = std::max(mx, s.back());
      }
      double z = 0.0;
      for (double& v : s) z += (v = std::exp(v - mx));
      for (size_t u = 0; u < seen.size(); ++u) {
        for (int64_t i = 0; i < hd; ++i) o[j * hd + i] += s[u] / z * seen[u]->v[g * hd + i];
      }
    }
    std::vector<double> h1 = matvec(wo, H, nh * hd, o);
    for (int64_t i = 0; i < H; ++i) h1[i] += residual[i];
    std::vector<double> const n1 = rms(h1, pnorm);
    std::vector<double> g = matvec(wg, I, H, n1), u = matvec(wu, I, H, n1);
    for (int64_t i = 0; i < I; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    out.hidden = matvec(wd, H, I, g);
    for (int64_t i = 0; i < H; ++i) out.hidden[i] += h1[i];
    out.logits = c.kind == DraftKind::kEagle3 ? matvec(lm, Vd, H, rms(out.hidden, fnorm))
                                              : matvec(lm, Vd, H, out.hidden);
    return out;
  }
};

// A request as the reference sees it: committed entries and the scratch tree.
struct RefSeq {
  std::vector<RefKv> committed;
  std::vector<RefKv> scratch;
  std::vector<int> parent, depth;

  RefOut extend(Ref const& R, int32_t token, float const* feature) {
    scratch.clear(), parent.clear(), depth.clear();
    std::vector<RefKv const*> before;
    for (RefKv const& kv : committed) before.push_back(&kv);
    RefOut o = R.step(token, R.incoming(feature), int64_t(committed.size()), before);
    committed.push_back(o.kv);
    return o;
  }
  RefOut draft(Ref const& R, int32_t token, std::vector<double> const& h, int p) {
    std::vector<RefKv const*> before;
    for (RefKv const& kv : committed) before.push_back(&kv);
    std::vector<int> chain;
    for (int a = p; a >= 0; a = parent[a]) chain.push_back(a);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) before.push_back(&scratch[*it]);
    int const d = p < 0 ? 0 : depth[p] + 1;
    RefOut o = R.step(token, h, int64_t(committed.size()) + d, before);
    scratch.push_back(o.kv);
    parent.push_back(p);
    depth.push_back(d);
    return o;
  }
};

// max |got - want| / max |want| over n values.
double rel_diff(float const* got, std::vector<double> const& want) {
  double d = 0.0, m = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::fabs(double(got[i]) - want[i]));
    m = std::max(m, std::fabs(want[i]));
  }
  return m > 0.0 ? d / m : d;
}
double rel_diff(float const* got, float const* want, int64_t n) {
  return rel_diff(got, std::vector<double>(want, want + n));
}

// Target features of `tokens` (the aux hidden states of `layers`, [T, |layers| * 128]).
std::vector<float> target_features(TinyKimi const& t, std::vector<int32_t> const& tokens,
                                   std::vector<int> const& layers = kLayers) {
  std::vector<float> logits, aux;
  Status const s =
      kimi::kimi_forward_reference(t.weights, t.config, tokens, 0, layers, &logits, &aux);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return aux;
}

eagle::DraftCache make_cache(eagle::DraftCpuModel const& m,
                             std::vector<eagle::RequestId> const& ids) {
  eagle::DraftCache c;
  Status s = eagle::DraftCache::create_for(m.config, &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  for (eagle::RequestId id : ids) {
    s = c.add_request(id);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  return c;
}

int64_t length_of(eagle::DraftCache const& c, eagle::RequestId id) {
  int64_t n = -1;
  REQUIRE(c.length(id, &n).ok());
  return n;
}
int64_t scratch_of(eagle::DraftCache const& c, eagle::RequestId id) {
  int64_t n = -1;
  REQUIRE(c.scratch_size(id, &n).ok());
  return n;
}

eagle::DraftCpuModel load_ok(Setup const& s) {
  eagle::DraftCpuModel m;
  Status const st = s.eagle3 ? s.load(&m) : s.load(&m, {}, DraftKind::kEagle);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return m;
}

// Draft-vocabulary argmax of logits row r, as a target id.
int32_t argmax_target(eagle::DraftCpuModel const& m, std::vector<float> const& logits, int64_t r) {
  int64_t const Vd = m.draft_vocab();
  auto const* row = logits.data() + r * Vd;
  return static_cast<int32_t>(m.draft_to_target(std::max_element(row, row + Vd) - row));
}

}  // namespace

TEST_CASE("eagle3_draft: a random draft written and loaded back") {
  Setup s;
  eagle::DraftCpuModel m = load_ok(s);
  eagle::DraftConfig const& c = m.config;
  CHECK(c.kind == DraftKind::kEagle3);
  CHECK(c.architecture == "LlamaForCausalLMEagle3");
  CHECK(c.layers == kLayers);
  CHECK(c.layers_from_file);
  CHECK(c.hidden_size == 128);
  CHECK(c.num_attention_heads == 4);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.head_dim == 32);
  CHECK(c.intermediate_size == 96);
  CHECK(c.vocab_size == 512);
  CHECK(c.rope_theta == doctest::Approx(s.target.config.rope_theta));
  CHECK(m.hidden() == 128);
  CHECK(m.feature_width() == 384);
  CHECK(m.draft_vocab() == kDraftVocab);
  CHECK(m.kv_width() == 64);
  CHECK(std::vector<int>(m.layers().begin(), m.layers().end()) == kLayers);
  CHECK(m.fc.rows() == 128);
  CHECK(m.fc.cols() == 384);
  CHECK(m.q_proj.rows() == 128);
  CHECK(m.q_proj.cols() == 256);
  CHECK(m.k_proj.rows() == 64);
  CHECK(m.o_proj.cols() == 128);
  CHECK(m.mlp.gate_proj.rows() == 96);
  CHECK(m.mlp.down_proj.cols() == 96);
  CHECK(m.lm_head.rows() == kDraftVocab);
  CHECK_FALSE(m.has_embedding);
  CHECK(m.target.embedding == s.embedding());
  CHECK(m.inv_freq.size() == 16);
  // d2t: a sorted subset of the target vocabulary, exactly where t2d is true.
  REQUIRE(m.d2t.size() == size_t(kDraftVocab));
  REQUIRE(m.t2d.size() == 512u);
  int64_t prev = -1, marked = 0;
  for (int64_t d = 0; d < kDraftVocab; ++d) {
    int64_t const t = m.draft_to_target(d);
    CHECK(t > prev);
    CHECK(m.t2d[t] == 1);
    prev = t;
  }
  for (uint8_t b : m.t2d) marked += b;
  CHECK(marked == kDraftVocab);
  CHECK(m.draft_to_target(kDraftVocab - 1) != kDraftVocab - 1);  // not the identity

  // Deterministic in the seed.
  auto bytes = [](std::string const& dir) {
    std::ifstream in(fs::path(dir) / "model.safetensors", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  TempDir more;
  std::string const again = (more.path / "again").string(), other = (more.path / "other").string();
  REQUIRE(eagle::write_random_draft(again, s.target.config, kLayers, 11, {kDraftVocab}).ok());
  REQUIRE(eagle::write_random_draft(other, s.target.config, kLayers, 12, {kDraftVocab}).ok());
  CHECK(bytes(again) == bytes(s.dir));
  CHECK(bytes(other) != bytes(s.dir));
  // Nothing is overwritten.
  check_error(eagle::write_random_draft(again, s.target.config, kLayers, 11, {kDraftVocab}),
              StatusCode::kInvalidArgument, {"not empty"});
  check_error(eagle::write_random_draft((more.path / "bad").string(), s.target.config,
                                        std::vector<int>{1, 4}, 11),
              StatusCode::kInvalidArgument, {"id 4 >= the target's 4 layers"});
  check_error(
      eagle::write_random_draft((more.path / "bad2").string(), s.target.config, kLayers, 11, {513}),
      StatusCode::kInvalidArgument, {"draft_vocab_size 513"});

  // With its own embedding and the full vocabulary: identity maps, no target embedding needed.
  std::string const full = (more.path / "full").string();
  eagle::DraftRandomOptions o;
  o.with_embedding = true;
  REQUIRE(eagle::write_random_draft(full, s.target.config, kLayers, 3, o).ok());
  eagle::DraftCpuModel mf;
  Status const st = eagle::load_draft_cpu_model(full, s.target.config, {}, DraftKind::kEagle3,
                                                kLayers, kPolicy, &mf);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(mf.has_embedding);
  CHECK(mf.embed_tokens.rows() == 512);
  CHECK(mf.draft_vocab() == 512);
  for (int64_t d = 0; d < 512; ++d) CHECK(mf.draft_to_target(d) == d);
}

TEST_CASE("eagle3_draft: the default layer ids [1, N/2 - 1, N - 4]") {
  Setup s;
  s.edit_config(
      [](nlohmann::json& j) { j["eagle_config"].erase("eagle_aux_hidden_state_layer_ids"); });
  eagle::DraftConfig c;
  Status st = eagle::read_draft_config(s.dir, 61, &c);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(c.layers == std::vector<int>{1, 29, 57});
  CHECK_FALSE(c.layers_from_file);
  CHECK(eagle::eagle3_default_layers(61) == std::vector<int>{1, 29, 57});
  // The 4-layer target's default [1,1,0] repeats a layer.
  check_error(eagle::read_draft_config(s.dir, 4, &c), StatusCode::kInvalidArgument,
              {"eagle_config.eagle_aux_hidden_state_layer_ids", "absent", "[1,1,0]",
               "write the ids the draft was trained with into eagle_config"});
  eagle::DraftCpuModel m;
  check_error(s.load(&m), StatusCode::kInvalidArgument, {"[1,1,0]", "into eagle_config"});
  // No eagle_config at all: the same default.
  s.edit_config([](nlohmann::json& j) { j.erase("eagle_config"); });
  st = eagle::read_draft_config(s.dir, 61, &c);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(c.layers == std::vector<int>{1, 29, 57});
}

// Extend two requests, three draft steps of two branches, extend again: every row against the
// reference.
void check_against_reference(Setup const& s) {
  eagle::DraftCpuModel m = load_ok(s);
  Ref const R(s.dir, s.target);
  int64_t const H = m.hidden(), F = m.feature_width(), Vd = m.draft_vocab();
  Rng rng(42);
  // Request 10: 6 tokens -> 5 entries (entry i = token t_{i+1} with the features of t_i);
  // request 20: 4 tokens -> 3 entries.
  std::vector<int32_t> const ta = random_tokens(rng, 6, 512), tb = random_tokens(rng, 4, 512);
  std::vector<float> const fa = target_features(s.target, ta, m.feature_layers),
                           fb = target_features(s.target, tb, m.feature_layers);
  std::vector<int32_t> tokens(ta.begin() + 1, ta.end());
  tokens.insert(tokens.end(), tb.begin() + 1, tb.end());
  std::vector<float> features(fa.begin(), fa.begin() + 5 * F);
  features.insert(features.end(), fb.begin(), fb.begin() + 3 * F);
  std::vector<eagle::RequestId> const ids{10, 20};
  std::vector<int32_t> const counts{5, 3};
  eagle::DraftCache cache = make_cache(m, ids);
  std::vector<float> hidden, logits;
  Status st = eagle::draft_extend(CpuExecutor{}, m, &cache, ids, counts, tokens, features, &hidden,
                                  &logits);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  REQUIRE(hidden.size() == size_t(2 * H));
  REQUIRE(logits.size() == size_t(2 * Vd));
  CHECK(length_of(cache, 10) == 5);
  CHECK(length_of(cache, 20) == 3);

  std::vector<RefSeq> ref(2);
  RefOut last[2];
  for (int i = 0; i < 5; ++i) last[0] = ref[0].extend(R, tokens[i], features.data() + i * F);
  for (int i = 0; i < 3; ++i)
    last[1] = ref[1].extend(R, tokens[5 + i], features.data() + (5 + i) * F);
  double worst = 0.0;
  for (int b = 0; b < 2; ++b) {
    double const dh = rel_diff(hidden.data() + b * H, last[b].hidden);
    double const dl = rel_diff(logits.data() + b * Vd, last[b].logits);
    CHECK_MESSAGE(dh <= kTol, "extend hidden of request ", b, ": ", dh);
    CHECK_MESSAGE(dl <= kTol, "extend logits of request ", b, ": ", dl);
    worst = std::max({worst, dh, dl});
  }

  // Three draft steps of K = 2 branches; the parents make the branches see different ancestors:
  // step 1 both from the prefix (-1); step 2 request 10 crossed [1, 0], request 20 [0, 0];
  // step 3 request 10 [2, 3], request 20 [3, -1].
  std::vector<std::vector<int32_t>> const parents{{-1, -1, -1, -1}, {1, 0, 0, 0}, {2, 3, 3, -1}};
  int const K = 2;
  // Scratch hidden per request, by scratch index (the prefix's hidden for parent -1).
  std::vector<std::vector<std::vector<float>>> scratch_hidden(2);
  for (size_t step = 0; step < parents.size(); ++step) {
    std::vector<int32_t> tok(4);
    std::vector<float> ph(static_cast<size_t>(4 * H));
    for (int b = 0; b < 2; ++b) {
      for (int j = 0; j < K; ++j) {
        int const r = b * K + j, p = parents[step][r];
        std::vector<float> const& h =
            p < 0 ? std::vector<float>(hidden.begin() + b * H, hidden.begin() + (b + 1) * H)
                  : scratch_hidden[b][p];
        std::copy(h.begin(), h.end(), ph.begin() + r * H);
        tok[r] = (j == 0 && p < 0) ? argmax_target(m, logits, b) : random_tokens(rng, 1, 512)[0];
      }
    }
    std::vector<float> sh, sl;
    std::vector<int32_t> index;
    st = eagle::draft_step(CpuExecutor{}, m, &cache, ids, K, tok, ph, parents[step], &sh, &sl,
                           &index);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE(sh.size() == size_t(4 * H));
    REQUIRE(sl.size() == size_t(4 * Vd));
    for (int b = 0; b < 2; ++b) {
      for (int j = 0; j < K; ++j) {
        int const r = b * K + j;
        CHECK(index[r] == int(step) * K + j);
        std::vector<double> const h(ph.begin() + r * H, ph.begin() + (r + 1) * H);
        RefOut const o = ref[b].draft(R, tok[r], h, parents[step][r]);
        double const dh = rel_diff(sh.data() + r * H, o.hidden);
        double const dl = rel_diff(sl.data() + r * Vd, o.logits);
        CHECK_MESSAGE(dh <= kTol, "step ", step, " row ", r, " hidden: ", dh);
        CHECK_MESSAGE(dl <= kTol, "step ", step, " row ", r, " logits: ", dl);
        worst = std::max({worst, dh, dl});
        scratch_hidden[b].emplace_back(sh.begin() + r * H, sh.begin() + (r + 1) * H);
      }
    }
  }
  CHECK(scratch_of(cache, 10) == 6);
  CHECK(length_of(cache, 10) == 5);  // scratch entries are not committed
  MESSAGE(std::string(m.config.kind_name()), " draft vs reference: worst relative difference ",
          worst);

  // A second extend clears the scratch and continues the committed sequence (positions 5, 6).
  std::vector<int32_t> const more_tokens{7, 9};
  std::vector<float> more_features(fa.begin() + 4 * F, fa.begin() + 6 * F);
  std::vector<eagle::RequestId> const only10{10};
  std::vector<int32_t> const two{2};
  st = eagle::draft_extend(CpuExecutor{}, m, &cache, only10, two, more_tokens, more_features,
                           &hidden, &logits);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(scratch_of(cache, 10) == 0);
  CHECK(scratch_of(cache, 20) == 6);  // other requests untouched
  CHECK(length_of(cache, 10) == 7);
  ref[0].extend(R, 7, more_features.data());
  RefOut const o = ref[0].extend(R, 9, more_features.data() + F);
  CHECK(rel_diff(hidden.data(), o.hidden) <= kTol);
  CHECK(rel_diff(logits.data(), o.logits) <= kTol);
}

TEST_CASE("eagle3_draft: extend and draft steps against the plain-loop reference") {
  check_against_reference(Setup{});
}

TEST_CASE("eagle_draft: EAGLE-1/2 extend and draft steps against the plain-loop reference") {
  Setup const s({}, eagle::kEagleArchitecture);
  check_against_reference(s);
  // The EAGLE-1/2 reading of the file: the target's vocabulary (identity maps), its last layer as
  // the feature, fc over [embedding | hidden] with its bias.
  eagle::DraftCpuModel const m = load_ok(s);
  CHECK(m.kind() == DraftKind::kEagle);
  CHECK(m.draft_vocab() == 512);
  CHECK(m.feature_layers == std::vector<int>{3});
  CHECK(m.feature_width() == 128);
  CHECK(m.fc.cols() == 256);
  CHECK(m.fc_bias.size() == 128);
  CHECK(std::all_of(m.d2t.begin(), m.d2t.end(), [](int64_t d) { return d == 0; }));
  CHECK(m.target.lm_head == s.target_cpu.lm_head.data());
}

TEST_CASE("eagle3_draft: own embedding, F32 and F16 weights") {
  Setup s({kDraftVocab, /*with_embedding=*/true});
  eagle::DraftCpuModel m = load_ok(s);
  CHECK(m.has_embedding);
  Rng rng(3);
  std::vector<int32_t> const t = random_tokens(rng, 4, 512);
  std::vector<float> const f = target_features(s.target, t);
  int64_t const F = m.feature_width();
  std::vector<int32_t> const tokens(t.begin() + 1, t.end());
  std::vector<float> const features(f.begin(), f.begin() + 3 * F);
  std::vector<eagle::RequestId> const ids{1};
  std::vector<int32_t> const counts{3};
  auto run = [&](eagle::DraftCpuModel const& model, std::vector<float>* h, std::vector<float>* l) {
    eagle::DraftCache c = make_cache(model, ids);
    Status const st =
        eagle::draft_extend(CpuExecutor{}, model, &c, ids, counts, tokens, features, h, l);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  };
  std::vector<float> h, l;
  run(m, &h, &l);
  Ref const R(s.dir, s.target);
  RefSeq seq;
  RefOut o;
  for (int i = 0; i < 3; ++i) o = seq.extend(R, tokens[i], features.data() + i * F);
  CHECK(rel_diff(h.data(), o.hidden) <= kTol);
  CHECK(rel_diff(l.data(), o.logits) <= kTol);

  // The same values stored as F32 (lm_head) and F16 (a norm: bf16 values near 1 are exact in
  // fp16): the same outputs.
  edit_tensors(s.dir, [](TensorMap& tm) {
    OwnedTensor& lm = tm["lm_head.weight"];
    std::vector<uint16_t> const b = values_of<uint16_t>(lm);
    std::vector<float> f32(b.size());
    for (size_t i = 0; i < b.size(); ++i) f32[i] = specdec::bf16_to_float(b[i]);
    lm.dtype = Dtype::kF32;
    lm.bytes.resize(f32.size() * 4);
    std::memcpy(lm.bytes.data(), f32.data(), lm.bytes.size());
    OwnedTensor& nw = tm["midlayer.hidden_norm.weight"];
    std::vector<uint16_t> hb = values_of<uint16_t>(nw);
    for (uint16_t& v : hb) v = specdec::float_to_fp16(specdec::bf16_to_float(v));
    nw.dtype = Dtype::kF16;
    set_values(&nw, hb);
  });
  eagle::DraftCpuModel m2 = load_ok(s);
  std::vector<float> h2, l2;
  run(m2, &h2, &l2);
  CHECK(rel_diff(h2.data(), h.data(), m.hidden()) == 0.0);
  CHECK(rel_diff(l2.data(), l.data(), m.draft_vocab()) == 0.0);
}

TEST_CASE("eagle3_draft: tree attention: each branch sees only its own ancestors") {
  Setup s;
  eagle::DraftCpuModel m = load_ok(s);
  int64_t const H = m.hidden(), F = m.feature_width(), Vd = m.draft_vocab();
  Rng rng(7);
  std::vector<int32_t> const t = random_tokens(rng, 5, 512);
  std::vector<float> const f = target_features(s.target, t);
  std::vector<int32_t> const prefix_tokens(t.begin() + 1, t.end());
  std::vector<float> const prefix_features(f.begin(), f.begin() + 4 * F);
  std::vector<eagle::RequestId> const ids{3};
  std::vector<int32_t> const counts{4};

  struct Node {
    int32_t token;
    int parent;  // node index, -1 = prefix
  };
  // 0: -1, 1: -1, 2: 0, 3: 1, 4: 3, 5: 2 (leaves 4 = path 1-3-4 and 5 = path 0-2-5), drafted
  // in steps of two: {0, 1}, {2, 3}, {4, 5}. Returns hidden / logits of every node.
  auto draft = [&](std::vector<Node> const& nodes, std::vector<std::vector<int>> const& steps,
                   std::vector<std::vector<float>>* hs, std::vector<std::vector<float>>* ls) {
    eagle::DraftCache c = make_cache(m, ids);
    std::vector<float> h0, l0;
    Status st = eagle::draft_extend(CpuExecutor{}, m, &c, ids, counts, prefix_tokens,
                                    prefix_features, &h0, &l0);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    hs->assign(nodes.size(), {});
    ls->assign(nodes.size(), {});
    std::vector<int32_t> scratch(nodes.size(), -1);
    for (std::vector<int> const& step : steps) {
      int const K = int(step.size());
      std::vector<int32_t> tok, par;
      std::vector<float> ph;
      for (int n : step) {
        int const p = nodes[n].parent;
        tok.push_back(nodes[n].token);
        par.push_back(p < 0 ? -1 : scratch[p]);
        std::vector<float> const& h = p < 0 ? h0 : (*hs)[p];
        ph.insert(ph.end(), h.begin(), h.end());
      }
      std::vector<float> sh, sl;
      std::vector<int32_t> index;
      st = eagle::draft_step(CpuExecutor{}, m, &c, ids, K, tok, ph, par, &sh, &sl, &index);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      for (int j = 0; j < K; ++j) {
        int const n = step[j];
        scratch[n] = index[j];
        (*hs)[n].assign(sh.begin() + j * H, sh.begin() + (j + 1) * H);
        (*ls)[n].assign(sl.begin() + j * Vd, sl.begin() + (j + 1) * Vd);
      }
    }
  };
  std::vector<Node> tree{{11, -1}, {22, -1}, {33, 0}, {44, 1}, {55, 3}, {66, 2}};
  std::vector<std::vector<int>> const steps{{0, 1}, {2, 3}, {4, 5}};
  std::vector<std::vector<float>> th, tl;
  draft(tree, steps, &th, &tl);

  // Each leaf's path drafted alone (a chain, K = 1) in a fresh cache: the same outputs.
  for (std::vector<int> const& path : {std::vector<int>{1, 3, 4}, std::vector<int>{0, 2, 5}}) {
    std::vector<Node> chain;
    std::vector<std::vector<int>> chain_steps;
    for (size_t k = 0; k < path.size(); ++k) {
      chain.push_back({tree[path[k]].token, int(k) - 1});
      chain_steps.push_back({int(k)});
    }
    std::vector<std::vector<float>> ch, cl;
    draft(chain, chain_steps, &ch, &cl);
    for (size_t k = 0; k < path.size(); ++k) {
      double const dh = rel_diff(th[path[k]].data(), ch[k].data(), H);
      double const dl = rel_diff(tl[path[k]].data(), cl[k].data(), Vd);
      CHECK_MESSAGE(dh <= kSameTol, "node ", path[k], " hidden ", dh);
      CHECK_MESSAGE(dl <= kSameTol, "node ", path[k], " logits ", dl);
    }
  }
  // Changing the other branch's tokens (nodes 0, 2, 5) leaves branch 1-3-4 as it was and moves
  // nodes 2 and 5 (which see node 0).
  std::vector<Node> other = tree;
  other[0].token = 101;
  other[2].token = 202;
  other[5].token = 303;
  std::vector<std::vector<float>> oh, ol;
  draft(other, steps, &oh, &ol);
  for (int n : {1, 3, 4}) {
    CHECK(rel_diff(oh[n].data(), th[n].data(), H) <= kSameTol);
    CHECK(rel_diff(ol[n].data(), tl[n].data(), Vd) <= kSameTol);
  }
  for (int n : {0, 2, 5}) CHECK(rel_diff(oh[n].data(), th[n].data(), H) > 1e-3);
  // Only node 0's token changed, not node 2's own: node 2 still moves (it attends to node 0).
  other = tree;
  other[0].token = 101;
  draft(other, steps, &oh, &ol);
  CHECK(rel_diff(oh[2].data(), th[2].data(), H) > 1e-3);
  CHECK(rel_diff(oh[3].data(), th[3].data(), H) <= kSameTol);
}

TEST_CASE("eagle3_draft: a draft that does not fit the policy") {
  SUBCASE("an EAGLE-1/2 checkpoint under an EAGLE3 policy") {
    Setup s({}, eagle::kEagleArchitecture);
    eagle::DraftCpuModel m;
    check_error(
        s.load(&m), StatusCode::kInvalidArgument,
        {"config.json", "this checkpoint is an EAGLE draft", "architectures LlamaForCausalLMEagle)",
         "use --speculative-algorithm EAGLE:", kPolicy});
    // Under an EAGLE policy it fits, given the target's lm_head and final norm.
    CHECK(s.load(&m, {}, DraftKind::kEagle).ok());
    check_error(s.load(&m, {}, DraftKind::kEagle, /*with_target_tensors=*/false),
                StatusCode::kInvalidArgument, {"EAGLE-1/2 draft reads the target's lm_head"});
  }
  SUBCASE("EAGLE-1/2 tensors that do not fit") {
    Setup s({}, eagle::kEagleArchitecture);
    eagle::DraftCpuModel m;
    // An EAGLE-3-wide fc (three streams) under an EAGLE-1/2 config.
    edit_tensors(s.dir, [](TensorMap& t) {
      OwnedTensor& fc = t.at("fc.weight");
      fc.shape = {128, 384};
      fc.bytes.assign(size_t(128 * 384 * 2), std::byte{0});
    });
    check_error(s.load(&m, {}, DraftKind::kEagle), StatusCode::kMalformedInput,
                {"fc.weight input width 384 != 2 x hidden 128 = 256", "as an EAGLE-3 draft does"});
  }
  SUBCASE("an EAGLE-1/2 draft of another width than the target") {
    Setup s({}, eagle::kEagleArchitecture);
    s.edit_config([](nlohmann::json& j) { j["hidden_size"] = 64; });
    eagle::DraftCpuModel m;
    check_error(s.load(&m, {}, DraftKind::kEagle), StatusCode::kInvalidArgument,
                {"hidden_size 64 != the target's hidden_size 128", "EAGLE-1/2"});
  }
  SUBCASE("an EAGLE-1/2 draft with an EAGLE-3 tensor") {
    Setup s({}, eagle::kEagleArchitecture);
    edit_tensors(s.dir, [](TensorMap& t) { t["norm.weight"] = t.at("fc.bias"); });
    eagle::DraftCpuModel m;
    check_error(s.load(&m, {}, DraftKind::kEagle), StatusCode::kMalformedInput,
                {"not part of an EAGLE-1/2 draft", "\"norm.weight\""});
  }
  SUBCASE("EagleLlamaForCausalLM is EAGLE-1/2 too") {
    Setup s;
    s.edit_config([](nlohmann::json& j) {
      j["architectures"] = {"EagleLlamaForCausalLM"};
      for (char const* k : {"draft_vocab_size", "target_hidden_size", "eagle_config"}) j.erase(k);
    });
    eagle::DraftCpuModel m;
    check_error(s.load(&m), StatusCode::kInvalidArgument,
                {"this checkpoint is an EAGLE draft", "use --speculative-algorithm EAGLE:"});
  }
  SUBCASE("an EAGLE-1/2 architecture with EAGLE-3 fields that say otherwise") {
    Setup s;
    s.edit_config([](nlohmann::json& j) { j["architectures"] = {"LlamaForCausalLMEagle"}; });
    eagle::DraftCpuModel m;
    check_error(s.load(&m), StatusCode::kInvalidArgument,
                {"field 'draft_vocab_size' = 200", "is an EAGLE-3 field",
                 "an EAGLE-1/2 draft (LlamaForCausalLMEagle)", "has 512"});
    s.edit_config([](nlohmann::json& j) { j.erase("draft_vocab_size"); });
    check_error(s.load(&m), StatusCode::kUnsupported,
                {"field 'eagle_config'", "is an EAGLE-3 field", "remove it"});
  }
  SUBCASE("an EAGLE-3 checkpoint under an EAGLE policy") {
    Setup s;
    eagle::DraftCpuModel m;
    check_error(
        s.load(&m, {}, DraftKind::kEagle), StatusCode::kInvalidArgument,
        {"this checkpoint is an EAGLE-3 draft", "use --speculative-algorithm EAGLE3", "[-1,1,3]"});
  }
  SUBCASE("the layer set in another order") {
    Setup s;
    eagle::DraftCpuModel m;
    check_error(s.load(&m, {1, -1, 3}), StatusCode::kInvalidArgument,
                {"eagle_aux_hidden_state_layer_ids", "expected [-1,1,3] (the draft checkpoint)",
                 "got [1,-1,3]", "different order"});
    check_error(s.load(&m, {-1, 1, 2}), StatusCode::kInvalidArgument,
                {"got [-1,1,2]", "different layers"});
  }
  SUBCASE("an unknown architecture") {
    Setup s;
    s.edit_config([](nlohmann::json& j) { j["architectures"] = {"FooForCausalLM"}; });
    eagle::DraftCpuModel m;
    check_error(s.load(&m), StatusCode::kUnsupported,
                {"field 'architectures'", "FooForCausalLM", "not an EAGLE draft"});
  }
}

TEST_CASE("eagle3_draft: config errors") {
  Setup s;
  eagle::DraftCpuModel m;
  auto with = [&](std::function<void(nlohmann::json&)> const& f, StatusCode code,
                  std::vector<std::string> const& parts) {
    std::string const path = (fs::path(s.dir) / "config.json").string();
    std::string saved;
    {
      std::ifstream in(path);
      saved.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    s.edit_config(f);
    check_error(s.load(&m), code, parts);
    std::ofstream(path) << saved;
  };
  with(
      [](nlohmann::json& j) {
        j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 4};
      },
      StatusCode::kInvalidArgument,
      {"eagle_config.eagle_aux_hidden_state_layer_ids", "[1,4]", "id 4 >= the target's 4 layers"});
  with(
      [](nlohmann::json& j) {
        j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 1};
      },
      StatusCode::kInvalidArgument, {"[1,1]", "twice"});
  with(
      [](nlohmann::json& j) {
        j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
      },
      StatusCode::kUnsupported, {"field 'rope_scaling.type'", "linear"});
  with(
      [](nlohmann::json& j) {
        j["rope_scaling"] = {{"type", "yarn"}, {"factor", 8.0}, {"beta_fast", 32.0},
                             {"beta_slow", 1.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                             {"original_max_position_embeddings", 64}};
      },
      StatusCode::kUnsupported, {"field 'rope_scaling'", "unscaled NeoX rope only"});
  // rope_theta beside transformers v5's rope_parameters: the two must agree.
  with(
      [](nlohmann::json& j) {
        j["rope_parameters"] = {{"rope_type", "default"},
                                {"rope_theta", j["rope_theta"].get<double>() + 1.0}};
      },
      StatusCode::kInvalidArgument, {"rope_parameters.rope_theta", "disagree"});
  with([](nlohmann::json& j) { j["vocab_size"] = 1000; }, StatusCode::kInvalidArgument,
       {"vocab_size 1000 != the target's vocab_size 512"});
  with([](nlohmann::json& j) { j["target_hidden_size"] = 256; }, StatusCode::kInvalidArgument,
       {"target_hidden_size 256", "!= the target's hidden_size 128"});
  with([](nlohmann::json& j) { j["num_hidden_layers"] = 2; }, StatusCode::kUnsupported,
       {"num_hidden_layers", "one decoder layer"});
  with([](nlohmann::json& j) { j.erase("rms_norm_eps"); }, StatusCode::kMalformedInput,
       {"field 'rms_norm_eps' is missing"});
  with([](nlohmann::json& j) { j["num_key_value_heads"] = 3; }, StatusCode::kInvalidArgument,
       {"num_key_value_heads", "does not divide num_attention_heads 4"});
  with([](nlohmann::json& j) { j["draft_vocab_size"] = 600; }, StatusCode::kInvalidArgument,
       {"draft_vocab_size", "more than vocab_size 512"});
  with([](nlohmann::json& j) { j["eagle_config"]["use_aux_hidden_state"] = false; },
       StatusCode::kUnsupported, {"eagle_config.use_aux_hidden_state"});
  // A draft without embed_tokens reads the target's: needs H == Ht (head_dim stays 32).
  with([](nlohmann::json& j) { j["hidden_size"] = 64; }, StatusCode::kInvalidArgument,
       {"no embed_tokens.weight", "hidden_size (64) to equal target_hidden_size (128)"});
  // The file is fine again.
  Status const st = s.load(&m);
  CHECK_MESSAGE(st.ok(), st.to_string());
  // No embed_tokens and no target embedding.
  check_error(s.load(&m, kLayers, DraftKind::kEagle3, /*with_target_embedding=*/false),
              StatusCode::kInvalidArgument,
              {"no embed_tokens.weight and no target embedding was given", "[512, 128]"});
}

TEST_CASE("eagle3_draft: tensor errors") {
  auto expect = [](std::function<void(Setup&)> const& edit, std::vector<std::string> const& parts,
                   std::vector<int> const& layers = kLayers) {
    Setup s;
    edit(s);
    eagle::DraftCpuModel m;
    check_error(s.load(&m, layers), StatusCode::kMalformedInput, parts);
  };
  SUBCASE("fc input width against the layer set") {
    expect(
        [](Setup& s) {
          s.edit_config([](nlohmann::json& j) {
            j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {-1, 1};
          });
        },
        {"tensor \"fc.weight\"",
         "fc.weight input width 384 != |layer set [-1,1]| 2 x target hidden 128 = 256"},
        {-1, 1});
  }
  SUBCASE("a missing tensor") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) { t.erase("midlayer.mlp.up_proj.weight"); });
        },
        {"missing tensor \"midlayer.mlp.up_proj.weight\""});
  }
  SUBCASE("a wrong shape") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) {
            OwnedTensor& q = t["midlayer.self_attn.q_proj.weight"];
            q.shape = {64, 256};
            q.bytes.resize(64 * 256 * 2);
          });
        },
        {"tensor \"midlayer.self_attn.q_proj.weight\"", "shape [64, 256], expected [128, 256]"});
  }
  SUBCASE("a wrong dtype") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) {
            t["norm.weight"].dtype = Dtype::kI32;
            t["norm.weight"].shape = {64};
          });
        },
        {"tensor \"norm.weight\"", "dtype I32, expected BF16, F16 or F32"});
  }
  SUBCASE("a tensor that is not part of a draft") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) { t["layers.0.foo.weight"] = t["norm.weight"]; });
        },
        {"not part of an EAGLE-3 draft", "\"layers.0.foo.weight\""});
  }
  SUBCASE("d2t length") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) {
            std::vector<int64_t> d = values_of<int64_t>(t["d2t"]);
            d.pop_back();
            set_values(&t["d2t"], d);
          });
        },
        {"tensor \"d2t\"", "d2t length 199 != draft_vocab_size 200"});
  }
  SUBCASE("d2t outside the vocabulary") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) {
            std::vector<int64_t> d = values_of<int64_t>(t["d2t"]);
            d[5] = 1000;
            set_values(&t["d2t"], d);
          });
        },
        {"d2t[5] = 1000 maps draft id 5 outside the target vocabulary [0, 512)"});
  }
  SUBCASE("t2d length") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) {
            std::vector<uint8_t> m = values_of<uint8_t>(t["t2d"]);
            m.pop_back();
            set_values(&t["t2d"], m);
          });
        },
        {"tensor \"t2d\"", "t2d length 511 != vocab_size 512"});
  }
  SUBCASE("t2d marks more ids than the draft vocabulary") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) {
            std::vector<uint8_t> m = values_of<uint8_t>(t["t2d"]);
            *std::find(m.begin(), m.end(), uint8_t{0}) = 1;
            set_values(&t["t2d"], m);
          });
        },
        {"t2d\" marks 201 target ids, != draft_vocab_size 200"});
  }
  SUBCASE("t2d false where d2t points") {
    expect(
        [](Setup& s) {
          edit_tensors(s.dir, [](TensorMap& t) {
            std::vector<uint8_t> m = values_of<uint8_t>(t["t2d"]);
            int64_t const t0 = values_of<int64_t>(t["d2t"])[0];  // draft id 0's target (marked)
            *std::find(m.begin(), m.end(), uint8_t{0}) = 1;      // an unmarked id, not t0
            m[t0] = 0;                                           // the count stays 200
            set_values(&t["t2d"], m);
          });
        },
        {"d2t maps draft id 0 to target id", "is false: the two maps disagree"});
  }
}

TEST_CASE("eagle3_draft: forward argument errors change nothing") {
  Setup s;
  s.edit_config([](nlohmann::json& j) { j["max_position_embeddings"] = 6; });
  eagle::DraftCpuModel m = load_ok(s);
  int64_t const H = m.hidden(), F = m.feature_width();
  eagle::DraftCache cache = make_cache(m, {1, 2});
  std::vector<eagle::RequestId> const one{1};
  std::vector<float> const feat5(static_cast<size_t>(5 * F), 0.25f);
  std::vector<int32_t> const tok5{1, 2, 3, 4, 5};
  std::vector<float> hidden{-1.0f}, logits{-1.0f};
  std::vector<int32_t> index{-7};
  auto unchanged = [&]() {
    CHECK(hidden == std::vector<float>{-1.0f});
    CHECK(logits == std::vector<float>{-1.0f});
    CHECK(index == std::vector<int32_t>{-7});
  };
  auto extend = [&](std::vector<eagle::RequestId> const& ids, std::vector<int32_t> const& counts,
                    std::vector<int32_t> const& tokens, std::vector<float> const& features) {
    return eagle::draft_extend(CpuExecutor{}, m, &cache, ids, counts, tokens, features, &hidden,
                               &logits);
  };
  check_error(extend({9}, {5}, tok5, feat5), StatusCode::kInvalidArgument,
              {"draft_extend (cpu)", "requests[0] = 9 is not in the cache"});
  check_error(extend({1, 1}, {2, 3}, tok5, feat5), StatusCode::kInvalidArgument,
              {"request 1 appears twice"});
  check_error(extend(one, {4}, tok5, feat5), StatusCode::kInvalidArgument,
              {"tokens has 5 values, expected 4 (sum of counts)"});
  check_error(extend({1, 2}, {5}, tok5, feat5), StatusCode::kInvalidArgument,
              {"counts has 1 values, expected 2"});
  check_error(extend({1, 2}, {5, 0}, tok5, feat5), StatusCode::kInvalidArgument,
              {"counts[1] = 0 must be >= 1"});
  check_error(extend(one, {5}, {1, 512, 3, 4, 5}, feat5), StatusCode::kInvalidArgument,
              {"tokens[1] = 512 is outside the target vocabulary [0, 512)"});
  check_error(
      extend(one, {5}, tok5, std::vector<float>(feat5.begin(), feat5.end() - 1)),
      StatusCode::kInvalidArgument,
      {"features has 1919 values, expected 1920", "|target streams [-1,1,3]| x target hidden 128"});
  check_error(extend(one, {7}, {1, 2, 3, 4, 5, 6, 7}, std::vector<float>(size_t(7 * F), 0.1f)),
              StatusCode::kInvalidArgument,
              {"request 1: position 6 is past the draft's max_position_embeddings 6"});
  unchanged();
  CHECK(length_of(cache, 1) == 0);

  Status st = extend(one, {5}, tok5, feat5);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  std::vector<float> const h0 = hidden, l0 = logits;
  hidden = {-1.0f}, logits = {-1.0f};
  auto step = [&](std::vector<int32_t> const& tokens, std::vector<int32_t> const& parents, int K,
                  std::vector<float> const& ph) {
    return eagle::draft_step(CpuExecutor{}, m, &cache, one, K, tokens, ph, parents, &hidden,
                             &logits, &index);
  };
  std::vector<float> ph2(h0);
  ph2.insert(ph2.end(), h0.begin(), h0.end());
  check_error(step({1, 2}, {-1, 0}, 2, ph2), StatusCode::kInvalidArgument,
              {"draft_step (cpu)", "parent_scratch[1] = 0 is outside [-1, 0)"});
  check_error(step({1, 2}, {-1, -2}, 2, ph2), StatusCode::kInvalidArgument,
              {"parent_scratch[1] = -2"});
  check_error(step({1, 2}, {-1, -1}, 2, h0), StatusCode::kInvalidArgument,
              {"parent_hidden has 128 values, expected 256 (batch 1 x branches 2 x hidden 128)"});
  check_error(step({1}, {-1, -1}, 2, ph2), StatusCode::kInvalidArgument,
              {"tokens has 1 values, expected 2"});
  check_error(step({1, -3}, {-1, -1}, 2, ph2), StatusCode::kInvalidArgument, {"tokens[1] = -3"});
  check_error(step({1, 2}, {-1, -1}, 0, ph2), StatusCode::kInvalidArgument,
              {"branches 0 must be >= 1"});
  unchanged();
  CHECK(scratch_of(cache, 1) == 0);
  // Position 5 (depth 0) fits, its child at 6 does not.
  st = step({1, 2}, {-1, -1}, 2, ph2);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(index == std::vector<int32_t>{0, 1});
  std::vector<float> const h1 = hidden;
  hidden = {-1.0f}, logits = {-1.0f}, index = {-7};
  check_error(step({3}, {0}, 1, std::vector<float>(h1.begin(), h1.begin() + H)),
              StatusCode::kInvalidArgument, {"request 1: position 6 is past", "6"});
  check_error(step({3, 4}, {-1, 2}, 2, ph2), StatusCode::kInvalidArgument,
              {"parent_scratch[1] = 2 is outside [-1, 2): request 1 has 2 scratch entries"});
  unchanged();
  CHECK(scratch_of(cache, 1) == 2);
  CHECK(length_of(cache, 1) == 5);
  // Cache bookkeeping.
  check_error(cache.add_request(1), StatusCode::kInvalidArgument, {"request 1 is already"});
  check_error(cache.free_request(9), StatusCode::kInvalidArgument,
              {"request 9 is not in the cache"});
  int64_t n = 0;
  check_error(cache.length(9, &n), StatusCode::kInvalidArgument, {"request 9"});
  REQUIRE(cache.clear_scratch(1).ok());
  CHECK(scratch_of(cache, 1) == 0);
  REQUIRE(cache.free_request(1).ok());
  CHECK_FALSE(cache.has_request(1));
  eagle::DraftCache wrong;
  REQUIRE(eagle::DraftCache::create(32, &wrong).ok());
  REQUIRE(wrong.add_request(1).ok());
  std::vector<int32_t> const five{5};
  check_error(
      eagle::draft_extend(CpuExecutor{}, m, &wrong, one, five, tok5, feat5, &hidden, &logits),
      StatusCode::kInvalidArgument, {"cache kv_width 32 != the model's", "64"});
  eagle::DraftCpuModel empty;
  std::vector<eagle::RequestId> const two_id{2};
  check_error(eagle::draft_extend(CpuExecutor{}, empty, &cache, two_id, five, tok5, feat5, &hidden,
                                  &logits),
              StatusCode::kInvalidArgument, {"the model is not loaded"});
}
