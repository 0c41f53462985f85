// write_dequantized_copy (model/kimi/dequantize_checkpoint.hpp): the float32 copy of an INT4
// checkpoint holds, for every INT4 expert linear, exactly the weight our INT4 path computes
// (checked against a dequantisation written out here in plain loops from the nibble layout of
// io/compressed_tensors.hpp), every other tensor byte for byte, and a config without
// quantization_config; bad sources and destinations are refused with a named error.
#include "specdec/model/kimi/dequantize_checkpoint.hpp"
#include "support/kimi_model.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
namespace kimi = specdec::model::kimi;
using specdec::Dtype;
using specdec::Status;
using specdec::io::SafetensorsCheckpoint;
using specdec::io::TensorView;
using specdec::testing::load_tiny_kimi;
using specdec::testing::TempDir;
using specdec::testing::TinyKimi;

template <class T>
std::vector<T> values_of(TensorView const& v) {
  std::vector<T> out(v.bytes.size() / sizeof(T));
  std::memcpy(out.data(), v.bytes.data(), v.bytes.size());
  return out;
}

nlohmann::json read_json(fs::path const& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("dequantize: the float32 copy is exactly the INT4 model") {
  TempDir tmp;
  TinyKimi m;
  load_tiny_kimi(tmp.path / "int4", true, 3, &m);
  REQUIRE(m.weights.experts_int4);
  Status const s = kimi::write_dequantized_copy((tmp.path / "int4").string(),
                                                (tmp.path / "f32").string());
  REQUIRE_MESSAGE(s.ok(), s.to_string());

  nlohmann::json const config = read_json(tmp.path / "f32" / "config.json");
  CHECK(!config.contains("quantization_config"));
  nlohmann::json original = read_json(tmp.path / "int4" / "config.json");
  original.erase("quantization_config");
  CHECK(config == original);  // nothing else changed

  SafetensorsCheckpoint copy;
  REQUIRE(SafetensorsCheckpoint::open((tmp.path / "f32").string(), &copy).ok());
  int64_t const group = m.config.quantization->group_size;
  int dequantised = 0, copied = 0;
  for (std::string_view name : m.ckpt.names()) {
    std::string const n(name);
    if (n.ends_with(".weight_scale") || n.ends_with(".weight_shape")) {
      CHECK_MESSAGE(!copy.contains(n), n);
      continue;
    }
    if (!n.ends_with(".weight_packed")) {
      TensorView const a = *m.ckpt.find(n);
      std::optional<TensorView> const b = copy.find(n);
      REQUIRE_MESSAGE(b.has_value(), n);
      CHECK(b->dtype == a.dtype);
      CHECK(b->shape == a.shape);
      CHECK_MESSAGE(std::memcmp(a.bytes.data(), b->bytes.data(), a.bytes.size()) == 0, n);
      ++copied;
      continue;
    }
    std::string const module = n.substr(0, n.size() - std::string(".weight_packed").size());
    auto const dims = values_of<int32_t>(*m.ckpt.find(module + ".weight_shape"));
    int64_t const out = dims[0], in = dims[1];
    auto const packed = values_of<int32_t>(*m.ckpt.find(n));
    auto const scale = values_of<uint16_t>(*m.ckpt.find(module + ".weight_scale"));
    TensorView w;
    REQUIRE(copy.get(module + ".weight", Dtype::kF32, {out, in}, &w).ok());
    auto const got = values_of<float>(w);
    // compressed-tensors pack-quantized: 8 nibbles per int32, nibble k % 8 at bits 4 * (k % 8),
    // stored as value + 8; scale per (row, group of `group` inputs).
    int mismatches = 0;
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t k = 0; k < in; ++k) {
        uint32_t const word = static_cast<uint32_t>(packed[r * (in / 8) + k / 8]);
        int const q = static_cast<int>((word >> (4 * (k % 8))) & 0xF) - 8;
        float const want = static_cast<float>(q) * specdec::bf16_to_float(scale[r * (in / group) + k / group]);
        mismatches += got[r * in + k] != want;
      }
    }
    CHECK_MESSAGE(mismatches == 0, module);
    ++dequantised;
  }
  MESSAGE(dequantised, " INT4 linears dequantised, ", copied, " tensors copied");
  // tiny: 3 MoE layers x 8 experts x 3 projections.
  CHECK(dequantised == 3 * 8 * 3);
  CHECK(copied > 0);
  CHECK(copy.size() == static_cast<size_t>(dequantised + copied));

  // Our loader reads bf16 checkpoints only: the copy is refused, naming a float32 weight.
  TinyKimi reloaded;
  REQUIRE(specdec::io::load_config(tmp.path / "f32", &reloaded.config).ok());
  Status const refused = kimi::load_kimi_weights(copy, reloaded.config, &reloaded.weights);
  CHECK(!refused.ok());
  CHECK(refused.to_string().find("F32") != std::string::npos);
}

TEST_CASE("dequantize: refusals") {
  TempDir tmp;
  TinyKimi bf16;
  load_tiny_kimi(tmp.path / "bf16", false, 3, &bf16);
  Status s = kimi::write_dequantized_copy((tmp.path / "bf16").string(), (tmp.path / "a").string());
  CHECK(s.to_string().find("no quantization_config: nothing to dequantize") != std::string::npos);

  TinyKimi int4;
  load_tiny_kimi(tmp.path / "int4", true, 3, &int4);
  fs::create_directories(tmp.path / "busy");
  std::ofstream(tmp.path / "busy" / "file") << "x";
  s = kimi::write_dequantized_copy((tmp.path / "int4").string(), (tmp.path / "busy").string());
  CHECK(s.to_string().find("not an empty (or new) directory") != std::string::npos);

  s = kimi::write_dequantized_copy((tmp.path / "missing").string(), (tmp.path / "b").string());
  CHECK(!s.ok());
  CHECK(s.to_string().find("missing") != std::string::npos);
}
