// The GPU pieces against the CPU: the rounding kernel against the emulator
// (bits and counters), the device histogram against TensorStats::add_values,
// and cuBLAS GEMMs against exact and bounded references. Every test case skips
// (exit 77, CTest "Skipped") when no CUDA device is present.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/block_format.hpp"
#include "mpsim/emulation/block_gemm.hpp"
#include "mpsim/gpu/block_quantize.hpp"
#include "mpsim/gpu/block_scale_layout.hpp"
#include "mpsim/gpu/device.hpp"
#include "mpsim/gpu/tensor_core_check.hpp"
#include "require_device.hpp"
#include "support/test_support.hpp"

using namespace mpsim;

namespace {

using test::require_device;

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// Gradient-like magnitudes over 2^-150 .. 2^20 with both signs, and every
// special class, so that every format sees subnormals, flushes and overflow.
std::vector<float> mixed_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> exponent(-150.0f, 20.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = (rng() & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-149f, 65504.0f, 65520.0f, 448.0f,
                            464.0f, 57344.0f, 61440.0f, 3.4028235e38f};
  for (std::size_t i = 0; i < std::size(specials) && i < n; ++i) v[i * 7 % n] = specials[i];
  return v;
}

// Values fit for a tensor under one scale (per-tensor FP8, NVFP4's second level): a single NaN or Inf would make
// every element NaN, and binary32's largest value a scale whose square overflows; either would leave a
// comparison with nothing to compare (as an H100 run of 2026-11-26 showed). Such values become 1.
void keep_one_scale_meaningful(std::vector<float>& v) {
  for (float& e : v)
    if (!std::isfinite(e) || std::fabs(e) > 0x1p20f) e = 1.0f;
}

// A tensor-core block GEMM of operands quantized from normal values (A's spread over binades -spread..spread, so
// that blocks take different scales): block_gemm's output (the emulator's model) against `device`'s, whose outputs
// must share the model's bits (the message names the case and how many differ by more than one ulp).
template <class Device>
void expect_model_bits(const BlockGemmModel& model, const char* a_name, const char* b_name, int m, int n, int k,
                       std::uint64_t seed, int spread, Device device) {
  const BlockFormat fa = *parse_block_format(a_name), fb = *parse_block_format(b_name);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-spread, spread);
  std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(n) * k);
  for (auto& v : x) v = std::ldexp(normal(rng), binade(rng));
  for (auto& v : y) v = normal(rng);
  const BlockOperand a = quantize_block_operand(fa, x, m, k), bt = quantize_block_operand(fb, y, n, k);
  std::vector<float> cpu(static_cast<std::size_t>(m) * n), gpu_out(cpu.size());
  block_gemm(model, fa, a, fb, bt, cpu.data(), m, n, k);
  device(model, fa, a, fb, bt, gpu_out.data(), m, n, k);
  // Nothing vacuous: every output a finite nonzero number.
  CHECK(std::count_if(cpu.begin(), cpu.end(), [](float v) { return std::isfinite(v) && v != 0; }) ==
        static_cast<std::ptrdiff_t>(cpu.size()));
  std::size_t same = 0, beyond_ulp = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    same += bits_of(cpu[i]) == bits_of(gpu_out[i]);
    beyond_ulp += !(std::fabs(cpu[i] - gpu_out[i]) <= std::fabs(std::nextafter(cpu[i], INFINITY) - cpu[i]));
  }
  INFO(a_name << " x " << b_name << ", " << m << " x " << n << " x " << k << ": " << same << " of " << cpu.size()
              << " outputs the model's bits, " << beyond_ulp << " more than one ulp away");
  CHECK(same == cpu.size());
}

}  // namespace

TEST_CASE("the rounding kernel matches the emulator bit for bit, counters included", "[gpu]") {
  require_device();
  const auto input = mixed_values(1 << 20, 20261121);
  for (const Format& format : {formats::binary16, formats::bfloat16, formats::tf32, formats::e4m3, formats::e5m2,
                               *parse_format("e5m2:ftz"), *parse_format("e4m3:sat")}) {
    for (int m = 0; m <= static_cast<int>(RoundingMode::stochastic); ++m) {
      for (const int random_bits : {32, 8}) {
        if (random_bits != 32 && static_cast<RoundingMode>(m) != RoundingMode::stochastic) continue;
        QuantizeOptions options;
        options.rounding = {static_cast<RoundingMode>(m), random_bits};
        options.stochastic = {{7, 11}, std::uint64_t{5} << 32};
        options.path = Path::scalar;
        std::vector<float> expected(input.size());
        const QuantizeCounts expected_counts = quantize(format, input, expected, options);
        gpu::DeviceBuffer buffer(input.size());
        buffer.upload(input);
        const QuantizeCounts counts = gpu::quantize(format, buffer.data(), buffer.size(), options);
        std::vector<float> got(input.size());
        buffer.download(got);
        INFO(format.name() << ", " << to_string(options.rounding.mode) << ", random bits " << random_bits);
        std::size_t mismatches = 0, first = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          if (bits_of(got[i]) != bits_of(expected[i]) && mismatches++ == 0) first = i;
        INFO("first mismatch at " << first << ": input " << input[first] << " gpu " << got[first] << " emulator "
                                  << expected[first]);
        CHECK(mismatches == 0);
        CHECK(counts == expected_counts);
      }
    }
  }
}

TEST_CASE("the device exponent histogram matches TensorStats::add_values", "[gpu]") {
  require_device();
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    const auto values = mixed_values(n, n);
    core::TensorStats expected, got;
    const auto expected_classes = expected.add_values(values);
    gpu::DeviceBuffer buffer(n);
    buffer.upload(values);
    const auto classes = gpu::add_values(got, buffer.data(), n);
    INFO("n = " << n);
    CHECK(got == expected);
    CHECK(classes.subnormal == expected_classes.subnormal);
    CHECK(classes.infinite == expected_classes.infinite);
    CHECK(classes.nan == expected_classes.nan);
  }
}

TEST_CASE("cuBLAS GEMMs: exact on small integers, within the binary32 accumulation bound otherwise", "[gpu]") {
  require_device();
  const int m = 96, n = 80, k = 512;
  std::mt19937_64 rng(3);
  for (const auto input : {gpu::GemmInput::binary32, gpu::GemmInput::tf32, gpu::GemmInput::binary16,
                           gpu::GemmInput::bfloat16}) {
    const Format format = input == gpu::GemmInput::binary32   ? formats::binary32
                          : input == gpu::GemmInput::tf32     ? formats::tf32
                          : input == gpu::GemmInput::binary16 ? formats::binary16
                                                              : formats::bfloat16;
    INFO("inputs " << format.name());
    for (const bool integers : {true, false}) {
      std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(k) * n);
      std::uniform_int_distribution<int> small(-8, 8);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (auto& x : a) x = integers ? static_cast<float>(small(rng)) : normal(rng);
      for (auto& x : b) x = integers ? static_cast<float>(small(rng)) : normal(rng);
      // The reference sees the inputs as the GEMM does: rounded to nearest-even into the input format.
      std::vector<float> ar(a.size()), br(b.size());
      quantize(format, a, ar);
      quantize(format, b, br);
      gpu::DeviceBuffer da(a.size()), db(b.size()), dc(static_cast<std::size_t>(m) * n);
      da.upload(a);
      db.upload(b);
      gpu::gemm(input, da.data(), db.data(), dc.data(), m, n, k);
      std::vector<float> c(dc.size());
      dc.download(c);
      // Small integers: every product and partial sum is an integer below 2^24: exact in any order.
      // Otherwise |c - exact| <= gamma_k * sum |a||b| with gamma_k = k u / (1 - k u) (Higham, Accuracy and
      // Stability of Numerical Algorithms, 2002, eq. 3.5), for any order of summation: u = 2^-24 for
      // binary32 FMAs; u = 2^-23 on Tensor Cores, whose accumulation truncates (Fasi et al. 2021).
      const double u = std::ldexp(1.0, input == gpu::GemmInput::binary32 ? -24 : -23), gamma = k * u / (1 - k * u);
      std::size_t bad = 0;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double exact = 0, absolute = 0;
          for (int p = 0; p < k; ++p) {
            const double prod = static_cast<double>(ar[i * k + p]) * br[p * n + j];
            exact += prod;
            absolute += std::fabs(prod);
          }
          const double got = c[i * n + j];
          if (integers ? got != exact : std::fabs(got - exact) > gamma * absolute) ++bad;
        }
      INFO((integers ? "small integers" : "normal inputs"));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("block quantization on the device gives quantize_blocks' bits, scale codes and counts", "[gpu][block]") {
  // One thread per 1 x N row segment running the host/device quantize_block_row
  // (2-D tiles: each tile's scale first), against the CPU's fast path (itself
  // equal to the exact reference). 37 rows: 16 x 16 tiles in 3 rows of tiles, the last partial.
  require_device();
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp4", "nvfp4", "fp8-e4m3-1x128",
                           "nvfp4-16x16", "fp8-e4m3-128x128", "fp8-e4m3-tensor", "mxint8", "int8", "int4"}) {
    const BlockFormat f = *parse_block_format(name);
    for (const RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::stochastic}) {
      const std::int64_t rows = 37, cols = 3 * std::max(f.block_cols, 16) + 5;
      std::vector<float> x = mixed_values(static_cast<std::size_t>(rows * cols), 42);
      if (f.block_rows == 0) keep_one_scale_meaningful(x);
      BlockQuantizeOptions options;
      options.rounding = Rounding{mode};
      options.key = {11, 3};
      options.first_index = (std::uint64_t{2} << 32) - 100;
      std::vector<float> cpu(x.size()), gpu_out(x.size());
      const BlockSummary want = quantize_blocks(f, x, cpu, rows, cols, options);
      const BlockSummary got = gpu::quantize_blocks_on_device(f, x, gpu_out, rows, cols, options);
      INFO(name << " " << to_string(mode));
      for (std::size_t i = 0; i < x.size(); ++i) {
        INFO("element " << i);
        REQUIRE((std::isnan(cpu[i]) ? std::isnan(gpu_out[i]) : bits_of(cpu[i]) == bits_of(gpu_out[i])));
      }
      CHECK(got.scale_codes == want.scale_codes);
      CHECK(got.counts == want.counts);
    }
  }
}

TEST_CASE("the device block GEMM names the formats it cannot take", "[gpu][block]") {
  // No device needed: what the cuda backend refuses before a run (its block_gemm_refusal).
  const auto why = [](const char* a, const char* b) {
    return gpu::block_gemm_refusal_on_device(*parse_block_format(a), *parse_block_format(b));
  };
  CHECK(why("mxfp8-e4m3", "mxfp8-e4m3").empty());
  CHECK(why("nvfp4", "nvfp4-16x16").empty());
  CHECK(why("mxfp6-e3m2", "mxfp4").empty());
  CHECK(why("fp8-e4m3-tensor", "fp8-e4m3-tensor").empty());
  CHECK(why("fp8-e5m2-tensor", "fp8-e5m2-tensor").empty());  // 128-bit sums: E5M2 too
  CHECK_THAT(why("fp8-e4m3-1x128", "fp8-e4m3-128x128"), Catch::Contains("blocks shorter than k"));
  CHECK(gpu::block_gemm_refusal_on_device(*parse_block_format("fp8-e4m3-1x128"), *parse_block_format("fp8-e4m3-1x128"),
                                          128).empty());  // one tile spans k
  CHECK_THAT(why("mxfp8-e4m3", "fp8-e4m3-tensor"), Catch::Contains("binary32 scales and the other not"));
  CHECK(why("mxint8", "mxint8").empty());  // integer elements on the integer grid's pattern format
  CHECK(why("mxfp8-e5m2", "mxfp8-e5m2").empty());  // 128-bit block sums (block_scaled_dot_exact)
  CHECK(why("mxfp8-e5m2", "mxfp8-e4m3").empty());
  CHECK_THAT(why("mxfp8-e4m3", "nvfp4"), Catch::Contains("blocks along k differ"));
}

TEST_CASE("block-scaled operands and GEMMs on the device give quantize_block_operand's and block_gemm's bits",
          "[gpu][block]") {
  // Elements kept by quantize_block_row, and one thread per output running the host/device
  // block_scaled_dot, against the CPU's quantize_block_operand and block_gemm (exact block partials).
  require_device();
  // B^T in 16 x 16 tiles (NVFP4's weights) beside 1 x 16 blocks of A: the tile's scale serves 16 rows.
  const std::pair<const char*, const char*> pairs[] = {{"mxfp8-e4m3", "mxfp8-e4m3"}, {"mxfp6-e2m3", "mxfp6-e2m3"},
                                                       {"mxfp4", "mxfp4"}, {"nvfp4", "nvfp4"},
                                                       {"nvfp4", "nvfp4-16x16"},
                                                       {"fp8-e4m3-tensor", "fp8-e4m3-tensor"},
                                                       {"fp8-e5m2-tensor", "fp8-e4m3-tensor"},
                                                       {"fp8-e5m2-tensor", "fp8-e5m2-tensor"},
                                                       {"mxint8", "mxint8"},
                                                       {"mxfp8-e5m2", "mxfp8-e5m2"},
                                                       {"mxfp8-e5m2", "mxfp8-e4m3"}};
  for (const auto& [a_name, b_name] : pairs) {
    const BlockFormat fa = *parse_block_format(a_name), fb = *parse_block_format(b_name);
    const int m = 33, n = 65, k = 4 * std::max(fa.block_cols, 32) + 3;  // per tensor: one block of 131
    std::vector<float> x = mixed_values(static_cast<std::size_t>(m) * k, 7);
    std::vector<float> y = mixed_values(static_cast<std::size_t>(n) * k, 8);
    if (fa.scale != ScaleFormat::e8m0) {
      keep_one_scale_meaningful(x);
      keep_one_scale_meaningful(y);
    }
    BlockQuantizeOptions options;
    options.rounding = Rounding{RoundingMode::stochastic};
    options.key = {5, 1};
    const BlockOperand a = quantize_block_operand(fa, x, m, k, options);
    const BlockOperand bt = quantize_block_operand(fb, y, n, k, options);
    INFO(a_name << " x " << b_name);
    for (const auto& [f, values, rows, want] : {std::tuple{fa, &x, m, &a}, std::tuple{fb, &y, n, &bt}}) {
      const BlockOperand got = gpu::quantize_block_operand_on_device(f, *values, rows, k, options);
      for (std::size_t i = 0; i < values->size(); ++i) {
        INFO("element " << i);
        REQUIRE((std::isnan(want->elements[i]) ? std::isnan(got.elements[i])
                                               : bits_of(want->elements[i]) == bits_of(got.elements[i])));
      }
      CHECK(got.scale_codes == want->scale_codes);
      CHECK(got.counts == want->counts);
    }
    std::vector<float> cpu(static_cast<std::size_t>(m) * n), gpu_out(cpu.size());
    block_gemm({}, fa, a, fb, bt, cpu.data(), m, n, k);
    CHECK(std::count_if(cpu.begin(), cpu.end(), [](float v) { return std::isfinite(v) && v != 0; }) >
          static_cast<std::ptrdiff_t>(cpu.size() / 4));  // many outputs are numbers: the comparison means something
    gpu::block_gemm_on_device(fa, a, fb, bt, gpu_out.data(), m, n, k);
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      INFO("output " << i);
      REQUIRE((std::isnan(cpu[i]) ? std::isnan(gpu_out[i]) : bits_of(cpu[i]) == bits_of(gpu_out[i])));
    }
  }
  // Refused: binary32 scales on blocks shorter than k.
  const BlockFormat tiles = *parse_block_format("fp8-e4m3-1x128");
  const std::vector<float> v = mixed_values(256, 9);
  const BlockOperand q = quantize_block_operand(tiles, v, 1, 256);
  float out = 0;
  CHECK_THROWS_AS(gpu::block_gemm_on_device(tiles, q, tiles, q, &out, 1, 1, 256), std::invalid_argument);
}

TEST_CASE("the device's tensor-core block GEMM names what it cannot take", "[gpu][block]") {
  // The reasons that need no device come first: on every machine with CUDA built.
  const TensorCoreModel h100 = *tensor_core_preset("h100", formats::e4m3, formats::binary32);
  const auto why = [](const char* a, const char* b, const TensorCoreModel& model) {
    return gpu::tensor_core_block_gemm_refusal(*parse_block_format(a), *parse_block_format(b), model);
  };
  CHECK_THAT(why("fp8-e4m3-1x128", "fp8-e4m3-128x128", *tensor_core_preset("a100", formats::binary16, formats::binary32)),
             Catch::Contains("does not emulate"));
  CHECK_THAT(why("fp8-e4m3-1x128", "fp8-e4m3-128x128", *tensor_core_preset("h100", formats::e4m3, formats::binary16)),
             Catch::Contains("does not emulate"));  // the mma.sync binary16-output row is not what cuBLASLt sums
  CHECK_THAT(why("mxfp8-e4m3", "mxfp8-e4m3", h100), Catch::Contains("binary32 (software) scales only"));
  CHECK_THAT(why("mxfp4", "mxfp4", h100), Catch::Contains("FP8 (E4M3, E5M2) elements only"));
  CHECK_THAT(why("fp8-e5m2-tensor", "fp8-e5m2-tensor", h100), Catch::Contains("E5M2 x E5M2"));
  CHECK_THAT(why("fp8-e4m3-1x128", "fp8-e4m3-tensor", h100), Catch::Contains("one scale along k and the other tiles"));
  // The formats and model it takes: refused only for want of an H100/H200 (or accepted on one). DeepSeek-V3's
  // tiles, and one scale per operand (fp8-current's points: E5M2 gradients times E4M3 in dgrad and wgrad).
  for (const auto& [a, b] : {std::pair{"fp8-e4m3-1x128", "fp8-e4m3-128x128"}, std::pair{"fp8-e4m3-tensor", "fp8-e4m3-tensor"},
                             std::pair{"fp8-e5m2-tensor", "fp8-e4m3-tensor"}}) {
    INFO(a << " x " << b);
    const std::string taken = why(a, b, h100);
    if (gpu::compute_capability().major == 9) CHECK(taken.empty());
    else CHECK_THAT(taken, Catch::Contains("compute capability 9.x"));
  }
}

TEST_CASE("cuBLASLt's block-scale layout: NVIDIA's worked example, and every scale at its own byte", "[gpu][block]") {
  // No device needed. The documentation's example (nvmath-python's get_block_scale_offset, after the cuBLAS
  // guide's "1D Block Scaling Factors Layout"): NVFP4 A of 128 x 128, blocks of 16 (8 along k): row 5's block 2
  // at byte 82, its block 5 at byte 593 (the second tile along k).
  CHECK(gpu::block_scale_offset(5, 2, 8) == 82);
  CHECK(gpu::block_scale_offset(5, 5, 8) == 593);
  CHECK(gpu::block_scale_bytes(128, 8) == 1024);
  // Past 128 rows the tiles run along k first, then down the rows (the documentation's formula; PyTorch's
  // to_blocked permutes (row tiles, k tiles, 128, 4) the same way): row 130's first block opens the third tile.
  CHECK(gpu::block_scale_offset(130, 0, 8) == 2 * 512 + 2 * 16);
  CHECK(gpu::block_scale_bytes(130, 8) == 2048);
  // Every (row, block) of padded shapes lands on a distinct byte inside the array, which it fills.
  for (const auto& [rows, groups] : {std::pair{128, 4}, std::pair{256, 12}, std::pair{384, 8}, std::pair{128, 1}}) {
    const std::int64_t tiles_k = gpu::block_scale_tile_columns(groups) * 4;
    std::vector<int> hits(static_cast<std::size_t>(gpu::block_scale_bytes(rows, groups)), 0);
    for (int r = 0; r < (rows + 127) / 128 * 128; ++r)
      for (int g = 0; g < tiles_k; ++g) {
        const std::int64_t at = gpu::block_scale_offset(r, g, groups);
        REQUIRE(at >= 0);
        REQUIRE(at < static_cast<std::int64_t>(hits.size()));
        ++hits[static_cast<std::size_t>(at)];
      }
    INFO(rows << " rows, " << groups << " blocks");
    CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  }
}

TEST_CASE("Blackwell's block-scaled GEMM names what it cannot take", "[gpu][block]") {
  const BlockFormat mx = *parse_block_format("mxfp8-e4m3"), nv = *parse_block_format("nvfp4");
  const TensorCoreModel b200 = *tensor_core_preset("b200", formats::e4m3, formats::binary32);
  const TensorCoreModel b200_fp4 = *tensor_core_preset("b200", formats::e2m1, formats::binary32);
  CHECK_THAT(gpu::native_block_gemm_refusal(mx, nv, b200, 0), Catch::Contains("MXFP8"));
  CHECK_THAT(gpu::native_block_gemm_refusal(*parse_block_format("mxfp4"), *parse_block_format("mxfp4"), b200, 0),
             Catch::Contains("MXFP8"));
  CHECK_THAT(gpu::native_block_gemm_refusal(mx, mx, *tensor_core_preset("h100", formats::e4m3, formats::binary32), 0),
             Catch::Contains("does not give"));
  CHECK_THAT(gpu::native_block_gemm_refusal(mx, mx, b200, 64), Catch::Contains("promotion interval"));
  const BlockFormat mx5 = *parse_block_format("mxfp8-e5m2");
  CHECK_THAT(gpu::native_block_gemm_refusal(mx5, mx5, *tensor_core_preset("b200", formats::e5m2, formats::binary32), 0),
             Catch::Contains("E5M2 x E5M2"));
  // Taken, or refused only for want of a Blackwell: MXFP8, NVFP4 with 16 x 16 weight tiles.
  for (const auto& [a, b, model] : {std::tuple{mx, mx, b200}, std::tuple{nv, *parse_block_format("nvfp4-16x16"), b200_fp4}}) {
    const std::string why = gpu::native_block_gemm_refusal(a, b, model, 0);
    INFO(a.name() << " x " << b.name());
    if (gpu::compute_capability().major == 10) CHECK(why.empty());
    else CHECK_THAT(why, Catch::Contains("compute capability 10.x"));
  }
}

TEST_CASE("Blackwell's block-scaled GEMM against the b200 model (unvalidated: this case measures it)",
          "[gpu][block]") {
  // The emulator's b200 row for FP8 and FP4 inputs (scaled products through the tensor-core accumulator, no
  // promotion) is ours, from NVIDIA's documentation; cuBLASLt's block-scaled GEMM is the hardware. Every output
  // bit for bit; a mismatch says the model is wrong somewhere (docs/tensor_cores.md), with the counts in the log.
  require_device();
  if (gpu::compute_capability().major != 10)
    test::skip("block-scaled tensor cores: needs a Blackwell data-center GPU (sm_100)");
  const std::tuple<const char*, const char*, Format> pairs[] = {{"mxfp8-e4m3", "mxfp8-e4m3", formats::e4m3},
                                                                {"mxfp8-e5m2", "mxfp8-e4m3", formats::e5m2},
                                                                {"nvfp4", "nvfp4-16x16", formats::e2m1}};
  // m, n not multiples of 128; k with a partial last block, or whole tiles of scales.
  const int shapes[][3] = {{35, 40, 300}, {130, 17, 256}, {16, 16, 64}};
  std::uint64_t seed = 90;
  for (const auto& [a_name, b_name, element] : pairs)
    for (const auto& [m, n, k] : shapes) {
      BlockGemmModel model;
      model.tensor_core = *tensor_core_preset("b200", element, formats::binary32);
      expect_model_bits(model, a_name, b_name, m, n, k, ++seed, 6, gpu::native_block_gemm_on_device);
    }
}

TEST_CASE("Per-tensor FP8 (fp8-current, gemm = h100) on the H100's tensor cores gives block_gemm's bits",
          "[gpu][block]") {
  // One binary32 scale per operand: block_gemm sums all of k through the h100 FP8 model, then multiplies by
  // both scales in one FMA; the device takes the sum from one cuBLASLt FP8 call (fast accumulation).
  require_device();
  if (gpu::compute_capability().major != 9) test::skip("the tensor cores' FP8 sums are the H100's: needs an sm_90 device");
  const std::pair<const char*, const char*> pairs[] = {{"fp8-e4m3-tensor", "fp8-e4m3-tensor"},
                                                       {"fp8-e5m2-tensor", "fp8-e4m3-tensor"}};
  // k not a multiple of 16 (padded with zeros), and long sums where the accumulator's 14 bits lose most.
  const int shapes[][3] = {{35, 40, 300}, {17, 130, 1000}, {16, 16, 16}};
  std::uint64_t seed = 70;
  for (const auto& [a_name, b_name] : pairs)
    for (const auto& [m, n, k] : shapes) {
      BlockGemmModel model;
      model.tensor_core = *tensor_core_preset("h100", parse_block_format(a_name)->element.floating.value(),
                                              formats::binary32);
      model.promotion_interval = k;  // block_scaled_gemm's: one block spans k
      expect_model_bits(model, a_name, b_name, m, n, k, ++seed, 0, gpu::tensor_core_block_gemm_on_device);
    }
}

TEST_CASE("DeepSeek-V3's FP8 GEMM on the H100's tensor cores gives block_gemm's bits", "[gpu][block]") {
  // The CPU's block_gemm through the h100 FP8 model, promoted to binary32 every 128 products with the tiles'
  // scales, against the same with each block's partials from cuBLASLt's FP8 GEMM (fast accumulation).
  require_device();
  if (gpu::compute_capability().major != 9) test::skip("the tensor cores' FP8 sums are the H100's: needs an sm_90 device");
  BlockGemmModel model;
  model.tensor_core = *tensor_core_preset("h100", formats::e4m3, formats::binary32);
  model.promotion_interval = 128;
  const std::pair<const char*, const char*> pairs[] = {{"fp8-e4m3-1x128", "fp8-e4m3-128x128"},
                                                       {"fp8-e4m3-1x128", "fp8-e4m3-1x128"}};
  // m, n: not multiples of 16; k: two whole tiles and one of 44 (padded to 48 for cuBLASLt), or a single tile.
  const int shapes[][3] = {{35, 40, 300}, {130, 17, 128}, {16, 16, 64}};
  std::uint64_t seed = 40;
  for (const auto& [a_name, b_name] : pairs)
    for (const auto& [m, n, k] : shapes)  // A's elements far from their tile's amax flush
      expect_model_bits(model, a_name, b_name, m, n, k, ++seed, 12, gpu::tensor_core_block_gemm_on_device);
}
