// The scale formats of block-scaled formats, as values with conversions in
// every rounding mode:
// - E8M0 (OCP Microscaling v1.0 §5.4.1): 8 exponent bits, no sign, no
//   mantissa, bias 127; code e is 2^(e-127) for e in 0..254 (so no zero),
//   0xFF is NaN.
// - UE4M3 (NVIDIA NVFP4's block scale): E4M3's non-negative half, 7 bits;
//   0x7F is NaN, the largest 448, gradual underflow down to 2^-9.
// - binary32 (DeepSeek-V3's FP8 tiles; NVFP4's per-tensor scale).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "mpsim/emulation/rounding.hpp"

namespace mpsim {

enum class ScaleFormat : std::uint8_t { e8m0, ue4m3, binary32 };

std::string_view to_string(ScaleFormat scale);
std::optional<ScaleFormat> parse_scale_format(std::string_view text);

// The value of a scale's code (NaN for E8M0 0xFF and UE4M3 0x7F); binary32
// codes are the value's pattern.
double scale_value(ScaleFormat scale, std::uint32_t code);

// Rounds a value into the scale format once, in any mode. `saturate`: an
// overflow gives the largest scale (else NaN: neither E8M0 nor UE4M3 has an
// infinity). The formats have no sign: a negative nonzero value or a NaN gives
// NaN with `invalid`, -0 gives +0 (UE4M3). E8M0 has no zero: anything below
// 2^-127 (zero included) becomes 2^-127 with underflow|inexact, in every mode.
// binary32 rounds as round_to_format(formats::binary32) and keeps the sign.
Rounded round_to_scale(ScaleFormat scale, Rounding rounding, double value, bool saturate = true,
                       std::uint32_t draw = 0);

// Codes and their count: E8M0 256, UE4M3 128.
constexpr std::uint32_t kE8m0Nan = 0xFF;
constexpr std::uint32_t kUe4m3Nan = 0x7F;
constexpr std::uint32_t kUe4m3Largest = 0x7E;  // 448

}  // namespace mpsim
