// Host side of device_rounding.hpp: DeviceFormat and DeviceRounding from the
// emulator's Format and Rounding, checked (pattern_format.hpp). Host code only
// (it includes the emulator's headers); kernels receive the results by value.
#pragma once

#include <stdexcept>
#include <string>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/pattern_format.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "mpsim/gpu/device_rounding.hpp"

namespace mpsim::gpu {

// Throws std::invalid_argument naming the format unless it is valid and fits_in_float.
inline DeviceFormat make_device_format(const Format& f) { return binary32_pattern_format(f); }

// Throws std::invalid_argument unless random_bits is in 1..32.
inline DeviceRounding make_device_rounding(const Rounding& r) { return pattern_rounding(r); }

}  // namespace mpsim::gpu
