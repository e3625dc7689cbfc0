// Exact integer arithmetic on decoded operands, ended by one rounding.
//
// Every operand has at most 53 significant bits, so products (106 bits) are
// exact in 128-bit integers; sums keep 124-bit aligned significands and fold
// what falls off into a sticky bit only when the operands are so far apart that
// at most one bit cancels; quotients and square roots carry 64 significant bits
// plus a sticky remainder bit. That is always >= precision + 2 bits, enough for
// every rounding mode, round-to-odd and stochastic included, to round once.
#include "mpsim/emulation/arithmetic.hpp"

#include <cmath>

#include "exact.hpp"

namespace mpsim {
namespace {

using detail::Decoded;
using detail::Exact;
using detail::Kind;
using detail::u128;

constexpr Flags no_flags{};
constexpr Flags invalid_flag{Flags::invalid};

Exact exact_of(const Decoded& d) { return {d.negative, d.exponent, d.significand, false}; }

Rounded finish(const Format& f, Rounding r, const Exact& x, std::uint32_t draw) {
  return detail::round_exact(f, r, x, draw);
}

Rounded infinite(const Format& f, bool negative, Flags flags = no_flags) {
  return {detail::encode_infinite(f, negative), flags};
}

Rounded invalid(const Format& f) { return {detail::default_nan(f), invalid_flag}; }

// NaN propagation as x86 SSE and SoftFloat's 8086-SSE specialisation do it:
// the first NaN operand, quieted; invalid when any operand is signaling.
Rounded propagate_nan(const Format& f, std::initializer_list<Decoded> operands) {
  Flags flags;
  const Decoded* first = nullptr;
  for (const auto& d : operands) {
    if (d.kind != Kind::nan) continue;
    if (d.signaling) flags.bits |= Flags::invalid;
    if (first == nullptr) first = &d;
  }
  return {detail::encode_nan(f, first->negative, first->payload, f.mantissa_bits - 1), flags};
}

// The sign of an exact zero sum of opposite-signed values (IEEE 754 §6.3).
bool zero_sum_sign(bool a_negative, bool b_negative, Rounding r) {
  if (a_negative == b_negative) return a_negative;
  return r.mode == RoundingMode::toward_negative;
}

// x + y for nonzero exact values with significands of at most 106 bits.
Exact add_exact(Exact x, Exact y, Rounding r) {
  constexpr int top = 124;  // aligned significands have their leading bit here
  auto align = [](Exact& v) {
    const int shift = top - (detail::bit_width128(v.significand) - 1);
    v.significand <<= shift;
    v.exponent -= shift;
  };
  align(x);
  align(y);
  if (x.exponent < y.exponent || (x.exponent == y.exponent && x.significand < y.significand)) std::swap(x, y);
  const int gap = x.exponent - y.exponent;  // >= 0; x is the larger in magnitude
  bool sticky = false;
  u128 small = 0;
  if (gap < 128) {
    small = y.significand >> gap;
    sticky = (y.significand & ((u128{1} << gap) - 1)) != 0;
  } else {
    sticky = true;
  }
  // Bits fall off only when gap > 124 - 106 = 18, and then at most one
  // leading bit cancels, leaving >= 122 bits above the unit.
  Exact sum{x.negative, x.exponent, 0, sticky};
  if (x.negative == y.negative) {
    sum.significand = x.significand + small;
  } else {
    // x - (small + eps) = (x - small - 1) + (1 - eps).
    sum.significand = x.significand - small - (sticky ? 1 : 0);
  }
  if (sum.significand == 0 && !sum.sticky) sum.negative = zero_sum_sign(x.negative, y.negative, r);
  return sum;
}

u128 integer_sqrt(u128 radicand, bool& inexact) {
  auto root = static_cast<std::uint64_t>(std::sqrt(static_cast<long double>(radicand)));
  if (static_cast<long double>(root) >= 18446744073709551615.0L) root = ~std::uint64_t{0};
  while (u128{root} * root > radicand) --root;
  while (root != ~std::uint64_t{0} && u128{root + 1} * (root + 1) <= radicand) ++root;
  inexact = u128{root} * root != radicand;
  return root;
}

Rounded add_decoded(const Format& f, Rounding r, const Decoded& a, const Decoded& b, std::uint32_t draw) {
  if (a.kind == Kind::nan || b.kind == Kind::nan) return propagate_nan(f, {a, b});
  if (a.kind == Kind::infinite || b.kind == Kind::infinite) {
    if (a.kind == Kind::infinite && b.kind == Kind::infinite && a.negative != b.negative) return invalid(f);
    return infinite(f, a.kind == Kind::infinite ? a.negative : b.negative);
  }
  if (a.kind == Kind::zero && b.kind == Kind::zero)
    return {detail::encode_zero(f, zero_sum_sign(a.negative, b.negative, r)), no_flags};
  if (a.kind == Kind::zero) return finish(f, r, exact_of(b), draw);
  if (b.kind == Kind::zero) return finish(f, r, exact_of(a), draw);
  return finish(f, r, add_exact(exact_of(a), exact_of(b), r), draw);
}

}  // namespace

Rounded add(const Format& f, Rounding r, Bits a, Bits b, std::uint32_t draw) {
  return add_decoded(f, r, detail::decode(f, a), detail::decode(f, b), draw);
}

Rounded sub(const Format& f, Rounding r, Bits a, Bits b, std::uint32_t draw) {
  Decoded negated_b = detail::decode(f, b);
  if (negated_b.kind != Kind::nan) negated_b.negative = !negated_b.negative;
  return add_decoded(f, r, detail::decode(f, a), negated_b, draw);
}

Rounded mul(const Format& f, Rounding r, Bits a_bits, Bits b_bits, std::uint32_t draw) {
  const Decoded a = detail::decode(f, a_bits), b = detail::decode(f, b_bits);
  if (a.kind == Kind::nan || b.kind == Kind::nan) return propagate_nan(f, {a, b});
  const bool negative = a.negative != b.negative;
  if (a.kind == Kind::infinite || b.kind == Kind::infinite) {
    if (a.kind == Kind::zero || b.kind == Kind::zero) return invalid(f);
    return infinite(f, negative);
  }
  if (a.kind == Kind::zero || b.kind == Kind::zero) return {detail::encode_zero(f, negative), no_flags};
  return finish(f, r, {negative, a.exponent + b.exponent, u128{a.significand} * b.significand, false}, draw);
}

Rounded div(const Format& f, Rounding r, Bits a_bits, Bits b_bits, std::uint32_t draw) {
  const Decoded a = detail::decode(f, a_bits), b = detail::decode(f, b_bits);
  if (a.kind == Kind::nan || b.kind == Kind::nan) return propagate_nan(f, {a, b});
  const bool negative = a.negative != b.negative;
  if (a.kind == Kind::infinite) return b.kind == Kind::infinite ? invalid(f) : infinite(f, negative);
  if (b.kind == Kind::infinite) return {detail::encode_zero(f, negative), no_flags};
  if (b.kind == Kind::zero) {
    if (a.kind == Kind::zero) return invalid(f);
    return infinite(f, negative, Flags{Flags::divide_by_zero});
  }
  if (a.kind == Kind::zero) return {detail::encode_zero(f, negative), no_flags};
  // Normalise both significands to 53 bits; the 117-by-53-bit quotient then
  // has 64 or 65 bits, and a nonzero remainder becomes the sticky bit.
  const int a_shift = 52 - (detail::bit_width128(a.significand) - 1);
  const int b_shift = 52 - (detail::bit_width128(b.significand) - 1);
  const u128 numerator = u128{a.significand << a_shift} << 64;
  const std::uint64_t divisor = b.significand << b_shift;
  const Exact q{negative, (a.exponent - a_shift) - (b.exponent - b_shift) - 64, numerator / divisor,
                numerator % divisor != 0};
  return finish(f, r, q, draw);
}

Rounded sqrt(const Format& f, Rounding r, Bits a_bits, std::uint32_t draw) {
  const Decoded a = detail::decode(f, a_bits);
  if (a.kind == Kind::nan) return propagate_nan(f, {a});
  if (a.kind == Kind::zero) return {detail::encode_zero(f, a.negative), no_flags};
  if (a.negative) return invalid(f);
  if (a.kind == Kind::infinite) return infinite(f, false);
  // value = s * 2^e with s normalised to 53 bits and e made even; widen the
  // radicand by 2^74 so the root has 64 bits.
  const int shift = 52 - (detail::bit_width128(a.significand) - 1);
  u128 s = u128{a.significand} << shift;
  int e = a.exponent - shift;
  if (e % 2 != 0) {
    s <<= 1;
    --e;
  }
  bool inexact = false;
  const u128 root = integer_sqrt(s << 74, inexact);
  return finish(f, r, {false, (e - 74) / 2, root, inexact}, draw);
}

Rounded fma(const Format& f, Rounding r, Bits a_bits, Bits b_bits, Bits c_bits, std::uint32_t draw) {
  const Decoded a = detail::decode(f, a_bits), b = detail::decode(f, b_bits), c = detail::decode(f, c_bits);
  if (a.kind == Kind::nan || b.kind == Kind::nan) return propagate_nan(f, {a, b, c});
  const bool product_negative = a.negative != b.negative;
  const bool product_infinite = a.kind == Kind::infinite || b.kind == Kind::infinite;
  const bool product_zero = a.kind == Kind::zero || b.kind == Kind::zero;
  // 0 * inf is invalid even when c is a quiet NaN (as on x86 and in SoftFloat).
  if (product_infinite && product_zero) {
    Rounded result = invalid(f);
    if (c.kind == Kind::nan) result.bits = propagate_nan(f, {c}).bits;
    return result;
  }
  if (c.kind == Kind::nan) return propagate_nan(f, {c});
  if (product_infinite) {
    if (c.kind == Kind::infinite && c.negative != product_negative) return invalid(f);
    return infinite(f, product_negative);
  }
  if (c.kind == Kind::infinite) return infinite(f, c.negative);
  if (product_zero) {
    if (c.kind == Kind::zero) return {detail::encode_zero(f, zero_sum_sign(product_negative, c.negative, r)), no_flags};
    return finish(f, r, exact_of(c), draw);
  }
  const Exact product{product_negative, a.exponent + b.exponent, u128{a.significand} * b.significand, false};
  if (c.kind == Kind::zero) return finish(f, r, product, draw);
  return finish(f, r, add_exact(product, exact_of(c), r), draw);
}

}  // namespace mpsim
