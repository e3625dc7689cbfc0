#include "mpsim/core/trainer.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
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
        shadow_ctx_(backend, shadow_policy_, setup.seed),
        scaler_(policy_.loss_scaling) {
    backend_.set_threads(setup.train.threads);
    backend_.set_cpu_gemm(setup.train.gemm);
    backend_.set_device_attention(setup.train.attention);
    ctx_.attention_stats = setup.train.attention_stats;
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
    shadow_ctx_.output_layer = ctx_.output_layer;
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
      const bool shadow = t.shadow_interval > 0 && step % t.shadow_interval == 0;
      double shadow_loss = 0.0;
      if (shadow) {
        // The steps before, read now: the scaler then holds this step's scale.
        if (read_steps(result, log)) break;
        shadow_loss = shadow_pass(images, labels);
      }

      // The step runs without waiting for the backend: the loss, the
      // inf/NaN check, the loss scale and the decision to skip stay there
      // (Backend's step ops) until the trainer reads them below.
      forward_backward(images, labels);
      if (shadow) {
        const std::vector<ShadowRecord> records = compare_with_shadow(step, shadow_loss);
        if (log) log->shadow(records);
      }
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
  // The forward pass of a batch of samples under ctx's policy; returns the logits.
  Tensor forward(StepContext& ctx, const std::vector<float>& images, const Dataset& shape) {
    auto& layers = model_.layers();
    const auto n = static_cast<std::int64_t>(images.size()) / shape.sample_size();
    Tensor h = backend_.from_host(images, {n, shape.channels, shape.height, shape.width});
    std::optional<RoundingPoint> incoming;  // the images: binary32, not rounded
    for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
      ctx.layer = i;
      ctx.incoming = incoming;
      h = layers[i]->forward(ctx, h);
      incoming = layers[i]->output_rounding(ctx.policy, incoming);
    }
    ctx.incoming.reset();
    return h;
  }

  // The backward pass from the loss gradient d_logits under ctx's policy,
  // which rounds it first like any other activation gradient.
  void backward(StepContext& ctx, Tensor d_logits) {
    auto& layers = model_.layers();
    ctx.layer = static_cast<int>(layers.size());
    ctx.round(d_logits, ctx.policy.activation_grads, TensorKind::activation_grads, Site::input_grad);
    Tensor g = d_logits;
    std::optional<RoundingPoint> incoming = ctx.policy.activation_grads;
    for (int i = static_cast<int>(layers.size()) - 1; i >= 0; --i) {
      ctx.layer = i;
      ctx.incoming = incoming;
      g = layers[i]->backward(ctx, g, needs_input_grad_[static_cast<std::size_t>(i)]);
      incoming = layers[i]->input_grad_rounding(ctx.policy, incoming);
    }
    ctx.incoming.reset();
  }

  // Rounds the working copies, runs forward and backward; the loss stays
  // with the backend (Backend::step_loss).
  void forward_backward(const std::vector<float>& images, const std::vector<float>& labels) {
    refresh_working_copies();
    const auto n = static_cast<std::int64_t>(labels.size());  // rows of logits: labels_per_sample per sample
    const Tensor logits = forward(ctx_, images, data_.train);
    ctx_.layer = static_cast<int>(model_.layers().size());
    // A last layer that does not note its logits before rounding them (every
    // model here ends in a Linear, which does): their rounded values.
    if (ctx_.logit_max && std::isnan(ctx_.logit_max->back())) ctx_.note_logit_max(logits);
    Tensor d_logits = backend_.empty(logits.shape());
    // Softmax and cross-entropy in binary32 always; the gradient enters the
    // backward pass multiplied by the loss scale and rounded like any other.
    backend_.step_loss(logits, backend_.from_host(labels, {n}), d_logits);
    backward(ctx_, d_logits);
  }

  // Issue 21's shadow FP32: the same batch from the weights this step starts
  // from, in binary32 (the fp32 preset) at loss scale 1, before the arm's own
  // pass. Its gradients go to buffers of its own and to the host
  // (shadow_grads_); the arm's working copies, gradients, amax histories and
  // step ops are not touched, so its bits do not change (test_training.cpp).
  // Dropout draws the arm's masks: its streams are keyed by (seed, layer,
  // site, step). Returns the shadow's mean loss.
  double shadow_pass(const std::vector<float>& images, const std::vector<float>& labels) {
    shadow_ctx_.step = ctx_.step;
    std::vector<std::pair<Tensor, Tensor>> arm_tensors;  // each parameter's working copy and gradient
    for (auto& lp : parameters_) {
      Parameter& p = *lp.parameter;
      Tensor weights = backend_.empty(p.shape);
      backend_.copy(p.master, weights);
      arm_tensors.emplace_back(std::exchange(p.working, weights), std::exchange(p.grad, backend_.zeros(p.shape)));
    }
    const auto n = static_cast<std::int64_t>(labels.size());
    const Tensor logits = forward(shadow_ctx_, images, data_.train);
    Tensor d_logits = backend_.empty(logits.shape());
    // softmax_cross_entropy's factor is grad_scale / rows: for a mean, the
    // step's factor at scale 1 (loss_gradient_factor); for a sum, rows / rows
    // = 1 and then the weight, rounded once as the step rounds it.
    const LossDefinition& loss = setup_.train.loss;
    const bool mean = loss.reduction == LossReduction::mean;
    const LossResult r = backend_.softmax_cross_entropy(logits, backend_.from_host(labels, {n}),
                                                        static_cast<float>(mean ? loss.weight : static_cast<double>(n)),
                                                        d_logits);
    if (!mean && loss.weight != 1.0) backend_.scale(d_logits, static_cast<float>(loss.weight));
    backward(shadow_ctx_, d_logits);
    shadow_grads_.resize(parameters_.size());
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      Parameter& p = *parameters_[i].parameter;
      shadow_grads_[i].resize(static_cast<std::size_t>(p.grad.numel()));
      backend_.to_host(p.grad, shadow_grads_[i]);
      p.working = std::move(arm_tensors[i].first);
      p.grad = std::move(arm_tensors[i].second);
    }
    return r.loss_sum / static_cast<double>(n);
  }

  // The arm's gradients (its backward pass done), unscaled, against the
  // shadow's: per layer with parameters, then the model (layer -1), in binary64.
  std::vector<ShadowRecord> compare_with_shadow(std::int64_t step, double shadow_loss) {
    struct Sums {
      double difference = 0.0, arm = 0.0, fp32 = 0.0, dot = 0.0;  // sums of squares and of products
      std::int64_t elements = 0, nonzero_fp32 = 0, zeroed = 0;
      void add(const Sums& o) {
        difference += o.difference, arm += o.arm, fp32 += o.fp32, dot += o.dot;
        elements += o.elements, nonzero_fp32 += o.nonzero_fp32, zeroed += o.zeroed;
      }
    };
    const double scale = scaler_.scale();  // this step's: the steps before it were read
    std::map<int, Sums> layers;
    std::vector<float> arm;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const Parameter& p = *parameters_[i].parameter;
      arm.resize(static_cast<std::size_t>(p.grad.numel()));
      backend_.to_host(p.grad, arm);
      Sums& s = layers[parameters_[i].layer];
      for (std::size_t e = 0; e < arm.size(); ++e) {
        const double g = static_cast<double>(arm[e]) / scale, g32 = shadow_grads_[i][e];
        s.difference += (g - g32) * (g - g32);
        s.arm += g * g;
        s.fp32 += g32 * g32;
        s.dot += g * g32;
        s.nonzero_fp32 += g32 != 0.0 ? 1 : 0;
        s.zeroed += g32 != 0.0 && g == 0.0 ? 1 : 0;
      }
      s.elements += static_cast<std::int64_t>(arm.size());
    }
    Sums model;
    for (const auto& [layer, s] : layers) model.add(s);
    const auto record = [&](std::int64_t layer, const Sums& s) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      ShadowRecord r;
      r.step = step;
      r.layer = layer;
      r.loss_fp32 = shadow_loss;
      r.relative_error = s.fp32 > 0.0 ? std::sqrt(s.difference / s.fp32) : nan;
      r.cosine = s.fp32 > 0.0 && s.arm > 0.0 ? s.dot / std::sqrt(s.arm * s.fp32) : nan;
      r.norm_ratio = s.fp32 > 0.0 ? std::sqrt(s.arm / s.fp32) : nan;
      r.norm_fp32 = std::sqrt(s.fp32);
      r.elements = s.elements;
      r.nonzero_fp32 = s.nonzero_fp32;
      r.zeroed = s.zeroed;
      return r;
    };
    std::vector<ShadowRecord> records;
    for (const auto& [layer, s] : layers) records.push_back(record(layer, s));
    records.push_back(record(-1, model));
    return records;
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
      const Tensor logits = forward(ctx_, images, test);
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
  const Policy shadow_policy_ = *preset_policy("fp32");  // the shadow's (shadow_pass)
  StepContext shadow_ctx_;
  std::vector<std::vector<float>> shadow_grads_;  // per parameter, on the host
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
