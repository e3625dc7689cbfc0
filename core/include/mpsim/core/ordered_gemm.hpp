#pragma once
// The CPU backend's default binary32 GEMM: one fixed order of operations, so
// that the same operands give the same bits on every x86-64 CPU, SIMD target
// (AVX-512, AVX2, SSE4, the portable one), thread count and run. OpenBLAS
// picks its kernel by CPU model and splits k over threads, so its sums are
// added in an order that changes from machine to machine (issue 18).
//
// The order (round to nearest even, binary32, no fused multiply-add):
//
//   c[i][j] = fl( ... fl( fl(+0 + fl(A[i][0] * B[0][j])) + fl(A[i][1] * B[1][j]) ) ... + fl(A[i][k-1] * B[k-1][j]) )
//
// every product rounded to binary32 and then added to the running sum, k in
// increasing order; +0 for k = 0. Each output element is one such chain,
// computed by one thread: the kernel vectorises across output elements (each
// lane holds a different c[i][j]), blocks k (the running sum is stored in c and
// reloaded, which continues the same chain), and splits c into tiles of rows
// (and of columns, when it has few rows) over threads, so neither the vector
// width nor the thread count can change a bit.
// The file is compiled with -ffp-contract=off: no multiply-add is fused.

#include <cstdint>
#include <string_view>

namespace mpsim::core {

// c [m x n, row-major] = op(a) * op(b). a is row-major [m x k], or [k x m]
// when transpose_a; b is row-major [k x n], or [n x k] when transpose_b. c
// must not overlap a or b. threads <= 1 runs on the calling thread; more use
// an OpenMP team (the bits are the same).
void ordered_gemm(const float* a, bool transpose_a, const float* b, bool transpose_b, float* c, std::int64_t m,
                  std::int64_t n, std::int64_t k, int threads);

// The Highway target ordered_gemm runs on this CPU now ("AVX3_ZEN4", "AVX2", ...).
std::string_view ordered_gemm_target();

}  // namespace mpsim::core
