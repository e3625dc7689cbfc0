// The device tests' visible skip: ends the test program with CTest's skip code
// (Skipped, never a silent pass) when there is no usable CUDA device.
#pragma once

#include "mpsim/gpu/device.hpp"
#include "support/test_support.hpp"

namespace mpsim::test {

// Returns the device's description when there is one.
inline const gpu::DeviceInfo& require_device() {
  static const gpu::DeviceInfo info = gpu::query_device();
  if (!info.available) skip("needs a CUDA device: " + info.description);
  return info;
}

}  // namespace mpsim::test
