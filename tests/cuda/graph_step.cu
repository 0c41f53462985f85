// One speculative step -- propose (draft_expand x steps, draft_finalize) -> tree_build ->
// verify_sample -> kv_commit -- captured into a CUDA graph, replayed with new inputs (logits,
// seeds, steps, prefix lengths, temperatures) written into the same device buffers, and compared
// with the eager run on those inputs and with the CPU references. Proves every op is capturable:
// no host synchronisation, and per-step scalars are read from device memory at replay.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/draft_select/draft_select.hpp"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "specdec/ops/verify_sample/verify_sample.hpp"
#include "support/testing.hpp"

namespace {

using namespace specdec;

constexpr int kB = 6, kV = 1000, kK = 4, kS = 3, kN = 10, kP = kS + 1;
constexpr int kC = kK + (kS - 1) * kK * kK;
constexpr int kMaxSeq = 64, kWidth = 36;  // a KV entry of 36 bf16-sized values

// The inputs of one step, on the host.
struct StepInputs {
  std::vector<float> draft_logits;   // [S][B, K, V] (step 0 uses row 0 of each request)
  std::vector<float> target_logits;  // [B, N, V]
  std::vector<int32_t> roots, prefix;
  std::vector<uint64_t> seeds;
  std::vector<uint32_t> steps;
  std::vector<float> temperature;
  std::vector<uint16_t> cache;       // [B, max_seq, W]
};

StepInputs make_inputs(uint64_t seed) {
  testing::Rng rng(seed);
  StepInputs in;
  // Draft and target share a preference over the vocabulary (as a trained draft shares its
  // target's), each row adding its own noise: drafts are accepted often, but not always.
  std::vector<float> const shared = testing::random_logits(rng, 1, kV, 3.0f);
  auto near_shared = [&](int64_t rows, float noise) {
    std::vector<float> out = testing::random_logits(rng, rows, kV, noise);
    for (size_t i = 0; i < out.size(); ++i) out[i] += shared[i % kV];
    return out;
  };
  in.draft_logits = near_shared(static_cast<int64_t>(kS) * kB * kK, 1.0f);
  in.target_logits = near_shared(static_cast<int64_t>(kB) * kN, 1.0f);
  std::uniform_int_distribution<int> token(0, kV - 1), prefix(0, kMaxSeq - kN);
  std::uniform_int_distribution<int> bits(0, 65535);
  for (int b = 0; b < kB; ++b) {
    in.roots.push_back(token(rng));
    in.prefix.push_back(prefix(rng));
    in.seeds.push_back(rng());
    in.steps.push_back(static_cast<uint32_t>(rng() % 1000));
    in.temperature.push_back(b % 3 == 0 ? 0.0f : 0.6f + 0.2f * static_cast<float>(b % 4));
  }
  in.cache.resize(static_cast<size_t>(kB) * kMaxSeq * kWidth);
  for (auto& x : in.cache) x = static_cast<uint16_t>(bits(rng));
  return in;
}

// All buffers of one step in executor memory: std::vector on the host, DeviceBuffer on the GPU.
template <template <class> class Buf>
struct StepBuffers {
  Buf<float> draft_logits{static_cast<size_t>(kS) * kB * kK * kV};
  Buf<float> target_logits{static_cast<size_t>(kB) * kN * kV};
  Buf<int32_t> roots{kB}, prefix{kB};
  Buf<uint64_t> seeds{kB};
  Buf<uint32_t> steps{kB};
  Buf<float> temperature{kB};
  Buf<uint16_t> cache_initial{static_cast<size_t>(kB) * kMaxSeq * kWidth};
  Buf<uint16_t> cache{static_cast<size_t>(kB) * kMaxSeq * kWidth};
  // frontier ping-pong: [2][B, K]
  Buf<float> scores{2 * kB * kK};
  Buf<int32_t> slots{2 * kB * kK}, next_tokens{kB * kK}, next_draft{kB * kK}, next_branch{kB * kK};
  Buf<int32_t> cand_tokens{kB * kC}, cand_parent{kB * kC};
  Buf<float> cand_scores{kB * kC};
  Buf<int32_t> tokens{kB * kN}, parents{kB * kN}, node_slot{kB * kN}, select_status{kB};
  Buf<uint32_t> mask{kB * kN};
  Buf<int32_t> depth{kB * kN}, positions{kB * kN}, first_child{kB * kN}, next_sibling{kB * kN},
      leaf_paths{kB * kN * kP}, leaf_count{kB}, tree_status{kB};
  Buf<int32_t> path{kB * kP}, num_accepted{kB}, next_token{kB}, sample_status{kB},
      commit_status{kB}, seq_len{kB};
  Buf<uint64_t> workspace{(ops::draft_expand_workspace_bytes(kB, kV, kK) + 7) / 8 + 1};
  Buf<uint64_t> sample_workspace{(ops::verify_sample_workspace_bytes(kB, kN, kV) + 7) / 8};
};

template <class T>
struct HostBuf : std::vector<T> {
  explicit HostBuf(size_t n) : std::vector<T>(n) {}
};

// Enqueues one whole step. The frontier starts as (score 0, slot -1) written by the step itself.
template <class Exec, class Buffers>
Status enqueue_step(Exec exec, Buffers& m, Status (*reset)(Exec, Buffers&)) {
  SPECDEC_RETURN_IF_ERROR(reset(exec, m));
  float* scores[2] = {m.scores.data(), m.scores.data() + kB * kK};
  int32_t* slots[2] = {m.slots.data(), m.slots.data() + kB * kK};
  for (int s = 0; s < kS; ++s) {
    ops::DraftExpandParams e;
    e.logits = m.draft_logits.data() + static_cast<size_t>(s) * kB * kK * kV;
    e.frontier_scores = scores[s % 2];
    e.frontier_slots = slots[s % 2];
    e.batch = kB;
    e.vocab = kV;
    e.topk = kK;
    e.steps = kS;
    e.step = s;
    e.cand_tokens = m.cand_tokens.data();
    e.cand_scores = m.cand_scores.data();
    e.cand_parent = m.cand_parent.data();
    e.next_scores = scores[(s + 1) % 2];
    e.next_slots = slots[(s + 1) % 2];
    e.next_tokens = m.next_tokens.data();
    e.next_draft_tokens = m.next_draft.data();
    e.next_branch = m.next_branch.data();
    e.workspace = m.workspace.data();
    e.workspace_bytes = m.workspace.size() * sizeof(uint64_t);
    SPECDEC_RETURN_IF_ERROR(ops::draft_expand(exec, e));
  }
  ops::DraftFinalizeParams f;
  f.cand_tokens = m.cand_tokens.data();
  f.cand_scores = m.cand_scores.data();
  f.cand_parent = m.cand_parent.data();
  f.root_tokens = m.roots.data();
  f.batch = kB;
  f.topk = kK;
  f.steps = kS;
  f.nodes = kN;
  f.tokens = m.tokens.data();
  f.parents = m.parents.data();
  f.node_slot = m.node_slot.data();
  f.status = m.select_status.data();
  SPECDEC_RETURN_IF_ERROR(ops::draft_finalize(exec, f));

  ops::TreeBuildParams t;
  t.tree = f.tree();
  t.prefix_len = m.prefix.data();
  t.out = TreeTopology{m.mask.data(),         m.depth.data(),      m.positions.data(),
                       m.first_child.data(),  m.next_sibling.data(), m.leaf_paths.data(),
                       m.leaf_count.data(),   m.tree_status.data(), kP};
  SPECDEC_RETURN_IF_ERROR(ops::tree_build(exec, t));

  Acceptance const acc{m.path.data(), m.num_accepted.data(), m.next_token.data(), kP};
  ops::VerifySampleParams v;
  v.tree = f.tree();
  v.links = TreeLinks{m.depth.data(), m.first_child.data(), m.next_sibling.data(),
                      m.tree_status.data()};
  v.logits = m.target_logits.data();
  v.vocab = kV;
  v.config.temperature = m.temperature.data();
  v.keys = RandomKeys{m.seeds.data(), m.steps.data(), nullptr};
  v.out = acc;
  v.status = m.sample_status.data();
  v.workspace = m.sample_workspace.data();
  v.workspace_bytes = m.sample_workspace.size() * sizeof(uint64_t);
  SPECDEC_RETURN_IF_ERROR(ops::verify_sample(exec, v));

  ops::KvCommitParams k;
  k.cache = m.cache.data();
  k.layer_stride_bytes = static_cast<int64_t>(kB) * kMaxSeq * kWidth * 2;
  k.num_layers = 1;
  k.width = kWidth;
  k.elem_bytes = 2;
  k.batch = kB;
  k.max_seq = kMaxSeq;
  k.prefix_len = m.prefix.data();
  k.acceptance = acc;
  k.seq_len_out = m.seq_len.data();
  k.status = m.commit_status.data();
  return ops::kv_commit(exec, k);
}

using DeviceStep = StepBuffers<DeviceBuffer>;
using HostStep = StepBuffers<HostBuf>;

// The frontier of step 0 (score 0, slot -1) and a pristine cache, written inside the step so a
// replayed graph starts from the same state.
Status reset_device(CudaExecutor e, DeviceStep& m) {
  SPECDEC_CUDA_TRY(cudaMemsetAsync(m.scores.data(), 0, sizeof(float) * kB * kK, e.stream));
  SPECDEC_CUDA_TRY(cudaMemsetAsync(m.slots.data(), 0xff, sizeof(int32_t) * kB * kK, e.stream));
  return cuda_status(cudaMemcpyAsync(m.cache.data(), m.cache_initial.data(),
                                     m.cache.size() * sizeof(uint16_t), cudaMemcpyDeviceToDevice,
                                     e.stream),
                     "cache reset");
}
Status reset_host(CpuExecutor, HostStep& m) {
  std::fill(m.scores.begin(), m.scores.begin() + kB * kK, 0.0f);
  std::fill(m.slots.begin(), m.slots.begin() + kB * kK, -1);
  m.cache = m.cache_initial;
  return Status::Ok();
}

void upload(DeviceStep& d, StepInputs const& in) {
  REQUIRE(d.draft_logits.upload(in.draft_logits).ok());
  REQUIRE(d.target_logits.upload(in.target_logits).ok());
  REQUIRE(d.roots.upload(in.roots).ok());
  REQUIRE(d.prefix.upload(in.prefix).ok());
  REQUIRE(d.seeds.upload(in.seeds).ok());
  REQUIRE(d.steps.upload(in.steps).ok());
  REQUIRE(d.temperature.upload(in.temperature).ok());
  REQUIRE(d.cache_initial.upload(in.cache).ok());
}

void assign(HostStep& h, StepInputs const& in) {
  std::copy(in.draft_logits.begin(), in.draft_logits.end(), h.draft_logits.begin());
  std::copy(in.target_logits.begin(), in.target_logits.end(), h.target_logits.begin());
  std::copy(in.roots.begin(), in.roots.end(), h.roots.begin());
  std::copy(in.prefix.begin(), in.prefix.end(), h.prefix.begin());
  std::copy(in.seeds.begin(), in.seeds.end(), h.seeds.begin());
  std::copy(in.steps.begin(), in.steps.end(), h.steps.begin());
  std::copy(in.temperature.begin(), in.temperature.end(), h.temperature.begin());
  std::copy(in.cache.begin(), in.cache.end(), h.cache_initial.begin());
}

// What a step produced: the tree, the acceptance and the committed cache.
struct StepResult {
  std::vector<int32_t> tokens, parents, path, num_accepted, next_token, seq_len;
  std::vector<uint16_t> cache;
  bool operator==(StepResult const&) const = default;
};

StepResult result_of(DeviceStep const& d) {
  return {d.tokens.download(),       d.parents.download(),    d.path.download(),
          d.num_accepted.download(), d.next_token.download(), d.seq_len.download(),
          d.cache.download()};
}
StepResult result_of(HostStep const& h) {
  return {h.tokens, h.parents, h.path, h.num_accepted, h.next_token, h.seq_len, h.cache};
}

}  // namespace

TEST_CASE("a captured speculative step replays with new inputs exactly as the eager step") {
  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  CudaExecutor const exec{stream};
  DeviceStep dev;
  REQUIRE(dev.workspace.fill_bytes(0).ok());  // draft_expand's workspace starts zeroed

  // Capture on inputs A.
  upload(dev, make_inputs(11));
  cudaGraph_t graph;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  Status const captured = enqueue_step(exec, dev, reset_device);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE_MESSAGE(captured.ok(), captured.to_string());
  cudaGraphExec_t graph_exec;
  REQUIRE(cudaGraphInstantiate(&graph_exec, graph, 0) == cudaSuccess);

  for (uint64_t seed : {23u, 37u, 41u}) {
    CAPTURE(seed);
    StepInputs const in = make_inputs(seed);
    upload(dev, in);

    REQUIRE(cudaGraphLaunch(graph_exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    StepResult const replayed = result_of(dev);

    REQUIRE(enqueue_step(exec, dev, reset_device).ok());
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    StepResult const eager = result_of(dev);
    CHECK(replayed == eager);

    HostStep host;
    assign(host, in);
    Status const cpu = enqueue_step(CpuExecutor{}, host, reset_host);
    REQUIRE_MESSAGE(cpu.ok(), cpu.to_string());
    StepResult const reference = result_of(host);
    CHECK(eager.tokens == reference.tokens);
    CHECK(eager.parents == reference.parents);
    // Sampled tokens may differ from the reference only where a uniform sits on a CDF boundary
    // (float rounding); with these sizes that is vanishingly rare, so the whole step must agree.
    CHECK(eager == reference);
    // The step did something: some request accepted at least one draft, and seeds matter.
    int accepted = 0;
    for (int n : eager.num_accepted) accepted += n;
    CHECK(accepted > 0);
  }
  cudaGraphExecDestroy(graph_exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
