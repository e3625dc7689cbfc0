// Bad input from the command line: reported with exit code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace mpsim::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline constexpr int usage_exit_code = 2;

}  // namespace mpsim::cli
