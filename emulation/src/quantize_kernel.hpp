// Internal: what the vector kernels receive. Everything that depends only on
// the format, the storage type and the mode is worked out once per call, on
// the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mpsim/emulation/pattern_rounding.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/block_scaling.hpp"

namespace mpsim::detail {

// Rounding a binary32 (binary64) value into a format that fits in it, done on
// the storage's bit pattern (see quantize_vector.cpp for the derivation).
// U is the pattern type: uint32_t for float storage, uint64_t for double.
template <class U>
struct Kernel {
  RoundingMode mode;
  PatternFormat<U> format;  // the format on the storage pattern, as the scalar path sees it
  U overflow_positive;      // what an overflow becomes, by sign, for this mode
  U overflow_negative;
  // Nearest-even only: the storage pattern of C = 2^(emin - mantissa bits +
  // storage mantissa bits), or 0 where the subnormal shortcut is not exact
  // (see QuantizeSubnormalLanes).
  U subnormal_magic;
  // Every mode, gradual underflow: the storage patterns of 2^(mantissa bits -
  // emin) and 2^(emin - mantissa bits), or 0 where the scaled short path is not
  // exact (see QuantizeSubnormalLanes).
  U subnormal_scale;
  U subnormal_quantum;
  // The quantum of ordinary lanes on the pattern, 2^shift, and the bits below it
  // (RoundOrdinaryLanes): worked out here, not in the loop, where GCC 12
  // recomputed them every vector.
  U quantum;
  U below_quantum;
  // Round-to-odd's bit to set where inexact: the quantum, or none where the
  // significand has no bits (it is 1, odd already).
  U odd_bit;
  // Nearest-even on the pattern (RoundPatternNearestEven): the bit above the
  // quantum is the significand's parity where the format has mantissa bits
  // (mask 1), else the significand is 1, odd (mask 0, one more in the bias);
  // shift 0 rounds nothing (mask 0). The bias: half a quantum minus one, plus that.
  U nearest_parity_mask;
  U nearest_bias;
  // largest finite - smallest normal + 1: AllOrdinary's wrap-around span.
  U ordinary_span;
  // Binary32 storage: (23 - mantissa bits) << 23, the offset from a binade's
  // exponent field to the pattern of its rounding constant (QuantizeShortLanesFpu),
  // or 0 where that path is off (not exact there; 23 mantissa bits give 0 too).
  std::uint32_t fpu_magic_offset = 0;
  // With it: the format's smallest normal binade as an exponent field
  // (emin << 23), and 23 - mantissa bits - 24 (StochasticMagnitudeAvx2's
  // shift offset), worked out here so that the loop reloads, not recomputes,
  // what it has no register for.
  std::uint32_t fpu_min_binade = 0;
  std::uint32_t fpu_shift_offset = 0;
  std::uint32_t random_mask;  // stochastic rounding: the draw bits that count
  DrawKey key;
  bool streaming_stores = false;  // QuantizeOptions::stores
};

template <class T>
using KernelFor = Kernel<std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>>;

template <class T>
KernelFor<T> make_kernel(const Format& format, const QuantizeOptions& options);
// The kernel of integer_pattern_format(bits, fraction_bits) (pattern_format.hpp):
// integer block elements. Its zeros keep their sign; the caller drops it.
KernelFor<float> make_integer_kernel(int bits, int fraction_bits, const QuantizeOptions& options);

// Quantizes n elements; element i uses random index first_index + i.
QuantizeCounts quantize_vector(const Kernel<std::uint32_t>& kernel, const float* in, float* out, std::size_t n,
                               std::uint64_t first_index);
QuantizeCounts quantize_vector(const Kernel<std::uint64_t>& kernel, const double* in, double* out, std::size_t n,
                               std::uint64_t first_index);
const char* vector_target();

// Block-scaled quantization fused in one pass (quantize_blocks' fast path):
// per block of `block` consecutive values (the last may be partial), its
// largest magnitude, its scale (block_params), y = x op scale, y rounded to the
// element format (the kernel's), and y's element times the dequantization
// factor, without leaving registers. Block b's scale code goes to codes[b].
// With `given` (a row of 2-D tiles, whose scales span rows) block b takes
// given[b] instead, and codes and clamped counts are left to the caller.
// `out` (dequantized values) and `elements` (each element's value before
// scaling) are written where not null. Element i draws index first_index + i;
// n must be below 2^28 (lane counters). With `block_amax` (block_amax_bits'
// output for these blocks), block b's largest magnitude is block_amax[b]
// instead of being found again; `codes` may be `block_amax` (each block's
// amax is read before its code is written). Then the blocks of a finite
// NVFP4 tensor whose elements round directly leave the zeros of x to the
// caller, who counted them there, and say so (zeros_uncounted): `nonzero` is
// the lanes looked at and `lost` the zero elements among them, zero x and the
// padding lanes of a block's last partial vector included.
struct BlockKernelCounts {
  std::uint64_t nonzero = 0, lost = 0, saturated = 0, flushed = 0, nan = 0, clamped = 0;
  bool zeros_uncounted = false;
};
void quantize_blocks_vector(const Kernel<std::uint32_t>& kernel, const BlockRule& rule, const BlockParams* given,
                            const float* in, float* out, float* elements, std::size_t n, std::size_t block,
                            std::uint64_t first_index, const std::uint32_t* block_amax, std::uint32_t* codes,
                            BlockKernelCounts& counts);
// The largest |x| of x[0, n) as binary32 bits (a NaN's are above 0x7F800000).
std::uint32_t amax_bits(const float* x, std::size_t n);
// The same, each block's (block b, x[b block, min(n, (b + 1) block)), into
// block_amax[b]) and the number of zeros in `zeros`: NVFP4's first pass, which
// reads the tensor for its amax anyway.
std::uint32_t block_amax_bits(const float* x, std::size_t n, std::size_t block, std::uint32_t* block_amax,
                              std::uint64_t& zeros);

}  // namespace mpsim::detail
