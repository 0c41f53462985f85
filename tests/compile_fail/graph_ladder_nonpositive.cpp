// Compile-fail check: GraphLadder with a batch size of 0.
// expect-error: GraphLadder: batch sizes must be >= 1
#include "specdec/policy/graph.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::GraphLadder<0, 2>;
#else
template struct specdec::GraphLadder<1, 2>;
#endif
