// Compile-fail check: describe<P>() is constrained by the SpecPolicyBundle concept.
// expect-error: SpecPolicyBundle
#include <string>

#include "specdec/core/dispatch.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
std::string const name = specdec::describe<specdec::TreeShape<4, 3, 8>>();
#else
std::string const name = specdec::describe<specdec::KimiK25NoDraft<specdec::Eager>>();
#endif
