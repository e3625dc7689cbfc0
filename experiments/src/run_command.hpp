#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace mpsim::cli {
// Adds `mpsim run CONFIG.toml [key=value ...]`; sets action when chosen.
void add_run_command(CLI::App& app, std::function<int()>& action);
}  // namespace mpsim::cli
