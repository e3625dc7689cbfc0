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
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the
// intrinsic headers as "may be used uninitialized" (at the headers' lines, so
// the pragma comes before them); nothing here is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"

namespace mpsim {
namespace {

constexpr int kLanes = 16;  // columns per panel

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

bool have_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return yes;
#else
  return false;
#endif
}

bool have_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// MPSIM_GEMM_TARGET=avx2 or =portable: a lesser kernel (to test or compare them).
std::string_view forced_target() {
  const char* target = std::getenv("MPSIM_GEMM_TARGET");
  return target == nullptr ? std::string_view{} : std::string_view(target);
}

inline __attribute__((always_inline)) float bits_float(std::uint32_t b) { return std::bit_cast<float>(b); }
inline __attribute__((always_inline)) std::uint32_t float_bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// Truncation toward zero to int32; 0 for what does not fit (NaN, infinities:
// lanes that are recomputed anyway), so the conversion is always defined.
inline __attribute__((always_inline)) std::int32_t truncate_int(float x) {
  return std::fabs(x) < 2147483648.0f ? static_cast<std::int32_t>(x) : 0;
}

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
inline __attribute__((always_inline)) void finish_block(const Plan& p, const std::int32_t* acc0,
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

// One tile: R rows (i0..) x the 16 columns of one panel. c_tile holds the
// starting c of each element (row r, lane l at [r*16+l]) and receives the
// results; fallback[r] gets a bit per lane the kernel could not compute.
// The portable version: the same arithmetic in plain loops over the lanes.
template <int R>
void tile_portable(const Plan& p, const Operands& o, int i0, int panel, float* c_tile, std::uint32_t* fallback) {
  const int k = o.k, f = p.fraction_bits;
  const float* bp = &o.panel[std::size_t(panel) * k * 2 * kLanes];
  const float threshold = std::ldexp(1.0f, f - 126);
  for (int k0 = 0; k0 < k; k0 += p.block) {
    const int k1 = std::min(k, k0 + p.block);
    for (int r = 0; r < R; ++r) {
      const float* aq = &o.aq[std::size_t(i0 + r) * k];
      const float* ax = &o.ax[std::size_t(i0 + r) * k];
      float* c = c_tile + r * kLanes;
      float maxp[kLanes], scale[kLanes];
      std::int32_t acc0[kLanes], acc1[kLanes];
      for (int l = 0; l < kLanes; ++l) maxp[l] = bits_float(float_bits(c[l]) & 0x7F800000u);
      for (int kk = k0; kk < k1; ++kk) {
        const float* bx = bp + std::size_t(kk) * 2 * kLanes + kLanes;
        for (int l = 0; l < kLanes; ++l) maxp[l] = std::max(maxp[l], ax[kk] * bx[l]);
      }
      for (int l = 0; l < kLanes; ++l) {
        const bool ok = maxp[l] >= threshold && maxp[l] <= 0x1p127f;
        fallback[r] |= ok ? 0u : 1u << l;
        scale[l] = ok ? bits_float(((254u + f) << 23) - float_bits(maxp[l])) : 0.0f;
        acc0[l] = truncate_int(c[l] * scale[l]);
        acc1[l] = 0;
      }
      for (int kk = k0; kk < k1; ++kk) {
        const float* bq = bp + std::size_t(kk) * 2 * kLanes;
        std::int32_t* acc = ((kk - k0) & 1) ? acc1 : acc0;
        for (int l = 0; l < kLanes; ++l) acc[l] += truncate_int(aq[kk] * bq[l] * scale[l]);
      }
      finish_block(p, acc0, acc1, maxp, c, fallback[r]);
    }
  }
}

#if defined(__x86_64__)
template <int R>
__attribute__((target("avx512f,avx512dq"))) void tile_avx512(const Plan& p, const Operands& o, int i0, int panel,
                                                             float* c_tile, std::uint32_t* fallback) {
  const int k = o.k, f = p.fraction_bits;
  const float* bp = &o.panel[std::size_t(panel) * k * 2 * kLanes];
  const __m512 threshold = _mm512_set1_ps(std::ldexp(1.0f, f - 126));
  const __m512 largest = _mm512_set1_ps(0x1p127f);
  const __m512i exponent_mask = _mm512_set1_epi32(0x7F800000);
  const __m512i scale_base = _mm512_set1_epi32(static_cast<int>((254u + f) << 23));
  const __m512i unscale_offset = _mm512_set1_epi32(f << 23);
  const __m512i significand_mask = _mm512_set1_epi32(static_cast<int>(p.significand_mask));
  constexpr int kRz = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  const float* aq[R];
  const float* ax[R];
  __m512 c[R];
  __mmask16 bad[R];
  for (int r = 0; r < R; ++r) {
    aq[r] = &o.aq[std::size_t(i0 + r) * k];
    ax[r] = &o.ax[std::size_t(i0 + r) * k];
    c[r] = _mm512_loadu_ps(c_tile + r * kLanes);
    bad[r] = 0;
  }
  for (int k0 = 0; k0 < k; k0 += p.block) {
    const int k1 = std::min(k, k0 + p.block);
    __m512 maxp[R], scale[R];
    __m512i acc0[R], acc1[R];
    for (int r = 0; r < R; ++r)
      maxp[r] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(c[r]), exponent_mask));
    for (int kk = k0; kk < k1; ++kk) {
      const __m512 bx = _mm512_loadu_ps(bp + std::size_t(kk) * 2 * kLanes + kLanes);
      for (int r = 0; r < R; ++r) maxp[r] = _mm512_max_ps(maxp[r], _mm512_mul_ps(_mm512_set1_ps(ax[r][kk]), bx));
    }
    for (int r = 0; r < R; ++r) {
      const __mmask16 ok =
          _mm512_cmp_ps_mask(maxp[r], threshold, _CMP_GE_OQ) & _mm512_cmp_ps_mask(maxp[r], largest, _CMP_LE_OQ);
      bad[r] |= static_cast<__mmask16>(~ok);
      scale[r] =
          _mm512_maskz_mov_ps(ok, _mm512_castsi512_ps(_mm512_sub_epi32(scale_base, _mm512_castps_si512(maxp[r]))));
      acc0[r] = _mm512_cvttps_epi32(_mm512_mul_ps(c[r], scale[r]));
      acc1[r] = _mm512_setzero_si512();
    }
    int kk = k0;
    for (; kk + 1 < k1; kk += 2) {
      const __m512 b0 = _mm512_loadu_ps(bp + std::size_t(kk) * 2 * kLanes);
      const __m512 b1 = _mm512_loadu_ps(bp + std::size_t(kk + 1) * 2 * kLanes);
      for (int r = 0; r < R; ++r) {
        const __m512 p0 = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(aq[r][kk]), b0), scale[r]);
        const __m512 p1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(aq[r][kk + 1]), b1), scale[r]);
        acc0[r] = _mm512_add_epi32(acc0[r], _mm512_cvttps_epi32(p0));
        acc1[r] = _mm512_add_epi32(acc1[r], _mm512_cvttps_epi32(p1));
      }
    }
    if (kk < k1) {
      const __m512 b0 = _mm512_loadu_ps(bp + std::size_t(kk) * 2 * kLanes);
      for (int r = 0; r < R; ++r)
        acc0[r] = _mm512_add_epi32(
            acc0[r], _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(aq[r][kk]), b0), scale[r])));
    }
    for (int r = 0; r < R; ++r) {
      // The two halves' sum, toward zero to binary32: in int32 unless it
      // overflows (same-sign halves, other-sign sum: rare), else in int64.
      const __m512i total = _mm512_add_epi32(acc0[r], acc1[r]);
      const __mmask16 overflow =
          _mm512_movepi32_mask(_mm512_and_si512(_mm512_xor_si512(acc0[r], total), _mm512_xor_si512(acc1[r], total)));
      __m512 sum = _mm512_cvt_roundepi32_ps(total, kRz);
      if (overflow != 0) {
        const __m512i lo = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc0[r])),
                                            _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc1[r])));
        const __m512i hi = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc0[r], 1)),
                                            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc1[r], 1)));
        const __m256 sum_lo = _mm512_cvt_roundepi64_ps(lo, kRz), sum_hi = _mm512_cvt_roundepi64_ps(hi, kRz);
        sum = _mm512_mask_mov_ps(sum, overflow, _mm512_insertf32x8(_mm512_castps256_ps512(sum_lo), sum_hi, 1));
      }
      sum = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(sum), significand_mask));
      const __m512 unscale = _mm512_castsi512_ps(_mm512_sub_epi32(_mm512_castps_si512(maxp[r]), unscale_offset));
      c[r] = _mm512_maskz_mul_round_ps(static_cast<__mmask16>(~bad[r]), sum, unscale, kRz);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c_tile + r * kLanes, c[r]);
    fallback[r] |= bad[r];
  }
}

// AVX2: two 8-lane halves, a row at a time (16 ymm registers). AVX2 has no
// per-instruction rounding, so the kernel runs with MXCSR rounding toward
// zero: the products and their scaling are exact (or below 1, truncated to 0
// either way), maxima and comparisons do not round, cvtt truncates anyway.
template <int R>
__attribute__((target("avx2,fma"))) void tile_avx2(const Plan& p, const Operands& o, int i0, int panel, float* c_tile,
                                                   std::uint32_t* fallback) {
  const int k = o.k, f = p.fraction_bits;
  const float* bp = &o.panel[std::size_t(panel) * k * 2 * kLanes];
  const __m256 threshold = _mm256_set1_ps(std::ldexp(1.0f, f - 126));
  const __m256 largest = _mm256_set1_ps(0x1p127f);
  const __m256i exponent_mask = _mm256_set1_epi32(0x7F800000);
  const __m256i scale_base = _mm256_set1_epi32(static_cast<int>((254u + f) << 23));
  const __m256i unscale_offset = _mm256_set1_epi32(f << 23);
  const __m256 significand_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(p.significand_mask)));
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i zero = _mm256_setzero_si256();
  const unsigned csr = _mm_getcsr();
  _mm_setcsr((csr & ~0xE040u) | 0x6000u);  // round toward zero; no FTZ, no DAZ (restored at the end)
  for (int r = 0; r < R; ++r) {
    const float* aq = &o.aq[std::size_t(i0 + r) * k];
    const float* ax = &o.ax[std::size_t(i0 + r) * k];
    float* c = c_tile + r * kLanes;
    for (int k0 = 0; k0 < k; k0 += p.block) {
      const int k1 = std::min(k, k0 + p.block);
      __m256 maxp[2], scale[2];
      __m256i acc0[2], acc1[2];
      for (int h = 0; h < 2; ++h)
        maxp[h] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(c + 8 * h)), exponent_mask));
      for (int kk = k0; kk < k1; ++kk) {
        const __m256 x = _mm256_broadcast_ss(ax + kk);
        const float* bx = bp + std::size_t(kk) * 2 * kLanes + kLanes;
        maxp[0] = _mm256_max_ps(maxp[0], _mm256_mul_ps(x, _mm256_loadu_ps(bx)));
        maxp[1] = _mm256_max_ps(maxp[1], _mm256_mul_ps(x, _mm256_loadu_ps(bx + 8)));
      }
      std::uint32_t bad = 0;
      for (int h = 0; h < 2; ++h) {
        const __m256 ok =
            _mm256_and_ps(_mm256_cmp_ps(maxp[h], threshold, _CMP_GE_OQ), _mm256_cmp_ps(maxp[h], largest, _CMP_LE_OQ));
        bad |= (~static_cast<std::uint32_t>(_mm256_movemask_ps(ok)) & 0xFFu) << (8 * h);
        scale[h] = _mm256_and_ps(ok, _mm256_castsi256_ps(_mm256_sub_epi32(scale_base, _mm256_castps_si256(maxp[h]))));
        // c * scale is below 2^(F+1) in the lanes kept; the others hold 0 (scale 0) or NaN, whose
        // conversion (0x80000000) is never used.
        acc0[h] = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + 8 * h), scale[h]));
        acc1[h] = zero;
      }
      int kk = k0;
      for (; kk + 1 < k1; kk += 2) {
        const __m256 x0 = _mm256_broadcast_ss(aq + kk), x1 = _mm256_broadcast_ss(aq + kk + 1);
        const float* b0 = bp + std::size_t(kk) * 2 * kLanes;
        const float* b1 = b0 + 2 * kLanes;
        for (int h = 0; h < 2; ++h) {
          const __m256 p0 = _mm256_mul_ps(_mm256_mul_ps(x0, _mm256_loadu_ps(b0 + 8 * h)), scale[h]);
          const __m256 p1 = _mm256_mul_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(b1 + 8 * h)), scale[h]);
          acc0[h] = _mm256_add_epi32(acc0[h], _mm256_cvttps_epi32(p0));
          acc1[h] = _mm256_add_epi32(acc1[h], _mm256_cvttps_epi32(p1));
        }
      }
      if (kk < k1) {
        const __m256 x0 = _mm256_broadcast_ss(aq + kk);
        const float* b0 = bp + std::size_t(kk) * 2 * kLanes;
        for (int h = 0; h < 2; ++h)
          acc0[h] = _mm256_add_epi32(
              acc0[h], _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_mul_ps(x0, _mm256_loadu_ps(b0 + 8 * h)), scale[h])));
      }
      fallback[r] |= bad;
      // The block's end, in the MXCSR's rounding toward zero: the int32 sum
      // converted is the sum truncated to 24 bits, and the scaling truncates.
      // A sum that overflows int32 (rare) takes the integer route.
      __m256i total[2];
      int overflow = 0;
      for (int h = 0; h < 2; ++h) {
        total[h] = _mm256_add_epi32(acc0[h], acc1[h]);
        overflow |= _mm256_movemask_ps(_mm256_castsi256_ps(
            _mm256_and_si256(_mm256_xor_si256(acc0[h], total[h]), _mm256_xor_si256(acc1[h], total[h]))));
      }
      if (overflow == 0) {
        for (int h = 0; h < 2; ++h) {
          __m256 sum = _mm256_and_ps(_mm256_cvtepi32_ps(total[h]), significand_mask);
          const __m256 unscale = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(maxp[h]), unscale_offset));
          const __m256 kept = _mm256_castsi256_ps(_mm256_cmpeq_epi32(
              _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(~fallback[r] >> (8 * h))), lane_bits), lane_bits));
          _mm256_storeu_ps(c + 8 * h, _mm256_and_ps(kept, _mm256_mul_ps(sum, unscale)));
        }
      } else {
        alignas(32) std::int32_t sum0[kLanes], sum1[kLanes];
        alignas(32) float top[kLanes];
        for (int h = 0; h < 2; ++h) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(sum0 + 8 * h), acc0[h]);
          _mm256_store_si256(reinterpret_cast<__m256i*>(sum1 + 8 * h), acc1[h]);
          _mm256_store_ps(top + 8 * h, maxp[h]);
        }
        finish_block(p, sum0, sum1, top, c, fallback[r]);
      }
    }
  }
  _mm_setcsr(csr);
}
#endif

using TileFunction = void (*)(const Plan&, const Operands&, int, int, float*, std::uint32_t*);

constexpr int kRows = 4;  // rows per tile

struct Kernel {
  TileFunction full, single;  // kRows rows, 1 row
  std::string_view name;
};

Kernel choose_kernel() {
  const std::string_view forced = forced_target();
#if defined(__x86_64__)
  if (have_avx512() && forced.empty()) return {tile_avx512<kRows>, tile_avx512<1>, "avx512"};
  if (have_avx2() && forced != "portable") return {tile_avx2<kRows>, tile_avx2<1>, "avx2"};
#endif
  return {tile_portable<kRows>, tile_portable<1>, "portable"};
}

// Keeps subnormals (no FTZ/DAZ) while the kernel runs: its exactness argument needs them.
class GradualUnderflow {
 public:
#if defined(__x86_64__)
  GradualUnderflow() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~0x8040u); }
  ~GradualUnderflow() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
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
  const Kernel kernel = choose_kernel();
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
          (rows == kRows ? kernel.full : kernel.single)(plan, o, i, panel, tile, fallback);
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

std::string_view gemm_kernel_name(const AccumulationModel& model) {
  if (!fast_plan(model)) return "scalar";
  return choose_kernel().name;
}

void gemm(const AccumulationModel& model, const float* a, const float* b, float* c, int m, int n, int k,
          bool accumulate_c, int threads, Path path) {
  if (m < 0 || n < 0 || k < 0) throw std::invalid_argument("gemm: negative size");
  if (m == 0 || n == 0) return;
  const auto plan = fast_plan(model);
  if (plan && path != Path::scalar) return gemm_fast(model, *plan, a, b, c, m, n, k, accumulate_c, threads);
  if (path == Path::vector && !plan) throw std::invalid_argument("gemm: no vector kernel for " + to_string(model));
  gemm_elementwise(model, a, b, c, m, n, k, accumulate_c, threads);
}

}  // namespace mpsim
