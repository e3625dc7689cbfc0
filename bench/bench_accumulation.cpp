// GEMM under accumulation models, beside Eigen's FP32 GEMM (Eigen::MatrixXf
// product) on the same 512x512x512 data, with 1 and 2 threads.
//
//   bench_accumulation --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// The Eigen row of each thread count runs first and stores its time; every
// other row of that thread count carries `x_eigen`: its time over Eigen's
// (the bar for the H100 FP16 -> FP32 model is x_eigen <= 10). A and B hold
// binary16 values drawn from N(0,1) (seed 20261121), C starts at zero.
// GCC 12 warns about its own AVX-512 intrinsic headers ("__Y may be used
// uninitialized") when Eigen is built with -march=native; nothing is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/simd.hpp"

namespace {

constexpr int kSize = 512;

struct Data {
  std::vector<float> a, b;  // row-major, binary16 values
};

const Data& data() {
  static const Data d = [] {
    Data x;
    std::mt19937_64 rng(20261121);
    std::normal_distribution<float> normal;
    auto draw = [&] {
      const float v = normal(rng);
      const mpsim::Rounded r = mpsim::round_to_format(mpsim::formats::binary16, mpsim::Rounding{}, v);
      return mpsim::to_float(mpsim::formats::binary16, r.bits);
    };
    x.a.resize(std::size_t(kSize) * kSize);
    x.b.resize(std::size_t(kSize) * kSize);
    for (auto& v : x.a) v = draw();
    for (auto& v : x.b) v = draw();
    return x;
  }();
  return d;
}

std::map<int, double>& eigen_seconds() {  // per thread count
  static std::map<int, double> seconds;
  return seconds;
}

void set_ratio(benchmark::State& state, int threads, double seconds) {
  const auto it = eigen_seconds().find(threads);
  if (it != eigen_seconds().end() && it->second > 0) state.counters["x_eigen"] = seconds / it->second;
}

void eigen_gemm(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Eigen::setNbThreads(threads);
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Matrix a = Eigen::Map<const Matrix>(data().a.data(), kSize, kSize);
  const Matrix b = Eigen::Map<const Matrix>(data().b.data(), kSize, kSize);
  Matrix c(kSize, kSize);
  double total = 0;
  std::int64_t runs = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++runs;
  }
  eigen_seconds()[threads] = total / double(runs);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kSize * kSize * kSize * double(runs) / 1e9 / total);
}

void model_gemm(benchmark::State& state, const std::string& name, const char* target) {
  const int threads = static_cast<int>(state.range(0));
  const auto model = mpsim::parse_accumulation_model(name, mpsim::formats::binary16);
  if (!model) {
    state.SkipWithError("unknown model");
    return;
  }
  // A lesser SIMD target than the best (mpsim/emulation/simd.hpp), where this CPU has it.
  std::optional<mpsim::simd::ForceTarget> forced;
  if (target != nullptr) {
    try {
      forced.emplace(target);
    } catch (const std::invalid_argument& e) {
      state.SkipWithError(e.what());
      return;
    }
  }
  state.SetLabel(std::string(mpsim::gemm_kernel_name(*model)));
  std::vector<float> c(std::size_t(kSize) * kSize);
  double total = 0;
  std::int64_t runs = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    mpsim::gemm(*model, data().a.data(), data().b.data(), c.data(), kSize, kSize, kSize, false, threads);
    benchmark::DoNotOptimize(c.data());
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++runs;
  }
  set_ratio(state, threads, total / double(runs));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kSize * kSize * kSize * double(runs) / 1e9 / total);
}

void h100_fp16(benchmark::State& state) { model_gemm(state, "h100", nullptr); }
void h100_fp16_avx2(benchmark::State& state) { model_gemm(state, "h100", "avx2"); }
void h100_fp16_portable(benchmark::State& state) {
  model_gemm(state, "h100", std::string(mpsim::simd::portable_target().name).c_str());
}
void a100_fp16(benchmark::State& state) { model_gemm(state, "a100", nullptr); }
void recursive_fp32(benchmark::State& state) { model_gemm(state, "fp32", nullptr); }

}  // namespace

// Registration order is run order: Eigen first for each thread count.
BENCHMARK(eigen_gemm)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(h100_fp16)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(h100_fp16_avx2)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(h100_fp16_portable)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(a100_fp16)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(recursive_fp32)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
