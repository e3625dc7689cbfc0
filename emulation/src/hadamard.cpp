#include "mpsim/emulation/hadamard.hpp"

#include <stdexcept>
#include <string>

#include "mpsim/emulation/random_draw.hpp"
#include "mpsim/emulation/rounding.hpp"

namespace mpsim {

std::array<float, kHadamardSize> hadamard_signs(std::uint64_t seed) {
  const DrawKey key = make_draw_key({seed, 0x4841444Du});
  std::array<float, kHadamardSize> signs{};
  for (int i = 0; i < kHadamardSize; ++i) signs[static_cast<std::size_t>(i)] = (random_draw(key, static_cast<std::uint64_t>(i)) & 1) ? -1.0f : 1.0f;
  return signs;
}

void random_hadamard(std::span<float> x, std::int64_t rows, std::int64_t cols, std::uint64_t seed, bool inverse) {
  if (rows < 0 || cols < 0 || static_cast<std::uint64_t>(rows * cols) != x.size())
    throw std::invalid_argument("random_hadamard: a " + std::to_string(rows) + " x " + std::to_string(cols) +
                                " tensor needs " + std::to_string(rows * cols) + " values, got " + std::to_string(x.size()));
  if (cols % kHadamardSize != 0)
    throw std::invalid_argument("random_hadamard: the rows' length " + std::to_string(cols) + " is not a multiple of " +
                                std::to_string(kHadamardSize) + " (pad the tensor)");
  const std::array<float, kHadamardSize> signs = hadamard_signs(seed);
  for (std::size_t chunk = 0; chunk < x.size(); chunk += kHadamardSize) {
    double v[kHadamardSize];
    // Forward: (x D) H / 4; inverse: (x H / 4) D (H is symmetric, D its own inverse).
    for (int i = 0; i < kHadamardSize; ++i) v[i] = static_cast<double>(x[chunk + i]) * (inverse ? 1.0 : signs[i]);
    for (int half = 1; half < kHadamardSize; half *= 2)  // Sylvester order: the butterfly pairs i, i + half
      for (int i = 0; i < kHadamardSize; i += 2 * half)
        for (int j = i; j < i + half; ++j) {
          const double a = v[j], b = v[j + half];
          v[j] = a + b;
          v[j + half] = a - b;
        }
    for (int i = 0; i < kHadamardSize; ++i)
      x[chunk + i] = static_cast<float>(v[i] * 0.25 * (inverse ? signs[i] : 1.0f));
  }
}

}  // namespace mpsim
