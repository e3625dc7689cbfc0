// The numerics written once for both backends (core/include/mpsim/core/
// numerics.hpp and numerics_layers.hpp), checked on the host against oracles
// that share no code with them: MPFR for the exact sum rounded to odd, the
// step decision against GradScaler's rule spelled out by hand, a plain list
// for the amax history, std::frexp/std::fpclassify for the statistics'
// binning, and binary64 references (closed forms, central finite differences
// in binary64) for the layers. The CUDA kernels call the same functions, so
// these tests prove the GPU's arithmetic too (up to the device libm's erff,
// expf and logf, which tests/gpu/test_backend_ops.cpp bounds).
//
// Bounds are derived from the binary32 unit roundoff u = 2^-24 and binary64's
// u64 = 2^-53, never hand-picked; each one says where its terms come from.
#include <catch2/catch.hpp>

#include <cstdint>  // before mpfr.h: enables MPFR's uintmax_t functions
#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "mpsim/core/numerics.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/core/policy.hpp"

using namespace mpsim::core;

namespace {

constexpr double u32 = 0x1p-24;  // binary32 unit roundoff
constexpr double u64 = 0x1p-53;  // binary64 unit roundoff

// x + y rounded to odd at 53 bits by MPFR: the exact sum truncated (toward
// zero) to 53 bits, its last bit set when that was inexact.
double mpfr_round_to_odd_sum(double x, double y) {
  mpfr_t a, b, s;
  mpfr_inits2(53, a, b, s, static_cast<mpfr_ptr>(nullptr));
  mpfr_set_d(a, x, MPFR_RNDN);  // exact: 53 bits
  mpfr_set_d(b, y, MPFR_RNDN);
  const int inexact = mpfr_add(s, a, b, MPFR_RNDZ);
  double r = mpfr_get_d(s, MPFR_RNDN);  // exact: s has 53 bits and lies in binary64's range here
  mpfr_clears(a, b, s, static_cast<mpfr_ptr>(nullptr));
  if (inexact != 0) r = std::bit_cast<double>(std::bit_cast<std::uint64_t>(r) | 1u);
  return r;
}

bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

}  // namespace

TEST_CASE("add_round_to_odd is the exact sum rounded to odd (MPFR)", "[numerics]") {
  std::mt19937_64 rng(20261125);
  std::uniform_real_distribution<double> exponent(-1070, 1000);
  auto signed_power = [&](double e) { return ((rng() & 1) ? -1.0 : 1.0) * std::exp2(e) * (1.0 + (rng() % 4096) / 4096.0); };
  std::size_t mismatches = 0, inexact = 0;
  for (int i = 0; i < 300000; ++i) {
    double x = signed_power(exponent(rng)), y;
    switch (i % 4) {
      case 0: y = signed_power(exponent(rng)); break;                                   // unrelated magnitudes
      case 1: y = x * std::ldexp(1.0, -static_cast<int>(rng() % 80)) * 1.2345; break;  // the weight update's w + u
      case 2: y = -x * (1.0 + std::ldexp(1.0, -static_cast<int>(rng() % 52))); break;  // cancellation
      default:  // the GEMM's acc + a*b: a product of two binary32 values, exact in binary64
        x = static_cast<float>(x * 0x1p-900);
        y = static_cast<double>(static_cast<float>(signed_power(exponent(rng) * 0.1))) *
            static_cast<double>(static_cast<float>(signed_power(exponent(rng) * 0.1)));
    }
    const double want = mpfr_round_to_odd_sum(x, y), got = add_round_to_odd(x, y);
    inexact += want != x + y;
    if (!same_bits(want, got) && ++mismatches <= 5) FAIL_CHECK(x << " + " << y << ": " << got << " != " << want);
  }
  CHECK(mismatches == 0);
  CHECK(inexact > 50000);  // the round-to-odd branch was exercised
  // Exact sums, infinities and NaN pass through unchanged.
  CHECK(same_bits(add_round_to_odd(1.0, 0x1p-52), 1.0 + 0x1p-52));
  CHECK(same_bits(add_round_to_odd(0.0, -0.0), 0.0));
  CHECK(std::isinf(add_round_to_odd(INFINITY, 1.0)));
  CHECK(std::isnan(add_round_to_odd(INFINITY, -INFINITY)));
  CHECK(std::isnan(add_round_to_odd(NAN, 1.0)));
  // Overflow stays infinite (round-to-odd would give the largest finite value;
  // the sum then rounds to the format's overflow result either way).
  CHECK(std::isinf(add_round_to_odd(std::numeric_limits<double>::max(), std::numeric_limits<double>::max())));
}

TEST_CASE("decide_step: found_inf, the unscaling factor and GradScaler's rule with hysteresis", "[numerics]") {
  LossScaling c;
  c.mode = LossScaleMode::dynamic;
  c.initial_scale = 3.0;  // not a power of two: 1/scale is rounded
  c.growth_interval = 2;
  c.hysteresis = 2;
  c.min_scale = 0.5;
  LossScaleState s = initial_loss_scale(c);
  // The reciprocal rounded to binary64, then to binary32 (GradScaler:
  // scale.double().reciprocal().float()), by MPFR.
  auto inverse = [](double scale) {
    mpfr_t r;
    mpfr_init2(r, 53);
    mpfr_set_d(r, scale, MPFR_RNDN);
    mpfr_ui_div(r, 1, r, MPFR_RNDN);
    mpfr_prec_round(r, 24, MPFR_RNDN);
    const auto f = static_cast<float>(mpfr_get_d(r, MPFR_RNDN));
    mpfr_clear(r);
    return f;
  };
  struct Step {
    double loss, sumsq;
    bool found_inf;
    double scale_after;
  };
  const double inf = INFINITY, nan = NAN;
  // By hand from the rule: growth every 2 clean steps; an overflow resets the
  // growth count and uses up one of 2 hysteresis credits, the scale halves
  // when none is left (floored at 0.5); growth restores the credits.
  const Step steps[] = {{1.0, 1.0, false, 3.0},   {1.0, 1.0, false, 6.0},  {1.0, inf, true, 6.0},
                        {nan, 1.0, true, 3.0},    {1.0, nan, true, 1.5},   {1.0, 2.0, false, 1.5},
                        {1.0, 2.0, false, 3.0},   {inf, 1.0, true, 3.0},   {1.0, 1.0, false, 3.0},
                        {1.0, inf, true, 1.5},    {1.0, inf, true, 0.75},  {1.0, inf, true, 0.5},
                        {1.0, inf, true, 0.5}};
  for (const Step& step : steps) {
    const double before = s.scale;
    const StepDecision d = decide_step(s, c, step.loss, step.sumsq);
    CHECK(d.found_inf == step.found_inf);
    CHECK(d.unscale == (before != 1.0));
    CHECK(d.inverse_scale == inverse(before));
    CHECK(s.scale == step.scale_after);
  }
  // Without dynamic scaling the scale never moves and an overflow is still found.
  LossScaling none;
  LossScaleState n = initial_loss_scale(none);
  const StepDecision d = decide_step(n, none, 1.0, inf);
  CHECK(d.found_inf);
  CHECK_FALSE(d.unscale);
  CHECK(d.inverse_scale == 1.0f);
  CHECK(n.scale == 1.0);
}

TEST_CASE("amax history: the largest of the last `length` amaxes, oldest overwritten", "[numerics]") {
  std::mt19937_64 rng(7);
  for (const int length : {1, 2, 5, 16}) {
    std::vector<float> ring(static_cast<std::size_t>(length) + 1, 0.0f);
    std::deque<float> recent;  // the oracle: the last `length` pushes
    CHECK(history_amax(ring.data(), length) == 0.0f);
    for (int i = 0; i < 100; ++i) {
      const float amax = std::ldexp(static_cast<float>(rng() % 1000 + 1), static_cast<int>(rng() % 40) - 20);
      push_history(ring.data(), length, amax);
      recent.push_back(amax);
      if (static_cast<int>(recent.size()) > length) recent.pop_front();
      CHECK(history_amax(ring.data(), length) == *std::max_element(recent.begin(), recent.end()));
      CHECK(ring[static_cast<std::size_t>(length)] == static_cast<float>((i + 1) % length));
    }
  }
}

TEST_CASE("statistics: exponent field, subnormal binade, classes and amax key (std::frexp, fpclassify)", "[numerics]") {
  auto check_one = [](std::uint32_t pattern) {
    const float x = std::bit_cast<float>(pattern);
    const std::uint32_t m = magnitude_bits(x);
    const int cls = std::fpclassify(x);
    REQUIRE(is_infinite_magnitude(m) == (cls == FP_INFINITE));
    REQUIRE(is_nan_magnitude(m) == (cls == FP_NAN));
    REQUIRE(is_subnormal_magnitude(m) == (cls == FP_SUBNORMAL));
    int e = 0;
    std::frexp(static_cast<double>(std::fabs(x)), &e);  // |x| = f 2^e, f in [0.5, 1): binade 2^(e - 1)
    if (cls == FP_NORMAL) REQUIRE(static_cast<int>(exponent_field(m)) == e - 1 + 127);
    if (cls == FP_ZERO || cls == FP_SUBNORMAL) REQUIRE(exponent_field(m) == 0);
    if (cls == FP_INFINITE || cls == FP_NAN) REQUIRE(exponent_field(m) == 255);
    if (cls == FP_SUBNORMAL) REQUIRE(subnormal_binade(m) == e - 1 + 149);
    // amax_key orders like |x|, NaN ignored (key 0).
    REQUIRE(amax_key(x) == (cls == FP_NAN ? 0u : std::bit_cast<std::uint32_t>(std::fabs(x))));
  };
  // Every subnormal (and zero) of both signs, exhaustively; then a stride
  // through all 2^32 patterns, and every field's ends.
  for (std::uint32_t t = 0; t < (1u << 23); ++t) {
    check_one(t);
    check_one(t | 0x80000000u);
  }
  for (std::uint64_t p = 0; p < (std::uint64_t{1} << 32); p += 4099) check_one(static_cast<std::uint32_t>(p));
  for (std::uint32_t field = 0; field < 256; ++field)
    for (const std::uint32_t t : {0u, 1u, 0x400000u, 0x7fffffu}) check_one(field << 23 | t);
  // The key orders magnitudes.
  CHECK(amax_key(-2.0f) > amax_key(1.5f));
  CHECK(amax_key(INFINITY) > amax_key(std::numeric_limits<float>::max()));
}

// --- Layers ---------------------------------------------------------------------------------------------------------

namespace {

std::vector<float> test_inputs(std::uint64_t seed, int n, double spread) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, spread);
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<float>(normal(rng)));
  for (const float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, 5.0f, -5.0f, 10.0f, -10.0f}) v.push_back(x);
  return v;
}

double gelu64(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

TEST_CASE("ReLU: y = max(x, 0) exactly, gradient passed where x > 0, NaN kept", "[numerics][layers]") {
  for (const float x : test_inputs(1, 1000, 3.0)) {
    CHECK(Relu::forward(x) == (x > 0.0f ? x : 0.0f));
    CHECK(std::signbit(Relu::forward(x)) == (x > 0.0f ? std::signbit(x) : false));
    CHECK(Relu::backward(x, 0.75f) == (x > 0.0f ? 0.75f : 0.0f));
  }
  CHECK(std::isnan(Relu::forward(NAN)));
  CHECK(Relu::backward(NAN, 1.0f) == 0.0f);
}

TEST_CASE("GELU's constants are 1/sqrt(2) and 1/sqrt(2 pi) correctly rounded to binary32 (MPFR)", "[numerics][layers]") {
  // The value bounds below cannot see an ulp or two in a constant; the
  // backends must agree on these bits exactly.
  mpfr_t c;
  mpfr_init2(c, 200);
  mpfr_set_ui(c, 2, MPFR_RNDN);
  mpfr_rec_sqrt(c, c, MPFR_RNDN);
  CHECK(Gelu::sqrt1_2 == mpfr_get_flt(c, MPFR_RNDN));
  mpfr_const_pi(c, MPFR_RNDN);
  mpfr_mul_ui(c, c, 2, MPFR_RNDN);
  mpfr_rec_sqrt(c, c, MPFR_RNDN);
  CHECK(Gelu::inv_sqrt_2pi == mpfr_get_flt(c, MPFR_RNDN));
  mpfr_clear(c);
}

TEST_CASE("GELU: forward and backward against binary64 (closed form and central differences)", "[numerics][layers]") {
  // glibc's erff and expf are within 1 ulp: error at most 2u relative (ulp <= 2u |v|).
  // Forward y = (0.5 x) * (1 + erf(x c)): x c rounds (relative u, which moves
  // erf by at most erf'(t) t u <= u / sqrt(e pi) < 0.35u absolute), erff adds
  // 2u |erf| <= 2u, the sum 1 + erf rounds (2u absolute: it is below 2),
  // c itself is 1/sqrt 2 within u relative (another 0.35u): the bracket is
  // within 5u absolute; 0.5 x is exact; the product adds u |y|. So
  // |y - y64| <= 5u * 0.5|x| + u|y64| (+ one more u|y| for the product's input error).
  for (const float x : test_inputs(2, 5000, 4.0)) {
    const double want = gelu64(x), got = Gelu::forward(x);
    const double bound = 5.0 * u32 * 0.5 * std::fabs(x) + 2.0 * u32 * std::fabs(want) + 1e-45;
    INFO("x = " << x);
    CHECK(std::fabs(got - want) <= bound);
  }
  // Backward dx = dy (Phi(x) + x phi(x)) against the central difference of
  // the binary64 forward (step h = 2^-20 |x| or 2^-20: truncation error
  // h^2 |gelu'''| / 6 <= 2^-40, rounding 2 u64 |gelu| / h) and the closed form.
  // The binary32 evaluation: cdf within 2.5u absolute (as above, halved, plus
  // its rounding), pdf = c2 exp(-0.5 x x) within (2 [x x] + 2 [expf] + 2 [c2,
  // product]) u relative times (1 + x^2) for the argument's error, x pdf adds u,
  // cdf + x pdf adds u of the sum, dy * adds u. pdf <= 0.4.
  for (const float x : test_inputs(3, 5000, 4.0)) {
    const float dy = 0.625f;
    const double xd = x, h = std::max(std::fabs(xd), 1.0) * 0x1p-20;
    const double fd = (gelu64(xd + h) - gelu64(xd - h)) / (2.0 * h);
    const double closed = 0.5 * (1.0 + std::erf(xd / std::sqrt(2.0))) +
                          xd * std::exp(-0.5 * xd * xd) / std::sqrt(2.0 * M_PI);
    REQUIRE(std::fabs(fd - closed) <= 0x1p-30 * std::max(1.0, std::fabs(xd)));  // the two oracles agree
    const double pdf = std::exp(-0.5 * xd * xd) / std::sqrt(2.0 * M_PI);
    const double sum_bound = 2.5 * u32 + std::fabs(xd) * pdf * (8.0 + xd * xd) * u32 + u32 * std::fabs(closed);
    const double got = Gelu::backward(x, dy);
    INFO("x = " << x);
    CHECK(std::fabs(got - dy * closed) <= dy * sum_bound + u32 * std::fabs(dy * closed) + 1e-45);
  }
}

TEST_CASE("LayerNorm: row statistics, output and input gradient against binary64", "[numerics][layers]") {
  std::mt19937_64 rng(4);
  for (const int cols : {1, 2, 7, 64, 300}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::normal_distribution<double> normal(trial % 3 == 0 ? 100.0 : 0.0, trial % 2 == 0 ? 1.0 : 1e-3);
      std::vector<float> x(cols), gamma(cols), beta(cols), dy(cols), dx_got(cols);
      for (int j = 0; j < cols; ++j) {
        x[j] = static_cast<float>(normal(rng));
        gamma[j] = static_cast<float>(1.0 + 0.25 * std::sin(j + trial));
        beta[j] = static_cast<float>(0.1 * std::cos(j));
        dy[j] = static_cast<float>(std::sin(3.0 * j + trial));
      }
      const float eps = 1e-5f;
      // binary64 references from the binary32 inputs (sums of <= 300 values:
      // relative error <= cols u64, far below the binary32 bounds).
      double s = 0.0;
      for (const float v : x) s += v;
      const double mean = s / cols;
      double s2 = 0.0;
      for (const float v : x) s2 += (v - mean) * (v - mean);
      const double rstd = 1.0 / std::sqrt(s2 / cols + static_cast<double>(eps));
      const LayerNormStatistics st = layer_norm_statistics(x.data(), cols, eps);
      INFO("cols " << cols << " trial " << trial);
      // Both are binary64 results rounded once to binary32: within u relative plus the sums' cols u64.
      CHECK(std::fabs(st.mean - mean) <= (u32 + 4.0 * cols * u64) * std::fabs(mean) + 4.0 * cols * u64 * std::fabs(s) / cols + 1e-45);
      CHECK(std::fabs(st.rstd - rstd) <= (u32 + 8.0 * cols * u64) * rstd);
      // Output from the stored statistics: (x - m) rounds (u), * rstd (u),
      // * gamma (u), + beta (u of the result): |y - y64| <= 3.01u |t| + u |y64|.
      for (int j = 0; j < cols; ++j) {
        const double t = (static_cast<double>(x[j]) - st.mean) * st.rstd * gamma[j];
        const double want = t + beta[j];
        CHECK(std::fabs(layer_norm_output(x[j], st.mean, st.rstd, gamma[j], beta[j]) - want) <=
              3.01 * u32 * std::fabs(t) + u32 * std::fabs(want) + 1e-45);
      }
      // Input gradient of L = sum dy * y against the central difference of
      // the binary64 forward, and the binary32 result against the closed form
      // from the stored statistics: dxhat = dy gamma, xhat and the products
      // round (u each), the means carry cols u64 and one rounding, the two
      // subtractions round (u of their operands' size), rstd * rounds (u).
      const LayerNormRowMeans means = layer_norm_row_means(x.data(), dy.data(), gamma.data(), cols, st.mean, st.rstd);
      auto loss64 = [&](const std::vector<double>& xs) {
        double m = 0.0, v = 0.0, l = 0.0;
        for (const double a : xs) m += a;
        m /= cols;
        for (const double a : xs) v += (a - m) * (a - m);
        const double r = 1.0 / std::sqrt(v / cols + static_cast<double>(eps));
        for (int j = 0; j < cols; ++j) l += dy[j] * ((xs[j] - m) * r * gamma[j] + beta[j]);
        return l;
      };
      double m_dxhat = 0.0, m_dxhat_xhat = 0.0, m_abs_dxhat = 0.0, m_abs_dxhat_xhat = 0.0;
      for (int j = 0; j < cols; ++j) {
        const double xhat = (x[j] - mean) * rstd;
        m_abs_dxhat += std::fabs(static_cast<double>(dy[j]) * gamma[j]) / cols;
        m_dxhat += static_cast<double>(dy[j]) * gamma[j] / cols;
        m_dxhat_xhat += static_cast<double>(dy[j]) * gamma[j] * xhat / cols;
        m_abs_dxhat_xhat += std::fabs(static_cast<double>(dy[j]) * gamma[j] * xhat) / cols;
      }
      std::vector<double> xs(x.begin(), x.end());
      for (int j = 0; j < cols; ++j) {
        const double xhat = (x[j] - mean) * rstd;
        const double closed = rstd * (static_cast<double>(dy[j]) * gamma[j] - m_dxhat - xhat * m_dxhat_xhat);
        if (trial % 5 == 0 && cols > 1 && std::fabs(mean) < 10.0 && rstd < 100.0) {
          const double h = 0x1p-18 / rstd, keep = xs[j];
          xs[j] = keep + h;
          const double up = loss64(xs);
          xs[j] = keep - h;
          const double down = loss64(xs);
          xs[j] = keep;
          // The closed form is the derivative: central differences agree to O(h^2) and rounding.
          REQUIRE(std::fabs((up - down) / (2.0 * h) - closed) <= 1e-6 * rstd * (1.0 + std::fabs(closed) / rstd));
        }
        const float xhat32 = layer_norm_xhat(x[j], st.mean, st.rstd);
        const double got = layer_norm_input_grad(dy[j], gamma[j], xhat32, st.rstd, means);
        // The means' rounding errors are relative to the sums of magnitudes
        // (their terms' roundings), not to the means, which may cancel.
        const double size = std::fabs(dy[j] * gamma[j]) + m_abs_dxhat + std::fabs(xhat) * m_abs_dxhat_xhat;
        // Terms: dxhat (u), means (2u + cols u64 each), xhat (3u: x - m, *rstd, and the
        // stored statistics' own u each), the product (u), two subtractions (u each of
        // size), rstd (u stored, u product): at most 12u of size, times rstd, plus u |dx|.
        // And the stored mean's rounding, u |mean| absolute, moves every xhat by
        // u |mean| rstd (large when the row's mean is large against its spread),
        // in the element's xhat and in the mean of dxhat * xhat.
        const double xhat_shift = u32 * std::fabs(mean) * rstd;
        CHECK(std::fabs(got - closed) <= rstd * (12.0 * u32 + 4.0 * cols * u64) * size + u32 * std::fabs(closed) +
                                             rstd * xhat_shift * (std::fabs(m_dxhat_xhat) + m_abs_dxhat));
      }
    }
  }
}

TEST_CASE("z-loss: the row's gradient is the binary64 gradient of CE + c log(Z)^2; c = 0 changes no bit",
          "[numerics][layers]") {
  std::mt19937_64 rng(6);
  for (const double c : {1e-4, 0.01, 0.5}) {
    for (int trial = 0; trial < 40; ++trial) {
      const int cols = 2 + trial % 30;
      std::normal_distribution<double> normal(trial % 5 == 0 ? 20.0 : 0.0, trial % 2 == 0 ? 1.0 : 6.0);
      std::vector<float> z(cols), d(cols), d0(cols), plain(cols);
      for (float& v : z) v = static_cast<float>(normal(rng));
      const int label = static_cast<int>(rng() % static_cast<std::uint64_t>(cols));
      const float factor = trial % 3 == 0 ? 1.0f / 64.0f : 1.0f;
      const SoftmaxRow row = softmax_cross_entropy_row(z.data(), cols, static_cast<float>(label), factor, d.data(),
                                                       static_cast<float>(c));
      const SoftmaxRow row0 = softmax_cross_entropy_row(z.data(), cols, static_cast<float>(label), factor, d0.data());
      softmax_cross_entropy_row(z.data(), cols, static_cast<float>(label), factor, plain.data(), 0.0f);
      CHECK(row.loss == row0.loss);  // the logged loss is the cross-entropy alone
      CHECK(std::memcmp(d0.data(), plain.data(), sizeof(float) * static_cast<std::size_t>(cols)) == 0);
      // binary64: log Z and the analytic gradient (softmax (1 + 2 c log Z) - onehot) * factor, checked
      // itself against central differences of CE + c log(Z)^2 below.
      const auto objective = [&](const std::vector<double>& x) {
        const double m = *std::max_element(x.begin(), x.end());
        double sum = 0.0;
        for (const double v : x) sum += std::exp(v - m);
        const double log_z = m + std::log(sum);
        return log_z - x[label] + c * log_z * log_z;
      };
      std::vector<double> x(z.begin(), z.end());
      const double m = *std::max_element(x.begin(), x.end());
      double sum = 0.0;
      for (const double v : x) sum += std::exp(v - m);
      const double log_z = m + std::log(sum);
      INFO("c " << c << " cols " << cols << " trial " << trial);
      for (int j = 0; j < cols; ++j) {
        const double p = std::exp(x[j] - log_z);
        const double want = (p * (1.0 + 2.0 * c * log_z) - (j == label ? 1.0 : 0.0)) * factor;
        const double h = 1e-5 * std::max(1.0, std::fabs(x[j]));
        std::vector<double> up = x, down = x;
        up[j] += h;
        down[j] -= h;
        const double fd = (objective(up) - objective(down)) / (2.0 * h) * factor;
        CHECK(std::fabs(fd - want) <= 1e-6 * factor * (1.0 + std::fabs(log_z)) * (1.0 + 2.0 * c * std::fabs(log_z)));
        // binary32: softmax within the bound of the case above (a few u times |log Z| relative), the
        // factor 1 + 2 c log Z within 3u relative plus 2u of its log Z.
        const double tolerance = factor * p * (1.0 + 2.0 * c * std::fabs(log_z)) *
                                     ((std::fabs(x[j] - m) + 4.0 * std::fabs(log_z) + cols + 12.0) * 2.0 * u32) +
                                 2.0 * u32 * std::fabs(want) + 1e-45;
        CHECK(std::fabs(d[j] - want) <= tolerance);
      }
    }
  }
}

TEST_CASE("softmax cross-entropy row: loss, gradient and argmax against binary64", "[numerics][layers]") {
  std::mt19937_64 rng(5);
  for (const int cols : {1, 2, 10, 100}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::normal_distribution<double> normal(trial % 4 == 0 ? 50.0 : 0.0, trial % 2 == 0 ? 1.0 : 8.0);
      std::vector<float> z(cols), d(cols);
      for (float& v : z) v = static_cast<float>(normal(rng));
      const int label = static_cast<int>(rng() % static_cast<std::uint64_t>(cols));
      const float factor = trial % 3 == 0 ? 1.0f / 128.0f : 65536.0f;
      const SoftmaxRow row = softmax_cross_entropy_row(z.data(), cols, static_cast<float>(label), factor, d.data());
      // binary64 reference: the max-shifted log-sum-exp.
      const double max = *std::max_element(z.begin(), z.end());
      double sum = 0.0;
      for (const float v : z) sum += std::exp(v - max);
      const double log_sum = std::log(sum);
      const double loss = log_sum - (z[label] - max);
      INFO("cols " << cols << " trial " << trial);
      // binary32: each exp term within 3u relative (z - max rounds: u |z - max|
      // absolute in the argument, expf 2u), the sum adds cols u of itself;
      // logf adds 2u |log_sum|, the log of a relative error e is e absolute; the
      // loss's two subtractions u each of their size.
      double spread = 0.0;
      for (const float v : z) spread = std::max(spread, std::fabs(v - max));
      const double sum_rel = (3.0 + cols) * u32 + spread * u32;
      CHECK(std::fabs(row.loss - loss) <=
            sum_rel + 2.0 * u32 * (std::fabs(log_sum) + std::fabs(z[label] - max) + std::fabs(loss)) + 1e-45);
      CHECK(row.correct == (std::max_element(z.begin(), z.end()) - z.begin() == label));
      for (int j = 0; j < cols; ++j) {
        const double p = std::exp(z[j] - max - log_sum);
        const double want = (p - (j == label ? 1.0 : 0.0)) * factor;
        // p's argument is within (|z - max| + |log_sum|) u + the log-sum's
        // error; expf 2u; the subtraction and the factor u each of the result.
        const double arg_error = (std::fabs(z[j] - max) + 2.0 * std::fabs(log_sum)) * 2.0 * u32 + sum_rel;
        CHECK(std::fabs(d[j] - want) <= factor * p * (arg_error + 3.0 * u32) + 2.0 * u32 * std::fabs(want) + 1e-45);
      }
      // The gradient row sums to zero up to rounding (softmax sums to 1).
      double total = 0.0;
      for (const float v : d) total += v;
      CHECK(std::fabs(total) <= factor * (cols + 4.0) * 8.0 * u32 * (1.0 + spread));
    }
  }
  // Ties: the first largest logit is the prediction (PyTorch's argmax), so a
  // tie counts as correct only for the first of the tied labels.
  const float tied[4] = {0.5f, 2.0f, -1.0f, 2.0f};
  float dt[4];
  CHECK(softmax_cross_entropy_row(tied, 4, 1.0f, 1.0f, dt).correct);
  CHECK_FALSE(softmax_cross_entropy_row(tied, 4, 3.0f, 1.0f, dt).correct);
  // A label outside [0, cols): NaN loss, no one-hot term, never correct.
  const float z[3] = {1.0f, 2.0f, 3.0f};
  float d[3];
  for (const float bad : {-1.0f, 3.0f, NAN}) {
    const SoftmaxRow row = softmax_cross_entropy_row(z, 3, bad, 1.0f, d);
    CHECK(std::isnan(row.loss));
    CHECK_FALSE(row.correct);
    for (const float v : d) CHECK(v > 0.0f);
  }
}

TEST_CASE("the activation table: names, enum order and which ones fp32_ops may name", "[numerics][layers]") {
  CHECK(Activations::size == activation_names.names.size());
  CHECK(activation_names.list() == "relu, gelu or silu");
  for (std::size_t i = 0; i < Activations::size; ++i) {
    const auto kind = static_cast<Activation>(i);
    CHECK(activation_names.parse(to_string(kind)) == kind);
    // visit reaches exactly the entry of `kind`.
    int visits = 0;
    Activations::visit(kind, [&]<typename A>(A) {
      ++visits;
      CHECK(A::kind == kind);
      CHECK(A::name == to_string(kind));
    });
    CHECK(visits == 1);
  }
  const auto& ops = fp32_op_names;
  CHECK(std::find(ops.begin(), ops.end(), "gelu") != ops.end());
  CHECK(std::find(ops.begin(), ops.end(), "relu") == ops.end());
  CHECK(std::find(ops.begin(), ops.end(), "layer_norm") != ops.end());
  CHECK(std::find(ops.begin(), ops.end(), "softmax_cross_entropy") != ops.end());
}

TEST_CASE("clip_factor: clip_grad_norm_'s factor from the loss-scaled sum of squares", "[numerics]") {
  // Unscaled norm 2 (sum of squares 4 at scale 1, or 16 at scale 2): clipped to 1 by 1 / (2 + 1e-6).
  CHECK(clip_factor(4.0, 1.0, 1.0f) == static_cast<float>(1.0 / (2.0 + 1e-6)));
  CHECK(clip_factor(16.0, 2.0, 1.0f) == static_cast<float>(1.0 / (2.0 + 1e-6)));
  CHECK(clip_factor(4.0, 1.0, 3.0f) == 1.0f);   // within the bound: untouched
  CHECK(clip_factor(4.0, 1.0, 0.0f) == 1.0f);   // no clipping
  CHECK(clip_factor(0.0, 1.0, 1.0f) == 1.0f);   // zero gradients
}
