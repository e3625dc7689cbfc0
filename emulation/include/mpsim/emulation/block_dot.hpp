// One output of block_gemm's default model, host and device: the element
// products of each block along k summed exactly, the partial times both
// blocks' scales (exact), added to a binary32 accumulator that starts at +0
// with one rounding per block (round to odd in binary64, then to binary32:
// round_to_odd.hpp). Written once for block_gemm's CUDA kernel
// (gpu/src/block_gemm.cu); tests/emulation/test_block_formats.cpp proves it
// equal to block_gemm on the host.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

#include "mpsim/emulation/exact_add.hpp"
#include "mpsim/emulation/host_device.hpp"
#include "mpsim/emulation/round_to_odd.hpp"

namespace mpsim {

// a and b: one row of A and one of B^T, k elements each (element values, as
// BlockOperand keeps them); a_scales and b_scales: their blocks' scales along
// k (E8M0 or UE4M3 values; NaN for a NaN block). The binary64 sum of a
// block's products is exact only where the formats' products and the block
// length fit 53 bits (block_partials_fit_binary64, block_gemm.hpp): every
// preset but MXFP8 E5M2. NVFP4's alpha and C are the caller's.
MPSIM_HOST_DEVICE inline float block_scaled_dot(const float* a, const double* a_scales, const float* b,
                                                const double* b_scales, int k, int block) {
  float acc = 0.0f;
  for (int k0 = 0, kb = 0; k0 < k; k0 += block, ++kb) {
    const int end = k0 + block < k ? k0 + block : k;
    double partial = 0.0;
    for (int t = k0; t < end; ++t) partial += static_cast<double>(a[t]) * static_cast<double>(b[t]);
    // + 0.0: an all-zero partial is +0, as an accumulator starting from +0 makes it.
    const double term = (partial + 0.0) * a_scales[kb] * b_scales[kb];
    acc = static_cast<float>(add_round_to_odd(acc, term));
  }
  return acc;
}

// |x| / 2^min as an integer, x a nonzero finite multiple of 2^min whose
// quotient fits 64 bits (from the binary32 pattern: significand times a power of two).
MPSIM_HOST_DEVICE inline std::uint64_t integer_of(float x, int min) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
  const int biased = static_cast<int>(bits >> 23);
  const std::uint64_t significand = biased == 0 ? bits : (bits & 0x7FFFFFu) | 0x800000u;
  const int exponent = (biased == 0 ? 1 : biased) - 127 - 23 - min;  // x = significand * 2^(exponent + min)
  return exponent >= 0 ? significand << exponent : significand >> -exponent;
}

// The products a[t] b[t], t in [begin, end), added exactly: each element an
// integer times 2^min (smallest_exponent of its format), each product of the
// integers below 2^64 (checked by the caller), their sum a 128-bit
// two's-complement integer (hi, lo; two 64-bit words, written out so that host
// and device run the same integer code) times 2^(min_a + min_b). False when
// an element is NaN; `nonzero`: whether a product is nonzero.
MPSIM_HOST_DEVICE inline bool sum_products(const float* a, int min_a, const float* b, int min_b, int begin, int end,
                                           std::uint64_t& hi, std::uint64_t& lo, bool& nonzero) {
  hi = lo = 0;
  nonzero = false;
  for (int t = begin; t < end; ++t) {
    const float x = a[t], y = b[t];
    if (x != x || y != y) return false;
    if (x == 0.0f || y == 0.0f) continue;
    nonzero = true;
    const std::uint64_t p = integer_of(x, min_a) * integer_of(y, min_b);
    if ((x < 0.0f) == (y < 0.0f)) {
      const std::uint64_t sum = lo + p;
      hi += sum < p ? 1u : 0u;
      lo = sum;
    } else {
      hi -= lo < p ? 1u : 0u;
      lo -= p;
    }
  }
  return true;
}

// A two's-complement (hi, lo) made its magnitude; whether it was negative.
MPSIM_HOST_DEVICE inline bool to_magnitude(std::uint64_t& hi, std::uint64_t& lo) {
  const bool negative = (hi >> 63) != 0;
  if (negative) {
    lo = ~lo + 1;
    hi = ~hi + (lo == 0 ? 1u : 0u);
  }
  return negative;
}

// One output of block_gemm's per-tensor path (binary32 scales, one block
// spanning k, no tensor-core model), before its alpha: the exact sum of
// a_t b_t (sum_products) rounded once to binary32, to nearest even
// (add_exactly_to_binary32 from +0), +0 for an exact zero; NaN when an
// element is. Exact where per_tensor_sums_fit_int128 (block_gemm.hpp) says so,
// MXFP8 E5M2 included, whose sums block_scaled_dot's binary64 cannot hold.
MPSIM_HOST_DEVICE inline float per_tensor_exact_dot(const float* a, int min_a, const float* b, int min_b, int k) {
  std::uint64_t hi = 0, lo = 0;
  bool nonzero = false;
  if (!sum_products(a, min_a, b, min_b, 0, k, hi, lo, nonzero)) return std::numeric_limits<float>::quiet_NaN();
  if (hi == 0 && lo == 0) return 0.0f;
  const bool negative = to_magnitude(hi, lo);
  return add_exactly_to_binary32(0.0f, negative, hi, lo, min_a + min_b);
}

// block_scaled_dot where a block's sum can exceed binary64 (MXFP8 E5M2,
// block_partials_fit_int128 in block_gemm.hpp): each block's products summed
// exactly (sum_products), times both blocks' power-of-two (E8M0) scales, added
// to the binary32 accumulator with one rounding (add_exactly_to_binary32).
// block_gemm gives the same bits whichever of its two sums it takes for a
// block: its binary64 one where the block's actual values fit (exact, then
// rounded once through rounding to odd) and its 640-bit one where not. A block
// without a nonzero product adds +0 (so -0 becomes +0, as block_scaled_dot's
// partial + 0.0 does); a NaN element or scale makes the output NaN; an
// infinite accumulator stays.
MPSIM_HOST_DEVICE inline float block_scaled_dot_exact(const float* a, const double* a_scales, int min_a, const float* b,
                                                      const double* b_scales, int min_b, int k, int block) {
  const auto exponent_of = [](double power_of_two) {  // a normal binary64 power of two
    return static_cast<int>((std::bit_cast<std::uint64_t>(power_of_two) >> 52) & 0x7FF) - 1023;
  };
  float acc = 0.0f;
  for (int k0 = 0, kb = 0; k0 < k; k0 += block, ++kb) {
    const double sa = a_scales[kb], sb = b_scales[kb];
    std::uint64_t hi = 0, lo = 0;
    bool nonzero = false;
    if (sa != sa || sb != sb || !sum_products(a, min_a, b, min_b, k0, k0 + block < k ? k0 + block : k, hi, lo, nonzero))
      return std::numeric_limits<float>::quiet_NaN();
    if (!nonzero || (hi == 0 && lo == 0)) {  // acc + 0 exactly (-0 + +0 is +0)
      acc = acc + 0.0f;
      continue;
    }
    if ((std::bit_cast<std::uint32_t>(acc) & 0x7FFFFFFFu) == 0x7F800000u) continue;  // infinite: stays
    const bool negative = to_magnitude(hi, lo);
    acc = add_exactly_to_binary32(acc, negative, hi, lo, min_a + min_b + exponent_of(sa) + exponent_of(sb));
  }
  return acc;
}

}  // namespace mpsim
