// `mpsim fp ...`: the emulator from the command line.
#pragma once

#include <CLI/CLI.hpp>

namespace mpsim::cli {

// Adds `fp round`, `fp info` and `fp testfloat` to the app. Each sets `run`
// to its action, returning the process exit code.
void add_fp_command(CLI::App& app, std::function<int()>& run);

}  // namespace mpsim::cli
