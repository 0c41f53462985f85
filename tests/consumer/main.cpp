// Uses the installed specdec headers: draws from the Philox stream and checks a Status.
#include <specdec/core/philox.hpp>
#include <specdec/core/status.hpp>

#include <cstdio>

int main() {
  float const u = specdec::philox_uniform(42, 0, 0, 0, 0);
  specdec::Status const status = specdec::Status::InvalidArgument("consumer check");
  if (!(u >= 0.0f && u < 1.0f) || status.ok()) return 1;
  std::printf("specdec consumer: u=%f status='%s'\n", u, status.to_string().c_str());
  return 0;
}
