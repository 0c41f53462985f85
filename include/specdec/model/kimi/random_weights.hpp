// Random Kimi / DeepSeek-V3 weights without a checkpoint: the schema of weights.hpp bound with
// no bytes (or with bytes drawn here, on the host), and the rule every element is drawn by, the
// same on the host and on the device (random_device.cuh draws it into GPU memory).
//
//   KimiRandomWeights::create(config, seed, &out, host_bytes = false)
//       out.weights: every schema tensor of `config` bound with its name, dtype and shape; no bytes,
//       or with host_bytes every tensor drawn here (views into memory `out` holds: for small
//       models and the CPU executor). out.draw(name): the distribution tensor `name` is drawn from.
//       generate_kimi_cuda_model (forward_cuda.cuh) draws the same values on the GPU.
//   store_random_at(draw, at, dst, i)
//       element `at` (row-major index in the whole tensor) into dst[i]: a function of (draw.key, at)
//       only (Philox4x32-10, core/philox.hpp), so a tensor-parallel rank's block holds exactly the
//       values the unsharded tensor holds there: TP = 1 and TP = N run one model.
//
// Values: uniform with the mean and variance of random_checkpoint.hpp's normals (embedding 0 / 1,
// norms 1 / 0.1^2, matrices [out, in] 0 / 1/in, e_score_correction_bias 0 / 0.01^2); the fp32
// copies of the (bf16) routers hold the bf16 values. INT4 experts: weight_packed is uniform random
// bits (every nibble uniform in 0..15, a weight q - 8 in [-8, 7], standard deviation 4.61) and
// weight_scale is the constant 1 / (4.61 sqrt(in)), so W has the matrices' variance 1/in. A
// tensor's key is detail::tensor_seed(seed, name), the writer's stream seed. The values are not
// random_checkpoint.hpp's (normals from std::mt19937_64): a checkpoint written by init-random and
// this model are different models of the same shape, each deterministic from its seed.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/macros.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/status.hpp"
#include "specdec/model/kimi/weights.hpp"

namespace specdec::model::kimi {

// How one tensor's elements are drawn.
struct RandomDraw {
  // kBf16Widened: the bf16 value stored as fp32 (a bf16 tensor's fp32 copy, e.g. the routers').
  enum class Kind { kBf16, kBf16Widened, kF32, kBits32 };
  Kind kind = Kind::kBf16;
  float mean = 0.0f;
  float half_width = 0.0f;  // uniform on [mean - half_width, mean + half_width)
  uint64_t key = 0;         // Philox key: (seed, tensor name)
};

namespace detail {

// splitmix64 over (seed, FNV-1a of key): a tensor's stream seed, here and in
// random_checkpoint.hpp's writer.
inline uint64_t tensor_seed(uint64_t seed, std::string_view key) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : key) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The standard deviation of q - 8 for q uniform in 0..15: sqrt((16^2 - 1) / 12).
constexpr double kInt4Sd = 4.6097722286464435;

// Element `at` (row-major index in the whole tensor) of a tensor drawn as d: its 32 random bits
// are word at % 4 of the Philox block {at / 4 (64 bits), 0, 0} under d.key.
SPECDEC_HD inline uint32_t random_bits_at(RandomDraw const& d, uint64_t at) {
  Philox4 const b = philox4x32_10(
      Philox4{{static_cast<uint32_t>(at >> 2), static_cast<uint32_t>(at >> 34), 0u, 0u}},
      static_cast<uint32_t>(d.key), static_cast<uint32_t>(d.key >> 32));
  return b.x[at & 3u];
}

// Writes element `at` of a tensor drawn as d into dst[i] (bf16 bits, fp32 or the bits).
SPECDEC_HD inline void store_random_at(RandomDraw const& d, uint64_t at, void* dst, int64_t i) {
  uint32_t const bits = random_bits_at(d, at);
  if (d.kind == RandomDraw::Kind::kBits32) {
    static_cast<uint32_t*>(dst)[i] = bits;
    return;
  }
  float const u = static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);  // [0, 1)
  // One correctly rounded fma (host and device alike; a contracted a * b + c would differ).
  float const v = fmaf(d.half_width, 2.0f * u - 1.0f, d.mean);
  if (d.kind == RandomDraw::Kind::kF32) {
    static_cast<float*>(dst)[i] = v;
  } else if (d.kind == RandomDraw::Kind::kBf16Widened) {
    static_cast<float*>(dst)[i] = bf16_to_float(float_to_bf16(v));
  } else {
    static_cast<uint16_t*>(dst)[i] = float_to_bf16(v);
  }
}

}  // namespace detail

// The schema of a config, bound without bytes, and each tensor's draw. Move-only in effect
// (weights' views name strings this object holds).
class KimiRandomWeights {
 public:
  KimiWeights weights;

  KimiRandomWeights() = default;
  KimiRandomWeights(KimiRandomWeights&&) = default;  // the names keep their addresses
  KimiRandomWeights& operator=(KimiRandomWeights&&) = default;
  KimiRandomWeights(KimiRandomWeights const&) = delete;
  KimiRandomWeights& operator=(KimiRandomWeights const&) = delete;

  // host_bytes: also draw every tensor on the host (the same values, held here, so the views
  // have bytes: load_kimi_cpu_model / load_kimi_cuda_model read them; for small models and
  // tests). INT4 weight_shape tensors then hold their [out, in] values.
  static Status create(DeepseekV3Config const& config, uint64_t seed, KimiRandomWeights* out,
                       bool host_bytes = false) {
    if (out == nullptr) return Status::InvalidArgument("KimiRandomWeights::create: out is null");
    out->names_.clear();
    out->draws_.clear();
    out->bytes_.clear();
    out->seed_ = seed;
    Sink sink{out, host_bytes};
    KimiWeights w;
    try {
      SPECDEC_RETURN_IF_ERROR(detail::walk_kimi_schema(config, &w, sink));
    } catch (std::bad_alloc const&) {
      return Status::Internal(config.source + ": out of host memory after drawing " +
                              std::to_string(sink.bytes) + " bytes of random weights on the host "
                              "(draw a model this large on the GPU: --device cuda)");
    }
    w.num_tensors = sink.count;
    w.num_bytes = sink.bytes;
    out->weights = std::move(w);
    return Status::Ok();
  }

  // The draw of tensor `name` (a schema tensor), or null.
  RandomDraw const* draw(std::string_view name) const {
    auto it = draws_.find(name);
    return it == draws_.end() ? nullptr : &it->second;
  }

 private:
  struct Sink {
    KimiRandomWeights* self;
    bool host_bytes = false;
    int64_t count = 0;
    uint64_t bytes = 0;
    Status bind(TensorSpec const& s, RandomDraw d, TensorView* slot) {
      self->names_.push_back(s.name);
      std::string const& name = self->names_.back();
      d.key = detail::tensor_seed(self->seed_, name);
      self->draws_[name] = d;
      slot->name = name;
      slot->dtype = s.dtype;
      slot->shape = s.shape;
      slot->bytes = {};
      if (host_bytes) {
        std::vector<std::byte>& b = self->bytes_.emplace_back(static_cast<size_t>(s.bytes()));
        for (int64_t i = 0, n = s.bytes() / dtype_size(s.dtype); i < n; ++i) {
          detail::store_random_at(d, static_cast<uint64_t>(i), b.data(), i);
        }
        slot->bytes = b;
      }
      ++count;
      bytes += static_cast<uint64_t>(s.bytes());
      return Status::Ok();
    }
    static RandomDraw uniform(RandomDraw::Kind kind, double mean, double sd) {
      return RandomDraw{kind, static_cast<float>(mean), static_cast<float>(sd * std::sqrt(3.0)), 0};
    }
    Status tensor(TensorSpec const& s, TensorView* slot) {
      RandomDraw::Kind const kind =
          s.dtype == Dtype::kF32 ? RandomDraw::Kind::kF32 : RandomDraw::Kind::kBf16;
      switch (s.init) {
        case TensorInit::kEmbedding: return bind(s, uniform(kind, 0.0, 1.0), slot);
        case TensorInit::kNorm: return bind(s, uniform(kind, 1.0, 0.1), slot);
        case TensorInit::kBias: return bind(s, uniform(kind, 0.0, 0.01), slot);
        case TensorInit::kMatrix: break;
      }
      double const in = static_cast<double>(s.shape.size() == 2 ? s.shape[1] : 1);
      return bind(s, uniform(kind, 0.0, 1.0 / std::sqrt(in)), slot);
    }
    Status linear(LinearSpec const& s, LinearWeights* slot) {
      std::vector<TensorSpec> const t = s.tensors();
      double const sd = 1.0 / std::sqrt(static_cast<double>(s.in));
      if (!s.int4) return bind(t[0], uniform(RandomDraw::Kind::kBf16, 0.0, sd), &slot->weight);
      SPECDEC_RETURN_IF_ERROR(
          bind(t[0], RandomDraw{RandomDraw::Kind::kBits32, 0, 0, 0}, &slot->weight_packed));
      SPECDEC_RETURN_IF_ERROR(bind(
          t[1], RandomDraw{RandomDraw::Kind::kBf16, static_cast<float>(sd / detail::kInt4Sd), 0, 0},
          &slot->weight_scale));
      SPECDEC_RETURN_IF_ERROR(
          bind(t[2], RandomDraw{RandomDraw::Kind::kBits32, 0, 0, 0}, &slot->weight_shape));
      if (host_bytes) {
        int32_t const shape[2] = {static_cast<int32_t>(s.out), static_cast<int32_t>(s.in)};
        std::memcpy(self->bytes_.back().data(), shape, sizeof shape);
      }
      return Status::Ok();
    }
  };

  uint64_t seed_ = 0;
  std::deque<std::string> names_;
  std::map<std::string, RandomDraw, std::less<>> draws_;
  std::deque<std::vector<std::byte>> bytes_;  // host_bytes: each tensor's values
};

}  // namespace specdec::model::kimi
