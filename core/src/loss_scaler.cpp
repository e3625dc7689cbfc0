#include "mpsim/core/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

namespace mpsim::core {

LossScaler::LossScaler(const LossScaling& config) : config_(config) {
  scale_ = config.mode == LossScaleMode::none ? 1.0 : config.initial_scale;
  hysteresis_tracker_ = config.hysteresis;
}

bool LossScaler::update(bool found_inf) {
  switch (config_.mode) {
    case LossScaleMode::none: return false;  // nothing to skip with: the trainer stops the arm
    case LossScaleMode::fixed: return found_inf;
    case LossScaleMode::dynamic: break;
  }
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) {
      scale_ *= config_.backoff_factor;
      if (config_.min_scale > 0.0) scale_ = std::max(scale_, config_.min_scale);
    }
    return true;
  }
  if (++growth_tracker_ == config_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = config_.hysteresis;
    const double grown = scale_ * config_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // GradScaler keeps the scale when growth overflows
    if (config_.max_scale > 0.0) scale_ = std::min(scale_, config_.max_scale);
  }
  return false;
}

}  // namespace mpsim::core
