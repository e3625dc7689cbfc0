// Reading numbers from text without double rounding, and writing format
// values exactly.
#pragma once

#include <string>
#include <string_view>

#include "mpsim/emulation/rounding.hpp"

namespace mpsim::cli {

// A number read from text: the binary64 value to round, and whether it is the
// text's exact value. When it is not, `odd` is the round-to-odd binary64
// neighbour, so one more rounding to any format of precision <= 51 gives the
// correctly rounded result (Boldo and Melquiond, "Emulation of FMA and
// correctly rounded sums: proved algorithms using rounding to odd", 2008).
struct ParsedNumber {
  double odd;      // exact value, or its round-to-odd binary64 neighbour
  double nearest;  // the text rounded to nearest binary64
  bool exact;
  bool beyond_binary64 = false;  // a finite number past binary64's largest (odd is then that largest)
};

// Accepts decimal and C99 hexadecimal floating-point text, inf and nan.
// Throws UsageError naming the token when it is not a number.
ParsedNumber parse_number(std::string_view token);

// Rounds text into a format once, as described above, with IEEE 754's flags
// (overflow too for a number past binary64's range, which `odd` alone cannot
// say). Text that binary64 does not hold exactly is refused (UsageError) for
// formats of more than 51 bits of precision: through `odd` it would be
// rounded twice.
Rounded round_text(const Format& format, Rounding rounding, const ParsedNumber& number, std::uint32_t draw);

std::string lower_case(std::string text);      // ASCII letters only: names given in any case
std::string exact_decimal(double value);     // every digit of a binary64 value
std::string exact_scientific(double value);  // the same digits, as d.ddde-N when very small or large
std::string hex_float(double value);      // C99 %a form
std::string bit_string(const Format& format, Bits bits);  // "0 01011 1001100110"
std::string_view class_name(FloatClass c);

}  // namespace mpsim::cli
