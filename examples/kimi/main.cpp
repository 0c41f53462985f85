// specdec-kimi: the Kimi-K2.5 reference binary (loading part).
//
//   specdec-kimi init-random --preset tiny|kimi-k2.5 --out DIR [--seed S] [--int4] [--shards N]
//                            [--num-layers L]
//       writes a random checkpoint (config.json + safetensors) of the preset into a new or empty DIR
//   specdec-kimi inspect --model-path DIR
//       loads config + weights (progress bar on stderr) and prints describe(config), the tensor
//       count and bytes, and whether the routed experts are INT4
//   specdec-kimi generate --model-path DIR --input-ids 1,2,3 --max-new-tokens N [--temperature T]
//                         [--seed S] [--device cpu|cuda] [--ignore-eos] [--page-size P] [--json]
//       plain decoding (no speculation) on the CPU or the CUDA executor (GPU 0; this binary is
//       compiled as CUDA where the build has CUDA); --json prints one object with
//       output_ids, tokens_per_s (output tokens / wall time of prefill + decode) and the timings
//   specdec-kimi dequantize --model-path DIR --out DIR2
//       writes a copy of an INT4-expert checkpoint with float32 dense experts (exact) and no
//       quantization_config, for frameworks that read dense weights (scripts/hf_parity.py --int4)
//
// Flags are strict: an unknown flag, a missing value or a malformed number is an error naming the
// flag (exit 2); a failed load or write prints the Status (exit 1).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/model/kimi/forward_cuda.cuh"
#endif
#include "specdec/io/hf_config.hpp"
#include "specdec/io/progress.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/dequantize_checkpoint.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/generate.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"

namespace {

using specdec::Status;

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: specdec-kimi init-random --preset tiny|kimi-k2.5 --out DIR [--seed S]\n"
               "                                [--int4] [--shards N] [--num-layers L]\n"
               "       specdec-kimi inspect --model-path DIR\n"
               "       specdec-kimi generate --model-path DIR --input-ids 1,2,3 --max-new-tokens N\n"
               "                             [--temperature T] [--seed S] [--device cpu|cuda]\n"
               "                             [--ignore-eos] [--page-size P] [--json]\n"
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
    fail_usage(std::string(flag) + (std::is_floating_point_v<T> ? " expects a number" : " expects a whole number") +
               ", got '" + text + "'");
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

// The flags after the command, walked in order:
//   for (Flags f(argc, argv); f.next();) { if (f.is("--x")) x = f.value(); ... else f.unknown(); }
class Flags {
 public:
  Flags(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    return true;
  }
  bool is(char const* name) const { return flag_ == name; }
  char const* value() {
    if (i_ + 1 >= argc_) fail_usage(flag_ + " needs a value");
    return argv_[++i_];
  }
  template <class T>
  T number() {
    char const* text = value();
    return ::number<T>(flag_.c_str(), text);
  }
  [[noreturn]] void unknown() const {
    fail_usage("unknown flag " + flag_ + " for " + argv_[1]);
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 1;  // argv[1] is the command
  std::string flag_;
};

// config.json, the safetensors and every weight of the checkpoint at `path` (progress on stderr).
struct LoadedCheckpoint {
  specdec::io::DeepseekV3Config config;
  specdec::io::SafetensorsCheckpoint ckpt;
  specdec::model::kimi::KimiWeights weights;
  bool config_loaded = false;  // config is valid even when a later step failed
};
Status load_checkpoint(std::string const& path, LoadedCheckpoint* m) {
  SPECDEC_RETURN_IF_ERROR(specdec::io::load_config(path, &m->config));
  m->config_loaded = true;
  SPECDEC_RETURN_IF_ERROR(specdec::io::SafetensorsCheckpoint::open(path, &m->ckpt));
  specdec::io::ProgressBar bar("load " + path);
  Status const s = specdec::model::kimi::load_kimi_weights(m->ckpt, m->config, &m->weights,
                                                           bar.callback());
  bar.finish();
  return s;
}

int init_random(int argc, char** argv) {
  std::string preset, out;
  uint64_t seed = 0;
  bool int4 = false;
  int shards = 1;
  std::optional<int> num_layers;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--preset")) preset = f.value();
    else if (f.is("--out")) out = f.value();
    else if (f.is("--seed")) seed = f.number<uint64_t>();
    else if (f.is("--int4")) int4 = true;
    else if (f.is("--shards")) shards = f.number<int>();
    else if (f.is("--num-layers")) num_layers = f.number<int>();
    else f.unknown();
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
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--model-path")) path = f.value();
    else f.unknown();
  }
  if (path.empty()) fail_usage("inspect needs --model-path DIR");
  LoadedCheckpoint m;
  Status const s = load_checkpoint(path, &m);
  if (m.config_loaded) std::printf("%s\n", specdec::io::describe(m.config).c_str());
  if (!s.ok()) return finish(s);
  std::printf("tensors: %lld in %zu shard%s, %s (%llu bytes)\n",
              static_cast<long long>(m.weights.num_tensors), m.ckpt.num_shards(),
              m.ckpt.num_shards() == 1 ? "" : "s",
              specdec::io::format_bytes(static_cast<double>(m.weights.num_bytes)).c_str(),
              static_cast<unsigned long long>(m.weights.num_bytes));
  std::printf("routed experts: %s\n", m.weights.experts_int4 ? "INT4" : "bf16");
  return 0;
}

// "1,2,3" -> {1, 2, 3}; any other text is a usage error naming the flag.
std::vector<int32_t> id_list(char const* flag, std::string const& text) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t const end = std::min(text.find(',', begin), text.size());
    ids.push_back(number<int32_t>(flag, text.substr(begin, end - begin).c_str()));
    begin = end + 1;
  }
  return ids;
}

int generate(int argc, char** argv) {
  std::string path, device = "cpu", input;
  specdec::model::kimi::GenerateOptions o;
  bool json = false, have_max = false;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--model-path")) path = f.value();
    else if (f.is("--input-ids")) input = f.value();
    else if (f.is("--max-new-tokens")) o.max_new_tokens = f.number<int>(), have_max = true;
    else if (f.is("--temperature")) o.temperature = f.number<float>();
    else if (f.is("--seed")) o.seed = f.number<uint64_t>();
    else if (f.is("--device")) device = f.value();
    else if (f.is("--page-size")) o.page_size = f.number<int>();
    else if (f.is("--ignore-eos")) o.stop_at_eos = false;
    else if (f.is("--json")) json = true;
    else f.unknown();
  }
  if (path.empty()) fail_usage("generate needs --model-path DIR");
  if (input.empty()) fail_usage("generate needs --input-ids (comma-separated token ids)");
  if (!have_max) fail_usage("generate needs --max-new-tokens N");
  if (device != "cpu" && device != "cuda") fail_usage("--device " + device + ": use cpu or cuda");
#if defined(__CUDACC__)
  if (device == "cuda" && !specdec::cuda_device_available()) {
    return finish(Status::Unsupported("--device cuda: no CUDA device is visible; use --device cpu"));
  }
#else
  if (device == "cuda") {
    return finish(Status::Unsupported(
        "--device cuda: this specdec-kimi was built without CUDA; use --device cpu"));
  }
#endif
  std::vector<int32_t> const ids = id_list("--input-ids", input);
  LoadedCheckpoint m;
  Status s = load_checkpoint(path, &m);
  if (!s.ok()) return finish(s);
  specdec::model::kimi::GenerateResult r;
  if (device == "cpu") {
    specdec::model::kimi::KimiCpuModel model;
    s = specdec::model::kimi::load_kimi_cpu_model(m.weights, m.config, &model);
    if (!s.ok()) return finish(s);
    s = specdec::model::kimi::kimi_generate(specdec::CpuExecutor{}, model, m.config, ids, o, &r);
  }
#if defined(__CUDACC__)
  if (device == "cuda") {
    specdec::model::kimi::KimiCudaModel model;
    s = specdec::model::kimi::load_kimi_cuda_model(m.weights, m.config, &model);
    if (!s.ok()) return finish(s);
    s = specdec::model::kimi::kimi_generate(specdec::CudaExecutor{}, model, ids, o, &r);
  }
#endif
  if (!s.ok()) return finish(s);
  nlohmann::json const j = {{"output_ids", r.output_ids},
                            {"finish_reason", r.stopped_at_eos ? "eos" : "length"},
                            {"prompt_tokens", ids.size()},
                            {"device", device},
                            {"tokens_per_s", r.tokens_per_s},
                            {"decode_tokens_per_s", r.decode_tokens_per_s},
                            {"prefill_seconds", r.prefill_seconds},
                            {"decode_seconds", r.decode_seconds}};
  std::printf("%s\n", json ? j.dump().c_str() : j.dump(2).c_str());
  return 0;
}

int dequantize(int argc, char** argv) {
  std::string path, out;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--model-path")) path = f.value();
    else if (f.is("--out")) out = f.value();
    else f.unknown();
  }
  if (path.empty()) fail_usage("dequantize needs --model-path DIR");
  if (out.empty()) fail_usage("dequantize needs --out DIR2");
  Status const s = specdec::model::kimi::write_dequantized_copy(path, out);
  if (s.ok()) std::printf("wrote the float32-expert copy of %s to %s\n", path.c_str(), out.c_str());
  return finish(s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail_usage("missing command (init-random, inspect, generate, dequantize)");
  std::string const cmd = argv[1];
  if (cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return 0;
  }
  try {
    if (cmd == "init-random") return init_random(argc, argv);
    if (cmd == "inspect") return inspect(argc, argv);
    if (cmd == "dequantize") return dequantize(argc, argv);
    if (cmd == "generate") return generate(argc, argv);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  fail_usage("unknown command '" + cmd + "' (init-random, inspect, generate, dequantize)");
}
