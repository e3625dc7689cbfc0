// Training-step time per policy, with and without instrumentation at every
// step, of the default MLP (784-256-256-10, ReLU, batch 128, SGD with
// momentum; BM_train_step) and of the charlm GPT (BM_gpt_step: 4 causal
// blocks of width 128, 4 heads, MLP 512, context 128, batch 32, AdamW, on a
// seeded random stream of 96 symbols: the step's cost does not depend on the
// text). bench/train_vs_torch.sh runs each beside the same step in PyTorch.
//
//   bench_train --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>

#include "mpsim/core/trainer.hpp"

using namespace mpsim::core;

namespace {

constexpr std::int64_t batch = 128, warmup_steps = 10, timed_steps = 60;

const TrainTest& data() {
  static const TrainTest d = make_synthetic(1, batch * (warmup_steps + timed_steps), 128);
  return d;
}

// The time per step from the end of `warmup` steps to the end of the
// last: model set-up and the final evaluation are outside the timed span.
double seconds_per_step(const ArmSetup& setup, const TrainTest& d, std::int64_t warmup) {
  auto backend = make_cpu_backend();
  std::chrono::steady_clock::time_point start, end;
  train_arm(*backend, setup, d, nullptr, [&](const Progress& p) {
    if (p.step == warmup) start = std::chrono::steady_clock::now();
    if (p.step == p.total_steps) end = std::chrono::steady_clock::now();
  });
  return std::chrono::duration<double>(end - start).count() / static_cast<double>(setup.train.max_steps - warmup);
}

// args: policy index, instrument (0/1), threads
void BM_train_step(benchmark::State& state) {
  const auto names = preset_policy_names();
  const Policy policy = *preset_policy(names[static_cast<std::size_t>(state.range(0))]);
  ArmSetup setup;
  setup.policy = &policy;
  setup.model.hidden = {256, 256};
  setup.train.batch_size = batch;
  setup.train.max_steps = warmup_steps + timed_steps;
  setup.train.stats_interval = state.range(1) ? 1 : 0;
  setup.train.eval_batch = 128;
  setup.train.threads = static_cast<int>(state.range(2));
  setup.seed = 1;
  for (auto _ : state) state.SetIterationTime(seconds_per_step(setup, data(), warmup_steps));
  state.SetLabel(policy.name + (state.range(1) ? " +stats" : ""));
}

void arguments(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int policy = 0; policy < static_cast<int>(preset_policy_names().size()); ++policy)
      for (int instrument : {0, 1}) b->Args({policy, instrument, threads});
  b->ArgNames({"policy", "stats", "threads"});
}

constexpr std::int64_t gpt_batch = 32, context = 128, vocabulary = 96, gpt_warmup = 2, gpt_timed = 6;
constexpr const char* gpt_policies[] = {"fp32", "bf16-mixed", "fp16-mixed"};

const TrainTest& tokens() {
  static const TrainTest d = [] {
    TrainTest t;
    std::mt19937_64 rng(1);
    for (auto [set, count] : {std::pair{&t.train, gpt_batch * (gpt_warmup + gpt_timed)}, {&t.test, gpt_batch}}) {
      set->channels = set->height = 1;
      set->width = set->labels_per_sample = context;
      set->classes = vocabulary;
      set->count = count;
      for (std::int64_t i = 0; i < count * context; ++i) {
        set->images.push_back(static_cast<float>(rng() % vocabulary));
        set->labels.push_back(static_cast<std::int32_t>(rng() % vocabulary));
      }
    }
    return t;
  }();
  return d;
}

// args: policy index, instrument (0/1), threads; `fused`: model.fused_attention (tiles of 64 keys)
void gpt_step(benchmark::State& state, bool fused) {
  const Policy policy = *preset_policy(gpt_policies[state.range(0)]);
  ArmSetup setup;
  setup.policy = &policy;
  setup.model.kind = ModelKind::gpt;
  setup.model.depth = 4;
  setup.model.width = 128;
  setup.model.heads = 4;
  setup.model.mlp_width = 512;
  setup.model.activation = Activation::gelu;
  setup.model.init = InitScheme::normal;
  setup.model.init_scale = 0.02;
  setup.model.fused_attention = fused;
  setup.optimizer.kind = OptimizerKind::adamw;
  setup.optimizer.lr = 3e-3;
  setup.optimizer.weight_decay = 0.1;
  setup.train.batch_size = gpt_batch;
  setup.train.max_steps = gpt_warmup + gpt_timed;
  setup.train.stats_interval = state.range(1) ? 1 : 0;
  setup.train.eval_batch = gpt_batch;
  setup.train.threads = static_cast<int>(state.range(2));
  setup.seed = 1;
  for (auto _ : state) state.SetIterationTime(seconds_per_step(setup, tokens(), gpt_warmup));
  state.SetLabel(policy.name + (state.range(1) ? " +stats" : "") + (fused ? " fused" : ""));
}
void BM_gpt_step(benchmark::State& state) { gpt_step(state, false); }
// The same step with FlashAttention-2's fused path (docs/transformers.md), without statistics.
void BM_gpt_step_fused(benchmark::State& state) { gpt_step(state, true); }

void gpt_arguments(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int policy = 0; policy < 3; ++policy)
      for (int instrument : {0, 1}) b->Args({policy, instrument, threads});
  b->ArgNames({"policy", "stats", "threads"});
}

}  // namespace

BENCHMARK(BM_train_step)->Apply(arguments)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_gpt_step)->Apply(gpt_arguments)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_gpt_step_fused)
    ->ArgsProduct({{0, 1, 2}, {0}, {1, 2}})
    ->ArgNames({"policy", "stats", "threads"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_MAIN();
