// The tensor-core presets of every GPU (issue 19 §3): which formats each has,
// which GPUs share a model (as the published MATLAB-tensor-core models say),
// hand-worked blocks that tell the new rules apart (expected values worked
// out by hand in exact arithmetic, in the comments), and the custom
// "tc:..." spelling. V100, A100 and H100 are checked against the measured
// vectors in tests/emulation/test_accumulation.cpp.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/quantize.hpp"

namespace mpsim {
namespace {

using namespace formats;

TensorCoreModel preset(std::string_view gpu, const Format& in, const Format& out) {
  const auto m = tensor_core_preset(gpu, in, out);
  INFO(gpu << " " << in.name() << " -> " << out.name());
  REQUIRE(m.has_value());
  return *m;
}

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

float dot1(const TensorCoreModel& m, std::vector<float> a, std::vector<float> b, float c) {
  return tensor_core_dot(m, a, b, c);
}

// Every (input, output) pair a GPU has, as docs/tensor_cores.md's table says.
struct Row {
  std::string_view gpu;
  std::vector<std::pair<Format, Format>> pairs;
};

const std::vector<Format> kInputs = {binary16, bfloat16, tf32, e4m3, e5m2, e3m2, e2m3, e2m1};

TEST_CASE("tensor-core presets exist for their formats only", "[accumulation][presets]") {
  const std::vector<std::pair<Format, Format>> nvidia = {{binary16, binary32}, {binary16, binary16},
                                                         {bfloat16, binary32}, {tf32, binary32}};
  auto with = [](std::vector<std::pair<Format, Format>> v, std::vector<std::pair<Format, Format>> more) {
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  const auto fp8_32 = std::vector<std::pair<Format, Format>>{{e4m3, binary32}, {e5m2, binary32}};
  const auto fp6_4 = std::vector<std::pair<Format, Format>>{{e3m2, binary32}, {e2m3, binary32}, {e2m1, binary32}};
  const std::vector<Row> rows = {
      {"v100", {{binary16, binary32}, {binary16, binary16}}},
      {"a100", nvidia},
      {"a30", nvidia},
      {"a2", nvidia},
      {"h100", with(with(nvidia, fp8_32), {{e4m3, binary16}, {e5m2, binary16}})},
      {"h200", with(with(nvidia, fp8_32), {{e4m3, binary16}, {e5m2, binary16}})},
      {"ada", with(nvidia, fp8_32)},
      {"l40s", with(nvidia, fp8_32)},
      {"rtx6000ada", with(nvidia, fp8_32)},
      {"b200", with(with(with(nvidia, fp8_32), fp6_4), {{e4m3, binary16}, {e5m2, binary16}})},
      {"b200rn", with(with(nvidia, fp8_32), fp6_4)},
      {"rtxpro6000", with(with(with(nvidia, fp8_32), fp6_4), {{e4m3, binary16}, {e5m2, binary16}})},
      {"mi100", {{binary16, binary32}, {bfloat16, binary32}}},
      {"mi210", {{binary16, binary32}, {bfloat16, binary32}}},
      {"mi250", {{binary16, binary32}, {bfloat16, binary32}}},
      {"mi300a", {{binary16, binary32}, {bfloat16, binary32}, {tf32, binary32}}},
      {"mi300x", {{binary16, binary32}, {bfloat16, binary32}, {tf32, binary32}}},
  };
  CHECK(tensor_core_gpus().size() == rows.size());
  for (const Row& row : rows) {
    CHECK(std::find(tensor_core_gpus().begin(), tensor_core_gpus().end(), row.gpu) != tensor_core_gpus().end());
    for (const Format& in : kInputs)
      for (const Format& out : {binary32, binary16, bfloat16}) {
        const bool listed = std::find(row.pairs.begin(), row.pairs.end(), std::pair{in, out}) != row.pairs.end();
        INFO(row.gpu << " " << in.name() << " -> " << out.name());
        CHECK(tensor_core_preset(row.gpu, in, out).has_value() == listed);
      }
  }
  // Any case names a GPU.
  CHECK(tensor_core_preset("MI300X", binary16, binary32) == tensor_core_preset("mi300x", binary16, binary32));
  CHECK(tensor_core_preset("RTXPRO6000", e2m1, binary32).has_value());
  CHECK_FALSE(tensor_core_preset("b300", binary16, binary32));
  // Only the GPUs measured in shared/ count as validated; FP6/FP4 never.
  CHECK(tensor_core_preset_validated("H100", e4m3, binary16));
  CHECK(tensor_core_preset_validated("v100", binary16, binary32));
  CHECK_FALSE(tensor_core_preset_validated("h200", binary16, binary32));
  CHECK_FALSE(tensor_core_preset_validated("b200", e2m1, binary32));
  CHECK_FALSE(tensor_core_preset_validated("mi300x", binary16, binary32));
}

// The published models make these GPUs the same tensor core (A30TC.m, A2TC.m,
// H200TC.m, L40STC.m = AdaTC.m, RTXPRO6000TC.m, MI250MC.m, MI300AMC.m and
// MI300XMC.m call or copy another model), and B200 / Ada equal H100 / A100
// for fp16, bf16 and tf32 (B200TC.m, AdaTC.m: the same fma and neab).
TEST_CASE("tensor-core presets that are the same model", "[accumulation][presets]") {
  const std::vector<std::pair<std::string_view, std::string_view>> same = {
      {"a30", "a100"},  {"a2", "a100"},       {"h200", "h100"},   {"l40s", "ada"},      {"rtx6000ada", "ada"},
      {"rtxpro6000", "b200"}, {"mi250", "mi210"}, {"mi300a", "mi300x"}};
  for (const auto& [gpu, model] : same)
    for (const Format& in : kInputs)
      for (const Format& out : {binary32, binary16}) {
        INFO(gpu << " = " << model << ", " << in.name() << " -> " << out.name());
        CHECK(tensor_core_preset(gpu, in, out) == tensor_core_preset(model, in, out));
      }
  for (const Format& in : {binary16, bfloat16, tf32}) {
    CHECK(tensor_core_preset("b200", in, binary32) == tensor_core_preset("h100", in, binary32));
    CHECK(tensor_core_preset("ada", in, binary32) == tensor_core_preset("a100", in, binary32));
  }
  CHECK(tensor_core_preset("b200", binary16, binary16) == tensor_core_preset("h100", binary16, binary16));
  // B200RN is B200 rounding to nearest (B200TCRN.m: frmode 'rne'); for FP8 it keeps B200TC.m's c in the block,
  // where B200 itself was fitted to measured vectors (next case).
  TensorCoreModel rn = preset("b200", binary16, binary32);
  rn.rounding = RoundingMode::nearest_even;
  CHECK(rn == preset("b200rn", binary16, binary32));
}

TEST_CASE("tensor-core presets: B200 FP8 truncates the products from +0, then adds c to nearest-even",
          "[accumulation][presets]") {
  // The rule that fits all 10,000 measured B200 FP8 -> fp32 cases of the MATLAB-tensor-core repository
  // (model_validation/B200, not in shared/; docs/tensor_cores.md). There, E4M3 case 1's products sum exactly
  // to 3.78884506... and P + c lies halfway between two binary32 values: the GPU gave the even one, where
  // B200TC.m's truncation with c in the block gives the lower. Here the same two effects on small cases.
  const TensorCoreModel b200 = preset("b200", e4m3, binary32);
  CHECK(b200.c_added_last);
  CHECK(b200.c_rounding == RoundingMode::nearest_even);
  CHECK(b200.rounding == RoundingMode::toward_zero);
  // c added to nearest: product 1.5 and c = 2^24 (ulp 2): 2^24 + 1.5 rounds to nearest 2^24 + 2; truncation
  // with c in the block (F = 25 below 2^24) would give 2^24.
  CHECK(dot1(b200, {1.5f}, {1.0f}, 0x1p24f) == 0x1p24f + 2);
  TensorCoreModel published = b200;
  published.c_added_last = false;
  published.c_rounding.reset();
  CHECK(dot1(published, {1.5f}, {1.0f}, 0x1p24f) == 0x1p24f);
  // The products alone are truncated first (E5M2 case 3936 measured it): 16 * 16 = 256 and 1.5 * 2^-17
  // (3 * 2^-9 times 2^-9) in a block whose unit is 2^(8 - 25): the small product truncates to 2^-17 and the
  // block to binary32 256 (ulp 2^-15); c = 2^-16 then ties and stays at the even 256. The exact sum,
  // 256 + 0.875 ulp, would round to 256 + 2^-15.
  CHECK(dot1(b200, {16.0f, 0x1.8p-8f}, {16.0f, 0x1p-9f}, 0x1p-16f) == 256.0f);
}

TEST_CASE("tensor-core presets: rounding to nearest against truncation (B200, B200RN)", "[accumulation][presets]") {
  // c = 1 and one product 1.5*2^-12 * 2^-12 = 0.75 * 2^-23, kept exactly
  // (2^-25 is the accumulator's unit, 25 bits below 2^0): the block sum is
  // 1 + 0.75 ulp(1). Truncation gives 1; rounding to nearest 1 + 2^-23.
  const std::vector<float> a = {0x1.8p-12f}, b = {0x1p-12f};
  CHECK(dot1(preset("b200", binary16, binary32), a, b, 1.0f) == 1.0f);
  CHECK(dot1(preset("b200rn", binary16, binary32), a, b, 1.0f) == 1.0f + 0x1p-23f);
  // FP4 (e2m1, unvalidated): c = 1, products 0.5 * 0.5 = 0.25 and 2^-24 is
  // not an e2m1 value; 1 + 0.25 is exact either way: both give 1.25.
  CHECK(dot1(preset("b200", e2m1, binary32), {0.5f}, {0.5f}, 1.0f) == 1.25f);
}

TEST_CASE("tensor-core presets: the block size decides what is lost (FP8: H100, Ada, B200)",
          "[accumulation][presets]") {
  // 16 products 2^-7 * 2^-7 = 2^-14 (e4m3 subnormals), then 1 * 1; c = 0.
  // H100 (one block of 32, unit 2^(0-13)): each 2^-14 truncates to 0: 1.
  // Ada (blocks of 16): the first block sums them exactly, 16 * 2^-14 = 2^-10;
  // the second adds 1: 2^-10 is above the unit 2^-13: 1 + 2^-10.
  // B200 (one block of 32, unit 2^-25): nothing is lost: 1 + 2^-10.
  std::vector<float> a(17, 0x1p-7f), b(17, 0x1p-7f);
  a[16] = b[16] = 1.0f;
  CHECK(tensor_core_dot(preset("h100", e4m3, binary32), a, b, 0.0f) == 1.0f);
  CHECK(tensor_core_dot(preset("ada", e4m3, binary32), a, b, 0.0f) == 1.0f + 0x1p-10f);
  CHECK(tensor_core_dot(preset("b200", e4m3, binary32), a, b, 0.0f) == 1.0f + 0x1p-10f);
}

TEST_CASE("tensor-core presets: AMD subnormal flushing (MI210 against MI100, MI300)", "[accumulation][presets]") {
  // 2^-24 (the smallest binary16 subnormal) * 1024 = 2^-14: MI100 and MI300
  // keep subnormal inputs; MI210 flushes 2^-24 to zero first.
  CHECK(dot1(preset("mi100", binary16, binary32), {0x1p-24f}, {1024.0f}, 0.0f) == 0x1p-14f);
  CHECK(dot1(preset("mi300x", binary16, binary32), {0x1p-24f}, {1024.0f}, 0.0f) == 0x1p-14f);
  CHECK(bits(dot1(preset("mi210", binary16, binary32), {0x1p-24f}, {1024.0f}, 0.0f)) == 0u);
  // bf16 2^-100 * 2^-30 = 2^-130, a binary32 subnormal: MI100 returns it,
  // MI210 flushes the product (and the result) to zero.
  CHECK(dot1(preset("mi100", bfloat16, binary32), {0x1p-100f}, {0x1p-30f}, 0.0f) == 0x1p-130f);
  CHECK(dot1(preset("mi210", bfloat16, binary32), {0x1p-100f}, {0x1p-30f}, 0.0f) == 0.0f);
  // A subnormal c is flushed on MI210: 0 + 2^-140 -> 0.
  CHECK(dot1(preset("mi210", binary16, binary32), {0.0f}, {1.0f}, 0x1p-140f) == 0.0f);
}

TEST_CASE("tensor-core presets: AMD block sums (exact, pairwise, late c)", "[accumulation][presets]") {
  // MI100 sums exactly: c = 1 + 2^-23, products 2^-24 and -2^-40: the exact
  // sum is just below the tie 1 + 2^-23 + 2^-24, so nearest gives 1 + 2^-23.
  // B200RN truncates -2^-40 away (unit 2^-25), sees the tie and rounds to
  // even, 1 + 2^-22.
  const std::vector<float> a = {0x1p-12f, -0x1p-20f}, b = {0x1p-12f, 0x1p-20f};
  CHECK(dot1(preset("mi100", binary16, binary32), a, b, 1.0f + 0x1p-23f) == 1.0f + 0x1p-23f);
  CHECK(dot1(preset("b200rn", binary16, binary32), a, b, 1.0f + 0x1p-23f) == 1.0f + 0x1p-22f);
  // MI210 rounds products and pairs: (1 + 2^-24) + (2^-24 + 0): the first
  // sum is a tie, to even: 1; then 1 + 2^-24 -> 1 again; c = 0 + 1 = 1.
  // MI100: 1 + 2^-23 exactly.
  const std::vector<float> x = {1.0f, 0x1p-12f, 0x1p-12f, 0.0f}, y = {1.0f, 0x1p-12f, 0x1p-12f, 0.0f};
  CHECK(tensor_core_dot(preset("mi210", binary16, binary32), x, y, 0.0f) == 1.0f);
  CHECK(tensor_core_dot(preset("mi100", binary16, binary32), x, y, 0.0f) == 1.0f + 0x1p-23f);
  // MI300 adds c late: products 2^-24 + 2^-40 (largest alignment exponent -24,
  // 2^-20 is a subnormal aligned at -14 - 14 = -28; both kept exactly at unit
  // 2^-48). c = 1 is larger: the products' sum goes onto c's grid, 24 + 7 =
  // 31 bits below 2^0, rounded toward -inf: 2^-24 (the 2^-40 is lost). 1 +
  // 2^-24 is a tie: to even, 1. MI100 (exact) sees 1 + 2^-24 + 2^-40: up, 1 + 2^-23.
  const std::vector<float> p = {0x1p-12f, 0x1p-20f};
  CHECK(dot1(preset("mi300x", binary16, binary32), p, p, 1.0f) == 1.0f);
  CHECK(dot1(preset("mi100", binary16, binary32), p, p, 1.0f) == 1.0f + 0x1p-23f);
  // Toward -inf, not toward zero: products -(2^-24 + 2^-40), c = 1 + 2^-22:
  // the products' sum on the 2^-31 grid is -(2^-24 + 2^-31) (rounded down in
  // value); 1 + 2^-22 - 2^-24 - 2^-31 is below the midpoint 1 + 2^-22 - 2^-24
  // of 1 + 2^-23 and 1 + 2^-22: nearest gives 1 + 2^-23. Truncating toward
  // zero would give the midpoint and round to even, 1 + 2^-22.
  const std::vector<float> n = {-0x1p-12f, -0x1p-20f};
  CHECK(dot1(preset("mi300x", binary16, binary32), n, p, 1.0f + 0x1p-22f) == 1.0f + 0x1p-23f);
  // AMD "prd_limit": a bf16 product 2^100 * 2^30 >= 2^128 makes the block
  // infinite even though the exact sum 2^130 - 2^130 + 1 is 1; with both signs, NaN.
  CHECK(tensor_core_dot(preset("mi300x", bfloat16, binary32), std::vector<float>{0x1p100f},
                        std::vector<float>{0x1p30f}, 1.0f) == INFINITY);
  CHECK(std::isnan(tensor_core_dot(preset("mi300x", bfloat16, binary32), std::vector<float>{0x1p100f, -0x1p100f},
                                   std::vector<float>{0x1p30f, 0x1p30f}, 1.0f)));
  // H100 has no such limit: the block's exact sum of truncated terms is 2^130
  // - 2^130 + 0 (c = 1 is below the unit 2^(130-25)): +0.
  CHECK(bits(tensor_core_dot(preset("h100", bfloat16, binary32), std::vector<float>{0x1p100f, -0x1p100f},
                             std::vector<float>{0x1p30f, 0x1p30f}, 1.0f)) == 0u);
}

// --- The custom spelling ----------------------------------------------------------

TEST_CASE("custom tensor cores: tc:KEY=VALUE", "[accumulation][presets]") {
  const auto custom = parse_accumulation_model("tc:block=16,bits=25,rounding=rtz,input=binary16,output=binary32");
  REQUIRE(custom.has_value());
  CHECK(custom->tensor_core == preset("h100", binary16, binary32));
  CHECK(to_string(*custom) == "h100:binary16:binary32");  // a preset prints as its GPU
  CHECK(parse_tensor_core_model("TC:input=fp16,extra=2,block=16,rounding=rtz") == preset("h100", binary16, binary32));
  // The same results on random data as the preset (K = 100, several blocks).
  std::mt19937_64 rng(19);
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> a(100), b(100);
    for (auto& v : a) v = normal(rng);
    for (auto& v : b) v = normal(rng);
    const float c = normal(rng);
    CHECK(bits(dot(*custom, a, b, c)) == bits(tensor_core_dot(preset("h100", binary16, binary32), a, b, c)));
  }
  // Every preset and a few customs print a name that parses back to it.
  for (std::string_view gpu : tensor_core_gpus())
    for (const Format& in : kInputs)
      for (const Format& out : {binary32, binary16}) {
        const auto m = tensor_core_preset(gpu, in, out);
        if (!m) continue;
        INFO(gpu << " " << in.name() << " -> " << out.name());
        const auto named = parse_accumulation_model(to_string(AccumulationModel{
            AccumulationKind::tensor_core, m->output, m->rounding, 32, *m}));
        REQUIRE(named.has_value());
        CHECK(named->tensor_core == *m);
        CHECK(parse_tensor_core_model(to_string(*m)) == *m);
      }
  for (std::string name : {"tc:input=e4m3,output=fp16,block=32,bits=25,rounding=rne,groups=2,run=2,c=last",
                           "tc:input=bf16,block=8,bits=24,rounding=rne,sum=late-c,overflow=products",
                           "tc:input=fp16:ftz,output=fp32:ftz,block=4,rounding=rne,sum=pairwise",
                           "tc:input=fp16,block=4,rounding=rne,sum=exact", "tc:block=7,bits=30,precision=12"}) {
    INFO(name);
    const auto m = parse_accumulation_model(name);
    REQUIRE(m.has_value());
    const auto again = parse_accumulation_model(to_string(*m));
    INFO(to_string(*m));
    REQUIRE(again.has_value());
    CHECK(*again == *m);
  }
  // A spelled-out MI300X model is the preset.
  CHECK(parse_tensor_core_model("tc:input=fp16,block=8,bits=24,rounding=rne,sum=late-c,overflow=products") ==
        preset("mi300x", binary16, binary32));
}

TEST_CASE("custom tensor cores: errors name the problem", "[accumulation][presets]") {
  auto message = [](std::string_view text) {
    try {
      parse_tensor_core_model(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(message("tc:block=0"), Contains("block 0 is not in 1..64"));
  CHECK_THAT(message("tc:block=65"), Contains("block 65"));
  CHECK_THAT(message("tc:bits=x"), Contains("bits=x is not an integer"));
  CHECK_THAT(message("tc:bits=0"), Contains("bits 0 is not in 1..100"));
  CHECK_THAT(message("tc:size=4"), Contains("unknown key 'size'"));
  CHECK_THAT(message("tc:input=fp99"), Contains("input=fp99 is not a format"));
  CHECK_THAT(message("tc:output=bf16"), Contains("output bfloat16 is not binary32 or binary16"));
  CHECK_THAT(message("tc:rounding=up"), Contains("rounding=up is not a rounding mode"));
  CHECK_THAT(message("tc:rounding=stochastic"), Contains("deterministic"));
  CHECK_THAT(message("tc:block=4,block=8"), Contains("'block' is given twice"));
  CHECK_THAT(message("tc:bits=25,extra=2"), Contains("bits or extra"));
  CHECK_THAT(message("tc:sum=kulisch"), Contains("sum=kulisch is not"));
  CHECK_THAT(message("tc:sum=exact,groups=2"), Contains("takes no groups"));
  CHECK_THAT(message("tc:block16"), Contains("'block16' is not KEY=VALUE"));
  CHECK_THAT(message("tc:c=first"), Contains("c=first"));
  CHECK_FALSE(parse_accumulation_model("tc:block=0").has_value());  // parse_tensor_core_model says why
  CHECK_FALSE(parse_accumulation_model("b200:e2m1:fp16").has_value());
}

}  // namespace

TEST_CASE("tensor-core promotion: runs of products from +0, each added to a binary32 sum (cuBLASLt's FP8 GEMM)",
          "[accumulation][presets]") {
  // The H100's FP8 accumulator keeps 13 bits below a block's largest term. One product 1 * 1, then 255 of
  // 2^-7 * 2^-7 = 2^-14 (E5M2 normals): chained along K, every block after the first sees c = 1 and truncates
  // each 2^-14 away (below 2^-13), so the sum stays 1. Promoted every 128 products (cuBLASLt's default FP8
  // GEMM on an H100, measured): the second run starts from +0, sums its 128 products exactly to 2^-7, and
  // 1 + 2^-7 is a binary32 value. The exact sum is 1 + 255 * 2^-14.
  TensorCoreModel chained = preset("h100", e5m2, binary32), promoted = chained;
  promoted.promotion = 128;
  std::vector<float> a(256, 0x1p-7f), b(256, 0x1p-7f);
  a[0] = b[0] = 1.0f;
  CHECK(tensor_core_dot(chained, a, b, 0.0f) == 1.0f);
  CHECK(tensor_core_dot(promoted, a, b, 0.0f) == 1.0f + 0x1p-7f);
  CHECK(tensor_core_dot(promoted, a, b, 0.5f) == 1.5f + 0x1p-7f);  // c starts the binary32 sum
  // The spelling, and gemm against dot (the GEMM runs per run of 128 on the model's vector kernel).
  const auto model = parse_accumulation_model("tc:input=e5m2,output=fp32,block=32,bits=13,precision=14,"
                                              "rounding=rtz,promote=128");
  REQUIRE(model);
  CHECK(model->tensor_core == promoted);
  CHECK(parse_accumulation_model(to_string(*model)) == model);
  const int m = 3, n = 5, k = 300;  // two whole runs and a part
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(k) * n), c(m * n, 0.25f);
  for (auto& v : x) v = std::ldexp(normal(rng), static_cast<int>(rng() % 12) - 6);
  for (auto& v : y) v = normal(rng);
  quantize(e5m2, x, x);
  quantize(e5m2, y, y);
  std::vector<float> got = c;
  gemm(*model, x.data(), y.data(), got.data(), m, n, k, true, 1);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      std::vector<float> col(k);
      for (int t = 0; t < k; ++t) col[t] = y[static_cast<std::size_t>(t) * n + j];
      const float want = tensor_core_dot(promoted, std::span(x).subspan(static_cast<std::size_t>(i) * k, k), col, 0.25f);
      CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(i) * n + j]) == std::bit_cast<std::uint32_t>(want));
    }
  CHECK_THROWS_WITH(parse_tensor_core_model("tc:input=e4m3,output=fp32,block=32,bits=13,promote=100"),
                    Catch::Contains("multiple of the block"));
  CHECK_THROWS_WITH(parse_tensor_core_model("tc:input=e4m3,output=fp16,block=32,bits=25,rounding=rne,promote=128"),
                    Catch::Contains("binary32 output"));
}

}  // namespace mpsim
