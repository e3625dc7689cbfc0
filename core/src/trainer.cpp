#include "mpsim/core/trainer.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <utility>

#include "mpsim/core/loss_scaler.hpp"

namespace mpsim::core {

double learning_rate(const OptimizerSpec& o, const ScheduleSpec& s, std::int64_t step, std::int64_t total) {
  if (s.kind == "constant") return o.lr;
  if (s.kind == "step") return o.lr * std::pow(s.gamma, static_cast<double>(step / std::max<std::int64_t>(1, s.step_size)));
  if (s.kind == "cosine") {
    const double t = total > 1 ? static_cast<double>(step) / static_cast<double>(total - 1) : 0.0;
    return s.min_lr + (o.lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
  throw std::invalid_argument("unknown schedule '" + s.kind + "'; expected constant, step or cosine");
}

namespace {

struct LayerParameter {
  int layer;
  Parameter* parameter;
  Site site;     // weight_operand or bias_operand: keys its streams
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
    auto& layers = model_.layers();
    bool earlier_has_parameters = false;
    for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
      needs_input_grad_.push_back(earlier_has_parameters);
      auto params = layers[i]->parameters();
      for (std::size_t j = 0; j < params.size(); ++j)
        parameters_.push_back({i, params[j], j == 0 ? Site::weight_operand : Site::bias_operand, Tensor()});
      earlier_has_parameters = earlier_has_parameters || !params.empty();
    }
    storage_ = policy_.master_weights ? RoundingPoint{} : policy_.weight_storage;
    shares_working_ = policy_.master_weights ? policy_.weights.is_identity() : policy_.weights == storage_;
    for (auto& lp : parameters_) {
      Parameter& p = *lp.parameter;
      p.master = backend_.from_host(p.initial, p.shape);
      if (!policy_.master_weights) {
        ctx_.layer = lp.layer;
        ctx_.round(p.master, storage_, TensorKind::weights, lp.site);  // the weights exist only in storage format
      }
      p.working = shares_working_ ? p.master : backend_.empty(p.shape);
      p.grad = backend_.zeros(p.shape);
      p.state1 = backend_.zeros(p.shape);
      if (setup_.optimizer.kind != "sgd") p.state2 = backend_.zeros(p.shape);
      lp.update = backend_.empty(p.shape);
    }
    if (setup_.optimizer.kind != "sgd" && setup_.optimizer.kind != "adam" && setup_.optimizer.kind != "adamw")
      throw std::invalid_argument("unknown optimizer '" + setup_.optimizer.kind + "'; expected sgd, adam or adamw");
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

    ArmResult result;
    TensorStats act_grads, weight_grads, updates;
    double epoch_loss = 0.0;
    std::int64_t epoch_batches = 0;
    double last_accuracy = std::numeric_limits<double>::quiet_NaN();
    std::vector<float> images, labels;
    LayerStats stats;

    for (std::int64_t step = 0; step < total; ++step) {
      const std::int64_t epoch = step / per_epoch, batch = step % per_epoch;
      batcher.gather(batcher.batch_indices(epoch, batch), images, labels);
      const bool instrument = t.stats_interval > 0 && step % t.stats_interval == 0;
      if (instrument) stats.assign(layer_count, {});
      ctx_.stats = instrument ? &stats : nullptr;
      ctx_.step = step;
      ctx_.training = true;

      const double scale = scaler_.scale();
      const double loss = forward_backward(images, labels, static_cast<float>(scale));
      if (setup_.inspect_gradients) setup_.inspect_gradients(step, model_.parameters(), backend_);
      double sum_squares = 0.0;
      for (auto& lp : parameters_) sum_squares += backend_.sum_squares(lp.parameter->grad);
      const bool found_inf = !std::isfinite(sum_squares) || !std::isfinite(loss);
      const bool skip = scaler_.update(found_inf);
      const double lr = learning_rate(setup_.optimizer, setup_.schedule, step, total);

      StepRecord record{step, loss, scale, found_inf, skip || found_inf, lr, std::sqrt(sum_squares) / scale};
      result.losses.push_back(loss);
      result.loss_scales.push_back(scale);
      result.steps = step + 1;
      // Without a loss scaler a non-finite step ends the arm (logged, counted as skipped).
      const bool stop = found_inf && policy_.loss_scaling.mode == LossScaleMode::none;
      if (skip || stop) {
        result.skipped_steps += 1;
      } else {
        optimizer_step(static_cast<float>(lr), scale);
      }
      if (log) {
        log->step(record);
        if (instrument) log->stats(step, stats);
      }
      if (stop) {
        result.status = "stopped: non-finite " + std::string(std::isfinite(loss) ? "gradient" : "loss") +
                        " at step " + std::to_string(step) + " and the policy has no loss scaler";
        break;
      }
      if (instrument) {
        result.stat_totals.resize(stats.size());
        for (std::size_t l = 0; l < stats.size(); ++l)
          for (int k = 0; k < tensor_kind_count; ++k) result.stat_totals[l][k] += stats[l][k];
        for (const auto& layer : stats) {
          act_grads += layer[static_cast<int>(TensorKind::activation_grads)];
          weight_grads += layer[static_cast<int>(TensorKind::weight_grads)];
          updates += layer[static_cast<int>(TensorKind::updates)];
        }
      }
      epoch_loss += loss;
      ++epoch_batches;
      const bool end_of_epoch = batch == per_epoch - 1 || step == total - 1;
      const bool eval_now = t.eval_interval > 0 ? ((step + 1) % t.eval_interval == 0 || step == total - 1)
                                                : end_of_epoch;
      if (eval_now) {
        const auto [test_loss, test_accuracy] = evaluate(data_.test);
        EvalRecord e;
        e.step = step + 1;
        e.epoch = static_cast<double>(step + 1) / static_cast<double>(per_epoch);
        e.train_loss = epoch_loss / static_cast<double>(epoch_batches);
        e.test_loss = test_loss;
        e.test_accuracy = test_accuracy;
        e.train_accuracy = train_correct_ / static_cast<double>(std::max<std::int64_t>(1, train_seen_));
        if (log) log->eval(e);
        result.train_loss = e.train_loss;
        result.test_loss = test_loss;
        result.test_accuracy = last_accuracy = test_accuracy;
        if (end_of_epoch) epoch_loss = 0.0, epoch_batches = 0, train_correct_ = 0, train_seen_ = 0;
      }
      if (progress) progress({step + 1, total, loss, scale, last_accuracy});
    }
    result.final_loss_scale = scaler_.scale();
    const auto rate = [](const TensorStats& s, Counter c) {
      return s[Counter::nonzero] ? static_cast<double>(s[c]) / static_cast<double>(s[Counter::nonzero]) : 0.0;
    };
    result.activation_grad_flushed = rate(act_grads, Counter::flushed);
    result.activation_grad_below_2_24 = rate(act_grads, Counter::below_2_24);
    result.weight_grad_flushed = rate(weight_grads, Counter::flushed);
    result.weight_grad_below_2_24 = rate(weight_grads, Counter::below_2_24);
    result.swallowed_updates = rate(updates, Counter::swallowed);
    result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (log) log->finish(result.status);
    return result;
  }

 private:
  // The forward pass of a batch of images; returns the logits.
  Tensor forward(const std::vector<float>& images, std::int64_t n, const Dataset& shape) {
    auto& layers = model_.layers();
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

  // Rounds the working copies, runs forward and backward; returns the mean loss.
  double forward_backward(const std::vector<float>& images, const std::vector<float>& labels, float loss_scale) {
    refresh_working_copies();
    auto& layers = model_.layers();
    const auto n = static_cast<std::int64_t>(labels.size());
    const Tensor logits = forward(images, n, data_.train);
    Tensor d_logits = backend_.empty(logits.shape());
    // Softmax and cross-entropy in binary32 always; the gradient enters the
    // backward pass multiplied by the loss scale and rounded like any other.
    const LossResult loss = backend_.softmax_cross_entropy(logits, backend_.from_host(labels, {n}), loss_scale, d_logits);
    train_correct_ += loss.correct;
    train_seen_ += n;
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
    return loss.loss_sum / static_cast<double>(n);
  }

  void refresh_working_copies() {
    for (auto& lp : parameters_) {
      Parameter& p = *lp.parameter;
      ctx_.layer = lp.layer;
      if (!shares_working_) backend_.copy(p.master, p.working);
      if (!shares_working_ || ctx_.stats) ctx_.round(p.working, policy_.weights, TensorKind::weights, lp.site);
    }
  }

  void optimizer_step(float lr, double scale) {
    const OptimizerSpec& o = setup_.optimizer;
    ++optimizer_steps_;
    for (auto& lp : parameters_) {
      Parameter& p = *lp.parameter;
      ctx_.layer = lp.layer;
      // Unscale in binary32 before the optimiser (GradScaler.unscale_).
      if (scale != 1.0) backend_.scale(p.grad, static_cast<float>(1.0 / scale));
      Tensor& update = lp.update;
      if (o.kind == "sgd") {
        backend_.sgd_update(p.master, p.grad, p.state1, lr, static_cast<float>(o.momentum),
                            static_cast<float>(o.weight_decay), optimizer_steps_ == 1, update);
      } else {
        AdamParams a{lr, static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps),
                     static_cast<float>(o.weight_decay), o.kind == "adamw", optimizer_steps_};
        backend_.adam_update(p.master, p.grad, p.state1, p.state2, a, update);
      }
      // Optimiser state is not one of the instrumented kinds: rounded, not counted.
      ctx_.round(p.state1, policy_.optimizer_state, std::nullopt, Site::extra_grad);
      if (!p.state2.empty()) ctx_.round(p.state2, policy_.optimizer_state, std::nullopt, Site::extra_grad);
      backend_.apply_update(p.master, update, storage_, ctx_.stream(lp.site), ctx_.stats_for(TensorKind::updates));
    }
  }

  std::pair<double, double> evaluate(const Dataset& test) {
    LayerStats* const counted = std::exchange(ctx_.stats, nullptr);
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
      const Tensor logits = forward(images, n, test);
      Tensor unused_gradient = backend_.empty(logits.shape());
      const LossResult r = backend_.softmax_cross_entropy(logits, backend_.from_host(labels, {n}), 1.0f, unused_gradient);
      loss_sum += r.loss_sum;
      correct += r.correct;
    }
    ctx_.stats = counted;
    ctx_.training = true;
    const double count = static_cast<double>(std::max<std::int64_t>(1, test.count));
    return {loss_sum / count, static_cast<double>(correct) / count};
  }

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
  std::int64_t optimizer_steps_ = 0;
  std::int64_t train_correct_ = 0, train_seen_ = 0;
};

}  // namespace

ArmResult train_arm(Backend& backend, const ArmSetup& setup, const TrainTest& data, ArmLog* log,
                    const std::function<void(const Progress&)>& progress) {
  Arm arm(backend, setup, data);
  return arm.run(log, progress);
}

}  // namespace mpsim::core
