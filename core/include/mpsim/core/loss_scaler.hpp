#pragma once
// Loss scaling (Micikevicius et al. 2018, section 3.2) on the host: the rule
// of numerics.hpp (GradScaler; Megatron-LM's hysteresis and min/max) with
// its state. Backends run the same rule where they keep the scale.

#include "mpsim/core/numerics.hpp"

namespace mpsim::core {

class LossScaler {
 public:
  explicit LossScaler(const LossScaling& config) : config_(config), state_(initial_loss_scale(config)) {}
  // The factor the loss gradient is multiplied by this step (1 without scaling).
  double scale() const { return state_.scale; }
  // See update_loss_scale.
  bool update(bool found_inf) { return update_loss_scale(state_, config_, found_inf); }
  int growth_tracker() const { return state_.growth_tracker; }
  int hysteresis_tracker() const { return state_.hysteresis_tracker; }
  const LossScaleState& state() const { return state_; }

 private:
  LossScaling config_;
  LossScaleState state_;
};

}  // namespace mpsim::core
