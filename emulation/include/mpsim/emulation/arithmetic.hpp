// Correctly rounded arithmetic in any format, every rounding mode, with IEEE
// 754 exception flags. Computed exactly on integers (no double rounding):
// see docs/emulation.md for why binary64 intermediates are avoided.
#pragma once

#include "mpsim/emulation/rounding.hpp"

namespace mpsim {

Rounded add(const Format& f, Rounding r, Bits a, Bits b, std::uint32_t draw = 0);
Rounded sub(const Format& f, Rounding r, Bits a, Bits b, std::uint32_t draw = 0);
Rounded mul(const Format& f, Rounding r, Bits a, Bits b, std::uint32_t draw = 0);
Rounded div(const Format& f, Rounding r, Bits a, Bits b, std::uint32_t draw = 0);
Rounded sqrt(const Format& f, Rounding r, Bits a, std::uint32_t draw = 0);
// a*b + c with a single rounding (IEEE 754 fusedMultiplyAdd).
Rounded fma(const Format& f, Rounding r, Bits a, Bits b, Bits c, std::uint32_t draw = 0);

}  // namespace mpsim
