#pragma once
// The CUDA training backend ("cuda"): core's Backend on one CUDA device, so
// that the training loop written in core runs on a GPU. No CUDA type appears
// here; docs/gpu.md says what it computes and when it waits for the device.

#include <cstdint>
#include <memory>

#include "mpsim/core/backend.hpp"

namespace mpsim::gpu {

// A backend on device 0. Throws std::runtime_error when there is no CUDA device.
std::unique_ptr<core::Backend> make_cuda_backend();

// Makes core::make_backend("cuda") build one (once, however often called).
void register_cuda_backend();

// The stream a backend made by make_cuda_backend enqueues all its work on, as
// an opaque handle (a cudaStream_t inside gpu/), for gpu/ code that orders or
// times work against it (mpsim/gpu/timing.hpp). std::invalid_argument for any
// other backend.
void* cuda_stream_of(core::Backend& backend);

// How many times the backend has waited for its stream so far (every wait
// goes through one place). Lets tests show that a training step queues its
// work without waiting except when the trainer logs. std::invalid_argument
// for a backend not made by make_cuda_backend.
std::uint64_t cuda_synchronisations(core::Backend& backend);

// Bytes per value a tensor of that backend holds on the device now: 1 or 2
// once a rounding point has rounded it to a format of at most 8 or 16 bits
// (stored in the format's own encoding, device_storage.hpp), 4 (binary32)
// otherwise. std::invalid_argument for a backend not made by make_cuda_backend.
int cuda_storage_bytes(core::Backend& backend, const core::Tensor& tensor);

}  // namespace mpsim::gpu
