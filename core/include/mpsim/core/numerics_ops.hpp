#pragma once
// The element-wise ops of a training step, one table: each entry is a struct
// with its name, its parameters, what its backward pass reads besides dy,
// and forward(x, p, i) and backward(saved, dy, p, i), host/device functions
// of element i. The backends run any entry with one CPU loop and one
// templated CUDA kernel, Backend::pointwise_forward/backward take an entry
// and its parameters as one value (PointwiseCall), and PointwiseLayer
// (model.hpp's make_pointwise) is a layer of any entry. So an element-wise
// layer is a struct here, its place in the table (pointwise_table below) and
// its place in the model (layer_table.hpp): no backend call, kernel or layer
// class to write.
//
// The activations of numerics_layers.hpp are the first entries, in their
// enum's order, so an Activation is also an entry's index.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "mpsim/core/numerics_attention.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/emulation/host_device.hpp"

namespace mpsim::core {

// What an entry's backward pass reads besides dy: the forward's input, its
// output, or nothing (dropout recomputes its mask from the element index).
enum class Saves : std::uint8_t { input, output, nothing };

// An activation of the table as an entry.
template <typename A>
struct ActivationOp {
  struct Params {
    friend constexpr bool operator==(const Params&, const Params&) = default;
  };
  static constexpr std::string_view name = A::name;
  static constexpr Saves saves = Saves::input;
  static constexpr bool fp32_op = A::fp32_op;
  static constexpr bool selects_gradient = A::selects_gradient;
  MPSIM_HOST_DEVICE static float forward(float x, const Params&, std::int64_t) { return A::forward(x); }
  MPSIM_HOST_DEVICE static float backward(float x, float dy, const Params&, std::int64_t) {
    return A::backward(x, dy);
  }
};

// Logit soft-capping (numerics_attention.hpp's soft_cap): y = cap tanh(x / cap),
// dx from the capped y.
struct SoftCapOp {
  struct Params {
    float cap = 0.0f;
    bool keep_mask = false;  // -inf (a causal mask) stays -inf
  };
  static constexpr std::string_view name = "soft_cap";
  static constexpr Saves saves = Saves::output;
  MPSIM_HOST_DEVICE static float forward(float x, const Params& p, std::int64_t) {
    return soft_cap(x, p.cap, p.keep_mask);
  }
  MPSIM_HOST_DEVICE static float backward(float y, float dy, const Params& p, std::int64_t) {
    return soft_cap_grad(y, dy, p.cap);
  }
  // Why these parameters cannot run (empty when they can): the backend's check.
  static std::string refusal(const Params& p) {
    return p.cap > 0.0f && p.cap < INFINITY ? std::string()
                                            : "the cap must be finite and > 0 (got " + std::to_string(p.cap) + ")";
  }
};

// Dropout with a counter-based mask (numerics_layers.hpp's dropout_value): the
// backward applies element i's mask to dy.
struct DropoutOp {
  using Params = DropoutMask;
  static constexpr std::string_view name = "dropout";
  static constexpr Saves saves = Saves::nothing;
  MPSIM_HOST_DEVICE static float forward(float x, const Params& m, std::int64_t i) { return dropout_value(x, m, i); }
  MPSIM_HOST_DEVICE static float backward(float, float dy, const Params& m, std::int64_t i) {
    return dropout_value(dy, m, i);
  }
};

// An entry's optional flags, false where it does not say: whether a policy's
// fp32_ops may exempt its output from rounding (autocast's FP32 list), and
// whether its backward only selects values of dy (dy or 0: ReLU), so that it
// makes no new gradient values: where dy already passed the policy's
// activation_grads point, the layer neither rounds nor counts them again
// (layers.cpp, issue 21: each tensor counted once).
template <typename P>
constexpr bool entry_fp32_op() {
  if constexpr (requires { P::fp32_op; }) return P::fp32_op;
  return false;
}
template <typename P>
constexpr bool entry_selects_gradient() {
  if constexpr (requires { P::selects_gradient; }) return P::selects_gradient;
  return false;
}

// A constant factor, y = x s and dx = dy s in binary32: Gemma's scaling of
// the embedded tokens by sqrt(width) (Gemma Team 2024; its reference code
// multiplies by the factor rounded to the activations' format).
struct MultiplyOp {
  struct Params {
    float factor = 1.0f;
  };
  static constexpr std::string_view name = "multiply";
  static constexpr Saves saves = Saves::nothing;
  MPSIM_HOST_DEVICE static float forward(float x, const Params& p, std::int64_t) { return x * p.factor; }
  MPSIM_HOST_DEVICE static float backward(float, float dy, const Params& p, std::int64_t) { return dy * p.factor; }
  static std::string refusal(const Params& p) {
    return p.factor > 0.0f && p.factor < INFINITY
               ? std::string()
               : "the factor must be finite and > 0 (got " + std::to_string(p.factor) + ")";
  }
};

// Calls f(E{}, params) with the entry E of `Entries` (a std::tuple) that
// `call` holds, a std::variant of the entries' parameters in the same order
// (host code: a backend picks its loop or kernel). Both op tables visit so.
template <typename Entries, typename Call, typename F>
void visit_entry(const Call& call, F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (void)((call.index() == I ? (f(std::tuple_element_t<I, Entries>{}, *std::get_if<I>(&call)), true) : false) || ...);
  }(std::make_index_sequence<std::tuple_size_v<Entries>>{});
}

// The table. Call holds which entry (its index) and that entry's parameters.
template <typename... P>
struct PointwiseTable {
  static constexpr std::size_t size = sizeof...(P);
  using Entries = std::tuple<P...>;
  using Call = std::variant<typename P::Params...>;
  static constexpr std::array<std::string_view, size> names{P::name...};
  static constexpr std::array<Saves, size> saves{P::saves...};
  static constexpr std::array<bool, size> fp32_op{entry_fp32_op<P>()...};
  static constexpr std::array<bool, size> selects_gradient{entry_selects_gradient<P>()...};
  static_assert((std::is_trivially_copyable_v<typename P::Params> && ...), "parameters travel by value into a kernel");

  template <typename F>
  static void visit(const Call& call, F&& f) {
    visit_entry<Entries>(call, std::forward<F>(f));
  }
  // Why the call's parameters cannot run, from the entry's `refusal` where it has one.
  static std::string refusal(const Call& call) {
    std::string why;
    visit(call, [&]<typename E>(E, const typename E::Params& p) {
      if constexpr (requires { E::refusal(p); }) why = E::refusal(p);
    });
    return why;
  }
};

// The table: every activation of `Activations`, in its order (so that an
// Activation is its entry's index), then the other ops. A new op is a struct
// above and its place in this list.
template <typename... A>
PointwiseTable<ActivationOp<A>..., SoftCapOp, DropoutOp, MultiplyOp> pointwise_table(ActivationTable<A...>);
using Pointwises = decltype(pointwise_table(Activations{}));
using PointwiseCall = Pointwises::Call;
static_assert(Pointwises::names[static_cast<std::size_t>(Activation::gelu)] == Gelu::name,
              "the activations are the first entries, in their enum's order");

inline Saves pointwise_saves(const PointwiseCall& call) { return Pointwises::saves[call.index()]; }

// The entry of an activation, and of the other ops with their parameters.
inline PointwiseCall activation_call(Activation kind) {
  PointwiseCall call;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (void)((static_cast<std::size_t>(kind) == I ? (call.emplace<I>(), true) : false) || ...);
  }(std::make_index_sequence<Activations::size>{});
  return call;
}
inline PointwiseCall soft_cap_call(float cap, bool keep_mask) { return SoftCapOp::Params{cap, keep_mask}; }
inline PointwiseCall dropout_call(const DropoutMask& mask) { return mask; }

}  // namespace mpsim::core
