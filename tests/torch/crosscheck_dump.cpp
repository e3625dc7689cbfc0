// torch_crosscheck_dump OUTDIR CASE [STEPS]
//
// Trains one small FP32 arm with mpsim's CPU backend and writes everything an
// independent implementation (tests/torch/crosscheck.py, PyTorch) needs to
// repeat the run: the model and optimiser, the initial weights, every step's
// batch, and what mpsim computed at each step: the loss, the gradients and the
// weights that step's forward pass used. Arrays are raw little-endian
// binary32 files (binary64 for the losses); OUTDIR/manifest.txt names them:
//
//   case NAME | model mlp|cnn|vit|gpt | activation relu|gelu | layer_norm 0|1
//   hidden W... | optimizer sgd|adam|adamw | lr X | momentum X | weight_decay X | decay_vectors 0|1 | clip_norm X
//   z_loss X
//   beta1 X | beta2 X | eps X | batch B | steps S | input C H W | classes K
//   labels_per_sample L | patch P | depth D | width W | heads H | mlp_width M
//   dropout P | attention_dropout P
//   param NAME FILE D0 D1 ...            (initial weights, in model order)
//   step S loss X images FILE labels FILE
//   grad S NAME FILE                     (dLoss/dparam at step S, mean loss)
//   weight S NAME FILE                   (the weights step S's forward used)
//   mask S FILE N                        (step S's forward dropout masks, in call order: N factors,
//                                         0 or the binary32 scale 1 / (1 - p) each)
//   final NAME FILE                      (the weights after the last step)
//   losses FILE                          (binary64, one per step)
//
// Exit status: 0 on success, 2 on bad arguments, 1 on any other error.

#include <bit>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/data.hpp"
#include "mpsim/core/model.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/trainer.hpp"
#include "support/forwarding_backend.hpp"

namespace fs = std::filesystem;
using namespace mpsim::core;

namespace {

static_assert(std::endian::native == std::endian::little, "the dump format is little-endian");

struct Case {
  const char* name;
  ModelSpec model;
  OptimizerSpec optimizer;
  double z_loss = 0.0;  // [loss] z_loss
  ScheduleSpec schedule{};  // [schedule]: the GPT cases warm up and decay (PyTorch's LinearLR and CosineAnnealingLR)
};

std::map<std::string, Case> cases() {
  std::map<std::string, Case> all;
  {
    Case c{"mlp_relu_sgd", {}, {}};
    c.model.kind = ModelKind::mlp;
    c.model.hidden = {64, 32};
    c.model.activation = Activation::relu;
    c.optimizer.kind = OptimizerKind::sgd;
    c.optimizer.lr = 0.05;
    c.optimizer.momentum = 0.9;
    c.optimizer.weight_decay = 1e-4;
    all.emplace(c.name, c);
  }
  for (const char* kind : {"adam", "adamw"}) {
    Case c{kind == std::string("adam") ? "mlp_gelu_ln_adam" : "mlp_gelu_ln_adamw", {}, {}};
    c.model.kind = ModelKind::mlp;
    c.model.hidden = {32, 32};
    c.model.activation = Activation::gelu;
    c.model.layer_norm = true;
    c.optimizer.kind = *optimizer_kind_names.parse(kind);
    c.optimizer.lr = 1e-3;
    c.optimizer.weight_decay = c.optimizer.kind == OptimizerKind::adamw ? 0.01 : 0.0;
    all.emplace(c.name, c);
  }
  // Transformers: a ViT on the synthetic images, a GPT on a synthetic token
  // stream (token_data), both with AdamW, GELU and every transformer op.
  for (const ModelKind kind : {ModelKind::vit, ModelKind::gpt}) {
    Case c{kind == ModelKind::vit ? "vit_adamw" : "gpt_adamw", {}, {}};
    c.model.kind = kind;
    c.model.activation = Activation::gelu;
    c.model.patch = 7;
    c.model.depth = 2;
    c.model.width = 16;
    c.model.heads = 2;
    c.model.mlp_width = 32;
    c.model.init = InitScheme::normal;
    c.model.init_scale = 0.2;
    c.optimizer.kind = OptimizerKind::adamw;
    c.optimizer.lr = 3e-3;
    c.optimizer.weight_decay = kind == ModelKind::gpt ? 0.1 : 0.01;
    c.optimizer.decay_vectors = kind == ModelKind::vit;  // the GPT decays matrices and tables only
    c.optimizer.clip_norm = kind == ModelKind::gpt ? 0.5 : 0.0;  // below the GPT's gradient norms: it clips
    // PaLM's z-loss, 100x PaLM's weight so that leaving it out fails the check.
    c.z_loss = kind == ModelKind::gpt ? 0.01 : 0.0;
    if (kind == ModelKind::gpt) {  // two warm-up steps, then a cosine to a tenth of lr at the last step
      c.schedule.kind = ScheduleKind::cosine;
      c.schedule.warmup = 2;
      c.schedule.min_lr = 3e-4;
    }
    all.emplace(c.name, c);
  }
  {
    // A GPT as LLaMA arranges it (RMSNorm, SwiGLU), with QK-LayerNorm.
    Case c = all.at("gpt_adamw");
    c.name = "llama_adamw";
    c.model.norm = NormKind::rms_norm;
    c.model.activation = Activation::silu;
    c.model.gated = true;
    c.model.qk_norm = true;
    all.emplace(c.name, c);
  }
  {
    // Gemma 2's arrangement: RMSNorm with zero-centred scales (1 + gamma), norms on both branches' outputs, a
    // GeGLU MLP, the embedded rows scaled by sqrt(width), a tied head, capped output logits; and QK-LayerNorm,
    // zero-centred too.
    Case c = all.at("gpt_adamw");
    c.name = "gemma_adamw";
    c.model.norm = NormKind::rms_norm;
    c.model.zero_centered_gamma = true;
    c.model.post_norm = true;
    c.model.gated = true;
    c.model.qk_norm = true;
    c.model.embedding_scale = 4.0;  // sqrt(16)
    c.model.tie_embeddings = true;
    c.model.logit_softcap = 0.5;
    c.optimizer.decay_vectors = true;  // the scales decay toward 1
    all.emplace(c.name, c);
  }
  {
    // Rotary positions (no position table), Gemma 2's soft caps, set near the logits' size so that tanh bends
    // them, and a head tied to the token table.
    Case c = all.at("gpt_adamw");
    c.name = "rotary_softcap_adamw";
    c.model.tie_embeddings = true;
    c.model.positions = PositionKind::rotary;
    c.model.attention_softcap = 1.0;
    c.model.logit_softcap = 0.5;
    all.emplace(c.name, c);
  }
  {
    // FlashAttention-2's fused path (numerics_attention.hpp's FusedAttention): tiles of 5 keys over contexts of
    // 16, so rows are rescaled up to three times, with rotary positions and capped attention logits. PyTorch's
    // unfused attention computes the same function.
    Case c = all.at("rotary_softcap_adamw");
    c.name = "fused_rotary_softcap_adamw";
    c.model.fused_attention = true;
    c.model.attention_tile = 5;
    all.emplace(c.name, c);
  }
  {
    // GPT-2's dropout: after the embeddings and each block's two branches, and on the attention probabilities.
    // PyTorch applies the masks mpsim drew (DropoutRecorder), so the check is of the arithmetic around them.
    Case c = all.at("gpt_adamw");
    c.name = "gpt_dropout_adamw";
    c.model.dropout = 0.1;
    c.model.attention_dropout = 0.1;
    all.emplace(c.name, c);
  }
  {
    Case c{"cnn_sgd", {}, {}};
    c.model.kind = ModelKind::cnn;
    c.model.activation = Activation::relu;
    c.optimizer.kind = OptimizerKind::sgd;
    c.optimizer.lr = 0.05;
    c.optimizer.momentum = 0.9;
    c.optimizer.weight_decay = 1e-4;
    all.emplace(c.name, c);
  }
  return all;
}

std::string file_name(std::string name) {
  for (char& ch : name)
    if (ch == '.') ch = '_';
  return name;
}

template <typename T>
void write_raw(const fs::path& path, std::span<const T> values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size_bytes()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string shape_text(const Shape& shape) {
  std::string s;
  for (const auto d : shape) s += " " + std::to_string(d);
  return s;
}

std::string number(double x) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", x);
  return buffer;
}

// A token stream for the GPT case: a vocabulary of 11, contexts of 16, each
// token the previous one plus a step of 1 or 2 (mod 11) drawn from the seed,
// so the next token is learnable; every position is labelled.
TrainTest token_data(std::uint64_t seed) {
  constexpr std::int64_t vocabulary = 11, context = 16;
  std::mt19937_64 rng(seed);  // the standard fixes mt19937_64's outputs
  TrainTest t;
  for (auto [d, count] : {std::pair{&t.train, 512}, {&t.test, 128}}) {
    d->channels = d->height = 1;
    d->width = d->labels_per_sample = context;
    d->classes = vocabulary;
    d->count = count;
    for (std::int64_t i = 0; i < count; ++i) {
      std::int64_t token = static_cast<std::int64_t>(rng() % vocabulary);
      for (std::int64_t k = 0; k <= context; ++k) {
        if (k < context) d->images.push_back(static_cast<float>(token));
        token = (token + 1 + static_cast<std::int64_t>(rng() % 2)) % vocabulary;
        if (k < context) d->labels.push_back(static_cast<std::int32_t>(token));
      }
    }
  }
  return t;
}

// Keeps the masks of every dropout call of a step's forward pass (those
// before its loss; the backward pass applies the same masks to gradients),
// as the factor each element is multiplied by: dropout_value(1, mask, i).
class DropoutRecorder final : public mpsim::test::ForwardingBackend {
 public:
  DropoutRecorder() : ForwardingBackend(make_cpu_backend()) {}
  std::vector<std::vector<std::vector<float>>> masks;  // [step][call][element]

  void pointwise_forward_impl(const PointwiseCall& op, const Tensor& x, Tensor& y) override {
    if (const DropoutMask* mask = std::get_if<DropoutMask>(&op); mask && !in_backward_) {
      if (masks.size() <= step_) masks.resize(step_ + 1);
      auto& factors = masks[step_].emplace_back(static_cast<std::size_t>(x.numel()));
      for (std::size_t i = 0; i < factors.size(); ++i)
        factors[i] = dropout_value(1.0f, *mask, static_cast<std::int64_t>(i));
    }
    ForwardingBackend::pointwise_forward_impl(op, x, y);
  }
  void step_loss_impl(const Tensor& logits, const Tensor& labels, Tensor& d_logits) override {
    in_backward_ = true;
    ForwardingBackend::step_loss_impl(logits, labels, d_logits);
  }
  void end_step_impl() override {
    in_backward_ = false;
    ++step_;
    ForwardingBackend::end_step_impl();
  }

 private:
  std::size_t step_ = 0;
  bool in_backward_ = false;
};

int run(const fs::path& out_dir, const Case& c, std::int64_t steps) {
  constexpr std::uint64_t seed = 20240607;
  constexpr std::int64_t batch = 32;
  const TrainTest data = c.model.kind == ModelKind::gpt ? token_data(seed) : make_synthetic(seed, 512, 128);
  const Policy policy = *preset_policy("fp32");

  ArmSetup setup;
  setup.policy = &policy;
  setup.model = c.model;
  setup.optimizer = c.optimizer;
  setup.train.loss.z_loss = c.z_loss;
  setup.schedule = c.schedule;
  setup.seed = seed;
  setup.train.epochs = 1;
  setup.train.max_steps = steps;
  setup.train.batch_size = batch;
  setup.train.eval_interval = 0;    // evaluates once, after the last step
  setup.train.eval_batch = 128;     // the whole (small) test set in one batch
  setup.train.stats_interval = 0;   // no instrumentation: it does not change FP32 values anyway
  setup.train.threads = 1;

  fs::create_directories(out_dir);
  std::ofstream manifest(out_dir / "manifest.txt");
  manifest << "case " << c.name << "\nmodel " << to_string(c.model.kind) << "\nactivation "
           << to_string(c.model.activation) << "\nlayer_norm "
           << (c.model.layer_norm ? 1 : 0) << "\nhidden" << shape_text(c.model.hidden) << "\noptimizer "
           << to_string(c.optimizer.kind) << "\nlr " << number(c.optimizer.lr) << "\nmomentum " << number(c.optimizer.momentum)
           << "\nweight_decay " << number(c.optimizer.weight_decay) << "\ndecay_vectors "
           << (c.optimizer.decay_vectors ? 1 : 0) << "\nclip_norm " << number(c.optimizer.clip_norm) << "\nz_loss " << number(c.z_loss) << "\nbeta1 " << number(c.optimizer.beta1)
           << "\nbeta2 " << number(c.optimizer.beta2) << "\neps " << number(c.optimizer.eps) << "\nbatch " << batch
           << "\nsteps " << steps << "\ninput " << data.train.channels << " " << data.train.height << " "
           << data.train.width << "\nclasses " << data.train.classes << "\nlabels_per_sample "
           << data.train.labels_per_sample << "\npatch " << c.model.patch << "\ndepth " << c.model.depth
           << "\nwidth " << c.model.width << "\nheads " << c.model.heads << "\nmlp_width " << c.model.mlp_width
           << "\nnorm " << to_string(c.model.norm) << "\nqk_norm " << (c.model.qk_norm ? 1 : 0) << "\ngated "
           << (c.model.gated ? 1 : 0) << "\npositions " << to_string(c.model.positions) << "\nrotary_base "
           << number(c.model.rotary_base) << "\nattention_softcap " << number(c.model.attention_softcap)
           << "\nlogit_softcap " << number(c.model.logit_softcap) << "\ntie_embeddings " << (c.model.tie_embeddings ? 1 : 0)
           << "\ndropout " << number(c.model.dropout) << "\nattention_dropout " << number(c.model.attention_dropout)
           << "\nzero_centered_gamma " << (c.model.zero_centered_gamma ? 1 : 0) << "\npost_norm "
           << (c.model.post_norm ? 1 : 0) << "\nembedding_scale " << number(c.model.embedding_scale)
           << "\nschedule " << to_string(c.schedule.kind) << "\nwarmup " << c.schedule.warmup << "\nmin_lr "
           << number(c.schedule.min_lr) << "\n";

  // Initial weights and every step's gradients and weights, from the hook.
  bool initial_written = false;
  std::vector<std::pair<std::string, Tensor>> masters;  // handles on the master copies
  std::vector<float> host;
  setup.inspect_gradients = [&](std::int64_t step, const std::vector<Parameter*>& parameters, Backend& backend) {
    if (!initial_written) {
      for (const Parameter* p : parameters) {
        const std::string file = "init_" + file_name(p->name) + ".f32";
        write_raw<float>(out_dir / file, p->initial);
        manifest << "param " << p->name << " " << file << shape_text(p->shape) << "\n";
      }
      initial_written = true;
    }
    for (const Parameter* p : parameters) {
      host.resize(static_cast<std::size_t>(element_count(p->shape)));
      const std::string stem = "step" + std::to_string(step) + "_";
      backend.to_host(p->grad, host);
      write_raw<float>(out_dir / (stem + "grad_" + file_name(p->name) + ".f32"), host);
      manifest << "grad " << step << " " << p->name << " " << stem + "grad_" + file_name(p->name) + ".f32\n";
      backend.to_host(p->working, host);
      write_raw<float>(out_dir / (stem + "weight_" + file_name(p->name) + ".f32"), host);
      manifest << "weight " << step << " " << p->name << " " << stem + "weight_" + file_name(p->name) + ".f32\n";
    }
    masters.clear();
    for (const Parameter* p : parameters) masters.emplace_back(p->name, p->master);
  };

  auto backend = std::make_unique<DropoutRecorder>();
  const ArmResult result = train_arm(*backend, setup, data, nullptr);
  if (result.steps != steps || result.status != "completed")
    throw std::runtime_error("the arm ran " + std::to_string(result.steps) + " steps: " + result.status);
  // The weights after the last optimiser step: the optimiser updates the
  // master buffers in place, and the handles kept by the hook keep them alive.
  for (const auto& [name, master] : masters) {
    host.resize(static_cast<std::size_t>(master.numel()));
    backend->to_host(master, host);
    write_raw<float>(out_dir / ("final_" + file_name(name) + ".f32"), host);
    manifest << "final " << name << " final_" << file_name(name) << ".f32\n";
  }

  // The batches, as the trainer draws them (step s: epoch s / per_epoch, batch s % per_epoch).
  Batcher batcher(data.train, batch, seed);
  const std::int64_t per_epoch = batcher.batches_per_epoch();
  std::vector<float> images, labels;
  for (std::int64_t s = 0; s < steps; ++s) {
    batcher.gather(batcher.batch_indices(s / per_epoch, s % per_epoch), images, labels);
    const std::string stem = "step" + std::to_string(s) + "_";
    write_raw<float>(out_dir / (stem + "images.f32"), images);
    write_raw<float>(out_dir / (stem + "labels.f32"), labels);
    manifest << "step " << s << " loss " << number(result.losses[static_cast<std::size_t>(s)]) << " images "
             << stem + "images.f32 labels " << stem + "labels.f32\n";
  }
  for (std::size_t s = 0; s < backend->masks.size(); ++s)
    for (std::size_t call = 0; call < backend->masks[s].size(); ++call) {
      const std::string file = "step" + std::to_string(s) + "_dropout" + std::to_string(call) + ".f32";
      write_raw<float>(out_dir / file, backend->masks[s][call]);
      manifest << "mask " << s << " " << file << " " << backend->masks[s][call].size() << "\n";
    }
  write_raw<double>(out_dir / "losses.f64", result.losses);
  manifest << "losses losses.f64\n";
  manifest.close();
  if (!manifest) throw std::runtime_error("cannot write " + (out_dir / "manifest.txt").string());
  std::cout << c.name << ": " << steps << " steps, final loss " << result.losses.back() << ", dump in "
            << out_dir.string() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto all = cases();
  auto usage = [&] {
    std::cerr << "usage: torch_crosscheck_dump OUTDIR CASE [STEPS]\ncases:";
    for (const auto& [name, c] : all) std::cerr << " " << name;
    std::cerr << "\n";
    return 2;
  };
  if (argc < 3 || argc > 4) return usage();
  const auto it = all.find(argv[2]);
  if (it == all.end()) return usage();
  std::int64_t steps = 6;
  if (argc == 4) {
    try {
      steps = std::stoll(argv[3]);
    } catch (const std::exception&) {
      return usage();
    }
    if (steps < 1 || steps > 16) return usage();  // 512 samples, batch 32: one epoch
  }
  try {
    return run(argv[1], it->second, steps);
  } catch (const std::exception& e) {
    std::cerr << "torch_crosscheck_dump: " << e.what() << "\n";
    return 1;
  }
}
