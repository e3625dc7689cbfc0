// Quantize arrays: the hot path of emulated training. Each element of a float
// or double array is rounded to a format and stored back as that format's
// (exact) value, and counters record what the rounding did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "mpsim/emulation/rounding.hpp"

namespace mpsim {

// What happened to the elements of one quantize call. The raw material of
// underflow studies: fractions are these over `elements` (or over nonzero inputs).
struct QuantizeCounts {
  std::uint64_t elements = 0;
  std::uint64_t inexact = 0;          // result differs from the input
  std::uint64_t flushed_to_zero = 0;  // nonzero finite input, zero result
  std::uint64_t subnormal = 0;        // nonzero subnormal result
  std::uint64_t overflow = 0;         // IEEE overflow: became infinity, NaN (no infinity), or saturated
  std::uint64_t nan = 0;              // NaN input or result (overflow in a format with NaN but no infinity);
                                      // a format with no NaN holds a NaN input as +largest finite
  // Inline: callers add one element's counts at a time in their loops.
  QuantizeCounts& operator+=(const QuantizeCounts& o) {
    elements += o.elements;
    inexact += o.inexact;
    flushed_to_zero += o.flushed_to_zero;
    subnormal += o.subnormal;
    overflow += o.overflow;
    nan += o.nan;
    return *this;
  }
  friend bool operator==(const QuantizeCounts&, const QuantizeCounts&) = default;
};

// Stochastic rounding of element i draws random_draw(key, first_index + i).
struct StochasticStream {
  RandomKey key;
  std::uint64_t first_index = 0;
};

// Which implementation runs. `automatic` picks the best vector target the CPU
// supports at run time (and threads for large arrays); `scalar` rounds element
// by element on the bit pattern (pattern_rounding.hpp, the code the CUDA
// kernels run), the reference that the vector paths must match bit for bit,
// counters included; `exact` rounds every element through round_to_format,
// the generic rounding of exact values (slow): the independent reference the
// scalar path is tested against. No path's bits depend on the caller's FPU
// rounding mode or DAZ/FTZ; on x86-64 without AVX-512 the vector path sets
// MXCSR's rounding (exceptions masked) for the call and restores it.
enum class Path : std::uint8_t { automatic, scalar, vector, exact };

// How the vector path writes its output: `cached` stores, or `streaming`
// (non-temporal) stores, which bypass the cache and skip reading each output
// line first. Streaming pays for a large array nobody reads soon after; in
// training the next op reads the output at once, from the cache, so cached is
// the default. No value or counter depends on it (docs/performance.md).
enum class Stores : std::uint8_t { cached, streaming };

struct QuantizeOptions {
  Rounding rounding;
  StochasticStream stochastic;
  Path path = Path::automatic;
  int threads = 0;  // 0: std::thread::hardware_concurrency() for large arrays; 1: the calling thread only
  Stores stores = Stores::cached;
};

// `out` may alias `in` (in place). Sizes must match. A float array requires
// fits_in_float(format); both throw std::invalid_argument otherwise.
QuantizeCounts quantize(const Format& format, std::span<const float> in, std::span<float> out,
                        const QuantizeOptions& options = {});
QuantizeCounts quantize(const Format& format, std::span<const double> in, std::span<double> out,
                        const QuantizeOptions& options = {});

// The name of the vector target `Path::automatic` uses on this CPU, e.g. "AVX3".
std::string_view vector_target_name();

}  // namespace mpsim
