// The emulator against Berkeley TestFloat 3e vectors (shared/testfloat/): every
// file, results and exception flags, zero mismatches. The checker itself
// (mpsim/emulation/testfloat.hpp) is tested first on hand-written lines.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/emulation/testfloat.hpp"
#include "support/test_support.hpp"

namespace mpsim {
namespace {

namespace fs = std::filesystem;

// FUNCTION.MODE.txt.gz, or FUNCTION.txt.gz for exact functions.
struct VectorFile {
  fs::path path;
  std::string function;
  std::string mode;  // empty for exact functions
};

std::optional<VectorFile> parse_file_name(const fs::path& path) {
  const std::string name = path.filename().string();
  const std::string suffix = ".txt.gz";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const std::string stem = name.substr(0, name.size() - suffix.size());
  const auto dot = stem.find('.');
  if (dot == std::string::npos) return VectorFile{path, stem, ""};
  return VectorFile{path, stem.substr(0, dot), stem.substr(dot + 1)};
}

// The vector folder, or a visible CTest skip when this checkout has none.
fs::path testfloat_dir_or_skip() {
  const auto shared = test::shared_dir();
  if (!shared) test::skip("no shared/ folder (set MPSIM_SHARED_DIR): TestFloat vectors not checked");
  const fs::path dir = *shared / "testfloat";
  if (!fs::is_directory(dir)) test::skip("no " + dir.string() + ": TestFloat vectors not checked");
  return dir;
}

std::vector<VectorFile> vector_files(const fs::path& dir) {
  std::vector<VectorFile> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (auto file = parse_file_name(entry.path())) files.push_back(*file);
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return files;
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The whole decompressed file; fails the test when gzip does.
std::string gunzip(const fs::path& path) {
  const std::string command = "gzip -dc " + shell_quote(path.string());
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string text;
  char buffer[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) text.append(buffer, n);
  const int status = ::pclose(pipe);
  INFO("command: " << command);
  REQUIRE(status == 0);
  return text;
}

// The TestFloat modes a file's cases hold: its own, or every mode for an exact
// function (whose results do not depend on the rounding direction).
std::vector<RoundingMode> modes_of(const VectorFile& file) {
  if (!file.mode.empty()) {
    const auto mode = parse_testfloat_rounding(file.mode);
    INFO(file.path.string());
    REQUIRE(mode.has_value());
    return {*mode};
  }
  std::vector<RoundingMode> all;
  for (auto name : {"rnear_even", "rnear_maxMag", "rminMag", "rmin", "rmax", "rodd"})
    all.push_back(*parse_testfloat_rounding(name));
  return all;
}

// Every file of one function (about 1.3 s for all functions in a Release build,
// so none needs to wait for the exhaustive suites).
void check_function_files(std::string_view function_name) {
  const fs::path dir = testfloat_dir_or_skip();
  const auto function = parse_testfloat_function(function_name);
  REQUIRE(function.has_value());

  std::size_t files_checked = 0;
  for (const VectorFile& file : vector_files(dir)) {
    if (file.function != function_name) continue;
    const std::string text = gunzip(file.path);
    for (RoundingMode mode : modes_of(file)) {
      std::istringstream lines(text);
      const TestFloatReport report = check_testfloat(lines, *function, mode, 20);
      std::string mismatches;
      for (const auto& m : report.first_mismatches) mismatches += "\n  " + m;
      INFO(file.path.filename().string() << " under " << *testfloat_rounding_name(mode) << ": " << report.passed
                                         << " passed, " << report.failed << " failed" << mismatches);
      CHECK(report.passed > 0);
      CHECK(report.failed == 0);
    }
    ++files_checked;
  }
  INFO("TestFloat files for " << function_name << " in " << dir.string());
  CHECK(files_checked > 0);
}

}  // namespace

// --- The checker on hand-written lines ------------------------------------------

TEST_CASE("testfloat checker: names of functions and rounding modes", "[testfloat]") {
  for (TestFloatFunction f : testfloat_functions()) CHECK(parse_testfloat_function(to_string(f)) == f);
  CHECK_FALSE(parse_testfloat_function("f16_foo").has_value());
  CHECK(testfloat_function_names().find("f16_mulAdd") != std::string::npos);
  CHECK(parse_testfloat_function("f16_mulAdd") == TestFloatFunction::f16_mulAdd);

  CHECK(parse_testfloat_rounding("rnear_even") == RoundingMode::nearest_even);
  CHECK(parse_testfloat_rounding("rnear_maxMag") == RoundingMode::nearest_away);
  CHECK(parse_testfloat_rounding("rminMag") == RoundingMode::toward_zero);
  CHECK(parse_testfloat_rounding("rmin") == RoundingMode::toward_negative);
  CHECK(parse_testfloat_rounding("rmax") == RoundingMode::toward_positive);
  CHECK(parse_testfloat_rounding("rodd") == RoundingMode::odd);
  CHECK_FALSE(parse_testfloat_rounding("near_even").has_value());
  CHECK_FALSE(testfloat_rounding_name(RoundingMode::stochastic).has_value());
  CHECK(testfloat_rounding_name(RoundingMode::odd) == "rodd");
}

TEST_CASE("testfloat checker: passes and reports mismatches and accepts any NaN for a NaN", "[testfloat]") {
  // 1 + 1 = 2 exactly; 1 + 2^-11 is a tie that rounds to even (1), inexact.
  std::istringstream good("3C00 3C00 4000 00\n3C00 1000 3C00 01\n\n");
  auto report = check_testfloat(good, TestFloatFunction::f16_add, RoundingMode::nearest_even);
  CHECK(report.passed == 2);
  CHECK(report.failed == 0);
  CHECK(report.first_mismatches.empty());

  // Wrong expectations: the report names the line, inputs, expected and got.
  std::istringstream bad("3C00 3C00 4001 00\r\n3C00 1000 3C00 00\n3C00 3C00 4000 00\n");
  report = check_testfloat(bad, TestFloatFunction::f16_add, RoundingMode::nearest_even, 1);
  CHECK(report.passed == 1);
  CHECK(report.failed == 2);
  REQUIRE(report.first_mismatches.size() == 1);
  const std::string& m = report.first_mismatches[0];
  INFO(m);
  CHECK(m.find("line 1") != std::string::npos);
  CHECK(m.find("f16_add(3C00, 3C00)") != std::string::npos);
  CHECK(m.find("rnear_even") != std::string::npos);
  CHECK(m.find("expected 4001 flags 00") != std::string::npos);
  CHECK(m.find("got 4000 flags 00") != std::string::npos);

  // A flag mismatch is named.
  std::istringstream flags("3C00 1000 3C00 00\n");
  report = check_testfloat(flags, TestFloatFunction::f16_add, RoundingMode::nearest_even);
  REQUIRE(report.first_mismatches.size() == 1);
  CHECK(report.first_mismatches[0].find("inexact") != std::string::npos);

  // inf - inf: invalid, NaN. Any NaN encoding is accepted for an expected NaN,
  // but the flags must still match exactly.
  std::istringstream nan("7C00 FC00 7FFF 10\n7C00 FC00 FE01 10\n7C00 FC00 7E00 00\n7C00 FC00 7C00 10\n");
  report = check_testfloat(nan, TestFloatFunction::f16_add, RoundingMode::nearest_even);
  CHECK(report.passed == 2);
  CHECK(report.failed == 2);

  // Conversions: binary32 1.0 -> binary16, and binary16 back, exact.
  std::istringstream to_half("3F800000 3C00 00\n");
  CHECK(check_testfloat(to_half, TestFloatFunction::f32_to_f16, RoundingMode::toward_zero).passed == 1);
  std::istringstream to_single("3C00 3F800000 00\n");
  CHECK(check_testfloat(to_single, TestFloatFunction::f16_to_f32, RoundingMode::odd).passed == 1);
}

TEST_CASE("testfloat checker: malformed lines name the line and the token", "[testfloat]") {
  auto error_of = [](const std::string& text, TestFloatFunction f) -> std::string {
    std::istringstream lines(text);
    try {
      check_testfloat(lines, f, RoundingMode::nearest_even);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  std::string e = error_of("3C00 3C00 4000 00\n3C00 3CG0 4000 00\n", TestFloatFunction::f16_add);
  INFO(e);
  CHECK(e.find("line 2") != std::string::npos);
  CHECK(e.find("'3CG0'") != std::string::npos);

  e = error_of("3C00 3C00 4000\n", TestFloatFunction::f16_add);  // a field short
  CHECK(e.find("line 1") != std::string::npos);
  e = error_of("3C00 3C00 4000 00 00\n", TestFloatFunction::f16_add);  // a field too many
  CHECK(e.find("line 1") != std::string::npos);
  e = error_of("3F800000 3C00 00\n", TestFloatFunction::f16_sqrt);  // binary32 operand for a binary16 function
  CHECK(e.find("'3F800000'") != std::string::npos);
  e = error_of("3C00 3C00 4000 20\n", TestFloatFunction::f16_add);  // no such flag
  CHECK(e.find("'20'") != std::string::npos);

  std::istringstream any("3C00 3C00 4000 00\n");
  CHECK_THROWS_AS(check_testfloat(any, TestFloatFunction::f16_add, RoundingMode::stochastic), std::invalid_argument);
}

// --- The vectors ------------------------------------------------------------------

TEST_CASE("testfloat: every vector file is of a supported function and mode", "[testfloat]") {
  const fs::path dir = testfloat_dir_or_skip();
  const auto files = vector_files(dir);
  CHECK(files.size() > 0);
  for (const VectorFile& file : files) {
    INFO(file.path.string());
    CHECK(parse_testfloat_function(file.function).has_value());
    if (!file.mode.empty()) CHECK(parse_testfloat_rounding(file.mode).has_value());
  }
}

#define MPSIM_TESTFLOAT_CASE(function)                                                                  \
  TEST_CASE("testfloat: " #function, "[testfloat]") { check_function_files(#function); }

MPSIM_TESTFLOAT_CASE(f32_to_f16)
MPSIM_TESTFLOAT_CASE(f64_to_f16)
MPSIM_TESTFLOAT_CASE(f32_to_bf16)
MPSIM_TESTFLOAT_CASE(f16_to_f32)
MPSIM_TESTFLOAT_CASE(bf16_to_f32)
MPSIM_TESTFLOAT_CASE(f16_add)
MPSIM_TESTFLOAT_CASE(f16_sub)
MPSIM_TESTFLOAT_CASE(f16_mul)
MPSIM_TESTFLOAT_CASE(f16_div)
MPSIM_TESTFLOAT_CASE(f16_sqrt)
MPSIM_TESTFLOAT_CASE(f16_mulAdd)

}  // namespace mpsim
