#pragma once
// The CUDA training backend ("cuda"): core's Backend on one CUDA device, so
// that the training loop written in core runs on a GPU. No CUDA type appears
// here; docs/gpu.md says what it computes and when it waits for the device.

#include <memory>

#include "mpsim/core/backend.hpp"

namespace mpsim::gpu {

// A backend on device 0. Throws std::runtime_error when there is no CUDA device.
std::unique_ptr<core::Backend> make_cuda_backend();

// Makes core::make_backend("cuda") build one (once, however often called).
void register_cuda_backend();

}  // namespace mpsim::gpu
