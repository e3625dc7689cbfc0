// Narrow storage (device_storage.hpp). Widening reads a stored tensor back
// as binary32: decode, then the stored scale's inverse applied as the
// rounding kernel would have applied it (one binary32 multiplication, skipped
// when it is 1, so NaN payloads survive as on the CPU): the binary32 values
// the CPU backend holds, bit for bit. Narrowing stores binary32 values that
// are already the format's (weights and optimiser state after their
// rounding) and flags any value that the codes would not give back.
#include "kernels.hpp"
#include "mpsim/gpu/device_storage.hpp"

namespace mpsim::gpu::kernels {
namespace {

template <typename Code>
__global__ void widen_kernel(const Code* codes, DeviceFormat format, const float* descale, float* out,
                             std::int64_t n) {
  const float after = *descale;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    float v = decode_storage(codes[i], format);
    if (after != 1.0f) v = __fmul_rn(v, after);
    out[i] = v;
  }
}

template <typename Code>
__global__ void narrow_kernel(const float* values, DeviceFormat format, Code* codes, float* descale, std::int64_t n,
                              unsigned int* flag) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *descale = 1.0f;
  bool changed = false;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float x = values[i];
    const std::uint32_t code = encode_storage(x, format);
    codes[i] = static_cast<Code>(code);
    changed = changed || __float_as_uint(decode_storage(code, format)) != __float_as_uint(x);
  }
  if (changed) atomicOr(flag, inexact_storage);
}

}  // namespace

void narrow(const float* values, DeviceFormat format, void* codes, float* descale, std::int64_t n, unsigned int* flag,
            cudaStream_t stream) {
  if (storage_bytes(format) == 4) throw std::logic_error("kernels::narrow: the format is not stored narrow");
  if (n == 0) return;
  if (storage_bytes(format) == 1)
    narrow_kernel<<<blocks(n), threads, 0, stream>>>(values, format, static_cast<std::uint8_t*>(codes), descale, n,
                                                     flag);
  else
    narrow_kernel<<<blocks(n), threads, 0, stream>>>(values, format, static_cast<std::uint16_t*>(codes), descale, n,
                                                     flag);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void widen(const void* codes, DeviceFormat format, const float* descale, float* out, std::int64_t n,
           cudaStream_t stream) {
  if (storage_bytes(format) == 4) throw std::logic_error("kernels::widen: the format is not stored narrow");
  if (n == 0) return;
  if (storage_bytes(format) == 1)
    widen_kernel<<<blocks(n), threads, 0, stream>>>(static_cast<const std::uint8_t*>(codes), format, descale, out, n);
  else
    widen_kernel<<<blocks(n), threads, 0, stream>>>(static_cast<const std::uint16_t*>(codes), format, descale, out, n);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
