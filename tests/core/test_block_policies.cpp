// Block-scaled GEMM operands in training (policy.hpp's block points): their
// text, the checks a config meets, the CPU backend's block GEMM against
// block_gemm on operands laid out by hand (block_gemm itself is checked
// against exact rationals in tests/emulation/test_block_formats.cpp), the
// statistics per operand, and training with every recipe preset.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/block_scaled_gemm.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/trainer.hpp"
#include "mpsim/emulation/block_gemm.hpp"

using namespace mpsim;
using namespace mpsim::core;

namespace {

BlockPoint block(std::string_view text) {
  std::string error;
  const auto p = parse_block_point(text, &error);
  INFO(error);
  REQUIRE(p);
  return *p;
}

struct MemoryLog final : ArmLog {
  std::vector<StepRecord> steps;
  std::vector<std::pair<std::int64_t, LayerBlockStats>> blocks;
  std::vector<EvalRecord> evals;
  std::string status;
  void step(const StepRecord& r) override { steps.push_back(r); }
  void stats(std::int64_t, const LayerStats&, std::span<const double>) override {}
  void block_stats(std::int64_t step, const LayerBlockStats& s) override { blocks.emplace_back(step, s); }
  void eval(const EvalRecord& r) override { evals.push_back(r); }
  void finish(const std::string& s) override { status = s; }
};

const TrainTest& synthetic() {
  static const TrainTest data = make_synthetic(7, 1024, 256);
  return data;
}

ArmSetup small_setup(const Policy& policy) {
  ArmSetup s;
  s.policy = &policy;
  s.model.hidden = {64, 32};
  s.train.batch_size = 32;
  s.train.max_steps = 12;
  s.train.eval_batch = 256;
  s.train.stats_interval = 4;
  s.train.threads = 1;
  s.optimizer.lr = 0.05;
  s.seed = 3;
  return s;
}

std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(d(gen), static_cast<int>(gen() % 9) - 4);
  return v;
}

}  // namespace

TEST_CASE("block points: text round trips, errors name the fix", "[block][policy]") {
  for (const char* text : {"none", "mxfp8-e4m3", "mxfp8-e4m3/ceil", "nvfp4/stochastic/rht", "nvfp4/nvfp4-te",
                           "nvfp4-16x16/floor", "fp8-e4m3-1x128", "fp8-e5m2-tensor", "mxint8"})
    CHECK(to_string(block(text)) == text);
  CHECK(block("nvfp4/rht/stochastic") == block("nvfp4/stochastic/rht"));
  CHECK(block("nvfp4/floor").format.scale == ScaleFormat::e8m0);
  CHECK(block("nvfp4/floor").format.rule == ScaleRule::ocp_floor);
  CHECK(!block("none").enabled());
  std::string error;
  CHECK(!parse_block_point("mxfp9", &error));
  CHECK_THAT(error, Catch::Contains("unknown block format 'mxfp9'") && Catch::Contains("mxfp8-e4m3"));
  CHECK(!parse_block_point("mxfp8-e4m3/toward-zero", &error));
  CHECK_THAT(error, Catch::Contains("toward-zero") && Catch::Contains("stochastic"));
  CHECK(!parse_block_point("mxint8/floor", &error));
  CHECK(!parse_block_point("mxfp4/nvfp4-te", &error));
}

TEST_CASE("block points: a role's operands must form a block-scaled GEMM", "[block][policy]") {
  Policy p = *preset_policy("bf16-mixed");
  p.fprop_activations = block("mxfp8-e4m3");
  CHECK_THROWS_WITH(check_block_points(p), Catch::Contains("two block-scaled operands"));
  p.fprop_weights = block("nvfp4");
  CHECK_THROWS_WITH(check_block_points(p), Catch::Contains("blocks along k differ"));
  p.fprop_weights = block("mxfp8-e5m2");
  CHECK_NOTHROW(check_block_points(p));
  p.fprop_weights = block("mxfp8-e5m2/rht");
  CHECK_THROWS_WITH(check_block_points(p), Catch::Contains("/rht"));
  p.fprop_weights = block("mxfp8-e5m2");
  p.gemm = "h100";
  CHECK_NOTHROW(check_block_points(p));  // FP8 elements: DeepSeek-V3's promotion
  p.fprop_activations = p.fprop_weights = block("mxfp4");
  CHECK_THROWS_WITH(check_block_points(p), Catch::Contains("cannot sum block-scaled operands"));
  p.gemm = "pairwise-fp32";
  CHECK_THROWS(check_block_points(p));
  // E8M0 scales with a tensor core: the scaled products in its accumulator, promoted every N products.
  p.fprop_activations = p.fprop_weights = block("mxfp8-e4m3");
  p.gemm = "b200";
  CHECK_NOTHROW(check_block_points(p));
  p.block_promotion_interval = 64;
  CHECK_NOTHROW(check_block_points(p));
  p.block_promotion_interval = 48;
  CHECK_THROWS_WITH(check_block_points(p), Catch::Contains("not a multiple of the block length"));
  p.gemm = "ieee";
  p.block_promotion_interval = 64;
  CHECK_THROWS_WITH(check_block_points(p), Catch::Contains("needs a tensor-core gemm"));
  p.fprop_activations = p.fprop_weights = block("fp8-e4m3-1x128");
  p.gemm = "h100";
  p.block_promotion_interval = 256;
  CHECK_THROWS_WITH(check_block_points(p), Catch::Contains("promote once per block"));
  p = *preset_policy("bf16-mixed");
  for (const auto& name : preset_policy_names()) {
    INFO(name);
    CHECK_NOTHROW(check_block_points(*preset_policy(name)));
  }
  CHECK(uses_block_formats(*preset_policy("nvfp4")));
  CHECK(!uses_block_formats(*preset_policy("fp8-delayed")));
  const auto body = [](const std::string& text) { return text.substr(text.find('\n')); };  // past "policy NAME"
  CHECK(body(describe(*preset_policy("fp8"))) == body(describe(*preset_policy("fp8-delayed"))));
}

TEST_CASE("the CPU backend's block GEMM quantizes each operand along k, whatever the layout", "[block][backend]") {
  // c = op(a) op(b) through Backend::gemm, for every transposition, against
  // block_gemm on the k-major operands written out here element by element.
  const int m = 5, n = 7, k = 70;  // k: two whole blocks of 32 and a partial one
  const std::vector<float> a_mk = random_values(m * k, 1), b_kn = random_values(k * n, 2);
  for (const char* format : {"mxfp8-e4m3", "nvfp4", "fp8-e4m3-tensor", "mxfp4/stochastic"}) {
    const BlockPoint point = block(format);
    std::vector<float> at(a_mk.size()), bt(b_kn.size());  // B^T: n x k
    for (int i = 0; i < m; ++i)
      for (int t = 0; t < k; ++t) at[static_cast<std::size_t>(t * m + i)] = a_mk[static_cast<std::size_t>(i * k + t)];
    for (int t = 0; t < k; ++t)
      for (int j = 0; j < n; ++j) bt[static_cast<std::size_t>(j * k + t)] = b_kn[static_cast<std::size_t>(t * n + j)];
    BlockQuantizeOptions oa, ob;
    oa.rounding = ob.rounding = point.rounding;
    oa.key = {9, 1};
    ob.key = {9, 2};
    const BlockQuantized qa = quantize_blocks(point.format, a_mk, m, k, oa);
    const BlockQuantized qb = quantize_blocks(point.format, bt, n, k, ob);
    std::vector<float> expected(static_cast<std::size_t>(m * n));
    block_gemm({}, point.format, qa, point.format, qb, expected.data(), m, n, k);

    auto backend = make_cpu_backend();
    GemmNumerics numerics;
    BlockStats sa, sb;
    numerics.a_block = GemmNumerics::BlockOperand{point, {{9, 1}, 0}, &sa};
    numerics.b_block = GemmNumerics::BlockOperand{point, {{9, 2}, 0}, &sb};
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        INFO(format << " ta " << ta << " tb " << tb);
        const Tensor a = ta ? backend->from_host(at, {k, m}) : backend->from_host(a_mk, {m, k});
        std::vector<float> b_stored = tb ? bt : b_kn;
        const Tensor b = tb ? backend->from_host(b_stored, {n, k}) : backend->from_host(b_stored, {k, n});
        Tensor c = backend->empty({m, n});
        backend->gemm(a, ta, b, tb, c, numerics, {});
        std::vector<float> got(expected.size());
        backend->to_host(c, got);
        for (std::size_t i = 0; i < got.size(); ++i)
          REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(expected[i]));
      }
    }
    // Four GEMMs, each counting its operand once.
    CHECK(sa[BlockCounter::elements] == 4u * m * k);
    CHECK(sb[BlockCounter::elements] == 4u * n * k);
    const std::uint64_t blocks_per_row = point.format.block_cols == 0 ? 0 : (k + point.format.block_cols - 1) /
                                                                                 point.format.block_cols;
    CHECK(sa[BlockCounter::blocks] == 4u * (blocks_per_row == 0 ? 1 : m * blocks_per_row));
  }
}

TEST_CASE("block_scaled_gemm runs the steps a backend gives it; the CPU runs every preset", "[block][backend]") {
  // The cuda backend passes its kernels as the steps (tests/gpu/test_backend_ops.cpp proves their bits); here
  // steps that count their calls and delegate to the CPU's give the CPU's bits, each operand quantized once.
  const int m = 6, n = 9, k = 48;
  const std::vector<float> a = random_values(m * k, 5), b = random_values(k * n, 6);
  GemmNumerics numerics;
  numerics.a_block = GemmNumerics::BlockOperand{block("nvfp4/stochastic"), {{4, 1}, 0}};
  numerics.b_block = GemmNumerics::BlockOperand{block("nvfp4-16x16"), {{4, 2}, 0}};
  std::vector<float> want(static_cast<std::size_t>(m * n)), got(want.size());
  block_scaled_gemm(a.data(), false, m, k, b.data(), false, k, n, want.data(), numerics);
  const BlockGemmSteps cpu = cpu_block_gemm_steps();
  int quantized = 0, multiplied = 0;
  BlockGemmSteps counted;
  counted.quantize = [&](const BlockFormat& f, std::span<const float> x, std::int64_t rows, std::int64_t cols,
                         const BlockQuantizeOptions& o) {
    ++quantized;
    return cpu.quantize(f, x, rows, cols, o);
  };
  counted.multiply = [&](const BlockGemmModel& model, const BlockFormat& fa, const BlockOperand& qa,
                         const BlockFormat& fb, const BlockOperand& qb, float* c, int mm, int nn, int kk) {
    ++multiplied;
    cpu.multiply(model, fa, qa, fb, qb, c, mm, nn, kk);
  };
  block_scaled_gemm(a.data(), false, m, k, b.data(), false, k, n, got.data(), numerics, counted);
  CHECK(quantized == 2);
  CHECK(multiplied == 1);
  for (std::size_t i = 0; i < got.size(); ++i)
    REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i]));
  const auto backend = make_cpu_backend();
  for (const std::string& name : preset_policy_names()) {
    INFO(name);
    CHECK(block_gemm_refusal(*backend, *preset_policy(name)).empty());
  }
}

TEST_CASE("block statistics: saturation, flushes, scale codes and errors per block", "[block][stats]") {
  // One MXFP8 E4M3 block (OCP floor scale): amax 896 = 2^9 * 1.75 gives
  // scale 2^(9 - 8) = 2 (E8M0 code 128); 896 / 2 = 448 and 1 / 2 are exact;
  // 1e-3 / 2 is below half of E4M3's smallest subnormal 2^-9: flushed.
  std::vector<float> x(32, 1.0f);
  x[0] = 896.0f;
  x[1] = 1e-3f;
  x[2] = 0.0f;
  const BlockFormat f = *parse_block_format("mxfp8-e4m3");
  const BlockOperand q = quantize_block_operand(f, x, 1, 32);
  BlockStats s;
  add_block_quantization(s, f, x, q, 1, 32);
  CHECK(s[BlockCounter::elements] == 32);
  CHECK(s[BlockCounter::nonzero] == 31);
  CHECK(s[BlockCounter::rounded_to_zero] == 1);
  CHECK(s[BlockCounter::blocks] == 1);
  CHECK(s.scale_codes[127 + 1] == 1);
  CHECK(s.scale_binades[Binades::bin_of_exponent(1)] == 1);
  // The error: only x[1] changes (to 0): sqrt(x1^2 / (896^2 + x1^2 + 29)) / 2^-3 (about 2^-16.8).
  const double x1 = static_cast<double>(1e-3f);
  const double relative = std::sqrt(x1 * x1 / (896.0 * 896.0 + x1 * x1 + 29.0)) / 0.125;
  const auto quarter = static_cast<std::size_t>(std::floor((std::log2(relative) + 30) * 4));
  CHECK(quarter == 13 * 4);  // log2 = -16.77: in [2^-17, 2^-16.75), the first quarter of binade -17
  CHECK(s.error[quarter] == 1);
  // A NaN block.
  x[5] = std::nanf("");
  BlockStats n;
  add_block_quantization(n, f, x, quantize_block_operand(f, x, 1, 32), 1, 32);
  CHECK(n.error[BlockStats::error_nan_bin] == 1);
  CHECK(n.scale_binades[Binades::nan_bin] == 1);
  CHECK(n.scale_codes[255] == 1);
}

TEST_CASE("MXFP8 through a tensor-core accumulator trains, and its accumulator changes the trajectory",
          "[block][training]") {
  Policy exact = *preset_policy("mxfp8");
  Policy tc = exact;
  tc.gemm = "h100";  // FP8 products in a 13-bit truncating accumulator, never promoted
  Policy promoted = tc;
  promoted.block_promotion_interval = 128;
  auto backend = make_cpu_backend();
  const ArmResult r_exact = train_arm(*backend, small_setup(exact), synthetic(), nullptr);
  const ArmResult r_tc = train_arm(*backend, small_setup(tc), synthetic(), nullptr);
  const ArmResult r_tc_again = train_arm(*backend, small_setup(tc), synthetic(), nullptr);
  const ArmResult r_promoted = train_arm(*backend, small_setup(promoted), synthetic(), nullptr);
  REQUIRE(r_tc.losses.size() == r_exact.losses.size());
  CHECK(std::isfinite(r_tc.losses.back()));
  CHECK(r_tc.losses.back() < r_tc.losses.front());
  CHECK(r_tc.losses == r_tc_again.losses);
  CHECK(r_tc.losses != r_exact.losses);
  CHECK(r_promoted.losses != r_tc.losses);
}

TEST_CASE("every recipe preset trains, the same bits twice, and logs its block statistics", "[block][training]") {
  for (const char* name : {"fp8-current", "mxfp8", "nvfp4", "deepseek-fp8"}) {
    INFO(name);
    const Policy policy = *preset_policy(name);
    const ArmSetup setup = small_setup(policy);
    MemoryLog first, second;
    auto backend = make_cpu_backend();
    const ArmResult r1 = train_arm(*backend, setup, synthetic(), &first);
    const ArmResult r2 = train_arm(*backend, setup, synthetic(), &second);
    REQUIRE(first.status == "completed");
    REQUIRE(r1.losses.size() == 12);
    for (std::size_t i = 0; i < r1.losses.size(); ++i)
      CHECK(std::bit_cast<std::uint64_t>(r1.losses[i]) == std::bit_cast<std::uint64_t>(r2.losses[i]));
    CHECK(std::isfinite(r1.losses.back()));
    CHECK(r1.losses.back() < r1.losses.front());
    // Steps 0, 4, 8; layers flatten, fc1, relu, fc2, relu, fc3, loss.
    REQUIRE(first.blocks.size() == 3);
    const LayerBlockStats& s = first.blocks.front().second;
    const auto& fc1 = s[1];
    CHECK(fc1[0][BlockCounter::elements] == 32u * 784);   // fprop activations: batch x in
    CHECK(fc1[1][BlockCounter::elements] == 64u * 784);   // fprop weights
    CHECK(fc1[4][BlockCounter::elements] == 32u * 64);    // wgrad gradients
    CHECK(fc1[2][BlockCounter::elements] == 0);           // no data gradient for the first layer
    const auto& fc3 = s[5];
    if (policy.high_precision_last == 1) CHECK(fc3[0][BlockCounter::elements] == 0);
    else CHECK(fc3[0][BlockCounter::elements] == 32u * 32);
  }
}

TEST_CASE("stochastic element rounding and the Hadamard transform change the trajectory", "[block][training]") {
  Policy plain = *preset_policy("nvfp4");
  plain.dgrad_gradients = block("nvfp4");
  plain.wgrad_gradients = block("nvfp4");
  plain.wgrad_activations = block("nvfp4");
  Policy with_rht = plain;
  with_rht.wgrad_gradients = block("nvfp4/rht");
  with_rht.wgrad_activations = block("nvfp4/rht");
  MemoryLog la, lb, lc;
  auto backend = make_cpu_backend();
  const ArmResult a = train_arm(*backend, small_setup(plain), synthetic(), &la);
  const ArmResult b = train_arm(*backend, small_setup(with_rht), synthetic(), &lb);
  const ArmResult c = train_arm(*backend, small_setup(*preset_policy("nvfp4")), synthetic(), &lc);
  CHECK(a.losses[0] == b.losses[0]);  // the first forward pass is the same
  CHECK(a.losses.back() != b.losses.back());
  CHECK(a.losses.back() != c.losses.back());
}
