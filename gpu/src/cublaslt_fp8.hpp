#pragma once
// cuBLASLt's FP8 GEMM, written once for the FP8 tensor-core check
// (fp8_gemm_check.cu), the DeepSeek-V3 block GEMM (tensor_core_block_gemm.cu)
// and, through LtMatmul, Blackwell's block-scaled GEMM (blackwell_block_gemm.cu):
// row-major C (m x n, leading dimension ldc) = A (m x k) B (k x n), A given as
// m rows of FP8 codes with k contiguous (leading dimension lda), B as B^T, n
// rows of k contiguous codes (ldb): "TN" in cuBLASLt's column-major terms, the
// only layout its FP8 and block-scaled kernels take. Binary32 C and D, no
// epilogue; cublaslt_fp8_matmul's scales are 1. Device pointers; m, n, k, the
// leading dimensions and the pointers' offsets multiples of 16. Private to gpu/.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "mpsim/gpu/tensor_core_check.hpp"  // Fp8

namespace mpsim::gpu::detail {

struct LtChoice {
  bool ran = false;
  std::string why_not;  // when cuBLASLt offers no algorithm
  int algorithm_id = -1, split_k = -1;
};

// One cuBLASLt matmul in the layout above (row-major C = alpha A B, A and B^T
// with k contiguous, binary32 C and D, beta 0), shared by the FP8 and the
// block-scaled GEMMs: its descriptors, released with it; settings of the
// operation (fast accumulation, scale modes and pointers) with set() before
// run(). One handle and workspace per process.
class LtMatmul {
 public:
  LtMatmul(cudaDataType a_type, int lda, cudaDataType b_type, int ldb, int ldc, int m, int n, int k);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  void set(cublasLtMatmulDescAttributes_t attribute, const void* value, std::size_t bytes);
  // With the first of the heuristic's algorithms that does not split k (a
  // split sums the parts in another order than the tensor-core rules say); on
  // the default stream, waiting for it. Not run (why_not) when there is none.
  LtChoice run(const void* a, const void* bt, float* c, float alpha);

 private:
  void release();
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t first_ = nullptr, second_ = nullptr, out_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
};

// fast_accumulation: CUBLASLT_MATMUL_DESC_FAST_ACCUM (the tensor core's own
// accumulator along all of k); otherwise cuBLASLt promotes to binary32 every
// 128 products (docs/tensor_cores.md, "FP8 on the H100 itself"). Runs on the
// default stream and waits for it.
LtChoice cublaslt_fp8_matmul(Fp8 a_type, const std::uint8_t* a, int lda, Fp8 b_type, const std::uint8_t* bt, int ldb,
                             float* c, int ldc, int m, int n, int k, bool fast_accumulation);

// x's FP8 code; std::invalid_argument naming `what` when x is not a value of
// the format (NaN maps to a NaN code).
std::uint8_t fp8_code(float x, Fp8 t, const char* what);

}  // namespace mpsim::gpu::detail
