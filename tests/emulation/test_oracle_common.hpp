// Helpers for the tests that compare the emulator with the MPFR oracle
// (test_oracle_*.cpp): a mismatch log that reports the first few failures in
// full and then stops, and seeded random encodings concentrated where
// rounding is delicate (ties, carries, cancellation, overflow, underflow).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <cstdint>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mpsim/emulation/arithmetic.hpp"
#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "support/mpfr_oracle.hpp"

namespace mpsim::oracle::testing {

using Rng = std::mt19937_64;

// Counts comparisons and keeps the first `limit` mismatches in full; `full()`
// tells the caller to stop. It does not call Catch until `finish()`, so worker
// threads can each fill one and the test merges them. alignas(64): each
// worker's counters on their own cache line (no false sharing).
class alignas(64) MismatchLog {
 public:
  explicit MismatchLog(int limit = 5) : limit_(limit) {}

  // One comparison of a Rounded result; `context` names the inputs (only
  // evaluated on a mismatch). Returns false on a mismatch.
  template <class Context>
  bool check(const Format& format, const Context& context, const Rounded& expected, const Rounded& got) {
    ++checked_;
    if (agrees(format, expected, got)) return true;
    fail(context() + "\n  expected " + describe(format, expected) + "\n  got      " + describe(format, got));
    return false;
  }

  void fail(const std::string& message) {
    ++failed_;
    if (static_cast<int>(messages_.size()) < limit_) messages_.push_back(message);
  }
  void count(std::uint64_t n = 1) { checked_ += n; }
  bool full() const { return failed_ >= static_cast<std::uint64_t>(limit_); }
  std::uint64_t checked() const { return checked_; }
  std::uint64_t failed() const { return failed_; }

  void merge(const MismatchLog& other) {
    checked_ += other.checked_;
    failed_ += other.failed_;
    for (const std::string& m : other.messages_) {
      if (static_cast<int>(messages_.size()) < limit_) messages_.push_back(m);
    }
  }

  // Call once at the end, on the test's thread: reports the kept mismatches
  // and one summarising assertion.
  void finish() {
    for (const std::string& m : messages_) FAIL_CHECK(m);
    INFO(checked_ << " comparisons, " << failed_ << " mismatches" << (full() ? " (stopped early)" : ""));
    CHECK(failed_ == 0);
  }

 private:
  int limit_;
  std::uint64_t failed_ = 0;
  std::uint64_t checked_ = 0;
  std::vector<std::string> messages_;
};

// Runs body(begin, end, log) over [0, total) in chunks on every hardware
// thread (for the exhaustive suites). Chunks must derive any randomness from
// their own indices so results do not depend on the thread count.
template <class Body>
void parallel_chunks(std::uint64_t total, std::uint64_t chunk, MismatchLog& log, Body body) {
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::vector<MismatchLog> logs(workers);
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (;;) {
        const std::uint64_t begin = next.fetch_add(chunk);
        if (begin >= total || stop.load()) return;
        body(begin, std::min(total, begin + chunk), logs[w]);
        if (logs[w].full()) stop.store(true);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const MismatchLog& l : logs) log.merge(l);
}

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

inline int operand_count(Operation op) {
  return op == Operation::sqrt ? 1 : op == Operation::fma ? 3 : 2;
}

inline Exact oracle_exact(const Format& f, Operation op, Bits a, Bits b, Bits c) {
  switch (op) {
    case Operation::add: return exact_add(f, a, b);
    case Operation::sub: return exact_sub(f, a, b);
    case Operation::mul: return exact_mul(f, a, b);
    case Operation::div: return exact_div(f, a, b);
    case Operation::sqrt: return exact_sqrt(f, a);
    case Operation::fma: return exact_fma(f, a, b, c);
  }
  throw std::logic_error("bad operation");
}

// The code under test.
inline Rounded emulator_result(const Format& f, Operation op, RoundingMode mode, Bits a, Bits b, Bits c) {
  const Rounding r{mode};
  switch (op) {
    case Operation::add: return mpsim::add(f, r, a, b);
    case Operation::sub: return mpsim::sub(f, r, a, b);
    case Operation::mul: return mpsim::mul(f, r, a, b);
    case Operation::div: return mpsim::div(f, r, a, b);
    case Operation::sqrt: return mpsim::sqrt(f, r, a);
    case Operation::fma: return mpsim::fma(f, r, a, b, c);
  }
  throw std::logic_error("bad operation");
}

inline std::string operation_text(const Format& f, Operation op, RoundingMode mode, Bits a, Bits b, Bits c) {
  std::string text = std::string(operation_name(op)) + " in " + format_name(f) + ", " + std::string(mode_name(mode)) +
                     ":\n  a = " + describe(f, a);
  if (operand_count(op) >= 2) text += "\n  b = " + describe(f, b);
  if (operand_count(op) >= 3) text += "\n  c = " + describe(f, c);
  return text;
}

// One case of `op` in every deterministic mode, emulator against oracle.
inline void check_operation(MismatchLog& log, const Format& f, Operation op, Bits a, Bits b = {}, Bits c = {}) {
  const Exact exact = oracle_exact(f, op, a, b, c);
  for (RoundingMode mode : kDeterministicModes) {
    log.check(f, [&] { return operation_text(f, op, mode, a, b, c); }, oracle::round(f, mode, exact),
              emulator_result(f, op, mode, a, b, c));
  }
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

// --- Conversion inputs ------------------------------------------------------------
// A point between the format value `v` and its upper neighbour (or, for the
// largest, its lower one): k/64 of the gap, k = 0..64 (0 the value itself, 32
// the midpoint). Computed in binary64 (exact unless M > 46).
inline double near_format_value(const Format& f, Bits v, Rng& rng) {
  const Decoded d = decode(f, v);
  const double x = d.value.to_double();
  Decoded next = decode(f, oracle::next_up(f, v));
  if (next.kind == FloatClass::infinite || next.kind == FloatClass::nan || next.value.to_double() == x) {
    next = decode(f, oracle::next_down(f, v));
  }
  const double gap = next.value.to_double() - x;
  return x + static_cast<double>(rng() % 65) / 64.0 * gap;
}

// Binary64 values worth converting into `f`, whatever the format.
inline std::vector<double> edge_doubles(const Format& f) {
  const Facts& k = facts(f);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = {0.0,
                           inf,
                           std::bit_cast<double>(std::uint64_t{0x7FF8000000000000}),  // quiet NaN
                           std::bit_cast<double>(std::uint64_t{0x7FF0000000000001}),  // signaling NaN
                           std::bit_cast<double>(std::uint64_t{0x7FF4000000000000}),  // signaling NaN, other payload
                           std::bit_cast<double>(std::uint64_t{0x7FFFFFFFFFFFFFFF}),  // quiet NaN, full payload
                           DBL_MAX, DBL_MIN, DBL_TRUE_MIN, 1.0, FLT_MAX, FLT_MIN, static_cast<double>(FLT_TRUE_MIN),
                           65504.0, 65520.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 0x1.fep127, 0x1.ffp127};
  // The format's own boundaries and the points between them.
  const double largest = k.largest.to_double(), tiniest = k.smallest_positive.to_double();
  const double top_gap = std::ldexp(1.0, k.emax - f.mantissa_bits);
  const double normal = k.smallest_normal.to_double();
  for (double x : {largest, largest + top_gap / 2, largest + top_gap / 4, largest + top_gap, largest + 1.5 * top_gap,
                   largest - top_gap / 2, tiniest, tiniest / 2, tiniest / 4, tiniest * 0.75, tiniest * 1.5,
                   normal, normal * (1 - std::ldexp(1.0, -k.precision - 1)), normal * (1 - std::ldexp(1.0, -k.precision)),
                   normal * (1 - std::ldexp(1.0, -k.precision - 2)), normal / 2, normal * 0.75}) {
    v.push_back(x);
  }
  // Each also one binary64 ulp up and down, and negated.
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) {
    v.push_back(std::nextafter(v[i], inf));
    v.push_back(std::nextafter(v[i], -inf));
  }
  const std::size_t m = v.size();
  for (std::size_t i = 0; i < m; ++i) v.push_back(-v[i]);
  return v;
}

// One random conversion input from one of several regions; `edges` and
// `boundaries` are edge_doubles(f) and edge_bits(f), made once by the caller.
inline double conversion_sample(const Format& f, Rng& rng, const std::vector<double>& edges,
                                const std::vector<Bits>& boundaries) {
  const Facts& k = facts(f);
  const double sign = (rng() & 1) ? -1.0 : 1.0;
  switch (rng() % 8) {
    case 0: return std::bit_cast<double>(rng());  // any binary64 encoding
    case 1: return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
    case 2: {  // around the overflow threshold: largest + j/64 of the top gap
      const double top_gap = std::ldexp(1.0, k.emax - f.mantissa_bits);
      const double j = static_cast<double>(static_cast<long>(rng() % 257) - 64);
      return sign * (k.largest.to_double() + j / 64.0 * top_gap);
    }
    case 3: {  // below 2^(emin+1): the subnormal range, the tininess boundary, below the smallest subnormal
      const double significand = static_cast<double>((rng() >> 11) | 1);  // 53 bits
      const int shift = static_cast<int>(rng() % static_cast<std::uint64_t>(f.mantissa_bits + 4));
      return sign * std::ldexp(significand, k.emin + 1 - 53 - shift);
    }
    case 4:
    case 5: {  // near a format value, anywhere in the range
      const Bits v = interesting_bits(f, rng);
      const FloatClass kind = oracle::classify(f, v);
      if (kind == FloatClass::nan || kind == FloatClass::infinite) return edges[rng() % edges.size()];
      return near_format_value(f, v, rng);
    }
    case 6: return edges[rng() % edges.size()];
    default: {  // near a boundary encoding of the format
      const Bits v = boundaries[rng() % boundaries.size()];
      const FloatClass kind = oracle::classify(f, v);
      if (kind == FloatClass::nan || kind == FloatClass::infinite) return edges[rng() % edges.size()];
      return near_format_value(f, v, rng);
    }
  }
}

// A binary32 NaN with the sign, quiet bit and leading payload of a binary64
// NaN (a cast would quiet a signaling NaN).
inline float float_nan_like(double x) {
  const std::uint64_t raw = std::bit_cast<std::uint64_t>(x);
  const bool quiet = ((raw >> 51) & 1) != 0;
  std::uint32_t payload = static_cast<std::uint32_t>((raw >> 29) & 0x3FFFFF);
  if (!quiet && payload == 0) payload = 1;
  return std::bit_cast<float>(static_cast<std::uint32_t>(raw >> 63 << 31) | 0x7F800000u | (quiet ? 0x400000u : 0u) |
                              payload);
}

}  // namespace mpsim::oracle::testing
