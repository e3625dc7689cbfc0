#include "mpsim/emulation/pattern_format.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace mpsim {

static_assert(pattern_mode::nearest_even == static_cast<std::uint8_t>(RoundingMode::nearest_even));
static_assert(pattern_mode::nearest_away == static_cast<std::uint8_t>(RoundingMode::nearest_away));
static_assert(pattern_mode::toward_zero == static_cast<std::uint8_t>(RoundingMode::toward_zero));
static_assert(pattern_mode::toward_positive == static_cast<std::uint8_t>(RoundingMode::toward_positive));
static_assert(pattern_mode::toward_negative == static_cast<std::uint8_t>(RoundingMode::toward_negative));
static_assert(pattern_mode::odd == static_cast<std::uint8_t>(RoundingMode::odd));
static_assert(pattern_mode::stochastic == static_cast<std::uint8_t>(RoundingMode::stochastic));

namespace {

template <class T>
PatternFormat<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>> pattern_format(const Format& f,
                                                                                                const char* caller) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  using L = StorageLayout<U>;
  if (auto reason = f.invalid_reason()) throw std::invalid_argument(std::string(caller) + ": invalid format: " + *reason);
  if (std::is_same_v<T, float> && !fits_in_float(f))
    throw std::invalid_argument(std::string(caller) + ": format " + f.name() +
                                " does not fit in binary32 (needs precision <= 24 and binary32's range)");
  // Format values are exact in the storage once the format fits.
  auto pattern = [](double value) { return std::bit_cast<U>(static_cast<T>(value)); };
  PatternFormat<U> p{};
  p.exponent_bits = f.exponent_bits;
  p.mantissa_bits = f.mantissa_bits;
  p.flush_to_zero = f.subnormals == Subnormals::flush_to_zero;
  p.saturate = f.overflow == Overflow::saturate;
  p.has_infinity = f.has_infinity();
  p.has_nan = f.has_nan();
  p.shift = static_cast<U>(L::trailing_bits - f.mantissa_bits);
  p.min_normal_exponent = static_cast<U>(f.emin() + std::numeric_limits<T>::max_exponent - 1);
  p.smallest_normal = pattern(f.smallest_normal());
  p.smallest_subnormal = pattern(f.smallest_subnormal());
  p.largest_finite = pattern(f.largest_finite());
  // NaNs keep their sign, and with infinities (hence a quiet bit) the leading
  // mantissa_bits - 1 payload bits (format.cpp encode_nan, to_float).
  p.nan_keep = f.has_infinity() ? ~((U{1} << p.shift) - 1) : L::sign;
  return p;
}

}  // namespace

PatternFormat<std::uint32_t> binary32_pattern_format(const Format& format) {
  return pattern_format<float>(format, "binary32_pattern_format");
}

PatternFormat<std::uint64_t> binary64_pattern_format(const Format& format) {
  return pattern_format<double>(format, "binary64_pattern_format");
}

PatternFormat<std::uint32_t> integer_pattern_format(int bits, int fraction_bits) {
  const int top = bits - 1 - fraction_bits;  // the grid ends below 2^top, binary32's normal there
  if (bits < 2 || bits > 16 || top < -126 || top > 127)
    throw std::invalid_argument("integer_pattern_format: int" + std::to_string(bits) + " with 2^-" +
                                std::to_string(fraction_bits) +
                                " needs 2..16 bits and a grid within binary32's normal range");
  using L = StorageLayout<std::uint32_t>;
  auto pattern = [](double value) { return std::bit_cast<std::uint32_t>(static_cast<float>(value)); };
  PatternFormat<std::uint32_t> p{};
  p.exponent_bits = 1;  // as Format{1, bits - 1}: one binade of subnormals, the integers
  p.mantissa_bits = bits - 1;
  p.flush_to_zero = false;
  p.saturate = true;
  p.has_infinity = false;
  p.has_nan = true;  // a NaN stays NaN (block quantization makes its block NaN before rounding)
  p.shift = static_cast<std::uint32_t>(L::trailing_bits - (bits - 1));
  p.min_normal_exponent = static_cast<std::uint32_t>(top + 127);
  p.smallest_normal = pattern(std::ldexp(1.0, top));
  p.smallest_subnormal = pattern(std::ldexp(1.0, -fraction_bits));
  p.largest_finite = pattern(std::ldexp(std::ldexp(1.0, bits - 1) - 1, -fraction_bits));
  p.nan_keep = L::sign;
  return p;
}

PatternRounding pattern_rounding(const Rounding& r) {
  if (r.random_bits < 1 || r.random_bits > 32)
    throw std::invalid_argument("pattern_rounding: random_bits must be in 1..32, got " + std::to_string(r.random_bits));
  return {static_cast<std::uint8_t>(r.mode), static_cast<std::uint8_t>(r.random_bits)};
}

}  // namespace mpsim
