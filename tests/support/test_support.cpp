#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace mpsim::test {

std::optional<std::filesystem::path> shared_dir() {
  const char* env = std::getenv("MPSIM_SHARED_DIR");
  std::filesystem::path dir = env != nullptr ? env : MPSIM_SHARED_DIR;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return std::nullopt;
  return std::filesystem::canonical(dir, ec);
}

void skip(std::string_view reason) {
  std::printf("SKIPPED: %.*s\n", static_cast<int>(reason.size()), reason.data());
  std::fflush(stdout);
  std::_Exit(MPSIM_SKIP_CODE);
}

void check_golden(const std::filesystem::path& path, const std::string& text) {
  if (std::getenv("MPSIM_UPDATE_GOLDEN")) {
    std::ofstream(path) << text;
    WARN("wrote " << path.string());
  }
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream golden;
  golden << in.rdbuf();
  CHECK(text == golden.str());
}

}  // namespace mpsim::test
