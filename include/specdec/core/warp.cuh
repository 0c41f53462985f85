// Warp-level operations shared by the kernels (all 32 lanes take part): reductions whose result
// every lane gets, the bf16 tensor-core MMA and its shared-memory fragment loads (ldmatrix), and
// the split of fp32 pairs into two bf16 pairs for MMAs at near-fp32 precision (sm_80 and later).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace specdec {

// Max of a 64-bit key over the warp (e.g. pack_value_index keys: a warp argmax).
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    uint64_t const other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over the warp, in the same butterfly order on every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of 64-bit integers over the warp (exact, so the same on every lane in any order).
__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// c += A [16 x 16] B [16 x 8], bf16 operands, fp32 accumulators (PTX fragment layout).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8 x 8 matrices of 16-bit values from shared memory: lane l gives the address of row l % 8
// of matrix l / 8 (16 contiguous, 16-byte aligned bytes); r[m] is matrix m's fragment (lane 4 g + q
// gets row g, values 2 q and 2 q + 1). With trans, each matrix is transposed first (lane 4 g + q
// gets rows 2 q and 2 q + 1 of column g): the B operand of mma_bf16_16816 from a row-major [k, n]
// tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], void const* row) {
  unsigned const a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], void const* row) {
  unsigned const a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// (a, b) as hi + lo, each a bf16 pair (a in the low half): hi = bf16(a, b) rounded to nearest,
// lo = bf16(a - hi.a, b - hi.b) (the differences are exact in fp32). hi + lo carries 16 bits of
// mantissa, so A B = Ah Bh + Ah Bl + Al Bh to within about 2^-16 of |A| |B| per product: three
// bf16 MMAs in place of an fp32 product.
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
  __nv_bfloat162 const h = __floats2bfloat162_rn(a, b);
  float2 const hf = __bfloat1622float2(h);
  __nv_bfloat162 const l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<uint32_t const*>(&h);
  lo = *reinterpret_cast<uint32_t const*>(&l);
}

// c += A B with both operands split (split_bf16x2): Ah Bh + Ah Bl + Al Bh, fragments as
// mma_bf16_16816's (a* [4], b* the two registers of one n-tile).
__device__ __forceinline__ void mma_bf16_16816_split(float (&c)[4], uint32_t const (&ahi)[4],
                                                     uint32_t const (&alo)[4], uint32_t bhi0,
                                                     uint32_t bhi1, uint32_t blo0, uint32_t blo1) {
  mma_bf16_16816(c, ahi[0], ahi[1], ahi[2], ahi[3], bhi0, bhi1);
  mma_bf16_16816(c, ahi[0], ahi[1], ahi[2], ahi[3], blo0, blo1);
  mma_bf16_16816(c, alo[0], alo[1], alo[2], alo[3], bhi0, bhi1);
}

}  // namespace specdec
