// GEMMs of block-scaled operands, the way block-scaled tensor cores compute
// them: the element products of each block along k summed exactly (no
// dequantization first), the block's partial times both blocks' scales, and
// the partials accumulated across blocks in binary32. Or the products,
// scaled, in a tensor-core accumulator across blocks (an unvalidated model of
// block-scaled tensor cores: the scales applied to the products before they
// are aligned), promoted to binary32 every so many products or never. Or
// DeepSeek-V3's recipe on H100 (arXiv 2412.19437 §3.3): each block's partial
// accumulated in the tensor core's limited-precision accumulator (a
// TensorCoreModel: for FP8 on H100 about 14 bits, truncating), then promoted
// every `promotion_interval` products: multiplied by the scales and added in
// binary32 on the CUDA cores (one fused multiply-add, as DeepGEMM's
// `acc += scale * partial` compiles).
#pragma once

#include <optional>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/block_format.hpp"

namespace mpsim {

struct BlockGemmModel {
  // Without a tensor core: exact block partials accumulated in binary32 (the interval must be 0).
  // With one: binary32 scales (software scales, DeepSeek-V3) promote every block (the interval is the block
  // length); E8M0/UE4M3 scales (applied inside block-scaled tensor cores) enter the accumulator with the
  // products, which are promoted to binary32 every `promotion_interval` products (a multiple of the block
  // length), or never (0: the whole k in the tensor core's accumulator).
  std::optional<TensorCoreModel> tensor_core;
  int promotion_interval = 0;
};

// C[m x n] = A[m x k] B[k x n] (+ C), from `a` (m x k, blocks along k) and
// `bt` (B transposed, n x k, blocks along k: both operands k-major, as the
// hardware wants), each quantized by quantize_block_operand (or the
// reference quantize_blocks) with the same block length along k. NVFP4's tensor scales apply once at the end (cuBLASLt's
// alpha = s_a s_b, one binary32 multiplication); C, when accumulated, is added
// last with one rounding. A NaN block (scale NaN) makes its outputs NaN.
// Block sums too wide for binary64 (MXFP8 E5M2 blocks that span many binades)
// go term by term through an exact fixed-point sum. Binary32 scales without
// promotion need one block along k (per-tensor scaling, `fp8-e4m3-tensor`):
// the exact sum rounded once to binary32, times alpha = sa * sb, as cuBLAS's
// FP8 GEMMs apply scale_a and scale_b. Throws std::invalid_argument for sizes
// that differ, binary32 scales of several blocks along k without promotion,
// elements or scales that do not match the shapes, or wide sums with scales
// that are not powers of two.
// The exponent of an element format's smallest positive value: every element
// is an integer times 2 to this power.
int smallest_exponent(const ElementFormat& e);
// Whether the exact sum of `block` element products of these formats always
// fits binary64 (every preset pair but MXFP8 E5M2 x E5M2; block_dot.hpp).
bool block_partials_fit_binary64(const BlockFormat& a, const BlockFormat& b, int block);
// Whether block_scaled_dot_exact (block_dot.hpp) sums `block` products of
// these formats exactly: each product of the elements' integers within 64
// bits, their sum within 128 (every preset pair, MXFP8 E5M2 included).
bool block_partials_fit_int128(const BlockFormat& a, const BlockFormat& b, int block);
// Whether per_tensor_exact_dot (block_dot.hpp) sums k products of these
// element formats exactly and returns a normal binary32: each product of the
// elements' integers within 64 bits, their sum within 128; every FP8, FP6 and
// FP4 pair for any k below 2^31.
bool per_tensor_sums_fit_int128(const ElementFormat& a, const ElementFormat& b, int k);

void block_gemm(const BlockGemmModel& model, const BlockFormat& a_format, const BlockOperand& a,
                const BlockFormat& b_format, const BlockOperand& bt, float* c, int m, int n, int k,
                bool accumulate_c = false);
void block_gemm(const BlockGemmModel& model, const BlockFormat& a_format, const BlockQuantized& a,
                const BlockFormat& b_format, const BlockQuantized& bt, float* c, int m, int n, int k,
                bool accumulate_c = false);

}  // namespace mpsim
