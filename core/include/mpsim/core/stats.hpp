#pragma once
// What the instrumentation measures for one tensor at one rounding point.
// Histograms bin the exact binary32 values BEFORE they are rounded to their
// storage format, one bin per binade, so an FP32 run shows what FP16 would
// lose (Micikevicius et al. 2018, Figure 3).

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "mpsim/emulation/quantize.hpp"
#include "mpsim/core/names.hpp"

namespace mpsim::core {

enum class TensorKind : std::uint8_t {
  weights,           // the working copy that GEMMs read, as rounded from the master weights
  activations,       // a layer's forward output, at the rounding of its storage format
  activation_grads,  // gradients with respect to a layer's input, as its backward produces them
  weight_grads,      // gradients with respect to the layer's parameters (loss-scaled, as stored)
  updates,           // the optimiser's update of each weight, before it is added to the weight
  gemm_inputs,       // activations and output gradients rounded for a GEMM operand (FP8 scaling happens here);
                     // only where that rounding can change a value (docs/policies.md)
};
inline constexpr int tensor_kind_count = 6;
// The kinds' names, in order: the log's "kind" coordinate and the notebooks read them.
inline constexpr EnumNames<TensorKind, tensor_kind_count> tensor_kind_names{
    {"weights", "activations", "activation_grads", "weight_grads", "updates", "gemm_inputs"}};
inline std::string_view to_string(TensorKind kind) { return tensor_kind_names(kind); }

// Bins: binades 2^-149 .. 2^127 (every binary32 value), then zero, infinity, NaN.
struct Binades {
  static constexpr int min_exponent = -149;
  static constexpr int max_exponent = 127;
  static constexpr int finite_bins = max_exponent - min_exponent + 1;  // 277
  static constexpr int zero_bin = finite_bins;
  static constexpr int infinity_bin = finite_bins + 1;
  static constexpr int nan_bin = finite_bins + 2;
  static constexpr int bin_count = finite_bins + 3;
  static constexpr int bin_of_exponent(int e) { return e - min_exponent; }
};
using Histogram = std::array<std::uint64_t, Binades::bin_count>;

// Scalar counters, in this order in the HDF5 log ("counters" attribute names them).
enum class Counter : std::uint8_t {
  elements,        // values rounded
  nonzero,         // nonzero values before rounding (NaN included)
  flushed,         // nonzero finite values that became zero
  below_2_24,      // nonzero finite values with magnitude below 2^-24 (FP16's smallest subnormal)
  subnormal,       // results in the storage format's subnormal range
  overflow,        // results that overflowed (to infinity, NaN, or saturated)
  nan,             // NaN results
  infinite,        // infinite results
  swallowed,       // updates only: nonzero updates that left the stored weight unchanged
  inexact,         // results different from the value before rounding
};
inline constexpr int counter_count = 10;
// The counters' names, in order: the log's "counter" coordinate.
inline constexpr EnumNames<Counter, counter_count> counter_names{{"elements", "nonzero", "flushed", "below_2^-24",
                                                                 "subnormal", "overflow", "nan", "infinite",
                                                                 "swallowed", "inexact"}};
inline std::string_view to_string(Counter counter) { return counter_names(counter); }

struct TensorStats {
  Histogram histogram{};
  std::array<std::uint64_t, counter_count> counters{};

  std::uint64_t& operator[](Counter c) { return counters[static_cast<int>(c)]; }
  std::uint64_t operator[](Counter c) const { return counters[static_cast<int>(c)]; }
  TensorStats& operator+=(const TensorStats& other);
  friend bool operator==(const TensorStats&, const TensorStats&) = default;

  // Adds the histogram of `values` and the counters that follow from it
  // (elements, nonzero, below_2_24). Returns the classes of these values alone.
  // Large arrays are split over up to `threads` OpenMP threads.
  struct Classes {
    std::uint64_t subnormal = 0, infinite = 0, nan = 0;  // as binary32 values
  };
  Classes add_values(std::span<const float> values, int threads = 1);

  // What a backend counts to get the same: the biased exponent field of each
  // binary32 value (the binade of a normal value; 0 for zeros and subnormals,
  // 255 for infinities and NaNs), the subnormals by binade (2^-149 .. 2^-127;
  // also in field[0]), infinities and NaNs (together field[255]).
  struct FieldCounts {
    std::array<std::uint64_t, 256> field{};
    std::array<std::uint64_t, 23> subnormal{};
    std::uint64_t infinite = 0, nan = 0;
  };
  Classes add_field_counts(const FieldCounts& counts);
  // Adds the counters that the emulator's rounding reports.
  void add_rounding(const QuantizeCounts& counts);
};

// How exponent fields are counted (add_values picks the fastest for this CPU's
// SIMD target; tests run each one on every target and compare them).
enum class FieldCountPath : std::uint8_t {
  automatic,  // what add_values does
  window,     // vector windows of adjacent fields and a positional population count
  pairs,      // memory increments, one per two values
};
// The field counts of `values` on one thread, through the SIMD target that
// dispatch picks now (mpsim/emulation/simd.hpp).
TensorStats::FieldCounts count_fields(std::span<const float> values, FieldCountPath path = FieldCountPath::automatic);

}  // namespace mpsim::core
