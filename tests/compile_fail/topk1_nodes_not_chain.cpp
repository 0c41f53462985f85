// Compile-fail check: TopK 1 with Nodes != Steps + 1 (SGLang rewrote it: DESIGN.md failure 3).
// expect-error: with TopK 1 the tree is a chain: Nodes must be Steps \+ 1
#include "specdec/policy/tree.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::TreeShape<1, 3, 8>;
#else
template struct specdec::TreeShape<1, 3, 4>;
#endif
