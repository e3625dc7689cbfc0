#pragma once
// The FP8 GEMM cases of the H100 check (issue #19 §7), written once for the
// device test (tests/gpu/test_tensor_core_check.cpp, which computes them on an
// H100) and the emulator's test against the H100's recorded outputs
// (tests/emulation/test_h100_fp8_gemm.cpp, data/tensor-cores/, on every
// machine). The operands are regenerated from each case's seed, so only the
// device's outputs need storing.
//
// The three rules the H100 follows (docs/tensor_cores.md, "FP8 on the H100
// itself"), by engine:
//   "lt-fast"  cuBLASLt's FP8 GEMM with fast accumulation: the wgmma model
//              (block 32, 13 bits, 14-bit truncation) chained along all of K;
//   "lt"       cuBLASLt's default: that model promoted into binary32 every 128
//              products;
//   "mma"      mma.sync.m16n8k32 chains: two fp16-style groups of alternating
//              pairs (block 32, 25 bits, truncation), c added nearest-even.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/emulation/format.hpp"

namespace mpsim::test {

enum class Fp8Data { exact, uniform, normal, wide };

struct Fp8Shape {
  int m, n, k;
};

struct Fp8Case {
  Format a_format, b_format;  // formats::e4m3 or formats::e5m2
  Fp8Data data;
  Fp8Shape shape;
  std::uint64_t seed;
  std::string label() const;  // "e4m3xe5m2 uniform 128x96x1008 (seed 20261153)"
  std::string slug() const;   // "e4m3xe5m2_uniform_128x96x1008_20261153"
  bool cublaslt_shape() const { return shape.m % 16 == 0 && shape.n % 16 == 0 && shape.k % 16 == 0; }
  // Whether the engine ("mma", "lt-fast", "lt") computes this case: cuBLASLt
  // needs sizes that are multiples of 16 and has no E5M2 x E5M2 kernel.
  bool runs_on(std::string_view engine) const;
};

// 80 cases: E4M3 and E5M2 in all four pairings, four kinds of data, five shapes
// (K from 32 to 2048), seeds 20261126 upwards.
std::vector<Fp8Case> fp8_cases();
inline constexpr const char* fp8_engines[] = {"mma", "lt-fast", "lt"};

struct Fp8Operands {
  std::vector<float> a, b;  // a: m x k, b: k x n, row-major, values of the case's formats
};
Fp8Operands make_operands(const Fp8Case& c);

// A format holding both operands' values exactly (mpsim::gemm rounds its
// inputs to the model's input format first): E5M3 for E4M3 x E5M2.
Format joint_format(const Fp8Case& c);

// The engine's rule as an accumulation model name (its input the joint format).
std::string rule_for(std::string_view engine, const Fp8Case& c);

// mpsim::gemm under the named model for the first `rows` rows of C (all of
// them when rows is 0).
std::vector<float> fp8_model_result(std::string_view model, const Fp8Case& c, const Fp8Operands& ops, int rows = 0);

// The exact sums (FP8 products exact in binary64, rounding errors carried by
// TwoSum) rounded to binary32: exact on the "exact" data.
std::vector<float> fp8_exact_rounded(const Fp8Case& c, const Fp8Operands& ops, int rows = 0);

}  // namespace mpsim::test
