// Helpers for the tests that compare the emulator with the MPFR oracle
// (test_oracle_*.cpp): a mismatch log that reports the first few failures in
// full and then stops, and seeded random encodings concentrated where
// rounding is delicate (ties, carries, cancellation, overflow, underflow).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/mpfr_oracle.hpp"

namespace mpsim::oracle::testing {

using Rng = std::mt19937_64;

// Counts comparisons; reports each mismatch with FAIL_CHECK until `limit`
// mismatches, after which `full()` tells the caller to stop.
class MismatchLog {
 public:
  explicit MismatchLog(int limit = 5) : limit_(limit) {}

  // One comparison of a Rounded result; `context` names the inputs (only
  // evaluated on a mismatch). Returns false on a mismatch.
  bool check(const Format& format, const std::function<std::string()>& context, const Rounded& expected,
             const Rounded& got) {
    ++checked_;
    if (agrees(format, expected, got)) return true;
    fail(context() + "\n  expected " + describe(format, expected) + "\n  got      " + describe(format, got));
    return false;
  }

  void fail(const std::string& message) {
    ++failed_;
    FAIL_CHECK(message);
  }
  void count(std::uint64_t n = 1) { checked_ += n; }
  bool full() const { return failed_ >= limit_; }
  std::uint64_t checked() const { return checked_; }

  // Call at the end: one assertion that summarises.
  void finish() {
    INFO(checked_ << " comparisons, " << failed_ << " mismatches" << (full() ? " (stopped early)" : ""));
    CHECK(failed_ == 0);
  }

 private:
  int limit_;
  int failed_ = 0;
  std::uint64_t checked_ = 0;
};

inline std::string hex(std::uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

// --- Random encodings -----------------------------------------------------------
inline std::uint64_t field_mask(int bits) { return bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1; }

inline Bits make_bits(const Format& f, bool negative, std::uint64_t exponent_field, std::uint64_t mantissa) {
  const int e = f.exponent_bits, m = f.mantissa_bits;
  return Bits{(std::uint64_t{negative} << (e + m)) | ((exponent_field & field_mask(e)) << m) |
              (mantissa & field_mask(m))};
}

inline Bits uniform_bits(const Format& f, Rng& rng) {
  return Bits{rng() & field_mask(1 + f.exponent_bits + f.mantissa_bits)};
}

// Mantissas with structure: runs of ones and zeros make ties and carries likely.
inline std::uint64_t structured_mantissa(const Format& f, Rng& rng) {
  const int m = f.mantissa_bits;
  if (m == 0) return 0;
  const std::uint64_t all = field_mask(m);
  const int k = static_cast<int>(rng() % static_cast<std::uint64_t>(m + 1));
  switch (rng() % 8) {
    case 0: return 0;
    case 1: return all;
    case 2: return all >> k;                      // low ones
    case 3: return (all << k) & all;              // high ones
    case 4: return std::uint64_t{1} << (k % m);   // one bit
    case 5: return (rng() & all) | 1;             // odd
    case 6: return (rng() & all) & ~std::uint64_t{1};
    default: return rng() & all;
  }
}

// Sign random, exponent field clamped into range, structured mantissa.
inline Bits bits_with_field(const Format& f, Rng& rng, long field) {
  const long top = static_cast<long>(field_mask(f.exponent_bits));
  field = std::clamp(field, 0L, top);
  return make_bits(f, (rng() & 1) != 0, static_cast<std::uint64_t>(field), structured_mantissa(f, rng));
}

inline long random_between(Rng& rng, long low, long high) {  // inclusive
  return low + static_cast<long>(rng() % static_cast<std::uint64_t>(high - low + 1));
}

// An operand: uniform, or with an exponent field near the bottom, the top,
// the middle (around 1), or anywhere, with a structured mantissa.
inline Bits interesting_bits(const Format& f, Rng& rng) {
  const long top = static_cast<long>(field_mask(f.exponent_bits));
  const long bias = top / 2;
  switch (rng() % 6) {
    case 0: return uniform_bits(f, rng);
    case 1: return bits_with_field(f, rng, random_between(rng, 0, 2));
    case 2: return bits_with_field(f, rng, random_between(rng, top - 2, top));
    case 3: return bits_with_field(f, rng, bias + random_between(rng, -3, 3));
    default: return bits_with_field(f, rng, random_between(rng, 0, top));
  }
}

enum class Operation { add, sub, mul, div, sqrt, fma };

inline const char* operation_name(Operation op) {
  switch (op) {
    case Operation::add: return "add";
    case Operation::sub: return "sub";
    case Operation::mul: return "mul";
    case Operation::div: return "div";
    case Operation::sqrt: return "sqrt";
    case Operation::fma: return "fma";
  }
  return "?";
}

inline long exponent_field_of(const Format& f, Bits b) {
  return static_cast<long>((b.value >> f.mantissa_bits) & field_mask(f.exponent_bits));
}

// A second operand chosen so that `op` lands where rounding is delicate:
// cancellation for sums, results near overflow, near the smallest normal and
// inside the subnormal range for products and quotients.
inline Bits partner_bits(const Format& f, Rng& rng, Operation op, Bits a) {
  if (rng() % 4 == 0) return interesting_bits(f, rng);
  const long top = static_cast<long>(field_mask(f.exponent_bits));
  const long bias = top / 2;
  const long m = f.mantissa_bits;
  const long fa = exponent_field_of(f, a);
  // A target exponent field for the result: near the top, the bottom, below it, or around 1.
  long target = 0;
  switch (rng() % 4) {
    case 0: target = top - random_between(rng, 0, 2); break;
    case 1: target = random_between(rng, -1, 2); break;
    case 2: target = -random_between(rng, 0, m + 2); break;
    default: target = bias + random_between(rng, -2, 2); break;
  }
  switch (op) {
    case Operation::add:
    case Operation::sub:
    case Operation::fma: return bits_with_field(f, rng, fa + random_between(rng, -(m + 3), m + 3));
    case Operation::mul: return bits_with_field(f, rng, target - fa + bias);
    case Operation::div: return bits_with_field(f, rng, fa - target + bias);
    case Operation::sqrt: break;
  }
  return interesting_bits(f, rng);
}

// For fma: c near the product a*b (cancellation), or anywhere.
inline Bits addend_bits(const Format& f, Rng& rng, Bits a, Bits b) {
  if (rng() % 3 == 0) return interesting_bits(f, rng);
  const long bias = static_cast<long>(field_mask(f.exponent_bits)) / 2;
  const long m = f.mantissa_bits;
  const long product_field = exponent_field_of(f, a) + exponent_field_of(f, b) - bias;
  return bits_with_field(f, rng, product_field + random_between(rng, -(m + 3), m + 3));
}

// Special and boundary encodings of a format, both signs: zeros, the smallest
// and largest subnormals, the smallest normal, 1 and its neighbours, the
// largest finite and its neighbour, infinities, quiet and signaling NaNs.
inline std::vector<Bits> edge_bits(const Format& f) {
  const Facts& k = facts(f);
  std::vector<Bits> positive = {zero_bits(f, false), encode(f, k.smallest_positive), encode(f, k.smallest_normal),
                                encode(f, Real(1.0)), encode(f, k.largest), nan_bits(f)};
  positive.push_back(oracle::next_up(f, positive[1]));
  positive.push_back(oracle::next_down(f, positive[2]));
  positive.push_back(oracle::next_up(f, positive[2]));
  positive.push_back(oracle::next_up(f, positive[3]));
  positive.push_back(oracle::next_down(f, positive[3]));
  positive.push_back(oracle::next_down(f, positive[4]));
  positive.push_back(encode(f, Real(2.0)));
  if (f.mantissa_bits > 0) {  // subnormal encodings, raw: they read as zero in a flush-to-zero format
    positive.push_back(make_bits(f, false, 0, 1));
    positive.push_back(make_bits(f, false, 0, field_mask(f.mantissa_bits)));
  }
  if (k.has_infinity) {
    positive.push_back(infinity_bits(f, false));
    // A signaling NaN (quiet bit clear, payload 1) and a quiet NaN with a payload.
    const std::uint64_t top = field_mask(f.exponent_bits);
    if (f.mantissa_bits >= 2) positive.push_back(make_bits(f, false, top, 1));
    positive.push_back(make_bits(f, false, top, field_mask(f.mantissa_bits)));
  }
  std::vector<Bits> all;
  for (Bits b : positive) {
    all.push_back(b);
    all.push_back(negate(f, b));
  }
  std::sort(all.begin(), all.end(), [](Bits x, Bits y) { return x.value < y.value; });
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

}  // namespace mpsim::oracle::testing
