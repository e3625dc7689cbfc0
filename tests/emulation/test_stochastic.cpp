// Stochastic rounding (RoundingMode::stochastic): every result is one of the
// two neighbours of the exact input; the frequency of rounding up matches the
// documented probability; draws depend only on (seed, stream, element index).
//
// "Up" means away from zero, to the neighbour of larger MAGNITUDE: the
// implementation rounds |x| (rounding.cpp, round_at) and adds the draw to the
// remainder below the quantum, so for x = +-(lower + frac * gap), with lower
// the neighbour nearer zero, P(|result| > |lower|) = floor(frac * 2^bits) / 2^bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/random_draw.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "support/test_support.hpp"

namespace mpsim {
namespace {

const Format kPresets[] = {formats::binary16, formats::bfloat16, formats::tf32,    formats::e4m3,
                           formats::e5m2,     formats::binary32, formats::binary64};
constexpr int kRandomBits[] = {1, 4, 16, 32};

template <class T>
using Uint = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;

template <class T>
Uint<T> bits_of(T x) {
  return std::bit_cast<Uint<T>>(x);
}

// Equal encodings, or both NaN.
template <class T>
bool same(T a, T b) {
  return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b));
}

std::string hex_float(double x) {
  char text[40];
  std::snprintf(text, sizeof text, "%a", x);
  return text;
}

template <class T>
T stored(const Format& f, Bits bits) {
  if constexpr (std::is_same_v<T, float>) return to_float(f, bits);
  else return to_double(f, bits);
}

template <class T>
T round_directed(const Format& f, RoundingMode mode, T x) {
  return stored<T>(f, round_to_format(f, Rounding{mode}, x).bits);
}

using Random = test::SplitMix;

// Random values over the whole range of `f` and a little beyond (below the
// smallest subnormal, above the largest finite), both signs, plus one in
// sixteen raw bit patterns of T (infinities, NaNs, T's subnormals).
template <class T>
std::vector<T> random_inputs(const Format& f, std::size_t n, std::uint64_t seed) {
  Random random{seed};
  constexpr int t_mantissa = std::numeric_limits<T>::digits - 1;
  const int low = std::max(f.emin() - f.mantissa_bits - 3, std::numeric_limits<T>::min_exponent - 1);
  const int high = std::min(f.emax() + 2, std::numeric_limits<T>::max_exponent - 1);
  std::vector<T> values(n);
  for (auto& v : values) {
    const std::uint64_t r = random.next();
    if ((r & 15) == 0) {
      v = std::bit_cast<T>(static_cast<Uint<T>>(random.next()));
      continue;
    }
    const int exponent = low + static_cast<int>((r >> 8) % static_cast<std::uint64_t>(high - low + 1));
    const std::uint64_t mantissa = random.next() >> (64 - t_mantissa);
    const T significand = static_cast<T>(1) + std::ldexp(static_cast<T>(mantissa), -t_mantissa);
    v = std::ldexp(significand, exponent);
    if ((r >> 4) & 1) v = -v;
  }
  return values;
}

QuantizeOptions stochastic_options(int random_bits, RandomKey key, std::uint64_t first_index = 0,
                                   Path path = Path::automatic, int threads = 1) {
  QuantizeOptions o;
  o.rounding = Rounding{RoundingMode::stochastic, random_bits};
  o.stochastic = StochasticStream{key, first_index};
  o.path = path;
  o.threads = threads;
  return o;
}

// Two-sided exact binomial p-value of observing k successes in n trials of
// probability p: twice the smaller tail, summed term by term in log space.
double binomial_p_value(std::uint64_t n, double p, std::uint64_t k) {
  if (p <= 0) return k == 0 ? 1.0 : 0.0;
  if (p >= 1) return k == n ? 1.0 : 0.0;
  const double log_n = std::lgamma(static_cast<double>(n) + 1);
  auto log_pmf = [&](std::uint64_t j) {
    const double jd = static_cast<double>(j);
    return log_n - std::lgamma(jd + 1) - std::lgamma(static_cast<double>(n) - jd + 1) + jd * std::log(p) +
           (static_cast<double>(n) - jd) * std::log1p(-p);
  };
  const double mean = static_cast<double>(n) * p;
  double tail = 0;
  if (static_cast<double>(k) >= mean) {
    for (std::uint64_t j = k; j <= n; ++j) {
      const double term = std::exp(log_pmf(j));
      tail += term;
      if (static_cast<double>(j) > mean + 1 && term < tail * 1e-17) break;
    }
  } else {
    for (std::uint64_t j = k + 1; j-- > 0;) {
      const double term = std::exp(log_pmf(j));
      tail += term;
      if (static_cast<double>(j) + 1 < mean && term < tail * 1e-17) break;
    }
  }
  return std::min(1.0, 2 * tail);
}

// --- (i) one of the two neighbours ----------------------------------------------------

// The two neighbours of x are its roundings toward -inf and +inf (which also
// give what an overflow or a flush to zero becomes in the format).
template <class T>
void check_neighbours(const Format& f, int random_bits, std::uint64_t seed) {
  const std::vector<T> in = random_inputs<T>(f, 100003, seed);
  std::vector<T> out(in.size());
  const RandomKey key{seed, 1};
  quantize(f, std::span<const T>(in), std::span<T>(out), stochastic_options(random_bits, key));
  std::uint64_t bad = 0, down = 0, up = 0;
  std::string first;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const T lower = round_directed(f, RoundingMode::toward_negative, in[i]);
    const T upper = round_directed(f, RoundingMode::toward_positive, in[i]);
    if (same(out[i], lower) && !same(lower, upper)) ++down;
    else if (same(out[i], upper) && !same(lower, upper)) ++up;
    else if (!same(out[i], lower) && !same(out[i], upper) && bad++ == 0)
      first = "input " + hex_float(in[i]) + " gave " + hex_float(out[i]) + ", neighbours " + hex_float(lower) +
              " and " + hex_float(upper);
  }
  INFO(f.name() << ", " << (std::is_same_v<T, float> ? "float" : "double") << " array, random_bits "
                << random_bits << ": " << first);
  CHECK(bad == 0);
  if (f != formats::binary64 && !(std::is_same_v<T, float> && f == formats::binary32)) {
    CHECK(down > 0);  // both directions really happen
    CHECK(up > 0);
  }
}

// --- (ii) the probability of rounding up ----------------------------------------------

// x = +-(lower + F/2^K * gap): a value whose fraction of the gap has K bits, so
// that x is exact in T. P(up) = floor(F/2^K * 2^bits) / 2^bits.
struct Place {
  const char* name;
  std::uint64_t lower_significand;  // lower = lower_significand * 2^gap_exponent
  int gap_exponent;
};

double probability_up(std::uint64_t fraction, int k, int random_bits) {
  const std::uint64_t kept = random_bits >= k ? fraction << (random_bits - k) : fraction >> (k - random_bits);
  return std::ldexp(static_cast<double>(kept), -random_bits);
}

template <class T>
void check_probabilities(const Format& f) {
  constexpr int t_precision = std::numeric_limits<T>::digits;
  const int m = f.mantissa_bits;
  std::vector<Place> places;
  places.push_back({"in [1, 2)", std::uint64_t{1} << m, -m});
  if (f.subnormals == Subnormals::gradual) places.push_back({"subnormal", 3, f.emin() - m});
  if (f.overflow == Overflow::ieee) places.push_back({"above the largest finite", f.max_significand(), f.emax() - m});

  constexpr std::size_t n = std::size_t{1} << 20;
  std::vector<T> in(n), out(n);
  std::uint64_t seed = 1;
  for (const Place& place : places) {
    // Fraction bits available: the significand lower*2^K + F must fit in T's
    // precision, and its unit 2^(gap_exponent-K) must not go below T's smallest subnormal.
    const int lower_bits = std::bit_width(place.lower_significand);
    const int smallest_exponent = std::numeric_limits<T>::min_exponent - t_precision;
    const int k = std::min({t_precision - lower_bits, place.gap_exponent - smallest_exponent, 40});
    if (k < 2) continue;
    const std::uint64_t one = std::uint64_t{1} << k;
    // Exact (P = 0), the smallest step (P = 0 unless bits >= K), a half, a
    // third, 5/16 and a little (P changes with every bits value), nearly 1.
    const std::uint64_t fractions[] = {0, 1, one / 2, one / 3, one / 16 * 5 + 1, one - 1};
    for (std::size_t which = 0; which < std::size(fractions); ++which) {
      const std::uint64_t fraction = fractions[which];
      const bool negative = which % 2 == 1;
      const T magnitude = std::ldexp(static_cast<T>((place.lower_significand << k) | fraction), place.gap_exponent - k);
      const T x = negative ? -magnitude : magnitude;
      REQUIRE(std::isfinite(x));
      const T toward_zero = round_directed(f, RoundingMode::toward_zero, x);
      REQUIRE(std::fabs(toward_zero) == std::ldexp(static_cast<T>(place.lower_significand), place.gap_exponent));
      const T away = round_directed(f, negative ? RoundingMode::toward_negative : RoundingMode::toward_positive, x);
      std::fill(in.begin(), in.end(), x);
      for (int random_bits : kRandomBits) {
        const RandomKey key{++seed, 0};
        quantize(f, std::span<const T>(in), std::span<T>(out), stochastic_options(random_bits, key, 0, Path::automatic, 0));
        std::uint64_t up = 0, other = 0;
        for (T y : out) {
          if (same(y, toward_zero)) continue;
          if (same(y, away)) ++up;
          else ++other;
        }
        const double p = probability_up(fraction, k, random_bits);
        const double p_value = binomial_p_value(n, p, up);
        INFO(f.name() << " " << place.name << ", " << (std::is_same_v<T, float> ? "float" : "double") << " x = "
                      << (negative ? "-" : "+") << "(lower + " << fraction << "/2^" << k << " gap), random_bits "
                      << random_bits << ": P(up) = " << p << ", " << up << " of " << n << " up (expected "
                      << p * static_cast<double>(n) << "), p-value " << p_value);
        CHECK(other == 0);
        CHECK(p_value >= 1e-9);
      }
    }
  }
}

// --- (iii) reproducibility and (iv) the scalar rounding with the same draws -----------

template <class T>
void check_reproducible(const Format& f) {
  const std::size_t n = (std::size_t{1} << 20) + 3;  // enough for quantize to use two threads
  const std::vector<T> in = random_inputs<T>(f, n, 99);
  const RandomKey key{12345, 6};
  const std::uint64_t base = (std::uint64_t{1} << 33) + 17;  // indices above 2^32: the draw's high word counts
  for (int random_bits : {4, 32}) {
    INFO(f.name() << ", " << (std::is_same_v<T, float> ? "float" : "double") << " array, random_bits " << random_bits);
    std::vector<T> one(n), two(n), split(n), other_seed(n), other_stream(n);
    const auto counts_one = quantize(f, std::span<const T>(in), std::span<T>(one),
                                     stochastic_options(random_bits, key, base, Path::automatic, 1));
    const auto counts_two = quantize(f, std::span<const T>(in), std::span<T>(two),
                                     stochastic_options(random_bits, key, base, Path::automatic, 2));
    const std::size_t cut = n / 3 + 1;
    auto counts_split = quantize(f, std::span<const T>(in).first(cut), std::span<T>(split).first(cut),
                                 stochastic_options(random_bits, key, base));
    counts_split += quantize(f, std::span<const T>(in).subspan(cut), std::span<T>(split).subspan(cut),
                             stochastic_options(random_bits, key, base + cut));
    quantize(f, std::span<const T>(in), std::span<T>(other_seed),
             stochastic_options(random_bits, RandomKey{key.seed + 1, key.stream}, base));
    quantize(f, std::span<const T>(in), std::span<T>(other_stream),
             stochastic_options(random_bits, RandomKey{key.seed, key.stream + 1}, base));

    std::uint64_t differ_threads = 0, differ_split = 0, differ_seed = 0, differ_stream = 0, inexact = 0;
    for (std::size_t i = 0; i < n; ++i) {
      differ_threads += bits_of(one[i]) != bits_of(two[i]);
      differ_split += bits_of(one[i]) != bits_of(split[i]);
      differ_seed += bits_of(one[i]) != bits_of(other_seed[i]);
      differ_stream += bits_of(one[i]) != bits_of(other_stream[i]);
    }
    inexact = counts_one.inexact;
    CHECK(differ_threads == 0);
    CHECK(counts_one == counts_two);
    CHECK(differ_split == 0);
    CHECK(counts_one == counts_split);
    // Another seed or stream changes a good share of the inexact results.
    if (inexact > 1000) {
      CHECK(differ_seed > inexact / 20);
      CHECK(differ_stream > inexact / 20);
    }
  }
}

template <class T>
void check_scalar_draws(const Format& f) {
  const std::size_t n = 200003;
  const std::vector<T> in = random_inputs<T>(f, n, 5);
  const RandomKey key{777, 3};
  const DrawKey draw_key = make_draw_key(key);
  const std::uint64_t base = (std::uint64_t{1} << 32) - 1000;  // crosses 2^32 inside the array
  for (int random_bits : kRandomBits) {
    for (Path path : {Path::scalar, Path::vector, Path::automatic}) {
      std::vector<T> out(n);
      quantize(f, std::span<const T>(in), std::span<T>(out), stochastic_options(random_bits, key, base, path, 1));
      std::uint64_t bad = 0;
      std::string first;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t draw = random_draw(draw_key, base + i);
        const T expected = stored<T>(f, round_to_format(f, Rounding{RoundingMode::stochastic, random_bits}, in[i], draw).bits);
        if (!same(expected, out[i]) && bad++ == 0)
          first = "element " + std::to_string(i) + " input " + hex_float(in[i]) + ": scalar " + hex_float(expected) +
                  ", quantize " + hex_float(out[i]);
      }
      INFO(f.name() << ", " << (std::is_same_v<T, float> ? "float" : "double") << " array, random_bits "
                    << random_bits << ", path " << static_cast<int>(path) << ": " << first);
      CHECK(bad == 0);
    }
  }
}

template <class Check>
void for_each_array_type(const Format& f, Check check) {
  if (fits_in_float(f)) check(float{});
  check(double{});
}

}  // namespace

TEST_CASE("stochastic: every result is one of the two neighbours", "[stochastic]") {
  const Format customs[] = {*parse_format("e3m2"), *parse_format("e6m9:sat:ftz"), *parse_format("e8m0"),
                            *parse_format("e4m3:fn")};
  std::uint64_t seed = 100;
  auto run = [&](const Format& f) {
    for (int random_bits : kRandomBits)
      for_each_array_type(f, [&](auto zero) { check_neighbours<decltype(zero)>(f, random_bits, ++seed); });
  };
  for (const Format& f : kPresets) run(f);
  for (const Format& f : customs) run(f);
}

TEST_CASE("stochastic: frequency of rounding up in binary16", "[stochastic]") {
  for_each_array_type(formats::binary16, [](auto zero) { check_probabilities<decltype(zero)>(formats::binary16); });
}
TEST_CASE("stochastic: frequency of rounding up in bfloat16", "[stochastic]") {
  for_each_array_type(formats::bfloat16, [](auto zero) { check_probabilities<decltype(zero)>(formats::bfloat16); });
}
TEST_CASE("stochastic: frequency of rounding up in tf32", "[stochastic]") {
  for_each_array_type(formats::tf32, [](auto zero) { check_probabilities<decltype(zero)>(formats::tf32); });
}
TEST_CASE("stochastic: frequency of rounding up in e4m3", "[stochastic]") {
  for_each_array_type(formats::e4m3, [](auto zero) { check_probabilities<decltype(zero)>(formats::e4m3); });
}
TEST_CASE("stochastic: frequency of rounding up in e5m2", "[stochastic]") {
  for_each_array_type(formats::e5m2, [](auto zero) { check_probabilities<decltype(zero)>(formats::e5m2); });
}
TEST_CASE("stochastic: frequency of rounding up in binary32", "[stochastic]") {
  // Float arrays hold binary32 values exactly: only double inputs round.
  check_probabilities<double>(formats::binary32);
}

TEST_CASE("stochastic: same seed gives the same bits for any threads or split and other seeds differ", "[stochastic]") {
  for (const Format& f : kPresets)
    for_each_array_type(f, [&](auto zero) { check_reproducible<decltype(zero)>(f); });
}

TEST_CASE("stochastic: quantize equals round_to_format with the draw of each element index", "[stochastic]") {
  for (const Format& f : kPresets)
    for_each_array_type(f, [&](auto zero) { check_scalar_draws<decltype(zero)>(f); });
}

// random_draw's state after its first xorshift, as the vector loops form it
// within one 2^16 window of indices (draw_window_term), for keys and indices
// around window boundaries and 2^32.
TEST_CASE("stochastic: draw_window_term gives random_draw's first round within a window", "[stochastic]") {
  std::mt19937_64 rng(20261129);
  for (int trial = 0; trial < 64; ++trial) {
    const DrawKey key{static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng())};
    const std::uint64_t window_start = (rng() & 0xFFFFFFFFFFF0000u) + (trial % 2 == 0 ? 0 : 0xFFFF0000u);
    const std::uint32_t term = draw_window_term(key, window_start + (rng() & 0xFFFF));
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{0x7FFF}, std::uint64_t{0xFFFF}}) {
      const std::uint64_t index = window_start + offset;
      std::uint32_t x = static_cast<std::uint32_t>(index) ^ key.low;
      x ^= x >> 16;
      CHECK(x == (static_cast<std::uint32_t>(index) ^ term));
    }
    // The next window's indices need their own term.
    const std::uint64_t next = window_start + 0x10000;
    std::uint32_t y = static_cast<std::uint32_t>(next) ^ key.low;
    y ^= y >> 16;
    CHECK(y != (static_cast<std::uint32_t>(next) ^ term));
  }
}

TEST_CASE("stochastic: binomial p-value helper", "[stochastic]") {
  CHECK(binomial_p_value(1000, 0.0, 0) == 1.0);
  CHECK(binomial_p_value(1000, 0.0, 1) == 0.0);
  CHECK(binomial_p_value(1000, 1.0, 1000) == 1.0);
  CHECK(binomial_p_value(1000, 0.5, 500) > 0.9);
  CHECK(binomial_p_value(1000, 0.5, 440) < 1e-3);   // 3.8 sigma low
  CHECK(binomial_p_value(1000, 0.5, 560) < 1e-3);   // 3.8 sigma high
  CHECK(binomial_p_value(1 << 20, 1e-9, 1) > 1e-3);  // one hit where ~0.001 expected is unusual, not impossible
  CHECK(binomial_p_value(1 << 20, 1e-9, 3) < 1e-9);
}

}  // namespace mpsim
