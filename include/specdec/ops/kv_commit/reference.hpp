// kv_commit CPU reference (plain loops): per request, check every move, then per layer copy all
// accepted source rows aside before writing any destination row (the ranges overlap).
// Shapes: see params.hpp (cache [L][B, max_seq, W] or [L][num_pages, page_size, W]).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "specdec/ops/kv_commit/params.hpp"

namespace specdec::ops {

inline Status kv_commit_reference(KvCommitParams const& p) {
  int64_t const row_bytes = kv_commit_row_bytes(p);
  unsigned char* cache = static_cast<unsigned char*>(p.cache);
  std::vector<int64_t> src(static_cast<size_t>(p.acceptance.path_capacity));
  std::vector<int64_t> dst(src.size());
  std::vector<unsigned char> stage;
  for (int b = 0; b < p.batch; ++b) {
    int32_t code = kv_commit_check_request(p, b);
    int const n = code == kKvCommitOk ? p.acceptance.num_accepted[b] : 0;
    for (int k = 1; k <= n; ++k) {
      int32_t const c = kv_commit_check_move(p, b, k, src[k], dst[k]);
      if (c > code) code = c;
    }
    p.status[b] = code;
    if (p.seq_len_out) p.seq_len_out[b] = code == kKvCommitOk ? p.prefix_len[b] + n + 1 : -1;
    if (code != kKvCommitOk) continue;
    stage.resize(static_cast<size_t>((n + 1) * row_bytes));
    for (int layer = 0; layer < p.num_layers; ++layer) {
      unsigned char* base = cache + layer * p.layer_stride_bytes;
      for (int k = 1; k <= n; ++k)
        std::memcpy(&stage[k * row_bytes], base + src[k] * row_bytes, row_bytes);
      for (int k = 1; k <= n; ++k)
        std::memcpy(base + dst[k] * row_bytes, &stage[k * row_bytes], row_bytes);
    }
  }
  return Status::Ok();
}

}  // namespace specdec::ops
