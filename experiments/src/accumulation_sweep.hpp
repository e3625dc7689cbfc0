// `mpsim tc sweep CONFIG.toml`: the error of dot products and GEMMs against
// the exact result as K grows, per accumulation model, input format and input
// distribution (issue #5's numerical study; notebooks/accumulation.ipynb
// plots it against the deterministic and probabilistic bounds).
#pragma once

#include <CLI/CLI.hpp>

namespace mpsim::cli {

void add_sweep_subcommand(CLI::App& tc, std::function<int()>& run);

}  // namespace mpsim::cli
