// The CUDA backend plugin's entry points (gpu/CMakeLists.txt): `mpsim` looks
// them up with dlsym after loading libmpsim_cuda.so.
#include "mpsim/gpu/backend.hpp"
#include "mpsim_revision.h"  // generated at build time (cmake/WriteRevision.cmake)

// A new backend on device 0, owned by the caller; throws std::runtime_error
// without a CUDA device (make_cuda_backend).
// The version and revision it was built at: the program loads only its own.
extern "C" __attribute__((visibility("default"))) const char* mpsim_plugin_build() { return MPSIM_BUILD_ID; }

extern "C" __attribute__((visibility("default"))) mpsim::core::Backend* mpsim_make_cuda_backend() {
  return mpsim::gpu::make_cuda_backend().release();
}
