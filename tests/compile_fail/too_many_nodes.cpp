// Compile-fail check: Nodes - 1 above TopK + (Steps-1)*TopK^2 candidates (2 + 2*4 = 10 < 11).
// expect-error: Nodes - 1 exceeds the TopK
#include "specdec/policy/tree.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::TreeShape<2, 3, 12>;
#else
template struct specdec::TreeShape<2, 3, 11>;
#endif
