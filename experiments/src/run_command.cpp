// mpsim run CONFIG.toml [key=value ...]: trains every arm of an experiment
// and logs it to one HDF5 file. The experiment engine (core/experiment.hpp)
// does the work; this parses the arguments, shows progress and prints.
#include "run_command.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>

#include "mpsim/core/config.hpp"
#include "mpsim/core/experiment.hpp"
#include "mpsim/core/sweep.hpp"
#include "usage_error.hpp"

namespace mpsim::cli {
namespace {

using namespace mpsim::core;

struct RunOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string output;
  bool force = false;
  bool quiet = false;
  bool smoke = false;
  int jobs = 0;  // arms at once, each in its own process; 0: cores / threads per arm
  // A child process of a parallel run: trains arm `arm_index` of the plan
  // alone into `output` and writes its result to `result_file`.
  int arm_index = -1;
  std::string result_file;
  std::string data_cache;  // the data set as the parent loaded it
};

Sweep load(const RunOptions& o) {
  try {
    return load_sweep(o.config, o.overrides, o.smoke);
  } catch (const ConfigError& e) {
    throw UsageError(std::string("config: ") + e.what());
  }
}

// Progress on stderr: a line per arm that rewrites itself on a terminal (ten
// plain lines per arm otherwise); with parallel arms, a line per finished arm.
class ProgressPrinter : public ExperimentObserver {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), terminal_(isatty(STDERR_FILENO) != 0) {}

  void started(const ExperimentStart& s) override {
    parallel_ = s.jobs > 1;
    if (quiet_) return;
    fmt::print(stderr, "mpsim run {}: {} train / {} test samples, {} arm(s){}{}, writing {}\n", s.name,
               s.train_samples, s.test_samples, s.arms,
               s.points > 1 ? fmt::format(" over {} sweep points", s.points) : "",
               s.jobs > 1 ? fmt::format(", {} at a time", s.jobs) : "", s.output.string());
  }

  void progress(const ArmInfo& arm, const Progress& p) override {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    const std::string acc = std::isnan(p.test_accuracy) ? "  -  " : fmt::format("{:5.1f}%", 100 * p.test_accuracy);
    const std::string line = fmt::format("{:<12} step {:>6}/{:<6} loss {:8.4f}  scale {:>8g}  test acc {}", arm.name,
                                         p.step, p.total_steps, p.loss, p.loss_scale, acc);
    if (terminal_) {
      if (arm.name != arm_) arm_ = arm.name, arm_start_ = now;
      if (now - last_ < std::chrono::milliseconds(100) && p.step != p.total_steps) return;
      fmt::print(stderr, "\r{} {}\x1b[K", bar(p, now), line);
      if (p.step == p.total_steps) fmt::print(stderr, "\n");
    } else {
      // Plain periodic lines: about ten per arm, and the last.
      const std::int64_t every = std::max<std::int64_t>(1, p.total_steps / 10);
      if (p.step % every != 0 && p.step != p.total_steps) return;
      fmt::print(stderr, "{}\n", line);
    }
    last_ = now;
  }

  void arm_finished(const ArmRow& row, std::size_t finished, std::size_t total) override {
    if (quiet_) return;
    const ArmResult& r = row.result;
    if (parallel_)
      fmt::print(stderr, "[{}/{}] {}: test acc {:.2f}%, {:.1f} s{}\n", finished, total, row.name,
                 100 * r.test_accuracy, r.wall_seconds, r.status == "completed" ? "" : ", " + r.status);
    else if (r.status != "completed")
      fmt::print(stderr, "\n{}: {}\n", row.name, r.status);
  }

 private:
  // [#######.....] 58% ETA 0:41: the share of the arm's steps done and the time
  // left at the arm's mean pace so far.
  std::string bar(const Progress& p, std::chrono::steady_clock::time_point now) const {
    constexpr int width = 20;
    const double done = p.total_steps > 0 ? static_cast<double>(p.step) / static_cast<double>(p.total_steps) : 1.0;
    const int filled = static_cast<int>(done * width);
    const double elapsed = std::chrono::duration<double>(now - arm_start_).count();
    std::string eta = "--:--";
    if (p.step > 0) {
      const auto left = static_cast<long>(elapsed / static_cast<double>(p.step) * static_cast<double>(p.total_steps - p.step));
      eta = fmt::format("{}:{:02}", left / 60, left % 60);
    }
    return fmt::format("[{}{}] {:3.0f}% ETA {:>5}", std::string(filled, '#'), std::string(width - filled, '.'),
                       100 * done, eta);
  }

  bool quiet_, terminal_, parallel_ = false;
  std::chrono::steady_clock::time_point last_{}, arm_start_{};
  std::string arm_;
};

// A child of a parallel run is this program again, asked for one arm.
std::vector<std::string> child_command(const RunOptions& o, const ChildArm& child) {
  std::vector<std::string> args{"/proc/self/exe", "run", o.config};
  args.insert(args.end(), o.overrides.begin(), o.overrides.end());
  args.insert(args.end(), child.overrides.begin(), child.overrides.end());
  if (o.smoke) args.push_back("--smoke");
  for (const std::string& a : {std::string("--quiet"), std::string("--force"), std::string("-o"), child.output.string(),
                               std::string("--arm-index"), std::to_string(child.index), std::string("--result"),
                               child.result.string(), std::string("--data-cache"), child.data.string()})
    args.push_back(a);
  return args;
}

// A child of a parallel run: one arm into its own file (the parent copies it).
int run_child(const RunOptions& o) {
  // A child must not outlive its parent (killed, interrupted): it then gets
  // SIGTERM, flushes its own file and ends like any interrupted run.
  if (!follow_parent_process()) return 1;
  const Sweep sweep = load(o);
  const std::size_t arms = plan_arms(sweep).size();
  if (static_cast<std::size_t>(o.arm_index) >= arms)
    throw UsageError(fmt::format("--arm-index {} is outside the plan's {} arms", o.arm_index, arms));
  ExperimentOptions options;
  options.output = o.output;
  options.data_cache = o.data_cache;
  run_planned_arm(sweep, static_cast<std::size_t>(o.arm_index), options, o.result_file);
  return 0;
}

int run(const RunOptions& o) {
  if (o.arm_index >= 0) return run_child(o);
  const Sweep sweep = load(o);
  if (o.jobs < 0) throw UsageError(fmt::format("--jobs {} must be >= 0 (0: as many as the cores allow)", o.jobs));
  ExperimentOptions options;
  options.output = o.output;
  options.force = o.force;
  options.jobs = o.jobs;
  options.child_command = [&o](const ChildArm& child) { return child_command(o, child); };
  ProgressPrinter printer(o.quiet);
  const ExperimentResult result = run_experiment(sweep, options, &printer);
  fmt::print("{}", format_summary(result));
  return 0;
}

// The config keys for --help, from the config's field tables: one line each.
std::string config_keys_help() {
  std::string text = "Config keys (every one, with its meaning: docs/configs.md or `mpsim docs configs`):\n";
  for (const ConfigKey& k : config_keys())
    text += fmt::format("  {:<46} {}{}\n", k.key, k.type, k.allowed.empty() ? "" : ", " + k.allowed);
  return text;
}

}  // namespace

void add_run_command(CLI::App& app, std::function<int()>& action) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Train every arm of an experiment and log it to HDF5");
  cmd->add_option("config", options->config, "Experiment config (TOML), e.g. experiments/configs/default.toml")
      ->required();
  cmd->add_option("overrides", options->overrides,
                  "Dotted overrides: train.epochs=2 arms='[\"fp32\"]'; several values sweep: optimizer.lr=0.01,0.1");
  CLI::Option* output =
      cmd->add_option("-o,--output", options->output, "HDF5 file to write (overrides the config's output)");
  cmd->add_flag("-f,--force", options->force, "Overwrite an existing output file");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress lines");
  cmd->add_flag("--smoke", options->smoke, "Apply the config's [smoke] overrides (a small, fast run)");
  cmd->add_option("-j,--jobs", options->jobs,
                  "Arms trained at once, each in its own process (default: cores / train.threads; 1 when "
                  "train.threads is 0, all cores)");
  // Internal: how a parallel run starts its child processes.
  cmd->add_option("--arm-index", options->arm_index)->group("");
  cmd->add_option("--result", options->result_file)->group("");
  cmd->add_option("--data-cache", options->data_cache)->group("");
  cmd->footer(config_keys_help());
  cmd->callback([&action, options, output] {
    // An empty -o (an unset shell variable) would fall back to the config's output: a file not asked for.
    if (output->count() > 0 && options->output.empty())
      throw UsageError("-o is empty: give the HDF5 file to write, or leave -o out for the config's output");
    action = [options] { return run(*options); };
  });
}

}  // namespace mpsim::cli
