// The fixed-order binary32 GEMM (ordered_gemm.hpp says the order and why).
//
// Layout, as in the GotoBLAS/BLIS family: k is cut into blocks of kBlockK;
// for each block, op(b) is packed into panels of W = 1 or 2 vectors of
// columns (1 when n fits one vector: LeNet's 6 and 16 channels, 10 classes),
// [panel][kk][W], zero columns past n. The micro-kernel holds an R x W tile
// of c in registers (R = 6 rows of 2 vectors or 12 rows of 1: 12
// accumulators, of AVX2's 16 registers); per kk it loads one panel row,
// broadcasts R values of op(a), read where they are stored (rows of a
// stride k, or of a^T stride 1: no packing), and does one multiply and one
// add per accumulator. Only an edge tile of fewer than R rows copies its rows
// of a, with zero rows after them. With separate multiplies and adds Zen's
// two multiply and two add pipes run at the rate of its two FMA pipes; Intel
// cores, whose adds share the FMA ports, run at about half of it.
//
// Compiled once per SIMD target by Highway (mpsim/emulation/simd.hpp) with
// -ffp-contract=off (core/CMakeLists.txt), so every target computes the same
// chain of roundings; the tests compare every target with a binary64 oracle.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/src/ordered_gemm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/aligned_allocator.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "mpsim/core/ordered_gemm.hpp"

#ifndef MPSIM_ORDERED_GEMM_SHARED
#define MPSIM_ORDERED_GEMM_SHARED
namespace mpsim::core::ordered {

constexpr std::int64_t kMaxRows = 12;   // rows of c per tile: 12 x 1 or 6 x 2 vectors
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

// Packs op(b)'s rows [k0, k0 + kc) into panel `panel` of width w: out[p][kk][0..w), zeros past n.
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

// Where op(a)'s element (i, kk) is: a[i * row_stride + kk * k_stride].
struct RowsOfA {
  const float* a;
  std::int64_t row_stride, k_stride;
};

// c_tile[r][0..NV vectors) (row stride ldc) = (first ? +0 : c_tile) + the
// block's products, each added in kk order: acc = acc + a * b, two roundings.
// Masked: only the first `width` columns of c are read and written, with the
// masked loads and stores of AVX2 and AVX-512, which touch no other column.
template <std::size_t NV, bool Masked, class D, std::size_t... R>
HWY_INLINE void tile(D d, RowsOfA a, const float* HWY_RESTRICT bp, std::int64_t kc, float* c, std::int64_t ldc,
                     bool first, std::int64_t width, std::index_sequence<R...>) {
  using V = hn::Vec<D>;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(d));
  hn::Mask<D> mask[NV];
  for (std::size_t v = 0; v < NV; ++v)
    mask[v] = hn::FirstN(
        d, static_cast<std::size_t>(std::clamp<std::int64_t>(width - static_cast<std::int64_t>(v) * lanes, 0, lanes)));
  const auto load = [&](const float* p, std::size_t v) {
    if constexpr (Masked) return hn::MaskedLoad(mask[v], d, p);
    else return hn::LoadU(d, p);
  };
  V acc[NV][sizeof...(R)];
  for (std::size_t v = 0; v < NV; ++v)
    ((acc[v][R] = first ? hn::Zero(d) : load(c + R * ldc + v * lanes, v)), ...);
  const float* HWY_RESTRICT ak = a.a;
  for (std::int64_t kk = 0; kk < kc; ++kk, ak += a.k_stride) {
    const float* row = bp + kk * NV * lanes;
    if constexpr (NV == 1) {
      const V b0 = hn::Load(d, row);
      ((acc[0][R] = hn::Add(acc[0][R], hn::Mul(hn::Set(d, ak[R * a.row_stride]), b0))), ...);
    } else {
      const V b0 = hn::Load(d, row), b1 = hn::Load(d, row + lanes);
      ((acc[0][R] = hn::Add(acc[0][R], hn::Mul(hn::Set(d, ak[R * a.row_stride]), b0)),
        acc[1][R] = hn::Add(acc[1][R], hn::Mul(hn::Set(d, ak[R * a.row_stride]), b1))),
       ...);
    }
  }
  for (std::size_t v = 0; v < NV; ++v) {
    if constexpr (Masked) ((hn::BlendedStore(acc[v][R], mask[v], d, c + R * ldc + v * lanes)), ...);
    else ((hn::StoreU(acc[v][R], d, c + R * ldc + v * lanes)), ...);
  }
}

// Whether this target's masked loads and stores leave other memory alone
// (SSE4's and the portable ones read or write the whole vector).
constexpr bool kTrueMasks = HWY_TARGET <= HWY_AVX2;

// Rows [i0, i0 + rows) of c over panels [p0, p1), for the k block [k0, k0 + kc).
template <std::size_t NV, std::size_t Rows>
void row_tile(const Operands& o, std::int64_t i0, std::int64_t p0, std::int64_t p1, std::int64_t k0, std::int64_t kc,
              const float* packed_b, float* edge_a) {
  const hn::ScalableTag<float> d;
  constexpr auto rows_tag = std::make_index_sequence<Rows>{};
  const std::int64_t w = NV * static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t rows = std::min<std::int64_t>(Rows, o.m - i0);
  const bool first = k0 == 0;
  RowsOfA a{o.ta ? o.a + k0 * o.m + i0 : o.a + i0 * o.k + k0, o.ta ? 1 : o.k, o.ta ? o.m : 1};
  if (rows < static_cast<std::int64_t>(Rows)) {  // the last rows: a copy with zero rows after them
    for (std::int64_t kk = 0; kk < kc; ++kk)
      for (std::int64_t r = 0; r < static_cast<std::int64_t>(Rows); ++r)
        edge_a[kk * Rows + r] = r < rows ? o.a_at(i0 + r, k0 + kk) : 0.0f;
    a = {edge_a, 1, static_cast<std::int64_t>(Rows)};
  }
  HWY_ALIGN float edge[kMaxRows * HWY_MAX_BYTES / sizeof(float)];
  for (std::int64_t p = p0; p < p1; ++p) {
    const std::int64_t j0 = p * w, width = std::min(w, o.n - j0);
    const float* bp = packed_b + p * kc * w;
    float* c = o.c + i0 * o.n + j0;
    if (rows == static_cast<std::int64_t>(Rows) && width == w) {
      tile<NV, false>(d, a, bp, kc, c, o.n, first, w, rows_tag);
      continue;
    }
    if (rows == static_cast<std::int64_t>(Rows) && kTrueMasks) {
      tile<NV, true>(d, a, bp, kc, c, o.n, first, width, rows_tag);
      continue;
    }
    // An edge tile runs on a full-size copy of c; only its part inside c goes back.
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(Rows); ++r)
      for (std::int64_t j = 0; j < w; ++j) edge[r * w + j] = (r < rows && j < width && !first) ? c[r * o.n + j] : 0.0f;
    tile<NV, false>(d, a, bp, kc, edge, w, first, w, rows_tag);
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(c + r * o.n, edge + r * w, sizeof(float) * std::size_t(width));
  }
}

// The whole GEMM with panels of NV vectors and tiles of Rows rows.
template <std::size_t NV, std::size_t Rows>
void gemm(const Operands& o, int threads) {
  const hn::ScalableTag<float> d;
  const std::int64_t w = NV * static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t panels = (o.n + w - 1) / w, tiles = (o.m + Rows - 1) / Rows;
  const std::int64_t block = std::min(kBlockK, o.k);
  const int team = (o.m * o.n * o.k >= kThreadedWork) ? std::max(1, threads) : 1;
  // Every buffer before the team starts: an exception cannot leave an OpenMP region.
  auto packed_b = hwy::AllocateAligned<float>(static_cast<std::size_t>(panels * block * w));
  std::vector<hwy::AlignedFreeUniquePtr<float[]>> edge_a(static_cast<std::size_t>(team));
  for (auto& buffer : edge_a) buffer = hwy::AllocateAligned<float>(static_cast<std::size_t>(Rows * block));
  if (!packed_b || std::any_of(edge_a.begin(), edge_a.end(), [](const auto& b) { return !b; })) throw std::bad_alloc();
  // Work items: a row tile by a group of panels. Few row tiles (a short c)
  // are split along n too, so every thread has work.
  const std::int64_t groups = tiles >= 2 * team ? 1 : std::min(panels, (2 * team + tiles - 1) / tiles);
  const std::int64_t per_group = (panels + groups - 1) / groups;
#pragma omp parallel num_threads(team) if (team > 1)
  {
    float* const my_edge_a = edge_a[static_cast<std::size_t>(omp_get_thread_num())].get();
    for (std::int64_t k0 = 0; k0 < o.k; k0 += block) {
      const std::int64_t kc = std::min(block, o.k - k0);
#pragma omp for schedule(static)
      for (std::int64_t p = 0; p < panels; ++p) pack_b(o, k0, kc, w, p, packed_b.get());
      // (the loop's implicit barrier: every panel is packed before any tile reads it)
#pragma omp for schedule(static)
      for (std::int64_t item = 0; item < tiles * groups; ++item) {
        const std::int64_t t = item / groups, p0 = (item % groups) * per_group;
        row_tile<NV, Rows>(o, t * static_cast<std::int64_t>(Rows), p0, std::min(panels, p0 + per_group), k0, kc,
                           packed_b.get(), my_edge_a);
      }
      // (and every tile has read this block's panels before the next block overwrites them)
    }
  }
}

}  // namespace

// The whole GEMM on this target (m, n >= 1, k >= 1): panels of one vector
// when n fits in one, else of two.
void Gemm(const Operands& o, int threads) {
  if (o.n <= static_cast<std::int64_t>(hn::Lanes(hn::ScalableTag<float>()))) return gemm<1, kMaxRows>(o, threads);
  gemm<2, kMaxRows / 2>(o, threads);
}

const char* Target() { return hwy::TargetName(HWY_TARGET); }

}  // namespace mpsim::core::ordered::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mpsim::core {
namespace ordered {
HWY_EXPORT(Gemm);
HWY_EXPORT(Target);
}  // namespace ordered

void ordered_gemm(const float* a, bool transpose_a, const float* b, bool transpose_b, float* c, std::int64_t m,
                  std::int64_t n, std::int64_t k, int threads) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  HWY_DYNAMIC_DISPATCH(ordered::Gemm)({a, transpose_a, b, transpose_b, c, m, n, k}, threads);
}

std::string_view ordered_gemm_target() { return HWY_DYNAMIC_DISPATCH(ordered::Target)(); }

}  // namespace mpsim::core
#endif  // HWY_ONCE
