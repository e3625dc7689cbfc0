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

// The index one past the highest set bit of x (0 for 0), from 32-bit
// countl_zero, which the device kernels of block_scaling.hpp already use.
MPSIM_HOST_DEVICE inline int bit_width_64(std::uint64_t x) {
  const auto high = static_cast<std::uint32_t>(x >> 32), low = static_cast<std::uint32_t>(x);
  return high != 0 ? 64 - std::countl_zero(high) : 32 - std::countl_zero(low);
}

// One output of block_gemm's per-tensor path (binary32 scales, one block
// spanning k, no tensor-core model), before its alpha: the exact sum of
// a_t b_t rounded once to binary32, to nearest even, +0 for an exact zero;
// NaN when an element is. Every element is an integer times 2^min_a (2^min_b:
// smallest_exponent of its format), so the sum is an integer in a 128-bit
// two's-complement fixed-point accumulator (two 64-bit words, written out so
// that host and device run the same integer code) times 2^(min_a + min_b):
// exact where per_tensor_sums_fit_int128 (block_gemm.hpp) says so, MXFP8 E5M2
// included, whose sums block_scaled_dot's binary64 cannot hold.
MPSIM_HOST_DEVICE inline float per_tensor_exact_dot(const float* a, int min_a, const float* b, int min_b, int k) {
  std::uint64_t hi = 0, lo = 0;  // the sum, two's complement
  for (int t = 0; t < k; ++t) {
    const float x = a[t], y = b[t];
    if (x != x || y != y) return std::numeric_limits<float>::quiet_NaN();
    if (x == 0.0f || y == 0.0f) continue;
    const std::uint64_t p = integer_of(x, min_a) * integer_of(y, min_b);  // < 2^64: checked by the caller
    if ((x < 0.0f) == (y < 0.0f)) {
      const std::uint64_t sum = lo + p;
      hi += sum < p ? 1u : 0u;
      lo = sum;
    } else {
      hi -= lo < p ? 1u : 0u;
      lo -= p;
    }
  }
  if (hi == 0 && lo == 0) return 0.0f;
  const bool negative = (hi >> 63) != 0;
  if (negative) {  // the magnitude
    lo = ~lo + 1;
    hi = ~hi + (lo == 0 ? 1u : 0u);
  }
  const int width = hi != 0 ? 64 + bit_width_64(hi) : bit_width_64(lo);
  const auto bit = [&](int i) -> std::uint64_t { return i >= 64 ? (hi >> (i - 64)) & 1u : (lo >> i) & 1u; };
  const auto any_below = [&](int i) {  // any of bits 0 .. i-1 set
    if (i <= 0) return false;
    if (i < 64) return (lo & ((std::uint64_t{1} << i) - 1)) != 0;
    return lo != 0 || (i > 64 && (hi & ((std::uint64_t{1} << (i - 64)) - 1)) != 0);
  };
  // The top 24 bits, rounded to nearest even on the bits below.
  const int shift = width > 24 ? width - 24 : 0;
  std::uint64_t top = 0;
  if (shift == 0) top = lo;
  else if (shift >= 64) top = hi >> (shift - 64);
  else top = (lo >> shift) | (hi << (64 - shift));
  auto significand = static_cast<std::uint32_t>(top);
  if (shift > 0 && bit(shift - 1) != 0 && (any_below(shift - 1) || (significand & 1u) != 0)) ++significand;
  // significand (at most 2^24, exact in binary32) times 2^e: one exact multiplication while the result is
  // normal, which per_tensor_sums_fit_int128 guarantees (-126 <= e, e + 25 <= 127).
  const int e = shift + min_a + min_b;
  const float value = static_cast<float>(significand) * std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
  return negative ? -value : value;
}

// block_scaled_dot where a block's sum can exceed binary64 (MXFP8 E5M2,
// block_partials_fit_int128 in block_gemm.hpp): each block's products summed
// exactly as 128-bit integers (as per_tensor_exact_dot), times both blocks'
// power-of-two (E8M0) scales, added to the binary32 accumulator with one
// rounding (add_exactly_to_binary32). block_gemm gives the same bits whichever
// of its two sums it takes for a block: its binary64 one where the block's
// actual values fit (exact, then rounded once through rounding to odd) and its
// 640-bit one where not. A block without a nonzero product adds +0 (so -0
// becomes +0, as block_scaled_dot's partial + 0.0 does); a NaN element or
// scale makes the output NaN; an infinite accumulator stays.
MPSIM_HOST_DEVICE inline float block_scaled_dot_exact(const float* a, const double* a_scales, int min_a, const float* b,
                                                      const double* b_scales, int min_b, int k, int block) {
  const auto exponent_of = [](double power_of_two) {  // a normal binary64 power of two
    return static_cast<int>((std::bit_cast<std::uint64_t>(power_of_two) >> 52) & 0x7FF) - 1023;
  };
  float acc = 0.0f;
  for (int k0 = 0, kb = 0; k0 < k; k0 += block, ++kb) {
    const double sa = a_scales[kb], sb = b_scales[kb];
    if (sa != sa || sb != sb) return std::numeric_limits<float>::quiet_NaN();
    const int end = k0 + block < k ? k0 + block : k;
    std::uint64_t hi = 0, lo = 0;  // the block's sum, two's complement
    bool nonzero = false;
    for (int t = k0; t < end; ++t) {
      const float x = a[t], y = b[t];
      if (x != x || y != y) return std::numeric_limits<float>::quiet_NaN();
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
    if (!nonzero || (hi == 0 && lo == 0)) {  // acc + 0 exactly (-0 + +0 is +0)
      acc = acc + 0.0f;
      continue;
    }
    if ((std::bit_cast<std::uint32_t>(acc) & 0x7FFFFFFFu) == 0x7F800000u) continue;  // infinite: stays
    const bool negative = (hi >> 63) != 0;
    if (negative) {
      lo = ~lo + 1;
      hi = ~hi + (lo == 0 ? 1u : 0u);
    }
    acc = add_exactly_to_binary32(acc, negative, hi, lo, min_a + min_b + exponent_of(sa) + exponent_of(sb));
  }
  return acc;
}

}  // namespace mpsim
