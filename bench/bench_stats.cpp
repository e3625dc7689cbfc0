// Exponent-histogram throughput (TensorStats::add_values) on the shapes the
// training loop feeds it: weights, post-ReLU activations (half zeros) and
// gradients spread over many binades. Reports ns per value.
//
//   bench_stats --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "mpsim/core/stats.hpp"
#include "mpsim/emulation/simd.hpp"

using namespace mpsim::core;

namespace {

std::vector<float> make_values(int shape, std::size_t n) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_real_distribution<float> exponent(-40.0f, 0.0f);
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (shape) {
      case 0: x = normal(rng); break;                                    // weights
      case 1: x = std::max(0.0f, normal(rng)); break;                   // post-ReLU
      case 2: x = normal(rng) * normal(rng) * normal(rng) * 1e-3f; break;  // gradient-like, heavy tails
      default: x = (rng() & 1 ? 1.0f : -1.0f) * std::exp2(exponent(rng));  // 40 binades, uniform
    }
  }
  return v;
}

// args: shape, size
void BM_histogram(benchmark::State& state) {
  const auto values = make_values(static_cast<int>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  TensorStats stats;
  for (auto _ : state) {
    benchmark::DoNotOptimize(stats.add_values(values));
    benchmark::ClobberMemory();
  }
  state.counters["ns/value"] = benchmark::Counter(
      static_cast<double>(state.iterations() * state.range(1)),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  static const char* names[] = {"weights", "relu", "gradients", "wide"};
  state.SetLabel(names[state.range(0)]);
}

// The same after evicting the values from the caches (an 8 MiB sweep), as
// in a training step, where the tensor was written a while before.
void BM_histogram_cold(benchmark::State& state) {
  const auto values = make_values(static_cast<int>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  std::vector<float> sweep(std::size_t{2} << 20);
  TensorStats stats;
  for (auto _ : state) {
    for (float& x : sweep) x += 1.0f;
    benchmark::ClobberMemory();
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(stats.add_values(values));
    benchmark::ClobberMemory();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  state.counters["ns/value"] = benchmark::Counter(
      static_cast<double>(state.iterations() * state.range(1)),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// One thread's field counting on a forced SIMD target and path (the
// histogram's kernels, without the binning): BM_fields/TARGET/PATH.
void BM_fields(benchmark::State& state, mpsim::simd::Target target, FieldCountPath path) {
  const auto values = make_values(static_cast<int>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  mpsim::simd::ForceTarget forced(target);
  for (auto _ : state) {
    benchmark::DoNotOptimize(count_fields(values, path));
    benchmark::ClobberMemory();
  }
  state.counters["ns/value"] = benchmark::Counter(
      static_cast<double>(state.iterations() * state.range(1)),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

const int fields_registered = [] {
  for (const mpsim::simd::Target& target : mpsim::simd::available_targets())
    for (const auto& [path, name] : {std::pair{FieldCountPath::window, "window"}, std::pair{FieldCountPath::pairs, "pairs"}})
      benchmark::RegisterBenchmark(("BM_fields/" + std::string(target.name) + "/" + name).c_str(), BM_fields, target,
                                   path)
          ->ArgsProduct({{0, 1, 2, 3}, {200704}})
          ->ArgNames({"shape", "n"});
  return 0;
}();

}  // namespace

BENCHMARK(BM_histogram_cold)->ArgsProduct({{0, 1}, {33000, 200704}})->ArgNames({"shape", "n"})->UseManualTime();
BENCHMARK(BM_histogram)->ArgsProduct({{0, 1, 2, 3}, {1000, 33000, 200704}})->ArgNames({"shape", "n"});
BENCHMARK_MAIN();
