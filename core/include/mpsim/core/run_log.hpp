#pragma once
// What a training run reports, and the HDF5 file that keeps it.
// The schema is documented in docs/hdf5-schema.md.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mpsim/core/policy.hpp"
#include "mpsim/core/stats.hpp"

namespace mpsim::core {

struct StepRecord {
  std::int64_t step = 0;  // 0-based optimiser step (skipped steps included)
  double loss = 0.0;      // mean training loss of the batch (unscaled)
  double loss_scale = 1.0;
  bool found_inf = false;  // some gradient was inf or NaN
  bool skipped = false;    // the optimiser step was skipped
  double learning_rate = 0.0;
  double grad_norm = 0.0;  // L2 norm of the unscaled gradients (inf/NaN when found_inf)
};

struct EvalRecord {
  std::int64_t step = 0;  // steps done when evaluated
  double epoch = 0.0;
  double train_loss = 0.0, train_accuracy = 0.0;  // mean over the epoch's batches so far
  double test_loss = 0.0, test_accuracy = 0.0;
};

// Per layer, per TensorKind.
using LayerStats = std::vector<std::array<TensorStats, tensor_kind_count>>;

struct ArmInfo {
  std::string name;
  std::string backend;
  std::string policy;              // preset or config name
  std::string policy_description;  // describe(policy)
  std::uint64_t seed = 0;
  std::vector<std::string> layers;  // layer names, in order
  std::string sweep;                // the sweep point ("lr=0.1,initial=8"); empty outside a sweep
  Policy resolved_policy;           // the policy as the arm runs it, stored field by field (/arms/<arm>/policy/)
};

class ArmLog {
 public:
  virtual ~ArmLog() = default;
  virtual void step(const StepRecord& record) = 0;
  virtual void stats(std::int64_t step, const LayerStats& stats) = 0;
  virtual void eval(const EvalRecord& record) = 0;
  // How the arm ended: "completed", or "stopped: <reason>".
  virtual void finish(const std::string& status) = 0;
};

struct ExperimentInfo {
  std::string config_toml;  // the fully resolved config
  std::string mpsim_version, git_revision, start_time, host;
  std::uint64_t seed = 0;
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
  virtual void flush() = 0;
};

// One HDF5 file per experiment. Creates (never overwrites: throws if the file
// exists) and writes buffered, flushing every `flush_interval` steps of an arm,
// on flush() and in the destructor.
std::unique_ptr<ExperimentLog> create_hdf5_log(const std::filesystem::path& path, const ExperimentInfo& info,
                                               int flush_interval);

// Flushes every open HDF5 log; async-signal paths call this from a watcher
// thread, see install_flush_on_signals().
void flush_all_logs();
// SIGINT/SIGTERM: flush every open log, then exit with 128+signal.
void install_flush_on_signals();

}  // namespace mpsim::core
