// The CPU backend's two binary32 GEMMs side by side: `ordered` (mpsim's
// fixed-order kernel, ordered_gemm.hpp) and `blas` (OpenBLAS through Eigen),
// on the products of one training step of the default MLP (784-256-256-10,
// batch 128) and of LeNet-5's convolutions, at 1 and 2 threads.
//
//   bench_gemm [--repetitions=N]   (default 21)
//
// Paired and interleaved: each repetition times every shape once with each
// GEMM, alternating which goes first, so drift on a shared machine hits both;
// a time is the median over repetitions of the best of 3 calls. The ratio is
// blas time / ordered time (above 1: ordered is faster).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/ordered_gemm.hpp"

using namespace mpsim;
using namespace mpsim::core;

namespace {

struct Product {
  const char* name;
  std::int64_t m, n, k;
  bool ta, tb;
};

// The default MLP's step: forward x W^T, weight gradient dy^T x, input gradient dy W.
constexpr Product products[] = {
    {"mlp fwd 1   128x256x784  A B^T", 128, 256, 784, false, true},
    {"mlp fwd 2   128x256x256  A B^T", 128, 256, 256, false, true},
    {"mlp fwd 3   128x10x256   A B^T", 128, 10, 256, false, true},
    {"mlp dW 1    256x784x128  A^T B", 256, 784, 128, true, false},
    {"mlp dW 2    256x256x128  A^T B", 256, 256, 128, true, false},
    {"mlp dW 3    10x256x128   A^T B", 10, 256, 128, true, false},
    {"mlp dX 3    128x256x10   A B", 128, 256, 10, false, false},
    {"mlp dX 2    128x256x256  A B", 128, 256, 256, false, false},
    {"lenet conv1 73728x6x25   A B^T", 73728, 6, 25, false, true},
    {"lenet conv2 8192x16x150  A B^T", 8192, 16, 150, false, true},
};

double seconds_of_best_of_3(Backend& backend, const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    backend.gemm(a, ta, b, tb, c, GemmNumerics{}, {});
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repetitions = 21;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--repetitions=", 0) == 0) repetitions = std::max(1, std::atoi(arg.c_str() + 14));
    else {
      fmt::print(stderr, "usage: bench_gemm [--repetitions=N]\n");
      return 2;
    }
  }
  auto backend = make_cpu_backend();
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal;
  fmt::print("bench_gemm: ordered ({}) against {}; {} repetitions, medians of best-of-3, milliseconds\n",
             ordered_gemm_target(), backend->describe_gemm(CpuGemm::blas, DeviceAttention::kernels), repetitions);
  for (const int threads : {1, 2}) {
    backend->set_threads(threads);
    fmt::print("\n{} thread(s)\n{:<34} {:>10} {:>10} {:>12}\n", threads, "shape (m x n x k)", "ordered", "blas",
               "blas/ordered");
    double total_ordered = 0, total_blas = 0;
    for (const Product& s : products) {
      auto values = [&](std::int64_t count) {
        std::vector<float> v(static_cast<std::size_t>(count));
        for (float& x : v) x = normal(rng);
        return v;
      };
      const Tensor a = backend->from_host(values(s.m * s.k), s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k});
      const Tensor b = backend->from_host(values(s.k * s.n), s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n});
      Tensor c = backend->zeros({s.m, s.n});
      std::vector<double> ordered, blas;
      for (int r = 0; r < repetitions; ++r)
        for (int turn = 0; turn < 2; ++turn) {
          const bool ordered_turn = (turn == 0) == (r % 2 == 0);
          backend->set_cpu_gemm(ordered_turn ? CpuGemm::ordered : CpuGemm::blas);
          (ordered_turn ? ordered : blas).push_back(seconds_of_best_of_3(*backend, a, s.ta, b, s.tb, c));
        }
      const double o = median(ordered), l = median(blas);
      const bool mlp = std::string(s.name).rfind("mlp", 0) == 0;
      if (mlp) {
        total_ordered += o;
        total_blas += l;
      }
      fmt::print("{:<34} {:>10.4f} {:>10.4f} {:>12.2f}\n", s.name, o * 1e3, l * 1e3, l / o);
    }
    fmt::print("{:<34} {:>10.4f} {:>10.4f} {:>12.2f}\n", "mlp step, sum of medians", total_ordered * 1e3,
               total_blas * 1e3, total_blas / total_ordered);
  }
}
