// Internal: an exact sum of binary32 products, for the exact accumulation
// model (accumulation.cpp) and the block GEMM's partials too wide for binary64
// (block_gemm.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

#include "exact.hpp"

namespace mpsim::detail {

// A two's-complement fixed-point number with unit 2^-320 and 640 bits: every
// product of two binary32 values (down to 2^-298) and every binary32 value
// lands on it exactly, and sums of up to 2^60 products below 2^256 fit.
class ExactAccumulator {
 public:
  static constexpr int kUnit = -320;
  static constexpr int kLimbs = 10;

  void add(bool negative, std::uint64_t significand, int lsb) {
    const int offset = lsb - kUnit;
    const u128 v = static_cast<u128>(significand) << (offset & 63);
    const std::uint64_t part[2] = {static_cast<std::uint64_t>(v), static_cast<std::uint64_t>(v >> 64)};
    int limb = offset >> 6;
    bool carry = false;
    for (int j = 0; limb < kLimbs && (j < 2 || carry); ++j, ++limb) {
      const std::uint64_t x = j < 2 ? part[j] : 0, old = limbs_[limb];
      if (!negative) {
        const std::uint64_t s = old + x;
        const std::uint64_t t = s + (carry ? 1 : 0);
        carry = s < old || t < s;
        limbs_[limb] = t;
      } else {
        const std::uint64_t s = old - x;
        const std::uint64_t t = s - (carry ? 1 : 0);
        carry = old < x || s < (carry ? 1u : 0u);
        limbs_[limb] = t;
      }
    }
  }

  bool is_zero() const {
    return std::all_of(limbs_.begin(), limbs_.end(), [](std::uint64_t x) { return x == 0; });
  }

  // The value, with 128 significant bits and a sticky bit for the rest.
  Exact value() const {
    std::array<std::uint64_t, kLimbs> mag = limbs_;
    const bool negative = (mag[kLimbs - 1] >> 63) != 0;
    if (negative) {  // two's complement negation
      bool carry = true;
      for (auto& x : mag) {
        x = ~x + (carry ? 1 : 0);
        carry = carry && x == 0;
      }
    }
    int top = -1;
    for (int j = kLimbs - 1; j >= 0 && top < 0; --j)
      if (mag[j] != 0) top = 64 * j + 63 - std::countl_zero(mag[j]);
    const int shift = std::max(0, top - 127);
    auto bits64 = [&](int pos) {  // 64 bits of mag starting at bit pos (pos >= 0)
      const int j = pos >> 6, r = pos & 63;
      std::uint64_t x = j < kLimbs ? mag[j] >> r : 0;
      if (r != 0 && j + 1 < kLimbs) x |= mag[j + 1] << (64 - r);
      return x;
    };
    const u128 significand = (static_cast<u128>(bits64(shift + 64)) << 64) | bits64(shift);
    bool sticky = false;
    for (int j = 0; j < kLimbs && 64 * j < shift; ++j) {
      const int below = std::min(64, shift - 64 * j);
      const std::uint64_t mask = below == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << below) - 1;
      sticky = sticky || (mag[j] & mask) != 0;
    }
    return {negative, shift + kUnit, significand, sticky};
  }

 private:
  std::array<std::uint64_t, kLimbs> limbs_{};
};

}  // namespace mpsim::detail
