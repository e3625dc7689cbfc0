#pragma once
// Stochastic rounding's random word, written once for the emulator and the
// CUDA kernels: element `index` of a stream with key `key` draws
// random_draw(key, index), so results depend only on (seed, stream, index),
// never on thread count, how an array is split, or the device
// (docs/emulation.md). 32-bit integer operations only.

#include <cstdint>

#include "mpsim/emulation/host_device.hpp"

namespace mpsim {

// The two words a (seed, stream) pair hashes to (make_draw_key, rounding.hpp).
struct DrawKey {
  std::uint32_t low = 0, high = 0;
};

// What the index's high word adds to the hash state (random_draw's second
// round): the same for every index of one 2^32 window, so vector code that
// steps low words computes it once per window.
MPSIM_HOST_DEVICE constexpr std::uint32_t draw_high_term(DrawKey key, std::uint64_t index) {
  return key.high + static_cast<std::uint32_t>(index >> 32) * 0x9E3779B9u;
}

// The multipliers of random_draw's two rounds (Wellons' lowbias32).
inline constexpr std::uint32_t kDrawMultiplier1 = 0x7FEB352Du, kDrawMultiplier2 = 0x846CA68Bu;

// A keyed form of Wellons' "lowbias32" integer hash: two multiply-xorshift
// rounds, with the key and the index's high word folded in between. Each step
// is a bijection of the 32-bit state, so distinct low words give distinct draws.
MPSIM_HOST_DEVICE constexpr std::uint32_t random_draw(DrawKey key, std::uint64_t index) {
  std::uint32_t x = static_cast<std::uint32_t>(index) ^ key.low;
  x ^= x >> 16;
  x *= kDrawMultiplier1;
  x ^= x >> 15;
  x ^= draw_high_term(key, index);
  x *= kDrawMultiplier2;
  x ^= x >> 16;
  return x;
}

// random_draw's state after its first xorshift is the index's low word xor
// this term, the same for every index whose bits 16 to 31 are index's (with
// u = low word ^ key.low, u ^ (u >> 16) = low word ^ key.low ^ (u >> 16), and
// u >> 16 depends on those bits only): vector code within one 2^16 window
// saves the shift and one xor per draw (quantize_vector.cpp's
// SteppedWindowDraws), or the first multiplication too where a vector starts
// at a multiple of its lane count (AlignedWindowDraws).
MPSIM_HOST_DEVICE constexpr std::uint32_t draw_window_term(DrawKey key, std::uint64_t index) {
  return key.low ^ ((static_cast<std::uint32_t>(index) ^ key.low) >> 16);
}

}  // namespace mpsim
