// GEMM under an accumulation model: element by element through dot(), or, for
// tensor-core models with binary32 output and inputs of at most 12 significant
// bits (fp16, bf16, tf32, e4m3, e5m2), a kernel that computes 16 columns at
// once and gives the same bits.
//
// Why the kernel is exact. Inputs a, b with 2^-63 <= |a|, |b| < 2^63 (or 0)
// have products a*b that are exact binary32 values (at most 24 significant
// bits, magnitudes within 2^-126..2^126); rows of A and columns of B holding
// anything else (always so for fp16 and FP8) go element by element. 2^ea * 2^eb
// = 2^(ea+eb) is the product's alignment exponent as a power of two (ea: a's
// exponent, emin for its subnormals). A block's largest exponent E is then a
// max of floats, and with scale = 2^(F-E) (F = fraction_bits), trunc(a*b*scale)
// is the product aligned to the accumulator's last bit 2^(E-F) and truncated
// toward zero: the scaling is exact unless the result is below 2^-126, where
// the truncated value is 0 either way, and the float-to-int conversion
// truncates toward zero. |a*b*scale| < 2^(F+2), so each half of a block sums
// in int32 when (block/2)*2^(F+2) + 2^(F+1) < 2^31. The sum converted to
// binary32 toward zero is the normalised sum truncated to 24 bits
// (result_precision then masks the significand), and multiplying it by
// 2^(E-F) toward zero is the model's final truncation, subnormal results and
// overflow included. Blocks whose E is below F-126 (only c, or nothing, is
// nonzero), and rows, columns or c values with infinities or NaNs, are
// recomputed by tensor_core_dot().
//
// The tile kernel is written once with Google Highway and compiled for each
// SIMD target (mpsim/emulation/simd.hpp); HWY_DYNAMIC_DISPATCH picks the best
// one at run time, and the portable target (EMU128, plain C++) is what the
// tests compare every other with. All of them run with the rounding mode set
// toward zero (RoundTowardZero): the sum's conversion to binary32 and its
// final scaling are the model's truncations, the products and their scaling
// are exact (or below 1, truncated to 0 either way), and maxima, comparisons
// and float-to-int conversions (which truncate anyway) do not round.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "emulation/src/accumulation_gemm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <barrier>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// What every target shares: defined once.
#ifndef MPSIM_ACCUMULATION_GEMM_SHARED
#define MPSIM_ACCUMULATION_GEMM_SHARED
namespace mpsim::gemm_kernels {
namespace {

constexpr int kLanes = 16;  // columns per panel
constexpr int kRows = 4;    // rows per tile

// What the kernel needs of a tensor-core model it covers.
struct Plan {
  int block = 16;
  int fraction_bits = 25;
  std::uint32_t significand_mask = 0xFFFFFFFFu;  // binary32 bits kept of the normalised sum
  int emin_in = -14;
};

std::optional<Plan> fast_plan(const AccumulationModel& model) {
  if (model.kind != AccumulationKind::tensor_core) return std::nullopt;
  const TensorCoreModel& m = model.tensor_core;
  const Format& in = m.input;
  const bool products_exact = in.invalid_reason() == std::nullopt && fits_in_float(in) && in.precision() <= 12;
  const int f = m.fraction_bits;
  const double half_block_sum = ((m.block_size + 1) / 2) * std::ldexp(1.0, f + 2) + std::ldexp(1.0, f + 1);
  if (m.output != formats::binary32 || m.rounding != RoundingMode::toward_zero || m.groups != 1 || m.c_added_last ||
      m.sum != TensorCoreSum::fused || m.products_overflow ||
      m.result_precision < 0 || m.result_precision > 24 || !products_exact || f < 1 || m.block_size < 1 ||
      m.block_size > 64 || half_block_sum >= std::ldexp(1.0, 31))
    return std::nullopt;
  Plan p;
  p.block = m.block_size;
  p.fraction_bits = f;
  if (m.result_precision > 0) p.significand_mask = 0xFFFFFFFFu << (24 - m.result_precision);
  p.emin_in = in.emin();
  return p;
}

inline __attribute__((always_inline)) float bits_float(std::uint32_t b) { return std::bit_cast<float>(b); }
inline __attribute__((always_inline)) std::uint32_t float_bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// Whether a value of the input format can go through the kernel: finite, and
// 0 or within 2^-63 <= |q| < 2^63, so products and powers of two stay normal.
inline bool kernel_value(float q) {
  const float magnitude = std::fabs(q);
  return magnitude == 0.0f || (magnitude >= 0x1p-63f && magnitude < 0x1p63f);
}

// 2^(alignment exponent) of a value of the input format: 0 for zeros.
float exponent_power(float q, int emin) {
  const std::uint32_t biased = (float_bits(q) >> 23) & 0xFF;
  if ((float_bits(q) & 0x7FFFFFFFu) == 0) return 0.0f;
  return bits_float(static_cast<std::uint32_t>(std::max<int>(biased, emin + 127)) << 23);
}

// The operands as the kernel reads them: A and 2^ea row-major; B and 2^eb in
// panels of 16 columns, [panel][k][bq 0..15, bx 0..15], zero-padded.
struct Operands {
  int m = 0, n = 0, k = 0, panels = 0;
  std::vector<float> aq, ax, panel, bq;  // bq: B quantized, row-major (packing's input)
  std::vector<char> row_special, column_special;
};

int thread_count(int threads, int work_items) {
  int t = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min(t, work_items));
}

template <class Body>
void parallel_rows(int m, int chunk, int threads, Body body) {
  const int chunks = (m + chunk - 1) / chunk;
  const int t = thread_count(threads, chunks);
  if (t <= 1) {
    for (int q = 0; q < chunks; ++q) body(q * chunk, std::min(m, (q + 1) * chunk));
    return;
  }
  std::vector<std::thread> workers;
  for (int w = 0; w < t; ++w)
    workers.emplace_back([&, w] {
      for (int q = w; q < chunks; q += t) body(q * chunk, std::min(m, (q + 1) * chunk));
    });
  for (auto& worker : workers) worker.join();
}

// Runs body(w, sync) on t threads, the caller being worker 0; sync() waits
// until every worker has reached it (the phases of one GEMM share a team).
template <class Body>
void run_team(int t, Body body) {
  if (t <= 1) {
    body(0, [] {});
    return;
  }
  std::barrier<> barrier(t);
  auto sync = [&barrier] { barrier.arrive_and_wait(); };
  std::vector<std::thread> workers;
  for (int w = 1; w < t; ++w) workers.emplace_back([&, w] { body(w, sync); });
  body(0, sync);
  for (auto& worker : workers) worker.join();
}

// Worker w of t takes chunks w, w+t, ... of [0, count).
template <class F>
void for_chunks(int count, int chunk, int w, int t, F f) {
  for (int begin = w * chunk; begin < count; begin += t * chunk) f(begin, std::min(count, begin + chunk));
}

// Sizes the operands (the caller, before the team starts).
void size_operands(Operands& o, int m, int n, int k) {
  o.m = m;
  o.n = n;
  o.k = k;
  o.panels = (n + kLanes - 1) / kLanes;
  o.aq.resize(std::size_t(m) * k);
  o.ax.resize(std::size_t(m) * k);
  o.bq.resize(std::size_t(k) * n);
  o.panel.resize(std::size_t(o.panels) * k * 2 * kLanes);
  o.row_special.resize(m);
  o.column_special.resize(n);
}

// Worker w's share of quantizing A and B (phase 1) and of packing B's panels
// (phase 2; each panel and its columns have one writer).
void quantize_operands(Operands& o, const TensorCoreModel& model, const Plan& plan, const float* a, const float* b,
                       int w, int t) {
  const int m = o.m, n = o.n, k = o.k, emin = plan.emin_in;
  QuantizeOptions options;
  options.rounding = Rounding{RoundingMode::nearest_even};
  options.threads = 1;
  // Raw pointers: the flags are chars, which may alias anything, so stores to
  // them would otherwise reload every vector's data pointer.
  float* const aq = o.aq.data();
  float* const ax = o.ax.data();
  float* const bq = o.bq.data();
  char* const row_special = o.row_special.data();
  for_chunks(m, 32, w, t, [&](int begin, int end) {
    const std::size_t first = std::size_t(begin) * k, count = std::size_t(end - begin) * k;
    quantize(model.input, std::span<const float>(a + first, count), std::span<float>(aq + first, count), options);
    for (int i = begin; i < end; ++i) {
      bool special = false;
      for (std::size_t e = std::size_t(i) * k; e < std::size_t(i + 1) * k; ++e) {
        special = special || !kernel_value(aq[e]);
        ax[e] = exponent_power(aq[e], emin);
      }
      row_special[i] = special;
    }
  });
  for_chunks(k, 32, w, t, [&](int begin, int end) {
    const std::size_t first = std::size_t(begin) * n, count = std::size_t(end - begin) * n;
    quantize(model.input, std::span<const float>(b + first, count), std::span<float>(bq + first, count), options);
  });
}

void pack_panels(Operands& o, const Plan& plan, int w, int t) {
  const int n = o.n, k = o.k, emin = plan.emin_in;
  const float* const bq = o.bq.data();
  float* const packed = o.panel.data();
  char* const column_special = o.column_special.data();
  for_chunks(o.panels, 4, w, t, [&](int begin, int end) {
    for (int panel = begin; panel < end; ++panel) {
      const int j0 = panel * kLanes, lanes = std::min(kLanes, n - j0);
      std::uint32_t special = 0;
      for (int kk = 0; kk < k; ++kk) {
        float* row = packed + (std::size_t(panel) * k + kk) * 2 * kLanes;
        const float* src = bq + std::size_t(kk) * n + j0;
        for (int l = 0; l < lanes; ++l) {
          special |= std::uint32_t{!kernel_value(src[l])} << l;
          row[l] = src[l];
          row[kLanes + l] = exponent_power(src[l], emin);
        }
        for (int l = lanes; l < kLanes; ++l) row[l] = row[kLanes + l] = 0.0f;  // padding: zero products
      }
      for (int l = 0; l < lanes; ++l) column_special[j0 + l] = (special >> l) & 1;
    }
  });
}

// The end of a block for one row of 16 lanes: the two half sums (int32) of
// each lane normalised, truncated to 24 bits and to the result precision, and
// scaled by 2^(E-F) into the next c. Subnormal and overflowing results are
// left to tensor_core_dot() (fallback bit); so are lanes already marked.
inline void finish_block(const Plan& p, const std::int32_t* acc0,
                                                        const std::int32_t* acc1, const float* maxp, float* c,
                                                        std::uint32_t& fallback) {
  for (int l = 0; l < kLanes; ++l) {
    const std::int64_t sum = std::int64_t{acc0[l]} + acc1[l];
    if ((fallback >> l & 1) || sum == 0) {
      c[l] = 0.0f;
      continue;
    }
    std::uint64_t mag = static_cast<std::uint64_t>(sum < 0 ? -sum : sum);
    const int width = std::bit_width(mag);
    int unit = static_cast<int>((float_bits(maxp[l]) >> 23) & 0xFF) - 127 - p.fraction_bits;
    if (width > 24) {  // truncation to 24 bits
      mag >>= width - 24;
      unit += width - 24;
    }
    const int top = std::bit_width(mag);
    const std::uint32_t sig = (static_cast<std::uint32_t>(mag) << (24 - top)) & p.significand_mask;
    const int exponent = unit + top - 1;
    if (exponent < -126 || exponent > 127) {
      fallback |= 1u << l;
      c[l] = 0.0f;
      continue;
    }
    c[l] = bits_float((sum < 0 ? 0x80000000u : 0u) | (std::uint32_t(exponent + 127) << 23) | (sig & 0x7FFFFFu));
  }
}

}  // namespace
}  // namespace mpsim::gemm_kernels
#endif  // MPSIM_ACCUMULATION_GEMM_SHARED

HWY_BEFORE_NAMESPACE();
namespace mpsim::gemm_kernels::HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;

// Truncation toward zero to int32 of values below 2^31 in magnitude (the
// scaled products: below 2^(F+2)). Highway's ConvertTo also fixes up lanes
// that overflow, three more instructions per product, which cost the x86
// targets a third of their speed; they convert with the bare instruction.
template <class DI, class VF>
HWY_INLINE hn::Vec<DI> truncate_small(DI di, VF v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)di;
  return hn::Vec<DI>{_mm512_cvttps_epi32(v.raw)};
#elif HWY_TARGET == HWY_AVX2
  (void)di;
  return hn::Vec<DI>{_mm256_cvttps_epi32(v.raw)};
#elif HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
  (void)di;
  return hn::Vec<DI>{_mm_cvttps_epi32(v.raw)};
#else
  return hn::ConvertTo(di, v);
#endif
}

// One tile: R rows (i0..) x the 16 columns of one panel. c_tile holds the
// starting c of each element (row r, lane l at [r*16+l]) and receives the
// results; fallback[r] gets a bit per lane the kernel could not compute.
// A row's 16 lanes are kVectors vectors of this target; kGroup rows are in
// flight at a time (16 vectors of state: registers on AVX-512 and AVX2, as
// long as every loop over rows and vectors is unrolled: HWY_UNROLL).
template <int R>
void tile(const Plan& p, const Operands& o, int i0, int panel, float* c_tile, std::uint32_t* fallback) {
  const hn::CappedTag<float, kLanes> df;
  const hn::RebindToSigned<decltype(df)> di;
  using VF = hn::Vec<decltype(df)>;
  using VI = hn::Vec<decltype(di)>;
  using MF = hn::Mask<decltype(df)>;
  constexpr int kWidth = static_cast<int>(hn::MaxLanes(df));
  constexpr int kVectors = kLanes / kWidth;
  constexpr int kGroup = std::min(R, std::max(1, 4 / kVectors));
  static_assert(kLanes % kWidth == 0 && R % kGroup == 0);
  const int k = o.k, f = p.fraction_bits;
  const float* bp = &o.panel[std::size_t(panel) * k * 2 * kLanes];
  const VF threshold = hn::Set(df, std::ldexp(1.0f, f - 126));
  const VF largest = hn::Set(df, 0x1p127f);
  const VI exponent_mask = hn::Set(di, 0x7F800000);
  const VI scale_base = hn::Set(di, static_cast<std::int32_t>((254u + f) << 23));
  const VI unscale_offset = hn::Set(di, f << 23);
  const VI significand_mask = hn::Set(di, static_cast<std::int32_t>(p.significand_mask));
  const VI zero = hn::Zero(di);
  for (int r0 = 0; r0 < R; r0 += kGroup) {
    const float* aq[kGroup];
    const float* ax[kGroup];
    MF bad[kGroup][kVectors];
    HWY_UNROLL(16)
    for (int r = 0; r < kGroup; ++r) {
      aq[r] = &o.aq[std::size_t(i0 + r0 + r) * k];
      ax[r] = &o.ax[std::size_t(i0 + r0 + r) * k];
      HWY_UNROLL(16)
      for (int h = 0; h < kVectors; ++h) bad[r][h] = hn::FirstN(df, 0);
    }
    for (int k0 = 0; k0 < k; k0 += p.block) {
      const int k1 = std::min(k, k0 + p.block);
      VF maxp[kGroup][kVectors], scale[kGroup][kVectors];
      VI acc0[kGroup][kVectors], acc1[kGroup][kVectors];
      HWY_UNROLL(16)
      for (int r = 0; r < kGroup; ++r)
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h)
          maxp[r][h] = hn::BitCast(df, hn::And(hn::BitCast(di, hn::LoadU(df, c_tile + (r0 + r) * kLanes + h * kWidth)),
                                               exponent_mask));
      for (int kk = k0; kk < k1; ++kk) {
        const float* bx = bp + std::size_t(kk) * 2 * kLanes + kLanes;
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h) {
          const VF x = hn::LoadU(df, bx + h * kWidth);
          HWY_UNROLL(16)
          for (int r = 0; r < kGroup; ++r) maxp[r][h] = hn::Max(maxp[r][h], hn::Mul(hn::Set(df, ax[r][kk]), x));
        }
      }
      HWY_UNROLL(16)
      for (int r = 0; r < kGroup; ++r)
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h) {
          const MF ok = hn::And(hn::Ge(maxp[r][h], threshold), hn::Le(maxp[r][h], largest));
          bad[r][h] = hn::Or(bad[r][h], hn::Not(ok));
          scale[r][h] = hn::IfThenElseZero(ok, hn::BitCast(df, hn::Sub(scale_base, hn::BitCast(di, maxp[r][h]))));
          // c * scale is below 2^(F+1) in the lanes kept; the others hold 0 (scale 0) or NaN, never used.
          const VF c = hn::LoadU(df, c_tile + (r0 + r) * kLanes + h * kWidth);
          acc0[r][h] = truncate_small(di, hn::Mul(c, scale[r][h]));
          acc1[r][h] = zero;
        }
      int kk = k0;
      for (; kk + 1 < k1; kk += 2) {
        const float* b0 = bp + std::size_t(kk) * 2 * kLanes;
        const float* b1 = b0 + 2 * kLanes;
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h) {
          const VF y0 = hn::LoadU(df, b0 + h * kWidth), y1 = hn::LoadU(df, b1 + h * kWidth);
          HWY_UNROLL(16)
          for (int r = 0; r < kGroup; ++r) {
            const VF p0 = hn::Mul(hn::Mul(hn::Set(df, aq[r][kk]), y0), scale[r][h]);
            const VF p1 = hn::Mul(hn::Mul(hn::Set(df, aq[r][kk + 1]), y1), scale[r][h]);
            acc0[r][h] = hn::Add(acc0[r][h], truncate_small(di, p0));
            acc1[r][h] = hn::Add(acc1[r][h], truncate_small(di, p1));
          }
        }
      }
      if (kk < k1) {
        const float* b0 = bp + std::size_t(kk) * 2 * kLanes;
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h) {
          const VF y0 = hn::LoadU(df, b0 + h * kWidth);
          HWY_UNROLL(16)
          for (int r = 0; r < kGroup; ++r)
            acc0[r][h] = hn::Add(acc0[r][h], truncate_small(di, hn::Mul(hn::Mul(hn::Set(df, aq[r][kk]), y0), scale[r][h])));
        }
      }
      // The block's end, rounding toward zero: the int32 sum converted is the
      // sum truncated to 24 bits, and the scaling truncates. A row whose sum
      // overflows int32 (same-sign halves, other-sign sum: rare) takes the
      // integer route (finish_block).
      HWY_UNROLL(16)
      for (int r = 0; r < kGroup; ++r) {
        float* c = c_tile + (r0 + r) * kLanes;
        VI total[kVectors];
        bool overflow = false;
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h) {
          total[h] = hn::Add(acc0[r][h], acc1[r][h]);
          const VI signs = hn::And(hn::Xor(acc0[r][h], total[h]), hn::Xor(acc1[r][h], total[h]));
          overflow = overflow || !hn::AllFalse(di, hn::Lt(signs, zero));
        }
        if (!overflow) {
          HWY_UNROLL(16)
          for (int h = 0; h < kVectors; ++h) {
            const VF sum = hn::BitCast(df, hn::And(hn::BitCast(di, hn::ConvertTo(df, total[h])), significand_mask));
            const VF unscale = hn::BitCast(df, hn::Sub(hn::BitCast(di, maxp[r][h]), unscale_offset));
            hn::StoreU(hn::IfThenZeroElse(bad[r][h], hn::Mul(sum, unscale)), df, c + h * kWidth);
          }
          continue;
        }
        alignas(64) std::int32_t sum0[kLanes], sum1[kLanes];
        alignas(64) float top[kLanes];
        std::uint32_t lanes_bad = 0;
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h) {
          hn::Store(acc0[r][h], di, sum0 + h * kWidth);
          hn::Store(acc1[r][h], di, sum1 + h * kWidth);
          hn::Store(maxp[r][h], df, top + h * kWidth);
          alignas(8) std::uint8_t bits[8] = {};
          hn::StoreMaskBits(df, bad[r][h], bits);
          lanes_bad |= (std::uint32_t{bits[0]} | std::uint32_t{bits[1]} << 8) << (h * kWidth);
        }
        finish_block(p, sum0, sum1, top, c, lanes_bad);
        HWY_UNROLL(16)
        for (int h = 0; h < kVectors; ++h) {
          alignas(8) std::uint8_t bits[8] = {};
          const std::uint32_t mine = (lanes_bad >> (h * kWidth)) & ((std::uint64_t{1} << kWidth) - 1);
          bits[0] = static_cast<std::uint8_t>(mine);
          bits[1] = static_cast<std::uint8_t>(mine >> 8);
          bad[r][h] = hn::LoadMaskBits(df, bits);
        }
      }
    }
    HWY_UNROLL(16)
    for (int r = 0; r < kGroup; ++r) {
      std::uint32_t lanes_bad = 0;
      HWY_UNROLL(16)
      for (int h = 0; h < kVectors; ++h) {
        alignas(8) std::uint8_t bits[8] = {};
        hn::StoreMaskBits(df, bad[r][h], bits);
        lanes_bad |= (std::uint32_t{bits[0]} | std::uint32_t{bits[1]} << 8) << (h * kWidth);
      }
      fallback[r0 + r] |= lanes_bad;
    }
  }
}

}  // namespace

void TileRows(const Plan& p, const Operands& o, int i0, int panel, float* c_tile, std::uint32_t* fallback) {
  tile<kRows>(p, o, i0, panel, c_tile, fallback);
}
void TileRow(const Plan& p, const Operands& o, int i0, int panel, float* c_tile, std::uint32_t* fallback) {
  tile<1>(p, o, i0, panel, c_tile, fallback);
}
const char* TileTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace mpsim::gemm_kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mpsim {
namespace gemm_kernels {
HWY_EXPORT(TileRows);
HWY_EXPORT(TileRow);
HWY_EXPORT(TileTarget);

namespace {

const char* tile_target() { return HWY_DYNAMIC_DISPATCH(TileTarget)(); }

// Keeps subnormals (no FTZ/DAZ) while the kernel runs: its exactness argument needs them.
class GradualUnderflow {
 public:
#if defined(__x86_64__) || defined(__i386__)
  GradualUnderflow() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~0x8040u); }
  ~GradualUnderflow() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// Rounds toward zero while a tile runs (every target: see the top of the file).
class RoundTowardZero {
 public:
#if defined(__x86_64__) || defined(__i386__)
  RoundTowardZero() : saved_(_mm_getcsr()) { _mm_setcsr((saved_ & ~0xE040u) | 0x6000u); }  // no FTZ, no DAZ
  ~RoundTowardZero() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#else
  RoundTowardZero() : saved_(std::fegetround()) { std::fesetround(FE_TOWARDZERO); }
  ~RoundTowardZero() { std::fesetround(saved_); }

 private:
  int saved_;
#endif
};

void gemm_elementwise(const AccumulationModel& model, const float* a, const float* b, float* c, int m, int n, int k,
                      bool accumulate_c, int threads) {
  parallel_rows(m, 8, threads, [&](int row_begin, int row_end) {
    std::vector<float> column(k);
    for (int j = 0; j < n; ++j) {
      for (int kk = 0; kk < k; ++kk) column[kk] = b[std::size_t(kk) * n + j];
      for (int i = row_begin; i < row_end; ++i) {
        float& out = c[std::size_t(i) * n + j];
        out = dot(model, std::span<const float>(a + std::size_t(i) * k, k), column, accumulate_c ? out : 0.0f);
      }
    }
  });
}

void gemm_fast(const AccumulationModel& model, const Plan& plan, const float* a, const float* b, float* c, int m, int n,
               int k, bool accumulate_c, int threads) {
  // The packed operands stay allocated in the calling thread between calls
  // (no page faults on the next GEMM of the same size). The workers use the
  // caller's through this reference: a thread_local named inside them would be theirs.
  thread_local Operands cached;
  Operands& o = cached;
  size_operands(o, m, n, k);
  constexpr int kChunk = 64;  // rows whose A stays in cache while the panels pass
  const int t = thread_count(threads, (m + kChunk - 1) / kChunk);
  run_team(t, [&](int w, auto sync) {
    quantize_operands(o, model.tensor_core, plan, a, b, w, t);
    sync();
    pack_panels(o, plan, w, t);
    sync();
    GradualUnderflow underflow;
    std::vector<float> column(k);
    float tile[kRows * kLanes], c_in[kRows * kLanes];
    std::uint32_t fallback[kRows], special[kRows];
    for_chunks(m, kChunk, w, t, [&](int row_begin, int row_end) {
      for (int panel = 0; panel < o.panels; ++panel) {
        const int j0 = panel * kLanes, lanes = std::min(kLanes, n - j0);
        const std::uint32_t lane_mask = (1u << lanes) - 1;
        std::uint32_t column_mask = 0;
        for (int l = 0; l < lanes; ++l) column_mask |= std::uint32_t{o.column_special[j0 + l] != 0} << l;
        for (int i = row_begin; i < row_end;) {
          const int rows = row_end - i >= kRows ? kRows : 1;
          for (int r = 0; r < rows; ++r) {
            const float* c_row = c + std::size_t(i + r) * n + j0;
            fallback[r] = 0;
            special[r] = column_mask | (o.row_special[i + r] ? lane_mask : 0u);
            for (int l = 0; l < kLanes; ++l) {
              const float x = (accumulate_c && l < lanes) ? c_row[l] : 0.0f;
              c_in[r * kLanes + l] = tile[r * kLanes + l] = x;
              special[r] |= std::uint32_t{!std::isfinite(x)} << l;
            }
          }
          {
            RoundTowardZero toward_zero;
            if (rows == kRows)
              HWY_DYNAMIC_DISPATCH(TileRows)(plan, o, i, panel, tile, fallback);
            else
              HWY_DYNAMIC_DISPATCH(TileRow)(plan, o, i, panel, tile, fallback);
          }
          for (int r = 0; r < rows; ++r) {
            float* c_row = c + std::size_t(i + r) * n + j0;
            std::memcpy(c_row, tile + r * kLanes, sizeof(float) * lanes);
            for (std::uint32_t redo = (fallback[r] | special[r]) & lane_mask; redo != 0; redo &= redo - 1) {
              const int l = std::countr_zero(redo), col = j0 + l;
              for (int kk = 0; kk < k; ++kk) column[kk] = b[std::size_t(kk) * n + col];
              c_row[l] = tensor_core_dot(model.tensor_core, std::span<const float>(a + std::size_t(i + r) * k, k),
                                         column, c_in[r * kLanes + l]);
            }
          }
          i += rows;
        }
      }
    });
  });
}

}  // namespace
}  // namespace gemm_kernels

std::string_view gemm_kernel_name(const AccumulationModel& model) {
  if (!gemm_kernels::fast_plan(model)) return "scalar";
  return gemm_kernels::tile_target();
}

void gemm(const AccumulationModel& model, const float* a, const float* b, float* c, int m, int n, int k,
          bool accumulate_c, int threads, Path path) {
  if (m < 0 || n < 0 || k < 0) throw std::invalid_argument("gemm: negative size");
  if (m == 0 || n == 0) return;
  if (model.kind == AccumulationKind::tensor_core && model.tensor_core.promotion > 0) {
    // tensor_core_dot's promotion, a GEMM per run of `promotion` products: each from +0, then added (nearest
    // even, binary32) into C, which starts at +0 or at c.
    if (model.tensor_core.promotion % model.tensor_core.block_size != 0 || model.tensor_core.output != formats::binary32)
      throw std::invalid_argument("gemm: unsupported tensor-core model " + to_string(model.tensor_core) +
                                  ": promote must be a multiple of the block, with a binary32 output");
    AccumulationModel run = model;
    run.tensor_core.promotion = 0;
    const int step = model.tensor_core.promotion;
    std::vector<float> sum(static_cast<std::size_t>(m) * n, 0.0f), part(sum.size());
    std::vector<float> a_run(static_cast<std::size_t>(m) * std::min(step, k));  // one run of A's columns
    if (accumulate_c) std::copy_n(c, sum.size(), sum.begin());  // the output is binary32 (invalid_reason)
    for (int k0 = 0; k0 < k; k0 += step) {
      const int width = std::min(step, k - k0);
      for (int i = 0; i < m; ++i)
        std::copy_n(a + static_cast<std::size_t>(i) * k + k0, width, a_run.begin() + static_cast<std::ptrdiff_t>(i) * width);
      gemm(run, a_run.data(), b + static_cast<std::size_t>(k0) * n, part.data(), m, n, width, false, threads, path);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    for (std::size_t i = 0; i < sum.size(); ++i)
      c[i] = std::isnan(sum[i]) ? std::bit_cast<float>(0x7FFFFFFFu) : sum[i];  // tensor_core_dot's NaN
    return;
  }
  const auto plan = gemm_kernels::fast_plan(model);
  if (plan && (path == Path::automatic || path == Path::vector)) return gemm_kernels::gemm_fast(model, *plan, a, b, c, m, n, k, accumulate_c, threads);
  if (path == Path::vector && !plan) throw std::invalid_argument("gemm: no vector kernel for " + to_string(model));
  gemm_kernels::gemm_elementwise(model, a, b, c, m, n, k, accumulate_c, threads);
}

}  // namespace mpsim
#endif  // HWY_ONCE
