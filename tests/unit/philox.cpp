// Philox4x32-10 against the published known-answer vectors, and the uniform stream's properties.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "specdec/core/philox.hpp"

using specdec::Philox4;
using specdec::philox4x32_10;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  Philox4 zero = philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 0);
  CHECK(zero.x[0] == 0x6627e8d5u);
  CHECK(zero.x[1] == 0xe169c58du);
  CHECK(zero.x[2] == 0xbc57ac4cu);
  CHECK(zero.x[3] == 0x9b00dbd8u);
  Philox4 ones = philox4x32_10(Philox4{{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  CHECK(ones.x[0] == 0x408f276du);
  CHECK(ones.x[1] == 0x41c83b0eu);
  CHECK(ones.x[2] == 0xa20bc7c6u);
  CHECK(ones.x[3] == 0x6d5451fdu);
  Philox4 pi = philox4x32_10(Philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                             0xa4093822u, 0x299f31d0u);
  CHECK(pi.x[0] == 0xd16cfe09u);
  CHECK(pi.x[1] == 0x94fdccebu);
  CHECK(pi.x[2] == 0x5001e420u);
  CHECK(pi.x[3] == 0x24126ea1u);
}

TEST_CASE("philox uniforms are in [0,1), keyed on every coordinate, and roughly uniform") {
  std::set<float> distinct;
  double sum = 0.0;
  int const n = 40000;
  for (int i = 0; i < n; ++i) {
    float u = specdec::philox_uniform(1234, 7, 3, 5, static_cast<uint32_t>(i));
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    sum += u;
    distinct.insert(u);
  }
  CHECK(std::abs(sum / n - 0.5) < 0.01);  // sd of the mean is 0.0014
  CHECK(distinct.size() > n * 0.99);
  float base = specdec::philox_uniform(1, 2, 3, 4, 5);
  CHECK(base != specdec::philox_uniform(2, 2, 3, 4, 5));
  CHECK(base != specdec::philox_uniform(1, 3, 3, 4, 5));
  CHECK(base != specdec::philox_uniform(1, 2, 4, 4, 5));
  CHECK(base != specdec::philox_uniform(1, 2, 3, 5, 5));
  CHECK(base != specdec::philox_uniform(1, 2, 3, 4, 6));
  CHECK(base != specdec::philox_uniform(1ull << 40, 2, 3, 4, 5));  // high seed bits matter
}
