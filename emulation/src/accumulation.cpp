// Accumulation models: the tensor-core block model, recursive / pairwise /
// blocked summation in a format, the exact reference, and their names.
// The GEMM and its vector kernel are in accumulation_gemm.cpp.
#include "mpsim/emulation/accumulation.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "exact.hpp"
#include "exact_accumulator.hpp"
#include "mpsim/emulation/arithmetic.hpp"

namespace mpsim {
namespace {

using detail::ExactAccumulator;
using detail::u128;
using i128 = __int128;

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

std::string lower(std::string_view text) {
  std::string s(text);
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// --- Values of a format carried in binary32 -----------------------------------

// A finite binary32 value taken apart: value = significand * 2^lsb, and the
// exponent a datapath of a format with this emin aligns it by: floor(log2|x|),
// or emin for the format's subnormals (their significand starts with zeros).
struct Operand {
  bool negative = false;
  std::uint64_t significand = 0;  // 0 for zeros
  int lsb = 0;
  int exponent = 0;
};

Operand decode_finite(float x, int emin) {
  const std::uint32_t b = bits_of(x);
  Operand o;
  o.negative = (b >> 31) != 0;
  const int biased = static_cast<int>((b >> 23) & 0xFF);
  const std::uint32_t fraction = b & 0x7FFFFF;
  if (biased == 0) {
    o.significand = fraction;
    o.lsb = -149;
    o.exponent = fraction == 0 ? emin : std::bit_width(fraction) - 1 - 149;
  } else {
    o.significand = fraction | 0x800000u;
    o.lsb = biased - 150;
    o.exponent = biased - 127;
  }
  o.exponent = std::max(o.exponent, emin);
  return o;
}

// Whether a binary32 value is a value of `f` (the format's own encoding of it
// would decode to exactly this float).
bool representable(const Format& f, float x) {
  if (std::isnan(x)) return true;
  if (std::isinf(x)) return f.has_infinity();
  if (x == 0.0f) return true;
  const Operand o = decode_finite(x, -1000);
  if (o.exponent > f.emax()) return false;
  if (o.exponent < f.emin() && f.subnormals == Subnormals::flush_to_zero) return false;
  const int quantum = std::max(o.exponent, f.emin()) - f.mantissa_bits;
  if (quantum - o.lsb >= 64) return false;  // below the smallest subnormal
  if (o.lsb < quantum && (o.significand & ((std::uint64_t{1} << (quantum - o.lsb)) - 1)) != 0) return false;
  if (o.exponent == f.emax()) {
    const std::uint64_t top =
        o.lsb >= quantum ? o.significand << (o.lsb - quantum) : o.significand >> (quantum - o.lsb);
    if (top > f.max_significand()) return false;
  }
  return true;
}

// x as a value of f, rounded to nearest-even once where it is not one.
float to_format(const Format& f, float x) {
  if (f == formats::binary32 || representable(f, x)) return x;
  return to_float(f, round_to_format(f, Rounding{RoundingMode::nearest_even}, x).bits);
}

Bits format_bits(const Format& f, float x) {
  return round_to_format(f, Rounding{RoundingMode::nearest_even}, x).bits;  // exact: x is a value of f
}

// --- The tensor-core block ----------------------------------------------------

float canonical_nan(const Format& output) {
  if (output == formats::binary32) return std::bit_cast<float>(0x7FFFFFFFu);
  return to_float(output, Bits{(std::uint64_t{1} << (output.total_bits() - 1)) - 1});
}

// IEEE 754 for a sum of products and c with an infinite or NaN operand: NaN for
// a NaN, inf*0 or infinities of both signs; otherwise the infinity. Nothing
// when every operand is finite.
std::optional<float> special_result(const float* a, const float* b, const int* index, int n, float c,
                                    const Format& output) {
  bool nan = std::isnan(c), positive = c == std::numeric_limits<float>::infinity(),
       negative = c == -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) {
    const float x = a[index[j]], y = b[index[j]];
    if (std::isfinite(x) && std::isfinite(y)) continue;
    if (std::isnan(x) || std::isnan(y) || x == 0.0f || y == 0.0f) {
      nan = true;
      continue;
    }
    (std::signbit(x) != std::signbit(y) ? negative : positive) = true;
  }
  if (!nan && !positive && !negative) return std::nullopt;
  if (nan || (positive && negative)) return canonical_nan(output);
  return to_float(output, infinity_or_nan(output, negative));
}

// Zero results: IEEE 754 §6.3 signs. An exact cancellation of nonzero terms is
// +0 (-0 rounding toward negative); a sum of zeros is -0 only when they all
// are (any is, rounding toward negative).
float zero_result(RoundingMode mode, bool all_negative, bool any_negative, bool only_zeros) {
  bool negative = mode == RoundingMode::toward_negative;
  if (only_zeros) negative = mode == RoundingMode::toward_negative ? any_negative : all_negative;
  return negative ? -0.0f : 0.0f;
}

// One fused block: the products a[index[j]] * b[index[j]] and c (a value of
// the output format) aligned, truncated, summed exactly, normalised, rounded.
float fused_block(const TensorCoreModel& m, const float* a, const float* b, const int* index, int n, float c) {
  if (auto special = special_result(a, b, index, n, c, m.output)) return *special;
  struct Term {
    bool negative;
    std::uint64_t significand;
    int lsb, exponent;
  };
  std::array<Term, 65> terms;
  int count = 0;
  bool all_negative = true, any_negative = false;
  const int emin_in = m.input.emin();
  for (int j = 0; j < n; ++j) {
    const Operand x = decode_finite(a[index[j]], emin_in), y = decode_finite(b[index[j]], emin_in);
    const bool negative = x.negative != y.negative;
    if (x.significand == 0 || y.significand == 0) {
      all_negative = all_negative && negative;
      any_negative = any_negative || negative;
      continue;
    }
    terms[count++] = {negative, x.significand * y.significand, x.lsb + y.lsb, x.exponent + y.exponent};
  }
  const Operand z = decode_finite(c, m.output.emin());
  if (z.significand == 0) {
    all_negative = all_negative && z.negative;
    any_negative = any_negative || z.negative;
  } else {
    terms[count++] = {z.negative, z.significand, z.lsb, z.exponent};
  }
  if (count == 0) return zero_result(m.rounding, all_negative, any_negative, true);

  int largest = terms[0].exponent;
  for (int j = 1; j < count; ++j) largest = std::max(largest, terms[j].exponent);
  const int unit = largest - m.fraction_bits;  // the accumulator's last bit: 2^unit
  i128 sum = 0;
  for (int j = 0; j < count; ++j) {
    const Term& t = terms[j];
    // Truncation toward zero of |term| / 2^unit: bits shifted out are lost.
    u128 aligned = 0;
    if (t.lsb >= unit)
      aligned = static_cast<u128>(t.significand) << (t.lsb - unit);
    else if (unit - t.lsb < 64)
      aligned = t.significand >> (unit - t.lsb);
    sum += t.negative ? -static_cast<i128>(aligned) : static_cast<i128>(aligned);
  }
  if (sum == 0) return zero_result(m.rounding, false, false, false);

  detail::Exact value{sum < 0, unit, static_cast<u128>(sum < 0 ? -sum : sum), false};
  const int width = detail::bit_width128(value.significand);
  if (m.result_precision > 0 && width > m.result_precision) {  // normalised, then truncated
    value.significand >>= width - m.result_precision;
    value.exponent += width - m.result_precision;
  }
  return to_float(m.output, detail::round_exact(m.output, Rounding{m.rounding}, value, 0).bits);
}

// One instruction: a block of up to block_size products (a missing product is 0).
float tensor_core_block(const TensorCoreModel& m, const float* a, const float* b, int n, float c) {
  std::array<int, 64> index;
  if (m.groups <= 1 && !m.c_added_last) {
    for (int j = 0; j < n; ++j) index[j] = j;
    return fused_block(m, a, b, index.data(), n, c);
  }
  float acc = m.c_added_last ? 0.0f : c;
  const int groups = std::max(1, m.groups);
  for (int g = 0; g < groups; ++g) {
    int count = 0;
    for (int j = 0; j < n; ++j)
      if ((j / m.group_run) % groups == g) index[count++] = j;
    acc = fused_block(m, a, b, index.data(), count, acc);
  }
  if (!m.c_added_last) return acc;
  const Rounded sum = add(m.output, Rounding{m.rounding}, format_bits(m.output, acc), format_bits(m.output, c));
  if (classify(m.output, sum.bits) == FloatClass::nan) return canonical_nan(m.output);
  return to_float(m.output, sum.bits);
}

void check_model(const TensorCoreModel& m) {
  auto shaped_like = [&](const Format& f) {  // binary32 or binary16, with either subnormal handling
    return m.output.exponent_bits == f.exponent_bits && m.output.mantissa_bits == f.mantissa_bits &&
           m.output.specials == Specials::ieee;
  };
  const bool output_ok = shaped_like(formats::binary32) || shaped_like(formats::binary16);
  if (!output_ok || !fits_in_float(m.input) || m.input.invalid_reason() || m.block_size < 1 || m.block_size > 64 ||
      m.fraction_bits < 1 || m.fraction_bits > 100 || m.result_precision < 0 || m.groups < 1 ||
      m.groups > m.block_size || m.group_run < 1 || m.rounding == RoundingMode::stochastic)
    throw std::invalid_argument("unsupported tensor-core model: " + to_string(m));
}

// --- Summation in a format ----------------------------------------------------

void check_format(const Format& f, RoundingMode mode) {
  if (f.invalid_reason() || !fits_in_float(f))
    throw std::invalid_argument("accumulation format " + f.name() + " does not fit in binary32");
  if (mode == RoundingMode::stochastic)
    throw std::invalid_argument("accumulation models take deterministic rounding modes only");
}

double round_value(const Format& f, RoundingMode mode, double x) {
  return to_double(f, round_to_format(f, Rounding{mode}, x).bits);
}

// s + p exactly (both binary64 values: format values or exact products of two
// binary32 values), rounded once into f. TwoSum gives s + p = hi + lo exactly;
// hi rounded to odd on lo keeps every bit a rounding to p <= 51 bits needs
// (Boldo and Melquiond, "When double rounding is odd", 2005).
double add_round(const Format& f, RoundingMode mode, double s, double p) {
  const double hi = s + p;
  if (!std::isfinite(hi)) return round_value(f, mode, hi);  // NaN, or an infinite operand
  if (hi == 0.0) {  // an exact zero: the operands are multiples of 2^-298, so nothing underflowed
    const bool both_zero = s == 0.0 && p == 0.0;
    bool negative = mode == RoundingMode::toward_negative;  // cancellation
    if (both_zero) negative = negative ? (std::signbit(s) || std::signbit(p)) : (std::signbit(s) && std::signbit(p));
    return negative ? -0.0 : 0.0;
  }
  const double z = hi - s;
  const double lo = (s - (hi - z)) + (p - z);
  double odd = hi;
  if (lo != 0.0 && (std::bit_cast<std::uint64_t>(hi) & 1) == 0)
    odd = std::nextafter(hi,
                         lo > 0.0 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity());
  return round_value(f, mode, odd);
}

double recursive_dot(const Format& f, RoundingMode mode, std::span<const float> a, std::span<const float> b, float c) {
  if (f == formats::binary32 && mode == RoundingMode::nearest_even) {  // IEEE fused multiply-add is exactly this
    float s = c;
    for (std::size_t k = 0; k < a.size(); ++k) s = std::fma(a[k], b[k], s);
    return s;
  }
  double s = round_value(f, mode, c);
  for (std::size_t k = 0; k < a.size(); ++k) s = add_round(f, mode, s, double{a[k]} * double{b[k]});
  return s;
}

double pairwise_sum(const Format& f, RoundingMode mode, const double* p, std::size_t n) {
  if (n == 1) return p[0];
  const std::size_t half = n / 2;
  return add_round(f, mode, pairwise_sum(f, mode, p, half), pairwise_sum(f, mode, p + half, n - half));
}

double pairwise_dot(const Format& f, RoundingMode mode, std::span<const float> a, std::span<const float> b, float c) {
  const double start = round_value(f, mode, c);
  if (a.empty()) return start;
  std::vector<double> products(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) products[k] = round_value(f, mode, double{a[k]} * double{b[k]});
  return add_round(f, mode, start, pairwise_sum(f, mode, products.data(), products.size()));
}

double blocked_dot(const Format& f, RoundingMode mode, int block, std::span<const float> a, std::span<const float> b,
                   float c) {
  if (block < 1) throw std::invalid_argument("blocked summation needs a block size >= 1");
  double s = round_value(f, mode, c);
  for (std::size_t start = 0; start < a.size(); start += static_cast<std::size_t>(block)) {
    const std::size_t end = std::min(a.size(), start + static_cast<std::size_t>(block));
    double t = 0.0;
    for (std::size_t k = start; k < end; ++k) t = add_round(f, mode, t, double{a[k]} * double{b[k]});
    s = add_round(f, mode, s, t);
  }
  return s;
}

// --- The exact reference ------------------------------------------------------


float exact_dot(const Format& f, RoundingMode mode, std::span<const float> a, std::span<const float> b, float c) {
  // The special cases are IEEE's; an infinity then goes into f.
  bool nan = std::isnan(c), positive = std::isinf(c) && c > 0, negative = std::isinf(c) && c < 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const float x = a[k], y = b[k];
    if (std::isfinite(x) && std::isfinite(y)) continue;
    if (std::isnan(x) || std::isnan(y) || x == 0.0f || y == 0.0f)
      nan = true;
    else
      (std::signbit(x) != std::signbit(y) ? negative : positive) = true;
  }
  if (nan || (positive && negative)) return std::numeric_limits<float>::quiet_NaN();
  if (positive || negative) return static_cast<float>(round_value(f, mode, negative ? -INFINITY : INFINITY));

  ExactAccumulator sum;
  bool all_negative = true, any_negative = false, only_zeros = true;
  auto add_term = [&](bool neg, std::uint64_t significand, int lsb) {
    if (significand == 0) {
      all_negative = all_negative && neg;
      any_negative = any_negative || neg;
      return;
    }
    only_zeros = false;
    sum.add(neg, significand, lsb);
  };
  for (std::size_t k = 0; k < a.size(); ++k) {
    const Operand x = decode_finite(a[k], -126), y = decode_finite(b[k], -126);
    add_term(x.negative != y.negative, x.significand * y.significand, x.lsb + y.lsb);
  }
  const Operand z = decode_finite(c, -126);
  add_term(z.negative, z.significand, z.lsb);
  if (only_zeros || sum.is_zero()) return zero_result(mode, all_negative, any_negative, only_zeros);
  return to_float(f, detail::round_exact(f, Rounding{mode}, sum.value(), 0).bits);
}

// --- Names ----------------------------------------------------------------------

constexpr std::string_view kGpus[] = {"v100", "a100", "h100"};

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

// --- Presets ----------------------------------------------------------------------

std::span<const std::string_view> tensor_core_gpus() { return kGpus; }

std::optional<TensorCoreModel> tensor_core_preset(std::string_view gpu_name, const Format& input,
                                                  const Format& output) {
  const std::string gpu = lower(gpu_name);
  const bool fp16_in = input == formats::binary16, bf16_in = input == formats::bfloat16,
             tf32_in = input == formats::tf32;
  const bool fp8_in = input == formats::e4m3 || input == formats::e5m2;
  const bool out32 = output == formats::binary32, out16 = output == formats::binary16;
  if (!out32 && !out16) return std::nullopt;
  TensorCoreModel m;
  m.input = input;
  m.output = output;
  // binary32 results are truncated, binary16 results rounded to nearest-even
  // (Fasi et al. 2021, section 4; Khattak and Mikaitis).
  m.rounding = out32 ? RoundingMode::toward_zero : RoundingMode::nearest_even;
  if (gpu == "v100") {  // Volta: 4 products, no extra alignment bit; fp16 inputs only
    if (!fp16_in) return std::nullopt;
    m.block_size = 4;
    m.fraction_bits = 23;
    return m;
  }
  if (gpu == "a100") {  // Ampere: 8 products (tf32: 4), 1 extra bit; binary16 output for fp16 inputs only
    if (!(fp16_in || ((bf16_in || tf32_in) && out32))) return std::nullopt;
    m.block_size = tf32_in ? 4 : 8;
    m.fraction_bits = 24;
    return m;
  }
  if (gpu == "h100") {  // Hopper: 16 products (tf32: 8), 2 extra bits
    if (fp16_in || ((bf16_in || tf32_in) && out32)) {
      m.block_size = tf32_in ? 8 : 16;
      m.fraction_bits = 25;
      return m;
    }
    if (!fp8_in) return std::nullopt;
    m.block_size = 32;
    if (out32) {  // wgmma: one block of 32, an accumulator 10 bits narrower, a 14-bit normalised sum
      m.fraction_bits = 13;
      m.result_precision = 14;
      return m;
    }
    // mma.sync with binary16 accumulation: two fp16 blocks of 16 (pairs of
    // products alternate between them), from +0, then c added in binary16.
    m.fraction_bits = 25;
    m.groups = 2;
    m.group_run = 2;
    m.c_added_last = true;
    return m;
  }
  return std::nullopt;
}

std::string to_string(const TensorCoreModel& m) {
  std::string s = "tensor-core(input " + m.input.name() + ", output " + m.output.name() + ", block " +
                  std::to_string(m.block_size) + ", fraction bits " + std::to_string(m.fraction_bits);
  if (m.result_precision > 0) s += ", result precision " + std::to_string(m.result_precision);
  s += ", rounding " + std::string(to_string(m.rounding));
  if (m.groups > 1) s += ", " + std::to_string(m.groups) + " groups of runs of " + std::to_string(m.group_run);
  if (m.c_added_last) s += ", c added last";
  return s + ")";
}

float tensor_core_dot(const TensorCoreModel& m, std::span<const float> a, std::span<const float> b, float c) {
  check_model(m);
  if (a.size() != b.size()) throw std::invalid_argument("tensor_core_dot: a and b differ in size");
  std::array<float, 64> x, y;
  float acc = to_format(m.output, c);
  for (std::size_t start = 0; start < a.size(); start += static_cast<std::size_t>(m.block_size)) {
    const int n = static_cast<int>(std::min<std::size_t>(m.block_size, a.size() - start));
    for (int j = 0; j < n; ++j) {
      x[j] = to_format(m.input, a[start + j]);
      y[j] = to_format(m.input, b[start + j]);
    }
    acc = tensor_core_block(m, x.data(), y.data(), n, acc);
  }
  return std::isnan(acc) ? canonical_nan(m.output) : acc;  // K = 0 with a NaN c too
}

// --- The common type ---------------------------------------------------------------

float dot(const AccumulationModel& model, std::span<const float> a, std::span<const float> b, float c) {
  if (a.size() != b.size()) throw std::invalid_argument("dot: a and b differ in size");
  if (model.kind == AccumulationKind::tensor_core) return tensor_core_dot(model.tensor_core, a, b, c);
  check_format(model.format, model.mode);
  switch (model.kind) {
    case AccumulationKind::recursive: return static_cast<float>(recursive_dot(model.format, model.mode, a, b, c));
    case AccumulationKind::pairwise: return static_cast<float>(pairwise_dot(model.format, model.mode, a, b, c));
    case AccumulationKind::blocked:
      return static_cast<float>(blocked_dot(model.format, model.mode, model.block, a, b, c));
    case AccumulationKind::exact: return exact_dot(model.format, model.mode, a, b, c);
    case AccumulationKind::tensor_core: break;
  }
  throw std::invalid_argument("dot: unknown accumulation model");
}

std::string to_string(const AccumulationModel& m) {
  if (m.kind == AccumulationKind::tensor_core) {
    for (std::string_view gpu : kGpus) {
      if (tensor_core_preset(gpu, m.tensor_core.input, m.tensor_core.output) == m.tensor_core)
        return std::string(gpu) + ":" + m.tensor_core.input.name() + ":" + m.tensor_core.output.name();
    }
    return to_string(m.tensor_core);
  }
  std::string s;
  switch (m.kind) {
    case AccumulationKind::recursive: s = m.format.name(); break;
    case AccumulationKind::pairwise: s = "pairwise-" + m.format.name(); break;
    case AccumulationKind::blocked: s = "blocked-" + m.format.name() + "-" + std::to_string(m.block); break;
    case AccumulationKind::exact: s = "exact-" + m.format.name(); break;
    case AccumulationKind::tensor_core: break;
  }
  if (m.mode != RoundingMode::nearest_even) s.append(":").append(to_string(m.mode));
  return s;
}

std::optional<AccumulationModel> parse_accumulation_model(std::string_view text, const Format& tensor_core_input) {
  const std::string name = lower(text);
  AccumulationModel m;
  // Tensor cores: GPU[:INPUT[:OUTPUT]].
  for (std::string_view gpu : kGpus) {
    if (name.rfind(gpu, 0) != 0 || (name.size() > gpu.size() && name[gpu.size()] != ':')) continue;
    Format input = tensor_core_input, output = formats::binary32;
    std::string_view rest = std::string_view(name).substr(gpu.size());
    if (!rest.empty()) {
      rest.remove_prefix(1);
      const auto colon = rest.find(':');
      const auto in = parse_format(rest.substr(0, colon));
      if (!in) return std::nullopt;
      input = *in;
      if (colon != std::string_view::npos) {
        const auto out = parse_format(rest.substr(colon + 1));
        if (!out) return std::nullopt;
        output = *out;
      }
    }
    const auto preset = tensor_core_preset(gpu, input, output);
    if (!preset) return std::nullopt;
    m.kind = AccumulationKind::tensor_core;
    m.format = preset->output;
    m.mode = preset->rounding;
    m.tensor_core = *preset;
    return m;
  }
  // Others: BODY[:MODE], where a format name may itself hold ':' options.
  std::string_view body = name;
  if (const auto colon = body.rfind(':'); colon != std::string_view::npos) {
    if (const auto mode = parse_rounding_mode(body.substr(colon + 1))) {
      if (*mode == RoundingMode::stochastic) return std::nullopt;
      m.mode = *mode;
      body = body.substr(0, colon);
    }
  }
  auto take_prefix = [&](std::string_view prefix) {
    if (body.rfind(prefix, 0) != 0) return false;
    body.remove_prefix(prefix.size());
    return true;
  };
  if (body == "exact") {
    m.kind = AccumulationKind::exact;
  } else if (take_prefix("exact-")) {
    m.kind = AccumulationKind::exact;
  } else if (take_prefix("pairwise-")) {
    m.kind = AccumulationKind::pairwise;
  } else if (take_prefix("blocked-")) {
    m.kind = AccumulationKind::blocked;
    const auto dash = body.rfind('-');
    if (dash == std::string_view::npos) return std::nullopt;
    const auto block = parse_int(body.substr(dash + 1));
    if (!block || *block < 1) return std::nullopt;
    m.block = *block;
    body = body.substr(0, dash);
  }
  if (!(m.kind == AccumulationKind::exact && body == "exact")) {
    const auto format = parse_format(body);
    if (!format || !fits_in_float(*format)) return std::nullopt;
    m.format = *format;
  }
  return m;
}

std::string_view accumulation_model_names() {
  return "FORMAT (recursive, e.g. fp32, fp16), pairwise-FORMAT, blocked-FORMAT-B, exact, exact-FORMAT, each with "
         "an optional :MODE; v100, a100, h100, or GPU:INPUT[:OUTPUT] (e.g. h100:e4m3:fp16)";
}

}  // namespace mpsim
