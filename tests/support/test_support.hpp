// Helpers shared by the test programs: the shared/ folder and visible skips.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace mpsim::test {

// The shared/ folder with conformance vectors: $MPSIM_SHARED_DIR if set, else
// the build's default (../shared beside the project). Nothing when absent.
std::optional<std::filesystem::path> shared_dir();

// Ends the current test process with CTest's skip code after saying why.
// Use only in a test case that CTest runs on its own.
[[noreturn]] void skip(std::string_view reason);

// Checks `text` against the golden file `path` (tests/golden/), after
// writing it there when MPSIM_UPDATE_GOLDEN is set: how a golden is
// regenerated after an intended change.
void check_golden(const std::filesystem::path& path, const std::string& text);

// SplitMix64 (Steele, Lea and Flood 2014), written out for test inputs that
// do not depend on a standard library's distributions.
struct SplitMix {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

}  // namespace mpsim::test
