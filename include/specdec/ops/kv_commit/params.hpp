// kv_commit parameters: move the KV entries of accepted tree nodes to contiguous slots.
//
// Convention: during tree verify, node i of request b wrote its entry at slot prefix_len[b] + i.
// For k = 1..num_accepted[b], kv_commit moves slot prefix_len[b] + accepted_path[b][k] to slot
// prefix_len[b] + k (k = 0, the root, is already in place), in every layer.
// An entry is W elements of elem_bytes (1, 2 or 4) bytes, copied as raw bytes.
// Layouts (per layer l, layer base = cache + l * layer_stride_bytes):
//   kContiguous  [B, max_seq, W]              slot s of request b is row b * max_seq + s
//   kPaged       [num_pages, page_size, W]    slot s of request b is row
//                page_table[b][s / page_size] * page_size + s % page_size
// Per-request errors (only detectable on device) go to status [B] (KvCommitError); a request with
// an error moves nothing, and nothing is ever written out of bounds.
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"

namespace specdec::ops {

enum class KvLayout : int32_t { kContiguous = 0, kPaged = 1 };

// Per-request result written to status [B]. When several apply, the largest code is reported.
enum KvCommitError : int32_t {
  kKvCommitOk = 0,
  kKvCommitBadPrefix = 1,    // prefix_len < 0 or its slot (the root) outside the request's capacity
  kKvCommitBadCount = 2,     // num_accepted outside [0, P-1]
  kKvCommitBadPathNode = 3,  // accepted_path[k] < 1 for some 1 <= k <= num_accepted
  kKvCommitSlotOutOfRange = 4,  // a source or destination slot >= max_seq (or page table capacity)
  kKvCommitBadPage = 5,         // a page table entry outside [0, num_pages)
};

inline const char* kv_commit_error_name(int32_t code) {
  switch (code) {
    case kKvCommitOk:
      return "ok";
    case kKvCommitBadPrefix:
      return "prefix_len negative or beyond the request's capacity";
    case kKvCommitBadCount:
      return "num_accepted outside [0, P-1]";
    case kKvCommitBadPathNode:
      return "accepted_path entry < 1 past the root";
    case kKvCommitSlotOutOfRange:
      return "slot beyond max_seq / page table capacity";
    case kKvCommitBadPage:
      return "page table entry outside [0, num_pages)";
  }
  return "unknown kv_commit error";
}

// The largest path capacity P supported (N <= 1024 nodes + 1); bounds the kernel's shared memory.
constexpr int kKvCommitMaxPath = 1025;

struct KvCommitParams {
  void* cache = nullptr;  // layer 0 base; [L][B, max_seq, W] or [L][num_pages, page_size, W]
  int64_t layer_stride_bytes = 0;  // bytes from layer l to layer l + 1
  int num_layers = 0;              // L
  int width = 0;                   // W elements per entry
  int elem_bytes = 0;              // 1, 2 or 4
  int batch = 0;                   // B
  KvLayout layout = KvLayout::kContiguous;
  int max_seq = 0;                      // contiguous: slots per request
  int32_t const* page_table = nullptr;  // paged: [B, max_pages_per_request] int32
  int max_pages_per_request = 0;        // paged
  int page_size = 0;                    // paged: slots per page
  int num_pages = 0;                    // paged: pages per layer
  int32_t const* prefix_len = nullptr;  // [B] int32, committed tokens before this step's root
  Acceptance acceptance;                // read: accepted_path [B, P], num_accepted [B], P
  int32_t* seq_len_out = nullptr;       // [B] int32 or nullptr: prefix_len + num_accepted + 1
                                        // (-1 for a request with an error)
  int32_t* status = nullptr;            // [B] int32, written: KvCommitError per request
};

SPECDEC_HD inline int64_t kv_commit_row_bytes(KvCommitParams const& p) {
  return static_cast<int64_t>(p.width) * p.elem_bytes;
}

// Row (within a layer) of slot `slot` of request b, or -KvCommitError when it has none.
SPECDEC_HD inline int64_t kv_commit_slot_row(KvCommitParams const& p, int b, int64_t slot) {
  if (p.layout == KvLayout::kContiguous) {
    if (slot < 0 || slot >= p.max_seq) return -kKvCommitSlotOutOfRange;
    return static_cast<int64_t>(b) * p.max_seq + slot;
  }
  int64_t const page_index = slot / p.page_size;
  if (slot < 0 || page_index >= p.max_pages_per_request) return -kKvCommitSlotOutOfRange;
  int32_t const page = p.page_table[static_cast<int64_t>(b) * p.max_pages_per_request + page_index];
  if (page < 0 || page >= p.num_pages) return -kKvCommitBadPage;
  return static_cast<int64_t>(page) * p.page_size + slot % p.page_size;
}

// Request-level checks (prefix, count); kKvCommitOk when the per-move checks may proceed.
SPECDEC_HD inline int32_t kv_commit_check_request(KvCommitParams const& p, int b) {
  int32_t const prefix = p.prefix_len[b], n = p.acceptance.num_accepted[b];
  if (prefix < 0 || kv_commit_slot_row(p, b, prefix) < 0) return kKvCommitBadPrefix;
  if (n < 0 || n > p.acceptance.path_capacity - 1) return kKvCommitBadCount;
  return kKvCommitOk;
}

// Checks move k (1 <= k <= num_accepted) of request b; on success sets its source and
// destination rows.
SPECDEC_HD inline int32_t kv_commit_check_move(KvCommitParams const& p, int b, int k,
                                               int64_t& src_row, int64_t& dst_row) {
  int32_t const node =
      p.acceptance.accepted_path[static_cast<int64_t>(b) * p.acceptance.path_capacity + k];
  if (node < 1) return kKvCommitBadPathNode;
  int64_t const prefix = p.prefix_len[b];
  src_row = kv_commit_slot_row(p, b, prefix + node);
  dst_row = kv_commit_slot_row(p, b, prefix + k);
  int64_t const worst = src_row < dst_row ? src_row : dst_row;
  return worst < 0 ? static_cast<int32_t>(-worst) : kKvCommitOk;
}

inline Status validate(KvCommitParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("kv_commit: " + m); };
  if (!p.cache) return bad("cache is null: pass the layer-0 base of the KV cache");
  if (p.num_layers < 1) return bad("num_layers " + std::to_string(p.num_layers) + " < 1");
  if (p.width < 1) return bad("width " + std::to_string(p.width) + " < 1");
  if (p.elem_bytes != 1 && p.elem_bytes != 2 && p.elem_bytes != 4) {
    return bad("elem_bytes " + std::to_string(p.elem_bytes) + " not 1, 2 or 4");
  }
  if (p.batch < 1) return bad("batch " + std::to_string(p.batch) + " < 1");
  int64_t rows_per_layer = 0;
  if (p.layout == KvLayout::kContiguous) {
    if (p.max_seq < 1) return bad("max_seq " + std::to_string(p.max_seq) + " < 1");
    rows_per_layer = static_cast<int64_t>(p.batch) * p.max_seq;
  } else if (p.layout == KvLayout::kPaged) {
    if (!p.page_table) return bad("page_table is null: a paged layout needs [B, max_pages] pages");
    if (p.max_pages_per_request < 1) {
      return bad("max_pages_per_request " + std::to_string(p.max_pages_per_request) + " < 1");
    }
    if (p.page_size < 1) return bad("page_size " + std::to_string(p.page_size) + " < 1");
    if (p.num_pages < 1) return bad("num_pages " + std::to_string(p.num_pages) + " < 1");
    rows_per_layer = static_cast<int64_t>(p.num_pages) * p.page_size;
  } else {
    return bad("layout " + std::to_string(static_cast<int>(p.layout)) +
               " is not kContiguous or kPaged");
  }
  if (p.num_layers > 1 && p.layer_stride_bytes < rows_per_layer * kv_commit_row_bytes(p)) {
    return bad("layer_stride_bytes " + std::to_string(p.layer_stride_bytes) + " < one layer (" +
               std::to_string(rows_per_layer * kv_commit_row_bytes(p)) +
               " bytes): layers would overlap");
  }
  if (p.acceptance.path_capacity < 1 || p.acceptance.path_capacity > kKvCommitMaxPath) {
    return bad("path capacity P " + std::to_string(p.acceptance.path_capacity) + " outside [1, " +
               std::to_string(kKvCommitMaxPath) + "]");
  }
  if (!p.prefix_len) return bad("prefix_len is null: pass the [B] committed lengths");
  if (!p.acceptance.accepted_path)
    return bad("acceptance.accepted_path is null: pass [B, P] paths");
  if (!p.acceptance.num_accepted) return bad("acceptance.num_accepted is null: pass [B] counts");
  if (!p.status) return bad("status is null: pass an int32 buffer [B] for per-request errors");
  return Status::Ok();
}

}  // namespace specdec::ops
