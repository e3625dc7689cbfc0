// Array quantize throughput (elements/s) for every preset format and rounding
// mode, beside the ceilings measured in the same run: memcpy of the same array
// and the hardware F16C float->half->float round trip.
//
//   bench_quantize --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Each quantize row carries `x_memcpy`: its rate over memcpy's rate for the same
// size and thread count (memcpy runs first). Data: "normal" is N(0,1), where
// almost every value is an ordinary normal number of the format; "gradients" has
// log-uniform magnitudes over 2^-40..2^0, where many values underflow and take
// the general path.
//
//   bench_quantize --side-by-side [--repetitions=N] [--passes=P] [--wall-clock] [--compare-stores] [--target=T]
//   bench_quantize --blocks [--repetitions=N] [--passes=P] [--wall-clock] [--formats=a,b,...] [--target=T]
//
// --target=T (e.g. AVX2) runs no vector target better than T (simd::ForceTarget):
// a CPU with AVX-512 measures the AVX2 code that a CPU without it would run.
//
// --blocks: the bar of issue #19 §8, the same pairing for block-scaled formats
// (quantize_blocks' fast path, counts on, 16M floats as one 1 x 16M tensor);
// --formats limits it to some presets (to profile one).
//
// The bar of issue #17 instead: 16M floats, one thread, memcpy and every format,
// mode and data set in one run. Each repetition times every row once, in a
// rotated order, each right after a memcpy of the same array into the same
// output buffer; a row's ratio in a repetition is its rate over that paired
// memcpy's rate. Prints medians (and the spread of the ratio over the
// repetitions) as Markdown. Times are the thread's CPU time (on a shared
// machine, time spent descheduled is nobody's kernel), or wall time with
// --wall-clock. --compare-stores times every row twice per repetition, with
// cached and with streaming stores (QuantizeOptions::stores), each after its
// own memcpy, and prints a table for each.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mpsim/emulation/block_format.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/simd.hpp"

namespace {

using mpsim::Format;
using mpsim::RoundingMode;

constexpr std::size_t in_cache = std::size_t{1} << 15;  // 32K floats: in and out fit in L2
constexpr std::size_t large = std::size_t{1} << 24;     // 16M floats: 64 MiB each way

enum class Data { normal, gradients };

const std::vector<float>& input(std::size_t n, Data data) {
  static std::map<std::pair<std::size_t, Data>, std::vector<float>> cache;
  auto& v = cache[{n, data}];
  if (v.empty()) {
    std::mt19937_64 rng(20261121);  // fixed seed: the same data every run
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> exponent(-40.0f, 0.0f);
    v.resize(n);
    for (auto& x : v) {
      x = data == Data::normal ? normal(rng) : ((rng() & 1) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
    }
  }
  return v;
}

// memcpy rate by (size, threads), for the ratios.
std::map<std::pair<std::size_t, int>, double> memcpy_rate;

template <class Work>
void run_split(std::size_t n, int threads, Work work) {
  if (threads == 1) return work(std::size_t{0}, n);
  std::vector<std::thread> pool;
  const std::size_t chunk = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { work(std::min(n, t * chunk), std::min(n, (t + 1) * chunk)); });
  for (auto& th : pool) th.join();
}

// Runs `body` once an iteration; reports elements/s, bytes/s (read and written
// elements of `element_size` bytes) and, through rate_out, this run's elements/s.
template <class Body>
void timed_loop(benchmark::State& state, std::size_t n, Body body, double* rate_out,
                std::size_t element_size = sizeof(float)) {
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    body();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n * 2 * element_size));
  if (rate_out != nullptr && seconds > 0) *rate_out = static_cast<double>(n) * state.iterations() / seconds;
}

void bench_memcpy(benchmark::State& state, std::size_t n, int threads) {
  const auto& in = input(n, Data::normal);
  std::vector<float> out(n);
  double rate = 0;
  timed_loop(state, n, [&] {
    run_split(n, threads, [&](std::size_t b, std::size_t e) { std::memcpy(out.data() + b, in.data() + b, (e - b) * 4); });
    benchmark::DoNotOptimize(out.data());
  }, &rate);
  memcpy_rate[{n, threads}] = rate;
}

__attribute__((target("f16c,avx2"))) void f16c_round_trip(const float* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
  }
  for (; i < n; ++i) out[i] = _cvtsh_ss(_cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT));
}

void add_ratio(benchmark::State& state, std::size_t n, int threads, double rate) {
  const auto base = memcpy_rate.find({n, threads});
  if (base != memcpy_rate.end() && base->second > 0) state.counters["x_memcpy"] = rate / base->second;
}

void bench_f16c(benchmark::State& state, std::size_t n, int threads) {
  if (!__builtin_cpu_supports("f16c")) {
    state.SkipWithError("this CPU has no F16C");
    return;
  }
  const auto& in = input(n, Data::normal);
  std::vector<float> out(n);
  double rate = 0;
  timed_loop(state, n, [&] {
    run_split(n, threads, [&](std::size_t b, std::size_t e) { f16c_round_trip(in.data() + b, out.data() + b, e - b); });
    benchmark::DoNotOptimize(out.data());
  }, &rate);
  add_ratio(state, n, threads, rate);
}

void bench_quantize(benchmark::State& state, Format format, RoundingMode mode, std::size_t n, int threads, Data data,
                    mpsim::Path path) {
  const auto& in = input(n, data);
  std::vector<float> out(n);
  mpsim::QuantizeOptions options;
  options.rounding.mode = mode;
  options.stochastic = {{42, 0}, 0};
  options.threads = threads;
  options.path = path;
  mpsim::QuantizeCounts counts;
  double rate = 0;
  timed_loop(state, n, [&] {
    counts = mpsim::quantize(format, std::span<const float>(in), std::span<float>(out), options);
    benchmark::DoNotOptimize(out.data());
  }, &rate);
  add_ratio(state, n, threads, rate);
  state.counters["inexact_pct"] = 100.0 * static_cast<double>(counts.inexact) / static_cast<double>(n);
  state.counters["flushed_pct"] = 100.0 * static_cast<double>(counts.flushed_to_zero) / static_cast<double>(n);
}

// Double storage: the scalar reference path, threaded.
void bench_quantize_double(benchmark::State& state, Format format, RoundingMode mode, std::size_t n, int threads) {
  const auto& in_float = input(n, Data::normal);
  std::vector<double> in(in_float.begin(), in_float.end()), out(n);
  mpsim::QuantizeOptions options;
  options.rounding.mode = mode;
  options.threads = threads;
  double rate = 0;
  timed_loop(state, n, [&] {
    mpsim::quantize(format, std::span<const double>(in), std::span<double>(out), options);
    benchmark::DoNotOptimize(out.data());
  }, &rate, sizeof(double));
  add_ratio(state, n, threads, rate);
}

// The formats and modes every table of this benchmark covers.
const std::pair<const char*, Format> bench_formats[] = {
    {"binary16", mpsim::formats::binary16}, {"bfloat16", mpsim::formats::bfloat16}, {"tf32", mpsim::formats::tf32},
    {"e4m3", mpsim::formats::e4m3},         {"e5m2", mpsim::formats::e5m2}};
const RoundingMode bench_modes[] = {RoundingMode::nearest_even,    RoundingMode::nearest_away,
                              RoundingMode::toward_zero,     RoundingMode::toward_positive,
                              RoundingMode::toward_negative, RoundingMode::odd,
                              RoundingMode::stochastic};

std::string size_name(std::size_t n) { return n == large ? "16M" : "32K"; }

void register_all() {
  for (std::size_t n : {in_cache, large}) {
    // Arrays below 128K elements run on one thread by design: no 2-thread rows for them.
    for (int threads : {1, 2}) {
      if (n == in_cache && threads > 1) continue;
      const std::string suffix = "/" + size_name(n) + "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(("memcpy" + suffix).c_str(), bench_memcpy, n, threads)->UseRealTime();
      benchmark::RegisterBenchmark(("f16c_round_trip" + suffix).c_str(), bench_f16c, n, threads)->UseRealTime();
      for (const auto& [name, format] : bench_formats) {
        for (RoundingMode mode : bench_modes) {
          for (Data data : {Data::normal, Data::gradients}) {
            const std::string label = std::string("quantize/") + name + "/" + std::string(mpsim::to_string(mode)) +
                                      (data == Data::normal ? "/normal" : "/gradients") + suffix;
            benchmark::RegisterBenchmark(label.c_str(), bench_quantize, format, mode, n, threads, data,
                                         mpsim::Path::automatic)
                ->UseRealTime();
          }
        }
      }
      // The scalar reference, for scale.
      benchmark::RegisterBenchmark(("quantize_scalar_reference/binary16/nearest-even/normal" + suffix).c_str(),
                                   bench_quantize, mpsim::formats::binary16, RoundingMode::nearest_even, n, threads,
                                   Data::normal, mpsim::Path::scalar)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("quantize_double_storage/binary16/nearest-even/normal" + suffix).c_str(),
                                   bench_quantize_double, mpsim::formats::binary16, RoundingMode::nearest_even, n,
                                   threads)
          ->UseRealTime();
    }
  }
}

}  // namespace

// ---- --side-by-side ----

struct Row {
  std::string format_name;
  Format format;
  RoundingMode mode;
  Data data;
  mpsim::Stores stores;
  std::vector<double> rates, ratios;  // one per repetition
};

const char* stores_name(mpsim::Stores stores) {
  switch (stores) {
    case mpsim::Stores::cached: return "cached";
    case mpsim::Stores::streaming: return "streaming";
  }
  return "?";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The clock of --side-by-side: this thread's CPU time by default (on a shared
// machine, time spent descheduled is not the kernel's), or wall time.
bool use_wall_clock = false;

double now_seconds() {
  if (use_wall_clock) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Elements per second of `passes` back-to-back calls of body.
template <class Body>
double time_passes(std::size_t n, int passes, Body body) {
  const double start = now_seconds();
  for (int p = 0; p < passes; ++p) body();
  return static_cast<double>(n) * passes / (now_seconds() - start);
}

void print_table(const std::vector<Row>& rows);

int side_by_side(int repetitions, int passes, const std::vector<mpsim::Stores>& kinds) {
  const std::size_t n = large;
  std::vector<Row> rows;
  for (mpsim::Stores stores : kinds)
    for (const auto& [name, format] : bench_formats)
      for (Data data : {Data::normal, Data::gradients})
        for (RoundingMode mode : bench_modes) rows.push_back({name, format, mode, data, stores, {}, {}});
  const auto& normal = input(n, Data::normal);
  const auto& gradients = input(n, Data::gradients);
  std::vector<float> out(n, 1.0f);  // one output buffer for every row and memcpy, touched once
  std::vector<double> memcpy_rates;
  auto run_memcpy = [&] {
    std::memcpy(out.data(), normal.data(), n * sizeof(float));
    benchmark::DoNotOptimize(out.data());
  };
  for (int w = 0; w < 2; ++w) run_memcpy();  // warm up
  for (int rep = 0; rep < repetitions; ++rep) {
    // Rotate the order so no row always follows the same neighbour.
    for (std::size_t k = 0; k < rows.size(); ++k) {
      Row& row = rows[(k + static_cast<std::size_t>(rep) * 7) % rows.size()];
      mpsim::QuantizeOptions options;
      options.rounding.mode = row.mode;
      options.stochastic = {{42, 0}, 0};
      options.threads = 1;
      options.stores = row.stores;
      const auto& in = row.data == Data::normal ? normal : gradients;
      const double base = time_passes(n, passes, run_memcpy);
      const double rate = time_passes(n, passes, [&] {
        mpsim::quantize(row.format, std::span<const float>(in), std::span<float>(out), options);
        benchmark::DoNotOptimize(out.data());
      });
      memcpy_rates.push_back(base);
      row.rates.push_back(rate);
      row.ratios.push_back(rate / base);
    }
    std::fprintf(stderr, "repetition %d of %d done\n", rep + 1, repetitions);
  }
  std::sort(memcpy_rates.begin(), memcpy_rates.end());
  std::printf("16M floats, 1 thread, vector target %s, %s, %d repetitions x %d passes. memcpy: median %.2f G/s "
              "(10th-90th percentile of its %zu paired runs: %.2f-%.2f).\n\n",
              std::string(mpsim::vector_target_name()).c_str(),
              use_wall_clock ? "wall-clock time" : "the thread's CPU time", repetitions, passes, median(memcpy_rates) / 1e9,
              memcpy_rates.size(), memcpy_rates[memcpy_rates.size() / 10] / 1e9,
              memcpy_rates[memcpy_rates.size() * 9 / 10] / 1e9);
  std::printf("Cells: median G elements/s (median of the per-repetition ratios to the paired memcpy; in brackets "
              "the lowest and highest ratio).\n");
  const std::size_t per_kind = rows.size() / kinds.size();
  for (std::size_t kind = 0; kind < kinds.size(); ++kind)
    print_table(std::vector<Row>(rows.begin() + static_cast<std::ptrdiff_t>(kind * per_kind),
                                 rows.begin() + static_cast<std::ptrdiff_t>((kind + 1) * per_kind)));
  return 0;
}

// One table of --side-by-side: the rows of one kind of store.
void print_table(const std::vector<Row>& rows) {
  std::printf("\nStores: %s (QuantizeOptions::stores).\n\n", stores_name(rows.front().stores));
  std::printf("| format | data |");
  for (RoundingMode mode : bench_modes) std::printf(" %s |", std::string(mpsim::to_string(mode)).c_str());
  std::printf("\n|---|---|");
  for (std::size_t m = 0; m < std::size(bench_modes); ++m) std::printf("---|");
  std::printf("\n");
  double worst_deterministic = 1e9, worst_stochastic = 1e9;
  for (std::size_t r = 0; r < rows.size(); r += std::size(bench_modes)) {
    std::printf("| %s | %s |", rows[r].format_name.c_str(), rows[r].data == Data::normal ? "normal" : "gradients");
    for (std::size_t m = 0; m < std::size(bench_modes); ++m) {
      const Row& row = rows[r + m];
      const double ratio = median(row.ratios);
      const auto [lo, hi] = std::minmax_element(row.ratios.begin(), row.ratios.end());
      std::printf(" %.2f (%.2fx; %.2f-%.2f) |", median(row.rates) / 1e9, ratio, *lo, *hi);
      double& worst = row.mode == RoundingMode::stochastic ? worst_stochastic : worst_deterministic;
      worst = std::min(worst, ratio);
    }
    std::printf("\n");
  }
  std::printf("\nLowest median ratio: deterministic modes %.2fx memcpy (goal 0.9x), stochastic %.2fx (goal 0.5x).\n",
              worst_deterministic, worst_stochastic);
}

// "a,b,c" -> {"a", "b", "c"}.
std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  std::istringstream stream(list);
  for (std::string name; std::getline(stream, name, ',');)
    if (!name.empty()) names.push_back(name);
  return names;
}

// Block-scaled formats beside memcpy, paired as in side_by_side.
int blocks_side_by_side(int repetitions, int passes, const std::vector<std::string>& only) {
  const std::size_t n = large;
  struct BlockRow {
    std::string name;
    RoundingMode mode;
    Data data;
    std::vector<double> rates, ratios;
  };
  std::vector<BlockRow> rows;
  std::vector<std::string> names{"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp4", "nvfp4", "fp8-e4m3-1x128", "mxint8"};
  if (!only.empty()) {
    for (const std::string& name : only)
      if (!mpsim::parse_block_format(name)) {
        std::fprintf(stderr, "bench_quantize --blocks: unknown block format %s in --formats\n", name.c_str());
        return 2;
      }
    names = only;
  }
  for (const std::string& name : names)
    for (Data data : {Data::normal, Data::gradients})
      for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::stochastic}) rows.push_back({name, mode, data, {}, {}});
  const auto& normal = input(n, Data::normal);
  const auto& gradients = input(n, Data::gradients);
  std::vector<float> out(n, 1.0f);
  std::vector<double> memcpy_rates;
  auto run_memcpy = [&] {
    std::memcpy(out.data(), normal.data(), n * sizeof(float));
    benchmark::DoNotOptimize(out.data());
  };
  for (int w = 0; w < 2; ++w) run_memcpy();
  for (int rep = 0; rep < repetitions; ++rep) {
    for (std::size_t k = 0; k < rows.size(); ++k) {
      BlockRow& row = rows[(k + static_cast<std::size_t>(rep) * 5) % rows.size()];
      const mpsim::BlockFormat format = *mpsim::parse_block_format(row.name);
      mpsim::BlockQuantizeOptions options;
      options.rounding.mode = row.mode;
      options.key = {42, 0};
      const auto& in = row.data == Data::normal ? normal : gradients;
      const double base = time_passes(n, passes, run_memcpy);
      const double rate = time_passes(n, passes, [&] {
        mpsim::quantize_blocks(format, std::span<const float>(in), std::span<float>(out), 1, static_cast<std::int64_t>(n),
                               options);
        benchmark::DoNotOptimize(out.data());
      });
      memcpy_rates.push_back(base);
      row.rates.push_back(rate);
      row.ratios.push_back(rate / base);
    }
    std::fprintf(stderr, "repetition %d of %d done\n", rep + 1, repetitions);
  }
  std::sort(memcpy_rates.begin(), memcpy_rates.end());
  std::printf("Block-scaled quantization (quantize_blocks, fast path, counts on), 16M floats, 1 thread, vector target "
              "%s, %s, %d repetitions x %d passes. memcpy: median %.2f G/s.\n\n",
              std::string(mpsim::vector_target_name()).c_str(),
              use_wall_clock ? "wall-clock time" : "the thread's CPU time", repetitions, passes, median(memcpy_rates) / 1e9);
  std::printf("Cells: median G elements/s (median ratio to the paired memcpy; lowest-highest ratio).\n\n");
  std::printf("| format | data | nearest-even | stochastic |\n|---|---|---|---|\n");
  double worst[2] = {1e9, 1e9};  // nearest-even, stochastic
  for (std::size_t r = 0; r < rows.size(); r += 2) {
    std::printf("| %s | %s |", rows[r].name.c_str(), rows[r].data == Data::normal ? "normal" : "gradients");
    for (std::size_t m = 0; m < 2; ++m) {
      const BlockRow& row = rows[r + m];
      const double ratio = median(row.ratios);
      const auto [lo, hi] = std::minmax_element(row.ratios.begin(), row.ratios.end());
      std::printf(" %.2f (%.2fx; %.2f-%.2f) |", median(row.rates) / 1e9, ratio, *lo, *hi);
      if (row.name == "mxfp8-e4m3" || row.name == "nvfp4") worst[m] = std::min(worst[m], ratio);
    }
    std::printf("\n");
  }
  if (worst[0] < 1e9)
    std::printf("\nLowest median ratio of MXFP8 (E4M3) and NVFP4: nearest-even %.2fx memcpy, stochastic %.2fx (goal "
                "0.5x).\n", worst[0], worst[1]);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--side-by-side" || std::string(argv[1]) == "--blocks")) {
    const bool blocks = std::string(argv[1]) == "--blocks";
    int repetitions = 11, passes = 2;
    std::vector<mpsim::Stores> kinds{mpsim::Stores::cached};
    std::vector<std::string> formats;
    std::optional<mpsim::simd::ForceTarget> forced;
    for (int a = 2; a < argc; ++a) {
      const std::string arg = argv[a];
      if (arg.rfind("--repetitions=", 0) == 0) repetitions = std::stoi(arg.substr(14));
      else if (arg.rfind("--passes=", 0) == 0) passes = std::stoi(arg.substr(9));
      else if (arg == "--wall-clock") use_wall_clock = true;
      else if (arg == "--compare-stores" && !blocks) kinds = {mpsim::Stores::cached, mpsim::Stores::streaming};
      else if (arg.rfind("--formats=", 0) == 0 && blocks) formats = split_names(arg.substr(10));
      else if (arg.rfind("--target=", 0) == 0) {
        try {
          forced.emplace(arg.substr(9));
        } catch (const std::invalid_argument& e) {
          std::fprintf(stderr, "bench_quantize: %s\n", e.what());
          return 2;
        }
      } else {
        std::fprintf(stderr, "bench_quantize %s: unknown option %s (accepted: --repetitions=N --passes=P "
                     "--wall-clock --target=T%s)\n", argv[1], arg.c_str(), blocks ? " --formats=a,b" : " --compare-stores");
        return 2;
      }
    }
    if (blocks) return blocks_side_by_side(std::max(1, repetitions), std::max(1, passes), formats);
    return side_by_side(std::max(1, repetitions), std::max(1, passes), kinds);
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::AddCustomContext("vector_target", std::string(mpsim::vector_target_name()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
