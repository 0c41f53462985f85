// Compile-fail check: Layers with an id below kEmbedding (-1).
// expect-error: a layer id is below kEmbedding
#include "specdec/policy/layers.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::Layers<-2, 3, 31>;
#else
template struct specdec::Layers<specdec::kEmbedding, 3, 31>;
#endif
