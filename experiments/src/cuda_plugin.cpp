#include "cuda_plugin.hpp"

#include <fmt/core.h>

#ifdef MPSIM_WITH_CUDA
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim_revision.h"  // generated at build time (cmake/WriteRevision.cmake)
#endif

#include "mpsim/core/backend.hpp"

namespace mpsim::cli {

#ifdef MPSIM_WITH_CUDA
namespace {

namespace fs = std::filesystem;

// The version and revision this program was built at; the plugin must say the same.
constexpr std::string_view kBuild = MPSIM_BUILD_ID;

// Where the plugin may be, in order: $MPSIM_CUDA_PLUGIN; beside an installed
// program (<prefix>/bin/mpsim -> <prefix>/lib/mpsim/libmpsim_cuda.so); in a
// build tree, wherever it was moved (<build>/experiments/mpsim ->
// <build>/gpu/libmpsim_cuda.so, as tools/gpu_bundle.sh packs it); where the
// build put it.
std::vector<fs::path> plugin_candidates() {
  std::vector<fs::path> paths;
  if (const char* env = std::getenv("MPSIM_CUDA_PLUGIN"); env && *env) paths.emplace_back(env);
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back(self.parent_path().parent_path() / MPSIM_CUDA_PLUGIN_INSTALLED);
    paths.push_back(self.parent_path().parent_path() / "gpu" / "libmpsim_cuda.so");
  }
  paths.emplace_back(MPSIM_CUDA_PLUGIN_BUILT);
  return paths;
}

using MakeBackend = core::Backend* (*)();
using PluginBuild = const char* (*)();

// Loads the plugin once (RTLD_NOW: a missing symbol shows here, not mid-run).
// Only a plugin of this very build is taken: the Backend interface it
// implements must be this program's. A path in MPSIM_CUDA_PLUGIN is the only
// one tried.
MakeBackend plugin_factory() {
  static const MakeBackend factory = [] {
    std::string tried;
    const bool from_environment = std::getenv("MPSIM_CUDA_PLUGIN") && *std::getenv("MPSIM_CUDA_PLUGIN");
    for (const fs::path& path : plugin_candidates()) {
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        tried += fmt::format("\n  {}: not there", path.string());
      } else if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL); !handle) {
        tried += fmt::format("\n  {}: {}", path.string(), dlerror());
      } else {
        const auto build = reinterpret_cast<PluginBuild>(dlsym(handle, "mpsim_plugin_build"));
        const auto make = reinterpret_cast<MakeBackend>(dlsym(handle, "mpsim_make_cuda_backend"));
        if (build && make && std::string_view(build()) == kBuild) return make;
        tried += fmt::format("\n  {}: {}", path.string(),
                             build ? fmt::format("built at {}, this program at {}", build(), kBuild)
                                   : std::string("not an mpsim CUDA plugin"));
        dlclose(handle);
      }
      if (from_environment) break;
    }
    throw std::runtime_error("the CUDA backend's plugin libmpsim_cuda.so did not load (set MPSIM_CUDA_PLUGIN to "
                             "the one built with this program); tried:" + tried);
  }();
  return factory;
}

std::unique_ptr<core::Backend> make_cuda_backend() { return std::unique_ptr<core::Backend>(plugin_factory()()); }

}  // namespace

void register_cuda_plugin() { core::register_backend("cuda", &make_cuda_backend); }
#else
void register_cuda_plugin() {}
#endif

}  // namespace mpsim::cli
