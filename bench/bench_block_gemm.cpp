// Block-scaled GEMMs (block_gemm.hpp) beside Eigen's binary32 GEMM of the same
// size, one thread, paired and interleaved: each repetition times Eigen and
// every format once, in turn; a time is the median over repetitions. The bar
// of issue #19 §8: the emulated block-scaled GEMM at most 10x Eigen's time.
// Operands are quantized once, outside the timing (the GEMM's inputs are
// quantized tensors).
//
//   bench_block_gemm [--repetitions=N] [--size=S]   (defaults 7, 512)
#include <Eigen/Core>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "mpsim/emulation/block_gemm.hpp"

using namespace mpsim;

namespace {

double seconds(const auto& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repetitions = 7, size = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--repetitions=", 0) == 0) repetitions = std::stoi(arg.substr(14));
    else if (arg.rfind("--size=", 0) == 0) size = std::stoi(arg.substr(7));
    else {
      fmt::print(stderr, "bench_block_gemm: unknown option {} (accepted: --repetitions=N --size=S)\n", arg);
      return 2;
    }
  }
  Eigen::setNbThreads(1);
  const int m = size, n = size, k = size;
  std::mt19937_64 rng(20261126);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(n) * k);
  for (float& v : x) v = normal(rng);
  for (float& v : y) v = normal(rng);
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const Matrix> ea(x.data(), m, k), eb(y.data(), n, k);
  Matrix ec(m, n);
  struct Row {
    std::string name;
    BlockFormat a, b;
    BlockGemmModel model;
    BlockOperand qa, qb;
    std::vector<double> times;
  };
  std::vector<Row> rows;
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp4", "nvfp4"})
    rows.push_back({name, *parse_block_format(name), *parse_block_format(name), {}, {}, {}, {}});
  BlockGemmModel deepseek;
  deepseek.promotion_interval = 128;
  deepseek.tensor_core = *tensor_core_preset("H100", formats::e4m3, formats::binary32);
  rows.push_back({"fp8-e4m3 1x128 x 128x128, H100 partials", *parse_block_format("fp8-e4m3-1x128"),
                  *parse_block_format("fp8-e4m3-128x128"), deepseek, {}, {}, {}});
  BlockGemmModel scaled_tc;  // E8M0-scaled products in the H100's FP8 accumulator, never promoted
  scaled_tc.tensor_core = *tensor_core_preset("H100", formats::e4m3, formats::binary32);
  rows.push_back({"mxfp8-e4m3, scaled products in H100's accumulator", *parse_block_format("mxfp8-e4m3"),
                  *parse_block_format("mxfp8-e4m3"), scaled_tc, {}, {}, {}});
  // Per-tensor FP8 (fp8-current): E4M3 x E4M3 sums fit binary64; E5M2 x E4M3 (its backward GEMMs) may not.
  rows.push_back({"fp8-e4m3 per tensor", *parse_block_format("fp8-e4m3-tensor"), *parse_block_format("fp8-e4m3-tensor"),
                  {}, {}, {}, {}});
  rows.push_back({"fp8-e5m2 x fp8-e4m3 per tensor", *parse_block_format("fp8-e5m2-tensor"),
                  *parse_block_format("fp8-e4m3-tensor"), {}, {}, {}, {}});
  // The same with A spread over 24 binades, as gradients are: its sums exceed binary64 (two exact binary64
  // GEMMs, split at 2^0).
  std::vector<float> spread = x;
  for (float& v : spread) v = std::ldexp(v, static_cast<int>(rng() % 24) - 12);
  rows.push_back({"fp8-e5m2 (A over 24 binades) x fp8-e4m3 per tensor", *parse_block_format("fp8-e5m2-tensor"),
                  *parse_block_format("fp8-e4m3-tensor"), {}, {}, {}, {}});
  for (Row& r : rows) {
    r.qa = quantize_block_operand(r.a, r.name.find("24 binades") != std::string::npos ? spread : x, m, k);
    r.qb = quantize_block_operand(r.b, y, n, k);
  }
  std::vector<float> c(static_cast<std::size_t>(m) * n);
  std::vector<double> eigen_times;
  for (int rep = 0; rep < repetitions; ++rep) {
    eigen_times.push_back(seconds([&] { ec.noalias() = ea * eb.transpose(); }));
    for (Row& r : rows)
      r.times.push_back(seconds([&] { block_gemm(r.model, r.a, r.qa, r.b, r.qb, c.data(), m, n, k); }));
  }
  const double eigen = median(eigen_times);
  fmt::print("{}x{}x{}, 1 thread, {} repetitions (median): Eigen binary32 GEMM {:.4f} s ({:.1f} GFLOP/s)\n\n", m, n, k,
             repetitions, eigen, 2.0 * m * n * k / eigen / 1e9);
  fmt::print("| operands | time s | / Eigen | bar (<= 10x) |\n|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double t = median(r.times);
    fmt::print("| {} | {:.4f} | {:.1f}x | {} |\n", r.name, t, t / eigen, t / eigen <= 10 ? "met" : "not met");
  }
  return 0;
}
