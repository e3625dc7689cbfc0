// Training-step time of the charlm GPT (experiments/configs/charlm.toml: 4
// causal blocks of width 128, 4 heads, MLP 512, context 128, batch 32,
// AdamW) per policy, with and without instrumentation at every step, on a
// seeded random token stream of 96 symbols (the step's cost does not depend
// on the text). bench/gpt_vs_torch.sh runs it beside the same step in PyTorch.
//
//   bench_train_gpt --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>

#include "mpsim/core/trainer.hpp"

using namespace mpsim::core;

namespace {

constexpr std::int64_t batch = 32, context = 128, vocabulary = 96, warmup_steps = 2, timed_steps = 6;
constexpr const char* policies[] = {"fp32", "bf16-mixed", "fp16-mixed"};

const TrainTest& data() {
  static const TrainTest d = [] {
    TrainTest t;
    std::mt19937_64 rng(1);
    for (auto [set, count] : {std::pair{&t.train, batch * (warmup_steps + timed_steps)}, {&t.test, batch}}) {
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

// args: policy index, instrument (0/1), threads
void BM_gpt_step(benchmark::State& state) {
  const Policy policy = *preset_policy(policies[state.range(0)]);
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
  setup.optimizer.kind = OptimizerKind::adamw;
  setup.optimizer.lr = 3e-3;
  setup.optimizer.weight_decay = 0.1;
  setup.train.batch_size = batch;
  setup.train.max_steps = warmup_steps + timed_steps;
  setup.train.stats_interval = state.range(1) ? 1 : 0;
  setup.train.eval_batch = batch;
  setup.train.threads = static_cast<int>(state.range(2));
  setup.seed = 1;
  auto backend = make_cpu_backend();
  for (auto _ : state) {
    std::chrono::steady_clock::time_point start, end;
    train_arm(*backend, setup, data(), nullptr, [&](const Progress& p) {
      if (p.step == warmup_steps) start = std::chrono::steady_clock::now();
      if (p.step == p.total_steps) end = std::chrono::steady_clock::now();
    });
    state.SetIterationTime(std::chrono::duration<double>(end - start).count() / timed_steps);
  }
  state.SetLabel(policy.name + (state.range(1) ? " +stats" : ""));
}

void arguments(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int policy = 0; policy < 3; ++policy)
      for (int instrument : {0, 1}) b->Args({policy, instrument, threads});
  b->ArgNames({"policy", "stats", "threads"});
}

}  // namespace

BENCHMARK(BM_gpt_step)->Apply(arguments)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_MAIN();
