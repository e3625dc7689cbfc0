// GEMMs through cuBLAS with binary32 accumulation. 16-bit inputs are stored
// as __half / __nv_bfloat16 after one round-to-nearest-even conversion (the
// hardware conversion, correctly rounded, subnormals kept: the emulator's
// nearest-even rounding into binary16 / bfloat16).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "check.hpp"
#include "mpsim/gpu/device.hpp"

namespace mpsim::gpu {
namespace {

template <typename T>
__global__ void convert(const float* in, T* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __half>) out[i] = __float2half_rn(in[i]);
    else out[i] = __float2bfloat16_rn(in[i]);
  }
}

// One cuBLAS handle for the process, created on first use.
cublasHandle_t handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    Handle() { MPSIM_CUBLAS_CHECK(cublasCreate(&h)); }
    ~Handle() { cublasDestroy(h); }  // at exit; nothing to report to
  };
  static Handle handle;
  return handle.h;
}

template <typename T>
void gemm_16bit(cudaDataType_t type, const float* a, const float* b, float* c, int m, int n, int k) {
  const auto size_a = static_cast<std::size_t>(m) * k, size_b = static_cast<std::size_t>(k) * n;
  detail::DeviceArray<T> a16(size_a), b16(size_b);
  constexpr unsigned threads = 256;
  convert<T><<<detail::blocks_for(size_a, threads), threads>>>(a, a16.data(), size_a);
  MPSIM_CUDA_CHECK_LAUNCH();
  convert<T><<<detail::blocks_for(size_b, threads), threads>>>(b, b16.data(), size_b);
  MPSIM_CUDA_CHECK_LAUNCH();
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C = A B is column-major C^T = B^T A^T.
  MPSIM_CUBLAS_CHECK(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b16.data(), type, n, a16.data(),
                                  type, k, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  MPSIM_CUDA_CHECK(cudaDeviceSynchronize());  // the scratch buffers are freed on return
}

}  // namespace

void gemm(GemmInput input, const float* a, const float* b, float* c, int m, int n, int k) {
  if (m <= 0 || n <= 0 || k <= 0)
    throw std::invalid_argument("gpu::gemm: sizes must be positive, got m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
  const float alpha = 1.0f, beta = 0.0f;
  switch (input) {
    case GemmInput::binary32:
      // PEDANTIC: binary32 products and sums, never TF32, whatever the handle's math mode.
      MPSIM_CUBLAS_CHECK(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_32F, n, a,
                                      CUDA_R_32F, k, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_PEDANTIC,
                                      CUBLAS_GEMM_DEFAULT));
      return;
    case GemmInput::tf32: {
      // The library's own conversion to TF32 is not documented to round to
      // nearest-even: round copies first (the emulator's rounding), so that its
      // conversion is exact and the result does not depend on it.
      const auto size_a = static_cast<std::size_t>(m) * k, size_b = static_cast<std::size_t>(k) * n;
      detail::DeviceArray<float> a32(size_a), b32(size_b);
      MPSIM_CUDA_CHECK(cudaMemcpy(a32.data(), a, size_a * sizeof(float), cudaMemcpyDeviceToDevice));
      MPSIM_CUDA_CHECK(cudaMemcpy(b32.data(), b, size_b * sizeof(float), cudaMemcpyDeviceToDevice));
      quantize(formats::tf32, a32.data(), size_a, {});
      quantize(formats::tf32, b32.data(), size_b, {});
      MPSIM_CUBLAS_CHECK(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b32.data(), CUDA_R_32F, n,
                                      a32.data(), CUDA_R_32F, k, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32,
                                      CUBLAS_GEMM_DEFAULT));
      MPSIM_CUDA_CHECK(cudaDeviceSynchronize());  // the scratch buffers are freed on return
      return;
    }
    case GemmInput::binary16: return gemm_16bit<__half>(CUDA_R_16F, a, b, c, m, n, k);
    case GemmInput::bfloat16: return gemm_16bit<__nv_bfloat16>(CUDA_R_16BF, a, b, c, m, n, k);
  }
}

}  // namespace mpsim::gpu
