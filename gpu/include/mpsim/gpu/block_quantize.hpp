#pragma once
// Block-scaled quantization on the GPU (issue 19 §7): 1 x N blocks along the
// rows, each block one thread running detail::quantize_block_row
// (mpsim/emulation/block_scaling.hpp), the routine that the CPU tests prove
// equal to quantize_blocks' fast path and the exact reference. No CUDA type.
// Not yet used by the training backend, which refuses block points.

#include <cstdint>
#include <span>

#include "mpsim/emulation/block_format.hpp"

namespace mpsim::gpu {

// quantize_blocks(format, in, out, rows, cols, options) with the work on the
// device: the same values, scale codes and counts (2-D tiles and integer
// elements are refused with std::invalid_argument). `in` and `out` are host
// memory; the call copies, runs and waits.
BlockSummary quantize_blocks_on_device(const BlockFormat& format, std::span<const float> in, std::span<float> out,
                                       std::int64_t rows, std::int64_t cols, const BlockQuantizeOptions& options = {});

}  // namespace mpsim::gpu
