#pragma once
// What the instrumentation measures for one tensor at one rounding point.
// Histograms bin the exact binary32 values BEFORE they are rounded to their
// storage format, one bin per binade, so an FP32 run shows what FP16 would
// lose (Micikevicius et al. 2018, Figure 3).

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "mpsim/emulation/block_format.hpp"
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
  attention_logits,  // self-attention's q k^T / sqrt(d) as rounded (masked entries, -inf, in the infinity bin)
  attention_probs,   // self-attention's softmax output as rounded (masked entries 0); not on the fused path
};
inline constexpr int tensor_kind_count = 8;
// The kinds' names, in order: the log's "kind" coordinate and the notebooks read them.
inline constexpr EnumNames<TensorKind, tensor_kind_count> tensor_kind_names{
    {"weights", "activations", "activation_grads", "weight_grads", "updates", "gemm_inputs", "attention_logits",
     "attention_probs"}};
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
  rounded_to_zero, // nonzero finite values that became zero (under the point's rounding mode; issue 21)
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
inline constexpr EnumNames<Counter, counter_count> counter_names{{"elements", "nonzero", "rounded_to_zero", "below_2^-24",
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

// What block-scaled quantization did to one GEMM operand (policy.hpp's
// BlockPoint), summed over the steps' uses at a logging interval.
enum class BlockCounter : std::uint8_t {
  elements,       // elements quantized
  nonzero,        // finite nonzero inputs
  saturated,      // elements clipped to the element format's largest value
  rounded_to_zero,  // finite nonzero inputs that became zero inside their block (its scale too large for them)
  nan,            // NaN outputs (blocks, or NVFP4 tensors, holding NaN or infinity)
  blocks,         // blocks (tiles)
  scale_clamped,  // blocks whose scale hit its format's range
};
inline constexpr int block_counter_count = 7;
inline constexpr EnumNames<BlockCounter, block_counter_count> block_counter_names{
    {"elements", "nonzero", "saturated", "rounded_to_zero", "nan", "blocks", "scale_clamped"}};

struct BlockStats {
  // Each block's decoded scale by binade (Binades' bins; a NaN scale in nan_bin).
  Histogram scale_binades{};
  // Each block's scale code: the E8M0 code (exponent + 127) or the UE4M3
  // encoding; nothing for binary32 scales (those have only binades).
  std::array<std::uint64_t, 256> scale_codes{};
  std::array<std::uint64_t, block_counter_count> counters{};
  // Each block's quantization error sqrt(sum (q - x)^2 / sum x^2) in units of
  // the element format's epsilon (2^-mantissa_bits; MXINT8: 2^-6), by quarter
  // binade from 2^-30 to 2^10 (bin i: 2^(-30 + i/4) <= error < 2^(-30 + (i+1)/4);
  // values beyond go to the end bins), then exact blocks (all-zero ones too),
  // then NaN blocks.
  static constexpr int error_min_exponent = -30, error_max_exponent = 9, error_bins_per_binade = 4;
  static constexpr int error_finite_bins = (error_max_exponent - error_min_exponent + 1) * error_bins_per_binade;
  static constexpr int error_zero_bin = error_finite_bins, error_nan_bin = error_finite_bins + 1;
  static constexpr int error_bins = error_finite_bins + 2;
  std::array<std::uint64_t, error_bins> error{};

  std::uint64_t& operator[](BlockCounter c) { return counters[static_cast<int>(c)]; }
  std::uint64_t operator[](BlockCounter c) const { return counters[static_cast<int>(c)]; }
  BlockStats& operator+=(const BlockStats& other);
  friend bool operator==(const BlockStats&, const BlockStats&) = default;
};

// The six block-scaled GEMM operands of a layer, in policy.hpp's block_points order.
inline constexpr int gemm_operand_count = 6;

// Adds what quantize_block_operand did to x (rows x cols, row-major) into
// stats: `format` as quantized (block_format.hpp), `q` its result.
void add_block_quantization(BlockStats& stats, const BlockFormat& format, std::span<const float> x,
                            const BlockOperand& q, std::int64_t rows, std::int64_t cols);

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
