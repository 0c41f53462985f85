// Compile-fail check: An EAGLE-3 layer set under Eagle (EAGLE-1/2): DESIGN.md failure 1.
// expect-error: only Eagle3 reads a layer set
#include "specdec/policy/spec_policy.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::SpecPolicy<specdec::Eagle, specdec::KimiK25Layers, specdec::Chain<3>,
                                    specdec::Eager>;
#else
template struct specdec::SpecPolicy<specdec::Eagle, specdec::Layers<>, specdec::Chain<3>,
                                    specdec::Eager>;
#endif
