#pragma once
// Backend "cuda" without linking CUDA into the program: the backend lives in
// the plugin libmpsim_cuda.so (gpu/CMakeLists.txt), loaded on first use.

namespace mpsim::cli {

// Registers "cuda" with core's backend registry when gpu/ was built; a no-op otherwise.
void register_cuda_plugin();

}  // namespace mpsim::cli
