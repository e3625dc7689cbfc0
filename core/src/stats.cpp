#include "mpsim/core/stats.hpp"

#include "mpsim/core/numerics.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <vector>

// The exponent histogram's kernels, compiled once per SIMD target by
// Highway (mpsim's one dispatch mechanism, emulation/include/mpsim/emulation/simd.hpp)
// and chosen at run time. AVX3_DL (AVX-512 with VBMI2, whose byte compression
// the window algorithm below uses most) is compiled beside the default targets.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/src/stats.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// What every target shares: defined once.
#ifndef MPSIM_CORE_STATS_SHARED
#define MPSIM_CORE_STATS_SHARED
namespace mpsim::core::stats_detail {

using FieldCounts = TensorStats::FieldCounts;

constexpr std::size_t chunk = 4096;
// The window algorithm's widths (count_fields_window): the first window is
// what one 16-byte table lookup can one-hot encode.
constexpr int window_width = 16, second_width = 24;

// Subnormal binades, infinities and NaNs of a chunk that holds any.
inline void resolve_special(const float* v, std::size_t m, FieldCounts& out) {
  for (std::size_t i = 0; i < m; ++i) {
    const std::uint32_t bits = magnitude_bits(v[i]);
    if (is_infinite_magnitude(bits)) ++out.infinite;
    else if (is_nan_magnitude(bits)) ++out.nan;
    else if (is_subnormal_magnitude(bits)) ++out.subnormal[subnormal_binade(bits)];  // binade 2^(k - 149)
  }
}

// Base of the `width` adjacent fields in 1..254 that hold the most values.
inline int best_window(const std::uint32_t* field, int width) {
  std::uint64_t sum = 0;
  for (int e = 1; e < 1 + width; ++e) sum += field[e];
  std::uint64_t best = sum;
  int best_base = 1;
  for (int base = 2; base + width - 1 <= 254; ++base) {
    sum += field[base + width - 1];
    sum -= field[base - 1];
    if (sum > best) best = sum, best_base = base;
  }
  return best_base;
}

// The two windows for values with these field counts.
inline std::pair<int, int> place_windows(std::array<std::uint32_t, 256> counts) {
  const int first = best_window(counts.data(), window_width);
  std::fill_n(counts.begin() + first, window_width, 0);
  return {first, best_window(counts.data(), second_width)};
}

}  // namespace mpsim::core::stats_detail
#endif  // MPSIM_CORE_STATS_SHARED

HWY_BEFORE_NAMESPACE();
namespace mpsim::core::HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;
using namespace stats_detail;

// The vectorisable pass over one chunk: the exponent field of each value into
// `keys`, whether any is subnormal, infinite or NaN, and the range of fields
// 1..254 seen, kept as min(field - 1) and max(field + 1) in 8-bit arithmetic so
// that fields 0 and 255 fall outside it.
bool extract_fields(const float* v, std::size_t m, std::uint8_t* keys, std::uint8_t& low_minus_1,
                    std::uint8_t& high_plus_1) {
  const hn::ScalableTag<std::uint8_t> d8;
  const hn::Repartition<std::uint32_t, decltype(d8)> du;
  const hn::Repartition<float, decltype(d8)> df;
  const std::size_t lanes = hn::Lanes(du), block = hn::Lanes(d8);
  const auto magnitude = hn::Set(du, 0x7fffffffu), one = hn::Set(du, 1u), below_normal = hn::Set(du, 0x7fffffu);
  const auto one8 = hn::Set(d8, std::uint8_t{1}), top8 = hn::Set(d8, std::uint8_t{255});
  auto lo = hn::Set(d8, low_minus_1), hi = hn::Set(d8, high_plus_1);
  auto special = hn::Zero(du);
  auto special8 = hn::Zero(d8);
  std::size_t i = 0;
  // Four vectors of values make one of keys: the keys of vector j go to byte
  // j of each 32-bit lane (the order of the keys does not matter to the
  // counts; Highway 1.0.3's TruncateTo to 8 bits is wrong on AVX3_DL). A
  // target whose byte vectors are not four times its 32-bit ones (SCALAR:
  // one lane each) leaves everything to the tail loop; reading four vectors
  // per key vector there ran past the values (AddressSanitizer found it).
  const bool four_per_key = block == 4 * lanes;
  for (; four_per_key && i + block <= m; i += block) {
    auto packed = hn::Zero(du);
    for (int j = 0; j < 4; ++j) {
      const auto bits = hn::And(hn::BitCast(du, hn::LoadU(df, v + i + j * lanes)), magnitude);
      packed = hn::Or(packed, hn::ShiftLeftSame(hn::ShiftRight<23>(bits), 8 * j));
      special = hn::Or(special, hn::VecFromMask(du, hn::Lt(hn::Sub(bits, one), below_normal)));  // subnormal
    }
    const auto key = hn::BitCast(d8, packed);
    hn::StoreU(key, d8, keys + i);
    special8 = hn::Or(special8, hn::VecFromMask(d8, hn::Eq(key, top8)));  // infinite or NaN
    lo = hn::Min(lo, hn::Sub(key, one8));
    hi = hn::Max(hi, hn::Add(key, one8));
  }
  bool any = !hn::AllTrue(du, hn::Eq(special, hn::Zero(du))) || !hn::AllTrue(d8, hn::Eq(special8, hn::Zero(d8)));
  alignas(64) std::uint8_t lo_lanes[64], hi_lanes[64];
  hn::Store(lo, d8, lo_lanes);
  hn::Store(hi, d8, hi_lanes);
  std::uint8_t lo_m1 = low_minus_1, hi_p1 = high_plus_1;
  for (std::size_t l = 0; l < block; ++l) {
    lo_m1 = std::min(lo_m1, lo_lanes[l]);
    hi_p1 = std::max(hi_p1, hi_lanes[l]);
  }
  for (; i < m; ++i) {  // the tail, one by one, by numerics.hpp's rule (the CUDA histogram's too)
    const std::uint32_t bits = magnitude_bits(v[i]);
    const auto key = static_cast<std::uint8_t>(exponent_field(bits));
    keys[i] = key;
    any = any || is_subnormal_magnitude(bits) || key == 255;
    lo_m1 = std::min<std::uint8_t>(lo_m1, static_cast<std::uint8_t>(key - 1));
    hi_p1 = std::max<std::uint8_t>(hi_p1, static_cast<std::uint8_t>(key + 1));
  }
  low_minus_1 = lo_m1;
  high_plus_1 = hi_p1;
  return any;
}

// A few values (fewer than 2048): four interleaved tables, so that
// repeated fields rarely wait on each other's increments. The tables stay
// zero between calls: only the fields seen, {0} u [lo, hi] u {255}, are read
// back and cleared, which keeps the cost of a call of 10 or 256 values (a
// bias and its gradient) small.
void count_fields_small(std::span<const float> values, FieldCounts& out) {
  alignas(8) std::array<std::uint8_t, chunk> keys;
  thread_local std::array<std::array<std::uint32_t, 256>, 4> field{};
  std::uint8_t lo_m1 = 255, hi_p1 = 0;
  for (std::size_t start = 0; start < values.size(); start += chunk) {
    const std::size_t m = std::min(chunk, values.size() - start);
    if (extract_fields(values.data() + start, m, keys.data(), lo_m1, hi_p1))
      resolve_special(values.data() + start, m, out);
    std::size_t i = 0;
    for (; i + 4 <= m; i += 4)
      for (int t = 0; t < 4; ++t) ++field[t][keys[i + t]];
    for (; i < m; ++i) ++field[0][keys[i]];
  }
  auto drain = [&](int e) {
    out.field[e] += std::uint64_t{field[0][e]} + field[1][e] + field[2][e] + field[3][e];
    for (auto& table : field) table[e] = 0;
  };
  drain(0);
  drain(255);
  for (int e = std::max(1, lo_m1 + 1); e <= std::min(254, hi_p1 - 1); ++e) drain(e);
}

// Adds counts[0..n) to field[0..n), clears them and returns their sum (a
// plain loop: the compiler vectorises it for each target).
std::uint64_t drain_range(std::uint16_t* counts, std::uint64_t* field, int n) {
  std::uint64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    field[i] += counts[i];
    sum += counts[i];
    counts[i] = 0;
  }
  return sum;
}

// Many values: count PAIRS of consecutive fields, one increment per two values
// (two key bytes read as one 16-bit index), alternating between two tables of
// 2^16 16-bit counters. A scalar histogram is bound by its memory operations,
// and pairs halve them; 16-bit counters halve the cache lines touched when the
// values span many binades. About 2x faster than one increment per value
// (eight interleaved tables) on 200K weights, post-ReLU activations and
// gradients (bench: 0.16-0.21 ns per value, 2026-11-21). Tables stay zero
// between calls: only the pairs of fields that occurred, within
// {0} u [lo, hi] u {255}, are read back and cleared.
void count_fields_pairs(std::span<const float> values, FieldCounts& out) {
  constexpr std::size_t pair_count = std::size_t{1} << 16;
  // A table gets a quarter of the values' pairs: draining every 2^17 values
  // keeps every counter below 2^16.
  constexpr std::size_t drain_interval = std::size_t{1} << 17;
  static_assert(drain_interval % chunk == 0);
  thread_local std::vector<std::uint16_t> pairs(2 * pair_count, 0);
  std::uint16_t* const even = pairs.data();
  std::uint16_t* const odd = pairs.data() + pair_count;
  alignas(8) std::array<std::uint8_t, chunk> keys;
  std::uint8_t lo_m1 = 255, hi_p1 = 0;
  auto drain = [&] {
    const int lo = std::max(1, lo_m1 + 1), hi = std::min(254, hi_p1 - 1);
    // A row holds the pairs with one second field; its columns are the first fields.
    auto drain_row = [&](std::uint16_t* row) {
      std::uint64_t sum = 0;
      for (const int first : {0, 255}) out.field[first] += row[first], sum += row[first], row[first] = 0;
      if (lo <= hi) sum += drain_range(row + lo, out.field.data() + lo, hi - lo + 1);
      return sum;
    };
    for (std::uint16_t* table : {even, odd}) {
      for (const int second : {0, 255}) out.field[second] += drain_row(table + (second << 8));
      for (int second = lo; second <= hi; ++second) out.field[second] += drain_row(table + (second << 8));
    }
    lo_m1 = 255;
    hi_p1 = 0;
  };
  for (std::size_t start = 0; start < values.size(); start += chunk) {
    const std::size_t m = std::min(chunk, values.size() - start);
    if (extract_fields(values.data() + start, m, keys.data(), lo_m1, hi_p1))
      resolve_special(values.data() + start, m, out);
    std::size_t i = 0;
    for (; i + 8 <= m; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, keys.data() + i, sizeof w);  // a pair counts both its fields, so byte order does not matter
      ++even[w & 0xffff];
      ++odd[(w >> 16) & 0xffff];
      ++even[(w >> 32) & 0xffff];
      ++odd[w >> 48];
    }
    for (; i < m; ++i) ++out.field[keys[i]];
    if ((start + m) % drain_interval == 0) drain();
  }
  if (values.size() % drain_interval != 0) drain();
}

#if HWY_TARGET != HWY_SCALAR
// Many values, with no per-value memory increments for almost all of them
// (the fastest path on AVX-512 targets; window_is_fastest below).
// Each block of one vector of bytes (64 values on AVX-512) is reduced to its
// exponent bytes. Those in a window of 16 adjacent fields become one-hot
// bytes, one bit per field, in two vectors (fields base..base+7 and
// base+8..base+15), and a positional population count adds them up: a
// carry-save adder tree over 16 blocks (Harley-Seal; Mula, Kurz and Lemire,
// "Faster population counts using AVX2 instructions", Computer Journal 61(1),
// 2018; applied per bit position as in Klarqvist, Mula and Lemire, "Efficient
// computation of positional population counts using SIMD instructions", 2021)
// costs about two logic operations per vector, and only its 16s are counted
// bit by bit. Zeros (field 0) are counted by a mask population count. Fields
// outside {0} u window are compressed into a list, which a second pass
// compares with a second window of 24 (cheap: it sees only the outliers); what
// is left is counted one by one. Weights, activations and gradients mostly
// span fewer than 40 binades, with two modes at times (a layer's inputs that
// are often exactly zero make gradients in two clusters). The windows are
// placed by a sample spread over the array and moved when a chunk has more
// than a few values outside both (count_fields_window).

// majority(a, b, c), bit by bit: one ternary-logic instruction on AVX-512
// (truth table 0xE8: set where at least two of a, b, c are), which Highway
// 1.0.3 does not offer; three logic operations elsewhere.
template <class V>
HWY_INLINE V majority(V a, V b, V c) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (sizeof(a.raw) == 64) return V{_mm512_ternarylogic_epi32(a.raw, b.raw, c.raw, 0xE8)};
#endif
  return hn::OrAnd(hn::And(a, b), c, hn::Or(a, b));
}

// One carry-save adder: a + b + c = 2 * carry + sum, bit by bit.
template <class V>
HWY_INLINE void carry_save(V& carry, V& sum, V a, V b, V c) {
  sum = hn::Xor3(a, b, c);
  carry = majority(a, b, c);
}

// field[j] += weight * (number of bytes of `bits` with bit j set), j < 8.
template <class D>
HWY_INLINE void add_bit_counts(D d, hn::Vec<D> bits, std::uint32_t weight, std::uint32_t* field) {
  for (int j = 0; j < 8; ++j) {
    const auto set = hn::TestBit(bits, hn::Set(d, static_cast<std::uint8_t>(1u << j)));
    field[j] += weight * static_cast<std::uint32_t>(hn::CountTrue(d, set));
  }
}

// Sum of the 8-bit counters of a vector.
template <class D>
HWY_INLINE std::uint32_t byte_total(D d, hn::Vec<D> counts) {
  const hn::Repartition<std::uint64_t, D> d64;
  return static_cast<std::uint32_t>(hn::GetLane(hn::SumOfLanes(d64, hn::SumsOf8(counts))));
}

struct FirstPass {
  std::size_t outliers = 0;    // fields outside {0} u window, stored in the list
  bool has_subnormal = false;  // a block held a subnormal value
};

// Counts blocks vectors' worth of values of v (at most a chunk: the list holds
// a chunk and one vector more): fields in {0} u [base, base + window_width)
// into `field`, the others into `outliers`.
FirstPass count_first_window(const float* v, std::size_t blocks, int base, std::uint32_t* field,
                             std::uint8_t* outliers) {
  const hn::ScalableTag<std::uint8_t> d8;
  const hn::Repartition<std::uint32_t, decltype(d8)> d32;
  const hn::Repartition<float, decltype(d8)> df;
  using V8 = hn::Vec<decltype(d8)>;
  const std::size_t block = hn::Lanes(d8), lanes32 = hn::Lanes(d32);
  // One-hot tables, indexed by the low 4 bits of field - base (per 16 bytes).
  alignas(16) static constexpr std::uint8_t low_table[16] = {1, 2, 4, 8, 16, 32, 64, 128, 0, 0, 0, 0, 0, 0, 0, 0};
  alignas(16) static constexpr std::uint8_t high_table[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, 128};
  const V8 low_onehot = hn::LoadDup128(d8, low_table), high_onehot = hn::LoadDup128(d8, high_table);
  const V8 zero = hn::Zero(d8);
  const auto zero32 = hn::Zero(d32), magnitude = hn::Set(d32, 0x7fffffffu), exponent_bits = hn::Set(d32, 0x7f800000u);
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3_DL
  // Byte i of a permutation's result: byte 3 of lane i mod 16 of the first
  // table (i mod 32 < 16) or of the second; both halves alike.
  alignas(64) static constexpr auto gather_table = [] {
    std::array<std::uint8_t, 64> t{};
    for (int i = 0; i < 64; ++i) t[i] = static_cast<std::uint8_t>((i % 32 < 16 ? 0 : 64) + 4 * (i % 16) + 3);
    return t;
  }();
  const V8 gather = hn::Load(d8, gather_table.data());
#else
  const auto byte1 = hn::Set(d32, 0xff00u), byte2 = hn::Set(d32, 0xff0000u), byte3 = hn::Set(d32, 0xff000000u);
#endif
  // (field - base) + 0x70 with unsigned saturation: offsets 0..15 become
  // 0x70..0x7f, the others have bit 7 set and look up zero. field 0 and 255
  // are outside: base >= 1 and base + 15 <= 254.
  const V8 base_vec = hn::Set(d8, static_cast<std::uint8_t>(base)), bias = hn::Set(d8, std::uint8_t{0x70});
  std::size_t n_out = 0;
  std::uint64_t zeros = 0;
  auto subnormal = zero32;
  // One block: its one-hot vectors for the low and high 8 fields.
  auto one_hot = [&](std::size_t b, V8& low, V8& high) HWY_ATTR {
    if (b >= blocks) {
      low = high = zero;
      return;
    }
    const float* p = v + block * b;
    // Byte 3 of each 32-bit lane of (bits + bits) is the exponent field: the
    // fields of four vectors go to bytes 0, 1, 2 and 3 of one (their order
    // does not matter to their counts).
    const auto x0 = hn::BitCast(d32, hn::LoadU(df, p)), x1 = hn::BitCast(d32, hn::LoadU(df, p + lanes32));
    const auto x2 = hn::BitCast(d32, hn::LoadU(df, p + 2 * lanes32));
    const auto x3 = hn::BitCast(d32, hn::LoadU(df, p + 3 * lanes32));
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3_DL
    // AVX-512 VBMI: two two-table byte permutations gather byte 3 of every
    // lane of (x0, x1) and of (x2, x3), and a blend joins the halves.
    const __m512i r01 = _mm512_permutex2var_epi8(hn::Add(x0, x0).raw, gather.raw, hn::Add(x1, x1).raw);
    const __m512i r23 = _mm512_permutex2var_epi8(hn::Add(x2, x2).raw, gather.raw, hn::Add(x3, x3).raw);
    const V8 fields{_mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, r01, r23)};
#else
    auto packed = hn::ShiftRight<24>(hn::Add(x0, x0));
    packed = hn::OrAnd(packed, hn::ShiftRight<16>(hn::Add(x1, x1)), byte1);
    packed = hn::OrAnd(packed, hn::ShiftRight<8>(hn::Add(x2, x2)), byte2);
    packed = hn::OrAnd(packed, hn::Add(x3, x3), byte3);
    const V8 fields = hn::BitCast(d8, packed);
#endif
    const auto is_zero = hn::Eq(fields, zero);
    zeros += hn::CountTrue(d8, is_zero);
    // Field 0 with a nonzero magnitude is subnormal.
    if (!hn::AllFalse(d8, is_zero)) {
      auto subnormal_in = [&](decltype(zero32) x) HWY_ATTR {
        return hn::VecFromMask(d32, hn::AndNot(hn::Eq(hn::And(x, magnitude), zero32),
                                               hn::Eq(hn::And(x, exponent_bits), zero32)));
      };
      subnormal = hn::Or(hn::Or(subnormal, hn::Or(subnormal_in(x0), subnormal_in(x1))),
                         hn::Or(subnormal_in(x2), subnormal_in(x3)));
    }
    const V8 offset = hn::SaturatedAdd(hn::Sub(fields, base_vec), bias);
    low = hn::TableLookupBytesOr0(low_onehot, offset);
    high = hn::TableLookupBytesOr0(high_onehot, offset);
    const auto outside = hn::AndNot(is_zero, hn::Eq(hn::Or(low, high), zero));
    // Compress in a register, then store: AVX-512's compress to memory is
    // microcoded and slow on AMD Zen 4 and 5.
    hn::StoreU(hn::Compress(fields, outside), d8, outliers + n_out);
    n_out += hn::CountTrue(d8, outside);
  };
  // The adder tree, for the low [0] and high [1] one-hot vectors: the running
  // 1s, 2s, 4s and 8s bit planes, and partial results of the current group of
  // 16 blocks (8 pairs) that wait for their partner.
  V8 ones[2] = {zero, zero}, twos[2] = {zero, zero}, fours[2] = {zero, zero}, eights[2] = {zero, zero};
  V8 twos_a[2] = {zero, zero}, fours_a[2] = {zero, zero}, eights_a[2] = {zero, zero};
  std::size_t pair = 0;
  for (std::size_t b = 0; b < blocks; b += 2, ++pair) {
    V8 d[2][2];
    one_hot(b, d[0][0], d[1][0]);
    one_hot(b + 1, d[0][1], d[1][1]);
    for (int g = 0; g < 2; ++g) {
      V8 twos_b, fours_b, eights_b, sixteens;
      if (pair % 2 == 0) {
        carry_save(twos_a[g], ones[g], ones[g], d[g][0], d[g][1]);
        continue;
      }
      carry_save(twos_b, ones[g], ones[g], d[g][0], d[g][1]);
      if (pair % 4 == 1) {
        carry_save(fours_a[g], twos[g], twos[g], twos_a[g], twos_b);
        continue;
      }
      carry_save(fours_b, twos[g], twos[g], twos_a[g], twos_b);
      if (pair % 8 == 3) {
        carry_save(eights_a[g], fours[g], fours[g], fours_a[g], fours_b);
        continue;
      }
      carry_save(eights_b, fours[g], fours[g], fours_a[g], fours_b);
      carry_save(sixteens, eights[g], eights[g], eights_a[g], eights_b);
      add_bit_counts(d8, sixteens, 16, field + base + 8 * g);
    }
  }
  for (int g = 0; g < 2; ++g) {
    std::uint32_t* const f = field + base + 8 * g;
    add_bit_counts(d8, ones[g], 1, f);
    add_bit_counts(d8, twos[g], 2, f);
    add_bit_counts(d8, fours[g], 4, f);
    add_bit_counts(d8, eights[g], 8, f);
    // Partial results still waiting for a partner (the last group had fewer than 8 pairs).
    if (pair % 2 == 1) add_bit_counts(d8, twos_a[g], 2, f);
    if (pair % 4 >= 2) add_bit_counts(d8, fours_a[g], 4, f);
    if (pair % 8 >= 4) add_bit_counts(d8, eights_a[g], 8, f);
  }
  field[0] += static_cast<std::uint32_t>(zeros);
  FirstPass result;
  result.outliers = n_out;
  result.has_subnormal = !hn::AllTrue(d32, hn::Eq(subnormal, zero32));
  return result;
}

// The second pass: counts the fields of list[0..n) (n <= chunk) in
// [base, base + second_width) into `field` and moves the others to the front
// of the list; returns how many there are.
std::size_t count_second_window(std::uint8_t* list, std::size_t n, int base, std::uint32_t* field) {
  const hn::ScalableTag<std::uint8_t> d8;
  using V8 = hn::Vec<decltype(d8)>;
  const std::size_t lanes = hn::Lanes(d8);
  const V8 zero = hn::Zero(d8), base_vec = hn::Set(d8, static_cast<std::uint8_t>(base));
  const V8 last = hn::Set(d8, static_cast<std::uint8_t>(second_width - 1));
  V8 in_window[second_width];
  for (auto& c : in_window) c = zero;
  auto drain = [&]() HWY_ATTR {
    for (int j = 0; j < second_width; ++j) {
      field[base + j] += byte_total(d8, in_window[j]);
      in_window[j] = zero;
    }
  };
  std::size_t n_out = 0, steps = 0;
  for (std::size_t i = 0; i < n; i += lanes) {
    const auto valid = hn::FirstN(d8, std::min(n - i, lanes));  // Highway 1.0.3's FirstN wraps counts above 127 of 8-bit lanes
    // Lanes past n hold 0 - base, never in the window (base >= 1).
    const V8 offset = hn::Sub(hn::MaskedLoad(valid, d8, list + i), base_vec);
    for (int j = 0; j < second_width; ++j)
      in_window[j] = hn::Sub(in_window[j], hn::VecFromMask(d8, hn::Eq(offset, hn::Set(d8, static_cast<std::uint8_t>(j)))));
    const auto outside = hn::AndNot(hn::Eq(hn::Min(offset, last), offset), valid);
    // In place: the bytes stored at n_out <= i end within the vector just read.
    hn::StoreU(hn::Compress(hn::Add(offset, base_vec), outside), d8, list + n_out);
    n_out += hn::CountTrue(d8, outside);
    if (++steps == 255) {  // before the 8-bit counters can wrap (vectors of 16 bytes)
      drain();
      steps = 0;
    }
  }
  drain();
  return n_out;
}

void count_fields_window(std::span<const float> values, FieldCounts& out) {
  const hn::ScalableTag<std::uint8_t> d8;
  const std::size_t block = hn::Lanes(d8);
  // Counts of the chunks so far, added to `out` every 2^30 values and at the end.
  constexpr std::size_t flush_interval = std::size_t{1} << 30;
  static_assert(flush_interval % chunk == 0);
  alignas(64) std::array<std::uint8_t, chunk + 64> outliers;
  std::array<std::uint32_t, 256> counts{};
  auto flush = [&] {
    for (int e = 0; e < 256; ++e) out.field[e] += counts[e];
    counts.fill(0);
  };
  // The windows start where a sample of the values is: 16 runs of 16 values
  // (a cache line each) spread over the span, since the magnitudes often
  // drift along a tensor (rows of a weight gradient that see different inputs).
  std::pair<int, int> windows;
  {
    std::array<std::uint32_t, 256> sample{};
    const std::size_t run = 16, runs = 16, stride = values.size() / runs;
    for (std::size_t r = 0; r < runs; ++r)
      for (std::size_t i = r * stride; i < std::min(values.size(), r * stride + run); ++i)
        ++sample[(std::bit_cast<std::uint32_t>(values[i]) >> 23) & 0xffu];
    windows = place_windows(sample);
  }
  bool moved = false;  // the windows were moved after the last chunk
  std::size_t start = 0;
  for (; start < values.size(); start += chunk) {
    const float* v = values.data() + start;
    const std::size_t m = std::min(chunk, values.size() - start);
    const std::array<std::uint32_t, 256> before = counts;  // a 1 KiB copy: this chunk's counts are the difference
    bool special = false;
    auto count_one_by_one = [&](std::size_t from, std::size_t to) {
      for (std::size_t i = from; i < to; ++i) {
        const std::uint32_t bits = magnitude_bits(v[i]);
        ++counts[exponent_field(bits)];
        special |= is_subnormal_magnitude(bits) || exponent_field(bits) == 255;
      }
    };
    const std::size_t blocks = m / block;
    const auto first = count_first_window(v, blocks, windows.first, counts.data(), outliers.data());
    // A short list is cheaper to count one by one than to pass through the second window.
    std::size_t left = first.outliers, outside_both = 0;
    if (left >= 64) left = outside_both = count_second_window(outliers.data(), left, windows.second, counts.data());
    for (std::size_t k = 0; k < left; ++k) ++counts[outliers[k]];
    count_one_by_one(block * blocks, m);
    if (special || first.has_subnormal || counts[255] != before[255]) resolve_special(v, m, out);
    if ((start + m) % flush_interval == 0) flush();
    if (outside_both > m / 64) {
      // More than a few values outside both windows (each costs a memory
      // increment): move them to where this chunk's values are, or, when the
      // values span too many binades for any two windows, count pairs.
      if (moved && outside_both > m / 4) {
        start += chunk;
        break;
      }
      std::array<std::uint32_t, 256> this_chunk;
      for (int e = 0; e < 256; ++e) this_chunk[e] = counts[e] - before[e];
      windows = place_windows(this_chunk);
      moved = true;
    } else {
      moved = false;
    }
  }
  flush();
  if (start < values.size()) count_fields_pairs(values.subspan(start), out);
}
// The targets where the window algorithm is the faster one: AVX-512, with or
// without VBMI2's byte compression (without it, Highway compresses 16-bit
// halves). On AVX2 and narrower targets pairs are 2-3x faster (bench_stats
// BM_fields, 2026-11-25).
constexpr bool window_is_fastest = HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3;
#else
void count_fields_window(std::span<const float> values, FieldCounts& out) { count_fields_pairs(values, out); }
constexpr bool window_is_fastest = false;
#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace

void CountFields(std::span<const float> values, FieldCounts& out, FieldCountPath path) {
  switch (path) {
    case FieldCountPath::window: return count_fields_window(values, out);
    case FieldCountPath::pairs: return count_fields_pairs(values, out);
    case FieldCountPath::automatic: break;
  }
  if (values.size() < 2048) return count_fields_small(values, out);
  if (window_is_fastest) return count_fields_window(values, out);
  count_fields_pairs(values, out);
}

}  // namespace mpsim::core::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mpsim::core {
HWY_EXPORT(CountFields);

TensorStats::FieldCounts count_fields(std::span<const float> values, FieldCountPath path) {
  TensorStats::FieldCounts counts;
  HWY_DYNAMIC_DISPATCH(CountFields)(values, counts, path);
  return counts;
}

TensorStats& TensorStats::operator+=(const TensorStats& other) {
  for (int i = 0; i < Binades::bin_count; ++i) histogram[i] += other.histogram[i];
  for (int i = 0; i < counter_count; ++i) counters[i] += other.counters[i];
  return *this;
}

TensorStats::Classes TensorStats::add_values(std::span<const float> values, int threads) {
  // Below this size a parallel region costs more than it saves.
  constexpr std::size_t min_values_per_thread = std::size_t{1} << 14;
  const std::size_t parts =
      std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), values.size() / min_values_per_thread);
  FieldCounts c;
  if (parts <= 1) {
    HWY_DYNAMIC_DISPATCH(CountFields)(values, c, FieldCountPath::automatic);
    return add_field_counts(c);
  }
  // Counts are sums, so the split does not change them. OpenMP's team is the
  // one OpenBLAS's GEMMs use, already awake (core/CMakeLists.txt).
  std::array<FieldCounts, 8> partial{};
  const std::size_t used = std::min<std::size_t>(parts, partial.size());
  const std::size_t piece = (values.size() / used + 63) / 64 * 64;
#pragma omp parallel for num_threads(static_cast<int>(used)) schedule(static, 1)
  for (std::size_t p = 0; p < used; ++p) {
    const std::size_t from = std::min(values.size(), p * piece);
    HWY_DYNAMIC_DISPATCH(CountFields)(values.subspan(from, std::min(piece, values.size() - from)), partial[p],
                                      FieldCountPath::automatic);
  }
  for (std::size_t p = 0; p < used; ++p) {
    for (int e = 0; e < 256; ++e) c.field[e] += partial[p].field[e];
    for (int k = 0; k < 23; ++k) c.subnormal[k] += partial[p].subnormal[k];
    c.infinite += partial[p].infinite;
    c.nan += partial[p].nan;
  }
  return add_field_counts(c);
}

TensorStats::Classes TensorStats::add_field_counts(const FieldCounts& c) {
  Histogram h{};
  for (int e = 1; e < 255; ++e) h[Binades::bin_of_exponent(e - 127)] = c.field[e];  // field e: binade 2^(e - 127)
  Classes classes;
  for (int k = 0; k < 23; ++k) h[Binades::bin_of_exponent(k - 149)] = c.subnormal[k], classes.subnormal += c.subnormal[k];
  h[Binades::zero_bin] = c.field[0] - classes.subnormal;
  h[Binades::infinity_bin] = classes.infinite = c.infinite;
  h[Binades::nan_bin] = classes.nan = c.nan;
  std::uint64_t below = 0, elements = 0;
  for (int e = Binades::min_exponent; e < -24; ++e) below += h[Binades::bin_of_exponent(e)];
  for (int b = 0; b < Binades::bin_count; ++b) histogram[b] += h[b], elements += h[b];
  (*this)[Counter::elements] += elements;
  (*this)[Counter::nonzero] += elements - h[Binades::zero_bin];
  (*this)[Counter::below_2_24] += below;
  return classes;
}

void TensorStats::add_rounding(const QuantizeCounts& counts) {
  (*this)[Counter::rounded_to_zero] += counts.flushed_to_zero;
  (*this)[Counter::subnormal] += counts.subnormal;
  (*this)[Counter::overflow] += counts.overflow;
  (*this)[Counter::nan] += counts.nan;
  (*this)[Counter::inexact] += counts.inexact;
}

}  // namespace mpsim::core
#endif  // HWY_ONCE
