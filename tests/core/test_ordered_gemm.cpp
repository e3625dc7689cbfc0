// The fixed-order GEMM against a binary64 oracle of its documented order, on
// every SIMD target this CPU runs and at several thread counts: the same bits
// everywhere (ordered_gemm.hpp).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "mpsim/core/ordered_gemm.hpp"
#include "mpsim/emulation/simd.hpp"

using namespace mpsim;

namespace {

// The order, computed in binary64 and rounded to binary32 after each
// operation: a product of two binary32 values is exact in binary64, and a sum
// of two binary32 values rounded first to binary64 (53 >= 2 x 24 + 2 bits)
// and then to binary32 is the correctly rounded binary32 sum. Independent of
// the kernel and immune to fused multiply-adds (the casts stop contraction).
std::vector<float> oracle(const std::vector<float>& a, bool ta, const std::vector<float>& b, bool tb, std::int64_t m,
                          std::int64_t n, std::int64_t k) {
  std::vector<float> c(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const double x = ta ? a[kk * m + i] : a[i * k + kk];
        const double y = tb ? b[j * k + kk] : b[kk * n + j];
        const auto product = static_cast<float>(x * y);
        acc = static_cast<float>(static_cast<double>(acc) + static_cast<double>(product));
      }
      c[i * n + j] = acc;
    }
  return c;
}

// Values with a wide exponent spread, signs, exact cancellations, subnormal
// products and, when asked, infinities and NaNs.
std::vector<float> operand(std::size_t count, std::mt19937_64& rng, bool special) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-70, 20), kind(0, 99);
  std::vector<float> v(count);
  for (float& x : v) {
    const int what = kind(rng);
    x = std::ldexp(normal(rng), what < 70 ? 0 : exponent(rng));
    if (what == 99) x = 0.0f;
    if (special && what == 98) x = std::numeric_limits<float>::infinity();
    if (special && what == 97) x = std::numeric_limits<float>::quiet_NaN();
  }
  return v;
}

// Bits equal, NaNs as a class (their payload and sign are not part of the order).
bool same(float x, float y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
}

struct Case {
  std::int64_t m, n, k;
  bool ta, tb, special;
};

}  // namespace

TEST_CASE("ordered GEMM: every target and thread count gives the oracle's bits", "[ordered_gemm]") {
  // Shapes: edge tiles in m and n, k across the 256-blocks, narrow n (panels
  // of one vector, partial columns through masked stores on AVX2/AVX-512),
  // the default MLP's products and threaded sizes.
  const std::vector<Case> cases = {
      {1, 1, 1, false, false, false},     {7, 33, 5, false, true, false},    {13, 17, 300, true, false, false},
      {6, 32, 256, true, true, false},    {128, 10, 256, false, true, false}, {10, 256, 128, true, false, false},
      {128, 256, 784, false, true, false}, {256, 784, 128, true, false, false}, {500, 6, 25, false, true, false},
      {37, 70, 513, false, false, true},  {3, 2, 1000, true, true, true},
  };
  std::mt19937_64 rng(20261125);
  const std::vector<simd::Target> targets = simd::available_targets();
  INFO("targets: " << targets.size() << ", portable " << simd::portable_target().name);
  for (const Case& t : cases) {
    const std::vector<float> a = operand(static_cast<std::size_t>(t.m * t.k), rng, t.special);
    const std::vector<float> b = operand(static_cast<std::size_t>(t.k * t.n), rng, t.special);
    const std::vector<float> expected = oracle(a, t.ta, b, t.tb, t.m, t.n, t.k);
    for (const simd::Target& target : targets) {
      simd::ForceTarget force(target);
      for (const int threads : {1, 2, 3}) {
        // c between guard cells that must stay untouched.
        constexpr std::size_t guard = 64;
        std::vector<float> padded(expected.size() + 2 * guard, -1.0f);
        float* const c = padded.data() + guard;
        core::ordered_gemm(a.data(), t.ta, b.data(), t.tb, c, t.m, t.n, t.k, threads);
        std::size_t wrong = 0, first = 0;
        for (std::size_t e = 0; e < expected.size(); ++e)
          if (!same(c[e], expected[e]) && wrong++ == 0) first = e;
        for (std::size_t e = 0; e < guard; ++e) {
          CHECK(padded[e] == -1.0f);
          CHECK(padded[guard + expected.size() + e] == -1.0f);
        }
        INFO(t.m << " x " << t.n << " x " << t.k << (t.ta ? " A^T" : "") << (t.tb ? " B^T" : "") << ", target "
                 << target.name << ", " << threads << " threads; first difference at " << first << ": "
                 << c[first] << " against " << expected[first]);
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("ordered GEMM: no fused multiply-add, subnormal sums kept, k = 0 gives +0", "[ordered_gemm]") {
  // acc + a*b rounded twice differs from one fused rounding here: the first
  // product gives acc = -(1 + 2^-11); then x*x, x = 1 + 2^-12, is
  // 1 + 2^-11 + 2^-24, which rounds to 1 + 2^-11 (a tie, to even) and
  // cancels acc to +0, where a fused multiply-add would leave 2^-24.
  const float x = 1.0f + 0x1p-12f;
  const std::vector<float> a = {1.0f, x}, b = {-(1.0f + 0x1p-11f), x};
  // Products of 2^-70 and 2^-70 are 2^-140, subnormal in binary32: kept (no FTZ).
  const std::vector<float> tiny = {0x1p-70f, 0x1p-70f};
  for (const simd::Target& target : simd::available_targets()) {
    simd::ForceTarget force(target);
    INFO("target " << target.name);
    float c = 1.0f;
    core::ordered_gemm(a.data(), false, b.data(), false, &c, 1, 1, 2, 1);
    CHECK(std::bit_cast<std::uint32_t>(c) == 0u);
    core::ordered_gemm(tiny.data(), false, tiny.data(), false, &c, 1, 1, 2, 1);
    CHECK(c == 0x1p-139f);
    c = -1.0f;
    core::ordered_gemm(a.data(), false, b.data(), false, &c, 1, 1, 0, 1);
    CHECK(std::bit_cast<std::uint32_t>(c) == 0u);
  }
  // The same through every lane of a 40-column c (full vectors on every target).
  std::vector<float> wide_a(2), wide_b(2 * 40), wide_c(40);
  wide_a = a;
  for (int j = 0; j < 40; ++j) {
    wide_b[j] = b[0];
    wide_b[40 + j] = b[1];
  }
  for (const simd::Target& target : simd::available_targets()) {
    simd::ForceTarget force(target);
    core::ordered_gemm(wide_a.data(), false, wide_b.data(), false, wide_c.data(), 1, 40, 2, 1);
    for (const float v : wide_c) CHECK(std::bit_cast<std::uint32_t>(v) == 0u);
  }
}
