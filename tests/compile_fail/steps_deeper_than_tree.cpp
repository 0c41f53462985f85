// Compile-fail check: TreeShape with more draft steps than a tree of Nodes nodes can be deep.
// expect-error: Steps > Nodes - 1
#include "specdec/policy/tree.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::TreeShape<4, 5, 4>;
#else
template struct specdec::TreeShape<4, 3, 4>;
#endif
