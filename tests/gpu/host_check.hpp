// What the host tests of gpu/'s device-portable code share: the formats
// they run (test_device_rounding.cpp, test_device_storage.cpp) and a tally of
// mismatches against the emulator.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "mpsim/emulation/format.hpp"

namespace mpsim::gpu::host_check {

// Presets and custom formats that exercise every branch: flushing (also at
// binary32's own subnormals), saturation, NaN-only overflow, no mantissa bits,
// a one-bit mantissa (no NaN payload room).
inline const Format kFormats[] = {
    formats::binary16,
    formats::bfloat16,
    formats::tf32,
    formats::e4m3,
    formats::e5m2,
    formats::binary32,
    Format{6, 9, Subnormals::flush_to_zero},
    Format{5, 7, Subnormals::gradual, Overflow::saturate},
};
inline const Format kEdgeFormats[] = {
    Format{8, 7, Subnormals::flush_to_zero},                         // bfloat16, flushing
    Format{8, 23, Subnormals::flush_to_zero},                        // binary32, flushing
    Format{4, 3, Subnormals::gradual, Overflow::ieee, Specials::nan_only},  // e4m3 overflowing to NaN
    Format{5, 2, Subnormals::flush_to_zero, Overflow::saturate, Specials::nan_only},
    Format{8, 0},  // no mantissa bits: no subnormals, no infinity
    Format{3, 0, Subnormals::gradual, Overflow::saturate},
    Format{2, 1},
    Format{7, 16, Subnormals::flush_to_zero, Overflow::saturate},
    formats::e2m1,  // OCP FP4 and FP6: no infinity, no NaN
    formats::e3m2,
    formats::e2m3,
};

inline std::string hex_bits(std::uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08X", bits);
  return text;
}

// Mismatches between device-portable code and the emulator, the first few described.
struct Tally {
  std::uint64_t compared = 0, mismatched = 0;
  std::string first;
  void add(const std::string& what) {
    if (++mismatched <= 8) first += "\n  " + what;
  }
  Tally& operator+=(const Tally& other) {
    compared += other.compared;
    mismatched += other.mismatched;
    first += other.first;
    return *this;
  }
};

}  // namespace mpsim::gpu::host_check
