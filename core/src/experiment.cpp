// The experiment engine (experiment.hpp): checks, plans, trains the arms here
// or in child processes, merges their logs and formats the summary.
#include "mpsim/core/experiment.hpp"

#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <numbers>
#include <thread>

#include "mpsim/core/arm_result_file.hpp"
#include "mpsim/core/block_scaled_gemm.hpp"
#include "mpsim/core/data.hpp"
#include "mpsim/core/run_log.hpp"
#include "layer_table.hpp"
#include "mpsim_revision.h"  // generated at build time (cmake/WriteRevision.cmake)

extern char** environ;

namespace mpsim::core {
namespace {

namespace fs = std::filesystem;

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

// The CPU's model name, as /proc/cpuinfo gives it ("AMD EPYC 9B14"), or "unknown".
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      const std::size_t start = line.find_first_not_of(" \t", line.find(':') + 1);
      return start == std::string::npos ? "unknown" : line.substr(start);
    }
  return "unknown";
}

// What decides the data an arm trains on, so points of a sweep share one load.
std::string data_key(const ExperimentConfig& c) {
  const DataSpec& d = c.data;
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", d.dataset, d.path, d.train_limit, d.test_limit, d.synthetic_train,
                     d.synthetic_test, d.dataset == "synthetic" ? c.seeds.front() : 0, d.context);
}

TrainTest load_data(const ExperimentConfig& c) {
  if (c.data.dataset == "synthetic")
    return make_synthetic(c.seeds.front(), c.data.synthetic_train, c.data.synthetic_test);
  try {
    if (c.data.dataset == "fortunes")
      return load_text(data_directory(c.data), c.data.context, c.data.train_limit, c.data.test_limit);
    return load_fashion_mnist(data_directory(c.data), c.data.train_limit, c.data.test_limit);
  } catch (const DataError& e) {
    throw SetupError(std::string("data: ") + e.what());
  }
}

// A file beside the log that keeps the resolved config: runs/x.h5 -> runs/x.toml.
fs::path config_path_for(const fs::path& output) { return fs::path(output).replace_extension(".toml"); }

// The first line of every resolved config mpsim writes; a .toml without it is
// the user's own, which no run may replace.
constexpr std::string_view resolved_config_header = "# resolved config of ";

bool written_by_mpsim(const fs::path& toml) {
  std::ifstream in(toml);
  std::string first;
  std::getline(in, first);
  return first.starts_with(resolved_config_header);
}

void check_output(const fs::path& output, bool force) {
  if (output.empty())
    throw SetupError("the output path is empty: set output = \"runs/NAME.h5\" in the config, or give -o PATH");
  if (fs::is_directory(output))
    throw SetupError(fmt::format("output '{}' is a folder; give a file in it, e.g. -o {}", output.string(),
                                 (output / "run.h5").string()));
  const fs::path toml = config_path_for(output);
  if (fs::exists(toml) && !written_by_mpsim(toml))
    throw SetupError(fmt::format("'{}' exists and is not a config that mpsim wrote (the run would keep its resolved "
                                 "config there); give the log another name with -o, e.g. {}",
                                 toml.string(), fs::path(output).replace_filename(output.stem().string() + "-run.h5").string()));
  for (const fs::path& p : {output, toml}) {
    if (fs::exists(p) && !force)
      throw SetupError(fmt::format("output '{}' exists; pass --force to overwrite it, or set output=PATH", p.string()));
  }
  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  for (fs::path above = dir; !above.empty(); above = above.parent_path()) {
    std::error_code unreadable;  // a folder we may not look into is check_output's "not writable" below
    if (fs::exists(above, unreadable) && !fs::is_directory(above, unreadable))
      throw SetupError(fmt::format("output '{}' lies under '{}', which is a file, not a folder; choose another path "
                                   "with -o",
                                   output.string(), above.string()));
    if (above == above.parent_path()) break;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || access(dir.c_str(), W_OK) != 0)
    throw SetupError(fmt::format("output directory '{}' is not writable; choose another with output=PATH",
                                 dir.string()));
}

// model.fused_attention rounds inside its kernel (numerics_attention.hpp's
// FusedAttention), where there is no tensor to scale, no stream of draws for
// its roundings and no softmax but binary32's: refuse what it cannot model.
void check_fused_attention(const ExperimentConfig& c) {
  for (const std::string& arm : c.arms) {
    const auto policy = c.policies.find(arm);
    if (policy == c.policies.end()) continue;
    const Policy& p = policy->second;
    if (internal_rounding(p, &Policy::softmax_internals, "softmax").enabled)
      throw SetupError(fmt::format("arm '{}' sets softmax_internals = \"{}\", but the fused attention path's softmax "
                                   "runs in binary32: drop softmax_internals from the policy, or set "
                                   "model.fused_attention = false",
                                   arm, to_string(p.softmax_internals)));
    try {
      internal_rounding(p, &Policy::activations, "fused attention");
      internal_rounding(p, &Policy::gradient_operands, "fused attention");
    } catch (const std::invalid_argument& e) {
      throw SetupError(fmt::format("arm '{}' cannot run model.fused_attention = true: {}; or set "
                                   "model.fused_attention = false",
                                   arm, e.what()));
    }
  }
}

// Sizes and arms a run cannot train with, found before anything is written or removed:
// a batch larger than the training set, block-scaled GEMMs a
// backend cannot run, and a model whose
// parameters and activations would not fit in this machine's memory (about:
// binary32 master weights, working copy, gradient and two optimiser states per
// parameter, and a batch's activations and gradients kept for the backward).
void check_sizes(const ExperimentConfig& c, const TrainTest& data,
                 const std::map<std::string, std::unique_ptr<Backend>>& backends) {
  if (c.train.batch_size > data.train.count)
    throw SetupError(fmt::format("train.batch_size = {} is larger than the {} training samples; use at most {}",
                                 c.train.batch_size, data.train.count, data.train.count));
  // Block-scaled GEMMs that a backend cannot run (the cuda backend's kernels cover fewer formats than the CPU's).
  for (const std::string& arm : c.arms) {
    const auto policy = c.policies.find(arm);
    if (policy == c.policies.end()) continue;
    for (const std::string& backend : c.backends) {
      const std::string why = block_gemm_refusal(*backends.at(backend), policy->second);
      if (!why.empty())
        throw SetupError(fmt::format("arm '{}' cannot run on the {} backend: its {}; set backends = [\"cpu\"] for it",
                                     arm, backend, why));
    }
  }
  for (const std::string& backend : c.backends) {
    const std::string why =
        backends.at(backend)->optimizer_refusal(optimizer_params(c.optimizer, static_cast<float>(c.optimizer.lr)));
    if (!why.empty())
      throw SetupError(fmt::format("the {} backend cannot run this optimizer: {}; set backends = [\"cpu\"]", backend,
                                   why));
  }
  const bool language_model = c.model.kind == ModelKind::gpt, text = c.data.dataset == "fortunes";
  if (language_model != text)
    throw SetupError(language_model
                         ? "model.kind = \"gpt\" predicts the next token of a text: set data.dataset = \"fortunes\""
                         : fmt::format("data.dataset = \"{}\" is text, a next-token task: set model.kind = \"gpt\"",
                                       c.data.dataset));
  if (c.model.kind == ModelKind::vit || language_model) {
    const ModelSpec& m = c.model;
    if (m.width % m.heads != 0)
      throw SetupError(fmt::format("model.width = {} is not a multiple of model.heads = {}; each head needs width / "
                                   "heads values: use a width that {} divides",
                                   m.width, m.heads, m.heads));
    if (std::string why = layer_table::binary32_refusal("attention_softcap", m.attention_softcap); !why.empty())
      throw SetupError(why);
    if (std::string why = layer_table::refusal(m); !why.empty()) throw SetupError(why);
    if (m.fused_attention) check_fused_attention(c);
    if (!language_model && (data.train.height % m.patch != 0 || data.train.width % m.patch != 0))
      throw SetupError(fmt::format("model.patch = {} does not divide the {}x{} images; use a divisor of both sides",
                                   m.patch, data.train.height, data.train.width));
  }
  if (c.model.kind != ModelKind::mlp) return;  // the CNN's sizes are fixed (LeNet-5); the ViT's are small
  double parameters = 0, activations = 0;
  double width = static_cast<double>(data.train.sample_size());
  std::vector<double> widths(c.model.hidden.begin(), c.model.hidden.end());
  widths.push_back(static_cast<double>(data.train.classes));
  for (const double w : widths) {
    parameters += width * w + w;
    activations += w;
    width = w;
  }
  const double bytes = 4.0 * (5 * parameters + 6 * activations * static_cast<double>(c.train.batch_size));
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (memory > 0 && bytes > memory)
    throw SetupError(fmt::format("model.hidden = [{}] needs about {:.1f} GiB ({:.3g} parameters), more than this "
                                 "machine's {:.1f} GiB; use narrower or fewer hidden layers",
                                 fmt::join(c.model.hidden, ", "), bytes / (1u << 30), parameters, memory / (1u << 30)));
}

std::string arm_name(const ExperimentConfig& c, const PlannedArm& arm, const std::string& sweep_point) {
  std::string name = arm.policy;
  if (c.backends.size() > 1) name = arm.backend + "." + name;
  if (c.seeds.size() > 1) name += ".seed" + std::to_string(arm.seed);
  if (!sweep_point.empty()) name += "@" + sweep_point;
  return name;
}

// Every arm's name is a group of the log: usable there, and one arm's only
// (the config's arrays repeat no value, but two sweep points may coincide).
// Checked before anything is written, so a refused run loses nothing.
void check_arm_names(const Sweep& sweep) {
  std::map<std::string, std::size_t> seen;  // name -> its sweep point
  for (const PlannedArm& arm : plan_arms(sweep)) {
    const SweepPoint& point = sweep.points[arm.point];
    const std::string name = arm_name(point.config, arm, point.label);
    if (!usable_arm_name(name))  // sweep labels hold no '/' (sweep.cpp): the policy's name is at fault
      throw SetupError(fmt::format("arm '{}' cannot be named so in the HDF5 log (its names are groups: no '/', not "
                                   "'.' or '..'): rename policy '{}'",
                                   name, arm.policy));
    const auto [it, added] = seen.emplace(name, arm.point);
    if (!added)
      throw SetupError(fmt::format("two arms would be named '{}': sweep points {} and {} are the same run; give each "
                                   "sweep value once",
                                   name, it->second + 1, arm.point + 1));
  }
}

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

ArmInfo make_info(const Sweep& sweep, const PlannedArm& arm, const TrainTest& data, const Backend& backend,
                  int threads) {
  const SweepPoint& point = sweep.points[arm.point];
  const ExperimentConfig& pc = point.config;
  const Policy& policy = pc.policies.at(arm.policy);
  const InputShape input{data.train.channels, data.train.height, data.train.width, data.train.classes};
  return {arm_name(pc, arm, point.label), arm.backend, arm.policy,   describe(policy),
          arm.seed,                       Model::stat_names(pc.model, input), point.label, policy,
          threads,                        backend.describe_gemm(pc.train.gemm, pc.train.attention)};
}

ArmRow make_row(const ArmInfo& info, const PlannedArm& arm, ArmResult result) {
  return {info.name, arm.backend, arm.policy, info.sweep, arm.seed, info.layers, std::move(result)};
}

int cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// The threads an arm trains with: train.threads, or all cores for 0.
int threads_for(const ExperimentConfig& pc) { return pc.train.threads > 0 ? pc.train.threads : cores(); }

std::unique_ptr<Backend> start_backend(const std::string& name) {
  std::unique_ptr<Backend> b;
  try {
    b = make_backend(name);
  } catch (const std::runtime_error& e) {
    throw SetupError(fmt::format("backend '{}' cannot start: {}", name, e.what()));
  }
  if (!b) {
    std::string known;
    for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
    throw SetupError(fmt::format("backend '{}' is not available in this build (available: {}); "
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
  info.cpu = cpu_model();
  info.seed = sweep.points.front().config.seeds.front();
  return info;
}

// Arms at once: as many as the cores hold at the arm's thread count, unless
// options.jobs says otherwise; one without a way to start a child.
int jobs_for(const ExperimentOptions& options, const ExperimentConfig& c, std::size_t arms) {
  if (!options.child_command) return 1;
  const int threads_in_config = c.train.threads;
  const int wanted = options.jobs > 0 ? options.jobs : std::max(1, threads_in_config > 0 ? cores() / threads_in_config : 1);
  return static_cast<int>(std::min<std::size_t>(arms, static_cast<std::size_t>(wanted)));
}

// Runs the arms in child processes, `jobs` at a time, each writing its own
// file under `parts`; copies every finished arm into `log` (in the order they
// finish) and returns the rows in plan order. A child that fails stops new
// ones from starting; its output is kept in `parts` and named.
std::vector<ArmRow> run_parallel(const ExperimentOptions& options, const Sweep& sweep,
                                 const std::vector<PlannedArm>& plan, const std::vector<ArmInfo>& infos, int jobs,
                                 const std::map<std::string, TrainTest>& data_sets, ExperimentLog& log,
                                 const fs::path& parts, ExperimentObserver* observer) {
  // Each gets cores / jobs threads where the config says "all cores" (0).
  const int threads_per_arm = std::max(1, cores() / std::max(1, jobs));
  fs::create_directories(parts);
  const auto part = [&](std::size_t k, const char* extension) {
    return parts / fmt::format("arm-{}{}", k, extension);
  };
  std::vector<ArmRow> rows(plan.size());
  std::map<pid_t, std::size_t> running;
  std::size_t next = 0, finished = 0;
  std::vector<std::string> failures;
  // Each data set once, for every child that trains on it: reading the cache
  // takes milliseconds, decompressing and converting Fashion-MNIST over a
  // second. All are written before the first child starts, and removed when
  // the run ends, whichever way (the parts folder may stay, for its logs).
  std::map<std::string, fs::path> caches;
  struct RemoveCaches {
    const std::map<std::string, fs::path>& files;
    ~RemoveCaches() {
      std::error_code ec;
      for (const auto& [key, file] : files) fs::remove(file, ec);
    }
  } remove_caches{caches};
  for (const PlannedArm& arm : plan) {
    const std::string key = data_key(sweep.points[arm.point].config);
    if (caches.count(key)) continue;
    const fs::path file = parts / fmt::format("data-{}.bin", caches.size());
    caches.emplace(key, file);
    write_data_cache(file, data_sets.at(key));
  }
  const auto cache_for = [&](const ExperimentConfig& c) { return caches.at(data_key(c)); };
  const auto spawn = [&](std::size_t k) {
    ChildArm child{k, {}, part(k, ".h5"), part(k, ".result"), cache_for(sweep.points[plan[k].point].config)};
    if (sweep.points[plan[k].point].config.train.threads == 0)
      child.overrides.push_back(fmt::format("train.threads={}", threads_per_arm));
    std::vector<std::string> args = options.child_command(child);
    if (args.empty()) throw std::invalid_argument("child_command gave an empty command");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log_path = part(k, ".log").string();
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = 0;
    const int error = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) throw std::runtime_error(fmt::format("cannot start a process for arm {}: {}", infos[k].name,
                                                         std::strerror(error)));
    running.emplace(pid, k);
  };
  // What a stop leaves outside the log: the arms under way, in their own files.
  const auto note_running = [&] {
    std::string names;
    for (const auto& [pid, k] : running)
      names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", infos[k].name, part(k, ".h5").filename().string());
    log.set_arms_elsewhere(names.empty() ? std::string()
                                         : fmt::format("Arms under way are not in it: each trains into its own log "
                                                       "in {}, which stays: {}",
                                                       parts.string(), names));
  };
  while (finished < plan.size() && (failures.empty() || !running.empty())) {
    while (failures.empty() && running.size() < static_cast<std::size_t>(jobs) && next < plan.size()) spawn(next++);
    note_running();
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
    ArmRow& row = rows[k];
    row = make_row(infos[k], plan[k], {});
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failures.push_back(fmt::format("arm {} failed ({}); its output: {}", infos[k].name,
                                     WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                                       : fmt::format("signal {}", WTERMSIG(status)),
                                     part(k, ".log").string()));
      row.result.status = "failed";
      continue;
    }
    row.result = read_arm_result(part(k, ".result"));
    log.copy_arm(part(k, ".h5"), infos[k].name);
    note_running();  // only now: until copied, the arm is in its own file
    if (observer) observer->arm_finished(row, finished, plan.size());
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

// Side by side: every arm on another backend against the same policy and
// seed on the first backend (the same initial weights and batches).
std::vector<Agreement> compare_backends(const std::vector<ArmRow>& rows, const std::string& first_backend) {
  std::vector<Agreement> agreements;
  const auto trace = [](const ArmRow& row) {
    return ArmTrace{row.name, row.layers, row.result.losses, row.result.test_accuracy, row.result.stat_totals};
  };
  for (const ArmRow& other : rows) {
    if (other.backend == first_backend) continue;
    for (const ArmRow& reference : rows)
      if (reference.backend == first_backend && reference.policy == other.policy && reference.seed == other.seed &&
          reference.sweep_point == other.sweep_point)
        agreements.push_back(compare_arms(trace(reference), trace(other)));
  }
  return agreements;
}

}  // namespace

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

ExperimentResult run_experiment(Sweep sweep, const ExperimentOptions& options, ExperimentObserver* observer) {
  ExperimentConfig& c = sweep.points.front().config;
  if (!options.output.empty()) c.output = options.output;
  const fs::path output(c.output);
  // Everything that can be wrong is checked before the first step.
  check_arm_names(sweep);
  std::vector<std::string> backend_list;
  for (const SweepPoint& p : sweep.points)
    for (const auto& name : p.config.backends)
      if (std::find(backend_list.begin(), backend_list.end(), name) == backend_list.end()) backend_list.push_back(name);
  std::map<std::string, std::unique_ptr<Backend>> backends;
  for (const auto& name : backend_list) backends.emplace(name, start_backend(name));
  if (options.jobs < 0) throw SetupError(fmt::format("jobs {} must be >= 0 (0: as many as the cores allow)", options.jobs));
  check_output(output, options.force);
  std::map<std::string, TrainTest> data_sets;
  for (const SweepPoint& p : sweep.points)
    if (!data_sets.count(data_key(p.config))) data_sets.emplace(data_key(p.config), load_data(p.config));
  for (const SweepPoint& p : sweep.points) check_sizes(p.config, data_sets.at(data_key(p.config)), backends);
  const ExperimentInfo info = experiment_info(sweep);
  // Only now, with everything checked, may --force replace the old results.
  if (options.force) {
    fs::remove(output);
    fs::remove(config_path_for(output));
  }
  std::unique_ptr<ExperimentLog> log;
  try {
    log = create_hdf5_log(output, info, c.flush_interval);  // exclusive: of two runs on one output, one stops here
  } catch (const std::exception& e) {
    throw SetupError(e.what());
  }
  {
    // The run that created the log writes its config: through a temporary
    // file and a rename, so the .toml beside a .h5 is always the one of its run.
    const fs::path toml = config_path_for(output);
    const fs::path temporary = fs::path(toml).concat(fmt::format(".tmp-{}", getpid()));
    {
      std::ofstream out(temporary);
      out << resolved_config_header << c.name << ", written by mpsim " << MPSIM_VERSION << "\n" << info.config_toml;
      if (!out) throw SetupError(fmt::format("cannot write '{}'", temporary.string()));
    }
    fs::rename(temporary, toml);
  }
  if (options.handle_signals) install_flush_on_signals();

  const std::vector<PlannedArm> plan = plan_arms(sweep);
  std::vector<ArmInfo> infos;
  for (const PlannedArm& arm : plan)
    infos.push_back(make_info(sweep, arm, data_sets.at(data_key(sweep.points[arm.point].config)),
                              *backends.at(arm.backend), threads_for(sweep.points[arm.point].config)));
  const int jobs = jobs_for(options, c, plan.size());
  if (observer) {
    const TrainTest& first = data_sets.at(data_key(c));
    observer->started({c.name, first.train.count, first.test.count, plan.size(), sweep.points.size(), jobs, output});
  }

  ExperimentResult result;
  if (jobs > 1) {
    const fs::path parts = (output.has_parent_path() ? output.parent_path() : fs::path(".")) /
                           fmt::format(".{}.parts-{}", output.filename().string(), getpid());
    result.rows = run_parallel(options, sweep, plan, infos, jobs, data_sets, *log, parts, observer);
  } else {
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const PlannedArm& arm = plan[k];
      const ExperimentConfig& pc = sweep.points[arm.point].config;
      const ArmInfo& arm_info = infos[k];
      ArmLog& arm_log = log->add_arm(arm_info);
      std::function<void(const Progress&)> progress;
      if (observer) progress = [&](const Progress& p) { observer->progress(arm_info, p); };
      ArmResult r = train_arm(*backends.at(arm.backend), make_setup(pc, arm, threads_for(pc)),
                              data_sets.at(data_key(pc)), &arm_log, progress);
      log->flush();
      result.rows.push_back(make_row(arm_info, arm, std::move(r)));
      if (observer) observer->arm_finished(result.rows.back(), k + 1, plan.size());
    }
  }
  result.agreements = compare_backends(result.rows, c.backends.front());
  result.text = std::all_of(sweep.points.begin(), sweep.points.end(),
                            [](const SweepPoint& p) { return p.config.data.dataset == "fortunes"; });
  for (const Agreement& a : result.agreements) log->add_agreement(a);
  log.reset();  // closes the file
  result.log = output;
  result.config = config_path_for(output);
  return result;
}

ArmResult run_planned_arm(const Sweep& sweep, std::size_t index, const ExperimentOptions& options,
                          const fs::path& result_file) {
  const std::vector<PlannedArm> plan = plan_arms(sweep);
  if (index >= plan.size())
    throw SetupError(fmt::format("arm index {} is outside the plan's {} arms", index, plan.size()));
  const PlannedArm& arm = plan[index];
  const ExperimentConfig& pc = sweep.points[arm.point].config;
  const TrainTest data = options.data_cache.empty() ? load_data(pc) : read_data_cache(options.data_cache);
  const std::unique_ptr<Backend> backend = start_backend(arm.backend);
  const int threads = threads_for(pc);
  const ArmInfo info = make_info(sweep, arm, data, *backend, threads);
  std::unique_ptr<ExperimentLog> log = create_hdf5_log(options.output, experiment_info(sweep), pc.flush_interval);
  if (options.handle_signals) install_flush_on_signals();
  ArmLog& arm_log = log->add_arm(info);
  ArmResult result = train_arm(*backend, make_setup(pc, arm, threads), data, &arm_log);
  log.reset();  // closes the file before the parent copies from it
  if (!result_file.empty()) write_arm_result(result_file, result);
  return result;
}

bool follow_parent_process() {
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  return getppid() != 1;  // adopted by init: the parent is already gone
}

std::string format_summary(const ExperimentResult& result) {
  std::string out;
  std::size_t width = 16;
  for (const ArmRow& row : result.rows) width = std::max(width, row.name.size());
  out += fmt::format("\n{:<{}} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>8} {:>10} {:>8}  {}\n", "arm", width,
                     "test acc", "test loss", "act-g to 0", "act-g<2^-24", "w-g to 0", "w-g<2^-24", "skipped",
                     "loss scale", "wall s", "status");
  bool any_uncollected = false;
  for (const ArmRow& row : result.rows) {
    const ArmResult& r = row.result;
    // No instrumented step (stats_interval = 0, or stopped before the first):
    // the shares were never measured, which is not 0%.
    const bool collected = !r.stat_totals.empty();
    any_uncollected |= !collected;
    const auto share = [collected](double x) {
      return collected ? fmt::format("{:>10.4f}%", 100 * x) : fmt::format("{:>11}", "n/a");
    };
    out += fmt::format("{:<{}} {:>8.2f}% {:>9.4f} {} {} {} {} {:>8} {:>10g} {:>8.1f}  {}\n", row.name, width,
                       100 * r.test_accuracy, r.test_loss, share(r.activation_grad_flushed),
                       share(r.activation_grad_below_2_24), share(r.weight_grad_flushed),
                       share(r.weight_grad_below_2_24), r.skipped_steps, r.final_loss_scale, r.wall_seconds, r.status);
  }
  out += "(act-g, w-g: activation and weight gradients, summed over the instrumented steps. to 0: nonzero values "
         "that\n rounding to the arm's format made zero; <2^-24: nonzero values below binary16's smallest subnormal; "
         "both per nonzero value.\n skipped: steps skipped for an inf/NaN gradient. loss scale: after the last "
         "step.)\n";
  if (any_uncollected) out += "(n/a: no step was instrumented; set train.stats_interval > 0 to measure these)\n";
  if (result.text) {
    out += "\ntest bits per character (test loss / ln 2):\n";
    for (const ArmRow& row : result.rows)
      out += fmt::format("{:<{}} {:>9.4f}\n", row.name, width, row.result.test_loss / std::numbers::ln2);
  }
  if (!result.agreements.empty()) {
    out += fmt::format("\n{:<28} {:<20} {:>16} {:>13} {:>13} {:>13}\n", "agreement of arm", "with",
                       "max loss rel diff", "test acc diff", "act-g hist TV", "w-g hist TV");
    for (const Agreement& a : result.agreements)
      out += fmt::format("{:<28} {:<20} {:>16.3e} {:>12.2f}% {:>13.4f} {:>13.4f}\n", a.other, a.reference,
                         a.max_loss_relative_difference, 100 * a.test_accuracy_difference,
                         a.largest_histogram_distance(TensorKind::activation_grads),
                         a.largest_histogram_distance(TensorKind::weight_grads));
    out += "(hist TV: the largest total-variation distance over layers between the arms' binade histograms)\n";
  }
  out += fmt::format("\nlog: {}\nconfig: {}\n", result.log.string(), result.config.string());
  return out;
}

}  // namespace mpsim::core
