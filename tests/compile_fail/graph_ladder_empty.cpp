// Compile-fail check: GraphLadder<> (no capture is Eager).
// expect-error: GraphLadder: needs at least one batch size
#include "specdec/policy/graph.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::GraphLadder<>;
#else
template struct specdec::GraphLadder<1>;
#endif
