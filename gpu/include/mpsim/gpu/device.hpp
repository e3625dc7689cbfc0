#pragma once
// The GPU side of mpsim, first pieces (issue #4): device discovery, the
// emulator's rounding as a kernel, the exponent histogram on the device and
// cuBLAS GEMMs with 16-bit inputs. Device memory is passed as plain float
// pointers (from DeviceBuffer); no CUDA type appears here. Every CUDA and
// cuBLAS call is checked: a failure throws std::runtime_error naming the call,
// the file and line, and CUDA's message.

#include <cstddef>
#include <span>
#include <string>

#include "mpsim/core/stats.hpp"
#include "mpsim/emulation/quantize.hpp"

namespace mpsim::gpu {

struct DeviceInfo {
  bool available = false;
  std::string description;  // name, compute capability, memory, driver; or why there is no device
};
DeviceInfo query_device();

// binary32 values in device memory, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  std::size_t size() const { return size_; }
  void upload(std::span<const float> values);  // sizes must match
  void download(std::span<float> values) const;

 private:
  float* data_ = nullptr;
  std::size_t size_ = 0;
};

// Rounds n binary32 values in device memory in place, as mpsim::quantize does
// on the CPU: same format, mode, stochastic draws (element i draws
// random_draw(key, first_index + i)) and counters. `options.path` and
// `options.threads` are ignored. Requires fits_in_float(format).
QuantizeCounts quantize(const Format& format, float* device_values, std::size_t n, const QuantizeOptions& options);

// Adds the exponent histogram of n binary32 values in device memory to
// `stats`, as TensorStats::add_values does on the CPU.
core::TensorStats::Classes add_values(core::TensorStats& stats, const float* device_values, std::size_t n);

// Row-major c[m x n] = a[m x k] * b[k x n] through cuBLAS with binary32
// accumulation (CUBLAS_COMPUTE_32F). The inputs are first rounded to nearest
// (ties to even) into the input format; binary32 inputs use no Tensor Cores
// unless the input is TF32.
enum class GemmInput { binary32, tf32, binary16, bfloat16 };
void gemm(GemmInput input, const float* a, const float* b, float* c, int m, int n, int k);

}  // namespace mpsim::gpu
