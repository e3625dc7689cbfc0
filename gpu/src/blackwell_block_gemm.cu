// Block-scaled GEMMs on Blackwell's own tensor cores (issue #19 §7): MXFP8 and
// NVFP4 operands through cuBLASLt's block-scaled matmul (compute capability
// 10.x: tcgen05.mma with block scales), elements as FP8 codes or packed E2M1,
// scales in cuBLASLt's tiled layout (block_scale_layout.hpp), NVFP4's tensor
// scales as alpha. The emulator's model of these sums (the b200 row for FP8
// and FP4 inputs: scaled products through the tensor-core accumulator, no
// promotion; docs/tensor_cores.md) is ours, built from NVIDIA's documentation
// and never compared with a Blackwell: the device case "Blackwell's
// block-scaled GEMM against the b200 model" is that comparison, and none was
// lent so far. Expect NVFP4 to differ from the model a priori: cuBLASLt runs
// it as tcgen05.mma kind::mxf4nvf4 (K = 64 per instruction), while the b200
// FP4 row follows kind::f8f6f4's K = 32. Untested by any case: NaN blocks
// (zero elements under a NaN scale code), where the hardware's behaviour is
// undocumented. Written for clarity, not speed, like mma_gemm.cu.
#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "cublaslt_fp8.hpp"
#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "mpsim/gpu/block_quantize.hpp"
#include "mpsim/gpu/block_scale_layout.hpp"
#include "mpsim/gpu/tensor_core_check.hpp"

namespace mpsim::gpu {
namespace {

// The two block-scaled kinds cuBLASLt takes: MXFP8 (E4M3 or E5M2 elements,
// E8M0 scales per 32 along k; CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0) and
// NVFP4 (E2M1 elements, UE4M3 scales per 16, rows of a 16 x 16 tile sharing
// theirs; VEC16_UE4M3).
enum class NativeKind { mxfp8, nvfp4 };

std::optional<NativeKind> native_kind(const BlockFormat& f) {
  if (!f.element.floating) return std::nullopt;
  const Format& e = *f.element.floating;
  const bool fp8 = e == formats::e4m3 || (e.exponent_bits == 5 && e.mantissa_bits == 2);
  if (fp8 && f.scale == ScaleFormat::e8m0 && f.block_cols == 32 && f.block_rows == 1) return NativeKind::mxfp8;
  if (e == formats::e2m1 && f.scale == ScaleFormat::ue4m3 && f.block_cols == 16 &&
      (f.block_rows == 1 || f.block_rows == 16))
    return NativeKind::nvfp4;
  return std::nullopt;
}

cudaDataType element_type(const BlockFormat& f) {
  const Format& e = *f.element.floating;
  if (e == formats::e2m1) return CUDA_R_4F_E2M1;
  return e == formats::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// The B200's row of the tensor-core table for these elements, binary32 out
// (the emulator's model of Blackwell's MMA; tensor_core_preset).
bool is_b200_model(const BlockFormat& f, const TensorCoreModel& model) {
  const auto preset = tensor_core_preset("b200", *f.element.floating, formats::binary32);
  return preset && *preset == model;
}

int round_up(int x, int to) { return (x + to - 1) / to * to; }

// An operand as cuBLASLt reads it: rows_pad rows of k_pad element codes (one
// byte each for FP8, two E2M1 codes a byte for NVFP4, the lower nibble first),
// and its scales' bytes in the tiled layout. Element codes are the emulator's
// encoding (round_to_format, exact: an element that is not a value of its
// format is an error). A NaN block (its scale NaN) keeps zero elements and the
// NaN scale code: E2M1 has no NaN of its own. Padding: zero elements, unit
// scales (E8M0 127, UE4M3 0x38).
struct NativeOperand {
  std::vector<std::uint8_t> elements, scales;
};

NativeOperand native_operand(const BlockFormat& f, const BlockOperand& q, int rows, int k, int rows_pad, int k_pad,
                             const char* what) {
  const NativeKind kind = *native_kind(f);
  const Format& element = *f.element.floating;
  const int block = f.block_cols, groups = (k + block - 1) / block, groups_pad = k_pad / block;
  const bool fp4 = kind == NativeKind::nvfp4;
  NativeOperand out;
  out.elements.assign(static_cast<std::size_t>(rows_pad) * (fp4 ? k_pad / 2 : k_pad), 0);
  out.scales.assign(static_cast<std::size_t>(block_scale_bytes(rows_pad, groups_pad)), fp4 ? 0x38 : 127);
  const std::uint32_t nan_code = fp4 ? kUe4m3Nan : kE8m0Nan;
  for (int r = 0; r < rows; ++r) {
    for (int g = 0; g < groups; ++g)
      out.scales[static_cast<std::size_t>(block_scale_offset(r, g, groups_pad))] =
          static_cast<std::uint8_t>(q.scale_codes[static_cast<std::size_t>(r / f.block_rows) * groups + g]);
    for (int j = 0; j < k; ++j) {
      const std::size_t at = static_cast<std::size_t>(r) * k + j;
      if (q.scale_codes[static_cast<std::size_t>(r / f.block_rows) * groups + j / block] == nan_code) continue;
      const float x = q.elements[at];
      const Rounded code = round_to_format(element, Rounding{}, x);
      if (code.flags != Flags{} || std::isnan(x))
        throw std::invalid_argument(std::string(what) + " holds " + std::to_string(x) + ", not an " +
                                    element.name() + " element (quantize the operand first)");
      const auto bits = static_cast<std::uint8_t>(code.bits.value);
      const std::size_t byte = static_cast<std::size_t>(r) * (fp4 ? k_pad / 2 : k_pad) + (fp4 ? j / 2 : j);
      out.elements[byte] |= fp4 && j % 2 == 1 ? static_cast<std::uint8_t>(bits << 4) : bits;
    }
  }
  return out;
}

// Row-major C (m_pad x n_pad, binary32) = alpha A B in cublaslt_fp8.hpp's
// layout (cuBLASLt's first operand our B^T, its second our A), each operand's
// scales for its own rows. Waits for the device.
void block_scaled_matmul(NativeKind kind, cudaDataType a_type, const std::uint8_t* a, const std::uint8_t* a_scales,
                         cudaDataType b_type, const std::uint8_t* bt, const std::uint8_t* b_scales, float* c,
                         int m_pad, int n_pad, int k_pad, float alpha) {
  detail::LtMatmul matmul(a_type, k_pad, b_type, k_pad, n_pad, m_pad, n_pad, k_pad);
  const cublasLtMatmulMatrixScale_t mode = kind == NativeKind::mxfp8 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0
                                                                     : CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
  matmul.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
  matmul.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
  matmul.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scales, sizeof b_scales);  // cuBLASLt's A is our B^T
  matmul.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales, sizeof a_scales);
  const detail::LtChoice run = matmul.run(a, bt, c, alpha);
  if (!run.ran) throw std::runtime_error("native_block_gemm_on_device: block-scaled " + run.why_not);
}

}  // namespace

std::string native_block_gemm_refusal(const BlockFormat& a, const BlockFormat& b, const TensorCoreModel& model,
                                      int promotion_interval) {
  const auto ka = native_kind(a), kb = native_kind(b);
  if (!ka || !kb || *ka != *kb)
    return "Blackwell's block-scaled tensor cores take MXFP8 (E4M3/E5M2 in 1 x 32 blocks, E8M0 scales) or NVFP4 (E2M1 "
           "in blocks of 16, UE4M3 scales) for both operands; got " + a.name() + " and " + b.name();
  if (element_type(a) == CUDA_R_8F_E5M2 && element_type(b) == CUDA_R_8F_E5M2)
    return "cuBLASLt has no E5M2 x E5M2 GEMM (its FP8 kernels take E4M3 on one side at least)";
  if (!is_b200_model(a, model))
    return "block-scaled GEMM sums through the tensor-core model " + to_string(model) +
           ", which Blackwell's own block-scaled GEMM does not give; the device runs the b200 one (gemm = \"b200\")";
  if (promotion_interval != 0)
    return "Blackwell's block-scaled GEMM promotes as cuBLASLt does; the device takes the model without a promotion "
           "interval (block_promotion_interval = 0)";
  const ComputeCapability cc = compute_capability();
  if (cc.major != 10)
    return "block-scaled tensor cores need a Blackwell data-center GPU (compute capability 10.x); device 0 is " +
           std::to_string(cc.major) + "." + std::to_string(cc.minor);
  return {};
}

void native_block_gemm_on_device(const BlockGemmModel& model, const BlockFormat& fa_in, const BlockOperand& a,
                                 const BlockFormat& fb_in, const BlockOperand& bt, float* c, int m, int n, int k) {
  if (!model.tensor_core) throw std::invalid_argument("native_block_gemm_on_device: no tensor-core model");
  const BlockFormat fa = fa_in.for_shape(m, k), fb = fb_in.for_shape(n, k);
  if (const std::string why = native_block_gemm_refusal(fa, fb, *model.tensor_core, model.promotion_interval);
      !why.empty())
    throw std::invalid_argument("native_block_gemm_on_device: " + why);
  const int block = fa.block_cols, groups = (k + block - 1) / block;
  const auto grid = [&](const BlockFormat& f, int rows) {
    return static_cast<std::size_t>((rows + f.block_rows - 1) / f.block_rows) * groups;
  };
  if (m <= 0 || n <= 0 || k <= 0 || a.elements.size() != static_cast<std::size_t>(m) * k ||
      bt.elements.size() != static_cast<std::size_t>(n) * k || a.scale_codes.size() != grid(fa, m) ||
      bt.scale_codes.size() != grid(fb, n))
    throw std::invalid_argument("native_block_gemm_on_device: A must be " + std::to_string(m) + " x " +
                                std::to_string(k) + " and B^T " + std::to_string(n) + " x " + std::to_string(k));
  // Whole scale tiles (128 rows, 4 blocks along k), zeros and unit scales beyond the operands.
  const int m_pad = round_up(m, 128), n_pad = round_up(n, 128), k_pad = round_up(k, 4 * block);
  const NativeOperand na = native_operand(fa, a, m, k, m_pad, k_pad, "the A operand");
  const NativeOperand nb = native_operand(fb, bt, n, k, n_pad, k_pad, "the B operand");
  detail::DeviceArray<std::uint8_t> da(na.elements.size()), db(nb.elements.size());
  detail::DeviceArray<std::uint8_t> dsa(na.scales.size()), dsb(nb.scales.size());
  detail::DeviceArray<float> dc(static_cast<std::size_t>(m_pad) * n_pad);
  MPSIM_CUDA_CHECK(cudaMemcpy(da.data(), na.elements.data(), na.elements.size(), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemcpy(db.data(), nb.elements.data(), nb.elements.size(), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemcpy(dsa.data(), na.scales.data(), na.scales.size(), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemcpy(dsb.data(), nb.scales.data(), nb.scales.size(), cudaMemcpyHostToDevice));
  // block_gemm's write_output: NVFP4's tensor scales (1 for MXFP8) as one binary32 factor, applied last.
  const auto alpha = static_cast<float>(static_cast<float>(a.tensor_scale) * static_cast<float>(bt.tensor_scale));
  block_scaled_matmul(*native_kind(fa), element_type(fa), da.data(), dsa.data(), element_type(fb), db.data(),
                      dsb.data(), dc.data(), m_pad, n_pad, k_pad, alpha);
  std::vector<float> padded(static_cast<std::size_t>(m_pad) * n_pad);
  MPSIM_CUDA_CHECK(cudaMemcpy(padded.data(), dc.data(), padded.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      c[static_cast<std::size_t>(i) * n + j] = padded[static_cast<std::size_t>(i) * n_pad + j];
}

}  // namespace mpsim::gpu
