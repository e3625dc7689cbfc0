// The random Hadamard transform that NVIDIA's NVFP4 recipe applies to the
// inputs of weight-gradient GEMMs before quantizing them (arXiv 2509.25149,
// §4.2): along each row, every chunk of 16 values x becomes x Q with
// Q = D H / 4, H the 16 x 16 Sylvester-Hadamard matrix and D a diagonal of
// random signs (one sign vector per seed, shared by all chunks). Q is
// orthogonal, so transforming both operands of a GEMM along k leaves the
// product: (A Q)(B^T Q)^T = A B, exact up to rounding. It spreads an outlier
// over its chunk, which shrinks the block's amax against its typical values.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace mpsim {

constexpr int kHadamardSize = 16;

// The seed's 16 signs (+1 or -1), from the counter-based draws of
// rounding.hpp (stream 0x4841444D), so CPU and GPU can share them.
std::array<float, kHadamardSize> hadamard_signs(std::uint64_t seed);

// x (rows x cols, row-major, cols a multiple of 16) -> x Q in place, or with
// `inverse` x Q^T (which undoes it). Each output is computed in binary64 by
// the fast Walsh-Hadamard transform and rounded once to binary32: correctly
// rounded whenever the binary64 sums are exact (the 16 inputs span fewer than
// 26 binades, as in every tensor we train). Throws std::invalid_argument
// when cols is not a multiple of 16 or the sizes differ.
void random_hadamard(std::span<float> x, std::int64_t rows, std::int64_t cols, std::uint64_t seed, bool inverse = false);

}  // namespace mpsim
