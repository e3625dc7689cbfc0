// DeepSeek-V3's FP8 GEMM, and per-tensor FP8 (fp8-current with gemm =
// "h100"), on the H100's own tensor cores (issue #19 §7):
// block_gemm's tensor-core path (emulation/src/block_gemm.cpp) with each
// block's partials computed by cuBLASLt's FP8 GEMM with fast accumulation,
// which follows the emulator's h100 FP8 model bit for bit along any k
// (docs/tensor_cores.md, "FP8 on the H100 itself"), and the promotion done
// as block_gemm does it: acc = fma(partial, sa * sb, acc) in binary32.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "cublaslt_fp8.hpp"
#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/gpu/block_quantize.hpp"

namespace mpsim::gpu {
namespace {

int round_up(int x, int to) { return (x + to - 1) / to * to; }

std::optional<Fp8> fp8_of(const BlockFormat& f) {
  if (!f.element.floating) return std::nullopt;
  if (*f.element.floating == formats::e4m3) return Fp8::e4m3;
  if (f.element.floating->exponent_bits == 5 && f.element.floating->mantissa_bits == 2) return Fp8::e5m2;
  return std::nullopt;
}

// The H100's FP8 row (wgmma) for binary32 output, whatever its FP8 input.
bool is_h100_fp8_model(const TensorCoreModel& model) {
  for (const Format& input : {formats::e4m3, formats::e5m2})
    if (const auto preset = tensor_core_preset("h100", input, formats::binary32); preset && *preset == model)
      return true;
  return false;
}

// rows x k elements as FP8 codes, rows_pad x k_pad (zero-padded: code 0 is +0);
// an element of a block whose scale is NaN is NaN, as block_gemm reads it.
std::vector<std::uint8_t> codes(const BlockFormat& f, const BlockOperand& q, Fp8 t, int rows, int k, int rows_pad,
                                int k_pad, const char* what) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(rows_pad) * k_pad, 0);
  const int grid_cols = (k + f.block_cols - 1) / f.block_cols;
  for (int r = 0; r < rows; ++r) {
    const double* scales = q.scales.data() + static_cast<std::size_t>(r / f.block_rows) * grid_cols;
    for (int j = 0; j < k; ++j) {
      const float x = std::isnan(scales[j / f.block_cols]) ? NAN : q.elements[static_cast<std::size_t>(r) * k + j];
      out[static_cast<std::size_t>(r) * k_pad + j] = detail::fp8_code(x, t, what);
    }
  }
  return out;
}

}  // namespace

std::string tensor_core_block_gemm_refusal(const BlockFormat& a, const BlockFormat& b, const TensorCoreModel& model,
                                           int k) {
  if (!is_h100_fp8_model(model))
    return "block-scaled GEMM sums through the tensor-core model " + to_string(model) +
           ", which the device does not emulate; it runs the H100's own FP8 one (gemm = \"h100\") on its tensor cores";
  const auto ta = fp8_of(a), tb = fp8_of(b);
  if (!ta || !tb) return "the device's tensor-core block GEMM takes FP8 (E4M3, E5M2) elements only";
  if (*ta == Fp8::e5m2 && *tb == Fp8::e5m2) return "cuBLASLt has no E5M2 x E5M2 GEMM";
  if (a.scale != ScaleFormat::binary32 || b.scale != ScaleFormat::binary32)
    return "the device's tensor-core block GEMM takes binary32 (software) scales only (DeepSeek-V3's tiles); "
           "E8M0/UE4M3 scales in the tensor core need Blackwell";
  // One binary32 scale per operand (fp8-current's per-tensor points; a tensor's shape makes it one block
  // spanning k) is a single block: one cuBLASLt call over all of k, padded with zeros to its step of 16.
  const bool one_block = a.one_block_along(k);
  if (one_block != b.one_block_along(k))
    return "one operand has one scale along k and the other tiles; the device's tensor-core block GEMM takes "
           "tiles of one length or one scale per operand";
  if (!one_block && (a.block_cols != b.block_cols || a.block_cols % 16 != 0))
    return "the operands' blocks along k must be equal and a multiple of 16 (cuBLASLt's FP8 k step)";
  const ComputeCapability cc = compute_capability();
  if (cc.major != 9)
    return "the H100's FP8 tensor-core numerics need an H100 or H200 (compute capability 9.x); device 0 is " +
           std::to_string(cc.major) + "." + std::to_string(cc.minor);
  return {};
}

void tensor_core_block_gemm_on_device(const BlockGemmModel& model, const BlockFormat& fa_in, const BlockOperand& a,
                                      const BlockFormat& fb_in, const BlockOperand& bt, float* c, int m, int n,
                                      int k) {
  if (!model.tensor_core) throw std::invalid_argument("tensor_core_block_gemm_on_device: no tensor-core model");
  const BlockFormat fa = fa_in.for_shape(m, k), fb = fb_in.for_shape(n, k);
  if (const std::string why = tensor_core_block_gemm_refusal(fa, fb, *model.tensor_core, k); !why.empty())
    throw std::invalid_argument("tensor_core_block_gemm_on_device: " + why);
  const int block = fa.block_cols;
  if (model.promotion_interval != block)
    throw std::invalid_argument("tensor_core_block_gemm_on_device: binary32 scales promote once per block (" +
                                std::to_string(block) + "), got an interval of " +
                                std::to_string(model.promotion_interval));
  const int grid_cols = (k + block - 1) / block;
  const auto grid = [&](const BlockFormat& f, int rows) {
    return static_cast<std::size_t>((rows + f.block_rows - 1) / f.block_rows) * grid_cols;
  };
  if (m <= 0 || n <= 0 || k <= 0 || a.elements.size() != static_cast<std::size_t>(m) * k ||
      bt.elements.size() != static_cast<std::size_t>(n) * k || a.scales.size() != grid(fa, m) ||
      bt.scales.size() != grid(fb, n))
    throw std::invalid_argument("tensor_core_block_gemm_on_device: A must be " + std::to_string(m) + " x " +
                                std::to_string(k) + " and B^T " + std::to_string(n) + " x " + std::to_string(k));
  // cuBLASLt's FP8 GEMM wants every size a multiple of 16: zero rows and columns feed only outputs not kept,
  // and zeros along k are products with a zero factor, no term of the model (the K = 1008 cases of the check).
  const int m_pad = round_up(m, 16), n_pad = round_up(n, 16), k_pad = round_up(k, 16);
  const Fp8 ta = *fp8_of(fa), tb = *fp8_of(fb);
  const auto a8 = codes(fa, a, ta, m, k, m_pad, k_pad, "the A operand");
  const auto b8 = codes(fb, bt, tb, n, k, n_pad, k_pad, "the B operand");
  detail::DeviceArray<std::uint8_t> da(a8.size()), db(b8.size());
  detail::DeviceArray<float> dp(static_cast<std::size_t>(m_pad) * n_pad);
  MPSIM_CUDA_CHECK(cudaMemcpy(da.data(), a8.data(), a8.size(), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemcpy(db.data(), b8.data(), b8.size(), cudaMemcpyHostToDevice));
  std::vector<float> acc(static_cast<std::size_t>(m) * n, 0.0f), p(static_cast<std::size_t>(m_pad) * n_pad);
  for (int kb = 0; kb < grid_cols; ++kb) {
    const int k0 = kb * block, width = round_up(std::min(block, k - k0), 16);
    const detail::LtChoice run = detail::cublaslt_fp8_matmul(ta, da.data() + k0, k_pad, tb, db.data() + k0, k_pad,
                                                             dp.data(), n_pad, m_pad, n_pad, width, true);
    if (!run.ran) throw std::runtime_error("tensor_core_block_gemm_on_device: " + run.why_not);
    MPSIM_CUDA_CHECK(cudaMemcpy(p.data(), dp.data(), p.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < m; ++i) {
      const auto sa = static_cast<float>(a.scales[static_cast<std::size_t>(i / fa.block_rows) * grid_cols + kb]);
      float* row = acc.data() + static_cast<std::size_t>(i) * n;
      const float* partials = p.data() + static_cast<std::size_t>(i) * n_pad;
      for (int j = 0; j < n; ++j) {
        const float scale = sa * static_cast<float>(bt.scales[static_cast<std::size_t>(j / fb.block_rows) * grid_cols + kb]);
        row[j] = std::fma(partials[j], scale, row[j]);  // block_gemm's promotion: one FFMA, as DeepGEMM
      }
    }
  }
  // block_gemm's write_output: the tensor scales (1 for these formats) once, then C.
  const auto alpha = static_cast<float>(static_cast<float>(a.tensor_scale) * static_cast<float>(bt.tensor_scale));
  for (std::size_t i = 0; i < acc.size(); ++i) c[i] = alpha != 1.0f ? acc[i] * alpha : acc[i];
}

}  // namespace mpsim::gpu
