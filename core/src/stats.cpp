#include "mpsim/core/stats.hpp"

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

void TensorStats::add_values(std::span<const float> values) {
  // The binade of a binary32 value comes from its exponent field; a
  // subnormal's from the position of its leading significand bit.
  std::array<std::uint64_t, Binades::bin_count> local{};
  for (const float v : values) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
    const std::uint32_t biased = bits >> 23;
    int bin;
    if (biased == 0xff) {
      bin = (bits & 0x7fffffu) ? Binades::nan_bin : Binades::infinity_bin;
    } else if (biased != 0) {
      bin = Binades::bin_of_exponent(static_cast<int>(biased) - 127);
    } else if (bits == 0) {
      bin = Binades::zero_bin;
    } else {
      bin = Binades::bin_of_exponent(31 - std::countl_zero(bits) - 149);  // value = bits * 2^-149
    }
    ++local[bin];
  }
  std::uint64_t below = 0;
  for (int e = Binades::min_exponent; e < -24; ++e) below += local[Binades::bin_of_exponent(e)];
  for (int i = 0; i < Binades::bin_count; ++i) histogram[i] += local[i];
  (*this)[Counter::elements] += values.size();
  (*this)[Counter::nonzero] += values.size() - local[Binades::zero_bin];
  (*this)[Counter::below_2_24] += below;
}

void TensorStats::add_rounding(const QuantizeCounts& counts) {
  (*this)[Counter::flushed] += counts.flushed_to_zero;
  (*this)[Counter::subnormal] += counts.subnormal;
  (*this)[Counter::overflow] += counts.overflow;
  (*this)[Counter::nan] += counts.nan;
  (*this)[Counter::inexact] += counts.inexact;
}

}  // namespace mpsim::core
