#pragma once
// Loss scaling (Micikevicius et al. 2018, section 3.2). Dynamic scaling
// follows PyTorch's GradScaler; hysteresis and min/max follow Megatron-LM's
// DynamicGradScaler, which is GradScaler when hysteresis = 1.

#include "mpsim/core/policy.hpp"

namespace mpsim::core {

class LossScaler {
 public:
  explicit LossScaler(const LossScaling& config);
  // The factor the loss gradient is multiplied by this step (1 without scaling).
  double scale() const { return scale_; }
  // Called once per step after the gradients are known. Returns true when the
  // optimiser step must be skipped (some gradient is inf or NaN and a scaler
  // is active); adjusts the scale for the next step.
  bool update(bool found_inf);
  int growth_tracker() const { return growth_tracker_; }
  int hysteresis_tracker() const { return hysteresis_tracker_; }

 private:
  LossScaling config_;
  double scale_ = 1.0;
  int growth_tracker_ = 0;
  int hysteresis_tracker_ = 1;
};

}  // namespace mpsim::core
