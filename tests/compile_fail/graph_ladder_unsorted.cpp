// Compile-fail check: GraphLadder whose batch sizes are not strictly increasing.
// expect-error: batch sizes must be strictly increasing
#include "specdec/policy/graph.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::GraphLadder<1, 4, 2>;
#else
template struct specdec::GraphLadder<1, 2, 4>;
#endif
