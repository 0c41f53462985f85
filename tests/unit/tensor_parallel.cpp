// Tensor parallelism on the CPU communicator: the collectives (results, bitwise agreement between
// ranks, a mismatched call, a failing rank, a rank that never arrives), the Kimi model's shards
// (what each rank holds, the sizes that do not split), and the proof of the sharded forward: at
// TP = 1, 2, 4 (expert- and tensor-parallel experts, bf16 and INT4) the logits and EAGLE features
// match the unsharded model within float rounding and greedy generation gives the same tokens,
// with and without speculation (n-gram, EAGLE-3, EAGLE-1/2); sampled generation is the same on
// every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "specdec/dist/communicator.hpp"
#include "specdec/dist/shard.hpp"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "support/engine_cases.hpp"
#include "support/kimi_model.hpp"
#include "support/testing.hpp"

namespace {

using namespace specdec;
using namespace specdec::testing;
using dist::CpuCommunicator;
using dist::MoeSplit;
using dist::TpShard;
using model::kimi::KimiCpuModel;

TEST_CASE("CpuCommunicator: all_reduce_sum, all_gather, broadcast agree on every rank") {
  for (int P : {1, 2, 3, 4}) {
    CAPTURE(P);
    int64_t const n = 1000;
    std::vector<std::vector<float>> reduced(P), gathered(P);
    std::vector<std::vector<std::byte>> bcast(P);
    Status const s = dist::run_ranks(P, [&](int rank, CpuCommunicator& c) -> Status {
      if (c.rank() != rank || c.size() != P) return Status::Internal("rank / size");
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = 0.1f * float(rank + 1) + 1e-3f * float(i);
      std::vector<float> in = x;
      SPECDEC_RETURN_IF_ERROR(c.all_reduce_sum(x.data(), n));
      reduced[rank] = x;
      gathered[rank].resize(size_t(P * n));
      SPECDEC_RETURN_IF_ERROR(c.all_gather(in.data(), n, gathered[rank].data()));
      std::vector<std::byte> b(7, std::byte(rank));
      SPECDEC_RETURN_IF_ERROR(c.broadcast(b.data(), 7, P - 1));
      bcast[rank] = b;
      return c.barrier();
    });
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    for (int64_t i = 0; i < n; ++i) {
      float want = 0.0f;  // rank order 0, 1, ..., P-1
      for (int q = 0; q < P; ++q) want += 0.1f * float(q + 1) + 1e-3f * float(i);
      CHECK(reduced[0][i] == want);
    }
    for (int r = 0; r < P; ++r) {
      CHECK(reduced[r] == reduced[0]);  // bit for bit
      for (int q = 0; q < P; ++q) {
        CHECK(gathered[r][size_t(q * n + 5)] == 0.1f * float(q + 1) + 1e-3f * 5.0f);
      }
      CHECK(bcast[r] == std::vector<std::byte>(7, std::byte(P - 1)));
    }
  }
}

TEST_CASE("run_ranks: a failing rank stops every rank and its own error is returned") {
  std::atomic<int> aborted{0};
  Status const s = dist::run_ranks(3, [&](int rank, CpuCommunicator& c) -> Status {
    std::vector<float> x(4, 1.0f);
    SPECDEC_RETURN_IF_ERROR(c.all_reduce_sum(x.data(), 4));
    if (rank == 1) return Status::MalformedInput("shard 1 is corrupt");
    Status const again = c.all_reduce_sum(x.data(), 4);  // never completes: rank 1 is gone
    if (!again.ok() &&
        again.message().find("aborted: rank 1 failed: shard 1 is corrupt") != std::string::npos) {
      ++aborted;
    }
    return again;
  });
  CHECK(!s.ok());
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(s.message() == "rank 1 of 3: shard 1 is corrupt");
  CHECK(aborted == 2);

  Status const thrown = dist::run_ranks(2, [](int rank, CpuCommunicator& c) -> Status {
    if (rank == 0) throw std::runtime_error("out of memory");
    return c.barrier();
  });
  CHECK(thrown.message() == "rank 0 of 2: exception: out of memory");
}

TEST_CASE("CpuCommunicator: collectives that do not match fail on every rank, naming both") {
  Status const s = dist::run_ranks(2, [](int rank, CpuCommunicator& c) -> Status {
    std::vector<float> x(8, 1.0f), out(16);
    if (rank == 0) return c.all_reduce_sum(x.data(), 8);
    return c.all_gather(x.data(), 8, out.data());
  });
  REQUIRE(!s.ok());
  CHECK_MESSAGE(s.message().find("collectives do not match") != std::string::npos, s.message());
  CHECK(s.message().find("all_reduce_sum(8") != std::string::npos);
  CHECK(s.message().find("all_gather(8") != std::string::npos);
}

TEST_CASE("CpuCommunicator: a rank that never arrives times out instead of hanging") {
  auto const start = std::chrono::steady_clock::now();
  Status const s = dist::run_ranks(
      2,
      [](int rank, CpuCommunicator& c) -> Status {
        if (rank == 1) return Status::Ok();  // leaves without its collective
        return c.barrier();
      },
      std::chrono::milliseconds(200));
  REQUIRE(!s.ok());
  CHECK_MESSAGE(s.message().find("timed out") != std::string::npos, s.message());
  CHECK(s.message().find("1 of 2 ranks arrived") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  CHECK(!dist::run_ranks(0, [](int, CpuCommunicator&) { return Status::Ok(); }).ok());
}

// Loads rank `rank` of P of the tiny checkpoint.
Status load_shard(TinyKimi const& m, TpShard shard, CpuCommunicator* c, KimiCpuModel* out) {
  return model::kimi::load_kimi_cpu_model(m.weights, m.config, shard, c, out);
}

TEST_CASE("Kimi CPU shards: each rank holds its heads, widths, experts and vocabulary slice") {
  TempDir dir;
  TinyKimi m;
  load_tiny_kimi(dir.path, /*int4=*/false, 11, &m);
  io::DeepseekV3Config const& c = m.config;
  KimiCpuModel whole;
  REQUIRE(model::kimi::load_kimi_cpu_model(m.weights, c, &whole).ok());
  for (MoeSplit split : {MoeSplit::kExpertParallel, MoeSplit::kTensorParallel}) {
    CAPTURE(dist::moe_split_name(split));
    int const P = 2;
    std::vector<KimiCpuModel> shards(P);
    Status const s = dist::run_ranks(P, [&](int rank, CpuCommunicator& comm) {
      return load_shard(m, {rank, P, split}, &comm, &shards[rank]);
    });
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    int64_t sum = 0;
    for (int r = 0; r < P; ++r) {
      KimiCpuModel const& k = shards[r];
      CHECK(k.heads == c.num_attention_heads / P);
      CHECK(k.lm_head.rows() == c.vocab_size / P);
      CHECK(k.vocab.begin == r * c.vocab_size / P);
      // the second rank's lm_head rows are the whole lm_head's rows of its slice
      CHECK(k.lm_head.row(3) == whole.lm_head.row(k.vocab.begin + 3));
      auto const& l = k.layers[1];
      CHECK(l.o_proj.cols() == whole.layers[1].o_proj.cols() / P);
      CHECK(l.o_proj.col(0) == whole.layers[1].o_proj.col(r * l.o_proj.cols()));
      if (split == MoeSplit::kExpertParallel) {
        CHECK(int64_t(l.experts.size()) == c.n_routed_experts / P);
        CHECK(l.experts[0].down_proj == whole.layers[1].experts[size_t(k.experts.begin)].down_proj);
      } else {
        CHECK(int64_t(l.experts.size()) == c.n_routed_experts);
        CHECK(l.experts[0].gate_proj.rows() == c.moe_intermediate_size / P);
      }
      CHECK(k.layers[0].mlp.gate_proj.rows() == c.intermediate_size / P);
      sum += k.num_floats();
    }
    // Replicated: embedding, norms, q_a / kv_a projections, routers. Everything else is split, so
    // the ranks together hold less than P whole models and more than one.
    CHECK(sum > whole.num_floats());
    CHECK(sum < P * whole.num_floats() * 3 / 4);
  }
}

TEST_CASE("Kimi CPU shards: sizes that do not split are refused, naming the size") {
  TempDir dir;
  TinyKimi m;
  load_tiny_kimi(dir.path, /*int4=*/true, 11, &m);
  auto shard_error = [&](TpShard shard) {
    std::vector<std::string> errors(static_cast<size_t>(shard.size));
    (void)dist::run_ranks(shard.size, [&](int rank, CpuCommunicator& comm) {
      KimiCpuModel k;
      TpShard mine = shard;
      mine.rank = rank;
      Status const s = load_shard(m, mine, &comm, &k);
      errors[size_t(rank)] = s.message();
      return s;
    });
    return errors[0];
  };
  CHECK_MESSAGE(
      shard_error({0, 3, MoeSplit::kExpertParallel})
              .find("num_attention_heads 4 does not split over 3 tensor-parallel ranks") !=
          std::string::npos,
      shard_error({0, 3, MoeSplit::kExpertParallel}));
  // tiny: INT4 experts of width 32 in groups of 32; half a group per rank cannot be dequantised
  std::string const e = shard_error({0, 2, MoeSplit::kTensorParallel});
  CHECK_MESSAGE(e.find("moe_intermediate_size (tensor-parallel INT4 experts split on quantization "
                       "groups) 32 over 2 ranks gives 16 per rank, not a multiple of 32") !=
                    std::string::npos,
                e);
  KimiCpuModel k;
  Status const no_comm = load_shard(m, {0, 2}, nullptr, &k);
  CHECK(no_comm.message().find("needs the rank's communicator") != std::string::npos);
  Status const bad_rank = load_shard(m, {2, 2}, nullptr, &k);
  CHECK(bad_rank.message().find("rank 2 of size 2") != std::string::npos);
}

// Prefill of two prompts then one decode token each, at TP size P: rank 0's logits and aux
// (layers 0..2) of both calls, concatenated; every rank's must be the same bit for bit.
std::vector<float> tp_forward(TinyKimi const& m, int P, MoeSplit split) {
  std::vector<std::vector<float>> out(static_cast<size_t>(P));
  Status const s = dist::run_ranks(P, [&](int rank, CpuCommunicator& comm) -> Status {
    KimiCpuModel k;
    SPECDEC_RETURN_IF_ERROR(load_shard(m, {rank, P, split}, &comm, &k));
    model::kimi::MlaCache cache;
    SPECDEC_RETURN_IF_ERROR(model::kimi::MlaCache::create_for(k.config, 16, 8, 4, &cache));
    std::vector<model::kimi::RequestId> const ids = {3, 9};
    for (auto id : ids) SPECDEC_RETURN_IF_ERROR(cache.add_request(id));
    std::vector<int32_t> const counts = {5, 9};
    std::vector<int32_t> tokens;
    for (int i = 0; i < 14; ++i) tokens.push_back((37 * i + 11) % int(k.config.vocab_size));
    std::vector<int> const aux_layers = {0, 1, 2};
    std::vector<float> logits, aux, all;
    SPECDEC_RETURN_IF_ERROR(model::kimi::kimi_prefill(CpuExecutor{}, k, &cache, ids, counts, tokens,
                                                      aux_layers, &logits, &aux));
    all = logits;
    all.insert(all.end(), aux.begin(), aux.end());
    std::vector<int32_t> const next = {7, 300};
    SPECDEC_RETURN_IF_ERROR(
        model::kimi::kimi_decode(CpuExecutor{}, k, &cache, ids, next, aux_layers, &logits, &aux));
    all.insert(all.end(), logits.begin(), logits.end());
    all.insert(all.end(), aux.begin(), aux.end());
    out[size_t(rank)] = std::move(all);
    return Status::Ok();
  });
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  for (int r = 1; r < P; ++r) CHECK(out[size_t(r)] == out[0]);
  return out[0];
}

TEST_CASE(
    "Kimi CPU tensor parallel: LogitsMode::kArgmax gives the whole vocabulary's argmax "
    "from each rank's slice") {
  TempDir dir;
  TinyKimi m;
  load_tiny_kimi(dir.path, /*int4=*/false, 21, &m);
  int64_t const V = m.config.vocab_size;
  for (int P : {1, 2, 4}) {
    CAPTURE(P);
    std::vector<std::vector<int32_t>> argmax(static_cast<size_t>(P));
    std::vector<float> full;
    Status const s = dist::run_ranks(P, [&](int rank, CpuCommunicator& comm) -> Status {
      KimiCpuModel k;
      SPECDEC_RETURN_IF_ERROR(load_shard(m, {rank, P}, &comm, &k));
      std::vector<int32_t> const tokens = {5, 77, 300, 12, 12, 9, 450};
      int32_t const count = 7;
      model::kimi::RequestId const id = 0;
      for (auto mode : {model::kimi::LogitsMode::kFull, model::kimi::LogitsMode::kArgmax}) {
        model::kimi::MlaCache cache;
        SPECDEC_RETURN_IF_ERROR(model::kimi::MlaCache::create_for(k.config, 16, 2, 2, &cache));
        SPECDEC_RETURN_IF_ERROR(cache.add_request(id));
        std::vector<float> logits;
        std::vector<int32_t> am;
        SPECDEC_RETURN_IF_ERROR(model::kimi::kimi_prefill(CpuExecutor{}, k, &cache, {&id, 1},
                                                          {&count, 1}, tokens, {}, &logits, nullptr,
                                                          mode, &am));
        if (mode == model::kimi::LogitsMode::kFull && rank == 0) full = logits;
        if (mode == model::kimi::LogitsMode::kArgmax) {
          if (int64_t(logits.size()) != 7 * V / P) return Status::Internal("not the slice");
          argmax[static_cast<size_t>(rank)] = am;
        }
      }
      return Status::Ok();
    });
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(full.size() == size_t(7 * V));
    for (int64_t t = 0; t < 7; ++t) {
      auto const row = full.begin() + t * V;
      int32_t const want = int32_t(std::max_element(row, row + V) - row);  // first of ties
      for (int r = 0; r < P; ++r) CHECK(argmax[size_t(r)][size_t(t)] == want);
    }
  }
}

TEST_CASE("Kimi CPU tensor parallel: logits and EAGLE features at TP 2 and 4 match TP 1") {
  for (bool int4 : {false, true}) {
    TempDir dir;
    TinyKimi m;
    load_tiny_kimi(dir.path, int4, 21, &m);
    std::vector<float> const ref = tp_forward(m, 1, MoeSplit::kExpertParallel);
    for (int P : {2, 4}) {
      for (MoeSplit split : {MoeSplit::kExpertParallel, MoeSplit::kTensorParallel}) {
        if (int4 && split == MoeSplit::kTensorParallel) continue;  // refused above
        CAPTURE(int4);
        CAPTURE(P);
        CAPTURE(dist::moe_split_name(split));
        std::vector<float> const got = tp_forward(m, P, split);
        REQUIRE(got.size() == ref.size());
        MaxDiff d;
        d.add(got.data(), ref.data(), int64_t(ref.size()));
        CHECK_MESSAGE(d.rel() < 1e-5, "max rel diff " << d.rel());
        CHECK(d.abs > 0.0);  // the sums really were split (another order of additions)
      }
    }
  }
}

// `requests` through SpecEngine<P> at TP size `tp` (the draft, if any, loaded by every rank from
// draft_dir): rank 0's outputs; every rank's must be the same.
template <class Policy>
std::vector<std::vector<int32_t>> tp_generate(
    TinyKimi const& m, int tp, MoeSplit split, std::filesystem::path const& draft_dir,
    std::vector<engine::GenerationRequest> const& requests, engine::SpecMetrics* metrics) {
  std::vector<std::vector<std::vector<int32_t>>> out(static_cast<size_t>(tp));
  std::vector<engine::SpecMetrics> totals(static_cast<size_t>(tp));
  Status const s = dist::run_ranks(tp, [&](int rank, CpuCommunicator& comm) -> Status {
    constexpr bool kEagle = Policy::kKind == DraftKind::kEagle;
    KimiCpuModel k;
    TpShard shard{rank, tp, split};
    shard.replicate_lm_head = kEagle;  // EAGLE-1/2 reads the target's whole lm_head
    SPECDEC_RETURN_IF_ERROR(load_shard(m, shard, &comm, &k));
    model::eagle::DraftCpuModel draft;
    if constexpr (engine::SpecEngine<Policy, CpuExecutor>::kDraftsWithModel) {
      SPECDEC_RETURN_IF_ERROR(model::eagle::load_draft_cpu_model(
          draft_dir.string(), k.config, model::eagle::target_tensors_of(k), Policy::kKind,
          Policy::Layers::ids(), "the test policy", &draft));
    }
    engine::SpecEngine<Policy, CpuExecutor> e;
    SPECDEC_RETURN_IF_ERROR((engine::SpecEngine<Policy, CpuExecutor>::create(
        &k, engine::SpecEngine<Policy, CpuExecutor>::kDraftsWithModel ? &draft : nullptr, {}, &e)));
    std::vector<engine::GenerationResult> results;
    SPECDEC_RETURN_IF_ERROR(e.generate(requests, &results, &totals[size_t(rank)]));
    for (auto const& r : results) out[size_t(rank)].push_back(r.output_ids);
    return Status::Ok();
  });
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  for (int r = 1; r < tp; ++r) CHECK(out[size_t(r)] == out[0]);
  if (metrics) *metrics = totals[0];
  return out[0];
}

template <class Policy>
void check_tp_generation(TinyKimi const& m, std::filesystem::path const& draft_dir) {
  CAPTURE(describe<Policy>());
  auto const greedy = mixed_requests(int(m.config.vocab_size), /*first_stops_at_eos=*/false);
  auto const want = tp_generate<Plain>(m, 1, MoeSplit::kExpertParallel, {}, greedy, nullptr);
  for (int tp : {2, 4}) {
    for (MoeSplit split : {MoeSplit::kExpertParallel, MoeSplit::kTensorParallel}) {
      CAPTURE(tp);
      CAPTURE(dist::moe_split_name(split));
      engine::SpecMetrics metrics;
      CHECK(tp_generate<Policy>(m, tp, split, draft_dir, greedy, &metrics) == want);
      if constexpr (Policy::kKind != DraftKind::kNone) CHECK(metrics.proposed() > 0);
    }
  }
  // Sampled: every rank draws the same Philox uniforms from the same logits (checked inside);
  // request 0 stays greedy (a mixed batch: the whole logits, not the argmax alone).
  auto sampled = greedy;
  for (size_t i = 1; i < sampled.size(); ++i) {
    sampled[i].temperature = 0.8f;
    sampled[i].top_k = 20;
    sampled[i].seed = 100 + i;
  }
  (void)tp_generate<Policy>(m, 2, MoeSplit::kExpertParallel, draft_dir, sampled, nullptr);
}

TEST_CASE(
    "Kimi CPU tensor parallel: greedy tokens at TP 2 and 4 equal TP 1, with and without "
    "speculation") {
  TempDir dir, eagle3_dir, eagle_dir;
  TinyKimi m;
  load_tiny_kimi(dir.path, /*int4=*/false, 31, &m);
  write_tiny_draft(eagle3_dir.path, m.config, DraftKind::kEagle3);
  write_tiny_draft(eagle_dir.path, m.config, DraftKind::kEagle);
  check_tp_generation<Plain>(m, {});
  check_tp_generation<NG<Chain<3>>>(m, {});
  check_tp_generation<E3<TreeShape<2, 3, 6>>>(m, eagle3_dir.path);
  check_tp_generation<EG<Chain<2>>>(m, eagle_dir.path);
}

TEST_CASE(
    "Kimi CPU tensor parallel: an EAGLE-1/2 draft over a vocabulary-split lm_head is refused") {
  TempDir dir, draft_dir;
  TinyKimi m;
  load_tiny_kimi(dir.path, /*int4=*/false, 31, &m);
  write_tiny_draft(draft_dir.path, m.config, DraftKind::kEagle);
  std::string message;
  (void)dist::run_ranks(2, [&](int rank, CpuCommunicator& comm) -> Status {
    KimiCpuModel k;
    SPECDEC_RETURN_IF_ERROR(load_shard(m, {rank, 2}, &comm, &k));
    model::eagle::DraftCpuModel draft;
    Status const s = model::eagle::load_draft_cpu_model(
        draft_dir.path.string(), k.config, model::eagle::target_tensors_of(k), DraftKind::kEagle,
        {}, "the test policy", &draft);
    if (rank == 0) message = s.message();
    return Status::Ok();
  });
  CHECK_MESSAGE(message.find("replicate_lm_head") != std::string::npos, message);
}

}  // namespace
