// Compile-fail check: Layers listing a residual stream twice.
// expect-error: a layer id is listed twice
#include "specdec/policy/layers.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::Layers<1, 29, 1>;
#else
template struct specdec::Layers<1, 29, 57>;
#endif
