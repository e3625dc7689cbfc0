// Backend's checked interface: every public call validates its tensors
// (not empty, on this backend's device, binary32, shapes that fit) and asks
// supports(op) before the implementation runs; what does not fit is a
// BackendError naming the backend, the call and the problem, never a
// silent misread or fallback.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "support/forwarding_backend.hpp"

using namespace mpsim;
using namespace mpsim::core;
using Catch::Matchers::Contains;

namespace {

// A CPU backend that says it cannot run GELU, and counts the GELU calls that
// reach its implementation.
class NoGelu final : public test::ForwardingBackend {
 public:
  NoGelu() : ForwardingBackend(make_cpu_backend()) {}
  bool supports_pointwise(std::size_t entry) const override {
    return entry != static_cast<std::size_t>(Activation::gelu);
  }
  int gelu_calls = 0;

 protected:
  void pointwise_forward_impl(const PointwiseCall& op, const Tensor& x, Tensor& y) override {
    gelu_calls += op.index() == static_cast<std::size_t>(Activation::gelu);
    ForwardingBackend::pointwise_forward_impl(op, x, y);
  }
};

// A CPU backend that refuses what the CUDA backend may refuse: an optimiser,
// a block-scaled GEMM and a row-wise entry.
class Refusing final : public test::ForwardingBackend {
 public:
  Refusing() : ForwardingBackend(make_cpu_backend()) {}
  bool supports_row(std::size_t) const override { return false; }
  std::string block_gemm_refusal(const BlockPoint&, const BlockPoint&, const std::optional<TensorCoreModel>&,
                                 int) const override {
    return "no block GEMM here";
  }
  std::string optimizer_refusal(const OptimizerParams&) const override { return "no optimiser here"; }
};

// A tensor that claims to live on a CUDA device (its buffer is host memory
// that must never be read as such).
Tensor on_cuda(const Shape& shape) {
  return Tensor(shape, std::shared_ptr<void>(new float[static_cast<std::size_t>(element_count(shape))],
                                             [](void* p) { delete[] static_cast<float*>(p); }),
                Device::cuda);
}

}  // namespace

TEST_CASE("names: ops, devices and element types have one table each", "[backend]") {
  CHECK(to_string(Op::gemm) == "gemm");
  CHECK(to_string(Op::training_step) == "training_step");
  CHECK(op_names.parse("row") == Op::row);
  CHECK_FALSE(op_names.parse("conv").has_value());
  CHECK(to_string(Device::cuda) == "cuda");
  CHECK(to_string(ElementType::binary32) == "binary32");
  CHECK(optimizer_kind_names.list() == "sgd, adam or adamw");
}

TEST_CASE("a tensor knows its device and element type, and keeps them when reshaped", "[backend]") {
  auto cpu = make_cpu_backend();
  const Tensor t = cpu->zeros({2, 3});
  CHECK(cpu->device() == Device::host);
  CHECK(t.device() == Device::host);
  CHECK(t.element_type() == ElementType::binary32);
  const Tensor c = on_cuda({6});
  CHECK(c.reshaped({2, 3}).device() == Device::cuda);
}

TEST_CASE("a tensor of another device is refused before any work", "[backend]") {
  auto cpu = make_cpu_backend();
  Tensor y = cpu->zeros({6});
  const Tensor x = on_cuda({6});
  std::vector<float> host(6);
  CHECK_THROWS_WITH(cpu->to_host(x, host), Contains("backend \"cpu\", to_host: t lives on cuda, this backend on host"));
  CHECK_THROWS_AS(cpu->activation_forward(Activation::relu, x, y), BackendError);
  CHECK_THROWS_WITH(cpu->copy(y, const_cast<Tensor&>(x)), Contains("to lives on cuda"));
}

TEST_CASE("shapes that do not fit are refused, naming the call", "[backend]") {
  auto cpu = make_cpu_backend();
  Tensor a = cpu->zeros({4, 3}), b = cpu->zeros({5, 2}), c = cpu->zeros({4, 2});
  CHECK_THROWS_WITH(cpu->gemm(a, false, b, false, c, {}, {}),
                    Contains("gemm: op(a) is 4x3, op(b) 5x2, c [4, 2]"));
  Tensor b_ok = cpu->zeros({3, 2});
  CHECK_NOTHROW(cpu->gemm(a, false, b_ok, false, c, {}, {}));
  Tensor c_wrong = cpu->zeros({2, 4});
  CHECK_THROWS_AS(cpu->gemm(a, false, b_ok, false, c_wrong, {}, {}), BackendError);
  // Transposes change which extents must agree.
  Tensor at = cpu->zeros({3, 4});
  CHECK_NOTHROW(cpu->gemm(at, true, b_ok, false, c, {}, {}));

  Tensor x = cpu->zeros({4, 3}), y = cpu->zeros({4, 2});
  CHECK_THROWS_WITH(cpu->activation_forward(Activation::relu, x, y),
                    Contains("activation_forward: x and y differ in size"));
  Tensor row = cpu->zeros({2});
  CHECK_THROWS_WITH(cpu->add_row_vector(x, row), Contains("add_row_vector: row of 2 for x of shape [4, 3]"));
  std::vector<float> five(5);
  CHECK_THROWS_WITH(cpu->from_host(five, {2, 3}), Contains("from_host: 5 values for shape [2, 3]"));
  CHECK_THROWS_WITH(cpu->zeros({2, -1}), Contains("negative extent"));
  Tensor logits = cpu->zeros({4, 10}), labels = cpu->zeros({3}), d = cpu->zeros({4, 10});
  CHECK_THROWS_WITH(cpu->softmax_cross_entropy(logits, labels, 1.0f, d), Contains("one label per row"));
  Tensor none;
  CHECK_THROWS_WITH(cpu->scale(none, 2.0f), Contains("scale: x is an empty tensor"));

  // The transformer ops check their tensors against the attention shape.
  AttentionShape s;
  s.batch = 2;
  s.tokens = 3;
  s.heads = 2;
  s.head_dim = 4;
  Tensor qkv = cpu->zeros({6, 24}), scores = cpu->zeros({12, 3}), out = cpu->zeros({6, 8});
  CHECK_NOTHROW(cpu->attention_scores(qkv, s, scores));
  Tensor short_scores = cpu->zeros({12, 2});
  CHECK_THROWS_WITH(cpu->attention_scores(qkv, s, short_scores),
                    Contains("attention_scores: scores of shape [12, 2] where scores [12, 3] fits"));
  Tensor wide_qkv = cpu->zeros({6, 25});
  CHECK_THROWS_WITH(cpu->attention_values(scores, wide_qkv, s, out), Contains("qkv of shape [6, 25]"));
  AttentionShape no_heads = s;
  no_heads.heads = 0;
  CHECK_THROWS_WITH(cpu->attention_scores(qkv, no_heads, scores), Contains("heads and head_dim must be positive"));
  CHECK_THROWS_WITH(cpu->add(out, scores), Contains("add: x and y differ in size"));
  Tensor means = cpu->zeros({3, 8});
  CHECK_THROWS_WITH(cpu->sequence_mean_forward(out, 3, means), Contains("sequence_mean_forward: x [6, 8]"));
}

TEST_CASE("the optimiser step checks its state for the optimiser it runs", "[backend]") {
  auto cpu = make_cpu_backend();
  cpu->start_steps({}, {});
  Tensor w = cpu->zeros({8}), g = cpu->zeros({8}), u = cpu->zeros({8}), m = cpu->zeros({8}), none;
  OptimizerParams adam;
  adam.kind = OptimizerKind::adam;
  CHECK_THROWS_WITH(cpu->optimizer_step(adam, w, g, m, none, u, {}, {}, nullptr), Contains("state2 (v)"));
  OptimizerParams plain_sgd;
  plain_sgd.momentum = 0.0f;
  Tensor g_short = cpu->zeros({7});
  CHECK_THROWS_WITH(cpu->optimizer_step(plain_sgd, w, g_short, none, none, u, {}, {}, nullptr),
                    Contains("weight, grad and update differ in size"));
}

TEST_CASE("an unsupported op is reported, never run or replaced", "[backend]") {
  NoGelu backend;
  Tensor x = backend.zeros({4}), y = backend.zeros({4});
  CHECK_THROWS_WITH(backend.activation_forward(Activation::gelu, x, y),
                    Contains("backend \"cpu\" does not support gelu (called as activation_forward)"));
  CHECK(backend.gelu_calls == 0);
  CHECK_NOTHROW(backend.activation_forward(Activation::relu, x, y));
}

TEST_CASE("the tests' forwarding backend passes on every refusal of the backend it wraps", "[backend]") {
  // Tests wrap the CUDA backend in ForwardingBackend; a refusal the wrapper
  // dropped would let a run start that the wrapped backend cannot do.
  test::ForwardingBackend no_gelu(std::make_unique<NoGelu>());
  CHECK_FALSE(no_gelu.supports_pointwise(static_cast<std::size_t>(Activation::gelu)));
  CHECK(no_gelu.supports_pointwise(static_cast<std::size_t>(Activation::relu)));
  test::ForwardingBackend refusing(std::make_unique<Refusing>());
  CHECK_FALSE(refusing.supports_row(0));
  CHECK(refusing.block_gemm_refusal({}, {}, std::nullopt, 0) == "no block GEMM here");
  CHECK(refusing.optimizer_refusal({}) == "no optimiser here");
  Tensor x = refusing.zeros({4}), y = refusing.zeros({4});
  CHECK_THROWS_WITH(no_gelu.activation_forward(Activation::gelu, x, y), Contains("does not support gelu"));
}

TEST_CASE("the element-wise and row-wise tables' generic calls are checked at the door", "[backend]") {
  auto cpu = make_cpu_backend();
  Tensor x = cpu->zeros({4, 6}), y = cpu->zeros({4, 6}), none;
  // Element-wise: an entry's own refusal, its saved tensor, sizes.
  CHECK_THROWS_WITH(cpu->pointwise_forward(soft_cap_call(0.0f, false), x, y),
                    Contains("pointwise_forward: the cap must be finite and > 0"));
  CHECK_THROWS_WITH(cpu->pointwise_forward(MultiplyOp::Params{INFINITY}, x, y),
                    Contains("the factor must be finite and > 0"));
  CHECK_THROWS_WITH(cpu->pointwise_backward(activation_call(Activation::gelu), none, x, y),
                    Contains("pointwise_backward: x is an empty tensor"));  // GELU saves its input
  CHECK_NOTHROW(cpu->pointwise_backward(MultiplyOp::Params{2.0f}, none, x, y));  // saves nothing
  Tensor short_y = cpu->zeros({5});
  CHECK_THROWS_WITH(cpu->pointwise_forward(MultiplyOp::Params{2.0f}, x, short_y), Contains("differ in size"));
  // Row-wise: the tensors an entry needs with its parameters, and no others; sizes from the layout.
  const RowLayout rows = RowLayout::rows(4, 6);
  Tensor gamma = cpu->zeros({6}), beta = cpu->zeros({6}), mean = cpu->zeros({4}), rstd = cpu->zeros({4});
  const RowCall layer_norm = norm_call(1e-5f, true, {}), rms_norm = norm_call(1e-5f, false, {});
  CHECK_NOTHROW(cpu->row_forward(layer_norm, rows, x, y, {{&gamma, &beta}, {&mean, &rstd}, {}}));
  CHECK_THROWS_WITH(cpu->row_forward(layer_norm, rows, x, y, {{&gamma, nullptr}, {&mean, &rstd}, {}}),
                    Contains("beta is missing"));
  CHECK_THROWS_WITH(cpu->row_forward(rms_norm, rows, x, y, {{&gamma, &beta}, {nullptr, &rstd}, {}}),
                    Contains("beta is not used by norm here"));
  Tensor wide_gamma = cpu->zeros({7});
  CHECK_THROWS_WITH(cpu->row_forward(rms_norm, rows, x, y, {{&wide_gamma, nullptr}, {nullptr, &rstd}, {}}),
                    Contains("gamma needs 6 values"));
  CHECK_THROWS_WITH(cpu->row_forward(rms_norm, RowLayout::rows(3, 6), x, y, {{&gamma, nullptr}, {nullptr, &rstd}, {}}),
                    Contains("need 18 values"));
  RowLayout overlapping = rows;
  overlapping.group_stride = 5;  // a segment of 6 values in groups of 5
  CHECK_THROWS_WITH(cpu->row_forward(rms_norm, overlapping, x, y, {{&gamma, nullptr}, {nullptr, &rstd}, {}}),
                    Contains("layout does not fit"));
  Tensor dgamma = cpu->zeros({6});
  CHECK_THROWS_WITH(cpu->row_backward(rms_norm, rows, x, x, y, {{&gamma, nullptr}, {nullptr, &rstd}, {}}),
                    Contains("dgamma is missing"));
  CHECK_NOTHROW(cpu->row_backward(rms_norm, rows, x, x, y, {{&gamma, nullptr}, {nullptr, &rstd}, {&dgamma, nullptr}}));
}

TEST_CASE("max_abs_finite: the largest finite magnitude, infinities and NaN ignored", "[backend]") {
  auto b = make_cpu_backend();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float largest = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
  const auto max_of = [&](std::vector<float> v) {
    return b->max_abs_finite(b->from_host(v, {static_cast<std::int64_t>(v.size())}));
  };
  CHECK(max_of({-inf, 1.5f, -2.25f, nan, inf}) == 2.25f);  // a masked row: -inf does not count
  CHECK(max_of({-largest, 3.0f}) == largest);
  CHECK(max_of({tiny, -0.0f}) == tiny);
  CHECK(max_of({-inf, -inf, nan}) == 0.0f);  // nothing finite
  CHECK(std::signbit(max_of({-0.0f})) == false);
}
