// Arithmetic against the MPFR oracle, every deterministic rounding mode,
// results and exception flags: add, sub, mul, div over every pair of e4m3 and
// e5m2 encodings; fma over random (and, [.exhaustive], all) triples of them;
// edge-case and structured random operands for binary16, bfloat16 and custom
// formats (flush-to-zero, saturating, NaN-only, M = 0, binary64's shape).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "test_oracle_common.hpp"

namespace mpsim::oracle::testing {
namespace {

using S = Subnormals;
using O = Overflow;
using P = Specials;

constexpr Operation kBinaryOperations[] = {Operation::add, Operation::sub, Operation::mul, Operation::div};
constexpr Operation kAllOperations[] = {Operation::add, Operation::sub,  Operation::mul,
                                        Operation::div, Operation::sqrt, Operation::fma};

std::uint64_t encoding_count(const Format& f) { return std::uint64_t{1} << (1 + f.exponent_bits + f.mantissa_bits); }

// Every pair (a, b) with a in [begin, end) for the four binary operations.
void check_pairs(const Format& f, std::uint64_t begin, std::uint64_t end, MismatchLog& log) {
  const std::uint64_t n = encoding_count(f);
  for (std::uint64_t a = begin; a < end && !log.full(); ++a) {
    for (std::uint64_t b = 0; b < n; ++b) {
      for (Operation op : kBinaryOperations) check_operation(log, f, op, Bits{a}, Bits{b});
    }
  }
}

void check_every_pair(const Format& f) {
  INFO("format " << format_name(f));
  REQUIRE_FALSE(f.invalid_reason().has_value());
  MismatchLog log;
  check_pairs(f, 0, encoding_count(f), log);
  log.finish();
}

// Every triple (a, b, c) of an 8-bit format, a in [begin, end).
void check_fma_triples(const Format& f, std::uint64_t begin, std::uint64_t end, MismatchLog& log) {
  const std::uint64_t n = encoding_count(f);
  for (std::uint64_t a = begin; a < end && !log.full(); ++a) {
    for (std::uint64_t b = 0; b < n; ++b) {
      for (std::uint64_t c = 0; c < n; ++c) check_operation(log, f, Operation::fma, Bits{a}, Bits{b}, Bits{c});
    }
  }
}

// Edge-case operands (every pair, every triple for fma) and then `samples`
// structured random ones per operation.
void check_edges(const Format& f, Operation op, MismatchLog& log) {
  const std::vector<Bits> edges = edge_bits(f);
  if (op == Operation::sqrt) {
    for (Bits a : edges) check_operation(log, f, op, a);
    return;
  }
  for (Bits a : edges) {
    for (Bits b : edges) {
      if (log.full()) return;
      if (op != Operation::fma) {
        check_operation(log, f, op, a, b);
        continue;
      }
      for (Bits c : edges) check_operation(log, f, op, a, b, c);
    }
  }
}

void check_random(const Format& f, Operation op, std::uint64_t seed, std::uint64_t begin, std::uint64_t end,
                  MismatchLog& log) {
  Rng rng(seed ^ (begin * 0x9E3779B97F4A7C15ull) ^ (static_cast<std::uint64_t>(op) << 56));
  for (std::uint64_t i = begin; i < end && !log.full(); ++i) {
    const Bits a = interesting_bits(f, rng);
    const Bits b = partner_bits(f, rng, op, a);
    const Bits c = addend_bits(f, rng, a, b);
    check_operation(log, f, op, a, b, c);
  }
}

void check_operations(const Format& f, int samples, std::uint64_t seed) {
  INFO("format " << format_name(f) << ", seed " << seed << ", " << samples << " random cases per operation");
  REQUIRE_FALSE(f.invalid_reason().has_value());
  MismatchLog log;
  for (Operation op : kAllOperations) {
    check_edges(f, op, log);
    check_random(f, op, seed, 0, static_cast<std::uint64_t>(samples), log);
  }
  log.finish();
}

void check_operations_parallel(const Format& f, int samples, std::uint64_t seed) {
  INFO("format " << format_name(f) << ", seed " << seed << ", " << samples << " random cases per operation");
  REQUIRE_FALSE(f.invalid_reason().has_value());
  MismatchLog log;
  for (Operation op : kAllOperations) {
    parallel_chunks(static_cast<std::uint64_t>(samples), 10000, log,
                    [&](std::uint64_t begin, std::uint64_t end, MismatchLog& local) {
                      check_random(f, op, seed, begin, end, local);
                    });
  }
  log.finish();
}

}  // namespace

// --- 8-bit formats: every pair --------------------------------------------------
TEST_CASE("oracle: add/sub/mul/div of every pair of e4m3 encodings in every mode", "[oracle][arithmetic]") {
  check_every_pair(formats::e4m3);
}

TEST_CASE("oracle: add/sub/mul/div of every pair of e5m2 encodings in every mode", "[oracle][arithmetic]") {
  check_every_pair(formats::e5m2);
}

TEST_CASE("oracle: add/sub/mul/div of every pair of other small formats in every mode",
          "[oracle][arithmetic][.exhaustive]") {
  for (const Format& f : {Format{4, 3, S::gradual, O::ieee, P::nan_only}, Format{4, 3}, Format{5, 2, S::gradual, O::saturate},
                          Format{5, 2, S::flush_to_zero}, Format{3, 4, S::gradual, O::saturate}, Format{2, 5, S::flush_to_zero},
                          Format{2, 1}, Format{3, 0, S::gradual, O::saturate}, Format{4, 3, S::flush_to_zero, O::saturate, P::nan_only},
                          Format{5, 0}, Format{6, 3}}) {
    INFO("format " << format_name(f));
    REQUIRE_FALSE(f.invalid_reason().has_value());
    MismatchLog log;
    parallel_chunks(encoding_count(f), 4, log, [&](std::uint64_t begin, std::uint64_t end, MismatchLog& local) {
      check_pairs(f, begin, end, local);
    });
    log.finish();
  }
}

// --- fma of 8-bit formats ---------------------------------------------------------
TEST_CASE("oracle: fma of edge and random e4m3 and e5m2 triples in every mode", "[oracle][arithmetic]") {
  for (const Format& f : {formats::e4m3, formats::e5m2}) {
    INFO("format " << format_name(f) << ", seed 301");
    MismatchLog log;
    check_edges(f, Operation::fma, log);
    check_random(f, Operation::fma, 301, 0, 100000, log);
    log.finish();
  }
}

TEST_CASE("oracle: fma of every triple of e4m3 and e5m2 encodings in every mode", "[oracle][arithmetic][.exhaustive]") {
  for (const Format& f : {formats::e4m3, formats::e5m2}) {
    INFO("format " << format_name(f));
    MismatchLog log;
    parallel_chunks(encoding_count(f), 1, log, [&](std::uint64_t begin, std::uint64_t end, MismatchLog& local) {
      check_fma_triples(f, begin, end, local);
    });
    log.finish();
  }
}

// --- 16-bit and custom formats: edge cases and structured random operands -------------
TEST_CASE("oracle: binary16 add/sub/mul/div/sqrt/fma on edge and random operands in every mode",
          "[oracle][arithmetic]") {
  check_operations(formats::binary16, 30000, 401);
}

TEST_CASE("oracle: bfloat16 add/sub/mul/div/sqrt/fma on edge and random operands in every mode",
          "[oracle][arithmetic]") {
  check_operations(formats::bfloat16, 30000, 402);
}

const std::vector<Format> kCustomFormats = {
    {6, 9, S::flush_to_zero}, {3, 4, S::gradual, O::saturate}, formats::binary64, formats::binary32, formats::tf32,
    {4, 3, S::gradual, O::ieee, P::nan_only}, {5, 2, S::gradual, O::saturate}, {8, 0}, {2, 1}, {3, 0, S::gradual, O::saturate},
    {11, 10, S::flush_to_zero}, {5, 10, S::flush_to_zero, O::saturate}, {2, 3, S::gradual, O::saturate, P::nan_only},
    {10, 51, S::flush_to_zero}};

TEST_CASE("oracle: custom formats add/sub/mul/div/sqrt/fma on edge and random operands in every mode",
          "[oracle][arithmetic]") {
  std::uint64_t seed = 500;
  for (const Format& f : kCustomFormats) {
    SECTION(format_name(f)) { check_operations(f, 4000, seed); }
    ++seed;
  }
}

TEST_CASE("oracle: 16-bit and custom formats with 3e5 random cases per operation", "[oracle][arithmetic][.exhaustive]") {
  std::vector<Format> all = {formats::binary16, formats::bfloat16};
  all.insert(all.end(), kCustomFormats.begin(), kCustomFormats.end());
  std::uint64_t seed = 600;
  for (const Format& f : all) {
    SECTION(format_name(f)) { check_operations_parallel(f, 300000, seed); }
    ++seed;
  }
}

}  // namespace mpsim::oracle::testing
