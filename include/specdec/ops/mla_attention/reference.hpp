// mla_attention CPU reference (plain loops, the oracle): for every token, the rows of its visible
// slots (mla_attention_visible_rows), then per head the scores, softmax and context in double,
// rounded to float. Checks the data contract of params.hpp first (the request and index of every
// token, base, max_slots, mask rows, page table entries of every visible slot) and writes nothing
// when any of it fails. Shapes: params.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/ops/mla_attention/params.hpp"

namespace specdec::ops {

// The cache rows of token t's visible slots in slot order, or the contract error (params.hpp).
inline Status mla_attention_visible_rows(MlaAttentionParams const& p, int t,
                                         std::vector<int64_t>* rows) {
  auto bad = [](std::string m) { return Status::InvalidArgument("mla_attention: " + m); };
  auto num = [](int64_t v) { return std::to_string(v); };
  rows->clear();
  int32_t const b = p.token_request[t];
  if (b < 0 || b >= p.batch) {
    return bad("token_request[" + num(t) + "] = " + num(b) + " not in [0, batch " + num(p.batch) +
               ")");
  }
  int32_t const i = p.token_index[t];
  if (i < 0) return bad("token_index[" + num(t) + "] = " + num(i) + " < 0");
  int64_t const base = p.base[b];
  if (base < 0) return bad("base[" + num(b) + "] = " + num(base) + " < 0");
  int64_t const n = base + i + 1;
  if (n > p.max_slots) {
    return bad("token " + num(t) + " (request " + num(b) + ", new token " + num(i) + ") has base " +
               num(base) + " + i + 1 = " + num(n) + " candidate slots > max_slots " +
               num(p.max_slots));
  }
  uint32_t const* mrow = p.mask ? p.mask + static_cast<int64_t>(t) * p.words : nullptr;
  if (mrow) {
    if (i >= static_cast<int64_t>(p.words) * 32) {
      return bad("token " + num(t) + " is new token " + num(i) + " but mask rows have " +
                 num(p.words) + " words (" + num(int64_t{p.words} * 32) +
                 " bits): words must be >= ceil((i + 1) / 32)");
    }
    for (int64_t j = i + 1; j < static_cast<int64_t>(p.words) * 32; ++j) {
      if ((mrow[j >> 5] >> (j & 31)) & 1u) {
        return bad("mask row of token " + num(t) + " (new token " + num(i) + ") has bit " + num(j) +
                   " set: only new tokens j <= i can be visible");
      }
    }
  }
  for (int64_t u = 0; u < n; ++u) {
    if (u >= base) {
      int64_t const j = u - base;
      if (mrow && !((mrow[j >> 5] >> (j & 31)) & 1u)) continue;
    }
    int64_t const k = u / p.page_size;
    if (k >= p.max_pages) {
      return bad("token " + num(t) + " reads slot " + num(u) + " of request " + num(b) +
                 ": page index " + num(k) + " >= max_pages " + num(p.max_pages));
    }
    int32_t const page = p.page_table[static_cast<int64_t>(b) * p.max_pages + k];
    if (page < 0 || page >= p.num_pages) {
      return bad("page_table[" + num(b) + "][" + num(k) + "] = " + num(page) + " not in [0, " +
                 "num_pages " + num(p.num_pages) + ") (slot " + num(u) + ", read by token " +
                 num(t) + ")");
    }
    rows->push_back(int64_t{page} * p.page_size + u % p.page_size);
  }
  return Status::Ok();
}

inline Status mla_attention_cpu(MlaAttentionParams const& p) {
  std::vector<int64_t> rows;
  for (int t = 0; t < p.tokens; ++t) SPECDEC_RETURN_IF_ERROR(mla_attention_visible_rows(p, t, &rows));
  int64_t const c = p.kv_lora_rank, W = c + p.rope_dim;
  std::vector<double> s, acc(static_cast<size_t>(c));
  for (int t = 0; t < p.tokens; ++t) {
    SPECDEC_RETURN_IF_ERROR(mla_attention_visible_rows(p, t, &rows));
    s.resize(rows.size());
    for (int h = 0; h < p.heads; ++h) {
      float const* q = p.q + (static_cast<int64_t>(t) * p.heads + h) * W;
      float* out = p.out + (static_cast<int64_t>(t) * p.heads + h) * c;
      if (rows.empty()) {
        std::fill(out, out + c, 0.0f);
        continue;
      }
      double mx = -INFINITY;
      for (size_t k = 0; k < rows.size(); ++k) {
        float const* e = p.cache + rows[k] * W;
        double dot = 0.0;
        for (int64_t x = 0; x < W; ++x) dot += static_cast<double>(q[x]) * e[x];
        s[k] = static_cast<double>(p.scale) * dot;
        mx = std::max(mx, s[k]);
      }
      double z = 0.0;
      for (double& v : s) {
        v = std::exp(v - mx);
        z += v;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t k = 0; k < rows.size(); ++k) {
        float const* e = p.cache + rows[k] * W;
        for (int64_t x = 0; x < c; ++x) acc[x] += s[k] * e[x];
      }
      for (int64_t x = 0; x < c; ++x) out[x] = static_cast<float>(acc[x] / z);
    }
  }
  return Status::Ok();
}

}  // namespace specdec::ops
