// A block's scale from its largest magnitude, and one 1 x n block quantized,
// written once for the fast path's host loop, its vector kernel
// (quantize_vector.cpp) and CUDA kernels (MPSIM_HOST_DEVICE; nvcc's
// --expt-relaxed-constexpr for std::bit_cast and std::countl_zero). Every
// step is the reference's (block_format.cpp, Quantizer): the same binary32
// operations in the same order, rounding on the pattern (pattern_rounding.hpp),
// which tests/emulation/test_paths.cpp proves equal to round_to_format;
// tests/emulation/test_block_formats.cpp proves quantize_block_row equal to
// quantize_blocks on the host.
#pragma once

#include <bit>
#include <cfloat>
#include <cstdint>
#include <limits>
#include <span>

#include "mpsim/emulation/block_format.hpp"
#include "mpsim/emulation/host_device.hpp"
#include "mpsim/emulation/pattern_rounding.hpp"
#include "mpsim/emulation/random_draw.hpp"

namespace mpsim::detail {

enum class BlockKind : std::uint8_t { power_of_two, nvfp4, tile };

// What a block's scale depends on beyond its amax, worked out once per tensor.
struct BlockRule {
  BlockKind kind = BlockKind::power_of_two;
  bool ceil = false;               // power_of_two: OCP's floor or the never-saturating ceil
  bool te_order = false;           // nvfp4: Transformer Engine's amax_b * (S_enc * (1/6))
  int emax = 0;                    // the element's largest binade
  float largest = 0;               // the element's largest value
  float encode = 1;                // nvfp4: S_enc
  float tensor_scale = 1;          // nvfp4: 1 / S_enc
  bool tensor_nan = false;         // nvfp4: a NaN anywhere
  bool tensor_finite = false;      // nvfp4: no infinity and no NaN anywhere
  PatternFormat<std::uint32_t> ue4m3{};  // nvfp4: E4M3 on binary32 patterns (saturating)
  bool integer_elements = false;         // a zero element is +0: an integer code holds no -0
};

// A format's rule for one tensor (host only): NVFP4's tensor scale comes from
// the whole tensor's largest magnitude, found here or given as binary32 bits.
BlockRule block_rule(const BlockFormat& format, std::span<const float> tensor);
BlockRule block_rule(const BlockFormat& format, std::uint32_t tensor_amax_bits);

// The element format on binary32 patterns (host only): binary32_pattern_format
// of a floating-point element, integer_pattern_format of an integer one.
PatternFormat<std::uint32_t> element_pattern_format(const ElementFormat& element);

struct BlockParams {
  bool nan = false;        // every value of the block is NaN
  bool zero_tile = false;  // tile: s = 0
  bool clamped = false;    // the scale hit its format's range
  float factor = 1;        // y = x * factor (power_of_two, nvfp4) or x / factor (tile)
  float dequant = 1;       // value = element * dequant (nvfp4: then * tensor_scale)
  std::uint32_t code = 0;  // the scale's code
};

// 2^k for k in [-149, 127], a binary32 value (subnormal below 2^-126).
MPSIM_HOST_DEVICE inline float power_of_two(int k) {
  return std::bit_cast<float>(k >= -126 ? static_cast<std::uint32_t>(k + 127) << 23 : std::uint32_t{1} << (k + 149));
}

// The significand of a positive finite binary32 pattern, in [1, 2) (a
// subnormal's normalized).
MPSIM_HOST_DEVICE inline float significand(std::uint32_t bits) {
  const std::uint32_t fraction = bits >= 0x00800000u ? bits : bits << (std::countl_zero(bits) - 8);
  return std::bit_cast<float>((fraction & 0x7FFFFFu) | 0x3F800000u);
}

// UE4M3's code of one of its values (a binary32 s >= 0 E4M3 rounding made).
MPSIM_HOST_DEVICE inline std::uint32_t ue4m3_code(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (bits == 0) return 0;
  const int exponent = static_cast<int>(bits >> 23) - 127;
  if (exponent >= -6) return static_cast<std::uint32_t>((exponent + 7) << 3) | ((bits >> 20) & 7);
  // A subnormal k 2^-9, k in 1..7: the significand's top bits, k = significand 2^(exponent + 9 - 23).
  return ((bits & 0x7FFFFFu) | 0x800000u) >> (14 - exponent);
}

// amax_bits: the block's largest |x| as binary32 bits (above 0x7F800000 a NaN).
MPSIM_HOST_DEVICE inline BlockParams block_params(const BlockRule& rule, std::uint32_t amax_bits) {
  BlockParams p;
  const float amax = std::bit_cast<float>(amax_bits);
  switch (rule.kind) {
    case BlockKind::power_of_two: {
      if (amax_bits >= 0x7F800000u) {  // NaN or infinity: a NaN block (E8M0 0xFF)
        p.nan = true;
        p.code = 0xFF;
        return p;
      }
      int e = -127;  // an all-zero block: the smallest scale
      if (amax_bits != 0) {
        // floor(log2 amax) from the bits: the exponent field, or a subnormal's leading bit.
        const int log2 = amax_bits >= 0x00800000u ? static_cast<int>(amax_bits >> 23) - 127
                                                  : -118 - std::countl_zero(amax_bits);
        e = log2 - rule.emax;
        // ceil: amax / 2^e <= largest, exactly: amax / 2^e = m 2^emax with m amax's significand in
        // [1, 2) (2^-e itself may lie beyond binary32's range).
        if (rule.ceil && significand(amax_bits) * power_of_two(rule.emax) > rule.largest) ++e;
        if (e < -127 || e > 127) {
          e = e < -127 ? -127 : 127;
          p.clamped = true;
        }
      }
      p.factor = power_of_two(-e);
      p.dequant = power_of_two(e);
      p.code = static_cast<std::uint32_t>(e + 127);
      return p;
    }
    case BlockKind::nvfp4: {
      if (rule.tensor_nan) {
        p.nan = true;
        p.code = 0x7F;
        return p;
      }
      float s = 0;
      if (!rule.te_order) {
        const float sixth = amax / 6.0f;
        s = sixth * rule.encode;
      } else {
        const float one_sixth = 1.0f / 6.0f;
        const float factor = rule.encode * one_sixth;
        s = amax * factor;
      }
      if (s > FLT_MAX) s = FLT_MAX;  // an infinity
      if (s > 448.0f) s = 448.0f, p.clamped = true;
      const float sb = std::bit_cast<float>(
          round_pattern<std::uint32_t>(std::bit_cast<std::uint32_t>(s), rule.ue4m3,
                                       PatternRounding{pattern_mode::nearest_even, 32}, 0)
              .value);
      if (sb == 0 && amax > 0) p.clamped = true;
      p.code = ue4m3_code(sb);
      const float product = sb * rule.tensor_scale;
      float enc = 1.0f / product;
      if (enc > FLT_MAX) enc = FLT_MAX;
      p.factor = enc;
      p.dequant = sb;
      return p;
    }
    case BlockKind::tile: {
      if (amax_bits >= 0x7F800000u) {  // NaN: a NaN scale; infinity: s = inf; NaN values either way
        p.nan = true;
        p.code = amax_bits > 0x7F800000u ? std::bit_cast<std::uint32_t>(std::numeric_limits<float>::quiet_NaN())
                                         : amax_bits;
        return p;
      }
      const float s = amax / rule.largest;
      p.clamped = s == 0 && amax > 0;
      p.code = std::bit_cast<std::uint32_t>(s);
      p.zero_tile = s == 0;
      p.factor = s;
      p.dequant = s;
      return p;
    }
  }
  return p;
}

// What quantize_block_row counted: finite nonzero inputs, those whose element
// became zero (the scale too large for them), elements that saturated, and
// NaN outputs (BlockCounts' meanings).
struct BlockRowCounts {
  std::uint64_t nonzero = 0, flushed = 0, saturated = 0, nan = 0;
};

// One block of n consecutive values: its scale from its largest magnitude (or
// `given`, a 2-D tile's), each element y = x * factor (tiles: x / s) rounded
// on the pattern into `element` (the element format, saturating) with draw
// random_draw(key, first_index + i), and out[i] = element * dequant (NVFP4:
// then * the tensor scale), each product one binary32 rounding: the fast
// path's arithmetic, value for value. `out` may be `in`. `elements`, where not
// null, gets each element's value before scaling (NaN in a NaN block), as
// quantize_block_operand keeps them. Returns the block's parameters (its
// scale code).
MPSIM_HOST_DEVICE inline BlockParams quantize_block_row(const BlockRule& rule, const BlockParams* given,
                                                        const PatternFormat<std::uint32_t>& element,
                                                        PatternRounding rounding, DrawKey key,
                                                        std::uint64_t first_index, const float* in, float* out, int n,
                                                        BlockRowCounts& counts, float* elements = nullptr) {
  std::uint32_t amax = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint32_t a = std::bit_cast<std::uint32_t>(in[i]) & 0x7FFFFFFFu;
    amax = a > amax ? a : amax;
  }
  const BlockParams p = given != nullptr ? *given : block_params(rule, amax);
  const bool tile = rule.kind == BlockKind::tile, two_step = rule.kind == BlockKind::nvfp4;
  for (int i = 0; i < n; ++i) {
    const float x = in[i];
    const std::uint32_t a = std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
    const bool finite_nonzero = a - 1u < 0x7F7FFFFFu;
    counts.nonzero += finite_nonzero;
    if (p.nan) {
      out[i] = std::numeric_limits<float>::quiet_NaN();
      if (elements != nullptr) elements[i] = std::numeric_limits<float>::quiet_NaN();
      ++counts.nan;
      continue;
    }
    const float y = tile ? (p.zero_tile && x == 0.0f ? x : x / p.factor) : x * p.factor;
    const std::uint32_t draw = rounding.mode == pattern_mode::stochastic ? random_draw(key, first_index + i) : 0;
    RoundedValue<std::uint32_t> r = round_pattern<std::uint32_t>(std::bit_cast<std::uint32_t>(y), element,
                                                                rounding, draw);
    if (rule.integer_elements && (r.value & 0x7FFFFFFFu) == 0) r.value = 0;  // the integer 0 has no sign
    counts.saturated += r.overflow;
    if (elements != nullptr) elements[i] = std::bit_cast<float>(r.value);
    float v = std::bit_cast<float>(r.value) * p.dequant;
    if (two_step) v = v * rule.tensor_scale;  // element * sb is exact; one rounding here
    counts.flushed += finite_nonzero && (r.value & 0x7FFFFFFFu) == 0;  // the element (NVFP4's zero scale: not here)
    out[i] = v;
  }
  return p;
}

}  // namespace mpsim::detail
