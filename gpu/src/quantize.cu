// The emulator's rounding as a kernel: the same device-portable rounding
// (device_rounding.hpp, checked bit for bit against the emulator on the CPU by
// tests/gpu/test_device_rounding.cpp), the same counter-based stochastic draws,
// the same counters, reduced per warp and added once per block.
#include "check.hpp"
#include "mpsim/gpu/device.hpp"
#include "mpsim/gpu/device_format.hpp"
#include "mpsim/gpu/device_rounding.hpp"

namespace mpsim::gpu {
namespace {

constexpr int counter_count = 5;  // inexact, flushed, subnormal, overflow, nan

__global__ void round_in_place(float* values, std::size_t n, DeviceFormat format, DeviceRounding rounding,
                               std::uint32_t key_low, std::uint32_t key_high, std::uint64_t first_index,
                               unsigned long long* counters) {
  unsigned int local[counter_count] = {};
  const bool stochastic = rounding.mode == static_cast<std::uint8_t>(RoundingMode::stochastic);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t draw = stochastic ? device_random_draw(key_low, key_high, first_index + i) : 0u;
    const RoundedFloat r = round_float(values[i], format, rounding, draw);
    values[i] = r.value;
    local[0] += r.inexact;
    local[1] += r.flushed_to_zero;
    local[2] += r.subnormal;
    local[3] += r.overflow;
    local[4] += r.nan;
  }
  for (int c = 0; c < counter_count; ++c) {
    const unsigned int warp_sum = __reduce_add_sync(0xffffffffu, local[c]);
    if ((threadIdx.x & 31) == 0 && warp_sum != 0) atomicAdd(&counters[c], static_cast<unsigned long long>(warp_sum));
  }
}

}  // namespace

QuantizeCounts quantize(const Format& format, float* device_values, std::size_t n, const QuantizeOptions& options) {
  const DeviceFormat device_format = make_device_format(format);       // throws unless fits_in_float(format)
  const DeviceRounding rounding = make_device_rounding(options.rounding);  // throws unless random_bits in 1..32
  QuantizeCounts counts;
  counts.elements = n;
  if (n == 0) return counts;
  const DrawKey key = make_draw_key(options.stochastic.key);
  detail::DeviceArray<unsigned long long> counters(counter_count);
  unsigned long long host[counter_count] = {};
  MPSIM_CUDA_CHECK(cudaMemset(counters.data(), 0, sizeof host));
  constexpr unsigned threads = 256;  // a multiple of the warp size: every warp is full for the reduction
  const unsigned blocks = detail::blocks_for(n, threads);
  round_in_place<<<blocks, threads>>>(device_values, n, device_format, rounding, key.low, key.high,
                                      options.stochastic.first_index, counters.data());
  MPSIM_CUDA_CHECK_LAUNCH();
  MPSIM_CUDA_CHECK(cudaMemcpy(host, counters.data(), sizeof host, cudaMemcpyDeviceToHost));
  counts.inexact = host[0];
  counts.flushed_to_zero = host[1];
  counts.subnormal = host[2];
  counts.overflow = host[3];
  counts.nan = host[4];
  return counts;
}

}  // namespace mpsim::gpu
