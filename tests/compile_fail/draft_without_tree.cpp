// Compile-fail check: A drafting strategy with NoTree.
// expect-error: needs a draft tree with Nodes >= 2
#include "specdec/policy/spec_policy.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
template struct specdec::SpecPolicy<specdec::NGram, specdec::Layers<>, specdec::NoTree,
                                    specdec::Eager>;
#else
template struct specdec::SpecPolicy<specdec::NGram, specdec::Layers<>, specdec::Chain<3>,
                                    specdec::Eager>;
#endif
