// GEMM helpers: the conversions that feed cuBLAS 16-bit Tensor Core inputs
// (checking that no value changes, since the backend chose the type from
// formats the values are promised to be exact in), the TF32 check, and the
// GEMM that rounds after every multiply-add, one thread per output element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels.hpp"
#include "round_binary64.hpp"

namespace mpsim::gpu::kernels {
namespace {

__device__ inline bool is_nan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }

template <typename T>
__global__ void convert_kernel(const float* in, T* out, std::int64_t n, unsigned int* flag, unsigned int bit) {
  bool changed = false;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float x = in[i];
    float back;
    if constexpr (std::is_same_v<T, __half>) {
      const __half h = __float2half_rn(x);
      out[i] = h;
      back = __half2float(h);
    } else {
      const __nv_bfloat16 h = __float2bfloat16_rn(x);
      out[i] = h;
      back = __bfloat162float(h);
    }
    changed = changed || (__float_as_uint(back) != __float_as_uint(x) && !is_nan(x));
  }
  if (changed) atomicOr(flag, bit);
}

// TF32 keeps 10 of binary32's 23 trailing significand bits (and its exponent range).
__global__ void check_tf32_kernel(const float* in, std::int64_t n, unsigned int* flag) {
  bool changed = false;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const unsigned int bits = __float_as_uint(in[i]);
    changed = changed || ((bits & 0x7f800000u) != 0x7f800000u && (bits & 0x1fffu) != 0);
  }
  if (changed) atomicOr(flag, inexact_tf32);
}

__global__ void gemm_every_addition_kernel(const float* a, const float* b, float* c, GemmShape s, DeviceFormat format,
                                           DeviceRounding rounding, Draws draws) {
  const bool stochastic = rounding.mode == device_mode::stochastic;
  const PatternFormat<std::uint64_t> wide = widen_format(format);
  const std::int64_t total = s.m * s.n;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t i = t / s.n, j = t % s.n;
    double acc = 0.0;
    for (std::int64_t kk = 0; kk < s.k; ++kk) {
      const float aik = s.transpose_a ? a[kk * s.a_cols + i] : a[i * s.a_cols + kk];
      const float bkj = s.transpose_b ? b[j * s.b_cols + kk] : b[kk * s.b_cols + j];
      // The product of two binary32 values is exact in binary64; the sum is rounded to odd, then once to the format.
      acc = add_round_to_odd(acc, __dmul_rn(static_cast<double>(aik), static_cast<double>(bkj)));
      const std::uint64_t index = draws.first_index + static_cast<std::uint64_t>((i * s.k + kk) * s.n + j);
      const std::uint32_t draw = stochastic ? device_random_draw(draws.key_low, draws.key_high, index) : 0u;
      acc = static_cast<double>(round_double(acc, wide, rounding, draw).value);
    }
    c[t] = static_cast<float>(acc);  // a format value: exact
  }
}

}  // namespace

void convert_for_gemm(const float* in, void* out, std::int64_t n, bool bfloat16, unsigned int* flag,
                      cudaStream_t stream) {
  if (n <= 0) return;
  if (bfloat16)
    convert_kernel<<<blocks(n), threads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n, flag, inexact_bfloat16);
  else
    convert_kernel<<<blocks(n), threads, 0, stream>>>(in, static_cast<__half*>(out), n, flag, inexact_binary16);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void check_tf32(const float* in, std::int64_t n, unsigned int* flag, cudaStream_t stream) {
  if (n <= 0) return;
  check_tf32_kernel<<<blocks(n), threads, 0, stream>>>(in, n, flag);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void gemm_rounding_every_addition(const float* a, const float* b, float* c, const GemmShape& shape,
                                  DeviceFormat format, DeviceRounding rounding, Draws draws, cudaStream_t stream) {
  const std::int64_t total = shape.m * shape.n;
  if (total <= 0) return;
  gemm_every_addition_kernel<<<blocks(total), threads, 0, stream>>>(a, b, c, shape, format, rounding, draws);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
