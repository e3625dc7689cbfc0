#pragma once
// The training loop, written once: one arm = one backend, one policy, one
// seed. Arms with the same seed start from the same weights and see the same
// batches, whatever their backend or policy.

#include <cstdint>
#include <functional>
#include <string>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/data.hpp"
#include "mpsim/core/model.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/run_log.hpp"

namespace mpsim::core {

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.05;
  double momentum = 0.9;  // sgd
  double weight_decay = 0.0;
  // Whether weight_decay applies to the parameters of one dimension (biases,
  // LayerNorm's gains and biases) too; false decays matrices and tables only
  // (GPT-2's and nanoGPT's convention).
  bool decay_vectors = true;
  double clip_norm = 0.0;  // > 0: clip the unscaled gradients' global L2 norm to this (clip_grad_norm_)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
};

enum class ScheduleKind : std::uint8_t { constant, step, cosine };
inline constexpr EnumNames<ScheduleKind, 3> schedule_kind_names{{"constant", "step", "cosine"}};
inline std::string_view to_string(ScheduleKind kind) { return schedule_kind_names(kind); }

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::constant;
  std::int64_t step_size = 1000;  // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  double min_lr = 0.0;  // cosine: the rate at the last step
  // > 0: the rate rises linearly to lr over the first `warmup` steps
  // (lr (step + 1) / warmup), and the schedule runs over the steps after them.
  std::int64_t warmup = 0;
};

// One step's optimiser settings at learning rate lr (weight decay for every parameter).
OptimizerParams optimizer_params(const OptimizerSpec& optimizer, float lr);
double learning_rate(const OptimizerSpec& optimizer, const ScheduleSpec& schedule, std::int64_t step,
                     std::int64_t total_steps);

struct TrainSpec {
  std::int64_t epochs = 1;
  std::int64_t max_steps = 0;       // > 0: stop after this many steps
  std::int64_t batch_size = 128;
  std::int64_t eval_interval = 0;   // steps between evaluations; 0: at the end of every epoch
  std::int64_t eval_batch = 1000;
  std::int64_t stats_interval = 1;  // steps between instrumented steps; 0: never
  // Also count attention's logits and probabilities (TensorKind::attention_logits, attention_probs) at the
  // instrumented steps: two more passes over batch x heads x tokens^2 values per layer, off by default.
  bool attention_stats = false;
  // > 0: every this many steps, the FP32 shadow pass (run_log.hpp's ShadowRecord); 0: never
  std::int64_t shadow_interval = 0;
  int threads = 1;
  CpuGemm gemm = CpuGemm::ordered;  // the CPU backend's binary32 GEMM (backend.hpp)
  DeviceAttention attention = DeviceAttention::kernels;  // the CUDA backend's attention products (backend.hpp)
  LossDefinition loss;  // config [loss]: reduction and weight (numerics.hpp)
};

struct ArmResult {
  std::string status = "completed";  // or "stopped: <reason>"
  std::int64_t steps = 0, skipped_steps = 0;
  double final_loss_scale = 1.0;
  double train_loss = 0.0, test_loss = 0.0, test_accuracy = 0.0;
  // Over all instrumented steps: flushed / nonzero, and below 2^-24 / nonzero.
  double activation_grad_flushed = 0.0, activation_grad_below_2_24 = 0.0;
  double weight_grad_flushed = 0.0, weight_grad_below_2_24 = 0.0;
  double swallowed_updates = 0.0;  // swallowed / nonzero updates
  double wall_seconds = 0.0;
  std::vector<double> losses;       // per step (for tests and golden trajectories)
  std::vector<double> loss_scales;  // per step, the scale used
  LayerStats stat_totals;           // per layer and kind, summed over the instrumented steps
};

struct Progress {
  std::int64_t step, total_steps;
  double loss, loss_scale, test_accuracy;  // test_accuracy: last evaluation, NaN before the first
};

struct ArmSetup {
  const Policy* policy = nullptr;
  ModelSpec model;
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  TrainSpec train;
  std::uint64_t seed = 0;
  // Called after every backward pass, before unscaling and the optimiser:
  // the parameters hold this step's (loss-scaled) gradients in `grad`.
  std::function<void(std::int64_t step, const std::vector<Parameter*>& parameters, Backend& backend)>
      inspect_gradients;
};

// Trains one arm. Writes every step, instrumented step and evaluation to log
// (when not null) and calls progress after every step.
ArmResult train_arm(Backend& backend, const ArmSetup& setup, const TrainTest& data, ArmLog* log,
                    const std::function<void(const Progress&)>& progress = {});

}  // namespace mpsim::core
