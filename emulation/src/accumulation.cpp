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

// AMD "prd_limit" (MATLAB-tensor-core, MI210MC.m, MI300MC.m): a product at or
// beyond 2^(emax + 1) of the output is an infinity before anything is summed.
std::optional<float> product_overflow(const TensorCoreModel& m, const float* a, const float* b, int n) {
  const double limit = std::ldexp(1.0, m.output.emax() + 1);
  bool positive = false, negative = false;
  for (int j = 0; j < n; ++j) {
    const double p = double{a[j]} * double{b[j]};  // exact: two significands of <= 24 bits
    if (std::fabs(p) >= limit) (p < 0 ? negative : positive) = true;
  }
  if (!positive && !negative) return std::nullopt;
  if (positive && negative) return canonical_nan(m.output);
  return to_float(m.output, infinity_or_nan(m.output, negative));
}

// CDNA1 (MI100MC.m, "correct_rounding"): the products and c summed exactly, rounded once.
float exact_block(const TensorCoreModel& m, const float* a, const float* b, int n, float c) {
  ExactAccumulator sum;
  bool all_negative = true, any_negative = false, only_zeros = true;
  auto add_term = [&](bool negative, std::uint64_t significand, int lsb) {
    if (significand == 0) {
      all_negative = all_negative && negative;
      any_negative = any_negative || negative;
      return;
    }
    only_zeros = false;
    sum.add(negative, significand, lsb);
  };
  for (int j = 0; j < n; ++j) {
    const Operand x = decode_finite(a[j], m.input.emin()), y = decode_finite(b[j], m.input.emin());
    add_term(x.negative != y.negative, x.significand * y.significand, x.lsb + y.lsb);
  }
  const Operand z = decode_finite(c, m.output.emin());
  add_term(z.negative, z.significand, z.lsb);
  if (only_zeros || sum.is_zero()) return zero_result(m.rounding, all_negative, any_negative, only_zeros);
  return to_float(m.output, detail::round_exact(m.output, Rounding{m.rounding}, sum.value(), 0).bits);
}

// CDNA2 (MI210MC.m, "pair_wise_sum"): products rounded to the output format
// (nearest-even, as MATLAB's single()), the block summed by halving (a missing
// product is +0), each sum rounded in the output format, then c + sum.
float pairwise_block(const TensorCoreModel& m, const float* a, const float* b, int n, float c) {
  std::array<Bits, 64> p;
  for (int j = 0; j < m.block_size; ++j)
    p[j] = round_to_format(m.output, Rounding{RoundingMode::nearest_even}, j < n ? double{a[j]} * double{b[j]} : 0.0)
               .bits;
  const Rounding r{m.rounding};
  auto halve = [&](auto&& self, int lo, int count) -> Bits {
    if (count == 1) return p[lo];
    const int half = count / 2;
    return add(m.output, r, self(self, lo, half), self(self, lo + half, count - half)).bits;
  };
  const Bits sum = add(m.output, r, format_bits(m.output, c), halve(halve, 0, m.block_size)).bits;
  if (classify(m.output, sum) == FloatClass::nan) return canonical_nan(m.output);
  return to_float(m.output, sum);
}

// x / 2^shift rounded toward -inf (shift > 0), or x * 2^-shift (shift <= 0, exact here).
i128 floor_shift(i128 x, int shift) {
  if (shift <= 0) return x << -shift;
  if (shift >= 127) return x < 0 ? -1 : 0;
  return x >> shift;  // arithmetic: toward -inf
}

// CDNA3 (MI300MC.m, "late_partial_sum"; last in commit b4bf135 of
// MATLAB-tensor-core): the products fused and truncated like `fused`, kept
// unnormalised; c (exponent emin of the output when it is 0) then joins: the
// smaller addend is rounded toward -inf onto the larger's grid, fraction_bits
// below its exponent (7 more for the products' sum when c is larger).
float late_c_block(const TensorCoreModel& m, const float* a, const float* b, int n, float c) {
  struct Term {
    bool negative;
    std::uint64_t significand;
    int lsb, exponent;
  };
  std::array<Term, 64> terms;
  int count = 0;
  bool all_negative = true, any_negative = false;
  for (int j = 0; j < n; ++j) {
    const Operand x = decode_finite(a[j], m.input.emin()), y = decode_finite(b[j], m.input.emin());
    const bool negative = x.negative != y.negative;
    if (x.significand == 0 || y.significand == 0) {
      all_negative = all_negative && negative;
      any_negative = any_negative || negative;
      continue;
    }
    terms[count++] = {negative, x.significand * y.significand, x.lsb + y.lsb, x.exponent + y.exponent};
  }
  const Operand z = decode_finite(c, m.output.emin());
  if (count == 0) {
    if (z.significand != 0) return c;
    return zero_result(m.rounding, all_negative && z.negative, any_negative || z.negative, true);
  }
  const int F = m.fraction_bits;
  int product_exponent = terms[0].exponent;
  for (int j = 1; j < count; ++j) product_exponent = std::max(product_exponent, terms[j].exponent);
  auto truncated = [](std::uint64_t significand, int lsb, int unit) -> u128 {
    if (lsb >= unit) return static_cast<u128>(significand) << (lsb - unit);
    return unit - lsb < 64 ? significand >> (unit - lsb) : 0;
  };
  i128 products = 0;
  for (int j = 0; j < count; ++j) {
    const i128 v = static_cast<i128>(truncated(terms[j].significand, terms[j].lsb, product_exponent - F));
    products += terms[j].negative ? -v : v;
  }
  const i128 magnitude_c = static_cast<i128>(truncated(z.significand, z.lsb, z.exponent - F));
  i128 addend = z.negative ? -magnitude_c : magnitude_c;
  int unit = product_exponent - F;
  if (z.exponent > product_exponent) {  // MI300MC.m: the products' sum gets 7 more bits (eab_1 = 7)
    unit = z.exponent - F - 7;
    products = floor_shift(products, z.exponent - product_exponent - 7);
    addend <<= 7;
  } else {
    addend = floor_shift(addend, product_exponent - z.exponent);
  }
  const i128 sum = products + addend;
  if (sum == 0) return zero_result(m.rounding, false, false, false);
  const detail::Exact value{sum < 0, unit, static_cast<u128>(sum < 0 ? -sum : sum), false};
  return to_float(m.output, detail::round_exact(m.output, Rounding{m.rounding}, value, 0).bits);
}

// One instruction: a block of up to block_size products (a missing product is 0).
float tensor_core_block(const TensorCoreModel& m, const float* a, const float* b, int n, float c) {
  std::array<int, 64> index;
  if (m.sum != TensorCoreSum::fused) {
    for (int j = 0; j < n; ++j) index[j] = j;
    if (auto special = special_result(a, b, index.data(), n, c, m.output)) return *special;
    if (m.products_overflow)
      if (auto overflow = product_overflow(m, a, b, n)) return *overflow;
    switch (m.sum) {
      case TensorCoreSum::exact: return exact_block(m, a, b, n, c);
      case TensorCoreSum::pairwise: return pairwise_block(m, a, b, n, c);
      case TensorCoreSum::late_c: return late_c_block(m, a, b, n, c);
      case TensorCoreSum::fused: break;
    }
  }
  if (m.products_overflow) {
    for (int j = 0; j < n; ++j) index[j] = j;
    if (!special_result(a, b, index.data(), n, c, m.output))
      if (auto overflow = product_overflow(m, a, b, n)) return *overflow;
  }
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
  const Rounded sum = add(m.output, Rounding{m.c_rounding.value_or(m.rounding)}, format_bits(m.output, acc),
                          format_bits(m.output, c));
  if (classify(m.output, sum.bits) == FloatClass::nan) return canonical_nan(m.output);
  return to_float(m.output, sum.bits);
}

std::string_view sum_name(TensorCoreSum sum) {
  switch (sum) {
    case TensorCoreSum::fused: return "fused";
    case TensorCoreSum::exact: return "exact";
    case TensorCoreSum::pairwise: return "pairwise";
    case TensorCoreSum::late_c: return "late-c";
  }
  return "fused";
}

// Why a model cannot run, or nothing when it can.
std::optional<std::string> invalid_reason(const TensorCoreModel& m) {
  auto shaped_like = [&](const Format& f) {  // binary32 or binary16, with either subnormal handling
    return m.output.exponent_bits == f.exponent_bits && m.output.mantissa_bits == f.mantissa_bits &&
           m.output.specials == Specials::ieee;
  };
  if (!shaped_like(formats::binary32) && !shaped_like(formats::binary16))
    return "output " + m.output.name() + " is not binary32 or binary16";
  if (auto why = m.input.invalid_reason()) return "input " + m.input.name() + ": " + *why;
  if (!fits_in_float(m.input)) return "input " + m.input.name() + " does not fit in binary32";
  if (m.block_size < 1 || m.block_size > 64) return "block " + std::to_string(m.block_size) + " is not in 1..64";
  if (m.fraction_bits < 1 || m.fraction_bits > 100)
    return "bits " + std::to_string(m.fraction_bits) + " is not in 1..100";
  if (m.result_precision < 0 || m.result_precision > 100)
    return "precision " + std::to_string(m.result_precision) + " is not in 0..100";
  if (m.groups < 1 || m.groups > m.block_size)
    return "groups " + std::to_string(m.groups) + " is not in 1..block";
  if (m.group_run < 1) return "run " + std::to_string(m.group_run) + " is below 1";
  if (m.rounding == RoundingMode::stochastic) return "rounding must be deterministic, not stochastic";
  if (m.sum != TensorCoreSum::fused && (m.groups != 1 || m.result_precision != 0 || m.c_added_last))
    return "sum=" + std::string(sum_name(m.sum)) + " takes no groups, precision or c=last";
  if (m.sum == TensorCoreSum::late_c && m.fraction_bits > 90) return "sum=late-c takes bits up to 90";
  if (m.c_rounding && !m.c_added_last) return "c_rounding goes with c=last";
  if (m.c_rounding == RoundingMode::stochastic) return "c_rounding must be deterministic, not stochastic";
  if (m.promotion < 0 || m.promotion % m.block_size != 0)
    return "promote " + std::to_string(m.promotion) + " is not 0 or a multiple of the block (" +
           std::to_string(m.block_size) + ")";
  if (m.promotion > 0 && m.output != formats::binary32) return "promote needs a binary32 output";
  return std::nullopt;
}

void check_model(const TensorCoreModel& m) {
  if (auto why = invalid_reason(m)) throw std::invalid_argument("unsupported tensor-core model " + to_string(m) + ": " + *why);
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

// --- Presets ----------------------------------------------------------------------

// Every GPU's tensor core, one row per architecture, input and output format.
// Parameters from Khattak and Mikaitis's MATLAB-tensor-core models (BSD-2,
// models/*.m; MI300 from models/MI300MC.m at commit b4bf135): block = "fma",
// bits = 23 + "neab", rounding = "frmode" (rz: toward zero, rne: nearest-even);
// "neab" -10 (FP8 on H100 and Ada) is bits 13 with the sum truncated to 14
// bits (GEMM.m narrows the output significand by 10). docs/tensor_cores.md
// has the table with its sources; the H100 FP8 -> binary16 row and the
// binary16 outputs were fitted to the measured vectors (shared/).
enum class Basis : std::uint8_t {
  measured,   // reproduces every measured case in shared/tensor-core-vectors/
  published,  // the published model; no measured vectors here
  nvidia_doc, // no published model: built from NVIDIA's PTX ISA (kind::f8f6f4 takes FP8, FP6, FP4 alike)
  fitted,     // fitted here to measured vectors outside shared/ (docs/tensor_cores.md says which)
};

struct PresetRow {
  std::string_view arch;
  Format input;
  bool out16;  // binary16 output, else binary32
  int block, bits, precision;
  RoundingMode rounding;
  int groups = 1, run = 1;
  bool c_last = false;
  TensorCoreSum sum = TensorCoreSum::fused;
  bool overflow = false, flush = false;  // AMD prd_limit; subnormals flushed on input and output
  Basis basis = Basis::published;
  std::optional<RoundingMode> c_rounding = std::nullopt;  // with c_last, when not `rounding`
};

constexpr RoundingMode rz = RoundingMode::toward_zero, rne = RoundingMode::nearest_even;
constexpr TensorCoreSum sum_exact = TensorCoreSum::exact, sum_pairwise = TensorCoreSum::pairwise,
                        sum_late_c = TensorCoreSum::late_c, sum_fused = TensorCoreSum::fused;
using formats::binary16, formats::bfloat16, formats::tf32, formats::e4m3, formats::e5m2, formats::e2m1,
    formats::e2m3, formats::e3m2;
constexpr Basis measured = Basis::measured, nvidia_doc = Basis::nvidia_doc, published = Basis::published,
                fitted = Basis::fitted;

constexpr PresetRow kPresets[] = {
    // arch   input    out16  block bits prec rounding groups run c_last sum overflow flush basis
    {"v100", binary16, false, 4, 23, 0, rz, 1, 1, false, sum_fused, false, false, measured},  // V100TC.m
    {"v100", binary16, true, 4, 23, 0, rne, 1, 1, false, sum_fused, false, false, measured},
    {"a100", binary16, false, 8, 24, 0, rz, 1, 1, false, sum_fused, false, false, measured},  // A100TC.m
    {"a100", binary16, true, 8, 24, 0, rne, 1, 1, false, sum_fused, false, false, measured},
    {"a100", bfloat16, false, 8, 24, 0, rz, 1, 1, false, sum_fused, false, false, measured},
    {"a100", tf32, false, 4, 24, 0, rz, 1, 1, false, sum_fused, false, false, measured},
    {"h100", binary16, false, 16, 25, 0, rz, 1, 1, false, sum_fused, false, false, measured},  // H100TC.m
    {"h100", binary16, true, 16, 25, 0, rne, 1, 1, false, sum_fused, false, false, measured},
    {"h100", bfloat16, false, 16, 25, 0, rz, 1, 1, false, sum_fused, false, false, measured},
    {"h100", tf32, false, 8, 25, 0, rz, 1, 1, false, sum_fused, false, false, measured},
    {"h100", e4m3, false, 32, 13, 14, rz, 1, 1, false, sum_fused, false, false, measured},  // wgmma
    {"h100", e5m2, false, 32, 13, 14, rz, 1, 1, false, sum_fused, false, false, measured},
    // mma.sync, f16 accumulator: two blocks of alternating pairs from +0, then c (fitted to shared/).
    {"h100", e4m3, true, 32, 25, 0, rne, 2, 2, true, sum_fused, false, false, measured},
    {"h100", e5m2, true, 32, 25, 0, rne, 2, 2, true, sum_fused, false, false, measured},
    {"ada", binary16, false, 8, 24, 0, rz, 1, 1, false, sum_fused, false, false, published},  // AdaTC.m, L40STC.m
    {"ada", binary16, true, 8, 24, 0, rne, 1, 1, false, sum_fused, false, false, published},
    {"ada", bfloat16, false, 8, 24, 0, rz, 1, 1, false, sum_fused, false, false, published},
    {"ada", tf32, false, 4, 24, 0, rz, 1, 1, false, sum_fused, false, false, published},
    {"ada", e4m3, false, 16, 13, 14, rz, 1, 1, false, sum_fused, false, false, published},
    {"ada", e5m2, false, 16, 13, 14, rz, 1, 1, false, sum_fused, false, false, published},
    {"b200", binary16, false, 16, 25, 0, rz, 1, 1, false, sum_fused, false, false, published},  // B200TC.m
    {"b200", binary16, true, 16, 25, 0, rne, 1, 1, false, sum_fused, false, false, published},
    {"b200", bfloat16, false, 16, 25, 0, rz, 1, 1, false, sum_fused, false, false, published},
    {"b200", tf32, false, 8, 25, 0, rz, 1, 1, false, sum_fused, false, false, published},
    // FP8: B200TC.m's block of 32 (F = 25, truncated), but from +0, and c added last to nearest-even: all
    // 10,000 of the MATLAB repository's measured B200 E4M3/E5M2 -> fp32 cases (B200TC.m itself: 3,557 fail).
    {"b200", e4m3, false, 32, 25, 0, rz, 1, 1, true, sum_fused, false, false, fitted, rne},
    {"b200", e5m2, false, 32, 25, 0, rz, 1, 1, true, sum_fused, false, false, fitted, rne},
    // FP8 -> fp16 (B200TC.m forces fp32): H100's mma.sync model fits all 10,000 measured cases there too.
    {"b200", e4m3, true, 32, 25, 0, rne, 2, 2, true, sum_fused, false, false, fitted},
    {"b200", e5m2, true, 32, 25, 0, rne, 2, 2, true, sum_fused, false, false, fitted},
    {"b200", e3m2, false, 32, 25, 0, rz, 1, 1, true, sum_fused, false, false, nvidia_doc, rne},  // as FP8
    {"b200", e2m3, false, 32, 25, 0, rz, 1, 1, true, sum_fused, false, false, nvidia_doc, rne},
    {"b200", e2m1, false, 32, 25, 0, rz, 1, 1, true, sum_fused, false, false, nvidia_doc, rne},
    {"b200rn", binary16, false, 16, 25, 0, rne, 1, 1, false, sum_fused, false, false, published},  // B200TCRN.m
    {"b200rn", binary16, true, 16, 25, 0, rne, 1, 1, false, sum_fused, false, false, published},
    {"b200rn", bfloat16, false, 16, 25, 0, rne, 1, 1, false, sum_fused, false, false, published},
    {"b200rn", tf32, false, 8, 25, 0, rne, 1, 1, false, sum_fused, false, false, published},
    {"b200rn", e4m3, false, 32, 25, 0, rne, 1, 1, false, sum_fused, false, false, published},
    {"b200rn", e5m2, false, 32, 25, 0, rne, 1, 1, false, sum_fused, false, false, published},
    {"b200rn", e3m2, false, 32, 25, 0, rne, 1, 1, false, sum_fused, false, false, nvidia_doc},
    {"b200rn", e2m3, false, 32, 25, 0, rne, 1, 1, false, sum_fused, false, false, nvidia_doc},
    {"b200rn", e2m1, false, 32, 25, 0, rne, 1, 1, false, sum_fused, false, false, nvidia_doc},
    {"cdna1", binary16, false, 4, 25, 0, rne, 1, 1, false, sum_exact, false, false, published},  // MI100MC.m
    {"cdna1", bfloat16, false, 2, 25, 0, rne, 1, 1, false, sum_exact, false, false, published},
    {"cdna2", binary16, false, 4, 25, 0, rne, 1, 1, false, sum_pairwise, true, true, published},  // MI210MC.m
    {"cdna2", bfloat16, false, 4, 25, 0, rne, 1, 1, false, sum_pairwise, true, true, published},
    {"cdna3", binary16, false, 8, 24, 0, rne, 1, 1, false, sum_late_c, true, false, published},  // MI300MC.m
    {"cdna3", bfloat16, false, 8, 24, 0, rne, 1, 1, false, sum_late_c, true, false, published},
    {"cdna3", tf32, false, 4, 24, 0, rne, 1, 1, false, sum_late_c, true, false, published},
};

// GPU names (lower case) and the architecture whose rows they use; the
// published models make A30 and A2 A100 (A30TC.m, A2TC.m), H200 H100
// (H200TC.m), L40S Ada (L40STC.m: the same parameters as AdaTC.m), RTX PRO
// 6000 B200 (RTXPRO6000TC.m), MI250 MI210 and MI300A/X MI300 (their *MC.m).
// RTX 6000 Ada is the Ada architecture (sm_89) too; no model names it.
struct GpuName {
  std::string_view gpu, arch;
};
constexpr GpuName kGpuArch[] = {
    {"v100", "v100"},   {"a100", "a100"},  {"a30", "a100"},        {"a2", "a100"},          {"h100", "h100"},
    {"h200", "h100"},   {"ada", "ada"},    {"l40s", "ada"},        {"rtx6000ada", "ada"},   {"b200", "b200"},
    {"b200rn", "b200rn"}, {"rtxpro6000", "b200"}, {"mi100", "cdna1"}, {"mi210", "cdna2"}, {"mi250", "cdna2"},
    {"mi300a", "cdna3"}, {"mi300x", "cdna3"},
};
constexpr auto kGpus = [] {
  std::array<std::string_view, std::size(kGpuArch)> names{};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = kGpuArch[i].gpu;
  return names;
}();

// Formats match by shape; the GPU decides subnormal handling and saturation.
bool same_shape(const Format& a, const Format& b) {
  return a.exponent_bits == b.exponent_bits && a.mantissa_bits == b.mantissa_bits && a.specials == b.specials;
}

const PresetRow* find_preset(std::string_view gpu_name, const Format& input, const Format& output) {
  const std::string gpu = lower(gpu_name);
  const bool out16 = same_shape(output, formats::binary16);
  if (!out16 && !same_shape(output, formats::binary32)) return nullptr;
  for (const GpuName& g : kGpuArch) {
    if (g.gpu != gpu) continue;
    for (const PresetRow& row : kPresets)
      if (row.arch == g.arch && row.out16 == out16 && same_shape(row.input, input)) return &row;
  }
  return nullptr;
}

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::span<const std::string_view> tensor_core_gpus() { return kGpus; }

std::optional<TensorCoreModel> tensor_core_preset(std::string_view gpu, const Format& input, const Format& output) {
  const PresetRow* row = find_preset(gpu, input, output);
  if (!row) return std::nullopt;
  const Subnormals subnormals = row->flush ? Subnormals::flush_to_zero : Subnormals::gradual;
  TensorCoreModel m;
  m.input = row->input;
  m.input.subnormals = row->flush ? subnormals : row->input.subnormals;
  m.output = row->out16 ? formats::binary16 : formats::binary32;
  m.output.subnormals = subnormals;
  m.block_size = row->block;
  m.fraction_bits = row->bits;
  m.result_precision = row->precision;
  m.rounding = row->rounding;
  m.groups = row->groups;
  m.group_run = row->run;
  m.c_added_last = row->c_last;
  m.c_rounding = row->c_rounding;
  m.sum = row->sum;
  m.products_overflow = row->overflow;
  return m;
}

bool tensor_core_preset_validated(std::string_view gpu, const Format& input, const Format& output) {
  const PresetRow* row = find_preset(gpu, input, output);
  const std::string g = lower(gpu);
  return row && row->basis == Basis::measured && (g == "v100" || g == "a100" || g == "h100");
}

std::string to_string(const TensorCoreModel& m) {
  std::string s = "tc:input=" + m.input.name() + ",output=" + m.output.name() + ",block=" +
                  std::to_string(m.block_size) + ",bits=" + std::to_string(m.fraction_bits);
  if (m.result_precision > 0) s += ",precision=" + std::to_string(m.result_precision);
  s += ",rounding=" + std::string(to_string(m.rounding));
  if (m.groups > 1 || m.group_run > 1) s += ",groups=" + std::to_string(m.groups) + ",run=" + std::to_string(m.group_run);
  if (m.c_added_last) s += ",c=last";
  if (m.c_rounding) s += ",c_rounding=" + std::string(to_string(*m.c_rounding));
  if (m.sum != TensorCoreSum::fused) s += ",sum=" + std::string(sum_name(m.sum));
  if (m.products_overflow) s += ",overflow=products";
  if (m.promotion > 0) s += ",promote=" + std::to_string(m.promotion);
  return s;
}

TensorCoreModel parse_tensor_core_model(std::string_view text) {
  std::string body = lower(text);
  if (body.rfind("tc:", 0) == 0) body.erase(0, 3);
  TensorCoreModel m;
  bool has_bits = false, has_extra = false;
  std::vector<std::string> seen;
  std::size_t start = 0;
  while (start <= body.size()) {
    const std::size_t comma = body.find(',', start);
    const std::string item = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? body.size() + 1 : comma + 1;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument("tensor-core model: '" + item + "' is not KEY=VALUE");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      throw std::invalid_argument("tensor-core model: key '" + key + "' is given twice");
    seen.push_back(key);
    auto number = [&] {
      const auto v = parse_int(value);
      if (!v) throw std::invalid_argument("tensor-core model: " + key + "=" + value + " is not an integer");
      return *v;
    };
    auto format = [&] {
      const auto f = parse_format(value);
      if (!f) throw std::invalid_argument("tensor-core model: " + key + "=" + value + " is not a format");
      return *f;
    };
    if (key == "input") {
      m.input = format();
    } else if (key == "output") {
      m.output = format();
    } else if (key == "block") {
      m.block_size = number();
    } else if (key == "bits") {
      m.fraction_bits = number();
      has_bits = true;
    } else if (key == "extra") {
      m.fraction_bits = 23 + number();
      has_extra = true;
    } else if (key == "precision") {
      m.result_precision = number();
    } else if (key == "rounding") {
      const auto mode = parse_rounding_mode(value);
      if (!mode) throw std::invalid_argument("tensor-core model: rounding=" + value + " is not a rounding mode");
      m.rounding = *mode;
    } else if (key == "groups") {
      m.groups = number();
    } else if (key == "run") {
      m.group_run = number();
    } else if (key == "c") {
      if (value != "block" && value != "last")
        throw std::invalid_argument("tensor-core model: c=" + value + " is neither 'block' nor 'last'");
      m.c_added_last = value == "last";
    } else if (key == "c_rounding") {
      const auto mode = parse_rounding_mode(value);
      if (!mode) throw std::invalid_argument("tensor-core model: c_rounding=" + value + " is not a rounding mode");
      m.c_rounding = *mode;
    } else if (key == "sum") {
      bool found = false;
      for (TensorCoreSum kind :
           {TensorCoreSum::fused, TensorCoreSum::exact, TensorCoreSum::pairwise, TensorCoreSum::late_c})
        if (value == sum_name(kind)) {
          m.sum = kind;
          found = true;
        }
      if (!found)
        throw std::invalid_argument("tensor-core model: sum=" + value + " is not fused, exact, pairwise or late-c");
    } else if (key == "promote") {
      m.promotion = number();
    } else if (key == "overflow") {
      if (value != "ieee" && value != "products")
        throw std::invalid_argument("tensor-core model: overflow=" + value + " is neither 'ieee' nor 'products'");
      m.products_overflow = value == "products";
    } else {
      throw std::invalid_argument("tensor-core model: unknown key '" + key +
                                  "' (keys: input, output, block, bits, extra, precision, rounding, groups, run, c, "
                                  "c_rounding, sum, overflow, promote)");
    }
  }
  if (has_bits && has_extra) throw std::invalid_argument("tensor-core model: give bits or extra, not both");
  if (auto why = invalid_reason(m)) throw std::invalid_argument("tensor-core model: " + *why);
  return m;
}

float tensor_core_dot(const TensorCoreModel& m, std::span<const float> a, std::span<const float> b, float c) {
  check_model(m);
  if (a.size() != b.size()) throw std::invalid_argument("tensor_core_dot: a and b differ in size");
  if (m.promotion > 0) {  // runs of `promotion` products from +0, each added to a binary32 sum that starts at c
    TensorCoreModel run = m;
    run.promotion = 0;
    float sum = to_format(m.output, c);
    const auto step = static_cast<std::size_t>(m.promotion);
    for (std::size_t start = 0; start < a.size(); start += step) {
      const std::size_t count = std::min(step, a.size() - start);
      sum += tensor_core_dot(run, a.subspan(start, count), b.subspan(start, count), 0.0f);
    }
    return std::isnan(sum) ? canonical_nan(m.output) : sum;
  }
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
      if (tensor_core_preset(gpu, m.tensor_core.input, m.tensor_core.output) != m.tensor_core) continue;
      Format in = m.tensor_core.input, out = m.tensor_core.output;  // the preset sets subnormal handling
      in.subnormals = out.subnormals = Subnormals::gradual;
      return std::string(gpu) + ":" + in.name() + ":" + out.name();
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

namespace {

[[noreturn]] void refuse_model(std::string_view text, const std::string& why) {
  throw std::invalid_argument("'" + std::string(text) + "': " + why);
}

// "binary16 -> binary32, binary16 -> binary16" for the GPU's presets.
std::string preset_list(std::string_view gpu) {
  std::string list;
  for (const auto& [input, output] : tensor_core_preset_formats(gpu))
    list += (list.empty() ? "" : ", ") + input.name() + " -> " + output.name();
  return list;
}

// Every input format of the preset table, once, in its order.
std::string tensor_core_input_names() {
  std::vector<Format> seen;
  std::string list;
  for (const PresetRow& row : kPresets) {
    if (std::any_of(seen.begin(), seen.end(), [&](const Format& f) { return same_shape(f, row.input); })) continue;
    seen.push_back(row.input);
    list += (list.empty() ? "" : ", ") + row.input.name();
  }
  return list;
}

// Whether text, or its last ':' piece, is a rounding mode: a ":MODE" suffix.
bool ends_in_mode(std::string_view piece) {
  const auto colon = piece.rfind(':');
  return parse_rounding_mode(colon == std::string_view::npos ? piece : piece.substr(colon + 1)).has_value();
}

// GPU[:INPUT[:OUTPUT]], `rest` being what follows the GPU's name.
AccumulationModel parse_gpu_model(std::string_view text, std::string_view gpu, std::string_view rest,
                                  const Format& default_input, const Format& default_output) {
  auto format_of = [&](std::string_view piece) {
    if (const auto f = parse_format(piece)) return *f;
    if (ends_in_mode(piece))
      refuse_model(text, "a tensor core takes no :MODE: the GPU fixes its rounding (a custom "
                         "tc:...,rounding=MODE sets one)");
    refuse_model(text, "'" + std::string(piece) + "' is not a format (GPU:INPUT[:OUTPUT], e.g. h100:e4m3:fp16; "
                       "tensor-core inputs: " + tensor_core_input_names() + ")");
  };
  Format input = default_input, output = default_output;
  if (!rest.empty()) {
    output = formats::binary32;
    rest.remove_prefix(1);  // the ':'
    const auto colon = rest.find(':');
    input = format_of(rest.substr(0, colon));
    if (colon != std::string_view::npos) output = format_of(rest.substr(colon + 1));
  }
  if (!same_shape(output, formats::binary32) && !same_shape(output, formats::binary16))
    refuse_model(text, "a tensor core's output is binary32 or binary16, not " + output.name());
  if (std::none_of(std::begin(kPresets), std::end(kPresets),
                   [&](const PresetRow& row) { return same_shape(row.input, input); }))
    refuse_model(text, input.name() + " is not a tensor-core input format (the GPUs take " + tensor_core_input_names() +
                           ")");
  const auto preset = tensor_core_preset(gpu, input, output);
  if (!preset)
    refuse_model(text, "no model for " + std::string(gpu) + " " + input.name() + " -> " + output.name() +
                           ": the GPU has no such instruction, or no model of it is published "
                           "(docs/tensor_cores.md); " + std::string(gpu) + "'s models: " + preset_list(gpu));
  AccumulationModel m;
  m.kind = AccumulationKind::tensor_core;
  m.format = preset->output;
  m.mode = preset->rounding;
  m.tensor_core = *preset;
  return m;
}

}  // namespace

std::vector<std::pair<Format, Format>> tensor_core_preset_formats(std::string_view gpu) {
  std::vector<std::pair<Format, Format>> pairs;
  const std::string name = lower(gpu);
  for (const GpuName& g : kGpuArch)
    if (g.gpu == name)
      for (const PresetRow& row : kPresets)
        if (row.arch == g.arch) pairs.emplace_back(row.input, row.out16 ? formats::binary16 : formats::binary32);
  return pairs;
}

AccumulationModel parse_accumulation_model_or_throw(std::string_view text, const Format& tensor_core_input,
                                                    const Format& tensor_core_output) {
  const std::string name = lower(text);
  if (name.empty())
    throw std::invalid_argument("an empty accumulation model name. Accepted: " +
                                std::string(accumulation_model_names()));
  AccumulationModel m;
  if (name.rfind("tc:", 0) == 0) {
    try {
      m.tensor_core = parse_tensor_core_model(name);
    } catch (const std::invalid_argument& e) {
      refuse_model(text, e.what());
    }
    m.kind = AccumulationKind::tensor_core;
    m.format = m.tensor_core.output;
    m.mode = m.tensor_core.rounding;
    return m;
  }
  for (std::string_view gpu : kGpus)
    if (name.rfind(gpu, 0) == 0 && (name.size() == gpu.size() || name[gpu.size()] == ':'))
      return parse_gpu_model(text, gpu, std::string_view(name).substr(gpu.size()), tensor_core_input,
                             tensor_core_output);
  // Others: BODY[:MODE], where a format name may itself hold ':' options.
  std::string_view body = name;
  if (const auto colon = body.rfind(':'); colon != std::string_view::npos) {
    if (const auto mode = parse_rounding_mode(body.substr(colon + 1))) {
      if (*mode == RoundingMode::stochastic) {
        std::string modes;
        for (RoundingMode d : {RoundingMode::nearest_even, RoundingMode::nearest_away, RoundingMode::toward_zero,
                               RoundingMode::toward_positive, RoundingMode::toward_negative, RoundingMode::odd})
          modes += (modes.empty() ? "" : ", ") + std::string(to_string(d));
        refuse_model(text, "stochastic rounding is not an accumulation mode: the models are deterministic; give "
                           "one of " + modes);
      }
      m.mode = *mode;
      body = body.substr(0, colon);
    }
  }
  std::string_view prefix;  // "pairwise-", ...: a format must follow
  auto take_prefix = [&](std::string_view p) {
    if (body.rfind(p, 0) != 0) return false;
    body.remove_prefix(p.size());
    prefix = p;
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
    if (dash == std::string_view::npos)
      refuse_model(text, "give the block size: blocked-FORMAT-B, e.g. blocked-fp32-32");
    const std::string size(body.substr(dash + 1));
    const auto block = parse_int(size);
    if (!block)
      refuse_model(text, "block size '" + size + "' is not a whole number (blocked-FORMAT-B, e.g. blocked-fp32-32)");
    if (*block < 1)
      refuse_model(text, "block size " + size + ": a block holds at least 1 product (e.g. blocked-fp32-32)");
    m.block = *block;
    body = body.substr(0, dash);
  }
  if (!(m.kind == AccumulationKind::exact && body == "exact")) {
    const auto format = parse_format(body);
    if (!format && prefix.empty())
      throw std::invalid_argument("unknown accumulation model '" + std::string(text) +
                                  "'. Accepted: " + std::string(accumulation_model_names()));
    if (!format)
      refuse_model(text, "'" + std::string(body) + "' is not a format (" + std::string(prefix) +
                             "FORMAT, e.g. " + std::string(prefix) + "fp32). Accepted formats: " +
                             std::string(format_names()));
    if (!fits_in_float(*format))
      refuse_model(text, format->name() + " does not fit in binary32: an accumulation format needs a precision of "
                                         "at most 24 bits and binary32's range or less");
    m.format = *format;
  }
  return m;
}

std::optional<AccumulationModel> parse_accumulation_model(std::string_view text, const Format& tensor_core_input) {
  try {
    return parse_accumulation_model_or_throw(text, tensor_core_input);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

std::string_view accumulation_model_names() {
  return "FORMAT (recursive, e.g. fp32, fp16), pairwise-FORMAT, blocked-FORMAT-B, exact, exact-FORMAT, each with "
         "an optional :MODE; a GPU (v100, a100, a30, a2, h100, h200, ada, l40s, rtx6000ada, b200, b200rn, rtxpro6000, "
         "mi100, mi210, mi250, mi300a, mi300x), or GPU:INPUT[:OUTPUT] (e.g. h100:e4m3:fp16); a custom tensor core "
         "tc:input=fp16,output=fp32,block=16,bits=25,rounding=rtz[,precision=P,groups=G,run=R,c=last,c_rounding=M,sum=exact|"
         "pairwise|late-c,overflow=products,promote=N]";
}

}  // namespace mpsim
