// Compile-fail check: A PolicyList entry that is not a bundle.
// expect-error: PolicyList: every entry must be a SpecPolicy
#include "specdec/core/dispatch.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
static_assert(specdec::PolicyList<specdec::KimiK25NoDraft<specdec::Eager>, int>::kSize == 2);
#else
static_assert(specdec::PolicyList<specdec::KimiK25NoDraft<specdec::Eager>>::kSize == 1);
#endif
