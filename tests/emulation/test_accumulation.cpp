// Accumulation models: the tensor-core models against every case measured on
// V100, A100 and H100 (shared/tensor-core-vectors/), hand-worked blocks, the
// exact reference against MPFR, the summation models against step-by-step
// emulator arithmetic, the truncation bias, names, and the GEMM kernels
// against the element-by-element model.
#include <unistd.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/arithmetic.hpp"
#include "mpsim/emulation/simd.hpp"
#include "mpsim/emulation/tensor_core_vectors.hpp"
#include "support/mpfr_oracle.hpp"
#include "support/test_support.hpp"

namespace mpsim {
namespace {

namespace fs = std::filesystem;
using Rng = std::mt19937_64;

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

std::string hex(float x) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%08x (%a)", bits(x), static_cast<double>(x));
  return text;
}

// Same bits, or both NaN.
bool same(float x, float y) { return bits(x) == bits(y) || (std::isnan(x) && std::isnan(y)); }

float value_of(const Format& f, float x) { return to_float(f, round_to_format(f, Rounding{}, x).bits); }

TensorCoreModel preset(std::string_view gpu, const Format& in, const Format& out) {
  const auto m = tensor_core_preset(gpu, in, out);
  REQUIRE(m.has_value());
  return *m;
}

// --- Measured vectors ---------------------------------------------------------

fs::path vectors_or_skip(std::string_view gpu, const Format& input) {
  const auto shared = test::shared_dir();
  if (!shared) test::skip("no shared/ folder (set MPSIM_SHARED_DIR): tensor-core vectors not checked");
  const fs::path dir = *shared / "tensor-core-vectors";
  const fs::path folder = dir / std::string(gpu) / tensor_core_vector_name(input, false);
  if (!fs::is_directory(folder)) test::skip("no " + folder.string() + ": tensor-core vectors not checked");
  return dir;
}

void check_vectors(std::string_view gpu, const Format& input, const Format& output) {
  const fs::path dir = vectors_or_skip(gpu, input);
  const VectorCheck check = validate_tensor_core_vectors(dir, gpu, input, output);
  std::printf("%.*s %s -> %s: %zu passed, %zu failed\n", static_cast<int>(gpu.size()), gpu.data(), input.name().c_str(),
              output.name().c_str(), check.passed, check.failed);
  std::string failures;
  for (const auto& f : check.first_failures) failures += "\n  " + f;
  INFO(check.passed << " passed, " << check.failed << " failed" << failures);
  REQUIRE(check.passed == 5000);
  REQUIRE(check.failed == 0);
}

using namespace formats;

TEST_CASE("tensor-core vectors: V100 fp16 -> fp32", "[accumulation][vectors]") {
  check_vectors("V100", binary16, binary32);
}
TEST_CASE("tensor-core vectors: V100 fp16 -> fp16", "[accumulation][vectors]") {
  check_vectors("V100", binary16, binary16);
}
TEST_CASE("tensor-core vectors: A100 fp16 -> fp32", "[accumulation][vectors]") {
  check_vectors("A100", binary16, binary32);
}
TEST_CASE("tensor-core vectors: A100 fp16 -> fp16", "[accumulation][vectors]") {
  check_vectors("A100", binary16, binary16);
}
TEST_CASE("tensor-core vectors: A100 bf16 -> fp32", "[accumulation][vectors]") {
  check_vectors("A100", bfloat16, binary32);
}
TEST_CASE("tensor-core vectors: A100 tf32 -> fp32", "[accumulation][vectors]") {
  check_vectors("A100", tf32, binary32);
}
TEST_CASE("tensor-core vectors: H100 fp16 -> fp32", "[accumulation][vectors]") {
  check_vectors("H100", binary16, binary32);
}
TEST_CASE("tensor-core vectors: H100 fp16 -> fp16", "[accumulation][vectors]") {
  check_vectors("H100", binary16, binary16);
}
TEST_CASE("tensor-core vectors: H100 bf16 -> fp32", "[accumulation][vectors]") {
  check_vectors("H100", bfloat16, binary32);
}
TEST_CASE("tensor-core vectors: H100 tf32 -> fp32", "[accumulation][vectors]") {
  check_vectors("H100", tf32, binary32);
}
TEST_CASE("tensor-core vectors: H100 e4m3 -> fp32", "[accumulation][vectors]") {
  check_vectors("H100", e4m3, binary32);
}
TEST_CASE("tensor-core vectors: H100 e4m3 -> fp16", "[accumulation][vectors]") {
  check_vectors("H100", e4m3, binary16);
}
TEST_CASE("tensor-core vectors: H100 e5m2 -> fp32", "[accumulation][vectors]") {
  check_vectors("H100", e5m2, binary32);
}
TEST_CASE("tensor-core vectors: H100 e5m2 -> fp16", "[accumulation][vectors]") {
  check_vectors("H100", e5m2, binary16);
}

// The vectors pin the parameters down: each nearby variant of a preset fails
// some cases (so the checks above can fail, and each parameter is needed).
TEST_CASE("tensor-core vectors reject nearby models", "[accumulation][vectors]") {
  const fs::path dir = vectors_or_skip("H100", binary16);
  struct Variant {
    std::string what, gpu;
    Format input, output;
    TensorCoreModel model;
  };
  std::vector<Variant> variants;
  auto add = [&](std::string what, std::string gpu, Format in, Format out, auto change) {
    TensorCoreModel m = preset(gpu, in, out);
    change(m);
    variants.push_back({std::move(what), std::move(gpu), in, out, m});
  };
  add("V100 with 1 extra alignment bit", "V100", binary16, binary32, [](auto& m) { m.fraction_bits = 24; });
  add("A100 without its extra bit", "A100", binary16, binary32, [](auto& m) { m.fraction_bits = 23; });
  add("A100 rounding to nearest", "A100", binary16, binary32, [](auto& m) { m.rounding = RoundingMode::nearest_even; });
  add("H100 with 3 extra bits", "H100", binary16, binary32, [](auto& m) { m.fraction_bits = 26; });
  add("H100 with 1 extra bit", "H100", bfloat16, binary32, [](auto& m) { m.fraction_bits = 24; });
  add("H100 fp16 output truncated", "H100", binary16, binary16,
      [](auto& m) { m.rounding = RoundingMode::toward_zero; });
  add("H100 e4m3 with a 24-bit sum", "H100", e4m3, binary32, [](auto& m) { m.result_precision = 0; });
  add("H100 e4m3 with 2 extra bits", "H100", e4m3, binary32, [](auto& m) { m.fraction_bits = 25; });
  add("H100 e4m3 fp16 as one block", "H100", e4m3, binary16, [](auto& m) { m.groups = 1; });
  add("H100 e4m3 fp16, odd and even products", "H100", e4m3, binary16, [](auto& m) { m.group_run = 1; });
  add("H100 e5m2 fp16, c in the first group", "H100", e5m2, binary16, [](auto& m) { m.c_added_last = false; });
  add("H100 e5m2 fp16, halves", "H100", e5m2, binary16, [](auto& m) { m.group_run = 16; });
  for (const auto& v : variants) {
    if (!fs::is_directory(dir / v.gpu / tensor_core_vector_name(v.input, false))) continue;
    const VectorCheck check = validate_tensor_core_vectors(dir, v.gpu, v.input, v.output, v.model);
    std::printf("variant %s: %zu passed, %zu failed\n", v.what.c_str(), check.passed, check.failed);
    INFO(v.what << ": " << check.passed << " passed, " << check.failed << " failed");
    CHECK(check.failed > 0);
  }
}

// The reader on a small folder written here: plain text read through zlib.
TEST_CASE("tensor-core vector reader", "[accumulation]") {
  const fs::path dir = fs::temp_directory_path() / ("mpsim-tc-vectors-" + std::to_string(::getpid()));
  const fs::path folder = dir / "V100" / "fp16";
  fs::create_directories(folder);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(folder / name) << text; };
  // 1+2+3+4 (+0.5) and a case whose recorded d is wrong.
  write("a_V100_fp16.txt.gz", "3f800000 40000000 40400000 40800000\n3f800000 3f800000 3f800000 3f800000\n");
  write("b_V100_fp16.txt.gz", "3f800000 3f800000 3f800000 3f800000\n3f800000 3f800000 3f800000 3f800000\n");
  write("c_V100_fp32.txt.gz", "00111111000000000000000000000000\n00000000000000000000000000000000\n");
  write("d_V100_fp32.txt.gz", "01000001001010000000000000000000\n01000000100000000000000000000001\n");
  const VectorCheck check = validate_tensor_core_vectors(dir, "V100", binary16, binary32);
  CHECK(check.passed == 1);
  CHECK(check.failed == 1);
  REQUIRE(check.first_failures.size() == 1);
  CHECK(check.first_failures[0].find("case 2") != std::string::npos);
  write("c_V100_fp32.txt.gz", "0011111100000000000000000000000\n");  // 31 digits, and one line short
  CHECK_THROWS(validate_tensor_core_vectors(dir, "V100", binary16, binary32));
  CHECK_THROWS_AS(validate_tensor_core_vectors(dir, "V100", bfloat16, binary32), std::invalid_argument);
  fs::remove_all(dir);
}

// The message of what `f` throws as std::runtime_error ("" when nothing).
template <typename F>
std::string runtime_error_of(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// Reading apart from checking: names in any case, and damaged files refused
// with the file at fault, never rounded or blamed on another.
TEST_CASE("tensor-core vector reader refuses damaged files", "[accumulation]") {
  const fs::path dir = fs::temp_directory_path() / ("mpsim-tc-damaged-" + std::to_string(::getpid()));
  const fs::path folder = dir / "v100" / "FP16";  // a GPU and format folder in other cases than the names inside
  fs::create_directories(folder);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(folder / name) << text; };
  const std::string one = "3f800000 3f800000 3f800000 3f800000\n";
  write("a_V100_fp16.txt", one);
  write("B_v100_FP16.txt.gz", one);
  write("c_V100_fp32.txt", "00000000000000000000000000000000\n");
  write("d_V100_fp32.txt", "01000000100000000000000000000000\n");  // 4
  const MeasuredFiles files = find_measured_files(dir, "V100", binary16, binary32);
  CHECK(files.folder == folder);
  CHECK(files.b.found);
  CHECK(files.b.path.filename() == "B_v100_FP16.txt.gz");
  CHECK_FALSE(find_measured_files(dir, "V100", binary16, binary16).d.found);
  const auto cases = read_measured_cases(files);
  REQUIRE(cases.size() == 1);
  CHECK(check_measured_cases(cases, preset("V100", binary16, binary32)).passed == 1);

  // A value more in a than in b: a is at fault, and both counts are said.
  write("a_V100_fp16.txt", "3f800000 3f800000 3f800000 3f800000 3f800000\n");
  std::string why = runtime_error_of([&] { read_measured_cases(files); });
  CHECK(why.find("a_V100_fp16.txt:1 holds 5 values but B_v100_FP16.txt.gz:1 holds 4") != std::string::npos);
  CHECK(why.find("restore the folder") != std::string::npos);
  // Not 8 hex digits, in a: a is named.
  write("a_V100_fp16.txt", "3f800000 3f80000g 3f800000 3f800000\n");
  why = runtime_error_of([&] { read_measured_cases(files); });
  CHECK(why.find("a_V100_fp16.txt:1: '3f80000g' is not 8 hex digits") != std::string::npos);
  // 1 + 2^-23 is no binary16 value: damaged, not rounded to 1.
  write("a_V100_fp16.txt", "3f800001 3f800000 3f800000 3f800000\n");
  why = runtime_error_of([&] { read_measured_cases(files); });
  CHECK(why.find("a_V100_fp16.txt:1: 3f800001 is not a binary16 value") != std::string::npos);
  write("a_V100_fp16.txt", one);
  // A gzip stream cut short: its path once, zlib's reason.
  {
    std::ofstream out(folder / "B_v100_FP16.txt.gz", std::ios::binary);
    const unsigned char header[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0x33};  // a gzip header, then one byte
    out.write(reinterpret_cast<const char*>(header), sizeof header);
  }
  why = runtime_error_of([&] { read_measured_cases(files); });
  const std::string path = files.b.path.string();
  CHECK(why.find(path) != std::string::npos);
  CHECK(why.find(path + ": " + path) == std::string::npos);
  write("B_v100_FP16.txt.gz", one);
  // A missing file is named as looked for (the GPU spelled as its folder).
  fs::remove(folder / "c_V100_fp32.txt");
  why = runtime_error_of([&] { read_measured_cases(find_measured_files(dir, "V100", binary16, binary32)); });
  CHECK(why.find("v100/FP16/c_v100_fp32.txt.gz is missing") != std::string::npos);
  // Two GPU folders that differ only in case: not ours to choose.
  fs::create_directories(dir / "V100");
  why = runtime_error_of([&] { find_measured_files(dir, "V100", binary16, binary32); });
  CHECK(why.find("differ only in case") != std::string::npos);
  fs::remove_all(dir);
}

// --- The block model by hand ------------------------------------------------------

// 1 + a product of 1.5*2^-24 below it, negative: V100 keeps 23 bits below
// 2^0 (the product vanishes), A100 24 (it becomes -2^-24), H100 25 (exact,
// then the sum 1 - 3*2^-25 is truncated to 1 - 2^-23).
TEST_CASE("tensor-core alignment: bits below the accumulator are dropped", "[accumulation]") {
  const std::vector<float> a = {1.0f, 0x1p-10f, 0.0f, 0.0f}, b = {1.0f, -0x1.8p-14f, 0.0f, 0.0f};
  CHECK(hex(tensor_core_dot(preset("V100", binary16, binary32), a, b, 0.0f)) == hex(1.0f));
  CHECK(hex(tensor_core_dot(preset("A100", binary16, binary32), a, b, 0.0f)) == hex(1.0f - 0x1p-24f));
  CHECK(hex(tensor_core_dot(preset("H100", binary16, binary32), a, b, 0.0f)) == hex(1.0f - 0x1p-23f));
  // The exact result rounded to nearest is 1 - 2^-23 (a tie, to even).
  AccumulationModel exact;
  exact.kind = AccumulationKind::exact;
  CHECK(hex(dot(exact, a, b, 0.0f)) == hex(1.0f - 0x1p-23f));
}

TEST_CASE("tensor-core alignment: c takes part, and a carry is truncated", "[accumulation]") {
  const TensorCoreModel h100 = preset("H100", binary16, binary32);
  // c = 2^30 dominates: the products (1 each) are far below 2^(30-25) and vanish.
  std::vector<float> ones(16, 1.0f);
  CHECK(hex(tensor_core_dot(h100, ones, ones, 0x1p30f)) == hex(0x1p30f));
  // 16 products of (2 - 2^-10)^2 carry into 2^6; the sum is truncated to 24 bits.
  std::vector<float> x(16, 2.0f - 0x1p-10f);
  const double exact = 16.0 * (2.0 - 0x1p-10) * (2.0 - 0x1p-10) + 0x1p-20;
  const float got = tensor_core_dot(h100, x, x, 0x1p-20f);
  const float truncated = std::nextafter(static_cast<float>(exact), 0.0f);  // exact is not a float; RN rounds up here
  CHECK(static_cast<double>(got) <= exact);
  CHECK((got == static_cast<float>(exact) || got == truncated));
  CHECK(static_cast<double>(std::nextafter(got, INFINITY)) > exact);
}

TEST_CASE("tensor-core chains blocks along k", "[accumulation]") {
  Rng rng(7);
  std::normal_distribution<float> normal;
  for (const auto& [gpu, in, out] : {std::tuple{"V100", binary16, binary32}, std::tuple{"A100", bfloat16, binary32},
                                     std::tuple{"H100", binary16, binary16}, std::tuple{"H100", e4m3, binary16},
                                     std::tuple{"H100", e5m2, binary32}}) {
    const TensorCoreModel m = preset(gpu, in, out);
    std::vector<float> a(3 * m.block_size + 3), b(a.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      a[k] = value_of(in, normal(rng));
      b[k] = value_of(in, normal(rng));
    }
    const float c = value_of(out, normal(rng));
    float chained = value_of(out, c);
    for (std::size_t start = 0; start < a.size(); start += m.block_size) {
      const std::size_t n = std::min<std::size_t>(m.block_size, a.size() - start);
      chained = tensor_core_dot(m, std::span(a).subspan(start, n), std::span(b).subspan(start, n), chained);
    }
    INFO(to_string(m));
    CHECK(hex(tensor_core_dot(m, a, b, c)) == hex(chained));
  }
}

TEST_CASE("tensor-core inputs, outputs and special values", "[accumulation]") {
  const TensorCoreModel h100 = preset("H100", binary16, binary32), h100_16 = preset("H100", binary16, binary16);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> one = {1.0f};
  // Inputs are rounded to binary16 first (1 + 2^-12 -> 1), c to the binary16 output.
  CHECK(tensor_core_dot(h100, std::vector<float>{1.0f + 0x1p-12f}, one, 0.0f) == 1.0f);
  CHECK(tensor_core_dot(h100_16, one, one, 0x1p-12f) == 1.0f);
  CHECK(tensor_core_dot(h100_16, one, one, 0x1.8p-11f) == 1.0f + 0x1p-10f);  // 1 + 0.75 ulp -> up
  CHECK(tensor_core_dot(h100_16, one, one, 0x1p-11f) == 1.0f);               // 1 + 0.5 ulp -> even
  CHECK(tensor_core_dot(h100_16, one, one, 0x1.8p-10f) == 1.0f + 0x1p-9f);   // 1 + 1.5 ulp -> even
  CHECK(tensor_core_dot(h100_16, std::vector<float>{256.0f}, std::vector<float>{256.0f}, 0.0f) == inf);
  const TensorCoreModel h100_bf16 = preset("H100", bfloat16, binary32);
  CHECK(tensor_core_dot(h100_bf16, std::vector<float>{0x1p100f}, std::vector<float>{0x1p100f}, 0.0f) ==
        std::numeric_limits<float>::max());  // truncation overflows to the largest finite (IEEE 754 §7.4)
  CHECK(tensor_core_dot(h100, std::vector<float>{65504.0f}, std::vector<float>{65504.0f}, 0x1p127f) == 0x1p127f);
  // Infinities and NaNs (IEEE 754 per block; NaN is the canonical 0x7fffffff).
  CHECK(tensor_core_dot(h100, std::vector<float>{inf}, one, 1.0f) == inf);
  CHECK(bits(tensor_core_dot(h100, std::vector<float>{inf}, std::vector<float>{0.0f}, 1.0f)) == 0x7FFFFFFFu);
  CHECK(bits(tensor_core_dot(h100, std::vector<float>{inf, -inf}, std::vector<float>{1.0f, 1.0f}, 0.0f)) ==
        0x7FFFFFFFu);
  CHECK(bits(tensor_core_dot(h100, one, one, nan)) == 0x7FFFFFFFu);
  CHECK(bits(tensor_core_dot(h100_16, one, one, nan)) == 0x7FFFE000u);
  CHECK(tensor_core_dot(h100, std::vector<float>(20, 1.0f), std::vector<float>(20, 1.0f), -inf) == -inf);
  // Zeros: a cancellation is +0; a sum of zeros is -0 only when all are.
  CHECK(bits(tensor_core_dot(h100, std::vector<float>{1.0f, -1.0f}, std::vector<float>{1.0f, 1.0f}, -0.0f)) == 0u);
  CHECK(bits(tensor_core_dot(h100, std::vector<float>{-0.0f}, one, -0.0f)) == 0x80000000u);
  CHECK(bits(tensor_core_dot(h100, std::vector<float>{0.0f}, one, -0.0f)) == 0u);
  // Subnormal inputs count at emin; subnormal results are produced (bf16 products reach them).
  CHECK(tensor_core_dot(h100, std::vector<float>{0x1p-24f}, std::vector<float>{0x1p-24f}, 0.0f) == 0x1p-48f);
  CHECK(tensor_core_dot(preset("H100", bfloat16, binary32), std::vector<float>{0x1p-100f},
                        std::vector<float>{0x1.8p-40f}, 0.0f) == 0x1.8p-140f);
  CHECK(tensor_core_dot(h100, std::vector<float>{}, std::vector<float>{}, 0x1p-140f) == 0x1p-140f);
  // binary16 output: a result below binary16's range is rounded to its subnormals.
  CHECK(tensor_core_dot(h100_16, std::vector<float>{0x1p-14f}, std::vector<float>{0x1.8p-10f}, 0.0f) == 0x1p-23f);
  CHECK(tensor_core_dot(h100_16, std::vector<float>{0x1p-14f}, std::vector<float>{0x1.cp-10f}, 0.0f) == 0x1p-23f);
  CHECK(tensor_core_dot(h100_16, std::vector<float>{0x1p-14f}, std::vector<float>{0x1p-11f}, 0.0f) == 0.0f);
  // Flush-to-zero formats: subnormal inputs read as zero, subnormal results flushed.
  TensorCoreModel ftz = preset("H100", bfloat16, binary32);
  ftz.output.subnormals = Subnormals::flush_to_zero;
  CHECK(tensor_core_dot(ftz, std::vector<float>{0x1p-100f}, std::vector<float>{0x1.8p-40f}, 0.0f) == 0.0f);
  ftz = preset("H100", binary16, binary32);
  ftz.input.subnormals = Subnormals::flush_to_zero;
  CHECK(tensor_core_dot(ftz, std::vector<float>{0x1p-24f, 1.0f}, std::vector<float>{1.0f, 0x1p-14f}, 0.0f) == 0x1p-14f);
  CHECK_THROWS_AS(tensor_core_dot(h100, one, std::vector<float>{1.0f, 2.0f}, 0.0f), std::invalid_argument);
  TensorCoreModel odd = h100;
  odd.output = bfloat16;
  CHECK_THROWS_AS(tensor_core_dot(odd, one, one, 0.0f), std::invalid_argument);
}

TEST_CASE("tensor-core presets", "[accumulation]") {
  CHECK(tensor_core_preset("v100", binary16, binary32)->block_size == 4);
  CHECK(tensor_core_preset("A100", tf32, binary32)->block_size == 4);
  CHECK(tensor_core_preset("H100", tf32, binary32)->block_size == 8);
  CHECK(tensor_core_preset("H100", e5m2, binary32)->result_precision == 14);
  CHECK(tensor_core_preset("H100", e5m2, binary16)->c_added_last);
  CHECK_FALSE(tensor_core_preset("V100", bfloat16, binary32));
  CHECK_FALSE(tensor_core_preset("A100", e4m3, binary32));
  CHECK_FALSE(tensor_core_preset("A100", bfloat16, binary16));
  CHECK_FALSE(tensor_core_preset("H100", binary16, bfloat16));
  CHECK_FALSE(tensor_core_preset("B300", binary16, binary32));
}

// --- The exact reference against MPFR ------------------------------------------------

// a·b + c in MPFR (exact at 1100 bits: every term is a multiple of 2^-298
// below 2^257), then "jammed" to 320 bits (round to odd), which the oracle
// rounds into any format correctly.
Rounded mpfr_exact_dot(const Format& f, RoundingMode mode, const std::vector<float>& a, const std::vector<float>& b,
                       float c) {
  mpfr_t sum, term;
  mpfr_init2(sum, 1100);
  mpfr_init2(term, 64);
  mpfr_set_flt(sum, c, MPFR_RNDN);
  for (std::size_t k = 0; k < a.size(); ++k) {
    mpfr_set_flt(term, a[k], MPFR_RNDN);
    mpfr_mul_d(term, term, static_cast<double>(b[k]), MPFR_RNDN);  // exact: 48 bits
    REQUIRE(mpfr_add(sum, sum, term, MPFR_RNDN) == 0);             // exact
  }
  // IEEE 754 §6.3: a sum of zeros is -0 when all are (any is, rounding down).
  bool only_zeros = c == 0.0f, all_negative = std::signbit(c), any_negative = std::signbit(c);
  for (std::size_t k = 0; k < a.size(); ++k) {
    const bool zero = a[k] == 0.0f || b[k] == 0.0f, negative = std::signbit(a[k]) != std::signbit(b[k]);
    only_zeros = only_zeros && zero;
    if (zero) {
      all_negative = all_negative && negative;
      any_negative = any_negative || negative;
    }
  }
  oracle::Exact e;
  if (only_zeros) {
    e.kind = oracle::Exact::Kind::zero;
    e.negative = mode == RoundingMode::toward_negative ? any_negative : all_negative;
  } else if (mpfr_zero_p(sum)) {
    e.kind = oracle::Exact::Kind::zero;
    e.cancellation = true;
  } else {
    e.kind = oracle::Exact::Kind::finite;
    e.negative = mpfr_signbit(sum) != 0;
    const int ternary = mpfr_set(e.value.get(), sum, MPFR_RNDZ);
    if (ternary != 0) {  // set the last bit: round to odd
      mpz_t z;
      mpz_init(z);
      mpfr_get_z_2exp(z, e.value.get());
      if (mpz_even_p(z)) {
        if (e.negative)
          mpfr_nextbelow(e.value.get());
        else
          mpfr_nextabove(e.value.get());
      }
      mpz_clear(z);
    }
  }
  mpfr_clear(sum);
  mpfr_clear(term);
  return oracle::round(f, mode, e);
}

// Random binary32 values with exponents spread over `range` binades around
// `center`, some subnormal, some zero.
float random_float(Rng& rng, int center, int range) {
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7FFFFF);
  std::uniform_int_distribution<int> exponent(center - range, center + range);
  const std::uint32_t sign = (rng() & 1) << 31;
  const int e = std::clamp(exponent(rng), -127, 127);
  if ((rng() & 31) == 0) return std::bit_cast<float>(sign);          // zero
  if (e == -127) return std::bit_cast<float>(sign | mantissa(rng));  // subnormal
  return std::bit_cast<float>(sign | (std::uint32_t(e + 127) << 23) | mantissa(rng));
}

TEST_CASE("exact dot product against MPFR", "[accumulation][oracle]") {
  Rng rng(20261121);
  const Format targets[] = {binary32, binary16, bfloat16, e5m2, Format{8, 23, Subnormals::flush_to_zero}};
  std::size_t checked = 0, mismatches = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int k = std::uniform_int_distribution<int>(0, 40)(rng);
    const int style = trial % 5;
    std::vector<float> a(k), b(k);
    float c = 0.0f;
    if (style == 0) {  // everything: wide exponents, subnormals
      for (int j = 0; j < k; ++j) {
        a[j] = random_float(rng, 0, 130);
        b[j] = random_float(rng, 0, 130);
      }
      c = random_float(rng, 0, 130);
    } else if (style == 1) {  // cancellation: pairs x*y and -x*y', c = -(sum) nearly
      for (int j = 0; j + 1 < k; j += 2) {
        a[j] = random_float(rng, 0, 10);
        b[j] = random_float(rng, 0, 10);
        a[j + 1] = -a[j];
        b[j + 1] = std::nextafter(b[j], (rng() & 1) ? INFINITY : -INFINITY);
      }
      c = random_float(rng, -40, 20);
    } else if (style == 2) {  // results near binary16/e5m2 ties and their subnormal range
      for (int j = 0; j < k; ++j) {
        a[j] = value_of(binary16, random_float(rng, -8, 6));
        b[j] = value_of(binary16, random_float(rng, -8, 6));
      }
      c = value_of(binary16, random_float(rng, -10, 10)) + ((rng() & 1) ? 0x1p-25f : -0x1p-30f);
    } else if (style == 3) {  // a tie of binary32 plus a tiny term deciding it
      const float base = random_float(rng, 0, 20);
      a = {base, std::abs(base) * 0x1p-24f * ((rng() & 1) ? 1.0f : 0.5f), 0x1p-100f};
      b = {1.0f, (base < 0) ? -1.0f : 1.0f, (rng() & 1) ? 0x1p-60f : -0x1p-60f};
      c = 0.0f;
    } else {  // huge and tiny together
      for (int j = 0; j < k; ++j) {
        a[j] = random_float(rng, (j % 2) ? 100 : -120, 8);
        b[j] = random_float(rng, (j % 2) ? 100 : -20, 8);
      }
      c = random_float(rng, 0, 127);
    }
    for (const Format& f : targets) {
      for (RoundingMode mode : oracle::kDeterministicModes) {
        AccumulationModel m;
        m.kind = AccumulationKind::exact;
        m.format = f;
        m.mode = mode;
        const float got = dot(m, a, b, c);
        const Rounded want = mpfr_exact_dot(f, mode, a, b, c);
        const float expected = to_float(f, want.bits);
        ++checked;
        if (!same(got, expected)) {
          ++mismatches;
          if (mismatches <= 5) {
            std::string text = "format " + f.name() + " mode " + std::string(to_string(mode)) + " c " + hex(c);
            for (int j = 0; j < static_cast<int>(a.size()); ++j) text += "\n  " + hex(a[j]) + " * " + hex(b[j]);
            FAIL_CHECK(text << "\n  expected " << hex(expected) << " got " << hex(got));
          }
        }
      }
    }
  }
  std::printf("exact dot vs MPFR: %zu passed, %zu failed\n", checked - mismatches, mismatches);
  CHECK(mismatches == 0);
  CHECK(checked > 10000);
}

// --- Summation in a format, step by step ---------------------------------------------------

std::vector<float> random_values(Rng& rng, const Format& f, int n, int range) {
  std::vector<float> v(n);
  for (auto& x : v) x = value_of(f, random_float(rng, 0, range));
  return v;
}

Bits enc(const Format& f, float x) { return round_to_format(f, Rounding{}, x).bits; }

TEST_CASE("recursive summation against step-by-step emulator FMAs", "[accumulation]") {
  Rng rng(11);
  for (const Format& f : {binary16, bfloat16, e5m2, binary32}) {
    for (RoundingMode mode : oracle::kDeterministicModes) {
      for (int trial = 0; trial < 40; ++trial) {
        const int k = 1 + trial * 3;
        const auto a = random_values(rng, f, k, 6), b = random_values(rng, f, k, 6);
        const float c = value_of(f, random_float(rng, 0, 6));
        Bits s = enc(f, c);
        for (int j = 0; j < k; ++j) s = fma(f, Rounding{mode}, enc(f, a[j]), enc(f, b[j]), s).bits;
        AccumulationModel m;
        m.format = f;
        m.mode = mode;
        INFO(to_string(m) << " k " << k);
        REQUIRE(same(dot(m, a, b, c), to_float(f, s)));
      }
    }
  }
}

TEST_CASE("pairwise and blocked summation against step-by-step emulator arithmetic", "[accumulation]") {
  Rng rng(12);
  for (const Format& f : {binary16, bfloat16, binary32}) {
    for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::toward_zero, RoundingMode::toward_negative}) {
      for (int k : {1, 2, 3, 7, 16, 33, 100}) {
        const auto a = random_values(rng, f, k, 5), b = random_values(rng, f, k, 5);
        const float c = value_of(f, random_float(rng, 0, 5));
        const Rounding r{mode};
        // Pairwise: rounded products, a halving tree, then c.
        std::vector<Bits> p(k);
        for (int j = 0; j < k; ++j) p[j] = mul(f, r, enc(f, a[j]), enc(f, b[j])).bits;
        auto tree = [&](auto&& self, int lo, int hi) -> Bits {
          if (hi - lo == 1) return p[lo];
          const int mid = lo + (hi - lo) / 2;
          return add(f, r, self(self, lo, mid), self(self, mid, hi)).bits;
        };
        const Bits pairwise = add(f, r, enc(f, c), tree(tree, 0, k)).bits;
        AccumulationModel pm;
        pm.kind = AccumulationKind::pairwise;
        pm.format = f;
        pm.mode = mode;
        INFO(to_string(pm) << " k " << k);
        CHECK(same(dot(pm, a, b, c), to_float(f, pairwise)));
        // Blocked, b = 8: fused within a block from 0, then across from c.
        Bits s = enc(f, c);
        for (int start = 0; start < k; start += 8) {
          Bits t = enc(f, 0.0f);
          for (int j = start; j < std::min(k, start + 8); ++j) t = fma(f, r, enc(f, a[j]), enc(f, b[j]), t).bits;
          s = add(f, r, s, t).bits;
        }
        AccumulationModel bm = pm;
        bm.kind = AccumulationKind::blocked;
        bm.block = 8;
        INFO(to_string(bm));
        CHECK(same(dot(bm, a, b, c), to_float(f, s)));
      }
    }
  }
}

// Truncation is a bias: a long sum of positive products comes out smaller
// than the exact sum every time under the H100 model, by far more than
// binary32's rounding to nearest, whose errors have both signs.
TEST_CASE("tensor-core truncation biases long positive sums downward", "[accumulation]") {
  Rng rng(13);
  std::uniform_real_distribution<float> uniform(0.5f, 1.0f);
  AccumulationModel h100 = *parse_accumulation_model("h100"), fp32 = *parse_accumulation_model("fp32"),
                    exact = *parse_accumulation_model("exact");
  int tc_below = 0, fp32_below = 0, fp32_above = 0, tc_below_fp32 = 0;
  double tc_error = 0, fp32_error = 0;
  const int trials = 20, k = 4096;
  for (int t = 0; t < trials; ++t) {
    std::vector<float> a(k), b(k);
    for (int j = 0; j < k; ++j) {
      a[j] = value_of(binary16, uniform(rng));
      b[j] = value_of(binary16, uniform(rng));
    }
    const double e = dot(exact, a, b, 0.0f), tc = dot(h100, a, b, 0.0f), f = dot(fp32, a, b, 0.0f);
    tc_below += tc < e;
    tc_below_fp32 += tc < f;
    fp32_below += f < e;
    fp32_above += f > e;
    tc_error += (tc - e) / e;
    fp32_error += (f - e) / e;
  }
  std::printf("k = %d, %d trials: mean relative error H100 %.3g, FP32 recursive %.3g\n", k, trials, tc_error / trials,
              fp32_error / trials);
  CHECK(tc_below == trials);
  CHECK(tc_below_fp32 == trials);
  CHECK(fp32_below > 0);
  CHECK(fp32_above > 0);
  CHECK(tc_error / trials < -4 * std::abs(fp32_error / trials));
}

// --- Names ---------------------------------------------------------------------------

TEST_CASE("accumulation model names", "[accumulation]") {
  for (std::string name :
       {"fp32", "fp16", "bf16:rtz", "pairwise-fp32", "blocked-fp32-32", "blocked-e5m2-4:rdn", "exact", "exact-fp16:rup",
        "e6m9:ftz", "e6m9:ftz:rto", "v100", "a100", "h100", "h100:bf16", "h100:e4m3:fp16", "a100:tf32:fp32"}) {
    const auto m = parse_accumulation_model(name);
    INFO(name);
    REQUIRE(m.has_value());
    const auto again = parse_accumulation_model(to_string(*m));
    INFO(to_string(*m));
    REQUIRE(again.has_value());
    CHECK(*again == *m);
  }
  CHECK(parse_accumulation_model("fp16:rtz")->mode == RoundingMode::toward_zero);
  CHECK(parse_accumulation_model("blocked-fp32-32")->block == 32);
  CHECK(parse_accumulation_model("h100", bfloat16)->tensor_core == preset("H100", bfloat16, binary32));
  CHECK(parse_accumulation_model("h100:e4m3:fp16")->tensor_core == preset("H100", e4m3, binary16));
  CHECK(to_string(*parse_accumulation_model("h100")) == "h100:binary16:binary32");
  for (std::string bad : {"", "fp99", "blocked-fp32", "blocked-fp32-0", "fp32:sr", "v100:bf16", "h100:fp16:bf16",
                          "exact-fp64", "pairwise-", "h100x"}) {
    INFO(bad);
    CHECK_FALSE(parse_accumulation_model(bad).has_value());
  }
}

// parse_accumulation_model_or_throw says why a name is no model.
TEST_CASE("accumulation model names: the reason a name is refused", "[accumulation]") {
  const std::pair<std::string, std::string> refusals[] = {
      {"b300", "unknown accumulation model 'b300'. Accepted: "},
      {"v100:bf16", "'v100:bf16': no model for v100 bfloat16 -> binary32: the GPU has no such instruction"},
      {"mi100:fp16:fp16", "mi100's models: binary16 -> binary32, bfloat16 -> binary32"},
      {"h100:e2m1", "no model for h100 e2m1 -> binary32"},
      {"h100:fp64", "binary64 is not a tensor-core input format"},
      {"h100:e4m3:bf16", "a tensor core's output is binary32 or binary16, not bfloat16"},
      {"h100:rtz", "a tensor core takes no :MODE"},
      {"fp32:stochastic", "stochastic rounding is not an accumulation mode"},
      {"fp64", "'fp64': binary64 does not fit in binary32"},
      {"exact-fp64", "binary64 does not fit in binary32"},
      {"blocked-fp32-0", "block size 0: a block holds at least 1 product"},
      {"blocked-fp32-x", "block size 'x' is not a whole number"},
      {"pairwise-fp99", "'fp99' is not a format"},
      {"tc:block=0", "'tc:block=0': tensor-core model: block 0 is not in 1..64"},
  };
  for (const auto& [name, reason] : refusals) {
    INFO(name);
    std::string why;
    try {
      parse_accumulation_model_or_throw(name);
    } catch (const std::invalid_argument& e) {
      why = e.what();
    }
    CHECK(why.find(reason) != std::string::npos);
    CHECK_FALSE(parse_accumulation_model(name).has_value());
  }
  // A bare GPU takes the output given; a spelled-out one keeps its own.
  CHECK(parse_accumulation_model_or_throw("h100", e4m3, binary16).tensor_core == preset("H100", e4m3, binary16));
  CHECK(parse_accumulation_model_or_throw("h100:e4m3", binary16, binary16).tensor_core ==
        preset("H100", e4m3, binary32));
  CHECK(tensor_core_preset_formats("V100") ==
        std::vector<std::pair<Format, Format>>{{binary16, binary32}, {binary16, binary16}});
  CHECK(tensor_core_preset_formats("b300").empty());
}

// --- GEMM --------------------------------------------------------------------------------

struct GemmCase {
  int m, n, k;
};

// Values of `in`, mostly N(0,1)-like, with zeros, subnormals and large ones.
float gemm_value(Rng& rng, const Format& in) {
  const int pick = static_cast<int>(rng() % 20);
  std::normal_distribution<float> normal;
  float x = normal(rng);
  if (pick == 0) x = 0.0f;
  if (pick == 1) x = -0.0f;
  if (pick == 2) x = std::ldexp(normal(rng), -20);  // subnormal in binary16
  if (pick == 3) x = std::ldexp(normal(rng), 12);
  if (in.emax() > 100 && pick == 4) x = std::ldexp(normal(rng), (rng() & 1) ? 70 : -70);  // beyond the kernel's range
  return value_of(in, x);
}

void check_gemm(const AccumulationModel& model, const GemmCase& g, bool accumulate_c, int threads, bool specials,
                Rng& rng, Path path = Path::automatic) {
  const Format in = model.tensor_core.input;
  std::vector<float> a(std::size_t(g.m) * g.k), b(std::size_t(g.k) * g.n), c(std::size_t(g.m) * g.n);
  for (auto& x : a) x = gemm_value(rng, in);
  for (auto& x : b) x = gemm_value(rng, in);
  std::normal_distribution<float> normal;
  for (auto& x : c) {
    const int pick = static_cast<int>(rng() % 10);
    x = normal(rng);
    if (pick == 0) x = std::ldexp(normal(rng), 100);   // c dominates the first block
    if (pick == 1) x = std::ldexp(normal(rng), -135);  // subnormal
    if (pick == 2) x = 0.0f;
  }
  if (specials && !a.empty() && !b.empty()) {
    const float inf = std::numeric_limits<float>::infinity();
    a[rng() % a.size()] = inf;
    b[rng() % b.size()] = std::numeric_limits<float>::quiet_NaN();
    c[rng() % c.size()] = -inf;
    if (g.k > 0) std::fill(a.begin(), a.begin() + g.k, 0.0f);  // row 0 all zero: results are c or zeros
    c[0] = -0.0f;
  }
  if (!accumulate_c) std::fill(c.begin(), c.end(), 12345.0f);  // must be ignored
  std::vector<float> out = c;
  gemm(model, a.data(), b.data(), out.data(), g.m, g.n, g.k, accumulate_c, threads, path);
  std::vector<float> column(g.k);
  int mismatches = 0;
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      for (int kk = 0; kk < g.k; ++kk) column[kk] = b[std::size_t(kk) * g.n + j];
      const float want = dot(model, std::span<const float>(a.data() + std::size_t(i) * g.k, g.k), column,
                             accumulate_c ? c[std::size_t(i) * g.n + j] : 0.0f);
      const float got = out[std::size_t(i) * g.n + j];
      if (!same(want, got) && ++mismatches <= 3)
        FAIL_CHECK(to_string(model) << " " << g.m << "x" << g.n << "x" << g.k << " threads " << threads << " (" << i
                                    << "," << j << "): expected " << hex(want) << " got " << hex(got));
    }
  CHECK(mismatches == 0);
}

TEST_CASE("tensor-core GEMM kernels match the model bit for bit", "[accumulation][gemm][simd]") {
  Rng rng(14);
  const GemmCase shapes[] = {
      {1, 1, 1},   {1, 17, 16},  {3, 5, 0},    {5, 33, 15}, {7, 16, 17},
      {9, 31, 50}, {13, 48, 64}, {6, 20, 100}, {17, 3, 33}, {131, 70, 45}};  // the last: several row chunks per thread
  for (const mpsim::simd::Target& target : mpsim::simd::available_targets()) {
    mpsim::simd::ForceTarget forced(target);
    for (const std::string name : {"v100", "a100", "h100", "h100:e4m3", "h100:e5m2", "h100:bf16", "a100:tf32"}) {
      const AccumulationModel model = *parse_accumulation_model(name);
      INFO(name << " target " << target.name << " kernel " << gemm_kernel_name(model));
      // The kernel's best compiled target at or below the one forced.
      CHECK(mpsim::simd::target_named(gemm_kernel_name(model)).bits >= target.bits);
      for (const GemmCase& g : shapes) {
        for (bool accumulate_c : {false, true})
          for (bool specials : {false, true}) check_gemm(model, g, accumulate_c, 1 + (g.m % 3), specials, rng);
      }
      for (int threads : {2, 3, 0}) check_gemm(model, {200, 150, 100}, true, threads, true, rng);
    }
  }
  // The largest binary16 products (2^32 each), beside a c at the top of binary32
  // (they vanish below it) and without it (64 of them: 2^38, exactly).
  const AccumulationModel h100 = *parse_accumulation_model("h100");
  const float top = std::numeric_limits<float>::max();
  std::vector<float> a(64 * 64, 65504.0f), b(64 * 64, -65504.0f), c(64 * 64, top), plain(64 * 64);
  std::vector<float> got = c;
  gemm(h100, a.data(), b.data(), got.data(), 64, 64, 64, true, 2);
  gemm(h100, a.data(), b.data(), plain.data(), 64, 64, 64, false, 1);
  for (std::size_t j = 0; j < got.size(); ++j) {
    REQUIRE(got[j] == top);  // the negative products truncate toward zero, to nothing (not to -1 unit)
    REQUIRE(plain[j] == plain[0]);
  }
  // Products are -4190209 * 2^10. Block 2 aligns to its c (-16 of them, below
  // 2^36: unit 2^10, nothing lost); blocks 3 and 4 to c beyond 2^36 and 2^37
  // (units 2^11, 2^12): each of their products loses 2^10 (4190209 = 1 mod 4).
  CHECK(plain[0] == static_cast<float>(-64.0 * 65504.0 * 65504.0 + 32 * 0x1p10));
  CHECK(plain[0] == tensor_core_dot(h100.tensor_core, std::span(a).first(64), std::span(b).first(64), 0.0f));
  CHECK(got[0] == tensor_core_dot(h100.tensor_core, std::span(a).first(64), std::span(b).first(64), top));
  // A block whose truncated sum passes 2^31 units: 16 products (2-2^-10)^2 * 2^30
  // and c just below 2^31 (the vector kernel's int32 sum overflows there).
  for (const mpsim::simd::Target& target : mpsim::simd::available_targets()) {
    mpsim::simd::ForceTarget forced(target);
    INFO("target " << target.name);
    std::vector<float> x(16 * 16, 65504.0f), y(16 * 16, 65504.0f), d(16 * 16, 0x1.fffffep30f);
    gemm(h100, x.data(), y.data(), d.data(), 16, 16, 16, true, 1);
    const float want =
        tensor_core_dot(h100.tensor_core, std::span(x).first(16), std::span(y).first(16), 0x1.fffffep30f);
    // (4190209 * 2^7 + 2^24 - 1) * 2^7 = 553123967 * 2^7, truncated to 24 bits: 8642561 * 2^13.
    CHECK(want == 8642561.0f * 0x1p13f);
    for (float v : d) REQUIRE(v == want);
  }
}

TEST_CASE("GEMM: every SIMD target gives the portable target's bits", "[accumulation][gemm][simd]") {
  namespace simd = mpsim::simd;
  Rng rng(17);
  // Widths that leave tails of every vector width and of the 16-column panel,
  // row counts that leave single-row tiles and several 64-row chunks per thread.
  const GemmCase shapes[] = {{1, 1, 1}, {4, 15, 7}, {5, 17, 33}, {8, 40, 64}, {70, 23, 41}, {130, 9, 16}};
  const float top = std::numeric_limits<float>::max();
  for (const std::string name : {"v100", "a100", "h100", "h100:e4m3", "h100:e5m2", "h100:bf16", "a100:tf32"}) {
    const AccumulationModel model = *parse_accumulation_model(name);
    for (const GemmCase& g : shapes)
      for (const int threads : {1, 2, 3}) {
        std::vector<float> a(std::size_t(g.m) * g.k), b(std::size_t(g.k) * g.n), c(std::size_t(g.m) * g.n);
        for (auto& x : a) x = gemm_value(rng, model.tensor_core.input);
        for (auto& x : b) x = gemm_value(rng, model.tensor_core.input);
        std::normal_distribution<float> normal;
        for (auto& x : c) {
          const int pick = static_cast<int>(rng() % 12);
          x = pick == 0 ? std::ldexp(normal(rng), 100) : pick == 1 ? std::ldexp(normal(rng), -135)
            : pick == 2 ? top : pick == 3 ? -0.0f : normal(rng);
        }
        if (rng() % 2) a[rng() % a.size()] = std::numeric_limits<float>::infinity();
        if (rng() % 2) b[rng() % b.size()] = std::numeric_limits<float>::quiet_NaN();
        auto run = [&](Path path) {
          std::vector<float> out = c;
          gemm(model, a.data(), b.data(), out.data(), g.m, g.n, g.k, true, threads, path);
          std::vector<std::uint32_t> bits(out.size());
          for (std::size_t j = 0; j < out.size(); ++j) bits[j] = std::bit_cast<std::uint32_t>(out[j]);
          return bits;
        };
        std::vector<std::uint32_t> portable;
        {
          simd::ForceTarget forced(simd::portable_target());
          portable = run(Path::vector);
        }
        INFO(name << " " << g.m << "x" << g.n << "x" << g.k << " threads " << threads);
        CHECK(portable == run(Path::scalar));  // the portable kernel is the model
        for (const simd::Target& target : simd::available_targets()) {
          simd::ForceTarget forced(target);
          INFO("target " << target.name << " kernel " << gemm_kernel_name(model));
          CHECK(run(Path::vector) == portable);
        }
      }
  }
}

TEST_CASE("GEMM under models without a vector kernel", "[accumulation][gemm]") {
  Rng rng(15);
  for (const std::string name : {"fp32", "fp16", "blocked-fp32-8", "pairwise-bf16", "exact", "h100:fp16:fp16",
                                 "h100:e5m2:fp16", "v100:fp16:fp16"}) {
    const AccumulationModel model = *parse_accumulation_model(name);
    INFO(name);
    CHECK(gemm_kernel_name(model) == "scalar");
    AccumulationModel m = model;
    if (m.kind != AccumulationKind::tensor_core) m.tensor_core.input = binary16;  // what gemm_value draws
    check_gemm(m, {5, 7, 19}, true, 2, true, rng);
    check_gemm(m, {40, 9, 19}, true, 3, true, rng);  // several row chunks per thread
    check_gemm(m, {4, 3, 0}, false, 1, false, rng);
  }
  const AccumulationModel fp32 = *parse_accumulation_model("fp32");
  float x = 1.0f;
  CHECK_THROWS_AS(gemm(fp32, &x, &x, &x, 1, 1, 1, false, 1, Path::vector), std::invalid_argument);
}

}  // namespace
}  // namespace mpsim
