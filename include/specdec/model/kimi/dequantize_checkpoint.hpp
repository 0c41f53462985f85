// A dequantised copy of a checkpoint whose routed experts are compressed-tensors INT4, for
// checking our INT4 path against a framework that reads only dense weights (transformers, in
// scripts/hf_parity.py --int4):
//   write_dequantized_copy(src_dir, dst_dir)
// Every INT4 linear `M` (M.weight_packed int32 [out, in/8], M.weight_scale bf16 [out, in/group],
// M.weight_shape int32 [2]) becomes M.weight float32 [out, in] = q * scale, computed by
// io::dequantize_int4_group, the function our loader's INT4 path uses. The product of a 4-bit
// integer and a bf16 scale has at most 12 significant bits, so float32 holds it exactly: the copy
// and the INT4 original describe the same model. Every other tensor is copied byte for byte, and
// config.json loses its quantization_config (top level or text_config). The copy is one
// model.safetensors held in memory while written: meant for small checkpoints. Our own loader
// reads bf16 checkpoints only, so it refuses the copy (float32 weights) with a dtype error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/atomic_file.hpp"
#include "specdec/io/compressed_tensors.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"

namespace specdec::model::kimi {

inline Status write_dequantized_copy(std::string const& src, std::string const& dst) {
  namespace fs = std::filesystem;
  std::string const config_path = (fs::path(src) / "config.json").string();
  io::DeepseekV3Config config;
  SPECDEC_RETURN_IF_ERROR(io::load_config(src, &config));
  if (!config.quantization) {
    return Status::InvalidArgument(config_path +
                                   " has no quantization_config: nothing to dequantize");
  }
  std::ifstream in(config_path, std::ios::binary);
  std::string const text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json raw = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (raw.is_discarded() || !raw.is_object()) {  // load_config parsed it: cannot happen
    return Status::Internal(config_path + ": unreadable on the second read");
  }
  raw.erase("quantization_config");
  if (raw.contains("text_config") && raw["text_config"].is_object()) {
    raw["text_config"].erase("quantization_config");
  }

  std::error_code ec;
  fs::create_directories(dst, ec);
  if (ec || !fs::is_empty(dst, ec) || ec) {
    return Status::InvalidArgument(dst + ": not an empty (or new) directory; the dequantised copy "
                                         "is written only into one");
  }

  io::SafetensorsCheckpoint ckpt;
  SPECDEC_RETURN_IF_ERROR(io::SafetensorsCheckpoint::open(src, &ckpt));
  constexpr std::string_view kPacked = ".weight_packed", kScale = ".weight_scale",
                             kShape = ".weight_shape";
  auto ends_with = [](std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
  };
  auto module_of = [&](std::string_view name) -> std::string_view {
    for (std::string_view suffix : {kPacked, kScale, kShape}) {
      if (ends_with(name, suffix)) return name.substr(0, name.size() - suffix.size());
    }
    return {};
  };
  int64_t const group = config.quantization->group_size;
  std::vector<io::TensorToWrite> tensors;
  std::vector<std::vector<float>> dense;  // storage of the dequantised weights
  dense.reserve(ckpt.size());
  for (std::string_view name : ckpt.names()) {
    std::string_view const module = module_of(name);
    bool const int4 = !module.empty() && ckpt.contains(std::string(module) + std::string(kPacked));
    if (!int4) {
      io::TensorView const v = *ckpt.find(name);
      tensors.push_back({std::string(name), v.dtype, v.shape, v.bytes});
      continue;
    }
    if (!ends_with(name, kPacked)) continue;  // scale and shape are read with the packed weight
    std::string const m(module);
    if (!io::is_int4_module(config, m)) {
      return Status::MalformedInput(src + ": tensor \"" + std::string(name) + "\" is packed INT4 but " +
                                    config.quantization_path + " does not quantise module \"" + m +
                                    "\"");
    }
    io::TensorView shape_view, packed, scale;
    SPECDEC_RETURN_IF_ERROR(ckpt.get(m + std::string(kShape), Dtype::kI32, {2}, &shape_view));
    int32_t dims[2];
    std::memcpy(dims, shape_view.bytes.data(), sizeof(dims));
    int64_t const out = dims[0], in_features = dims[1];
    if (out < 1 || in_features < 1 || in_features % group != 0 || group % io::kInt4PerWord != 0) {
      return Status::MalformedInput(src + ": " + m + std::string(kShape) + " = [" +
                                    std::to_string(out) + ", " + std::to_string(in_features) +
                                    "] does not fit group size " + std::to_string(group));
    }
    SPECDEC_RETURN_IF_ERROR(ckpt.get(m + std::string(kPacked), Dtype::kI32,
                                     {out, in_features / io::kInt4PerWord}, &packed));
    SPECDEC_RETURN_IF_ERROR(
        ckpt.get(m + std::string(kScale), Dtype::kBF16, {out, in_features / group}, &scale));
    std::vector<float>& w = dense.emplace_back(static_cast<size_t>(out * in_features));
    // Copies: safetensors data need not be aligned for int32 / uint16 reads.
    std::vector<int32_t> packed_words(static_cast<size_t>(packed.numel()));
    std::vector<uint16_t> scale_bits(static_cast<size_t>(scale.numel()));
    std::memcpy(packed_words.data(), packed.bytes.data(), packed.bytes.size());
    std::memcpy(scale_bits.data(), scale.bytes.data(), scale.bytes.size());
    SPECDEC_RETURN_IF_ERROR(io::dequantize_int4_group(packed_words.data(), scale_bits.data(), out,
                                                      in_features, group, w.data()));
    tensors.push_back({m + ".weight", Dtype::kF32, {out, in_features},
                       std::as_bytes(std::span<float const>(w))});
  }
  if (dense.empty()) {
    return Status::MalformedInput(src + ": " + config.quantization_path +
                                  " is set but the checkpoint holds no packed INT4 tensor");
  }
  SPECDEC_RETURN_IF_ERROR(io::write_safetensors(
      (fs::path(dst) / io::kSafetensorsSingleFile).string(), tensors, {{"format", "pt"}}));
  return io::write_file_atomically((fs::path(dst) / "config.json").string(), raw.dump(2) + "\n");
}

}  // namespace specdec::model::kimi
