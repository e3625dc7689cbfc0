#pragma once
// Stream-aware launchers of the rounding and histogram kernels, shared by the
// one-shot public functions (device.hpp: quantize, add_values) and the CUDA
// backend, so that both run the same kernels. Private to gpu/.
#include <cstddef>
#include <cstdint>

#include "check.hpp"
#include "mpsim/core/numerics.hpp"
#include "mpsim/core/stats.hpp"
#include "mpsim/gpu/device_rounding.hpp"

namespace mpsim::gpu::detail {

// --- The exponent histogram (TensorStats::FieldCounts on the device) --------
// Bins: the 256 biased exponent fields of binary32, the 23 subnormal binades
// 2^-149 .. 2^-127, then infinities and NaNs.
inline constexpr int field_bins = 256, subnormal_bins = 23;
inline constexpr int infinite_bin = field_bins + subnormal_bins, nan_bin = infinite_bin + 1;
inline constexpr int histogram_bins = nan_bin + 1;

#ifdef __CUDACC__
// Counts one value into a block's shared bins, classified by numerics.hpp's
// rules, as the CPU's TensorStats::add_values.
__device__ inline void count_value(float x, unsigned int* bins) {
  const std::uint32_t bits = core::magnitude_bits(x);
  atomicAdd(&bins[core::exponent_field(bits)], 1u);
  if (core::is_subnormal_magnitude(bits)) atomicAdd(&bins[field_bins + core::subnormal_binade(bits)], 1u);  // 2^(k - 149)
  if (core::is_infinite_magnitude(bits)) atomicAdd(&bins[infinite_bin], 1u);
  if (core::is_nan_magnitude(bits)) atomicAdd(&bins[nan_bin], 1u);
}
#endif

// Adds the histogram of n values to bins[histogram_bins] (device memory), in stream order.
void launch_histogram(const float* values, std::size_t n, unsigned long long* bins, cudaStream_t stream);
// The FieldCounts of bins copied to the host.
core::TensorStats::FieldCounts field_counts_of(const unsigned long long* host_bins);

// --- Rounding in place --------------------------------------------------------
// What the rounding kernel counts, in this order.
namespace counter {
inline constexpr int inexact = 0, flushed = 1, subnormal = 2, overflow = 3, nan = 4, infinite = 5;
}
inline constexpr int rounding_counter_count = 6;

struct RoundLaunch {
  bool round = true;  // false: scale and count only (binary32 storage, nothing rounded)
  DeviceFormat format{};
  DeviceRounding rounding{};
  std::uint32_t key_low = 0, key_high = 0;  // DrawKey; element i draws device_random_draw(key, first_index + i)
  std::uint64_t first_index = 0;
  // x -> round(x * before) * after, each multiplication only when asked (as
  // the CPU backend, which skips them when the scale is 1: a NaN's payload
  // would not survive a multiplication on the device).
  bool scale_before = false, scale_after = false;
  float before = 1.0f, after = 1.0f;
  unsigned long long* counters = nullptr;  // [rounding_counter_count] by `counter`, added to; null: not counted
  unsigned long long* bins = nullptr;      // [histogram_bins], the values after scaling, before rounding; null: none
  unsigned int* amax = nullptr;  // max'ed with the largest |x| pattern before scaling, NaN ignored; null: none
  // Delayed scaling on the device: when not null, before = *device_scale
  // (a power of two), after = 1 / before, each applied when not 1.
  const float* device_scale = nullptr;
  // When not null and nonzero, the kernel does nothing (a skipped step's gate).
  const int* skip = nullptr;
  // Narrow storage (device_storage.hpp): when not null, the rounded values
  // are written here in the format's encoding (storage_bytes(format) bytes
  // each), before the multiplication by `after`, and `values` is left as it
  // was; *store_descale gets `after` (1 when not scaled after), which the
  // widening kernel applies. Needs round, and no skip: a skipped launch
  // would leave the store unwritten.
  void* store = nullptr;
  float* store_descale = nullptr;
};

// Rounds n values in place, in stream order; never synchronises.
void launch_round(float* values, std::size_t n, const RoundLaunch& launch, cudaStream_t stream);

}  // namespace mpsim::gpu::detail
