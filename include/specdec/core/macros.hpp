// Portability macros shared by host-only and CUDA translation units.
// SPECDEC_HD marks functions usable from both host and device code (plain inline on the host
// compiler), so one definition of the arithmetic serves the CPU reference and the kernel.
#pragma once

#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__
#define SPECDEC_DEVICE __device__
#else
#define SPECDEC_HD
#define SPECDEC_DEVICE
#endif

#define SPECDEC_INLINE inline

// Loop unrolling hint for code shared by host and device (no pragma warning on the host compiler).
#if defined(__CUDACC__)
#define SPECDEC_UNROLL _Pragma("unroll")
#else
#define SPECDEC_UNROLL
#endif
