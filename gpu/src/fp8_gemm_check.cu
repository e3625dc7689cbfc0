// FP8 GEMMs on the device for checking the FP8 tensor-core models (issue #19
// §7): a chain of mma.sync.m16n8k32 instructions (the shape of the emulator's
// tensor_core_dot with a block of 32), and cuBLASLt's FP8 GEMM with and without
// its fast accumulation. Written for clarity, not speed, like mma_gemm.cu.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "check.hpp"
#include "cublaslt_fp8.hpp"
#include "mpsim/gpu/tensor_core_check.hpp"

namespace mpsim::gpu {
namespace {

// One mma.sync.m16n8k32: C tile 16 x 8, K step 32.
constexpr int kTileM = 16, kTileN = 8, kTileK = 32;
constexpr unsigned kWarpsPerBlock = 4;

int round_up(int x, int to) { return (x + to - 1) / to * to; }

const char* name(Fp8 t) { return t == Fp8::e4m3 ? "E4M3" : "E5M2"; }
__nv_fp8_interpretation_t interpretation(Fp8 t) { return t == Fp8::e4m3 ? __NV_E4M3 : __NV_E5M2; }

// rows x cols row-major (or its transpose) as FP8 codes in an out_rows x
// out_cols row-major array, zero-padded: what both engines read, K innermost.
std::vector<std::uint8_t> to_codes(std::span<const float> in, int rows, int cols, bool transpose, Fp8 t,
                                   int out_rows, int out_cols, const char* operand) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(out_rows) * out_cols, 0);  // code 0 is +0 in both
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::uint8_t code = detail::fp8_code(in[static_cast<std::size_t>(r) * cols + c], t, operand);
      const int orow = transpose ? c : r, ocol = transpose ? r : c;
      out[static_cast<std::size_t>(orow) * out_cols + ocol] = code;
    }
  return out;
}

// d = A(16x32) B(32x8) + d for this lane's fragments, the FP8 types as template
// codes (0 E4M3, 1 E5M2). Only for sm_89 and later.
template <int TA, int TB>
__device__ void mma_16x8x32(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define MPSIM_MMA_FP8(ta, tb)                                                                                   \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." ta "." tb                                               \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                         \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
  if constexpr (TA == 0 && TB == 0) MPSIM_MMA_FP8("e4m3", "e4m3");
  else if constexpr (TA == 0 && TB == 1) MPSIM_MMA_FP8("e4m3", "e5m2");
  else if constexpr (TA == 1 && TB == 0) MPSIM_MMA_FP8("e5m2", "e4m3");
  else MPSIM_MMA_FP8("e5m2", "e5m2");
#undef MPSIM_MMA_FP8
#endif
}

// Four consecutive codes along K as one .b32 register, the lowest K in the low
// byte (PTX ISA: fragments list elements "low to high"). p is 4-byte aligned.
__device__ std::uint32_t load4(const std::uint8_t* p) { return *reinterpret_cast<const std::uint32_t*>(p); }

// One warp per 16 x 8 tile of C. a: m_pad x k_pad row-major; bt: B transposed,
// n_pad x k_pad row-major (the ".col" operand). Fragments for m16n8k32 with
// 8-bit types (PTX ISA, "Matrix Fragments for mma.m16n8k32"), group = lane / 4,
// pair = lane % 4:
//   A: {row g, k 4p..4p+3}, {row g+8, k 4p..}, {row g, k 4p+16..}, {row g+8, k 4p+16..}
//   B: {k 4p..4p+3, col g}, {k 4p+16..4p+19, col g}
//   C: d0, d1 at row g, cols 2p, 2p+1; d2, d3 at row g+8 (as m16n8k16).
template <int TA, int TB>
__global__ void mma_fp8_tiles(const std::uint8_t* a, const std::uint8_t* bt, float* c, int m, int n, int k_pad,
                              int tiles_n, long long tiles, unsigned* unsupported) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  if (blockIdx.x == 0 && threadIdx.x == 0) *unsupported = 1;
#else
  const long long first_warp = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / 32;
  const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32), group = lane / 4, pair = lane % 4;
  for (long long tile = first_warp; tile < tiles; tile += warps) {
    const int row0 = static_cast<int>(tile / tiles_n) * kTileM, col0 = static_cast<int>(tile % tiles_n) * kTileN;
    const std::uint8_t* a_row = a + static_cast<std::size_t>(row0 + group) * k_pad + 4 * pair;
    const std::uint8_t* a_row8 = a_row + static_cast<std::size_t>(8) * k_pad;
    const std::uint8_t* b_col = bt + static_cast<std::size_t>(col0 + group) * k_pad + 4 * pair;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // C starts at +0
    for (int kb = 0; kb < k_pad; kb += kTileK) {  // increasing K
      const std::uint32_t fa[4] = {load4(a_row + kb), load4(a_row8 + kb), load4(a_row + kb + 16),
                                   load4(a_row8 + kb + 16)};
      const std::uint32_t fb[2] = {load4(b_col + kb), load4(b_col + kb + 16)};
      mma_16x8x32<TA, TB>(d, fa, fb);
    }
    const int row = row0 + group, col = col0 + 2 * pair;
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      if (r >= m) continue;
      if (col < n) c[static_cast<std::size_t>(r) * n + col] = d[2 * h];
      if (col + 1 < n) c[static_cast<std::size_t>(r) * n + col + 1] = d[2 * h + 1];
    }
  }
#endif
}

template <int TA, int TB>
void launch_mma(const std::uint8_t* a, const std::uint8_t* bt, float* c, int m, int n, int k_pad, int tiles_n,
                long long tiles, unsigned* unsupported) {
  const long long wanted = (tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
  mma_fp8_tiles<TA, TB><<<blocks, kWarpsPerBlock * 32>>>(a, bt, c, m, n, k_pad, tiles_n, tiles, unsupported);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void check_sizes(const char* what, std::span<const float> a, std::span<const float> b, int m, int n, int k) {
  if (m <= 0 || n <= 0 || k <= 0 || k > (1 << 24) || m > (1 << 24) || n > (1 << 24))
    throw std::invalid_argument(std::string(what) + ": sizes must be in 1 .. 2^24, got m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
  if (a.size() != static_cast<std::size_t>(m) * k || b.size() != static_cast<std::size_t>(k) * n)
    throw std::invalid_argument(std::string(what) + ": a must hold m*k values and b k*n");
}

ComputeCapability require_capability(const char* what, int major, int minor) {
  const ComputeCapability cc = compute_capability();
  if (cc.major * 10 + cc.minor < major * 10 + minor)
    throw std::runtime_error(std::string(what) + " needs compute capability " + std::to_string(major) + "." +
                             std::to_string(minor) + " or later; device 0 is " + std::to_string(cc.major) + "." +
                             std::to_string(cc.minor));
  return cc;
}

template <typename T>
std::vector<T> download(T* device, std::size_t n) {
  std::vector<T> out(n);
  MPSIM_CUDA_CHECK(cudaMemcpy(out.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

template <typename T>
void upload(T* device, const std::vector<T>& host) {
  MPSIM_CUDA_CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}

}  // namespace

std::vector<float> mma_gemm_fp8(Fp8 a_type, Fp8 b_type, std::span<const float> a, std::span<const float> b, int m,
                                int n, int k) {
  check_sizes("gpu::mma_gemm_fp8", a, b, m, n, k);
  require_capability("gpu::mma_gemm_fp8 (mma.sync with FP8 inputs)", 8, 9);
  const int m_pad = round_up(m, kTileM), n_pad = round_up(n, kTileN), k_pad = round_up(k, kTileK);
  const auto a8 = to_codes(a, m, k, false, a_type, m_pad, k_pad, "a");
  const auto bt8 = to_codes(b, k, n, true, b_type, n_pad, k_pad, "b");
  detail::DeviceArray<std::uint8_t> da(a8.size()), dbt(bt8.size());
  detail::DeviceArray<float> dc(static_cast<std::size_t>(m) * n);
  detail::DeviceArray<unsigned> unsupported(1);
  upload(da.data(), a8);
  upload(dbt.data(), bt8);
  MPSIM_CUDA_CHECK(cudaMemset(unsupported.data(), 0, sizeof(unsigned)));
  const int tiles_n = n_pad / kTileN;
  const long long tiles = static_cast<long long>(m_pad / kTileM) * tiles_n;
  const int code = (a_type == Fp8::e5m2 ? 2 : 0) + (b_type == Fp8::e5m2 ? 1 : 0);
  switch (code) {
    case 0: launch_mma<0, 0>(da.data(), dbt.data(), dc.data(), m, n, k_pad, tiles_n, tiles, unsupported.data()); break;
    case 1: launch_mma<0, 1>(da.data(), dbt.data(), dc.data(), m, n, k_pad, tiles_n, tiles, unsupported.data()); break;
    case 2: launch_mma<1, 0>(da.data(), dbt.data(), dc.data(), m, n, k_pad, tiles_n, tiles, unsupported.data()); break;
    default: launch_mma<1, 1>(da.data(), dbt.data(), dc.data(), m, n, k_pad, tiles_n, tiles, unsupported.data());
  }
  if (download(unsupported.data(), 1)[0] != 0)  // synchronises
    throw std::runtime_error("gpu::mma_gemm_fp8: this build has no FP8 mma.sync code for the device (compiled for an "
                             "architecture below sm_89); set CMAKE_CUDA_ARCHITECTURES");
  return download(dc.data(), static_cast<std::size_t>(m) * n);
}

Fp8GemmRun cublaslt_gemm_fp8(Fp8 a_type, Fp8 b_type, std::span<const float> a, std::span<const float> b, int m,
                             int n, int k, bool fast_accumulation) {
  check_sizes("gpu::cublaslt_gemm_fp8", a, b, m, n, k);
  if (m % 16 != 0 || n % 16 != 0 || k % 16 != 0)
    throw std::invalid_argument("gpu::cublaslt_gemm_fp8: cuBLASLt's FP8 GEMM needs m, n and k multiples of 16");
  require_capability("gpu::cublaslt_gemm_fp8", 8, 9);
  const auto a8 = to_codes(a, m, k, false, a_type, m, k, "a");
  const auto bt8 = to_codes(b, k, n, true, b_type, n, k, "b");
  detail::DeviceArray<std::uint8_t> da(a8.size()), dbt(bt8.size());
  detail::DeviceArray<float> dc(static_cast<std::size_t>(m) * n);
  upload(da.data(), a8);
  upload(dbt.data(), bt8);
  const detail::LtChoice choice =
      detail::cublaslt_fp8_matmul(a_type, da.data(), k, b_type, dbt.data(), k, dc.data(), n, m, n, k, fast_accumulation);
  Fp8GemmRun run;
  run.ran = choice.ran;
  run.why_not = choice.why_not;
  run.algorithm_id = choice.algorithm_id;
  run.split_k = choice.split_k;
  if (run.ran) run.c = download(dc.data(), static_cast<std::size_t>(m) * n);
  return run;
}

namespace detail {

std::uint8_t fp8_code(float x, Fp8 t, const char* what) {
  const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(x, __NV_NOSAT, interpretation(t));
  const float back = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, interpretation(t))));
  if (!(back == x) && !(std::isnan(x) && std::isnan(back)))
    throw std::invalid_argument(std::string(what) + " holds " + std::to_string(x) + ", not an " + name(t) +
                                " value (round the inputs first)");
  return code;
}

namespace {

constexpr std::size_t kLtWorkspace = std::size_t{32} << 20;

cublasLtHandle_t lt_handle() {
  static const cublasLtHandle_t lt = [] {
    cublasLtHandle_t h = nullptr;
    MPSIM_CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  }();
  return lt;
}

void* lt_workspace() {
  static DeviceArray<std::uint8_t> workspace(kLtWorkspace);  // one per process, as the handle
  return workspace.data();
}

}  // namespace

// Row-major C (m x n) is column-major C^T (n x m) = B^T A^T. First operand: B^T, n rows of k codes = column-major
// k x n (leading dimension ldb), op T. Second: A, m rows of k codes = column-major k x m, op N.
LtMatmul::LtMatmul(cudaDataType a_type, int lda, cudaDataType b_type, int ldb, int ldc, int m, int n, int k) {
  try {
    MPSIM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;
    set(CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof transposed);
    set(CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof plain);
    MPSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&first_, b_type, k, n, ldb));
    MPSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&second_, a_type, k, m, lda));
    MPSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&out_, CUDA_R_32F, n, m, ldc));
    MPSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference_));
    MPSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &kLtWorkspace, sizeof kLtWorkspace));
  } catch (...) {
    release();
    throw;
  }
}

LtMatmul::~LtMatmul() { release(); }

void LtMatmul::release() {
  if (preference_) cublasLtMatmulPreferenceDestroy(preference_);
  if (out_) cublasLtMatrixLayoutDestroy(out_);
  if (second_) cublasLtMatrixLayoutDestroy(second_);
  if (first_) cublasLtMatrixLayoutDestroy(first_);
  if (op_) cublasLtMatmulDescDestroy(op_);
}

void LtMatmul::set(cublasLtMatmulDescAttributes_t attribute, const void* value, std::size_t bytes) {
  MPSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, attribute, value, bytes));
}

LtChoice LtMatmul::run(const void* a, const void* bt, float* c, float alpha) {
  LtChoice choice;
  constexpr int kAsked = 8;
  cublasLtMatmulHeuristicResult_t results[kAsked]{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(), op_, first_, second_, out_, out_, preference_, kAsked, results, &found);
  const cublasLtMatmulHeuristicResult_t* heuristic = nullptr;
  for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < found && heuristic == nullptr; ++i) {
    std::uint32_t split = 1;
    std::size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split,
                                         &written);
    if (split <= 1) {
      heuristic = &results[i];
      choice.split_k = static_cast<int>(split);
      cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_ID, &choice.algorithm_id,
                                           sizeof choice.algorithm_id, &written);
    }
  }
  if (heuristic == nullptr) {
    choice.why_not = std::string("cuBLASLt offers no algorithm without split-k (") + cublasGetStatusName(status) +
                     ", " + std::to_string(found) + " found)";
    return choice;
  }
  const float beta = 0.0f;
  MPSIM_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), op_, &alpha, bt, first_, a, second_, &beta, c, out_, c, out_,
                                    &heuristic->algo, lt_workspace(), kLtWorkspace, nullptr));
  MPSIM_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  choice.ran = true;
  return choice;
}

LtChoice cublaslt_fp8_matmul(Fp8 a_type, const std::uint8_t* a, int lda, Fp8 b_type, const std::uint8_t* bt, int ldb,
                             float* c, int ldc, int m, int n, int k, bool fast_accumulation) {
  if (a_type == Fp8::e5m2 && b_type == Fp8::e5m2) {
    LtChoice choice;
    choice.why_not = "cuBLASLt has no E5M2 x E5M2 GEMM";
    return choice;
  }
  auto lt_type = [](Fp8 t) { return t == Fp8::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; };
  LtMatmul matmul(lt_type(a_type), lda, lt_type(b_type), ldb, ldc, m, n, k);
  const std::int8_t fast = fast_accumulation ? 1 : 0;
  matmul.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
  LtChoice choice = matmul.run(a, bt, c, 1.0f);
  if (!choice.ran) choice.why_not = std::string(name(b_type)) + " x " + name(a_type) + " -> binary32: " + choice.why_not;
  return choice;
}

}  // namespace detail

}  // namespace mpsim::gpu
