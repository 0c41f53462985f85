// Compile-fail check: TreeShape above kMaxTreeNodes.
// expect-error: Nodes must be <= kMaxTreeNodes
#include "specdec/policy/tree.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::TreeShape<1, 1024, 1025>;
#else
template struct specdec::TreeShape<1, 1023, 1024>;
#endif
