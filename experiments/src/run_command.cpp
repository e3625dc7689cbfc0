// mpsim run CONFIG.toml [key=value ...]: trains every arm of an experiment
// and logs it to one HDF5 file.
#include "run_command.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "mpsim/core/agreement.hpp"
#include "mpsim/core/config.hpp"
#include "mpsim/core/data.hpp"
#include "mpsim/core/run_log.hpp"
#include "mpsim/core/sweep.hpp"
#include "mpsim/core/trainer.hpp"
#include "usage_error.hpp"

namespace mpsim::cli {
namespace {

namespace fs = std::filesystem;
using namespace mpsim::core;

struct RunOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string output;
  bool force = false;
  bool quiet = false;
  bool smoke = false;
};

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return text;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// What decides the data an arm trains on, so points of a sweep share one load.
std::string data_key(const ExperimentConfig& c) {
  const DataSpec& d = c.data;
  return fmt::format("{}|{}|{}|{}|{}|{}|{}", d.dataset, d.path, d.train_limit, d.test_limit, d.synthetic_train,
                     d.synthetic_test, d.dataset == "synthetic" ? c.seeds.front() : 0);
}

TrainTest load_data(const ExperimentConfig& c) {
  if (c.data.dataset == "synthetic")
    return make_synthetic(c.seeds.front(), c.data.synthetic_train, c.data.synthetic_test);
  try {
    return load_fashion_mnist(c.data.path, c.data.train_limit, c.data.test_limit);
  } catch (const DataError& e) {
    throw UsageError(std::string("data: ") + e.what());
  }
}

// A file beside the log that keeps the resolved config: runs/x.h5 -> runs/x.toml.
fs::path config_path_for(const fs::path& output) { return fs::path(output).replace_extension(".toml"); }

void check_output(const fs::path& output, bool force) {
  for (const fs::path& p : {output, config_path_for(output)}) {
    if (fs::exists(p) && !force)
      throw UsageError(fmt::format("output '{}' exists; pass --force to overwrite it, or set output=PATH", p.string()));
  }
  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || access(dir.c_str(), W_OK) != 0)
    throw UsageError(fmt::format("output directory '{}' is not writable; choose another with output=PATH",
                                 dir.string()));
}

std::string arm_name(const ExperimentConfig& c, const std::string& backend, const std::string& policy,
                     std::uint64_t seed, const std::string& sweep_point) {
  std::string name = policy;
  if (c.backends.size() > 1) name = backend + "." + name;
  if (c.seeds.size() > 1) name += ".seed" + std::to_string(seed);
  if (!sweep_point.empty()) name += "@" + sweep_point;
  return name;
}

class ProgressLine {
 public:
  ProgressLine(bool quiet) : quiet_(quiet), terminal_(isatty(STDERR_FILENO) != 0) {}
  void update(const std::string& arm, const Progress& p) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    const std::string acc = std::isnan(p.test_accuracy) ? "  -  " : fmt::format("{:5.1f}%", 100 * p.test_accuracy);
    const std::string line = fmt::format("{:<12} step {:>6}/{:<6} loss {:8.4f}  scale {:>8g}  test acc {}", arm,
                                         p.step, p.total_steps, p.loss, p.loss_scale, acc);
    if (terminal_) {
      if (now - last_ < std::chrono::milliseconds(100) && p.step != p.total_steps) return;
      fmt::print(stderr, "\r{}\x1b[K", line);
      if (p.step == p.total_steps) fmt::print(stderr, "\n");
    } else {
      // Plain periodic lines: about ten per arm, and the last.
      const std::int64_t every = std::max<std::int64_t>(1, p.total_steps / 10);
      if (p.step % every != 0 && p.step != p.total_steps) return;
      fmt::print(stderr, "{}\n", line);
    }
    last_ = now;
  }

 private:
  bool quiet_, terminal_;
  std::chrono::steady_clock::time_point last_{};
};

int run(const RunOptions& o) {
  Sweep sweep;
  try {
    sweep = load_sweep(o.config, o.overrides, o.smoke);
  } catch (const ConfigError& e) {
    throw UsageError(std::string("config: ") + e.what());
  }
  ExperimentConfig& c = sweep.points.front().config;
  if (!o.output.empty()) c.output = o.output;
  const fs::path output(c.output);
  // Everything that can be wrong is checked before the first step.
  std::vector<std::string> backend_list;
  for (const SweepPoint& p : sweep.points)
    for (const auto& name : p.config.backends)
      if (std::find(backend_list.begin(), backend_list.end(), name) == backend_list.end()) backend_list.push_back(name);
  std::map<std::string, std::unique_ptr<Backend>> backends;
  for (const auto& name : backend_list) {
    std::unique_ptr<Backend> b;
    try {
      b = make_backend(name);
    } catch (const std::runtime_error& e) {
      throw UsageError(fmt::format("backend '{}' cannot start: {}", name, e.what()));
    }
    if (!b) {
      std::string known;
      for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
      throw UsageError(fmt::format("backend '{}' is not available in this build (available: {}); "
                                   "build with CUDA for the cuda backend",
                                   name, known));
    }
    backends.emplace(name, std::move(b));
  }
  check_output(output, o.force);
  std::map<std::string, TrainTest> data_sets;
  for (const SweepPoint& p : sweep.points)
    if (!data_sets.count(data_key(p.config))) data_sets.emplace(data_key(p.config), load_data(p.config));
  if (o.force) {
    fs::remove(output);
    fs::remove(config_path_for(output));
  }
  ExperimentInfo info;
  info.config_toml = sweep.to_toml();
  {
    std::ofstream toml(config_path_for(output));
    toml << "# resolved config of " << c.name << ", written by mpsim " << MPSIM_VERSION << "\n" << info.config_toml;
  }

  info.mpsim_version = MPSIM_VERSION;
  info.git_revision = MPSIM_GIT_REVISION;
  info.start_time = now_utc();
  info.host = host_name();
  info.seed = c.seeds.front();
  std::unique_ptr<ExperimentLog> log;
  try {
    log = create_hdf5_log(output, info, c.flush_interval);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  install_flush_on_signals();

  std::size_t arm_count = 0;
  for (const SweepPoint& p : sweep.points) arm_count += p.config.arms.size() * p.config.seeds.size() * p.config.backends.size();
  if (!o.quiet) {
    const TrainTest& first = data_sets.at(data_key(c));
    fmt::print(stderr, "mpsim run {}: {} train / {} test samples, {} arm(s){}, writing {}\n", c.name, first.train.count,
               first.test.count, arm_count,
               sweep.points.size() > 1 ? fmt::format(" over {} sweep points", sweep.points.size()) : "",
               output.string());
  }

  struct Row {
    std::string name, backend, policy, sweep_point;
    std::uint64_t seed;
    std::vector<std::string> layers;
    ArmResult result;
  };
  std::vector<Row> rows;
  ProgressLine progress(o.quiet);
  for (const SweepPoint& point : sweep.points) {
    const ExperimentConfig& pc = point.config;
    const TrainTest& data = data_sets.at(data_key(pc));
    const int threads =
        pc.train.threads > 0 ? pc.train.threads : static_cast<int>(std::thread::hardware_concurrency());
    for (const std::string& backend_name : pc.backends)
      for (const std::uint64_t seed : pc.seeds)
        for (const std::string& policy_name : pc.arms) {
          const Policy& policy = pc.policies.at(policy_name);
          ArmSetup setup;
          setup.policy = &policy;
          setup.model = pc.model;
          setup.optimizer = pc.optimizer;
          setup.schedule = pc.schedule;
          setup.train = pc.train;
          setup.train.threads = threads;
          setup.seed = seed;
          const std::string name = arm_name(pc, backend_name, policy_name, seed, point.label);
          const InputShape input{data.train.channels, data.train.height, data.train.width, data.train.classes};
          ArmInfo arm{name,        backend_name, policy_name, describe(policy), seed, Model::stat_names(pc.model, input),
                      point.label};
          ArmLog& arm_log = log->add_arm(arm);
          ArmResult r = train_arm(*backends.at(backend_name), setup, data, &arm_log,
                                  [&](const Progress& p) { progress.update(name, p); });
          log->flush();
          if (r.status != "completed" && !o.quiet) fmt::print(stderr, "\n{}: {}\n", name, r.status);
          rows.push_back({name, backend_name, policy_name, point.label, seed, arm.layers, std::move(r)});
        }
  }
  // Side by side: every arm on another backend against the same policy and
  // seed on the first backend (the same initial weights and batches).
  std::vector<Agreement> agreements;
  const auto trace = [](const Row& row) {
    return ArmTrace{row.name, row.layers, row.result.losses, row.result.test_accuracy, row.result.stat_totals};
  };
  for (const Row& other : rows) {
    if (other.backend == c.backends.front()) continue;
    for (const Row& reference : rows)
      if (reference.backend == c.backends.front() && reference.policy == other.policy &&
          reference.seed == other.seed && reference.sweep_point == other.sweep_point)
        agreements.push_back(compare_arms(trace(reference), trace(other)));
  }
  for (const Agreement& a : agreements) log->add_agreement(a);
  log.reset();  // closes the file

  std::size_t width = 16;
  for (const Row& row : rows) width = std::max(width, row.name.size());
  fmt::print("\n{:<{}} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>8} {:>10} {:>8}  {}\n", "arm", width, "test acc",
             "test loss", "act-g flush", "act-g<2^-24", "w-g flush", "w-g<2^-24", "skipped", "loss scale", "wall s",
             "status");
  for (const Row& row : rows) {
    const ArmResult& r = row.result;
    fmt::print("{:<{}} {:>8.2f}% {:>9.4f} {:>10.4f}% {:>10.4f}% {:>10.4f}% {:>10.4f}% {:>8} {:>10g} {:>8.1f}  {}\n",
               row.name, width, 100 * r.test_accuracy, r.test_loss, 100 * r.activation_grad_flushed,
               100 * r.activation_grad_below_2_24, 100 * r.weight_grad_flushed, 100 * r.weight_grad_below_2_24,
               r.skipped_steps, r.final_loss_scale, r.wall_seconds, r.status);
  }
  if (!agreements.empty()) {
    fmt::print("\n{:<28} {:<20} {:>16} {:>13} {:>13} {:>13}\n", "agreement of arm", "with", "max loss rel diff",
               "test acc diff", "act-g hist TV", "w-g hist TV");
    for (const Agreement& a : agreements)
      fmt::print("{:<28} {:<20} {:>16.3e} {:>12.2f}% {:>13.4f} {:>13.4f}\n", a.other, a.reference,
                 a.max_loss_relative_difference, 100 * a.test_accuracy_difference,
                 a.largest_histogram_distance(TensorKind::activation_grads),
                 a.largest_histogram_distance(TensorKind::weight_grads));
    fmt::print("(hist TV: the largest total-variation distance over layers between the arms' binade histograms)\n");
  }
  fmt::print("\nlog: {}\nconfig: {}\n", output.string(), config_path_for(output).string());
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, std::function<int()>& action) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Train every arm of an experiment and log it to HDF5");
  cmd->add_option("config", options->config, "Experiment config (TOML), e.g. experiments/configs/default.toml")
      ->required();
  cmd->add_option("overrides", options->overrides,
                  "Dotted overrides: train.epochs=2 arms='[\"fp32\"]'; several values sweep: optimizer.lr=0.01,0.1");
  cmd->add_option("-o,--output", options->output, "HDF5 file to write (overrides the config's output)");
  cmd->add_flag("-f,--force", options->force, "Overwrite an existing output file");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress lines");
  cmd->add_flag("--smoke", options->smoke, "Apply the config's [smoke] overrides (a small, fast run)");
  cmd->callback([&action, options] { action = [options] { return run(*options); }; });
}

}  // namespace mpsim::cli
