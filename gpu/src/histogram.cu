// The exponent histogram on the device: per-block counts in shared memory,
// merged into 64-bit global counters; the same bins as TensorStats::add_values.
#include <array>

#include "check.hpp"
#include "launch.hpp"
#include "mpsim/gpu/device.hpp"

namespace mpsim::gpu {
namespace detail {
namespace {

__global__ void count_fields(const float* values, std::size_t n, unsigned long long* out) {
  __shared__ unsigned int counts[histogram_bins];
  for (int i = threadIdx.x; i < histogram_bins; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    count_value(values[i], counts);
  __syncthreads();
  for (int i = threadIdx.x; i < histogram_bins; i += blockDim.x)
    if (counts[i] != 0) atomicAdd(&out[i], static_cast<unsigned long long>(counts[i]));
}

}  // namespace

void launch_histogram(const float* values, std::size_t n, unsigned long long* bins, cudaStream_t stream) {
  if (n == 0) return;
  constexpr unsigned threads = 256;
  count_fields<<<blocks_for(n, threads), threads, 0, stream>>>(values, n, bins);
  MPSIM_CUDA_CHECK_LAUNCH();
}

core::TensorStats::FieldCounts field_counts_of(const unsigned long long* host) {
  core::TensorStats::FieldCounts c;
  for (int e = 0; e < field_bins; ++e) c.field[e] = host[e];
  for (int k = 0; k < subnormal_bins; ++k) c.subnormal[k] = host[field_bins + k];
  c.infinite = host[infinite_bin];
  c.nan = host[nan_bin];
  return c;
}

}  // namespace detail

core::TensorStats::Classes add_values(core::TensorStats& stats, const float* device_values, std::size_t n) {
  core::TensorStats::FieldCounts c;
  if (n > 0) {
    detail::DeviceArray<unsigned long long> counts(detail::histogram_bins);
    std::array<unsigned long long, detail::histogram_bins> host{};
    MPSIM_CUDA_CHECK(cudaMemset(counts.data(), 0, sizeof host));
    detail::launch_histogram(device_values, n, counts.data(), nullptr);  // the legacy default stream
    MPSIM_CUDA_CHECK(cudaMemcpy(host.data(), counts.data(), sizeof host, cudaMemcpyDeviceToHost));
    c = detail::field_counts_of(host.data());
  }
  return stats.add_field_counts(c);
}

}  // namespace mpsim::gpu
