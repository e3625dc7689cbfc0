// Layers (core/src/layers.cpp) and the fused loss on the CPU backend, against
// independent binary64 references written from the mathematics.
//
// For every layer the test holds a plain-loop binary64 forward f(x, theta). It checks:
//  * the binary32 forward against f, within a rounding-error bound derived
//    per layer from the binary32 unit roundoff u = 2^-24 (see each bound);
//  * the binary32 backward, given dy = r (a fixed random projection, exactly
//    binary32), against central finite differences in binary64 of
//    L(x, theta) = sum_k r_k f(x, theta)_k, with h = 1e-6 max(1, |theta_i|).
//
// Gradient tolerances. The same differences give the Jacobian column J_:i, so
// the test knows M_i = sum_k |r_k| |J_ki|, the sum of the magnitudes of the
// terms the backward adds up for element i. A binary32 sum of n terms is off
// by at most gamma_n M_i, gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability of
// Numerical Algorithms, section 3.1; blocked and FMA sums as in OpenBLAS only do
// better), so GEMM-based gradients must satisfy
//   |analytic_i - fd_i| <= 2 (n + 2) u M_i + floor_i,
// n the longest binary32 reduction (factor 2 for the u^2 terms and the few
// roundings besides the sum). Non-GEMM layers (GELU, LayerNorm, the loss)
// have bounds from a short first-order error analysis given beside them.
// floor_i is the error of the finite difference itself: L is evaluated in
// binary64 with relative error ~ 32 eps64 over sum_k |r_k| (1 + |f_k|), which
// the difference divides by h; truncation (h^2/6 |L'''|) adds < 1e-12 of that
// size. The floor is about 1e-8 of the size: far below the binary32 terms.
// ReLU and max pooling are evaluated away from kinks: no input within 1e-3
// of 0 and no pooling window with two values within 1e-3 of each other,
// while h <= 3e-6 there, so no difference crosses a kink.
//
// Whole models (the MLP and the LeNet-style CNN) are checked end to end by
// central differences of the binary32 loss itself, with a large h; the error
// budget is next to that test.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/model.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "support/test_support.hpp"

namespace {

using namespace mpsim::core;
using Vec = std::vector<double>;
using FVec = std::vector<float>;
using Index = std::int64_t;

constexpr double u = 0x1p-24;      // binary32 unit roundoff
constexpr double eps64 = 0x1p-53;  // binary64 unit roundoff

// SplitMix64: the same draws with every standard library.
struct Rng : mpsim::test::SplitMix {
  double uniform(double lo, double hi) { return lo + (hi - lo) * (static_cast<double>(next() >> 11) * 0x1p-53); }
  std::size_t index(std::size_t n) { return static_cast<std::size_t>(next() % n); }
};

FVec uniform(Rng& rng, std::size_t n, double lo, double hi) {
  FVec v(n);
  for (float& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

// Magnitudes in [lo, hi], random signs: nothing near 0 when lo > 0.
FVec away_from_zero(Rng& rng, std::size_t n, double lo, double hi) {
  FVec v = uniform(rng, n, lo, hi);
  for (float& x : v)
    if (rng.next() & 1u) x = -x;
  return v;
}

Vec widen(const FVec& v) { return Vec(v.begin(), v.end()); }
Vec abs_of(Vec v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}
std::vector<Vec> abs_of(std::vector<Vec> args) {
  for (Vec& a : args) a = abs_of(std::move(a));
  return args;
}
Vec scaled(Vec v, double factor) {
  for (double& x : v) x *= factor;
  return v;
}
std::size_t size_of(const Shape& s) { return static_cast<std::size_t>(element_count(s)); }
std::string shape_string(const Shape& s) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < s.size(); ++i) out << (i ? "," : "") << s[i];
  out << ']';
  return out.str();
}

struct Fixture {
  explicit Fixture(const char* policy_name = "fp32")
      : policy(*preset_policy(policy_name)), ctx(*backend, policy, 1234) {}
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Policy policy;
  StepContext ctx;

  Tensor tensor(const FVec& v, const Shape& s) { return backend->from_host(v, s); }
  FVec host(const Tensor& t) {
    FVec v(static_cast<std::size_t>(t.numel()));
    backend->to_host(t, v);
    return v;
  }
  // Master and working copy from `values`; the gradient starts as NaN, so a
  // layer that adds to it instead of writing it is caught.
  void set_parameter(Parameter& p, const FVec& values) {
    REQUIRE(values.size() == size_of(p.shape));
    p.master = tensor(values, p.shape);
    p.working = p.master;
    p.grad = tensor(FVec(values.size(), std::numeric_limits<float>::quiet_NaN()), p.shape);
  }
};

// One CHECK per tensor: |got_i - want_i| <= bound_i for every i; the failure
// message names the worst element.
void expect_close(const std::string& what, const FVec& got, const Vec& want, const Vec& bound) {
  REQUIRE(got.size() == want.size());
  REQUIRE(bound.size() == want.size());
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    double ratio = err == 0.0 ? 0.0 : err / bound[i];  // bound 0 and err > 0: infinity
    if (std::isnan(ratio)) ratio = std::numeric_limits<double>::infinity();
    if (ratio > worst) worst = ratio, at = i;
  }
  INFO(what << ": worst element " << at << " of " << got.size() << ": got " << (got.empty() ? 0.0f : got[at])
            << ", reference " << (want.empty() ? 0.0 : want[at]) << ", bound " << (bound.empty() ? 0.0 : bound[at])
            << " (error / bound = " << worst << ")");
  CHECK(worst <= 1.0);
}

// --- Finite differences of the binary64 references ---------------------------

// y = f(args), args[0] the input, args[1..] the parameters, all binary64.
using RefForward = std::function<Vec(const std::vector<Vec>& args)>;

struct Fd {
  Vec grad;       // dL/dtheta_i, L = sum_k r_k f_k
  Vec magnitude;  // M_i = sum_k |r_k| |df_k/dtheta_i|
  Vec floor;      // error of the difference itself
};

Fd finite_differences(const RefForward& f, std::vector<Vec> args, std::size_t which, const Vec& r) {
  const Vec y0 = f(args);
  REQUIRE(y0.size() == r.size());
  double size = 0.0;
  for (std::size_t k = 0; k < r.size(); ++k) size += std::fabs(r[k]) * (1.0 + std::fabs(y0[k]));
  Vec& theta = args[which];
  Fd out;
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const double t = theta[i], h = 1e-6 * std::max(1.0, std::fabs(t));
    const double plus = t + h, minus = t - h;
    theta[i] = plus;
    const Vec yp = f(args);
    theta[i] = minus;
    const Vec ym = f(args);
    theta[i] = t;
    double g = 0.0, m = 0.0;
    for (std::size_t k = 0; k < r.size(); ++k) {
      const double d = (yp[k] - ym[k]) / (plus - minus);
      g += r[k] * d;
      m += std::fabs(r[k] * d);
    }
    out.grad.push_back(g);
    out.magnitude.push_back(m);
    out.floor.push_back((32.0 * eps64 / h + 1e-12) * size);
  }
  return out;
}

// What a layer test knows about its layer besides the layer itself.
struct Reference {
  RefForward forward;
  // Allowed |forward_float - f| per output element.
  std::function<Vec(const std::vector<Vec>& args)> forward_bound;
  // Allowed |analytic - fd| per element of args[which], before the FD floor.
  std::function<Vec(std::size_t which, const std::vector<Vec>& args, const Vec& r, const Fd& fd)> grad_bound;
};

// GEMM-like gradients: 2 (n + 2) u M_i, n the longest binary32 reduction.
auto dot_bound(Index n) {
  return [n](std::size_t, const std::vector<Vec>&, const Vec&, const Fd& fd) {
    return scaled(fd.magnitude, 2.0 * static_cast<double>(n + 2) * u);
  };
}

// Runs forward and backward (dy = r, drawn here) in binary32 and compares
// both with the reference. Returns the binary32 output for further checks.
FVec check_layer(const std::string& what, Layer& layer, const FVec& x, const Shape& x_shape,
                 const std::vector<FVec>& params, const Reference& ref, std::uint64_t seed) {
  INFO(what << ", input " << shape_string(x_shape));
  Fixture f;
  std::vector<Parameter*> ps = layer.parameters();
  REQUIRE(ps.size() == params.size());
  for (std::size_t i = 0; i < ps.size(); ++i) f.set_parameter(*ps[i], params[i]);

  f.ctx.layer = 0;
  const Tensor y = layer.forward(f.ctx, f.tensor(x, x_shape));
  REQUIRE(y.shape() == layer.output_shape(x_shape));
  const FVec y_float = f.host(y);

  Rng rng{seed};
  const FVec r = uniform(rng, y_float.size(), -1.0, 1.0);
  const Tensor dx = layer.backward(f.ctx, f.tensor(r, y.shape()), true);
  REQUIRE(dx.numel() == element_count(x_shape));
  const FVec dx_float = f.host(dx);

  std::vector<Vec> args{widen(x)};
  for (const FVec& p : params) args.push_back(widen(p));
  const Vec y_ref = ref.forward(args);
  expect_close(what + ": forward", y_float, y_ref, ref.forward_bound(args));

  const Vec rd = widen(r);
  for (std::size_t which = 0; which < args.size(); ++which) {
    const Fd fd = finite_differences(ref.forward, args, which, rd);
    Vec bound = ref.grad_bound(which, args, rd, fd);
    for (std::size_t i = 0; i < bound.size(); ++i) bound[i] += fd.floor[i];
    const FVec got = which == 0 ? dx_float : f.host(ps[which - 1]->grad);
    expect_close(what + ": gradient wrt " + (which == 0 ? std::string("input") : ps[which - 1]->name), got, fd.grad,
                 bound);
  }
  return y_float;
}

// --- Linear ------------------------------------------------------------------

Vec linear_ref(const std::vector<Vec>& a, Index batch, Index in, Index out) {
  const Vec &x = a[0], &w = a[1], &b = a[2];
  Vec y(static_cast<std::size_t>(batch * out));
  for (Index n = 0; n < batch; ++n)
    for (Index o = 0; o < out; ++o) {
      double s = b[o];
      for (Index i = 0; i < in; ++i) s += x[n * in + i] * w[o * in + i];
      y[n * out + o] = s;
    }
  return y;
}

TEST_CASE("Linear forward and backward match binary64 references", "[layers]") {
  struct Case { Index batch, in, out; };
  for (const Case c : {Case{4, 7, 5}, Case{1, 10, 3}, Case{1, 1, 1}, Case{3, 64, 17}, Case{9, 5, 12}}) {
    Rng rng{static_cast<std::uint64_t>(100 + c.batch * 1000 + c.in * 10 + c.out)};
    auto layer = make_linear("fc", c.in, c.out);
    const FVec x = uniform(rng, c.batch * c.in, -1.0, 1.0);
    const FVec w = uniform(rng, c.out * c.in, -0.5, 0.5), b = uniform(rng, c.out, -0.5, 0.5);
    Reference ref;
    ref.forward = [c](const std::vector<Vec>& a) { return linear_ref(a, c.batch, c.in, c.out); };
    // y = fl(fl(x w) + b): a sum of in + 1 terms; A = f(|x|, |w|, |b|) is the
    // sum of their magnitudes.
    ref.forward_bound = [c, ref](const std::vector<Vec>& a) {
      return scaled(ref.forward(abs_of(a)), 2.0 * static_cast<double>(c.in + 3) * u);
    };
    // dW and db sum over the batch, dx over the outputs.
    ref.grad_bound = dot_bound(std::max(c.batch, c.out));
    check_layer("linear " + std::to_string(c.in) + "->" + std::to_string(c.out), *layer, x, {c.batch, c.in}, {w, b},
                ref, 7 + static_cast<std::uint64_t>(c.out));
  }
}

// --- Conv2d ------------------------------------------------------------------

struct ConvCase {
  Index batch, cin, cout, height, width, kernel, stride, padding;
  Index oh() const { return (height + 2 * padding - kernel) / stride + 1; }
  Index ow() const { return (width + 2 * padding - kernel) / stride + 1; }
};

Vec conv_ref(const std::vector<Vec>& a, const ConvCase& c) {
  const Vec &x = a[0], &w = a[1], &b = a[2];
  const Index oh = c.oh(), ow = c.ow();
  Vec y(static_cast<std::size_t>(c.batch * c.cout * oh * ow));
  for (Index n = 0; n < c.batch; ++n)
    for (Index co = 0; co < c.cout; ++co)
      for (Index i = 0; i < oh; ++i)
        for (Index j = 0; j < ow; ++j) {
          double s = b[co];
          for (Index ci = 0; ci < c.cin; ++ci)
            for (Index p = 0; p < c.kernel; ++p)
              for (Index q = 0; q < c.kernel; ++q) {
                const Index yy = i * c.stride - c.padding + p, xx = j * c.stride - c.padding + q;
                if (yy < 0 || yy >= c.height || xx < 0 || xx >= c.width) continue;  // zero padding
                s += w[((co * c.cin + ci) * c.kernel + p) * c.kernel + q] *
                     x[((n * c.cin + ci) * c.height + yy) * c.width + xx];
              }
          y[((n * c.cout + co) * oh + i) * ow + j] = s;
        }
  return y;
}

TEST_CASE("Conv2d forward and backward match binary64 references", "[layers]") {
  const std::vector<ConvCase> cases{
      {2, 3, 4, 8, 8, 5, 1, 2},  // LeNet conv1 geometry: padding 2, stride 1, several channels
      {1, 6, 5, 9, 9, 5, 1, 0},  // LeNet conv2 geometry: no padding, batch 1
      {2, 2, 3, 9, 9, 3, 2, 0},  // stride 2
      {2, 2, 3, 7, 6, 3, 2, 0},  // stride 2, the last column read by no window: its gradient is 0
      {1, 3, 2, 6, 7, 5, 2, 2},  // stride 2 with padding 2
      {3, 1, 1, 4, 4, 1, 1, 0},  // 1x1 kernel
  };
  int serial = 0;
  for (const ConvCase& c : cases) {
    ++serial;
    Rng rng{static_cast<std::uint64_t>(500 + serial)};
    auto layer = make_conv2d("conv", c.cin, c.cout, c.kernel, c.stride, c.padding);
    const FVec x = uniform(rng, static_cast<std::size_t>(c.batch * c.cin * c.height * c.width), -1.0, 1.0);
    const FVec w = uniform(rng, static_cast<std::size_t>(c.cout * c.cin * c.kernel * c.kernel), -0.5, 0.5);
    const FVec b = uniform(rng, static_cast<std::size_t>(c.cout), -0.5, 0.5);
    Reference ref;
    ref.forward = [c](const std::vector<Vec>& a) { return conv_ref(a, c); };
    // One output sums cin k^2 products and the bias (im2col and the layout
    // changes are exact).
    ref.forward_bound = [c, ref](const std::vector<Vec>& a) {
      return scaled(ref.forward(abs_of(a)), 2.0 * static_cast<double>(c.cin * c.kernel * c.kernel + 3) * u);
    };
    // dW and db sum over batch x output pixels; dx sums cout products per
    // patch element, then col2im adds up to k^2 overlapping patches.
    const Index patches = c.batch * c.oh() * c.ow();
    ref.grad_bound = dot_bound(std::max(patches, c.cout + c.kernel * c.kernel));
    std::ostringstream what;
    what << "conv k" << c.kernel << " s" << c.stride << " p" << c.padding << " " << c.cin << "->" << c.cout;
    const FVec y = check_layer(what.str(), *layer, x, {c.batch, c.cin, c.height, c.width}, {w, b}, ref,
                               static_cast<std::uint64_t>(900 + serial));
    CHECK(y.size() == static_cast<std::size_t>(c.batch * c.cout * c.oh() * c.ow()));
  }
}

// --- MaxPool2d ---------------------------------------------------------------

Vec max_pool_ref(const Vec& x, Index planes, Index h, Index w, Index k, Index s) {
  const Index oh = (h - k) / s + 1, ow = (w - k) / s + 1;
  Vec y(static_cast<std::size_t>(planes * oh * ow));
  for (Index pl = 0; pl < planes; ++pl)
    for (Index i = 0; i < oh; ++i)
      for (Index j = 0; j < ow; ++j) {
        double m = -std::numeric_limits<double>::infinity();
        for (Index p = 0; p < k; ++p)
          for (Index q = 0; q < k; ++q) m = std::max(m, x[(pl * h + i * s + p) * w + j * s + q]);
        y[(pl * oh + i) * ow + j] = m;
      }
  return y;
}

// Each plane holds a shuffled ramp: any two values differ by at least
// 0.75 * 3 / (h w) > 1e-3, so no window has a near-tie.
FVec distinct_planes(Rng& rng, Index planes, Index h, Index w) {
  FVec v;
  for (Index pl = 0; pl < planes; ++pl) {
    std::vector<Index> order(static_cast<std::size_t>(h * w));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<Index>(i);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.index(i)]);
    for (const Index o : order)
      v.push_back(static_cast<float>(-1.5 + 3.0 * (static_cast<double>(o) + rng.uniform(0.0, 0.25)) /
                                                static_cast<double>(h * w)));
  }
  return v;
}

TEST_CASE("MaxPool2d forward and backward match binary64 references", "[layers]") {
  struct Case { Index batch, channels, h, w, k, s; };
  // 2x2 stride 2 (odd sizes: the last row or column is read by no window) and
  // 3x3 stride 2 (overlapping windows).
  for (const Case c :
       {Case{2, 3, 6, 6, 2, 2}, Case{1, 2, 7, 7, 3, 2}, Case{2, 2, 5, 7, 2, 2}, Case{1, 1, 9, 8, 3, 2}}) {
    Rng rng{static_cast<std::uint64_t>(77 + c.h * 10 + c.k)};
    auto layer = make_max_pool2d("pool", c.k, c.s);
    const FVec x = distinct_planes(rng, c.batch * c.channels, c.h, c.w);
    Reference ref;
    ref.forward = [c](const std::vector<Vec>& a) {
      return max_pool_ref(a[0], c.batch * c.channels, c.h, c.w, c.k, c.s);
    };
    // Selecting a value is exact.
    ref.forward_bound = [ref](const std::vector<Vec>& a) { return Vec(ref.forward(a).size(), 0.0); };
    // dx adds dy of every window whose maximum it is: overlapping 3x3 stride-2
    // windows share a pixel among at most 4, so n = 4.
    ref.grad_bound = dot_bound(4);
    std::ostringstream what;
    what << "max pool " << c.k << "x" << c.k << " stride " << c.s;
    check_layer(what.str(), *layer, x, {c.batch, c.channels, c.h, c.w}, {}, ref, 31 + static_cast<std::uint64_t>(c.w));
  }
}

// --- Flatten and ReLU ----------------------------------------------------------

TEST_CASE("Flatten keeps values and restores the input shape in backward", "[layers]") {
  Fixture f;
  Rng rng{5};
  const Shape shape{3, 2, 4, 5};
  const FVec x = uniform(rng, size_of(shape), -2.0, 2.0);
  auto layer = make_flatten("flatten");
  const Tensor y = layer->forward(f.ctx, f.tensor(x, shape));
  CHECK(y.shape() == Shape{3, 40});
  CHECK(layer->output_shape(shape) == Shape{3, 40});
  CHECK(f.host(y) == x);  // NCHW rows are already C*H*W contiguous
  const FVec dy = uniform(rng, x.size(), -1.0, 1.0);
  const Tensor dx = layer->backward(f.ctx, f.tensor(dy, {3, 40}), true);
  CHECK(dx.shape() == shape);
  CHECK(f.host(dx) == dy);
  layer->forward(f.ctx, f.tensor(x, shape));
  CHECK(layer->backward(f.ctx, f.tensor(dy, {3, 40}), false).empty());

  // And through the same finite-difference harness as every layer: the identity.
  Reference ref;
  ref.forward = [](const std::vector<Vec>& a) { return a[0]; };
  ref.forward_bound = [](const std::vector<Vec>& a) { return Vec(a[0].size(), 0.0); };
  ref.grad_bound = [](std::size_t, const std::vector<Vec>& a, const Vec&, const Fd&) { return Vec(a[0].size(), 0.0); };
  auto fresh = make_flatten("flatten");
  check_layer("flatten", *fresh, x, shape, {}, ref, 6);
}

TEST_CASE("ReLU forward and backward match binary64 references", "[layers]") {
  Rng rng{11};
  const Shape shape{3, 2, 5, 4};
  // Magnitudes log-uniform in [1e-3, 3]: many inputs close to (not within 1e-3 of) the kink.
  FVec x = away_from_zero(rng, size_of(shape), 0.0, 1.0);
  for (float& v : x) v = std::copysign(static_cast<float>(1e-3 * std::pow(3e3, std::fabs(v))), v);
  auto layer = make_activation("relu", Activation::relu);
  Reference ref;
  ref.forward = [](const std::vector<Vec>& a) {
    Vec y = a[0];
    for (double& v : y) v = v > 0.0 ? v : 0.0;
    return y;
  };
  ref.forward_bound = [](const std::vector<Vec>& a) { return Vec(a[0].size(), 0.0); };  // exact
  ref.grad_bound = [](std::size_t, const std::vector<Vec>& a, const Vec&, const Fd&) {
    return Vec(a[0].size(), 0.0);  // dx = dy or 0: exact
  };
  check_layer("relu", *layer, x, shape, {}, ref, 12);
}

// --- GELU --------------------------------------------------------------------

TEST_CASE("GELU (exact erf) forward and backward match binary64 references", "[layers]") {
  Rng rng{21};
  FVec x = uniform(rng, 60, -4.0, 4.0);
  for (const float v : {0.0f, 1e-4f, -1e-4f, -0.75f, -6.0f, 6.0f, -9.5f, 9.5f, 0.5f, -2.5f}) x.push_back(v);
  auto layer = make_activation("gelu", Activation::gelu);
  Reference ref;
  ref.forward = [](const std::vector<Vec>& a) {
    Vec y = a[0];
    for (double& v : y) v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    return y;
  };
  // y = 0.5 x (1 + erf(x / sqrt 2)) in binary32: erff and the scaled argument
  // put at most ~4u absolute error on 1 + erf (which cancels for x < 0), times
  // 0.5|x|, plus ~3 roundings relative to y: |err| <= 4u |x| + 3u |y|. Bound 8u (|x| + |y|).
  ref.forward_bound = [ref](const std::vector<Vec>& a) {
    const Vec y = ref.forward(a);
    Vec b(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) b[i] = 8.0 * u * (std::fabs(a[0][i]) + std::fabs(y[i]));
    return b;
  };
  // dx = dy (Phi(x) + x phi(x)): Phi to ~4u absolute as above; phi = exp(-x^2/2)
  // to u (x^2 + 3) relative, and |x| phi (x^2 + 4) <= 1.5; two more roundings
  // of a value below 1.13 |dy|. About 8u |dy|; bound 16u |dy| (1 + |x|).
  ref.grad_bound = [](std::size_t, const std::vector<Vec>& a, const Vec& r, const Fd&) {
    Vec b(r.size());
    for (std::size_t i = 0; i < r.size(); ++i) b[i] = 16.0 * u * std::fabs(r[i]) * (1.0 + std::fabs(a[0][i]));
    return b;
  };
  check_layer("gelu", *layer, x, {7, 10}, {}, ref, 22);
}

// --- SiLU and gated linear units ---------------------------------------------

double silu64(double x) { return x / (1.0 + std::exp(-x)); }

TEST_CASE("SiLU forward and backward match binary64 references", "[layers]") {
  Rng rng{23};
  FVec x = uniform(rng, 60, -6.0, 6.0);
  for (const float v : {0.0f, 1e-4f, -1e-4f, -20.0f, 20.0f, -90.0f, 90.0f}) x.push_back(v);
  auto layer = make_activation("silu", Activation::silu);
  Reference ref;
  ref.forward = [](const std::vector<Vec>& a) {
    Vec y = a[0];
    for (double& v : y) v = silu64(v);
    return y;
  };
  // x s in binary32: expf within 1u, then an addition, a division and a
  // product, each u relative: |err| <= 5u |y|, plus |x| 2^-149 where e^x is
  // subnormal (x < -87.3). Bound 8u |y| + 2 |x| 2^-149.
  ref.forward_bound = [ref](const std::vector<Vec>& a) {
    Vec b = scaled(abs_of(ref.forward(a)), 8.0 * u);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] += 2.0 * std::fabs(a[0][i]) * 0x1p-149;
    return b;
  };
  // dx = dy s (1 + x (1 - s)): s within 4u relative, 1 - s within 4u absolute
  // (it cancels for large x), times |x|: about 6u |dy| (1 + |x|). Bound 16u |dy| (1 + |x|).
  ref.grad_bound = [](std::size_t, const std::vector<Vec>& a, const Vec& r, const Fd&) {
    Vec b(r.size());
    for (std::size_t i = 0; i < r.size(); ++i) b[i] = 16.0 * u * std::fabs(r[i]) * (1.0 + std::fabs(a[0][i]));
    return b;
  };
  check_layer("silu", *layer, x, {67, 1}, {}, ref, 24);
}

TEST_CASE("Logit soft-capping forward and backward match binary64 references", "[layers][transformer]") {
  Rng rng{31};
  constexpr double cap = 5.0;
  FVec x = uniform(rng, 60, -4.0 * cap, 4.0 * cap);
  for (const float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e6f, -1e6f}) x.push_back(v);
  auto layer = make_soft_cap("softcap", static_cast<float>(cap));
  Reference ref;
  ref.forward = [](const std::vector<Vec>& a) {
    Vec y = a[0];
    for (double& v : y) v = cap * std::tanh(v / cap);
    return y;
  };
  // x / cap, tanhf (glibc: within 2 ulps) and the product: about 4u |y|,
  // plus tanh's slope times x / cap's rounding, u |x| / cap <= u |x|. Bound 8u (|y| + |x|).
  ref.forward_bound = [ref](const std::vector<Vec>& a) {
    Vec b = ref.forward(a);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = 8.0 * u * (std::fabs(b[i]) + std::fabs(a[0][i]));
    return b;
  };
  // dx = dy (1 - t^2), t = y / cap within 6u relative: 1 - t^2 within 12u
  // absolute (it cancels as |t| -> 1), then a product. Bound 16u |dy|.
  ref.grad_bound = [](std::size_t, const std::vector<Vec>&, const Vec& r, const Fd&) { return scaled(abs_of(r), 16.0 * u); };
  check_layer("soft cap", *layer, x, {66, 1}, {}, ref, 25);
}

TEST_CASE("SwiGLU: silu(a) * b on rows of [a | b], forward and backward against binary64", "[layers][transformer]") {
  const Index rows = 6, n = 9;
  Rng rng{25};
  const FVec x = uniform(rng, static_cast<std::size_t>(rows * 2 * n), -4.0, 4.0);
  auto layer = make_gated_activation("swiglu", Activation::silu);
  Reference ref;
  ref.forward = [](const std::vector<Vec>& a) {
    Vec y(static_cast<std::size_t>(rows * n));
    for (Index r = 0; r < rows; ++r)
      for (Index j = 0; j < n; ++j) y[r * n + j] = silu64(a[0][r * 2 * n + j]) * a[0][r * 2 * n + n + j];
    return y;
  };
  // SiLU's 5u, one more product: bound 8u |y|.
  ref.forward_bound = [ref](const std::vector<Vec>& a) { return scaled(abs_of(ref.forward(a)), 8.0 * u); };
  // da = silu'(a) (dy b): SiLU's gradient bound with dy b for dy, plus the
  // product's u; db = dy silu(a): 6u of it. Bounds 20u |dy b| (1 + |a|) and 8u |dy silu(a)|.
  ref.grad_bound = [](std::size_t, const std::vector<Vec>& a, const Vec& r, const Fd&) {
    Vec b(a[0].size());
    for (Index row = 0; row < rows; ++row)
      for (Index j = 0; j < n; ++j) {
        const double gate = a[0][row * 2 * n + j], value = a[0][row * 2 * n + n + j], dy = r[row * n + j];
        b[row * 2 * n + j] = 20.0 * u * std::fabs(dy * value) * (1.0 + std::fabs(gate));
        b[row * 2 * n + n + j] = 8.0 * u * std::fabs(dy * silu64(gate));
      }
    return b;
  };
  check_layer("swiglu", *layer, x, {rows, 2 * n}, {}, ref, 26);
}

// --- LayerNorm ---------------------------------------------------------------

struct LnStats {
  Vec mean, rstd;
};
LnStats ln_stats(const Vec& x, Index rows, Index features, double eps) {
  LnStats s;
  for (Index r = 0; r < rows; ++r) {
    double m = 0.0, v = 0.0;
    for (Index j = 0; j < features; ++j) m += x[r * features + j];
    m /= static_cast<double>(features);
    for (Index j = 0; j < features; ++j) v += (x[r * features + j] - m) * (x[r * features + j] - m);
    v /= static_cast<double>(features);  // biased variance, as PyTorch
    s.mean.push_back(m);
    s.rstd.push_back(1.0 / std::sqrt(v + eps));
  }
  return s;
}

TEST_CASE("RMSNorm forward and backward match binary64 references", "[layers][transformer]") {
  const double eps = static_cast<double>(1e-5f);
  for (const Shape& shape : {Shape{3, 16}, Shape{1, 5}, Shape{2, 3, 8}}) {
    const Index features = shape.back(), rows = element_count(shape) / features;
    Rng rng{static_cast<std::uint64_t>(60 + rows * 100 + features)};
    auto layer = make_rms_norm("rms", features);
    const FVec x = uniform(rng, size_of(shape), -1.5, 2.5);
    const FVec gamma = away_from_zero(rng, static_cast<std::size_t>(features), 0.3, 1.7);
    // rstd = 1 / sqrt(mean(x^2) + eps) per row, in binary64.
    const auto rstd_of = [rows, features, eps](const Vec& x) {
      Vec rstd;
      for (Index r = 0; r < rows; ++r) {
        double s2 = 0.0;
        for (Index j = 0; j < features; ++j) s2 += x[r * features + j] * x[r * features + j];
        rstd.push_back(1.0 / std::sqrt(s2 / static_cast<double>(features) + eps));
      }
      return rstd;
    };
    Reference ref;
    ref.forward = [rows, features, rstd_of](const std::vector<Vec>& a) {
      const Vec rstd = rstd_of(a[0]);
      Vec y(a[0].size());
      for (Index r = 0; r < rows; ++r)
        for (Index j = 0; j < features; ++j) y[r * features + j] = a[0][r * features + j] * rstd[r] * a[1][j];
      return y;
    };
    // rstd stored as binary32 (u), then two products (u each): 3u |y|. Bound 8u |y|.
    ref.forward_bound = [ref](const std::vector<Vec>& a) { return scaled(abs_of(ref.forward(a)), 8.0 * u); };
    // dx_j = rstd (dxhat_j - xhat_j mean(dxhat xhat)), dxhat = dy g: xhat within 2u
    // relative, the mean stored as binary32; with C2 = mean |dxhat xhat|,
    // S_j = rstd (|dxhat_j| + |xhat_j| C2): about 6u S_j, bound 16u S_j.
    // dgamma_j = sum over rows of dy xhat in binary32: 2 (rows + 4) u sum |dy xhat|.
    ref.grad_bound = [rows, features, rstd_of](std::size_t which, const std::vector<Vec>& a, const Vec& dy,
                                               const Fd&) {
      const Vec rstd = rstd_of(a[0]);
      Vec b(a[which].size(), 0.0);
      for (Index r = 0; r < rows; ++r) {
        double c2 = 0.0;
        for (Index j = 0; j < features; ++j)
          c2 += std::fabs(dy[r * features + j] * a[1][j] * a[0][r * features + j] * rstd[r]);
        c2 /= static_cast<double>(features);
        for (Index j = 0; j < features; ++j) {
          const double xhat = a[0][r * features + j] * rstd[r], dxhat = dy[r * features + j] * a[1][j];
          if (which == 0)
            b[r * features + j] = 16.0 * u * rstd[r] * (std::fabs(dxhat) + std::fabs(xhat) * c2);
          else
            b[j] += 2.0 * static_cast<double>(rows + 4) * u * std::fabs(dy[r * features + j] * xhat);
        }
      }
      return b;
    };
    check_layer("rms norm " + shape_string(shape), *layer, x, shape, {gamma}, ref, 61);
  }
}

TEST_CASE("LayerNorm forward and backward match binary64 references", "[layers]") {
  const double eps = static_cast<double>(1e-5f);  // the layer's default, as the binary32 it holds
  for (const Shape& shape : {Shape{3, 16}, Shape{1, 5}, Shape{2, 3, 8}}) {
    const Index features = shape.back(), rows = element_count(shape) / features;
    Rng rng{static_cast<std::uint64_t>(40 + rows * 100 + features)};
    auto layer = make_layer_norm("ln", features);
    const FVec x = uniform(rng, size_of(shape), -1.5, 2.5);  // rows with a mean away from 0
    FVec gamma = away_from_zero(rng, static_cast<std::size_t>(features), 0.3, 1.7);
    const FVec beta = uniform(rng, static_cast<std::size_t>(features), -1.0, 1.0);
    Reference ref;
    ref.forward = [rows, features, eps](const std::vector<Vec>& a) {
      const LnStats s = ln_stats(a[0], rows, features, eps);
      Vec y(a[0].size());
      for (Index r = 0; r < rows; ++r)
        for (Index j = 0; j < features; ++j) {
          const std::size_t i = static_cast<std::size_t>(r * features + j);
          y[i] = (a[0][i] - s.mean[r]) * s.rstd[r] * a[1][j] + a[2][j];
        }
      return y;
    };
    // Statistics in binary64, then y = ((x - m_f) rstd_f) g + b in binary32:
    // m_f is off by u|m|, rstd_f by ~u relative, and four roundings follow:
    // |err| <= rstd |g| (u |m| + 5u |x - m|) + u |b|. Bound 8u (rstd |g| (|x - m| + |m|) + |b|).
    ref.forward_bound = [rows, features, eps](const std::vector<Vec>& a) {
      const LnStats s = ln_stats(a[0], rows, features, eps);
      Vec b(a[0].size());
      for (Index r = 0; r < rows; ++r)
        for (Index j = 0; j < features; ++j) {
          const std::size_t i = static_cast<std::size_t>(r * features + j);
          b[i] = 8.0 * u *
                 (s.rstd[r] * std::fabs(a[1][j]) * (std::fabs(a[0][i] - s.mean[r]) + std::fabs(s.mean[r])) +
                  std::fabs(a[2][j]));
        }
      return b;
    };
    // dx_j = rstd (dxhat_j - mean(dxhat) - xhat_j mean(dxhat xhat)), dxhat = dy g,
    // the means summed in binary64. xhat in binary32 is off by
    // u rstd |m| + 2u |xhat|; each of the three terms then carries a few u of
    // its magnitude, with C1 = mean |dxhat|, C2 = mean |dxhat xhat|:
    //   S_j = rstd (|dxhat_j| + C1 + |xhat_j| C2 + rstd |m| (C2 + |xhat_j| C1)).
    // The analysis gives about 6u S_j; bound 16u S_j.
    // dgamma_j = sum over rows of dy xhat in binary32: 2 (rows + 4) u times
    // sum |dy| (|xhat| + rstd |m|); dbeta_j = sum of dy: 2 (rows + 2) u sum |dy|.
    ref.grad_bound = [rows, features, eps](std::size_t which, const std::vector<Vec>& a, const Vec& dy, const Fd&) {
      const LnStats s = ln_stats(a[0], rows, features, eps);
      const auto xhat = [&](Index r, Index j) { return (a[0][r * features + j] - s.mean[r]) * s.rstd[r]; };
      Vec b(which == 0 ? a[0].size() : static_cast<std::size_t>(features), 0.0);
      for (Index r = 0; r < rows; ++r) {
        double c1 = 0.0, c2 = 0.0;
        for (Index j = 0; j < features; ++j) {
          const double dxhat = std::fabs(dy[r * features + j] * a[1][j]);
          c1 += dxhat / static_cast<double>(features);
          c2 += dxhat * std::fabs(xhat(r, j)) / static_cast<double>(features);
        }
        const double rm = s.rstd[r] * std::fabs(s.mean[r]);
        for (Index j = 0; j < features; ++j) {
          const double d = std::fabs(dy[r * features + j]), xh = std::fabs(xhat(r, j));
          if (which == 0)
            b[r * features + j] =
                16.0 * u * s.rstd[r] * (d * std::fabs(a[1][j]) + c1 + xh * c2 + rm * (c2 + xh * c1));
          else if (which == 1)
            b[j] += 2.0 * static_cast<double>(rows + 4) * u * d * (xh + rm);
          else
            b[j] += 2.0 * static_cast<double>(rows + 2) * u * d;
        }
      }
      return b;
    };
    check_layer("layer norm " + shape_string(shape), *layer, x, shape, {gamma, beta}, ref,
                60 + static_cast<std::uint64_t>(features));
  }
}

// --- Softmax cross-entropy -----------------------------------------------------

struct SoftmaxRef {
  Vec loss;  // per row
  Vec p;     // softmax
  std::vector<Index> argmax;
};
SoftmaxRef softmax_ref(const Vec& z, const std::vector<Index>& labels, Index cols) {
  SoftmaxRef s;
  const Index rows = static_cast<Index>(labels.size());
  for (Index r = 0; r < rows; ++r) {
    const double* row = z.data() + r * cols;
    Index am = 0;
    for (Index j = 1; j < cols; ++j)
      if (row[j] > row[am]) am = j;  // the first maximum, as PyTorch's argmax
    double sum = 0.0;
    for (Index j = 0; j < cols; ++j) sum += std::exp(row[j] - row[am]);
    const double lse = row[am] + std::log(sum);
    s.loss.push_back(lse - row[labels[r]]);
    for (Index j = 0; j < cols; ++j) s.p.push_back(std::exp(row[j] - lse));
    s.argmax.push_back(am);
  }
  return s;
}

TEST_CASE("Softmax cross-entropy: loss and d_logits match binary64 references", "[layers]") {
  struct Case {
    Index rows, cols;
    float grad_scale;
    FVec logits;
    std::vector<Index> labels;
  };
  Rng rng{99};
  std::vector<Case> cases;
  {
    Case c{4, 10, 1.0f, uniform(rng, 40, -5.0, 5.0), {}};
    for (Index r = 0; r < c.rows; ++r) c.labels.push_back(static_cast<Index>(rng.index(10)));
    cases.push_back(c);
  }
  {
    Case c{3, 7, 65536.0f, uniform(rng, 21, -3.0, 3.0), {2, 0, 6}};
    cases.push_back(c);
  }
  // Large logits: differences of 160 and more, exp(100) overflows binary32
  // and exp(-120) underflows it, so only a max-shifted evaluation gets these right.
  cases.push_back(Case{8, 4, 0.75f,
                       {80, -80, 0, 3,              // label -80: loss 160
                        80, -80, 0, 3,              // label 80: loss ~ e^-77
                        -80, -80, -80, -80,         // all equal: log 4
                        80, 80, -80, 79.5f,         // tie at the top
                        -80, -79, -78, -77.5f,      //
                        1e-3f, 0, -1e-3f, 20,       //
                        100, -100, 50, 0,           // label -100: loss 200
                        -120, -121, -119, -120.5f}, // every exp(z) underflows
                       {1, 0, 2, 1, 0, 3, 1, 2}});
  cases.push_back(Case{5, 3, 1024.0f, uniform(rng, 15, -30.0, 30.0), {0, 1, 2, 2, 1}});

  for (const Case& c : cases) {
    INFO("rows " << c.rows << ", classes " << c.cols << ", grad_scale " << c.grad_scale);
    Fixture f;
    FVec labels;
    for (const Index l : c.labels) labels.push_back(static_cast<float>(l));
    const Tensor logits = f.tensor(c.logits, {c.rows, c.cols});
    Tensor d_logits = f.tensor(FVec(c.logits.size(), std::numeric_limits<float>::quiet_NaN()), {c.rows, c.cols});
    const LossResult result = f.backend->softmax_cross_entropy(logits, f.tensor(labels, {c.rows}), c.grad_scale,
                                                               d_logits);
    const FVec dz = f.host(d_logits);

    const Vec z = widen(c.logits);
    const SoftmaxRef s = softmax_ref(z, c.labels, c.cols);
    // Per row, in binary32: z_j - max (u |z_j - max|), C exponentials (u
    // relative each, plus the argument's error), their sum (C u), the log
    // (u |lse'| plus the sum's relative error), and two subtractions:
    //   |err| <= u (C + 2 + 2 range + |log sum| + |loss|), range = max_j |z_j - max|.
    // Bound 4u (C + 2 + 2 range + 2 |loss|) (|log sum| <= |loss| + range).
    double loss_sum = 0.0, loss_bound = 0.0;
    std::int64_t correct = 0;
    Vec range(static_cast<std::size_t>(c.rows), 0.0);
    for (Index r = 0; r < c.rows; ++r) {
      const double m = z[static_cast<std::size_t>(r * c.cols + s.argmax[r])];
      for (Index j = 0; j < c.cols; ++j) range[r] = std::max(range[r], m - z[r * c.cols + j]);
      loss_sum += s.loss[r];
      loss_bound +=
          4.0 * u * (static_cast<double>(c.cols) + 2.0 + 2.0 * range[r] + 2.0 * std::fabs(s.loss[r]));
      correct += s.argmax[r] == c.labels[r];
    }
    INFO("loss_sum " << result.loss_sum << ", reference " << loss_sum << ", bound " << loss_bound);
    CHECK(std::fabs(result.loss_sum - loss_sum) <= loss_bound);
    CHECK(result.correct == correct);

    // d_logits against finite differences of grad_scale * mean loss in binary64.
    const double scale = static_cast<double>(c.grad_scale);
    const RefForward scaled_mean_loss = [&](const std::vector<Vec>& a) {
      const SoftmaxRef t = softmax_ref(a[0], c.labels, c.cols);
      double l = 0.0;
      for (const double v : t.loss) l += v;
      return Vec{scale * l / static_cast<double>(c.rows)};
    };
    const Fd fd = finite_differences(scaled_mean_loss, {z}, 0, Vec{1.0});
    // d = (p - onehot) * fl(grad_scale / rows). p = exp(z - max - log sum) is
    // off by u (C + 4 + 3 range + 2 |log sum|) relative (the argument's error
    // as above); then (p - onehot) and the two products add 3u |p - onehot|.
    // Doubled, plus binary32's underflow (p below 2^-126 loses all digits).
    Vec bound(dz.size());
    const double factor = scale / static_cast<double>(c.rows);
    for (Index r = 0; r < c.rows; ++r) {
      const double log_sum = s.loss[r] + z[r * c.cols + c.labels[r]] - z[r * c.cols + s.argmax[r]];
      for (Index j = 0; j < c.cols; ++j) {
        const std::size_t i = static_cast<std::size_t>(r * c.cols + j);
        const double pm = std::fabs(s.p[i] - (j == c.labels[r] ? 1.0 : 0.0));
        bound[i] = factor * (2.0 * u * (s.p[i] * (static_cast<double>(c.cols) + 4.0 + 3.0 * range[r] +
                                                   2.0 * std::fabs(log_sum)) +
                                        3.0 * pm) +
                             0x1p-125) +
                   0x1p-148 + fd.floor[i];
      }
    }
    expect_close("d_logits", dz, fd.grad, bound);
  }
}

// --- Rounding points under fp16-mixed --------------------------------------------

bool is_binary16(float v) {
  const mpsim::Rounded r = mpsim::round_to_format(mpsim::formats::binary16, {}, v);
  return !r.flags.has(mpsim::Flags::inexact) && mpsim::to_float(mpsim::formats::binary16, r.bits) == v;
}

TEST_CASE("Linear under fp16-mixed rounds its outputs and gradients to binary16", "[layers]") {
  const Index batch = 3, in = 20, out = 6;
  Rng rng{123};
  const FVec x = uniform(rng, batch * in, -2.0, 2.0);
  const FVec w = uniform(rng, out * in, -0.5, 0.5), b = uniform(rng, out, -0.5, 0.5);
  const FVec dy = uniform(rng, batch * out, -1.0, 1.0);

  Fixture f("fp16-mixed");
  auto layer = make_linear("fc", in, out);
  std::vector<Parameter*> ps = layer->parameters();
  f.set_parameter(*ps[0], w);
  f.set_parameter(*ps[1], b);
  for (Parameter* p : ps) {  // the working copy in policy.weights, as the trainer makes it
    p->working = f.tensor(f.host(p->master), p->shape);
    f.ctx.round(p->working, f.policy.weights, TensorKind::weights, Site::weight_operand);
  }
  const FVec w16 = f.host(ps[0]->working), b16 = f.host(ps[1]->working);
  for (const float v : w16) REQUIRE(is_binary16(v));

  const FVec y = f.host(layer->forward(f.ctx, f.tensor(x, {batch, in})));
  const FVec dx = f.host(layer->backward(f.ctx, f.tensor(dy, {batch, out}), true));
  const FVec dw = f.host(ps[0]->grad), db = f.host(ps[1]->grad);
  const auto all_binary16 = [](const FVec& v) { return std::all_of(v.begin(), v.end(), is_binary16); };
  CHECK(all_binary16(y));
  CHECK(all_binary16(dx));
  CHECK(all_binary16(dw));
  CHECK(all_binary16(db));

  // And they are the right binary16 values: y = fp16(fp16(x) w16 + b16), the
  // sum in binary32 (2 (in + 3) u of the magnitudes) before one rounding to
  // binary16 (half an ulp: 2^-11 relative, or 2^-25 among subnormals).
  FVec x16 = x;
  for (float& v : x16)
    v = mpsim::to_float(mpsim::formats::binary16, mpsim::round_to_format(mpsim::formats::binary16, {}, v).bits);
  const Vec y_ref = linear_ref({widen(x16), widen(w16), widen(b16)}, batch, in, out);
  const Vec a = linear_ref(abs_of(std::vector<Vec>{widen(x16), widen(w16), widen(b16)}), batch, in, out);
  Vec bound(y_ref.size());
  for (std::size_t i = 0; i < bound.size(); ++i)
    bound[i] = 0x1p-11 * std::fabs(y_ref[i]) + 2.0 * static_cast<double>(in + 3) * u * a[i] * (1.0 + 0x1p-10) +
               0x1p-25;
  expect_close("fp16-mixed linear forward", y, y_ref, bound);
  // The rounding changed something: the binary32 result of unrounded x differs.
  const Vec y32 = linear_ref({widen(x), widen(w16), widen(b16)}, batch, in, out);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < y.size(); ++i) differ += y[i] != static_cast<float>(y32[i]);
  CHECK(differ > y.size() / 2);
}

// The binary32 encodings of v: compares values bit for bit (NaN and -0 included).
std::vector<std::uint32_t> bits_of(const FVec& v) {
  std::vector<std::uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));  // memcpy from null is undefined
  return out;
}

TEST_CASE("a GEMM operand already in the operand's format is used as it is, with the same bits", "[layers]") {
  // The trainer tells a layer which rounding its input passed last. Under
  // fp16-mixed, an input that passed binary16 skips the operand copy and
  // rounding (and is not counted again as gemm_inputs), and the layer's
  // results are bit for bit those of the rounding it skipped.
  const Index batch = 4, in = 24, out = 5;
  Rng rng{7};
  FVec x = uniform(rng, batch * in, -2.0, 2.0);
  for (float& v : x)  // values that passed binary16
    v = mpsim::to_float(mpsim::formats::binary16, mpsim::round_to_format(mpsim::formats::binary16, {}, v).bits);
  const FVec w = uniform(rng, out * in, -0.5, 0.5), b = uniform(rng, out, -0.5, 0.5);
  const FVec dy16 = [&] {
    FVec d = uniform(rng, batch * out, -1.0, 1.0);
    for (float& v : d)
      v = mpsim::to_float(mpsim::formats::binary16, mpsim::round_to_format(mpsim::formats::binary16, {}, v).bits);
    return d;
  }();
  struct Results {
    FVec y, dx, dw;
    std::uint64_t gemm_inputs_counted;
  };
  const auto run = [&](bool told) {
    Fixture f("fp16-mixed");
    LayerStats stats(1);
    f.ctx.stats = &stats;
    auto layer = make_linear("fc", in, out);
    std::vector<Parameter*> ps = layer->parameters();
    f.set_parameter(*ps[0], w);
    f.set_parameter(*ps[1], b);
    if (told) f.ctx.incoming = layer->output_rounding(f.policy, std::nullopt);  // binary16, like a Linear before it
    Results r;
    r.y = f.host(layer->forward(f.ctx, f.tensor(x, {batch, in})));
    if (told) f.ctx.incoming = f.policy.activation_grads;
    r.dx = f.host(layer->backward(f.ctx, f.tensor(dy16, {batch, out}), true));
    r.dw = f.host(ps[0]->grad);
    r.gemm_inputs_counted = stats[0][static_cast<int>(TensorKind::gemm_inputs)][Counter::elements];
    return r;
  };
  const Results rounded = run(false), skipped = run(true);
  CHECK(bits_of(skipped.y) == bits_of(rounded.y));
  CHECK(bits_of(skipped.dx) == bits_of(rounded.dx));
  CHECK(bits_of(skipped.dw) == bits_of(rounded.dw));
  CHECK(rounded.gemm_inputs_counted == static_cast<std::uint64_t>(batch * (in + out)));
  CHECK(skipped.gemm_inputs_counted == 0);

  // Which roundings keep earlier values: same format unscaled, or the identity.
  const auto point = [](const char* text) {
    const auto p = parse_rounding_point(text, nullptr);
    REQUIRE(p);
    return *p;
  };
  CHECK(point("binary16").keeps_values_of(point("binary16/stochastic")));
  CHECK(point("binary16/toward-zero").keeps_values_of(point("binary16")));
  CHECK(point("binary32").keeps_values_of(point("e4m3/scaled")));
  CHECK_FALSE(point("binary16").keeps_values_of(point("bfloat16")));
  CHECK_FALSE(point("binary16").keeps_values_of(point("binary32")));
  CHECK_FALSE(point("e4m3/scaled").keeps_values_of(point("e4m3/scaled")));
  CHECK_FALSE(point("e4m3").keeps_values_of(point("e4m3/scaled")));
}

// --- Whole models ------------------------------------------------------------------

// The loss of one batch through the layers, as the trainer runs them, and
// the model's kink pattern: the sign of every ReLU input and the position of
// every pooling window's maximum (first of equals).
struct ModelEval {
  double loss = 0.0;
  std::vector<std::uint8_t> pattern;
};

ModelEval evaluate(Fixture& f, Model& model, const FVec& x, const Shape& x_shape, const FVec& labels,
                   bool backward) {
  auto& layers = model.layers();
  ModelEval e;
  Tensor h = f.tensor(x, x_shape);
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
    const std::string& name = layers[static_cast<std::size_t>(i)]->name();
    if (name.starts_with("relu")) {
      for (const float v : f.host(h)) e.pattern.push_back(v > 0.0f);
    } else if (name.starts_with("pool")) {  // 2x2, stride 2
      const FVec v = f.host(h);
      const Shape& s = h.shape();
      for (Index pl = 0; pl < s[0] * s[1]; ++pl)
        for (Index i2 = 0; i2 + 1 < s[2]; i2 += 2)
          for (Index j2 = 0; j2 + 1 < s[3]; j2 += 2) {
            std::uint8_t best = 0;
            float m = v[static_cast<std::size_t>((pl * s[2] + i2) * s[3] + j2)];
            for (std::uint8_t k = 1; k < 4; ++k) {
              const float c = v[static_cast<std::size_t>((pl * s[2] + i2 + k / 2) * s[3] + j2 + k % 2)];
              if (c > m) m = c, best = k;
            }
            e.pattern.push_back(best);
          }
    }
    f.ctx.layer = i;
    h = layers[static_cast<std::size_t>(i)]->forward(f.ctx, h);
  }
  const Index n = static_cast<Index>(labels.size());
  Tensor d_logits = f.backend->empty(h.shape());
  const LossResult r = f.backend->softmax_cross_entropy(h, f.tensor(labels, {n}), 1.0f, d_logits);
  e.loss = r.loss_sum / static_cast<double>(n);
  if (backward) {
    Tensor g = d_logits;
    for (int i = static_cast<int>(layers.size()) - 1; i >= 0; --i) {
      f.ctx.layer = i;
      g = layers[static_cast<std::size_t>(i)]->backward(f.ctx, g, i > 0);
    }
  }
  return e;
}

// Central differences of the binary32 loss, for `wanted` distinct parameters
// drawn at random, taking the parameter tensors in turn (so every weight and
// bias tensor is sampled, the first layer's too).
//
// Kinks. Where a step changes the model's pattern (a ReLU input or a pooling
// maximum crosses over) the loss has a kink inside [t - s, t + s] and the
// quotient is no derivative. So the step s is the largest of h, 0.3h, 0.1h,
// 0.03h, 0.01h whose two evaluations keep the pattern of the unperturbed
// model; a parameter with no such step is drawn again (the test counts them).
// Error budget. The binary32 loss is the exact loss of the binary32
// parameters plus rounding noise: the short sums of O(1) logits and the loss
// (~2.3 for 10 classes) put it at a few u (1 + |L|) (measured: up to
// ~3u (1 + |L|), 4e-7); allowing d = 16u (1 + |L|), the quotient is off by
// at most 2d / 2s = d / s (with h = 1e-2: ~3e-4 at s = h, 3e-2 at s = 0.01h).
// Within one pattern the logits are affine in any single parameter
// (z = z0 + t v) and softmax cross-entropy has third derivatives below
// ~0.4 |v|^3, so truncation is s^2/6 |L'''| <~ 1e-5 |v|^3, covered by a part
// relative to the gradient (which grows with |v|). Bound: d / s + 1e-3 |fd|.
// (A wrong factor, sign or index misses by far more.) The step is taken in
// binary32 and the quotient divides by the step actually taken.
// A language model (`tokens`): the inputs are token ids and every position
// has a label, the next token.
void check_model_gradients(const ModelSpec& spec, const InputShape& in, Index batch, float h, std::uint64_t seed,
                           int wanted, bool tokens = false) {
  Fixture f;
  Model model(spec, in, seed);
  std::vector<Parameter*> params = model.parameters();
  for (Parameter* p : params) f.set_parameter(*p, p->initial);
  Rng rng{seed + 1};
  const Shape x_shape{batch, in.channels, in.height, in.width};
  FVec x = uniform(rng, size_of(x_shape), 0.0, 1.0);
  FVec labels;
  const auto draw_class = [&] { return static_cast<float>(rng.index(static_cast<std::size_t>(in.classes))); };
  if (tokens) {
    for (float& id : x) id = draw_class();
    for (std::size_t i = 0; i < x.size(); ++i) labels.push_back(draw_class());
  } else {
    for (Index i = 0; i < batch; ++i) labels.push_back(draw_class());
  }

  const ModelEval base = evaluate(f, model, x, x_shape, labels, true);
  std::vector<FVec> grads;
  for (Parameter* p : params) grads.push_back(f.host(p->grad));
  bool finite = true;
  for (const FVec& g : grads)
    for (const float v : g) finite = finite && std::isfinite(v);
  REQUIRE(finite);  // every gradient element written (they started as NaN)
  const double noise = 16.0 * u * (1.0 + std::fabs(base.loss));

  std::vector<std::pair<std::size_t, std::size_t>> checked;
  int accepted = 0, redrawn = 0, nonzero = 0, attempts = 0;
  double worst = 0.0;
  while (accepted < wanted && redrawn < 10 * wanted && ++attempts < 100 * wanted) {
    const std::size_t pi = static_cast<std::size_t>(accepted) % params.size();
    Parameter& p = *params[pi];
    const std::size_t i = rng.index(p.initial.size());
    if (std::find(checked.begin(), checked.end(), std::pair{pi, i}) != checked.end()) continue;
    FVec values = p.initial;
    const float t = values[i];
    float plus = t, minus = t;
    ModelEval ep, em;
    bool smooth = false;
    for (const float fraction : {1.0f, 0.3f, 0.1f, 0.03f, 0.01f}) {
      plus = t + fraction * h;
      minus = t - fraction * h;
      values[i] = plus;
      f.backend->copy(f.tensor(values, p.shape), p.working);
      ep = evaluate(f, model, x, x_shape, labels, false);
      values[i] = minus;
      f.backend->copy(f.tensor(values, p.shape), p.working);
      em = evaluate(f, model, x, x_shape, labels, false);
      smooth = ep.pattern == base.pattern && em.pattern == base.pattern;
      if (smooth) break;
    }
    values[i] = t;
    f.backend->copy(f.tensor(values, p.shape), p.working);
    if (!smooth) {
      ++redrawn;
      continue;
    }
    ++accepted;
    checked.emplace_back(pi, i);
    const double step = (static_cast<double>(plus) - static_cast<double>(minus)) / 2.0;
    const double fd = (ep.loss - em.loss) / (2.0 * step);
    const double g = grads[pi][i];
    nonzero += g != 0.0;
    const double bound = noise / step + 1e-3 * std::fabs(fd);
    worst = std::max(worst, std::fabs(g - fd) / bound);
    INFO(p.name << "[" << i << "]: backward " << g << ", finite difference " << fd << " (step " << step
                << "), bound " << bound);
    CHECK(std::fabs(g - fd) <= bound);
  }
  INFO(to_string(spec.kind) << ": " << accepted << " parameters checked, " << redrawn << " redrawn for kinks, " << nonzero
                 << " with a nonzero gradient, worst error / bound " << worst);
  CHECK(accepted == wanted);
  CHECK(nonzero >= wanted / 2);
}

TEST_CASE("MLP: backward gradients match finite differences of the binary32 loss", "[layers]") {
  ModelSpec spec;
  spec.kind = ModelKind::mlp;
  spec.hidden = {16, 8};
  check_model_gradients(spec, InputShape{1, 4, 4, 3}, 5, 1e-2f, 2024, 20);
}

TEST_CASE("CNN: backward gradients match finite differences of the binary32 loss", "[layers]") {
  ModelSpec spec;
  spec.kind = ModelKind::cnn;
  check_model_gradients(spec, InputShape{1, 28, 28, 10}, 2, 1e-2f, 2025, 20);
}

// --- Transformer layers (layers_transformer.cpp) ----------------------------------

// Self-attention on [q | k | v] rows in binary64: the logits, the
// probabilities, the output (numerics_attention.hpp's layout).
struct AttentionRef {
  Index batch, tokens, heads, dim;
  bool causal;
  Index width() const { return heads * dim; }
  double at(const Vec& x, Index b, Index i, int part, Index h, Index c) const {
    return x[static_cast<std::size_t>((b * tokens + i) * 3 * width() + part * width() + h * dim + c)];
  }
  bool visible(Index i, Index j) const { return !causal || j <= i; }
  // probs[((b * heads + h) * tokens + i) * tokens + j]
  Vec probs(const Vec& x) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    Vec p(static_cast<std::size_t>(batch * heads * tokens * tokens), 0.0);
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < heads; ++h)
        for (Index i = 0; i < tokens; ++i) {
          Vec s(static_cast<std::size_t>(tokens), -std::numeric_limits<double>::infinity());
          double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
          for (Index j = 0; j < tokens; ++j) {
            if (!visible(i, j)) continue;
            double d = 0.0;
            for (Index c = 0; c < dim; ++c) d += at(x, b, i, 0, h, c) * at(x, b, j, 1, h, c);
            s[j] = d * scale;
            m = std::max(m, s[j]);
          }
          for (Index j = 0; j < tokens; ++j) sum += visible(i, j) ? std::exp(s[j] - m) : 0.0;
          for (Index j = 0; j < tokens; ++j)
            p[static_cast<std::size_t>(((b * heads + h) * tokens + i) * tokens + j)] =
                visible(i, j) ? std::exp(s[j] - m) / sum : 0.0;
        }
    return p;
  }
  double prob(const Vec& p, Index b, Index h, Index i, Index j) const {
    return p[static_cast<std::size_t>(((b * heads + h) * tokens + i) * tokens + j)];
  }
  Vec forward(const Vec& x) const {
    const Vec p = probs(x);
    Vec y(static_cast<std::size_t>(batch * tokens * width()), 0.0);
    for (Index b = 0; b < batch; ++b)
      for (Index i = 0; i < tokens; ++i)
        for (Index h = 0; h < heads; ++h)
          for (Index c = 0; c < dim; ++c) {
            double sum = 0.0;
            for (Index j = 0; j < tokens; ++j) sum += prob(p, b, h, i, j) * at(x, b, j, 2, h, c);
            y[static_cast<std::size_t>((b * tokens + i) * width() + h * dim + c)] = sum;
          }
    return y;
  }
  // The relative error of a binary32 probability: the logits' dot products
  // (dim terms, then the scale: (dim + 2) u sum |q k| scale, twice for the
  // difference to the row's maximum) and softmax's few roundings (8u).
  double prob_error(const Vec& x) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    double worst = 0.0;
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < heads; ++h)
        for (Index i = 0; i < tokens; ++i)
          for (Index j = 0; j < tokens; ++j) {
            double d = 0.0;
            for (Index c = 0; c < dim; ++c) d += std::fabs(at(x, b, i, 0, h, c) * at(x, b, j, 1, h, c));
            worst = std::max(worst, 2.0 * static_cast<double>(dim + 2) * u * d * scale);
          }
    return worst + 8.0 * u;
  }
  // The backward pass with every value replaced by its magnitude and every
  // difference by a sum: the size of the terms each binary32 gradient adds up.
  Vec gradient_magnitudes(const Vec& x, const Vec& dy) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    const Vec p = probs(x);
    Vec g(x.size(), 0.0);
    const auto out = [&](Index b, Index i, Index h, Index c) {
      return std::fabs(dy[static_cast<std::size_t>((b * tokens + i) * width() + h * dim + c)]);
    };
    const auto slot = [&](Index b, Index i, int part, Index h, Index c) -> double& {
      return g[static_cast<std::size_t>((b * tokens + i) * 3 * width() + part * width() + h * dim + c)];
    };
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < heads; ++h) {
        Vec ds(static_cast<std::size_t>(tokens * tokens), 0.0);
        for (Index i = 0; i < tokens; ++i) {
          Vec dp(static_cast<std::size_t>(tokens), 0.0);
          double row = 0.0;
          for (Index j = 0; j < tokens; ++j) {
            for (Index c = 0; c < dim; ++c) dp[j] += out(b, i, h, c) * std::fabs(at(x, b, j, 2, h, c));
            row += prob(p, b, h, i, j) * dp[j];
          }
          for (Index j = 0; j < tokens; ++j) ds[static_cast<std::size_t>(i * tokens + j)] = prob(p, b, h, i, j) * (dp[j] + row);
        }
        for (Index i = 0; i < tokens; ++i)
          for (Index j = 0; j < tokens; ++j)
            for (Index c = 0; c < dim; ++c) {
              const double d = ds[static_cast<std::size_t>(i * tokens + j)];
              slot(b, i, 0, h, c) += scale * d * std::fabs(at(x, b, j, 1, h, c));
              slot(b, j, 1, h, c) += scale * d * std::fabs(at(x, b, i, 0, h, c));
              slot(b, j, 2, h, c) += prob(p, b, h, i, j) * out(b, i, h, c);
            }
      }
    return g;
  }
};

// Self-attention's layer (unfused, or fused with tiles of `tile` keys) against
// AttentionRef's binary64 values and finite differences. Returns the output.
FVec check_attention_layer(bool causal, Index tile) {
  const AttentionRef a{2, 5, 2, 4, causal};
  Rng rng{causal ? 81u : 80u};
  const Shape shape{a.batch * a.tokens, 3 * a.width()};
  const FVec x = uniform(rng, size_of(shape), -1.5, 1.5);
  auto layer = make_self_attention("attn", a.tokens, a.heads, causal, 0.0f, 0.0, tile);
  // Bounds: a binary32 sum of at most n = tokens + dim terms of the
  // magnitudes the reference adds up, 2 (n + 6) u of them, plus the
  // probabilities' own relative error (prob_error) on the same magnitudes.
  // The fused path adds its binary32 sum of the exponentials (tokens terms),
  // a rescaling exp(m - m') per tile, the reciprocal, and (backward) the
  // error of lse = m + log(l), at most (|logit| + log(tokens) + 2) u of
  // absolute error in each exponent.
  double k = 2.0 * static_cast<double>(a.tokens + a.dim + 6) * u;
  if (tile > 0) {
    const double tiles = std::ceil(static_cast<double>(a.tokens) / static_cast<double>(tile));
    const Vec xd(x.begin(), x.end());
    double logit = 0.0;
    for (Index b = 0; b < a.batch; ++b)
      for (Index h = 0; h < a.heads; ++h)
        for (Index i = 0; i < a.tokens; ++i)
          for (Index j = 0; j < a.tokens; ++j) {
            double d = 0.0;
            for (Index c = 0; c < a.dim; ++c) d += std::fabs(a.at(xd, b, i, 0, h, c) * a.at(xd, b, j, 1, h, c));
            logit = std::max(logit, d / std::sqrt(static_cast<double>(a.dim)));
          }
    k += 2.0 * (static_cast<double>(a.tokens) + 3.0 * tiles + 4.0 + logit + std::log(a.tokens) + 2.0) * u;
  }
  {
    Reference ref;
    ref.forward = [a](const std::vector<Vec>& args) { return a.forward(args[0]); };
    ref.forward_bound = [a, k](const std::vector<Vec>& args) {
      AttentionRef m = a;
      Vec abs_x = abs_of(args[0]);
      const Vec p = a.probs(args[0]);
      Vec bound(static_cast<std::size_t>(a.batch * a.tokens * a.width()), 0.0);
      const double e = a.prob_error(args[0]);
      for (Index b = 0; b < a.batch; ++b)
        for (Index i = 0; i < a.tokens; ++i)
          for (Index h = 0; h < a.heads; ++h)
            for (Index c = 0; c < a.dim; ++c) {
              double s = 0.0;
              for (Index j = 0; j < a.tokens; ++j) s += m.prob(p, b, h, i, j) * m.at(abs_x, b, j, 2, h, c);
              bound[static_cast<std::size_t>((b * a.tokens + i) * a.width() + h * a.dim + c)] = (k + e) * s;
            }
      return bound;
    };
    ref.grad_bound = [a, k](std::size_t, const std::vector<Vec>& args, const Vec& dy, const Fd&) {
      return scaled(a.gradient_magnitudes(args[0], dy), k + 2.0 * a.prob_error(args[0]));
    };
    const std::string what = std::string(causal ? "causal attention" : "attention") +
                             (tile > 0 ? ", fused, tiles of " + std::to_string(tile) : std::string());
    const FVec y = check_layer(what, *layer, x, shape, {}, ref, 82);
    if (causal) {
      // The first query sees only itself: its output is its own v.
      for (Index h = 0; h < a.heads; ++h)
        for (Index c = 0; c < a.dim; ++c)
          CHECK(y[static_cast<std::size_t>(h * a.dim + c)] == x[static_cast<std::size_t>(2 * a.width() + h * a.dim + c)]);
    }
    return y;
  }
}

TEST_CASE("Self-attention forward and backward match binary64 references", "[layers][transformer]") {
  for (const bool causal : {false, true}) check_attention_layer(causal, 0);
}

TEST_CASE("Fused attention (FlashAttention-2's online softmax) matches the binary64 references and finite "
          "differences at every tile size", "[layers][transformer]") {
  for (const bool causal : {false, true})
    for (const Index tile : {1, 2, 5, 64}) check_attention_layer(causal, tile);
}

TEST_CASE("Fused attention keeps its logits in binary32: a BF16 logit quantum that moves the unfused "
          "probabilities leaves the fused ones within BF16's own rounding", "[layers][transformer]") {
  // One sample, two tokens, one head of two features (scale 1/sqrt(2)), not
  // causal. Query 0 is (1, 1), keys (108.5, 0) and (108.5, 0.75), all BF16
  // values: logits 76.72 and 77.25, which bfloat16 (quantum 0.5 there)
  // rounds to 76.5 and 77.5, doubling their difference. v_0 = (1, 0),
  // v_1 = (0, 0): output 0 of query 0 is its probability of key 0.
  const FVec x{1, 1, 108.5f, 0, 1, 0,  //
               1, 1, 108.5f, 0.75f, 0, 0};
  const double scale = 1.0 / std::sqrt(2.0), s0 = 108.5 * scale, s1 = 109.25 * scale;
  const double want = 1.0 / (1.0 + std::exp(s1 - s0));  // 0.3704
  const auto probability = [&](Index tile) {
    Fixture f("bf16-mixed");
    auto layer = make_self_attention("attn", 2, 1, false, 0.0f, 0.0, tile);
    return static_cast<double>(f.host(layer->forward(f.ctx, f.tensor(x, {2, 6})))[0]);
  };
  const double unfused = probability(0), fused = probability(64);
  INFO("binary64 " << want << ", unfused bf16-mixed " << unfused << ", fused bf16-mixed " << fused);
  // Unfused: 1 / (1 + e^1) = 0.2689 before the last roundings, 0.10 below.
  CHECK(std::fabs(unfused - want) > 0.09);
  // Fused: exp(s0 - s1) rounded to BF16 (2^-9 relative), the output rounded to BF16 (2^-9), binary32 elsewhere.
  CHECK(std::fabs(fused - want) <= (std::ldexp(1.0, -9) * 2 + 1e-6) * want);
}

// Runs layers as one: forward in order, backward in reverse (a residual
// connection is a pair of layers around its branch).
class LayerChain final : public Layer {
 public:
  explicit LayerChain(std::vector<std::unique_ptr<Layer>> layers) : Layer("chain"), layers_(std::move(layers)) {}
  Shape output_shape(const Shape& in) const override {
    Shape s = in;
    for (const auto& l : layers_) s = l->output_shape(s);
    return s;
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> all;
    for (auto& l : layers_)
      for (Parameter* p : l->parameters()) all.push_back(p);
    return all;
  }
  std::optional<RoundingPoint> output_rounding(const Policy&, const std::optional<RoundingPoint>&) const override {
    return std::nullopt;
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers_) h = l->forward(ctx, h);
    return h;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    Tensor g = dy;
    for (std::size_t i = layers_.size(); i-- > 0;) g = layers_[i]->backward(ctx, g, i > 0 || need_input_grad);
    return g;
  }

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

TEST_CASE("A residual connection around a Linear: y = x + W x + b, forward and backward", "[layers][transformer]") {
  const Index batch = 3, n = 6;
  Rng rng{90};
  const FVec x = uniform(rng, static_cast<std::size_t>(batch * n), -1.0, 1.0);
  const FVec w = uniform(rng, static_cast<std::size_t>(n * n), -1.0, 1.0);
  const FVec bias = uniform(rng, static_cast<std::size_t>(n), -1.0, 1.0);
  ResidualLayers residual = make_residual("skip", "add");
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::move(residual.branch));
  layers.push_back(make_linear("fc", n, n));
  layers.push_back(std::move(residual.add));
  LayerChain chain(std::move(layers));
  Reference ref;
  ref.forward = [&](const std::vector<Vec>& a) {
    Vec y = linear_ref(a, batch, n, n);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += a[0][i];
    return y;
  };
  // The Linear's bound (n + 1 terms) plus the residual sum's rounding.
  ref.forward_bound = [&](const std::vector<Vec>& a) {
    Vec m = linear_ref(abs_of(a), batch, n, n);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = 2.0 * static_cast<double>(n + 3) * u * (m[i] + std::fabs(a[0][i]));
    return m;
  };
  ref.grad_bound = dot_bound(batch + n + 1);
  check_layer("residual", chain, x, {batch, n}, {w, bias}, ref, 91);
}

TEST_CASE("Position embedding, tokens and the sequence mean match binary64 references", "[layers][transformer]") {
  const Index batch = 3, tokens = 4, width = 5;
  Rng rng{95};
  {
    const FVec x = uniform(rng, static_cast<std::size_t>(batch * tokens * width), -1.0, 1.0);
    const FVec table = uniform(rng, static_cast<std::size_t>(tokens * width), -1.0, 1.0);
    auto layer = make_position_embedding("pos", tokens, width);
    Reference ref;
    ref.forward = [&](const std::vector<Vec>& a) {
      Vec y = a[0];
      for (std::size_t i = 0; i < y.size(); ++i) y[i] += a[1][i % static_cast<std::size_t>(tokens * width)];
      return y;
    };
    ref.forward_bound = [&](const std::vector<Vec>& a) {
      Vec b(a[0].size());
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = u * (std::fabs(a[0][i]) + std::fabs(a[1][i % static_cast<std::size_t>(tokens * width)]));
      return b;
    };
    ref.grad_bound = dot_bound(batch);
    check_layer("position embedding", *layer, x, {batch * tokens, width}, {table}, ref, 96);
  }
  {
    const FVec x = uniform(rng, static_cast<std::size_t>(batch * tokens * width), -1.0, 1.0);
    auto layer = make_sequence_mean("mean", tokens);
    Reference ref;
    ref.forward = [&](const std::vector<Vec>& a) {
      Vec y(static_cast<std::size_t>(batch * width), 0.0);
      for (Index b = 0; b < batch; ++b)
        for (Index i = 0; i < tokens; ++i)
          for (Index c = 0; c < width; ++c) y[b * width + c] += a[0][(b * tokens + i) * width + c] / tokens;
      return y;
    };
    ref.forward_bound = [&](const std::vector<Vec>& a) {
      Vec y(static_cast<std::size_t>(batch * width), 0.0);
      for (Index b = 0; b < batch; ++b)
        for (Index i = 0; i < tokens; ++i)
          for (Index c = 0; c < width; ++c)
            y[b * width + c] += 2.0 * (tokens + 2) * u * std::fabs(a[0][(b * tokens + i) * width + c]) / tokens;
      return y;
    };
    ref.grad_bound = dot_bound(1);
    check_layer("sequence mean", *layer, x, {batch * tokens, width}, {}, ref, 97);
  }
  {
    // NCHW -> a row per position: a permutation, exact both ways.
    const Index c = 3, h = 2, w = 2;
    const FVec x = uniform(rng, static_cast<std::size_t>(batch * c * h * w), -1.0, 1.0);
    auto layer = make_tokens("tokens");
    Reference ref;
    ref.forward = [&](const std::vector<Vec>& a) {
      Vec y(a[0].size());
      for (Index b = 0; b < batch; ++b)
        for (Index ch = 0; ch < c; ++ch)
          for (Index p = 0; p < h * w; ++p) y[(b * h * w + p) * c + ch] = a[0][(b * c + ch) * h * w + p];
      return y;
    };
    ref.forward_bound = [](const std::vector<Vec>& a) { return Vec(a[0].size(), 0.0); };
    ref.grad_bound = [](std::size_t, const std::vector<Vec>& a, const Vec&, const Fd&) {
      return Vec(a[0].size(), 0.0);
    };
    check_layer("tokens", *layer, x, {batch, c, h, w}, {}, ref, 98);
  }
}

// Two GELU blocks of width 8 with 2 heads and an MLP of 16 (the ViT: 4x4 patches).
ModelSpec small_transformer(ModelKind kind) {
  ModelSpec spec;
  spec.kind = kind;
  spec.activation = Activation::gelu;
  spec.patch = 4;
  spec.depth = 2;
  spec.width = 8;
  spec.heads = 2;
  spec.mlp_width = 16;
  return spec;
}

TEST_CASE("ViT: backward gradients match finite differences of the binary32 loss", "[layers][transformer]") {
  check_model_gradients(small_transformer(ModelKind::vit), InputShape{1, 8, 8, 3}, 3, 1e-2f, 2026, 30);
}

TEST_CASE("GPT: backward gradients match finite differences of the binary32 loss", "[layers][transformer]") {
  // A context of 6 tokens from a vocabulary of 5, every position labelled.
  check_model_gradients(small_transformer(ModelKind::gpt), InputShape{1, 1, 6, 5}, 3, 1e-2f, 2027, 30, true);
}

TEST_CASE("GPT with a SwiGLU MLP: backward gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.activation = Activation::silu;
  spec.gated = true;
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-2f, 2029, 30, true);
}

TEST_CASE("GPT as LLaMA arranges it (RMSNorm, SwiGLU): gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.norm = NormKind::rms_norm;
  spec.activation = Activation::silu;
  spec.gated = true;
  // A step of 1e-3, not 1e-2: this model's loss is far from affine in a
  // norm's gamma (SiLU's curvature times RMSNorm's), and at 1e-2 the
  // central difference of one gamma was 4.6% off (truncation, which falls
  // as h^2). The layers are checked tightly one by one above.
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-3f, 2030, 30, true);
}

TEST_CASE("GPT with soft-capped attention and output logits: gradients match finite differences of the loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  // Caps near the logits' size, so that tanh bends them (a cap far above them would be the identity).
  spec.attention_softcap = 0.5;
  spec.logit_softcap = 0.3;
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-2f, 2031, 30, true);
}

// The model's logits for token ids x (rows: sample-major positions).
FVec model_logits(Fixture& f, Model& model, const FVec& x, const Shape& x_shape) {
  Tensor h = f.tensor(x, x_shape);
  auto& layers = model.layers();
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
    f.ctx.layer = i;
    h = layers[static_cast<std::size_t>(i)]->forward(f.ctx, h);
  }
  return f.host(h);
}

TEST_CASE("a causal GPT's logits at a position never depend on later tokens (rotary, soft caps, QK-LayerNorm)",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.positions = PositionKind::rotary;
  spec.attention_softcap = 0.5;
  spec.logit_softcap = 0.3;
  spec.qk_norm = true;
  const InputShape in{1, 1, 6, 5};
  Fixture f;
  Model model(spec, in, 77);
  for (Parameter* p : model.parameters()) f.set_parameter(*p, p->initial);
  const Shape x_shape{2, 1, 1, 6};
  const FVec x{0, 1, 2, 3, 4, 0, 4, 3, 2, 1, 0, 4};
  const FVec base = model_logits(f, model, x, x_shape);
  for (std::size_t changed = 0; changed < x.size(); ++changed) {
    FVec y = x;
    y[changed] = std::fmod(y[changed] + 1.0f, 5.0f);
    const FVec logits = model_logits(f, model, y, x_shape);
    const std::size_t sample_start = changed / 6 * 6;
    int earlier_differ = 0, later_differ = 0;
    for (std::size_t pos = 0; pos < x.size(); ++pos)
      for (std::size_t c = 0; c < 5; ++c) {
        const bool same = base[pos * 5 + c] == logits[pos * 5 + c];
        if (pos >= sample_start && pos < changed) earlier_differ += !same;
        if (pos == changed) later_differ += !same;
      }
    INFO("token " << changed << " changed");
    CHECK(earlier_differ == 0);  // the mask held through the cap and the rotation
    CHECK(later_differ > 0);     // and the change did reach its own position
  }
}

TEST_CASE("soft-capped causal attention keeps its mask: the first query attends to its own value alone",
          "[layers][transformer]") {
  Fixture f;
  const Index batch = 2, tokens = 4, heads = 2, head_dim = 3, width = heads * head_dim;
  Rng rng{43};
  const FVec x = uniform(rng, static_cast<std::size_t>(batch * tokens * 3 * width), -3.0, 3.0);
  auto layer = make_self_attention("attn", tokens, heads, true, 0.5f);
  const FVec y = f.host(layer->forward(f.ctx, f.tensor(x, {batch * tokens, 3 * width})));
  int differ = 0;
  for (Index b = 0; b < batch; ++b)
    for (Index c = 0; c < width; ++c)  // position 0 sees key 0 only: probability exactly 1, output = v_0
      differ += y[static_cast<std::size_t>(b * tokens * width + c)] !=
                x[static_cast<std::size_t>(b * tokens * 3 * width + 2 * width + c)];
  CHECK(differ == 0);
  // The mask (-inf) passes the attention's cap with a zero gradient (capped, it would be -cap: an unmasked
  // key); elsewhere an infinity becomes +-cap, as in PyTorch.
  CHECK(soft_cap(-INFINITY, 0.5f, true) == -INFINITY);
  CHECK(soft_cap_grad(-INFINITY, 1.0f, 0.5f) == 0.0f);
  CHECK(soft_cap(INFINITY, 0.5f, true) == 0.5f);
  CHECK(soft_cap(-INFINITY, 0.5f, false) == -0.5f);
}

TEST_CASE("Dropout keeps 1 - p of the elements scaled by 1/(1 - p), reuses its mask backward, and is the identity "
          "in evaluation", "[layers][transformer]") {
  Fixture f;
  constexpr double p = 0.25;
  const std::size_t n = std::size_t{1} << 20;
  const FVec ones(n, 1.0f);
  auto layer = make_dropout("drop", p);
  f.ctx.layer = 3;
  f.ctx.step = 7;
  const Tensor x = f.tensor(ones, {static_cast<Index>(n)});
  const FVec y = f.host(layer->forward(f.ctx, x));
  const FVec dx = f.host(layer->backward(f.ctx, x, true));
  std::size_t kept = 0, wrong_value = 0, rule_broken = 0;
  const DropoutMask mask = dropout_mask(f.ctx.stream(Site::dropout_mask), p);
  for (std::size_t i = 0; i < n; ++i) {
    kept += y[i] != 0.0f;
    wrong_value += y[i] != 0.0f && y[i] != static_cast<float>(1.0 / (1.0 - p));
    const bool keeps = random_draw(mask.key, mask.first_index + i) >= static_cast<std::uint32_t>(p * 0x1p32);
    rule_broken += keeps != (y[i] != 0.0f);
  }
  // Binomial(n, 1 - p): the kept fraction within 5 standard deviations (2.1e-3 at 2^20).
  const double fraction = static_cast<double>(kept) / static_cast<double>(n);
  CHECK(std::fabs(fraction - (1.0 - p)) < 5.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(n)));
  CHECK(wrong_value == 0);
  CHECK(rule_broken == 0);
  CHECK(dx == y);  // the same mask and scale on dy = 1
  // Dropped elements are multiplied by 0, as PyTorch's x * mask * scale: a NaN stays NaN (an overflowed
  // gradient is still found), a negative value gives -0.
  std::size_t dropped = 0, next = 1;
  while (y[dropped] != 0.0f) ++dropped;
  for (next = dropped + 1; y[next] != 0.0f;) ++next;
  FVec probe(n, -1.0f);
  probe[dropped] = std::numeric_limits<float>::quiet_NaN();
  const FVec out = f.host(layer->forward(f.ctx, f.tensor(probe, {static_cast<Index>(n)})));
  CHECK(std::isnan(out[dropped]));
  CHECK(out[next] == 0.0f);
  CHECK(std::signbit(out[next]));
  // Another step draws another mask: agreement near p^2 + (1 - p)^2 = 0.625, not 1.
  f.ctx.step = 8;
  const FVec y8 = f.host(layer->forward(f.ctx, x));
  std::size_t agree = 0;
  for (std::size_t i = 0; i < n; ++i) agree += (y8[i] != 0.0f) == (y[i] != 0.0f);
  CHECK(std::fabs(static_cast<double>(agree) / static_cast<double>(n) - 0.625) < 0.005);
  // Evaluation: the input itself.
  f.ctx.training = false;
  CHECK(f.host(layer->forward(f.ctx, x)) == ones);
}

// Binary64 central differences per op for the layers that the whole-model tests covered only through the
// binary32 loss (issue #20 section 1): dropout with its mask fixed, QK-LayerNorm, and token embeddings with a
// head tied to their table.

TEST_CASE("fp32_ops \"attention_logits\" keeps attention's logits in binary32 and changes nothing else",
          "[layers][transformer]") {
  // A policy that rounds only GEMM outputs, to E4M3 (coarse enough that rounded logits move the softmax):
  // with attention_logits in fp32_ops the layer's output is binary32 attention rounded once at its output.
  const Index tokens = 4, heads = 2, head_dim = 3, rows = 2 * tokens;
  Rng rng{103};
  const FVec x = uniform(rng, static_cast<std::size_t>(rows * 3 * heads * head_dim), -2.0, 2.0);
  const auto run = [&](const char* gemm_output, std::vector<std::string> fp32_ops, bool round_output_after) {
    Fixture f;
    f.policy.gemm_output = *parse_rounding_point(gemm_output, nullptr);
    f.policy.fp32_ops = std::move(fp32_ops);
    auto layer = make_self_attention("attn", tokens, heads, true);
    Tensor y = layer->forward(f.ctx, f.tensor(x, {rows, 3 * heads * head_dim}));
    if (round_output_after) f.ctx.round(y, *parse_rounding_point("e4m3", nullptr), std::nullopt, Site::output);
    return f.host(y);
  };
  const FVec kept = run("e4m3", {"attention_logits"}, false), rounded = run("e4m3", {}, false);
  const FVec binary32_then_rounded = run("binary32", {}, true);
  CHECK(bits_of(kept) == bits_of(binary32_then_rounded));
  CHECK(bits_of(kept) != bits_of(rounded));  // the logits' rounding did change the output
}

TEST_CASE("Self-attention counts its logits and probabilities as tensor kinds of their own", "[layers][transformer]") {
  // Under bf16-mixed the logits round to bfloat16 at gemm_output and the probabilities stay binary32 (fp32_ops
  // softmax). When train.attention_stats asks, every element is counted, the causal mask's -inf in the infinity
  // bin (infinite, not overflowed) and its probabilities in the zero bin; the fused path has no such tensors and
  // counts none, and without the switch nothing is counted (the layer's output still is).
  const Index batch = 2, tokens = 4, heads = 2, head_dim = 3, rows = batch * tokens;
  const std::uint64_t elements = batch * heads * tokens * tokens, masked = batch * heads * tokens * (tokens - 1) / 2;
  Rng rng{105};
  const FVec x = uniform(rng, static_cast<std::size_t>(rows * 3 * heads * head_dim), -2.0, 2.0);
  for (const Index tile : {Index{0}, Index{2}, Index{-1}}) {  // -1: unfused, train.attention_stats off
    INFO((tile > 0 ? "fused" : tile == 0 ? "unfused" : "unfused, not asked"));
    Fixture f("bf16-mixed");
    LayerStats stats(1);
    f.ctx.stats = &stats;
    f.ctx.layer = 0;
    f.ctx.attention_stats = tile >= 0;
    auto layer = make_self_attention("attn", tokens, heads, true, 0.0f, 0.0, std::max<Index>(tile, 0));
    layer->forward(f.ctx, f.tensor(x, {rows, 3 * heads * head_dim}));
    const TensorStats& logits = stats[0][static_cast<int>(TensorKind::attention_logits)];
    const TensorStats& probs = stats[0][static_cast<int>(TensorKind::attention_probs)];
    CHECK(stats[0][static_cast<int>(TensorKind::activations)][Counter::elements] == rows * heads * head_dim);
    if (tile != 0) {
      CHECK(logits[Counter::elements] == 0);
      CHECK(probs[Counter::elements] == 0);
      continue;
    }
    CHECK(logits[Counter::elements] == elements);
    CHECK(logits[Counter::infinite] == masked);
    CHECK(logits[Counter::overflow] == 0);
    CHECK(logits.histogram[Binades::infinity_bin] == masked);
    CHECK(logits[Counter::inexact] > 0);  // bfloat16 logits
    CHECK(probs[Counter::elements] == elements);
    CHECK(probs.histogram[Binades::zero_bin] == masked);
    CHECK(probs[Counter::inexact] == 0);  // binary32 probabilities
    std::uint64_t in_binades = 0;
    for (int bin = 0; bin < Binades::finite_bins; ++bin) in_binades += probs.histogram[static_cast<std::size_t>(bin)];
    CHECK(in_binades == elements - masked);
  }
}

TEST_CASE("The output soft cap counts its binary32 output as the layer's activations", "[layers][transformer]") {
  Fixture f("bf16-mixed");
  LayerStats stats(1);
  f.ctx.stats = &stats;
  auto layer = make_soft_cap("cap", 0.5f);
  const FVec x{-3.0f, -0.25f, 0.0f, 1e-3f, 2.0f, 40.0f};
  const FVec y = f.host(layer->forward(f.ctx, f.tensor(x, {2, 3})));
  const TensorStats& counted = stats[0][static_cast<int>(TensorKind::activations)];
  CHECK(counted[Counter::elements] == x.size());
  CHECK(counted[Counter::nonzero] == x.size() - 1);
  CHECK(counted[Counter::inexact] == 0);  // counted as it is, not rounded
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == soft_cap(x[i], 0.5f, false));
}

TEST_CASE("Dropout forward and backward match binary64 references under its mask", "[layers][transformer]") {
  constexpr double p = 0.3;
  const Shape shape{6, 7};
  Rng rng{97};
  const FVec x = uniform(rng, size_of(shape), -2.0, 2.0);
  auto layer = make_dropout("drop", p);
  // check_layer's context (Fixture's seed, layer 0, step 0) and that stream's mask: the mask is the given here
  // (its statistics and its reuse are the test above); the arithmetic around it is what is checked.
  Fixture g;
  g.ctx.layer = 0;
  const DropoutMask mask = dropout_mask(g.ctx.stream(Site::dropout_mask), p);
  Vec keep(x.size());
  std::size_t kept = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    keep[i] = random_draw(mask.key, mask.first_index + i) >= mask.threshold ? 1.0 : 0.0;
    kept += keep[i] != 0.0;
  }
  REQUIRE(kept > 0);
  REQUIRE(kept < x.size());  // kept and dropped elements both
  const double scale = 1.0 / (1.0 - p);
  Reference ref;
  ref.forward = [&](const std::vector<Vec>& a) {
    Vec y(a[0].size());
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = a[0][i] * keep[i] * scale;
    return y;
  };
  // One binary32 product by the binary32 scale (within u of 1 / (1 - p)): 2u |y| and u^2 terms; dropped
  // elements exactly 0.
  ref.forward_bound = [&](const std::vector<Vec>& a) { return scaled(abs_of(ref.forward(a)), 3.0 * u); };
  ref.grad_bound = [](std::size_t, const std::vector<Vec>&, const Vec&, const Fd& fd) {
    return scaled(fd.magnitude, 3.0 * u);
  };
  check_layer("dropout", *layer, x, shape, {}, ref, 98);
}

TEST_CASE("Gemma's embedding scale: forward and backward match binary64 references, and the model places it",
          "[layers][transformer]") {
  // sqrt(3072) rounded to bfloat16, as Gemma's reference code multiplies by it: 55.5.
  const float factor = 55.5f;
  const Shape shape{4, 6};
  Rng rng{96};
  const FVec x = uniform(rng, size_of(shape), -2.0, 2.0);
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.embedding_scale = factor;
  const std::vector<std::string> names = Model::stat_names(spec, InputShape{1, 1, 6, 5});
  REQUIRE(names.size() > 3);
  CHECK(names[0] == "embed");
  CHECK(names[1] == "embed_scale");  // before the learned positions
  CHECK(names[2] == "pos");
  auto layer = make_pointwise("embed_scale", {.op = MultiplyOp::Params{factor},
                                              .output = PointwiseOutput::elementwise,
                                              .per_step = {}});
  Reference ref;
  ref.forward = [&](const std::vector<Vec>& a) {
    Vec y(a[0].size());
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = a[0][i] * factor;
    return y;
  };
  // One binary32 product of binary32 values: within u |y|.
  ref.forward_bound = [&](const std::vector<Vec>& a) { return scaled(abs_of(ref.forward(a)), u); };
  ref.grad_bound = [](std::size_t, const std::vector<Vec>&, const Vec&, const Fd& fd) {
    return scaled(fd.magnitude, 2.0 * u);
  };
  check_layer("embed_scale", *layer, x, shape, {}, ref, 99);
}

TEST_CASE("GPT with Gemma's embedding scale: gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.embedding_scale = std::sqrt(8.0);
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-2f, 2036, 30, true);
}

TEST_CASE("Gemma 2's post-branch norms: the model places them, and gradients match finite differences of the loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.post_norm = true;
  spec.dropout = 0.1;
  const std::vector<std::string> names = Model::stat_names(spec, InputShape{1, 1, 6, 5});
  const auto index_of = [&](const std::string& name) {
    const auto it = std::find(names.begin(), names.end(), name);
    REQUIRE(it != names.end());
    return it - names.begin();
  };
  // Each branch's norm after its last Linear and before its dropout and residual sum.
  CHECK(index_of("block1.ln1_post") == index_of("block1.proj") + 1);
  CHECK(index_of("block1.drop1") == index_of("block1.ln1_post") + 1);
  CHECK(index_of("block2.ln2_post") == index_of("block2.fc2") + 1);
  CHECK(index_of("block2.drop2") == index_of("block2.ln2_post") + 1);
  spec.dropout = 0.0;
  // Gemma 2 arranges it with RMSNorm; the ViT with LayerNorm (gamma and beta). A step of 1e-3 as for LLaMA's
  // arrangement above (RMSNorm's curvature in gamma).
  spec.norm = NormKind::rms_norm;
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-3f, 2037, 30, true);
  ModelSpec vit = small_transformer(ModelKind::vit);
  vit.post_norm = true;
  check_model_gradients(vit, InputShape{1, 8, 8, 3}, 3, 1e-2f, 2038, 30);
}

// A zero-centred gamma (model.zero_centered_gamma) scales by 1 + gamma in
// binary32 and nothing else changes: the norm with parameter g computes, bit
// for bit, the plain norm whose gamma is the binary32 sum 1 + g, forward and
// backward, with binary64 statistics and with bfloat16 ones; the parameters'
// gradients too (d(1 + g)/dg = 1). The plain norms are checked against
// binary64 references above.
TEST_CASE("zero-centred gamma: a norm with parameter g computes the plain norm with gamma = 1 + g, bit for bit",
          "[layers][transformer]") {
  const Index tokens = 3, heads = 2, head_dim = 4, width = heads * head_dim, rows = 2 * tokens;
  Rng rng{2039};
  const FVec x = uniform(rng, static_cast<std::size_t>(rows * 3 * width), -1.5, 2.5);
  const FVec dy = uniform(rng, x.size(), -1.0, 1.0);
  struct Case {
    const char* name;
    std::function<std::unique_ptr<Layer>(bool zero_centered)> make;
    Shape shape;
  };
  const std::vector<Case> cases{
      {"LayerNorm", [&](bool z) { return make_layer_norm("ln", 3 * width, 1e-5f, z); }, {rows, 3 * width}},
      {"RMSNorm", [&](bool z) { return make_rms_norm("rms", 3 * width, 1e-5f, z); }, {rows, 3 * width}},
      {"QK-LayerNorm", [&](bool z) { return make_qk_norm("qkn", tokens, heads, head_dim, 1e-5f, z); },
       {rows, 3 * width}},
  };
  for (const bool low : {false, true})
    for (const Case& c : cases) {
      DYNAMIC_SECTION(c.name << (low ? ", bfloat16 statistics" : ", binary64 statistics")) {
        struct Out {
          FVec y, dx, dgamma, dbeta;
        };
        const auto run = [&](bool zero_centered, const FVec& gamma, const FVec& beta) {
          Fixture f;
          if (low) f.policy.norm_statistics = RoundingPoint{mpsim::formats::bfloat16};
          std::unique_ptr<Layer> layer = c.make(zero_centered);
          const std::vector<Parameter*> params = layer->parameters();
          f.set_parameter(*params[0], gamma);
          if (params.size() > 1) f.set_parameter(*params[1], beta);
          Out out;
          out.y = f.host(layer->forward(f.ctx, f.tensor(x, c.shape)));
          out.dx = f.host(layer->backward(f.ctx, f.tensor(dy, c.shape), true));
          out.dgamma = f.host(params[0]->grad);
          if (params.size() > 1) out.dbeta = f.host(params[1]->grad);
          return out;
        };
        const std::size_t n = size_of(c.make(false)->parameters()[0]->shape);
        // Offsets from 1 as a trained zero-centred gamma holds them, some below bfloat16's spacing at 1.
        FVec g = uniform(rng, n, -0.3, 0.3);
        g[0] = 0.0f, g[1] = 0x1p-10f, g[2] = -0.0f;
        const FVec beta = uniform(rng, n, -1.0, 1.0);
        FVec one_plus_g(n);
        for (std::size_t i = 0; i < n; ++i) one_plus_g[i] = 1.0f + g[i];
        const Out centred = run(true, g, beta), plain = run(false, one_plus_g, beta);
        CHECK(bits_of(centred.y) == bits_of(plain.y));
        CHECK(bits_of(centred.dx) == bits_of(plain.dx));
        CHECK(bits_of(centred.dgamma) == bits_of(plain.dgamma));
        CHECK(bits_of(centred.dbeta) == bits_of(plain.dbeta));
        // And it is not the plain norm with gamma = g.
        CHECK(bits_of(run(false, g, beta).y) != bits_of(centred.y));
      }
    }
}

TEST_CASE("zero-centred gamma: gammas start at 0, and a GPT's gradients match finite differences of the loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.zero_centered_gamma = true;
  spec.qk_norm = true;
  spec.post_norm = true;
  Model model(spec, InputShape{1, 1, 6, 5}, 7);
  std::size_t gammas = 0;
  for (const Parameter* p : model.parameters())
    if (p->shape.size() == 1 && !p->name.ends_with(".bias")) {
      ++gammas;
      CHECK(std::all_of(p->initial.begin(), p->initial.end(), [](float v) { return v == 0.0f && !std::signbit(v); }));
    }
  CHECK(gammas == 2 * 5 + 1);  // per block ln1, ln2, qk_norm, ln1_post, ln2_post; the final ln
  // A step of 1e-3: with a norm after each branch the loss curves more in the inputs' positions (at 1e-2 the
  // central difference of one position entry was 3.4% off, truncation, which falls as h^2).
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-3f, 2040, 30, true);
}

TEST_CASE("QK-LayerNorm forward and backward match binary64 references", "[layers][transformer]") {
  const Index batch = 2, tokens = 3, heads = 2, head_dim = 5, width = heads * head_dim, rows = batch * tokens;
  const double eps = static_cast<double>(1e-5f);
  Rng rng{99};
  auto layer = make_qk_norm("qkn", tokens, heads, head_dim);
  const FVec x = uniform(rng, static_cast<std::size_t>(rows * 3 * width), -1.5, 2.5);
  const FVec gamma = away_from_zero(rng, static_cast<std::size_t>(2 * head_dim), 0.3, 1.7);
  const FVec beta = uniform(rng, static_cast<std::size_t>(2 * head_dim), -1.0, 1.0);
  // Segment (r, part, h), part 0 for q and 1 for k: the head_dim values of row r at part * width + h * head_dim,
  // normalised with the parameters at part * head_dim; v (part 2) passes unchanged.
  const auto at = [=](Index r, Index part, Index h, Index c) {
    return static_cast<std::size_t>(r * 3 * width + part * width + h * head_dim + c);
  };
  const auto segment_stats = [=](const Vec& a0, Index r, Index part, Index h) {
    Vec seg(static_cast<std::size_t>(head_dim));
    for (Index c = 0; c < head_dim; ++c) seg[static_cast<std::size_t>(c)] = a0[at(r, part, h, c)];
    const LnStats st = ln_stats(seg, 1, head_dim, eps);
    return std::pair<double, double>{st.mean[0], st.rstd[0]};
  };
  // fn(i, j, mean, rstd) for every element i of every q and k segment, j its parameter index.
  const auto each_normalised = [=](const Vec& a0, const auto& fn) {
    for (Index r = 0; r < rows; ++r)
      for (Index part = 0; part < 2; ++part)
        for (Index h = 0; h < heads; ++h) {
          const auto [m, rs] = segment_stats(a0, r, part, h);
          for (Index c = 0; c < head_dim; ++c) fn(at(r, part, h, c), static_cast<std::size_t>(part * head_dim + c), m, rs);
        }
  };
  Reference ref;
  ref.forward = [=](const std::vector<Vec>& a) {
    Vec y = a[0];
    each_normalised(a[0], [&](std::size_t i, std::size_t j, double m, double rs) {
      y[i] = (a[0][i] - m) * rs * a[1][j] + a[2][j];
    });
    return y;
  };
  // LayerNorm's bounds (the test above) per segment; v is copied: exact.
  ref.forward_bound = [=](const std::vector<Vec>& a) {
    Vec b(a[0].size(), 0.0);
    each_normalised(a[0], [&](std::size_t i, std::size_t j, double m, double rs) {
      b[i] = 8.0 * u * (rs * std::fabs(a[1][j]) * (std::fabs(a[0][i] - m) + std::fabs(m)) + std::fabs(a[2][j]));
    });
    return b;
  };
  // dx: LayerNorm's 16u S_j per segment, v's gradient copied (exact); dgamma and dbeta sum over every row and
  // head in binary32 (rows x heads terms).
  ref.grad_bound = [=](std::size_t which, const std::vector<Vec>& a, const Vec& dy, const Fd&) {
    Vec b(which == 0 ? a[0].size() : static_cast<std::size_t>(2 * head_dim), 0.0);
    const double terms = static_cast<double>(rows * heads);
    for (Index r = 0; r < rows; ++r)
      for (Index part = 0; part < 2; ++part)
        for (Index h = 0; h < heads; ++h) {
          const auto [m, rs] = segment_stats(a[0], r, part, h);
          double c1 = 0.0, c2 = 0.0;
          for (Index c = 0; c < head_dim; ++c) {
            const std::size_t i = at(r, part, h, c), j = static_cast<std::size_t>(part * head_dim + c);
            const double dxhat = std::fabs(dy[i] * a[1][j]);
            c1 += dxhat / static_cast<double>(head_dim);
            c2 += dxhat * std::fabs((a[0][i] - m) * rs) / static_cast<double>(head_dim);
          }
          const double rm = rs * std::fabs(m);
          for (Index c = 0; c < head_dim; ++c) {
            const std::size_t i = at(r, part, h, c), j = static_cast<std::size_t>(part * head_dim + c);
            const double d = std::fabs(dy[i]), xh = std::fabs((a[0][i] - m) * rs);
            if (which == 0)
              b[i] = 16.0 * u * rs * (d * std::fabs(a[1][j]) + c1 + xh * c2 + rm * (c2 + xh * c1));
            else if (which == 1)
              b[j] += 2.0 * (terms + 4.0) * u * d * (xh + rm);
            else
              b[j] += 2.0 * (terms + 2.0) * u * d;
          }
        }
    return b;
  };
  check_layer("qk norm", *layer, x, {rows, 3 * width}, {gamma, beta}, ref, 100);
}

TEST_CASE("Token embeddings and a head tied to their table: logits and the table's gradient match binary64 "
          "central differences", "[layers][transformer]") {
  // logits[t][v] = sum_c T[id_t][c] T[v][c] + b[v]: the table T enters twice, as the embedding's rows and as the
  // head's weight; its gradient is the head's part plus the embedding's scatter of the head's input gradient.
  const Index vocabulary = 7, width = 5, tokens = 9;
  Rng rng{101};
  const FVec table = uniform(rng, static_cast<std::size_t>(vocabulary * width), -1.0, 1.0);
  const FVec bias = uniform(rng, static_cast<std::size_t>(vocabulary), -0.5, 0.5);
  FVec ids(static_cast<std::size_t>(tokens));
  for (Index t = 0; t < tokens; ++t) ids[static_cast<std::size_t>(t)] = static_cast<float>((t * 3) % (vocabulary - 1));
  // (repeated ids; the last row is named by no token: only the head's part reaches it)
  const auto tie = std::make_shared<TiedTable>();
  auto embedding = make_embedding("embed", vocabulary, width, tie);
  auto head = make_tied_linear("head", width, vocabulary, tie);
  Fixture f;
  f.set_parameter(*embedding->parameters().at(0), table);
  f.set_parameter(*head->parameters().at(0), bias);
  f.ctx.layer = 0;
  const Tensor e = embedding->forward(f.ctx, f.tensor(ids, {tokens}));
  f.ctx.layer = 1;
  const FVec logits = f.host(head->forward(f.ctx, e));
  const FVec r = uniform(rng, logits.size(), -1.0, 1.0);
  const Tensor de = head->backward(f.ctx, f.tensor(r, {tokens, vocabulary}), true);
  f.ctx.layer = 0;
  embedding->backward(f.ctx, de, false);
  const FVec dtable = f.host(embedding->parameters().at(0)->grad), dbias = f.host(head->parameters().at(0)->grad);

  const RefForward forward = [&](const std::vector<Vec>& a) {  // a[0] the table, a[1] the bias
    Vec y(static_cast<std::size_t>(tokens * vocabulary));
    for (Index t = 0; t < tokens; ++t)
      for (Index v = 0; v < vocabulary; ++v) {
        const auto row = static_cast<Index>(ids[static_cast<std::size_t>(t)]);
        double sum = a[1][static_cast<std::size_t>(v)];
        for (Index c = 0; c < width; ++c) sum += a[0][row * width + c] * a[0][v * width + c];
        y[t * vocabulary + v] = sum;
      }
    return y;
  };
  const std::vector<Vec> args{widen(table), widen(bias)};
  const Vec want = forward(args);
  // A binary32 dot of width products plus the bias: 2 (width + 2) u (sum |e||T| + |b|).
  Vec forward_bound(want.size());
  for (Index t = 0; t < tokens; ++t)
    for (Index v = 0; v < vocabulary; ++v) {
      const auto row = static_cast<Index>(ids[static_cast<std::size_t>(t)]);
      double m = std::fabs(args[1][static_cast<std::size_t>(v)]);
      for (Index c = 0; c < width; ++c) m += std::fabs(args[0][row * width + c] * args[0][v * width + c]);
      forward_bound[static_cast<std::size_t>(t * vocabulary + v)] = 2.0 * (width + 2) * u * m;
    }
  expect_close("tied logits", logits, want, forward_bound);
  // The table's gradient: the head's sum over tokens, the input gradient's sum over the vocabulary, its scatter
  // over the tokens of a row and the final add: at most tokens + vocabulary + 2 terms in a chain, against the
  // magnitudes M_i of the differences (GEMM-like, dot_bound's rule). The bias: a sum over tokens.
  const Vec rd = widen(r);
  for (std::size_t which : {std::size_t{0}, std::size_t{1}}) {
    const Fd fd = finite_differences(forward, args, which, rd);
    Vec bound = scaled(fd.magnitude, 2.0 * static_cast<double>(tokens + vocabulary + 4) * u);
    for (std::size_t i = 0; i < bound.size(); ++i) bound[i] += fd.floor[i];
    expect_close(which == 0 ? "tied table gradient" : "head bias gradient", which == 0 ? dtable : dbias, fd.grad,
                 bound);
  }
  // The row no token names gets the head's part alone, which is not zero.
  CHECK(std::any_of(dtable.end() - width, dtable.end(), [](float g) { return g != 0.0f; }));
}

TEST_CASE("GPT with dropout and attention dropout: gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  // The masks depend on (seed, layer, step) only, so every evaluation of the difference quotient drops the same
  // elements: the loss is a smooth function of the parameters for a fixed step. A step of 1e-3: at 1e-2 one
  // LayerNorm bias's difference quotient was 0.9% off (truncation: it passes at 1e-3; ignoring the mask in the
  // backward fails 21 of the checks).
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.dropout = 0.2;
  spec.attention_dropout = 0.2;
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-3f, 2033, 30, true);
}

TEST_CASE("GPT with fused attention and attention dropout: gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  // The fused path's dropout (FlashAttention-2's, inside the kernel) and its backward (dV from dropout(p), dp
  // masked): ignoring the mask in the backward, or dropping other elements there than forward, fails this.
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.attention_dropout = 0.3;
  spec.fused_attention = true;
  spec.attention_tile = 4;  // two tiles of keys for the 6-token context
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-3f, 2035, 30, true);
}

TEST_CASE("Fused attention with dropout drops the unfused path's elements: outputs and gradients agree in binary32",
          "[layers][transformer]") {
  // The same layer name, step and seed give the same counter-based mask to both paths. At FP32 the two differ
  // only by the online softmax's order of operations (within 1e-5 of the output's scale here), while a mask
  // that differed in one element would move an output by about a probability times |v| (0.05 or more here).
  const Index batch = 2, tokens = 9, heads = 2, dim = 4;
  Rng rng{90};
  const Shape shape{batch * tokens, 3 * heads * dim};
  const FVec x = uniform(rng, size_of(shape), -1.0, 1.0);
  const FVec dy = uniform(rng, static_cast<std::size_t>(batch * tokens * heads * dim), -1.0, 1.0);
  const auto run = [&](Index tile, double dropout) {
    Fixture f;
    f.ctx.layer = 2;
    f.ctx.step = 5;
    auto layer = make_self_attention("attn", tokens, heads, true, 0.0f, dropout, tile);
    const FVec y = f.host(layer->forward(f.ctx, f.tensor(x, shape)));
    const FVec dx = f.host(layer->backward(f.ctx, f.tensor(dy, {batch * tokens, heads * dim}), true));
    return std::pair{y, dx};
  };
  const auto [y_unfused, dx_unfused] = run(0, 0.3);
  const auto [y_fused, dx_fused] = run(4, 0.3);
  const auto [y_plain, dx_plain] = run(4, 0.0);
  const auto largest_difference = [](const FVec& a, const FVec& b) {
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    return worst;
  };
  CHECK(largest_difference(y_fused, y_unfused) < 1e-5);
  CHECK(largest_difference(dx_fused, dx_unfused) < 1e-5);
  // Dropout does something: without it the outputs move by far more than the paths' difference.
  CHECK(largest_difference(y_fused, y_plain) > 0.05);
  CHECK(largest_difference(dx_fused, dx_plain) > 0.05);
}

TEST_CASE("GPT with a head tied to the token table: gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.tie_embeddings = true;
  Model model(spec, InputShape{1, 1, 6, 5}, 1);
  std::vector<std::string> names;
  for (Parameter* p : model.parameters()) names.push_back(p->name);
  CHECK(std::count(names.begin(), names.end(), "embed.weight") == 1);  // one parameter, not two
  CHECK(std::count(names.begin(), names.end(), "head.weight") == 0);
  CHECK(std::count(names.begin(), names.end(), "head.bias") == 1);
  // The table's difference quotient moves both of its uses: it checks the sum of the two gradient parts.
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-2f, 2034, 30, true);
}

TEST_CASE("GPT with rotary positions: backward gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.positions = PositionKind::rotary;
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-2f, 2032, 30, true);
}

TEST_CASE("Rotary embeddings forward and backward match binary64 references", "[layers][transformer]") {
  Rng rng{41};
  const Index batch = 2, tokens = 5, heads = 2, head_dim = 6, half = head_dim / 2, width = heads * head_dim;
  constexpr double base = 10000.0;
  const FVec x = uniform(rng, static_cast<std::size_t>(batch * tokens * 3 * width), -2.0, 2.0);
  auto layer = make_rotary("rope", tokens, heads, head_dim, base);
  // The rotation of each (c, c + half) pair of q and k at the row's position, v unchanged, in binary64.
  const auto rotate = [&](const Vec& v, double sign) {
    Vec y = v;
    for (Index r = 0; r < batch * tokens; ++r)
      for (Index part = 0; part < 2; ++part)
        for (Index h = 0; h < heads; ++h)
          for (Index c = 0; c < half; ++c) {
            const double theta = static_cast<double>(r % tokens) * std::pow(base, -2.0 * c / head_dim);
            const std::size_t at = static_cast<std::size_t>(r * 3 * width + part * width + h * head_dim + c),
                              partner = at + static_cast<std::size_t>(half);
            y[at] = v[at] * std::cos(theta) - sign * v[partner] * std::sin(theta);
            y[partner] = v[partner] * std::cos(theta) + sign * v[at] * std::sin(theta);
          }
    return y;
  };
  Reference ref;
  ref.forward = [&](const std::vector<Vec>& a) { return rotate(a[0], 1.0); };
  // cos and sin each rounded once (u), two products and a sum (3u): within 4u (|x_c| + |x_partner|) + u.
  ref.forward_bound = [&](const std::vector<Vec>& a) {
    Vec b(a[0].size());
    for (std::size_t i = 0; i < b.size(); ++i) {
      const std::size_t in_head = i % static_cast<std::size_t>(head_dim), partner =
          in_head < static_cast<std::size_t>(half) ? i + static_cast<std::size_t>(half) : i - static_cast<std::size_t>(half);
      b[i] = 4.0 * u * (std::fabs(a[0][i]) + std::fabs(a[0][partner]));
    }
    return b;
  };
  ref.grad_bound = [&](std::size_t, const std::vector<Vec>& a, const Vec& r, const Fd&) {
    Vec b(a[0].size());
    for (std::size_t i = 0; i < b.size(); ++i) {
      const std::size_t in_head = i % static_cast<std::size_t>(head_dim), partner =
          in_head < static_cast<std::size_t>(half) ? i + static_cast<std::size_t>(half) : i - static_cast<std::size_t>(half);
      b[i] = 4.0 * u * (std::fabs(r[i]) + std::fabs(r[partner]));
    }
    return b;
  };
  check_layer("rotary", *layer, x, {batch * tokens, 3 * width}, {}, ref, 42);
}

TEST_CASE("GPT with QK-LayerNorm: backward gradients match finite differences of the binary32 loss",
          "[layers][transformer]") {
  ModelSpec spec = small_transformer(ModelKind::gpt);
  spec.qk_norm = true;
  check_model_gradients(spec, InputShape{1, 1, 6, 5}, 3, 1e-2f, 2028, 30, true);
}

}  // namespace
