// linear_bf16 CPU reference: y = beta y + x W^T (rule and shapes in linear_bf16/params.hpp), plain
// loops, one fp32 sum per output in k order.
#pragma once

#include <cstdint>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/ops/linear_bf16/params.hpp"

namespace specdec::ops {

inline Status linear_bf16_cpu(LinearBf16Params const& p) {
  for (int b = 0; b < p.batch; ++b) {
    for (int t = 0; t < p.tokens; ++t) {
      uint16_t const* x = p.x + b * p.x_batch + t * p.ldx;
      for (int64_t o = 0; o < p.out; ++o) {
        uint16_t const* w = p.w + b * p.w_batch + o * p.in;
        float sum = 0.0f;
        for (int64_t k = 0; k < p.in; ++k) sum += bf16_to_float(x[k]) * bf16_to_float(w[k]);
        linear_bf16_store(p, b, t, o, sum);
      }
    }
  }
  return Status::Ok();
}

}  // namespace specdec::ops
