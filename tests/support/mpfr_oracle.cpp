#include "support/mpfr_oracle.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <utility>

namespace mpsim::oracle {

// --- Real ------------------------------------------------------------------------
Real::Real() {
  static_assert(mpfr_custom_get_size(kPrecision) <= sizeof limbs_);
  mpfr_custom_init(limbs_, kPrecision);
  mpfr_custom_init_set(value_, MPFR_ZERO_KIND, 0, kPrecision, limbs_);  // +0
}
Real::Real(double value) : Real() {
  mpfr_set_d(value_, value, MPFR_RNDN);  // exact: 53 <= kPrecision
}
Real::Real(const Real& other) : Real() { mpfr_set(value_, other.value_, MPFR_RNDN); }
Real& Real::operator=(const Real& other) {
  mpfr_set(value_, other.value_, MPFR_RNDN);  // exact: same precision
  return *this;
}

namespace {

// Operations that must be exact (scaling, products of two format values,
// floors and remainders) are checked: an inexact one is a bug in the oracle.
void require_exact(int ternary, const char* what) {
  if (ternary != 0) throw std::logic_error(std::string("mpfr_oracle: unexpectedly inexact ") + what);
}

// Turns a result computed toward zero (with ternary value `ternary`) into the
// round-to-odd result at its precision: when inexact, the last bit must be 1.
void jam(Real& value, int ternary) {
  if (ternary == 0) return;
  if (mpfr_zero_p(value.get())) throw std::logic_error("mpfr_oracle: inexact zero");
  if (mpfr_min_prec(value.get()) == mpfr_get_prec(value.get())) return;  // last bit already 1
  if (mpfr_signbit(value.get())) {
    mpfr_nextbelow(value.get());
  } else {
    mpfr_nextabove(value.get());
  }
}

// Exponent e with 2^e <= |x| < 2^(e+1), for finite nonzero x.
long floor_log2(const Real& x) { return static_cast<long>(mpfr_get_exp(x.get())) - 1; }

Real power_of_two(long exponent) {
  Real r;
  mpfr_set_ui_2exp(r.get(), 1, exponent, MPFR_RNDN);
  return r;
}

std::uint64_t low_ones(int n) { return n >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1; }

// --- Fields of an encoding: sign | exponent (E bits) | mantissa (M bits) ---
struct Fields {
  bool negative = false;
  std::uint64_t exponent = 0;
  std::uint64_t mantissa = 0;
};

Fields split(const Format& f, Bits bits) {
  const int e = f.exponent_bits, m = f.mantissa_bits;
  return {((bits.value >> (e + m)) & 1) != 0, (bits.value >> m) & low_ones(e), bits.value & low_ones(m)};
}

Bits join(const Format& f, bool negative, std::uint64_t exponent, std::uint64_t mantissa) {
  const int e = f.exponent_bits, m = f.mantissa_bits;
  return Bits{(std::uint64_t{negative} << (e + m)) | (exponent << m) | mantissa};
}

// The contract: bias 2^(E-1)-1. Infinities exist only with IEEE specials and M > 0.
int bias_of(const Format& f) { return (1 << (f.exponent_bits - 1)) - 1; }
bool infinities_in(const Format& f) { return f.specials == Specials::ieee && f.mantissa_bits > 0; }

Decoded decode_fields(const Format& f, Bits bits) {
  const Fields fields = split(f, bits);
  const int m = f.mantissa_bits;
  const std::uint64_t all_ones_exponent = low_ones(f.exponent_bits);
  Decoded d;
  d.negative = fields.negative;
  const auto set_signed = [&](std::uint64_t significand, long exponent) {
    require_exact(mpfr_set_uj_2exp(d.value.get(), significand, exponent, MPFR_RNDN), "decode");
    if (fields.negative) mpfr_neg(d.value.get(), d.value.get(), MPFR_RNDN);
  };
  if (fields.exponent == all_ones_exponent) {
    if (infinities_in(f)) {
      if (fields.mantissa == 0) {
        d.kind = FloatClass::infinite;
        mpfr_set_inf(d.value.get(), fields.negative ? -1 : 1);
      } else {
        d.kind = FloatClass::nan;
        d.signaling = ((fields.mantissa >> (m - 1)) & 1) == 0;  // quiet bit: the top mantissa bit
        mpfr_set_nan(d.value.get());
      }
      return d;
    }
    // The single NaN of a format without infinities; none at all with Specials::none (every encoding finite).
    if (f.specials != Specials::none && (m == 0 || fields.mantissa == low_ones(m))) {
      d.kind = FloatClass::nan;
      mpfr_set_nan(d.value.get());
      return d;
    }
    // Otherwise an ordinary normal number, decoded below.
  }
  const long bias = bias_of(f);
  if (fields.exponent == 0) {
    if (fields.mantissa == 0 || f.subnormals == Subnormals::flush_to_zero) {
      d.kind = FloatClass::zero;
      mpfr_set_zero(d.value.get(), fields.negative ? -1 : 1);
      return d;
    }
    d.kind = FloatClass::subnormal;
    set_signed(fields.mantissa, 1 - bias - m);  // 0.mantissa * 2^emin
    return d;
  }
  d.kind = FloatClass::normal;
  set_signed((std::uint64_t{1} << m) | fields.mantissa, static_cast<long>(fields.exponent) - bias - m);
  return d;
}

Facts derive_facts(const Format& f) {
  const int m = f.mantissa_bits;
  const std::uint64_t top = low_ones(f.exponent_bits);
  Facts k;
  k.precision = m + 1;
  k.bias = bias_of(f);
  k.gradual = f.subnormals == Subnormals::gradual;
  k.has_infinity = decode_fields(f, join(f, false, top, 0)).kind == FloatClass::infinite;

  k.smallest_normal = decode_fields(f, join(f, false, 1, 0)).value;
  k.emin = static_cast<int>(floor_log2(k.smallest_normal));

  // The largest finite value: among the encodings that can hold it, the
  // largest that decodes as a finite number.
  const std::uint64_t mantissa_top = low_ones(m);
  Bits candidates[3] = {join(f, false, top, mantissa_top), join(f, false, top, mantissa_top - 1),
                        join(f, false, top - 1, mantissa_top)};
  bool found = false;
  for (int i = 0; i < 3; ++i) {
    if (i == 1 && m == 0) continue;
    const Decoded d = decode_fields(f, candidates[i]);
    if (d.kind != FloatClass::normal) continue;
    if (!found || mpfr_cmp(d.value.get(), k.largest.get()) > 0) k.largest = d.value;
    found = true;
  }
  if (!found) throw std::logic_error("mpfr_oracle: no largest finite value");
  k.emax = static_cast<int>(floor_log2(k.largest));

  const Decoded first = decode_fields(f, Bits{1});
  k.smallest_positive = first.kind == FloatClass::zero ? k.smallest_normal : first.value;
  if (k.gradual && m > 0) k.largest_subnormal = decode_fields(f, join(f, false, 0, mantissa_top)).value;

  k.unit_roundoff = power_of_two(-k.precision);
  k.machine_epsilon = power_of_two(1 - k.precision);
  return k;
}

}  // namespace

const Facts& facts(const Format& format) {
  if (format.exponent_bits < 2 || format.exponent_bits > 11 || format.mantissa_bits < 0 ||
      format.mantissa_bits > 52) {
    throw std::invalid_argument("mpfr_oracle: format out of range");
  }
  // Deriving takes a few decodes; the tests use one format at a time.
  thread_local std::optional<std::pair<Format, Facts>> cache;
  if (!cache || !(cache->first == format)) cache.emplace(format, derive_facts(format));
  return cache->second;
}

std::string format_name(const Format& format) {
  std::string name = "e" + std::to_string(format.exponent_bits) + "m" + std::to_string(format.mantissa_bits);
  if (format.subnormals == Subnormals::flush_to_zero) name += ":ftz";
  if (format.overflow == Overflow::saturate) name += ":sat";
  if (format.specials == Specials::nan_only) name += ":fn";
  if (format.specials == Specials::none) name += ":finite";
  return name;
}

// --- Encodings ---------------------------------------------------------------------
Decoded decode(const Format& format, Bits bits) {
  facts(format);  // validates the format
  return decode_fields(format, bits);
}

FloatClass classify(const Format& format, Bits bits) { return decode(format, bits).kind; }

bool is_signaling_nan(const Format& format, Bits bits) {
  const Decoded d = decode(format, bits);
  return d.kind == FloatClass::nan && d.signaling;
}

Bits zero_bits(const Format& format, bool negative) { return join(format, negative, 0, 0); }

Bits nan_bits(const Format& format) {
  // The contract: a format with no NaN (Specials::none) holds a NaN as +largest finite.
  if (format.specials == Specials::none) return largest_bits(format, false);
  const int m = format.mantissa_bits;
  const std::uint64_t top = low_ones(format.exponent_bits);
  if (facts(format).has_infinity) return join(format, false, top, std::uint64_t{1} << (m - 1));
  return join(format, false, top, low_ones(m));
}

Bits infinity_bits(const Format& format, bool negative) {
  if (!facts(format).has_infinity) throw std::logic_error("mpfr_oracle: no infinity in " + format_name(format));
  return join(format, negative, low_ones(format.exponent_bits), 0);
}

Bits encode(const Format& format, const Real& value) {
  const Facts& k = facts(format);
  const mpfr_srcptr v = value.get();
  if (!mpfr_number_p(v)) throw std::logic_error("mpfr_oracle: encode of a non-finite value");
  const bool negative = mpfr_signbit(v) != 0;
  if (mpfr_zero_p(v)) return zero_bits(format, negative);
  const int m = format.mantissa_bits;
  Real magnitude;
  mpfr_abs(magnitude.get(), v, MPFR_RNDN);
  const long e = floor_log2(magnitude);
  // Significand scaled to an integer at the quantum of its binade (or of the subnormal range).
  const long quantum = std::max<long>(e, k.emin) - m;
  Real scaled;
  require_exact(mpfr_mul_2si(scaled.get(), magnitude.get(), -quantum, MPFR_RNDN), "encode scaling");
  if (!mpfr_integer_p(scaled.get())) {
    throw std::logic_error("mpfr_oracle: value not representable in " + format_name(format));
  }
  const std::uint64_t significand = mpfr_get_uj(scaled.get(), MPFR_RNDN);
  Bits bits;
  if (e >= k.emin) {
    bits = join(format, negative, static_cast<std::uint64_t>(e + k.bias), significand - (std::uint64_t{1} << m));
  } else {
    if (!k.gradual) throw std::logic_error("mpfr_oracle: subnormal value in a flush-to-zero format");
    bits = join(format, negative, 0, significand);
  }
  // The encoding must read back as the same value.
  const Decoded back = decode_fields(format, bits);
  if (!mpfr_number_p(back.value.get()) || mpfr_cmp(back.value.get(), v) != 0 ||
      e > k.emax) {
    throw std::logic_error("mpfr_oracle: value beyond the range of " + format_name(format));
  }
  return bits;
}

Bits encode(const Format& format, double value) { return encode(format, Real(value)); }

Bits largest_bits(const Format& format, bool negative) {
  const Bits positive = encode(format, facts(format).largest);
  return negative ? negate(format, positive) : positive;
}

Bits negate(const Format& format, Bits bits) {
  return Bits{bits.value ^ (std::uint64_t{1} << (format.exponent_bits + format.mantissa_bits))};
}

// --- Rounding ----------------------------------------------------------------------
namespace {

// Rounding directions on the magnitude.
enum class Way : std::uint8_t { down, up, nearest_even, nearest_away, odd };

Way way_for(RoundingMode mode, bool negative) {
  switch (mode) {
    case RoundingMode::nearest_even: return Way::nearest_even;
    case RoundingMode::nearest_away: return Way::nearest_away;
    case RoundingMode::toward_zero: return Way::down;
    case RoundingMode::toward_positive: return negative ? Way::down : Way::up;
    case RoundingMode::toward_negative: return negative ? Way::up : Way::down;
    case RoundingMode::odd: return Way::odd;
    case RoundingMode::stochastic: break;
  }
  throw std::invalid_argument("mpfr_oracle: stochastic rounding has no single correct result");
}

struct Multiple {
  std::uint64_t count = 0;  // the result is count * 2^quantum
  bool inexact = false;
};

// Rounds a > 0 to a multiple of 2^quantum, where a < 2^(quantum+54).
Multiple round_to_quantum(const Real& a, long quantum, Way way) {
  thread_local Real scaled, whole, rest;
  require_exact(mpfr_mul_2si(scaled.get(), a.get(), -quantum, MPFR_RNDN), "scaling");
  mpfr_floor(whole.get(), scaled.get());  // exact: same precision (its return value says only "was it an integer")
  require_exact(mpfr_sub(rest.get(), scaled.get(), whole.get(), MPFR_RNDN), "remainder");
  if (mpfr_cmp_ui_2exp(whole.get(), 1, 60) >= 0) throw std::logic_error("mpfr_oracle: quantum too small");
  Multiple r{mpfr_get_uj(whole.get(), MPFR_RNDN), !mpfr_zero_p(rest.get())};
  if (!r.inexact) return r;
  const int versus_half = mpfr_cmp_d(rest.get(), 0.5);
  switch (way) {
    case Way::down: break;
    case Way::up: r.count += 1; break;
    case Way::nearest_even:
      if (versus_half > 0 || (versus_half == 0 && (r.count & 1) != 0)) r.count += 1;
      break;
    case Way::nearest_away:
      if (versus_half >= 0) r.count += 1;
      break;
    case Way::odd: r.count |= 1; break;  // truncate, then set the last bit
  }
  return r;
}

Real times_power_of_two(std::uint64_t count, long exponent) {
  Real r;
  require_exact(mpfr_set_uj_2exp(r.get(), count, exponent, MPFR_RNDN), "result");
  return r;
}

// The value an overflow gives (contract, "Overflow").
Bits overflow_value(const Format& format, RoundingMode mode, bool negative) {
  if (format.overflow == Overflow::saturate) return largest_bits(format, negative);
  bool infinite = false;
  switch (mode) {
    case RoundingMode::nearest_even:
    case RoundingMode::nearest_away:
    case RoundingMode::stochastic: infinite = true; break;
    case RoundingMode::toward_zero:
    case RoundingMode::odd: infinite = false; break;
    case RoundingMode::toward_positive: infinite = !negative; break;
    case RoundingMode::toward_negative: infinite = negative; break;
  }
  if (!infinite) return largest_bits(format, negative);
  return facts(format).has_infinity ? infinity_bits(format, negative) : nan_bits(format);
}

Rounded overflow_result(const Format& format, RoundingMode mode, bool negative, Flags flags) {
  flags.bits |= Flags::overflow | Flags::inexact;
  return {overflow_value(format, mode, negative), flags};
}

Rounded round_finite(const Format& format, RoundingMode mode, const Real& x, Flags flags) {
  const Facts& k = facts(format);
  const int m = format.mantissa_bits;
  const bool negative = mpfr_signbit(x.get()) != 0;
  const Way way = way_for(mode, negative);
  Real a;
  mpfr_abs(a.get(), x.get(), MPFR_RNDN);
  const long e = floor_log2(a);

  // With an unbounded exponent range: decides tininess and overflow.
  const Multiple unbounded = round_to_quantum(a, e - m, way);
  const Real unbounded_value = times_power_of_two(unbounded.count, e - m);
  if (mpfr_cmp(unbounded_value.get(), k.largest.get()) > 0) return overflow_result(format, mode, negative, flags);
  const bool tiny = mpfr_cmp(unbounded_value.get(), k.smallest_normal.get()) < 0;
  if (tiny && !k.gradual) {
    flags.bits |= Flags::underflow | Flags::inexact;
    return {zero_bits(format, negative), flags};
  }

  // With the exponent bounded below by emin: the fixed quantum 2^(emin-M).
  const long quantum = std::max<long>(e, k.emin) - m;
  const Multiple bounded = round_to_quantum(a, quantum, way);
  Real result = times_power_of_two(bounded.count, quantum);
  if (negative) mpfr_neg(result.get(), result.get(), MPFR_RNDN);  // -0 when rounded to zero
  if (bounded.inexact) flags.bits |= Flags::inexact;
  if (bounded.inexact && tiny) flags.bits |= Flags::underflow;
  return {encode(format, result), flags};
}

}  // namespace

Rounded round(const Format& format, RoundingMode mode, const Exact& exact) {
  way_for(mode, false);  // rejects stochastic rounding
  const Facts& k = facts(format);
  switch (exact.kind) {
    case Exact::Kind::nan: {
      Flags flags = exact.flags;
      if (format.specials == Specials::none) flags.bits |= Flags::invalid;  // no NaN to hold it
      return {nan_bits(format), flags};
    }
    case Exact::Kind::zero: {
      const bool negative = exact.cancellation ? mode == RoundingMode::toward_negative : exact.negative;
      return {zero_bits(format, negative), exact.flags};
    }
    case Exact::Kind::infinity:
      if (k.has_infinity) return {infinity_bits(format, exact.negative), exact.flags};
      if (exact.infinity_is_overflow) return overflow_result(format, mode, exact.negative, exact.flags);
      return {format.overflow == Overflow::saturate ? largest_bits(format, exact.negative) : nan_bits(format),
              exact.flags};
    case Exact::Kind::finite: return round_finite(format, mode, exact.value, exact.flags);
  }
  throw std::logic_error("mpfr_oracle: bad exact kind");
}

Bits next_up(const Format& format, Bits bits) {
  const Facts& k = facts(format);
  const Decoded d = decode(format, bits);
  switch (d.kind) {
    case FloatClass::nan: return nan_bits(format);
    case FloatClass::infinite: return d.negative ? largest_bits(format, true) : bits;
    case FloatClass::zero: return encode(format, k.smallest_positive);
    case FloatClass::subnormal:
    case FloatClass::normal: break;
  }
  if (mpfr_cmp(d.value.get(), k.largest.get()) == 0) {
    return k.has_infinity ? infinity_bits(format, false) : bits;
  }
  // x + epsilon, with epsilon far below any gap between format values, rounded
  // toward +inf: the smallest format value above x.
  Real nudged;
  const long e = floor_log2(d.value);
  Real epsilon = power_of_two(e - 300);
  require_exact(mpfr_add(nudged.get(), d.value.get(), epsilon.get(), MPFR_RNDN), "nudge");
  return round_finite(format, RoundingMode::toward_positive, nudged, Flags{}).bits;
}

Bits next_down(const Format& format, Bits bits) {
  if (oracle::classify(format, bits) == FloatClass::nan) return nan_bits(format);
  return negate(format, oracle::next_up(format, negate(format, bits)));
}

// --- Exact operations -------------------------------------------------------------
namespace {

Exact nan_result(bool invalid) {
  Exact r;
  r.kind = Exact::Kind::nan;
  if (invalid) r.flags.bits |= Flags::invalid;
  return r;
}
Exact zero_result(bool negative) {
  Exact r;
  r.kind = Exact::Kind::zero;
  r.negative = negative;
  return r;
}
Exact cancellation_result() {
  Exact r = zero_result(false);
  r.cancellation = true;
  return r;
}
Exact infinity_result(bool negative, std::uint8_t flags = 0) {
  Exact r;
  r.kind = Exact::Kind::infinity;
  r.negative = negative;
  r.flags.bits = flags;
  return r;
}
Exact finite_result(Real value) {
  Exact r;
  r.kind = Exact::Kind::finite;
  r.negative = mpfr_signbit(value.get()) != 0;
  r.value = std::move(value);
  return r;
}
// A sum computed toward zero: exact zero is a cancellation, otherwise jammed.
Exact sum_result(Real value, int ternary) {
  if (mpfr_zero_p(value.get())) {
    require_exact(ternary, "zero sum");
    return cancellation_result();
  }
  jam(value, ternary);
  return finite_result(std::move(value));
}

bool is_nan(const Decoded& d) { return d.kind == FloatClass::nan; }
bool is_inf(const Decoded& d) { return d.kind == FloatClass::infinite; }
bool is_zero(const Decoded& d) { return d.kind == FloatClass::zero; }

Exact conversion_of(Decoded d) {
  if (is_nan(d)) return nan_result(d.signaling);
  if (is_inf(d)) {
    Exact r = infinity_result(d.negative);
    r.infinity_is_overflow = true;
    return r;
  }
  if (is_zero(d)) return zero_result(d.negative);
  return finite_result(std::move(d.value));
}

Exact add_decoded(const Decoded& x, const Decoded& y) {
  if (is_nan(x) || is_nan(y)) return nan_result(x.signaling || y.signaling);
  if (is_inf(x) && is_inf(y)) return x.negative == y.negative ? infinity_result(x.negative) : nan_result(true);
  if (is_inf(x)) return infinity_result(x.negative);
  if (is_inf(y)) return infinity_result(y.negative);
  if (is_zero(x) && is_zero(y)) return x.negative == y.negative ? zero_result(x.negative) : cancellation_result();
  Real sum;
  const int t = mpfr_add(sum.get(), x.value.get(), y.value.get(), MPFR_RNDZ);
  return sum_result(std::move(sum), t);
}

}  // namespace

Exact exact_from_double(double value) {
  const std::uint64_t raw = std::bit_cast<std::uint64_t>(value);
  Decoded d;
  d.negative = (raw >> 63) != 0;
  if (value != value) {
    d.kind = FloatClass::nan;
    d.signaling = ((raw >> 51) & 1) == 0;
  } else if (value == 0) {
    d.kind = FloatClass::zero;
  } else if (value - value != 0) {
    d.kind = FloatClass::infinite;
  } else {
    d.kind = FloatClass::normal;
    d.value = Real(value);
  }
  return conversion_of(std::move(d));
}

Exact exact_from_float(float value) {
  const std::uint32_t raw = std::bit_cast<std::uint32_t>(value);
  Decoded d;
  d.negative = (raw >> 31) != 0;
  if (value != value) {
    d.kind = FloatClass::nan;
    d.signaling = ((raw >> 22) & 1) == 0;
  } else if (value == 0) {
    d.kind = FloatClass::zero;
  } else if (value - value != 0) {
    d.kind = FloatClass::infinite;
  } else {
    d.kind = FloatClass::normal;
    d.value = Real(static_cast<double>(value));
  }
  return conversion_of(std::move(d));
}

Exact exact_from_encoding(const Format& format, Bits bits) { return conversion_of(decode(format, bits)); }

Exact exact_add(const Format& format, Bits a, Bits b) { return add_decoded(decode(format, a), decode(format, b)); }

Exact exact_sub(const Format& format, Bits a, Bits b) {
  Decoded y = decode(format, b);
  y.negative = !y.negative;
  mpfr_neg(y.value.get(), y.value.get(), MPFR_RNDN);
  return add_decoded(decode(format, a), y);
}

Exact exact_mul(const Format& format, Bits a, Bits b) {
  const Decoded x = decode(format, a), y = decode(format, b);
  if (is_nan(x) || is_nan(y)) return nan_result(x.signaling || y.signaling);
  if ((is_zero(x) && is_inf(y)) || (is_inf(x) && is_zero(y))) return nan_result(true);
  const bool negative = x.negative != y.negative;
  if (is_inf(x) || is_inf(y)) return infinity_result(negative);
  if (is_zero(x) || is_zero(y)) return zero_result(negative);
  Real product;
  require_exact(mpfr_mul(product.get(), x.value.get(), y.value.get(), MPFR_RNDZ), "product");
  return finite_result(std::move(product));
}

Exact exact_div(const Format& format, Bits a, Bits b) {
  const Decoded x = decode(format, a), y = decode(format, b);
  if (is_nan(x) || is_nan(y)) return nan_result(x.signaling || y.signaling);
  if ((is_inf(x) && is_inf(y)) || (is_zero(x) && is_zero(y))) return nan_result(true);
  const bool negative = x.negative != y.negative;
  if (is_inf(x)) return infinity_result(negative);
  if (is_inf(y) || is_zero(x)) return zero_result(negative);
  if (is_zero(y)) return infinity_result(negative, Flags::divide_by_zero);
  Real quotient;
  const int t = mpfr_div(quotient.get(), x.value.get(), y.value.get(), MPFR_RNDZ);
  jam(quotient, t);
  return finite_result(std::move(quotient));
}

Exact exact_sqrt(const Format& format, Bits a) {
  const Decoded x = decode(format, a);
  if (is_nan(x)) return nan_result(x.signaling);
  if (is_zero(x)) return zero_result(x.negative);  // sqrt(-0) = -0
  if (x.negative) return nan_result(true);
  if (is_inf(x)) return infinity_result(false);
  Real root;
  const int t = mpfr_sqrt(root.get(), x.value.get(), MPFR_RNDZ);
  jam(root, t);
  return finite_result(std::move(root));
}

Exact exact_fma(const Format& format, Bits a, Bits b, Bits c) {
  const Decoded x = decode(format, a), y = decode(format, b), z = decode(format, c);
  const bool zero_times_infinity = (is_zero(x) && is_inf(y)) || (is_inf(x) && is_zero(y));
  if (is_nan(x) || is_nan(y) || is_nan(z)) {
    // x86/SoftFloat: 0*inf is invalid even when c is a quiet NaN.
    return nan_result(x.signaling || y.signaling || z.signaling || zero_times_infinity);
  }
  if (zero_times_infinity) return nan_result(true);
  const bool product_negative = x.negative != y.negative;
  if (is_inf(x) || is_inf(y)) {
    if (is_inf(z) && z.negative != product_negative) return nan_result(true);
    return infinity_result(product_negative);
  }
  if (is_inf(z)) return infinity_result(z.negative);
  if (is_zero(x) || is_zero(y)) {
    if (is_zero(z)) return z.negative == product_negative ? zero_result(z.negative) : cancellation_result();
    return finite_result(z.value);
  }
  if (is_zero(z)) {
    Real product;
    require_exact(mpfr_mul(product.get(), x.value.get(), y.value.get(), MPFR_RNDZ), "product");
    return finite_result(std::move(product));
  }
  Real result;
  const int t = mpfr_fma(result.get(), x.value.get(), y.value.get(), z.value.get(), MPFR_RNDZ);
  return sum_result(std::move(result), t);
}

Rounded from_double(const Format& format, RoundingMode mode, double value) {
  return round(format, mode, exact_from_double(value));
}
Rounded from_float(const Format& format, RoundingMode mode, float value) {
  return round(format, mode, exact_from_float(value));
}
Rounded convert(const Format& from, Bits bits, const Format& to, RoundingMode mode) {
  return round(to, mode, exact_from_encoding(from, bits));
}
Rounded add(const Format& format, RoundingMode mode, Bits a, Bits b) {
  return round(format, mode, exact_add(format, a, b));
}
Rounded sub(const Format& format, RoundingMode mode, Bits a, Bits b) {
  return round(format, mode, exact_sub(format, a, b));
}
Rounded mul(const Format& format, RoundingMode mode, Bits a, Bits b) {
  return round(format, mode, exact_mul(format, a, b));
}
Rounded div(const Format& format, RoundingMode mode, Bits a, Bits b) {
  return round(format, mode, exact_div(format, a, b));
}
Rounded sqrt(const Format& format, RoundingMode mode, Bits a) { return round(format, mode, exact_sqrt(format, a)); }
Rounded fma(const Format& format, RoundingMode mode, Bits a, Bits b, Bits c) {
  return round(format, mode, exact_fma(format, a, b, c));
}

// --- Comparing and reporting -------------------------------------------------------
std::string_view mode_name(RoundingMode mode) {
  switch (mode) {
    case RoundingMode::nearest_even: return "nearest_even";
    case RoundingMode::nearest_away: return "nearest_away";
    case RoundingMode::toward_zero: return "toward_zero";
    case RoundingMode::toward_positive: return "toward_positive";
    case RoundingMode::toward_negative: return "toward_negative";
    case RoundingMode::odd: return "odd";
    case RoundingMode::stochastic: return "stochastic";
  }
  return "?";
}

std::string_view class_name(FloatClass kind) {
  switch (kind) {
    case FloatClass::zero: return "zero";
    case FloatClass::subnormal: return "subnormal";
    case FloatClass::normal: return "normal";
    case FloatClass::infinite: return "infinite";
    case FloatClass::nan: return "nan";
  }
  return "?";
}

std::string flags_name(Flags flags) {
  static constexpr std::pair<std::uint8_t, const char*> names[] = {
      {Flags::invalid, "invalid"}, {Flags::divide_by_zero, "divide_by_zero"}, {Flags::overflow, "overflow"},
      {Flags::underflow, "underflow"}, {Flags::inexact, "inexact"}};
  std::string text;
  for (const auto& [bit, name] : names) {
    if ((flags.bits & bit) == 0) continue;
    if (!text.empty()) text += '|';
    text += name;
  }
  if ((flags.bits & ~0x1Fu) != 0) text += text.empty() ? "unknown" : "|unknown";
  return text.empty() ? "none" : text;
}

std::string describe(const Format& format, Bits bits) {
  const Decoded d = decode(format, bits);
  char text[128];
  const int digits = (1 + format.exponent_bits + format.mantissa_bits + 3) / 4;
  const auto raw = static_cast<unsigned long long>(bits.value);
  if (d.kind == FloatClass::nan) {
    std::snprintf(text, sizeof text, "0x%0*llx (%cnan%s)", digits, raw, d.negative ? '-' : '+',
                  d.signaling ? " signaling" : "");
  } else {
    std::snprintf(text, sizeof text, "0x%0*llx (%a %s)", digits, raw, d.value.to_double(),
                  std::string(class_name(d.kind)).c_str());
  }
  return text;
}

std::string describe(const Format& format, const Rounded& result) {
  return describe(format, result.bits) + " flags " + flags_name(result.flags);
}

bool agrees(const Format& format, const Rounded& expected, const Rounded& got) {
  if (!(expected.flags == got.flags)) return false;
  const FloatClass want = oracle::classify(format, expected.bits);
  if (want != oracle::classify(format, got.bits)) return false;
  return want == FloatClass::nan || expected.bits == got.bits;
}

}  // namespace mpsim::oracle
