#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace mpsim::cli {
// Adds `mpsim docs configs|steps|eval`: the field tables as markdown (the
// generated blocks of docs/configs.md and docs/hdf5-schema.md); sets action when chosen.
void add_docs_command(CLI::App& app, std::function<int()>& action);
}  // namespace mpsim::cli
