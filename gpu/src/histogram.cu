// The exponent histogram on the device: per-block counts in shared memory,
// merged into 64-bit global counters; the same bins as TensorStats::add_values.
#include <array>

#include "check.hpp"
#include "mpsim/gpu/device.hpp"

namespace mpsim::gpu {
namespace {

constexpr int field_bins = 256, subnormal_bins = 23;
constexpr int bins = field_bins + subnormal_bins + 2;  // + infinite, NaN

__global__ void count_fields(const float* values, std::size_t n, unsigned long long* out) {
  __shared__ unsigned int counts[bins];
  for (int i = threadIdx.x; i < bins; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const unsigned int bits = __float_as_uint(values[i]) & 0x7fffffffu;
    atomicAdd(&counts[bits >> 23], 1u);
    if (bits != 0 && bits < 0x800000u) atomicAdd(&counts[field_bins + 31 - __clz(bits)], 1u);  // 2^(k - 149)
    if (bits == 0x7f800000u) atomicAdd(&counts[field_bins + subnormal_bins], 1u);
    if (bits > 0x7f800000u) atomicAdd(&counts[field_bins + subnormal_bins + 1], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < bins; i += blockDim.x)
    if (counts[i] != 0) atomicAdd(&out[i], static_cast<unsigned long long>(counts[i]));
}

}  // namespace

core::TensorStats::Classes add_values(core::TensorStats& stats, const float* device_values, std::size_t n) {
  core::TensorStats::FieldCounts c;
  if (n > 0) {
    detail::DeviceArray<unsigned long long> counts(bins);
    std::array<unsigned long long, bins> host{};
    MPSIM_CUDA_CHECK(cudaMemset(counts.data(), 0, sizeof host));
    constexpr unsigned threads = 256;
    count_fields<<<detail::blocks_for(n, threads), threads>>>(device_values, n, counts.data());
    MPSIM_CUDA_CHECK_LAUNCH();
    MPSIM_CUDA_CHECK(cudaMemcpy(host.data(), counts.data(), sizeof host, cudaMemcpyDeviceToHost));
    for (int e = 0; e < field_bins; ++e) c.field[e] = host[e];
    for (int k = 0; k < subnormal_bins; ++k) c.subnormal[k] = host[field_bins + k];
    c.infinite = host[field_bins + subnormal_bins];
    c.nan = host[field_bins + subnormal_bins + 1];
  }
  return stats.add_field_counts(c);
}

}  // namespace mpsim::gpu
