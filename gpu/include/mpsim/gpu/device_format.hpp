// Host side of device_rounding.hpp: DeviceFormat and DeviceRounding from the
// emulator's Format and Rounding, checked. Host code only (it includes the
// emulator's headers); kernels receive the results by value.
#pragma once

#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "mpsim/gpu/device_rounding.hpp"

namespace mpsim::gpu {

static_assert(device_mode::nearest_even == static_cast<std::uint8_t>(RoundingMode::nearest_even));
static_assert(device_mode::nearest_away == static_cast<std::uint8_t>(RoundingMode::nearest_away));
static_assert(device_mode::toward_zero == static_cast<std::uint8_t>(RoundingMode::toward_zero));
static_assert(device_mode::toward_positive == static_cast<std::uint8_t>(RoundingMode::toward_positive));
static_assert(device_mode::toward_negative == static_cast<std::uint8_t>(RoundingMode::toward_negative));
static_assert(device_mode::odd == static_cast<std::uint8_t>(RoundingMode::odd));
static_assert(device_mode::stochastic == static_cast<std::uint8_t>(RoundingMode::stochastic));

// Throws std::invalid_argument unless the format is valid and fits_in_float.
inline DeviceFormat make_device_format(const Format& f) {
  if (auto reason = f.invalid_reason()) throw std::invalid_argument("make_device_format: invalid format: " + *reason);
  if (!fits_in_float(f))
    throw std::invalid_argument("make_device_format: format " + f.name() +
                                " does not fit in binary32 (needs precision <= 24 and binary32's range)");
  // Format values are exact in binary32 once the format fits.
  auto pattern = [](double value) { return std::bit_cast<std::uint32_t>(static_cast<float>(value)); };
  DeviceFormat d{};
  d.exponent_bits = f.exponent_bits;
  d.mantissa_bits = f.mantissa_bits;
  d.flush_to_zero = f.subnormals == Subnormals::flush_to_zero;
  d.saturate = f.overflow == Overflow::saturate;
  d.has_infinity = f.has_infinity();
  d.shift = static_cast<std::uint32_t>(23 - f.mantissa_bits);
  d.min_normal_exponent = static_cast<std::uint32_t>(f.emin() + 127);
  d.smallest_normal = pattern(f.smallest_normal());
  d.smallest_subnormal = pattern(f.smallest_subnormal());
  d.largest_finite = pattern(f.largest_finite());
  // NaNs keep their sign, and with infinities (hence a quiet bit) the leading
  // mantissa_bits - 1 payload bits (format.cpp encode_nan, to_float).
  d.nan_keep = f.has_infinity() ? ~((std::uint32_t{1} << d.shift) - 1) : detail::sign_bit;
  return d;
}

// Throws std::invalid_argument unless random_bits is in 1..32.
inline DeviceRounding make_device_rounding(const Rounding& r) {
  if (r.random_bits < 1 || r.random_bits > 32)
    throw std::invalid_argument("make_device_rounding: random_bits must be in 1..32, got " +
                                std::to_string(r.random_bits));
  return {static_cast<std::uint8_t>(r.mode), static_cast<std::uint8_t>(r.random_bits)};
}

}  // namespace mpsim::gpu
