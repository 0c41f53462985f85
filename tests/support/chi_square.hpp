// Test support: chi-square goodness of fit (the statistic and its upper-tail p-value), for the
// statistical tests that prove sampling lossless.
//   chi2(counts [C], probs [C]) -> {statistic, degrees of freedom}
//   chi2_pvalue(statistic, dof) -> P(X >= statistic) for X ~ chi-square(dof)
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace specdec::testing {

// Upper tail of the chi-square distribution: Q(dof/2, x/2), regularised incomplete gamma
// (series for x < a + 1, continued fraction otherwise; Numerical Recipes 6.2).
inline double chi2_pvalue(double x, int dof) {
  double const a = 0.5 * dof, z = 0.5 * x;
  if (z <= 0) return 1.0;
  double const lg = std::lgamma(a);
  if (z < a + 1) {
    double sum = 1.0 / a, term = sum;
    for (int n = 1; n < 1000; ++n) {
      term *= z / (a + n);
      sum += term;
      if (term < sum * 1e-15) break;
    }
    return 1.0 - sum * std::exp(-z + a * std::log(z) - lg);
  }
  double b = z + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    double const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    double const del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(-z + a * std::log(z) - lg) * h;
}

// Chi-square statistic of counts against probabilities (cells with p = 0 must be empty: any count
// there makes the statistic infinite). Returns {statistic, dof}.
inline std::pair<double, int> chi2(std::vector<int64_t> const& counts,
                                   std::vector<double> const& probs) {
  int64_t total = 0;
  for (auto c : counts) total += c;
  double stat = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    double const e = probs[i] * total;
    if (e <= 0) {
      if (counts[i] > 0) return {INFINITY, 1};
      continue;
    }
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  return {stat, cells - 1};
}

}  // namespace specdec::testing
