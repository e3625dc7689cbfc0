// The exponent histogram against an independent classification (std::frexp
// and std::fpclassify), on values from every binade and class.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "mpsim/core/stats.hpp"
#include "mpsim/emulation/simd.hpp"

using namespace mpsim::core;

namespace {

// The histogram by std::fpclassify and std::frexp, one value at a time.
std::array<std::uint64_t, Binades::bin_count> oracle_histogram(const std::vector<float>& values) {
  std::array<std::uint64_t, Binades::bin_count> h{};
  for (const float v : values) {
    switch (std::fpclassify(v)) {
      case FP_ZERO: ++h[Binades::zero_bin]; continue;
      case FP_INFINITE: ++h[Binades::infinity_bin]; continue;
      case FP_NAN: ++h[Binades::nan_bin]; continue;
      default: break;
    }
    int exponent;
    std::frexp(static_cast<double>(v), &exponent);  // v = m * 2^exponent, m in [0.5, 1)
    ++h[Binades::bin_of_exponent(exponent - 1)];
  }
  return h;
}

}  // namespace

TEST_CASE("exponent histogram bins every binary32 class and binade", "[stats]") {
  std::mt19937_64 rng(42);
  std::vector<float> values;
  for (int e = -149; e <= 127; ++e)
    for (int k = 0; k < 3; ++k) {
      // A value in [2^e, 2^(e+1)): 2^e times a significand in [1, 2) (subnormal binades hold fewer values).
      const float v = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, e);
      values.push_back(std::isfinite(v) ? v : std::ldexp(1.0f, e));
      values.push_back(-values.back());
    }
  for (int k = 0; k < 5; ++k) values.push_back(0.0f), values.push_back(-0.0f);
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  values.push_back(std::numeric_limits<float>::denorm_min());

  TensorStats stats;
  const auto classes = stats.add_values(values);
  const auto expected = oracle_histogram(values);
  std::uint64_t subnormal = 0, below = 0, nonzero = 0;
  for (const float v : values) {
    subnormal += std::fpclassify(v) == FP_SUBNORMAL;
    nonzero += v != 0.0f;  // NaN and infinities included
    below += std::isfinite(v) && v != 0.0f && std::fabs(v) < std::ldexp(1.0, -24);
  }
  CHECK(stats.histogram == expected);
  CHECK(stats[Counter::elements] == values.size());
  CHECK(stats[Counter::nonzero] == nonzero);
  CHECK(stats[Counter::below_2_24] == below);
  CHECK(classes.subnormal == subnormal);
  CHECK(classes.infinite == 2);
  CHECK(classes.nan == 1);

  // Adding twice doubles every count.
  TensorStats twice = stats;
  twice.add_values(values);
  for (int b = 0; b < Binades::bin_count; ++b) CHECK(twice.histogram[b] == 2 * expected[b]);
}


// n values of one shape for the histogram tests: "weights" (a few binades),
// "relu" (half zeros), "wide" (40 binades: more than the AVX-512 windows
// cover, so pair counting), "zeros" (signed), "two modes" (clusters 2^16 apart,
// the second window), "shifting" (binades move by 2^20 every 10000 values),
// "chunks" (alternating 4096-value chunks), "special" (rare subnormals,
// infinities and NaNs in the middle of a chunk).
namespace {
std::vector<float> histogram_test_values(std::string_view shape, std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_real_distribution<float> exponent(-40.0f, 0.0f);
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (shape == "weights") values[i] = normal(rng);
    else if (shape == "relu") values[i] = std::max(0.0f, normal(rng));
    else if (shape == "wide") values[i] = (rng() & 1 ? 1.0f : -1.0f) * std::exp2(exponent(rng));
    else if (shape == "zeros") values[i] = (i % 2) ? 0.0f : -0.0f;
    else if (shape == "two modes") values[i] = normal(rng) * (rng() % 3 == 0 ? 1.0f : 0x1p-16f);
    else if (shape == "shifting") values[i] = normal(rng) * std::exp2(-20.0f * static_cast<float>(i / 10000 % 2));
    else if (shape == "chunks") values[i] = (i / 4096) % 2 ? 0x1p-30f : -1.5f;
    else if (shape == "special") {
      const std::uint64_t r = rng() % 1000;
      values[i] = r == 0 ? std::numeric_limits<float>::infinity()
                : r == 1 ? -std::numeric_limits<float>::quiet_NaN()
                : r < 10 ? std::ldexp(static_cast<float>(rng() % 1000 + 1), -149 + static_cast<int>(rng() % 12))
                         : normal(rng);
    } else {
      FAIL("unknown shape " << shape);
    }
  }
  return values;
}
}  // namespace

TEST_CASE("exponent histogram of large arrays matches the one-value-at-a-time oracle", "[stats]") {
  // Sizes around the switch to vector or pair counting (2048), the chunk
  // (4096) and the pair-table drain (2^17); data concentrated in a few
  // binades, post-ReLU (half zeros), spread over 40 binades (more than the
  // AVX-512 windows cover: pair counting), with rare subnormals, infinities
  // and NaNs in the middle of a chunk, in two clusters, and moving.
  std::mt19937_64 rng(20261121);
  for (const std::size_t n : {std::size_t{1}, std::size_t{2047}, std::size_t{2048}, std::size_t{4095}, std::size_t{8192},
                              std::size_t{8193}, std::size_t{100003}, (std::size_t{1} << 17) + 5,
                              std::size_t{3} << 17}) {
    for (const char* shape : {"weights", "relu", "wide", "special", "zeros", "two modes", "shifting"}) {
      const std::vector<float> values = histogram_test_values(shape, n, rng);
      const auto expected = oracle_histogram(values);
      // Split over 1, 2 and 3 OpenMP threads (pieces meet mid-chunk).
      for (const int threads : {1, 2, 3}) {
        INFO("n = " << n << ", " << shape << ", " << threads << " threads");
        TensorStats stats;
        stats.add_values(values, threads);
        CHECK(stats.histogram == expected);
        CHECK(stats[Counter::elements] == n);
        CHECK(stats[Counter::nonzero] == n - expected[Binades::zero_bin]);
      }
    }
  }
}

namespace {

void check_same_counts(const TensorStats::FieldCounts& got, const TensorStats::FieldCounts& want) {
  CHECK(got.field == want.field);
  CHECK(got.subnormal == want.subnormal);
  CHECK(got.infinite == want.infinite);
  CHECK(got.nan == want.nan);
}

}  // namespace

TEST_CASE("exponent histogram: every SIMD target and path counts like the portable target", "[stats][simd]") {
  namespace simd = mpsim::simd;
  // Sizes with tails of every vector width (1..64 lanes), chunk (4096) and
  // pair-table drain (2^17) boundaries; shapes that take every path: few
  // binades, half zeros, 40 binades, specials, two modes, moving binades, and
  // whole chunks of one value that alternate between two fields 30 binades
  // apart (the second window then counts 4096 equal fields of a chunk: 256 per
  // 8-bit counter with 16-byte vectors).
  std::mt19937_64 rng(20261125);
  const std::vector<simd::Target> targets = simd::available_targets();
  REQUIRE(!targets.empty());
  INFO("targets: " << targets.size() << ", portable " << simd::portable_target().name);
  for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{63}, std::size_t{65}, std::size_t{2047},
                              std::size_t{4096 + 17}, std::size_t{16} << 12, std::size_t{100003},
                              (std::size_t{1} << 17) + 5}) {
    for (const char* shape : {"weights", "relu", "wide", "special", "two modes", "shifting", "chunks"}) {
      const std::vector<float> values = histogram_test_values(shape, n, rng);
      const auto expected = oracle_histogram(values);
      TensorStats::FieldCounts portable;
      {
        simd::ForceTarget force(simd::portable_target());
        portable = count_fields(values);
        TensorStats stats;
        stats.add_values(values);
        INFO("n = " << n << ", " << shape << ", portable target");
        CHECK(stats.histogram == expected);
      }
      for (const simd::Target& target : targets) {
        simd::ForceTarget force(target);
        REQUIRE(simd::current_target() == target);
        for (const FieldCountPath path : {FieldCountPath::automatic, FieldCountPath::window, FieldCountPath::pairs}) {
          INFO("n = " << n << ", " << shape << ", target " << target.name << ", path " << static_cast<int>(path));
          check_same_counts(count_fields(values, path), portable);
        }
        // Split over 1 and 3 OpenMP threads (pieces meet mid-chunk).
        for (const int threads : {1, 3}) {
          INFO("n = " << n << ", " << shape << ", target " << target.name << ", " << threads << " threads");
          TensorStats stats;
          stats.add_values(values, threads);
          CHECK(stats.histogram == expected);
        }
      }
    }
  }
}
