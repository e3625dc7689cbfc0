// Array quantization against the MPFR oracle: every element of quantize()'s
// output is the exact value of the oracle's rounding of the input (same zero
// sign; any NaN for a NaN), and the counters are what the oracle's results
// say, for every path (scalar, vector, automatic), every deterministic mode,
// float and double arrays.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "mpsim/emulation/quantize.hpp"
#include "test_oracle_common.hpp"

namespace mpsim::oracle::testing {
namespace {

using S = Subnormals;
using O = Overflow;
using P = Specials;

const char* path_name(Path path) {
  switch (path) {
    case Path::automatic: return "automatic";
    case Path::scalar: return "scalar";
    case Path::vector: return "vector";
    case Path::exact: return "exact";
  }
  return "?";
}

std::string counts_text(const QuantizeCounts& c) {
  return "elements " + std::to_string(c.elements) + ", inexact " + std::to_string(c.inexact) + ", flushed_to_zero " +
         std::to_string(c.flushed_to_zero) + ", subnormal " + std::to_string(c.subnormal) + ", overflow " +
         std::to_string(c.overflow) + ", nan " + std::to_string(c.nan);
}

// What one element adds to the counters, read from the oracle's result.
QuantizeCounts expected_counts(const Format& f, const Exact& exact, const Rounded& r) {
  QuantizeCounts c;
  c.elements = 1;
  const FloatClass kind = oracle::classify(f, r.bits);
  c.inexact = r.flags.has(Flags::inexact);
  c.flushed_to_zero = exact.kind == Exact::Kind::finite && kind == FloatClass::zero;
  c.subnormal = kind == FloatClass::subnormal;
  c.overflow = r.flags.has(Flags::overflow);
  c.nan = kind == FloatClass::nan;
  return c;
}

template <class T>
void check_array(const Format& f, RoundingMode mode, const std::vector<T>& in, MismatchLog& log) {
  std::vector<Rounded> want(in.size());
  QuantizeCounts want_counts;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Exact exact = std::is_same_v<T, float> ? exact_from_float(static_cast<float>(in[i]))
                                                 : exact_from_double(static_cast<double>(in[i]));
    want[i] = oracle::round(f, mode, exact);
    want_counts += expected_counts(f, exact, want[i]);
  }
  // The automatic path twice: on the calling thread, and with its own choice of threads.
  for (int run = 0; run < 5; ++run) {
    const Path path = run == 0 ? Path::scalar : run == 1 ? Path::vector : run == 4 ? Path::exact : Path::automatic;
    std::vector<T> out(in.size());
    QuantizeOptions options;
    options.rounding = Rounding{mode};
    options.path = path;
    options.threads = run == 3 ? 0 : 1;
    const QuantizeCounts counts = quantize(f, std::span<const T>(in), std::span<T>(out), options);
    const std::string where = std::string("quantize<") + (sizeof(T) == 4 ? "float" : "double") + "> into " +
                              format_name(f) + ", " + std::string(mode_name(mode)) + ", path " + path_name(path) +
                              (run == 3 ? " (threads 0)" : "");
    log.count();
    if (!(counts == want_counts)) {
      log.fail(where + ": counters\n  expected " + counts_text(want_counts) + "\n  got      " + counts_text(counts));
    }
    for (std::size_t i = 0; i < in.size() && !log.full(); ++i) {
      const Decoded d = decode(f, want[i].bits);
      const double got = static_cast<double>(out[i]);
      const bool ok = d.kind == FloatClass::nan
                          ? std::isnan(got)
                          : std::bit_cast<std::uint64_t>(got) == std::bit_cast<std::uint64_t>(d.value.to_double());
      log.count();
      if (!ok) {
        char text[160];
        std::snprintf(text, sizeof text, ": element %zu, input %a (0x%llx)\n  expected ", i, static_cast<double>(in[i]),
                      static_cast<unsigned long long>(sizeof(T) == 4 ? std::bit_cast<std::uint32_t>(static_cast<float>(in[i]))
                                                                     : std::bit_cast<std::uint64_t>(static_cast<double>(in[i]))));
        char value[64];
        std::snprintf(value, sizeof value, "%a", got);
        log.fail(where + text + describe(f, want[i]) + "\n  got      " + value);
      }
    }
  }
}

void check_quantize(const Format& f, std::uint64_t seed, std::size_t length) {
  INFO("format " << format_name(f) << ", seed " << seed);
  REQUIRE_FALSE(f.invalid_reason().has_value());
  const std::vector<double> edges = edge_doubles(f);
  const std::vector<Bits> boundaries = edge_bits(f);
  Rng rng(seed);
  std::vector<double> doubles(edges);
  while (doubles.size() < length) {
    const double x = conversion_sample(f, rng, edges, boundaries);
    const std::uint64_t nudge = rng() % 3;
    doubles.push_back(nudge == 0 ? x : std::nextafter(x, nudge == 1 ? HUGE_VAL : -HUGE_VAL));
  }
  std::vector<float> floats;
  for (double x : doubles) floats.push_back(std::isnan(x) ? float_nan_like(x) : static_cast<float>(x));
  MismatchLog log;
  for (RoundingMode mode : kDeterministicModes) {
    check_array(f, mode, doubles, log);
    if (mpsim::fits_in_float(f)) check_array(f, mode, floats, log);
  }
  log.finish();
}

}  // namespace

TEST_CASE("oracle: quantize arrays into presets in every mode and path", "[oracle][quantize]") {
  std::uint64_t seed = 700;
  for (const Format& f : {formats::binary16, formats::bfloat16, formats::tf32, formats::e4m3, formats::e5m2,
                          formats::binary32, formats::binary64}) {
    SECTION(format_name(f)) { check_quantize(f, seed, 30011); }
    ++seed;
  }
}

TEST_CASE("oracle: quantize arrays into custom formats in every mode and path", "[oracle][quantize]") {
  std::uint64_t seed = 800;
  for (const Format& f : {Format{5, 10, S::flush_to_zero}, Format{8, 7, S::flush_to_zero, O::saturate},
                          Format{4, 3, S::gradual, O::ieee, P::nan_only}, Format{4, 3}, Format{5, 2, S::gradual, O::saturate},
                          Format{2, 0}, Format{8, 0}, Format{2, 1}, Format{3, 4, S::gradual, O::saturate},
                          Format{6, 9, S::flush_to_zero, O::saturate}, Format{11, 52, S::flush_to_zero, O::saturate},
                          Format{11, 10}, Format{8, 10, S::flush_to_zero}, Format{8, 23, S::flush_to_zero}}) {
    SECTION(format_name(f)) { check_quantize(f, seed, 20011); }
    ++seed;
  }
}

}  // namespace mpsim::oracle::testing
