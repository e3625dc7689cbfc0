// The FP32 shadow (issue 21, train.shadow_interval): an fp32 arm's shadow is
// its own gradient to the bit, the shadow changes no bit of any arm, and its
// records agree with gradients taken independently from two plain arms.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "mpsim/core/config.hpp"
#include "mpsim/core/trainer.hpp"
#include "tiny_text.hpp"

using namespace mpsim;
using namespace mpsim::core;

namespace {

struct ShadowLog final : ArmLog {
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  std::vector<ShadowRecord> shadows;
  std::string status;
  void step(const StepRecord& r) override { steps.push_back(r); }
  void stats(std::int64_t, const LayerStats&, std::span<const double>) override {}
  void eval(const EvalRecord& r) override { evals.push_back(r); }
  void shadow(std::span<const ShadowRecord> records) override {
    shadows.insert(shadows.end(), records.begin(), records.end());
  }
  void finish(const std::string& s) override { status = s; }
};

const TrainTest& synthetic() {
  static const TrainTest data = make_synthetic(11, 512, 128);
  return data;
}

const TrainTest& tiny_text() {
  static const TrainTest text = test::tiny_text();
  return text;
}

ArmSetup mlp_setup(const Policy& policy) {
  ArmSetup s;
  s.policy = &policy;
  s.model.hidden = {32, 16};
  s.train.batch_size = 32;
  s.train.max_steps = 12;
  s.train.eval_interval = 6;
  s.train.eval_batch = 128;
  s.train.stats_interval = 4;
  s.train.threads = 1;
  s.optimizer.lr = 0.05;
  s.seed = 5;
  return s;
}

// A GPT with what could leak from one pass into the next: dropout masks, a
// tied head, AdamW's state.
ArmSetup gpt_setup(const Policy& policy) {
  ArmSetup s = mlp_setup(policy);
  s.model.kind = ModelKind::gpt;
  s.model.depth = 2;
  s.model.width = 8;
  s.model.heads = 2;
  s.model.mlp_width = 16;
  s.model.tie_embeddings = true;
  s.model.dropout = 0.1;
  s.model.attention_dropout = 0.1;
  s.train.batch_size = 8;
  s.train.eval_batch = 16;
  s.optimizer.kind = OptimizerKind::adamw;
  s.optimizer.lr = 0.01;
  return s;
}

ShadowLog train(const ArmSetup& setup, const TrainTest& data) {
  auto backend = make_cpu_backend();
  ShadowLog log;
  train_arm(*backend, setup, data, &log);
  return log;
}

}  // namespace

TEST_CASE("shadow FP32: an fp32 arm's shadow is its own gradient, bit for bit", "[training][shadow]") {
  const Policy fp32 = *preset_policy("fp32");
  for (const bool gpt : {false, true}) {
    for (const LossReduction reduction : {LossReduction::mean, LossReduction::sum}) {
      ArmSetup s = gpt ? gpt_setup(fp32) : mlp_setup(fp32);
      s.train.shadow_interval = 5;
      s.train.loss.reduction = reduction;
      s.train.loss.weight = reduction == LossReduction::sum ? 0.3 : 1.0;  // the sum's weight: a scale after the loss
      if (reduction == LossReduction::sum) s.optimizer.lr /= 64;
      INFO((gpt ? "gpt, " : "mlp, ") << to_string(reduction));
      const ShadowLog log = train(s, gpt ? tiny_text() : synthetic());
      REQUIRE(log.status == "completed");
      REQUIRE(!log.shadows.empty());
      std::vector<std::int64_t> steps;
      for (const ShadowRecord& r : log.shadows) {
        INFO("step " << r.step << ", layer " << r.layer);
        if (steps.empty() || steps.back() != r.step) steps.push_back(r.step);
        CHECK(r.relative_error == 0.0);
        CHECK(r.cosine == 1.0);  // sqrt(x^2) = x in binary64
        CHECK(r.norm_ratio == 1.0);
        CHECK(r.zeroed == 0);
        CHECK(r.norm_fp32 > 0.0);
        CHECK(r.nonzero_fp32 <= r.elements);
        // The shadow's loss is the arm's loss of the step.
        CHECK(r.loss_fp32 == log.steps.at(static_cast<std::size_t>(r.step)).loss);
      }
      std::vector<std::int64_t> expected;
      for (std::int64_t step = 0; step < static_cast<std::int64_t>(log.steps.size()); step += 5)
        expected.push_back(step);
      CHECK(steps == expected);
      CHECK(steps.size() >= 2);
      // The model's row counts every element of the layers' rows.
      std::int64_t layer_elements = 0, model_elements = 0;
      for (const ShadowRecord& r : log.shadows) {
        if (r.step != 0) continue;
        if (r.layer == -1) model_elements = r.elements;
        else layer_elements += r.elements;
      }
      CHECK(model_elements == layer_elements);
      CHECK(model_elements > 0);
    }
  }
}

TEST_CASE("shadow FP32: the shadow changes no bit of the arm", "[training][shadow]") {
  // Loss scaling (the scale read before the shadow), delayed-scaled amax
  // histories, block formats, stochastic rounding, dropout and a tied head.
  for (const std::string name : {"fp16-mixed", "fp8-delayed", "mxfp8", "stochastic bf16"}) {
    for (const bool gpt : {false, true}) {
      Policy policy = *preset_policy(name == "stochastic bf16" ? "fp32" : name);
      if (name == "stochastic bf16") {  // no master copy: every rounding draws from its stream
        const RoundingPoint stochastic{formats::bfloat16, Rounding{RoundingMode::stochastic}, false};
        policy.master_weights = false;
        policy.weight_storage = policy.weights = policy.optimizer_state = stochastic;
        policy.gemm_output = policy.weight_grads = policy.activation_grads = stochastic;
      }
      INFO(name << (gpt ? ", gpt" : ", mlp"));
      ArmSetup plain = gpt ? gpt_setup(policy) : mlp_setup(policy);
      ArmSetup shadowed = plain;
      shadowed.train.shadow_interval = 3;
      const TrainTest& data = gpt ? tiny_text() : synthetic();
      const ShadowLog a = train(plain, data), b = train(shadowed, data);
      CHECK(a.status == b.status);
      CHECK(a.steps == b.steps);
      CHECK(a.evals == b.evals);
      CHECK(a.shadows.empty());
      CHECK(b.shadows.size() > 0);
    }
  }
}

TEST_CASE("shadow FP32: step 0's rows agree with the gradients of a plain fp32 arm and of the arm",
          "[training][shadow]") {
  // At step 0 every arm of a seed with a binary32 master copy starts from the
  // same weights and batch, so the shadow's gradient is the fp32 arm's first
  // gradient (an arm without a master copy, fp16-naive, starts from its
  // stored weights, which the shadow reads too). Both gradients are taken
  // here by the inspect_gradients hook, and the comparison redone in long
  // double over the model.
  const Policy fp32 = *preset_policy("fp32");
  for (const char* name : {"fp16-mixed", "bf16-mixed", "fp8-delayed"}) {
    const Policy policy = *preset_policy(name);
    INFO(name);
    std::vector<std::vector<float>> reference, arm;
    const auto capture = [](std::vector<std::vector<float>>& out) {
      return [&out](std::int64_t step, const std::vector<Parameter*>& parameters, Backend& backend) {
        if (step != 0) return;
        for (const Parameter* p : parameters) {
          out.emplace_back(static_cast<std::size_t>(p->grad.numel()));
          backend.to_host(p->grad, out.back());
        }
      };
    };
    ArmSetup plain = mlp_setup(fp32);
    plain.inspect_gradients = capture(reference);
    const ShadowLog fp32_log = train(plain, synthetic());
    ArmSetup shadowed = mlp_setup(policy);
    shadowed.train.shadow_interval = 4;
    shadowed.inspect_gradients = capture(arm);
    const ShadowLog log = train(shadowed, synthetic());
    REQUIRE(reference.size() == arm.size());
    const double scale = log.steps.at(0).loss_scale;
    long double difference = 0, arm_sq = 0, fp32_sq = 0, dot = 0;
    std::int64_t elements = 0, nonzero = 0, zeroed = 0;
    for (std::size_t p = 0; p < arm.size(); ++p)
      for (std::size_t e = 0; e < arm[p].size(); ++e) {
        const long double g = static_cast<long double>(arm[p][e]) / scale, g32 = reference[p][e];
        difference += (g - g32) * (g - g32);
        arm_sq += g * g;
        fp32_sq += g32 * g32;
        dot += g * g32;
        ++elements;
        nonzero += g32 != 0;
        zeroed += g32 != 0 && g == 0;
      }
    const ShadowRecord* model = nullptr;
    for (const ShadowRecord& r : log.shadows)
      if (r.step == 0 && r.layer == -1) model = &r;
    REQUIRE(model != nullptr);
    CHECK(model->loss_fp32 == fp32_log.steps.at(0).loss);
    CHECK(model->elements == elements);
    CHECK(model->nonzero_fp32 == nonzero);
    CHECK(model->zeroed == zeroed);
    CHECK(model->norm_fp32 == Approx(static_cast<double>(std::sqrt(fp32_sq))).epsilon(1e-12));
    CHECK(model->relative_error == Approx(static_cast<double>(std::sqrt(difference / fp32_sq))).epsilon(1e-9));
    CHECK(model->cosine == Approx(static_cast<double>(dot / std::sqrt(arm_sq * fp32_sq))).epsilon(1e-12));
    CHECK(model->norm_ratio == Approx(static_cast<double>(std::sqrt(arm_sq / fp32_sq))).epsilon(1e-12));
    // A narrow format costs something, and not everything.
    CHECK(model->relative_error > 1e-5);
    CHECK(model->cosine > 0.9);
  }
}

TEST_CASE("shadow FP32: a z-loss with a shadow is refused, naming both keys", "[training][shadow][config]") {
  const std::string config = "name = \"x\"\narms = [\"fp32\"]\n[train]\nshadow_interval = 10\n[loss]\nz_loss = 1e-4\n";
  CHECK_THROWS_WITH(parse_config(config, "inline"),
                    Catch::Matchers::Contains("train.shadow_interval = 10 with loss.z_loss = 0.0001") &&
                        Catch::Matchers::Contains("set loss.z_loss = 0 or train.shadow_interval = 0"));
  CHECK_NOTHROW(parse_config("name = \"x\"\narms = [\"fp32\"]\n[train]\nshadow_interval = 10\n", "inline"));
}
