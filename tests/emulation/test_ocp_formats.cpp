// OCP Microscaling (MX) v1.0 element formats without infinity or NaN (FP4
// E2M1, FP6 E3M2 and E2M3, §5.3.3) against the specification itself: the
// value of every encoding from the spec's formula, written here, and rounding
// checked by brute force over the table of values (no MPFR, no emulator code
// in the oracle). NaN and infinity inputs follow CUDA's documented
// conversions (cuda_fp6.h: "Large out-of-range values saturate to MAXNORM of
// the same sign. NaN input values result in positive MAXNORM").
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/rounding.hpp"

namespace mpsim {
namespace {

struct OcpElement {
  Format format;
  int exponent_bits, mantissa_bits, bias;
  double largest, smallest_normal, smallest_subnormal;  // OCP MX v1.0 Table 2 / §5.3.3
};

const OcpElement kElements[] = {
    {formats::e2m1, 2, 1, 1, 6.0, 1.0, 0.5},
    {formats::e3m2, 3, 2, 3, 28.0, 0.25, 0.0625},
    {formats::e2m3, 2, 3, 1, 7.5, 1.0, 0.125},
};

// The spec's decoding: exponent field 0 is subnormal, (-1)^S 2^(1-bias) 0.M;
// otherwise (-1)^S 2^(E-bias) 1.M. Every encoding is a number.
double spec_value(const OcpElement& e, std::uint64_t code) {
  const std::uint64_t mantissa = code & ((1u << e.mantissa_bits) - 1);
  const std::uint64_t exponent = (code >> e.mantissa_bits) & ((1u << e.exponent_bits) - 1);
  const bool negative = ((code >> (e.exponent_bits + e.mantissa_bits)) & 1) != 0;
  const double fraction = static_cast<double>(mantissa) / static_cast<double>(1u << e.mantissa_bits);
  const double magnitude = exponent == 0 ? std::ldexp(fraction, 1 - e.bias)
                                         : std::ldexp(1.0 + fraction, static_cast<int>(exponent) - e.bias);
  return negative ? -magnitude : magnitude;
}

std::uint64_t code_count(const OcpElement& e) { return std::uint64_t{1} << (1 + e.exponent_bits + e.mantissa_bits); }

// Brute force: among the encodings, the one a mode picks for the finite x.
// Nearest: smallest distance, ties to the even code (last mantissa bit 0) or
// away from zero; directed: the nearest value on the mode's side, and beyond
// the largest the largest of x's sign (saturation). Odd: toward zero, then the
// odd code of the pair around x when inexact. Zero results keep x's sign.
std::uint64_t spec_round(const OcpElement& e, double x, RoundingMode mode) {
  const std::uint64_t sign_bit = std::uint64_t{1} << (e.exponent_bits + e.mantissa_bits);
  const bool negative = std::signbit(x);
  const double a = std::fabs(x);
  // Positive codes sorted by value (the encodings of one sign are monotone).
  std::uint64_t below = 0, above = 0;  // largest code <= a, smallest code >= a (saturating)
  for (std::uint64_t c = 0; c < sign_bit; ++c) {
    if (spec_value(e, c) <= a) below = c;
  }
  above = spec_value(e, below) == a || below + 1 == sign_bit ? below : below + 1;
  std::uint64_t pick = below;
  if (below != above) {
    const double lo = spec_value(e, below), hi = spec_value(e, above);
    const bool up_magnitude_toward = (mode == RoundingMode::toward_positive && !negative) ||
                                     (mode == RoundingMode::toward_negative && negative);
    switch (mode) {
      case RoundingMode::nearest_even:
        pick = a - lo < hi - a ? below : a - lo > hi - a ? above : ((below & 1) == 0 ? below : above);
        break;
      case RoundingMode::nearest_away: pick = a - lo < hi - a ? below : above; break;
      case RoundingMode::toward_zero: pick = below; break;
      case RoundingMode::toward_positive:
      case RoundingMode::toward_negative: pick = up_magnitude_toward ? above : below; break;
      case RoundingMode::odd: pick = (below & 1) != 0 ? below : above; break;
      case RoundingMode::stochastic: break;
    }
  }
  return negative ? pick | sign_bit : pick;
}

TEST_CASE("OCP FP4/FP6: every encoding decodes to the specification's value", "[format][ocp]") {
  for (const OcpElement& e : kElements) {
    INFO(e.format.name());
    CHECK(e.format.exponent_bits == e.exponent_bits);
    CHECK(e.format.mantissa_bits == e.mantissa_bits);
    CHECK(e.format.bias() == e.bias);
    CHECK_FALSE(e.format.has_infinity());
    CHECK_FALSE(e.format.has_nan());
    CHECK(e.format.largest_finite() == e.largest);
    CHECK(e.format.smallest_normal() == e.smallest_normal);
    CHECK(e.format.smallest_subnormal() == e.smallest_subnormal);
    for (std::uint64_t c = 0; c < code_count(e); ++c) {
      INFO("code " << c);
      const double want = spec_value(e, c);
      CHECK(std::bit_cast<std::uint64_t>(to_double(e.format, Bits{c})) == std::bit_cast<std::uint64_t>(want));
      CHECK(classify(e.format, Bits{c}) != FloatClass::nan);
      CHECK(classify(e.format, Bits{c}) != FloatClass::infinite);
    }
  }
  // The E2M1 values, as the spec lists them.
  std::vector<double> e2m1;
  for (std::uint64_t c = 0; c < 8; ++c) e2m1.push_back(to_double(formats::e2m1, Bits{c}));
  CHECK(e2m1 == std::vector<double>{0, 0.5, 1, 1.5, 2, 3, 4, 6});
}

TEST_CASE("OCP FP4/FP6: rounding in every deterministic mode agrees with brute force over the table",
          "[format][ocp]") {
  constexpr RoundingMode modes[] = {RoundingMode::nearest_even,    RoundingMode::nearest_away,
                                    RoundingMode::toward_zero,     RoundingMode::toward_positive,
                                    RoundingMode::toward_negative, RoundingMode::odd};
  std::mt19937_64 rng(20261126);
  for (const OcpElement& e : kElements) {
    // Every value, midpoint and quarter point between neighbours, their binary32
    // neighbours, beyond the largest, below the smallest subnormal; and random.
    std::vector<float> inputs;
    std::vector<double> values;
    for (std::uint64_t c = 0; c < code_count(e) / 2; ++c) values.push_back(spec_value(e, c));
    values.push_back(2 * e.largest);
    for (std::size_t i = 0; i + 1 < values.size(); ++i) {
      for (double t : {0.0, 0.25, 0.5, 0.75}) {
        const float x = static_cast<float>(values[i] + t * (values[i + 1] - values[i]));
        for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, 1e30f)}) {
          inputs.push_back(y);
          inputs.push_back(-y);
        }
      }
    }
    for (int i = 0; i < 20000; ++i) {
      const float x = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 16) - 8);
      inputs.push_back(x);
    }
    inputs.push_back(std::numeric_limits<float>::max());
    inputs.push_back(-std::numeric_limits<float>::denorm_min());
    for (RoundingMode mode : modes) {
      int mismatches = 0;
      for (float x : inputs) {
        const std::uint64_t want = spec_round(e, x, mode);
        const Rounded got = round_to_format(e.format, Rounding{mode}, x);
        if (got.bits.value != want && ++mismatches <= 5)
          FAIL_CHECK(e.format.name() << " " << to_string(mode) << " of " << x << ": got code " << got.bits.value
                                     << ", brute force " << want);
        // Flags: inexact exactly when the value moved; overflow only beyond the largest.
        CHECK(got.flags.has(Flags::inexact) == (spec_value(e, want) != static_cast<double>(x)));
      }
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("OCP FP4/FP6: infinities saturate, a NaN becomes +largest with invalid", "[format][ocp]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const OcpElement& e : kElements) {
    INFO(e.format.name());
    for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::toward_zero, RoundingMode::toward_positive}) {
      const Rounded plus = round_to_format(e.format, Rounding{mode}, inf);
      const Rounded minus = round_to_format(e.format, Rounding{mode}, -inf);
      CHECK(to_double(e.format, plus.bits) == e.largest);
      CHECK(to_double(e.format, minus.bits) == -e.largest);
      CHECK(plus.flags.has(Flags::overflow));
      const Rounded big = round_to_format(e.format, Rounding{mode}, -1e30);
      CHECK(to_double(e.format, big.bits) == -e.largest);
      for (double nan : {std::nan(""), -std::nan("")}) {
        const Rounded r = round_to_format(e.format, Rounding{mode}, nan);
        CHECK(to_double(e.format, r.bits) == e.largest);
        CHECK(r.flags.has(Flags::invalid));
      }
    }
    // The array paths agree and count the NaN.
    std::vector<float> in = {std::nanf(""), -inf, 7.0f, 0.3f}, out(4);
    for (Path path : {Path::automatic, Path::scalar, Path::exact}) {
      QuantizeOptions o;
      o.path = path;
      const QuantizeCounts counts = quantize(e.format, std::span<const float>(in), std::span<float>(out), o);
      CHECK(out[0] == static_cast<float>(e.largest));
      CHECK(out[1] == static_cast<float>(-e.largest));
      CHECK(counts.nan == 1);
      // -inf overflows everywhere; 7 only in E2M1 (it rounds to 8 > 6 with an unbounded exponent).
      CHECK(counts.overflow == (e.largest == 6.0 ? 2u : 1u));
    }
  }
}

TEST_CASE("OCP FP4/FP6: names, options and what is rejected", "[format][ocp]") {
  CHECK(parse_format("e2m1") == formats::e2m1);
  CHECK(parse_format("fp4e2m1") == formats::e2m1);
  CHECK(parse_format("fp6e3m2") == formats::e3m2);
  CHECK(parse_format("fp6e2m3") == formats::e2m3);
  CHECK(parse_format("e4m3:finite") == Format{4, 3, Subnormals::gradual, Overflow::saturate, Specials::none});
  CHECK_FALSE(parse_format("e2m1:nosat").has_value());  // nothing to overflow to
  CHECK(parse_format("e2m1:inf:nosat") == Format{2, 1});
  CHECK(formats::e4m3.largest_finite() == 448.0);  // fn: unchanged
  CHECK(Format{4, 3, Subnormals::gradual, Overflow::saturate, Specials::none}.largest_finite() == 480.0);
  for (const Format& f : {formats::e2m1, formats::e3m2, formats::e2m3, Format{2, 1}, Format{3, 2},
                          Format{4, 3, Subnormals::flush_to_zero, Overflow::saturate, Specials::none},
                          Format{2, 0, Subnormals::gradual, Overflow::saturate, Specials::none}, Format{8, 0},
                          Format{8, 0, Subnormals::gradual, Overflow::ieee, Specials::nan_only}}) {
    INFO(f.name());
    const auto back = parse_format(f.name());
    REQUIRE(back.has_value());
    if (f.mantissa_bits == 0 && f.specials != Specials::none) CHECK(back->name() == f.name());
    else CHECK(*back == f);
  }
  CHECK(Format{2, 1, Subnormals::gradual, Overflow::ieee, Specials::none}.invalid_reason().has_value());
}

}  // namespace
}  // namespace mpsim
