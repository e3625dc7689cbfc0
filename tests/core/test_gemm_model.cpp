// A policy whose GEMMs follow a hardware accumulation model (Policy::gemm,
// e.g. "h100"): the config accepts it only where the model can take the
// operands; the CPU backend's GEMM then truncates like the tensor core, which
// on positive data biases every sum low, while binary32 accumulation
// (round-to-nearest) stays unbiased. The reference is the exact sum (binary64
// products of 11-bit significands, summed with TwoSum).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "mpsim/core/config.hpp"
#include "mpsim/core/trainer.hpp"

using namespace mpsim;
using namespace mpsim::core;

namespace {

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    parse_config("arms = [\"mine\"]\n", "test.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

double exact_dot(const std::vector<float>& a, const std::vector<float>& b, std::int64_t i, std::int64_t j,
                 std::int64_t k, std::int64_t n) {
  double hi = 0.0, lo = 0.0;
  for (std::int64_t t = 0; t < k; ++t) {
    const double p = static_cast<double>(a[i * k + t]) * static_cast<double>(b[t * n + j]);  // exact
    const double s = hi + p, bp = s - hi;
    lo += (hi - (s - bp)) + (p - bp);
    hi = s;
  }
  return hi + lo;
}

}  // namespace

TEST_CASE("gemm = \"h100\" is accepted only where the model can take the operands", "[gemm_model][config]") {
  CHECK(config_error({"policies.mine.base=fp16-mixed", "policies.mine.gemm=h100"}) == "no error");
  CHECK(config_error({"policies.mine.base=bf16-mixed", "policies.mine.gemm=a100"}) == "no error");
  CHECK(config_error({"policies.mine.base=fp32", "policies.mine.gemm=pairwise-fp32"}) == "no error");
  // binary32 operands: no tensor-core instruction takes them.
  CHECK_THAT(config_error({"policies.mine.base=fp32", "policies.mine.gemm=h100"}),
             Catch::Matchers::Contains("policies.mine: gemm = \"h100\" is not an accumulation model for binary32"));
  // FP8 operands are scaled per tensor, and e4m3 meets e5m2 in the backward GEMMs.
  CHECK_THAT(config_error({"policies.mine.base=fp8", "policies.mine.gemm=h100"}),
             Catch::Matchers::Contains("one unscaled format"));
  CHECK_THAT(config_error({"policies.mine.base=fp16-mixed", "policies.mine.gemm=h100",
                           "policies.mine.accumulation=binary16"}),
             Catch::Matchers::Contains("set accumulation = \"binary32\""));
  CHECK_THAT(config_error({"policies.mine.base=fp16-mixed", "policies.mine.gemm=b300"}),
             Catch::Matchers::Contains("is not an accumulation model"));
  // The resolved config keeps the key.
  const ExperimentConfig c =
      parse_config("arms = [\"mine\"]\n", "t", {"policies.mine.base=fp16-mixed", "policies.mine.gemm=h100"});
  CHECK(parse_config(c.to_toml(), "resolved").policies.at("mine").gemm == "h100");
}

TEST_CASE("the H100 model GEMM truncates: positive sums come out low, binary32 accumulation is unbiased",
          "[gemm_model]") {
  const std::int64_t m = 32, n = 32, k = 4096;
  std::mt19937_64 rng(20261121);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> a(m * k), b(k * n);
  // Positive binary16 values (an exact conversion of a value rounded to 11 bits).
  const auto fp16 = [&] { return std::ldexp(std::nearbyint(std::ldexp(uniform(rng), 11)), -11); };
  for (float& x : a) x = fp16();
  for (float& x : b) x = fp16();
  auto backend = make_cpu_backend();
  const Tensor ta = backend->from_host(a, {m, k}), tb = backend->from_host(b, {k, n});
  Policy policy = *preset_policy("fp16-mixed");
  const auto run = [&](const std::string& gemm) {
    policy.gemm = gemm;
    Tensor tc = backend->empty({m, n});
    GemmNumerics numerics;
    numerics.a_format = numerics.b_format = formats::binary16;
    numerics.accumulation = policy.accumulation;
    numerics.model = gemm_model(policy, policy.activations, policy.weights);
    backend->gemm(ta, false, tb, false, tc, numerics, {});
    std::vector<float> c(m * n);
    backend->to_host(tc, c);
    return c;
  };
  const std::vector<float> h100 = run("h100"), fp32 = run("ieee");
  double bias_h100 = 0.0, bias_fp32 = 0.0;
  std::int64_t above_h100 = 0, above_fp32 = 0, below_fp32 = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const double exact = exact_dot(a, b, i, j, k, n);
      const double e_h100 = (h100[i * n + j] - exact) / exact, e_fp32 = (fp32[i * n + j] - exact) / exact;
      bias_h100 += e_h100 / (m * n);
      bias_fp32 += e_fp32 / (m * n);
      above_h100 += e_h100 > 0;
      above_fp32 += e_fp32 > 0;
      below_fp32 += e_fp32 < 0;
    }
  INFO("mean relative error: h100 " << bias_h100 << ", binary32 " << bias_fp32);
  // Truncation of nonnegative terms never rounds up.
  CHECK(above_h100 == 0);
  // About K/16 blocks each losing about half an ulp of the running sum: order 1e-5 here.
  CHECK(bias_h100 < -2e-6);
  CHECK(std::abs(bias_fp32) < std::abs(bias_h100) / 10);
  // Round-to-nearest errs both ways.
  CHECK(above_fp32 > 0);
  CHECK(below_fp32 > 0);
}

TEST_CASE("a training arm with gemm = \"h100\" runs and departs from IEEE accumulation", "[gemm_model][training]") {
  const TrainTest data = make_synthetic(3, 256, 64);
  const auto losses = [&](const std::string& gemm) {
    Policy policy = *preset_policy("fp16-mixed");
    policy.gemm = gemm;
    ArmSetup s;
    s.policy = &policy;
    s.model.hidden = {32};
    s.train.batch_size = 32;
    s.train.max_steps = 8;
    s.train.eval_batch = 64;
    s.train.threads = 1;
    s.seed = 9;
    auto backend = make_cpu_backend();
    return train_arm(*backend, s, data, nullptr).losses;
  };
  const auto h100 = losses("h100"), ieee = losses("ieee");
  REQUIRE(h100.size() == 8);
  for (const double l : h100) CHECK(std::isfinite(l));
  CHECK(h100 != ieee);
}
