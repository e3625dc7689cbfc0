// The kernels' rounding of exact sums (gpu/src/round_binary64.hpp), compiled
// for the host: add_round_to_odd against an independent TwoSum formulation,
// and round_double against the emulator's exact quantize path (Path::exact)
// of binary64 arrays
// (the CPU backend's apply_update and rounding-every-addition GEMM use the
// same two steps): bit patterns and every counter, for preset and custom
// formats, all modes, stochastic rounding with 32, 8 and 1 random bits on the
// same counter-based draws. Inputs: binary64 magnitudes over 2^-160..2^140,
// sums of two binary32 values rounded to odd, random binary64 patterns (NaN
// payloads included), edge values with their neighbours, and every format's
// values, their neighbours and midpoints.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "mpsim/emulation/quantize.hpp"
#include "mpsim/gpu/device_format.hpp"
#include "round_binary64.hpp"

namespace mpsim::gpu {
namespace {

// x + y rounded to odd: the nearest-even sum, moved one ulp toward the exact
// sum when it is inexact and even (Boldo and Melquiond 2008).
double oracle_round_to_odd_sum(double x, double y) {
  const double s = x + y;
  const double bb = s - x;
  const double error = (x - (s - bb)) + (y - bb);  // TwoSum: exact when s is finite
  if (error == 0.0 || !std::isfinite(s) || (std::bit_cast<std::uint64_t>(s) & 1u) != 0) return s;
  return std::nextafter(s, error > 0 ? INFINITY : -INFINITY);
}

float signed_power(std::mt19937_64& rng, float exponent) {
  return ((rng() & 1) ? -1.0f : 1.0f) * std::exp2(exponent);
}

std::vector<double> common_inputs(std::mt19937_64& rng) {
  std::vector<double> in;
  std::uniform_real_distribution<double> wide(-160, 140);
  for (int i = 0; i < 50000; ++i) in.push_back(((rng() & 1) ? -1.0 : 1.0) * std::exp2(wide(rng)));
  std::uniform_real_distribution<float> exponent(-150, 128);
  for (int i = 0; i < 50000; ++i) {
    const float w = signed_power(rng, exponent(rng));
    const float u = i % 3 == 0 ? w * std::ldexp(1.0f, -static_cast<int>(rng() % 40))
                               : signed_power(rng, exponent(rng) * 0.3f - 20.0f);
    in.push_back(oracle_round_to_odd_sum(w, u));
  }
  for (int i = 0; i < 50000; ++i) in.push_back(std::bit_cast<double>(rng()));
  const double edges[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN, 65504.0, 65520.0, 448.0, 464.0, 57344.0,
                          61440.0, 3.4028235677973366e38, 1e300, 1e-300, 5e-324, std::ldexp(1.0, -126),
                          std::ldexp(1.0, -127), std::ldexp(1.0, -149), std::ldexp(1.0, -150), std::ldexp(3.0, -151),
                          std::ldexp(1.0, -24), std::ldexp(1.0, -25), std::ldexp(3.0, -26), std::ldexp(1.0, -14)};
  for (const double x : edges) {
    in.push_back(x);
    in.push_back(std::nextafter(x, INFINITY));
    in.push_back(std::nextafter(x, -INFINITY));
  }
  return in;
}

}  // namespace

TEST_CASE("device add_round_to_odd equals the TwoSum round-to-odd sum", "[gpu-host][binary64]") {
  std::mt19937_64 rng(20261121);
  std::uniform_real_distribution<float> exponent(-150, 128);
  std::size_t mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float w = signed_power(rng, exponent(rng));
    const float u = i % 3 == 0 ? w * std::ldexp(1.0f, -static_cast<int>(rng() % 40)) : signed_power(rng, exponent(rng));
    const double want = oracle_round_to_odd_sum(w, u), got = add_round_to_odd(w, u);
    mismatches += std::bit_cast<std::uint64_t>(want) != std::bit_cast<std::uint64_t>(got);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("device round_double equals the emulator's quantize of binary64 values", "[gpu-host][binary64]") {
  std::mt19937_64 rng(7);
  const std::vector<double> common = common_inputs(rng);
  for (const char* name : {"binary16", "bfloat16", "tf32", "e4m3", "e5m2", "binary32", "e5m2:ftz", "e4m3:sat",
                           "binary16:ftz", "e8m0", "e3m2", "e8m23:ftz", "e2m1:fn"}) {
    const Format format = *parse_format(name);
    std::vector<double> in = common;
    // The format's values, their binary64 neighbours and the midpoints between neighbours.
    for (int i = 0; i < 5000; ++i) {
      const double v = ((rng() & 1) ? -1.0 : 1.0) *
                       std::ldexp(1.0 + static_cast<double>(rng() % 16) / 16.0, static_cast<int>(rng() % 300) - 160);
      const Bits bits = round_to_format(format, {}, v).bits;
      const double value = to_double(format, bits), next = to_double(format, next_up(format, bits));
      in.insert(in.end(), {value, std::nextafter(value, INFINITY), std::nextafter(value, -INFINITY)});
      if (std::isfinite(next)) in.insert(in.end(), {(value + next) / 2, std::nextafter((value + next) / 2, 0.0)});
    }
    const DeviceFormat device_format = make_device_format(format);
    for (int mode = 0; mode <= 6; ++mode)
      for (const int random_bits : {32, 8, 1}) {
        if (random_bits != 32 && static_cast<RoundingMode>(mode) != RoundingMode::stochastic) continue;
        QuantizeOptions o;
        o.rounding = {static_cast<RoundingMode>(mode), random_bits};
        o.stochastic = {{7, 11}, 5ull << 32};
        o.path = Path::exact;
        std::vector<double> expected(in.size());
        const QuantizeCounts expected_counts = quantize(format, in, expected, o);
        const DrawKey key = make_draw_key(o.stochastic.key);
        QuantizeCounts counts;
        counts.elements = in.size();
        std::size_t mismatches = 0;
        double first_input = 0.0;
        for (std::size_t i = 0; i < in.size(); ++i) {
          const auto r = round_double(in[i], device_format, make_device_rounding(o.rounding),
                                      device_random_draw(key.low, key.high, o.stochastic.first_index + i));
          counts.inexact += r.inexact;
          counts.flushed_to_zero += r.flushed_to_zero;
          counts.subnormal += r.subnormal;
          counts.overflow += r.overflow;
          counts.nan += r.nan;
          if (std::bit_cast<std::uint32_t>(static_cast<float>(expected[i])) != std::bit_cast<std::uint32_t>(r.value)) {
            if (mismatches++ == 0) first_input = in[i];
          }
        }
        INFO(name << ", mode " << to_string(static_cast<RoundingMode>(mode)) << ", " << random_bits
                  << " random bits; first mismatch at input " << first_input);
        CHECK(mismatches == 0);
        CHECK(counts == expected_counts);
      }
  }
}

}  // namespace mpsim::gpu
