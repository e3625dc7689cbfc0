#include "mpsim/core/agreement.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mpsim::core {
namespace {

constexpr double infinity = std::numeric_limits<double>::infinity();
constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();

double relative_difference(double reference, double other) {
  if (std::isnan(reference) != std::isnan(other)) return infinity;
  if (std::isnan(reference) || reference == other) return 0.0;  // both NaN, or equal (infinities too)
  return std::abs(other - reference) / std::abs(reference);    // inf when reference is 0
}

// Half the L1 distance of the two histograms, each divided by its total.
double total_variation(const Histogram& a, const Histogram& b) {
  double total_a = 0.0, total_b = 0.0;
  for (int i = 0; i < Binades::bin_count; ++i) total_a += static_cast<double>(a[i]), total_b += static_cast<double>(b[i]);
  if (total_a == 0.0 || total_b == 0.0) return not_a_number;
  double sum = 0.0;
  for (int i = 0; i < Binades::bin_count; ++i)
    sum += std::abs(static_cast<double>(a[i]) / total_a - static_cast<double>(b[i]) / total_b);
  return sum / 2.0;
}

}  // namespace

double Agreement::largest_histogram_distance(TensorKind kind) const {
  double largest = not_a_number;
  for (const auto& layer : histogram_distance) {
    const double d = layer[static_cast<int>(kind)];
    if (!std::isnan(d) && !(largest >= d)) largest = d;
  }
  return largest;
}

Agreement compare_arms(const ArmTrace& reference, const ArmTrace& other) {
  Agreement a;
  a.reference = reference.name;
  a.other = other.name;
  a.layers = reference.layers.size() >= other.layers.size() ? reference.layers : other.layers;
  const std::size_t steps = std::max(reference.losses.size(), other.losses.size());
  for (std::size_t s = 0; s < steps; ++s) {
    const double d = s < reference.losses.size() && s < other.losses.size()
                         ? relative_difference(reference.losses[s], other.losses[s])
                         : infinity;
    a.max_loss_relative_difference = std::max(a.max_loss_relative_difference, d);
  }
  a.test_accuracy_difference = other.test_accuracy - reference.test_accuracy;
  const std::size_t layers = std::max({reference.totals.size(), other.totals.size(), a.layers.size()});
  a.histogram_distance.resize(layers);
  a.layers.resize(layers);
  for (std::size_t l = 0; l < layers; ++l)
    for (int k = 0; k < tensor_kind_count; ++k)
      a.histogram_distance[l][k] = l < reference.totals.size() && l < other.totals.size()
                                       ? total_variation(reference.totals[l][k].histogram, other.totals[l][k].histogram)
                                       : not_a_number;
  return a;
}

}  // namespace mpsim::core
