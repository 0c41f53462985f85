// Compile-fail check: A PolicyList naming one bundle twice (dispatch would be ambiguous).
// expect-error: PolicyList: a bundle is listed twice
#include "specdec/core/dispatch.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
static_assert(specdec::PolicyList<specdec::KimiK25NoDraft<specdec::Eager>,
                                  specdec::KimiK25NoDraft<specdec::Eager>>::kSize == 2);
#else
static_assert(specdec::PolicyList<specdec::KimiK25NoDraft<specdec::Eager>>::kSize == 1);
#endif
