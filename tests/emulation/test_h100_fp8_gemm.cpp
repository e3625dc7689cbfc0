// The emulator against FP8 GEMMs computed by an H100 (issue #19 §3, §7):
// data/tensor-cores/h100_fp8_gemm_2026-11-26.txt.gz holds the first four rows
// of every output of the 80 FP8 cases (tests/support/fp8_gemm_cases.hpp) as
// the H100 computed them three ways (mma.sync chains, cuBLASLt's FP8 GEMM with
// and without fast accumulation; data/tensor-cores/README.md). The operands
// are regenerated from the seeds, and each engine's rule, an accumulation model
// of the emulator, must give every recorded output bit for bit: long chains
// with c carried, promotion every 128 products, mixed E4M3 x E5M2. An oracle
// from the hardware, on every machine.
#include <catch2/catch.hpp>
#include <zlib.h>

#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/fp8_gemm_cases.hpp"

namespace mpsim {
namespace {

using Key = std::pair<std::string, std::string>;  // case slug, engine

// Every recorded row: (slug, engine) -> rows of binary32 bits, in file order.
std::map<Key, std::vector<std::vector<std::uint32_t>>> read_recorded(const std::string& path) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  REQUIRE(file != nullptr);
  std::map<Key, std::vector<std::vector<std::uint32_t>>> rows;
  std::string line;
  char buffer[4096];
  while (gzgets(file.get(), buffer, sizeof buffer) != nullptr) {
    line += buffer;
    if (line.empty() || line.back() != '\n') continue;  // a line longer than the buffer: read on
    if (line[0] != '#') {
      std::istringstream in(line);
      std::string slug, engine;
      int row = -1;
      in >> slug >> engine >> row;
      auto& values = rows[{slug, engine}];
      REQUIRE(row == static_cast<int>(values.size()));
      values.emplace_back();
      std::string hex;
      while (in >> hex) values.back().push_back(static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16)));
    }
    line.clear();
  }
  return rows;
}

TEST_CASE("the H100's FP8 GEMMs: every recorded output is its engine's rule, bit for bit", "[accumulation][h100]") {
  const auto recorded = read_recorded(std::string(MPSIM_SOURCE_DIR) + "/data/tensor-cores/h100_fp8_gemm_2026-11-26.txt.gz");
  std::size_t compared = 0, pairs = 0;
  for (const test::Fp8Case& c : test::fp8_cases()) {
    const test::Fp8Operands ops = test::make_operands(c);
    for (const char* engine : test::fp8_engines) {
      const auto it = recorded.find({c.slug(), engine});
      INFO(c.label() << ", " << engine);
      REQUIRE((it != recorded.end()) == c.runs_on(engine));  // every case the H100 ran, and only those
      if (it == recorded.end()) continue;
      const auto& rows = it->second;
      REQUIRE(rows.size() == 4);
      const std::vector<float> model = test::fp8_model_result(test::rule_for(engine, c), c, ops, 4);
      for (int r = 0; r < 4; ++r) {
        REQUIRE(rows[r].size() == static_cast<std::size_t>(c.shape.n));
        for (int j = 0; j < c.shape.n; ++j) {
          INFO("row " << r << ", column " << j);
          CHECK(std::bit_cast<std::uint32_t>(model[static_cast<std::size_t>(r) * c.shape.n + j]) == rows[r][j]);
          ++compared;
        }
      }
      ++pairs;
    }
  }
  CHECK(pairs == 176);  // 80 mma.sync cases, 48 each for cuBLASLt with and without fast accumulation
  CHECK(compared > 20000);
}

}  // namespace
}  // namespace mpsim
