#pragma once
// A Backend that passes every call to another one: tests derive from it and
// override the calls they want to watch (what the trainer asks of a backend,
// with which streams and histories), leaving the arithmetic to the inner one.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "mpsim/core/backend.hpp"
#include "support/backend_internals.hpp"

namespace mpsim::test {
namespace forwarding {
// MPSIM_BACKEND_IMPLEMENTATIONS names core's types unqualified.
using namespace core;

class ForwardingBackend : public core::Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<core::Backend> inner) : inner_(std::move(inner)) {}
  core::Backend& inner() { return *inner_; }

  std::string_view name() const override { return inner_->name(); }
  core::Device device() const override { return inner_->device(); }
  bool supports(core::Op op) const override { return inner_->supports(op); }
  bool supports_pointwise(std::size_t entry) const override { return inner_->supports_pointwise(entry); }
  bool supports_row(std::size_t entry) const override { return inner_->supports_row(entry); }
  std::string block_gemm_refusal(const core::BlockPoint& a, const core::BlockPoint& b,
                                 const std::optional<TensorCoreModel>& promotion,
                                 int promotion_interval) const override {
    return inner_->block_gemm_refusal(a, b, promotion, promotion_interval);
  }
  std::string optimizer_refusal(const core::OptimizerParams& params) const override {
    return inner_->optimizer_refusal(params);
  }
  void set_threads(int threads) override { inner_->set_threads(threads); }
  void set_cpu_gemm(core::CpuGemm gemm) override { inner_->set_cpu_gemm(gemm); }
  void set_device_attention(core::DeviceAttention attention) override { inner_->set_device_attention(attention); }
  std::string describe_gemm(core::CpuGemm gemm, core::DeviceAttention attention) const override {
    return inner_->describe_gemm(gemm, attention);
  }
  // Every *_impl calls the inner backend's public call of the same name.
#define MPSIM_FORWARD_IMPLEMENTATION(result, op, parameters, arguments) \
  result op##_impl parameters override { return inner_->op arguments; }
  MPSIM_BACKEND_IMPLEMENTATIONS(MPSIM_FORWARD_IMPLEMENTATION)
#undef MPSIM_FORWARD_IMPLEMENTATION

  // The optimiser's internals, which are not public calls.
  void sgd_update(const core::Tensor& weight, const core::Tensor& grad, core::Tensor& momentum, float lr,
                  float momentum_factor, float weight_decay, bool first_step, core::Tensor& update) override {
    core::BackendInternals::sgd_update(*inner_, weight, grad, momentum, lr, momentum_factor, weight_decay, first_step,
                                       update);
  }
  void adam_update(const core::Tensor& weight, const core::Tensor& grad, core::Tensor& m, core::Tensor& v,
                   const core::AdamParams& p, core::Tensor& update) override {
    core::BackendInternals::adam_update(*inner_, weight, grad, m, v, p, update);
  }
  void apply_update(core::Tensor& weight, const core::Tensor& update, const core::RoundingPoint& storage,
                    StochasticStream stream, core::TensorStats* stats) override {
    core::BackendInternals::apply_update(*inner_, weight, update, storage, stream, stats);
  }

 private:
  std::unique_ptr<core::Backend> inner_;
};

}  // namespace forwarding
using forwarding::ForwardingBackend;

}  // namespace mpsim::test
