#pragma once
// A block-scaled GEMM of the training loop (backend.hpp's
// GemmNumerics::a_block), written once for every backend: each operand laid
// out k-major (as the hardware reads it), Hadamard-transformed along k where
// its point asks, quantized, counted into its BlockStats, and multiplied. A
// backend supplies the two numeric steps: the CPU's quantize_block_operand
// and block_gemm by default, or the cuda backend's kernels, which
// tests/gpu/test_device.cpp proves give the same bits.

#include <cstdint>
#include <functional>
#include <span>

#include "mpsim/core/backend.hpp"
#include "mpsim/emulation/block_gemm.hpp"

namespace mpsim::core {

struct BlockGemmSteps {
  // quantize_block_operand's contract.
  std::function<BlockOperand(const BlockFormat&, std::span<const float>, std::int64_t rows, std::int64_t cols,
                             const BlockQuantizeOptions&)>
      quantize;
  // block_gemm's contract, C = A B from A (m x k) and B^T (n x k), C overwritten.
  std::function<void(const BlockGemmModel&, const BlockFormat&, const BlockOperand&, const BlockFormat&,
                     const BlockOperand&, float* c, int m, int n, int k)>
      multiply;
};

// The CPU's steps: quantize_block_operand and block_gemm.
BlockGemmSteps cpu_block_gemm_steps();

// c (m x n) = op(a) op(b), a stored a_rows x a_cols and b b_rows x b_cols
// row-major in host memory, each operand quantized along k to its block point
// first.
void block_scaled_gemm(const float* a, bool transpose_a, std::int64_t a_rows, std::int64_t a_cols, const float* b,
                       bool transpose_b, std::int64_t b_rows, std::int64_t b_cols, float* c,
                       const GemmNumerics& numerics, const BlockGemmSteps& steps = cpu_block_gemm_steps());

// Why `backend` cannot run policy p's block-scaled GEMMs (Backend::block_gemm_refusal, asked
// for each role's operand pair); empty when it can, or when p has none.
std::string block_gemm_refusal(const Backend& backend, const Policy& p);

}  // namespace mpsim::core
