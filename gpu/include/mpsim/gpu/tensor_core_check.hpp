#pragma once
// The tensor-core models checked on the device (issue #5 §4): a GEMM made of
// single mma.sync instructions, whose every output element is the chain along
// K that the emulator's tensor-core model describes, and the element-by-element
// comparison of two binary32 results. No CUDA type appears here.

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "mpsim/gpu/device.hpp"  // GemmInput

namespace mpsim::gpu {

// Compute capability of device 0 ({0, 0} when there is no device).
struct ComputeCapability {
  int major = 0, minor = 0;
};
ComputeCapability compute_capability();

// Row-major c[m x n] = a[m x k] * b[k x n] on device pointers, with
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: each
// element of c is a chain of instructions along K in increasing K, 16 products
// per instruction, the binary32 accumulator passed from one to the next and
// starting at +0. That is the shape of tensor_core_dot() with a block of 16
// (the H100 preset for fp16 and bf16 inputs), so on an H100 each element should
// equal mpsim::gemm with the "h100" model bit for bit.
//
// `input` is GemmInput::binary16 or GemmInput::bfloat16; every value of a and b
// must already be a value of that format (they are converted exactly on the
// device; std::invalid_argument when one is not, e.g. 0.1f or 1e6f for
// binary16). m, n, k > 0, in any size: the operands are zero-padded to whole
// tiles. Needs compute capability 8.0 or later. Synchronises the device.
void mma_gemm(GemmInput input, const float* a, const float* b, float* c, int m, int n, int k);

// FP8 GEMMs on the device, for the FP8 tensor-core models (issue #19 §7). Host
// vectors in and out, row-major: a is m x k, b is k x n, every value a value
// of its FP8 format (std::invalid_argument otherwise: round the inputs first).
enum class Fp8 { e4m3, e5m2 };

// Each element of c is a chain of
// mma.sync.aligned.m16n8k32.row.col.f32.{a_type}.{b_type}.f32 along K in
// increasing K, 32 products per instruction, the binary32 accumulator passed on
// and starting at +0; operands zero-padded to whole tiles. Needs compute
// capability 8.9 or later. Which tensor-core model it follows on a Hopper is
// what the check measures (the measured H100 FP8 vectors are wgmma's).
std::vector<float> mma_gemm_fp8(Fp8 a_type, Fp8 b_type, std::span<const float> a, std::span<const float> b, int m,
                                int n, int k);

// cuBLASLt's FP8 GEMM (unit scales, binary32 C and D, no epilogue) as its
// heuristic picks it. fast_accumulation sets CUBLASLT_MATMUL_DESC_FAST_ACCUM:
// the tensor core's own accumulator along all of K; without it cuBLASLt adds
// the partial sums into binary32 registers at an interval of its choosing.
// m, n and k must be multiples of 16; E5M2 x E5M2 has no cuBLASLt kernel.
// `ran` is false, with the reason, when cuBLASLt offers no algorithm.
struct Fp8GemmRun {
  bool ran = false;
  std::string why_not;
  std::vector<float> c;
  int algorithm_id = -1, split_k = -1;  // the heuristic's choice (CUBLASLT_ALGO_CONFIG_ID, _SPLITK_NUM)
};
Fp8GemmRun cublaslt_gemm_fp8(Fp8 a_type, Fp8 b_type, std::span<const float> a, std::span<const float> b, int m,
                             int n, int k, bool fast_accumulation);

// got against expected, element by element: how many have the same binary32
// bits, and the largest distance in units in the last place (the number of
// binary32 values between them, counting across zero; infinite when exactly
// one is NaN, 0 when both are). +0 and -0 differ in bits but are 0 ulps apart.
struct GemmComparison {
  std::size_t identical = 0, total = 0;
  double max_ulp = 0;
  std::size_t first_difference = 0;  // index of the first element that differs (meaningless when none does)
  double fraction_identical() const { return total == 0 ? 1.0 : static_cast<double>(identical) / total; }
};
GemmComparison compare_bits(std::span<const float> got, std::span<const float> expected);

}  // namespace mpsim::gpu
