// Block-scaled formats as values, and their quantization. A block-scaled
// format is an element format, a block shape, a scale format and a rule that
// picks each block's scale (and NVFP4's second, per-tensor level):
// - OCP Microscaling v1.0 (MXFP8 E4M3/E5M2, MXFP6 E3M2/E2M3, MXFP4, MXINT8):
//   blocks of 32, E8M0 scales (§6.3);
// - NVIDIA NVFP4: E2M1 in blocks of 16, UE4M3 scales, a binary32 tensor scale;
// - DeepSeek-V3's FP8 tiles: E4M3 in 1x128 or 128x128 tiles, binary32 scale
//   amax / 448 (arXiv 2412.19437 §3.3).
// Where the sources disagree the choices are docs/block-formats.md's.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "mpsim/emulation/scale_format.hpp"

namespace mpsim {

// An element: a floating-point format, or a symmetric integer k * 2^-fraction_bits
// with |k| <= 2^(bits-1) - 1 (MXINT8: 8 bits, 6 fraction bits; int8: 8, 0).
struct ElementFormat {
  std::optional<Format> floating;
  int integer_bits = 0;
  int fraction_bits = 0;

  double largest() const;
  int emax() const;  // the exponent of the largest binade (OCP's emax_elem; MXINT8: 0)
  std::string name() const;
  friend bool operator==(const ElementFormat&, const ElementFormat&) = default;
};

// How a block's scale is chosen from the block's largest magnitude amax.
enum class ScaleRule : std::uint8_t {
  ocp_floor,     // 2^(floor(log2 amax) - emax_elem), clamped to E8M0's range; elements may saturate
  ceil,          // the smallest power of two 2^e with amax / 2^e <= the largest element: never saturates
  nvfp4,         // NVIDIA's two-level NVFP4 scales in the paper's binary32 order (arXiv 2509.25149)
  nvfp4_te,      // the same with Transformer Engine's order: amax_b * (S_enc * (1/6))
  amax_over_max  // s = amax / largest element in binary32 (DeepSeek-V3; plain int8 with a scale)
};
std::string_view to_string(ScaleRule rule);
std::optional<ScaleRule> parse_scale_rule(std::string_view text);

struct BlockFormat {
  ElementFormat element;
  int block_rows = 1;   // 1 x block_cols blocks along a row, or block_rows x block_cols tiles;
  int block_cols = 32;  // 0 x 0: one block, the whole tensor (per-tensor scaling)
  ScaleFormat scale = ScaleFormat::e8m0;
  ScaleRule rule = ScaleRule::ocp_floor;

  std::string name() const;  // the preset's name, or a description
  // The format with a 0 x 0 block made the whole rows x cols tensor.
  BlockFormat for_shape(std::int64_t rows, std::int64_t cols) const;
  // Whether one block covers the k values along a row: per-tensor (0 x 0), or
  // blocks at least k long (k = 0: unknown, so per-tensor only).
  bool one_block_along(std::int64_t k) const {
    return (block_rows == 0 && block_cols == 0) || (k > 0 && block_cols >= k);
  }
  friend bool operator==(const BlockFormat&, const BlockFormat&) = default;
};

// Presets: mxfp8-e4m3, mxfp8-e5m2, mxfp6-e3m2, mxfp6-e2m3, mxfp4, mxint8,
// nvfp4, nvfp4-16x16, fp8-e4m3-1x128, fp8-e4m3-128x128, fp8-e4m3-tensor,
// fp8-e5m2-tensor, int8, int4.
std::optional<BlockFormat> parse_block_format(std::string_view name);
std::string_view block_format_names();

struct BlockQuantizeOptions {
  Rounding rounding;         // of the elements: nearest-even (the default) or stochastic
  RandomKey key;             // stochastic draws: element i draws random_draw(key, first_index + i)
  std::uint64_t first_index = 0;
};

// What happened in one block (or, summed, in a tensor).
struct BlockCounts {
  std::uint64_t elements = 0;
  std::uint64_t nonzero = 0;       // finite nonzero inputs
  std::uint64_t saturated = 0;     // elements clipped to the largest element (an overflow of the element)
  std::uint64_t flushed = 0;       // finite nonzero inputs that became zero: the block's scale too large for them
  std::uint64_t nan = 0;           // NaN outputs (a block or tensor with NaN or infinity)
  std::uint64_t scale_clamped = 0; // blocks whose scale hit its format's range (1 per such block)
  BlockCounts& operator+=(const BlockCounts& other);
  friend bool operator==(const BlockCounts&, const BlockCounts&) = default;
};

struct BlockQuantized {
  std::vector<double> values;            // the dequantized values, exactly (element * scale [* tensor scale])
  std::vector<std::uint32_t> elements;   // element codes (the format's encoding; integers two's complement)
  std::vector<std::uint32_t> scale_codes;  // one per block, row-major over the block grid
  std::vector<double> scales;            // their values (NaN for a NaN block)
  std::vector<BlockCounts> block_counts;
  double tensor_scale = 1;               // NVFP4's per-tensor scale (1 / S_enc); 1 otherwise
  BlockCounts counts;                    // the whole tensor
};

// Quantizes a rows x cols row-major tensor (a 1-D tensor: rows = 1). Blocks
// run along rows; the last block of a row (or tile) may be partial. The
// reference: every element through round_to_format, values exact in binary64,
// counts per block. Throws std::invalid_argument for a size mismatch.
BlockQuantized quantize_blocks(const BlockFormat& format, std::span<const float> values, std::int64_t rows,
                               std::int64_t cols, const BlockQuantizeOptions& options = {});

// The fast path, for training: `out` (which may alias `in`) gets the
// dequantized values rounded once to binary32 (exact for the MX formats'
// power-of-two scales; NVFP4's and the tiles' products are rounded to nearest
// even), with the tensor's counts and the scales. Elements round through the
// vector quantizer; the same bits, counts and draws as the reference. Element
// rounding: nearest-even or stochastic (else std::invalid_argument). Integer
// elements take the reference path.
struct BlockSummary {
  BlockCounts counts;
  std::vector<std::uint32_t> scale_codes;
  double tensor_scale = 1;
};
BlockSummary quantize_blocks(const BlockFormat& format, std::span<const float> in, std::span<float> out,
                             std::int64_t rows, std::int64_t cols, const BlockQuantizeOptions& options = {});

// A quantized tensor as a block-scaled GEMM reads it: each element's value
// before scaling (binary32 holds every element format exactly; NaN in a block
// whose values are NaN), each block's scale (decoded; NaN for a NaN block),
// and NVFP4's tensor scale. The dequantized value of element i of block b is
// elements[i] * scales[b] * tensor_scale, exact in binary64.
struct BlockOperand {
  std::vector<float> elements;
  std::vector<std::uint32_t> scale_codes;  // one per block, row-major over the block grid
  std::vector<double> scales;
  double tensor_scale = 1;
  BlockCounts counts;
};

// The fast path (the same bits, counts and draws as the reference), keeping
// the elements instead of the dequantized values: training's GEMM operands.
BlockOperand quantize_block_operand(const BlockFormat& format, std::span<const float> in, std::int64_t rows,
                                    std::int64_t cols, const BlockQuantizeOptions& options = {});
// The reference's result in the same form.
BlockOperand to_block_operand(const BlockFormat& format, const BlockQuantized& q);
// A fast path's summary and the elements it kept, as an operand (its scale
// codes decoded into scales).
BlockOperand to_block_operand(const BlockFormat& format, BlockSummary summary, std::vector<float> elements);

}  // namespace mpsim
