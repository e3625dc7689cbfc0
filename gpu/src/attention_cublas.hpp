#pragma once
// Attention's four products as batched cuBLAS GEMMs (config
// `train.attention = "cublas"`): one strided-batched call per sample, batched
// over its heads, in binary32 without TF32 (CUBLAS_COMPUTE_32F_PEDANTIC), in
// the order cuBLAS picks. The layouts are numerics_attention.hpp's; the
// products are the same sums as its functions (the kernels' path), the
// masked terms included: a causal mask hides them afterwards (-inf logits,
// zero probability gradients), and their zero probabilities add ±0 terms,
// or NaN where a masked v or output gradient is not finite. tests/gpu
// bounds the difference to the CPU backend by gamma_k.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "mpsim/core/numerics_attention.hpp"

namespace mpsim::gpu::detail {

// Whether the shape has work for cuBLAS (empty shapes take the kernels, which write what an empty product gives).
bool cublas_attention_applies(const core::AttentionShape& s);

void cublas_attention_scores(cublasHandle_t blas, cudaStream_t stream, const float* qkv, const core::AttentionShape& s,
                             float* scores);
void cublas_attention_values(cublasHandle_t blas, const float* probs, const float* qkv, const core::AttentionShape& s,
                             float* out);
void cublas_attention_values_backward(cublasHandle_t blas, cudaStream_t stream, const float* probs, const float* qkv,
                                      const float* dout, const core::AttentionShape& s, float* dprobs, float* dqkv);
void cublas_attention_scores_backward(cublasHandle_t blas, const float* dscores, const float* qkv,
                                      const core::AttentionShape& s, float* dqkv);

}  // namespace mpsim::gpu::detail
