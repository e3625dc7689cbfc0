// The training loop: loss scaling step by step against GradScaler's documented
// behaviour, what each policy does to gradients and updates, skipped steps,
// clean stops, and a golden trajectory replayed bit for bit.
#include <catch2/catch.hpp>

#include <tuple>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numbers>
#include <sstream>

#include "mpsim/core/config.hpp"
#include "mpsim/core/loss_scaler.hpp"
#include "mpsim/core/trainer.hpp"
#include "support/forwarding_backend.hpp"
#include "support/test_support.hpp"
#include "tiny_text.hpp"

using namespace mpsim;
using namespace mpsim::core;

namespace {

// Keeps everything a run reports, in memory.
struct MemoryLog final : ArmLog {
  std::vector<StepRecord> steps;
  std::vector<std::pair<std::int64_t, LayerStats>> recorded;
  std::vector<std::vector<double>> logit_max;
  std::vector<EvalRecord> evals;
  std::string status;
  void step(const StepRecord& r) override { steps.push_back(r); }
  void stats(std::int64_t step, const LayerStats& s, std::span<const double> maxima) override {
    recorded.emplace_back(step, s);
    logit_max.emplace_back(maxima.begin(), maxima.end());
  }
  void eval(const EvalRecord& r) override { evals.push_back(r); }
  void finish(const std::string& s) override { status = s; }

  // Sum over instrumented steps and layers of one counter of one kind.
  std::uint64_t total(TensorKind kind, Counter counter) const {
    std::uint64_t n = 0;
    for (const auto& [step, layers] : recorded)
      for (const auto& layer : layers) n += layer[static_cast<int>(kind)][counter];
    return n;
  }
};

const TrainTest& synthetic() {
  static const TrainTest data = make_synthetic(7, 1024, 256);
  return data;
}

ArmSetup small_setup(const Policy& policy) {
  ArmSetup s;
  s.policy = &policy;
  s.model.hidden = {64, 32};
  s.train.batch_size = 32;
  s.train.max_steps = 20;
  s.train.eval_batch = 256;
  s.train.threads = 1;
  s.optimizer.lr = 0.05;
  s.seed = 3;
  return s;
}

ArmResult run(const ArmSetup& setup, MemoryLog& log) {
  auto backend = make_cpu_backend();
  return train_arm(*backend, setup, synthetic(), &log);
}

}  // namespace

TEST_CASE("dynamic loss scaling follows GradScaler step by step", "[training][loss_scale]") {
  // torch.cuda.amp.GradScaler (docs, _amp_update_scale_): on inf/NaN the step is
  // skipped, scale *= backoff_factor and the growth tracker resets; after
  // growth_interval consecutive good steps scale *= growth_factor.
  LossScaling c;
  c.mode = LossScaleMode::dynamic;
  c.initial_scale = 65536;
  c.growth_interval = 3;
  LossScaler s(c);
  const std::vector<bool> found_inf{false, false, false, false, true, false, false, true, true, false, false, false};
  const std::vector<double> scale_before{65536, 65536, 65536, 131072, 131072, 65536, 65536, 65536, 32768, 16384,
                                         16384, 16384};
  const std::vector<bool> skipped{false, false, false, false, true, false, false, true, true, false, false, false};
  for (std::size_t i = 0; i < found_inf.size(); ++i) {
    INFO("step " << i);
    CHECK(s.scale() == scale_before[i]);
    CHECK(s.update(found_inf[i]) == skipped[i]);
  }
  CHECK(s.scale() == 32768);  // grown after the three good steps at the end
}

TEST_CASE("hysteresis, min and max scale follow Megatron-LM", "[training][loss_scale]") {
  LossScaling c;
  c.mode = LossScaleMode::dynamic;
  c.initial_scale = 1024;
  c.growth_interval = 2;
  c.hysteresis = 2;
  c.min_scale = 256;
  c.max_scale = 2048;
  LossScaler s(c);
  CHECK(s.update(true));  // first overflow: tolerated, still skipped
  CHECK(s.scale() == 1024);
  CHECK(s.update(true));  // second: backoff
  CHECK(s.scale() == 512);
  CHECK(s.update(true));
  CHECK(s.scale() == 256);
  CHECK(s.update(true));
  CHECK(s.scale() == 256);  // clamped at min
  CHECK_FALSE(s.update(false));
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 512);  // grown; hysteresis restored
  CHECK(s.update(true));
  CHECK(s.scale() == 512);  // tolerated again
  for (int i = 0; i < 8; ++i) s.update(false);
  CHECK(s.scale() == 2048);  // clamped at max
}

TEST_CASE("static and no loss scaling", "[training][loss_scale]") {
  LossScaling c;
  c.mode = LossScaleMode::fixed;
  c.initial_scale = 128;
  LossScaler s(c);
  CHECK(s.update(true));
  CHECK(s.scale() == 128);
  CHECK_FALSE(s.update(false));
  LossScaler none(LossScaling{});
  CHECK(none.scale() == 1);
  CHECK(none.update(true));  // the update does not run: the trainer ends the arm
  CHECK(none.scale() == 1);
  CHECK_FALSE(none.update(false));
}

TEST_CASE("overflowing gradients are skipped, recorded and back off the scale", "[training][loss_scale]") {
  Policy p = *preset_policy("fp16-mixed");
  p.loss_scaling.initial_scale = std::ldexp(1.0, 32);  // gradients overflow FP16 at first
  ArmSetup setup = small_setup(p);
  setup.train.max_steps = 40;
  setup.train.epochs = 2;
  MemoryLog log;
  const ArmResult r = run(setup, log);
  REQUIRE(r.status == "completed");
  REQUIRE(log.steps.size() == 40);
  int skipped = 0;
  for (std::size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& s = log.steps[i];
    CHECK(s.skipped == s.found_inf);
    if (i > 0) CHECK(s.loss_scale == (log.steps[i - 1].skipped ? log.steps[i - 1].loss_scale / 2 : log.steps[i - 1].loss_scale));
    skipped += s.skipped;
  }
  CHECK(skipped >= 5);  // 2^32 must come down below FP16's 65504 / |gradient|
  CHECK(r.skipped_steps == skipped);
  CHECK(log.steps.front().skipped);
  CHECK_FALSE(log.steps.back().skipped);
  // A skipped step leaves the weights alone: the loss of a skipped step's
  // successor is computed with the same weights, so equal batches would give
  // equal losses; here we only check training resumed and the loss fell.
  CHECK(log.steps.back().loss < log.steps.front().loss);
}

TEST_CASE("fp16-naive flushes tiny activation gradients that FP32 keeps", "[training][policy]") {
  // Small initial weights make small activation gradients (the paper's
  // motivating case); FP32 shows them below 2^-24, FP16 flushes them.
  const Policy fp32 = *preset_policy("fp32"), naive = *preset_policy("fp16-naive"), mixed = *preset_policy("fp16-mixed");
  const auto setup = [](const Policy& p) {
    ArmSetup s = small_setup(p);
    s.model.init_scale = 0.02;
    s.train.max_steps = 5;
    return s;
  };
  MemoryLog log32, log_naive, log_mixed;
  run(setup(fp32), log32);
  run(setup(naive), log_naive);
  run(setup(mixed), log_mixed);
  const auto below32 = log32.total(TensorKind::activation_grads, Counter::below_2_24);
  CHECK(below32 > 100);
  CHECK(log32.total(TensorKind::activation_grads, Counter::rounded_to_zero) == 0);  // binary32 flushes nothing here
  const auto flushed_naive = log_naive.total(TensorKind::activation_grads, Counter::rounded_to_zero);
  CHECK(flushed_naive > 50);
  // Loss scaling (2^16) lifts them into FP16's range.
  CHECK(log_mixed.total(TensorKind::activation_grads, Counter::rounded_to_zero) * 10 < flushed_naive);
  // And every flushed value is one that was nonzero: flushed <= nonzero.
  CHECK(flushed_naive <= log_naive.total(TensorKind::activation_grads, Counter::nonzero));
}

TEST_CASE("a loss weight of 2^-k moves every gradient k binades down and changes nothing in FP32 with SGD",
          "[training][loss]") {
  static_assert(loss_gradient_factor(65536.0, {}, 128) == 512.0f);
  static_assert(loss_gradient_factor(65536.0, {LossReduction::sum, 0x1p-20}, 128) == 0.0625f);
  static_assert(loss_gradient_factor(1.0, {LossReduction::mean, 0.1}, 3) == 0.1f / 3.0f);
  const Policy fp32 = *preset_policy("fp32"), naive = *preset_policy("fp16-naive"), mixed = *preset_policy("fp16-mixed");
  const auto setup = [](const Policy& p, double weight, LossReduction reduction = LossReduction::mean) {
    ArmSetup s = small_setup(p);
    s.train.loss = {reduction, weight};
    s.optimizer.lr = 0.05 / weight;  // SGD: u = -lr * m, and m carries the weight
    s.train.max_steps = 12;
    return s;
  };
  MemoryLog plain, weighted, summed;
  const ArmResult a = run(setup(fp32, 1.0), plain), b = run(setup(fp32, 0x1p-12), weighted);
  // Powers of two scale binary32 exactly (nothing here nears its subnormals),
  // so the weighted FP32 arm is the same run: same losses, same weights.
  CHECK(a.losses == b.losses);
  CHECK(a.test_accuracy == b.test_accuracy);
  REQUIRE(plain.steps.size() == weighted.steps.size());
  for (std::size_t i = 0; i < plain.steps.size(); ++i) CHECK(weighted.steps[i].grad_norm == plain.steps[i].grad_norm / 4096);
  // A sum over the batch of 32 with weight 1/32 is the mean, bit for bit.
  ArmSetup sum_setup = setup(fp32, 1.0 / 32, LossReduction::sum);
  sum_setup.optimizer.lr = 0.05;
  const ArmResult c = run(sum_setup, summed);
  CHECK(c.losses == a.losses);
  // The histogram of the weighted run's activation gradients is the plain
  // run's moved 12 binades down: more of them below 2^-24.
  CHECK(weighted.total(TensorKind::activation_grads, Counter::below_2_24) >
        plain.total(TensorKind::activation_grads, Counter::below_2_24) + 1000);
  // In FP16 without loss scaling the weight flushes gradients that the
  // unweighted run keeps; the dynamic loss scaler (2^16) lifts them back.
  MemoryLog naive_plain, naive_weighted, mixed_weighted;
  run(setup(naive, 1.0), naive_plain);
  run(setup(naive, 0x1p-12), naive_weighted);
  run(setup(mixed, 0x1p-12), mixed_weighted);
  const auto flushed = [](const MemoryLog& log) { return log.total(TensorKind::activation_grads, Counter::rounded_to_zero); };
  CHECK(flushed(naive_weighted) > 10 * (flushed(naive_plain) + 100));
  CHECK(flushed(mixed_weighted) * 10 < flushed(naive_weighted));
}

TEST_CASE("master weights prevent swallowed updates", "[training][policy]") {
  // With a tiny learning rate, w + dw rounds back to w in FP16 for most
  // weights; an FP32 master copy keeps the updates.
  const Policy naive = *preset_policy("fp16-naive"), mixed = *preset_policy("fp16-mixed");
  const auto setup = [](const Policy& p) {
    ArmSetup s = small_setup(p);
    s.optimizer.lr = 1e-4;
    s.optimizer.momentum = 0.0;
    s.train.max_steps = 4;
    return s;
  };
  MemoryLog log_naive, log_mixed;
  run(setup(naive), log_naive);
  run(setup(mixed), log_mixed);
  const auto rate = [](const MemoryLog& l) {
    return static_cast<double>(l.total(TensorKind::updates, Counter::swallowed)) /
           static_cast<double>(l.total(TensorKind::updates, Counter::nonzero));
  };
  CHECK(rate(log_naive) > 0.5);
  CHECK(rate(log_mixed) < 0.01);

  // Stochastic rounding of the stored FP16 weights lets updates through on average.
  Policy sr = naive;
  sr.name = "fp16-naive-sr";
  sr.weight_storage.rounding.mode = RoundingMode::stochastic;
  MemoryLog log_sr;
  run(setup(sr), log_sr);
  CHECK(rate(log_sr) < rate(log_naive));
}

TEST_CASE("a non-finite loss without a loss scaler stops the arm cleanly", "[training][policy]") {
  const Policy naive = *preset_policy("fp16-naive");
  ArmSetup s = small_setup(naive);
  s.optimizer.lr = 1e6;  // diverges within a few steps
  MemoryLog log;
  const ArmResult r = run(s, log);
  CHECK_THAT(r.status, Catch::Matchers::StartsWith("stopped: non-finite"));
  CHECK(log.status == r.status);
  CHECK(log.steps.size() == static_cast<std::size_t>(r.steps));
  CHECK(log.steps.back().found_inf);
}

// The trainer reads a step's scalars from the backend only when it logs
// (Backend's step ops): how often must not change a bit of the run.
TEST_CASE("reading the steps from the backend now and then changes nothing", "[training][loss_scale]") {
  const auto step_records = [](const MemoryLog& log) {
    // Bit patterns: a skipped step's gradient norm is NaN or inf.
    const auto bits = [](double x) { return std::bit_cast<std::uint64_t>(x); };
    std::vector<std::tuple<std::int64_t, std::uint64_t, double, bool, bool, double, std::uint64_t>> v;
    for (const StepRecord& r : log.steps)
      v.emplace_back(r.step, bits(r.loss), r.loss_scale, r.found_inf, r.skipped, r.learning_rate, bits(r.grad_norm));
    return v;
  };
  SECTION("dynamic scaling with overflows, Adam") {
    Policy p = *preset_policy("fp16-mixed");
    p.loss_scaling.initial_scale = std::ldexp(1.0, 30);  // overflows at first, backs off, grows again
    p.loss_scaling.growth_interval = 3;
    ArmSetup every = small_setup(p);
    every.optimizer.kind = OptimizerKind::adam;
    every.optimizer.lr = 1e-3;
    every.train.max_steps = 30;
    every.train.stats_interval = 1;
    ArmSetup seldom = every;
    seldom.train.stats_interval = 7;
    MemoryLog a, b;
    const ArmResult ra = run(every, a), rb = run(seldom, b);
    CHECK(ra.skipped_steps >= 3);
    CHECK(ra.losses == rb.losses);
    CHECK(ra.loss_scales == rb.loss_scales);
    CHECK(ra.skipped_steps == rb.skipped_steps);
    CHECK(ra.final_loss_scale == rb.final_loss_scale);
    CHECK(step_records(a) == step_records(b));
    CHECK(b.recorded.size() == 5);  // steps 0, 7, 14, 21, 28
  }
  SECTION("a stop without a loss scaler between two reads") {
    const Policy naive = *preset_policy("fp16-naive");
    ArmSetup every = small_setup(naive);
    every.optimizer.lr = 1e6;  // diverges within a few steps
    every.train.stats_interval = 1;
    ArmSetup seldom = every;
    seldom.train.stats_interval = 0;  // read only at the end of the run: the stop is found late
    MemoryLog a, b;
    const ArmResult ra = run(every, a), rb = run(seldom, b);
    REQUIRE_THAT(ra.status, Catch::Matchers::StartsWith("stopped: non-finite"));
    CHECK(rb.status == ra.status);
    CHECK(rb.steps == ra.steps);
    CHECK(step_records(a) == step_records(b));  // nothing after the stop is logged
    CHECK(b.status == ra.status);
  }
}

TEST_CASE("same seed, same bits; arms share initial weights and batches", "[training]") {
  const Policy p = *preset_policy("bf16-mixed");
  MemoryLog a, b;
  const ArmResult ra = run(small_setup(p), a), rb = run(small_setup(p), b);
  CHECK(ra.losses == rb.losses);
  // Step 0's loss depends only on the initial weights and the first batch:
  // FP32 and BF16 arms differ there only by BF16 rounding of the forward pass.
  MemoryLog c;
  const ArmResult rc = run(small_setup(*preset_policy("fp32")), c);
  CHECK(std::abs(rc.losses[0] - ra.losses[0]) < 0.05 * rc.losses[0]);
}

namespace {

std::string hex(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%a", v);
  return text;
}

}  // namespace

TEST_CASE("golden trajectory: fp16-mixed with dynamic scaling replays bit for bit", "[training][golden]") {
  // A short seeded run whose losses, loss scales and underflow counts are
  // stored in tests/golden/ and must come back identical. The scale starts at
  // 2^24 with growth every 8 steps, so backoffs and growth both happen.
  // Regenerate (after an intended change) with MPSIM_UPDATE_GOLDEN=1.
  // A second run, fp16-naive with small weights, has nonzero flush counts.
  Policy p = *preset_policy("fp16-mixed");
  p.loss_scaling.initial_scale = std::ldexp(1.0, 24);
  p.loss_scaling.growth_interval = 8;
  const Policy naive = *preset_policy("fp16-naive");
  ArmSetup first = small_setup(p);
  first.train.max_steps = 40;
  first.train.epochs = 2;
  first.model.init_scale = 0.5;
  ArmSetup second = small_setup(naive);
  second.train.max_steps = 12;
  second.model.init_scale = 0.02;
  std::ostringstream text;
  for (const ArmSetup* s : {&first, &second}) {
    MemoryLog log;
    run(*s, log);
    text << "# " << s->policy->name << ": step loss loss_scale skipped act_grad_flushed act_grad_below_2^-24 "
         << "weight_grad_flushed\n";
    for (std::size_t i = 0; i < log.steps.size(); ++i) {
      std::uint64_t flushed = 0, below = 0, wflushed = 0;
      for (const auto& layer : log.recorded[i].second) {
        flushed += layer[static_cast<int>(TensorKind::activation_grads)][Counter::rounded_to_zero];
        below += layer[static_cast<int>(TensorKind::activation_grads)][Counter::below_2_24];
        wflushed += layer[static_cast<int>(TensorKind::weight_grads)][Counter::rounded_to_zero];
      }
      const auto& r = log.steps[i];
      text << r.step << ' ' << hex(r.loss) << ' ' << hex(r.loss_scale) << ' ' << r.skipped << ' ' << flushed << ' '
           << below << ' ' << wflushed << '\n';
    }
  }
  test::check_golden(std::string(MPSIM_SOURCE_DIR) + "/tests/golden/trajectories.txt", text.str());
}

TEST_CASE("config errors name the key and what is accepted", "[training][config]") {
  const std::string base = "arms = [\"fp32\"]\n";
  const auto error = [&](const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
      parse_config(text, "test.toml", overrides);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error(base + "[train]\nepoch = 3\n"),
             Catch::Matchers::Contains("unknown config key 'train.epoch'; did you mean 'train.epochs'?"));
  // A key under the wrong table, a misspelt table and a policy's key: the nearest documented key, as written.
  CHECK_THAT(error(base + "[train]\nlr = 0.1\n"), Catch::Matchers::Contains("did you mean 'optimizer.lr'?"));
  CHECK_THAT(error(base + "[optimiser]\nlr = 0.1\n"), Catch::Matchers::Contains("did you mean 'optimizer'?"));
  CHECK_THAT(error(base + "[policies.x]\nweigths = \"binary16\"\n"),
             Catch::Matchers::Contains("did you mean 'policies.x.weights'?"));
  CHECK_THAT(error(base + "[train]\nzzz = 1\n"), !Catch::Matchers::Contains("did you mean"));
  CHECK_THAT(error(base + "[train]\nepochs = \"3\"\n"),
             Catch::Matchers::Contains("train.epochs must be an integer (got the string \"3\")"));
  CHECK_THAT(error(base + "[model]\nhidden = 3\n"), Catch::Matchers::Contains("must be an array (got the integer 3)"));
  CHECK_THAT(error("arms = [\"fp17\"]\n"), Catch::Matchers::Contains("unknown policy 'fp17'"));
  CHECK_THAT(error(base + "[policies.x]\nweights = \"binary17\"\n"),
             Catch::Matchers::Contains("unknown format 'binary17'"));
  CHECK_THAT(error(base + "[policies.x]\nweights = \"binary16/sideways\"\n"),
             Catch::Matchers::Contains("unknown rounding 'sideways'"));
  CHECK_THAT(error(base, {"train.epochs"}), Catch::Matchers::Contains("is not key=value"));
  CHECK_THAT(error(base, {"optimizer.kind=lion"}), Catch::Matchers::Contains("expected one of: sgd, adam, adamw"));
  CHECK_THAT(error(base + "[model]\nhidden = [0]\n"), Catch::Matchers::Contains("model.hidden"));
  CHECK_THAT(error(base + "[loss]\nweight = 0.0\n"), Catch::Matchers::Contains("loss.weight must be a finite number > 0"));
  CHECK_THAT(error(base, {"loss.reduction=median"}), Catch::Matchers::Contains("expected one of: mean, sum"));
  CHECK_THAT(error("arms = [\"fp32\"\n"), Catch::Matchers::Contains("test.toml:"));
  CHECK(error(base, {"train.epochs=2", "policies.fp16-mixed.loss_scale.initial=1024"}) == "no error");

  const ExperimentConfig c = parse_config(base, "t", {"arms=[\"fp16-mixed\",\"mine\"]", "policies.mine.base=fp16-naive",
                                                      "policies.mine.weight_storage=binary16/stochastic"});
  CHECK(c.policies.at("mine").weight_storage.rounding.mode == RoundingMode::stochastic);
  CHECK_FALSE(c.policies.at("mine").master_weights);
  // The resolved config parses back to the same policies.
  const ExperimentConfig again = parse_config(c.to_toml(), "resolved");
  CHECK(again.policies.at("mine").weight_storage == c.policies.at("mine").weight_storage);
  CHECK(again.arms == c.arms);
  const ExperimentConfig weighted = parse_config(base, "t", {"loss.reduction=sum", "loss.weight=0.125"});
  CHECK(parse_config(weighted.to_toml(), "resolved").train.loss == LossDefinition{LossReduction::sum, 0.125});
}

namespace {

// Watches what the trainer asks the CPU backend to round, and with which
// stochastic stream and amax history, leaving the arithmetic to it.
class WatchingBackend final : public test::ForwardingBackend {
 public:
  WatchingBackend() : ForwardingBackend(make_cpu_backend()) {}

  // One stochastic rounding call: what it rounded (the tensor, and whether
  // as a GEMM's running sums, a rounding or a weight update) and its draws.
  enum class What : std::uint8_t { gemm_sums, rounding, update };
  struct Call {
    const void* tensor;
    What what;
    std::uint64_t stream, first_index;
  };
  // One optimiser-state rounding: what the same probe values become when
  // rounded as this state tensor is (its point, unscaled, and its stream).
  struct StateCall {
    std::int64_t step;
    const void* tensor;
    std::vector<float> probe;
    const void* history;
    float amax;  // of the state before rounding, NaN ignored
  };
  std::vector<Call> calls;
  std::vector<StateCall> state_calls;
  std::int64_t steps_ended = 0;

  RoundResult round_impl(Tensor& t, const RoundingPoint& point, float scale, StochasticStream stream,
                    TensorStats* stats) override {
    if (point.rounding.mode == RoundingMode::stochastic)
      calls.push_back({t.buffer(), What::rounding, stream.key.stream, stream.first_index});
    return ForwardingBackend::round_impl(t, point, scale, stream, stats);
  }
  void gemm_impl(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, const GemmNumerics& numerics,
            StochasticStream stream) override {
    if (numerics.accumulation.rounding.mode == RoundingMode::stochastic)
      calls.push_back({c.buffer(), What::gemm_sums, stream.key.stream, stream.first_index});
    ForwardingBackend::gemm_impl(a, ta, b, tb, c, numerics, stream);
  }
  void optimizer_step_impl(const OptimizerParams& params, Tensor& weight, Tensor& grad, Tensor& state1, Tensor& state2,
                      Tensor& update, const RoundingPoint& storage, StochasticStream stream,
                      TensorStats* stats) override {
    if (storage.rounding.mode == RoundingMode::stochastic)
      calls.push_back({weight.buffer(), What::update, stream.key.stream, stream.first_index});
    ForwardingBackend::optimizer_step_impl(params, weight, grad, state1, state2, update, storage, stream, stats);
  }
  void end_step_impl() override {
    ++steps_ended;
    ForwardingBackend::end_step_impl();
  }
  void round_state_impl(Tensor& state, const RoundingPoint& point, Tensor* history, int margin,
                   StochasticStream stream) override {
    StateCall c{steps_ended, state.buffer(), {}, history ? history->buffer() : nullptr, 0.0f};
    std::vector<float> values(static_cast<std::size_t>(state.numel()));
    inner().to_host(state, values);
    for (const float v : values)
      if (!std::isnan(v)) c.amax = std::max(c.amax, std::fabs(v));
    // Probe values spread over one bfloat16 spacing above 1 (2^-7):
    // stochastic rounding sends each up or down by its draw.
    std::vector<float> probe(4096);
    for (std::size_t i = 0; i < probe.size(); ++i) probe[i] = 1.0f + (static_cast<float>(i) + 0.5f) * 0x1p-19f;
    Tensor p = inner().from_host(probe, {static_cast<std::int64_t>(probe.size())});
    RoundingPoint unscaled = point;
    unscaled.delayed_scaling = false;
    inner().round(p, unscaled, 1.0f, stream, nullptr);
    c.probe.resize(probe.size());
    inner().to_host(p, c.probe);
    state_calls.push_back(std::move(c));
    ForwardingBackend::round_state_impl(state, point, history, margin, stream);
  }
};

}  // namespace

TEST_CASE("every rounded tensor draws its own random stream", "[training][identity]") {
  // Issue 17: all optimiser state of a layer (momentum, Adam's m and v, of the
  // weight and of the bias) rounded with one shared stream, so two state
  // tensors holding the same values rounded them identically.
  Policy policy = *preset_policy("fp32");
  const RoundingPoint stochastic_bf16{formats::bfloat16, Rounding{RoundingMode::stochastic}, false};
  policy.optimizer_state = stochastic_bf16;
  SECTION("optimiser state, Adam") {}
  SECTION("optimiser state and stored weights, SGD with momentum, no master copy") {
    policy.master_weights = false;
    policy.weight_storage = policy.weights = stochastic_bf16;
    policy.accumulation = stochastic_bf16;  // GEMM sums round too, apart from their results
    policy.gemm_output = policy.weight_grads = policy.activation_grads = stochastic_bf16;
  }
  ArmSetup setup = small_setup(policy);
  setup.train.max_steps = 3;
  setup.train.stats_interval = 0;
  if (policy.master_weights) setup.optimizer.kind = OptimizerKind::adam, setup.optimizer.lr = 1e-3;
  else setup.optimizer.momentum = 0.9;
  WatchingBackend backend;
  MemoryLog log;
  REQUIRE(train_arm(backend, setup, synthetic(), &log).status == "completed");

  // The same probe values, rounded as two different state tensors of one step
  // are, must not come out identical everywhere.
  REQUIRE(backend.state_calls.size() >= 2 * 2 * 3);
  std::size_t pairs = 0, identical = 0;
  for (std::size_t i = 0; i < backend.state_calls.size(); ++i)
    for (std::size_t j = i + 1; j < backend.state_calls.size(); ++j) {
      const auto &a = backend.state_calls[i], &b = backend.state_calls[j];
      if (a.step != b.step || a.tensor == b.tensor) continue;
      ++pairs;
      identical += a.probe == b.probe ? 1 : 0;
    }
  CHECK(pairs > 0);
  CHECK(identical == 0);

  // No two roundings draw from the same (stream, index) range: a tensor
  // rounded again in the same way with its own draws is fine; a GEMM's sums
  // and its result, or a weight's initial rounding and its first update,
  // sharing draws is not.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::pair<const void*, WatchingBackend::What>> owner;
  std::size_t shared = 0;
  for (const auto& c : backend.calls) {
    const auto [it, added] = owner.try_emplace({c.stream, c.first_index}, c.tensor, c.what);
    if (!added && it->second != std::pair{c.tensor, c.what}) {
      ++shared;
      UNSCOPED_INFO("stream " << c.stream << " at index " << c.first_index << " used by two roundings");
    }
  }
  CHECK(shared == 0);
  if (!policy.master_weights) CHECK(backend.calls.size() > 20);
}

TEST_CASE("every delayed-scaled tensor keeps its own amax history", "[training][identity]") {
  // Adam's m and v, of the weight and of the bias, each scaled from its own
  // amax only: the history each state tensor is rounded with holds exactly
  // the amax of that tensor's last uses, in the ring's order.
  Policy policy = *preset_policy("fp32");
  policy.optimizer_state = RoundingPoint{formats::bfloat16, Rounding{}, true};
  // Headroom for v, which grows by up to about 2x a step early in training:
  // scaled to bfloat16's largest value with no margin, it overflows.
  policy.delayed_scaling.margin = 4;
  ArmSetup setup = small_setup(policy);
  setup.optimizer.kind = OptimizerKind::adam;
  setup.optimizer.lr = 1e-3;
  setup.train.max_steps = 20;  // more uses than the ring holds (16)
  setup.train.stats_interval = 0;
  WatchingBackend backend;
  MemoryLog log;
  // A history shared with another tensor scales by that tensor's amax: Adam's
  // v is far smaller than m, so m overflowed and the arm stopped.
  CHECK(train_arm(backend, setup, synthetic(), &log).status == "completed");

  std::map<const void*, const void*> tensor_of_history;
  std::map<const void*, std::vector<float>> amaxes_of_history;
  std::size_t conflicts = 0;
  for (const auto& c : backend.state_calls) {
    REQUIRE(c.history != nullptr);
    const auto [it, added] = tensor_of_history.try_emplace(c.history, c.tensor);
    if (!added && it->second != c.tensor) ++conflicts;
    amaxes_of_history[c.history].push_back(c.amax);
  }
  CHECK(conflicts == 0);
  // 3 Linear layers, weight and bias, m and v.
  CHECK(tensor_of_history.size() == 12);
  // The ring's values: history[k % 16] is the amax of the k-th use.
  const int length = policy.delayed_scaling.history;
  for (const auto& [history, amaxes] : amaxes_of_history) {
    std::vector<float> expected(static_cast<std::size_t>(length), 0.0f);
    for (std::size_t k = 0; k < amaxes.size(); ++k) expected[k % static_cast<std::size_t>(length)] = amaxes[k];
    // Read the ring back through a tensor that shares its buffer.
    std::vector<float> ring(static_cast<std::size_t>(length) + 1);
    backend.inner().to_host(Tensor({length + 1}, std::shared_ptr<void>(const_cast<void*>(history), [](void*) {})),
                            ring);
    ring.pop_back();
    CHECK(ring == expected);
  }
}

TEST_CASE("learning-rate warm-up: linear to lr, then the schedule over the remaining steps", "[training]") {
  OptimizerSpec o;
  o.lr = 0.8;
  ScheduleSpec s;
  s.kind = ScheduleKind::cosine;
  s.min_lr = 0.0;
  s.warmup = 4;
  CHECK(learning_rate(o, s, 0, 14) == 0.2);
  CHECK(learning_rate(o, s, 1, 14) == 0.4);
  CHECK(learning_rate(o, s, 3, 14) == 0.8);
  CHECK(learning_rate(o, s, 4, 14) == 0.8);          // the cosine's first step
  CHECK(learning_rate(o, s, 13, 14) == Approx(0.0).margin(1e-15));  // its last
  CHECK(learning_rate(o, s, 9, 14) == Approx(0.4 * (1.0 + std::cos(std::numbers::pi * 5.0 / 9.0))));
  s.warmup = 0;  // none: the cosine from step 0, as before
  CHECK(learning_rate(o, s, 0, 14) == 0.8);
}

namespace {

// Every max_abs_finite call the trainer makes, with the value a plain host
// loop in binary64 gives for the same tensor.
class MaximaBackend final : public test::ForwardingBackend {
 public:
  MaximaBackend() : ForwardingBackend(make_cpu_backend()) {}
  std::vector<std::pair<float, double>> calls;  // (backend's, host's)
  float max_abs_finite_impl(const Tensor& x) override {
    std::vector<float> v(static_cast<std::size_t>(x.numel()));
    inner().to_host(x, v);
    double host = 0.0;
    for (const float f : v)
      if (std::isfinite(f)) host = std::max(host, std::fabs(static_cast<double>(f)));
    calls.emplace_back(ForwardingBackend::max_abs_finite_impl(x), host);
    return calls.back().first;
  }
};

using test::tiny_text;

// A GPT of two blocks of width 8 (two heads, an MLP of 16) for tiny_text, trained with AdamW.
ArmSetup tiny_gpt_setup(const Policy& policy) {
  ArmSetup s = small_setup(policy);
  s.model.kind = ModelKind::gpt;
  s.model.depth = 2;
  s.model.width = 8;
  s.model.heads = 2;
  s.model.mlp_width = 16;
  s.train.batch_size = 8;
  s.optimizer.kind = OptimizerKind::adamw;
  s.optimizer.lr = 0.01;
  return s;
}

}  // namespace

TEST_CASE("logit maxima: each attention layer's and the output's, at the steps that keep statistics",
          "[training][transformer]") {
  const Policy policy = *preset_policy("fp32");
  ArmSetup s = tiny_gpt_setup(policy);
  s.train.max_steps = 6;
  s.train.stats_interval = 3;
  MaximaBackend backend;
  MemoryLog log;
  train_arm(backend, s, tiny_text(), &log);
  const std::vector<std::string> names = Model::stat_names(s.model, InputShape{1, 1, 8, 5});
  REQUIRE(log.logit_max.size() == 2);  // steps 0 and 3
  REQUIRE(backend.calls.size() == 2 * 3);  // two attention layers and the output, per logging step
  for (const auto& [mine, host] : backend.calls) {
    CHECK(mine > 0.0f);
    CHECK(static_cast<double>(mine) == host);
  }
  std::size_t call = 0;
  for (const auto& maxima : log.logit_max) {
    REQUIRE(maxima.size() == names.size());
    for (std::size_t l = 0; l < names.size(); ++l) {
      INFO(names[l]);
      const bool has_logits = names[l].ends_with(".attn") || names[l] == "loss";
      if (has_logits) CHECK(maxima[l] == static_cast<double>(backend.calls[call++].first));
      else CHECK(std::isnan(maxima[l]));
    }
  }
}

namespace {

// The activation-gradient elements counted per layer over a run, by the layer's name.
std::map<std::string, std::uint64_t> activation_grad_elements(const ArmSetup& setup, const ArmResult& r) {
  const std::vector<std::string> names = Model::stat_names(setup.model, InputShape{1, 28, 28, 10});
  REQUIRE(names.size() == r.stat_totals.size());
  std::map<std::string, std::uint64_t> counted;
  for (std::size_t i = 0; i < names.size(); ++i)
    counted[names[i]] = r.stat_totals[i][static_cast<int>(TensorKind::activation_grads)][Counter::elements];
  return counted;
}

}  // namespace

TEST_CASE("each activation-gradient tensor is counted once: ReLU and max pooling select, they do not round again",
          "[training][stats]") {
  // ReLU's and non-overlapping max pooling's input gradients hold only values of their output gradients and
  // zeros. Where those values already passed the policy's activation_grads point they are not rounded or counted
  // again (issue 21, section 1): an aggregate over layers counts each gradient tensor once. Under a per-tensor
  // scaled point the layer's new amax gives a new scale, so there the layer does round and count.
  for (const char* name : {"fp32", "fp16-mixed", "bf16-mixed"}) {
    CAPTURE(name);
    const Policy policy = *preset_policy(name);
    ArmSetup s = small_setup(policy);
    s.train.max_steps = 3;
    MemoryLog log;
    const ArmResult r = run(s, log);
    const auto counted = activation_grad_elements(s, r);
    // MLP 784-64-32-10, batch 32, 3 instrumented steps: the loss's gradient (32 x 10), fc3's input gradient
    // (32 x 32) and fc2's (32 x 64); fc1's is never made, ReLU's two select.
    CHECK(counted.at("loss") == 3u * 32 * 10);
    CHECK(counted.at("fc3") == 3u * 32 * 32);
    CHECK(counted.at("fc2") == 3u * 32 * 64);
    CHECK(counted.at("relu1") == 0);
    CHECK(counted.at("relu2") == 0);
    CHECK(log.total(TensorKind::activation_grads, Counter::elements) == 3u * 32 * (10 + 32 + 64));
  }
  SECTION("a delayed-scaled activation_grads point: ReLU rounds and counts its own tensor") {
    Policy scaled = *preset_policy("fp32");
    scaled.activation_grads = RoundingPoint{formats::e5m2, {}, true};
    ArmSetup s = small_setup(scaled);
    s.train.max_steps = 3;
    MemoryLog log;
    const auto counted = activation_grad_elements(s, run(s, log));
    CHECK(counted.at("relu1") == 3u * 32 * 64);
    CHECK(counted.at("relu2") == 3u * 32 * 32);
  }
  SECTION("LeNet-5: max pooling (2 x 2, stride 2) and ReLU select; the convolutions and Linear layers count") {
    const Policy policy = *preset_policy("fp16-mixed");
    ArmSetup s = small_setup(policy);
    s.model.kind = ModelKind::cnn;
    s.train.batch_size = 4;
    s.train.max_steps = 1;
    MemoryLog log;
    const ArmResult r = run(s, log);
    const auto counted = activation_grad_elements(s, r);
    std::uint64_t selecting = 0, computing = 0;
    for (const auto& [layer, n] : counted) {
      CAPTURE(layer);
      if (layer.rfind("pool", 0) == 0 || layer.rfind("relu", 0) == 0) selecting += n;
      else computing += n;
    }
    CHECK(selecting == 0);
    // conv2's input gradient (4 x 6 x 14 x 14), fc1's (4 x 400), fc2's (4 x 120), fc3's (4 x 84), the loss's (4 x 10).
    CHECK(counted.at("conv2") == 4u * 6 * 14 * 14);
    CHECK(computing == 4u * (6 * 14 * 14 + 400 + 120 + 84 + 10));
  }
}

namespace {

// FNV-1a over the bytes of a trivially copyable value: a fingerprint of a
// step's statistics for the golden file.
template <typename T>
std::uint64_t fnv1a(const T& value, std::uint64_t h = 0xcbf29ce484222325ull) {
  static_assert(std::has_unique_object_representations_v<T>);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&value);
  for (std::size_t i = 0; i < sizeof(T); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

TEST_CASE("golden trajectory: transformers with every optional layer replay bit for bit", "[training][golden]") {
  // Pins the bits of every transformer layer through training before the
  // layers' plumbing is rewritten (docs/plan-layer-tables.md, step 0): each
  // step's loss, scale and a hash of every layer's statistics (histograms,
  // counters, logit maxima), then the evaluations. Regenerate (after an
  // intended change) with MPSIM_UPDATE_GOLDEN=1.
  Policy bf16 = *preset_policy("bf16-mixed");
  bf16.norm_statistics = RoundingPoint{formats::bfloat16, Rounding{RoundingMode::nearest_even}};
  const Policy fp16 = *preset_policy("fp16-mixed");
  const auto gpt = [](const Policy& p) {
    ArmSetup s = tiny_gpt_setup(p);
    s.train.max_steps = 8;
    s.train.stats_interval = 1;
    s.train.eval_batch = 16;
    s.seed = 5;
    return s;
  };
  // Every optional layer: QK-norm, rotary positions, dropouts, both soft caps, RMSNorm with narrow statistics.
  ArmSetup every = gpt(bf16);
  every.model.activation = Activation::gelu;
  every.model.norm = NormKind::rms_norm;
  every.model.qk_norm = true;
  every.model.positions = PositionKind::rotary;
  every.model.dropout = 0.1;
  every.model.attention_dropout = 0.1;
  every.model.attention_softcap = 5.0;
  every.model.logit_softcap = 3.0;
  // LayerNorm, learned positions, SwiGLU, tied embeddings, fused attention with dropout, loss scaling.
  ArmSetup other = gpt(fp16);
  other.model.activation = Activation::silu;
  other.model.gated = true;
  other.model.tie_embeddings = true;
  other.model.fused_attention = true;
  other.model.attention_tile = 3;
  other.model.attention_dropout = 0.1;
  other.model.qk_norm = true;
  // A ViT: patches, tokens, sequence mean, GELU and LayerNorm.
  ArmSetup vit = gpt(bf16);
  vit.model.kind = ModelKind::vit;
  vit.model.activation = Activation::gelu;
  vit.model.depth = 1;
  vit.train.max_steps = 4;
  vit.train.batch_size = 16;
  vit.train.eval_batch = 64;
  std::ostringstream text;
  for (const auto& [name, s] : {std::pair<const char*, const ArmSetup*>{"gpt-every-layer", &every},
                                {"gpt-tied-swiglu-fused", &other}, {"vit-gelu", &vit}}) {
    MemoryLog log;
    auto backend = make_cpu_backend();
    if (s->model.kind == ModelKind::vit)
      train_arm(*backend, *s, synthetic(), &log);
    else
      train_arm(*backend, *s, tiny_text(), &log);
    const bool vision = s->model.kind == ModelKind::vit;
    text << "# " << name << ": layers";  // their order keys every stream
    for (const std::string& layer : Model::stat_names(s->model, vision ? InputShape{} : InputShape{1, 1, 8, 5}))
      text << ' ' << layer;
    text << "\n# step loss loss_scale skipped stats_hash\n";
    REQUIRE(log.recorded.size() == log.steps.size());
    for (std::size_t i = 0; i < log.steps.size(); ++i) {
      std::uint64_t h = 0xcbf29ce484222325ull;
      for (const auto& layer : log.recorded[i].second)
        for (const TensorStats& t : layer) h = fnv1a(t.counters, fnv1a(t.histogram, h));
      for (const double m : log.logit_max[i]) h = fnv1a(std::bit_cast<std::uint64_t>(m), h);
      const auto& r = log.steps[i];
      text << r.step << ' ' << hex(r.loss) << ' ' << hex(r.loss_scale) << ' ' << r.skipped << ' ' << std::hex << h
           << std::dec << '\n';
    }
    for (const EvalRecord& e : log.evals)
      text << "eval " << e.step << ' ' << hex(e.train_loss) << ' ' << hex(e.test_loss) << ' '
           << hex(e.test_accuracy) << '\n';
  }
  test::check_golden(std::string(MPSIM_SOURCE_DIR) + "/tests/golden/transformer_trajectories.txt", text.str());
}
