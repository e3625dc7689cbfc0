// The emulator's rounding as a kernel: the same device-portable rounding
// (device_rounding.hpp, checked bit for bit against the emulator on the CPU by
// tests/gpu/test_device_rounding.cpp), the same counter-based stochastic draws,
// the same counters, reduced per warp and added once per block. The CUDA
// backend runs the same kernel on its stream, with the per-tensor scaling, the
// amax of delayed scaling and the histogram of its statistics folded in, so a
// rounding point is one pass over the tensor.
#include "check.hpp"
#include "launch.hpp"
#include "mpsim/gpu/device.hpp"
#include "mpsim/gpu/device_format.hpp"
#include "mpsim/gpu/device_rounding.hpp"
#include "mpsim/gpu/device_storage.hpp"

namespace mpsim::gpu {
namespace detail {
namespace {

// A multiple of the warp size, so that every warp is full for the reductions.
constexpr unsigned round_threads = 256;

__global__ void round_in_place(float* values, std::size_t n, RoundLaunch p) {
  if (p.skip && *p.skip) return;  // the whole grid: before any barrier
  if (p.device_scale) {
    p.before = *p.device_scale;
    p.after = 1.0f / p.before;  // exact: a power of two
    p.scale_before = p.scale_after = p.before != 1.0f;
  }
  __shared__ unsigned int bins[histogram_bins];
  if (p.bins) {  // the same for the whole block: the barriers below are reached by every thread or none
    for (int b = threadIdx.x; b < histogram_bins; b += blockDim.x) bins[b] = 0;
    __syncthreads();
  }
  const int store_bytes = p.store ? storage_bytes(p.format) : 4;
  if (p.store && blockIdx.x == 0 && threadIdx.x == 0) *p.store_descale = p.scale_after ? p.after : 1.0f;
  unsigned int local[rounding_counter_count] = {};
  unsigned int largest = 0;
  const bool stochastic = p.rounding.mode == device_mode::stochastic;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float x = values[i];
    if (p.amax) largest = max(largest, core::amax_key(x));  // NaN ignored, as the CPU's amax_of
    if (p.scale_before) x = __fmul_rn(x, p.before);
    if (p.bins) count_value(x, bins);
    if (p.round) {
      const std::uint32_t draw = stochastic ? device_random_draw(p.key_low, p.key_high, p.first_index + i) : 0u;
      const RoundedFloat r = round_float(x, p.format, p.rounding, draw);
      x = r.value;
      local[counter::inexact] += r.inexact;
      local[counter::flushed] += r.flushed_to_zero;
      local[counter::subnormal] += r.subnormal;
      local[counter::overflow] += r.overflow;
      local[counter::nan] += r.nan;
      // Counted before unscaling, as the CPU does.
      local[counter::infinite] += core::is_infinite_magnitude(core::magnitude_bits(x));
    }
    if (p.store) {
      const std::uint32_t code = encode_storage(x, p.format);  // x is a value of the format: exact
      if (store_bytes == 1) static_cast<std::uint8_t*>(p.store)[i] = static_cast<std::uint8_t>(code);
      else static_cast<std::uint16_t*>(p.store)[i] = static_cast<std::uint16_t>(code);
      continue;
    }
    if (p.scale_after) x = __fmul_rn(x, p.after);
    values[i] = x;
  }
  if (p.counters) {
    for (int c = 0; c < rounding_counter_count; ++c) {
      const unsigned int warp_sum = __reduce_add_sync(0xffffffffu, local[c]);
      if ((threadIdx.x & 31) == 0 && warp_sum != 0)
        atomicAdd(&p.counters[c], static_cast<unsigned long long>(warp_sum));
    }
  }
  if (p.amax) {
    const unsigned int warp_max = __reduce_max_sync(0xffffffffu, largest);
    if ((threadIdx.x & 31) == 0 && warp_max != 0) atomicMax(p.amax, warp_max);
  }
  if (p.bins) {
    __syncthreads();
    for (int b = threadIdx.x; b < histogram_bins; b += blockDim.x)
      if (bins[b] != 0) atomicAdd(&p.bins[b], static_cast<unsigned long long>(bins[b]));
  }
}

}  // namespace

void launch_round(float* values, std::size_t n, const RoundLaunch& launch, cudaStream_t stream) {
  if (n == 0) return;
  if (launch.store && (!launch.round || launch.skip || !launch.store_descale || storage_bytes(launch.format) == 4))
    throw std::logic_error("launch_round: narrow storage needs a rounding to a format of at most 16 bits, a descale "
                           "slot and no skip gate");
  round_in_place<<<blocks_for(n, round_threads), round_threads, 0, stream>>>(values, n, launch);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

QuantizeCounts quantize(const Format& format, float* device_values, std::size_t n, const QuantizeOptions& options) {
  detail::RoundLaunch launch;
  launch.format = make_device_format(format);              // throws unless fits_in_float(format)
  launch.rounding = make_device_rounding(options.rounding);  // throws unless random_bits in 1..32
  QuantizeCounts counts;
  counts.elements = n;
  if (n == 0) return counts;
  const DrawKey key = make_draw_key(options.stochastic.key);
  launch.key_low = key.low;
  launch.key_high = key.high;
  launch.first_index = options.stochastic.first_index;
  detail::DeviceArray<unsigned long long> counters(detail::rounding_counter_count);
  unsigned long long host[detail::rounding_counter_count] = {};
  MPSIM_CUDA_CHECK(cudaMemset(counters.data(), 0, sizeof host));
  launch.counters = counters.data();
  detail::launch_round(device_values, n, launch, nullptr);  // the legacy default stream, like the copies around it
  MPSIM_CUDA_CHECK(cudaMemcpy(host, counters.data(), sizeof host, cudaMemcpyDeviceToHost));
  counts.inexact = host[detail::counter::inexact];
  counts.flushed_to_zero = host[detail::counter::flushed];
  counts.subnormal = host[detail::counter::subnormal];
  counts.overflow = host[detail::counter::overflow];
  counts.nan = host[detail::counter::nan];
  return counts;
}

}  // namespace mpsim::gpu
