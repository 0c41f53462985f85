// Counter-based randomness: Philox4x32-10 (Salmon et al., SC'11), identical on host and device.
// Every random draw in the library is keyed on (seed, request, step, node, index):
//   key     = seed (64 bits)
//   counter = {request, step, node, index / 4}, and the draw is output word index % 4.
// So the CPU reference, the CUDA kernel and every tensor-parallel rank draw the same uniforms
// with no state to carry between calls, and a kernel can sit in a CUDA graph with the seed and
// step read from device memory.
#pragma once

#include <cstdint>

#include "specdec/core/macros.hpp"

namespace specdec {

struct Philox4 {
  uint32_t x[4];
};

SPECDEC_HD inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t const product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

// The Philox4x32 bijection with 10 rounds.
SPECDEC_HD inline Philox4 philox4x32_10(Philox4 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  Philox4 c = counter;
  SPECDEC_UNROLL
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, c.x[0], hi0, lo0);
    philox_mulhilo(kMul1, c.x[2], hi1, lo1);
    c = Philox4{{hi1 ^ c.x[1] ^ key0, lo1, hi0 ^ c.x[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return c;
}

// The 32 random bits of draw `index` in the stream (seed, request, step, node).
SPECDEC_HD inline uint32_t philox_bits(uint64_t seed, uint32_t request, uint32_t step,
                                       uint32_t node, uint32_t index) {
  Philox4 const out = philox4x32_10(Philox4{{request, step, node, index >> 2}},
                                    static_cast<uint32_t>(seed),
                                    static_cast<uint32_t>(seed >> 32));
  return out.x[index & 3u];
}

// A uniform float in [0, 1) with 24 random bits: exactly representable, so host and device agree
// bit for bit.
SPECDEC_HD inline float philox_uniform(uint64_t seed, uint32_t request, uint32_t step,
                                       uint32_t node, uint32_t index) {
  return static_cast<float>(philox_bits(seed, request, step, node, index) >> 8) *
         (1.0f / 16777216.0f);
}

}  // namespace specdec

namespace specdec {

// Per-request keys of the random stream; arrays live in the executor's memory (host for the CPU
// reference, device for kernels) so a captured CUDA graph replays with new seeds and steps.
//   seed        [B] uint64  the request's sampling seed
//   step        [B] uint32  the request's speculative step (advances every verify)
//   request_id  [B] uint32  a stable request id, or nullptr: the batch index is used
// Draw `index` at tree node `node` of request b is philox_uniform(seed[b], id(b), step[b], node, index).
struct RandomKeys {
  uint64_t const* seed = nullptr;
  uint32_t const* step = nullptr;
  uint32_t const* request_id = nullptr;

  SPECDEC_HD float uniform(int b, uint32_t node, uint32_t index) const {
    uint32_t const id = request_id ? request_id[b] : static_cast<uint32_t>(b);
    return philox_uniform(seed[b], id, step[b], node, index);
  }
};

}  // namespace specdec
