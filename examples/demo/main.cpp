// specdec-demo: one speculative-decoding loop, end to end, on a synthetic draft/target pair.
//
// The pair is defined here: a bigram target whose next-token logits depend on the last token only,
//   target[t][v] = sharpness * g(t, v)                 g ~ N(0, 1) from Philox (seed, t, v)
//   draft[t][v]  = target[t][v] + noise * h(t, v)      h an independent N(0, 1)
// so `--noise` sets how well the draft predicts the target (0: perfectly). Each step runs
//   propose (draft_expand x steps, draft_finalize) -> tree_build -> verify (greedy or sampled)
//   -> kv_commit
// over B requests, on the GPU when one is present (else the CPU references). The "KV cache" holds
// (token, position) per slot, so after kv_commit it must spell out each request's committed text;
// the demo checks that, and with temperature 0 checks the output equals plain greedy decoding.
// It prints the accept length and the acceptance per draft position.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "specdec/core/philox.hpp"
#include "specdec/ops/draft_select/draft_select.hpp"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "specdec/ops/verify_greedy/verify_greedy.hpp"
#include "specdec/ops/verify_sample/verify_sample.hpp"
#include "specdec/policy/spec_policy.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#endif

namespace {

using specdec::CpuExecutor;
using specdec::Status;

struct Options {
  int batch = 4;
  int vocab = 512;
  int topk = 4;
  int steps = 3;
  int nodes = 8;
  int tokens = 64;  // tokens generated per request
  float temperature = 0.0f;
  float sharpness = 4.0f;
  float noise = 1.0f;
  uint64_t seed = 1;
  bool cpu = false;
};

void usage() {
  std::printf(
      "usage: specdec-demo [--batch B] [--vocab V] [--speculative-eagle-topk K]\n"
      "                    [--speculative-num-steps S] [--speculative-num-draft-tokens N]\n"
      "                    [--tokens T] [--temperature X] [--noise X] [--sharpness X]\n"
      "                    [--seed S] [--cpu]\n");
}

// A flag's value as a number; anything but a whole number of that type is an error naming the flag.
template <class T>
T number(char const* flag, char const* text) {
  T value{};
  char const* end = text + std::strlen(text);
  auto const [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || ptr == text) {
    std::fprintf(stderr, "error: %s expects a number, got '%s'\n", flag, text);
    std::exit(2);
  }
  return value;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto value = [&](char const* name) -> char const* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    auto integer = [&](char const* name) { return number<int>(name, value(name)); };
    auto real = [&](char const* name) { return number<float>(name, value(name)); };
    if (a == "--batch") o.batch = integer("--batch");
    else if (a == "--vocab") o.vocab = integer("--vocab");
    else if (a == "--speculative-eagle-topk") o.topk = integer("--speculative-eagle-topk");
    else if (a == "--speculative-num-steps") o.steps = integer("--speculative-num-steps");
    else if (a == "--speculative-num-draft-tokens") o.nodes = integer("--speculative-num-draft-tokens");
    else if (a == "--tokens") o.tokens = integer("--tokens");
    else if (a == "--temperature") o.temperature = real("--temperature");
    else if (a == "--noise") o.noise = real("--noise");
    else if (a == "--sharpness") o.sharpness = real("--sharpness");
    else if (a == "--seed") o.seed = number<uint64_t>("--seed", value("--seed"));
    else if (a == "--cpu") o.cpu = true;
    else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "error: unknown flag %s\n", a.c_str());
      usage();
      return false;
    }
  }
  return true;
}

// A standard normal from four Philox uniforms (Irwin-Hall, rescaled): smooth enough for logits.
float normal(uint64_t seed, uint32_t table, uint32_t row, uint32_t col) {
  float s = 0.0f;
  for (uint32_t k = 0; k < 4; ++k) s += specdec::philox_uniform(seed, table, row, col, k);
  return (s - 2.0f) * 1.7320508f;
}

// Host memory for the CPU executor, device memory for the CUDA executor; same interface.
template <class Exec>
struct Memory {
  template <class T>
  struct Buffer {
    std::vector<T> v;
    explicit Buffer(size_t n) : v(n) {}
    T* data() { return v.data(); }
    size_t size() const { return v.size(); }
    std::vector<T> download() const { return v; }
    Status upload(std::vector<T> const& h) {
      v = h;
      return Status::Ok();
    }
  };
};
#if defined(__CUDACC__)
template <>
struct Memory<specdec::CudaExecutor> {
  template <class T>
  using Buffer = specdec::DeviceBuffer<T>;
};
#endif

// out[r, :] = table[rows[r], :] for r < count. The synthetic models' "forward".
void gather_rows(CpuExecutor, float const* table, int32_t const* rows, int count, int vocab,
                 float* out) {
  for (int r = 0; r < count; ++r) {
    std::memcpy(out + static_cast<size_t>(r) * vocab, table + static_cast<size_t>(rows[r]) * vocab,
                sizeof(float) * vocab);
  }
}
// The tree verify forward's KV write: node i of request b stores (token, position) at slot
// prefix_len[b] + i of the request's cache rows [max_seq, 2].
void write_tree_kv(CpuExecutor, int32_t const* tokens, int32_t const* positions,
                   int32_t const* prefix_len, int batch, int nodes, int max_seq, int32_t* cache) {
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < nodes; ++i) {
      int32_t* entry = cache + (static_cast<size_t>(b) * max_seq + prefix_len[b] + i) * 2;
      entry[0] = tokens[b * nodes + i];
      entry[1] = positions[b * nodes + i];
    }
  }
}

#if defined(__CUDACC__)
__global__ void gather_rows_kernel(float const* table, int32_t const* rows, int vocab, float* out) {
  float const* src = table + static_cast<size_t>(rows[blockIdx.x]) * vocab;
  float* dst = out + static_cast<size_t>(blockIdx.x) * vocab;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) dst[v] = src[v];
}
void gather_rows(specdec::CudaExecutor e, float const* table, int32_t const* rows, int count,
                 int vocab, float* out) {
  gather_rows_kernel<<<count, 256, 0, e.stream>>>(table, rows, vocab, out);
}
__global__ void write_tree_kv_kernel(int32_t const* tokens, int32_t const* positions,
                                     int32_t const* prefix_len, int nodes, int max_seq,
                                     int32_t* cache) {
  int const b = blockIdx.x, i = threadIdx.x;
  if (i >= nodes) return;
  int32_t* entry = cache + (static_cast<size_t>(b) * max_seq + prefix_len[b] + i) * 2;
  entry[0] = tokens[b * nodes + i];
  entry[1] = positions[b * nodes + i];
}
void write_tree_kv(specdec::CudaExecutor e, int32_t const* tokens, int32_t const* positions,
                   int32_t const* prefix_len, int batch, int nodes, int max_seq, int32_t* cache) {
  write_tree_kv_kernel<<<batch, nodes, 0, e.stream>>>(tokens, positions, prefix_len, nodes,
                                                      max_seq, cache);
}
#endif

void fail(Status const& s, char const* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

template <class Exec>
int run(Exec exec, Options const& o, char const* where) {
  using Mem = Memory<Exec>;
  int const B = o.batch, V = o.vocab, K = o.topk, S = o.steps, N = o.nodes;
  int const C = K + (S - 1) * K * K;
  int const P = S + 1;                                // deepest path: one node per draft step
  int const max_seq = 1 + o.tokens + N;               // prompt token + generated + one tree
  size_t const BN = static_cast<size_t>(B) * N;

  // The synthetic models: target and draft logit tables [V, V].
  std::vector<float> target(static_cast<size_t>(V) * V), draft(target.size());
  for (int t = 0; t < V; ++t) {
    for (int v = 0; v < V; ++v) {
      size_t const k = static_cast<size_t>(t) * V + v;
      target[k] = o.sharpness * normal(o.seed, 0, t, v);
      draft[k] = target[k] + o.noise * normal(o.seed, 1, t, v);
    }
  }
  typename Mem::template Buffer<float> target_d(target.size()), draft_d(draft.size());
  fail(target_d.upload(target), "upload");
  fail(draft_d.upload(draft), "upload");

  // Step buffers.
  typename Mem::template Buffer<float> draft_logits(static_cast<size_t>(B) * K * V);
  typename Mem::template Buffer<float> target_logits(BN * V);
  typename Mem::template Buffer<float> frontier_scores(static_cast<size_t>(B) * K), next_scores(B * K);
  typename Mem::template Buffer<int32_t> frontier_slots(B * K), next_slots(B * K), next_tokens(B * K),
      next_draft_tokens(B * K), next_branch(B * K), frontier_tokens(B * K);
  typename Mem::template Buffer<int32_t> cand_tokens(static_cast<size_t>(B) * C), cand_parent(B * C);
  typename Mem::template Buffer<float> cand_scores(static_cast<size_t>(B) * C);
  typename Mem::template Buffer<int32_t> tokens(BN), parents(BN), node_slot(BN), select_status(B);
  typename Mem::template Buffer<uint32_t> mask(BN * specdec::mask_words(N));
  typename Mem::template Buffer<int32_t> depth(BN), positions(BN), first_child(BN), next_sibling(BN),
      leaf_paths(BN * P), leaf_count(B), tree_status(B);
  typename Mem::template Buffer<int32_t> argmax(BN), path(static_cast<size_t>(B) * P),
      num_accepted(B), next_token(B), sample_status(B), commit_status(B), seq_len(B), prefix(B),
      roots(B);
  typename Mem::template Buffer<int32_t> cache(static_cast<size_t>(B) * max_seq * 2);
  typename Mem::template Buffer<float> temperature(B);
  typename Mem::template Buffer<uint64_t> seeds(B);
  typename Mem::template Buffer<uint32_t> step_counter(B);
  size_t const workspace_bytes = specdec::ops::draft_expand_workspace_bytes(B, V, K);
  // draft_expand's CUDA workspace starts zeroed (each launch leaves it zeroed).
  typename Mem::template Buffer<uint64_t> workspace((workspace_bytes + 7) / 8);
  // verify_sample's CUDA workspace (chunk partials of every target logit row).
  typename Mem::template Buffer<uint64_t> sample_workspace(
      (specdec::ops::verify_sample_workspace_bytes(B, N, V) + 7) / 8);
  fail(workspace.upload(std::vector<uint64_t>(workspace.size(), 0)), "upload");

  // Every request starts from its own prompt token; the root of the first tree.
  std::vector<int32_t> root_h(B), prefix_h(B, 0);
  std::vector<std::vector<int32_t>> text(B);
  for (int b = 0; b < B; ++b) {
    root_h[b] = static_cast<int32_t>((b * 7919 + 13) % V);
    text[b].push_back(root_h[b]);
  }
  fail(temperature.upload(std::vector<float>(B, o.temperature)), "upload");
  std::vector<uint64_t> seeds_h(B);
  for (int b = 0; b < B; ++b) seeds_h[b] = o.seed * 1000003u + b;
  fail(seeds.upload(seeds_h), "upload");

  std::vector<long> accepted_at_depth(P, 0);
  long verifies = 0, committed = 0, steps_run = 0;
  double seconds = 0.0;
  for (uint32_t step = 0;; ++step) {
    bool done = true;
    for (int b = 0; b < B; ++b) done = done && static_cast<int>(text[b].size()) > o.tokens;
    if (done) break;
    auto const t0 = std::chrono::steady_clock::now();
    fail(roots.upload(root_h), "upload");
    fail(prefix.upload(prefix_h), "upload");
    fail(step_counter.upload(std::vector<uint32_t>(B, step)), "upload");

    // 1. Propose: the draft expands `steps` times from the root, then the best N-1 form the tree.
    specdec::ops::DraftSelectBuffers select{
        B,          V,                     K,                  S,
        cand_tokens.data(), cand_scores.data(), cand_parent.data(), next_scores.data(),
        next_slots.data(),  frontier_tokens.data(), next_draft_tokens.data(), next_branch.data(),
        workspace.data(),   workspace_bytes};
    fail(frontier_scores.upload(std::vector<float>(B * K, 0.0f)), "upload");
    fail(frontier_slots.upload(std::vector<int32_t>(B * K, -1)), "upload");
    for (int s = 0; s < S; ++s) {
      if (s == 0) {
        gather_rows(exec, draft_d.data(), roots.data(), B, V, draft_logits.data());
      } else {
        gather_rows(exec, draft_d.data(), frontier_tokens.data(), B * K, V, draft_logits.data());
      }
      select.next_scores = next_scores.data();  // swapped with the frontier after each step
      select.next_slots = next_slots.data();
      specdec::ops::DraftExpandParams const e =
          select.expand(s, draft_logits.data(), frontier_scores.data(), frontier_slots.data(),
                        nullptr);
      fail(specdec::ops::draft_expand(exec, e), "draft_expand");
      std::swap(frontier_scores, next_scores);
      std::swap(frontier_slots, next_slots);
    }
    specdec::ops::DraftFinalizeParams const f = select.finalize(
        roots.data(), N, tokens.data(), parents.data(), node_slot.data(), select_status.data());
    fail(specdec::ops::draft_finalize(exec, f), "draft_finalize");

    // 2. Build: masks, positions, links.
    specdec::ops::TreeBuildParams tb;
    tb.tree = f.tree();
    tb.prefix_len = prefix.data();
    tb.out = specdec::TreeTopology{mask.data(),       depth.data(),      positions.data(),
                                   first_child.data(), next_sibling.data(), leaf_paths.data(),
                                   leaf_count.data(),  tree_status.data(), P};
    fail(specdec::ops::tree_build(exec, tb), "tree_build");

    // 3. Verify forward (the bigram target: each node's next-token logits) and its KV writes.
    gather_rows(exec, target_d.data(), tokens.data(), static_cast<int>(BN), V, target_logits.data());
    write_tree_kv(exec, tokens.data(), positions.data(), prefix.data(), B, N, max_seq, cache.data());

    // 4. Accept.
    specdec::Acceptance acc{path.data(), num_accepted.data(), next_token.data(), P};
    specdec::TreeLinks links{depth.data(), first_child.data(), next_sibling.data(),
                             tree_status.data()};
    if (o.temperature <= 0.0f) {
      specdec::ops::VerifyGreedyParams vg;
      vg.tree = f.tree();
      vg.links = links;
      vg.logits = target_logits.data();
      vg.vocab = V;
      vg.argmax_scratch = argmax.data();
      vg.out = acc;
      fail(specdec::ops::verify_greedy(exec, vg), "verify_greedy");
    } else {
      specdec::ops::VerifySampleParams vs;
      vs.tree = f.tree();
      vs.links = links;
      vs.logits = target_logits.data();
      vs.vocab = V;
      vs.config.temperature = temperature.data();
      vs.keys = specdec::RandomKeys{seeds.data(), step_counter.data(), nullptr};
      vs.out = acc;
      vs.status = sample_status.data();
      vs.workspace = sample_workspace.data();
      vs.workspace_bytes = sample_workspace.size() * sizeof(uint64_t);
      fail(specdec::ops::verify_sample(exec, vs), "verify_sample");
    }

    // 5. Commit: accepted nodes' KV to contiguous slots.
    specdec::ops::KvCommitParams kc;
    kc.cache = cache.data();
    kc.layer_stride_bytes = static_cast<int64_t>(B) * max_seq * 2 * sizeof(int32_t);
    kc.num_layers = 1;
    kc.width = 2;
    kc.elem_bytes = sizeof(int32_t);
    kc.batch = B;
    kc.max_seq = max_seq;
    kc.prefix_len = prefix.data();
    kc.acceptance = acc;
    kc.seq_len_out = seq_len.data();
    kc.status = commit_status.data();
    fail(specdec::ops::kv_commit(exec, kc), "kv_commit");

    // The host reads the step's result (the engine issue moves this onto the device).
    std::vector<int32_t> const n_acc = num_accepted.download(), nxt = next_token.download(),
                               path_h = path.download(), tok_h = tokens.download(),
                               tstat = tree_status.download(), sel = select_status.download();
    ++steps_run;
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fail(specdec::check_tree_status(tstat.data(), B), "tree");
    for (int b = 0; b < B; ++b) {
      if (sel[b] != 0) fail(Status::Internal("draft_finalize status " + std::to_string(sel[b])), "draft");
      if (static_cast<int>(text[b].size()) > o.tokens) continue;  // finished; still decoded in batch
      ++verifies;
      committed += n_acc[b] + 1;
      for (int d = 1; d <= n_acc[b]; ++d) {
        ++accepted_at_depth[d];
        text[b].push_back(tok_h[static_cast<size_t>(b) * N + path_h[static_cast<size_t>(b) * P + d]]);
      }
      text[b].push_back(nxt[b]);
      prefix_h[b] += n_acc[b] + 1;
      root_h[b] = nxt[b];
    }
  }

  // Checks: the committed KV spells each request's text (minus the uncached last root), and
  // greedy speculation equals plain greedy decoding.
  std::vector<int32_t> const cache_h = cache.download();
  bool kv_ok = true, lossless = true;
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < o.tokens && k + 1 < static_cast<int>(text[b].size()); ++k) {
      int32_t const* entry = &cache_h[(static_cast<size_t>(b) * max_seq + k) * 2];
      kv_ok = kv_ok && entry[0] == text[b][k] && entry[1] == k;
    }
    if (o.temperature <= 0.0f) {
      int32_t cur = text[b][0];
      for (int k = 1; k <= o.tokens; ++k) {
        float const* row = &target[static_cast<size_t>(cur) * V];
        cur = static_cast<int32_t>(std::max_element(row, row + V) - row);
        lossless = lossless && text[b][k] == cur;
      }
    }
  }

  std::printf("specdec-demo on %s: batch %d, vocab %d, tree topk %d steps %d nodes %d, "
              "temperature %.2f, draft noise %.2f\n",
              where, B, V, K, S, N, o.temperature, o.noise);
  std::printf("verifies %ld, tokens committed %ld, accept length %.3f (tokens per request per verify)\n",
              verifies, committed, static_cast<double>(committed) / verifies);
  std::printf("acceptance per draft position (fraction of verifies accepting depth d):\n");
  for (int d = 1; d < P; ++d) {
    std::printf("  depth %d: %.3f\n", d, static_cast<double>(accepted_at_depth[d]) / verifies);
  }
  std::printf("step time (propose+build+verify+commit, host round trip included): %.1f us\n",
              1e6 * seconds / std::max<long>(1, steps_run));
  std::printf("kv cache after commit matches the committed text: %s\n", kv_ok ? "yes" : "NO");
  if (o.temperature <= 0.0f) {
    std::printf("greedy output equals plain greedy decoding of the target: %s\n",
                lossless ? "yes" : "NO");
  }
  return kv_ok && lossless ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  // The synthetic draft stands in for an EAGLE-3 draft: the tree flags are checked by the same
  // rules as the reference binary's (nothing adjusted; a bad combination is an error).
  specdec::SpecConfig config;
  config.algorithm = "EAGLE3";
  config.num_steps = o.steps;
  config.eagle_topk = o.topk;
  config.num_draft_tokens = o.nodes;
  config.layers = {1, 29, 57};
  Status const valid = specdec::validate(config);
  if (!valid.ok()) {
    std::fprintf(stderr, "error: %s\n", valid.message().c_str());
    return 2;
  }
  if (o.batch < 1 || o.vocab < o.topk || o.tokens < 1) {
    std::fprintf(stderr, "error: need --batch >= 1, --vocab >= --speculative-eagle-topk, --tokens >= 1\n");
    return 2;
  }
#if defined(__CUDACC__)
  if (!o.cpu && specdec::cuda_device_available()) return run(specdec::CudaExecutor{}, o, "CUDA");
#endif
  return run(CpuExecutor{}, o, "CPU");
}
