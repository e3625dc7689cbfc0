// Low-precision storage on the device: a value of a format of at most 16
// bits, held in the format's own encoding (sign, exponent field, trailing
// significand, as emulation/format.hpp lays it out) in 1 or 2 bytes instead
// of a binary32. For binary16, bfloat16, e4m3 and e5m2 these are exactly the
// bits of CUDA's __half, __nv_bfloat16, __nv_fp8_e4m3 and __nv_fp8_e5m2, so
// cuBLAS reads binary16 and bfloat16 tensors as they are stored.
//
// The codec only moves bits: rounding happens once, before, in the rounding
// kernel (device_rounding.hpp). encode takes a value of the format (what
// round_float returns) and decode gives that same binary32 pattern back, NaN
// payloads included; tests/gpu/test_device_storage.cpp proves both on the
// host against the emulator's encodings, exhaustively per format. Integer
// arithmetic only, so no FPU setting can change a result.
#pragma once

#include <cstdint>

#include "mpsim/gpu/device_rounding.hpp"

namespace mpsim::gpu {

// Bytes per element of a format's device storage: 1 or 2 for formats of at
// most 8 or 16 bits, 4 (binary32 patterns, no codec) otherwise.
MPSIM_HOST_DEVICE inline int storage_bytes(const DeviceFormat& f) {
  const int bits = 1 + f.exponent_bits + f.mantissa_bits;
  return bits <= 8 ? 1 : bits <= 16 ? 2 : 4;
}

namespace detail {

MPSIM_HOST_DEVICE inline int leading_bit(std::uint32_t x) {  // x != 0
#ifdef __CUDA_ARCH__
  return 31 - __clz(x);
#else
  return 31 - __builtin_clz(x);
#endif
}

}  // namespace detail

// The encoding of x, a value of format f (storage_bytes(f) < 4). A NaN
// becomes a quiet NaN of x's sign with x's leading payload bits (the single
// NaN pattern of a format without infinities), as round_float makes them.
MPSIM_HOST_DEVICE inline std::uint32_t encode_storage(float x, const DeviceFormat& f) {
  using namespace detail;
  const std::uint32_t bits = bits_of(x);
  const std::uint32_t a = bits & ~sign_bit;
  const int field_bits = f.exponent_bits + f.mantissa_bits;
  const std::uint32_t sign = (bits >> 31) << field_bits;
  const std::uint32_t exponent_ones = ((std::uint32_t{1} << f.exponent_bits) - 1) << f.mantissa_bits;
  if (a >= infinity_bits) {
    // An infinity cannot be a value here, nor a NaN of a format with no NaN (round_float makes it +largest).
    if (!f.has_infinity) return sign | ((std::uint32_t{1} << field_bits) - 1);
    return sign | exponent_ones | ((a & ((std::uint32_t{1} << trailing_bits) - 1)) >> f.shift);
  }
  if (a == 0) return sign;
  const std::uint32_t exponent = a >> trailing_bits;
  if (a >= f.smallest_normal) {
    // Binary32's biased exponent minus the format's: 127 - bias = min_normal_exponent - 1.
    const std::uint32_t field = exponent - (f.min_normal_exponent - 1);
    return sign | (field << f.mantissa_bits) | ((a & ((std::uint32_t{1} << trailing_bits) - 1)) >> f.shift);
  }
  // A subnormal of the format: |x| = M * 2^(eff - 150) = k * 2^(emin - m), so
  // k = M >> (emin - m - eff + 150) = M >> (min_normal_exponent - eff + shift).
  const std::uint32_t eff = exponent > 1 ? exponent : 1;
  const std::uint32_t significand = a - ((eff - 1) << trailing_bits);
  const std::uint32_t count = f.min_normal_exponent - eff + f.shift;  // < 24 for a value of f
  return sign | (count < 32 ? significand >> count : 0u);  // not f's value: a code that decodes to another value
}

// The binary32 pattern of an encoding of f, as a float. A flush-to-zero
// format reads its subnormal encodings as zero (format.hpp's DAZ).
MPSIM_HOST_DEVICE inline float decode_storage(std::uint32_t code, const DeviceFormat& f) {
  using namespace detail;
  const int field_bits = f.exponent_bits + f.mantissa_bits;
  const std::uint32_t sign = ((code >> field_bits) & 1u) << 31;
  const std::uint32_t magnitude = code & ((std::uint32_t{1} << field_bits) - 1);
  const std::uint32_t field = magnitude >> f.mantissa_bits;
  const std::uint32_t trailing = magnitude & ((std::uint32_t{1} << f.mantissa_bits) - 1);
  const std::uint32_t field_ones = (std::uint32_t{1} << f.exponent_bits) - 1;
  if (f.has_infinity && field == field_ones) return float_of(sign | infinity_bits | (trailing << f.shift));
  if (!f.has_infinity && f.has_nan && magnitude == (std::uint32_t{1} << field_bits) - 1)
    return float_of(sign | quiet_nan_bits);
  if (field != 0) return float_of(sign | ((field + f.min_normal_exponent - 1) << trailing_bits) | (trailing << f.shift));
  if (trailing == 0 || f.flush_to_zero) return float_of(sign);
  // trailing * 2^u with u = emin - m = min_normal_exponent + shift - 150, exact in binary32.
  const int u = static_cast<int>(f.min_normal_exponent + f.shift) - 150;
  const int top = leading_bit(trailing);
  if (u + top >= -126)
    return float_of(sign | (static_cast<std::uint32_t>(u + top + 127) << trailing_bits) |
                    ((trailing << (trailing_bits - top)) & ((std::uint32_t{1} << trailing_bits) - 1)));
  return float_of(sign | (trailing << (u + 149)));  // a binary32 subnormal
}

}  // namespace mpsim::gpu
