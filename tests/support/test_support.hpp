// Helpers shared by the test programs: the shared/ folder and visible skips.
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

namespace mpsim::test {

// The shared/ folder with conformance vectors: $MPSIM_SHARED_DIR if set, else
// the build's default (../shared beside the project). Nothing when absent.
std::optional<std::filesystem::path> shared_dir();

// Ends the current test process with CTest's skip code after saying why.
// Use only in a test case that CTest runs on its own.
[[noreturn]] void skip(std::string_view reason);

}  // namespace mpsim::test
