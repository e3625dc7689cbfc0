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

// A keyed form of Wellons' "lowbias32" integer hash: two multiply-xorshift
// rounds, with the key and the index's high word folded in between. Each step
// is a bijection of the 32-bit state, so distinct low words give distinct draws.
MPSIM_HOST_DEVICE constexpr std::uint32_t random_draw(DrawKey key, std::uint64_t index) {
  std::uint32_t x = static_cast<std::uint32_t>(index) ^ key.low;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x ^= draw_high_term(key, index);
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

}  // namespace mpsim
