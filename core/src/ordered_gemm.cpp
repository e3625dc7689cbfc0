// The fixed-order binary32 GEMM (ordered_gemm.hpp says the order and why).
//
// Layout, as in the GotoBLAS/BLIS family: k is cut into blocks of kBlockK;
// for each block, op(b) is packed into panels of W = 2 vectors of columns,
// [panel][kk][W] (zero columns past n), and each thread packs its tile of
// kRows rows of op(a) as [kk][kRows] (zero rows past m). The micro-kernel
// holds a kRows x W tile of c in 2 * kRows vector registers; per kk it loads
// one panel row, broadcasts kRows values of a and does one multiply and one
// add per accumulator. With separate multiplies and adds Zen's two multiply
// and two add pipes run at the rate of its two FMA pipes; Intel cores, whose
// adds share the FMA ports, run at about half of it.
//
// Compiled once per SIMD target by Highway (mpsim/emulation/simd.hpp) with
// -ffp-contract=off (core/CMakeLists.txt), so every target computes the same
// chain of roundings; the tests compare every target with a binary64 oracle.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/src/ordered_gemm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/aligned_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "mpsim/core/ordered_gemm.hpp"

#ifndef MPSIM_ORDERED_GEMM_SHARED
#define MPSIM_ORDERED_GEMM_SHARED
namespace mpsim::core::ordered {

constexpr std::int64_t kRows = 6;       // rows of c per tile: 12 accumulators of 16 vector registers (AVX2)
constexpr std::int64_t kBlockK = 256;   // k per block: a panel of 256 x W floats stays in L1/L2

// The operands as stored; element (i, kk) of op(a) and (kk, j) of op(b).
struct Operands {
  const float* a;
  bool ta;
  const float* b;
  bool tb;
  float* c;
  std::int64_t m, n, k;
  float a_at(std::int64_t i, std::int64_t kk) const { return ta ? a[kk * m + i] : a[i * k + kk]; }
  float b_at(std::int64_t kk, std::int64_t j) const { return tb ? b[j * k + kk] : b[kk * n + j]; }
};

// Below this many multiply-adds a GEMM runs on the calling thread: waking a
// team costs more than it saves. (Not a numerical choice: bits are the same.)
constexpr std::int64_t kThreadedWork = std::int64_t{1} << 17;

}  // namespace mpsim::core::ordered
#endif

HWY_BEFORE_NAMESPACE();
namespace mpsim::core::ordered::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace {

// Packs op(b)'s rows [k0, k0 + kc) into panels: out[p][kk][0..w), zeros past n.
void pack_b(const Operands& o, std::int64_t k0, std::int64_t kc, std::int64_t w, std::int64_t panel, float* out) {
  const std::int64_t j0 = panel * w, width = std::min(w, o.n - j0);
  float* dst = out + panel * kc * w;
  if (!o.tb) {
    for (std::int64_t kk = 0; kk < kc; ++kk) {
      float* row = dst + kk * w;
      std::memcpy(row, o.b + (k0 + kk) * o.n + j0, sizeof(float) * static_cast<std::size_t>(width));
      std::fill(row + width, row + w, 0.0f);
    }
    return;
  }
  // Stored transposed: read each column of op(b) contiguously.
  for (std::int64_t j = 0; j < w; ++j) {
    const float* column = o.b + (j0 + j) * o.k + k0;
    for (std::int64_t kk = 0; kk < kc; ++kk) dst[kk * w + j] = j < width ? column[kk] : 0.0f;
  }
}

// Packs op(a)'s rows [i0, i0 + kRows), columns [k0, k0 + kc): out[kk][r], zeros past m.
void pack_a(const Operands& o, std::int64_t i0, std::int64_t k0, std::int64_t kc, float* out) {
  const std::int64_t rows = std::min(kRows, o.m - i0);
  for (std::int64_t kk = 0; kk < kc; ++kk) {
    float* dst = out + kk * kRows;
    for (std::int64_t r = 0; r < rows; ++r) dst[r] = o.a_at(i0 + r, k0 + kk);
    for (std::int64_t r = rows; r < kRows; ++r) dst[r] = 0.0f;
  }
}

// c_tile[r][0..2L) (row stride ldc) = (first ? +0 : c_tile) + the block's
// products, each added in kk order: acc = acc + a * b, two roundings.
template <class D, std::size_t... R>
HWY_INLINE void tile(D d, const float* HWY_RESTRICT ap, const float* HWY_RESTRICT bp, std::int64_t kc, float* c,
                     std::int64_t ldc, bool first, std::index_sequence<R...>) {
  using V = hn::Vec<D>;
  const std::size_t lanes = hn::Lanes(d);
  V lo[sizeof...(R)], hi[sizeof...(R)];
  ((lo[R] = first ? hn::Zero(d) : hn::LoadU(d, c + R * ldc),
    hi[R] = first ? hn::Zero(d) : hn::LoadU(d, c + R * ldc + lanes)),
   ...);
  for (std::int64_t kk = 0; kk < kc; ++kk) {
    const V b0 = hn::Load(d, bp + kk * 2 * lanes);
    const V b1 = hn::Load(d, bp + kk * 2 * lanes + lanes);
    const float* a = ap + kk * kRows;
    ((lo[R] = hn::Add(lo[R], hn::Mul(hn::Set(d, a[R]), b0)),
      hi[R] = hn::Add(hi[R], hn::Mul(hn::Set(d, a[R]), b1))),
     ...);
  }
  ((hn::StoreU(lo[R], d, c + R * ldc), hn::StoreU(hi[R], d, c + R * ldc + lanes)), ...);
}

// One row tile of c over panels [p0, p1), for the k block [k0, k0 + kc).
void row_tile(const Operands& o, std::int64_t i0, std::int64_t p0, std::int64_t p1, std::int64_t k0, std::int64_t kc,
              const float* packed_b, float* packed_a) {
  const hn::ScalableTag<float> d;
  const std::int64_t w = 2 * static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t rows = std::min(kRows, o.m - i0);
  const bool first = k0 == 0;
  pack_a(o, i0, k0, kc, packed_a);
  HWY_ALIGN float edge[kRows * 2 * HWY_MAX_BYTES / sizeof(float)];
  for (std::int64_t p = p0; p < p1; ++p) {
    const std::int64_t j0 = p * w, width = std::min(w, o.n - j0);
    const float* bp = packed_b + p * kc * w;
    float* c = o.c + i0 * o.n + j0;
    if (rows == kRows && width == w) {
      tile(d, packed_a, bp, kc, c, o.n, first, std::make_index_sequence<kRows>{});
      continue;
    }
    // An edge tile runs on a full-size copy; only its part inside c goes back.
    for (std::int64_t r = 0; r < kRows; ++r)
      for (std::int64_t j = 0; j < w; ++j) edge[r * w + j] = (r < rows && j < width && !first) ? c[r * o.n + j] : 0.0f;
    tile(d, packed_a, bp, kc, edge, w, first, std::make_index_sequence<kRows>{});
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(c + r * o.n, edge + r * w, sizeof(float) * std::size_t(width));
  }
}

}  // namespace

// The whole GEMM on this target (m, n >= 1, k >= 1).
void Gemm(const Operands& o, int threads) {
  const hn::ScalableTag<float> d;
  const std::int64_t w = 2 * static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t panels = (o.n + w - 1) / w, tiles = (o.m + kRows - 1) / kRows;
  const std::int64_t block = std::min(kBlockK, o.k);
  auto packed_b = hwy::AllocateAligned<float>(static_cast<std::size_t>(panels * block * w));
  const int team = (o.m * o.n * o.k >= kThreadedWork) ? std::max(1, threads) : 1;
  // Work items: a row tile by a group of panels. Few row tiles (a short or
  // transposed-narrow c) are split along n too, so every thread has work.
  const std::int64_t groups = tiles >= 2 * team ? 1 : std::min(panels, (2 * team + tiles - 1) / tiles);
  const std::int64_t per_group = (panels + groups - 1) / groups;
#pragma omp parallel num_threads(team) if (team > 1)
  {
    auto packed_a = hwy::AllocateAligned<float>(static_cast<std::size_t>(kRows * block));
    for (std::int64_t k0 = 0; k0 < o.k; k0 += block) {
      const std::int64_t kc = std::min(block, o.k - k0);
#pragma omp for schedule(static)
      for (std::int64_t p = 0; p < panels; ++p) pack_b(o, k0, kc, w, p, packed_b.get());
      // (the loop's implicit barrier: every panel is packed before any tile reads it)
#pragma omp for schedule(static)
      for (std::int64_t item = 0; item < tiles * groups; ++item) {
        const std::int64_t t = item / groups, p0 = (item % groups) * per_group;
        row_tile(o, t * kRows, p0, std::min(panels, p0 + per_group), k0, kc, packed_b.get(), packed_a.get());
      }
      // (and every tile has read this block's panels before the next block overwrites them)
    }
  }
}

// Columns per panel on this target: 2 vectors.
std::int64_t PanelWidth() { return 2 * static_cast<std::int64_t>(hn::Lanes(hn::ScalableTag<float>())); }

const char* Target() { return hwy::TargetName(HWY_TARGET); }

}  // namespace mpsim::core::ordered::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mpsim::core {
namespace ordered {
HWY_EXPORT(Gemm);
HWY_EXPORT(PanelWidth);
HWY_EXPORT(Target);
}  // namespace ordered

void ordered_gemm(const float* a, bool transpose_a, const float* b, bool transpose_b, float* c, std::int64_t m,
                  std::int64_t n, std::int64_t k, int threads) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  // A narrow c (fewer columns than a panel: LeNet's 6 channels, 10 classes)
  // is computed transposed, c^T = op(b)^T op(a)^T, which fills the vectors
  // along m instead; every element is the same chain, so the same bits.
  if (n < HWY_DYNAMIC_DISPATCH(ordered::PanelWidth)() && m > n) {
    auto transposed = hwy::AllocateAligned<float>(static_cast<std::size_t>(m * n));
    HWY_DYNAMIC_DISPATCH(ordered::Gemm)({b, !transpose_b, a, !transpose_a, transposed.get(), n, m, k}, threads);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * n + j] = transposed[j * m + i];
    return;
  }
  HWY_DYNAMIC_DISPATCH(ordered::Gemm)({a, transpose_a, b, transpose_b, c, m, n, k}, threads);
}

std::string_view ordered_gemm_target() { return HWY_DYNAMIC_DISPATCH(ordered::Target)(); }

}  // namespace mpsim::core
#endif  // HWY_ONCE
