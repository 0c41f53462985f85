// Test support: doctest checks that a Status has the expected code and that its message names
// every expected part (substrings).
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "specdec/core/status.hpp"

namespace specdec::testing {

inline bool contains(std::string const& s, std::string const& part) {
  return s.find(part) != std::string::npos;
}

inline void check_error(Status const& s, StatusCode code, std::vector<std::string> const& parts) {
  CHECK_MESSAGE(s.code() == code, s.to_string());
  for (auto const& p : parts) {
    CHECK_MESSAGE(contains(s.message(), p), "want '", p, "' in: ", s.message());
  }
}

}  // namespace specdec::testing
