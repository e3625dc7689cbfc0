#include "mpsim/emulation/scale_format.hpp"

#include <bit>
#include <cmath>
#include <limits>

#include "mpsim/emulation/format.hpp"

namespace mpsim {
namespace {

constexpr std::uint8_t flag(std::uint8_t bits) { return bits; }

// E8M0 codes 0..254 are 2^-127..2^127: the normal binades of a format with
// no mantissa and a 9-bit exponent (bias 255, field f is 2^(f-255)), shifted
// by 128. Rounding there first gives every mode's answer with an unbounded
// range (ties to the larger power, as any format without mantissa bits
// rounds them: rounding.cpp); the ends are then clamped.
constexpr Format kWideExponentOnly{9, 0, Subnormals::gradual, Overflow::ieee, Specials::nan_only};
constexpr int kE8m0FieldOffset = 128;

Rounded round_to_e8m0(Rounding rounding, double value, bool saturate, std::uint32_t draw) {
  if (std::isnan(value) || (value < 0 && value != 0)) return {Bits{kE8m0Nan}, {flag(Flags::invalid)}};
  if (value == 0) return {Bits{0}, {flag(Flags::underflow | Flags::inexact)}};
  const std::uint32_t largest = kE8m0Nan - 1;
  if (std::isinf(value))
    return {Bits{saturate ? largest : kE8m0Nan}, {flag(Flags::overflow | Flags::inexact)}};
  const Rounded wide = round_to_format(kWideExponentOnly, rounding, value, draw);
  const long field = static_cast<long>(wide.bits.value);  // positive: no sign bit set
  Flags flags{static_cast<std::uint8_t>(wide.flags.bits & Flags::inexact)};
  if (field < kE8m0FieldOffset) return {Bits{0}, {flag(Flags::underflow | Flags::inexact)}};
  if (field - kE8m0FieldOffset > static_cast<long>(largest))
    return {Bits{saturate ? largest : kE8m0Nan}, {flag(Flags::overflow | Flags::inexact)}};
  return {Bits{static_cast<std::uint64_t>(field - kE8m0FieldOffset)}, flags};
}

Rounded round_to_ue4m3(Rounding rounding, double value, bool saturate, std::uint32_t draw) {
  if (std::isnan(value) || (value < 0 && value != 0)) return {Bits{kUe4m3Nan}, {flag(Flags::invalid)}};
  if (value == 0) return {Bits{0}, {}};
  const Format e4m3 = saturate ? formats::e4m3 : Format{4, 3, Subnormals::gradual, Overflow::ieee, Specials::nan_only};
  const Rounded r = round_to_format(e4m3, rounding, value, draw);
  return {Bits{r.bits.value & 0x7F}, r.flags};  // a positive value: the sign bit is clear
}

}  // namespace

std::string_view to_string(ScaleFormat scale) {
  switch (scale) {
    case ScaleFormat::e8m0: return "e8m0";
    case ScaleFormat::ue4m3: return "ue4m3";
    case ScaleFormat::binary32: return "binary32";
  }
  return "?";
}

std::optional<ScaleFormat> parse_scale_format(std::string_view text) {
  for (ScaleFormat s : {ScaleFormat::e8m0, ScaleFormat::ue4m3, ScaleFormat::binary32})
    if (text == to_string(s)) return s;
  if (text == "fp32") return ScaleFormat::binary32;
  return std::nullopt;
}

double scale_value(ScaleFormat scale, std::uint32_t code) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  switch (scale) {
    case ScaleFormat::e8m0: return code >= kE8m0Nan ? nan : std::ldexp(1.0, static_cast<int>(code) - 127);
    case ScaleFormat::ue4m3: return (code & 0x7F) == kUe4m3Nan ? nan : to_double(formats::e4m3, Bits{code & 0x7F});
    case ScaleFormat::binary32: return std::bit_cast<float>(code);
  }
  return nan;
}

Rounded round_to_scale(ScaleFormat scale, Rounding rounding, double value, bool saturate, std::uint32_t draw) {
  switch (scale) {
    case ScaleFormat::e8m0: return round_to_e8m0(rounding, value, saturate, draw);
    case ScaleFormat::ue4m3: return round_to_ue4m3(rounding, value, saturate, draw);
    case ScaleFormat::binary32: {
      const Format f = saturate ? Format{8, 23, Subnormals::gradual, Overflow::saturate} : formats::binary32;
      return round_to_format(f, rounding, value, draw);
    }
  }
  return {Bits{0}, {}};
}

}  // namespace mpsim
