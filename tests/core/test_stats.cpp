// The exponent histogram against an independent classification (std::frexp
// and std::fpclassify), on values from every binade and class.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "mpsim/core/stats.hpp"

using namespace mpsim::core;

TEST_CASE("exponent histogram bins every binary32 class and binade", "[stats]") {
  std::mt19937_64 rng(42);
  std::vector<float> values;
  for (int e = -149; e <= 127; ++e)
    for (int k = 0; k < 3; ++k) {
      // A value in [2^e, 2^(e+1)): 2^e times a significand in [1, 2) (subnormal binades hold fewer values).
      const float v = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, e);
      values.push_back(std::isfinite(v) ? v : std::ldexp(1.0f, e));
      values.push_back(-values.back());
    }
  for (int k = 0; k < 5; ++k) values.push_back(0.0f), values.push_back(-0.0f);
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  values.push_back(std::numeric_limits<float>::denorm_min());

  TensorStats stats;
  const auto classes = stats.add_values(values);
  std::array<std::uint64_t, Binades::bin_count> expected{};
  std::uint64_t subnormal = 0, below = 0, nonzero = 0;
  for (const float v : values) {
    switch (std::fpclassify(v)) {
      case FP_ZERO: ++expected[Binades::zero_bin]; continue;
      case FP_INFINITE: ++expected[Binades::infinity_bin]; ++nonzero; continue;
      case FP_NAN: ++expected[Binades::nan_bin]; ++nonzero; continue;
      case FP_SUBNORMAL: ++subnormal; break;
      default: break;
    }
    int exponent;
    std::frexp(static_cast<double>(v), &exponent);  // v = m * 2^exponent, m in [0.5, 1)
    ++expected[Binades::bin_of_exponent(exponent - 1)];
    ++nonzero;
    below += std::fabs(v) < std::ldexp(1.0, -24);
  }
  CHECK(stats.histogram == expected);
  CHECK(stats[Counter::elements] == values.size());
  CHECK(stats[Counter::nonzero] == nonzero);
  CHECK(stats[Counter::below_2_24] == below);
  CHECK(classes.subnormal == subnormal);
  CHECK(classes.infinite == 2);
  CHECK(classes.nan == 1);

  // Adding twice doubles every count.
  TensorStats twice = stats;
  twice.add_values(values);
  for (int b = 0; b < Binades::bin_count; ++b) CHECK(twice.histogram[b] == 2 * expected[b]);
}
