#include "mpsim/core/stats.hpp"

#include <algorithm>
#include <bit>

namespace mpsim::core {

std::string_view to_string(TensorKind kind) {
  switch (kind) {
    case TensorKind::weights: return "weights";
    case TensorKind::activations: return "activations";
    case TensorKind::activation_grads: return "activation_grads";
    case TensorKind::weight_grads: return "weight_grads";
    case TensorKind::updates: return "updates";
    case TensorKind::gemm_inputs: return "gemm_inputs";
  }
  return "?";
}

std::string_view to_string(Counter counter) {
  switch (counter) {
    case Counter::elements: return "elements";
    case Counter::nonzero: return "nonzero";
    case Counter::flushed: return "flushed";
    case Counter::below_2_24: return "below_2^-24";
    case Counter::subnormal: return "subnormal";
    case Counter::overflow: return "overflow";
    case Counter::nan: return "nan";
    case Counter::infinite: return "infinite";
    case Counter::swallowed: return "swallowed";
    case Counter::inexact: return "inexact";
  }
  return "?";
}

TensorStats& TensorStats::operator+=(const TensorStats& other) {
  for (int i = 0; i < Binades::bin_count; ++i) histogram[i] += other.histogram[i];
  for (int i = 0; i < counter_count; ++i) counters[i] += other.counters[i];
  return *this;
}

TensorStats::Classes TensorStats::add_values(std::span<const float> values) {
  // First pass: count the biased exponent field (the binade of every normal
  // value) in four interleaved tables, so consecutive increments rarely hit
  // the same counter. Fields 0 (zero, subnormal) and 255 (inf, NaN) are
  // resolved by a second pass over only those values.
  // Zeros (common after ReLU) get their own slot 256, so the second pass runs
  // only when there are subnormals, infinities or NaNs.
  std::array<std::array<std::uint32_t, 257>, 4> field{};
  const std::size_t n = values.size();
  const auto key = [&](std::size_t i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(values[i]) & 0x7fffffffu;
    return (bits >> 23) | (static_cast<std::uint32_t>(bits == 0) << 8);
  };
  std::array<std::uint64_t, 257> total{};
  // Blocks of at most 2^32 - 1 values per table keep the 32-bit counters exact.
  for (std::size_t block = 0; block < n; block += std::size_t{1} << 32) {
    const std::size_t end = std::min(n, block + (std::size_t{1} << 32));
    std::size_t i = block;
    for (; i + 4 <= end; i += 4) {
      ++field[0][key(i)];
      ++field[1][key(i + 1)];
      ++field[2][key(i + 2)];
      ++field[3][key(i + 3)];
    }
    for (; i < end; ++i) ++field[0][key(i)];
    for (int e = 0; e < 257; ++e) {
      total[e] += std::uint64_t{field[0][e]} + field[1][e] + field[2][e] + field[3][e];
      field[0][e] = field[1][e] = field[2][e] = field[3][e] = 0;
    }
  }

  std::array<std::uint64_t, Binades::bin_count> local{};
  for (int e = 1; e < 255; ++e) local[Binades::bin_of_exponent(e - 127)] = total[e];
  local[Binades::zero_bin] = total[256];
  if (total[0] != 0 || total[255] != 0) {
    for (const float v : values) {
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
      const std::uint32_t biased = bits >> 23;
      if (biased == 0xff) ++local[(bits & 0x7fffffu) ? Binades::nan_bin : Binades::infinity_bin];
      else if (biased == 0 && bits != 0) ++local[Binades::bin_of_exponent(31 - std::countl_zero(bits) - 149)];
    }
  }
  std::uint64_t below = 0;
  for (int e = Binades::min_exponent; e < -24; ++e) below += local[Binades::bin_of_exponent(e)];
  for (int b = 0; b < Binades::bin_count; ++b) histogram[b] += local[b];
  (*this)[Counter::elements] += n;
  (*this)[Counter::nonzero] += n - local[Binades::zero_bin];
  (*this)[Counter::below_2_24] += below;
  Classes classes;
  for (int e = Binades::min_exponent; e < -126; ++e) classes.subnormal += local[Binades::bin_of_exponent(e)];
  classes.infinite = local[Binades::infinity_bin];
  classes.nan = local[Binades::nan_bin];
  return classes;
}

void TensorStats::add_rounding(const QuantizeCounts& counts) {
  (*this)[Counter::flushed] += counts.flushed_to_zero;
  (*this)[Counter::subnormal] += counts.subnormal;
  (*this)[Counter::overflow] += counts.overflow;
  (*this)[Counter::nan] += counts.nan;
  (*this)[Counter::inexact] += counts.inexact;
}

}  // namespace mpsim::core
