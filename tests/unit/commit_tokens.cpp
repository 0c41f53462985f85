// commit_tokens CPU reference (ops/commit_tokens) on hand-worked trees: the committed tokens of
// each request up to its stop (eos only when the request stops at eos, its own stop ids, its
// remaining budget), the order of the stop checks, the drafts counted per depth, clamped
// acceptance, and the argument errors.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "specdec/core/executor.hpp"
#include "specdec/ops/commit_tokens/commit_tokens.hpp"
#include "support/status_checks.hpp"

namespace {

using namespace specdec;
using namespace specdec::ops;

// One request's tree: tokens 10..14, parents [-1, 0, 1, 0, 3] (two chains of 2 under the root),
// depths [0, 1, 2, 1, 2]; path capacity 3 (two draft steps); path root -> 3 -> 4.
struct Case {
  std::vector<int32_t> tokens{10, 11, 12, 13, 14}, depth{0, 1, 2, 1, 2};
  std::vector<int32_t> path{0, 3, 4}, accepted{2}, next{99};
  std::vector<int32_t> eos, at_eos{1}, offsets{0, 0}, stop_ids, remaining{10};
  std::vector<int32_t> record = std::vector<int32_t>(commit_record_width(3), -7);

  std::vector<int32_t> const& run() {
    CommitTokensParams p;
    p.tree = TreeInput{tokens.data(), nullptr, nullptr, 1, 5};
    p.depth = depth.data();
    p.acceptance = Acceptance{path.data(), accepted.data(), next.data(), 3};
    p.eos = eos.data();
    p.num_eos = static_cast<int>(eos.size());
    p.stop_at_eos = at_eos.data();
    p.stop_offsets = offsets.data();
    p.stop_ids = stop_ids.data();
    p.remaining = remaining.data();
    p.record = record.data();
    Status const s = commit_tokens(CpuExecutor{}, p);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    return record;
  }
};

using R = std::vector<int32_t>;

TEST_CASE("commit_tokens: the accepted drafts, then the bonus, with the drafts per depth") {
  Case c;
  // count 3, go on, tokens [13, 14, 99], proposed [-, 2 at depth 1, 2 at depth 2]
  CHECK(c.run() == R{3, kCommitGoOn, 13, 14, 99, 0, 2, 2});
}

TEST_CASE("commit_tokens: a request stops at its first stopping token") {
  SUBCASE("eos inside the path") {
    Case c;
    c.eos = {14, 5};
    CHECK(c.run() == R{2, kCommitEos, 13, 14, -1, 0, 2, 2});
  }
  SUBCASE("eos ignored by a request that does not stop at eos") {
    Case c;
    c.eos = {14};
    c.at_eos = {0};
    CHECK(c.run() == R{3, kCommitGoOn, 13, 14, 99, 0, 2, 2});
  }
  SUBCASE("a stop id: the first draft") {
    Case c;
    c.stop_ids = {7, 13};
    c.offsets = {0, 2};
    CHECK(c.run() == R{1, kCommitStopId, 13, -1, -1, 0, 2, 2});
  }
  SUBCASE("a stop id on the bonus token") {
    Case c;
    c.stop_ids = {99};
    c.offsets = {0, 1};
    CHECK(c.run() == R{3, kCommitStopId, 13, 14, 99, 0, 2, 2});
  }
  SUBCASE("eos before a stop id on the same token") {
    Case c;
    c.eos = {14};
    c.stop_ids = {14};
    c.offsets = {0, 1};
    CHECK(c.run() == R{2, kCommitEos, 13, 14, -1, 0, 2, 2});
  }
  SUBCASE("the budget: one token left") {
    Case c;
    c.remaining = {1};
    CHECK(c.run() == R{1, kCommitLength, 13, -1, -1, 0, 2, 2});
  }
  SUBCASE("a stop id before the budget on the same token") {
    Case c;
    c.remaining = {2};
    c.stop_ids = {14};
    c.offsets = {0, 1};
    CHECK(c.run() == R{2, kCommitStopId, 13, 14, -1, 0, 2, 2});
  }
}

TEST_CASE("commit_tokens: nothing accepted, and acceptance outside the path is clamped") {
  Case c;
  c.accepted = {0};
  CHECK(c.run() == R{1, kCommitGoOn, 99, -1, -1, 0, 2, 2});
  c.accepted = {-3};
  CHECK(c.run() == R{1, kCommitGoOn, 99, -1, -1, 0, 2, 2});
  c.accepted = {9};  // clamped to P - 1 = 2
  CHECK(c.run() == R{3, kCommitGoOn, 13, 14, 99, 0, 2, 2});
}

TEST_CASE("commit_tokens: a batch reads each request's own stop ids and node count") {
  // Request 0: the tree above, stop ids {14}. Request 1: 3 of 5 nodes (a chain 20 -> 21 -> 22),
  // path 0 -> 1 -> 2, stop ids {} and budget 2.
  std::vector<int32_t> tokens{10, 11, 12, 13, 14, 20, 21, 22, 0, 0};
  std::vector<int32_t> depth{0, 1, 2, 1, 2, 0, 1, 2, -1, -1}, count{5, 3};
  std::vector<int32_t> path{0, 3, 4, 0, 1, 2}, accepted{2, 2}, next{99, 98};
  std::vector<int32_t> at_eos{1, 1}, offsets{0, 1, 1}, stop_ids{14}, remaining{10, 2}, eos{};
  std::vector<int32_t> record(2 * commit_record_width(3), -7);
  CommitTokensParams p;
  p.tree = TreeInput{tokens.data(), nullptr, count.data(), 2, 5};
  p.depth = depth.data();
  p.acceptance = Acceptance{path.data(), accepted.data(), next.data(), 3};
  p.stop_at_eos = at_eos.data();
  p.stop_offsets = offsets.data();
  p.stop_ids = stop_ids.data();
  p.remaining = remaining.data();
  p.record = record.data();
  REQUIRE(commit_tokens(CpuExecutor{}, p).ok());
  CHECK(record == R{2, kCommitStopId, 13, 14, -1, 0, 2, 2,  //
                    2, kCommitLength, 21, 22, -1, 0, 1, 1});
}

TEST_CASE("commit_tokens: commit_stop checks eos, then stop ids, then the budget") {
  int32_t const eos[] = {2}, stop[] = {3};
  CHECK(commit_stop(2, true, eos, 1, stop, 1, 1, 5) == kCommitEos);
  CHECK(commit_stop(2, false, eos, 1, stop, 1, 5, 5) == kCommitLength);
  CHECK(commit_stop(3, true, eos, 1, stop, 1, 5, 5) == kCommitStopId);
  CHECK(commit_stop(4, true, eos, 1, stop, 1, 4, 5) == kCommitGoOn);
  CHECK(commit_stop(4, true, eos, 1, stop, 1, 5, 5) == kCommitLength);
}

TEST_CASE("commit_tokens: argument errors name the problem") {
  Case c;
  CommitTokensParams p;
  p.tree = TreeInput{c.tokens.data(), nullptr, nullptr, 1, 5};
  p.depth = c.depth.data();
  p.acceptance = Acceptance{c.path.data(), c.accepted.data(), c.next.data(), 6};
  p.stop_at_eos = c.at_eos.data();
  p.stop_offsets = c.offsets.data();
  p.remaining = c.remaining.data();
  p.record = c.record.data();
  testing::check_error(commit_tokens(CpuExecutor{}, p), StatusCode::kInvalidArgument,
                       {"path capacity 6", "<= nodes"});
  p.acceptance.path_capacity = 3;
  p.record = nullptr;
  testing::check_error(commit_tokens(CpuExecutor{}, p), StatusCode::kInvalidArgument,
                       {"required array is null"});
}

}  // namespace
