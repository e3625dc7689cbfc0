// How a dot product or a GEMM accumulates: recursive, pairwise and blocked
// summation in a chosen format and rounding mode, the exact (correctly
// rounded) reference, and bit-accurate models of GPU tensor / matrix cores,
// all behind one value type. docs/tensor_cores.md describes the models, the
// measured vectors they reproduce bit for bit, and the GEMM's speed.
//
// Tensor cores (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA
// tensor cores", PeerJ Computer Science 7:e330, 2021; Khattak and Mikaitis,
// "Accurate models of NVIDIA tensor cores", ACM TACO, and "Generalized
// methodology for determining numerical features of hardware floating-point
// matrix multipliers", IEEE HPEC 2025): each product of a block is exact; the
// products and c are aligned to the largest exponent in the block and
// truncated toward zero (no sticky bit) to a fixed-point accumulator with
// `fraction_bits` bits below that exponent; the exact sum of the truncated
// terms is normalised once and rounded to the output format. A longer inner
// product is a chain of blocks, each result being the next block's c.
// AMD matrix cores (the same authors' MATLAB-tensor-core models, BSD-2) sum a
// block exactly (CDNA1), pairwise in binary32 (CDNA2), or add c late (CDNA3):
// TensorCoreSum. One table in accumulation.cpp holds every GPU's parameters;
// only V100, A100 and H100 are validated here against measured vectors.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpsim/emulation/quantize.hpp"  // Path
#include "mpsim/emulation/rounding.hpp"

namespace mpsim {

// How a block's products and c are summed (TensorCoreModel::sum).
enum class TensorCoreSum : std::uint8_t {
  fused,     // NVIDIA: products and c aligned, truncated to fraction_bits, summed, normalised, rounded once
  exact,     // AMD CDNA1 (MI100): products and c summed exactly, rounded once
  pairwise,  // AMD CDNA2 (MI210, MI250): products rounded to the output format, summed by halving the
             // block (each sum rounded), then c added by one rounded addition
  late_c,    // AMD CDNA3 (MI300): products fused as `fused` but unnormalised; then c joins: the smaller of the
             // two is rounded toward -inf onto the larger's grid (fraction_bits below its exponent, 7 more
             // bits for the products when c is larger), and the exact sum is rounded once
};

// One tensor-core instruction, parameterised. The presets hold the measured
// values. Subnormal handling follows the formats: an input format with
// Subnormals::flush_to_zero flushes subnormal inputs, such an output format
// flushes subnormal results (the presets keep both, as the GPUs do).
struct TensorCoreModel {
  Format input = formats::binary16;   // a and b (values are first rounded to it, nearest-even)
  Format output = formats::binary32;  // c and d: binary32 or binary16 (c is rounded to it, nearest-even)
  int block_size = 16;                // products fused per block (1..64)
  // Accumulator bits kept below the block's largest exponent: 23 + the
  // "extra alignment bits" (V100 0, A100 1, H100 2; H100 FP8 -10). 1..100.
  // The largest exponent of a product is ea + eb, the input exponents
  // (subnormals at emin), whatever the significand product's size.
  int fraction_bits = 25;
  int result_precision = 0;                           // 0, or the normalised sum is first truncated to this many bits
  RoundingMode rounding = RoundingMode::toward_zero;  // block sum -> output (any deterministic mode)
  // groups > 1: the block runs as `groups` chained sub-blocks (each a block
  // of this model); product k goes to sub-block (k / group_run) % groups.
  int groups = 1;
  int group_run = 1;
  bool c_added_last = false;  // the products start from +0; c is added by one rounded addition at the end
  // With c_added_last: the rounding of that addition, when not `rounding`
  // (B200 FP8: the products truncated, c added to nearest-even).
  std::optional<RoundingMode> c_rounding;
  TensorCoreSum sum = TensorCoreSum::fused;  // exact, pairwise, late_c: groups 1, result_precision 0, c in the block
  // A product of magnitude >= 2^(emax + 1) of the output makes the block an
  // infinity (NaN for both signs), whatever else it holds (AMD, "prd_limit").
  bool products_overflow = false;
  // > 0: the sum is promoted out of the tensor core every `promotion` products
  // (a multiple of block_size): each run of that many starts from +0 and its
  // result is added to a binary32 accumulator that starts at c (one
  // nearest-even addition each). cuBLASLt's default FP8 GEMM on an H100 is the
  // H100 FP8 model with 128 (docs/tensor_cores.md, "FP8 on the H100 itself"),
  // DeepSeek-V3's recipe. Binary32 output only. 0: never.
  int promotion = 0;
  friend bool operator==(const TensorCoreModel&, const TensorCoreModel&) = default;
};

// The GPUs that tensor_core_preset knows, in lower case ("v100", "a100",
// "a30", "a2", "h100", "h200", "ada", "l40s", "rtx6000ada", "b200",
// "b200rn", "rtxpro6000", "mi100", "mi210", "mi250", "mi300a", "mi300x");
// measured vectors' folders spell them in any case (tensor-core-vectors/V100).
std::span<const std::string_view> tensor_core_gpus();

// The model of `gpu` (any case) for these formats, or nothing where the GPU
// has no such instruction or no model is known. Formats are matched by shape
// (exponent and mantissa bits, specials); the model's formats carry the GPU's
// own subnormal handling (the CDNA2 presets flush).
std::optional<TensorCoreModel> tensor_core_preset(std::string_view gpu, const Format& input, const Format& output);
// Whether the preset was checked here against measured vectors (V100, A100,
// H100 and the GPUs the published models say are identical to one of them).
bool tensor_core_preset_validated(std::string_view gpu, const Format& input, const Format& output);
// The (input, output) formats `gpu` (any case) has presets for; empty for an unknown GPU.
std::vector<std::pair<Format, Format>> tensor_core_preset_formats(std::string_view gpu);
// The custom spelling "tc:input=..,output=..,block=..,bits=..,rounding=..[,..]"
// that parse_tensor_core_model reads back (docs/tensor_cores.md).
std::string to_string(const TensorCoreModel& model);
// Reads that spelling (keys in any order; "tc:" optional). Throws
// std::invalid_argument naming the key or value at fault.
TensorCoreModel parse_tensor_core_model(std::string_view text);

// d = a·b + c through chained blocks, in order of k. a and b hold values of
// the model's input format (others are rounded to it first), c a value of any
// format; a binary16 result is returned as its binary32 value. Sizes must
// match. Infinities and NaNs follow IEEE 754 per block; a NaN result is
// the GPU's canonical NaN (0x7fffffff in binary32, 0x7fff in binary16).
float tensor_core_dot(const TensorCoreModel& model, std::span<const float> a, std::span<const float> b, float c);

enum class AccumulationKind : std::uint8_t {
  recursive,    // s = c; s = round(s + a_k*b_k) for each k, product exact (a fused multiply-add)
  pairwise,     // p_k = round(a_k*b_k), summed by halving the range, each sum rounded; then round(c + sum)
  blocked,      // per block of `block` products: t = round(t + a_k*b_k) from 0; then s = round(s + t), s from c
  exact,        // a·b + c exactly, rounded once
  tensor_core,  // `tensor_core`; `format` and `mode` are its output and rounding
};

struct AccumulationModel {
  AccumulationKind kind = AccumulationKind::recursive;
  Format format = formats::binary32;  // the accumulator and result (precision <= 24, binary32's range or less)
  RoundingMode mode = RoundingMode::nearest_even;  // every mode but stochastic
  int block = 32;                                  // blocked only
  TensorCoreModel tensor_core;                     // tensor_core only
  friend bool operator==(const AccumulationModel&, const AccumulationModel&) = default;
};

// Names: "fp32", "fp16", "bf16" (any format name: recursive), "pairwise-fp32",
// "blocked-fp32-32", "exact" (binary32), "exact-fp16", each with an optional
// ":MODE" suffix ("fp16:rtz"); a GPU of tensor_core_gpus() with the input
// format given here, or "h100:INPUT[:OUTPUT]" ("h100:e4m3:binary16"); binary32
// output by default; a custom tensor core "tc:KEY=VALUE,..." (nothing when it
// is invalid: parse_accumulation_model_or_throw says why). to_string() prints a name
// this parses back.
std::optional<AccumulationModel> parse_accumulation_model(std::string_view text,
                                                          const Format& tensor_core_input = formats::binary16);
// The same, throwing std::invalid_argument that names the text and says why
// it is no model: an unknown name (with the accepted ones), a GPU without that
// instruction (with the GPU's models), a format that is no tensor-core input,
// stochastic rounding, a block size below 1, parse_tensor_core_model's reason.
// A bare GPU name takes tensor_core_output too (parse_accumulation_model: binary32).
AccumulationModel parse_accumulation_model_or_throw(std::string_view text,
                                                    const Format& tensor_core_input = formats::binary16,
                                                    const Format& tensor_core_output = formats::binary32);
std::string to_string(const AccumulationModel& model);
std::string_view accumulation_model_names();

// a·b + c under the model; the result as a binary32 value. Throws
// std::invalid_argument for sizes that differ or an unsupported model.
float dot(const AccumulationModel& model, std::span<const float> a, std::span<const float> b, float c);

// Row-major C[m x n] = A[m x k] * B[k x n] (+ C when accumulate_c), each
// element the model's dot product along k in increasing k. threads <= 0: all
// cores. Path::automatic takes the vectorised kernel where the model has one
// (Path::scalar and Path::exact: dot() element by element) (tensor cores with binary32 output and inputs of at most 12 significant
// bits: fp16, bf16, tf32, e4m3, e5m2; rows and columns holding infinities,
// NaNs or magnitudes beyond 2^-63..2^63 go element by element) and dot()
// element by element otherwise; every path gives the same bits. The kernel is
// written once with Highway and its SIMD target chosen at run time (the best
// this CPU has; mpsim/emulation/simd.hpp's ForceTarget picks a lesser one).
void gemm(const AccumulationModel& model, const float* a, const float* b, float* c, int m, int n, int k,
          bool accumulate_c, int threads, Path path = Path::automatic);

// Which kernel gemm() uses for this model here: the Highway target of the
// vector kernel ("AVX3", "AVX2", "SSE4", "SSSE3", or the portable "SCALAR" or
// "EMU128"), or "scalar" (element by element through dot()).
std::string_view gemm_kernel_name(const AccumulationModel& model);

}  // namespace mpsim
