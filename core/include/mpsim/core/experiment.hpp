#pragma once
// The experiment engine: plans the arms of a sweep, trains them (one after
// another in this process, or several at once in child processes), gathers
// them into one HDF5 log beside the resolved config, compares arms across
// backends and formats the summary table. `mpsim run` only parses its
// arguments and prints; tests (and later bindings or an MPI launcher) call the
// same functions.
//
// Parallel arms: the engine starts, watches and gathers the child processes
// (each writes its own log and an arm result file, arm_result_file.hpp, which
// the engine merges), but the caller says what a child runs: child_command
// returns the argv of a process that calls run_planned_arm() for one arm. So
// core knows no command-line syntax, and another entry point (a Python
// module, an MPI rank wrapper) passes its own command. Without one, arms run
// one after another in this process.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/core/agreement.hpp"
#include "mpsim/core/sweep.hpp"
#include "mpsim/core/trainer.hpp"

namespace mpsim::core {

// The experiment cannot start as asked (a backend, the data, the output):
// thrown before the first step; the message names the problem and the fix.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One arm of the experiment, in the order every process enumerates them:
// points, then backends, seeds and policies.
struct PlannedArm {
  std::size_t point;  // index into Sweep::points
  std::string backend, policy;
  std::uint64_t seed;
};
std::vector<PlannedArm> plan_arms(const Sweep& sweep);

// What one child process of a parallel run is asked to do.
struct ChildArm {
  std::size_t index;                   // into plan_arms(sweep)
  std::vector<std::string> overrides;  // config overrides to apply after the experiment's own
  std::filesystem::path output;        // the HDF5 log it writes, this arm alone
  std::filesystem::path result;        // the arm result file it writes
  std::filesystem::path data;          // its data set, loaded once by the parent (write_data_cache)
};

struct ExperimentOptions {
  std::string output;  // the HDF5 log; empty: the config's `output`
  bool force = false;  // replace an existing log (and the config beside it)
  int jobs = 0;        // arms at once; 0: cores / train.threads (1 when train.threads is 0, all cores)
  bool handle_signals = true;  // SIGINT/SIGTERM flush the open logs and exit (install_flush_on_signals)
  // run_planned_arm: read the data set from this cache (ChildArm::data)
  // instead of loading it; empty: load it.
  std::filesystem::path data_cache;
  // The argv of a process that trains one arm (argv[0]: the program to run);
  // needed for more than one job.
  std::function<std::vector<std::string>(const ChildArm&)> child_command;
};

// One finished arm, as the summary shows it.
struct ArmRow {
  std::string name, backend, policy, sweep_point;
  std::uint64_t seed = 0;
  std::vector<std::string> layers;
  ArmResult result;  // status "failed" when its process failed
};

struct ExperimentStart {
  std::string name;  // the experiment's
  std::int64_t train_samples = 0, test_samples = 0;  // of the first point's data
  std::size_t arms = 0, points = 0;
  int jobs = 1;  // arms at once
  std::filesystem::path output;
};

// What a run reports while it goes (all calls from the calling thread).
class ExperimentObserver {
 public:
  virtual ~ExperimentObserver() = default;
  virtual void started(const ExperimentStart&) {}
  virtual void progress(const ArmInfo&, const Progress&) {}  // after every step (arms in this process)
  // An arm is done: `finished` of `total`, in the order they finish.
  virtual void arm_finished(const ArmRow&, std::size_t /*finished*/, std::size_t /*total*/) {}
};

struct ExperimentResult {
  std::vector<ArmRow> rows;  // in plan order
  // Every arm on another backend against the same policy, seed and point on the first backend.
  std::vector<Agreement> agreements;
  std::filesystem::path log, config;  // the HDF5 log and the resolved config beside it
  // Character-level text (data.dataset = "fortunes"): the losses are nats per predicted character, and the
  // summary gives each arm's test loss in bits per character too.
  bool text = false;
};

// Runs every arm of the sweep. Everything that can be wrong (backends, output,
// data) is checked before the first step (SetupError). When an arm's process
// fails, the others finish, the log keeps them and a std::runtime_error names it.
ExperimentResult run_experiment(Sweep sweep, const ExperimentOptions& options, ExperimentObserver* observer = nullptr);

// What a child process does: trains arm `index` of plan_arms(sweep) alone into
// options.output, then writes its result to `result_file` (when not empty).
ArmResult run_planned_arm(const Sweep& sweep, std::size_t index, const ExperimentOptions& options,
                          const std::filesystem::path& result_file);

// A child process calls this first: it then gets SIGTERM (and so flushes and
// ends) when its parent dies. False when the parent is already gone.
bool follow_parent_process();

// The summary table, the agreement table and where the files are, as printed.
std::string format_summary(const ExperimentResult& result);

}  // namespace mpsim::core
