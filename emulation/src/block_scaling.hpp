// Internal: a block's scale from its largest magnitude, written once for the
// fast path's host loop and its vector kernel (quantize_vector.cpp). Every
// step is the reference's (block_format.cpp, Quantizer): the same binary32
// operations in the same order, E4M3 rounding on the pattern
// (pattern_rounding.hpp), which tests/emulation/test_paths.cpp proves equal to
// round_to_format.
#pragma once

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <limits>

#include "mpsim/emulation/pattern_rounding.hpp"

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
  PatternFormat<std::uint32_t> ue4m3{};  // nvfp4: E4M3 on binary32 patterns (saturating)
};

struct BlockParams {
  bool nan = false;        // every value of the block is NaN
  bool zero_tile = false;  // tile: s = 0
  bool clamped = false;    // the scale hit its format's range
  float factor = 1;        // y = x * factor (power_of_two, nvfp4) or x / factor (tile)
  float dequant = 1;       // value = element * dequant (nvfp4: then * tensor_scale)
  std::uint32_t code = 0;  // the scale's code
};

// 2^k for k in [-149, 127], a binary32 value (subnormal below 2^-126).
inline float power_of_two(int k) {
  return std::bit_cast<float>(k >= -126 ? static_cast<std::uint32_t>(k + 127) << 23 : std::uint32_t{1} << (k + 149));
}

// UE4M3's code of one of its values (a binary32 s >= 0 E4M3 rounding made).
inline std::uint32_t ue4m3_code(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (bits == 0) return 0;
  const int exponent = static_cast<int>(bits >> 23) - 127;
  if (exponent >= -6) return static_cast<std::uint32_t>((exponent + 7) << 3) | ((bits >> 20) & 7);
  // A subnormal k 2^-9, k in 1..7: the significand's top bits, k = significand 2^(exponent + 9 - 23).
  return ((bits & 0x7FFFFFu) | 0x800000u) >> (14 - exponent);
}

// amax_bits: the block's largest |x| as binary32 bits (above 0x7F800000 a NaN).
[[gnu::always_inline]] inline BlockParams block_params(const BlockRule& rule, std::uint32_t amax_bits) {
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
        // ceil: amax / 2^e <= largest, exactly (amax 2^-e lies in [1, 2^(emax+1)): exact in binary32).
        if (rule.ceil && amax * power_of_two(-e) > rule.largest) ++e;
        if (e < -127 || e > 127) {
          e = std::clamp(e, -127, 127);
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

}  // namespace mpsim::detail
