#pragma once
// Block-scaled quantization and GEMMs on the GPU (issue 19 §7): 1 x N blocks
// along the rows, each block one thread running detail::quantize_block_row
// (mpsim/emulation/block_scaling.hpp), and block-scaled GEMMs, each output
// one thread running block_scaled_dot (mpsim/emulation/block_dot.hpp): the
// routines that the CPU tests prove equal to quantize_blocks' fast path (and
// the exact reference) and to block_gemm. No CUDA type. Not yet used by the
// training backend, which refuses block points; never run on a GPU here
// (docs/gpu.md).

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

// quantize_block_operand(format, in, rows, cols, options) with the work on
// the device: the same elements, scale codes, scales and counts (the same
// refusals as above).
BlockOperand quantize_block_operand_on_device(const BlockFormat& format, std::span<const float> in, std::int64_t rows,
                                              std::int64_t cols, const BlockQuantizeOptions& options = {});

// block_gemm(BlockGemmModel{}, a_format, a, b_format, bt, c, m, n, k) with
// the work on the device: C = A B from A (m x k) and B^T (n x k), exact block
// partials accumulated in binary32, NVFP4's alpha last. Host memory in and
// out. Refused with std::invalid_argument: binary32 scales, blocks of
// different lengths along k, format pairs whose block sums can exceed
// binary64 (block_partials_fit_binary64: MXFP8 E5M2), sizes that do not match.
void block_gemm_on_device(const BlockFormat& a_format, const BlockOperand& a, const BlockFormat& b_format,
                          const BlockOperand& bt, float* c, int m, int n, int k);

}  // namespace mpsim::gpu
