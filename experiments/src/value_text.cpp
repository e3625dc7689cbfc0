#include "value_text.hpp"

#include <fmt/core.h>

#include <bit>
#include <cctype>
#include <cerrno>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "usage_error.hpp"

namespace mpsim::cli {
namespace {

// strtod in a given IEEE rounding direction (glibc honours the current mode).
double parse_in_mode(const std::string& text, int mode, char** end) {
  const int saved = std::fegetround();
  std::fesetround(mode);
  const double value = std::strtod(text.c_str(), end);
  std::fesetround(saved);
  return value;
}

}  // namespace

ParsedNumber parse_number(std::string_view token) {
  const std::string text(token);
  char* end = nullptr;
  errno = 0;
  const double down = parse_in_mode(text, FE_DOWNWARD, &end);
  if (text.empty() || end != text.c_str() + text.size())
    throw UsageError("'" + text + "' is not a number: give decimal (0.1, 3e-5), hexadecimal (0x1.8p-3), inf or nan");
  const double up = parse_in_mode(text, FE_UPWARD, &end);
  const double nearest = parse_in_mode(text, FE_TONEAREST, &end);
  if (std::isnan(down) || std::bit_cast<std::uint64_t>(down) == std::bit_cast<std::uint64_t>(up))
    return {down, down, true};
  // Inexact: down and up are neighbours around the exact value; the one with
  // an odd last bit is the round-to-odd result.
  // Past binary64's range, one neighbour is an infinity and the other the largest finite (odd: all ones).
  return {(std::bit_cast<std::uint64_t>(down) & 1) != 0 ? down : up, nearest, false, std::isinf(down) != std::isinf(up)};
}

Rounded round_text(const Format& format, Rounding rounding, const ParsedNumber& number, std::uint32_t draw) {
  if (!number.exact && format.precision() > 51)
    throw UsageError(fmt::format(
        "{} has {} bits of precision, and text is read exactly only for formats of at most 51 (through binary64's "
        "round-to-odd neighbour, which would round it twice here): give a value that binary64 holds exactly (a hex "
        "float of at most 53 significant bits, e.g. 0x1.999999999999ap-4), or a narrower format",
        format.name(), format.precision()));
  Rounded r = round_to_format(format, rounding, number.odd, draw);
  // The exact value exceeds every format's largest finite (none is above binary64's): rounded with an unbounded
  // exponent it is still above, which is IEEE 754's overflow (7.4) whatever the rounding direction returned.
  if (number.beyond_binary64) r.flags |= Flags{Flags::overflow | Flags::inexact};
  return r;
}

std::string lower_case(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string exact_decimal(double value) {
  if (std::isnan(value)) return std::signbit(value) ? "-nan" : "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (value == 0) return std::signbit(value) ? "-0" : "0";
  // |value| = m * 2^e with a 53-bit integer m; its lowest set bit, 2^-k, needs k fraction digits.
  int exponent = 0;
  const auto m = static_cast<std::uint64_t>(std::ldexp(std::fabs(std::frexp(value, &exponent)), 53));
  const int lowest = exponent - 53 + std::countr_zero(m);
  const int digits = lowest < 0 ? -lowest : 0;
  std::string text(static_cast<std::size_t>(std::snprintf(nullptr, 0, "%.*f", digits, value)) + 1, '\0');
  std::snprintf(text.data(), text.size(), "%.*f", digits, value);
  text.pop_back();
  return text;
}

std::string exact_scientific(double value) {
  std::string fixed = exact_decimal(value);
  const double magnitude = std::fabs(value);
  if (!std::isfinite(value) || magnitude == 0 || (magnitude >= 1e-3 && magnitude < 1e7)) return fixed;
  // Every digit of the fixed form, moved behind one leading digit.
  const bool negative = fixed[0] == '-';
  std::string digits;
  int point = -1;
  for (std::size_t i = negative ? 1 : 0; i < fixed.size(); ++i) {
    if (fixed[i] == '.') point = static_cast<int>(digits.size());
    else digits += fixed[i];
  }
  if (point < 0) point = static_cast<int>(digits.size());
  const auto first = digits.find_first_not_of('0');
  const auto last = digits.find_last_not_of('0');
  const int exponent = point - static_cast<int>(first) - 1;
  std::string mantissa = digits.substr(first, last - first + 1);
  if (mantissa.size() > 1) mantissa.insert(1, ".");
  return (negative ? "-" : "") + mantissa + "e" + (exponent < 0 ? "-" : "+") + std::to_string(std::abs(exponent));
}

std::string hex_float(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%a", value);
  return buffer;
}

std::string bit_string(const Format& f, Bits bits) {
  std::string text;
  for (int i = f.total_bits() - 1; i >= 0; --i) {
    text += ((bits.value >> i) & 1) != 0 ? '1' : '0';
    if (i == f.total_bits() - 1 || (i == f.mantissa_bits && f.mantissa_bits > 0)) text += ' ';
  }
  return text;
}

std::string_view class_name(FloatClass c) {
  switch (c) {
    case FloatClass::zero: return "zero";
    case FloatClass::subnormal: return "subnormal";
    case FloatClass::normal: return "normal";
    case FloatClass::infinite: return "infinite";
    case FloatClass::nan: return "nan";
  }
  return "?";
}

}  // namespace mpsim::cli
