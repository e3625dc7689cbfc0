#include <utility>

#include "check.hpp"
#include "mpsim/gpu/device.hpp"

namespace mpsim::gpu {

DeviceInfo query_device() {
  DeviceInfo info;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.description = std::string("no CUDA device: ") + cudaGetErrorString(status);
    return info;
  }
  if (count == 0) {
    info.description = "no CUDA device: the driver reports none";
    return info;
  }
  cudaDeviceProp p{};
  MPSIM_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  int driver = 0;
  MPSIM_CUDA_CHECK(cudaDriverGetVersion(&driver));
  info.available = true;
  info.description = std::string(p.name) + ", compute capability " + std::to_string(p.major) + "." +
                     std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB, driver " +
                     std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
  return info;
}

DeviceBuffer::DeviceBuffer(std::size_t count) : size_(count) {
  if (count > 0) MPSIM_CUDA_CHECK(cudaMalloc(&data_, count * sizeof(float)));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);  // no throw from a destructor; errors surface at the next checked call
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(std::span<const float> values) {
  if (values.size() != size_)
    throw std::invalid_argument("DeviceBuffer::upload: " + std::to_string(values.size()) + " values for a buffer of " +
                                std::to_string(size_));
  if (size_ > 0) MPSIM_CUDA_CHECK(cudaMemcpy(data_, values.data(), size_ * sizeof(float), cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(std::span<float> values) const {
  if (values.size() != size_)
    throw std::invalid_argument("DeviceBuffer::download: room for " + std::to_string(values.size()) +
                                " values, the buffer holds " + std::to_string(size_));
  if (size_ > 0) MPSIM_CUDA_CHECK(cudaMemcpy(values.data(), data_, size_ * sizeof(float), cudaMemcpyDeviceToHost));
}

}  // namespace mpsim::gpu
