// Internal: what the vector kernels receive. Everything that depends only on
// the format and the mode is worked out once per call, on the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpsim/emulation/quantize.hpp"

namespace mpsim::detail {

// Rounding a binary32 value into a format that fits in binary32, done on the
// binary32 bit pattern (see quantize_vector.cpp for the derivation).
struct Float32Kernel {
  RoundingMode mode;
  std::uint32_t base_shift;          // 23 - mantissa bits: the quantum within a binade
  std::uint32_t min_normal_exponent; // the format's emin as a biased binary32 exponent
  bool flush_to_zero;
  bool has_infinity;
  std::uint32_t smallest_normal;     // binary32 patterns of format values
  std::uint32_t smallest_subnormal;
  std::uint32_t largest_finite;
  std::uint32_t overflow_positive;   // what an overflow becomes, by sign, for this mode
  std::uint32_t overflow_negative;
  std::uint32_t nan_keep;            // NaN result = (input & nan_keep) | nan_set
  std::uint32_t nan_set;
  std::uint32_t random_mask;         // stochastic rounding: the draw bits that count
  DrawKey key;
};

Float32Kernel make_float32_kernel(const Format& format, const QuantizeOptions& options);

// Quantizes n elements; element i uses random index first_index + i.
QuantizeCounts quantize_float32_vector(const Float32Kernel& kernel, const float* in, float* out, std::size_t n,
                                       std::uint64_t first_index);
const char* float32_vector_target();

}  // namespace mpsim::detail
