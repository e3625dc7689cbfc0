// Checks the emulator against Berkeley TestFloat test vectors: the text that
// `testfloat_gen` writes, one case a line, hexadecimal fields separated by
// single spaces (the operands, the expected result, the expected flags).
//
// The vectors are the oracle; the emulator (convert, round_to_format, add, sub,
// mul, div, sqrt, fma) is what is checked. A case passes when the result
// encoding and the exception flags are both exactly as expected, with one
// allowance: where TestFloat expects a NaN, any NaN of the result format is
// accepted (SoftFloat writes x86's default NaN and quiets propagated payloads,
// which the emulator's contract does not fix). Flags are always compared
// exactly, so a NaN result must still raise `invalid` exactly when expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/emulation/rounding.hpp"

namespace mpsim {

// The TestFloat functions this checker understands, named as TestFloat names them.
enum class TestFloatFunction : std::uint8_t {
  f32_to_f16,
  f64_to_f16,
  f32_to_bf16,
  f64_to_bf16,
  f16_to_f32,
  f16_to_f64,
  bf16_to_f32,
  f16_add,
  f16_sub,
  f16_mul,
  f16_div,
  f16_sqrt,
  f16_mulAdd,  // a*b + c with one rounding
};

std::optional<TestFloatFunction> parse_testfloat_function(std::string_view name);
std::string_view to_string(TestFloatFunction function);
// Every supported function, in the order of the enumeration, and their names
// as one comma-separated list (for messages).
std::span<const TestFloatFunction> testfloat_functions();
std::string testfloat_function_names();

// TestFloat's rounding-mode names (rnear_even, rnear_maxMag, rminMag, rmin,
// rmax, rodd) and ours. Stochastic rounding has no TestFloat name.
std::optional<RoundingMode> parse_testfloat_rounding(std::string_view name);
std::optional<std::string_view> testfloat_rounding_name(RoundingMode mode);

struct TestFloatReport {
  std::uint64_t passed = 0;
  std::uint64_t failed = 0;
  // The first failures (at most the `max_reported` given to check_testfloat),
  // one line each: line number, operands, expected and got bits and flags.
  std::vector<std::string> first_mismatches;
};

// Checks every case in `lines` (blank lines are ignored). Conversions from
// binary32/binary64 are checked through both `convert` and `round_to_format`;
// a case passes only when both agree with the vector. Throws
// std::invalid_argument, naming the line number and the offending token, for a
// malformed line (wrong field count, non-hexadecimal text, a value too wide for
// its field), and for stochastic rounding.
TestFloatReport check_testfloat(std::istream& lines, TestFloatFunction function, RoundingMode mode,
                                std::size_t max_reported = 10);

}  // namespace mpsim
