#pragma once
// Every CUDA runtime and cuBLAS call goes through these: a failure throws
// std::runtime_error with the call, where it was made and CUDA's own message.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace mpsim::gpu::detail {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                             cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                             cublasGetStatusName(status) + ": " + cublasGetStatusString(status));
}

// n elements of T in device memory, freed on scope exit (also when a checked
// call throws): scratch and counters of one call.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) {
    if (n > 0) check_cuda(cudaMalloc(&data_, n * sizeof(T)), "cudaMalloc", __FILE__, __LINE__);
  }
  ~DeviceArray() { cudaFree(data_); }  // no throw from a destructor; errors surface at the next checked call
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* data() { return data_; }

 private:
  T* data_ = nullptr;
};

// Grid size for a grid-stride loop over n elements.
inline unsigned blocks_for(std::size_t n, unsigned threads_per_block) {
  const std::size_t wanted = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(wanted < 4096 ? (wanted == 0 ? 1 : wanted) : 4096);
}

}  // namespace mpsim::gpu::detail

#define MPSIM_CUDA_CHECK(call) ::mpsim::gpu::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define MPSIM_CUBLAS_CHECK(call) ::mpsim::gpu::detail::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch errors now, execution errors at the next sync.
#define MPSIM_CUDA_CHECK_LAUNCH() MPSIM_CUDA_CHECK(cudaGetLastError())
