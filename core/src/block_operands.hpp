#pragma once
// The CPU backend's block-scaled GEMM (backend.hpp's GemmNumerics::a_block).

#include <cstdint>

#include "mpsim/core/backend.hpp"

namespace mpsim::core {

// c (m x n) = op(a) op(b), a stored a_rows x a_cols and b b_rows x b_cols
// row-major, each operand quantized along k to its block point first.
void block_scaled_gemm(const float* a, bool transpose_a, std::int64_t a_rows, std::int64_t a_cols, const float* b,
                       bool transpose_b, std::int64_t b_rows, std::int64_t b_cols, float* c,
                       const GemmNumerics& numerics);

}  // namespace mpsim::core
