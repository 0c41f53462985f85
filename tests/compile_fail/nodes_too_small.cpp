// Compile-fail check: TreeShape with a single node that is not NoTree.
// expect-error: Nodes \(verified nodes, root included\) must be >= 2
#include "specdec/policy/tree.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::TreeShape<4, 1, 1>;
#else
template struct specdec::TreeShape<4, 1, 2>;
#endif
