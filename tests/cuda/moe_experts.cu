// moe_experts CUDA kernels vs the CPU reference, both weight formats (bf16, INT4 with group sizes
// 8 / 32 / 96 / 128): the tiny preset (H 128, I 32, E 8, top-2), a mid shape (H 1024, I 512,
// E 64, top-6), shapes with column tails and several 1024-column chunks (H 1056 / 1048), and
// Kimi-K2.5's H 7168 / I 2048 with few experts; T in {1, 7, 64, 300}; random distinct routing,
// repeated ids, skewed routing (every token to the same top_k experts; every slot to one expert)
// and ids outside [0, E) (skipped by the kernel: compared with the reference given weight 0 for
// those slots). Outputs and workspace are poisoned (0xff: NaN) before each run; a second run must
// be bit-identical (deterministic grouping, no atomics). Tolerance per token row, against
// max_j |ref[t, j]|: bf16 experts 1e-4 (float accumulation against the reference's double); INT4
// experts (tensor cores, bf16 operands) 1e-3 against the reference in its bf16_operands mode (an
// h on the other side of a bf16 rounding boundary moves y by ~2^-9 of one of I terms) and
// kInt4ExactTol against the exact reference (the bf16 rounding of x, the weights and h).
// accumulate adds the sum to y; given x_bf16 and an addend that another stream writes ~2 ms late
// (addend_ready), the result is the plain launch's plus the addend, bit for bit.
// Launches of at most 32 assignments (either format) are grouped by each kernel's warps from the
// ids (no group kernel): T = 1 on every shape, T = 7 at top-2 and top-4, and Kimi's 4 x 8 take
// that path; T = 7 at top-6 and Kimi's 5 x 8 the group kernel's.
// A CUDA-graph test captures one launch (64 tokens; 3 tokens, grouped in a warp) and replays it
// after x and ids change in place. The INT4
// weights reach the kernels through the CUDA conversion to the tiled order, itself compared word
// for word with the CPU's over shapes with partial chunks and Kimi-K2.5's matrices.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/ops/moe_experts/moe_experts.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

struct Shape {
  int H, I, E, K, G;  // G = 0: bf16
};

// Expert weights on the host and on the device. Each kind of tensor lives in one allocation with
// the experts in REVERSE order (table[e] points at slot E-1-e), so a kernel that assumed
// contiguous or ordered experts would fail.
struct Experts {
  Shape s;
  bool int4 = false;
  // Index m: 0 gate, 1 up, 2 down.
  std::vector<uint16_t> bf16[3];
  std::vector<int32_t> packed[3];
  std::vector<uint16_t> scale[3];
  std::vector<uint16_t const*> h_bf16[3], h_scale[3];
  std::vector<int32_t const*> h_packed[3];
  DeviceBuffer<uint16_t> d_bf16[3], d_scale[3];
  DeviceBuffer<int32_t> d_packed[3];
  DeviceBuffer<uint16_t const*> dt_bf16[3], dt_scale[3];
  DeviceBuffer<int32_t const*> dt_packed[3];

  int64_t rows(int m) const { return m == 2 ? s.H : s.I; }
  int64_t cols(int m) const { return m == 2 ? s.I : s.H; }
};

// Random experts: bf16 N(0, 1/in); INT4 uniform nibbles (values -8..7, std ~4.6) with scales
// U(0.5, 1.5) / (4.6 sqrt(in)), so both give rows of about unit norm.
void make_experts(testing::Rng& rng, Shape s, Experts* X) {
  X->s = s;
  X->int4 = s.G > 0;
  int const E = s.E;
  for (int m = 0; m < 3; ++m) {
    int64_t const R = X->rows(m), C = X->cols(m);
    float const sd = 1.0f / std::sqrt(static_cast<float>(C));
    if (X->int4) {
      int64_t const words = R * C / 8, groups = R * (C / s.G);
      X->packed[m].resize(static_cast<size_t>(words * E));
      X->scale[m].resize(static_cast<size_t>(groups * E));
      for (auto& w : X->packed[m]) w = static_cast<int32_t>(static_cast<uint32_t>(rng()));
      std::uniform_real_distribution<float> u(0.5f, 1.5f);
      for (auto& v : X->scale[m]) v = float_to_bf16(u(rng) * sd / 4.6f);
      // Uploaded row-major, then put in the kernels' tiled order on the device, one expert
      // matrix at a time, as the model loader does.
      DeviceBuffer<int32_t> const row_major(X->packed[m]);
      X->d_packed[m] = DeviceBuffer<int32_t>(X->packed[m].size());
      X->d_scale[m] = DeviceBuffer<uint16_t>(X->scale[m]);
      REQUIRE(row_major.valid());
      REQUIRE(X->d_packed[m].valid());
      for (int64_t slot = 0; slot < E; ++slot) {
        REQUIRE(moe_experts_tile_int4(CudaExecutor{}, row_major.data() + slot * words, R, C,
                                      X->d_packed[m].data() + slot * words)
                    .ok());
      }
      REQUIRE(X->d_scale[m].valid());
      std::vector<int32_t const*> dp;
      std::vector<uint16_t const*> ds;
      for (int e = 0; e < E; ++e) {
        int64_t const slot = E - 1 - e;
        X->h_packed[m].push_back(X->packed[m].data() + slot * words);
        X->h_scale[m].push_back(X->scale[m].data() + slot * groups);
        dp.push_back(X->d_packed[m].data() + slot * words);
        ds.push_back(X->d_scale[m].data() + slot * groups);
      }
      X->dt_packed[m] = DeviceBuffer<int32_t const*>(dp);
      X->dt_scale[m] = DeviceBuffer<uint16_t const*>(ds);
    } else {
      int64_t const n = R * C;
      X->bf16[m].resize(static_cast<size_t>(n * E));
      std::normal_distribution<float> nd(0.0f, sd);
      for (auto& v : X->bf16[m]) v = float_to_bf16(nd(rng));
      X->d_bf16[m] = DeviceBuffer<uint16_t>(X->bf16[m]);
      REQUIRE(X->d_bf16[m].valid());
      std::vector<uint16_t const*> db;
      for (int e = 0; e < E; ++e) {
        int64_t const slot = E - 1 - e;
        X->h_bf16[m].push_back(X->bf16[m].data() + slot * n);
        db.push_back(X->d_bf16[m].data() + slot * n);
      }
      X->dt_bf16[m] = DeviceBuffer<uint16_t const*>(db);
    }
  }
}

MoeExpertWeights host_weights(Experts const& X) {
  MoeExpertWeights w;
  w.int4 = X.int4;
  w.group_size = X.s.G;
  if (X.int4) {
    w.gate_packed = X.h_packed[0].data(), w.up_packed = X.h_packed[1].data();
    w.down_packed = X.h_packed[2].data();
    w.gate_scale = X.h_scale[0].data(), w.up_scale = X.h_scale[1].data();
    w.down_scale = X.h_scale[2].data();
  } else {
    w.gate = X.h_bf16[0].data(), w.up = X.h_bf16[1].data(), w.down = X.h_bf16[2].data();
  }
  return w;
}

MoeExpertWeights device_weights(Experts const& X) {
  MoeExpertWeights w;
  w.int4 = X.int4;
  w.group_size = X.s.G;
  if (X.int4) {
    w.gate_packed = X.dt_packed[0].data(), w.up_packed = X.dt_packed[1].data();
    w.down_packed = X.dt_packed[2].data();
    w.gate_scale = X.dt_scale[0].data(), w.up_scale = X.dt_scale[1].data();
    w.down_scale = X.dt_scale[2].data();
  } else {
    w.gate = X.dt_bf16[0].data(), w.up = X.dt_bf16[1].data(), w.down = X.dt_bf16[2].data();
  }
  return w;
}

enum class Routing { kRandom, kRepeats, kSameK, kOneExpert, kBadIds };
char const* routing_name(Routing r) {
  switch (r) {
    case Routing::kRandom: return "random";
    case Routing::kRepeats: return "repeats";
    case Routing::kSameK: return "same top_k experts";
    case Routing::kOneExpert: return "one expert";
    case Routing::kBadIds: return "ids outside [0, E)";
  }
  return "?";
}

struct Routed {
  std::vector<float> x;
  std::vector<int32_t> ids;     // what the kernel sees
  std::vector<float> weights;
  std::vector<int32_t> ref_ids;  // what the reference sees (bad ids -> 0 with weight 0)
  std::vector<float> ref_weights;
};

Routed route(testing::Rng& rng, Shape s, int T, Routing r) {
  Routed o;
  o.x = testing::random_logits(rng, T, s.H, 1.0f);
  o.ids.resize(static_cast<size_t>(T) * s.K);
  o.weights.resize(o.ids.size());
  std::uniform_real_distribution<float> wd(0.05f, 1.0f);
  std::uniform_int_distribution<int> any(0, s.E - 1);
  std::vector<int32_t> perm(static_cast<size_t>(s.E));
  for (int t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < s.K; ++k) {
      size_t const a = static_cast<size_t>(t) * s.K + k;
      switch (r) {
        case Routing::kRandom:
        case Routing::kBadIds: o.ids[a] = perm[static_cast<size_t>(k % s.E)]; break;
        case Routing::kRepeats: o.ids[a] = any(rng) % std::max(1, s.E / 4); break;
        case Routing::kSameK: o.ids[a] = (3 * k + 1) % s.E; break;
        case Routing::kOneExpert: o.ids[a] = s.E - 1; break;
      }
      o.weights[a] = wd(rng);
    }
  }
  o.ref_ids = o.ids;
  o.ref_weights = o.weights;
  if (r == Routing::kBadIds) {
    int32_t const bad[] = {-1, s.E, s.E + 1000, INT32_MIN, INT32_MAX, -77};
    for (size_t a = 0, i = 0; a < o.ids.size(); a += 3, ++i) {
      o.ids[a] = bad[i % 6];
      o.ref_ids[a] = 0;
      o.ref_weights[a] = 0.0f;
    }
  }
  return o;
}

// The INT4 path against the exact reference: three bf16 roundings (2^-9 relative each) over
// random-sign sums; the bf16_operands reference itself is up to 1.2e-2 from the exact one on the
// tiny preset's shape (H 128, I 32, T 300), 5e-3 at Kimi-K2.5's. The bf16 bound of the issue.
constexpr double kInt4ExactTol = 2e-2;

// |gpu - ref| <= tol * max_j |ref[t, j]| per row; NaN fails.
void check_close(std::vector<float> const& gpu, std::vector<float> const& ref, int T, int H,
                 double tol, char const* what) {
  int reported = 0;
  double worst = 0.0;
  for (int t = 0; t < T; ++t) {
    float scale = 0.0f;
    for (int j = 0; j < H; ++j) scale = std::max(scale, std::fabs(ref[static_cast<size_t>(t) * H + j]));
    for (int j = 0; j < H; ++j) {
      size_t const i = static_cast<size_t>(t) * H + j;
      double const err = std::fabs(static_cast<double>(gpu[i]) - ref[i]);
      bool const ok = err <= tol * scale;
      if (scale > 0) worst = std::max(worst, std::isnan(err) ? 1e30 : err / scale);
      if (!ok && reported++ < 8) {
        FAIL_CHECK(what << ": y[" << t << ", " << j << "] = " << gpu[i] << ", reference "
                        << ref[i] << " (row max " << scale << ", tolerance " << tol << ")");
      }
    }
  }
  if (reported > 8) FAIL_CHECK(reported << " elements outside the tolerance in all");
  MESSAGE(what << ": worst error / row max: " << worst);
}

struct Run {
  MoeExpertsParams p;  // device pointers
  DeviceBuffer<float> x, weights, y;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<unsigned char> workspace;
};

void setup_run(Experts const& X, Routed const& r, int T, Run* run) {
  Shape const s = X.s;
  run->x = DeviceBuffer<float>(r.x);
  run->ids = DeviceBuffer<int32_t>(r.ids);
  run->weights = DeviceBuffer<float>(r.weights);
  run->y = DeviceBuffer<float>(static_cast<size_t>(T) * s.H);
  size_t const ws = moe_experts_workspace_bytes(T, s.K, s.E, s.H, s.I);
  run->workspace = DeviceBuffer<unsigned char>(ws);
  REQUIRE(run->x.valid());
  REQUIRE(run->y.valid());
  REQUIRE(run->workspace.valid());
  MoeExpertsParams& p = run->p;
  p.x = run->x.data();
  p.ids = run->ids.data();
  p.weights = run->weights.data();
  p.tokens = T;
  p.hidden = s.H;
  p.inter = s.I;
  p.experts = s.E;
  p.top_k = s.K;
  p.w = device_weights(X);
  p.y = run->y.data();
  p.workspace = run->workspace.data();
  p.workspace_bytes = ws;
}

std::vector<float> reference(Experts const& X, Routed const& r, int T, bool bf16_operands = false) {
  std::vector<float> y(static_cast<size_t>(T) * X.s.H, NAN);
  MoeExpertsParams p;
  p.x = r.x.data();
  p.ids = r.ref_ids.data();
  p.weights = r.ref_weights.data();
  p.tokens = T;
  p.hidden = X.s.H;
  p.inter = X.s.I;
  p.experts = X.s.E;
  p.top_k = X.s.K;
  p.w = host_weights(X);
  p.y = y.data();
  Status const st = moe_experts_cpu(p, bf16_operands);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return y;
}

// Holds a stream for `cycles` clock cycles (work that lands late on another stream).
__global__ void spin_kernel(int64_t cycles) {
  int64_t const start = clock64();
  while (clock64() - start < cycles) {
  }
}

// The GPU's y against the reference(s) of its format (the top of the file).
void check_reference(Experts const& X, Routed const& r, int T, std::vector<float> const& gpu) {
  if (!X.int4) {
    check_close(gpu, reference(X, r, T), T, X.s.H, 1e-4, "bf16 experts");
    return;
  }
  check_close(gpu, reference(X, r, T, /*bf16_operands=*/true), T, X.s.H, 1e-3,
              "INT4, reference with bf16 operands");
  check_close(gpu, reference(X, r, T), T, X.s.H, kInt4ExactTol, "INT4, exact reference");
}

}  // namespace

TEST_CASE("moe_experts: GPU output matches the CPU reference") {
  struct Case {
    Shape s;
    std::vector<int> tokens;
    std::vector<Routing> routings;
  };
  std::vector<Routing> const all = {Routing::kRandom, Routing::kRepeats, Routing::kSameK,
                                    Routing::kOneExpert, Routing::kBadIds};
  std::vector<Case> const cases = {
      {{128, 32, 8, 2, 32}, {1, 7, 64, 300}, all},    // the tiny preset, INT4
      {{128, 32, 8, 2, 0}, {1, 7, 64, 300}, all},     // the tiny preset, bf16
      {{1024, 512, 64, 6, 32}, {1, 7, 64, 300}, {Routing::kRandom}},
      {{1024, 512, 64, 6, 0}, {1, 7, 64, 300}, {Routing::kRandom}},
      {{1024, 512, 64, 6, 32}, {64}, {Routing::kSameK, Routing::kOneExpert, Routing::kBadIds}},
      {{1024, 512, 64, 6, 0}, {64}, {Routing::kSameK, Routing::kBadIds}},
      {{1056, 96, 16, 4, 8}, {1, 7, 64, 300}, {Routing::kRandom, Routing::kOneExpert}},
      {{1048, 200, 16, 4, 0}, {1, 7, 64, 300}, {Routing::kRandom, Routing::kSameK}},
      {{1056, 96, 5, 3, 96}, {7, 64}, {Routing::kRandom}},  // group size not a power of two
      {{2048, 256, 8, 2, 128}, {1, 64}, {Routing::kRandom, Routing::kRepeats}},
      // Kimi-K2.5's H and I, INT4; 4 x 8 = 32 assignments are grouped in a warp, 5 x 8 not
      {{7168, 2048, 8, 8, 32}, {1, 4, 5}, {Routing::kRandom, Routing::kRepeats}},
      {{7168, 2048, 4, 4, 0}, {3}, {Routing::kRandom}},      // and bf16
  };
  testing::Rng rng(2024);
  int runs = 0;
  for (Case const& c : cases) {
    Experts X;
    make_experts(rng, c.s, &X);
    for (int T : c.tokens) {
      for (Routing r : c.routings) {
        CAPTURE(c.s.H);
        CAPTURE(c.s.I);
        CAPTURE(c.s.E);
        CAPTURE(c.s.K);
        CAPTURE(c.s.G);
        CAPTURE(T);
        INFO("routing: " << routing_name(r));
        Routed const routed = route(rng, c.s, T, r);
        Run run;
        setup_run(X, routed, T, &run);
        REQUIRE(run.y.fill_bytes(0xff).ok());
        REQUIRE(run.workspace.fill_bytes(0xff).ok());
        Status const st = moe_experts(CudaExecutor{}, run.p);
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        std::vector<float> const first = run.y.download();
        check_reference(X, routed, T, first);
        // Deterministic: the same bits again, from a poisoned output and workspace.
        REQUIRE(run.y.fill_bytes(0xff).ok());
        REQUIRE(run.workspace.fill_bytes(0xff).ok());
        REQUIRE(moe_experts(CudaExecutor{}, run.p).ok());
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        std::vector<float> const second = run.y.download();
        CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
        ++runs;
      }
    }
  }
  MESSAGE("compared " << runs << " launches");
}

TEST_CASE("moe_experts: accumulate adds the sum to y; x_bf16 and a late addend, the same bits") {
  for (int G : {32, 0}) {  // INT4, bf16
    CAPTURE(G);
    Shape const s{1024, 512, 64, 6, G};
    testing::Rng rng(91 + G);
    Experts X;
    make_experts(rng, s, &X);
    int const T = 7;
    Routed const routed = route(rng, s, T, Routing::kBadIds);
    Run run;
    setup_run(X, routed, T, &run);
    std::vector<float> const y0 = testing::random_logits(rng, T, s.H, 1.0f);
    REQUIRE(run.y.upload(y0).ok());
    run.p.accumulate = true;
    Status const st = moe_experts(CudaExecutor{}, run.p);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> const gpu = run.y.download();
    // y - y0 against the overwriting reference: the sum was added, and added once.
    std::vector<float> added(gpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) added[i] = gpu[i] - y0[i];
    check_reference(X, routed, T, added);

    // The forward's form: x's bf16 copy from the norm (INT4: no conversion kernel) and the
    // shared experts' output, written on a side stream, added by the last kernel after an event.
    // Against the launch above: bit for bit (the same bf16 operand; y = (y0 + m) + addend).
    std::vector<uint16_t> xb(routed.x.size());
    for (size_t i = 0; i < xb.size(); ++i) xb[i] = float_to_bf16(routed.x[i]);
    DeviceBuffer<uint16_t> dxb(xb);
    std::vector<float> const add = testing::random_logits(rng, T, s.H, 1.0f);
    DeviceBuffer<float> staged(add), daddend(add.size());
    REQUIRE(daddend.fill_bytes(0xff).ok());
    cudaStream_t main = nullptr, side = nullptr;
    cudaEvent_t ready = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(run.y.upload(y0).ok());
    REQUIRE(run.workspace.fill_bytes(0xff).ok());
    // The addend lands on the side stream after a delay the main stream does not wait for.
    spin_kernel<<<1, 1, 0, side>>>(int64_t{4} << 20);  // ~2 ms
    REQUIRE(cudaGetLastError() == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(daddend.data(), staged.data(), add.size() * sizeof(float),
                            cudaMemcpyDeviceToDevice, side) == cudaSuccess);
    REQUIRE(cudaEventRecord(ready, side) == cudaSuccess);
    run.p.x_bf16 = dxb.data();
    run.p.addend = daddend.data();
    run.p.addend_ready = ready;
    Status const late = moe_experts(CudaExecutor{main}, run.p);
    REQUIRE_MESSAGE(late.ok(), late.to_string());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> const got = run.y.download();
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      float const want = gpu[i] + add[i];
      if (std::memcmp(&got[i], &want, sizeof(float)) != 0 && bad++ < 5) {
        FAIL_CHECK("y[" << i << "] = " << got[i] << ", want " << want);
      }
    }
    CHECK(bad == 0);
    cudaEventDestroy(ready);
    cudaStreamDestroy(side);
    cudaStreamDestroy(main);
  }
}

TEST_CASE("moe_experts: one captured launch replays after x and ids change in place") {
  Shape const s{1024, 512, 64, 6, 32};
  testing::Rng rng(77);
  Experts X;
  make_experts(rng, s, &X);
  // 64 tokens: grouped by the group kernel; 3 x 6 = 18 assignments: in a warp by each kernel.
  for (int const T : {64, 3}) {
    CAPTURE(T);
    Routed const first = route(rng, s, T, Routing::kRandom);
    Run run;
    setup_run(X, first, T, &run);
    REQUIRE(run.y.fill_bytes(0xff).ok());
    REQUIRE(run.workspace.fill_bytes(0xff).ok());

    cudaStream_t stream;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    Status const captured = moe_experts(CudaExecutor{stream}, run.p);
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    REQUIRE_MESSAGE(captured.ok(), captured.to_string());
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<float> const replay1 = run.y.download();
    check_reference(X, first, T, replay1);

    // Same buffers, new contents: a different routing (skewed, with bad ids) and new tokens.
    Routed second = route(rng, s, T, Routing::kBadIds);
    for (size_t a = 0; a < second.ids.size(); ++a) {
      if (a % 3 != 0 && a % 2 == 0) second.ids[a] = second.ref_ids[a] = 5;  // skew toward expert 5
    }
    REQUIRE(run.x.upload(second.x).ok());
    REQUIRE(run.ids.upload(second.ids).ok());
    REQUIRE(run.weights.upload(second.weights).ok());
    REQUIRE(run.y.fill_bytes(0xff).ok());
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<float> const replay2 = run.y.download();
    check_reference(X, second, T, replay2);

    // The replay equals an eager launch bit for bit.
    REQUIRE(run.y.fill_bytes(0xff).ok());
    REQUIRE(moe_experts(CudaExecutor{stream}, run.p).ok());
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<float> const eager = run.y.download();
    CHECK(std::memcmp(replay2.data(), eager.data(), eager.size() * sizeof(float)) == 0);

    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST_CASE("moe_experts: the tiled order on the GPU matches the CPU's, word for word") {
  testing::Rng rng(41);
  // rows x cols: one band and one piece; partial last chunks of 1 and 3 pieces; Kimi-K2.5's
  // gate / up (2048 x 7168) and down (7168 x 2048).
  int64_t const shapes[][2] = {{16, 32}, {32, 160}, {48, 224}, {2048, 7168}, {7168, 2048}};
  for (auto const& shape : shapes) {
    int64_t const rows = shape[0], cols = shape[1], words = rows * cols / 8;
    CAPTURE(rows);
    CAPTURE(cols);
    std::vector<int32_t> src(static_cast<size_t>(words)), want(src.size());
    for (auto& v : src) v = static_cast<int32_t>(static_cast<uint32_t>(rng()));
    REQUIRE(moe_experts_tile_int4(CpuExecutor{}, src.data(), rows, cols, want.data()).ok());
    DeviceBuffer<int32_t> const d_src(src);
    DeviceBuffer<int32_t> d_dst(src.size());
    REQUIRE(d_dst.valid());
    REQUIRE(d_dst.fill_bytes(0xff).ok());
    REQUIRE(moe_experts_tile_int4(CudaExecutor{}, d_src.data(), rows, cols, d_dst.data()).ok());
    CHECK(d_dst.download() == want);
  }
}

TEST_CASE("moe_experts: no tokens launches nothing") {
  MoeExpertsParams p;
  p.tokens = 0;
  p.hidden = 128;
  p.inter = 32;
  p.experts = 8;
  p.top_k = 2;
  CHECK(moe_experts(CudaExecutor{}, p).ok());
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
