// The bits of every element-wise and row-wise layer op of the CPU backend,
// pinned in tests/golden/op_bits.txt: a hash of each op's outputs on seeded
// inputs that hold NaN, infinities, -0 and subnormals. The ops' plumbing
// (backend calls, layer classes) may be rewritten; their bits may not
// (docs/plan-layer-tables.md, step 0). Whether the bits are right is other
// tests' business (test_layers.cpp, test_transformer_ops.cpp,
// test_internal_rounding.cpp); this one says they did not move.
// Regenerate (after an intended change) with MPSIM_UPDATE_GOLDEN=1.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/model.hpp"
#include "mpsim/core/policy.hpp"
#include "support/test_support.hpp"

namespace {

using namespace mpsim;
using namespace mpsim::core;
using FVec = std::vector<float>;

// Seeded inputs (SplitMix64: the same values with any standard library).
struct Inputs {
  test::SplitMix random;
  std::uint64_t next() { return random.next(); }
  // Values spread over [-4, 4), with one special value in every 16: NaN,
  // +-inf, -0, subnormals, large and tiny normals.
  FVec values(std::size_t n, bool specials) {
    static const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity(), -0.0f, 0x1p-140f, -0x1.8p-130f,
                                    3.0e38f, 0x1p-100f};
    FVec v(n);
    for (float& x : v) {
      const std::uint64_t r = next();
      x = specials && r % 16 == 0 ? special[(r >> 8) % 8] : static_cast<float>(r >> 40) * 0x1p-21f - 4.0f;
    }
    return v;
  }
};

// NaNs hash as one value: which NaN an invalid operation or a NaN operand
// gives depends on the compiler's operand order (an -O1 sanitizer build and an
// -O2 build differ), and number classes, not NaN payloads, are what we pin.
std::uint64_t hash_bits(const FVec& v, std::uint64_t h) {
  for (const float x : v) {
    const std::uint32_t bits = x != x ? 0x7fc00000u : std::bit_cast<std::uint32_t>(x);
    for (int b = 0; b < 32; b += 8) h = (h ^ ((bits >> b) & 0xFF)) * 0x100000001b3ull;
  }
  return h;
}

class OpBits {
 public:
  explicit OpBits(Backend& b) : b_(b) {}
  Tensor tensor(const FVec& v, const Shape& shape) { return b_.from_host(v, shape); }
  FVec host(const Tensor& t) {
    FVec v(static_cast<std::size_t>(t.numel()));
    b_.to_host(t, v);
    return v;
  }
  // One line: the op's name and the hash of its outputs, in order.
  void record(const std::string& name, std::initializer_list<const Tensor*> outputs) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const Tensor* t : outputs) h = hash_bits(host(*t), h);
    char line[32];
    std::snprintf(line, sizeof line, "%016llx", static_cast<unsigned long long>(h));
    text_ << name << ' ' << line << '\n';
  }
  std::string text() const { return text_.str(); }

 private:
  Backend& b_;
  std::ostringstream text_;
};

InternalRounding narrow(const Format& f, std::string_view op) {
  Policy p = *preset_policy("fp32");
  p.norm_statistics = RoundingPoint{f, Rounding{RoundingMode::nearest_even}};
  p.softmax_internals = p.norm_statistics;
  return internal_rounding(p, op == "softmax" ? &Policy::softmax_internals : &Policy::norm_statistics, op);
}

}  // namespace

TEST_CASE("op bits: every element-wise and row-wise op keeps its bits", "[core][golden]") {
  auto backend = make_cpu_backend();
  Backend& b = *backend;
  OpBits r(b);
  Inputs in{{11}};
  constexpr std::int64_t rows = 12, cols = 40;
  const Shape shape{rows, cols};
  const Tensor x = r.tensor(in.values(rows * cols, true), shape);
  const Tensor dy = r.tensor(in.values(rows * cols, true), shape);
  Tensor y = b.zeros(shape), dx = b.zeros(shape);

  for (const Activation a : {Activation::relu, Activation::gelu, Activation::silu}) {
    const std::string name(to_string(a));
    b.activation_forward(a, x, y);
    b.activation_backward(a, x, dy, dx);
    r.record(name, {&y, &dx});
    Tensor half = b.zeros({rows, cols / 2});
    const Tensor dhalf = r.tensor(in.values(rows * cols / 2, true), {rows, cols / 2});
    b.gated_activation_forward(a, x, half);
    b.gated_activation_backward(a, x, dhalf, dx);
    r.record(name + "_glu", {&half, &dx});
  }
  for (const bool keep_mask : {false, true}) {
    b.soft_cap_forward(x, 2.5f, keep_mask, y);
    b.soft_cap_backward(y, dy, 2.5f, dx);
    r.record(keep_mask ? "soft_cap_keep_mask" : "soft_cap", {&y, &dx});
  }
  b.pointwise_forward(MultiplyOp::Params{55.5f}, x, y);
  b.pointwise_backward(MultiplyOp::Params{55.5f}, Tensor(), dy, dx);
  r.record("multiply", {&y, &dx});
  for (const double p : {0.1, 0.5}) {
    StochasticStream s;
    s.key.seed = 9;
    s.key.stream = 77;
    s.first_index = 5ull << 32;
    b.dropout(x, dropout_mask(s, p), y);
    r.record("dropout_" + std::to_string(p).substr(0, 3), {&y});
  }

  // Row ops: one row in four holds a special value, the others are finite.
  const Tensor xr = r.tensor(in.values(rows * cols, false), shape);
  FVec with_specials = r.host(xr);
  with_specials[3 * cols + 7] = std::numeric_limits<float>::quiet_NaN();
  with_specials[7 * cols + 1] = std::numeric_limits<float>::infinity();
  with_specials[11 * cols + 2] = 0x1p-140f;
  const Tensor xs = r.tensor(with_specials, shape);
  const Tensor dyr = r.tensor(in.values(rows * cols, false), shape);
  const Tensor gamma = r.tensor(in.values(cols, false), {cols});
  const Tensor beta = r.tensor(in.values(cols, false), {cols});
  Tensor mean = b.zeros({rows}), rstd = b.zeros({rows}), dgamma = b.zeros({cols}), dbeta = b.zeros({cols});
  const std::pair<const char*, InternalRounding> lows[] = {{"", InternalRounding{}},
                                                            {"_binary16", narrow(formats::binary16, "layer_norm")},
                                                            {"_bfloat16", narrow(formats::bfloat16, "layer_norm")}};
  for (const auto& [suffix, low] : lows)
    for (const Tensor* input : {&xr, &xs}) {
      const std::string tail = std::string(suffix) + (input == &xs ? "_specials" : "");
      b.layer_norm_forward(*input, gamma, beta, 1e-5f, y, mean, rstd, low);
      b.layer_norm_backward(*input, gamma, mean, rstd, dyr, dx, dgamma, dbeta, low);
      r.record("layer_norm" + tail, {&y, &mean, &rstd, &dx, &dgamma, &dbeta});
      b.rms_norm_forward(*input, gamma, 1e-5f, y, rstd, low);
      b.rms_norm_backward(*input, gamma, rstd, dyr, dx, dgamma, low);
      r.record("rms_norm" + tail, {&y, &rstd, &dx, &dgamma});
    }
  const std::pair<const char*, InternalRounding> softmax_lows[] = {
      {"", InternalRounding{}}, {"_binary16", narrow(formats::binary16, "softmax")}};
  for (const auto& [suffix, low] : softmax_lows) {
    b.softmax_forward(xs, y, low);
    b.softmax_backward(y, dyr, dx, low);
    r.record(std::string("softmax") + suffix, {&y, &dx});
  }

  // Attention's row ops on [q | k | v] rows: 2 samples of 3 tokens, 2 heads of 4.
  const AttentionShape a{2, 3, 2, 4, true};
  const Shape qkv_shape{a.rows(), 3 * a.width()};
  const Tensor qkv = r.tensor(in.values(static_cast<std::size_t>(a.rows() * 3 * a.width()), false), qkv_shape);
  const Tensor dqkv_out = r.tensor(in.values(static_cast<std::size_t>(a.rows() * 3 * a.width()), false), qkv_shape);
  Tensor qy = b.zeros(qkv_shape), qdx = b.zeros(qkv_shape);
  const Tensor qgamma = r.tensor(in.values(2 * a.head_dim, false), {2 * a.head_dim});
  const Tensor qbeta = r.tensor(in.values(2 * a.head_dim, false), {2 * a.head_dim});
  Tensor qmean = b.zeros({a.rows() * 2 * a.heads}), qrstd = b.zeros({a.rows() * 2 * a.heads});
  Tensor qdgamma = b.zeros({2 * a.head_dim}), qdbeta = b.zeros({2 * a.head_dim});
  for (const auto& [suffix, low] : lows) {
    b.qk_norm_forward(qkv, qgamma, qbeta, a, 1e-5f, qy, qmean, qrstd, low);
    b.qk_norm_backward(qkv, qgamma, qmean, qrstd, dqkv_out, a, qdx, qdgamma, qdbeta, low);
    r.record(std::string("qk_norm") + suffix, {&qy, &qmean, &qrstd, &qdx, &qdgamma, &qdbeta});
  }
  const FVec angles = rotary_table(a.tokens, a.head_dim, 10000.0);
  const Tensor table = r.tensor(angles, {2, a.tokens, a.head_dim / 2});
  b.rotary(qkv, table, a, false, qy);
  b.rotary(dqkv_out, table, a, true, qdx);
  r.record("rotary", {&qy, &qdx});

  test::check_golden(std::string(MPSIM_SOURCE_DIR) + "/tests/golden/op_bits.txt", r.text());
}
