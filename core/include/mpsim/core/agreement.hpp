#pragma once
// How closely two arms of the same policy, seed, initial weights and batches
// agree when they ran on different backends (the CPU emulator and the GPU):
// issue #4's side-by-side comparison, printed in the summary and kept in the
// HDF5 file (docs/hdf5-schema.md, /agreement).

#include <string>
#include <vector>

#include "mpsim/core/run_log.hpp"

namespace mpsim::core {

// What the comparison reads from one finished arm.
struct ArmTrace {
  std::string name;
  std::vector<std::string> layers;  // layer names, in order
  std::vector<double> losses;       // per step
  double test_accuracy = 0.0;
  LayerStats totals;           // statistics summed over the instrumented steps
};

struct Agreement {
  std::string reference, other;  // arm names
  std::vector<std::string> layers;
  // max over steps of |loss_other - loss_ref| / |loss_ref| (0/0 counts as 0;
  // a step one arm has and the other has not, or a NaN in one only, is +inf).
  double max_loss_relative_difference = 0.0;
  double test_accuracy_difference = 0.0;  // other - reference
  // Per layer and TensorKind: total-variation distance between the two
  // normalised binade histograms (0: identical shapes, 1: disjoint; NaN when
  // either side counted no value).
  std::vector<std::array<double, tensor_kind_count>> histogram_distance;

  // The largest distance of one kind over the layers (NaN when none is defined).
  double largest_histogram_distance(TensorKind kind) const;
};

Agreement compare_arms(const ArmTrace& reference, const ArmTrace& other);

}  // namespace mpsim::core
