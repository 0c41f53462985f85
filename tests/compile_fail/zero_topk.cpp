// Compile-fail check: TreeShape with top-k 0 that is not NoTree.
// expect-error: TopK must be >= 1
#include "specdec/policy/tree.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::TreeShape<0, 3, 4>;
#else
template struct specdec::TreeShape<0, 0, 1>;  // NoTree
#endif
