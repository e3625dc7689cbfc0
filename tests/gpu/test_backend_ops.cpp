// The CUDA backend against the CPU backend, op by op on the same seeded
// inputs (ggml's test-backend-ops idea), then whole training steps.
//
// Exact where the CUDA backend does the CPU's operations in the CPU's order:
// copies, layouts, pooling, rounding (values, counters, histograms, amax),
// the element-wise binary32 ops, LayerNorm, the optimisers and apply_update,
// and the GEMM that rounds after every addition; NaNs are compared as a class
// only, since CUDA arithmetic returns its canonical NaN where x86 keeps the
// operand's payload. Bounded, with the bound derived next to each check, where
// the CUDA backend cannot follow the CPU: cuBLAS and OpenBLAS sum in
// different orders, the column sums and sum of squares reduce in a different
// order, and CUDA's expf/erff/logf are not glibc's.
//
// Every test case skips (exit 77, CTest "Skipped") when no CUDA device is present.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/block_scaled_gemm.hpp"
#include "support/backend_internals.hpp"
#include "mpsim/core/data.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/trainer.hpp"
#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/gpu/backend.hpp"
#include "mpsim/gpu/device.hpp"
#include "mpsim/gpu/tensor_core_check.hpp"
#include "require_device.hpp"
#include "support/test_support.hpp"

using namespace mpsim;
using core::Shape;
using core::Tensor;

namespace {

using FVec = std::vector<float>;

using test::require_device;

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// The distance from |x| to the next binary32 value away from zero.
double ulp_of(float x) {
  const float a = std::fabs(x);
  if (!std::isfinite(a)) return 0.0;
  return static_cast<double>(std::nextafter(a, std::numeric_limits<float>::infinity())) - a;
}

// Both backends, and the same values in each.
struct Backends {
  std::unique_ptr<core::Backend> cpu = core::make_cpu_backend();
  std::unique_ptr<core::Backend> gpu = gpu::make_cuda_backend();
  struct Pair {
    Tensor cpu, gpu;
  };
  Pair upload(const FVec& v, const Shape& s) { return {cpu->from_host(v, s), gpu->from_host(v, s)}; }
  Pair zeros(const Shape& s) { return {cpu->zeros(s), gpu->zeros(s)}; }
  Pair empty(const Shape& s) { return {cpu->empty(s), gpu->empty(s)}; }
  FVec cpu_values(const Tensor& t) { return values_of(*cpu, t); }
  FVec gpu_values(const Tensor& t) { return values_of(*gpu, t); }
  static FVec values_of(core::Backend& b, const Tensor& t) {
    FVec v(static_cast<std::size_t>(t.numel()));
    b.to_host(t, v);
    return v;
  }
};

// Same bits, except that any NaN matches any NaN. One CHECK; the message names the first difference.
void check_same(const std::string& what, const FVec& want, const FVec& got) {
  REQUIRE(want.size() == got.size());
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : bits_of(want[i]) == bits_of(got[i]);
    if (!same && mismatches++ == 0) first = i;
  }
  INFO(what << ": " << mismatches << " of " << want.size() << " differ; first at " << first << ": cpu "
            << (want.empty() ? 0.0f : want[first]) << " gpu " << (got.empty() ? 0.0f : got[first]));
  CHECK(mismatches == 0);
}

void check_same(const std::string& what, Backends& b, const Backends::Pair& t) {
  check_same(what, b.cpu_values(t.cpu), b.gpu_values(t.gpu));
}

// |got_i - want_i| <= bound_i, non-finite values of the same class. One CHECK, naming the worst element.
template <typename Bound>
void check_close(const std::string& what, const FVec& want, const FVec& got, Bound bound) {
  REQUIRE(want.size() == got.size());
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {
      const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : want[i] == got[i];
      if (!same) ++bad, worst = i, worst_ratio = INFINITY;
      continue;
    }
    const double b = bound(i), d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (d > b) ++bad;
    const double ratio = b > 0 ? d / b : (d > 0 ? INFINITY : 0.0);
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  INFO(what << ": " << bad << " of " << want.size() << " outside the bound; worst at " << worst << ": cpu "
            << want[worst] << " gpu " << got[worst] << ", " << worst_ratio << " times the bound");
  CHECK(bad == 0);
}

// Gradient-like magnitudes over 2^-150 .. 2^20 with both signs, and every
// special class (as tests/gpu/test_device.cpp), so that every format sees
// subnormals, flushes and overflow.
FVec mixed_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> exponent(-150.0f, 20.0f);
  FVec v(n);
  for (auto& x : v) x = (rng() & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-149f, 65504.0f, 65520.0f, 448.0f,
                            464.0f, 57344.0f, 61440.0f, 3.4028235e38f};
  for (std::size_t i = 0; i < std::size(specials) && i < n; ++i) v[i * 7 % n] = specials[i];
  return v;
}

FVec normal_values(std::size_t n, std::uint64_t seed, float sigma = 1.0f, float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(mean, sigma);
  FVec v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Integers in [lo, hi]: exact in every format below (e5m2 holds the integers up to 8).
FVec small_integers(std::size_t n, std::uint64_t seed, int lo = -8, int hi = 8) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(lo, hi);
  FVec v(n);
  for (auto& x : v) x = static_cast<float>(pick(rng));
  return v;
}

FVec rounded(const Format& f, FVec v) {
  quantize(f, v, v);
  return v;
}

core::RoundingPoint point(const Format& f, RoundingMode mode = RoundingMode::nearest_even, int random_bits = 32,
                          bool scaled = false) {
  core::RoundingPoint p;
  p.format = f;
  p.rounding = {mode, random_bits};
  p.delayed_scaling = scaled;
  return p;
}

StochasticStream stream_of(std::uint64_t seed, std::uint64_t stream, std::uint64_t first_index) {
  StochasticStream s;
  s.key = {seed, stream};
  s.first_index = first_index;
  return s;
}

const std::vector<Format>& formats_to_round() {
  static const std::vector<Format> list{formats::binary16,          formats::bfloat16, formats::tf32,
                                        formats::e4m3,              formats::e5m2,     formats::binary32,
                                        *parse_format("e5m2:ftz"), *parse_format("e4m3:sat")};
  return list;
}

}  // namespace

TEST_CASE("memory round trips keep every bit", "[gpu][backend]") {
  require_device();
  Backends b;
  CHECK(b.gpu->name() == "cuda");
  const FVec v = mixed_values(10007, 1);
  const Tensor t = b.gpu->from_host(v, {10007});
  FVec back(v.size());
  b.gpu->to_host(t, back);
  CHECK(std::memcmp(back.data(), v.data(), v.size() * sizeof(float)) == 0);  // NaN payloads included: only copies
  Tensor c = b.gpu->empty({97, 103});
  REQUIRE(c.numel() == 9991);
  Tensor d = b.gpu->empty({10007});
  b.gpu->copy(t, d);
  b.gpu->to_host(d, back);
  CHECK(std::memcmp(back.data(), v.data(), v.size() * sizeof(float)) == 0);
  const Tensor z = b.gpu->zeros({33, 3});
  for (const float x : Backends::values_of(*b.gpu, z)) CHECK(bits_of(x) == 0u);
  const Tensor none = b.gpu->zeros({0});
  CHECK_FALSE(none.empty());
  CHECK(none.numel() == 0);
  FVec nothing;
  b.gpu->to_host(none, nothing);
}

TEST_CASE("round matches the CPU bit for bit, counters, histogram and amax included", "[gpu][backend]") {
  require_device();
  Backends b;
  const std::size_t n = 100003;  // not a multiple of a block; several blocks
  const FVec input = mixed_values(n, 20261121);
  for (const Format& format : formats_to_round()) {
    for (int m = 0; m <= static_cast<int>(RoundingMode::stochastic); ++m) {
      for (const int random_bits : {32, 8}) {
        const auto mode = static_cast<RoundingMode>(m);
        if (random_bits != 32 && mode != RoundingMode::stochastic) continue;
        // Unscaled, and scaled by powers of two down and up (delayed scaling's x -> round(x * s) / s).
        for (const float scale : {1.0f, 0x1p-7f, 0x1p5f}) {
          for (const bool with_stats : {false, true}) {
            const core::RoundingPoint p = point(format, mode, random_bits, scale != 1.0f);
            INFO(format.name() << ", " << to_string(mode) << ", random bits " << random_bits << ", scale " << scale
                               << (with_stats ? ", with statistics" : ""));
            auto t = b.upload(input, {static_cast<std::int64_t>(n)});
            core::TensorStats cpu_stats, gpu_stats;
            const StochasticStream s = stream_of(7, 11, std::uint64_t{5} << 32);
            const core::RoundResult rc = b.cpu->round(t.cpu, p, scale, s, with_stats ? &cpu_stats : nullptr);
            const core::RoundResult rg = b.gpu->round(t.gpu, p, scale, s, with_stats ? &gpu_stats : nullptr);
            check_same("values", b, t);
            CHECK(bits_of(rc.amax) == bits_of(rg.amax));
            CHECK(cpu_stats == gpu_stats);
          }
        }
      }
    }
  }
  SECTION("binary32 storage counts without rounding") {
    core::TensorStats cpu_stats, gpu_stats;
    auto t = b.upload(input, {static_cast<std::int64_t>(n)});
    b.cpu->round(t.cpu, core::RoundingPoint{}, 1.0f, {}, &cpu_stats);
    b.gpu->round(t.gpu, core::RoundingPoint{}, 1.0f, {}, &gpu_stats);
    CHECK(cpu_stats == gpu_stats);
    FVec back = b.gpu_values(t.gpu);
    CHECK(std::memcmp(back.data(), input.data(), n * sizeof(float)) == 0);  // untouched
  }
}

TEST_CASE("element-wise ops match the CPU bit for bit", "[gpu][backend]") {
  require_device();
  Backends b;
  const std::int64_t rows = 37, cols = 129, n = rows * cols;
  const FVec x = mixed_values(static_cast<std::size_t>(n), 3), g = mixed_values(static_cast<std::size_t>(n), 4);
  const auto xs = b.upload(x, {rows, cols}), gs = b.upload(g, {rows, cols});
  SECTION("relu") {
    auto y = b.empty({rows, cols}), dx = b.empty({rows, cols});
    b.cpu->activation_forward(core::Activation::relu, xs.cpu, y.cpu);
    b.gpu->activation_forward(core::Activation::relu, xs.gpu, y.gpu);
    check_same("relu forward", b, y);
    b.cpu->activation_backward(core::Activation::relu, xs.cpu, gs.cpu, dx.cpu);
    b.gpu->activation_backward(core::Activation::relu, xs.gpu, gs.gpu, dx.gpu);
    check_same("relu backward", b, dx);
  }
  SECTION("multiply (the element-wise table's constant factor: model.embedding_scale)") {
    auto y = b.empty({rows, cols}), dx = b.empty({rows, cols});
    const core::PointwiseCall factor = core::MultiplyOp::Params{55.5f};
    b.cpu->pointwise_forward(factor, xs.cpu, y.cpu);
    b.gpu->pointwise_forward(factor, xs.gpu, y.gpu);
    check_same("multiply forward", b, y);
    b.cpu->pointwise_backward(factor, core::Tensor(), gs.cpu, dx.cpu);
    b.gpu->pointwise_backward(factor, core::Tensor(), gs.gpu, dx.gpu);
    check_same("multiply backward", b, dx);
  }
  SECTION("scale") {
    for (const float factor : {0x1p-3f, 0.7f, 65536.0f}) {
      auto t = b.upload(x, {rows, cols});
      b.cpu->scale(t.cpu, factor);
      b.gpu->scale(t.gpu, factor);
      check_same("scale by " + std::to_string(factor), b, t);
    }
  }
  SECTION("add_row_vector") {
    auto t = b.upload(normal_values(static_cast<std::size_t>(n), 5), {rows, cols});
    const auto row = b.upload(mixed_values(static_cast<std::size_t>(cols), 6), {cols});
    b.cpu->add_row_vector(t.cpu, row.cpu);
    b.gpu->add_row_vector(t.gpu, row.gpu);
    check_same("add_row_vector", b, t);
  }
}

TEST_CASE("convolution layouts and max pooling match the CPU bit for bit", "[gpu][backend]") {
  require_device();
  Backends b;
  struct Case {
    std::int64_t batch, channels, height, width, kernel, stride, padding;
  };
  // Overlapping and disjoint windows, padding, non-square images, LeNet's shapes.
  for (const Case c : {Case{3, 2, 9, 7, 3, 1, 1}, Case{2, 3, 10, 10, 5, 2, 2}, Case{2, 1, 8, 8, 2, 2, 0},
                       Case{1, 2, 11, 6, 3, 3, 0}, Case{4, 6, 28, 28, 5, 1, 2}, Case{2, 4, 7, 9, 3, 2, 1}}) {
    core::ConvGeometry g;
    g.batch = c.batch, g.channels = c.channels, g.height = c.height, g.width = c.width;
    g.kernel = c.kernel, g.stride = c.stride, g.padding = c.padding;
    INFO("batch " << c.batch << " channels " << c.channels << " " << c.height << "x" << c.width << " kernel "
                  << c.kernel << " stride " << c.stride << " padding " << c.padding);
    const std::int64_t oh = g.out_height(), ow = g.out_width(), patches = g.batch * oh * ow;
    const std::int64_t width = g.channels * g.kernel * g.kernel;
    const Shape image{g.batch, g.channels, g.height, g.width};
    const auto x = b.upload(normal_values(static_cast<std::size_t>(core::element_count(image)), 7), image);
    auto columns = b.empty({patches, width});
    b.cpu->im2col(x.cpu, g, columns.cpu);
    b.gpu->im2col(x.gpu, g, columns.gpu);
    check_same("im2col", b, columns);

    // col2im adds overlapping patches in binary32: the order matters, and is the CPU's.
    const auto dcols = b.upload(normal_values(static_cast<std::size_t>(patches * width), 8), {patches, width});
    auto dx = b.zeros(image);
    b.cpu->col2im(dcols.cpu, g, dx.cpu);
    b.gpu->col2im(dcols.gpu, g, dx.gpu);
    check_same("col2im", b, dx);

    const auto rows = b.upload(normal_values(static_cast<std::size_t>(patches * 5), 9), {patches, 5});
    auto nchw = b.empty({g.batch, 5, oh, ow});
    b.cpu->rows_to_nchw(rows.cpu, g.batch, oh, ow, nchw.cpu);
    b.gpu->rows_to_nchw(rows.gpu, g.batch, oh, ow, nchw.gpu);
    check_same("rows_to_nchw", b, nchw);
    auto back = b.empty({patches, 5});
    b.cpu->nchw_to_rows(nchw.cpu, back.cpu);
    b.gpu->nchw_to_rows(nchw.gpu, back.gpu);
    check_same("nchw_to_rows", b, back);

    // Max pooling on small integers (ties: the first wins) with a NaN (it wins and ends the window).
    FVec pool_in = small_integers(static_cast<std::size_t>(core::element_count(image)), 10, -3, 3);
    pool_in[pool_in.size() / 3] = NAN;
    const auto px = b.upload(pool_in, image);
    const Shape pooled{g.batch, g.channels, oh, ow};
    auto y = b.empty(pooled), argmax = b.empty(pooled);
    b.cpu->max_pool_forward(px.cpu, g, y.cpu, argmax.cpu);
    b.gpu->max_pool_forward(px.gpu, g, y.gpu, argmax.gpu);
    check_same("max pool forward", b, y);
    check_same("max pool argmax", b, argmax);
    const auto dy = b.upload(normal_values(static_cast<std::size_t>(core::element_count(pooled)), 11), pooled);
    auto dpool = b.empty(image);
    b.cpu->max_pool_backward(dy.cpu, argmax.cpu, dpool.cpu);
    b.gpu->max_pool_backward(dy.gpu, argmax.gpu, dpool.gpu);
    check_same("max pool backward", b, dpool);
  }
}

TEST_CASE("column sums and sums of squares, exact on integers, bounded otherwise", "[gpu][backend]") {
  require_device();
  Backends b;
  // Any order of summation of n values is within gamma_{n-1} * sum |x| of the exact sum (Higham 2002,
  // eq. 4.4), gamma_n = n u / (1 - n u): both backends are, so they differ by at most twice that.
  const auto gamma = [](double n, double u) { return n * u / (1 - n * u); };
  for (const std::int64_t rows : {1, 7, 256, 257, 3001}) {
    for (const std::int64_t cols : {1, 6, 130}) {
      INFO(rows << " x " << cols);
      const std::size_t n = static_cast<std::size_t>(rows * cols);
      // Integer sums below 2^24 are exact in any order.
      const auto ints = b.upload(small_integers(n, 12), {rows, cols});
      auto sums = b.empty({cols});
      b.cpu->column_sums(ints.cpu, sums.cpu);
      b.gpu->column_sums(ints.gpu, sums.gpu);
      check_same("column sums of integers", b, sums);

      const FVec v = normal_values(n, 13);
      const auto x = b.upload(v, {rows, cols});
      b.cpu->column_sums(x.cpu, sums.cpu);
      b.gpu->column_sums(x.gpu, sums.gpu);
      std::vector<double> magnitude(static_cast<std::size_t>(cols), 0.0);
      for (std::size_t i = 0; i < n; ++i) magnitude[i % static_cast<std::size_t>(cols)] += std::fabs(v[i]);
      const double g = 2 * gamma(static_cast<double>(rows - 1), 0x1p-24);
      check_close("column sums", b.cpu_values(sums.cpu), b.gpu_values(sums.gpu),
                  [&](std::size_t j) { return g * magnitude[j]; });

      // Squares of integers up to 64, summed below 2^53: exact in binary64 in any order.
      CHECK(b.cpu->sum_squares(ints.cpu) == b.gpu->sum_squares(ints.gpu));
      double squares = 0.0;
      for (const float f : v) squares += static_cast<double>(f) * f;
      const double cpu = b.cpu->sum_squares(x.cpu), gpu = b.gpu->sum_squares(x.gpu);
      CHECK(std::fabs(cpu - gpu) <= 2 * gamma(static_cast<double>(n), 0x1p-53) * squares);
    }
  }
  SECTION("inf and NaN propagate") {
    FVec v = normal_values(5000, 14);
    v[17] = INFINITY;
    const auto with_inf = b.upload(v, {5000});
    CHECK(std::isinf(b.gpu->sum_squares(with_inf.gpu)));
    v[4000] = NAN;
    const auto with_nan = b.upload(v, {5000});
    CHECK(std::isnan(b.gpu->sum_squares(with_nan.gpu)));
    CHECK(b.gpu->sum_squares(b.gpu->zeros({0})) == 0.0);
  }
}

namespace {

const std::vector<Format>& gemm_formats() {
  static const std::vector<Format> list{formats::binary32, formats::tf32, formats::binary16,
                                        formats::bfloat16, formats::e4m3, formats::e5m2};
  return list;
}

// Row-major op(a) of an a stored [rows x cols].
double element(const FVec& a, std::int64_t cols, bool transpose, std::int64_t i, std::int64_t kk) {
  return transpose ? a[static_cast<std::size_t>(kk * cols + i)] : a[static_cast<std::size_t>(i * cols + kk)];
}

core::GemmNumerics gemm_numerics(const Format& a, const Format& b, const core::RoundingPoint& accumulation = {}) {
  core::GemmNumerics g;
  g.a_format = a;
  g.b_format = b;
  g.accumulation = accumulation;
  return g;
}

struct GemmRun {
  FVec cpu, gpu;
  std::vector<double> exact, magnitude;  // sum a*b and sum |a*b| in binary64
};

GemmRun run_gemm(Backends& b, const FVec& a, const FVec& bv, std::int64_t m, std::int64_t n, std::int64_t k, bool ta,
                 bool tb, const core::GemmNumerics& numerics, StochasticStream s = {}) {
  const Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
  const auto at = b.upload(a, sa), bt = b.upload(bv, sb);
  auto c = b.empty({m, n});
  b.cpu->gemm(at.cpu, ta, bt.cpu, tb, c.cpu, numerics, s);
  b.gpu->gemm(at.gpu, ta, bt.gpu, tb, c.gpu, numerics, s);
  GemmRun r{b.cpu_values(c.cpu), b.gpu_values(c.gpu), {}, {}};
  r.exact.resize(static_cast<std::size_t>(m * n));
  r.magnitude.resize(r.exact.size());
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0, abs = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const double p = element(a, sa[1], ta, i, kk) * element(bv, sb[1], tb, kk, j);
        sum += p;
        abs += std::fabs(p);
      }
      r.exact[static_cast<std::size_t>(i * n + j)] = sum;
      r.magnitude[static_cast<std::size_t>(i * n + j)] = abs;
    }
  return r;
}

}  // namespace

TEST_CASE("binary32-accumulation GEMMs, exact on small integers, within gamma_k otherwise",
          "[gpu][backend][gemm]") {
  require_device();
  Backends b;
  const std::int64_t m = 67, n = 45, k = 300;
  std::uint64_t seed = 100;
  for (const Format& fa : gemm_formats()) {
    for (const Format& fb : gemm_formats()) {
      const core::GemmNumerics numerics = gemm_numerics(fa, fb);
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          INFO("a " << fa.name() << (ta ? " transposed" : "") << ", b " << fb.name() << (tb ? " transposed" : ""));
          // Integers in [-8, 8] are exact in every format here, and every partial sum is an integer below 2^24:
          // exact in any order and on Tensor Cores, whose accumulation truncates only below the integers.
          const FVec int_a = small_integers(static_cast<std::size_t>(m * k), ++seed);
          const FVec int_b = small_integers(static_cast<std::size_t>(k * n), ++seed);
          const auto ints = run_gemm(b, int_a, int_b, m, n, k, ta, tb, numerics);
          check_same("integer GEMM", ints.cpu, ints.gpu);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < ints.exact.size(); ++i) wrong += ints.gpu[i] != ints.exact[i];
          CHECK(wrong == 0);

          // Values of the formats: |c - exact| <= gamma_k * sum |a||b| in any order (Higham 2002, eq. 3.5);
          // u = 2^-24 for binary32 FMAs, 2^-23 on Tensor Cores, whose accumulation truncates (Fasi et al. 2021).
          const FVec a = rounded(fa, normal_values(static_cast<std::size_t>(m * k), ++seed));
          const FVec bv = rounded(fb, normal_values(static_cast<std::size_t>(k * n), ++seed));
          const auto r = run_gemm(b, a, bv, m, n, k, ta, tb, numerics);
          const bool tensor_cores = fa != formats::binary32 && fb != formats::binary32;
          const double u = tensor_cores ? 0x1p-23 : 0x1p-24, gamma = k * u / (1 - k * u);
          const double gamma_cpu = k * 0x1p-24 / (1 - k * 0x1p-24);
          FVec exact(r.exact.begin(), r.exact.end());
          check_close("gpu GEMM against the exact products", exact, r.gpu,
                      [&](std::size_t i) { return gamma * r.magnitude[i] + ulp_of(exact[i]); });
          check_close("gpu GEMM against the cpu", r.cpu, r.gpu,
                      [&](std::size_t i) { return (gamma + gamma_cpu) * r.magnitude[i]; });
        }
      }
    }
  }
  SECTION("FP8 values scaled by powers of two stay exact on bfloat16 Tensor Cores") {
    // Delayed scaling stores format values times 2^-e; far from binary16's range here.
    for (const float scale : {0x1p-100f, 0x1p40f}) {
      FVec a = rounded(formats::e4m3, normal_values(static_cast<std::size_t>(m * k), 201, 30.0f));
      FVec bv = rounded(formats::e5m2, normal_values(static_cast<std::size_t>(k * n), 202, 30.0f));
      for (auto& v : a) v *= scale;
      const auto r = run_gemm(b, a, bv, m, n, k, false, true, gemm_numerics(formats::e4m3, formats::e5m2));
      const double gamma = k * 0x1p-23 / (1 - k * 0x1p-23);
      FVec exact(r.exact.begin(), r.exact.end());
      check_close("scaled FP8 GEMM", exact, r.gpu,
                  [&](std::size_t i) { return gamma * r.magnitude[i] + ulp_of(exact[i]); });
    }
  }
}

TEST_CASE("an accumulation model in GemmNumerics is ignored: the hardware is the model", "[gpu][backend][gemm]") {
  require_device();
  Backends b;
  const std::int64_t m = 33, n = 65, k = 517;
  const FVec a = rounded(formats::binary16, normal_values(static_cast<std::size_t>(m * k), 250));
  const FVec bv = rounded(formats::binary16, normal_values(static_cast<std::size_t>(k * n), 251));
  const core::GemmNumerics plain = gemm_numerics(formats::binary16, formats::binary16);
  core::GemmNumerics modelled = plain;
  modelled.model = parse_accumulation_model("h100", formats::binary16);
  REQUIRE(modelled.model.has_value());
  const auto at = b.gpu->from_host(a, {m, k}), bt = b.gpu->from_host(bv, {k, n});
  Tensor c1 = b.gpu->empty({m, n}), c2 = b.gpu->empty({m, n});
  b.gpu->gemm(at, false, bt, false, c1, plain, {});
  b.gpu->gemm(at, false, bt, false, c2, modelled, {});
  check_same("GEMM with and without a model", Backends::values_of(*b.gpu, c1), Backends::values_of(*b.gpu, c2));
}

TEST_CASE("an operand its claimed format does not hold is reported at the next synchronisation",
          "[gpu][backend][gemm]") {
  require_device();
  const auto backend = gpu::make_cuda_backend();
  const FVec exact_values = small_integers(64, 300);
  for (const auto& [format, bad_value] :
       {std::pair{formats::binary16, 1.0f + 0x1p-20f}, std::pair{formats::bfloat16, 0x1p-140f},
        std::pair{formats::tf32, 1.0f + 0x1p-20f}, std::pair{formats::binary16, 1e6f}}) {
    INFO(format.name() << " with " << bad_value);
    FVec a = exact_values;
    a[5] = bad_value;
    const Tensor at = backend->from_host(a, {8, 8}), bt = backend->from_host(exact_values, {8, 8});
    Tensor c = backend->empty({8, 8});
    backend->gemm(at, false, bt, false, c, gemm_numerics(format, format), {});
    FVec out(64);
    CHECK_THROWS_AS(backend->to_host(c, out), std::runtime_error);
    // Reported once; the backend goes on.
    const Tensor good = backend->from_host(exact_values, {8, 8});
    backend->gemm(good, false, bt, false, c, gemm_numerics(format, format), {});
    CHECK_NOTHROW(backend->to_host(c, out));
  }
}

TEST_CASE("GEMMs rounding after every addition match the CPU bit for bit", "[gpu][backend][gemm]") {
  require_device();
  Backends b;
  const std::int64_t m = 13, n = 17, k = 40;
  const std::vector<core::RoundingPoint> accumulations{
      point(formats::binary16),
      point(formats::bfloat16, RoundingMode::stochastic),
      point(formats::binary16, RoundingMode::stochastic, 8),
      point(formats::binary32, RoundingMode::stochastic),
      point(formats::tf32, RoundingMode::odd),
      point(formats::e5m2, RoundingMode::toward_zero),
      point(*parse_format("e4m3:sat"), RoundingMode::nearest_away),
      point(formats::binary16, RoundingMode::toward_negative),
  };
  std::uint64_t seed = 400;
  for (const auto& accumulation : accumulations) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        INFO("accumulation " << core::to_string(accumulation) << (ta ? ", a transposed" : "")
                             << (tb ? ", b transposed" : ""));
        // Wide magnitudes: products that overflow binary16 and E4M3, sums that flush.
        FVec a = normal_values(static_cast<std::size_t>(m * k), ++seed, 20.0f);
        const FVec bv = normal_values(static_cast<std::size_t>(k * n), ++seed, 20.0f);
        a[3] = 1e-30f;
        a[4] = -0.0f;
        const auto numerics = gemm_numerics(formats::binary32, formats::binary32, accumulation);
        const auto r = run_gemm(b, a, bv, m, n, k, ta, tb, numerics, stream_of(9, 1 << 8 | 3, std::uint64_t{12} << 32));
        check_same("GEMM rounding every addition", r.cpu, r.gpu);
      }
    }
  }
}

TEST_CASE("block-scaled GEMMs on the cuda backend give the CPU backend's bits and block statistics",
          "[gpu][backend][gemm][block]") {
  // The same orchestration (core/block_scaled_gemm.hpp) with the device's quantizer and GEMM kernels: every
  // output bit, every scale code, counter and error bin the CPU backend gives. Pairs as the presets use them:
  // MXFP8 with the rounded-up scale, NVFP4 with 16 x 16 weight tiles, stochastic NVFP4 gradients after the
  // random Hadamard transform.
  require_device();
  Backends b;
  const std::pair<const char*, const char*> pairs[] = {{"mxfp8-e4m3/ceil", "mxfp8-e4m3/ceil"},
                                                       {"nvfp4", "nvfp4-16x16"},
                                                       {"nvfp4/stochastic/rht", "nvfp4/rht"},
                                                       {"mxfp6-e2m3/stochastic", "mxfp4"},
                                                       {"fp8-e5m2-tensor", "fp8-e4m3-tensor"}};
  const auto parse = [](const char* text) {
    std::string error;
    const auto point = core::parse_block_point(text, &error);
    INFO(text << ": " << error);
    REQUIRE(point);
    return *point;
  };
  // Both backends on the same operands (a m x k, b k x n, either stored transposed): the same output bits and
  // the same statistics of both operands' quantizations; returns the blocks A's quantization counted.
  const auto same_on_both = [&b](const char* what, core::GemmNumerics numerics, const FVec& a, const FVec& bv,
                                 std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb) {
    core::BlockStats stats_cpu[2], stats_gpu[2];
    const Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
    const auto at = b.upload(a, sa), bt = b.upload(bv, sb);
    auto c = b.empty({m, n});
    numerics.a_block->stats = &stats_cpu[0];
    numerics.b_block->stats = &stats_cpu[1];
    b.cpu->gemm(at.cpu, ta, bt.cpu, tb, c.cpu, numerics, {});
    numerics.a_block->stats = &stats_gpu[0];
    numerics.b_block->stats = &stats_gpu[1];
    b.gpu->gemm(at.gpu, ta, bt.gpu, tb, c.gpu, numerics, {});
    check_same(what, b.cpu_values(c.cpu), b.gpu_values(c.gpu));
    CHECK(stats_cpu[0] == stats_gpu[0]);
    CHECK(stats_cpu[1] == stats_gpu[1]);
    return stats_cpu[0][core::BlockCounter::blocks];
  };
  std::uint64_t seed = 700;
  for (const auto& [a_text, b_text] : pairs) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        INFO(a_text << " x " << b_text << (ta ? ", a transposed" : "") << (tb ? ", b transposed" : ""));
        const std::int64_t m = 35, n = 40, k = 77;  // k: whole blocks and a partial one
        FVec a = normal_values(static_cast<std::size_t>(m * k), ++seed, 4.0f);
        const FVec bv = normal_values(static_cast<std::size_t>(k * n), ++seed, 4.0f);
        a[5] = 3e-30f;  // flushed inside its block
        a[6] = 1e4f;    // saturates under the OCP rule, sets the scale under the rounded-up one
        auto numerics = gemm_numerics(formats::binary32, formats::binary32);
        numerics.a_block = core::GemmNumerics::BlockOperand{parse(a_text), stream_of(3, 77, std::uint64_t{5} << 32)};
        numerics.b_block = core::GemmNumerics::BlockOperand{parse(b_text), stream_of(3, 78, std::uint64_t{5} << 32)};
        numerics.hadamard_seed = 0x5eed;
        CHECK(same_on_both("block-scaled GEMM", numerics, a, bv, m, n, k, ta, tb) > 0);
      }
    }
  }
  // DeepSeek-V3's tiles through the H100's FP8 tensor-core model, promoted every 128 products: on an H100 or
  // H200 the partials are the tensor cores' own (tensor_core_block_gemm.cu); the same bits and statistics.
  if (gpu::compute_capability().major == 9) {
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        INFO("deepseek-fp8 tiles" << (ta ? ", a transposed" : "") << (tb ? ", b transposed" : ""));
        const std::int64_t m = 35, n = 40, k = 300;  // two whole tiles along k and one of 44
        const FVec a = normal_values(static_cast<std::size_t>(m * k), ++seed, 4.0f);
        const FVec bv = normal_values(static_cast<std::size_t>(k * n), ++seed, 4.0f);
        auto numerics = gemm_numerics(formats::binary32, formats::binary32);
        numerics.a_block = core::GemmNumerics::BlockOperand{parse("fp8-e4m3-1x128"), {}};
        numerics.b_block = core::GemmNumerics::BlockOperand{parse("fp8-e4m3-128x128"), {}};
        numerics.block_promotion = tensor_core_preset("h100", formats::e4m3, formats::binary32);
        same_on_both("deepseek-fp8 GEMM", numerics, a, bv, m, n, k, ta, tb);
      }
  }
  // What the kernels do not cover is refused by name, never computed another way.
  auto numerics = gemm_numerics(formats::binary32, formats::binary32);
  numerics.a_block = core::GemmNumerics::BlockOperand{parse("fp8-e4m3-1x128"), {}};
  numerics.b_block = core::GemmNumerics::BlockOperand{parse("fp8-e4m3-128x128"), {}};
  const auto at = b.upload(FVec(8 * 256, 1.0f), {8, 256}), bt = b.upload(FVec(256 * 8, 1.0f), {256, 8});
  auto c = b.empty({8, 8});
  CHECK_THROWS_WITH(b.gpu->gemm(at.gpu, false, bt.gpu, false, c.gpu, numerics, {}),
                    Catch::Contains("blocks shorter than k"));
}

// Narrow storage (issue #4 §1): a tensor rounded to a format of at most 16
// bits is held on the device in that format's encoding, and every op reads it
// as the CPU backend reads its binary32 copy of the same values.
TEST_CASE("rounded tensors are stored in their format and read back as the CPU's values", "[gpu][backend][storage]") {
  require_device();
  Backends b;
  const std::int64_t rows = 64, cols = 96, n = rows * cols;
  const FVec x = mixed_values(static_cast<std::size_t>(n), 11);
  struct Case {
    Format format;
    float scale;
    int bytes;
  };
  const Case cases[] = {{formats::binary16, 1.0f, 2}, {formats::bfloat16, 1.0f, 2}, {formats::e4m3, 0x1p-7f, 1},
                        {formats::e5m2, 1.0f, 1},     {formats::tf32, 1.0f, 4},     {*parse_format("e3m4"), 0x1p3f, 1}};
  for (const Case& c : cases) {
    INFO(c.format.name() << ", scale " << c.scale);
    const core::RoundingPoint p = point(c.format, RoundingMode::stochastic, 32, c.scale != 1.0f);
    const StochasticStream s = stream_of(3, 5, 17);
    auto t = b.upload(x, {rows, cols});
    CHECK(gpu::cuda_storage_bytes(*b.gpu, t.gpu) == 4);
    b.cpu->round(t.cpu, p, c.scale, s, nullptr);
    b.gpu->round(t.gpu, p, c.scale, s, nullptr);
    CHECK(gpu::cuda_storage_bytes(*b.gpu, t.gpu) == c.bytes);
    check_same("stored values", b, t);
    // A reshaped view shares the storage.
    CHECK(gpu::cuda_storage_bytes(*b.gpu, t.gpu.reshaped({n})) == c.bytes);
    // Read by an element-wise op, a reduction and a copy; the outputs are binary32.
    auto y = b.empty({rows, cols});
    b.cpu->activation_forward(core::Activation::relu, t.cpu, y.cpu);
    b.gpu->activation_forward(core::Activation::relu, t.gpu, y.gpu);
    check_same("relu of a stored tensor", b, y);
    CHECK(gpu::cuda_storage_bytes(*b.gpu, y.gpu) == 4);
    CHECK(std::isnan(b.cpu->sum_squares(t.cpu)) == std::isnan(b.gpu->sum_squares(t.gpu)));
    auto copied = b.empty({rows, cols});
    b.cpu->copy(t.cpu, copied.cpu);
    b.gpu->copy(t.gpu, copied.gpu);
    check_same("copy of a stored tensor", b, copied);
    // Written in place: widened first, then binary32.
    b.cpu->scale(t.cpu, 0.75f);
    b.gpu->scale(t.gpu, 0.75f);
    check_same("scaled in place", b, t);
    CHECK(gpu::cuda_storage_bytes(*b.gpu, t.gpu) == 4);
    // An op's output that was stored narrow gets binary32 memory again.
    b.gpu->round(y.gpu, p, c.scale, s, nullptr);
    b.gpu->activation_forward(core::Activation::relu, copied.gpu, y.gpu);
    b.cpu->activation_forward(core::Activation::relu, copied.cpu, y.cpu);
    check_same("output over a stored tensor", b, y);
  }
  SECTION("delayed scaling stores the scaled codes and the device's scale") {
    const core::RoundingPoint p = point(formats::e4m3, RoundingMode::nearest_even, 32, true);
    auto history = b.zeros({5});
    for (int step = 0; step < 3; ++step) {
      auto t = b.upload(normal_values(static_cast<std::size_t>(n), 40 + step, 1e-3f), {rows, cols});
      b.cpu->round_delayed(t.cpu, p, history.cpu, 0, true, {}, nullptr);
      b.gpu->round_delayed(t.gpu, p, history.gpu, 0, true, {}, nullptr);
      CHECK(gpu::cuda_storage_bytes(*b.gpu, t.gpu) == 1);
      check_same("delayed-scaled values, step " + std::to_string(step), b, t);
    }
  }
  SECTION("weights updated into a 16-bit storage format are stored in it") {
    const core::RoundingPoint storage = point(formats::binary16, RoundingMode::stochastic);
    auto w = b.upload(normal_values(static_cast<std::size_t>(n), 50), {rows, cols});
    const auto u = b.upload(normal_values(static_cast<std::size_t>(n), 51, 1e-3f), {rows, cols});
    for (int step = 0; step < 2; ++step) {
      const StochasticStream s = stream_of(9, 1, static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(n));
      core::BackendInternals::apply_update(*b.cpu, w.cpu, u.cpu, storage, s, nullptr);
      core::BackendInternals::apply_update(*b.gpu, w.gpu, u.gpu, storage, s, nullptr);
      CHECK(gpu::cuda_storage_bytes(*b.gpu, w.gpu) == 2);
      check_same("weights after update " + std::to_string(step), b, w);
    }
    // Zeros are every format's values; state rounded at a 16-bit point is stored in it.
    auto state = b.zeros({rows, cols});
    const core::RoundingPoint state_point = point(formats::bfloat16);
    b.gpu->start_steps({}, {});
    b.gpu->end_step();  // a step that found nothing: the gated rounding runs
    b.gpu->round_state(state.gpu, state_point, nullptr, 0, {});
    b.cpu->round_state(state.cpu, state_point, nullptr, 0, {});
    CHECK(gpu::cuda_storage_bytes(*b.gpu, state.gpu) == 2);
    check_same("state", b, state);
  }
  SECTION("GEMMs read binary16 and bfloat16 storage as cuBLAS operands, exact on small integers") {
    for (const Format& f : {formats::binary16, formats::bfloat16, formats::e4m3}) {
      INFO(f.name());
      const std::int64_t m = 48, k = 80, nn = 40;
      auto a = b.upload(small_integers(static_cast<std::size_t>(m * k), 21), {m, k});
      auto bt = b.upload(small_integers(static_cast<std::size_t>(k * nn), 22), {k, nn});
      for (auto* pair : {&a, &bt}) {
        b.cpu->round(pair->cpu, point(f), 1.0f, {}, nullptr);
        b.gpu->round(pair->gpu, point(f), 1.0f, {}, nullptr);
      }
      auto c = b.empty({m, nn});
      const core::GemmNumerics g = gemm_numerics(f, f);
      b.cpu->gemm(a.cpu, false, bt.cpu, false, c.cpu, g, {});
      b.gpu->gemm(a.gpu, false, bt.gpu, false, c.gpu, g, {});
      check_same("gemm on stored operands", b, c);
    }
  }
}

TEST_CASE("softmax cross-entropy within the expf/logf bounds, argmax exactly", "[gpu][backend]") {
  require_device();
  Backends b;
  const std::int64_t rows = 200, cols = 10;
  const FVec z = normal_values(static_cast<std::size_t>(rows * cols), 500, 3.0f);
  FVec labels(static_cast<std::size_t>(rows));
  std::mt19937_64 rng(501);
  for (auto& l : labels) l = static_cast<float>(rng() % cols);
  const auto logits = b.upload(z, {rows, cols}), y = b.upload(labels, {rows});
  for (const float grad_scale : {1.0f, 65536.0f}) {
    INFO("grad_scale " << grad_scale);
    auto d = b.empty({rows, cols});
    const core::LossResult lc = b.cpu->softmax_cross_entropy(logits.cpu, y.cpu, grad_scale, d.cpu);
    const core::LossResult lg = b.gpu->softmax_cross_entropy(logits.gpu, y.gpu, grad_scale, d.gpu);
    CHECK(lc.correct == lg.correct);
    // Per row the max and z - max are the same on both. The exponentials differ by at most 3 ulps (CUDA's expf
    // 2, glibc's 1), so the sequential binary32 sums S (in [1, cols]) differ by at most S (3 + 2(cols - 1)/2)
    // 2^-23 relatively; log S by that plus 2 ulps of log S (logf: 1 ulp each); log S < 4 here, its ulp <= 2^-22.
    // The row's loss adds one rounding on each side: an ulp of the loss.
    const double d_log = (cols + 2) * 0x1p-23 + 2 * 0x1p-22;
    double bound = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = z.data() + r * cols;
      const float max = *std::max_element(row, row + cols);
      const float label_term = row[static_cast<std::int64_t>(labels[static_cast<std::size_t>(r)])] - max;
      bound += d_log + ulp_of(static_cast<float>(std::log(static_cast<double>(cols)) - label_term)) * 2;
    }
    CHECK(std::fabs(lc.loss_sum - lg.loss_sum) <= bound);
    // d = (exp(z - max - log S) - onehot) * factor: p's argument differs by d_log, its exp by 3 ulps,
    // p - onehot adds an ulp of a value below 1 (2^-23), the product with factor an ulp of the result.
    const float factor = grad_scale / static_cast<float>(rows);
    const FVec dc = b.cpu_values(d.cpu);
    check_close("d_logits", dc, b.gpu_values(d.gpu), [&](std::size_t i) {
      return factor * (d_log * 1.01 + 5 * 0x1p-23) + 2 * ulp_of(dc[i]);
    });
  }
}

TEST_CASE("GELU within the erff/expf bounds", "[gpu][backend]") {
  require_device();
  Backends b;
  FVec x = normal_values(50000, 600, 3.0f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 12.0f, -12.0f, 14.0f, -14.0f, 1e-30f, -1e-30f};
  for (std::size_t i = 0; i < std::size(specials); ++i) x[i * 101] = specials[i];
  const FVec g = normal_values(x.size(), 601);
  const std::int64_t n = static_cast<std::int64_t>(x.size());
  const auto xs = b.upload(x, {n}), gs = b.upload(g, {n});
  auto y = b.empty({n}), dx = b.empty({n});
  b.cpu->activation_forward(core::Activation::gelu, xs.cpu, y.cpu);
  b.gpu->activation_forward(core::Activation::gelu, xs.gpu, y.gpu);
  // y = (0.5 x) (1 + erf(x / sqrt 2)): erf differs by at most 3 ulps (<= 3 * 2^-24 below 1; CUDA's erff 2 ulps,
  // glibc's 1), 1 + erf by that plus a rounding on each side (<= 2 * 2^-24): |dy| <= 0.5 |x| 5 * 2^-24 plus an
  // ulp of y for the last rounding on each side. Bound: |x| 2^-22 + 2 ulp(y).
  const FVec yc = b.cpu_values(y.cpu);
  check_close("gelu forward", yc, b.gpu_values(y.gpu),
              [&](std::size_t i) { return std::fabs(x[i]) * 0x1p-22 + 2 * ulp_of(yc[i]); });
  b.cpu->activation_backward(core::Activation::gelu, xs.cpu, gs.cpu, dx.cpu);
  b.gpu->activation_backward(core::Activation::gelu, xs.gpu, gs.gpu, dx.gpu);
  // dx = g (cdf + x pdf): cdf differs by <= 2.5 * 2^-24, pdf by 3 ulps of exp and two roundings (<= 4 * 2^-23
  // relative, and |x| pdf <= 0.25), the sum (< 1.2) by two more roundings: |d| <= 3.5 * 2^-23 |g|, plus an ulp
  // of dx. Bound: |g| 2^-20 + 2 ulp(dx).
  const FVec dc = b.cpu_values(dx.cpu);
  check_close("gelu backward", dc, b.gpu_values(dx.gpu),
              [&](std::size_t i) { return std::fabs(g[i]) * 0x1p-20 + 2 * ulp_of(dc[i]); });
}

TEST_CASE("LayerNorm and RMSNorm forward and backward match the CPU bit for bit", "[gpu][backend]") {
  require_device();
  Backends b;
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{37, 96}, {300, 7}, {1, 1024}}) {
    INFO(rows << " x " << cols);
    const auto n = static_cast<std::size_t>(rows * cols);
    const auto x = b.upload(normal_values(n, 700, 2.0f, 1.0f), {rows, cols});
    const auto gamma = b.upload(normal_values(static_cast<std::size_t>(cols), 701, 1.0f, 1.0f), {cols});
    const auto beta = b.upload(normal_values(static_cast<std::size_t>(cols), 702), {cols});
    auto y = b.empty({rows, cols}), mean = b.empty({rows}), rstd = b.empty({rows});
    b.cpu->layer_norm_forward(x.cpu, gamma.cpu, beta.cpu, 1e-5f, y.cpu, mean.cpu, rstd.cpu);
    b.gpu->layer_norm_forward(x.gpu, gamma.gpu, beta.gpu, 1e-5f, y.gpu, mean.gpu, rstd.gpu);
    check_same("layer norm output", b, y);
    check_same("layer norm mean", b, mean);
    check_same("layer norm rstd", b, rstd);
    const auto dy = b.upload(normal_values(n, 703), {rows, cols});
    auto dx = b.empty({rows, cols});
    // NaN first: an op that adds to its outputs instead of writing them is caught.
    auto dgamma = b.upload(FVec(static_cast<std::size_t>(cols), NAN), {cols});
    auto dbeta = b.upload(FVec(static_cast<std::size_t>(cols), NAN), {cols});
    b.cpu->layer_norm_backward(x.cpu, gamma.cpu, mean.cpu, rstd.cpu, dy.cpu, dx.cpu, dgamma.cpu, dbeta.cpu);
    b.gpu->layer_norm_backward(x.gpu, gamma.gpu, mean.gpu, rstd.gpu, dy.gpu, dx.gpu, dgamma.gpu, dbeta.gpu);
    check_same("layer norm dx", b, dx);
    check_same("layer norm dgamma", b, dgamma);
    check_same("layer norm dbeta", b, dbeta);
    // RMSNorm: the same kernels uncentred.
    auto ry = b.empty({rows, cols}), rrstd = b.empty({rows});
    b.cpu->rms_norm_forward(x.cpu, gamma.cpu, 1e-5f, ry.cpu, rrstd.cpu);
    b.gpu->rms_norm_forward(x.gpu, gamma.gpu, 1e-5f, ry.gpu, rrstd.gpu);
    check_same("rms norm", b, ry);
    check_same("rms norm rstd", b, rrstd);
    const auto rs = b.upload(b.cpu_values(rrstd.cpu), {rows});
    auto rdx = b.empty({rows, cols}), rdgamma = b.empty({cols});
    b.cpu->rms_norm_backward(x.cpu, gamma.cpu, rs.cpu, dy.cpu, rdx.cpu, rdgamma.cpu);
    b.gpu->rms_norm_backward(x.gpu, gamma.gpu, rs.gpu, dy.gpu, rdx.gpu, rdgamma.gpu);
    check_same("rms norm dx", b, rdx);
    check_same("rms norm dgamma", b, rdgamma);
    // Zero-centred gamma (model.zero_centered_gamma), through the generic row call: the scale 1 + gamma.
    for (const bool centered : {true, false}) {
      INFO((centered ? "LayerNorm" : "RMSNorm") << " with a zero-centred gamma");
      const core::RowCall call = core::norm_call(1e-5f, centered, {}, true);
      const core::RowLayout layout = core::RowLayout::rows(rows, cols);
      auto zy = b.empty({rows, cols}), zmean = b.empty({rows}), zrstd = b.empty({rows}), zdx = b.empty({rows, cols});
      auto zdgamma = b.upload(FVec(static_cast<std::size_t>(cols), NAN), {cols});
      auto zdbeta = b.upload(FVec(static_cast<std::size_t>(cols), NAN), {cols});
      for (const bool gpu : {false, true}) {
        core::Backend& backend = gpu ? *b.gpu : *b.cpu;
        const auto at = [gpu](auto& pair) { return gpu ? &pair.gpu : &pair.cpu; };
        core::Backend::RowTensors t;
        t.parameters = {at(gamma), centered ? at(beta) : nullptr};
        t.statistics = {centered ? at(zmean) : nullptr, at(zrstd)};
        backend.row_forward(call, layout, *at(x), *at(zy), t);
        t.parameters[1] = nullptr;
        t.parameter_grads = {at(zdgamma), centered ? at(zdbeta) : nullptr};
        backend.row_backward(call, layout, *at(x), *at(dy), *at(zdx), t);
      }
      check_same("zero-centred output", b, zy);
      check_same("zero-centred rstd", b, zrstd);
      check_same("zero-centred dx", b, zdx);
      check_same("zero-centred dgamma", b, zdgamma);
      if (centered) check_same("zero-centred dbeta", b, zdbeta);
    }
  }
}

TEST_CASE("logit soft-capping matches the CPU within tanhf's bound", "[gpu][backend][transformer]") {
  require_device();
  Backends b;
  const std::int64_t n = 4097;
  const float cap = 30.0f;
  const auto x = b.upload(normal_values(static_cast<std::size_t>(n), 960, 40.0f), {n});
  auto y = b.empty({n});
  b.cpu->soft_cap_forward(x.cpu, cap, false, y.cpu);
  b.gpu->soft_cap_forward(x.gpu, cap, false, y.gpu);
  // tanhf: CUDA within 2 ulps, glibc within 2: y = cap * t differs by at most 4 ulps of t, then one rounding each.
  const FVec yc = b.cpu_values(y.cpu);
  check_close("soft cap", yc, b.gpu_values(y.gpu), [&](std::size_t i) { return 6 * ulp_of(yc[i]); });
  // The backward from the same capped values is elementwise binary32: bit for bit.
  const auto capped = b.upload(yc, {n});
  const auto dy = b.upload(normal_values(static_cast<std::size_t>(n), 961), {n});
  auto dx = b.empty({n});
  b.cpu->soft_cap_backward(capped.cpu, dy.cpu, cap, dx.cpu);
  b.gpu->soft_cap_backward(capped.gpu, dy.gpu, cap, dx.gpu);
  check_same("soft cap backward", b, dx);
}

TEST_CASE("dropout draws the CPU's mask", "[gpu][backend][transformer]") {
  require_device();
  Backends b;
  const std::int64_t n = 100003;
  const auto x = b.upload(normal_values(static_cast<std::size_t>(n), 980), {n});
  StochasticStream stream;
  stream.key = {2026, 77};
  stream.first_index = std::uint64_t{5} << 32;
  const core::DropoutMask mask = core::dropout_mask(stream, 0.1);
  auto y = b.empty({n});
  b.cpu->dropout(x.cpu, mask, y.cpu);
  b.gpu->dropout(x.gpu, mask, y.gpu);
  check_same("dropout", b, y);
}

TEST_CASE("rotary embeddings match the CPU bit for bit", "[gpu][backend][transformer]") {
  require_device();
  Backends b;
  core::AttentionShape s;
  s.batch = 3;
  s.tokens = 17;
  s.heads = 4;
  s.head_dim = 8;
  const std::int64_t rows = s.rows(), cols = 3 * s.width();
  const std::vector<float> host_table = core::rotary_table(s.tokens, s.head_dim, 10000.0);
  const auto table = b.upload(host_table, {static_cast<std::int64_t>(host_table.size())});
  const auto qkv = b.upload(normal_values(static_cast<std::size_t>(rows * cols), 970, 2.0f), {rows, cols});
  for (const bool inverse : {false, true}) {
    INFO((inverse ? "backward" : "forward"));
    auto y = b.upload(FVec(static_cast<std::size_t>(rows * cols), NAN), {rows, cols});  // every element written
    b.cpu->rotary(qkv.cpu, table.cpu, s, inverse, y.cpu);
    b.gpu->rotary(qkv.gpu, table.gpu, s, inverse, y.gpu);
    check_same("rotary", b, y);
  }
}

TEST_CASE("softmax, norm statistics and the loss in a narrow format (policy internals) match the CPU bit for bit",
          "[gpu][backend][transformer]") {
  // Binary64 sums rounded to odd, exact products, IEEE binary64 quotients and roots (numerics_layers.hpp's
  // InternalRounding): the same bits on both. The softmax's exp is binary64's (CUDA's within 1 ulp of glibc's):
  // its rounding to a format of <= 11 bits could differ only if the two straddled a rounding boundary.
  require_device();
  Backends b;
  for (const Format& f : {formats::binary16, formats::bfloat16}) {
    INFO(f.name());
    core::Policy policy = *core::preset_policy("fp32");
    policy.softmax_internals = core::RoundingPoint{f};
    policy.norm_statistics = core::RoundingPoint{f};
    const core::InternalRounding soft = core::internal_rounding(policy, &core::Policy::softmax_internals, "softmax");
    const core::InternalRounding stats = core::internal_rounding(policy, &core::Policy::norm_statistics, "layer_norm");
    const std::int64_t rows = 45, cols = 96;
    const auto n = static_cast<std::size_t>(rows * cols);
    const auto x = b.upload(normal_values(n, 950, 4.0f, 1.0f), {rows, cols});
    auto probs = b.empty({rows, cols}), dx = b.empty({rows, cols});
    b.cpu->softmax_forward(x.cpu, probs.cpu, soft);
    b.gpu->softmax_forward(x.gpu, probs.gpu, soft);
    check_same("narrow softmax", b, probs);
    const auto p = b.upload(b.cpu_values(probs.cpu), {rows, cols});
    const auto dp = b.upload(normal_values(n, 951, 0.01f), {rows, cols});
    b.cpu->softmax_backward(p.cpu, dp.cpu, dx.cpu, soft);
    b.gpu->softmax_backward(p.gpu, dp.gpu, dx.gpu, soft);
    check_same("narrow softmax backward", b, dx);
    const auto gamma = b.upload(normal_values(static_cast<std::size_t>(cols), 952, 1.0f, 1.0f), {cols});
    const auto beta = b.upload(normal_values(static_cast<std::size_t>(cols), 953), {cols});
    auto y = b.empty({rows, cols}), mean = b.empty({rows}), rstd = b.empty({rows});
    b.cpu->layer_norm_forward(x.cpu, gamma.cpu, beta.cpu, 1e-5f, y.cpu, mean.cpu, rstd.cpu, stats);
    b.gpu->layer_norm_forward(x.gpu, gamma.gpu, beta.gpu, 1e-5f, y.gpu, mean.gpu, rstd.gpu, stats);
    check_same("narrow layer norm", b, y);
    check_same("narrow layer norm rstd", b, rstd);
    auto lx = b.empty({rows, cols}), dgamma = b.empty({cols}), dbeta = b.empty({cols});
    b.cpu->layer_norm_backward(x.cpu, gamma.cpu, mean.cpu, rstd.cpu, dp.cpu, lx.cpu, dgamma.cpu, dbeta.cpu, stats);
    const auto mu = b.upload(b.cpu_values(mean.cpu), {rows});
    const auto rs = b.upload(b.cpu_values(rstd.cpu), {rows});
    b.gpu->layer_norm_backward(x.gpu, gamma.gpu, mu.gpu, rs.gpu, dp.gpu, lx.gpu, dgamma.gpu, dbeta.gpu, stats);
    check_same("narrow layer norm dx", b, lx);
    auto ry = b.empty({rows, cols}), rrstd = b.empty({rows});
    b.cpu->rms_norm_forward(x.cpu, gamma.cpu, 1e-5f, ry.cpu, rrstd.cpu, stats);
    b.gpu->rms_norm_forward(x.gpu, gamma.gpu, 1e-5f, ry.gpu, rrstd.gpu, stats);
    check_same("narrow rms norm", b, ry);
    // The training loss (policy.loss_internals), with PaLM's z-loss: the gradient and the loss bit for bit.
    policy.loss_internals = core::RoundingPoint{f};
    policy.fp32_ops.clear();
    const core::InternalRounding loss_low =
        core::internal_rounding(policy, &core::Policy::loss_internals, "softmax_cross_entropy");
    core::LossDefinition loss;
    loss.z_loss = 1e-2;
    b.cpu->start_steps({}, loss, loss_low);
    b.gpu->start_steps({}, loss, loss_low);
    const auto labels = b.upload(small_integers(rows, 954, 0, cols - 1), {rows});
    auto d_logits = b.empty({rows, cols});
    b.cpu->step_loss(x.cpu, labels.cpu, d_logits.cpu);
    b.gpu->step_loss(x.gpu, labels.gpu, d_logits.gpu);
    check_same("narrow loss gradient", b, d_logits);
    b.cpu->end_step();
    b.gpu->end_step();
    const auto cpu_steps = b.cpu->take_steps(), gpu_steps = b.gpu->take_steps();
    REQUIRE(cpu_steps.size() == 1);
    REQUIRE(gpu_steps.size() == 1);
    CHECK(std::bit_cast<std::uint64_t>(cpu_steps[0].loss_sum) == std::bit_cast<std::uint64_t>(gpu_steps[0].loss_sum));
    CHECK(cpu_steps[0].correct == gpu_steps[0].correct);
  }
}

TEST_CASE("token embeddings: rows looked up and the table's gradient summed in token order, bit for bit",
          "[gpu][backend][transformer]") {
  require_device();
  Backends b;
  const std::int64_t rows = 11, width = 24, tokens = 70;
  FVec ids(static_cast<std::size_t>(tokens));
  // Repeated ids (their gradients add in token order), every row but the last, and ids no row has (a NaN
  // output, no gradient): -1, 11 and 2.5.
  for (std::int64_t t = 0; t < tokens; ++t) ids[static_cast<std::size_t>(t)] = static_cast<float>((t * 7) % (rows - 1));
  ids[5] = -1.0f;
  ids[17] = static_cast<float>(rows);
  ids[40] = 2.5f;
  const auto id = b.upload(ids, {tokens});
  const auto table = b.upload(normal_values(static_cast<std::size_t>(rows * width), 910), {rows, width});
  auto out = b.empty({tokens, width});
  b.cpu->embedding_forward(id.cpu, table.cpu, out.cpu);
  b.gpu->embedding_forward(id.gpu, table.gpu, out.gpu);
  check_same("embedding", b, out);
  const FVec o = b.cpu_values(out.cpu);
  CHECK(std::isnan(o[static_cast<std::size_t>(5 * width)]));
  const auto dout = b.upload(normal_values(static_cast<std::size_t>(tokens * width), 911), {tokens, width});
  auto dtable = b.upload(FVec(static_cast<std::size_t>(rows * width), NAN), {rows, width});  // every element written
  b.cpu->embedding_backward(id.cpu, dout.cpu, dtable.cpu);
  b.gpu->embedding_backward(id.gpu, dout.gpu, dtable.gpu);
  check_same("embedding table gradient", b, dtable);
  const FVec g = b.cpu_values(dtable.cpu);
  CHECK(std::none_of(g.begin(), g.end(), [](float v) { return std::isnan(v); }));
  CHECK(g[static_cast<std::size_t>((rows - 1) * width)] == 0.0f);  // the row no token names
}

TEST_CASE("transformer ops: attention, add and the sequence mean bit for bit, softmax within expf's bound",
          "[gpu][backend][transformer]") {
  require_device();
  Backends b;
  for (const bool causal : {false, true}) {
    INFO((causal ? "causal" : "not causal"));
    core::AttentionShape s;
    s.batch = 3;
    s.tokens = 17;
    s.heads = 4;
    s.head_dim = 8;
    s.causal = causal;
    const std::int64_t rows = s.rows(), cols = 3 * s.width(), score_rows = s.score_rows();
    const auto qkv = b.upload(normal_values(static_cast<std::size_t>(rows * cols), 900, 2.0f), {rows, cols});
    auto scores = b.empty({score_rows, s.tokens}), probs = b.empty({score_rows, s.tokens});
    b.cpu->attention_scores(qkv.cpu, s, scores.cpu);
    b.gpu->attention_scores(qkv.gpu, s, scores.gpu);
    check_same("attention scores", b, scores);
    // The logged logit maximum: an integer max, the same on both (masked -inf ignored).
    CHECK(b.gpu->max_abs_finite(scores.gpu) == b.cpu->max_abs_finite(scores.cpu));
    b.cpu->softmax_forward(scores.cpu, probs.cpu);
    b.gpu->softmax_forward(scores.gpu, probs.gpu);
    // p = e / S: the exponentials differ by at most 3 ulps (CUDA's expf 2, glibc's 1), so the binary64 sums
    // S by at most 3 * 2^-23 relatively, and p, after one more rounding on each side, by 6 * 2^-23 |p| + 2 ulp(p).
    const FVec pc = b.cpu_values(probs.cpu);
    check_close("softmax", pc, b.gpu_values(probs.gpu),
                [&](std::size_t i) { return 6 * 0x1p-23 * std::fabs(pc[i]) + 2 * ulp_of(pc[i]); });
    // From here on both backends read the CPU's probabilities.
    const auto p = b.upload(pc, {score_rows, s.tokens});
    auto out = b.empty({rows, s.width()});
    b.cpu->attention_values(p.cpu, qkv.cpu, s, out.cpu);
    b.gpu->attention_values(p.gpu, qkv.gpu, s, out.gpu);
    check_same("attention output", b, out);
    const auto dout = b.upload(normal_values(static_cast<std::size_t>(rows * s.width()), 901), {rows, s.width()});
    auto dprobs = b.empty({score_rows, s.tokens}), dscores = b.empty({score_rows, s.tokens});
    // NaN first: every element of dqkv must be written by the two backward calls.
    auto dqkv = b.upload(FVec(static_cast<std::size_t>(rows * cols), NAN), {rows, cols});
    b.cpu->attention_values_backward(p.cpu, qkv.cpu, dout.cpu, s, dprobs.cpu, dqkv.cpu);
    b.gpu->attention_values_backward(p.gpu, qkv.gpu, dout.gpu, s, dprobs.gpu, dqkv.gpu);
    check_same("attention dprobs", b, dprobs);
    b.cpu->softmax_backward(p.cpu, dprobs.cpu, dscores.cpu);
    b.gpu->softmax_backward(p.gpu, dprobs.gpu, dscores.gpu);
    check_same("softmax backward", b, dscores);
    b.cpu->attention_scores_backward(dscores.cpu, qkv.cpu, s, dqkv.cpu);
    b.gpu->attention_scores_backward(dscores.gpu, qkv.gpu, s, dqkv.gpu);
    const FVec dq = b.cpu_values(dqkv.cpu);
    CHECK(std::none_of(dq.begin(), dq.end(), [](float v) { return std::isnan(v); }));
    check_same("attention dqkv", b, dqkv);
    // QK-LayerNorm: LayerNorm's sums on each segment, the parameter gradients in (row, head) order.
    const auto gamma = b.upload(normal_values(static_cast<std::size_t>(2 * s.head_dim), 902), {2 * s.head_dim});
    const auto beta = b.upload(normal_values(static_cast<std::size_t>(2 * s.head_dim), 903), {2 * s.head_dim});
    auto normed = b.empty({rows, cols}), qk_mean = b.empty({rows * 2 * s.heads}), rstd = b.empty({rows * 2 * s.heads});
    b.cpu->qk_norm_forward(qkv.cpu, gamma.cpu, beta.cpu, s, 1e-5f, normed.cpu, qk_mean.cpu, rstd.cpu);
    b.gpu->qk_norm_forward(qkv.gpu, gamma.gpu, beta.gpu, s, 1e-5f, normed.gpu, qk_mean.gpu, rstd.gpu);
    check_same("qk norm", b, normed);
    check_same("qk norm mean", b, qk_mean);
    check_same("qk norm rstd", b, rstd);
    const auto dnormed = b.upload(normal_values(static_cast<std::size_t>(rows * cols), 904), {rows, cols});
    auto dx = b.empty({rows, cols}), dgamma = b.empty({2 * s.head_dim}), dbeta = b.empty({2 * s.head_dim});
    const auto mu = b.upload(b.cpu_values(qk_mean.cpu), {rows * 2 * s.heads});
    const auto rs = b.upload(b.cpu_values(rstd.cpu), {rows * 2 * s.heads});
    b.cpu->qk_norm_backward(qkv.cpu, gamma.cpu, mu.cpu, rs.cpu, dnormed.cpu, s, dx.cpu, dgamma.cpu, dbeta.cpu);
    b.gpu->qk_norm_backward(qkv.gpu, gamma.gpu, mu.gpu, rs.gpu, dnormed.gpu, s, dx.gpu, dgamma.gpu, dbeta.gpu);
    check_same("qk norm dx", b, dx);
    check_same("qk norm dgamma", b, dgamma);
    check_same("qk norm dbeta", b, dbeta);
    // SwiGLU on rows of [a | b]: SiLU's expf differs by at most 3 ulps (CUDA 2, glibc 1), which moves
    // sigmoid by 4 ulps and the products by 8; 1 - s in the gradient cancels, so 8 * 2^-24 (1 + |a|) of |dy b| more.
    {
      const std::int64_t n = s.width();
      const auto gin = b.upload(normal_values(static_cast<std::size_t>(rows * 2 * n), 905, 3.0f), {rows, 2 * n});
      auto glu = b.empty({rows, n});
      b.cpu->gated_activation_forward(core::Activation::silu, gin.cpu, glu.cpu);
      b.gpu->gated_activation_forward(core::Activation::silu, gin.gpu, glu.gpu);
      const FVec gc = b.cpu_values(glu.cpu);
      check_close("swiglu", gc, b.gpu_values(glu.gpu), [&](std::size_t i) { return 8 * ulp_of(gc[i]); });
      const auto gdy = b.upload(normal_values(static_cast<std::size_t>(rows * n), 906), {rows, n});
      auto gdx = b.empty({rows, 2 * n});
      b.cpu->gated_activation_backward(core::Activation::silu, gin.cpu, gdy.cpu, gdx.cpu);
      b.gpu->gated_activation_backward(core::Activation::silu, gin.gpu, gdy.gpu, gdx.gpu);
      const FVec dc = b.cpu_values(gdx.cpu), a = b.cpu_values(gin.cpu), dyv = b.cpu_values(gdy.cpu);
      check_close("swiglu backward", dc, b.gpu_values(gdx.gpu), [&](std::size_t i) {
        const std::size_t row = i / static_cast<std::size_t>(2 * n), j = i % static_cast<std::size_t>(2 * n);
        const std::size_t k = row * static_cast<std::size_t>(n) + j % static_cast<std::size_t>(n);
        const float gate = a[row * static_cast<std::size_t>(2 * n) + j % static_cast<std::size_t>(n)];
        const float value = a[row * static_cast<std::size_t>(2 * n) + static_cast<std::size_t>(n) +
                              j % static_cast<std::size_t>(n)];
        return 8 * ulp_of(dc[i]) + 8 * 0x1p-24 * std::fabs(dyv[k] * value) * (1 + std::fabs(gate));
      });
    }
    // The residual add and the mean over each sample's tokens.
    auto sum = b.upload(b.cpu_values(out.cpu), {rows, s.width()});
    b.cpu->add(sum.cpu, dout.cpu);
    b.gpu->add(sum.gpu, dout.gpu);
    check_same("add", b, sum);
    auto mean = b.empty({s.batch, s.width()}), dmean = b.empty({rows, s.width()});
    b.cpu->sequence_mean_forward(sum.cpu, s.tokens, mean.cpu);
    b.gpu->sequence_mean_forward(sum.gpu, s.tokens, mean.gpu);
    check_same("sequence mean", b, mean);
    b.cpu->sequence_mean_backward(mean.cpu, s.tokens, dmean.cpu);
    b.gpu->sequence_mean_backward(mean.gpu, s.tokens, dmean.gpu);
    check_same("sequence mean backward", b, dmean);
  }
}

TEST_CASE("fused attention (model.fused_attention): the CPU's rows within expf's bounds, its pieces bit for bit",
          "[gpu][backend][transformer]") {
  require_device();
  Backends b;
  const core::InternalRounding bf16 =
      core::internal_rounding(*core::preset_policy("bf16-mixed"), &core::Policy::activations, "fused attention");
  REQUIRE(bf16.enabled);
  mpsim::StochasticStream stream;
  stream.key = {41, 9};
  const core::DropoutMask mask = core::dropout_mask(stream, 0.2);
  for (const bool causal : {false, true})
    for (const bool rounded : {false, true})
    for (const bool dropping : {false, true}) {
      INFO((causal ? "causal" : "not causal") << (rounded ? ", exp(s - m) rounded to bfloat16" : ", binary32")
                                              << (dropping ? ", dropout 0.2 (the same mask on both)" : ""));
      core::AttentionShape s;
      s.batch = 3;
      s.tokens = 17;
      s.heads = 4;
      s.head_dim = 8;
      s.causal = causal;
      const std::int64_t rows = s.rows(), cols = 3 * s.width(), score_rows = s.score_rows();
      const FVec values = normal_values(static_cast<std::size_t>(rows * cols), 910, 2.0f);
      FVec magnitudes = values;  // v replaced by |v|: the CPU's output on it bounds sum_j p_j |v_j|
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 2 * s.width(); c < cols; ++c)
          magnitudes[static_cast<std::size_t>(r * cols + c)] = std::fabs(magnitudes[static_cast<std::size_t>(r * cols + c)]);
      const auto qkv = b.upload(values, {rows, cols}), qkv_abs = b.upload(magnitudes, {rows, cols});
      const core::FusedAttention fused{5, 0.0f, rounded ? bf16 : core::InternalRounding{}, dropping, mask};
      auto out = b.empty({rows, s.width()}), lse = b.empty({score_rows, 1}), logit_max = b.empty({score_rows, 1});
      auto magnitude = b.empty({rows, s.width()}), lse_abs = b.empty({score_rows, 1}), max_abs = b.empty({score_rows, 1});
      b.cpu->fused_attention_forward(qkv.cpu, s, fused, out.cpu, lse.cpu, logit_max.cpu);
      b.gpu->fused_attention_forward(qkv.gpu, s, fused, out.gpu, lse.gpu, logit_max.gpu);
      b.cpu->fused_attention_forward(qkv_abs.cpu, s, core::FusedAttention{5, 0.0f, {}, dropping, mask}, magnitude.cpu,
                                     lse_abs.cpu, max_abs.cpu);
      // The logits are the same binary32 dot products on both: their maxima agree exactly.
      check_same("fused attention logit maxima", b, logit_max);
      // Each exponential and each of the 4 tiles' rescalings differ by at most 3 ulps (CUDA's expf 2, glibc's
      // 1): 64 * 2^-24 of sum_j p_j |v_j| covers them and the sums; a bfloat16 rounding of exp(s - m) that one
      // such ulp moves across a tie changes that term by 2^-8 of it.
      const FVec oc = b.cpu_values(out.cpu), m = b.cpu_values(magnitude.cpu);
      check_close("fused attention output", oc, b.gpu_values(out.gpu), [&](std::size_t i) {
        return ((rounded ? 0x1p-8 : 0.0) + 64 * 0x1p-24) * m[i] + 2 * ulp_of(oc[i]);
      });
      const FVec lc = b.cpu_values(lse.cpu);
      check_close("fused attention lse", lc, b.gpu_values(lse.gpu),
                  [&](std::size_t i) { return 64 * 0x1p-24 + 4 * ulp_of(lc[i]); });
      // The backward's pieces, from the CPU's values on both sides.
      auto scores = b.empty({score_rows, s.tokens}), probs = b.empty({score_rows, s.tokens});
      b.cpu->attention_scores(qkv.cpu, s, scores.cpu);
      b.gpu->attention_scores(qkv.gpu, s, scores.gpu);
      const auto l = b.upload(lc, {score_rows, 1});
      b.cpu->fused_attention_probs(scores.cpu, l.cpu, probs.cpu);
      b.gpu->fused_attention_probs(scores.gpu, l.gpu, probs.gpu);
      const FVec pc = b.cpu_values(probs.cpu);
      check_close("fused attention probabilities", pc, b.gpu_values(probs.gpu),
                  [&](std::size_t i) { return 3 * ulp_of(pc[i]); });
      const auto o = b.upload(oc, {rows, s.width()}), p = b.upload(pc, {score_rows, s.tokens});
      const auto dout = b.upload(normal_values(static_cast<std::size_t>(rows * s.width()), 911), {rows, s.width()});
      auto dot = b.empty({score_rows, 1});
      b.cpu->fused_attention_row_dot(dout.cpu, o.cpu, s, dot.cpu);
      b.gpu->fused_attention_row_dot(dout.gpu, o.gpu, s, dot.gpu);
      check_same("fused attention row dot", b, dot);
      const auto dprobs = b.upload(normal_values(static_cast<std::size_t>(score_rows * s.tokens), 912),
                                   {score_rows, s.tokens});
      auto dscores = b.empty({score_rows, s.tokens});
      const auto d = b.upload(b.cpu_values(dot.cpu), {score_rows, 1});
      b.cpu->fused_attention_scores_grad(p.cpu, dprobs.cpu, d.cpu, dscores.cpu);
      b.gpu->fused_attention_scores_grad(p.gpu, dprobs.gpu, d.gpu, dscores.gpu);
      check_same("fused attention score gradients", b, dscores);
    }
}

TEST_CASE("attention through batched cuBLAS (train.attention = \"cublas\"): within gamma_k of the CPU, masks exact",
          "[gpu][backend][transformer]") {
  require_device();
  Backends b;
  b.gpu->set_device_attention(core::DeviceAttention::cublas);
  CHECK(b.gpu->describe_gemm(core::CpuGemm::ordered, core::DeviceAttention::cublas) == "cuBLAS, attention cublas");
  const auto absolute = [](FVec v) {
    for (float& x : v) x = std::fabs(x);
    return v;
  };
  // Each side's sum of k products is within gamma_k * sum |a b| of the exact one in any order (Higham 2002,
  // eq. 3.5), times the scale once rounded on each side; `magnitude` is the CPU's op on |inputs|, that sum
  // (itself rounded: the 1.001). Masked entries (-inf logits, zero gradients) must be equal exactly.
  const auto within = [](const FVec& want, const FVec& magnitude, std::int64_t k) {
    const double gamma = static_cast<double>(k) * 0x1p-24 / (1 - static_cast<double>(k) * 0x1p-24);
    return [&want, &magnitude, gamma](std::size_t i) {
      return 2.0 * gamma * 1.001 * magnitude[i] + 2.0 * ulp_of(want[i]);
    };
  };
  for (const bool causal : {false, true}) {
    for (const std::int64_t head_dim : {8, 32}) {
      INFO((causal ? "causal" : "not causal") << ", head_dim " << head_dim);
      core::AttentionShape s;
      s.batch = 3;
      s.tokens = 17;
      s.heads = 4;
      s.head_dim = head_dim;
      s.causal = causal;
      const std::int64_t rows = s.rows(), cols = 3 * s.width(), score_rows = s.score_rows();
      const FVec qkv_values = normal_values(static_cast<std::size_t>(rows * cols), 910, 2.0f);
      const auto qkv = b.upload(qkv_values, {rows, cols}), qkv_abs = b.upload(absolute(qkv_values), {rows, cols});
      auto scores = b.empty({score_rows, s.tokens}), magnitude = b.empty({score_rows, s.tokens});
      b.cpu->attention_scores(qkv.cpu, s, scores.cpu);
      b.cpu->attention_scores(qkv_abs.cpu, s, magnitude.cpu);
      b.gpu->attention_scores(qkv.gpu, s, scores.gpu);
      const FVec sc = b.cpu_values(scores.cpu), sm = b.cpu_values(magnitude.cpu);
      check_close("scores", sc, b.gpu_values(scores.gpu), within(sc, sm, s.head_dim));
      // Both backends read the CPU's probabilities from here on.
      auto probs = b.empty({score_rows, s.tokens});
      b.cpu->softmax_forward(scores.cpu, probs.cpu);
      const FVec pc = b.cpu_values(probs.cpu);
      const auto p = b.upload(pc, {score_rows, s.tokens});
      auto out = b.empty({rows, s.width()}), out_magnitude = b.empty({rows, s.width()});
      b.cpu->attention_values(p.cpu, qkv.cpu, s, out.cpu);
      b.cpu->attention_values(p.cpu, qkv_abs.cpu, s, out_magnitude.cpu);
      b.gpu->attention_values(p.gpu, qkv.gpu, s, out.gpu);
      const FVec oc = b.cpu_values(out.cpu), om = b.cpu_values(out_magnitude.cpu);
      check_close("output", oc, b.gpu_values(out.gpu), within(oc, om, s.tokens));

      const FVec dout_values = normal_values(static_cast<std::size_t>(rows * s.width()), 911);
      const auto dout = b.upload(dout_values, {rows, s.width()});
      const auto dout_abs = b.upload(absolute(dout_values), {rows, s.width()});
      auto dprobs = b.empty({score_rows, s.tokens}), dprobs_magnitude = b.empty({score_rows, s.tokens});
      // NaN first: the two backward calls must write every element of dqkv.
      auto dqkv = b.upload(FVec(static_cast<std::size_t>(rows * cols), NAN), {rows, cols});
      auto dqkv_magnitude = b.cpu->from_host(FVec(static_cast<std::size_t>(rows * cols), NAN), {rows, cols});
      b.cpu->attention_values_backward(p.cpu, qkv.cpu, dout.cpu, s, dprobs.cpu, dqkv.cpu);
      b.cpu->attention_values_backward(p.cpu, qkv_abs.cpu, dout_abs.cpu, s, dprobs_magnitude.cpu, dqkv_magnitude);
      b.gpu->attention_values_backward(p.gpu, qkv.gpu, dout.gpu, s, dprobs.gpu, dqkv.gpu);
      const FVec dpc = b.cpu_values(dprobs.cpu), dpm = b.cpu_values(dprobs_magnitude.cpu);
      const FVec dpg = b.gpu_values(dprobs.gpu);
      check_close("dprobs", dpc, dpg, within(dpc, dpm, s.head_dim));
      std::size_t masked = 0, masked_not_zero = 0;
      for (std::int64_t r = 0; r < score_rows; ++r)
        for (std::int64_t j = s.keys_end(r % s.tokens); j < s.tokens; ++j) {
          ++masked;
          masked_not_zero += bits_of(dpg[static_cast<std::size_t>(r * s.tokens + j)]) != 0;
        }
      CHECK(masked == (causal ? static_cast<std::size_t>(score_rows * (s.tokens - 1) / 2) : 0u));
      CHECK(masked_not_zero == 0);

      // The logits' gradient from the CPU's softmax backward (zero where masked), read by both.
      auto dscores = b.cpu->empty({score_rows, s.tokens});
      b.cpu->softmax_backward(p.cpu, dprobs.cpu, dscores);
      const FVec dsc = b.cpu_values(dscores);
      const auto ds = b.upload(dsc, {score_rows, s.tokens}), ds_abs = b.upload(absolute(dsc), {score_rows, s.tokens});
      b.cpu->attention_scores_backward(ds.cpu, qkv.cpu, s, dqkv.cpu);
      b.cpu->attention_scores_backward(ds_abs.cpu, qkv_abs.cpu, s, dqkv_magnitude);
      b.gpu->attention_scores_backward(ds.gpu, qkv.gpu, s, dqkv.gpu);
      const FVec dc = b.cpu_values(dqkv.cpu), dm = b.values_of(*b.cpu, dqkv_magnitude), dg = b.gpu_values(dqkv.gpu);
      CHECK(std::none_of(dg.begin(), dg.end(), [](float v) { return std::isnan(v); }));
      check_close("dqkv", dc, dg, within(dc, dm, s.tokens));
    }
  }
}

TEST_CASE("SGD and Adam updates match the CPU bit for bit", "[gpu][backend][optimizer]") {
  require_device();
  Backends b;
  const std::int64_t n = 40009;
  const auto w = b.upload(normal_values(static_cast<std::size_t>(n), 800, 0.1f), {n});
  SECTION("sgd") {
    for (const float momentum : {0.0f, 0.9f}) {
      for (const float decay : {0.0f, 1e-4f}) {
        INFO("momentum " << momentum << ", weight decay " << decay);
        auto state = b.zeros({n}), update = b.empty({n});
        for (int step = 0; step < 3; ++step) {
          const auto g = b.upload(normal_values(static_cast<std::size_t>(n), 801 + step, 1e-2f), {n});
          core::BackendInternals::sgd_update(*b.cpu, w.cpu, g.cpu, state.cpu, 0.05f, momentum, decay, step == 0, update.cpu);
          core::BackendInternals::sgd_update(*b.gpu, w.gpu, g.gpu, state.gpu, 0.05f, momentum, decay, step == 0, update.gpu);
          check_same("sgd update", b, update);
          if (momentum != 0.0f) check_same("sgd momentum", b, state);
        }
      }
    }
  }
  SECTION("adam and adamw") {
    for (const bool decoupled : {false, true}) {
      for (const float decay : {0.0f, 0.01f}) {
        INFO((decoupled ? "adamw" : "adam") << ", weight decay " << decay);
        auto m = b.zeros({n}), v = b.zeros({n}), update = b.empty({n});
        for (std::int64_t step = 1; step <= 3; ++step) {
          const auto g = b.upload(normal_values(static_cast<std::size_t>(n), 810 + step, 1e-2f), {n});
          const core::AdamParams p{1e-3f, 0.9f, 0.999f, 1e-8f, decay, decoupled, step};
          core::BackendInternals::adam_update(*b.cpu, w.cpu, g.cpu, m.cpu, v.cpu, p, update.cpu);
          core::BackendInternals::adam_update(*b.gpu, w.gpu, g.gpu, m.gpu, v.gpu, p, update.gpu);
          check_same("adam update", b, update);
          check_same("adam m", b, m);
          check_same("adam v", b, v);
        }
      }
    }
  }
}

TEST_CASE("apply_update matches the CPU bit for bit, swallowed updates and counters included",
          "[gpu][backend][optimizer]") {
  require_device();
  Backends b;
  const std::int64_t n = 70001;
  const std::vector<core::RoundingPoint> storages{
      core::RoundingPoint{},                                  // binary32 addition
      point(formats::binary16),                               // fp16-naive
      point(formats::binary16, RoundingMode::stochastic),     // stochastic rounding lets small updates through
      point(formats::binary16, RoundingMode::stochastic, 8),
      point(formats::bfloat16, RoundingMode::toward_zero),
      point(formats::binary32, RoundingMode::stochastic),
      point(formats::e4m3),
      point(*parse_format("e5m2:ftz"), RoundingMode::odd),
  };
  for (const auto& storage : storages) {
    for (const bool with_stats : {false, true}) {
      INFO("storage " << core::to_string(storage) << (with_stats ? ", with statistics" : ""));
      // Weights already in the storage format; updates from far below their ulp (swallowed) to above it,
      // zeros (never swallowed), and a few specials.
      const Format& f = storage.format;
      FVec w = rounded(f, normal_values(static_cast<std::size_t>(n), 900, 0.5f));
      FVec u = mixed_values(static_cast<std::size_t>(n), 901);
      for (std::size_t i = 0; i < u.size(); i += 5) u[i] = 0.0f;
      for (std::size_t i = 1; i < u.size(); i += 5) u[i] = w[i] * 1e-4f;
      auto wt = b.upload(w, {n});
      const auto ut = b.upload(u, {n});
      core::TensorStats cpu_stats, gpu_stats;
      const StochasticStream s = stream_of(21, 2 << 8 | 1, std::uint64_t{3} << 32);
      core::BackendInternals::apply_update(*b.cpu, wt.cpu, ut.cpu, storage, s, with_stats ? &cpu_stats : nullptr);
      core::BackendInternals::apply_update(*b.gpu, wt.gpu, ut.gpu, storage, s, with_stats ? &gpu_stats : nullptr);
      check_same("weights", b, wt);
      CHECK(cpu_stats == gpu_stats);
      if (with_stats) CHECK(cpu_stats[core::Counter::swallowed] > 0);
    }
  }
}

namespace {

// What a run leaves to compare: per step, every parameter's gradient and master weights as the optimiser
// sees them (inspect_gradients runs after backward, before the update).
struct Trace {
  std::vector<std::vector<FVec>> grads, masters;  // [step][parameter]
  core::ArmResult result;
};

Trace trace_run(core::Backend& backend, core::ArmSetup setup, const core::TrainTest& data) {
  Trace t;
  setup.inspect_gradients = [&t](std::int64_t, const std::vector<core::Parameter*>& parameters, core::Backend& b) {
    t.grads.emplace_back();
    t.masters.emplace_back();
    for (const core::Parameter* p : parameters) {
      t.grads.back().push_back(Backends::values_of(b, p->grad));
      t.masters.back().push_back(Backends::values_of(b, p->master));
    }
  };
  t.result = core::train_arm(backend, setup, data, nullptr);
  return t;
}

bool all_finite(const FVec& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

double relative_difference(const FVec& want, const FVec& got) {
  double d2 = 0.0, w2 = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    d2 += d * d;
    w2 += static_cast<double>(want[i]) * want[i];
  }
  return w2 == 0.0 ? (d2 == 0.0 ? 0.0 : INFINITY) : std::sqrt(d2 / w2);
}

const core::TrainTest& synthetic() {
  static const core::TrainTest data = core::make_synthetic(7, 256, 64);
  return data;
}

core::ArmSetup small_setup(const core::Policy& policy, const std::string& model) {
  core::ArmSetup s;
  s.policy = &policy;
  if (model == "cnn") {
    s.model.kind = core::ModelKind::cnn;
  } else {
    s.model.hidden = {64, 32};
    s.model.layer_norm = model == "mlp-gelu-layernorm";
    s.model.activation = model == "mlp-gelu-layernorm" ? core::Activation::gelu : core::Activation::relu;
  }
  s.train.batch_size = 32;
  s.train.max_steps = 2;
  s.train.eval_batch = 64;
  s.train.stats_interval = 1;  // the instrumented path every step
  s.train.threads = 1;
  s.seed = 3;
  return s;
}

}  // namespace

TEST_CASE("a training step of every preset policy agrees with the CPU", "[gpu][backend][training]") {
  require_device();
  Backends b;
  // Not a proof, a guard against a wrong op: the binary32 GEMMs of cuBLAS and OpenBLAS sum in different orders
  // (each within gamma_k sum |a||b|, k <= 784: below 2^-13 relatively), and a value within that of a rounding
  // boundary of a narrow format lands on the other side, one ulp of that format away; such values are rare (their
  // share is about the binary32 difference over the format's ulp), so normwise the gradients and updates of the
  // two backends differ by far less than 2^-8. A wrong op (an index, a formula, a rounding point) differs by O(1).
  const double bound = 0x1p-8;
  // The presets whose block-scaled GEMMs the device does not cover are refused before a run: none on an H100 or
  // H200; elsewhere DeepSeek-V3's tiles, whose partials are the H100's own tensor-core sums. Exactly these, so that
  // a new refusal fails here.
  std::vector<std::string> refused;
  for (const std::string& name : core::preset_policy_names())
    if (const std::string why = core::block_gemm_refusal(*b.gpu, *core::preset_policy(name)); !why.empty()) {
      WARN("not on the cuda backend: " << name << ": " << why);
      refused.push_back(name);
    }
  CHECK(refused == (gpu::compute_capability().major == 9 ? std::vector<std::string>{}
                                                         : std::vector<std::string>{"deepseek-fp8"}));
  for (const std::string& name : core::preset_policy_names()) {
    if (std::find(refused.begin(), refused.end(), name) != refused.end()) continue;
    for (const std::string model : {"mlp", "mlp-gelu-layernorm", "cnn"}) {
      INFO("policy " << name << ", model " << model);
      const core::Policy policy = *core::preset_policy(name);
      const core::ArmSetup setup = small_setup(policy, model);
      const Trace cpu = trace_run(*b.cpu, setup, synthetic());
      const Trace gpu = trace_run(*b.gpu, setup, synthetic());
      CHECK(cpu.result.status == gpu.result.status);
      CHECK(cpu.result.skipped_steps == gpu.result.skipped_steps);
      REQUIRE(cpu.grads.size() == 2);
      REQUIRE(gpu.grads.size() == 2);
      // Step 0: the same weights and batch; the loss and every (loss-scaled) gradient.
      CHECK(std::fabs(cpu.result.losses[0] - gpu.result.losses[0]) <= bound * std::fabs(cpu.result.losses[0]));
      for (std::size_t p = 0; p < cpu.grads[0].size(); ++p) {
        INFO("parameter " << p);
        // A step whose gradients overflowed is skipped on both (checked above): nothing to compare.
        if (!all_finite(cpu.grads[0][p]) || !all_finite(gpu.grads[0][p])) {
          CHECK(all_finite(cpu.grads[0][p]) == all_finite(gpu.grads[0][p]));
          continue;
        }
        CHECK(relative_difference(cpu.grads[0][p], gpu.grads[0][p]) <= bound);
        // Step 1 sees the weights after the first update: compare the updates (the weights themselves agree
        // far better, being mostly the identical initial values).
        FVec cpu_update(cpu.masters[1][p].size()), gpu_update(cpu_update.size());
        for (std::size_t i = 0; i < cpu_update.size(); ++i) {
          cpu_update[i] = cpu.masters[1][p][i] - cpu.masters[0][p][i];
          gpu_update[i] = gpu.masters[1][p][i] - gpu.masters[0][p][i];
        }
        CHECK(relative_difference(cpu.masters[0][p], gpu.masters[0][p]) == 0.0);  // both start from the same bits
        CHECK(relative_difference(cpu_update, gpu_update) <= bound);
      }
    }
  }
}

TEST_CASE("a seeded dynamic loss-scale trajectory is the CPU's: same skipped steps, same scales",
          "[gpu][backend][training]") {
  require_device();
  Backends b;
  core::Policy policy = *core::preset_policy("fp16-mixed");
  policy.loss_scaling.initial_scale = std::ldexp(1.0, 32);  // FP16 gradients overflow at first
  policy.loss_scaling.growth_interval = 4;                  // and the scale grows back during the run
  core::ArmSetup setup = small_setup(policy, "mlp");
  setup.train.epochs = 4;  // 8 batches an epoch
  // 22 steps: 16 backoffs from 2^32, then growth back to 2^18 and one backoff. A decision differs only where
  // max |g| * S lies within the backends' binary32 difference of FP16's overflow threshold. After the first
  // update the weights differ in their last bits (cuBLAS against the fixed-order CPU GEMM), and from step 19 on
  // this run's scale hovers at that threshold (2^17 <-> 2^18), so a longer run can part: on an H100
  // (2026-11-25, 30 steps) the first different decision came at step 26.
  setup.train.max_steps = 22;
  setup.train.stats_interval = 5;
  const core::ArmResult cpu = core::train_arm(*b.cpu, setup, synthetic(), nullptr);
  const core::ArmResult gpu = core::train_arm(*b.gpu, setup, synthetic(), nullptr);
  REQUIRE(cpu.loss_scales.size() == 22);
  CHECK(cpu.skipped_steps >= 5);  // the run does exercise the backoff
  CHECK(*std::max_element(cpu.loss_scales.begin() + 16, cpu.loss_scales.end()) > cpu.loss_scales[15]);  // and growth
  CHECK(cpu.loss_scales == gpu.loss_scales);
  CHECK(cpu.skipped_steps == gpu.skipped_steps);
  CHECK(cpu.final_loss_scale == gpu.final_loss_scale);
  CHECK(cpu.status == gpu.status);
}

namespace {

// The FP32 shadow's rows and the steps of a run.
struct ShadowRows final : core::ArmLog {
  std::vector<core::ShadowRecord> rows;
  void step(const core::StepRecord&) override {}
  void stats(std::int64_t, const core::LayerStats&, std::span<const double>) override {}
  void eval(const core::EvalRecord&) override {}
  void shadow(std::span<const core::ShadowRecord> records) override {
    rows.insert(rows.end(), records.begin(), records.end());
  }
  void finish(const std::string&) override {}
  const core::ShadowRecord& model_row(std::int64_t step) const {
    for (const core::ShadowRecord& r : rows)
      if (r.step == step && r.layer == -1) return r;
    FAIL("no model row at step " << step);
    return rows.front();
  }
};

}  // namespace

TEST_CASE("the FP32 shadow on the cuda backend: exact for fp32, the arm's bits unchanged, step 0 as on the CPU",
          "[gpu][backend][training][shadow]") {
  require_device();
  Backends b;
  {  // fp32: the shadow's pass makes the arm's own cuBLAS calls on the same values
    const core::Policy fp32 = *core::preset_policy("fp32");
    core::ArmSetup setup = small_setup(fp32, "mlp");
    setup.train.max_steps = 6;
    setup.train.shadow_interval = 2;
    ShadowRows log;
    core::train_arm(*b.gpu, setup, synthetic(), &log);
    REQUIRE(log.rows.size() == 3 * 4);  // steps 0, 2, 4: three Linear layers and the model
    for (const core::ShadowRecord& r : log.rows) {
      CHECK(r.relative_error == 0.0);
      CHECK(r.zeroed == 0);
    }
  }
  // The bound of "a training step of every preset policy agrees with the CPU": the backends' binary32 sums differ
  // in order, so their gradients differ normwise by far less than 2^-8; each relative error and cosine, a
  // difference of two such gradients over a norm, by less than twice that.
  const double bound = 0x1p-8;
  for (const char* name : {"fp16-mixed", "bf16-mixed"}) {
    INFO(name);
    const core::Policy policy = *core::preset_policy(name);
    core::ArmSetup setup = small_setup(policy, "mlp");
    setup.train.max_steps = 6;
    core::ArmSetup shadowed = setup;
    shadowed.train.shadow_interval = 2;
    ShadowRows gpu_rows, cpu_rows;
    const core::ArmResult plain = core::train_arm(*b.gpu, setup, synthetic(), nullptr);
    const core::ArmResult with_shadow = core::train_arm(*b.gpu, shadowed, synthetic(), &gpu_rows);
    CHECK(plain.losses == with_shadow.losses);
    CHECK(plain.test_loss == with_shadow.test_loss);
    core::train_arm(*b.cpu, shadowed, synthetic(), &cpu_rows);
    const core::ShadowRecord &on_gpu = gpu_rows.model_row(0), &on_cpu = cpu_rows.model_row(0);
    CHECK(on_gpu.relative_error > 0.0);
    CHECK(std::fabs(on_gpu.loss_fp32 - on_cpu.loss_fp32) <= bound * on_cpu.loss_fp32);
    CHECK(std::fabs(on_gpu.norm_fp32 - on_cpu.norm_fp32) <= bound * on_cpu.norm_fp32);
    CHECK(std::fabs(on_gpu.relative_error - on_cpu.relative_error) <= 2 * bound);
    CHECK(std::fabs(on_gpu.cosine - on_cpu.cosine) <= 2 * bound);
    CHECK(on_gpu.elements == on_cpu.elements);
  }
}

TEST_CASE("the step ops decide on the device as the CPU does: scales, skips, updates bit for bit",
          "[gpu][backend][training]") {
  require_device();
  Backends b;
  core::LossScaling scaling;
  scaling.mode = core::LossScaleMode::dynamic;
  scaling.initial_scale = 16.0;
  scaling.growth_interval = 2;
  scaling.hysteresis = 2;
  const core::LossDefinition loss{core::LossReduction::mean, 0.5};  // a weight: the factor's path on both
  b.cpu->start_steps(scaling, loss);
  b.gpu->start_steps(scaling, loss);
  const std::int64_t n = 5003, rows = 64, classes = 10;
  const auto labels = b.upload(small_integers(rows, 900, 0, classes - 1), {rows});
  for (const auto kind : {core::OptimizerKind::sgd, core::OptimizerKind::adamw}) {
    INFO("optimizer " << (kind == core::OptimizerKind::sgd ? "sgd" : "adamw"));
    core::OptimizerParams params;
    params.kind = kind;
    params.lr = 0.01f;
    params.momentum = 0.9f;
    params.weight_decay = 1e-3f;
    // Clipping by global norm: the integer gradients' unscaled norms (about 20) are above 5, so every step clips.
    params.clip_norm = 5.0f;
    auto w = b.upload(normal_values(n, 901, 0.1f), {n});
    auto s1 = b.zeros({n}), s2 = b.zeros({n}), update = b.empty({n});
    auto ring = b.zeros({5});  // a history of 4
    std::vector<core::StepScalars> cpu_steps, gpu_steps;
    for (int step = 0; step < 9; ++step) {
      INFO("step " << step);
      const auto logits = b.upload(normal_values(rows * classes, 910 + step), {rows, classes});
      auto d_logits = b.empty({rows, classes});
      b.cpu->step_loss(logits.cpu, labels.cpu, d_logits.cpu);
      b.gpu->step_loss(logits.gpu, labels.gpu, d_logits.gpu);
      // Integer gradients: their sums of squares are exact on both sides. Steps 2 and 3 overflow (hysteresis 2:
      // the second backs off), step 6 holds a NaN.
      FVec g = small_integers(n, 920 + step);
      if (step == 2 || step == 3) g[17] = INFINITY;
      if (step == 6) g[n - 1] = NAN;
      auto grad = b.upload(g, {n});
      b.cpu->step_check_gradient(grad.cpu);
      b.gpu->step_check_gradient(grad.gpu);
      b.cpu->end_step();
      b.gpu->end_step();
      const auto storage = point(formats::bfloat16, RoundingMode::stochastic);
      const auto stream = stream_of(7, 3, static_cast<std::uint64_t>(step) << 32);
      b.cpu->optimizer_step(params, w.cpu, grad.cpu, s1.cpu, s2.cpu, update.cpu, storage, stream, nullptr);
      b.gpu->optimizer_step(params, w.gpu, grad.gpu, s1.gpu, s2.gpu, update.gpu, storage, stream, nullptr);
      const auto state_point = point(formats::e4m3, RoundingMode::nearest_even, 32, true);
      b.cpu->round_state(s1.cpu, state_point, &ring.cpu, 0, stream);
      b.gpu->round_state(s1.gpu, state_point, &ring.gpu, 0, stream);
      if (step % 4 == 3 || step == 8) {  // read now and then, as the trainer does when it logs
        for (const auto& s : b.cpu->take_steps()) cpu_steps.push_back(s);
        for (const auto& s : b.gpu->take_steps()) gpu_steps.push_back(s);
        check_same("weights", b, w);
        check_same("state 1", b, s1);
        check_same("amax ring", b, ring);
        if (kind != core::OptimizerKind::sgd) check_same("state 2", b, s2);
      }
    }
    REQUIRE(cpu_steps.size() == 9);
    REQUIRE(gpu_steps.size() == 9);
    for (std::size_t i = 0; i < cpu_steps.size(); ++i) {
      INFO("record " << i);
      CHECK(cpu_steps[i].loss_scale == gpu_steps[i].loss_scale);
      CHECK(cpu_steps[i].found_inf == gpu_steps[i].found_inf);
      CHECK(cpu_steps[i].correct == gpu_steps[i].correct);
      // Exact on both sides (integers); inf and NaN as a class.
      const double cpu_sum = cpu_steps[i].grad_sum_squares, gpu_sum = gpu_steps[i].grad_sum_squares;
      CHECK(std::isnan(cpu_sum) == std::isnan(gpu_sum));
      if (!std::isnan(cpu_sum)) CHECK(cpu_sum == gpu_sum);
      // expf and logf: a few binary32 ulps per row (the softmax test's bound), summed over the rows.
      CHECK(std::fabs(cpu_steps[i].loss_sum - gpu_steps[i].loss_sum) <= 1e-5 * std::fabs(cpu_steps[i].loss_sum));
    }
    CHECK(cpu_steps[2].found_inf);
    CHECK(cpu_steps[3].loss_scale == cpu_steps[2].loss_scale);      // hysteresis: the first overflow keeps it
    CHECK(cpu_steps[4].loss_scale == cpu_steps[3].loss_scale / 2);  // the second backs off
  }
}

TEST_CASE("a training step waits for the device only when the trainer logs", "[gpu][backend][training]") {
  require_device();
  const core::Policy policy = *core::preset_policy("fp16-mixed");
  const auto waits = [&](std::int64_t steps, std::int64_t stats_interval) {
    core::ArmSetup setup = small_setup(policy, "mlp");
    setup.train.epochs = 8;
    setup.train.max_steps = steps;
    setup.train.stats_interval = stats_interval;
    setup.train.eval_interval = 0;  // at the end of each epoch (8 batches) and the last step
    const auto backend = gpu::make_cuda_backend();
    const std::uint64_t before = gpu::cuda_synchronisations(*backend);
    core::train_arm(*backend, setup, synthetic(), nullptr);
    return gpu::cuda_synchronisations(*backend) - before;
  };
  // Without instrumentation, 8 more steps (one more epoch: one evaluation) add only that evaluation's waits.
  const std::uint64_t eight = waits(8, 0), sixteen = waits(16, 0), twenty_four = waits(24, 0);
  INFO("waits for 8, 16 and 24 steps: " << eight << ", " << sixteen << ", " << twenty_four);
  CHECK(sixteen - eight == twenty_four - sixteen);   // a fixed cost per epoch, not per step
  CHECK(sixteen - eight < 8);                        // fewer than one wait per step
  // Statistics every step: the logged steps do wait.
  CHECK(waits(16, 1) > sixteen + 16);
}

TEST_CASE("register_cuda_backend makes \"cuda\" a backend name", "[gpu][backend]") {
  require_device();
  gpu::register_cuda_backend();
  gpu::register_cuda_backend();  // once is enough; twice changes nothing
  const auto names = core::backend_names();
  CHECK(std::count(names.begin(), names.end(), "cuda") == 1);
  const auto backend = core::make_backend("cuda");
  REQUIRE(backend != nullptr);
  CHECK(backend->name() == "cuda");
}
