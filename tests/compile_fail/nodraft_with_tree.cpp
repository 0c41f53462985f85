// Compile-fail check: NoDraft with a draft tree.
// expect-error: NoDraft verifies the root only
#include "specdec/policy/spec_policy.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::SpecPolicy<specdec::NoDraft, specdec::Layers<>, specdec::Chain<3>,
                                    specdec::Eager>;
#else
template struct specdec::SpecPolicy<specdec::NoDraft, specdec::Layers<>, specdec::NoTree,
                                    specdec::Eager>;
#endif
