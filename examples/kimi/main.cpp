// specdec-kimi: the Kimi-K2.5 reference binary (loading part).
//
//   specdec-kimi init-random --preset tiny|kimi-k2.5 --out DIR [--seed S] [--int4] [--shards N]
//                            [--num-layers L]
//       writes a random checkpoint (config.json + safetensors) of the preset into a new or empty DIR
//   specdec-kimi inspect --model-path DIR
//       loads config + weights (progress bar on stderr) and prints describe(config), the tensor
//       count and bytes, and whether the routed experts are INT4
//   specdec-kimi dequantize --model-path DIR --out DIR2
//       writes a copy of an INT4-expert checkpoint with float32 dense experts (exact) and no
//       quantization_config, for frameworks that read dense weights (scripts/hf_parity.py --int4)
//
// Flags are strict: an unknown flag, a missing value or a malformed number is an error naming the
// flag (exit 2); a failed load or write prints the Status (exit 1).
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include "specdec/io/hf_config.hpp"
#include "specdec/io/progress.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/dequantize_checkpoint.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"

namespace {

using specdec::Status;

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: specdec-kimi init-random --preset tiny|kimi-k2.5 --out DIR [--seed S]\n"
               "                                [--int4] [--shards N] [--num-layers L]\n"
               "       specdec-kimi inspect --model-path DIR\n"
               "       specdec-kimi dequantize --model-path DIR --out DIR2\n");
}

[[noreturn]] void fail_usage(std::string const& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  usage(stderr);
  std::exit(2);
}

// A flag's value as a number; anything but a whole number of that type is an error naming the flag.
template <class T>
T number(char const* flag, char const* text) {
  T value{};
  char const* end = text + std::strlen(text);
  auto const [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || ptr == text) {
    fail_usage(std::string(flag) + " expects a whole number, got '" + text + "'");
  }
  return value;
}

int finish(Status const& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}

int init_random(int argc, char** argv) {
  std::string preset, out;
  uint64_t seed = 0;
  bool int4 = false;
  int shards = 1;
  std::optional<int> num_layers;
  for (int i = 2; i < argc; ++i) {
    std::string const a = argv[i];
    auto value = [&](char const* name) -> char const* {
      if (i + 1 >= argc) fail_usage(std::string(name) + " needs a value");
      return argv[++i];
    };
    if (a == "--preset") preset = value("--preset");
    else if (a == "--out") out = value("--out");
    else if (a == "--seed") seed = number<uint64_t>("--seed", value("--seed"));
    else if (a == "--int4") int4 = true;
    else if (a == "--shards") shards = number<int>("--shards", value("--shards"));
    else if (a == "--num-layers") num_layers = number<int>("--num-layers", value("--num-layers"));
    else fail_usage("unknown flag " + a + " for init-random");
  }
  if (preset.empty()) fail_usage("init-random needs --preset (tiny, kimi-k2.5)");
  if (out.empty()) fail_usage("init-random needs --out DIR");
  specdec::io::ProgressBar bar("write " + out);
  Status const s = specdec::model::kimi::write_random_preset(out, preset, seed, int4, shards,
                                                              num_layers, bar.callback());
  bar.finish();
  if (s.ok()) {
    std::printf("wrote %s checkpoint (%s, %d shard%s, seed %llu) to %s\n", preset.c_str(),
                int4 ? "INT4 experts" : "bf16", shards, shards == 1 ? "" : "s",
                static_cast<unsigned long long>(seed), out.c_str());
  }
  return finish(s);
}

int inspect(int argc, char** argv) {
  std::string path;
  for (int i = 2; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--model-path") {
      if (i + 1 >= argc) fail_usage("--model-path needs a value");
      path = argv[++i];
    } else {
      fail_usage("unknown flag " + a + " for inspect");
    }
  }
  if (path.empty()) fail_usage("inspect needs --model-path DIR");
  specdec::io::DeepseekV3Config config;
  Status s = specdec::io::load_config(path, &config);
  if (!s.ok()) return finish(s);
  std::printf("%s\n", specdec::io::describe(config).c_str());
  specdec::io::SafetensorsCheckpoint ckpt;
  s = specdec::io::SafetensorsCheckpoint::open(path, &ckpt);
  if (!s.ok()) return finish(s);
  specdec::model::kimi::KimiWeights weights;
  specdec::io::ProgressBar bar("load " + path);
  s = specdec::model::kimi::load_kimi_weights(ckpt, config, &weights, bar.callback());
  bar.finish();
  if (!s.ok()) return finish(s);
  std::printf("tensors: %lld in %zu shard%s, %s (%llu bytes)\n",
              static_cast<long long>(weights.num_tensors), ckpt.num_shards(),
              ckpt.num_shards() == 1 ? "" : "s",
              specdec::io::format_bytes(static_cast<double>(weights.num_bytes)).c_str(),
              static_cast<unsigned long long>(weights.num_bytes));
  std::printf("routed experts: %s\n", weights.experts_int4 ? "INT4" : "bf16");
  return 0;
}

int dequantize(int argc, char** argv) {
  std::string path, out;
  for (int i = 2; i < argc; ++i) {
    std::string const a = argv[i];
    auto value = [&](char const* name) -> std::string {
      if (i + 1 >= argc) fail_usage(std::string(name) + " needs a value");
      return argv[++i];
    };
    if (a == "--model-path") path = value("--model-path");
    else if (a == "--out") out = value("--out");
    else fail_usage("unknown flag " + a + " for dequantize");
  }
  if (path.empty()) fail_usage("dequantize needs --model-path DIR");
  if (out.empty()) fail_usage("dequantize needs --out DIR2");
  Status const s = specdec::model::kimi::write_dequantized_copy(path, out);
  if (s.ok()) std::printf("wrote the float32-expert copy of %s to %s\n", path.c_str(), out.c_str());
  return finish(s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail_usage("missing command (init-random, inspect, dequantize)");
  std::string const cmd = argv[1];
  if (cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return 0;
  }
  try {
    if (cmd == "init-random") return init_random(argc, argv);
    if (cmd == "inspect") return inspect(argc, argv);
    if (cmd == "dequantize") return dequantize(argc, argv);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  fail_usage("unknown command '" + cmd + "' (init-random, inspect, dequantize)");
}
