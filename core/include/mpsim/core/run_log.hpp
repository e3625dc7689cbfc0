#pragma once
// What a training run reports, and the HDF5 file that keeps it.
// The schema is documented in docs/hdf5-schema.md.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "mpsim/core/fields.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/stats.hpp"

namespace mpsim::core {

// One row of /arms/<arm>/steps/ per optimiser step. Every member is a line
// of step_record_fields below, which writes, reads and documents it.
struct StepRecord {
  std::int64_t step = 0;
  double loss = 0.0;
  double loss_scale = 1.0;
  bool found_inf = false;
  bool skipped = false;
  double learning_rate = 0.0;
  double grad_norm = 0.0;
  friend bool operator==(const StepRecord&, const StepRecord&) = default;
};

// One row of /arms/<arm>/eval/ per evaluation; eval_record_fields below.
struct EvalRecord {
  std::int64_t step = 0;
  double epoch = 0.0;
  double train_loss = 0.0, train_accuracy = 0.0;
  double test_loss = 0.0, test_accuracy = 0.0;
  friend bool operator==(const EvalRecord&, const EvalRecord&) = default;
};

// One row of /arms/<arm>/shadow/ per layer with parameters, and one for the
// whole model, at every shadow step (train.shadow_interval; issue 21's shadow
// FP32): the arm's gradient g, unscaled (g / loss scale in binary64), against
// g32, the gradient that the same weights and batch give in binary32 (the
// fp32 preset, no loss scale). It measures what the arm's rounding costs at
// that step without the divergence of two trajectories. Sums in binary64
// over every element of the layer's parameters; shadow_record_fields below.
struct ShadowRecord {
  std::int64_t step = 0;
  std::int64_t layer = -1;
  double loss_fp32 = 0.0;
  double relative_error = 0.0;
  double cosine = 0.0;
  double norm_ratio = 0.0;
  double norm_fp32 = 0.0;
  std::int64_t elements = 0;
  std::int64_t nonzero_fp32 = 0;
  std::int64_t zeroed = 0;
  friend bool operator==(const ShadowRecord&, const ShadowRecord&) = default;
};

// A record's field: one 1-D dataset of its group, named as the field. The
// member's type gives the dataset's: std::int64_t int64, double float64,
// bool uint8 (0 or 1). The first field, `step`, is the group's dimension scale.
template <typename Record>
using RecordField = Field<Record, std::int64_t, double, bool>;

inline constexpr auto step_record_fields = std::to_array<RecordField<StepRecord>>({
    {"step", &StepRecord::step, "step", "dimension scale `step`: 0-based optimiser step, skipped steps included"},
    {"loss", &StepRecord::loss, "", "mean training loss of the batch, unscaled"},
    {"loss_scale", &StepRecord::loss_scale, "", "loss scale used for the step (1 without loss scaling)"},
    {"found_inf", &StepRecord::found_inf, "flag", "1 if some gradient was inf or NaN, else 0"},
    {"skipped", &StepRecord::skipped, "flag", "1 if the optimiser step was skipped, else 0"},
    {"learning_rate", &StepRecord::learning_rate, "", "learning rate of the step"},
    {"grad_norm", &StepRecord::grad_norm, "", "L2 norm of the unscaled gradients (inf or NaN when `found_inf`)"},
});

inline constexpr auto eval_record_fields = std::to_array<RecordField<EvalRecord>>({
    {"step", &EvalRecord::step, "step", "dimension scale `step`: optimiser steps done when evaluated"},
    {"epoch", &EvalRecord::epoch, "epoch", "epochs done (fractional)"},
    {"train_loss", &EvalRecord::train_loss, "", "mean training loss over the epoch's batches so far"},
    {"train_accuracy", &EvalRecord::train_accuracy, "0..1", "mean training accuracy over the epoch's batches so far"},
    {"test_loss", &EvalRecord::test_loss, "", "loss on the test set"},
    {"test_accuracy", &EvalRecord::test_accuracy, "0..1", "accuracy on the test set"},
});

inline constexpr auto shadow_record_fields = std::to_array<RecordField<ShadowRecord>>({
    {"step", &ShadowRecord::step, "step", "dimension scale `step`: the shadow step (one row per layer, repeated)"},
    {"layer", &ShadowRecord::layer, "index",
     "the layer: an index into the arm's `layer` dataset (a layer with parameters); `-1`: every parameter of the "
     "model together"},
    {"loss_fp32", &ShadowRecord::loss_fp32, "", "the shadow's mean training loss of the batch (binary32 pass)"},
    {"relative_error", &ShadowRecord::relative_error, "",
     "norm(g - g32) / norm(g32), L2 norms; NaN where g32 is all zero, inf or NaN where g is not finite (the step "
     "found inf)"},
    {"cosine", &ShadowRecord::cosine, "",
     "cosine similarity dot(g, g32) / (norm(g) norm(g32)); NaN where either is all zero"},
    {"norm_ratio", &ShadowRecord::norm_ratio, "",
     "norm(g) / norm(g32): below 1 where the arm's gradient lost magnitude"},
    {"norm_fp32", &ShadowRecord::norm_fp32, "", "norm(g32), the L2 norm of the binary32 gradient"},
    {"elements", &ShadowRecord::elements, "count", "elements of the layer's parameters"},
    {"nonzero_fp32", &ShadowRecord::nonzero_fp32, "count",
     "elements where g32 is nonzero: the denominator of `zeroed`"},
    {"zeroed", &ShadowRecord::zeroed, "count", "elements where g32 is nonzero and g is exactly zero"},
});

static_assert(describes_every_member<StepRecord>(step_record_fields),
              "every StepRecord member needs one line in step_record_fields");
static_assert(describes_every_member<EvalRecord>(eval_record_fields),
              "every EvalRecord member needs one line in eval_record_fields");
static_assert(describes_every_member<ShadowRecord>(shadow_record_fields),
              "every ShadowRecord member needs one line in shadow_record_fields");
static_assert(step_record_fields[0].name == "step" && eval_record_fields[0].name == "step" &&
                  shadow_record_fields[0].name == "step",
              "a record's first field is its step, the dimension scale of its group");

// The HDF5 type name of a record field ("int64", "float64", "uint8").
template <typename Record>
constexpr std::string_view hdf5_type_name(const RecordField<Record>& field) {
  return std::visit(
      [](auto member) -> std::string_view {
        using T = std::remove_cvref_t<decltype(std::declval<Record>().*member)>;
        if constexpr (std::is_same_v<T, bool>) return "uint8";
        else if constexpr (std::is_same_v<T, double>) return "float64";
        else return "int64";
      },
      field.member);
}

// The tables as markdown (docs/hdf5-schema.md; `mpsim docs steps|eval`).
std::string step_fields_markdown();
std::string eval_fields_markdown();
std::string shadow_fields_markdown();

// Per layer, per TensorKind.
using LayerStats = std::vector<std::array<TensorStats, tensor_kind_count>>;
// Per layer, per block-scaled GEMM operand (policy.hpp's block_points).
using LayerBlockStats = std::vector<std::array<BlockStats, gemm_operand_count>>;

struct ArmInfo {
  std::string name;
  std::string backend;
  std::string policy;              // preset or config name
  std::string policy_description;  // describe(policy)
  std::uint64_t seed = 0;
  std::vector<std::string> layers;  // layer names, in order
  std::string sweep;                // the sweep point ("lr=0.1,initial=8"); empty outside a sweep
  Policy resolved_policy;           // the policy as the arm runs it, stored field by field (/arms/<arm>/policy/)
  int threads = 1;                  // the threads it trains with (train.threads resolved)
  std::string gemm;                 // what computes its binary32 products (Backend::describe_gemm)
};

struct ExperimentInfo {
  std::string config_toml;  // the fully resolved config
  std::string mpsim_version, git_revision, start_time, host;
  std::string cpu;  // the CPU's model name (/proc/cpuinfo)
  std::uint64_t seed = 0;
};

// An attribute of the log's root group (ExperimentInfo) or of an arm's group
// (ArmInfo), one member each: std::string a variable-length UTF-8 string,
// std::uint64_t uint64, int int32. The writer (hdf5_log.cpp) and the docs
// (`mpsim docs root|arm`, docs/hdf5-schema.md) read these tables. Members
// stored otherwise (an arm's layer names, a dataset; its policy, a group)
// have a line too, with the place they go, so that every member is named.
template <typename S>
using AttributeField = Field<S, std::string, std::uint64_t, int, std::vector<std::string>, Policy>;

inline constexpr auto experiment_attribute_fields = std::to_array<AttributeField<ExperimentInfo>>({
    {"config", &ExperimentInfo::config_toml, "", "the fully resolved TOML config of the experiment"},
    {"mpsim_version", &ExperimentInfo::mpsim_version, "", "version of the mpsim that wrote the file"},
    {"git_revision", &ExperimentInfo::git_revision, "", "git revision of that build"},
    {"start_time", &ExperimentInfo::start_time, "", "when the experiment started (UTC, ISO 8601)"},
    {"host", &ExperimentInfo::host, "", "host name of the machine"},
    {"cpu", &ExperimentInfo::cpu, "", "the CPU's model name (`/proc/cpuinfo`), `unknown` where it has none"},
    {"seed", &ExperimentInfo::seed, "", "the experiment's seed"},
});

inline constexpr auto arm_attribute_fields = std::to_array<AttributeField<ArmInfo>>({
    {"name", &ArmInfo::name, "", "the arm's name (same as the group's)"},
    {"backend", &ArmInfo::backend, "", "backend that ran it (`cpu`, `cuda`, ...)"},
    {"policy", &ArmInfo::policy, "", "precision policy: preset or config name"},
    {"policy_description", &ArmInfo::policy_description, "",
     "`describe(policy)`: the policy in words, for people; programs read `policy/` below"},
    {"seed", &ArmInfo::seed, "", "the arm's seed"},
    {"layer", &ArmInfo::layers, "", "the dataset `layer` below"},
    {"sweep", &ArmInfo::sweep, "",
     "the sweep point of this arm (`lr=0.1,initial=8`, see docs/configs.md); empty outside a sweep"},
    {"policy/", &ArmInfo::resolved_policy, "", "the group `policy/` below"},
    {"threads", &ArmInfo::threads, "", "the threads the arm trained with (`train.threads`, `0` resolved to the cores)"},
    {"gemm", &ArmInfo::gemm, "",
     "what computed its binary32 products: `ordered (<SIMD target>)`, mpsim's fixed-order GEMM (the same bits on "
     "every CPU and thread count); `blas (<OpenBLAS build>, <kernel> kernels)` with `train.gemm = \"blas\"`; "
     "`cuBLAS, attention kernels` or `cuBLAS, attention cublas` on the GPU (`train.attention`)"},
});

static_assert(describes_every_member<ExperimentInfo>(experiment_attribute_fields),
              "every ExperimentInfo member needs one line in experiment_attribute_fields");
static_assert(describes_every_member<ArmInfo>(arm_attribute_fields),
              "every ArmInfo member needs one line in arm_attribute_fields");

// The attribute tables as markdown, with the attributes the log writes
// besides them (`schema_version`, `status`): docs/hdf5-schema.md.
std::string root_attributes_markdown();
std::string arm_attributes_markdown();
// The attributes of /arms/<arm>/policy/ (config.hpp's policy_attributes).
std::string policy_attributes_markdown();

class ArmLog {
 public:
  virtual ~ArmLog() = default;
  virtual void step(const StepRecord& record) = 0;
  // A logging step's statistics, and its logit maxima per layer (NaN where
  // a layer has no logits: StepContext::logit_max).
  virtual void stats(std::int64_t step, const LayerStats& stats, std::span<const double> logit_max) = 0;
  // Arms whose policy uses block formats (uses_block_formats), at the same steps.
  virtual void block_stats(std::int64_t /*step*/, const LayerBlockStats& /*stats*/) {}
  virtual void eval(const EvalRecord& record) = 0;
  // A shadow step's rows (train.shadow_interval > 0).
  virtual void shadow(std::span<const ShadowRecord> /*records*/) {}
  // How the arm ended: "completed", or "stopped: <reason>".
  virtual void finish(const std::string& status) = 0;
};

// A log that could not be written (a full disk, a file size limit): what()
// names the file, the arms it stopped and what the file held at its last flush.
class LogWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};



struct Agreement;  // agreement.hpp

class ExperimentLog {
 public:
  virtual ~ExperimentLog() = default;
  virtual ArmLog& add_arm(const ArmInfo& info) = 0;  // creates every dataset of the arm up front
  // Keeps the comparison of two finished arms under /agreement (written at once).
  virtual void add_agreement(const Agreement& agreement) = 0;
  // Copies the finished arm `name` from another log file of this schema
  // (a child process's, when arms run in parallel) into this one, whole.
  virtual void copy_arm(const std::filesystem::path& file, const std::string& name) = 0;
  // What a stopped run says beside this file's arms about arms being trained
  // into files of their own (parallel children): which, and where.
  virtual void set_arms_elsewhere(std::string note) = 0;
  virtual void flush() = 0;
};

// Whether `name` can name an arm's group in the log: not empty, not "." or
// "..", no '/' (HDF5's path separator).
bool usable_arm_name(std::string_view name);

// One HDF5 file per experiment. Creates (never overwrites: throws if the file
// exists) and writes buffered, flushing every `flush_interval` steps of an arm,
// on flush() and in the destructor.
std::unique_ptr<ExperimentLog> create_hdf5_log(const std::filesystem::path& path, const ExperimentInfo& info,
                                               int flush_interval);

// An arm's records read back from such a file (through the same tables as
// they were written), in file order. Throws std::runtime_error naming the
// file, arm and dataset at fault.
std::vector<StepRecord> read_step_records(const std::filesystem::path& file, const std::string& arm);
std::vector<EvalRecord> read_eval_records(const std::filesystem::path& file, const std::string& arm);
std::vector<ShadowRecord> read_shadow_records(const std::filesystem::path& file, const std::string& arm);

// Flushes every open HDF5 log; async-signal paths call this from a watcher
// thread, see install_flush_on_signals().
void flush_all_logs();
// SIGINT/SIGTERM: flush every open log, then exit with 128+signal.
void install_flush_on_signals();

}  // namespace mpsim::core
