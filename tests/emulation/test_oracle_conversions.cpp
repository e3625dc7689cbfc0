// Conversions against the MPFR oracle, every deterministic rounding mode:
// binary64 and binary32 values into the presets and custom formats (through
// round_to_format and through convert from the binary64/binary32 encodings),
// sampled at random and where rounding is delicate (overflow threshold,
// subnormal range and tininess boundary, neighbours and midpoints +- 1 ulp of
// the source, edge cases); and every encoding of the 8- and 16-bit formats
// converted into the others.
#include <catch2/catch.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_oracle_common.hpp"

namespace mpsim::oracle::testing {
namespace {

using S = Subnormals;
using O = Overflow;
using P = Specials;

constexpr Format kBinary64{11, 52};
constexpr Format kBinary32{8, 23};
// Each sample index checks one binary64 and one binary32 input, every mode.
constexpr int kDefaultSamples = 100000;
constexpr int kExhaustivePresetSamples = 5000000;  // 1e7 inputs per preset, [.exhaustive]
constexpr int kExhaustiveCustomSamples = 500000;   // 1e6 inputs per custom format, [.exhaustive]
constexpr std::size_t kPresetCount = 7;                   // the first entries of kTargets

std::string double_text(double x) {
  char text[96];
  std::snprintf(text, sizeof text, "%a (0x%016llx)", x, static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(x)));
  return text;
}
std::string float_text(float x) {
  char text[96];
  std::snprintf(text, sizeof text, "%a (0x%08x)", static_cast<double>(x), std::bit_cast<std::uint32_t>(x));
  return text;
}

void check_double(const Format& f, double x, MismatchLog& log) {
  const Exact exact = exact_from_double(x);
  const Bits source{std::bit_cast<std::uint64_t>(x)};
  for (RoundingMode mode : kDeterministicModes) {
    const Rounded want = oracle::round(f, mode, exact);
    log.check(f, [&] {
      return "round_to_format(" + format_name(f) + ", " + std::string(mode_name(mode)) + ", double " + double_text(x) + ")";
    }, want, mpsim::round_to_format(f, Rounding{mode}, x));
    log.check(f, [&] {
      return "convert(binary64 " + double_text(x) + " -> " + format_name(f) + ", " + std::string(mode_name(mode)) + ")";
    }, want, mpsim::convert(kBinary64, source, f, Rounding{mode}));
  }
}

void check_float(const Format& f, float x, MismatchLog& log) {
  const Exact exact = exact_from_float(x);
  const Bits source{std::bit_cast<std::uint32_t>(x)};
  for (RoundingMode mode : kDeterministicModes) {
    const Rounded want = oracle::round(f, mode, exact);
    log.check(f, [&] {
      return "round_to_format(" + format_name(f) + ", " + std::string(mode_name(mode)) + ", float " + float_text(x) + ")";
    }, want, mpsim::round_to_format(f, Rounding{mode}, x));
    log.check(f, [&] {
      return "convert(binary32 " + float_text(x) + " -> " + format_name(f) + ", " + std::string(mode_name(mode)) + ")";
    }, want, mpsim::convert(kBinary32, source, f, Rounding{mode}));
  }
}

// Samples [begin, end) of the deterministic sequence for `f` and `seed`: the
// first ones are the edge cases, then random ones; each moved by one ulp of
// the source type a third of the time in each direction.
void check_samples(const Format& f, std::uint64_t seed, std::uint64_t begin, std::uint64_t end, MismatchLog& log) {
  const std::vector<double> edges = edge_doubles(f);
  const std::vector<Bits> boundaries = edge_bits(f);
  Rng rng(seed ^ (begin * 0x9E3779B97F4A7C15ull));
  const double inf = std::numeric_limits<double>::infinity();
  for (std::uint64_t i = begin; i < end && !log.full(); ++i) {
    const double x = i < edges.size() ? edges[i] : conversion_sample(f, rng, edges, boundaries);
    const std::uint64_t nudge = i < edges.size() ? 0 : rng() % 3;
    const double xd = nudge == 0 ? x : std::nextafter(x, nudge == 1 ? inf : -inf);
    check_double(f, xd, log);
    const float xf = static_cast<float>(x);
    const float xs = nudge == 0 ? xf : std::nextafter(xf, nudge == 1 ? HUGE_VALF : -HUGE_VALF);
    check_float(f, std::isnan(x) ? float_nan_like(x) : xs, log);
  }
}

void check_conversions(const Format& f, int samples, std::uint64_t seed) {
  INFO("format " << format_name(f) << ", seed " << seed << ", " << samples << " samples from binary64 and binary32");
  REQUIRE_FALSE(f.invalid_reason().has_value());
  MismatchLog log;
  check_samples(f, seed, 0, static_cast<std::uint64_t>(samples), log);
  log.finish();
}

void check_conversions_parallel(const Format& f, int samples, std::uint64_t seed) {
  INFO("format " << format_name(f) << ", seed " << seed << ", " << samples << " samples from binary64 and binary32");
  REQUIRE_FALSE(f.invalid_reason().has_value());
  MismatchLog log;
  parallel_chunks(static_cast<std::uint64_t>(samples), 20000, log,
                  [&](std::uint64_t begin, std::uint64_t end, MismatchLog& local) {
                    check_samples(f, seed, begin, end, local);
                  });
  log.finish();
}

// The formats converted into: the presets and custom formats with every option.
const std::vector<std::pair<const char*, Format>> kTargets = {
    {"binary16", formats::binary16},
    {"bfloat16", formats::bfloat16},
    {"tf32", formats::tf32},
    {"e4m3", formats::e4m3},
    {"e5m2", formats::e5m2},
    {"binary32", formats::binary32},
    {"binary64", formats::binary64},
    {"e5m10:ftz", {5, 10, S::flush_to_zero}},
    {"e8m7:ftz", {8, 7, S::flush_to_zero}},
    {"e8m23:ftz:sat", {8, 23, S::flush_to_zero, O::saturate}},
    {"e5m2:sat", {5, 2, S::gradual, O::saturate}},
    {"e4m3:fn (no saturation)", {4, 3, S::gradual, O::ieee, P::nan_only}},
    {"e4m3 (IEEE specials)", {4, 3}},
    {"e2m0", {2, 0}},
    {"e3m0:sat", {3, 0, S::gradual, O::saturate}},
    {"e8m0", {8, 0}},
    {"e2m1 (IEEE specials)", {2, 1}},
    {"e2m1", formats::e2m1},
    {"e3m2", formats::e3m2},
    {"e2m3", formats::e2m3},
    {"e4m3:finite:ftz", {4, 3, S::flush_to_zero, O::saturate, P::none}},
    {"e2m3:fn:sat", {2, 3, S::gradual, O::saturate, P::nan_only}},
    {"e3m4:sat", {3, 4, S::gradual, O::saturate}},
    {"e6m9:ftz:sat", {6, 9, S::flush_to_zero, O::saturate}},
    {"e11m10", {11, 10}},
    {"e11m52:ftz:sat", {11, 52, S::flush_to_zero, O::saturate}},
    {"e10m51", {10, 51}},
};

const Format& target(const char* name) {
  for (const auto& [n, f] : kTargets) {
    if (std::string(n) == name) return f;
  }
  throw std::logic_error("unknown target");
}

}  // namespace

// One test case per target format, so each stays a few seconds.
#define MPSIM_ORACLE_CONVERSION_CASE(NAME, SEED)                                                        \
  TEST_CASE("oracle: binary64 and binary32 values into " NAME " in every mode", "[oracle][conversion]") { \
    check_conversions(target(NAME), kDefaultSamples, SEED);                                               \
  }

MPSIM_ORACLE_CONVERSION_CASE("binary16", 101)
MPSIM_ORACLE_CONVERSION_CASE("bfloat16", 102)
MPSIM_ORACLE_CONVERSION_CASE("tf32", 103)
MPSIM_ORACLE_CONVERSION_CASE("e4m3", 104)
MPSIM_ORACLE_CONVERSION_CASE("e5m2", 105)
MPSIM_ORACLE_CONVERSION_CASE("binary32", 106)
MPSIM_ORACLE_CONVERSION_CASE("binary64", 107)
MPSIM_ORACLE_CONVERSION_CASE("e5m10:ftz", 108)
MPSIM_ORACLE_CONVERSION_CASE("e8m7:ftz", 109)
MPSIM_ORACLE_CONVERSION_CASE("e8m23:ftz:sat", 110)
MPSIM_ORACLE_CONVERSION_CASE("e5m2:sat", 111)
MPSIM_ORACLE_CONVERSION_CASE("e4m3:fn (no saturation)", 112)
MPSIM_ORACLE_CONVERSION_CASE("e4m3 (IEEE specials)", 113)
MPSIM_ORACLE_CONVERSION_CASE("e2m0", 114)
MPSIM_ORACLE_CONVERSION_CASE("e3m0:sat", 115)
MPSIM_ORACLE_CONVERSION_CASE("e8m0", 116)
MPSIM_ORACLE_CONVERSION_CASE("e2m1 (IEEE specials)", 117)
MPSIM_ORACLE_CONVERSION_CASE("e2m1", 124)
MPSIM_ORACLE_CONVERSION_CASE("e3m2", 125)
MPSIM_ORACLE_CONVERSION_CASE("e2m3", 126)
MPSIM_ORACLE_CONVERSION_CASE("e4m3:finite:ftz", 127)
MPSIM_ORACLE_CONVERSION_CASE("e2m3:fn:sat", 118)
MPSIM_ORACLE_CONVERSION_CASE("e3m4:sat", 119)
MPSIM_ORACLE_CONVERSION_CASE("e6m9:ftz:sat", 120)
MPSIM_ORACLE_CONVERSION_CASE("e11m10", 121)
MPSIM_ORACLE_CONVERSION_CASE("e11m52:ftz:sat", 122)
MPSIM_ORACLE_CONVERSION_CASE("e10m51", 123)

TEST_CASE("oracle: binary64 and binary32 values into every target with 1e7 samples for presets", "[oracle][conversion][.exhaustive]") {
  for (std::size_t i = 0; i < kTargets.size(); ++i) {
    const auto& [name, f] = kTargets[i];
    const int samples = i < kPresetCount ? kExhaustivePresetSamples : kExhaustiveCustomSamples;
    SECTION(name) { check_conversions_parallel(f, samples, 1001 + i); }
  }
}

// --- Between formats: every encoding of the small formats ----------------------
namespace {

void check_every_conversion(const Format& from, const std::vector<Format>& targets) {
  MismatchLog log;
  const std::uint64_t count = std::uint64_t{1} << (1 + from.exponent_bits + from.mantissa_bits);
  for (const Format& to : targets) {
    if (to == from) continue;
    for (std::uint64_t i = 0; i < count && !log.full(); ++i) {
      const Bits b{i};
      const Exact exact = exact_from_encoding(from, b);
      for (RoundingMode mode : kDeterministicModes) {
        log.check(to, [&] {
          return "convert(" + format_name(from) + " " + describe(from, b) + " -> " + format_name(to) + ", " +
                 std::string(mode_name(mode)) + ")";
        }, oracle::round(to, mode, exact), mpsim::convert(from, b, to, Rounding{mode}));
      }
    }
  }
  log.finish();
}

const std::vector<Format> kNarrowTargets = {
    formats::binary16, formats::bfloat16, formats::e4m3, formats::e5m2, formats::tf32, {2, 1},
    {4, 3, S::gradual, O::ieee, P::nan_only}, {5, 10, S::flush_to_zero}, {3, 0, S::gradual, O::saturate}};

const std::vector<Format> kAllSmallTargets = {
    formats::binary16, formats::bfloat16, formats::e4m3, formats::e5m2, formats::tf32, formats::binary32,
    {2, 0}, {2, 1}, {3, 0, S::gradual, O::saturate}, {8, 0}, {4, 3}, {4, 3, S::gradual, O::ieee, P::nan_only},
    {5, 2, S::gradual, O::saturate}, {5, 10, S::flush_to_zero}, {8, 7, S::flush_to_zero}, {3, 4, S::gradual, O::saturate},
    {2, 3, S::gradual, O::saturate, P::nan_only}};

}  // namespace

TEST_CASE("oracle: every binary16 encoding converted into 8- and 16-bit formats in every mode", "[oracle][conversion]") {
  check_every_conversion(formats::binary16, kNarrowTargets);
}

TEST_CASE("oracle: every bfloat16 encoding converted into 8- and 16-bit formats in every mode", "[oracle][conversion]") {
  check_every_conversion(formats::bfloat16, kNarrowTargets);
}

TEST_CASE("oracle: every encoding of the 8-bit formats converted into the others in every mode", "[oracle][conversion]") {
  for (const Format& from : {formats::e4m3, formats::e5m2, Format{4, 3}, Format{5, 2, S::flush_to_zero},
                             Format{4, 3, S::flush_to_zero, O::saturate, P::nan_only}, Format{2, 5}}) {
    check_every_conversion(from, kAllSmallTargets);
  }
}

TEST_CASE("oracle: every encoding of flush-to-zero 16-bit formats converted in every mode", "[oracle][conversion]") {
  check_every_conversion(Format{5, 10, S::flush_to_zero}, {formats::binary16, formats::e4m3, formats::e5m2, formats::binary32});
  check_every_conversion(Format{8, 7, S::flush_to_zero}, {formats::bfloat16, formats::binary16, formats::e5m2});
}

}  // namespace mpsim::oracle::testing
