// The fast array paths of quantize (Path::vector, Path::automatic, threads)
// and the generic exact rounding (Path::exact) are bit-identical to the scalar
// reference (Path::scalar, one thread, out of place: the pattern rounding the
// CUDA kernels run), results and QuantizeCounts alike, NaN payloads included: for every
// preset format and some custom ones, every rounding mode (stochastic with
// several random_bits), float and double arrays, in place and out of place.
// Inputs: zeros, infinities, NaNs, the array type's subnormals, the format's
// smallest subnormal / smallest normal / largest finite and the midpoints
// around them (the ties, the overflow threshold), then random values over the
// format's range and random bit patterns. Lengths 0, 1, 7 (windows sliding
// over all the edge cases, so each one meets the vector code's tail handling),
// 1000 and 1000003, starting one element past the allocation (misaligned).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "support/test_support.hpp"

namespace mpsim {
namespace {

template <class T>
using Uint = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;

template <class T>
Uint<T> bits_of(T x) {
  return std::bit_cast<Uint<T>>(x);
}

using Random = test::SplitMix;

// Special values of T and the format's boundaries, each with its neighbours
// in T and negated. Values T cannot hold become T's nearest (still inputs).
template <class T>
std::vector<T> edge_inputs(const Format& f) {
  using limits = std::numeric_limits<T>;
  std::vector<T> edges;
  auto add = [&](T v) {
    for (T x : {v, std::nextafter(v, limits::infinity()), std::nextafter(v, -limits::infinity())})
      for (T s : {x, -x}) edges.push_back(s);
  };
  auto add_value = [&](double v) { add(static_cast<T>(v)); };

  // T's own specials: zeros, infinities, NaNs (quiet, signalling, payloads), subnormals.
  edges.push_back(T{0});
  edges.push_back(-T{0});
  edges.push_back(limits::infinity());
  edges.push_back(-limits::infinity());
  constexpr int t_mantissa = limits::digits - 1;
  const Uint<T> exponent_all_ones = (~Uint<T>{0} >> 1) & ~((Uint<T>{1} << t_mantissa) - 1);
  const Uint<T> sign = Uint<T>{1} << (sizeof(T) * 8 - 1);
  for (Uint<T> payload : {Uint<T>{1}, Uint<T>{1} << (t_mantissa - 1), (Uint<T>{1} << t_mantissa) - 1,
                          (Uint<T>{3} << (t_mantissa - 2)) | 5, Uint<T>{1} << (t_mantissa - 2)})
    for (Uint<T> s : {Uint<T>{0}, sign}) edges.push_back(std::bit_cast<T>(s | exponent_all_ones | payload));
  add(limits::denorm_min());
  add(limits::min());
  add(limits::max());
  add(std::bit_cast<T>(Uint<T>{1} << (t_mantissa - 1)));  // a subnormal of T

  // The format's boundaries and the midpoints between neighbours there.
  const int m = f.mantissa_bits;
  const double subnormal_gap = std::ldexp(1.0, f.emin() - m);
  const double top_gap = std::ldexp(1.0, f.emax() - m);
  const double one_gap = std::ldexp(1.0, -m);
  for (double k : {0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5}) add_value(k * subnormal_gap);
  add_value(f.smallest_normal());
  add_value(f.smallest_normal() - 0.5 * subnormal_gap);
  add_value(f.smallest_normal() - subnormal_gap);
  add_value(f.smallest_normal() + 0.5 * subnormal_gap);
  add_value(0.5 * f.smallest_normal());
  for (double k : {-0.25, 0.0, 0.5, 1.0, 1.5, 2.5}) add_value(1.0 + k * one_gap);
  add_value(f.largest_finite());
  add_value(f.largest_finite() - 0.5 * top_gap);
  add_value(f.largest_finite() + 0.5 * top_gap);  // the overflow threshold of nearest rounding
  add_value(f.largest_finite() + top_gap);
  add_value(std::ldexp(1.0, f.emax() + 1));
  return edges;
}

// The edge cases, then random values over the format's range (one in four a
// midpoint between neighbours) and random bit patterns of T, `n` in all.
template <class T>
std::vector<T> path_inputs(const Format& f, std::size_t n, std::uint64_t seed) {
  using limits = std::numeric_limits<T>;
  std::vector<T> values = edge_inputs<T>(f);
  Random random{seed};
  constexpr int t_mantissa = limits::digits - 1;
  const int low = std::max(f.emin() - f.mantissa_bits - 3, limits::min_exponent - 1);
  const int high = std::min(f.emax() + 2, limits::max_exponent - 1);
  while (values.size() < n) {
    const std::uint64_t r = random.next();
    if ((r & 7) == 0) {
      values.push_back(std::bit_cast<T>(static_cast<Uint<T>>(random.next())));
      continue;
    }
    const int exponent = low + static_cast<int>((r >> 8) % static_cast<std::uint64_t>(high - low + 1));
    std::uint64_t mantissa = random.next() >> (64 - t_mantissa);
    if (((r >> 3) & 3) == 0 && f.mantissa_bits < t_mantissa) {
      // A midpoint: the format's bits, then a one, then zeros.
      const int dropped = t_mantissa - f.mantissa_bits;
      mantissa = (mantissa & ~((std::uint64_t{1} << dropped) - 1)) | (std::uint64_t{1} << (dropped - 1));
    }
    T v = std::ldexp(static_cast<T>(1) + std::ldexp(static_cast<T>(mantissa), -t_mantissa), exponent);
    values.push_back((r >> 5) & 1 ? -v : v);
  }
  values.resize(n);
  return values;
}

struct Variant {
  Path path;
  int threads;
  bool in_place;
  Stores stores = Stores::cached;  // streaming: the vector path's non-temporal stores, from a misaligned start
  // The output placed so that its alignment to 64 bytes is its first random index's (the stochastic stream's
  // first index times the element size), not one element off: streaming stores and stochastic rounding's
  // aligned draws (AlignedWindowDraws) then start at the same element.
  bool output_aligned_like_index = false;
};
constexpr Variant kEveryVariant[] = {
    {Path::exact, 1, false},     {Path::scalar, 1, true},     {Path::scalar, 2, false},    {Path::scalar, 2, true},
    {Path::vector, 1, false},    {Path::vector, 1, true},     {Path::vector, 2, false},
    {Path::vector, 2, true},     {Path::automatic, 1, false}, {Path::automatic, 1, true},
    {Path::automatic, 2, false}, {Path::automatic, 2, true},  {Path::automatic, 0, false},
    {Path::vector, 1, false, Stores::streaming}, {Path::vector, 2, true, Stores::streaming},
    {Path::vector, 1, false, Stores::streaming, true}, {Path::vector, 2, true, Stores::streaming, true},
};
// For the longest arrays: the fast paths, one and two threads, both placements, both kinds of store.
constexpr Variant kLongVariants[] = {
    {Path::vector, 1, false},    {Path::vector, 2, true},
    {Path::automatic, 0, true},  {Path::automatic, 2, false},
    {Path::vector, 1, false, Stores::streaming}, {Path::automatic, 2, true, Stores::streaming},
    {Path::vector, 1, false, Stores::streaming, true}};

const Rounding kRoundings[] = {
    {RoundingMode::nearest_even},    {RoundingMode::nearest_away},    {RoundingMode::toward_zero},
    {RoundingMode::toward_positive}, {RoundingMode::toward_negative}, {RoundingMode::odd},
    {RoundingMode::stochastic, 32},  {RoundingMode::stochastic, 4},   {RoundingMode::stochastic, 1},
};

std::string path_name(Path p) {
  switch (p) {
    case Path::scalar: return "scalar";
    case Path::vector: return "vector";
    case Path::automatic: return "automatic";
    case Path::exact: return "exact";
  }
  return "?";
}

std::string counts_text(const QuantizeCounts& c) {
  return "{elements " + std::to_string(c.elements) + ", inexact " + std::to_string(c.inexact) + ", flushed " +
         std::to_string(c.flushed_to_zero) + ", subnormal " + std::to_string(c.subnormal) + ", overflow " +
         std::to_string(c.overflow) + ", nan " + std::to_string(c.nan) + "}";
}

template <class T>
std::string hex_float(T x) {
  char text[40];
  std::snprintf(text, sizeof text, "%a", static_cast<double>(x));
  return text;
}

template <class T>
std::string hex_bits(T x) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%0*llX", static_cast<int>(sizeof(T) * 2),
                static_cast<unsigned long long>(bits_of(x)));
  return text;
}

// Runs one variant and describes how it differs from the reference (empty: it does not).
template <class T>
std::string run_and_compare(const Format& f, QuantizeOptions options, const Variant& v, std::span<const T> in,
                            const std::vector<T>& expected, const QuantizeCounts& expected_counts) {
  options.path = v.path;
  options.threads = v.threads;
  options.stores = v.stores;
  // Storage longer than needed, used from element 1 (misaligned like the input) or from the element whose
  // address is aligned like the first random index.
  constexpr std::size_t kLine = 64 / sizeof(T);
  std::vector<T> storage(in.size() + kLine, std::bit_cast<T>(static_cast<Uint<T>>(0x7FBADBADDEADBEEFull)));
  std::size_t offset = 1;
  if (v.output_aligned_like_index) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data()) / sizeof(T);
    offset = (options.stochastic.first_index % kLine + kLine - address % kLine) % kLine;
  }
  const std::span<T> out(storage.data() + offset, in.size());
  QuantizeCounts counts;
  if (v.in_place) {
    std::copy(in.begin(), in.end(), out.begin());
    counts = quantize(f, std::span<const T>(out), out, options);
  } else {
    counts = quantize(f, in, out, options);
  }
  std::string where = "path " + path_name(v.path) + ", threads " + std::to_string(v.threads) +
                      (v.in_place ? ", in place" : ", out of place") +
                      (v.stores == Stores::streaming ? ", streaming stores" : "") +
                      (v.output_aligned_like_index ? ", output aligned like its index" : "") +
                      ", length " + std::to_string(in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    if (bits_of(out[i]) != bits_of(expected[i]))
      return where + ": element " + std::to_string(i) + " input " + hex_bits(in[i]) + " (" + hex_float(in[i]) +
             ") scalar gives " + hex_bits(expected[i]) + " (" + hex_float(expected[i]) + "), this path " +
             hex_bits(out[i]) + " (" + hex_float(out[i]) + ")";
  if (!(counts == expected_counts))
    return where + ": counts " + counts_text(counts) + ", scalar " + counts_text(expected_counts);
  return {};
}

template <class T>
void check_paths(const Format& f) {
  constexpr std::size_t longest = 1000003;
  const std::vector<T> pool = path_inputs<T>(f, longest + 1, 31);
  const std::size_t edge_count = edge_inputs<T>(f).size();
  const char* type = std::is_same_v<T, float> ? "float" : "double";

  for (const Rounding& rounding : kRoundings) {
    QuantizeOptions reference;
    reference.rounding = rounding;
    reference.stochastic = StochasticStream{RandomKey{42, 7}, 1000};
    reference.path = Path::scalar;
    reference.threads = 1;

    // (start, length) windows of the pool: sliding over the edge cases, then long ones.
    std::vector<std::pair<std::size_t, std::size_t>> windows{{1, 0}, {1, 1000}, {1, longest}};
    for (std::size_t length : {std::size_t{1}, std::size_t{7}})
      for (std::size_t start = 0; start < edge_count; start += length) windows.emplace_back(start, length);

    std::uint64_t failures = 0;
    std::string first_failure;
    for (const auto& [start, length] : windows) {
      const std::span<const T> in = std::span<const T>(pool).subspan(start, length);
      std::vector<T> expected(length);
      const QuantizeCounts expected_counts = quantize(f, in, std::span<T>(expected), reference);
      if (expected_counts.elements != length) {
        ++failures;
        first_failure = "scalar counts " + std::to_string(expected_counts.elements) + " elements";
      }
      const std::span<const Variant> variants =
          length == longest ? std::span<const Variant>(kLongVariants) : std::span<const Variant>(kEveryVariant);
      for (const Variant& v : variants) {
        const std::string difference = run_and_compare<T>(f, reference, v, in, expected, expected_counts);
        if (!difference.empty() && failures++ == 0) first_failure = difference;
      }
    }
    INFO(f.name() << ", " << type << " arrays, " << to_string(rounding.mode)
                  << (rounding.mode == RoundingMode::stochastic ? " random_bits " + std::to_string(rounding.random_bits)
                                                                 : std::string())
                  << ": " << failures << " differing runs; first: " << first_failure);
    CHECK(failures == 0);
  }
}

void check_format(const Format& f) {
  if (fits_in_float(f)) check_paths<float>(f);
  check_paths<double>(f);
}

}  // namespace

TEST_CASE("paths: binary16", "[paths]") { check_format(formats::binary16); }
TEST_CASE("paths: bfloat16", "[paths]") { check_format(formats::bfloat16); }
TEST_CASE("paths: tf32", "[paths]") { check_format(formats::tf32); }
TEST_CASE("paths: e4m3", "[paths]") { check_format(formats::e4m3); }
TEST_CASE("paths: e5m2", "[paths]") { check_format(formats::e5m2); }
TEST_CASE("paths: binary32", "[paths]") { check_format(formats::binary32); }
TEST_CASE("paths: binary64", "[paths]") { check_format(formats::binary64); }
TEST_CASE("paths: e3m2 (OCP FP6, no infinity or NaN)", "[paths]") { check_format(formats::e3m2); }
TEST_CASE("paths: e2m1 (OCP FP4)", "[paths]") { check_format(formats::e2m1); }
TEST_CASE("paths: e2m3 (OCP FP6)", "[paths]") { check_format(formats::e2m3); }
TEST_CASE("paths: e3m2:inf:nosat (IEEE-like)", "[paths]") { check_format(*parse_format("e3m2:inf:nosat")); }
TEST_CASE("paths: e5m7:ftz", "[paths]") { check_format(*parse_format("e5m7:ftz")); }
TEST_CASE("paths: e4m3:sat", "[paths]") { check_format(*parse_format("e4m3:sat")); }
TEST_CASE("paths: e4m3:fn", "[paths]") { check_format(*parse_format("e4m3:fn")); }
TEST_CASE("paths: e6m9:sat:ftz", "[paths]") { check_format(*parse_format("e6m9:sat:ftz")); }
TEST_CASE("paths: e8m0", "[paths]") { check_format(*parse_format("e8m0")); }
TEST_CASE("paths: e5m10:ftz", "[paths]") { check_format(*parse_format("e5m10:ftz")); }

TEST_CASE("paths: custom formats parse", "[paths]") {
  for (const char* name : {"e3m2", "e5m7:ftz", "e4m3:sat", "e4m3:fn", "e6m9:sat:ftz", "e8m0", "e5m10:ftz"}) {
    INFO(name);
    const auto f = parse_format(name);
    REQUIRE(f.has_value());
    CHECK(fits_in_float(*f));
  }
}

}  // namespace mpsim
