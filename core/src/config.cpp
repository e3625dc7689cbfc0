// Experiment configs, key by key from one table per section (config_fields
// below): each key's name, member, type, unit, allowed values and meaning.
// The tables drive reading TOML (toml++), the checks and their messages,
// writing the resolved TOML, and the docs (config_keys(), docs/configs.md).
#include "mpsim/core/config.hpp"

#include <toml++/toml.h>

#include <charconv>
#include <climits>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <span>
#include <sstream>
#include <type_traits>
#include <utility>

#include "config_field.hpp"
#include "layer_table.hpp"
#include "mpsim/core/fields.hpp"

namespace mpsim::core {
namespace {

using namespace config_field;

// --- The tables ---------------------------------------------------------------------

constexpr std::array<std::string_view, 2> backend_names{"cpu", "cuda"};
constexpr std::array<std::string_view, 3> dataset_names{"fashion-mnist", "synthetic", "fortunes"};

using C = ExperimentConfig;
constexpr auto top_fields = std::to_array<ConfigField<C>>({
    key<&C::name>("name", "", "experiment name"),
    key<&C::output>("output", "", "the HDF5 log (`-o` overrides); never overwritten without `--force`"),
    key<&C::arms>("arms", "", "policy names: presets or `[policies.NAME]` tables", no_limits, true),
    key<&C::seeds>("seeds", "",
                   "one arm per seed and policy; the seed fixes initial weights, batches and stochastic rounding",
                   no_limits, true),
    choice<&C::backends>("backends", backend_names,
                         "`cuda` when the GPU backend is built and a device is present. With two, every arm on the "
                         "second is compared with the same policy and seed on the first: the summary prints the "
                         "agreement, the log keeps it under `/agreement` ([hdf5-schema.md](hdf5-schema.md))",
                         true),
    key<&C::flush_interval>("flush_interval", "steps",
                            "steps between HDF5 flushes (also flushed at the end, on SIGINT and on SIGTERM)",
                            at_least(1)),
});

constexpr auto data_fields = std::to_array<ConfigField<DataSpec>>({
    choice<&DataSpec::dataset>("dataset", dataset_names,
                               "`synthetic`: seeded, for fast tests; `fortunes`: English text for a character-level "
                               "language model (`model.kind = \"gpt\"`), Debian's `fortunes` package"),
    key<&DataSpec::path>("path", "",
                         "the dataset's directory; empty: where its Debian package puts it "
                         "(`fashion-mnist`: `/usr/share/datasets/fashion-mnist`, `fortunes`: `/usr/share/games/fortunes`)"),
    key<&DataSpec::context>("context", "tokens", "`fortunes`: the tokens of one sample (the model's context)",
                            at_least(1)),
    key<&DataSpec::train_limit>("train_limit", "samples", "`> 0`: use only the first N training samples"),
    key<&DataSpec::test_limit>("test_limit", "samples", "`> 0`: use only the first N test samples"),
    key<&DataSpec::synthetic_train>("synthetic_train", "samples", "size of the synthetic training set",
                                    at_least(1)),
    key<&DataSpec::synthetic_test>("synthetic_test", "samples", "size of the synthetic test set", at_least(1)),
});

constexpr auto base_model_fields = std::to_array<ConfigField<ModelSpec>>({
    enum_key<&ModelSpec::kind, model_kind_names>(
        "kind", "`mlp`; `cnn`: LeNet-5 with ReLU and max pooling; `vit`: a Vision Transformer (pre-LayerNorm "
                "blocks, learned position embeddings, mean pooling); `gpt`: a decoder-only character-level language "
                "model on `data.dataset = \"fortunes\"` (docs/transformers.md)"),
    key<&ModelSpec::hidden>("hidden", "units", "MLP hidden widths", at_least(1)),
    enum_key<&ModelSpec::activation, activation_names>(
        "activation",
        "`gelu`: the exact erf form; the names come from `Activations` (core/include/mpsim/core/numerics_layers.hpp)"),
    key<&ModelSpec::layer_norm>("layer_norm", "", "MLP: LayerNorm after each hidden Linear"),
    enum_key<&ModelSpec::norm, norm_kind_names>(
        "norm", "the kind of every norm layer (the MLP's with layer_norm, a transformer's): `layernorm`, or "
                "`rmsnorm` (Zhang and Sennrich 2019; LLaMA: no mean, no bias)"),
    key<&ModelSpec::zero_centered_gamma>(
        "zero_centered_gamma", "",
        "every norm (QK-norm included) scales by 1 + gamma in binary32, gamma starting at 0 (Transformer Engine's "
        "zero_centered_gamma, Megatron-LM's apply_layernorm_1p, Gemma's RMSNorm): a narrow weight format then holds "
        "gamma's small offsets from 1, and weight decay (optimizer.decay_vectors) pulls the scale toward 1"),
    key<&ModelSpec::patch>("patch", "pixels", "vit: side of the square patches; divides the image's sides",
                           at_least(1)),
    key<&ModelSpec::depth>("depth", "blocks", "vit, gpt: transformer blocks", at_least(1)),
    key<&ModelSpec::width>("width", "", "vit, gpt: model width; a multiple of heads", at_least(1)),
    key<&ModelSpec::heads>("heads", "", "vit, gpt: attention heads of width / heads each", at_least(1)),
    key<&ModelSpec::mlp_width>("mlp_width", "units", "vit, gpt: hidden width of each block's MLP", at_least(1)),
    key<&ModelSpec::gated>("gated", "",
                           "vit, gpt: each block's MLP as a gated linear unit, activation(x W1) * (x V) (Shazeer "
                           "2020): with activation = \"silu\" the SwiGLU of LLaMA; fc1 then has 2 x mlp_width outputs"),
    key<&ModelSpec::tie_embeddings>("tie_embeddings", "",
                                    "gpt: the head's weight is the token table (Press and Wolf 2017; GPT-2), one "
                                    "parameter whose gradient sums the head's and the embedding's parts"),
    key<&ModelSpec::attention_dropout>("attention_dropout", "",
                                       "vit, gpt: dropout probability on the attention probabilities (GPT-2's "
                                       "attn_pdrop), in training only. 0: off",
                                       at_least_below(0, 1)),
    key<&ModelSpec::attention_softcap>(
        "attention_softcap", "",
        "vit, gpt: > 0 caps every attention logit at +-this, cap x tanh(logit / cap), after its rounding and before "
        "the softmax (Gemma 2: 50); the logged maximum is the logit before the cap. 0: off",
        finite_at_least(0)),
    key<&ModelSpec::fused_attention>(
        "fused_attention", "",
        "vit, gpt: FlashAttention-2's fused attention (Dao 2023): logits in binary32, never rounded nor stored; an "
        "online softmax over tiles of attention_tile keys; exp(s - running max) rounded as the value product's "
        "operand (policy activations); one normalisation at the end; the backward recomputes the probabilities "
        "from each row's log-sum-exp (docs/transformers.md). Needs unscaled, deterministic activations and "
        "gradient_operands and no softmax_internals; attention_dropout drops inside the kernel"),
    key<&ModelSpec::attention_tile>(
        "attention_tile", "keys",
        "vit, gpt with fused_attention: keys per tile of the online softmax (FlashAttention-2's B_c)",
        between(1, 256)),
    enum_key<&ModelSpec::init, init_scheme_names>(
        "init", "`he` (normal, std sqrt(2/fan_in)), `xavier` (uniform), `normal` (std 1)"),
    key<&ModelSpec::init_scale>("init_scale", "", "multiplies every initial weight: small weights, small gradients",
                                finite_above(0)),
});

// The model's keys, then its optional layers' (layer_table.hpp).
constexpr auto model_fields = [] {
  std::array<ConfigField<ModelSpec>, base_model_fields.size() + layer_table::keys.size()> all{};
  std::size_t i = 0;
  for (const auto& f : base_model_fields) all[i++] = f;
  for (const auto& f : layer_table::keys) all[i++] = f;
  return all;
}();

constexpr auto train_fields = std::to_array<ConfigField<TrainSpec>>({
    key<&TrainSpec::epochs>("epochs", "epochs", "passes over the training set", at_least(1)),
    key<&TrainSpec::max_steps>("max_steps", "steps", "`> 0`: stop after this many steps"),
    key<&TrainSpec::batch_size>("batch_size", "samples", "the last incomplete batch of an epoch is dropped",
                                at_least(1)),
    key<&TrainSpec::eval_interval>("eval_interval", "steps",
                                   "steps between test-set evaluations; `0`: end of each epoch"),
    key<&TrainSpec::eval_batch>("eval_batch", "samples", "batch size of evaluations", at_least(1)),
    key<&TrainSpec::stats_interval>("stats_interval", "steps", "instrument every Nth step; `0`: never"),
    key<&TrainSpec::attention_stats>(
        "attention_stats", "",
        "vit, gpt: at the instrumented steps, also attention's logits and probabilities as the tensor kinds "
        "`attention_logits` and `attention_probs` (two more passes over batch x heads x tokens^2 values per layer; "
        "the charlm GPT's step about 4% slower with statistics at every step). Not on the fused path"),
    key<&TrainSpec::shadow_interval>(
        "shadow_interval", "steps",
        "`> 0`: every Nth step, also the FP32 shadow: the same weights and batch in binary32, whose gradient each "
        "layer's is compared with (docs/hdf5-schema.md, `/arms/<arm>/shadow/`); one more forward and backward pass "
        "per shadow step, the arm's bits unchanged. `0`: never",
        at_least(0)),
    key<&TrainSpec::threads>("threads", "threads",
                             "GEMM, quantization and statistics threads; `0`: all cores. No bit depends on it with "
                             "`gemm = \"ordered\"`",
                             between(0, 1024)),
    enum_key<&TrainSpec::gemm, cpu_gemm_names>(
        "gemm",
        "the CPU backend's binary32 GEMM: `ordered`, one fixed summation order, the same bits on every x86-64 CPU "
        "and thread count (core/include/mpsim/core/ordered_gemm.hpp); `blas`, OpenBLAS, whose kernel and order "
        "depend on the CPU model and the thread count. Ignored on the GPU (cuBLAS)"),
    enum_key<&TrainSpec::attention, device_attention_names>(
        "attention",
        "the CUDA backend's attention products (q k^T, p v and their gradients): `kernels`, one thread per output "
        "summing in the CPU backend's order (the same bits as the CPU up to expf; gpu/src/kernels_attention.cu); "
        "`cublas`, batched cuBLAS GEMMs in binary32 without TF32, in cuBLAS's order, masked products included (a "
        "non-finite value at a masked position then gives NaN, as in a fused GPU kernel's diagonal tile). Ignored "
        "on the CPU"),
});

constexpr auto loss_fields = std::to_array<ConfigField<LossDefinition>>({
    enum_key<&LossDefinition::reduction, loss_reduction_names>(
        "reduction", "the softmax cross-entropy over the batch: `mean` (PyTorch's default) or `sum`"),
    key<&LossDefinition::weight>(
        "weight", "",
        "multiplies the loss the backward pass differentiates, as a coefficient in a weighted sum of losses; the "
        "logged `loss` stays the plain batch mean; gradients and their logged norm are those of the weighted loss. "
        "d_logits = (softmax - onehot) x binary32(scale x weight) [/ batch]: `core::loss_gradient_factor`",
        finite_above(0)),
    key<&LossDefinition::z_loss>(
        "z_loss", "",
        "PaLM's auxiliary z-loss (Chowdhery et al. 2022): adds z_loss x log(Z)^2 per row of logits, Z the "
        "softmax's normaliser, to what the backward pass differentiates (PaLM: 1e-4), which keeps the output "
        "logits from drifting; the logged `loss` stays the cross-entropy. 0: off",
        finite_at_least(0)),
});

constexpr auto optimizer_fields = std::to_array<ConfigField<OptimizerSpec>>({
    enum_key<&OptimizerSpec::kind, optimizer_kind_names>("kind", "`sgd`, `adam`, `adamw` (PyTorch's formulas)"),
    key<&OptimizerSpec::lr>("lr", "", "learning rate (the schedule's start)", finite_above(0)),
    key<&OptimizerSpec::momentum>("momentum", "", "SGD momentum", at_least_below(0, 1)),
    key<&OptimizerSpec::weight_decay>("weight_decay", "", "weight decay (AdamW: decoupled)", finite_at_least(0)),
    key<&OptimizerSpec::clip_norm>("clip_norm", "",
                                   "`> 0`: clip the gradients' global L2 norm, after unscaling, to this, as "
                                   "`torch.nn.utils.clip_grad_norm_` (`core::clip_factor`, shared by the CPU and CUDA optimiser steps)",
                                   finite_at_least(0)),
    key<&OptimizerSpec::decay_vectors>("decay_vectors", "",
                                       "`false`: no weight decay on parameters of one dimension (biases, LayerNorm's "
                                       "gains and biases), as GPT-2 and nanoGPT train"),
    key<&OptimizerSpec::beta1>("beta1", "", "Adam, AdamW: first-moment decay", at_least_below(0, 1)),
    key<&OptimizerSpec::beta2>("beta2", "", "Adam, AdamW: second-moment decay", at_least_below(0, 1)),
    key<&OptimizerSpec::eps>("eps", "", "Adam, AdamW: added to the denominator", finite_at_least(0)),
});

constexpr auto schedule_fields = std::to_array<ConfigField<ScheduleSpec>>({
    enum_key<&ScheduleSpec::kind, schedule_kind_names>(
        "kind", "`constant`, `step` (times `gamma` every `step_size` steps), `cosine` (to `min_lr`)"),
    key<&ScheduleSpec::step_size>("step_size", "steps", "`step`: steps between multiplications by `gamma`",
                                  at_least(1)),
    key<&ScheduleSpec::gamma>("gamma", "", "`step`: the factor", finite_above(0)),
    key<&ScheduleSpec::min_lr>("min_lr", "", "`cosine`: the rate at the last step", finite_at_least(0)),
    key<&ScheduleSpec::warmup>("warmup", "steps",
                               "`> 0`: the rate rises linearly to `lr` over these first steps (lr (step + 1) / "
                               "warmup); the schedule runs over the steps after them"),
});

// The rounding points come from their own table, rounding_points (policy.hpp).
template <std::size_t I>
constexpr ConfigField<Policy> point_key() {
  return key<rounding_points[I].point>(rounding_points[I].name, "", rounding_points[I].doc);
}
template <std::size_t I>
constexpr ConfigField<Policy> block_key() {
  return key<block_points[I].point>(block_points[I].name, "", block_points[I].doc);
}
template <std::size_t... I, std::size_t... J>
constexpr auto policy_fields_of(std::index_sequence<I...>, std::index_sequence<J...>) {
  return std::to_array<ConfigField<Policy>>({
      point_key<I>()...,
      block_key<J>()...,
      key<&Policy::high_precision_last>("high_precision_last", "layers",
                                        "the last N layers with GEMMs ignore the block points (NVFP4's recipe: 1)"),
      key<&Policy::block_promotion_interval>(
          "block_promotion_interval", "products",
          "with a tensor-core `gemm` and E8M0/UE4M3 block scales: products summed in the tensor core's "
          "accumulator before each promotion to binary32 (a multiple of the block length); `0`: never, the whole "
          "k in the accumulator. Binary32 (software) scales promote once per block (DeepSeek-V3) and take 0",
          at_least(0)),
      key<&Policy::master_weights>("master_weights", "", "false: the weights live only in `weight_storage`"),
      key<&Policy::gemm>("gemm", "",
                         "how GEMMs sum: `ieee` (as `accumulation` says) or an accumulation model (`h100`, "
                         "`pairwise-fp32`, ...)"),
      choice<&Policy::fp32_ops>("fp32_ops", fp32_op_names,
                                "ops that compute and output binary32 whatever the points say"),
  });
}
constexpr auto policy_fields = policy_fields_of(std::make_index_sequence<rounding_points.size()>(),
                                                std::make_index_sequence<block_points.size()>());

constexpr auto loss_scale_fields = std::to_array<ConfigField<LossScaling>>({
    enum_key<&LossScaling::mode, loss_scale_mode_names>("mode", "`none`, `static` or `dynamic`"),
    key<&LossScaling::initial_scale>("initial", "", "initial (static: the) loss scale", finite_above(0)),
    key<&LossScaling::growth_factor>("growth_factor", "", "dynamic: factor after `growth_interval` clean steps",
                                     finite_at_least(1)),
    key<&LossScaling::backoff_factor>("backoff_factor", "", "dynamic: factor on a step with inf/NaN gradients",
                                      above_at_most(0, 1)),
    key<&LossScaling::growth_interval>("growth_interval", "steps", "dynamic: clean steps before growing",
                                       at_least(1)),
    key<&LossScaling::hysteresis>("hysteresis", "steps",
                                  "dynamic: overflowing steps tolerated before backing off", at_least(1)),
    key<&LossScaling::min_scale>("min", "", "dynamic: lower bound of the scale (0: none)", finite_at_least(0)),
    key<&LossScaling::max_scale>("max", "", "dynamic: upper bound of the scale (0: none)", finite_at_least(0)),
});

constexpr auto delayed_scaling_fields = std::to_array<ConfigField<DelayedScaling>>({
    key<&DelayedScaling::history>("history", "steps", "amax history length of scaled points", at_least(1)),
    key<&DelayedScaling::margin>("margin", "binades", "scaled points: the scale is divided by 2^margin",
                                 between(0, 64)),
});

// Every member is a key, or a section of its own (named beside the assert).
template <typename S, std::size_t N>
constexpr bool names_distinct(const std::array<ConfigField<S>, N>& fields) {
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (fields[i].name == fields[j].name) return false;
  return true;
}
static_assert(names_distinct(top_fields) && names_distinct(data_fields) && names_distinct(model_fields) &&
              names_distinct(train_fields) && names_distinct(loss_fields) && names_distinct(optimizer_fields) &&
              names_distinct(schedule_fields) && names_distinct(policy_fields) &&
              names_distinct(loss_scale_fields) && names_distinct(delayed_scaling_fields));
static_assert(top_fields.size() + 6 == member_count_v<ExperimentConfig>,  // + data, model, train, optimizer, schedule, policies
              "every ExperimentConfig member needs a line in top_fields");
static_assert(data_fields.size() == member_count_v<DataSpec>, "every DataSpec member needs a line in data_fields");
static_assert(model_fields.size() == member_count_v<ModelSpec>, "every ModelSpec member needs a line in model_fields");
static_assert(train_fields.size() + 1 == member_count_v<TrainSpec>,  // + loss: [loss]
              "every TrainSpec member needs a line in train_fields");
static_assert(loss_fields.size() == member_count_v<LossDefinition>, "every LossDefinition member needs a line");
static_assert(optimizer_fields.size() == member_count_v<OptimizerSpec>, "every OptimizerSpec member needs a line");
static_assert(schedule_fields.size() == member_count_v<ScheduleSpec>, "every ScheduleSpec member needs a line");
static_assert(policy_fields.size() + 3 == member_count_v<Policy>,  // + name, [loss_scale], [delayed_scaling]
              "every Policy member needs a line in policy_fields");
static_assert(loss_scale_fields.size() == member_count_v<LossScaling>, "every LossScaling member needs a line");
static_assert(delayed_scaling_fields.size() == member_count_v<DelayedScaling>,
              "every DelayedScaling member needs a line");

// --- Reading ----------------------------------------------------------------------------

Policy read_policy(const std::string& name, const toml::table* table) {
  Section s(table, "policies." + name);
  std::string base = preset_policy(name) ? name : "fp32";
  if (const toml::node* node = s.take("base")) {
    const auto text = node->value_exact<std::string>();
    if (!text) s.fail_type("base", "a string");
    base = *text;
  }
  auto policy = preset_policy(base);
  if (!policy)
    throw ConfigError("policies." + name + ".base = \"" + base + "\" is not a preset; expected one of: " +
                      join(preset_policy_names()));
  Policy p = *policy;
  p.name = name;
  read_fields(s, policy_fields, p);
  // Every GEMM's operand pair, as the layers form them.
  try {
    gemm_model(p, p.activations, p.weights);
    gemm_model(p, p.gradient_operands, p.activations);
    gemm_model(p, p.gradient_operands, p.weights);
    check_block_points(p);
    internal_rounding(p, &Policy::softmax_internals, "softmax");
    internal_rounding(p, &Policy::norm_statistics, "layer_norm");
    internal_rounding(p, &Policy::loss_internals, "softmax_cross_entropy");
  } catch (const std::invalid_argument& e) {
    throw ConfigError("policies." + name + ": " + e.what());
  }
  if (p.master_weights && !p.weight_storage.is_identity())
    throw ConfigError("policies." + name + ": weight_storage must be binary32 when master_weights = true");

  Section ls(s.subtable("loss_scale"), "policies." + name + ".loss_scale");
  read_fields(ls, loss_scale_fields, p.loss_scaling);
  ls.check_unknown();
  const LossScaling& l = p.loss_scaling;
  if (l.min_scale > 0 && l.max_scale > 0 && l.min_scale > l.max_scale)
    throw ConfigError(inverted_bounds_message("policies." + name + ".loss_scale", l.min_scale, l.max_scale));
  Section ds(s.subtable("delayed_scaling"), "policies." + name + ".delayed_scaling");
  read_fields(ds, delayed_scaling_fields, p.delayed_scaling);
  ds.check_unknown();
  s.check_unknown();
  return p;
}

// "a.b.c=value": value is TOML (2, 0.5, true, "x", [..]) or else a bare string.
void apply_override(toml::table& root, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("override '" + text + "' is not key=value (example: train.epochs=2)");
  const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};
  }
  toml::table* table = &root;
  std::size_t start = 0;
  for (;;) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw ConfigError("override '" + text + "' has an empty key part");
    if (dot == std::string::npos) {
      table->insert_or_assign(part, *parsed.get("v"));
      return;
    }
    toml::node* next = table->get(part);
    if (!next) {
      table->insert(part, toml::table{});
      next = table->get(part);
    }
    if (!next->is_table()) throw ConfigError("override '" + text + "': '" + part + "' is not a table");
    table = next->as_table();
    start = dot + 1;
  }
}

}  // namespace

ExperimentConfig parse_config(const std::string& text, const std::string& source,
                              const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    throw ConfigError(msg.str());
  }
  for (const auto& o : overrides) apply_override(root, o);

  ExperimentConfig c;
  Section top(&root, "");
  read_fields(top, top_fields, c);
  const auto section = [&top](std::string_view name, const auto& fields, auto& out) {
    Section s(top.subtable(name), std::string(name));
    read_fields(s, fields, out);
    s.check_unknown();
  };
  section("data", data_fields, c.data);
  section("model", model_fields, c.model);
  section("train", train_fields, c.train);
  section("loss", loss_fields, c.train.loss);
  section("optimizer", optimizer_fields, c.optimizer);
  section("schedule", schedule_fields, c.schedule);
  if (c.train.shadow_interval > 0 && c.train.loss.z_loss > 0)
    throw ConfigError("train.shadow_interval = " + std::to_string(c.train.shadow_interval) + " with loss.z_loss = " +
                      number_text(c.train.loss.z_loss) +
                      ": the FP32 shadow's loss gradient is the softmax cross-entropy's alone, without a z-loss "
                      "term; set loss.z_loss = 0 or train.shadow_interval = 0");

  const toml::table* policies = top.subtable("policies");
  std::vector<std::string> custom;
  if (policies)
    for (const auto& [key, node] : *policies) {
      if (!node.is_table()) throw ConfigError("policies." + std::string(key.str()) + " must be a table");
      const std::string name(key.str());
      c.policies[name] = read_policy(name, node.as_table());
      custom.push_back(name);
    }
  for (const auto& arm : c.arms) {
    if (c.policies.count(arm)) continue;
    auto p = preset_policy(arm);
    if (!p) {
      std::vector<std::string> known = preset_policy_names();
      known.insert(known.end(), custom.begin(), custom.end());
      throw ConfigError("arms: unknown policy '" + arm + "'; expected a preset or a [policies." + arm +
                        "] table. Known: " + join(known));
    }
    c.policies[arm] = *p;
  }
  top.check_unknown({"sweep", "smoke"});  // read by parse_sweep (sweep.hpp)
  return c;
}

ExperimentConfig load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read config file '" + file.string() + "': check the path");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), file.string(), overrides);
}

std::string ExperimentConfig::to_toml() const {
  toml::table t = write_fields(top_fields, *this);
  t.insert("data", write_fields(data_fields, data));
  t.insert("model", write_fields(model_fields, model));
  t.insert("train", write_fields(train_fields, train));
  t.insert("loss", write_fields(loss_fields, train.loss));
  t.insert("optimizer", write_fields(optimizer_fields, optimizer));
  t.insert("schedule", write_fields(schedule_fields, schedule));
  toml::table ps;
  for (const auto& [pname, p] : policies) {
    toml::table table = write_fields(policy_fields, p);
    table.insert("loss_scale", write_fields(loss_scale_fields, p.loss_scaling));
    table.insert("delayed_scaling", write_fields(delayed_scaling_fields, p.delayed_scaling));
    ps.insert(pname, std::move(table));
  }
  t.insert("policies", ps);
  std::ostringstream out;
  out << t << "\n";
  return out.str();
}

// --- Docs ---------------------------------------------------------------------------------

namespace {

// The shortest decimal that reads back as v, with a point (TOML's float).
std::string shortest_text(double v) {
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, v).ptr;
  std::string text(buffer, end);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

template <typename S, std::size_t N>
void describe_fields(std::vector<ConfigKey>& out, const std::string& prefix,
                     const std::array<ConfigField<S>, N>& fields, const S& defaults) {
  const toml::table values = write_fields(fields, defaults);
  for (const auto& f : fields) {
    std::ostringstream value;
    if (const auto number = values.get(f.name)->template value_exact<double>())
      value << shortest_text(*number);  // toml++ writes 0.05 as 0.050000000000000003
    else
      values.get(f.name)->visit([&value](const auto& node) { value << node; });
    std::string allowed;
    if (!f.choices.empty()) allowed = (f.type.starts_with("array") ? "each one of: " : "one of: ") + join(f.choices);
    if (f.limits.any()) allowed = (f.type.starts_with("array") ? std::string("each ") : std::string()) +
                                  f.limits.text();
    if (f.distinct) allowed += allowed.empty() ? "not empty, no value twice" : "; not empty, no value twice";
    out.push_back({prefix + std::string(f.name), std::string(f.type), value.str(), std::string(f.unit), allowed,
                   std::string(f.doc)});
  }
}

}  // namespace

std::vector<ConfigKey> config_keys() {
  const ExperimentConfig c;
  std::vector<ConfigKey> keys;
  describe_fields(keys, "", top_fields, c);
  describe_fields(keys, "data.", data_fields, c.data);
  describe_fields(keys, "model.", model_fields, c.model);
  describe_fields(keys, "train.", train_fields, c.train);
  describe_fields(keys, "loss.", loss_fields, c.train.loss);
  describe_fields(keys, "optimizer.", optimizer_fields, c.optimizer);
  describe_fields(keys, "schedule.", schedule_fields, c.schedule);
  keys.push_back({"policies.NAME.base", "string", "NAME if a preset, else \"fp32\"", "",
                  "one of: " + join(preset_policy_names()),
                  "the preset whose settings the keys below change (defaults shown: `fp32`'s)"});
  const Policy fp32 = *preset_policy("fp32");
  describe_fields(keys, "policies.NAME.", policy_fields, fp32);
  describe_fields(keys, "policies.NAME.loss_scale.", loss_scale_fields, fp32.loss_scaling);
  describe_fields(keys, "policies.NAME.delayed_scaling.", delayed_scaling_fields, fp32.delayed_scaling);
  return keys;
}

namespace {

// The keys of `fields` other than rounding points, valued as the config writes them.
template <typename S, std::size_t N>
void add_policy_attributes(std::vector<PolicyAttribute>& out, const std::string& prefix,
                           const std::array<ConfigField<S>, N>& fields, const S& in) {
  for (const auto& f : fields) {
    if (f.type == type_name<RoundingPoint>()) continue;  // split into parts by policy_attributes
    toml::table t;
    f.write(t, f, in);
    const toml::node& node = *t.get(f.name);
    std::string doc(f.doc);
    if (!f.unit.empty()) doc += " (" + std::string(f.unit) + ")";
    if (!f.choices.empty() && doc.find("`" + std::string(f.choices.front()) + "`") == std::string::npos) {
      doc += "; each one of:";
      for (const auto c : f.choices) doc += std::string(c == f.choices.front() ? " `" : ", `") + std::string(c) + "`";
    }
    PolicyAttribute a{prefix + std::string(f.name), prefix + std::string(f.name), {}, doc};
    if (auto b = node.value_exact<bool>()) a.value = *b;
    else if (auto i = node.value_exact<std::int64_t>()) a.value = static_cast<int>(*i);
    else if (auto d = node.value_exact<double>()) a.value = *d;
    else if (auto text = node.value_exact<std::string>()) a.value = *text;
    else if (const toml::array* array = node.as_array()) {
      std::vector<std::string> items;
      for (const toml::node& item : *array) items.push_back(*item.value_exact<std::string>());
      a.value = std::move(items);
    }
    out.push_back(std::move(a));
  }
}

}  // namespace

std::vector<PolicyAttribute> policy_attributes(const Policy& p) {
  std::vector<PolicyAttribute> out;
  out.push_back({"name", "name", p.name, "the policy's name (preset or config table)"});
  std::vector<std::string> points;
  for (const auto& point : rounding_points) points.emplace_back(point.name);
  out.push_back({"points", "points", points,
                 "the rounding points, in the order a training step meets them: " + join(points)});
  for (const auto& [name, member, doc] : rounding_points) {
    const RoundingPoint& point = p.*member;
    const std::string key(name);
    auto add = [&](std::string_view part, decltype(PolicyAttribute::value) value, std::string doc_text) {
      out.push_back({key + "." + std::string(part), "<point>." + std::string(part), std::move(value),
                     std::move(doc_text)});
    };
    add("format", point.format.name(),
        "the point's format, as the config spells it: `binary32`, `binary16`, `bfloat16`, `tf32`, `e4m3`, `e5m2`, "
        "`e2m1`, `e3m2`, `e2m3`, or `eXmY[:ftz][:sat][:fn|:finite]`");
    add("exponent_bits", point.format.exponent_bits, "exponent bits of that format");
    add("mantissa_bits", point.format.mantissa_bits, "trailing significand bits of that format");
    add("rounding", std::string(to_string(point.rounding.mode)),
        "rounding mode: `nearest-even`, `nearest-away`, `toward-zero`, `toward-positive`, `toward-negative`, "
        "`odd`, `stochastic`");
    add("random_bits", point.rounding.random_bits,
        "random bits of stochastic rounding (1 ... 32; unused by the other modes)");
    add("scaled", point.delayed_scaling, "the tensor is scaled per tensor (delayed scaling) before rounding");
  }
  add_policy_attributes(out, "", policy_fields, p);
  add_policy_attributes(out, "loss_scale.", loss_scale_fields, p.loss_scaling);
  add_policy_attributes(out, "delayed_scaling.", delayed_scaling_fields, p.delayed_scaling);
  return out;
}

std::string config_field::closest_config_key(const std::string& unknown) {
  // Policies' keys are documented as policies.NAME.KEY.
  const auto generic = [](std::string key) {
    if (key.starts_with("policies.")) {
      const auto dot = key.find('.', 9);
      if (dot != std::string::npos) key = "policies.NAME" + key.substr(dot);
    }
    return key;
  };
  const auto last = [](const std::string& key) { return key.substr(key.rfind('.') + 1); };
  const auto distance = [](const std::string& a, const std::string& b) {  // Levenshtein
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  const std::string key = generic(unknown);
  // As the user wrote it: policies.NAME.weights -> policies.p.weights.
  const auto specific = [&](std::string known) {
    if (known.starts_with("policies.NAME") && key.starts_with("policies.NAME"))
      known = unknown.substr(0, unknown.find('.', 9)) + known.substr(13);
    return known;
  };
  std::vector<std::string> candidates;
  for (const ConfigKey& k : config_keys()) {
    candidates.push_back(k.key);
    for (auto dot = k.key.find('.'); dot != std::string::npos; dot = k.key.find('.', dot + 1))
      candidates.push_back(k.key.substr(0, dot));  // its tables: optimiser -> optimizer
  }
  std::string best;
  std::size_t best_distance = 3;  // at most two edits
  for (const std::string& k : candidates) {
    if (k.find('.') != std::string::npos && last(k) == last(key) &&
        k.starts_with("policies.") == key.starts_with("policies."))
      return specific(k);
    if (const std::size_t d = distance(key, k); d < best_distance) best = k, best_distance = d;
  }
  return best.empty() ? best : specific(best);
}

std::string config_keys_markdown() {
  std::vector<std::array<std::string, 6>> rows;
  for (const ConfigKey& k : config_keys())
    rows.push_back({"`" + k.key + "`", k.type, "`" + k.default_value + "`", k.unit, k.allowed, k.doc});
  return markdown_table<6>({"key", "type", "default", "unit", "allowed", "meaning"}, rows);
}

std::string data_directory(const DataSpec& data) {
  if (!data.path.empty()) return data.path;
  return data.dataset == "fortunes" ? default_fortunes_dir : default_fashion_mnist_dir;
}

}  // namespace mpsim::core
