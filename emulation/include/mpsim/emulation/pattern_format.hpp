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

// Throws std::invalid_argument unless random_bits is in 1..32.
PatternRounding pattern_rounding(const Rounding& rounding);

}  // namespace mpsim
