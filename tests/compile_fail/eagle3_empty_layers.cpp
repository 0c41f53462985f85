// Compile-fail check: Eagle3 without a layer set.
// expect-error: Eagle3 needs a non-empty layer set
#include "specdec/policy/spec_policy.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::SpecPolicy<specdec::Eagle3, specdec::Layers<>, specdec::Chain<3>,
                                    specdec::Eager>;
#else
template struct specdec::SpecPolicy<specdec::Eagle3, specdec::KimiK25Layers, specdec::Chain<3>,
                                    specdec::Eager>;
#endif
