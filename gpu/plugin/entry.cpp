// The CUDA backend plugin's one entry point (gpu/CMakeLists.txt): `mpsim`
// looks it up with dlsym after loading libmpsim_cuda.so.
#include "mpsim/gpu/backend.hpp"

// A new backend on device 0, owned by the caller; throws std::runtime_error
// without a CUDA device (make_cuda_backend).
extern "C" __attribute__((visibility("default"))) mpsim::core::Backend* mpsim_make_cuda_backend() {
  return mpsim::gpu::make_cuda_backend().release();
}
