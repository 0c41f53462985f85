// Compile-fail check: TreeShape with zero draft steps.
// expect-error: Steps must be >= 1
#include "specdec/policy/tree.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::TreeShape<4, 0, 5>;
#else
template struct specdec::TreeShape<4, 1, 5>;
#endif
