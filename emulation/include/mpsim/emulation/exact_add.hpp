// acc + P 2^e rounded once to binary32 (nearest even), host and device: the
// exact sum of a binary32 accumulator and a wide integer partial (up to 128
// bits, MXFP8 E5M2's block sums, which binary64 cannot hold), for
// block_scaled_dot_exact (block_dot.hpp) and so for the CUDA block GEMM.
//
// Both operands go into a 192-bit window whose bottom W lies 189 bits below
// the larger operand's top bit; that operand (at most 128 bits) fits whole.
// The other either fits too, or its bits below W are folded into a sticky bit
// at W: it is then at least two bits below the larger one's top, no
// cancellation can bring the sum's top within 24 bits of W, and any value
// strictly between two multiples of 2^(W + 1) rounds as the exact one does
// (the classic guard/sticky argument of floating-point adders: Goldberg, "What
// every computer scientist should know about floating-point arithmetic", 1991).
// Integer code only, written once for host and device.
#pragma once

#include <bit>
#include <cstdint>

#include "mpsim/emulation/host_device.hpp"

namespace mpsim {

namespace exact_add_detail {

// A 192-bit unsigned integer, least significant word first.
struct Wide {
  std::uint64_t w[3];
};

MPSIM_HOST_DEVICE inline int width_64(std::uint64_t x) {
  const auto high = static_cast<std::uint32_t>(x >> 32), low = static_cast<std::uint32_t>(x);
  return high != 0 ? 64 - std::countl_zero(high) : 32 - std::countl_zero(low);
}

MPSIM_HOST_DEVICE inline int width(const Wide& x) {
  return x.w[2] != 0 ? 128 + width_64(x.w[2]) : x.w[1] != 0 ? 64 + width_64(x.w[1]) : width_64(x.w[0]);
}

// The 128-bit (hi, lo) shifted left by s bits (0 <= s, the result within 192 bits).
MPSIM_HOST_DEVICE inline Wide shifted_left(std::uint64_t hi, std::uint64_t lo, int s) {
  const std::uint64_t source[3] = {lo, hi, 0};
  Wide r{{0, 0, 0}};
  const int words = s / 64, bits = s % 64;
  for (int i = words; i < 3; ++i) {
    const int j = i - words;
    r.w[i] = source[j] << bits;
    if (bits != 0 && j >= 1) r.w[i] |= source[j - 1] >> (64 - bits);
  }
  return r;
}

// (hi, lo) shifted right by s > 0 bits, every bit shifted out ORed into bit 0.
MPSIM_HOST_DEVICE inline void shift_right_sticky(std::uint64_t& hi, std::uint64_t& lo, int s) {
  bool lost = false;
  if (s >= 128) {
    lost = (hi | lo) != 0;
    hi = lo = 0;
  } else if (s >= 64) {
    lost = lo != 0 || (s > 64 && (hi & ((std::uint64_t{1} << (s - 64)) - 1)) != 0);
    lo = s == 64 ? hi : hi >> (s - 64);
    hi = 0;
  } else {
    lost = (lo & ((std::uint64_t{1} << s) - 1)) != 0;
    lo = (lo >> s) | (hi << (64 - s));
    hi >>= s;
  }
  lo |= lost ? 1u : 0u;
}

MPSIM_HOST_DEVICE inline Wide plus(const Wide& x, const Wide& y) {
  Wide r{{0, 0, 0}};
  std::uint64_t carry = 0;
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t s = x.w[i] + y.w[i];
    const std::uint64_t c1 = s < x.w[i] ? 1u : 0u;
    r.w[i] = s + carry;
    carry = c1 + (r.w[i] < s ? 1u : 0u);
  }
  return r;
}

MPSIM_HOST_DEVICE inline Wide minus(const Wide& x, const Wide& y) {  // x >= y
  Wide r{{0, 0, 0}};
  std::uint64_t borrow = 0;
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t d = x.w[i] - y.w[i];
    const std::uint64_t b1 = x.w[i] < y.w[i] ? 1u : 0u;
    r.w[i] = d - borrow;
    borrow = b1 + (d < borrow ? 1u : 0u);
  }
  return r;
}

MPSIM_HOST_DEVICE inline bool less(const Wide& x, const Wide& y) {
  for (int i = 2; i >= 0; --i)
    if (x.w[i] != y.w[i]) return x.w[i] < y.w[i];
  return false;
}

// 64 bits of x from bit `at` up (0 <= at; none from 192 up).
MPSIM_HOST_DEVICE inline std::uint64_t bits_from(const Wide& x, int at) {
  if (at >= 192) return 0;
  const int word = at / 64, off = at % 64;
  std::uint64_t v = x.w[word] >> off;
  if (off != 0 && word + 1 < 3) v |= x.w[word + 1] << (64 - off);
  return v;
}

// Whether any of x's bits 0 .. at - 1 is set.
MPSIM_HOST_DEVICE inline bool any_below(const Wide& x, int at) {
  for (int i = 0; i < 3 && at > 0; ++i, at -= 64) {
    const std::uint64_t mask = at >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << at) - 1;
    if ((x.w[i] & mask) != 0) return true;
  }
  return false;
}

// r 2^w (r nonzero) rounded to binary32, nearest even, with the sign.
MPSIM_HOST_DEVICE inline float to_binary32(const Wide& r, int w, bool negative) {
  const int top = w + width(r) - 1;
  const int q = top - 23 > -149 ? top - 23 : -149;  // the result's quantum 2^q
  const int below = q - w;                          // r's bits under the quantum (all of them far under 2^-149)
  std::uint64_t m = 0;                              // the significand, at most 2^24 after rounding
  if (below <= 0) {
    m = r.w[0] << -below;  // exact: r < 2^(24 + below)
  } else {
    m = bits_from(r, below) & ((std::uint64_t{1} << 25) - 1);
    const bool half = (bits_from(r, below - 1) & 1u) != 0;
    if (half && (any_below(r, below - 1) || (m & 1u) != 0)) ++m;
  }
  // m 2^q as a pattern: ((q + 149) << 23) + m covers subnormals, normals and a carry to the next binade.
  const std::uint64_t pattern = (static_cast<std::uint64_t>(q + 149) << 23) + m;
  const std::uint32_t magnitude = pattern >= 0x7F800000u ? 0x7F800000u : static_cast<std::uint32_t>(pattern);
  return std::bit_cast<float>(magnitude | (negative ? 0x80000000u : 0u));
}

}  // namespace exact_add_detail

// acc + (-1)^negative P 2^e rounded once to binary32, nearest even: P a
// nonzero integer of at most 128 bits (hi, lo), acc finite. An exact zero is
// +0; an overflow is infinity.
MPSIM_HOST_DEVICE inline float add_exactly_to_binary32(float acc, bool negative, std::uint64_t hi, std::uint64_t lo,
                                                       int e) {
  using namespace exact_add_detail;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(acc) & 0x7FFFFFFFu;
  const int biased = static_cast<int>(bits >> 23);
  const std::uint64_t acc_significand = biased == 0 ? bits : (bits & 0x7FFFFFu) | 0x800000u;
  const int acc_e = (biased == 0 ? 1 : biased) - 150;  // acc = significand 2^acc_e
  const bool acc_negative = (std::bit_cast<std::uint32_t>(acc) >> 31) != 0;
  const int p_top = e + (hi != 0 ? 64 + width_64(hi) : width_64(lo)) - 1;
  if (acc_significand == 0) {
    const int w = p_top - 189;
    return to_binary32(shifted_left(hi, lo, e - w), w, negative);
  }
  const int acc_top = acc_e + width_64(acc_significand) - 1;
  // x: the operand with the higher top bit, whole in the window; y: the other, with its sticky bit.
  const bool p_larger = p_top >= acc_top;
  const int w = (p_larger ? p_top : acc_top) - 189;
  std::uint64_t y_hi = p_larger ? 0 : hi, y_lo = p_larger ? acc_significand : lo;
  const int y_e = p_larger ? acc_e : e;
  const Wide x = p_larger ? shifted_left(hi, lo, e - w) : shifted_left(0, acc_significand, acc_e - w);
  Wide y{{0, 0, 0}};
  if (y_e >= w) {
    y = shifted_left(y_hi, y_lo, y_e - w);
  } else {
    shift_right_sticky(y_hi, y_lo, w - y_e);
    y = shifted_left(y_hi, y_lo, 0);
  }
  const bool x_negative = p_larger ? negative : acc_negative, y_negative = p_larger ? acc_negative : negative;
  if (x_negative == y_negative) return to_binary32(plus(x, y), w, x_negative);
  if (less(x, y)) return to_binary32(minus(y, x), w, y_negative);
  const Wide d = minus(x, y);
  if ((d.w[0] | d.w[1] | d.w[2]) == 0) return 0.0f;
  return to_binary32(d, w, x_negative);
}

}  // namespace mpsim
