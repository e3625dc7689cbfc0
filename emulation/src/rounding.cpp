#include "mpsim/emulation/rounding.hpp"

#include <string>

#include "exact.hpp"

namespace mpsim {
namespace {

struct ModeName {
  std::string_view name;
  RoundingMode mode;
};
constexpr ModeName mode_names[] = {
    {"nearest-even", RoundingMode::nearest_even}, {"nearest-away", RoundingMode::nearest_away},
    {"toward-zero", RoundingMode::toward_zero},   {"toward-positive", RoundingMode::toward_positive},
    {"toward-negative", RoundingMode::toward_negative}, {"odd", RoundingMode::odd},
    {"stochastic", RoundingMode::stochastic},
    // Short aliases.
    {"rne", RoundingMode::nearest_even}, {"rna", RoundingMode::nearest_away}, {"rtz", RoundingMode::toward_zero},
    {"rup", RoundingMode::toward_positive}, {"rdn", RoundingMode::toward_negative}, {"rto", RoundingMode::odd},
    {"sr", RoundingMode::stochastic},
};

}  // namespace

namespace detail {
// The result of an overflow (IEEE 754 §7.4): the directed modes that point
// toward zero give the largest finite value, the others infinity; a format
// without infinity gets NaN there, a saturating format always the largest finite.
Bits overflow_result(const Format& f, RoundingMode mode, bool negative) {
  bool to_infinity = true;
  switch (mode) {
    case RoundingMode::toward_zero:
    case RoundingMode::odd: to_infinity = false; break;
    case RoundingMode::toward_positive: to_infinity = !negative; break;
    case RoundingMode::toward_negative: to_infinity = negative; break;
    default: break;
  }
  if (f.overflow == Overflow::saturate || !to_infinity) return largest_finite_bits(f, negative);
  return infinity_or_nan(f, negative);
}
}  // namespace detail

namespace {
using detail::overflow_result;

struct Step {
  detail::u128 n;  // result = n * 2^quantum
  bool inexact;
};

// Rounds |x| to a multiple of 2^quantum.
Step round_at(const detail::Exact& x, int quantum, Rounding r, std::uint32_t draw) {
  using detail::u128;
  const int shift = quantum - x.exponent;
  if (shift <= 0) return {x.significand << -shift, x.sticky};  // callers never pass sticky here
  u128 n = 0, rest = x.significand;  // rest: the bits below the quantum
  if (shift < 128) {
    n = x.significand >> shift;
    rest = x.significand & ((u128{1} << shift) - 1);
  }
  const bool inexact = rest != 0 || x.sticky;
  if (!inexact) return {n, false};
  const bool half_bit = shift - 1 < 128 && ((rest >> (shift - 1)) & 1) != 0;
  const u128 below_half_mask = shift - 1 >= 128 ? ~u128{0} : (u128{1} << (shift - 1)) - 1;
  const bool below_half = (rest & below_half_mask) != 0 || x.sticky;
  bool up = false;
  switch (r.mode) {
    case RoundingMode::nearest_even: up = half_bit && (below_half || (n & 1) != 0); break;
    case RoundingMode::nearest_away: up = half_bit; break;
    case RoundingMode::toward_zero: break;
    case RoundingMode::toward_positive: up = !x.negative; break;
    case RoundingMode::toward_negative: up = x.negative; break;
    case RoundingMode::odd: n |= 1; break;
    case RoundingMode::stochastic: {
      // The remainder as a 0.32 fixed-point fraction of the quantum, cut to
      // `random_bits` bits; round up when adding the draw carries out.
      std::uint32_t fraction = 0;
      if (shift <= 32) fraction = static_cast<std::uint32_t>(rest << (32 - shift));
      else if (shift - 32 < 128) fraction = static_cast<std::uint32_t>(rest >> (shift - 32));
      const std::uint32_t keep = ~std::uint32_t{0} << (32 - r.random_bits);
      up = std::uint64_t{fraction & keep} + (draw & keep) > 0xFFFFFFFFu;
      break;
    }
  }
  return {n + (up ? 1 : 0), true};
}

}  // namespace

std::optional<RoundingMode> parse_rounding_mode(std::string_view text) {
  for (const auto& m : mode_names)
    if (text == m.name) return m.mode;
  return std::nullopt;
}

std::string_view to_string(RoundingMode mode) {
  for (const auto& m : mode_names)
    if (m.mode == mode) return m.name;
  return "?";
}

std::string_view rounding_mode_names() {
  return "nearest-even (rne), nearest-away (rna), toward-zero (rtz), toward-positive (rup), "
         "toward-negative (rdn), odd (rto), stochastic (sr)";
}

std::string flags_to_string(Flags flags) {
  static constexpr std::pair<std::uint8_t, std::string_view> names[] = {
      {Flags::inexact, "inexact"},   {Flags::underflow, "underflow"}, {Flags::overflow, "overflow"},
      {Flags::divide_by_zero, "divide-by-zero"}, {Flags::invalid, "invalid"}};
  std::string text;
  for (const auto& [bit, name] : names) {
    if (!flags.has(bit)) continue;
    if (!text.empty()) text += '|';
    text += name;
  }
  return text.empty() ? "none" : text;
}

// SplitMix64's finaliser (Steele, Lea, Flood 2014): spreads seed and stream
// over the 64 key bits.
static std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

DrawKey make_draw_key(RandomKey key) {
  const std::uint64_t k = mix64(key.seed ^ mix64(key.stream + 0x9E3779B97F4A7C15ull));
  return {static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32)};
}

namespace detail {

Rounded round_exact(const Format& f, Rounding r, const Exact& x, std::uint32_t draw) {
  if (x.significand == 0) return {encode_zero(f, x.negative), {}};
  const int m = f.mantissa_bits;
  const int top = x.exponent + bit_width128(x.significand) - 1;  // 2^top <= |x| < 2^(top+1)
  const bool flush = f.subnormals == Subnormals::flush_to_zero;

  // Tininess after rounding (IEEE 754 §7.5): |x| rounded to p bits with an
  // unbounded exponent range is below 2^emin.
  bool tiny = false;
  if (top < f.emin()) {
    const Step unbounded = round_at(x, top - m, r, draw);
    tiny = !(top == f.emin() - 1 && unbounded.n == (u128{2} << m));
  }
  if (flush && tiny) return {encode_zero(f, x.negative), {Flags::inexact | Flags::underflow}};

  int quantum = flush ? top - m : std::max(top - m, f.emin() - m);
  Step s = round_at(x, quantum, r, draw);
  Flags flags{static_cast<std::uint8_t>(s.inexact ? Flags::inexact : 0)};
  if (tiny && s.inexact) flags.bits |= Flags::underflow;
  if (s.n == 0) return {encode_zero(f, x.negative), flags};
  if (s.n == (u128{2} << m)) {  // carried into the next binade
    s.n >>= 1;
    ++quantum;
  }
  const bool normal = s.n >= (u128{1} << m);
  const int exponent = quantum + m;
  if (normal && (exponent > f.emax() || (exponent == f.emax() && s.n > f.max_significand())))
    return {overflow_result(f, r.mode, x.negative),
            Flags{static_cast<std::uint8_t>(Flags::overflow | Flags::inexact)}};
  const std::uint64_t biased = normal ? static_cast<std::uint64_t>(exponent + f.bias()) : 0;
  const std::uint64_t mantissa = static_cast<std::uint64_t>(s.n) & ((std::uint64_t{1} << m) - 1);
  const std::uint64_t sign = std::uint64_t{x.negative} << (f.exponent_bits + m);
  return {Bits{sign | (biased << m) | mantissa}, flags};
}

}  // namespace detail

namespace {

// Rounds a decoded value of any source format (one step, no intermediate).
Rounded round_decoded(const Format& f, Rounding r, const detail::Decoded& d, int source_payload_bits,
                      std::uint32_t draw) {
  switch (d.kind) {
    case detail::Kind::zero: return {detail::encode_zero(f, d.negative), {}};
    case detail::Kind::nan:  // into a format with no NaN: +largest finite, invalid (format.hpp, Specials::none)
      return {detail::encode_nan(f, d.negative, d.payload, source_payload_bits),
              Flags{static_cast<std::uint8_t>(d.signaling || !f.has_nan() ? Flags::invalid : 0)}};
    case detail::Kind::infinite:
      if (f.has_infinity()) return {infinity_or_nan(f, d.negative), {}};
      return {overflow_result(f, r.mode, d.negative),
              Flags{static_cast<std::uint8_t>(Flags::overflow | Flags::inexact)}};
    case detail::Kind::finite: break;
  }
  return detail::round_exact(f, r, {d.negative, d.exponent, d.significand, false}, draw);
}

}  // namespace

Rounded round_to_format(const Format& f, Rounding r, double value, std::uint32_t draw) {
  return round_decoded(f, r, detail::decode_binary64(value), 51, draw);
}

Rounded round_to_format(const Format& f, Rounding r, float value, std::uint32_t draw) {
  return round_decoded(f, r, detail::decode_binary32(value), 22, draw);
}

Rounded convert(const Format& from, Bits bits, const Format& to, Rounding r, std::uint32_t draw) {
  return round_decoded(to, r, detail::decode(from, bits), from.has_infinity() ? from.mantissa_bits - 1 : 0, draw);
}

}  // namespace mpsim
