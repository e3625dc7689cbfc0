#include "mpsim/core/stats.hpp"

#include "mpsim/core/numerics.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MPSIM_HISTOGRAM_AVX512 1
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_epi32() as the unused
// merge operand, which its own flow analysis then reports as uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace mpsim::core {
namespace {

using FieldCounts = TensorStats::FieldCounts;

constexpr std::size_t chunk = 4096;

// The vectorisable pass over one chunk: the exponent field of each value into
// `keys`, how many are subnormal, infinite or NaN, and the range of fields
// 1..254 seen, kept as min(field - 1) and max(field + 1) in 8-bit arithmetic so
// that fields 0 and 255 fall outside it. Compiled for AVX-512 and for baseline
// x86-64 and chosen at load time: AVX-512 makes this pass about 4x faster.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "default")))
#endif
std::uint32_t extract_fields(const float* v, std::size_t m, std::uint8_t* keys, std::uint8_t& low_minus_1,
                             std::uint8_t& high_plus_1) {
  std::uint32_t special = 0;
  std::uint8_t lo = low_minus_1, hi = high_plus_1;
  for (std::size_t i = 0; i < m; ++i) {
    // numerics.hpp's classification, which the CUDA histogram kernel runs too.
    const std::uint32_t bits = magnitude_bits(v[i]);
    const auto key = static_cast<std::uint8_t>(exponent_field(bits));
    keys[i] = key;
    special += static_cast<std::uint32_t>(is_subnormal_magnitude(bits) || key == 255);
    lo = std::min<std::uint8_t>(lo, static_cast<std::uint8_t>(key - 1));
    hi = std::max<std::uint8_t>(hi, static_cast<std::uint8_t>(key + 1));
  }
  low_minus_1 = lo;
  high_plus_1 = hi;
  return special;
}

// Subnormal binades, infinities and NaNs of a chunk that holds any.
void resolve_special(const float* v, std::size_t m, FieldCounts& out) {
  for (std::size_t i = 0; i < m; ++i) {
    const std::uint32_t bits = magnitude_bits(v[i]);
    if (is_infinite_magnitude(bits)) ++out.infinite;
    else if (is_nan_magnitude(bits)) ++out.nan;
    else if (is_subnormal_magnitude(bits)) ++out.subnormal[subnormal_binade(bits)];  // binade 2^(k - 149)
  }
}

// A few values (fewer than a chunk): four interleaved tables, so that
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
    if (extract_fields(values.data() + start, m, keys.data(), lo_m1, hi_p1) != 0)
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

// Adds counts[0..n) to field[0..n), clears them and returns their sum.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "default")))
#endif
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
    if (extract_fields(values.data() + start, m, keys.data(), lo_m1, hi_p1) != 0)
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

#if MPSIM_HISTOGRAM_AVX512
// Many values on a CPU with AVX-512 VBMI2: no per-value memory increments for
// almost all values. Each block of 64 values is reduced to 64 exponent bytes.
// Those in a window of 16 adjacent fields become one-hot bytes, one bit per
// field, in two vectors (fields base..base+7 and base+8..base+15), and a
// positional population count adds them up: a carry-save adder tree over 16
// blocks (Harley-Seal; Mula, Kurz and Lemire, "Faster population counts using
// AVX2 instructions", Computer Journal 61(1), 2018; applied per bit position as
// in Klarqvist, Mula and Lemire, "Efficient computation of positional population
// counts using SIMD instructions", 2021) costs about two logic operations per
// vector, and only its 16s are counted bit by bit. Zeros (field 0) are counted
// by a mask population count. Fields outside {0} u window are compressed into
// a list, which a second pass compares with a second window of 24 (cheap: it
// sees only the outliers); what is left is counted one by one.
// Weights, activations and gradients mostly span fewer than 40 binades, with
// two modes at times (a layer's inputs that are often exactly zero make
// gradients in two clusters). The windows are placed by a sample spread over
// the array and moved when a chunk has more than a few values outside both
// (count_fields_window). This first pass
// replaced one that compared every byte with each of 12 fields (a masked byte
// add per field), and is about 1.6x faster than it (bench_stats, 2026-11-22).
constexpr int window_width = 16, second_width = 24;
#define MPSIM_TARGET_AVX512_VBMI2 __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vbmi2,popcnt")))

// Adds 1 to counts[j] in the lanes where offset == j, j < width.
template <int width>
MPSIM_TARGET_AVX512_VBMI2 inline void count_offsets(__m512i offset, __m512i* counts) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int j = 0; j < width; ++j) {
    const __mmask64 hit = _mm512_cmpeq_epi8_mask(offset, _mm512_set1_epi8(static_cast<char>(j)));
    counts[j] = _mm512_mask_add_epi8(counts[j], hit, counts[j], ones);
  }
}

// Sum of the 64 8-bit counters of a vector.
MPSIM_TARGET_AVX512_VBMI2 std::uint32_t byte_total(__m512i counts) {
  alignas(64) std::uint64_t sums[8];  // GCC 12's _mm512_reduce_add_epi64 warns of an uninitialised temporary
  _mm512_store_si512(sums, _mm512_sad_epu8(counts, _mm512_setzero_si512()));
  std::uint64_t total = 0;
  for (const std::uint64_t s : sums) total += s;
  return static_cast<std::uint32_t>(total);
}

// One carry-save adder: a + b + c = 2 * carry + sum, bit by bit.
MPSIM_TARGET_AVX512_VBMI2 inline void carry_save(__m512i& carry, __m512i& sum, __m512i a, __m512i b, __m512i c) {
  sum = _mm512_ternarylogic_epi32(a, b, c, 0x96);    // a ^ b ^ c
  carry = _mm512_ternarylogic_epi32(a, b, c, 0xe8);  // majority(a, b, c)
}

// field[j] += weight * (number of bytes of `bits` with bit j set), j < 8.
MPSIM_TARGET_AVX512_VBMI2 void add_bit_counts(__m512i bits, std::uint32_t weight, std::uint32_t* field) {
  for (int j = 0; j < 8; ++j) {
    const __mmask64 set = _mm512_test_epi8_mask(bits, _mm512_set1_epi8(static_cast<char>(1 << j)));
    field[j] += weight * static_cast<std::uint32_t>(__builtin_popcountll(set));
  }
}

struct FirstPass {
  std::size_t outliers = 0;  // fields outside {0} u window, stored in the list
  bool has_subnormal = false;  // a block held a subnormal value
};

// Counts blocks * 64 values of v (at most chunk / 64 blocks: the list holds a chunk): fields in
// {0} u [base, base + window_width) into `field`, the others into `outliers`.
MPSIM_TARGET_AVX512_VBMI2 FirstPass count_first_window(const float* v, std::size_t blocks, int base,
                                                       std::uint32_t* field, std::uint8_t* outliers) {
  // Byte 3 of each 32-bit lane of (bits + bits) is the exponent field. One
  // permutation gathers those of two vectors into bytes 0..31, another those
  // of the next two, kept in bytes 32..63: byte 16 i + k is lane k of vector i.
  alignas(64) std::uint8_t gather[64];
  for (int i = 0; i < 64; ++i) gather[i] = static_cast<std::uint8_t>((i % 32 < 16 ? 0 : 64) + 4 * (i % 16) + 3);
  // One-hot tables, indexed by the low 4 bits of field - base (per 128-bit lane).
  alignas(64) std::uint8_t low_table[64], high_table[64];
  for (int i = 0; i < 64; ++i) {
    const int offset = i % 16;
    low_table[i] = static_cast<std::uint8_t>(offset < 8 ? 1 << offset : 0);
    high_table[i] = static_cast<std::uint8_t>(offset < 8 ? 0 : 1 << (offset - 8));
  }
  const __m512i gather_index = _mm512_load_si512(gather);
  const __m512i low_onehot = _mm512_load_si512(low_table), high_onehot = _mm512_load_si512(high_table);
  const __m512i zero = _mm512_setzero_si512(), magnitude = _mm512_set1_epi32(0x7fffffff);
  // (field - base) + 0x70 with unsigned saturation: offsets 0..15 become
  // 0x70..0x7f, the others have bit 7 set and look up zero. field 0 and 255
  // are outside: base >= 1 and base + 15 <= 254.
  const __m512i base_vec = _mm512_set1_epi8(static_cast<char>(base)), bias = _mm512_set1_epi8(0x70);
  std::size_t n_out = 0;
  std::uint64_t zeros = 0;
  __mmask16 subnormal = 0;
  // One block: its one-hot vectors for the low and high 8 fields.
  auto one_hot = [&](std::size_t b, __m512i& low, __m512i& high) MPSIM_TARGET_AVX512_VBMI2 {
    if (b >= blocks) {
      low = high = zero;
      return;
    }
    const float* p = v + 64 * b;
    const __m512i x[4] = {_mm512_loadu_si512(p), _mm512_loadu_si512(p + 16), _mm512_loadu_si512(p + 32),
                          _mm512_loadu_si512(p + 48)};
    const __m512i fields =
        _mm512_mask_blend_epi8(0xffffffff00000000ull,
                               _mm512_permutex2var_epi8(_mm512_add_epi32(x[0], x[0]), gather_index,
                                                        _mm512_add_epi32(x[1], x[1])),
                               _mm512_permutex2var_epi8(_mm512_add_epi32(x[2], x[2]), gather_index,
                                                        _mm512_add_epi32(x[3], x[3])));
    const __mmask64 is_zero = _mm512_cmpeq_epi8_mask(fields, zero);
    zeros += static_cast<std::uint64_t>(__builtin_popcountll(is_zero));
    // Field 0 with a nonzero magnitude is subnormal. Bits 16 i .. 16 i + 15 of is_zero are vector i's lanes.
    if (is_zero != 0)
      for (int i = 0; i < 4; ++i)
        subnormal |= _mm512_mask_test_epi32_mask(static_cast<__mmask16>(is_zero >> (16 * i)), x[i], magnitude);
    const __m512i offset = _mm512_adds_epu8(_mm512_sub_epi8(fields, base_vec), bias);
    low = _mm512_shuffle_epi8(low_onehot, offset);
    high = _mm512_shuffle_epi8(high_onehot, offset);
    const __m512i any = _mm512_or_si512(low, high);
    const __mmask64 outside = _mm512_testn_epi8_mask(any, any) & ~is_zero;
    _mm512_storeu_si512(outliers + n_out, _mm512_maskz_compress_epi8(outside, fields));
    n_out += static_cast<std::size_t>(__builtin_popcountll(outside));
  };
  // The adder tree, for the low [0] and high [1] one-hot vectors: the running
  // 1s, 2s, 4s and 8s bit planes, and partial results of the current group of
  // 16 blocks (8 pairs) that wait for their partner.
  __m512i ones[2] = {zero, zero}, twos[2] = {zero, zero}, fours[2] = {zero, zero}, eights[2] = {zero, zero};
  __m512i twos_a[2] = {zero, zero}, fours_a[2] = {zero, zero}, eights_a[2] = {zero, zero};
  std::size_t pair = 0;
  for (std::size_t b = 0; b < blocks; b += 2, ++pair) {
    __m512i d[2][2];
    one_hot(b, d[0][0], d[1][0]);
    one_hot(b + 1, d[0][1], d[1][1]);
    for (int g = 0; g < 2; ++g) {
      __m512i twos_b, fours_b, eights_b, sixteens;
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
      add_bit_counts(sixteens, 16, field + base + 8 * g);
    }
  }
  for (int g = 0; g < 2; ++g) {
    std::uint32_t* const f = field + base + 8 * g;
    add_bit_counts(ones[g], 1, f);
    add_bit_counts(twos[g], 2, f);
    add_bit_counts(fours[g], 4, f);
    add_bit_counts(eights[g], 8, f);
    // Partial results still waiting for a partner (the last group had fewer than 8 pairs).
    if (pair % 2 == 1) add_bit_counts(twos_a[g], 2, f);
    if (pair % 4 >= 2) add_bit_counts(fours_a[g], 4, f);
    if (pair % 8 >= 4) add_bit_counts(eights_a[g], 8, f);
  }
  field[0] += static_cast<std::uint32_t>(zeros);
  FirstPass result;
  result.outliers = n_out;
  result.has_subnormal = subnormal != 0;
  return result;
}

// The second pass: counts the fields of list[0..n) (n <= 4096) in
// [base, base + second_width) into `field` and moves the others to the front
// of the list; returns how many there are.
MPSIM_TARGET_AVX512_VBMI2 std::size_t count_second_window(std::uint8_t* list, std::size_t n, int base,
                                                          std::uint32_t* field) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i base_vec = _mm512_set1_epi8(static_cast<char>(base)), width = _mm512_set1_epi8(second_width);
  __m512i in_window[second_width];
  for (auto& c : in_window) c = zero;
  std::size_t n_out = 0;
  for (std::size_t i = 0; i < n; i += 64) {
    const __mmask64 valid = n - i >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - i)) - 1;
    const __m512i offset = _mm512_sub_epi8(_mm512_maskz_loadu_epi8(valid, list + i), base_vec);
    // Lanes past n hold 0 - base, never in the window (base >= 1).
    count_offsets<second_width>(offset, in_window);
    const __mmask64 outside = _mm512_mask_cmpge_epu8_mask(valid, offset, width);
    // In place: the 64 bytes stored at n_out <= i end within the block just read.
    _mm512_storeu_si512(list + n_out, _mm512_add_epi8(_mm512_maskz_compress_epi8(outside, offset), base_vec));
    n_out += static_cast<std::size_t>(__builtin_popcountll(outside));
  }
  for (int j = 0; j < second_width; ++j) field[base + j] += byte_total(in_window[j]);
  return n_out;
}

// Base of the window_width adjacent fields in 1..254 that hold the most values.
int best_window(const std::uint32_t* field, int width) {
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
std::pair<int, int> place_windows(std::array<std::uint32_t, 256> counts) {
  const int first = best_window(counts.data(), window_width);
  std::fill_n(counts.begin() + first, window_width, 0);
  return {first, best_window(counts.data(), second_width)};
}

void count_fields_window(std::span<const float> values, FieldCounts& out) {
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
    const std::size_t blocks = m / 64;
    const auto first = count_first_window(v, blocks, windows.first, counts.data(), outliers.data());
    // A short list is cheaper to count one by one than to pass through the second window.
    std::size_t left = first.outliers, outside_both = 0;
    if (left >= 64) left = outside_both = count_second_window(outliers.data(), left, windows.second, counts.data());
    for (std::size_t k = 0; k < left; ++k) ++counts[outliers[k]];
    count_one_by_one(64 * blocks, m);
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

bool has_avx512_vbmi2() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2");
  return has;
}
#endif

void count_fields(std::span<const float> values, FieldCounts& out) {
#if MPSIM_HISTOGRAM_AVX512
  if (values.size() >= 2048 && has_avx512_vbmi2()) return count_fields_window(values, out);
#endif
  if (values.size() >= 2048)
    count_fields_pairs(values, out);
  else
    count_fields_small(values, out);
}

}  // namespace


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
    count_fields(values, c);
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
    count_fields(values.subspan(from, std::min(piece, values.size() - from)), partial[p]);
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
  (*this)[Counter::flushed] += counts.flushed_to_zero;
  (*this)[Counter::subnormal] += counts.subnormal;
  (*this)[Counter::overflow] += counts.overflow;
  (*this)[Counter::nan] += counts.nan;
  (*this)[Counter::inexact] += counts.inexact;
}

}  // namespace mpsim::core
