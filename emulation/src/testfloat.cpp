#include "mpsim/emulation/testfloat.hpp"

#include <array>
#include <bit>
#include <cstdio>
#include <istream>
#include <stdexcept>

#include "mpsim/emulation/arithmetic.hpp"

namespace mpsim {
namespace {

struct FunctionInfo {
  TestFloatFunction function;
  std::string_view name;
  int operands;
  Format operand_format;
  Format result_format;
};

constexpr std::array<FunctionInfo, 13> kFunctions{{
    {TestFloatFunction::f32_to_f16, "f32_to_f16", 1, formats::binary32, formats::binary16},
    {TestFloatFunction::f64_to_f16, "f64_to_f16", 1, formats::binary64, formats::binary16},
    {TestFloatFunction::f32_to_bf16, "f32_to_bf16", 1, formats::binary32, formats::bfloat16},
    {TestFloatFunction::f64_to_bf16, "f64_to_bf16", 1, formats::binary64, formats::bfloat16},
    {TestFloatFunction::f16_to_f32, "f16_to_f32", 1, formats::binary16, formats::binary32},
    {TestFloatFunction::f16_to_f64, "f16_to_f64", 1, formats::binary16, formats::binary64},
    {TestFloatFunction::bf16_to_f32, "bf16_to_f32", 1, formats::bfloat16, formats::binary32},
    {TestFloatFunction::f16_add, "f16_add", 2, formats::binary16, formats::binary16},
    {TestFloatFunction::f16_sub, "f16_sub", 2, formats::binary16, formats::binary16},
    {TestFloatFunction::f16_mul, "f16_mul", 2, formats::binary16, formats::binary16},
    {TestFloatFunction::f16_div, "f16_div", 2, formats::binary16, formats::binary16},
    {TestFloatFunction::f16_sqrt, "f16_sqrt", 1, formats::binary16, formats::binary16},
    {TestFloatFunction::f16_mulAdd, "f16_mulAdd", 3, formats::binary16, formats::binary16},
}};

constexpr std::array<TestFloatFunction, kFunctions.size()> kFunctionList = [] {
  std::array<TestFloatFunction, kFunctions.size()> list{};
  for (std::size_t i = 0; i < kFunctions.size(); ++i) list[i] = kFunctions[i].function;
  return list;
}();

struct ModeName {
  RoundingMode mode;
  std::string_view name;
};
constexpr std::array<ModeName, 6> kModes{{
    {RoundingMode::nearest_even, "rnear_even"},
    {RoundingMode::nearest_away, "rnear_maxMag"},
    {RoundingMode::toward_zero, "rminMag"},
    {RoundingMode::toward_negative, "rmin"},
    {RoundingMode::toward_positive, "rmax"},
    {RoundingMode::odd, "rodd"},
}};

const FunctionInfo& info(TestFloatFunction function) {
  for (const auto& entry : kFunctions)
    if (entry.function == function) return entry;
  throw std::invalid_argument("unknown TestFloat function");
}

// TestFloat writes every field with a fixed number of hexadecimal digits.
int hex_digits(const Format& format) { return (format.total_bits() + 3) / 4; }
constexpr int kFlagDigits = 2;
constexpr std::uint8_t kAllFlags = 0x1F;

std::string hex(std::uint64_t value, int digits) {
  char text[20];
  std::snprintf(text, sizeof text, "%0*llX", digits, static_cast<unsigned long long>(value));
  return text;
}

std::string flags_text(Flags flags) {
  return hex(flags.bits, kFlagDigits) + " (" + flags_to_string(flags) + ")";
}

[[noreturn]] void bad_line(std::uint64_t line_number, std::string_view token, std::string_view why) {
  throw std::invalid_argument("TestFloat line " + std::to_string(line_number) + ": bad token '" +
                              std::string(token) + "': " + std::string(why));
}

std::uint64_t parse_hex_field(std::string_view token, int digits, std::uint64_t line_number,
                              std::string_view what) {
  if (token.size() != static_cast<std::size_t>(digits))
    bad_line(line_number, token, "expected " + std::to_string(digits) + " hexadecimal digits for " + std::string(what));
  std::uint64_t value = 0;
  for (char c : token) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) bad_line(line_number, token, "not hexadecimal, in " + std::string(what));
    value = value << 4 | static_cast<std::uint64_t>(digit);
  }
  return value;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t pos = 0;
  while (pos < line.size()) {
    if (line[pos] == ' ' || line[pos] == '\t') {
      ++pos;
      continue;
    }
    std::size_t end = pos;
    while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
    fields.push_back(line.substr(pos, end - pos));
    pos = end;
  }
  return fields;
}

struct Case {
  std::array<std::uint64_t, 3> operands{};
  Bits expected;
  Flags expected_flags;
};

Case parse_case(std::string_view line, std::uint64_t line_number, const FunctionInfo& function) {
  const auto fields = split_fields(line);
  const std::size_t wanted = static_cast<std::size_t>(function.operands) + 2;
  if (fields.size() > wanted)
    bad_line(line_number, fields[wanted],
             "too many fields for " + std::string(function.name) + " (expected " + std::to_string(wanted) + ")");
  if (fields.size() < wanted)
    bad_line(line_number, line,
             "too few fields for " + std::string(function.name) + " (expected " + std::to_string(wanted) + ")");

  Case result;
  const int operand_digits = hex_digits(function.operand_format);
  for (int i = 0; i < function.operands; ++i)
    result.operands[i] = parse_hex_field(fields[i], operand_digits, line_number,
                                         "operand " + std::to_string(i + 1) + " (" + function.operand_format.name() + ")");
  result.expected.value = parse_hex_field(fields[function.operands], hex_digits(function.result_format), line_number,
                                          "the result (" + function.result_format.name() + ")");
  const std::uint64_t flags = parse_hex_field(fields[function.operands + 1], kFlagDigits, line_number, "the flags");
  if (flags > kAllFlags) bad_line(line_number, fields[function.operands + 1], "unknown exception flag bits");
  result.expected_flags.bits = static_cast<std::uint8_t>(flags);
  return result;
}

// NaN by the IEEE encoding rule (all-ones exponent, nonzero trailing
// significand), computed here rather than by the emulator under test.
bool is_nan_encoding(const Format& format, Bits bits) {
  if (bits.value >> format.total_bits() != 0) return false;
  const std::uint64_t mantissa_mask = (std::uint64_t{1} << format.mantissa_bits) - 1;
  const std::uint64_t exponent_mask = (std::uint64_t{1} << format.exponent_bits) - 1;
  const std::uint64_t exponent = bits.value >> format.mantissa_bits & exponent_mask;
  return exponent == exponent_mask && (bits.value & mantissa_mask) != 0;
}

bool matches(const Format& format, const Case& expected, const Rounded& got) {
  if (got.flags != expected.expected_flags) return false;
  if (is_nan_encoding(format, expected.expected)) return is_nan_encoding(format, got.bits);
  return got.bits == expected.expected;
}

// One way of computing the function through the emulator's public interface.
struct Attempt {
  std::string_view entry_point;
  Rounded got;
};

// Every emulator entry point that computes `function` on this case.
std::vector<Attempt> evaluate(const FunctionInfo& function, Rounding rounding, const Case& c) {
  const Format& f = function.result_format;
  const Bits a{c.operands[0]}, b{c.operands[1]}, d{c.operands[2]};
  switch (function.function) {
    case TestFloatFunction::f16_add: return {{"add", add(f, rounding, a, b)}};
    case TestFloatFunction::f16_sub: return {{"sub", sub(f, rounding, a, b)}};
    case TestFloatFunction::f16_mul: return {{"mul", mul(f, rounding, a, b)}};
    case TestFloatFunction::f16_div: return {{"div", div(f, rounding, a, b)}};
    case TestFloatFunction::f16_sqrt: return {{"sqrt", sqrt(f, rounding, a)}};
    case TestFloatFunction::f16_mulAdd: return {{"fma", fma(f, rounding, a, b, d)}};
    default: break;
  }
  std::vector<Attempt> attempts{{"convert", convert(function.operand_format, a, f, rounding)}};
  if (function.operand_format == formats::binary32) {
    const float value = std::bit_cast<float>(static_cast<std::uint32_t>(a.value));
    attempts.push_back({"round_to_format(float)", round_to_format(f, rounding, value)});
  } else if (function.operand_format == formats::binary64) {
    const double value = std::bit_cast<double>(a.value);
    attempts.push_back({"round_to_format(double)", round_to_format(f, rounding, value)});
  }
  return attempts;
}

std::string describe_mismatch(std::uint64_t line_number, const FunctionInfo& function, RoundingMode mode,
                              const Case& c, const Attempt& attempt) {
  const int operand_digits = hex_digits(function.operand_format);
  const int result_digits = hex_digits(function.result_format);
  std::string text = "line " + std::to_string(line_number) + ": " + std::string(function.name) + "(";
  for (int i = 0; i < function.operands; ++i) {
    if (i > 0) text += ", ";
    text += hex(c.operands[i], operand_digits);
  }
  text += ") ";
  text += testfloat_rounding_name(mode).value_or("?");
  text += ": expected " + hex(c.expected.value, result_digits) + " flags " + flags_text(c.expected_flags);
  text += ", got " + hex(attempt.got.bits.value, result_digits) + " flags " + flags_text(attempt.got.flags);
  text += " from " + std::string(attempt.entry_point);
  return text;
}

}  // namespace

std::optional<TestFloatFunction> parse_testfloat_function(std::string_view name) {
  for (const auto& entry : kFunctions)
    if (entry.name == name) return entry.function;
  return std::nullopt;
}

std::string_view to_string(TestFloatFunction function) { return info(function).name; }

std::span<const TestFloatFunction> testfloat_functions() { return kFunctionList; }

std::string testfloat_function_names() {
  std::string names;
  for (const auto& entry : kFunctions) {
    if (!names.empty()) names += ", ";
    names += entry.name;
  }
  return names;
}

std::optional<RoundingMode> parse_testfloat_rounding(std::string_view name) {
  for (const auto& entry : kModes)
    if (entry.name == name) return entry.mode;
  return std::nullopt;
}

std::optional<std::string_view> testfloat_rounding_name(RoundingMode mode) {
  for (const auto& entry : kModes)
    if (entry.mode == mode) return entry.name;
  return std::nullopt;
}

TestFloatReport check_testfloat(std::istream& lines, TestFloatFunction function, RoundingMode mode,
                                std::size_t max_reported) {
  if (!testfloat_rounding_name(mode))
    throw std::invalid_argument("TestFloat has no vectors for rounding mode " + std::string(to_string(mode)));
  const FunctionInfo& fn = info(function);
  const Rounding rounding{mode};

  TestFloatReport report;
  std::string line;
  std::uint64_t line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;

    const Case c = parse_case(line, line_number, fn);
    bool ok = true;
    for (const Attempt& attempt : evaluate(fn, rounding, c)) {
      if (matches(fn.result_format, c, attempt.got)) continue;
      ok = false;
      if (report.first_mismatches.size() < max_reported)
        report.first_mismatches.push_back(describe_mismatch(line_number, fn, mode, c, attempt));
      break;
    }
    ++(ok ? report.passed : report.failed);
  }
  return report;
}

}  // namespace mpsim
