#pragma once
// The optimiser's internals of a backend (Backend's protected sgd_update,
// adam_update and apply_update), reached by name so that tests can compare
// two backends op by op. Not part of the public backend surface: the
// training loop only calls Backend::optimizer_step.

#include "mpsim/core/backend.hpp"

namespace mpsim::core {

class BackendInternals {
 public:
  static void sgd_update(Backend& b, const Tensor& weight, const Tensor& grad, Tensor& momentum, float lr,
                         float momentum_factor, float weight_decay, bool first_step, Tensor& update) {
    b.sgd_update(weight, grad, momentum, lr, momentum_factor, weight_decay, first_step, update);
  }
  static void adam_update(Backend& b, const Tensor& weight, const Tensor& grad, Tensor& m, Tensor& v,
                          const AdamParams& p, Tensor& update) {
    b.adam_update(weight, grad, m, v, p, update);
  }
  static void apply_update(Backend& b, Tensor& weight, const Tensor& update, const RoundingPoint& storage,
                           StochasticStream stream, TensorStats* stats) {
    b.apply_update(weight, update, storage, stream, stats);
  }
};

}  // namespace mpsim::core
