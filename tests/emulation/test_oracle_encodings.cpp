// Formats and encodings against the MPFR oracle: the parameters of presets and
// custom formats, and, for every encoding of binary16, bfloat16 and the small
// formats, decode (exact value), classify, signaling-NaN detection, nextUp /
// nextDown and sqrt in every deterministic rounding mode.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "test_oracle_common.hpp"

namespace mpsim::oracle::testing {
namespace {

using S = Subnormals;
using O = Overflow;
using P = Specials;

// Presets first, then custom formats with every option: flush-to-zero,
// saturation, NaN-only specials, M = 0, E = 2, binary64's own shape.
const std::vector<Format> kParameterFormats = {
    formats::binary16, formats::bfloat16, formats::tf32, formats::e4m3, formats::e5m2, formats::binary32,
    formats::binary64,
    {2, 0}, {2, 1}, {2, 3}, {3, 0}, {3, 1}, {3, 1, S::gradual, O::ieee, P::nan_only}, {4, 3},
    {4, 3, S::gradual, O::ieee, P::nan_only}, {4, 3, S::flush_to_zero, O::saturate, P::nan_only},
    {5, 2, S::gradual, O::saturate}, {5, 10, S::flush_to_zero}, {6, 9}, {6, 9, S::flush_to_zero, O::saturate},
    {8, 0}, {8, 7, S::flush_to_zero}, {8, 23, S::flush_to_zero}, {8, 23, S::gradual, O::saturate},
    {11, 0}, {11, 10}, {11, 52, S::flush_to_zero}, {11, 52, S::gradual, O::saturate}, {3, 4, S::gradual, O::saturate},
    {2, 1, S::gradual, O::saturate, P::nan_only}, {7, 40}, {10, 52, S::flush_to_zero, O::saturate},
    // No infinity, no NaN (OCP MX FP4/FP6 and others of the kind).
    formats::e2m1, formats::e3m2, formats::e2m3, {2, 0, S::gradual, O::saturate, P::none},
    {4, 3, S::flush_to_zero, O::saturate, P::none}, {8, 7, S::gradual, O::saturate, P::none}};

// Every format with at most 16 bits used for exhaustive encoding checks,
// besides binary16 and bfloat16.
const std::vector<Format> kSmallFormats = {
    formats::e4m3, formats::e5m2, {2, 0}, {2, 1}, {2, 3}, {3, 0}, {3, 1, S::gradual, O::ieee, P::nan_only},
    {3, 4, S::gradual, O::saturate}, {4, 3}, {4, 3, S::gradual, O::ieee, P::nan_only}, {5, 2, S::flush_to_zero},
    {5, 10, S::flush_to_zero}, {6, 9}, {6, 9, S::flush_to_zero, O::saturate}, {8, 0}, {8, 7, S::flush_to_zero},
    {8, 7, S::gradual, O::saturate, P::nan_only}, {2, 1, S::gradual, O::saturate, P::nan_only}, {7, 8},
    formats::e2m1, formats::e3m2, formats::e2m3, {2, 0, S::gradual, O::saturate, P::none},
    {4, 3, S::flush_to_zero, O::saturate, P::none}, {8, 7, S::gradual, O::saturate, P::none}};

std::string value_text(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%a", v);
  return text;
}

bool same_double(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

void check_parameters(const Format& f, MismatchLog& log) {
  const Facts& k = facts(f);
  const std::string name = format_name(f);
  if (const auto why = f.invalid_reason()) {
    log.fail(name + " is rejected by the emulator: " + *why);
    return;
  }
  const auto expect_int = [&](const char* what, long long got, long long want) {
    log.count();
    if (got != want) log.fail(name + " " + what + ": expected " + std::to_string(want) + ", got " + std::to_string(got));
  };
  const auto expect_double = [&](const char* what, double got, const Real& want) {
    log.count();
    if (!same_double(got, want.to_double())) {
      log.fail(name + " " + what + ": expected " + value_text(want.to_double()) + ", got " + value_text(got));
    }
  };
  const auto expect_bits = [&](const char* what, Bits got, Bits want) {
    log.check(f, [&] { return name + " " + what; }, Rounded{want, {}}, Rounded{got, {}});
  };
  expect_int("precision", f.precision(), k.precision);
  expect_int("bias", f.bias(), k.bias);
  expect_int("total_bits", f.total_bits(), 1 + f.exponent_bits + f.mantissa_bits);
  expect_int("emin", f.emin(), k.emin);
  expect_int("emax", f.emax(), k.emax);
  expect_int("has_infinity", f.has_infinity(), k.has_infinity);
  // The largest significand, as an integer of p bits, is largest / 2^(emax-M).
  Real significand;
  mpfr_mul_2si(significand.get(), k.largest.get(), f.mantissa_bits - k.emax, MPFR_RNDN);
  expect_int("max_significand", static_cast<long long>(f.max_significand()),
             static_cast<long long>(mpfr_get_uj(significand.get(), MPFR_RNDN)));
  expect_double("largest_finite", f.largest_finite(), k.largest);
  expect_double("smallest_normal", f.smallest_normal(), k.smallest_normal);
  expect_double("smallest_subnormal", f.smallest_subnormal(), k.smallest_positive);
  expect_double("unit_roundoff", f.unit_roundoff(), k.unit_roundoff);
  expect_double("machine_epsilon", f.machine_epsilon(), k.machine_epsilon);
  // The gap above 1 is the machine epsilon (derived by the oracle's nextUp).
  Real gap;
  mpfr_sub_ui(gap.get(), decode(f, oracle::next_up(f, encode(f, 1.0))).value.get(), 1, MPFR_RNDN);
  expect_double("machine_epsilon (gap above 1)", f.machine_epsilon(), gap);
  // Every value is a binary32 value: precision <= 24 and the range inside binary32's.
  const bool fits = k.precision <= 24 && k.emax <= 127 && k.emin - f.mantissa_bits >= -149;
  expect_int("fits_in_float", mpsim::fits_in_float(f), fits);

  for (bool negative : {false, true}) {
    expect_bits(negative ? "largest_finite_bits(-)" : "largest_finite_bits(+)", mpsim::largest_finite_bits(f, negative),
                largest_bits(f, negative));
    const Bits nan = mpsim::quiet_nan(f, negative);
    if (f.specials == P::none) {  // no NaN: what a NaN becomes, +largest (contract)
      expect_bits("quiet_nan (no NaN in the format)", nan, largest_bits(f, false));
      expect_bits("infinity_or_nan (no infinity, no NaN)", mpsim::infinity_or_nan(f, negative), largest_bits(f, negative));
      continue;
    }
    const Decoded d = decode(f, nan);
    log.count();
    if (d.kind != FloatClass::nan || d.signaling || d.negative != negative) {
      log.fail(name + " quiet_nan(" + (negative ? "-" : "+") + ") is " + describe(f, nan));
    }
    const Bits beyond = mpsim::infinity_or_nan(f, negative);
    if (k.has_infinity) {
      expect_bits("infinity_or_nan", beyond, infinity_bits(f, negative));
    } else {
      log.count();
      if (oracle::classify(f, beyond) != FloatClass::nan) log.fail(name + " infinity_or_nan is " + describe(f, beyond));
    }
  }
}

// Exact value, class, signaling bit, and (for formats that fit) binary32 value.
void check_decoding(const Format& f, Bits b, MismatchLog& log) {
  const Decoded want = decode(f, b);
  const std::string what = format_name(f) + " " + describe(f, b);
  log.count(4);
  const FloatClass kind = mpsim::classify(f, b);
  if (kind != want.kind) {
    log.fail(what + ": classify gives " + std::string(class_name(kind)));
  }
  const bool signaling = mpsim::is_signaling_nan(f, b);
  if (signaling != (want.kind == FloatClass::nan && want.signaling)) {
    log.fail(what + ": is_signaling_nan gives " + (signaling ? "true" : "false"));
  }
  const double value = mpsim::to_double(f, b);
  if (want.kind == FloatClass::nan) {
    if (!std::isnan(value) || std::signbit(value) != want.negative) {
      log.fail(what + ": to_double gives " + value_text(value) + ", a NaN of the same sign expected");
    }
  } else if (!same_double(value, want.value.to_double())) {
    log.fail(what + ": to_double gives " + value_text(value));
  }
  if (facts(f).precision <= 24 && facts(f).emax <= 127 && facts(f).emin - f.mantissa_bits >= -149) {
    const float single = mpsim::to_float(f, b);
    if (want.kind == FloatClass::nan) {
      if (!std::isnan(single) || std::signbit(single) != want.negative) {
        log.fail(what + ": to_float gives " + value_text(single) + ", a NaN of the same sign expected");
      }
    } else if (!same_double(static_cast<double>(single), want.value.to_double())) {
      log.fail(what + ": to_float gives " + value_text(single));
    }
  }
}

void check_neighbours(const Format& f, Bits b, MismatchLog& log) {
  log.check(f, [&] { return format_name(f) + " next_up of " + describe(f, b); }, Rounded{oracle::next_up(f, b), {}},
            Rounded{mpsim::next_up(f, b), {}});
  log.check(f, [&] { return format_name(f) + " next_down of " + describe(f, b); }, Rounded{oracle::next_down(f, b), {}},
            Rounded{mpsim::next_down(f, b), {}});
}

// Checks the oracle's nextUp by a different route: sort every value of the
// format and take the next larger one. (Oracle self-test; no emulator code.)
void check_oracle_neighbours_by_sorting(const Format& f, MismatchLog& log) {
  const std::uint64_t count = std::uint64_t{1} << (1 + f.exponent_bits + f.mantissa_bits);
  std::vector<double> values;
  for (std::uint64_t i = 0; i < count; ++i) {
    const Decoded d = decode(f, Bits{i});
    if (d.kind != FloatClass::nan) values.push_back(d.value.to_double());
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());  // +0 and -0 are one value
  for (std::uint64_t i = 0; i < count && !log.full(); ++i) {
    const Decoded d = decode(f, Bits{i});
    if (d.kind == FloatClass::nan) continue;
    const double x = d.value.to_double();
    const auto above = std::upper_bound(values.begin(), values.end(), x);
    double want = above == values.end() ? x : *above;  // the largest stays (+inf, or the largest finite)
    if (want == 0) want = -0.0;                          // nextUp(-smallest) is -0
    const double got = decode(f, oracle::next_up(f, Bits{i})).value.to_double();
    log.count();
    if (!same_double(got, want)) {
      log.fail("oracle self-test: " + format_name(f) + " nextUp(" + describe(f, Bits{i}) + ") = " + value_text(got) +
               ", the sorted values say " + value_text(want));
    }
  }
}

void check_every_encoding(const Format& f, MismatchLog& log) {
  check_oracle_neighbours_by_sorting(f, log);
  const std::uint64_t count = std::uint64_t{1} << (1 + f.exponent_bits + f.mantissa_bits);
  for (std::uint64_t i = 0; i < count && !log.full(); ++i) {
    check_decoding(f, Bits{i}, log);
    check_neighbours(f, Bits{i}, log);
  }
}

void check_every_sqrt(const Format& f, MismatchLog& log) {
  const std::uint64_t count = std::uint64_t{1} << (1 + f.exponent_bits + f.mantissa_bits);
  for (std::uint64_t i = 0; i < count && !log.full(); ++i) check_operation(log, f, Operation::sqrt, Bits{i});
}

}  // namespace

TEST_CASE("oracle: format parameters of presets and custom formats", "[oracle][format]") {
  MismatchLog log(20);
  for (const Format& f : kParameterFormats) check_parameters(f, log);
  log.finish();
}

TEST_CASE("oracle: every binary16 encoding: decode/classify/nextUp/nextDown", "[oracle][format]") {
  MismatchLog log;
  check_every_encoding(formats::binary16, log);
  log.finish();
}

TEST_CASE("oracle: every bfloat16 encoding: decode/classify/nextUp/nextDown", "[oracle][format]") {
  MismatchLog log;
  check_every_encoding(formats::bfloat16, log);
  log.finish();
}

TEST_CASE("oracle: every encoding of 8-bit and small custom formats: decode/classify/neighbours",
          "[oracle][format]") {
  MismatchLog log;
  for (const Format& f : kSmallFormats) {
    if (log.full()) break;
    check_every_encoding(f, log);
  }
  log.finish();
}

TEST_CASE("oracle: sqrt of every binary16 encoding in every mode", "[oracle][sqrt]") {
  MismatchLog log;
  check_every_sqrt(formats::binary16, log);
  log.finish();
}

TEST_CASE("oracle: sqrt of every bfloat16 encoding in every mode", "[oracle][sqrt]") {
  MismatchLog log;
  check_every_sqrt(formats::bfloat16, log);
  log.finish();
}

TEST_CASE("oracle: sqrt of every encoding of 8-bit and small custom formats in every mode", "[oracle][sqrt]") {
  MismatchLog log;
  for (const Format& f : kSmallFormats) {
    if (log.full()) break;
    check_every_sqrt(f, log);
  }
  log.finish();
}

}  // namespace mpsim::oracle::testing
