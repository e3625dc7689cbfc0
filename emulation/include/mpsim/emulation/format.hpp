// Floating-point formats as values: {exponent bits, mantissa bits, subnormals,
// overflow, specials}, with named presets. Encode, decode, classify, neighbours.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mpsim {

// Whether results below the smallest normal keep gradual underflow (IEEE 754
// subnormals) or are flushed to a signed zero (GPU "FTZ" behaviour). A
// flush-to-zero format also reads subnormal encodings as zero (DAZ).
enum class Subnormals : std::uint8_t { gradual, flush_to_zero };

// What a finite result too large for the format becomes: the IEEE 754 §7.4
// result (infinity or the largest finite, depending on the rounding direction),
// or always the largest finite value of the right sign (NVIDIA "satfinite").
enum class Overflow : std::uint8_t { ieee, saturate };

// How the all-ones exponent is used. `ieee`: infinities and NaNs.
// `nan_only`: OCP 8-bit FP "fn" formats (E4M3): no infinities, the single NaN
// pattern S.1..1.1..1, every other all-ones-exponent encoding is finite.
// A format with zero mantissa bits cannot hold both infinity and NaN; it is
// always treated as `nan_only` (like OCP's E8M0).
// `none`: OCP MX v1.0 FP6 (E3M2, E2M3) and FP4 (E2M1): every encoding is a
// finite number. An overflow can only saturate (such a format must be
// Overflow::saturate), and a NaN becomes +largest finite with `invalid`, as
// CUDA's cuda_fp6.h/cuda_fp4.h conversions document and as IEEE 754 §7.2
// treats a NaN converted to a format with no NaN (an integer).
enum class Specials : std::uint8_t { ieee, nan_only, none };

enum class FloatClass : std::uint8_t { zero, subnormal, normal, infinite, nan };

// A bit pattern of some format, right-aligned. Never converts silently.
struct Bits {
  std::uint64_t value = 0;
  friend constexpr bool operator==(Bits, Bits) = default;
};

struct Format {
  int exponent_bits = 5;   // 2..11
  int mantissa_bits = 10;  // trailing significand bits, 0..52
  Subnormals subnormals = Subnormals::gradual;
  Overflow overflow = Overflow::ieee;
  Specials specials = Specials::ieee;

  friend constexpr bool operator==(const Format&, const Format&) = default;

  constexpr int precision() const { return mantissa_bits + 1; }
  constexpr int total_bits() const { return 1 + exponent_bits + mantissa_bits; }
  constexpr int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  constexpr bool has_infinity() const { return specials == Specials::ieee && mantissa_bits > 0; }
  constexpr bool has_nan() const { return specials != Specials::none; }
  constexpr bool all_ones_exponent_is_finite() const {
    return specials == Specials::none || (!has_infinity() && mantissa_bits > 0);
  }
  constexpr int emin() const { return 1 - bias(); }
  constexpr int emax() const { return all_ones_exponent_is_finite() ? bias() + 1 : bias(); }
  // Largest significand (as an integer with `precision()` bits) at exponent emax.
  constexpr std::uint64_t max_significand() const {
    const std::uint64_t all_ones = (std::uint64_t{2} << mantissa_bits) - 1;
    return all_ones_exponent_is_finite() && has_nan() ? all_ones - 1 : all_ones;
  }

  double largest_finite() const;
  double smallest_normal() const;
  double smallest_subnormal() const;  // the smallest normal for flush-to-zero formats
  double unit_roundoff() const;       // 2^-p: the bound on relative error of round-to-nearest
  double machine_epsilon() const;     // 2^(1-p): the gap from 1 to the next value

  // "binary16", "e4m3", or "e6m9" plus options, e.g. "e6m9:ftz:sat".
  std::string name() const;
  // Why this format is not valid, or nothing when it is.
  std::optional<std::string> invalid_reason() const;
};

namespace formats {
inline constexpr Format binary16{5, 10};
inline constexpr Format bfloat16{8, 7};
inline constexpr Format tf32{8, 10};  // NVIDIA TensorFloat-32: binary32's range, binary16's precision
inline constexpr Format e4m3{4, 3, Subnormals::gradual, Overflow::saturate, Specials::nan_only};  // OCP FP8
inline constexpr Format e5m2{5, 2};                                                          // OCP FP8, IEEE-like
// OCP MX v1.0 §5.3.3 element formats: no infinity, no NaN; largest 6, 28, 7.5.
inline constexpr Format e2m1{2, 1, Subnormals::gradual, Overflow::saturate, Specials::none};  // FP4
inline constexpr Format e3m2{3, 2, Subnormals::gradual, Overflow::saturate, Specials::none};  // FP6
inline constexpr Format e2m3{2, 3, Subnormals::gradual, Overflow::saturate, Specials::none};  // FP6
inline constexpr Format binary32{8, 23};
inline constexpr Format binary64{11, 52};
}  // namespace formats

// Parses a preset name (binary16|fp16|half, bfloat16|bf16, tf32, e4m3|fp8e4m3,
// e5m2|fp8e5m2, e2m1|fp4e2m1, e3m2|fp6e3m2, e2m3|fp6e2m3, binary32|fp32,
// binary64|fp64) or a custom "eXmY" with options ":ftz" (flush subnormals),
// ":sat" (saturate on overflow), ":fn" (NaN only), ":finite" (no infinity, no
// NaN; implies :sat), ":inf" (IEEE specials), ":nosat".
// Returns nothing for an unknown name; `format_names()` lists the accepted ones.
std::optional<Format> parse_format(std::string_view text);
std::string_view format_names();

// --- Encodings ---------------------------------------------------------------
FloatClass classify(const Format& format, Bits bits);
bool is_signaling_nan(const Format& format, Bits bits);
Bits quiet_nan(const Format& format, bool negative);
// Infinity; NaN where the format has no infinity; +-largest where it has neither.
Bits infinity_or_nan(const Format& format, bool negative);
Bits largest_finite_bits(const Format& format, bool negative);

// Exact value of an encoding. Every format value is a binary64 value; NaN
// payloads keep their sign and leading payload bits.
double to_double(const Format& format, Bits bits);
// Exact in binary32 when the format fits (precision <= 24, range within binary32).
float to_float(const Format& format, Bits bits);
bool fits_in_float(const Format& format);

// IEEE 754 nextUp / nextDown: the neighbour toward +inf / -inf. NaN stays NaN;
// nextUp(largest finite) is +inf (or stays for formats without infinity).
Bits next_up(const Format& format, Bits bits);
Bits next_down(const Format& format, Bits bits);

}  // namespace mpsim
