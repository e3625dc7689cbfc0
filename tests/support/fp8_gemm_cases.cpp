#include "support/fp8_gemm_cases.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/quantize.hpp"

namespace mpsim::test {
namespace {

const char* name(Fp8Data d) {
  switch (d) {
    case Fp8Data::exact: return "exact";
    case Fp8Data::uniform: return "uniform";
    case Fp8Data::normal: return "normal";
    case Fp8Data::wide: return "wide";
  }
  return "?";
}

std::string shape_text(const Fp8Shape& s, const char* sep) {
  return std::to_string(s.m) + sep + std::to_string(s.n) + sep + std::to_string(s.k);
}

// One instruction; whole tiles; a long K not a multiple of 32 (1008); a longer
// K (2048 = 64 instructions); nothing a multiple of the tile.
constexpr Fp8Shape kShapes[] = {{16, 16, 32}, {64, 64, 64}, {128, 96, 1008}, {128, 128, 2048}, {33, 17, 100}};

// Values of `format`: "exact" draws -1, 0, 1 (partial sums stay integers below
// 2^11 for K <= 2048, exact in a 13-bit aligned sum); uniform on (-1, 1);
// standard normal; "wide": random sign, binade and significand over the
// format's normal range (E4M3 2^-6 .. 2^8, E5M2 2^-14 .. 2^15), clamped to its
// largest finite value; then rounded to the format (nearest-even).
std::vector<float> fp8_values(Fp8Data data, const Format& format, std::size_t n, std::mt19937_64& rng) {
  std::vector<float> raw(n);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), significand(1.0f, 2.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> trit(-1, 1);
  const bool e4m3 = format == formats::e4m3;
  const float largest = e4m3 ? 448.0f : 57344.0f;
  std::uniform_int_distribution<int> binade(e4m3 ? -6 : -14, e4m3 ? 8 : 15);
  for (auto& x : raw) {
    switch (data) {
      case Fp8Data::exact: x = static_cast<float>(trit(rng)); break;
      case Fp8Data::uniform: x = uniform(rng); break;
      case Fp8Data::normal: x = normal(rng); break;
      case Fp8Data::wide:
        x = std::clamp((rng() & 1 ? -1.0f : 1.0f) * std::ldexp(significand(rng), binade(rng)), -largest, largest);
        break;
    }
  }
  std::vector<float> values(n);
  quantize(format, raw, values);
  return values;
}

int rows_of(const Fp8Case& c, int rows) { return rows <= 0 || rows > c.shape.m ? c.shape.m : rows; }

}  // namespace

std::string Fp8Case::label() const {
  return a_format.name() + "x" + b_format.name() + " " + name(data) + " " + shape_text(shape, "x") + " (seed " +
         std::to_string(seed) + ")";
}

std::string Fp8Case::slug() const {
  return a_format.name() + "x" + b_format.name() + "_" + name(data) + "_" + shape_text(shape, "x") + "_" +
         std::to_string(seed);
}

bool Fp8Case::runs_on(std::string_view engine) const {
  if (engine == "mma") return true;
  return cublaslt_shape() && !(a_format == formats::e5m2 && b_format == formats::e5m2);
}

std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> cases;
  std::uint64_t seed = 20261126;
  for (const Format& a : {formats::e4m3, formats::e5m2})
    for (const Format& b : {formats::e4m3, formats::e5m2})
      for (const Fp8Data data : {Fp8Data::exact, Fp8Data::uniform, Fp8Data::normal, Fp8Data::wide})
        for (const Fp8Shape& shape : kShapes) cases.push_back({a, b, data, shape, seed++});
  return cases;
}

Fp8Operands make_operands(const Fp8Case& c) {
  std::mt19937_64 rng(c.seed);
  Fp8Operands ops;
  ops.a = fp8_values(c.data, c.a_format, static_cast<std::size_t>(c.shape.m) * c.shape.k, rng);
  ops.b = fp8_values(c.data, c.b_format, static_cast<std::size_t>(c.shape.k) * c.shape.n, rng);
  return ops;
}

Format joint_format(const Fp8Case& c) { return c.a_format == c.b_format ? c.a_format : Format{5, 3}; }

std::string rule_for(std::string_view engine, const Fp8Case& c) {
  const std::string input = "tc:input=" + joint_format(c).name() + ",output=fp32";
  const std::string wgmma = input + ",block=32,bits=13,rounding=rtz,precision=14";
  if (engine == "lt-fast") return wgmma;
  if (engine == "lt") return wgmma + ",promote=128";
  if (engine == "mma") return input + ",block=32,bits=25,rounding=rtz,groups=2,run=2,c=last,c_rounding=rne";
  throw std::invalid_argument("rule_for: no engine '" + std::string(engine) + "'");
}

std::vector<float> fp8_model_result(std::string_view model_name, const Fp8Case& c, const Fp8Operands& ops, int rows) {
  const auto model = parse_accumulation_model(model_name, joint_format(c));
  if (!model) throw std::invalid_argument("fp8_model_result: not a model: " + std::string(model_name));
  const int m = rows_of(c, rows);
  std::vector<float> out(static_cast<std::size_t>(m) * c.shape.n);
  gemm(*model, ops.a.data(), ops.b.data(), out.data(), m, c.shape.n, c.shape.k, false, 0);
  return out;
}

std::vector<float> fp8_exact_rounded(const Fp8Case& c, const Fp8Operands& ops, int rows) {
  const int m = rows_of(c, rows), n = c.shape.n, k = c.shape.k;
  std::vector<float> out(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0, error = 0;
      for (int p = 0; p < k; ++p) {
        const double prod = static_cast<double>(ops.a[static_cast<std::size_t>(i) * k + p]) *
                            ops.b[static_cast<std::size_t>(p) * n + j];
        const double s = sum + prod, z = s - sum;  // TwoSum (Knuth)
        error += (sum - (s - z)) + (prod - z);
        sum = s;
      }
      out[static_cast<std::size_t>(i) * n + j] = static_cast<float>(sum + error);
    }
  return out;
}

}  // namespace mpsim::test
