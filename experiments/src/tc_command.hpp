// `mpsim tc ...`: tensor-core and accumulation models from the command line.
#pragma once

#include <CLI/CLI.hpp>

namespace mpsim::cli {

// Adds `tc validate` (a model against measured vectors), `tc dot` (one inner
// product under every model) and `tc sweep` (the error-versus-K study).
void add_tc_command(CLI::App& app, std::function<int()>& run);

}  // namespace mpsim::cli
