// mpsim run CONFIG.toml [key=value ...]: trains every arm of an experiment
// and logs it to one HDF5 file.
#include "run_command.hpp"

#include <fcntl.h>
#include <fmt/core.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>
#include <type_traits>

#include "mpsim/core/agreement.hpp"
#include "mpsim/core/config.hpp"
#include "mpsim/core/data.hpp"
#include "mpsim/core/run_log.hpp"
#include "mpsim/core/sweep.hpp"
#include "mpsim/core/trainer.hpp"
#include "usage_error.hpp"

extern char** environ;

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
  int jobs = 0;  // arms at once, each in its own process; 0: cores / threads per arm
  // A child process of a parallel run: trains arm `arm_index` of the plan
  // alone into `output` and writes its result to `result_file`.
  int arm_index = -1;
  std::string result_file;
};

// One arm of the experiment, in the order every process enumerates them.
struct PlannedArm {
  std::size_t point;  // index into Sweep::points
  std::string backend, policy;
  std::uint64_t seed;
};

std::vector<PlannedArm> plan_arms(const Sweep& sweep) {
  std::vector<PlannedArm> plan;
  for (std::size_t i = 0; i < sweep.points.size(); ++i) {
    const ExperimentConfig& pc = sweep.points[i].config;
    for (const std::string& backend : pc.backends)
      for (const std::uint64_t seed : pc.seeds)
        for (const std::string& policy : pc.arms) plan.push_back({i, backend, policy, seed});
  }
  return plan;
}

// --- A child's result, handed to the parent in a file (same binary on both ends) ---
static_assert(std::is_trivially_copyable_v<TensorStats>);

class ResultWriter {
 public:
  explicit ResultWriter(const fs::path& path) : out_(path, std::ios::binary) {}
  template <typename T>
  void value(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.write(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <typename T>
  void values(const std::vector<T>& v) {
    value(v.size());
    out_.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  }
  void text(const std::string& s) { values(std::vector<char>(s.begin(), s.end())); }
  bool ok() const { return out_.good(); }

 private:
  std::ofstream out_;
};

class ResultReader {
 public:
  explicit ResultReader(const fs::path& path) : in_(path, std::ios::binary) {}
  template <typename T>
  void value(T& v) {
    in_.read(reinterpret_cast<char*>(&v), sizeof v);
  }
  template <typename T>
  void values(std::vector<T>& v) {
    std::size_t n = 0;
    value(n);
    if (!in_ || n > (std::size_t{1} << 32)) throw std::runtime_error("truncated result file");
    v.resize(n);
    in_.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  }
  void text(std::string& s) {
    std::vector<char> c;
    values(c);
    s.assign(c.begin(), c.end());
  }
  bool ok() const { return in_.good(); }

 private:
  std::ifstream in_;
};

// Every field of an ArmResult, in one order for writing and reading.
template <typename Stream, typename Result>
void result_fields(Stream& io, Result& r) {
  io.text(r.status);
  io.value(r.steps);
  io.value(r.skipped_steps);
  for (auto* v : {&r.final_loss_scale, &r.train_loss, &r.test_loss, &r.test_accuracy, &r.activation_grad_flushed,
                  &r.activation_grad_below_2_24, &r.weight_grad_flushed, &r.weight_grad_below_2_24,
                  &r.swallowed_updates, &r.wall_seconds})
    io.value(*v);
  io.values(r.losses);
  io.values(r.loss_scales);
  io.values(r.stat_totals);
}

void write_result(const fs::path& path, const ArmResult& r) {
  ResultWriter w(path);
  result_fields(w, r);
  if (!w.ok()) throw std::runtime_error("cannot write " + path.string());
}

ArmResult read_result(const fs::path& path) {
  ArmResult r;
  ResultReader in(path);
  result_fields(in, r);
  if (!in.ok()) throw std::runtime_error("cannot read " + path.string());
  return r;
}

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

ArmSetup make_setup(const ExperimentConfig& pc, const PlannedArm& arm, int threads) {
  ArmSetup setup;
  setup.policy = &pc.policies.at(arm.policy);
  setup.model = pc.model;
  setup.optimizer = pc.optimizer;
  setup.schedule = pc.schedule;
  setup.train = pc.train;
  setup.train.threads = threads;
  setup.seed = arm.seed;
  return setup;
}

ArmInfo make_info(const Sweep& sweep, const PlannedArm& arm, const TrainTest& data) {
  const SweepPoint& point = sweep.points[arm.point];
  const ExperimentConfig& pc = point.config;
  const Policy& policy = pc.policies.at(arm.policy);
  const InputShape input{data.train.channels, data.train.height, data.train.width, data.train.classes};
  return {arm_name(pc, arm.backend, arm.policy, arm.seed, point.label), arm.backend, arm.policy, describe(policy),
          arm.seed, Model::stat_names(pc.model, input), point.label, policy};
}

int cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// The threads an arm trains with: train.threads, or all cores for 0.
int threads_for(const ExperimentConfig& pc) { return pc.train.threads > 0 ? pc.train.threads : cores(); }

std::unique_ptr<Backend> start_backend(const std::string& name) {
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
  return b;
}

ExperimentInfo experiment_info(const Sweep& sweep) {
  ExperimentInfo info;
  info.config_toml = sweep.to_toml();
  info.mpsim_version = MPSIM_VERSION;
  info.git_revision = MPSIM_GIT_REVISION;
  info.start_time = now_utc();
  info.host = host_name();
  info.seed = sweep.points.front().config.seeds.front();
  return info;
}

Sweep load(const RunOptions& o) {
  try {
    return load_sweep(o.config, o.overrides, o.smoke);
  } catch (const ConfigError& e) {
    throw UsageError(std::string("config: ") + e.what());
  }
}

// A child of a parallel run: one arm into its own file (the parent copies it).
int run_child(const RunOptions& o) {
  // A child must not outlive its parent (killed, interrupted): it then gets
  // SIGTERM, flushes its own file and ends like any interrupted run.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) return 1;  // the parent is already gone
  const Sweep sweep = load(o);
  const std::vector<PlannedArm> plan = plan_arms(sweep);
  if (o.arm_index < 0 || static_cast<std::size_t>(o.arm_index) >= plan.size())
    throw UsageError(fmt::format("--arm-index {} is outside the plan's {} arms", o.arm_index, plan.size()));
  const PlannedArm& arm = plan[static_cast<std::size_t>(o.arm_index)];
  const ExperimentConfig& pc = sweep.points[arm.point].config;
  const TrainTest data = load_data(pc);
  const std::unique_ptr<Backend> backend = start_backend(arm.backend);
  const int threads = threads_for(pc);
  const ArmInfo info = make_info(sweep, arm, data);
  std::unique_ptr<ExperimentLog> log = create_hdf5_log(o.output, experiment_info(sweep), pc.flush_interval);
  install_flush_on_signals();
  ArmLog& arm_log = log->add_arm(info);
  const ArmResult result = train_arm(*backend, make_setup(pc, arm, threads), data, &arm_log);
  log.reset();  // closes the file before the parent copies from it
  write_result(o.result_file, result);
  return 0;
}

struct Row {
  std::string name, backend, policy, sweep_point;
  std::uint64_t seed = 0;
  std::vector<std::string> layers;
  ArmResult result;
};

// Runs the arms in child processes, `jobs` at a time, each writing its own
// file under `parts`; copies every finished arm into `log` (in the order they
// finish) and returns the rows in plan order. A child that fails stops new
// ones from starting; its output is kept in `parts` and named.
std::vector<Row> run_parallel(const RunOptions& o, const Sweep& sweep, const std::vector<PlannedArm>& plan,
                              const std::vector<ArmInfo>& infos, int jobs, int threads_per_arm, ExperimentLog& log,
                              const fs::path& parts) {
  fs::create_directories(parts);
  const auto part = [&](std::size_t k, const char* extension) {
    return parts / fmt::format("arm-{}{}", k, extension);
  };
  std::vector<Row> rows(plan.size());
  std::map<pid_t, std::size_t> running;
  std::size_t next = 0, finished = 0;
  std::vector<std::string> failures;
  const auto spawn = [&](std::size_t k) {
    std::vector<std::string> args{"mpsim", "run", o.config};
    for (const auto& v : o.overrides) args.push_back(v);
    if (sweep.points[plan[k].point].config.train.threads == 0)
      args.push_back(fmt::format("train.threads={}", threads_per_arm));
    if (o.smoke) args.push_back("--smoke");
    for (const std::string& a : {std::string("--quiet"), std::string("--force"), std::string("-o"),
                                 part(k, ".h5").string(), std::string("--arm-index"), std::to_string(k),
                                 std::string("--result"), part(k, ".result").string()})
      args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log_path = part(k, ".log").string();
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = 0;
    const int error = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) throw std::runtime_error(fmt::format("cannot start a process for arm {}: {}", infos[k].name,
                                                         std::strerror(error)));
    running.emplace(pid, k);
  };
  while (finished < plan.size() && (failures.empty() || !running.empty())) {
    while (failures.empty() && running.size() < static_cast<std::size_t>(jobs) && next < plan.size()) spawn(next++);
    if (running.empty()) break;
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(fmt::format("waitpid: {}", std::strerror(errno)));
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const std::size_t k = it->second;
    running.erase(it);
    ++finished;
    const PlannedArm& arm = plan[k];
    Row& row = rows[k];
    row = {infos[k].name, arm.backend, arm.policy, sweep.points[arm.point].label, arm.seed, infos[k].layers, {}};
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failures.push_back(fmt::format("arm {} failed ({}); its output: {}", infos[k].name,
                                     WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                                       : fmt::format("signal {}", WTERMSIG(status)),
                                     part(k, ".log").string()));
      row.result.status = "failed";
      continue;
    }
    row.result = read_result(part(k, ".result"));
    log.copy_arm(part(k, ".h5"), infos[k].name);
    if (!o.quiet)
      fmt::print(stderr, "[{}/{}] {}: test acc {:.2f}%, {:.1f} s{}\n", finished, plan.size(), row.name,
                 100 * row.result.test_accuracy, row.result.wall_seconds,
                 row.result.status == "completed" ? "" : ", " + row.result.status);
  }
  if (!failures.empty()) {
    std::string message;
    for (const auto& f : failures) message += "\n  " + f;
    throw std::runtime_error(fmt::format("{} arm(s) failed; the log keeps the arms that finished:{}",
                                         failures.size(), message));
  }
  fs::remove_all(parts);
  return rows;
}

int run(const RunOptions& o) {
  if (o.arm_index >= 0) return run_child(o);
  Sweep sweep = load(o);
  ExperimentConfig& c = sweep.points.front().config;
  if (!o.output.empty()) c.output = o.output;
  const fs::path output(c.output);
  // Everything that can be wrong is checked before the first step.
  std::vector<std::string> backend_list;
  for (const SweepPoint& p : sweep.points)
    for (const auto& name : p.config.backends)
      if (std::find(backend_list.begin(), backend_list.end(), name) == backend_list.end()) backend_list.push_back(name);
  std::map<std::string, std::unique_ptr<Backend>> backends;
  for (const auto& name : backend_list) backends.emplace(name, start_backend(name));
  if (o.jobs < 0) throw UsageError(fmt::format("--jobs {} must be >= 0 (0: as many as the cores allow)", o.jobs));
  check_output(output, o.force);
  std::map<std::string, TrainTest> data_sets;
  for (const SweepPoint& p : sweep.points)
    if (!data_sets.count(data_key(p.config))) data_sets.emplace(data_key(p.config), load_data(p.config));
  if (o.force) {
    fs::remove(output);
    fs::remove(config_path_for(output));
  }
  const ExperimentInfo info = experiment_info(sweep);
  {
    std::ofstream toml(config_path_for(output));
    toml << "# resolved config of " << c.name << ", written by mpsim " << MPSIM_VERSION << "\n" << info.config_toml;
  }
  std::unique_ptr<ExperimentLog> log;
  try {
    log = create_hdf5_log(output, info, c.flush_interval);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  install_flush_on_signals();

  const std::vector<PlannedArm> plan = plan_arms(sweep);
  std::vector<ArmInfo> infos;
  for (const PlannedArm& arm : plan)
    infos.push_back(make_info(sweep, arm, data_sets.at(data_key(sweep.points[arm.point].config))));
  // Arms at once: as many as the cores hold at the arm's thread count, unless
  // --jobs says otherwise; each then gets cores / jobs threads where the
  // config says "all cores" (0).
  const int threads_in_config = c.train.threads;
  const int jobs = static_cast<int>(std::min<std::size_t>(
      plan.size(),
      static_cast<std::size_t>(o.jobs > 0 ? o.jobs : std::max(1, threads_in_config > 0 ? cores() / threads_in_config : 1))));
  const int threads_per_arm = std::max(1, cores() / std::max(1, jobs));
  if (!o.quiet) {
    const TrainTest& first = data_sets.at(data_key(c));
    fmt::print(stderr, "mpsim run {}: {} train / {} test samples, {} arm(s){}{}, writing {}\n", c.name,
               first.train.count, first.test.count, plan.size(),
               sweep.points.size() > 1 ? fmt::format(" over {} sweep points", sweep.points.size()) : "",
               jobs > 1 ? fmt::format(", {} at a time", jobs) : "", output.string());
  }

  std::vector<Row> rows;
  if (jobs > 1) {
    const fs::path parts = (output.has_parent_path() ? output.parent_path() : fs::path(".")) /
                           fmt::format(".{}.parts-{}", output.filename().string(), getpid());
    rows = run_parallel(o, sweep, plan, infos, jobs, threads_per_arm, *log, parts);
  } else {
    ProgressLine progress(o.quiet);
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const PlannedArm& arm = plan[k];
      const ExperimentConfig& pc = sweep.points[arm.point].config;
      const TrainTest& data = data_sets.at(data_key(pc));
      const int threads = threads_for(pc);
      const ArmInfo& info = infos[k];
      ArmLog& arm_log = log->add_arm(info);
      ArmResult r = train_arm(*backends.at(arm.backend), make_setup(pc, arm, threads), data, &arm_log,
                              [&](const Progress& p) { progress.update(info.name, p); });
      log->flush();
      if (r.status != "completed" && !o.quiet) fmt::print(stderr, "\n{}: {}\n", info.name, r.status);
      rows.push_back({info.name, arm.backend, arm.policy, sweep.points[arm.point].label, arm.seed, info.layers,
                      std::move(r)});
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
  cmd->add_option("-j,--jobs", options->jobs,
                  "Arms trained at once, each in its own process (default: cores / train.threads; 1 when "
                  "train.threads is 0, all cores)");
  // Internal: how a parallel run starts its child processes.
  cmd->add_option("--arm-index", options->arm_index)->group("");
  cmd->add_option("--result", options->result_file)->group("");
  cmd->callback([&action, options] { action = [options] { return run(*options); }; });
}

}  // namespace mpsim::cli
