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
  // Two passes per chunk: a vectorisable one extracts the biased exponent
  // bytes and counts subnormals; a scalar one increments eight interleaved
  // tables (so repeated keys rarely wait on each other). Field 0 holds zeros
  // and subnormals: zeros = field 0 - subnormals. A final pass over the data
  // resolves subnormal binades, infinities and NaNs, only when there are any.
  constexpr std::size_t chunk = 2048;
  constexpr int tables = 8;
  std::array<std::array<std::uint32_t, 256>, tables> field{};
  std::array<std::uint8_t, chunk> keys;
  const std::size_t n = values.size();
  std::array<std::uint64_t, 256> total{};
  std::uint64_t subnormals = 0;
  std::size_t since_flush = 0;
  for (std::size_t start = 0; start < n; start += chunk) {
    const std::size_t m = std::min(chunk, n - start);
    const float* v = values.data() + start;
    std::uint32_t chunk_subnormals = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(v[i]) & 0x7fffffffu;
      keys[i] = static_cast<std::uint8_t>(bits >> 23);
      chunk_subnormals += static_cast<std::uint32_t>(bits - 1u < 0x7fffffu);  // 0 < bits < 2^23
    }
    subnormals += chunk_subnormals;
    std::size_t i = 0;
    for (; i + tables <= m; i += tables)
      for (int t = 0; t < tables; ++t) ++field[t][keys[i + t]];
    for (; i < m; ++i) ++field[0][keys[i]];
    since_flush += m;
    if (since_flush > (std::size_t{1} << 31) || start + m == n) {  // 32-bit counters stay exact
      for (int e = 0; e < 256; ++e) {
        for (int t = 0; t < tables; ++t) total[e] += field[t][e], field[t][e] = 0;
      }
      since_flush = 0;
    }
  }
  std::array<std::uint64_t, 257> slots{};
  for (int e = 1; e < 256; ++e) slots[e] = total[e];
  slots[256] = total[0] - subnormals;  // zeros
  total[0] = subnormals;

  std::array<std::uint64_t, Binades::bin_count> local{};
  for (int e = 1; e < 255; ++e) local[Binades::bin_of_exponent(e - 127)] = slots[e];
  local[Binades::zero_bin] = slots[256];
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
