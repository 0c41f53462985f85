// Compile-fail check: A tag with no DraftTraits specialization (CUTLASS-style primary template).
// expect-error: no specialization of DraftTraits for this type
#include "specdec/policy/draft.hpp"

#if defined(SPECDEC_COMPILE_FAIL)
struct Medusa {
  static constexpr specdec::DraftKind kKind = specdec::DraftKind::kEagle;
};
static_assert(specdec::DraftTraits<Medusa>::kHasModel);
#else
static_assert(specdec::DraftTraits<specdec::NGram>::kKind == specdec::DraftKind::kNGram);
#endif
