// One output of block_gemm's default model, host and device: the element
// products of each block along k summed exactly, the partial times both
// blocks' scales (exact), added to a binary32 accumulator that starts at +0
// with one rounding per block (round to odd in binary64, then to binary32:
// round_to_odd.hpp). Written once for block_gemm's CUDA kernel
// (gpu/src/block_gemm.cu); tests/emulation/test_block_formats.cpp proves it
// equal to block_gemm on the host.
#pragma once

#include "mpsim/emulation/host_device.hpp"
#include "mpsim/emulation/round_to_odd.hpp"

namespace mpsim {

// a and b: one row of A and one of B^T, k elements each (element values, as
// BlockOperand keeps them); a_scales and b_scales: their blocks' scales along
// k (E8M0 or UE4M3 values; NaN for a NaN block). The binary64 sum of a
// block's products is exact only where the formats' products and the block
// length fit 53 bits (block_partials_fit_binary64, block_gemm.hpp): every
// preset but MXFP8 E5M2. NVFP4's alpha and C are the caller's.
MPSIM_HOST_DEVICE inline float block_scaled_dot(const float* a, const double* a_scales, const float* b,
                                                const double* b_scales, int k, int block) {
  float acc = 0.0f;
  for (int k0 = 0, kb = 0; k0 < k; k0 += block, ++kb) {
    const int end = k0 + block < k ? k0 + block : k;
    double partial = 0.0;
    for (int t = k0; t < end; ++t) partial += static_cast<double>(a[t]) * static_cast<double>(b[t]);
    // + 0.0: an all-zero partial is +0, as an accumulator starting from +0 makes it.
    const double term = (partial + 0.0) * a_scales[kb] * b_scales[kb];
    acc = static_cast<float>(add_round_to_odd(acc, term));
  }
  return acc;
}

}  // namespace mpsim
