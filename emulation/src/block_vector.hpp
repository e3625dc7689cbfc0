// Internal: the vector loops of quantize_blocks' fast path (block_vector.cpp,
// Highway's run-time dispatch), on runs of consecutive blocks of `block`
// values; the last block may be partial.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpsim::detail {

// The largest |x| of each block, as binary32 bits (a NaN's are above 0x7F800000).
void block_amax_bits(const float* x, std::size_t n, std::size_t block, std::uint32_t* amax);

struct ScaleCounts {
  std::uint64_t nonzero = 0;  // finite nonzero x
  std::uint64_t lost = 0;     // finite nonzero x whose y is zero
};
// y = x * factor[b] in block b, one binary32 multiplication each.
ScaleCounts scale_blocks(const float* x, std::size_t n, std::size_t block, const float* factor, float* y);

// out = e * dequant[b]; two_step: (e * dequant[b]) * tensor_scale.
void dequantize_blocks(const float* e, std::size_t n, std::size_t block, const float* dequant, float tensor_scale,
                       bool two_step, float* out);

}  // namespace mpsim::detail
