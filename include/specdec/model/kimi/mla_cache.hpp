// MlaCache: the paged MLA latent KV cache (fp32) of the Kimi forwards: pages of page_size token
// slots handed to requests from a free list, per-request page tables, lengths, truncation and
// release. The entries live on the host (create: the CPU executor, model/kimi/forward_cpu.hpp) or
// in memory the caller owns (create_external: the CUDA executor's device buffer,
// model/kimi/forward_cuda.cuh); the bookkeeping is the same host object either way.
//
// Entry (one token, one layer): W = kv_lora_rank + qk_rope_head_dim floats
//   [ c_kv (kv_lora_rank values, AFTER kv_a_layernorm) | k_pe (qk_rope_head_dim values, RoPE'd at
//     the token's position) ]            Kimi-K2.5: 512 + 64 = 576 floats = 2304 bytes
// Storage: ONE float buffer [L][num_pages, page_size, W]:
//   layer l starts at data() + l * layer_stride(), layer_stride() = num_pages * page_size * W
//   slot s of a request lies in row page_table[s / page_size] * page_size + s % page_size of
//   every layer, i.e. at layer(l) + row * W.
// This is exactly ops/kv_commit's KvLayout::kPaged with elem_bytes 4, width W, layer_stride_bytes
// 4 * layer_stride(), page table [B, max_pages_per_request] int32 (unused entries -1):
// kv_commit_params() fills a KvCommitParams for a batch of requests, so kv_commit can move a tree
// verify's accepted entries (slot length + path[k]) to contiguous slots (length + k).
//
// Per request (RequestId, chosen by the caller):
//   length  committed tokens: slots [0, length) hold the request's prefix
//   staged  slots [length, length + staged) hold entries written past the length (a tree
//           verify's N nodes, node i at slot length + i) that commit() may adopt
//   pages   page table: capacity = pages * page_size slots; at most max_pages_per_request
// Operations: add_request, reserve (pages for slots [0, n), all-or-nothing over a batch), append
// (length += n), stage, commit (length over staged slots), truncate (length back, whole pages past
// it returned to the free list), free_request (every page back), padding_page (one page kept for
// the filler rows of padded forwards). Pages are taken from the free list lowest page first, so
// requests that grow in turn interleave their pages.
// Every error (unknown or duplicate request, out of pages, a page table past
// max_pages_per_request, a slot or length beyond what the request holds) is a Status naming the
// request and the numbers; a failed call changes nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/ops/kv_commit/params.hpp"

namespace specdec::model::kimi {

using RequestId = int64_t;

class MlaCache {
 public:
  // A cache of num_pages pages of page_size slots for num_layers layers of entries
  // [kv_lora_rank | rope_dim]; a request may hold at most max_pages_per_request pages.
  static Status create(int num_layers, int kv_lora_rank, int rope_dim, int page_size, int num_pages,
                       int max_pages_per_request, MlaCache* out) {
    return create_impl(num_layers, kv_lora_rank, rope_dim, page_size, num_pages,
                       max_pages_per_request, /*host=*/true, out);
  }
 private:
  static Status create_impl(int num_layers, int kv_lora_rank, int rope_dim, int page_size,
                            int num_pages, int max_pages_per_request, bool host, MlaCache* out) {
    auto bad = [](std::string m) { return Status::InvalidArgument("MlaCache::create: " + m); };
    if (out == nullptr) return bad("out is null");
    if (num_layers < 1) return bad("num_layers " + std::to_string(num_layers) + " < 1");
    if (kv_lora_rank < 1) return bad("kv_lora_rank " + std::to_string(kv_lora_rank) + " < 1");
    if (rope_dim < 2 || rope_dim % 2 != 0) {
      return bad("rope_dim " + std::to_string(rope_dim) + " must be even and >= 2");
    }
    if (page_size < 1) return bad("page_size " + std::to_string(page_size) + " < 1");
    if (num_pages < 1) return bad("num_pages " + std::to_string(num_pages) + " < 1");
    if (max_pages_per_request < 1 || max_pages_per_request > num_pages) {
      return bad("max_pages_per_request " + std::to_string(max_pages_per_request) +
                 " not in [1, num_pages " + std::to_string(num_pages) + "]");
    }
    int64_t const width = int64_t{kv_lora_rank} + rope_dim;
    int64_t const stride = int64_t{num_pages} * page_size * width;
    if (stride > (int64_t{1} << 40) / num_layers) {
      return bad(std::to_string(num_layers) + " layers x " + std::to_string(num_pages) +
                 " pages x " + std::to_string(page_size) + " slots x " + std::to_string(width) +
                 " floats is beyond 2^40 floats");
    }
    try {
      MlaCache c;
      c.num_layers_ = num_layers;
      c.kv_lora_rank_ = kv_lora_rank;
      c.rope_dim_ = rope_dim;
      c.page_size_ = page_size;
      c.num_pages_ = num_pages;
      c.max_pages_per_request_ = max_pages_per_request;
      c.layer_stride_ = stride;
      if (host) c.data_.assign(static_cast<size_t>(stride * num_layers), 0.0f);
      c.free_.reserve(static_cast<size_t>(num_pages));
      for (int p = num_pages - 1; p >= 0; --p) c.free_.push_back(p);  // pop_back gives page 0
      *out = std::move(c);
    } catch (std::exception const& e) {
      return Status::Internal("MlaCache::create: allocating " +
                              std::to_string(stride * num_layers * 4) + " bytes: " + e.what());
    }
    return Status::Ok();
  }

 public:
  // The same bookkeeping over entries the caller owns (e.g. device memory): `entries` must hold
  // floats_needed(...) floats and outlive the cache (and its copies, which share it); nothing is
  // allocated for the entries.
  static Status create_external(float* entries, int64_t entries_floats, int num_layers,
                                int kv_lora_rank, int rope_dim, int page_size, int num_pages,
                                int max_pages_per_request, MlaCache* out) {
    if (entries == nullptr) return Status::InvalidArgument("MlaCache::create_external: entries is null");
    int64_t const need = floats_needed(num_layers, kv_lora_rank, rope_dim, page_size, num_pages);
    if (entries_floats < need) {
      return Status::InvalidArgument("MlaCache::create_external: " + std::to_string(entries_floats) +
                                     " floats given, the geometry needs " + std::to_string(need));
    }
    SPECDEC_RETURN_IF_ERROR(create_impl(num_layers, kv_lora_rank, rope_dim, page_size, num_pages,
                                        max_pages_per_request, /*host=*/false, out));
    out->external_ = entries;
    return Status::Ok();
  }
  static int64_t floats_needed(int num_layers, int kv_lora_rank, int rope_dim, int page_size,
                               int num_pages) {
    return int64_t{num_layers} * num_pages * page_size * (int64_t{kv_lora_rank} + rope_dim);
  }

  // The cache for `config`'s model: num_hidden_layers layers, entries kv_lora_rank +
  // qk_rope_head_dim wide.
  static Status create_for(io::DeepseekV3Config const& config, int page_size, int num_pages,
                           int max_pages_per_request, MlaCache* out) {
    return create(config.num_hidden_layers, config.kv_lora_rank, config.qk_rope_head_dim, page_size,
                  num_pages, max_pages_per_request, out);
  }

  int num_layers() const { return num_layers_; }
  int kv_lora_rank() const { return kv_lora_rank_; }
  int rope_dim() const { return rope_dim_; }
  int width() const { return kv_lora_rank_ + rope_dim_; }  // W floats per entry
  int page_size() const { return page_size_; }
  int num_pages() const { return num_pages_; }
  int max_pages_per_request() const { return max_pages_per_request_; }
  int free_pages() const { return static_cast<int>(free_.size()); }
  int64_t layer_stride() const { return layer_stride_; }  // floats from layer l to l + 1
  // Layer l's entries [num_pages * page_size, W] (device memory for an external cache).
  float* layer(int l) { return entries() + l * layer_stride_; }
  float const* layer(int l) const { return entries() + l * layer_stride_; }
  float* entries() { return external_ ? external_ : data_.data(); }
  float const* entries() const { return external_ ? external_ : data_.data(); }
  bool external() const { return external_ != nullptr; }

  bool has_request(RequestId id) const { return requests_.count(id) != 0; }
  int num_requests() const { return static_cast<int>(requests_.size()); }

  // Registers request `id` with length 0 and no pages.
  Status add_request(RequestId id) {
    if (has_request(id)) {
      return Status::InvalidArgument("MlaCache: request " + std::to_string(id) +
                                     " already exists (free it first)");
    }
    requests_[id];
    return Status::Ok();
  }

  // The page that the filler rows of a padded forward write and read (model/kimi/forward_cuda.cuh:
  // a decode or verify batch padded to its graph ladder's size). The first call takes the lowest
  // free page for good; later calls return the same page. No request ever holds it, and it counts
  // as used in free_pages(). Out of pages: an error, and nothing changes.
  Status padding_page(int32_t* out) {
    if (padding_page_ < 0) {
      if (free_.empty()) {
        return Status::InvalidArgument(
            "MlaCache: out of pages: a padded forward needs one page for its filler rows, and " +
            std::string("all ") + std::to_string(num_pages_) +
            " are held: free finished requests or create the cache with more pages");
      }
      padding_page_ = free_.back();
      free_.pop_back();
    }
    *out = padding_page_;
    return Status::Ok();
  }

  // Returns every page of `id` to the free list and forgets the request.
  Status free_request(RequestId id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return unknown(id, "free_request");
    for (auto p = it->second.pages.rbegin(); p != it->second.pages.rend(); ++p) free_.push_back(*p);
    requests_.erase(it);
    sort_free();
    return Status::Ok();
  }

  Status length(RequestId id, int64_t* out) const {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "length", &r));
    *out = r->length;
    return Status::Ok();
  }
  Status staged(RequestId id, int64_t* out) const {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "staged", &r));
    *out = r->staged;
    return Status::Ok();
  }
  // The request's page table (valid until its next reserve / truncate / free).
  Status pages(RequestId id, std::span<int32_t const>* out) const {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "pages", &r));
    *out = r->pages;
    return Status::Ok();
  }

  // Row (within a layer) of slot `slot` of `id`; the slot must lie in the request's pages.
  Status row(RequestId id, int64_t slot, int64_t* out) const {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "row", &r));
    int64_t const capacity = static_cast<int64_t>(r->pages.size()) * page_size_;
    if (slot < 0 || slot >= capacity) {
      return Status::InvalidArgument("MlaCache: slot " + std::to_string(slot) + " of request " +
                                     std::to_string(id) + " is beyond its " +
                                     std::to_string(r->pages.size()) + " page(s) (" +
                                     std::to_string(capacity) + " slots): reserve it first");
    }
    *out =
        int64_t{r->pages[static_cast<size_t>(slot / page_size_)]} * page_size_ + slot % page_size_;
    return Status::Ok();
  }

  // All or nothing: afterwards request ids[b] holds pages for slots [0, slots[b]). Fails, changing
  // nothing, on an unknown or repeated id, a request past max_pages_per_request, or too few free
  // pages for the whole batch.
  Status reserve(std::span<RequestId const> ids, std::span<int64_t const> slots) {
    if (ids.size() != slots.size()) {
      return Status::InvalidArgument("MlaCache::reserve: " + std::to_string(ids.size()) +
                                     " requests but " + std::to_string(slots.size()) +
                                     " slot counts");
    }
    int64_t total = 0;
    std::vector<int64_t> more(ids.size(), 0);
    for (size_t b = 0; b < ids.size(); ++b) {
      Request const* r = nullptr;
      SPECDEC_RETURN_IF_ERROR(find(ids[b], "reserve", &r));
      for (size_t k = 0; k < b; ++k) {
        if (ids[k] == ids[b]) {
          return Status::InvalidArgument("MlaCache::reserve: request " + std::to_string(ids[b]) +
                                         " listed twice (entries " + std::to_string(k) + " and " +
                                         std::to_string(b) + ")");
        }
      }
      if (slots[b] < 0) {
        return Status::InvalidArgument("MlaCache::reserve: request " + std::to_string(ids[b]) +
                                       ": slots " + std::to_string(slots[b]) + " < 0");
      }
      int64_t const need = (slots[b] + page_size_ - 1) / page_size_;
      if (need > max_pages_per_request_) {
        return Status::InvalidArgument(
            "MlaCache: request " + std::to_string(ids[b]) + " needs " + std::to_string(slots[b]) +
            " slots = " + std::to_string(need) + " pages of " + std::to_string(page_size_) +
            ", beyond max_pages_per_request " + std::to_string(max_pages_per_request_) + " (" +
            std::to_string(int64_t{max_pages_per_request_} * page_size_) + " slots)");
      }
      more[b] = std::max<int64_t>(0, need - static_cast<int64_t>(r->pages.size()));
      total += more[b];
    }
    if (total > free_pages()) {
      std::string who;
      for (size_t b = 0; b < ids.size(); ++b) {
        if (more[b] == 0) continue;
        who += (who.empty() ? "" : ", ") + std::string("request ") + std::to_string(ids[b]) + " " +
               std::to_string(more[b]) + " for " + std::to_string(slots[b]) + " slots";
      }
      return Status::InvalidArgument(
          "MlaCache: out of pages: " + std::to_string(total) + " more page(s) of " +
          std::to_string(page_size_) + " slots needed (" + who + "), " +
          std::to_string(free_pages()) + " of " + std::to_string(num_pages_) +
          " free: free finished requests or create the cache with more "
          "pages");
    }
    for (size_t b = 0; b < ids.size(); ++b) {
      Request& r = requests_.at(ids[b]);
      for (int64_t k = 0; k < more[b]; ++k) {
        r.pages.push_back(free_.back());
        free_.pop_back();
      }
    }
    return Status::Ok();
  }
  Status reserve(RequestId id, int64_t slots) {
    return reserve(std::span<RequestId const>(&id, 1), std::span<int64_t const>(&slots, 1));
  }

  // length += count (pages reserved as needed); the caller writes (or has written) the entries of
  // slots [old length, old length + count). Drops staged slots.
  Status append(RequestId id, int64_t count) {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "append", &r));
    if (count < 0) {
      return Status::InvalidArgument("MlaCache::append: request " + std::to_string(id) +
                                     ": count " + std::to_string(count) + " < 0");
    }
    SPECDEC_RETURN_IF_ERROR(reserve(id, r->length + count));
    Request& w = requests_.at(id);
    w.length += count;
    w.staged = 0;
    return Status::Ok();
  }

  // Records that slots [length, length + count) hold entries written past the length (a tree
  // verify's nodes); they must lie in the request's pages. The length does not move.
  Status stage(RequestId id, int64_t count) {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "stage", &r));
    int64_t const capacity = static_cast<int64_t>(r->pages.size()) * page_size_;
    if (count < 0 || r->length + count > capacity) {
      return Status::InvalidArgument("MlaCache::stage: request " + std::to_string(id) +
                                     ": slots [" + std::to_string(r->length) + ", " +
                                     std::to_string(r->length + count) + ") not within its " +
                                     std::to_string(capacity) + " reserved slots");
    }
    requests_.at(id).staged = count;
    return Status::Ok();
  }

  // Advances the length to new_length over staged slots (after kv_commit moved a verify's accepted
  // entries to slots length, length + 1, ...: new_length = its seq_len_out). Drops the rest of the
  // staged slots.
  Status commit(RequestId id, int64_t new_length) {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "commit", &r));
    if (new_length < r->length || new_length > r->length + r->staged) {
      return Status::InvalidArgument("MlaCache::commit: request " + std::to_string(id) +
                                     ": new length " + std::to_string(new_length) +
                                     " not in [length " + std::to_string(r->length) +
                                     ", length + staged " + std::to_string(r->length + r->staged) +
                                     "]: only slots a verify wrote can be committed");
    }
    Request& w = requests_.at(id);
    w.length = new_length;
    w.staged = 0;
    return Status::Ok();
  }

  // Shortens the request to new_length <= length (rejected speculative tokens), drops staged
  // slots and returns the pages past ceil(new_length / page_size) to the free list.
  Status truncate(RequestId id, int64_t new_length) {
    Request const* r = nullptr;
    SPECDEC_RETURN_IF_ERROR(find(id, "truncate", &r));
    if (new_length < 0 || new_length > r->length) {
      return Status::InvalidArgument("MlaCache::truncate: request " + std::to_string(id) +
                                     ": new length " + std::to_string(new_length) +
                                     " not in [0, length " + std::to_string(r->length) + "]");
    }
    Request& w = requests_.at(id);
    size_t const keep = static_cast<size_t>((new_length + page_size_ - 1) / page_size_);
    while (w.pages.size() > keep) {
      free_.push_back(w.pages.back());
      w.pages.pop_back();
    }
    sort_free();
    w.length = new_length;
    w.staged = 0;
    return Status::Ok();
  }

  // ops::kv_commit parameters over requests ids [B] (kPaged, this cache's layout; prefix_len =
  // each request's length). *page_table [B, max_pages_per_request] and *prefix_len [B] are the
  // storage p points into. The caller sets p->acceptance, p->status and p->seq_len_out.
  Status kv_commit_params(std::span<RequestId const> ids, std::vector<int32_t>* page_table,
                          std::vector<int32_t>* prefix_len, ops::KvCommitParams* p) {
    if (page_table == nullptr || prefix_len == nullptr || p == nullptr) {
      return Status::InvalidArgument("MlaCache::kv_commit_params: a null output");
    }
    if (ids.empty()) return Status::InvalidArgument("MlaCache::kv_commit_params: no requests");
    std::vector<int32_t> table(ids.size() * static_cast<size_t>(max_pages_per_request_), -1);
    std::vector<int32_t> lengths(ids.size());
    for (size_t b = 0; b < ids.size(); ++b) {
      Request const* r = nullptr;
      SPECDEC_RETURN_IF_ERROR(find(ids[b], "kv_commit_params", &r));
      std::copy(r->pages.begin(), r->pages.end(),
                table.begin() + static_cast<int64_t>(b) * max_pages_per_request_);
      lengths[b] = static_cast<int32_t>(r->length);
    }
    *page_table = std::move(table);
    *prefix_len = std::move(lengths);
    *p = ops::KvCommitParams{};
    p->cache = entries();
    p->layer_stride_bytes = layer_stride_ * static_cast<int64_t>(sizeof(float));
    p->num_layers = num_layers_;
    p->width = width();
    p->elem_bytes = static_cast<int>(sizeof(float));
    p->batch = static_cast<int>(ids.size());
    p->layout = ops::KvLayout::kPaged;
    p->page_table = page_table->data();
    p->max_pages_per_request = max_pages_per_request_;
    p->page_size = page_size_;
    p->num_pages = num_pages_;
    p->prefix_len = prefix_len->data();
    return Status::Ok();
  }

 private:
  struct Request {
    int64_t length = 0;
    int64_t staged = 0;
    std::vector<int32_t> pages;
  };

  static Status unknown(RequestId id, char const* what) {
    return Status::InvalidArgument("MlaCache::" + std::string(what) + ": unknown request " +
                                   std::to_string(id) + " (add_request it first)");
  }
  Status find(RequestId id, char const* what, Request const** out) const {
    auto it = requests_.find(id);
    if (it == requests_.end()) return unknown(id, what);
    *out = &it->second;
    return Status::Ok();
  }
  // Keeps the free list so that pop_back returns the lowest free page.
  void sort_free() { std::sort(free_.begin(), free_.end(), std::greater<int32_t>()); }

  int num_layers_ = 0;
  int kv_lora_rank_ = 0;
  int rope_dim_ = 0;
  int page_size_ = 0;
  int num_pages_ = 0;
  int max_pages_per_request_ = 0;
  int64_t layer_stride_ = 0;
  std::vector<float> data_;    // [L][num_pages, page_size, W] (host entries)
  float* external_ = nullptr;  // the caller's entries (create_external), shared by copies
  std::vector<int32_t> free_;  // free pages, decreasing (pop_back = lowest)
  int32_t padding_page_ = -1;  // padding_page(), once taken
  std::map<RequestId, Request> requests_;
};

}  // namespace specdec::model::kimi
