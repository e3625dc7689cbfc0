// The vector paths on gradient-like data: random signs, magnitudes spread
// log-uniformly over many binades, so whole vectors sit below a format's
// smallest normal (the case underflow studies care about, and the one where
// nearest-even takes its subnormal shortcut). Every lane must match the scalar
// reference bit for bit, counters included, in every mode, for float and
// double storage, also when the FPU's rounding mode is not to-nearest or
// DAZ/FTZ are set, and on every vector target the CPU runs.
#include <catch2/catch.hpp>
#include <hwy/targets.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/rounding.hpp"

namespace mpsim {
namespace {

constexpr RoundingMode all_modes[] = {RoundingMode::nearest_even,    RoundingMode::nearest_away,
                                      RoundingMode::toward_zero,     RoundingMode::toward_positive,
                                      RoundingMode::toward_negative, RoundingMode::odd,
                                      RoundingMode::stochastic};

// Magnitudes 2^u, u uniform in [low, high]; a few exact zeros.
template <class T>
std::vector<T> gradient_like(std::size_t n, double low, double high, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(low, high);
  std::vector<T> v(n);
  for (auto& x : v) {
    const double magnitude = rng() % 97 == 0 ? 0.0 : std::exp2(exponent(rng));
    x = static_cast<T>((rng() & 1) ? -magnitude : magnitude);
  }
  return v;
}

template <class T>
void check_same_as_scalar(const Format& f, RoundingMode mode, const std::vector<T>& in, int random_bits = 32,
                          std::uint64_t first_index = 5) {
  using U = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;
  QuantizeOptions options;
  options.rounding = {mode, random_bits};
  options.stochastic = {{2026, 11}, first_index};
  options.threads = 1;
  std::vector<T> reference(in.size()), fast(in.size());
  options.path = Path::scalar;
  const QuantizeCounts expected = quantize(f, std::span<const T>(in), std::span<T>(reference), options);
  options.path = Path::vector;
  const QuantizeCounts got = quantize(f, std::span<const T>(in), std::span<T>(fast), options);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < in.size() && mismatches < 3; ++i) {
    if (std::bit_cast<U>(reference[i]) == std::bit_cast<U>(fast[i])) continue;
    ++mismatches;
    INFO(f.name() << " " << to_string(mode) << " input " << std::hexfloat << in[i] << " scalar " << reference[i]
                  << " vector " << fast[i]);
    CHECK(false);
  }
  INFO(f.name() << " " << to_string(mode) << ", random bits " << random_bits);
  CHECK(got == expected);
}

// Runs body(target) on every vector target compiled into the library that
// this CPU runs (AVX-512, AVX2, SSE4, ...), then restores the usual dispatch.
template <class Body>
void on_every_vector_target(Body body) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  REQUIRE(!targets.empty());
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    body(target);
  }
  hwy::SetSupportedTargetsForTest(0);
}

template <class T>
void check_formats(const std::vector<std::string>& names, double low, double high) {
  const auto in = gradient_like<T>(std::size_t{1} << 15, low, high, 99);
  for (const auto& name : names) {
    const Format f = *parse_format(name);
    for (RoundingMode mode : all_modes) check_same_as_scalar(f, mode, in);
  }
}

const std::vector<std::string> float_formats = {"binary16", "bfloat16", "tf32",      "e4m3",     "e5m2",
                                                "e4m3:fn",  "e3m2",     "e5m10:ftz", "e6m9:sat", "binary32"};
const std::vector<std::string> double_formats = {"binary16", "bfloat16", "e4m3",       "e5m2",   "binary32",
                                                 "e11m10",   "e11m52",   "e10m40:ftz", "e9m20:sat"};

TEST_CASE("paths on gradient-like data: float storage, every mode", "[paths]") {
  check_formats<float>(float_formats, -40, 0);    // underflows in 16- and 8-bit formats, no overflow
  check_formats<float>(float_formats, -150, 20);  // every range at once, binary32 subnormals included
}

TEST_CASE("paths on gradient-like data: double storage, every mode", "[paths]") {
  check_formats<double>(double_formats, -40, 0);
  check_formats<double>(double_formats, -1080, 40);
}

TEST_CASE("paths on gradient-like data: the FPU's rounding mode does not leak in", "[paths]") {
  // The nearest-even subnormal shortcut uses the FPU's addition; in any other
  // FPU mode quantize must not take it, and still match the scalar reference.
  // The other modes' subnormal path scales, truncates and adds in the FPU too.
  for (int fpu_mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    const int saved = std::fegetround();
    std::fesetround(fpu_mode);
    const auto in = gradient_like<float>(std::size_t{1} << 14, -40, 0, 7);
    const auto in_double = gradient_like<double>(std::size_t{1} << 12, -40, 0, 7);
    for (const char* name : {"binary16", "e4m3", "e5m2"}) {
      for (RoundingMode mode : all_modes) {
        check_same_as_scalar(*parse_format(name), mode, in);
        check_same_as_scalar(*parse_format(name), mode, in_double);
      }
    }
    std::fesetround(saved);
  }
}

#if defined(__x86_64__) || defined(__i386__)
TEST_CASE("paths on gradient-like data: denormals-are-zero and flush-to-zero do not leak in, on every vector target",
          "[paths]") {
  // Binary32 subnormal inputs (2^-150..) beside underflowing ones. The FPU
  // short path serves them under its own MXCSR (DAZ and FTZ cleared for the
  // call); the elementwise quantizer's other vector paths keep binary32
  // subnormals off the FPU. So DAZ/FTZ settings cannot change a bit or a
  // counter. Two inputs: mostly below the format's smallest normal (the
  // kernel's FPU loop) and normal but for one in 1,024, half of them binary32
  // subnormals, placed where the kernel's sample (every 64th element) does
  // not look, so that it picks its loop that tries the pattern first (for
  // binary16 and the FP8 formats). Both paths run under the settings; the
  // reference is the scalar path without them.
  const unsigned saved = _mm_getcsr();
  const auto below = gradient_like<float>(std::size_t{1} << 14, -150, 0, 8);
  auto mostly_normal = gradient_like<float>(std::size_t{1} << 14, -6, 3, 9);
  for (std::size_t i = 37, k = 0; i < mostly_normal.size(); i += 1024, ++k)
    mostly_normal[i] = k % 2 ? below[i] : std::bit_cast<float>(static_cast<std::uint32_t>(1 + 40503 * k) | (k % 4 ? 0u : 0x80000000u));
  std::vector<float> reference(below.size()), got(below.size());
  on_every_vector_target([&](std::int64_t target) {
    for (const char* name : {"binary16", "e4m3", "e5m2", "e3m2"}) {
      const Format f = *parse_format(name);
      for (const auto& [mode, random_bits, in] : {std::tuple{RoundingMode::nearest_even, 32, &below},
                                                   {RoundingMode::nearest_away, 32, &below},
                                                   {RoundingMode::toward_zero, 32, &below},
                                                   {RoundingMode::toward_positive, 32, &below},
                                                   {RoundingMode::toward_negative, 32, &below},
                                                   {RoundingMode::odd, 32, &below},
                                                   {RoundingMode::stochastic, 32, &below},
                                                   {RoundingMode::stochastic, 4, &below},
                                                   {RoundingMode::nearest_even, 32, &mostly_normal},
                                                   {RoundingMode::odd, 32, &mostly_normal},
                                                   {RoundingMode::toward_negative, 32, &mostly_normal},
                                                   {RoundingMode::stochastic, 32, &mostly_normal},
                                                   {RoundingMode::stochastic, 4, &mostly_normal}}) {
        QuantizeOptions options;
        options.rounding = {mode, random_bits};
        options.stochastic = {{2026, 11}, 5};
        options.threads = 1;
        options.path = Path::scalar;
        const QuantizeCounts expected = quantize(f, std::span<const float>(*in), std::span<float>(reference), options);
        for (unsigned bits : {0x0040u, 0x8000u, 0x8040u}) {  // DAZ, FTZ, both
          for (Path path : {Path::scalar, Path::vector}) {
            options.path = path;
            _mm_setcsr(saved | bits);
            const QuantizeCounts counts = quantize(f, std::span<const float>(*in), std::span<float>(got), options);
            const unsigned after = _mm_getcsr();
            _mm_setcsr(saved);
            INFO("vector target " << hwy::TargetName(target) << ", " << name << " " << to_string(mode) << " ("
                                  << random_bits << " random bits), " << (in == &below ? "mostly below normal" : "mostly normal")
                                  << ", MXCSR bits " << bits << (path == Path::scalar ? ", scalar" : ", vector"));
            CHECK(counts == expected);
            CHECK(std::memcmp(got.data(), reference.data(), in->size() * sizeof(float)) == 0);
            CHECK((after & ~0x3Fu) == ((saved | bits) & ~0x3Fu));  // the caller's settings come back
          }
        }
      }
    }
  });
}
#endif

// The short paths' rounding at every position the quantum can take: for each
// binade of the storage up to the format's largest finite value (so whole
// vectors stay on the short paths: no overflow; binary32 subnormals, which
// the FPU path serves on x86-64, included) and each bit
// position p of the significand, patterns whose bits below p are 0, 1, half
// minus one, half, half plus one and all ones (exact, just above, ties and
// their neighbours at every quantum, normal and subnormal results alike),
// with random bits above p and both signs. Every mode (stochastic with 32, 4
// and 1 random bits), every vector target, against the scalar reference.
std::vector<float> every_quantum_position(const Format& f) {
  const auto largest = std::bit_cast<std::uint32_t>(static_cast<float>(f.largest_finite()));
  std::mt19937_64 rng(2611);
  std::vector<float> v{0.0f, -0.0f};
  for (std::uint32_t binade = 0; binade <= (largest >> 23); ++binade) {  // 0: binary32 subnormals
    for (int p = 1; p <= 23; ++p) {
      const std::uint32_t half = std::uint32_t{1} << (p - 1), low_mask = (std::uint32_t{1} << p) - 1;
      for (std::uint32_t low : {0u, 1u, half - 1, half, half + 1, low_mask}) {
        for (int draw = 0; draw < 2; ++draw) {
          const std::uint32_t high = static_cast<std::uint32_t>(rng()) & 0x7FFFFFu & ~low_mask;
          const std::uint32_t bits = (binade << 23) | high | (low & low_mask);
          if (bits == 0) continue;
          if (bits > largest) continue;
          v.push_back(std::bit_cast<float>(bits | ((rng() & 1) ? 0x80000000u : 0u)));
        }
      }
    }
  }
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

TEST_CASE("paths: every quantum position, its ties and neighbours, on the short paths", "[paths]") {
  on_every_vector_target([&](std::int64_t target) {
    for (const char* name : {"binary16", "e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "e4m3:sat", "e3m2:inf:nosat",
                             "e5m0", "e7m0", "e5m22", "e7m22"}) {  // no mantissa bits; C = 2^(e + 1)
      const Format f = *parse_format(name);
      const auto all = every_quantum_position(f);
      // The same inputs, and those above the smallest normal with one in 10,000 of
      // the others (the kernel picks its loop from how many lie below it).
      std::vector<float> mostly_normal;
      std::size_t below = 0;
      for (float x : all)
        if (std::fabs(x) >= f.smallest_normal() || ++below % 10000 == 0) mostly_normal.push_back(x);
      for (const auto& in : {all, mostly_normal}) {
        INFO("vector target " << hwy::TargetName(target) << ", " << name << ", " << in.size() << " inputs");
        for (RoundingMode mode : all_modes) check_same_as_scalar(f, mode, in);
        for (int random_bits : {4, 1}) check_same_as_scalar(f, RoundingMode::stochastic, in, random_bits);
      }
    }
  });
}

// Inputs at stochastic rounding's carry boundaries, each built from its own
// element's draw (element i draws random_draw(key, first + i); the checker's
// stream is {2026, 11} from index 5): with r random bits and the draw's top r
// bits k, a fraction of the quantum of (2^r - k) / 2^r carries and one 2^-r
// less does not; the elements alternate between the two, over subnormal and
// normal quanta and both signs (exact for r <= 23 - M). With 32 bits, the
// elements whose draw d >= 2^32 - 2^20 sit far below the quantum (z = the
// fraction times 2^32 is (2^32 - d) or (2^32 - d) - 1/4, which only a
// truncating conversion floors correctly); the others hold ordinary values.
std::vector<float> carry_boundaries(const Format& f, int random_bits, std::size_t n) {
  const DrawKey key = make_draw_key(RandomKey{2026, 11});
  const int m = f.mantissa_bits;
  std::vector<float> v(n);
  std::size_t inexact_builds = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t d = random_draw(key, 5 + i);
    double x;
    if (random_bits == 32) {
      const double q = std::ldexp(1.0, f.emin() - m);  // the subnormal quantum
      x = d >= 0xFFF00000u ? std::ldexp(4.0 * (4294967296.0 - d) - (i & 1), -34) * q
                           : std::ldexp(1.0 + static_cast<double>(i % 1024) / 1024.0, f.emin() - static_cast<int>(i % 7));
    } else {
      const std::uint64_t kept = d >> (32 - random_bits);
      const double fraction = std::ldexp(static_cast<double>((std::uint64_t{1} << random_bits) - kept - (i & 1)), -random_bits);
      const int binade = f.emin() + static_cast<int>(i % 5) - 1;  // below emin: subnormal quanta
      const double quantum = std::ldexp(1.0, std::max(binade, f.emin()) - m);
      const double integer = binade < f.emin() ? static_cast<double>(i % (std::size_t{1} << m))
                                               : std::ldexp(1.0, m) + static_cast<double>(i % (std::size_t{1} << m));
      x = (integer + fraction) * quantum;
    }
    v[i] = static_cast<float>((i & 2) ? -x : x);
    inexact_builds += static_cast<double>(v[i]) != ((i & 2) ? -x : x);
  }
  REQUIRE(inexact_builds == 0);  // every input is the value meant
  return v;
}

TEST_CASE("paths: stochastic rounding at its carry boundaries, on every vector target", "[paths]") {
  on_every_vector_target([&](std::int64_t target) {
    for (const char* name : {"binary16", "e4m3", "e5m2", "e2m1"}) {
      const Format f = *parse_format(name);
      for (int random_bits : {1, 4, 8, 32}) {
        const auto in = carry_boundaries(f, random_bits, random_bits == 32 ? std::size_t{1} << 16 : 4096);
        INFO("vector target " << hwy::TargetName(target) << ", " << name << ", random bits " << random_bits);
        check_same_as_scalar(f, RoundingMode::stochastic, in, random_bits);
      }
    }
  });
}

// Every x86-64 target runs the FPU short path with MXCSR set for the call: the caller's rounding mode must come back, and must not leak
// into the results, on every target.
TEST_CASE("paths: every vector target leaves the FPU's rounding mode as it found it", "[paths]") {
  const auto in = gradient_like<float>(std::size_t{1} << 12, -40, 0, 21);
  const int saved = std::fegetround();
  on_every_vector_target([&](std::int64_t target) {
    for (int fpu_mode : {FE_UPWARD, FE_DOWNWARD}) {
      std::fesetround(fpu_mode);
#if defined(__x86_64__) || defined(__i386__)
      const unsigned mxcsr = _mm_getcsr();  // fegetround reads the x87 control word only
#endif
      for (RoundingMode mode : all_modes) {
        check_same_as_scalar(*parse_format("e4m3"), mode, in);
        INFO("vector target " << hwy::TargetName(target) << ", " << to_string(mode));
        CHECK(std::fegetround() == fpu_mode);
#if defined(__x86_64__) || defined(__i386__)
        CHECK((_mm_getcsr() & ~0x3Fu) == (mxcsr & ~0x3Fu));  // all but the sticky flags
#endif
      }
    }
  });
  std::fesetround(saved);
}

#if defined(__x86_64__) && defined(__GLIBC__)
// A caller may unmask floating-point exceptions: the vector paths' roundings
// must not trap (an inexact addition is their whole point). A trap ends the
// test binary with SIGFPE, which CTest reports as a failure.
TEST_CASE("paths: the vector paths raise no unmasked floating-point exception, on every vector target", "[paths]") {
  const auto in = gradient_like<float>(std::size_t{1} << 12, -40, 0, 23);
  on_every_vector_target([&](std::int64_t) {
    for (const char* name : {"binary16", "e4m3", "e5m2", "e2m1"}) {
      for (RoundingMode mode : all_modes) {
        feclearexcept(FE_ALL_EXCEPT);
        feenableexcept(FE_INEXACT | FE_UNDERFLOW | FE_OVERFLOW | FE_INVALID | FE_DIVBYZERO);
        check_same_as_scalar(*parse_format(name), mode, in);
        fedisableexcept(FE_ALL_EXCEPT);
        feclearexcept(FE_ALL_EXCEPT);
      }
    }
  });
}

// fegetround reads the x87 control word only; SSE and AVX follow MXCSR, which
// a caller may set alone. Nearest-even shortcuts taken "because the FPU rounds
// to nearest" must look at MXCSR (e6m23: binary32's precision, few exponent bits).
TEST_CASE("paths: a rounding mode set in MXCSR alone does not leak in, on every vector target", "[paths]") {
  const auto in = gradient_like<float>(std::size_t{1} << 12, -60, 0, 24);
  const unsigned saved = _mm_getcsr();
  on_every_vector_target([&](std::int64_t) {
    for (unsigned control : {1u, 2u, 3u}) {  // downward, upward, toward zero
      for (const char* name : {"binary16", "e4m3", "e6m23", "e5m22"}) {
        for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::odd, RoundingMode::stochastic}) {
          _mm_setcsr((saved & ~0x6000u) | (control << 13));
          check_same_as_scalar(*parse_format(name), mode, in);
          _mm_setcsr(saved);
        }
      }
    }
  });
}
#endif

// Every vector target compiled into the library (AVX-512, AVX2, SSE4, ...),
// not only the best one of this CPU, against the scalar reference.
TEST_CASE("paths on gradient-like data: every vector target this CPU runs", "[paths]") {
  const auto in = gradient_like<float>(std::size_t{1} << 13, -40, 0, 11);
  const auto wide = gradient_like<float>(std::size_t{1} << 13, -150, 20, 12);
  const auto in_double = gradient_like<double>(std::size_t{1} << 12, -40, 0, 13);
  on_every_vector_target([&](std::int64_t target) {
    INFO("vector target " << hwy::TargetName(target));
    CHECK(std::string(vector_target_name()) == hwy::TargetName(target));
    for (const char* name : {"binary16", "bfloat16", "e4m3", "e5m2", "e3m2", "e5m10:ftz", "e4m3:fn", "e6m9:sat"}) {
      for (RoundingMode mode : all_modes) {
        check_same_as_scalar(*parse_format(name), mode, in);
        check_same_as_scalar(*parse_format(name), mode, wide);
        check_same_as_scalar(*parse_format(name), mode, in_double);
      }
    }
  });
}

// The vector loops work in blocks of at most 2^17 elements (their 16-bit lane
// counts) and, under stochastic rounding, draw within windows of 2^16 indices
// (draw_window_term): arrays that cross several of both, and 2^32, starting
// off a vector's boundary, on every vector target.
TEST_CASE("paths on gradient-like data: across 2^17 blocks and 2^16 windows of draws, on every vector target",
          "[paths]") {
  const std::size_t n = (std::size_t{3} << 16) + 13;
  const auto in = gradient_like<float>(n, -40, 0, 21);
  const auto in_double = gradient_like<double>(n, -40, 0, 22);
  on_every_vector_target([&](std::int64_t target) {
    INFO("vector target " << hwy::TargetName(target));
    for (std::uint64_t first_index : {(std::uint64_t{1} << 16) - 3, (std::uint64_t{1} << 32) - 70001}) {
      INFO("first index " << first_index);
      for (const char* name : {"binary16", "bfloat16", "e4m3"}) {
        for (RoundingMode mode : {RoundingMode::stochastic, RoundingMode::nearest_even, RoundingMode::toward_positive}) {
          check_same_as_scalar(*parse_format(name), mode, in, 32, first_index);
          check_same_as_scalar(*parse_format(name), mode, in_double, 32, first_index);
        }
      }
    }
  });
}

}  // namespace
}  // namespace mpsim
