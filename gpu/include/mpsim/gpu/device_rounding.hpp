// The emulator's one pattern rounding (mpsim/emulation/pattern_rounding.hpp)
// for binary32 values in CUDA kernels and host code alike: the CPU's scalar
// quantize path runs the same round_pattern, so the CPU tests prove what the
// kernels round. This header only names it for the kernels (DeviceFormat,
// round_float with a float in and out) and adds the float bit casts.
//
// No CUDA type and no host-only header: the host helpers that build a
// DeviceFormat from an mpsim::Format live in device_format.hpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "mpsim/emulation/host_device.hpp"
#include "mpsim/emulation/pattern_rounding.hpp"
#include "mpsim/emulation/random_draw.hpp"

namespace mpsim::gpu {

// A format that fits in binary32, as binary32 patterns (make_device_format).
using DeviceFormat = PatternFormat<std::uint32_t>;
using DeviceRounding = PatternRounding;
namespace device_mode = mpsim::pattern_mode;

// A rounded value and what QuantizeCounts counts for it (pattern_rounding.hpp).
using RoundedFloat = RoundedValue<float>;

namespace detail {

// binary32's layout (IEEE 754-2019 §3.4).
inline constexpr std::uint32_t sign_bit = StorageLayout<std::uint32_t>::sign;
inline constexpr std::uint32_t infinity_bits = StorageLayout<std::uint32_t>::infinity;
inline constexpr std::uint32_t quiet_nan_bits = StorageLayout<std::uint32_t>::quiet_nan;
inline constexpr int trailing_bits = StorageLayout<std::uint32_t>::trailing_bits;

MPSIM_HOST_DEVICE inline std::uint32_t bits_of(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MPSIM_HOST_DEVICE inline float float_of(std::uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

}  // namespace detail

// Rounds x once into the format and returns the format's value as a float
// (round_pattern on x's bits). `draw` is the element's 32-bit random word
// (device_random_draw); only stochastic rounding reads it.
MPSIM_HOST_DEVICE inline RoundedFloat round_float(float x, DeviceFormat f, DeviceRounding r, std::uint32_t draw) {
  const RoundedValue<std::uint32_t> p = round_pattern<std::uint32_t>(detail::bits_of(x), f, r, draw);
  return {detail::float_of(p.value), p.inexact, p.flushed_to_zero, p.subnormal, p.overflow, p.nan};
}

// mpsim::random_draw (random_draw.hpp, the emulator's own) with the DrawKey's two words.
MPSIM_HOST_DEVICE inline std::uint32_t device_random_draw(std::uint32_t key_low, std::uint32_t key_high,
                                                          std::uint64_t index) {
  return random_draw(DrawKey{key_low, key_high}, index);
}

}  // namespace mpsim::gpu
