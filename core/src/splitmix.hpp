#pragma once
// SplitMix64 (Steele, Lea and Flood 2014, as in Vigna's reference code),
// written out so that a seed gives the same bits with every compiler and
// standard library; <random>'s distributions are not specified that tightly.

#include <cstdint>

namespace mpsim::core {

inline constexpr std::uint64_t splitmix_gamma = 0x9e3779b97f4a7c15u;

constexpr std::uint64_t splitmix_finalize(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return splitmix_finalize(state_ += splitmix_gamma); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n), n > 0, without modulo bias: draws below 2^64 mod n are
  // rejected so that every residue is equally likely.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t threshold = (0 - n) % n;
    for (;;) {
      const std::uint64_t x = next();
      if (x >= threshold) return x % n;
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace mpsim::core
