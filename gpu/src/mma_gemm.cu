// A GEMM made of single tensor-core instructions, to check the emulator's
// tensor-core models on the device (issue #5 §4). It is written for clarity,
// not speed: one warp per 16 x 8 tile of C, operands read straight from global
// memory, no shared memory, no pipelining. What matters is the order of the
// arithmetic: every element of C is
//
//   d = 0; for each k-block of 16 in increasing k: d = mma(a block, b block, d)
//
// with mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, which
// is tensor_core_dot() with a block of 16: the H100 preset for these inputs
// (docs/tensor_cores.md; ../shared/tensor-core-vectors/README.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "check.hpp"
#include "mpsim/gpu/tensor_core_check.hpp"

namespace mpsim::gpu {
namespace {

// The shape of one mma.sync.m16n8k16: C tile 16 x 8, K step 16.
constexpr int kTileM = 16, kTileN = 8, kTileK = 16;
constexpr unsigned kWarpsPerBlock = 4;

int round_up(int x, int to) { return (x + to - 1) / to * to; }

template <typename T>
__device__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

template <typename T>
__device__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}

template <typename T>
__device__ std::uint32_t bits16(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(x);
  else return __bfloat16_as_ushort(x);
}

// out (out_rows x out_cols, row-major) = in (rows x cols, row-major), or its
// transpose when `transpose`, converted to T and zero-padded beyond the
// source. Sets *inexact when a source value is not a value of T (NaN counts
// as exact: its class is kept). The conversion rounds to nearest-even but,
// for values of T, rounds nothing.
template <typename T>
__global__ void to_padded(const float* in, int rows, int cols, bool transpose, T* out, int out_rows, int out_cols,
                          unsigned* inexact) {
  const std::size_t total = static_cast<std::size_t>(out_rows) * out_cols;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / out_cols), c = static_cast<int>(i % out_cols);
    const int sr = transpose ? c : r, sc = transpose ? r : c;
    float x = 0.0f;
    if (sr < rows && sc < cols) x = in[static_cast<std::size_t>(sr) * cols + sc];
    const T y = from_float<T>(x);
    if (!(to_float(y) == x) && !isnan(x)) atomicOr(inexact, 1u);
    out[i] = y;
  }
}

// Two consecutive elements as one .f16x2 / .bf16x2 register: the first (lower
// index along K) in the low 16 bits, as the PTX fragments list "low to high".
template <typename T>
__device__ std::uint32_t pack(const T* p) {
  return bits16(p[0]) | (bits16(p[1]) << 16);
}

// d = A(16x16) B(16x8) + d for this lane's fragments. Only for sm_80 and later.
template <typename T>
__device__ void mma_16x8x16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// One warp per 16 x 8 tile of C (a warp-stride loop over the tiles; every lane
// of a warp takes the same tiles, as mma.sync needs). a: m_pad x k_pad
// row-major; bt: B transposed, n_pad x k_pad row-major (B column-major, the
// ".col" operand), so that a lane's two K-consecutive elements are adjacent.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type"), with group = lane / 4 and pair = lane % 4:
//   A: registers {row g, k 2p..2p+1}, {row g+8, k 2p..}, {row g, k 2p+8..}, {row g+8, k 2p+8..}
//   B: registers {k 2p..2p+1, col g}, {k 2p+8..2p+9, col g}
//   C: d0, d1 at row g, cols 2p, 2p+1; d2, d3 at row g+8, the same cols.
template <typename T>
__global__ void mma_tiles(const T* a, const T* bt, float* c, int m, int n, int k_pad, int tiles_n,
                          long long tiles, unsigned* unsupported) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // Built for an architecture without mma.m16n8k16: say so instead of computing nothing silently.
  if (blockIdx.x == 0 && threadIdx.x == 0) *unsupported = 1;
#else
  const long long first_warp = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / 32;
  const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32), group = lane / 4, pair = lane % 4;
  for (long long tile = first_warp; tile < tiles; tile += warps) {
    const int row0 = static_cast<int>(tile / tiles_n) * kTileM, col0 = static_cast<int>(tile % tiles_n) * kTileN;
    const T* a_row = a + static_cast<std::size_t>(row0 + group) * k_pad + 2 * pair;       // row g
    const T* a_row8 = a_row + static_cast<std::size_t>(8) * k_pad;                        // row g + 8
    const T* b_col = bt + static_cast<std::size_t>(col0 + group) * k_pad + 2 * pair;      // column g
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // C starts at +0
    for (int kb = 0; kb < k_pad; kb += kTileK) {  // increasing K: the chain of the model
      const std::uint32_t fa[4] = {pack(a_row + kb), pack(a_row8 + kb), pack(a_row + kb + 8), pack(a_row8 + kb + 8)};
      const std::uint32_t fb[2] = {pack(b_col + kb), pack(b_col + kb + 8)};
      mma_16x8x16<T>(d, fa, fb);
    }
    const int row = row0 + group, col = col0 + 2 * pair;
    for (int h = 0; h < 2; ++h) {  // h = 0: row g (d0, d1); h = 1: row g + 8 (d2, d3)
      const int r = row + 8 * h;
      if (r >= m) continue;
      if (col < n) c[static_cast<std::size_t>(r) * n + col] = d[2 * h];
      if (col + 1 < n) c[static_cast<std::size_t>(r) * n + col + 1] = d[2 * h + 1];
    }
  }
#endif
}

void require_mma_device() {
  int device = 0, major = 0, minor = 0;
  MPSIM_CUDA_CHECK(cudaGetDevice(&device));
  MPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major < 8)
    throw std::runtime_error("gpu::mma_gemm needs compute capability 8.0 or later (mma.m16n8k16 with bf16); device " +
                             std::to_string(device) + " is " + std::to_string(major) + "." + std::to_string(minor));
}

template <typename T>
void mma_gemm_typed(const float* a, const float* b, float* c, int m, int n, int k) {
  // Zero padding to whole tiles. Rows of A beyond m and columns of B beyond n
  // only feed elements of C that are not stored. Along K, a padded position
  // holds 0 in both A and B, so it adds the product +0 * +0 to its block. In
  // the model (fused_block in emulation/src/accumulation.cpp) a product with a
  // zero factor is no term at all: it neither sets the block's largest
  // exponent, to which the other terms are aligned and truncated, nor adds to
  // the sum; a last block of fewer than 16 products is computed the same way
  // ("a missing product is 0"). Signed zeros cannot differ either: C starts at
  // +0 and the result of a block is -0 only when all its terms are zeros of
  // negative sign, so with a +0 in the chain every all-zero block gives +0.
  // So padding changes nothing in the model. It would change the hardware's
  // result only if the hardware aligned to a zero product as if it had an
  // exponent (say 2 emin: 2^-28 for binary16, 2^-252 for bfloat16) and the
  // block's c and every nonzero product were below that; the model would then
  // be wrong for every zero, padded or not. The test's "tiny" binary16 data
  // (every product below 2^-28, K not a multiple of 16) probes exactly that.
  const int m_pad = round_up(m, kTileM), n_pad = round_up(n, kTileN), k_pad = round_up(k, kTileK);
  detail::DeviceArray<T> a16(static_cast<std::size_t>(m_pad) * k_pad), bt16(static_cast<std::size_t>(n_pad) * k_pad);
  detail::DeviceArray<unsigned> flags(2);  // [0] an operand is not a value of T, [1] no mma in this build
  MPSIM_CUDA_CHECK(cudaMemset(flags.data(), 0, 2 * sizeof(unsigned)));
  constexpr unsigned threads = 256;
  to_padded<T><<<detail::blocks_for(static_cast<std::size_t>(m_pad) * k_pad, threads), threads>>>(
      a, m, k, false, a16.data(), m_pad, k_pad, flags.data());
  MPSIM_CUDA_CHECK_LAUNCH();
  to_padded<T><<<detail::blocks_for(static_cast<std::size_t>(n_pad) * k_pad, threads), threads>>>(
      b, k, n, true, bt16.data(), n_pad, k_pad, flags.data());
  MPSIM_CUDA_CHECK_LAUNCH();

  const int tiles_n = n_pad / kTileN;
  const long long tiles = static_cast<long long>(m_pad / kTileM) * tiles_n;
  const long long wanted_blocks = (tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned blocks = static_cast<unsigned>(wanted_blocks < 65536 ? wanted_blocks : 65536);
  mma_tiles<T><<<blocks, kWarpsPerBlock * 32>>>(a16.data(), bt16.data(), c, m, n, k_pad, tiles_n, tiles,
                                                flags.data() + 1);
  MPSIM_CUDA_CHECK_LAUNCH();

  unsigned host_flags[2] = {0, 0};
  MPSIM_CUDA_CHECK(cudaMemcpy(host_flags, flags.data(), sizeof host_flags, cudaMemcpyDeviceToHost));  // synchronises
  if (host_flags[0] != 0)
    throw std::invalid_argument(std::string("gpu::mma_gemm: an operand is not a ") +
                                (std::is_same_v<T, __half> ? "binary16" : "bfloat16") +
                                " value (round the inputs first); c is not meaningful");
  if (host_flags[1] != 0)
    throw std::runtime_error("gpu::mma_gemm: this build has no mma.m16n8k16 code for the device (compiled for an "
                             "architecture below sm_80); set CMAKE_CUDA_ARCHITECTURES");
}

// The binary32 values in order, as integers: the distance is the number of
// values between them. Both zeros map to 0.
std::int64_t ordered(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const auto magnitude = static_cast<std::int64_t>(bits & 0x7FFFFFFFu);
  return (bits & 0x80000000u) != 0 ? -magnitude : magnitude;
}

}  // namespace

ComputeCapability compute_capability() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clears the error the probe may have left; nothing to report: no device is an answer
    return {};
  }
  ComputeCapability cc;
  MPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&cc.major, cudaDevAttrComputeCapabilityMajor, 0));
  MPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&cc.minor, cudaDevAttrComputeCapabilityMinor, 0));
  return cc;
}

void mma_gemm(GemmInput input, const float* a, const float* b, float* c, int m, int n, int k) {
  if (m <= 0 || n <= 0 || k <= 0)
    throw std::invalid_argument("gpu::mma_gemm: sizes must be positive, got m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
  if (input != GemmInput::binary16 && input != GemmInput::bfloat16)
    throw std::invalid_argument("gpu::mma_gemm: the input must be binary16 or bfloat16");
  if (k > std::numeric_limits<int>::max() - kTileK || m > std::numeric_limits<int>::max() - kTileM ||
      n > std::numeric_limits<int>::max() - kTileN)
    throw std::invalid_argument("gpu::mma_gemm: sizes too large");
  require_mma_device();
  if (input == GemmInput::binary16) mma_gemm_typed<__half>(a, b, c, m, n, k);
  else mma_gemm_typed<__nv_bfloat16>(a, b, c, m, n, k);
}

GemmComparison compare_bits(std::span<const float> got, std::span<const float> expected) {
  if (got.size() != expected.size())
    throw std::invalid_argument("compare_bits: " + std::to_string(got.size()) + " values against " +
                                std::to_string(expected.size()));
  GemmComparison result;
  result.total = got.size();
  bool differs = false;
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint32_t g, e;
    std::memcpy(&g, &got[i], sizeof g);
    std::memcpy(&e, &expected[i], sizeof e);
    if (g == e) {
      ++result.identical;
      continue;
    }
    if (!differs) result.first_difference = i;
    differs = true;
    double ulp;
    if (std::isnan(got[i]) || std::isnan(expected[i]))
      ulp = std::isnan(got[i]) && std::isnan(expected[i]) ? 0.0 : std::numeric_limits<double>::infinity();
    else
      ulp = std::fabs(static_cast<double>(ordered(got[i]) - ordered(expected[i])));
    if (ulp > result.max_ulp) result.max_ulp = ulp;
  }
  return result;
}

}  // namespace mpsim::gpu
