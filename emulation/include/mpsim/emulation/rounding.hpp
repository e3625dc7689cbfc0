// Rounding modes, IEEE 754 exception flags, the counter-based random draws of
// stochastic rounding, and one-step rounding of binary32/binary64 values.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/random_draw.hpp"

namespace mpsim {

enum class RoundingMode : std::uint8_t {
  nearest_even,  // IEEE 754 roundTiesToEven
  nearest_away,  // IEEE 754 roundTiesToAway
  toward_zero,
  toward_positive,
  toward_negative,
  odd,         // round to odd ("von Neumann" / jamming): truncate, set the last bit if inexact
  stochastic,  // up with probability proportional to the distance from the lower neighbour
};

std::optional<RoundingMode> parse_rounding_mode(std::string_view text);
std::string_view to_string(RoundingMode mode);
std::string_view rounding_mode_names();

// A rounding mode and, for stochastic rounding, how many random bits decide:
// the remainder is truncated to `random_bits` bits, so the probability of
// rounding up is floor(distance * 2^bits) / 2^bits of the gap between neighbours.
struct Rounding {
  RoundingMode mode = RoundingMode::nearest_even;
  int random_bits = 32;  // 1..32, stochastic rounding only
};

// IEEE 754 exception flags, with TestFloat's bit assignment. Underflow is
// signalled when the result is tiny after rounding (as on x86 and ARM) and inexact.
struct Flags {
  enum : std::uint8_t { inexact = 1, underflow = 2, overflow = 4, divide_by_zero = 8, invalid = 16 };
  std::uint8_t bits = 0;
  constexpr bool has(std::uint8_t flag) const { return (bits & flag) != 0; }
  constexpr Flags& operator|=(Flags other) { bits |= other.bits; return *this; }
  friend constexpr bool operator==(Flags, Flags) = default;
};
std::string flags_to_string(Flags flags);  // "inexact|underflow", or "none"

struct Rounded {
  Bits bits;
  Flags flags;
};

// --- Stochastic rounding draws -----------------------------------------------
// Every draw depends only on (seed, stream, element index), through a keyed
// 32-bit integer hash, so results do not depend on thread count or how an array
// is split, and a GPU kernel can reproduce them (see docs/emulation.md).
struct RandomKey {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
};
DrawKey make_draw_key(RandomKey key);
// random_draw(DrawKey, index): random_draw.hpp, shared with the CUDA kernels.

// --- One-step rounding ---------------------------------------------------------
// Rounds the exact value of `value` into `format` once. `draw` is the 32-bit
// random word used by stochastic rounding, ignored by the other modes.
Rounded round_to_format(const Format& format, Rounding rounding, double value, std::uint32_t draw = 0);
Rounded round_to_format(const Format& format, Rounding rounding, float value, std::uint32_t draw = 0);
// Converts an encoding of one format into another, rounding once.
Rounded convert(const Format& from, Bits bits, const Format& to, Rounding rounding, std::uint32_t draw = 0);

}  // namespace mpsim
