// Row-major products through column-major cuBLAS: a row-major matrix with
// row stride ld is, read column-major with leading dimension ld, its
// transpose, so row-major C = X Y is column-major C^T = Y^T X^T. Each call
// below names the column-major operands it reads; the comments give the
// row-major product (q, k, v, o of one sample and head; s = scores, p = probs).
#include "attention_cublas.hpp"

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "check.hpp"
#include "kernels.hpp"

namespace mpsim::gpu::detail {
namespace {

int as_int(std::int64_t value, const char* what) {
  if (value < 0 || value > INT_MAX)
    throw std::invalid_argument(std::string("cuda backend: attention through cuBLAS: ") + what + " = " +
                                std::to_string(value) + " does not fit cuBLAS's int");
  return static_cast<int>(value);
}

// A column-major operand of a strided batch: its first matrix, leading dimension and the stride between heads.
struct Operand {
  const float* at;
  std::int64_t ld, stride;
};

struct Batch {
  cublasHandle_t blas;
  int heads;
  // C = alpha op(A) op(B) for every head (m x n, inner dimension k), C's heads `c_stride` apart.
  void operator()(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, Operand a,
                  Operand b, float* c, std::int64_t ldc, std::int64_t c_stride) const {
    const float beta = 0.0f;  // read when the call is made (host pointer mode)
    MPSIM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(m, "m"), as_int(n, "n"),
        as_int(k, "k"), &alpha, a.at, CUDA_R_32F, as_int(a.ld, "lda"), a.stride, b.at, CUDA_R_32F,
        as_int(b.ld, "ldb"), b.stride, &beta, c, CUDA_R_32F, as_int(ldc, "ldc"), c_stride, heads,
        CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
  }
};

// Sample b's views: q, k and v of its first head in the [q | k | v] rows, its scores and its output rows.
struct Sample {
  const core::AttentionShape& s;
  std::int64_t b;
  std::int64_t qkv_ld() const { return 3 * s.width(); }
  std::int64_t qkv_offset(int part) const { return b * s.tokens * qkv_ld() + part * s.width(); }
  std::int64_t scores_offset() const { return b * s.heads * s.tokens * s.tokens; }
  std::int64_t rows_offset() const { return b * s.tokens * s.width(); }
  Operand part(const float* qkv, int which) const { return {qkv + qkv_offset(which), qkv_ld(), s.head_dim}; }
  Operand scores(const float* p) const { return {p + scores_offset(), s.tokens, s.tokens * s.tokens}; }
  Operand rows(const float* o) const { return {o + rows_offset(), s.width(), s.head_dim}; }
};

}  // namespace

bool cublas_attention_applies(const core::AttentionShape& s) {
  return s.batch > 0 && s.tokens > 0 && s.heads > 0 && s.head_dim > 0;
}

void cublas_attention_scores(cublasHandle_t blas, cudaStream_t stream, const float* qkv, const core::AttentionShape& s,
                             float* scores) {
  const Batch batch{blas, as_int(s.heads, "heads")};
  const std::int64_t t = s.tokens, tt = t * t;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const Sample x{s, b};
    // s = (q k^T) * scale: column-major s^T = k q^T.
    batch(true, false, t, t, s.head_dim, s.scale(), x.part(qkv, core::attention_k), x.part(qkv, core::attention_q),
          scores + x.scores_offset(), t, tt);
  }
  kernels::attention_mask(scores, s, -INFINITY, stream);
}

void cublas_attention_values(cublasHandle_t blas, const float* probs, const float* qkv, const core::AttentionShape& s,
                             float* out) {
  const Batch batch{blas, as_int(s.heads, "heads")};
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const Sample x{s, b};
    // o = p v: column-major o^T = v^T p^T.
    batch(false, false, s.head_dim, s.tokens, s.tokens, 1.0f, x.part(qkv, core::attention_v), x.scores(probs),
          out + x.rows_offset(), s.width(), s.head_dim);
  }
}

void cublas_attention_values_backward(cublasHandle_t blas, cudaStream_t stream, const float* probs, const float* qkv,
                                      const float* dout, const core::AttentionShape& s, float* dprobs, float* dqkv) {
  const Batch batch{blas, as_int(s.heads, "heads")};
  const std::int64_t t = s.tokens, tt = t * t;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const Sample x{s, b};
    // dp = do v^T: column-major dp^T = v do^T.
    batch(true, false, t, t, s.head_dim, 1.0f, x.part(qkv, core::attention_v), x.rows(dout),
          dprobs + x.scores_offset(), t, tt);
    // dv = p^T do: column-major dv^T = do^T p, into v's columns of dqkv.
    batch(false, true, s.head_dim, t, t, 1.0f, x.rows(dout), x.scores(probs), dqkv + x.qkv_offset(core::attention_v),
          x.qkv_ld(), s.head_dim);
  }
  kernels::attention_mask(dprobs, s, 0.0f, stream);
}

void cublas_attention_scores_backward(cublasHandle_t blas, const float* dscores, const float* qkv,
                                      const core::AttentionShape& s, float* dqkv) {
  const Batch batch{blas, as_int(s.heads, "heads")};
  const std::int64_t t = s.tokens;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const Sample x{s, b};
    // dq = (ds k) * scale: column-major dq^T = k^T ds^T.
    batch(false, false, s.head_dim, t, t, s.scale(), x.part(qkv, core::attention_k), x.scores(dscores),
          dqkv + x.qkv_offset(core::attention_q), x.qkv_ld(), s.head_dim);
    // dk = (ds^T q) * scale: column-major dk^T = q^T ds.
    batch(false, true, s.head_dim, t, t, s.scale(), x.part(qkv, core::attention_q), x.scores(dscores),
          dqkv + x.qkv_offset(core::attention_k), x.qkv_ld(), s.head_dim);
  }
}

}  // namespace mpsim::gpu::detail
