// Host side of pattern_rounding.hpp: a PatternFormat and a PatternRounding
// from the emulator's Format and Rounding, checked.
#pragma once

#include <cstdint>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/pattern_rounding.hpp"
#include "mpsim/emulation/rounding.hpp"

namespace mpsim {

// Throw std::invalid_argument naming the format unless it is valid and fits
// the storage (binary32: fits_in_float; binary64: every valid format does).
PatternFormat<std::uint32_t> binary32_pattern_format(const Format& format);
PatternFormat<std::uint64_t> binary64_pattern_format(const Format& format);

// The grid of symmetric integers k * 2^-fraction_bits, |k| <= 2^(bits-1) - 1,
// saturating (block_format.hpp's integer elements: MXINT8, int8, int4), as a
// format whose values all lie below its smallest normal 2^(bits-1-fraction_bits):
// one quantum, 2^-fraction_bits, from zero to the largest value, so that
// round_pattern rounds y * 2^fraction_bits to an integer in every mode, the
// draw included, and saturates beyond. A zero keeps the input's sign there;
// an integer code holds no -0, so the caller drops it. Throws
// std::invalid_argument unless bits is in 2..16 and the grid fits binary32.
PatternFormat<std::uint32_t> integer_pattern_format(int bits, int fraction_bits);

// Throws std::invalid_argument unless random_bits is in 1..32.
PatternRounding pattern_rounding(const Rounding& rounding);

}  // namespace mpsim
