#pragma once
// What every layer file shares: the rounding of a GEMM operand.

#include "mpsim/core/model.hpp"

namespace mpsim::core::detail {

// A GEMM operand: a copy of x rounded at `point` (policy.activations or
// policy.gradient_operands), or x itself when that rounding would change no
// value: at the identity, or when x already passed `earlier` (the same
// format, unscaled). Such operands are not counted as gemm_inputs either:
// their values were counted where they were made.
inline Tensor operand(StepContext& ctx, const Tensor& x, const RoundingPoint& point,
                      const std::optional<RoundingPoint>& earlier, Site site) {
  if (point.is_identity() || (earlier && point.keeps_values_of(*earlier))) return x;
  Tensor q = ctx.backend.empty(x.shape());
  ctx.backend.copy(x, q);
  ctx.round(q, point, TensorKind::gemm_inputs, site);
  return q;
}
// The same for values that enter the current layer (ctx.incoming says what they passed).
inline Tensor operand(StepContext& ctx, const Tensor& x, const RoundingPoint& point, Site site) {
  return operand(ctx, x, point, ctx.incoming, site);
}

}  // namespace mpsim::core::detail
