// Training-step time of the default MLP (784-256-256-10, ReLU, batch 128,
// SGD with momentum) per policy, with and without instrumentation at every
// step. bench/train_vs_torch.sh runs it beside the same step in PyTorch.
//
//   bench_train --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>

#include "mpsim/core/trainer.hpp"

using namespace mpsim::core;

namespace {

constexpr std::int64_t batch = 128, warmup_steps = 10, timed_steps = 60;

const TrainTest& data() {
  static const TrainTest d = make_synthetic(1, batch * (warmup_steps + timed_steps), 128);
  return d;
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
  auto backend = make_cpu_backend();
  for (auto _ : state) {
    // Time from the end of the warm-up steps to the end of the last step:
    // model set-up and the final evaluation are outside the timed span.
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
    for (int policy = 0; policy < static_cast<int>(preset_policy_names().size()); ++policy)
      for (int instrument : {0, 1}) b->Args({policy, instrument, threads});
  b->ArgNames({"policy", "stats", "threads"});
}

}  // namespace

BENCHMARK(BM_train_step)->Apply(arguments)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
