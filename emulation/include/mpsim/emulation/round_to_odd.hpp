// x + y rounded to odd in binary64, host and device: the intermediate that
// makes a second rounding correct. Rounding the exact x + y to odd at 53 bits
// and then to any format of at most 51 bits of precision gives the correctly
// rounded sum (Boldo and Melquiond, "Emulation of FMA and correctly rounded
// sums: proved algorithms using rounding to odd", IEEE TC 57(4), 2008).
#pragma once

#include <bit>
#include <cstdint>

#include "mpsim/emulation/host_device.hpp"

namespace mpsim {

// TwoSum (Knuth) gives s = RN(x + y) and its exact error; the round-to-odd
// sum is s when s is exact or odd (its last significand bit set), or inf/NaN
// when s is; when s is inexact and even, its neighbour toward the error is
// odd. On the pattern: "toward the error" is one more in the magnitude when
// the error has s's sign (s != 0 here: a sum that small is exact).
MPSIM_HOST_DEVICE inline double add_round_to_odd(double x, double y) {
  const double s = x + y;
  const double bb = s - x;
  const double err = (x - (s - bb)) + (y - bb);
  const auto bits = std::bit_cast<std::uint64_t>(s);
  constexpr std::uint64_t exponent_mask = 0x7FF0000000000000ull, sign_bit = 0x8000000000000000ull;
  if (err == 0.0 || (bits & exponent_mask) == exponent_mask) return s;  // exact, or inf / NaN
  if ((bits & 1u) != 0) return s;
  const bool away = (err > 0.0) == ((bits & sign_bit) == 0);
  return std::bit_cast<double>(away ? bits + 1 : bits - 1);
}

}  // namespace mpsim
