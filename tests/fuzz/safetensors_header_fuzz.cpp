// libFuzzer target: arbitrary bytes as a whole safetensors file into parse_safetensors.
// Beyond "no crash, no sanitizer report, no escaping exception", an accepted file must satisfy the
// parser's promises (sorted unique names, ranges inside the data, sizes = numel * dtype size, no
// overlaps), and re-encoding its table with write's encoder must parse back to the same table.
// Build: clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -Iinclude
// (tests/fuzz/CMakeLists.txt).
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "specdec/io/safetensors.hpp"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(uint8_t const* data, size_t size) {
  using namespace specdec::io;
  std::span<std::byte const> const file(reinterpret_cast<std::byte const*>(data), size);
  SafetensorsHeader h;
  specdec::Status const s = parse_safetensors(file, "fuzz", &h);
  if (!s.ok()) {
    require(!s.message().empty());
    return 0;
  }
  require(h.data_start + h.data_size == size);
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    SafetensorsEntry const& e = h.tensors[i];
    if (i > 0) require(h.tensors[i - 1].name < e.name);
    require(e.begin <= e.end && e.end <= h.data_size);
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      require(d >= 0);
      numel *= static_cast<uint64_t>(d);  // cannot overflow: the parser checked
    }
    require(numel * static_cast<uint64_t>(specdec::dtype_size(e.dtype)) == e.end - e.begin);
    for (size_t k = 0; k < i; ++k) {
      SafetensorsEntry const& o = h.tensors[k];
      bool const empty = e.begin == e.end || o.begin == o.end;
      require(empty || e.end <= o.begin || o.end <= e.begin);
    }
    tensors.push_back({e.name, e.dtype, e.shape,
                       file.subspan(static_cast<size_t>(h.data_start + e.begin),
                                    static_cast<size_t>(e.end - e.begin))});
  }
  std::vector<std::byte> encoded;
  require(encode_safetensors(tensors, h.metadata, &encoded).ok());
  SafetensorsHeader back;
  require(parse_safetensors(encoded, "fuzz re-encoded", &back).ok());
  require(back.metadata == h.metadata && back.tensors.size() == h.tensors.size());
  require(back.data_start % 8 == 0);
  for (size_t i = 0; i < back.tensors.size(); ++i) {
    SafetensorsEntry const& a = h.tensors[i];
    SafetensorsEntry const& b = back.tensors[i];
    require(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape);
    require(a.end - a.begin == b.end - b.begin);
    for (uint64_t k = 0; k < a.end - a.begin; ++k) {
      require(file[h.data_start + a.begin + k] == encoded[back.data_start + b.begin + k]);
    }
  }
  return 0;
}

#ifdef SPECDEC_FUZZ_SEEDS
// Seed corpus writer (built with the host compiler): `safetensors_fuzz_seeds <dir>` writes a few
// valid files (empty table, each dtype, a scalar, a zero-size tensor, metadata) into <dir>.
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  using namespace specdec::io;
  using specdec::Dtype;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  std::string const dir = argv[1];
  std::vector<std::byte> const bytes(64, std::byte{0x3f});
  auto b = [&](size_t n) { return std::span<std::byte const>(bytes.data(), n); };
  std::vector<std::vector<TensorToWrite>> const files = {
      {},
      {{"model.norm.weight", Dtype::kBF16, {4}, b(8)}},
      {{"a", Dtype::kF32, {2, 2}, b(16)},
       {"b", Dtype::kI64, {1}, b(8)},
       {"c", Dtype::kI32, {}, b(4)},
       {"d", Dtype::kBool, {3}, b(3)},
       {"e", Dtype::kF16, {0, 5}, b(0)}},
      {{"language_model.model.layers.1.mlp.experts.0.down_proj.weight_packed",
        Dtype::kI32,
        {2, 2},
        b(16)},
       {"language_model.model.layers.1.mlp.experts.0.down_proj.weight_scale",
        Dtype::kBF16,
        {2, 1},
        b(4)}},
  };
  std::vector<std::map<std::string, std::string>> const metadata = {
      {}, {{"format", "pt"}}, {}, {{"format", "pt"}, {"note", "seed"}}};
  for (size_t i = 0; i < files.size(); ++i) {
    std::string const path = dir + "/seed" + std::to_string(i) + ".safetensors";
    specdec::Status const s = write_safetensors(path, files[i], metadata[i]);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 1;
    }
  }
  return 0;
}
#endif
