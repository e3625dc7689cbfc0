#include "mpsim/core/trainer.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <stdexcept>
#include <utility>

#include "mpsim/core/loss_scaler.hpp"

namespace mpsim::core {

OptimizerParams optimizer_params(const OptimizerSpec& o, float lr) {
  OptimizerParams params;
  params.kind = o.kind;
  params.lr = lr;
  params.momentum = static_cast<float>(o.momentum);
  params.weight_decay = static_cast<float>(o.weight_decay);
  params.beta1 = static_cast<float>(o.beta1);
  params.beta2 = static_cast<float>(o.beta2);
  params.eps = static_cast<float>(o.eps);
  params.clip_norm = static_cast<float>(o.clip_norm);
  return params;
}

double learning_rate(const OptimizerSpec& o, const ScheduleSpec& s, std::int64_t step, std::int64_t total) {
  if (s.warmup > 0) {
    if (step < s.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup);
    step -= s.warmup;
    total -= s.warmup;
  }
  switch (s.kind) {
    case ScheduleKind::constant: return o.lr;
    case ScheduleKind::step:
      return o.lr * std::pow(s.gamma, static_cast<double>(step / std::max<std::int64_t>(1, s.step_size)));
    case ScheduleKind::cosine: {
      const double t = total > 1 ? static_cast<double>(step) / static_cast<double>(total - 1) : 0.0;
      return s.min_lr + (o.lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
    }
  }
  throw std::invalid_argument("unknown schedule; expected " + schedule_kind_names.list());
}

namespace {

struct LayerParameter {
  int layer;
  Parameter* parameter;
  std::size_t index;  // within its layer: keys its sites (parameter_site)
  Tensor update;  // the optimiser's update, reused every step
};

class Arm {
 public:
  Arm(Backend& backend, const ArmSetup& setup, const TrainTest& data)
      : backend_(backend),
        setup_(setup),
        policy_(*setup.policy),
        data_(data),
        model_(setup.model, InputShape{data.train.channels, data.train.height, data.train.width, data.train.classes},
               setup.seed),
        ctx_(backend, policy_, setup.seed),
        scaler_(policy_.loss_scaling) {
    backend_.set_threads(setup.train.threads);
    backend_.set_cpu_gemm(setup.train.gemm);
    auto& layers = model_.layers();
    // The head: the last layer with parameters (a soft cap after it has none).
    ctx_.output_layer = static_cast<int>(layers.size()) - 1;
    while (ctx_.output_layer > 0 && layers[static_cast<std::size_t>(ctx_.output_layer)]->parameters().empty())
      --ctx_.output_layer;
    bool earlier_has_parameters = false;
    for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
      needs_input_grad_.push_back(earlier_has_parameters);
      auto params = layers[i]->parameters();
      for (std::size_t j = 0; j < params.size(); ++j)
        parameters_.push_back({i, params[j], j, Tensor()});
      earlier_has_parameters = earlier_has_parameters || !params.empty();
    }
    // The last high_precision_last layers with parameters ignore the block points.
    for (int i = static_cast<int>(layers.size()) - 1, kept = 0; i >= 0 && kept < policy_.high_precision_last; --i)
      if (!layers[i]->parameters().empty()) {
        ctx_.block_points_end = i;
        ++kept;
      }
    storage_ = policy_.master_weights ? RoundingPoint{} : policy_.weight_storage;
    shares_working_ = policy_.master_weights ? policy_.weights.is_identity() : policy_.weights == storage_;
    for (auto& lp : parameters_) {
      Parameter& p = *lp.parameter;
      p.master = backend_.from_host(p.initial, p.shape);
      if (!policy_.master_weights) {
        ctx_.layer = lp.layer;
        // The weights exist only in storage format.
        ctx_.round(p.master, storage_, TensorKind::weights, parameter_site(lp.index, ParameterRole::storage));
      }
      p.working = shares_working_ ? p.master : backend_.empty(p.shape);
      p.grad = backend_.zeros(p.shape);
      p.state1 = backend_.zeros(p.shape);
      if (setup_.optimizer.kind != OptimizerKind::sgd) p.state2 = backend_.zeros(p.shape);
      lp.update = backend_.empty(p.shape);
    }
  }

  ArmResult run(ArmLog* log, const std::function<void(const Progress&)>& progress) {
    const auto start = std::chrono::steady_clock::now();
    const TrainSpec& t = setup_.train;
    Batcher batcher(data_.train, t.batch_size, setup_.seed);
    const std::int64_t per_epoch = batcher.batches_per_epoch();
    if (per_epoch == 0) throw std::invalid_argument("batch_size is larger than the training set");
    std::int64_t total = t.epochs * per_epoch;
    if (t.max_steps > 0) total = std::min(total, t.max_steps);
    const auto layer_count = model_.layers().size() + 1;  // + loss
    backend_.start_steps(policy_.loss_scaling, t.loss,
                         internal_rounding(policy_, &Policy::loss_internals, "softmax_cross_entropy"));

    ArmResult result;
    std::vector<float> images, labels;
    LayerStats stats;
    LayerBlockStats block_stats;
    std::vector<double> logit_max;
    const bool blocks = uses_block_formats(policy_);
    const auto log_stats = [&](std::int64_t step) {
      log->stats(step, stats, logit_max);
      if (blocks) log->block_stats(step, block_stats);
    };
    Progress shown{0, total, std::numeric_limits<double>::quiet_NaN(), scaler_.scale(),
                   std::numeric_limits<double>::quiet_NaN()};

    for (std::int64_t step = 0; step < total; ++step) {
      const std::int64_t epoch = step / per_epoch, batch = step % per_epoch;
      batcher.gather(batcher.batch_indices(epoch, batch), images, labels);
      const bool instrument = t.stats_interval > 0 && step % t.stats_interval == 0;
      if (instrument) stats.assign(layer_count, {});
      if (instrument) logit_max.assign(layer_count, std::numeric_limits<double>::quiet_NaN());
      ctx_.stats = instrument ? &stats : nullptr;
      ctx_.logit_max = instrument ? &logit_max : nullptr;
      if (instrument && blocks) block_stats.assign(layer_count, {});
      ctx_.block_stats = instrument && blocks ? &block_stats : nullptr;
      ctx_.step = step;
      ctx_.training = true;

      // The step runs without waiting for the backend: the loss, the
      // inf/NaN check, the loss scale and the decision to skip stay there
      // (Backend's step ops) until the trainer reads them below.
      forward_backward(images, labels);
      if (setup_.inspect_gradients) setup_.inspect_gradients(step, model_.parameters(), backend_);
      for (auto& lp : parameters_) backend_.step_check_gradient(lp.parameter->grad);
      backend_.end_step();
      const double lr = learning_rate(setup_.optimizer, setup_.schedule, step, total);
      optimizer_step(static_cast<float>(lr));
      pending_.push_back({step, lr, static_cast<std::int64_t>(labels.size())});

      const bool end_of_epoch = batch == per_epoch - 1 || step == total - 1;
      const bool eval_now = t.eval_interval > 0 ? ((step + 1) % t.eval_interval == 0 || step == total - 1)
                                                : end_of_epoch;
      // Read the steps only when logging: instrumented steps, evaluations,
      // the last step, and often enough to bound what the backend holds.
      if (instrument || eval_now || step == total - 1 || pending_.size() >= max_pending_steps) {
        if (const auto stopped = read_steps(result, log)) {  // the arm ends at a step read now
          if (*stopped == step && instrument && log) log_stats(step);
          break;
        }
        shown.loss = result.losses.back();
        shown.loss_scale = result.loss_scales.back();
      }
      if (instrument) {
        if (log) log_stats(step);
        result.stat_totals.resize(stats.size());
        for (std::size_t l = 0; l < stats.size(); ++l)
          for (int k = 0; k < tensor_kind_count; ++k) result.stat_totals[l][k] += stats[l][k];
      }
      if (eval_now) {
        const auto [test_loss, test_accuracy] = evaluate(data_.test);
        EvalRecord e;
        e.step = step + 1;
        e.epoch = static_cast<double>(step + 1) / static_cast<double>(per_epoch);
        e.train_loss = epoch_loss_ / static_cast<double>(epoch_batches_);
        e.test_loss = test_loss;
        e.test_accuracy = test_accuracy;
        e.train_accuracy = train_correct_ / static_cast<double>(std::max<std::int64_t>(1, train_seen_));
        if (log) log->eval(e);
        result.train_loss = e.train_loss;
        result.test_loss = test_loss;
        result.test_accuracy = shown.test_accuracy = test_accuracy;
        if (end_of_epoch) epoch_loss_ = 0.0, epoch_batches_ = 0, train_correct_ = 0, train_seen_ = 0;
      }
      shown.step = step + 1;
      if (progress) progress(shown);
    }
    result.final_loss_scale = scaler_.scale();
    const auto rate = [](const TensorStats& s, Counter c) {
      return s[Counter::nonzero] ? static_cast<double>(s[c]) / static_cast<double>(s[Counter::nonzero]) : 0.0;
    };
    TensorStats act_grads, weight_grads, updates;
    for (const auto& layer : result.stat_totals) {
      act_grads += layer[static_cast<int>(TensorKind::activation_grads)];
      weight_grads += layer[static_cast<int>(TensorKind::weight_grads)];
      updates += layer[static_cast<int>(TensorKind::updates)];
    }
    result.activation_grad_flushed = rate(act_grads, Counter::rounded_to_zero);
    result.activation_grad_below_2_24 = rate(act_grads, Counter::below_2_24);
    result.weight_grad_flushed = rate(weight_grads, Counter::rounded_to_zero);
    result.weight_grad_below_2_24 = rate(weight_grads, Counter::below_2_24);
    result.swallowed_updates = rate(updates, Counter::swallowed);
    result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (log) log->finish(result.status);
    return result;
  }

 private:
  // The forward pass of a batch of samples; returns the logits.
  Tensor forward(const std::vector<float>& images, const Dataset& shape) {
    auto& layers = model_.layers();
    const auto n = static_cast<std::int64_t>(images.size()) / shape.sample_size();
    Tensor h = backend_.from_host(images, {n, shape.channels, shape.height, shape.width});
    std::optional<RoundingPoint> incoming;  // the images: binary32, not rounded
    for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
      ctx_.layer = i;
      ctx_.incoming = incoming;
      h = layers[i]->forward(ctx_, h);
      incoming = layers[i]->output_rounding(policy_, incoming);
    }
    ctx_.incoming.reset();
    return h;
  }

  // Rounds the working copies, runs forward and backward; the loss stays
  // with the backend (Backend::step_loss).
  void forward_backward(const std::vector<float>& images, const std::vector<float>& labels) {
    refresh_working_copies();
    auto& layers = model_.layers();
    const auto n = static_cast<std::int64_t>(labels.size());  // rows of logits: labels_per_sample per sample
    const Tensor logits = forward(images, data_.train);
    ctx_.layer = static_cast<int>(layers.size());
    // A last layer that does not note its logits before rounding them (every
    // model here ends in a Linear, which does): their rounded values.
    if (ctx_.logit_max && std::isnan(ctx_.logit_max->back())) ctx_.note_logit_max(logits);
    Tensor d_logits = backend_.empty(logits.shape());
    // Softmax and cross-entropy in binary32 always; the gradient enters the
    // backward pass multiplied by the loss scale and rounded like any other.
    backend_.step_loss(logits, backend_.from_host(labels, {n}), d_logits);
    ctx_.layer = static_cast<int>(layers.size());
    ctx_.round(d_logits, policy_.activation_grads, TensorKind::activation_grads, Site::input_grad);
    Tensor g = d_logits;
    std::optional<RoundingPoint> incoming = policy_.activation_grads;
    for (int i = static_cast<int>(layers.size()) - 1; i >= 0; --i) {
      ctx_.layer = i;
      ctx_.incoming = incoming;
      g = layers[i]->backward(ctx_, g, needs_input_grad_[static_cast<std::size_t>(i)]);
      incoming = layers[i]->input_grad_rounding(policy_, incoming);
    }
    ctx_.incoming.reset();
  }

  void refresh_working_copies() {
    for (auto& lp : parameters_) {
      Parameter& p = *lp.parameter;
      ctx_.layer = lp.layer;
      if (!shares_working_) backend_.copy(p.master, p.working);
      if (!shares_working_ || ctx_.stats) ctx_.round(p.working, policy_.weights, TensorKind::weights, parameter_site(lp.index, ParameterRole::operand));
    }
  }

  // Queued whatever the step decided: the backend skips it when the step
  // found inf or NaN (Backend::optimizer_step, round_state).
  void optimizer_step(float lr) {
    const OptimizerSpec& o = setup_.optimizer;
    OptimizerParams params = optimizer_params(o, lr);
    const float decay = params.weight_decay;
    for (auto& lp : parameters_) {
      Parameter& p = *lp.parameter;
      ctx_.layer = lp.layer;
      params.weight_decay = o.decay_vectors || p.shape.size() > 1 ? decay : 0.0f;
      backend_.optimizer_step(params, p.master, p.grad, p.state1, p.state2, lp.update, storage_,
                              ctx_.stream(parameter_site(lp.index, ParameterRole::storage), ctx_.step + 1),
                              ctx_.stats_for(TensorKind::updates));
      // Optimiser state is not one of the instrumented kinds: rounded, not counted.
      ctx_.round_state(p.state1, policy_.optimizer_state, parameter_site(lp.index, ParameterRole::state1));
      if (!p.state2.empty())
        ctx_.round_state(p.state2, policy_.optimizer_state, parameter_site(lp.index, ParameterRole::state2));
    }
  }

  std::pair<double, double> evaluate(const Dataset& test) {
    LayerStats* const counted = std::exchange(ctx_.stats, nullptr);
    LayerBlockStats* const block_counted = std::exchange(ctx_.block_stats, nullptr);
    std::vector<double>* const maxima = std::exchange(ctx_.logit_max, nullptr);
    ctx_.training = false;
    refresh_working_copies();
    Batcher batcher(test, setup_.train.eval_batch, 0, false);
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    std::vector<float> images, labels;
    std::vector<std::int64_t> indices;
    for (std::int64_t start = 0; start < test.count; start += setup_.train.eval_batch) {
      indices.clear();
      for (std::int64_t i = start; i < std::min(test.count, start + setup_.train.eval_batch); ++i) indices.push_back(i);
      batcher.gather(indices, images, labels);
      const auto n = static_cast<std::int64_t>(labels.size());
      const Tensor logits = forward(images, test);
      Tensor unused_gradient = backend_.empty(logits.shape());
      const LossResult r = backend_.softmax_cross_entropy(logits, backend_.from_host(labels, {n}), 1.0f, unused_gradient);
      loss_sum += r.loss_sum;
      correct += r.correct;
    }
    ctx_.stats = counted;
    ctx_.block_stats = block_counted;
    ctx_.logit_max = maxima;
    ctx_.training = true;
    const double count = static_cast<double>(std::max<std::int64_t>(1, test.label_count()));
    return {loss_sum / count, static_cast<double>(correct) / count};
  }

  // Takes the steps the backend decided since the last read and logs them.
  // The host's loss scaler replays each decision (the same rule,
  // numerics.hpp) and must agree with the scale the backend used.
  // When a step without a loss scaler found inf or NaN, the arm ends
  // there, and the steps after it (already run, their updates computed from
  // the weights that step left) are dropped. Returns that step, if any.
  std::optional<std::int64_t> read_steps(ArmResult& result, ArmLog* log) {
    const std::vector<StepScalars> steps = backend_.take_steps();
    if (steps.size() != pending_.size())
      throw std::logic_error("backend \"" + std::string(backend_.name()) + "\" returned " +
                             std::to_string(steps.size()) + " steps, " + std::to_string(pending_.size()) + " expected");
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const StepScalars& s = steps[i];
      const PendingStep& p = pending_[i];
      if (s.loss_scale != scaler_.scale())
        throw std::logic_error("backend \"" + std::string(backend_.name()) + "\" used loss scale " +
                               std::to_string(s.loss_scale) + " at step " + std::to_string(p.step) +
                               "; the loss scaler's rule gives " + std::to_string(scaler_.scale()));
      scaler_.update(s.found_inf);
      const double loss = s.loss_sum / static_cast<double>(p.rows);
      const StepRecord record{p.step,        loss, s.loss_scale, s.found_inf, s.found_inf, p.lr,
                              std::sqrt(s.grad_sum_squares) / s.loss_scale};
      result.losses.push_back(loss);
      result.loss_scales.push_back(s.loss_scale);
      result.steps = p.step + 1;
      result.skipped_steps += s.found_inf ? 1 : 0;
      epoch_loss_ += loss;
      ++epoch_batches_;
      train_correct_ += s.correct;
      train_seen_ += p.rows;
      if (log) log->step(record);
      if (s.found_inf && policy_.loss_scaling.mode == LossScaleMode::none) {
        result.status = "stopped: non-finite " + std::string(std::isfinite(loss) ? "gradient" : "loss") +
                        " at step " + std::to_string(p.step) + " and the policy has no loss scaler";
        pending_.clear();
        return p.step;
      }
    }
    pending_.clear();
    return std::nullopt;
  }

  // What the host knows of a step the backend has not reported yet.
  struct PendingStep {
    std::int64_t step;
    double lr;
    std::int64_t rows;
  };
  // At most this many steps between reads: bounds the backend's record buffer.
  static constexpr std::size_t max_pending_steps = 1024;

  Backend& backend_;
  const ArmSetup& setup_;
  const Policy& policy_;
  const TrainTest& data_;
  Model model_;
  StepContext ctx_;
  LossScaler scaler_;
  std::vector<LayerParameter> parameters_;
  std::vector<bool> needs_input_grad_;
  RoundingPoint storage_;
  bool shares_working_ = false;
  std::int64_t train_correct_ = 0, train_seen_ = 0;
  double epoch_loss_ = 0.0;
  std::int64_t epoch_batches_ = 0;
  std::vector<PendingStep> pending_;
};

}  // namespace

ArmResult train_arm(Backend& backend, const ArmSetup& setup, const TrainTest& data, ArmLog* log,
                    const std::function<void(const Progress&)>& progress) {
  Arm arm(backend, setup, data);
  return arm.run(log, progress);
}

}  // namespace mpsim::core
