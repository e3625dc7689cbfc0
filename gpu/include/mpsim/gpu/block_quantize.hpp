#pragma once
// Block-scaled quantization and GEMMs on the GPU (issue 19 §7): each 1 x N
// row segment one thread running detail::quantize_block_row
// (mpsim/emulation/block_scaling.hpp), a 2-D tile's scale found first by one
// thread per tile, and block-scaled GEMMs, each output one thread running
// block_scaled_dot (mpsim/emulation/block_dot.hpp): the routines that the CPU
// tests prove equal to quantize_blocks' fast path (and the exact reference)
// and to block_gemm. No CUDA type. The cuda backend's block-scaled GEMMs run
// on these (core/block_scaled_gemm.hpp's steps); docs/gpu.md says where they
// ran on a GPU.

#include <cstdint>
#include <span>
#include <string>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/block_format.hpp"
#include "mpsim/emulation/block_gemm.hpp"

namespace mpsim::gpu {

// quantize_blocks(format, in, out, rows, cols, options) with the work on the
// device: the same values, scale codes and counts, floating-point and
// integer elements alike (quantize_block_row). `in` and `out` are host
// memory; the call copies, runs and waits.
BlockSummary quantize_blocks_on_device(const BlockFormat& format, std::span<const float> in, std::span<float> out,
                                       std::int64_t rows, std::int64_t cols, const BlockQuantizeOptions& options = {});

// quantize_block_operand(format, in, rows, cols, options) with the work on
// the device: the same elements, scale codes, scales and counts.
BlockOperand quantize_block_operand_on_device(const BlockFormat& format, std::span<const float> in, std::int64_t rows,
                                              std::int64_t cols, const BlockQuantizeOptions& options = {});

// block_gemm(BlockGemmModel{}, a_format, a, b_format, bt, c, m, n, k) with
// the work on the device: C = A B from A (m x k) and B^T (n x k), exact block
// partials accumulated in binary32 (binary32 scales per tensor: the exact sum
// rounded once, times the scales), NVFP4's alpha last. Host memory in and
// out. Refused with std::invalid_argument: what block_gemm_refusal_on_device
// names, and sizes that do not match.
void block_gemm_on_device(const BlockFormat& a_format, const BlockOperand& a, const BlockFormat& b_format,
                          const BlockOperand& bt, float* c, int m, int n, int k);

// Why block_gemm_on_device (with the quantizer before it) cannot take
// operands in formats a and b with k products per output (0: any k); empty
// when it can. Refused: binary32 scales on blocks shorter
// than k (DeepSeek-V3's tiles, which take a tensor-core promotion model); and
// E8M0/UE4M3 blocks of different lengths along k. Block sums that can exceed
// binary64 (MXFP8 E5M2) are summed as 128-bit integers and added to the
// accumulator with one rounding (block_scaled_dot_exact), with E8M0 scales
// (block_gemm refuses other scales there too); binary32 scales per tensor (one
// block spans k) in 128-bit fixed point (per_tensor_exact_dot), E5M2 included.
std::string block_gemm_refusal_on_device(const BlockFormat& a, const BlockFormat& b, int k = 0);

// block_gemm(model, ...) for DeepSeek-V3's recipe on an H100 or H200: FP8
// elements with binary32 scales on blocks of B along k (1 x 128, 128 x 128),
// model.tensor_core the H100's FP8 row and model.promotion_interval = B; or
// one binary32 scale per operand (fp8-current's points with gemm = "h100":
// one block, B = k, no promotion before the end). Each
// block's partials come from the tensor cores themselves (cuBLASLt's FP8 GEMM
// with fast accumulation, which equals the h100 FP8 model bit for bit:
// docs/tensor_cores.md), promoted as block_gemm does, acc = fma(partial,
// sa sb, acc) in binary32: the same bits. Host memory in and out.
void tensor_core_block_gemm_on_device(const BlockGemmModel& model, const BlockFormat& a_format, const BlockOperand& a,
                                      const BlockFormat& b_format, const BlockOperand& bt, float* c, int m, int n,
                                      int k);
// Why it cannot take these operands through this tensor-core model with k
// products per output (0: any k); empty when it can. Asks the device last
// (compute capability 9.x: the model is the H100's), so that every other
// reason is named without one.
std::string tensor_core_block_gemm_refusal(const BlockFormat& a, const BlockFormat& b, const TensorCoreModel& model,
                                           int k = 0);

// block_gemm(model, ...) for MXFP8 or NVFP4 operands through the B200's
// model (gemm = "b200", no promotion) on a Blackwell data-center GPU's own
// block-scaled tensor cores: cuBLASLt's block-scaled GEMM (E8M0 scales per 32
// or UE4M3 per 16 applied in hardware, NVFP4's tensor scales as alpha). The
// model is ours and unvalidated (docs/tensor_cores.md): whether the two give
// the same bits is what the device case measures. Host memory in and out.
void native_block_gemm_on_device(const BlockGemmModel& model, const BlockFormat& a_format, const BlockOperand& a,
                                 const BlockFormat& b_format, const BlockOperand& bt, float* c, int m, int n, int k);
// Why it cannot take these operands and model; empty when it can. Asks the
// device last (compute capability 10.x).
std::string native_block_gemm_refusal(const BlockFormat& a, const BlockFormat& b, const TensorCoreModel& model,
                                      int promotion_interval);

}  // namespace mpsim::gpu
