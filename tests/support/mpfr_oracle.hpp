// An independent reference for the emulator, built on MPFR. It reads a Format
// only through its five fields (exponent_bits, mantissa_bits, subnormals,
// overflow, specials) and follows docs/emulation-contract.md; it shares no code
// with emulation/src and calls none of the emulator's functions (only its
// types: Format, Bits, Flags, Rounded, RoundingMode).
//
// Method: every operation is first computed in MPFR at Real::kPrecision bits,
// toward zero; an inexact result is then "jammed" (its last bit set, i.e.
// rounded to odd), which keeps it strictly between the same two 318-bit
// numbers as the exact result. Rounding that to p <= 53 bits, at any quantum,
// in any mode, gives the correctly rounded result (Boldo & Melquiond, "When
// double rounding is odd", 2005). The rounding into a format is done here by
// hand: truncation to a multiple of the quantum plus a comparison of the
// remainder with one half, which covers ties-away and round-to-odd (MPFR has
// neither for ordinary operations) and the fixed quantum 2^(emin-M) of the
// subnormal range.
#pragma once

#include <cstdint>  // before mpfr.h: enables MPFR's uintmax_t functions
#include <mpfr.h>

#include <array>
#include <string>
#include <string_view>

#include "mpsim/emulation/format.hpp"    // types only: Format, Bits, FloatClass
#include "mpsim/emulation/rounding.hpp"  // types only: RoundingMode, Flags, Rounded

namespace mpsim::oracle {

// An MPFR number that owns its storage, in the object itself: its limbs
// through MPFR's custom interface (mpfr_custom_init_set), so making one
// allocates nothing. The oracle makes millions per test; heap allocation was a
// third of their time. Every Real has kPrecision bits; never give get() to
// anything that changes the precision (mpfr_set_prec) or swaps storage.
class Real {
 public:
  // At least 2*53 bits so products of two format values are exact, and 2 more
  // than any target precision so round-to-odd intermediates round correctly.
  static constexpr mpfr_prec_t kPrecision = 320;

  Real();  // +0
  explicit Real(double value);
  Real(const Real& other);
  Real& operator=(const Real& other);

  mpfr_ptr get() { return value_; }
  mpfr_srcptr get() const { return value_; }
  // Every value of a format with E <= 11 and M <= 52 is a binary64 value, so
  // this is exact for them.
  double to_double() const { return mpfr_get_d(value_, MPFR_RNDN); }

 private:
  static constexpr int kLimbs = (kPrecision + GMP_NUMB_BITS - 1) / GMP_NUMB_BITS;
  mp_limb_t limbs_[kLimbs];
  mpfr_t value_;  // points into limbs_
};

// What the contract says about a format, derived from its fields and from
// decoding particular encodings.
struct Facts {
  int precision = 0;  // p = M+1
  int bias = 0;       // 2^(E-1)-1
  int emin = 0;       // exponent of the smallest normal encoding
  int emax = 0;       // exponent of the largest finite encoding
  bool has_infinity = false;
  bool gradual = true;
  Real largest;             // largest finite value
  Real smallest_normal;     // 2^emin
  Real smallest_positive;   // 2^(emin-M) with gradual underflow, 2^emin when subnormals are flushed
  Real largest_subnormal;   // 0 when subnormals are flushed or M = 0
  Real unit_roundoff;       // 2^-p
  Real machine_epsilon;     // 2^(1-p): the gap between 1 and the next larger value
};
const Facts& facts(const Format& format);

// "e5m10", "e4m3:sat:fn", ... (independent of Format::name()).
std::string format_name(const Format& format);

// --- Encodings ---------------------------------------------------------------
struct Decoded {
  FloatClass kind = FloatClass::zero;
  bool negative = false;
  bool signaling = false;  // a NaN with its quiet bit clear (formats with infinities only)
  Real value;              // exact signed value; +-0 for zeros (and flushed subnormals), +-inf, NaN
};
Decoded decode(const Format& format, Bits bits);
FloatClass classify(const Format& format, Bits bits);
bool is_signaling_nan(const Format& format, Bits bits);

// Encoding of a value the format holds exactly (throws std::logic_error otherwise).
Bits encode(const Format& format, const Real& value);
Bits encode(const Format& format, double value);
Bits zero_bits(const Format& format, bool negative);
Bits nan_bits(const Format& format);  // a quiet NaN
Bits infinity_bits(const Format& format, bool negative);  // requires an infinity
Bits largest_bits(const Format& format, bool negative);
Bits negate(const Format& format, Bits bits);

// nextUp / nextDown, found by rounding x + epsilon toward +inf (not by
// incrementing encodings). nextUp(largest) is +inf, or the largest itself in a
// format without infinity; nextUp(-smallest) is -0; NaN gives a NaN.
Bits next_up(const Format& format, Bits bits);
Bits next_down(const Format& format, Bits bits);

// --- Exact results and rounding -------------------------------------------------
// The exact (or jammed) result of an operation before rounding.
struct Exact {
  enum class Kind : std::uint8_t { finite, zero, infinity, nan };
  Kind kind = Kind::nan;
  bool negative = false;
  bool cancellation = false;         // exact zero sum of opposite signs: +0, or -0 toward negative
  bool infinity_is_overflow = false;  // an infinite conversion input: an overflow where there is no infinity
  Flags flags{};                      // invalid / divide_by_zero raised by the operation itself
  Real value;                         // finite nonzero results: exact, or round-to-odd at kPrecision bits
};

Exact exact_from_double(double value);
Exact exact_from_float(float value);
Exact exact_from_encoding(const Format& format, Bits bits);
Exact exact_add(const Format& format, Bits a, Bits b);
Exact exact_sub(const Format& format, Bits a, Bits b);
Exact exact_mul(const Format& format, Bits a, Bits b);
Exact exact_div(const Format& format, Bits a, Bits b);
Exact exact_sqrt(const Format& format, Bits a);
Exact exact_fma(const Format& format, Bits a, Bits b, Bits c);

// Rounds into `format` per the contract. Every mode but stochastic (throws).
Rounded round(const Format& format, RoundingMode mode, const Exact& exact);

Rounded from_double(const Format& format, RoundingMode mode, double value);
Rounded from_float(const Format& format, RoundingMode mode, float value);
Rounded convert(const Format& from, Bits bits, const Format& to, RoundingMode mode);
Rounded add(const Format& format, RoundingMode mode, Bits a, Bits b);
Rounded sub(const Format& format, RoundingMode mode, Bits a, Bits b);
Rounded mul(const Format& format, RoundingMode mode, Bits a, Bits b);
Rounded div(const Format& format, RoundingMode mode, Bits a, Bits b);
Rounded sqrt(const Format& format, RoundingMode mode, Bits a);
Rounded fma(const Format& format, RoundingMode mode, Bits a, Bits b, Bits c);

// --- Comparing and reporting -------------------------------------------------------
inline constexpr std::array<RoundingMode, 6> kDeterministicModes = {
    RoundingMode::nearest_even,    RoundingMode::nearest_away,    RoundingMode::toward_zero,
    RoundingMode::toward_positive, RoundingMode::toward_negative, RoundingMode::odd};

std::string_view mode_name(RoundingMode mode);
std::string_view class_name(FloatClass kind);
std::string flags_name(Flags flags);
// "0x3c00 (+0x1p+0 normal)"
std::string describe(const Format& format, Bits bits);
// "0x3c00 (+0x1p+0 normal) flags inexact"
std::string describe(const Format& format, const Rounded& result);

// The contract's comparison: the classes agree; non-NaN encodings agree bit for
// bit (so zero signs too); NaNs agree by class only; flags agree exactly.
bool agrees(const Format& format, const Rounded& expected, const Rounded& got);

}  // namespace mpsim::oracle
