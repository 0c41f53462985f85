// Compile-fail check: SpecPolicy whose first parameter is not a draft strategy tag.
// expect-error: the first parameter must be a draft strategy tag
#include "specdec/policy/spec_policy.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::SpecPolicy<int, specdec::KimiK25Layers, specdec::Chain<3>, specdec::Eager>;
#else
template struct specdec::SpecPolicy<specdec::Eagle3, specdec::KimiK25Layers, specdec::Chain<3>,
                                    specdec::Eager>;
#endif
