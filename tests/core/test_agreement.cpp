// Side-by-side agreement of two arms (core/src/agreement.cpp): hand-computed
// cases, and two real arms of the same policy and seed on two CPU backend
// instances, which must agree exactly (the same bits on the same machine),
// while arms of different policies must not.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "mpsim/core/agreement.hpp"
#include "mpsim/core/trainer.hpp"

using namespace mpsim::core;

namespace {

LayerStats one_layer(std::initializer_list<std::pair<int, std::uint64_t>> weight_grad_bins) {
  LayerStats s(1);
  for (const auto& [bin, count] : weight_grad_bins)
    s[0][static_cast<int>(TensorKind::weight_grads)].histogram[bin] = count;
  return s;
}

}  // namespace

TEST_CASE("agreement: identical arms agree exactly", "[agreement]") {
  const ArmTrace a{"cpu.fp16-mixed", {"fc1"}, {2.0, 1.5, 1.0}, 0.8, one_layer({{100, 5}, {101, 7}})};
  const Agreement g = compare_arms(a, a);
  CHECK(g.max_loss_relative_difference == 0.0);
  CHECK(g.test_accuracy_difference == 0.0);
  CHECK(g.largest_histogram_distance(TensorKind::weight_grads) == 0.0);
  // Kinds that counted nothing have no distance.
  CHECK(std::isnan(g.largest_histogram_distance(TensorKind::activations)));
}

TEST_CASE("agreement: hand-computed differences", "[agreement]") {
  const ArmTrace ref{"cpu.x", {"fc1"}, {2.0, 1.0, 0.0}, 0.80, one_layer({{100, 4}})};
  const ArmTrace other{"cuda.x", {"fc1"}, {2.0, 1.1, 0.0}, 0.75, one_layer({{100, 2}, {101, 2}})};
  const Agreement g = compare_arms(ref, other);
  CHECK(g.reference == "cpu.x");
  CHECK(g.other == "cuda.x");
  CHECK(g.max_loss_relative_difference == Approx(0.1).epsilon(1e-12));
  CHECK(g.test_accuracy_difference == Approx(-0.05).epsilon(1e-12));
  // Half of the mass moved one binade: total variation 1/2.
  CHECK(g.largest_histogram_distance(TensorKind::weight_grads) == 0.5);
  REQUIRE(g.histogram_distance.size() == 1);
  CHECK(g.layers == std::vector<std::string>{"fc1"});

  // Disjoint histograms: 1. A missing step or a NaN on one side only: infinite.
  const ArmTrace moved{"cuda.y", {"fc1"}, {2.0, 1.0}, 0.8, one_layer({{120, 9}})};
  const Agreement d = compare_arms(ref, moved);
  CHECK(d.largest_histogram_distance(TensorKind::weight_grads) == 1.0);
  CHECK(d.max_loss_relative_difference == std::numeric_limits<double>::infinity());
  const ArmTrace nan{"cuda.z", {"fc1"}, {2.0, std::nan(""), 0.0}, 0.8, one_layer({{100, 4}})};
  CHECK(compare_arms(ref, nan).max_loss_relative_difference == std::numeric_limits<double>::infinity());
  // A loss of exactly 0 in both: no difference; 0 against nonzero: infinite.
  const ArmTrace zero_other{"cuda.w", {"fc1"}, {2.0, 1.0, 1e-9}, 0.8, one_layer({{100, 4}})};
  CHECK(compare_arms(ref, zero_other).max_loss_relative_difference == std::numeric_limits<double>::infinity());
}

TEST_CASE("agreement: the same arm on two backend instances agrees bit for bit", "[agreement][training]") {
  const TrainTest data = make_synthetic(11, 512, 128);
  const auto run = [&](const std::string& policy_name) {
    const Policy policy = *preset_policy(policy_name);
    ArmSetup s;
    s.policy = &policy;
    s.model.hidden = {32};
    s.train.batch_size = 32;
    s.train.max_steps = 12;
    s.train.eval_batch = 128;
    s.train.threads = 1;
    s.seed = 5;
    auto backend = make_cpu_backend();
    ArmResult r = train_arm(*backend, s, data, nullptr);
    REQUIRE(r.losses.size() == 12);
    return ArmTrace{policy_name, {"fc1", "fc2", "loss"}, r.losses, r.test_accuracy, r.stat_totals};
  };
  const ArmTrace a = run("fp16-mixed"), b = run("fp16-mixed"), c = run("fp32");
  const Agreement same = compare_arms(a, b);
  CHECK(same.max_loss_relative_difference == 0.0);
  CHECK(same.test_accuracy_difference == 0.0);
  for (const TensorKind kind : {TensorKind::activations, TensorKind::activation_grads, TensorKind::weight_grads})
    CHECK(same.largest_histogram_distance(kind) == 0.0);
  const Agreement different = compare_arms(c, a);
  CHECK(different.max_loss_relative_difference > 0.0);
  CHECK(different.largest_histogram_distance(TensorKind::weight_grads) > 0.0);
}
