// moe_experts parameters: the routed experts of a DeepseekV3 / Kimi-K2.5 MoE layer (SwiGLU), for
// T tokens each routed to top_k experts by ops::moe_route.
//
//   x        [T, H] float   the tokens (post_attention_layernorm'd), row stride H
//   ids      [T, K] int32   expert of each (token, slot), as moe_route writes them
//   weights  [T, K] float   routing weight of each (token, slot)
//   y        [T, H] float   y[t] = m[t] (accumulate false: overwritten) or y[t] += m[t] (true: a
//                           float add of the rounded m[t], e.g. straight into the residual), with
//     m[t] = sum_{k < K} weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t),  e = ids[t, k]
//   addend   [T, H] float   optional (nullptr: none): then one more float add after that,
//                           y[t] = (m[t] or y[t] + m[t]) + addend[t] (e.g. the shared experts'
//                           output, computed beside the routed ones)
//   x_bf16   [T, H] bf16    optional: bf16(x), round to nearest even (e.g. the norm's bf16 copy
//                           of x); the CUDA INT4 path reads it instead of converting x itself
//   silu(v) = v / (1 + exp(-v)); gate_e, up_e [I, H], down_e [H, I] (H = hidden, I =
//   moe_intermediate_size). An id may repeat within a token (each slot counts).
//
// Expert weights are per-expert POINTER TABLES (E entries each; for the CUDA executor the tables
// and every matrix they point to are device memory), in one of two formats:
//   bf16 (w.int4 false):  gate, up [E] -> [I, H], down [E] -> [H, I]; bf16 bits, row-major
//                         [out, in].
//   INT4 (w.int4 true):   compressed-tensors pack-quantized, io/compressed_tensors.hpp's rule:
//                         gate_packed, up_packed [E] -> int32 [I, H/8], gate_scale, up_scale
//                         [E] -> bf16 [I, H/G]; down_packed [E] -> [H, I/8], down_scale [E] ->
//                         [H, I/G]; W[n, k] = (nibble(n, k) - 8) * scale[n, k/G], nibble k of a
//                         row in bits 4(k%8).. of word k/8, least significant first.
//                         The CUDA executor reads the packed words in the TILED order below
//                         (moe_experts_tile_int4 converts; the scales stay row-major); the CPU
//                         reference reads them row-major.
//
// The tiled order of an INT4 packed matrix [rows, cols/8] (rows a multiple of 16, cols of 32):
// a row is P = cols/32 pieces of 128 bits (32 nibbles); rows go in bands of 16 and a band in
// chunks of 4 pieces (128 columns; the last chunk of a row holds w = min(4, P - 4c) pieces); a
// chunk stores its 16 rows' pieces row by row, each in w slots of 128 bits: row r's slot s of
// chunk c is tiled piece
//   (r / 16) * 16 P + c * 64 + (r % 16) * w + s,
// so a band keeps its place and the 32 lanes of a warp that read 16-byte slots of rows g, g + 8
// (lane = 4 g + q, slot q) read 512 contiguous bytes of DRAM per instruction, where the
// row-major order has them read 8 separate 64-byte pieces. In a full chunk (w = 4) the row's 16
// words are transposed 4 x 4: word j of slot s holds the chunk's columns 32 j + 8 s .. + 7, so
// the 4 lanes of a quad, which feed one mma, hold 32 columns of one 32-column block between them
// in each word j (with Kimi's group of 32, one scale group). A partial last chunk keeps a piece
// per slot (word j of slot s: columns 32 s + 8 j ..). Within each packed word the
// 8 nibbles are reordered too (moe_int4_pair_nibbles): nibble i holds column 2i and nibble i + 4
// column 2i + 1 (i < 4), so the kernel's pairs of nibbles (i, i + 4) are the column pairs
// (2i, 2i + 1), as the token operand's bf16 pairs lie in memory.
//
// Contract (validate(), one for both executors; the last items are the kernel's):
//   tokens >= 0, experts in [1, kMoeExpertsMaxExperts] (the grouping kernel counts experts in
//   shared memory), top_k >= 1, tokens * top_k <= 2^31 - 1, hidden and inter >= 1;
//   bf16: hidden and inter multiples of 8 (the kernel's 128-bit loads hold 8 bf16);
//   INT4: group_size G >= 1 dividing hidden and inter, G % 8 == 0 (a packed word never
//   straddles two groups; hence 8 | hidden, inter as the packing needs), hidden and inter
//   multiples of 32 (a 128-bit load holds 32 nibbles);
//   every pointer and table non-null when tokens > 0.
// The CPU reference refuses an id outside [0, E) (naming token, slot and id). The CUDA kernels
// cannot report without a host sync: they SKIP such an assignment (it contributes 0 to y) and
// never read out of bounds.
// CUDA only (validate_cuda()): a workspace of moe_experts_workspace_bytes(T, K, E, H, I) bytes,
// 16-byte aligned, no initial contents needed; x and y 16-byte aligned; every matrix a table
// points to 16-byte aligned (the kernels read weights with 128-bit loads; cudaMalloc gives 256,
// and tensors packed into one arena keep it when each starts at a multiple of 16 bytes). The
// workspace holds: offsets int32 [E + 1], active int32 [min(E, T*K)], sorted int32 [T*K],
// h float [T*K, I], out float [T*K, H], xb bf16 [T, H] (layout below).
// Numerics: the CUDA INT4 path multiplies on tensor cores with bf16 operands, x and h rounded to
// bf16, fp32 sums. A matrix with moe_int4_scales_after_mma (Kimi's: groups of 32, 128-column
// chunks only) multiplies the exact nibbles n - 8 and scales each group's fp32 sum, so its
// weights are exact; any other has each dequantised weight (n - 8) * scale rounded to bf16, as a
// bf16 GEMM over the dequantised weights does. The CPU path and the CUDA bf16 path multiply the
// exact values in float / double.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"

namespace specdec::ops {

constexpr int kMoeExpertsMaxExperts = 1024;

struct MoeExpertWeights {
  bool int4 = false;
  int group_size = 0;                           // G (INT4 only)
  uint16_t const* const* gate = nullptr;        // bf16: [E] -> [I, H] bf16 bits
  uint16_t const* const* up = nullptr;          // bf16: [E] -> [I, H]
  uint16_t const* const* down = nullptr;        // bf16: [E] -> [H, I]
  int32_t const* const* gate_packed = nullptr;  // INT4: [E] -> int32 [I, H/8]
  uint16_t const* const* gate_scale = nullptr;  // INT4: [E] -> bf16 bits [I, H/G]
  int32_t const* const* up_packed = nullptr;    // INT4: [E] -> int32 [I, H/8]
  uint16_t const* const* up_scale = nullptr;    // INT4: [E] -> bf16 bits [I, H/G]
  int32_t const* const* down_packed = nullptr;  // INT4: [E] -> int32 [H, I/8]
  uint16_t const* const* down_scale = nullptr;  // INT4: [E] -> bf16 bits [H, I/G]
};

// ---- The INT4 packed matrices' tiled order (above) ----
constexpr int kMoeInt4BandRows = 16;     // rows of a band
constexpr int kMoeInt4ChunkPieces = 4;   // 128-bit pieces of a chunk (128 columns)

// Pieces per row of chunk c in a row of `pieces` pieces: 4, or fewer for the last chunk.
SPECDEC_HD inline int moe_int4_chunk_width(int64_t pieces, int64_t c) {
  int64_t const left = pieces - c * kMoeInt4ChunkPieces;  // pieces from chunk c to the row's end
  return static_cast<int>(left < kMoeInt4ChunkPieces ? left : kMoeInt4ChunkPieces);
}

// The tiled position of packed word k (columns 8 k .. 8 k + 7) of row r, in 32-bit words.
SPECDEC_HD inline int64_t moe_int4_tiled_word(int64_t cols, int64_t r, int64_t k) {
  int64_t const pieces = cols / 32, p = k / 4, c = p / kMoeInt4ChunkPieces;
  int64_t const w = moe_int4_chunk_width(pieces, c);
  int64_t const block = p % kMoeInt4ChunkPieces, j = k % 4;  // 32-column block, word in it
  bool const full = w == kMoeInt4ChunkPieces;
  int64_t const slot = full ? j : block;
  int64_t const piece = (r / kMoeInt4BandRows) * kMoeInt4BandRows * pieces +
                        c * (kMoeInt4BandRows * kMoeInt4ChunkPieces) +
                        (r % kMoeInt4BandRows) * w + slot;
  return piece * 4 + (full ? block : j);
}

// Whether the CUDA kernels multiply a matrix of `cols` reduction columns with the group scales
// applied to the mma's fp32 sums (exact weights): each mma's 16 columns in one group needs
// groups of 32 and full chunks only.
SPECDEC_HD inline bool moe_int4_scales_after_mma(int64_t cols, int64_t group) {
  return group == 32 && cols % (32 * kMoeInt4ChunkPieces) == 0;
}

// A packed word in the tiled order's nibble order: nibble i <- column 2i, nibble i + 4 <- column
// 2i + 1 (i < 4); the columns' nibbles k sit at bits 4k of `word`.
SPECDEC_HD inline uint32_t moe_int4_pair_nibbles(uint32_t word) {
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    out |= ((word >> (8 * i)) & 0xFu) << (4 * i);
    out |= ((word >> (8 * i + 4)) & 0xFu) << (4 * i + 16);
  }
  return out;
}

// The shape contract of the tiled order and of its conversion (src and dst distinct buffers).
inline Status validate_int4_tiling(int32_t const* src, int32_t* dst, int64_t rows, int64_t cols) {
  auto bad = [](std::string m) { return Status::InvalidArgument("moe_experts_tile_int4: " + m); };
  if (rows < 0 || rows % kMoeInt4BandRows != 0 || cols < 0 || cols % 32 != 0) {
    return bad("an INT4 matrix of " + std::to_string(rows) + " x " + std::to_string(cols) +
               " has no tiled order: rows must be a multiple of 16 and columns of 32 (as the "
               "experts' hidden and inter are)");
  }
  if (rows * cols == 0) return Status::Ok();
  if (!src || !dst) return bad(std::string(!src ? "src" : "dst") + " is null");
  auto const s = reinterpret_cast<uintptr_t>(src), d = reinterpret_cast<uintptr_t>(dst);
  auto const bytes = static_cast<uintptr_t>(rows * (cols / 8)) * sizeof(int32_t);
  if (s < d + bytes && d < s + bytes) {
    return bad("src and dst overlap: the conversion is out of place");
  }
  return Status::Ok();
}

struct MoeExpertsParams {
  float const* x = nullptr;        // [T, H] float
  int32_t const* ids = nullptr;    // [T, K] int32
  float const* weights = nullptr;  // [T, K] float
  int tokens = 0;                  // T
  int hidden = 0;                  // H
  int inter = 0;                   // I (moe_intermediate_size)
  int experts = 0;                 // E (n_routed_experts)
  int top_k = 1;                   // K (num_experts_per_tok)
  MoeExpertWeights w;              // expert weight tables
  float* y = nullptr;              // [T, H] float, written or added to
  bool accumulate = false;         // y += the experts' sum instead of y =
  float const* addend = nullptr;   // [T, H] float added to y after the sum, or nullptr
  // CUDA only: a cudaEvent_t recorded where addend is complete on another stream (nullptr: it is
  // complete in stream order); the stream waits for it right before the last kernel, which reads
  // addend (with no tokens, at once), so the other stream's work overlaps the rest.
  void* addend_ready = nullptr;
  uint16_t const* x_bf16 = nullptr;  // [T, H] bf16(x), or nullptr (the INT4 path converts x)
  void* workspace = nullptr;       // CUDA only: moe_experts_workspace_bytes(T, K, E, H, I) bytes,
  size_t workspace_bytes = 0;      //   16-byte aligned (no initial contents needed)
};

// ---- The CUDA path's workspace ----
// Byte offsets of its sections, each 256-byte aligned:
//   offsets [E + 1] int32       expert e's assignments are sorted[offsets[e] .. offsets[e+1])
//   active  [min(E, T*K)] int32 the experts with >= 1 assignment, increasing; -1 after them
//   sorted  [T*K] int32         assignment indices a = t*K + k grouped by expert, stable in a
//                               (assignments with an id outside [0, E) are left out)
//   h       [T*K, I] float      silu(gate x) * up x of the assignment at each sorted position
//                               (INT4: bf16 [T*K, I])
//   out     [T*K, H] float      down h of each assignment a (by a, not by sorted position)
//   xb      [T, H] bf16         bf16(x), the INT4 path's tensor-core operand, where x_bf16 is
//                               not given
struct MoeExpertsWorkspaceLayout {
  size_t offsets = 0, active = 0, sorted = 0, h = 0, out = 0, xb = 0;
  size_t bytes = 0;  // total
};

inline MoeExpertsWorkspaceLayout moe_experts_workspace_layout(int tokens, int top_k, int experts,
                                                              int hidden, int inter) {
  auto const up = [](size_t b) { return (b + 255) / 256 * 256; };
  auto const nn = [](int v) { return static_cast<size_t>(std::max(v, 0)); };
  size_t const n = nn(tokens) * nn(top_k), e = nn(experts);
  MoeExpertsWorkspaceLayout l;
  size_t at = 0;
  l.offsets = at;
  at += up((e + 1) * sizeof(int32_t));
  l.active = at;
  at += up(std::min(e, n) * sizeof(int32_t));
  l.sorted = at;
  at += up(n * sizeof(int32_t));
  l.h = at;
  at += up(n * nn(inter) * sizeof(float));
  l.out = at;
  at += up(n * nn(hidden) * sizeof(float));
  l.xb = at;
  at += up(nn(tokens) * nn(hidden) * sizeof(uint16_t));
  l.bytes = at;
  return l;
}

// Bytes of CUDA workspace for T tokens, top_k K, E experts, hidden H, moe_intermediate_size I.
inline size_t moe_experts_workspace_bytes(int tokens, int top_k, int experts, int hidden,
                                          int inter) {
  return moe_experts_workspace_layout(tokens, top_k, experts, hidden, inter).bytes;
}

// The shape and pointer contract (both executors).
inline Status validate(MoeExpertsParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("moe_experts: " + m); };
  auto s = [](int64_t v) { return std::to_string(v); };
  if (p.tokens < 0) return bad("tokens " + s(p.tokens) + " < 0");
  if (p.experts < 1) return bad("experts " + s(p.experts) + " < 1");
  if (p.experts > kMoeExpertsMaxExperts) {
    return bad("experts " + s(p.experts) + " > " + s(kMoeExpertsMaxExperts) +
               " (the grouping kernel's shared-memory counters)");
  }
  if (p.top_k < 1) return bad("top_k " + s(p.top_k) + " < 1");
  if (static_cast<int64_t>(p.tokens) * p.top_k > int64_t{INT32_MAX}) {
    return bad("tokens * top_k = " + s(static_cast<int64_t>(p.tokens) * p.top_k) +
               " assignments > 2^31 - 1");
  }
  if (p.hidden < 1) return bad("hidden " + s(p.hidden) + " < 1");
  if (p.inter < 1) return bad("inter " + s(p.inter) + " < 1");
  MoeExpertWeights const& w = p.w;
  if (!w.int4) {
    if (p.hidden % 8 != 0 || p.inter % 8 != 0) {
      return bad("bf16 experts need hidden and inter multiples of 8 (128-bit loads of 8 bf16), "
                 "got hidden " + s(p.hidden) + ", inter " + s(p.inter));
    }
  } else {
    int const G = w.group_size;
    if (G < 1) return bad("INT4 group_size " + s(G) + " < 1");
    if (p.hidden % G != 0 || p.inter % G != 0) {
      return bad("INT4 group_size " + s(G) + " does not divide hidden " + s(p.hidden) +
                 " and inter " + s(p.inter));
    }
    if (G % 8 != 0) {
      return bad("INT4 group_size " + s(G) +
                 " is not a multiple of 8 (a packed int32 of 8 nibbles must lie in one group)");
    }
    if (p.hidden % 32 != 0 || p.inter % 32 != 0) {
      return bad("INT4 experts need hidden and inter multiples of 32 (the kernel's 128-bit loads "
                 "of 32 nibbles), got hidden " + s(p.hidden) + ", inter " + s(p.inter));
    }
  }
  if (p.tokens == 0) return Status::Ok();
  if (!p.x) return bad("x is null: pass [T, H] = [" + s(p.tokens) + ", " + s(p.hidden) + "] floats");
  if (!p.ids || !p.weights) {
    return bad(std::string(!p.ids ? "ids" : "weights") + " is null: pass [T, K] = [" +
               s(p.tokens) + ", " + s(p.top_k) + "] (moe_route's outputs)");
  }
  if (!p.y) return bad("y is null: pass [T, H] = [" + s(p.tokens) + ", " + s(p.hidden) + "] floats");
  struct Table {
    void const* ptr;
    char const* name;
  };
  Table const bf16_tables[] = {{w.gate, "w.gate"}, {w.up, "w.up"}, {w.down, "w.down"}};
  Table const int4_tables[] = {{w.gate_packed, "w.gate_packed"}, {w.gate_scale, "w.gate_scale"},
                               {w.up_packed, "w.up_packed"},     {w.up_scale, "w.up_scale"},
                               {w.down_packed, "w.down_packed"}, {w.down_scale, "w.down_scale"}};
  if (!w.int4) {
    for (Table const& t : bf16_tables) {
      if (!t.ptr) return bad(std::string(t.name) + " is null: pass a table of " + s(p.experts) +
                             " bf16 expert matrices (w.int4 is false)");
    }
  } else {
    for (Table const& t : int4_tables) {
      if (!t.ptr) return bad(std::string(t.name) + " is null: pass a table of " + s(p.experts) +
                             " INT4 expert tensors (w.int4 is true)");
    }
  }
  return Status::Ok();
}

// The CUDA path's extra requirements: the workspace and 16-byte alignment of x and y (the
// alignment of the weight matrices lives in device tables and is the caller's to keep).
inline Status validate_cuda(MoeExpertsParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("moe_experts: " + m); };
  if (p.tokens == 0) return Status::Ok();
  size_t const need =
      moe_experts_workspace_bytes(p.tokens, p.top_k, p.experts, p.hidden, p.inter);
  if (!p.workspace || p.workspace_bytes < need) {
    return bad("workspace of " + std::to_string(p.workspace ? p.workspace_bytes : 0) +
               " bytes < " + std::to_string(need) +
               " needed: allocate moe_experts_workspace_bytes(tokens, top_k, experts, hidden, "
               "inter)");
  }
  auto misaligned = [](void const* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(p.workspace)) return bad("workspace is not 16-byte aligned");
  if (misaligned(p.x)) return bad("x is not 16-byte aligned (the kernels read it as float4)");
  if (misaligned(p.y)) return bad("y is not 16-byte aligned (the kernels write it as float4)");
  if (misaligned(p.addend)) return bad("addend is not 16-byte aligned (read as float4)");
  if (misaligned(p.x_bf16)) return bad("x_bf16 is not 16-byte aligned (read 8 values at a time)");
  return Status::Ok();
}

}  // namespace specdec::ops
