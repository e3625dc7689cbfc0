#include "mpsim/emulation/format.hpp"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "exact.hpp"

namespace mpsim {
namespace {

struct Fields {
  bool negative;
  std::uint64_t exponent;
  std::uint64_t mantissa;
};

constexpr std::uint64_t low_mask(int bits) { return bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1; }

Fields split(const Format& f, Bits bits) {
  const int m = f.mantissa_bits;
  return {((bits.value >> (m + f.exponent_bits)) & 1) != 0, (bits.value >> m) & low_mask(f.exponent_bits),
          bits.value & low_mask(m)};
}

Bits join(const Format& f, bool negative, std::uint64_t exponent, std::uint64_t mantissa) {
  const int m = f.mantissa_bits;
  return Bits{(std::uint64_t{negative} << (m + f.exponent_bits)) | (exponent << m) | mantissa};
}

struct Preset {
  std::string_view name;
  Format format;
};
constexpr Preset presets[] = {
    {"binary16", formats::binary16}, {"bfloat16", formats::bfloat16}, {"tf32", formats::tf32},
    {"e4m3", formats::e4m3},         {"e5m2", formats::e5m2},         {"e2m1", formats::e2m1},
    {"e3m2", formats::e3m2},         {"e2m3", formats::e2m3},         {"binary32", formats::binary32},
    {"binary64", formats::binary64},
};
struct Alias {
  std::string_view alias, name;
};
constexpr Alias aliases[] = {{"fp16", "binary16"}, {"half", "binary16"},   {"bf16", "bfloat16"},
                             {"fp8e4m3", "e4m3"},  {"fp8e5m2", "e5m2"},    {"fp32", "binary32"},
                             {"float", "binary32"}, {"fp64", "binary64"}, {"double", "binary64"},
                             {"fp4e2m1", "e2m1"},  {"fp6e3m2", "e3m2"},    {"fp6e2m3", "e2m3"}};

std::optional<Format> parse_base(std::string_view text) {
  for (const auto& a : aliases)
    if (text == a.alias) text = a.name;
  for (const auto& p : presets)
    if (text == p.name) return p.format;
  // Custom "eXmY".
  if (text.size() < 4 || text[0] != 'e') return std::nullopt;
  const auto m_pos = text.find('m');
  if (m_pos == std::string_view::npos) return std::nullopt;
  Format f;
  const auto e_text = text.substr(1, m_pos - 1), m_text = text.substr(m_pos + 1);
  auto [pe, ee] = std::from_chars(e_text.data(), e_text.data() + e_text.size(), f.exponent_bits);
  auto [pm, em] = std::from_chars(m_text.data(), m_text.data() + m_text.size(), f.mantissa_bits);
  if (ee != std::errc{} || em != std::errc{} || pe != e_text.data() + e_text.size() ||
      pm != m_text.data() + m_text.size() || e_text.empty() || m_text.empty())
    return std::nullopt;
  return f;
}

}  // namespace

double Format::largest_finite() const {
  return std::ldexp(static_cast<double>(max_significand()), emax() - mantissa_bits);
}
double Format::smallest_normal() const { return std::ldexp(1.0, emin()); }
double Format::smallest_subnormal() const {
  return subnormals == Subnormals::gradual ? std::ldexp(1.0, emin() - mantissa_bits) : smallest_normal();
}
double Format::unit_roundoff() const { return std::ldexp(1.0, -precision()); }
double Format::machine_epsilon() const { return std::ldexp(1.0, 1 - precision()); }

std::optional<std::string> Format::invalid_reason() const {
  if (exponent_bits < 2 || exponent_bits > 11)
    return "exponent width " + std::to_string(exponent_bits) + " is outside 2..11";
  if (mantissa_bits < 0 || mantissa_bits > 52)
    return "mantissa width " + std::to_string(mantissa_bits) + " is outside 0..52";
  if (specials == Specials::none && overflow != Overflow::saturate)
    return "a format with neither infinity nor NaN (:finite) can only saturate on overflow: drop :nosat";
  return std::nullopt;
}

std::string Format::name() const {
  for (const auto& p : presets)
    if (p.format == *this) return std::string(p.name);
  std::string text = "e" + std::to_string(exponent_bits) + "m" + std::to_string(mantissa_bits);
  // The options, in the order parse_format applies them, from what "eXmY" alone parses to.
  Format now = *parse_base(text);
  // With no mantissa bits `ieee` and `nan_only` are the same format.
  const auto kind = [this](Specials s) { return mantissa_bits == 0 && s == Specials::nan_only ? Specials::ieee : s; };
  if (kind(specials) != kind(now.specials)) {
    text += specials == Specials::nan_only ? ":fn" : specials == Specials::none ? ":finite" : ":inf";
    now.specials = specials;
    if (specials == Specials::none) now.overflow = Overflow::saturate;
  }
  if (subnormals != now.subnormals) text += subnormals == Subnormals::flush_to_zero ? ":ftz" : ":subnormals";
  if (overflow != now.overflow) text += overflow == Overflow::saturate ? ":sat" : ":nosat";
  return text;
}

std::string_view format_names() {
  return "binary16 (fp16, half), bfloat16 (bf16), tf32, e4m3 (fp8e4m3), e5m2 (fp8e5m2), e2m1 (fp4e2m1), "
         "e3m2 (fp6e3m2), e2m3 (fp6e2m3), binary32 (fp32), binary64 (fp64), or eXmY with X in 2..11 exponent bits "
         "and Y in 0..52 mantissa bits; options after colons: ftz (flush subnormals), sat (saturate on overflow), "
         "nosat, fn (no infinities, NaN only at all-ones), finite (no infinities and no NaN, saturating), inf "
         "(IEEE infinities), e.g. e6m9:ftz:sat";
}

std::optional<Format> parse_format(std::string_view text) {
  auto colon = text.find(':');
  auto format = parse_base(text.substr(0, colon));
  if (!format || format->invalid_reason()) return std::nullopt;
  while (colon != std::string_view::npos) {
    text.remove_prefix(colon + 1);
    colon = text.find(':');
    const auto option = text.substr(0, colon);
    if (option == "ftz") format->subnormals = Subnormals::flush_to_zero;
    else if (option == "subnormals") format->subnormals = Subnormals::gradual;
    else if (option == "sat") format->overflow = Overflow::saturate;
    else if (option == "nosat") format->overflow = Overflow::ieee;
    else if (option == "fn") format->specials = Specials::nan_only;
    else if (option == "inf") format->specials = Specials::ieee;
    else if (option == "finite") format->specials = Specials::none, format->overflow = Overflow::saturate;
    else return std::nullopt;
  }
  if (format->invalid_reason()) return std::nullopt;
  return format;
}

FloatClass classify(const Format& f, Bits bits) {
  switch (detail::decode(f, bits).kind) {
    case detail::Kind::zero: return FloatClass::zero;
    case detail::Kind::infinite: return FloatClass::infinite;
    case detail::Kind::nan: return FloatClass::nan;
    case detail::Kind::finite: break;
  }
  return split(f, bits).exponent == 0 ? FloatClass::subnormal : FloatClass::normal;
}

bool is_signaling_nan(const Format& f, Bits bits) {
  const auto d = detail::decode(f, bits);
  return d.kind == detail::Kind::nan && d.signaling;
}

Bits quiet_nan(const Format& f, bool negative) {
  if (!f.has_nan()) return largest_finite_bits(f, false);  // Specials::none: what a NaN becomes
  const Bits nan = detail::default_nan(f);
  return join(f, negative, split(f, nan).exponent, split(f, nan).mantissa);
}

Bits infinity_or_nan(const Format& f, bool negative) {
  if (f.has_infinity()) return join(f, negative, low_mask(f.exponent_bits), 0);
  if (!f.has_nan()) return largest_finite_bits(f, negative);  // Specials::none saturates
  return quiet_nan(f, negative);
}

Bits largest_finite_bits(const Format& f, bool negative) {
  const std::uint64_t top_exponent = low_mask(f.exponent_bits) - (f.all_ones_exponent_is_finite() ? 0 : 1);
  return join(f, negative, top_exponent, f.max_significand() & low_mask(f.mantissa_bits));
}

bool fits_in_float(const Format& f) {
  return f.precision() <= 24 && f.emax() <= 127 && f.emin() - f.mantissa_bits >= -149;
}

double to_double(const Format& f, Bits bits) {
  const auto d = detail::decode(f, bits);
  switch (d.kind) {
    case detail::Kind::zero: return d.negative ? -0.0 : 0.0;
    case detail::Kind::infinite:
      return d.negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    case detail::Kind::nan: {
      const int payload_bits = f.has_infinity() ? f.mantissa_bits - 1 : 0;
      const std::uint64_t payload = payload_bits > 0 ? d.payload << (51 - payload_bits) : 0;
      const std::uint64_t quiet = std::uint64_t{1} << 51;
      return std::bit_cast<double>((std::uint64_t{d.negative} << 63) | (std::uint64_t{0x7FF} << 52) | quiet | payload);
    }
    case detail::Kind::finite: break;
  }
  const double magnitude = std::ldexp(static_cast<double>(d.significand), d.exponent);
  return d.negative ? -magnitude : magnitude;
}

float to_float(const Format& f, Bits bits) {
  const auto d = detail::decode(f, bits);
  if (d.kind == detail::Kind::nan) {
    const int payload_bits = f.has_infinity() ? f.mantissa_bits - 1 : 0;
    const std::uint32_t payload =
        payload_bits > 0 ? static_cast<std::uint32_t>(payload_bits <= 22 ? d.payload << (22 - payload_bits)
                                                                           : d.payload >> (payload_bits - 22))
                         : 0;
    return std::bit_cast<float>((std::uint32_t{d.negative} << 31) | 0x7FC00000u | payload);
  }
  return static_cast<float>(to_double(f, bits));  // exact when fits_in_float(f)
}

Bits next_up(const Format& f, Bits bits) {
  const auto d = detail::decode(f, bits);
  const Fields x = split(f, bits);
  const std::uint64_t magnitude = bits.value & low_mask(f.exponent_bits + f.mantissa_bits);
  const bool ftz = f.subnormals == Subnormals::flush_to_zero;
  const Bits smallest_normal = join(f, false, 1, 0);
  switch (d.kind) {
    case detail::Kind::nan: return bits;
    case detail::Kind::infinite: return d.negative ? largest_finite_bits(f, true) : bits;
    case detail::Kind::zero: return ftz ? smallest_normal : Bits{1};
    case detail::Kind::finite: break;
  }
  if (!x.negative) {
    if (bits == largest_finite_bits(f, false)) return f.has_infinity() ? infinity_or_nan(f, false) : bits;
    return Bits{bits.value + 1};
  }
  const Bits smaller = Bits{bits.value - 1};
  if ((magnitude - 1) == 0 || (ftz && split(f, smaller).exponent == 0)) return join(f, true, 0, 0);
  return smaller;
}

Bits next_down(const Format& f, Bits bits) {
  // nextDown(x) = -nextUp(-x) (IEEE 754 §5.3.1).
  const std::uint64_t sign = std::uint64_t{1} << (f.exponent_bits + f.mantissa_bits);
  if (classify(f, bits) == FloatClass::nan) return bits;
  return Bits{next_up(f, Bits{bits.value ^ sign}).value ^ sign};
}

namespace detail {

Decoded decode(const Format& f, Bits bits) {
  const Fields x = split(f, bits);
  const std::uint64_t all_ones = low_mask(f.exponent_bits);
  const int m = f.mantissa_bits;
  Decoded d;
  d.negative = x.negative;
  if (x.exponent == all_ones) {
    if (f.has_infinity()) {
      if (x.mantissa == 0) {
        d.kind = Kind::infinite;
      } else {
        d.kind = Kind::nan;
        const std::uint64_t quiet_bit = std::uint64_t{1} << (m - 1);
        d.signaling = (x.mantissa & quiet_bit) == 0;
        d.payload = x.mantissa & (quiet_bit - 1);
      }
      return d;
    }
    if (f.has_nan() && x.mantissa == low_mask(m)) {
      d.kind = Kind::nan;
      return d;
    }
  }
  if (x.exponent == 0) {
    if (x.mantissa == 0 || f.subnormals == Subnormals::flush_to_zero) {
      d.kind = Kind::zero;
      return d;
    }
    d.kind = Kind::finite;
    d.exponent = f.emin() - m;
    d.significand = x.mantissa;
    return d;
  }
  d.kind = Kind::finite;
  d.exponent = static_cast<int>(x.exponent) - f.bias() - m;
  d.significand = x.mantissa | (std::uint64_t{1} << m);
  return d;
}

Decoded decode_binary64(double value) { return decode(formats::binary64, Bits{std::bit_cast<std::uint64_t>(value)}); }
Decoded decode_binary32(float value) { return decode(formats::binary32, Bits{std::bit_cast<std::uint32_t>(value)}); }

Bits encode_zero(const Format& f, bool negative) { return join(f, negative, 0, 0); }

Bits default_nan(const Format& f) {
  if (!f.has_nan()) return largest_finite_bits(f, false);  // Specials::none: what a NaN becomes
  // x86's default NaN (sign set, quiet), as SoftFloat's 8086 specialisation and TestFloat use.
  if (!f.has_infinity()) return join(f, true, low_mask(f.exponent_bits), low_mask(f.mantissa_bits));
  return join(f, true, low_mask(f.exponent_bits), std::uint64_t{1} << (f.mantissa_bits - 1));
}

Bits encode_nan(const Format& f, bool negative, std::uint64_t payload, int payload_bits) {
  if (!f.has_nan()) return largest_finite_bits(f, false);  // Specials::none: what a NaN becomes
  if (!f.has_infinity()) return join(f, negative, low_mask(f.exponent_bits), low_mask(f.mantissa_bits));
  const int room = f.mantissa_bits - 1;
  const std::uint64_t kept = room <= 0 ? 0
                             : payload_bits >= room ? payload >> (payload_bits - room)
                                                    : payload << (room - payload_bits);
  return join(f, negative, low_mask(f.exponent_bits), (std::uint64_t{1} << room) | kept);
}

Bits encode_infinite(const Format& f, bool negative) {
  if (f.has_infinity()) return infinity_or_nan(f, negative);
  return f.overflow == Overflow::saturate ? largest_finite_bits(f, negative) : quiet_nan(f, negative);
}

}  // namespace detail
}  // namespace mpsim
