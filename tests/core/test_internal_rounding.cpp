// The softmax, the norm statistics and the loss computed in a narrow format
// (policy.softmax_internals, policy.norm_statistics, policy.loss_internals; numerics_layers.hpp's
// InternalRounding) against a reference built from the MPFR oracle's
// correctly rounded format operations (tests/support/mpfr_oracle.hpp, which
// shares no code with the emulator): bit for bit, in every deterministic
// rounding mode, for binary16, bfloat16, e5m2 and e4m3. The reference performs the
// same sequence of operations as the documented rule; what it checks is that
// each of them is the format's correctly rounded operation, which the
// implementation gets through binary64 (sums rounded to odd, products exact,
// quotients and roots rounded once), not through the oracle.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/core/numerics_attention.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/core/policy.hpp"
#include "support/mpfr_oracle.hpp"

namespace {

using namespace mpsim;
using namespace mpsim::core;
namespace oracle = mpsim::oracle;

// The format's arithmetic, through the oracle, on doubles that hold format values.
struct Reference {
  Format f;
  RoundingMode m;
  double in(double v) const { return value(oracle::from_double(f, m, v).bits); }
  double value(Bits b) const { return oracle::decode(f, b).value.to_double(); }
  Bits bits(double v) const {
    if (std::isnan(v)) return oracle::nan_bits(f);
    return std::isinf(v) ? oracle::infinity_bits(f, v < 0) : oracle::encode(f, v);
  }
  double add(double a, double b) const { return value(oracle::add(f, m, bits(a), bits(b)).bits); }
  double sub(double a, double b) const { return value(oracle::sub(f, m, bits(a), bits(b)).bits); }
  double mul(double a, double b) const { return value(oracle::mul(f, m, bits(a), bits(b)).bits); }
  double div(double a, double b) const { return value(oracle::div(f, m, bits(a), bits(b)).bits); }
  double root(double a) const { return value(oracle::sqrt(f, m, bits(a)).bits); }
};

Policy policy_with(const Format& f, RoundingMode m) {
  Policy p = *preset_policy("fp32");
  p.softmax_internals = RoundingPoint{f, Rounding{m}};
  p.norm_statistics = p.softmax_internals;
  return p;
}

bool same(double want, float got) {
  if (std::isnan(want)) return std::isnan(got);
  return std::bit_cast<std::uint32_t>(static_cast<float>(want)) == std::bit_cast<std::uint32_t>(got);
}

// e4m3 has no infinity: the masked entries must stay masked without passing through it.
const std::vector<Format> formats_under_test{formats::binary16, formats::bfloat16, formats::e5m2, formats::e4m3};

}  // namespace

TEST_CASE("internal rounding: softmax in a narrow format, against the MPFR oracle's operations",
          "[core][transformer][internal]") {
  std::mt19937_64 rng(20261127);
  std::normal_distribution<float> logit(0.0f, 3.0f), grad(0.0f, 1e-3f);
  constexpr std::int64_t cols = 40;
  int rows_checked = 0;
  for (const Format& f : formats_under_test)
    for (const RoundingMode m : oracle::kDeterministicModes) {
      const InternalRounding low = internal_rounding(policy_with(f, m), &Policy::softmax_internals, "softmax");
      REQUIRE(low.enabled);
      const Reference ref{f, m};
      for (int row = 0; row < 6; ++row) {
        INFO(oracle::format_name(f) << " " << oracle::mode_name(m) << " row " << row);
        std::vector<float> x(cols), p(cols), dp(cols), dx(cols);
        for (auto& v : x) v = logit(rng);
        for (std::int64_t j = cols - row * 3; j < cols; ++j) x[static_cast<std::size_t>(j)] = -INFINITY;  // masked
        for (auto& v : dp) v = grad(rng);
        softmax_row(x.data(), cols, p.data(), low);
        softmax_backward_row(p.data(), dp.data(), cols, dx.data(), low);

        double max = -INFINITY;
        for (float v : x)
          if (v != -INFINITY) max = std::fmax(max, ref.in(v));
        std::vector<double> e(cols);
        double sum = 0.0;
        for (std::size_t j = 0; j < e.size(); ++j) {
          if (x[j] == -INFINITY) continue;  // masked: probability 0, out of the sum
          e[j] = ref.in(std::exp(ref.sub(ref.in(x[j]), max)));
          sum = ref.add(sum, e[j]);
        }
        int differ = 0;
        for (std::size_t j = 0; j < e.size(); ++j) differ += !same(ref.div(e[j], sum), p[j]);
        CHECK(differ == 0);
        double dot = 0.0;
        for (std::size_t j = 0; j < e.size(); ++j) dot = ref.add(dot, ref.mul(ref.in(p[j]), ref.in(dp[j])));
        differ = 0;
        for (std::size_t j = 0; j < e.size(); ++j) {
          const double want = ref.mul(ref.in(p[j]), ref.sub(ref.in(dp[j]), dot));
          if (!same(want, dx[j])) {
            ++differ;
            UNSCOPED_INFO("dx[" << j << "]: want " << want << ", got " << dx[j] << " (p " << p[j] << ", dp " << dp[j]
                                << ", dot " << dot << ")");
          }
        }
        CHECK(differ == 0);
        ++rows_checked;
      }
    }
  CHECK(rows_checked == 4 * 6 * 6);
}

TEST_CASE("internal rounding: the loss's softmax cross-entropy in a narrow format, against the MPFR oracle",
          "[core][transformer][internal]") {
  std::mt19937_64 rng(20261128);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  constexpr std::int64_t cols = 33;
  int rows_checked = 0;
  for (const Format& f : formats_under_test)
    for (const RoundingMode m : oracle::kDeterministicModes) {
      Policy p = *preset_policy("fp32");
      p.loss_internals = RoundingPoint{f, Rounding{m}};
      const InternalRounding low = internal_rounding(p, &Policy::loss_internals, "softmax_cross_entropy");
      REQUIRE(low.enabled);
      const Reference ref{f, m};
      for (int row = 0; row < 6; ++row) {
        INFO(oracle::format_name(f) << " " << oracle::mode_name(m) << " row " << row);
        std::vector<float> x(cols), d(cols);
        for (auto& v : x) v = logit(rng);
        const auto label = static_cast<std::size_t>(row * 5);
        // Rows 0-2 plain, 3-5 with PaLM's z-loss; the factor is a loss scale over a batch of 32.
        const float z_loss = row < 3 ? 0.0f : 1e-2f, factor = 2048.0f / 32.0f * static_cast<float>(row + 1);
        const SoftmaxRow got =
            softmax_cross_entropy_row(x.data(), cols, static_cast<float>(label), factor, d.data(), z_loss, low);

        double max = ref.in(x[0]);
        for (float v : x) max = std::fmax(max, ref.in(v));
        std::vector<double> e(cols);
        double sum = 0.0;
        for (std::size_t j = 0; j < e.size(); ++j) {
          e[j] = ref.in(std::exp(ref.sub(ref.in(x[j]), max)));
          sum = ref.add(sum, e[j]);
        }
        const double log_sum = ref.in(std::log(sum));
        CHECK(same(ref.sub(log_sum, ref.sub(ref.in(x[label]), max)), got.loss));
        const double z_factor =
            ref.add(1.0, ref.mul(ref.in(2.0 * static_cast<double>(z_loss)), ref.add(max, log_sum)));
        int differ = 0;
        for (std::size_t j = 0; j < e.size(); ++j) {
          double g = ref.div(e[j], sum);
          if (z_loss != 0.0f) g = ref.mul(g, z_factor);
          differ += !same(ref.mul(ref.sub(g, j == label ? 1.0 : 0.0), ref.in(factor)), d[j]);
        }
        CHECK(differ == 0);
        // The prediction is read from the binary32 logits.
        CHECK(got.correct == (std::max_element(x.begin(), x.end()) - x.begin() == static_cast<std::ptrdiff_t>(label)));
        ++rows_checked;
      }
    }
  CHECK(rows_checked == 4 * 6 * 6);
}

TEST_CASE("internal rounding: a bfloat16 loss swallows the small probabilities' share of the sum",
          "[core][transformer][internal]") {
  // 255 logits at -3 and one at +3: exp(-6) = 0.00248 each, their sum 0.63 beside the
  // label's 1, which comes first. bfloat16's sum never grows: from 1 (ulp 2^-7) each term is
  // below half an ulp (0.00248 < 2^-8), so the sum stays 1 and the loss of the right answer
  // comes out exactly 0 instead of log(1.63) = 0.49.
  Policy p = *preset_policy("fp32");
  p.loss_internals = RoundingPoint{formats::bfloat16};
  const InternalRounding low = internal_rounding(p, &Policy::loss_internals, "softmax_cross_entropy");
  std::vector<float> x(256, -3.0f), d(256);
  x[0] = 3.0f;
  const SoftmaxRow wide = softmax_cross_entropy_row(x.data(), 256, 0.0f, 1.0f, d.data());
  const SoftmaxRow narrow = softmax_cross_entropy_row(x.data(), 256, 0.0f, 1.0f, d.data(), 0.0f, low);
  CHECK(wide.loss == Approx(std::log(1.0 + 255.0 * std::exp(-6.0))).epsilon(1e-4));  // binary32 sum of 256 terms
  CHECK(narrow.loss == 0.0f);
  CHECK(wide.correct);
  CHECK(narrow.correct);
}

TEST_CASE("internal rounding: LayerNorm and RMSNorm statistics in a narrow format, against the MPFR oracle",
          "[core][transformer][internal]") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> value(2.0f, 5.0f), grad(0.0f, 0.01f), scale(1.0f, 0.1f);
  constexpr std::int64_t cols = 48;
  constexpr float eps = 1e-5f;
  for (const Format& f : formats_under_test)
    for (const RoundingMode m : oracle::kDeterministicModes)
      for (const bool centered : {true, false}) {
        INFO(oracle::format_name(f) << " " << oracle::mode_name(m) << (centered ? " LayerNorm" : " RMSNorm"));
        const InternalRounding low = internal_rounding(policy_with(f, m), &Policy::norm_statistics, "layer_norm");
        const Reference ref{f, m};
        std::vector<float> x(cols), dy(cols), gamma(cols);
        for (auto& v : x) v = value(rng);
        for (auto& v : dy) v = grad(rng);
        for (auto& v : gamma) v = scale(rng);
        const LayerNormStatistics st = layer_norm_statistics(x.data(), cols, eps, centered, low);
        const LayerNormRowMeans means =
            layer_norm_row_means(x.data(), dy.data(), gamma.data(), cols, st.mean, st.rstd, centered, low);

        const double count = ref.in(cols);
        double s = 0.0, s2 = 0.0;
        if (centered)
          for (float v : x) s = ref.add(s, ref.in(v));
        const double mean = centered ? ref.div(s, count) : 0.0;
        for (float v : x) {
          const double d = ref.sub(ref.in(v), mean);
          s2 = ref.add(s2, ref.mul(d, d));
        }
        const double rstd = ref.div(1.0, ref.root(ref.add(ref.div(s2, count), ref.in(eps))));
        CHECK(same(mean, st.mean));
        CHECK(same(rstd, st.rstd));
        double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
        for (std::size_t j = 0; j < x.size(); ++j) {
          const double xhat = ref.mul(ref.sub(ref.in(x[j]), mean), rstd);
          const double dxhat = ref.mul(ref.in(dy[j]), ref.in(gamma[j]));
          sum_dxhat = ref.add(sum_dxhat, dxhat);
          sum_dxhat_xhat = ref.add(sum_dxhat_xhat, ref.mul(dxhat, xhat));
        }
        CHECK(same(centered ? ref.div(sum_dxhat, count) : 0.0, means.dxhat));
        CHECK(same(ref.div(sum_dxhat_xhat, count), means.dxhat_xhat));
      }
}

TEST_CASE("internal rounding: a binary16 sum of squares overflows where bfloat16's does not",
          "[core][transformer][internal]") {
  // 128 values of magnitude 40: sum x^2 = 204800 > 65504, binary16's largest.
  std::vector<float> x(128);
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = j % 2 ? 40.0f : -40.0f;
  const auto rstd = [&](const Format& f) {
    const InternalRounding low =
        internal_rounding(policy_with(f, RoundingMode::nearest_even), &Policy::norm_statistics, "layer_norm");
    return layer_norm_statistics(x.data(), 128, 1e-5f, false, low).rstd;
  };
  CHECK(rstd(formats::binary16) == 0.0f);  // 1 / sqrt(inf): every output of the row becomes 0
  // bfloat16 holds the range, but its 8-bit running sum stalls once terms fall below half an ulp of it.
  CHECK(rstd(formats::bfloat16) > 0.024f);
  CHECK(rstd(formats::bfloat16) < 0.025f);
  CHECK(layer_norm_statistics(x.data(), 128, 1e-5f, false).rstd == Approx(0.025f).epsilon(1e-6));
}

TEST_CASE("internal rounding: off by default, off for fp32_ops, refused when scaled or stochastic",
          "[core][transformer][internal]") {
  Policy p = *preset_policy("bf16-mixed");
  CHECK_FALSE(internal_rounding(p, &Policy::softmax_internals, "softmax").enabled);
  CHECK_FALSE(internal_rounding(p, &Policy::norm_statistics, "layer_norm").enabled);
  CHECK_FALSE(internal_rounding(p, &Policy::loss_internals, "softmax_cross_entropy").enabled);
  p.loss_internals = RoundingPoint{formats::bfloat16};
  CHECK_FALSE(internal_rounding(p, &Policy::loss_internals, "softmax_cross_entropy").enabled);  // bf16-mixed's fp32_ops
  p.fp32_ops.clear();
  CHECK(internal_rounding(p, &Policy::loss_internals, "softmax_cross_entropy").enabled);
  p.softmax_internals = RoundingPoint{formats::bfloat16};
  p.norm_statistics = RoundingPoint{formats::bfloat16};
  p.fp32_ops = {"softmax"};
  CHECK_FALSE(internal_rounding(p, &Policy::softmax_internals, "softmax").enabled);
  CHECK(internal_rounding(p, &Policy::norm_statistics, "layer_norm").enabled);
  p.norm_statistics.rounding.mode = RoundingMode::stochastic;
  CHECK_THROWS_WITH(internal_rounding(p, &Policy::norm_statistics, "layer_norm"),
                    Catch::Matchers::Contains("norm_statistics") && Catch::Matchers::Contains("stochastic"));
  p.norm_statistics = RoundingPoint{formats::bfloat16, Rounding{}, true};
  CHECK_THROWS_WITH(internal_rounding(p, &Policy::norm_statistics, "layer_norm"),
                    Catch::Matchers::Contains("/scaled"));
}
