// The GPU benchmark of issue #4 §5. In one run, every time is device time
// between CUDA events:
//  1. the training step of mpsim's "cuda" backend for a large MLP (4 hidden
//     layers of 4096, batch 4096) and LeNet-5 (batch 256) on synthetic data of
//     Fashion-MNIST's shape, policies fp32 (no TF32), tf32, fp16-mixed and
//     bf16-mixed, with statistics never, every 10 steps and every step;
//  2. GEMM throughput (8192^3, binary32 accumulation) per input type: cuBLAS
//     alone, a gpu::gemm call, and the GEMM FLOPs of the MLP step divided by
//     its step time.
// Prints Markdown tables and writes every figure to OUT_DIR/bench_gpu.json.
// bench/gpu_vs_torch.sh runs it beside PyTorch (bench/torch_gpu_step.py) and
// merges the tables; docs/gpu.md says how to run it.
//
// A plain program rather than Google Benchmark: each figure is a median over
// windows of steps timed with CUDA events inside one training run, the point
// is the ratios between runs (speed-up, instrumentation overhead, GEMM
// efficiency) and the report must carry the GPU and CUDA versions beside them.
// Google Benchmark would add only a repetition loop that rebuilds the
// 50M-parameter model per repetition, and its own timers would go unused.
//
//   bench_gpu [--out DIR] [--windows N] [--warmup N] [--mlp-batch N] [--cnn-batch N]
//             [--gemm-size N] [--gemm-repetitions N] [--quick]
// Exit status: 0 done; 77 no CUDA device (nothing measured); 2 bad
// arguments; 1 a failure (the message on stderr).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpsim/core/trainer.hpp"
#include "mpsim/gpu/backend.hpp"
#include "mpsim/gpu/device.hpp"
#include "mpsim/gpu/timing.hpp"

#ifndef MPSIM_VERSION
#define MPSIM_VERSION "unknown"
#endif
#ifndef MPSIM_NVCC_VERSION
#define MPSIM_NVCC_VERSION "unknown"
#endif

namespace {

using namespace mpsim;

constexpr int exit_no_device = 77, exit_usage = 2;

struct Options {
  std::filesystem::path out_dir = ".";
  std::int64_t mlp_batch = 4096, mlp_width = 4096, mlp_depth = 4, cnn_batch = 256;
  int warmup_steps = 10;
  int window_steps = 10;  // a multiple of 10: each window holds one step instrumented at interval 10
  int windows = 10;
  int gemm_size = 8192, gemm_repetitions = 20, gemm_call_repetitions = 5;
  std::uint64_t seed = 1;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr std::string_view usage_text =
    "usage: bench_gpu [--out DIR] [--windows N] [--warmup N] [--mlp-batch N] [--cnn-batch N]\n"
    "                 [--gemm-size N] [--gemm-repetitions N] [--quick]\n"
    "  --out DIR    where bench_gpu.json goes (created if missing; default .)\n"
    "  --quick      small sizes for a smoke test (MLP 2x512, batch 512; GEMM 1024; 3 windows)\n";

std::int64_t positive(std::string_view flag, const char* text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || text[used] != '\0' || value <= 0)
    throw UsageError(std::string(flag) + " needs a positive integer, got '" + text + "'");
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  // --quick first, wherever it stands, so that the other flags override it.
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--quick") {
      o.mlp_batch = 512, o.mlp_width = 512, o.mlp_depth = 2, o.cnn_batch = 64;
      o.warmup_steps = 3, o.windows = 3, o.gemm_size = 1024, o.gemm_repetitions = 5, o.gemm_call_repetitions = 2;
    }
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << usage_text;
      std::exit(0);
    }
    if (arg == "--quick") continue;
    if (i + 1 >= argc) throw UsageError(std::string(arg) + " needs a value");
    const char* value = argv[++i];
    if (arg == "--out") o.out_dir = value;
    else if (arg == "--windows") o.windows = static_cast<int>(positive(arg, value));
    else if (arg == "--warmup") o.warmup_steps = static_cast<int>(positive(arg, value));
    else if (arg == "--mlp-batch") o.mlp_batch = positive(arg, value);
    else if (arg == "--cnn-batch") o.cnn_batch = positive(arg, value);
    else if (arg == "--gemm-size") o.gemm_size = static_cast<int>(positive(arg, value));
    else if (arg == "--gemm-repetitions") o.gemm_repetitions = static_cast<int>(positive(arg, value));
    else throw UsageError("unknown option '" + std::string(arg) + "'");
  }
  return o;
}

// --- Small helpers ------------------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string percent(double ratio) {  // ratio - 1 as a signed percentage
  if (!std::isfinite(ratio)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * (ratio - 1.0));
  return buf;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// --- JSON, written by hand for this one report ---------------------------------------------------------------------

std::string json(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else out += c;
  }
  return out + "\"";
}

std::string json(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string json(std::int64_t v) { return std::to_string(v); }
std::string json(int v) { return std::to_string(v); }
std::string json(const char* s) { return json(std::string_view(s)); }
std::string json(const std::string& s) { return json(std::string_view(s)); }

std::string json(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + json(values[i]);
  return out + "]";
}

// Fields are (key, JSON text) pairs.
using Fields = std::vector<std::pair<std::string, std::string>>;

std::string object(const Fields& fields) {
  std::string out = "{";
  for (std::size_t i = 0; i < fields.size(); ++i)
    out += (i ? ", " : "") + json(fields[i].first) + ": " + fields[i].second;
  return out + "}";
}

std::string array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ",\n    " : "\n    ") + items[i];
  return out + (items.empty() ? "]" : "\n  ]");
}

// --- The models and policies ----------------------------------------------------------------------------------------

struct ModelCase {
  std::string name;  // "mlp" or "cnn"
  core::ModelSpec spec;
  std::int64_t batch;
};

// The fp32 preset with TF32 GEMM operands: the CUDA backend then runs its
// GEMMs on TF32 Tensor Cores (docs/gpu.md, GEMM input types).
core::Policy tf32_policy() {
  core::Policy p = *core::preset_policy("fp32");
  p.name = "tf32";
  p.weights.format = p.activations.format = p.gradient_operands.format = formats::tf32;
  return p;
}

std::vector<core::Policy> benchmark_policies() {
  return {*core::preset_policy("fp32"), tf32_policy(), *core::preset_policy("fp16-mixed"),
          *core::preset_policy("bf16-mixed")};
}

// The name of the GEMM input type the CUDA backend picks for a policy's operands.
std::string_view gemm_input_of_policy(std::string_view policy) {
  if (policy == "fp32") return "binary32";
  if (policy == "tf32") return "tf32";
  if (policy == "fp16-mixed") return "binary16";
  if (policy == "bf16-mixed") return "bfloat16";
  return "?";
}

// The GEMM FLOPs of one MLP training step: every Linear computes its output
// (2 b in out), its weight gradient (the same), and its input gradient except
// the first Linear, whose input gradient is never computed.
double mlp_gemm_flops(const core::ModelSpec& spec, std::int64_t batch, const core::InputShape& in) {
  std::vector<std::int64_t> widths{in.channels * in.height * in.width};
  widths.insert(widths.end(), spec.hidden.begin(), spec.hidden.end());
  widths.push_back(in.classes);
  double flops = 0.0;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const double one = 2.0 * static_cast<double>(batch) * static_cast<double>(widths[l]) *
                       static_cast<double>(widths[l + 1]);
    flops += one * (l == 0 ? 2.0 : 3.0);
  }
  return flops;
}

// --- Training steps -------------------------------------------------------------------------------------------------

struct StepFigures {
  std::string model, policy;
  std::int64_t batch = 0;
  int stats_interval = 0;
  std::vector<double> device_ms;  // per step, one value per window (CUDA events)
  std::vector<double> host_ms;    // the same windows by the host's steady clock
  double median_ms = 0.0, host_median_ms = 0.0, samples_per_s = 0.0;
  double gemm_flops = 0.0;   // per step (MLP only; 0: not counted)
  double gemm_tflops = 0.0;  // gemm_flops / median step time
  std::int64_t skipped_steps = 0;
  double final_loss_scale = 1.0;
};

// Trains warmup + windows * window_steps + 1 steps and times the windows.
// Evaluation runs only after the last step, which is not timed; model set-up
// is outside the timed span too.
StepFigures time_steps(core::Backend& backend, const Options& o, const ModelCase& m, const core::Policy& policy,
                       int stats_interval, const core::TrainTest& data) {
  core::ArmSetup setup;
  setup.policy = &policy;
  setup.model = m.spec;
  setup.train.batch_size = m.batch;
  const std::int64_t timed = static_cast<std::int64_t>(o.windows) * o.window_steps;
  setup.train.max_steps = o.warmup_steps + timed + 1;
  setup.train.epochs = setup.train.max_steps;  // enough epochs of the small data set: max_steps decides
  setup.train.eval_interval = std::int64_t{1} << 40;  // no evaluation at epoch ends: only after the last step
  setup.train.eval_batch = m.batch;
  setup.train.stats_interval = stats_interval;
  setup.seed = o.seed;

  gpu::EventTimer timer(backend);
  std::vector<std::chrono::steady_clock::time_point> host_marks;
  // Progress fires on the host after each step has been enqueued: an event
  // recorded then completes when the device has finished that step.
  const core::ArmResult result = core::train_arm(backend, setup, data, nullptr, [&](const core::Progress& p) {
    const std::int64_t since = p.step - o.warmup_steps;
    if (since >= 0 && since <= timed && since % o.window_steps == 0) {
      timer.mark();
      host_marks.push_back(std::chrono::steady_clock::now());
    }
  });
  if (result.status != "completed" || timer.marks() != static_cast<std::size_t>(o.windows) + 1)
    throw std::runtime_error(m.name + " " + policy.name + ": the arm did not run all its steps (" + result.status + ")");

  StepFigures f;
  f.model = m.name;
  f.policy = policy.name;
  f.batch = m.batch;
  f.stats_interval = stats_interval;
  for (const double ms : timer.intervals_ms()) f.device_ms.push_back(ms / o.window_steps);
  for (std::size_t i = 1; i < host_marks.size(); ++i)
    f.host_ms.push_back(std::chrono::duration<double, std::milli>(host_marks[i] - host_marks[i - 1]).count() /
                        o.window_steps);
  f.median_ms = median(f.device_ms);
  f.host_median_ms = median(f.host_ms);
  f.samples_per_s = static_cast<double>(m.batch) / (f.median_ms * 1e-3);
  if (m.name == "mlp") {
    f.gemm_flops = mlp_gemm_flops(m.spec, m.batch, core::InputShape{});
    f.gemm_tflops = f.gemm_flops / (f.median_ms * 1e-3) * 1e-12;
  }
  f.skipped_steps = result.skipped_steps;
  f.final_loss_scale = result.final_loss_scale;
  return f;
}

const StepFigures* find(const std::vector<StepFigures>& all, std::string_view model, std::string_view policy,
                        int stats_interval) {
  for (const auto& f : all)
    if (f.model == model && f.policy == policy && f.stats_interval == stats_interval) return &f;
  return nullptr;
}

// --- GEMMs ----------------------------------------------------------------------------------------------------------

struct GemmFigures {
  std::string input;
  gpu::GemmTiming bare;          // cuBLAS alone, operands already in the input type
  std::vector<double> call_ms;   // whole gpu::gemm calls
  double call_median_ms = 0.0, call_tflops = 0.0;
};

std::vector<float> host_uniform(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t state = seed;
  for (float& x : v) {  // splitmix64: a seeded, library-independent sequence
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x = static_cast<float>(z >> 40) * 0x1p-23f - 1.0f;  // [-1, 1), exact
  }
  return v;
}

std::vector<GemmFigures> time_gemms(const Options& o) {
  const std::vector<std::pair<gpu::GemmInput, std::string>> inputs{{gpu::GemmInput::binary32, "binary32"},
                                                                   {gpu::GemmInput::tf32, "tf32"},
                                                                   {gpu::GemmInput::binary16, "binary16"},
                                                                   {gpu::GemmInput::bfloat16, "bfloat16"}};
  const int s = o.gemm_size;
  const std::size_t count = static_cast<std::size_t>(s) * static_cast<std::size_t>(s);
  gpu::DeviceBuffer a(count), b(count), c(count);
  a.upload(host_uniform(count, o.seed));
  b.upload(host_uniform(count, o.seed + 1));
  const double flops = 2.0 * s * static_cast<double>(s) * s;
  std::vector<GemmFigures> all;
  for (const auto& [input, name] : inputs) {
    GemmFigures g;
    g.input = name;
    g.bare = gpu::time_cublas_gemm(input, s, s, s, o.gemm_repetitions);
    // gpu::gemm as a caller sees it: its rounding copies of the operands
    // (allocated per call), the GEMM and, except for binary32, its wait for
    // the device. It works on the legacy default stream.
    gpu::gemm(input, a.data(), b.data(), c.data(), s, s, s);  // warm-up
    gpu::EventTimer timer;
    timer.mark();
    for (int r = 0; r < o.gemm_call_repetitions; ++r) {
      gpu::gemm(input, a.data(), b.data(), c.data(), s, s, s);
      timer.mark();
    }
    g.call_ms = timer.intervals_ms();
    g.call_median_ms = median(g.call_ms);
    g.call_tflops = flops / (g.call_median_ms * 1e-3) * 1e-12;
    std::cerr << "gemm " << name << ": cuBLAS " << fixed(g.bare.tflops, 1) << " TFLOP/s, gpu::gemm "
              << fixed(g.call_tflops, 1) << " TFLOP/s\n";
    all.push_back(std::move(g));
  }
  return all;
}

// --- Report ---------------------------------------------------------------------------------------------------------

struct Environment {
  std::string date, device, gpu_name;
  gpu::CudaVersions cuda;
};

std::string gpu_name_of(const std::string& description) {
  const auto end = description.find(", compute capability");
  return end == std::string::npos ? description : description.substr(0, end);
}

void print_tables(std::ostream& out, const Options& o, const Environment& env, const std::vector<ModelCase>& models,
                  const std::vector<StepFigures>& steps, const std::vector<GemmFigures>& gemms) {
  out << "# mpsim GPU benchmark (issue #4 §5)\n\n";
  out << "GPU: " << env.device << "; CUDA runtime " << env.cuda.runtime << ", driver " << env.cuda.driver
      << ", cuBLAS " << env.cuda.cublas << ", nvcc " << MPSIM_NVCC_VERSION << "; mpsim " << MPSIM_VERSION << "; "
      << env.date << ".\n\n";
  out << "## Training step, mpsim \"cuda\" backend\n\n";
  out << "Device time per step (CUDA events on the backend's stream): median of " << o.windows << " windows of "
      << o.window_steps << " steps after " << o.warmup_steps
      << " warm-up steps. Synthetic data of Fashion-MNIST's shape (1x28x28, 10 classes), uploaded from host memory "
         "every step; SGD with momentum 0.9.\n\n";
  out << "| model | batch | policy | ms/step | samples/s | speed-up vs fp32 | stats every 10: ms/step | overhead "
         "| stats every step: ms/step | overhead | GEMM TFLOP/s in step |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& m : models) {
    const StepFigures* fp32 = find(steps, m.name, "fp32", 0);
    for (const auto& policy : benchmark_policies()) {
      const StepFigures* off = find(steps, m.name, policy.name, 0);
      const StepFigures* ten = find(steps, m.name, policy.name, 10);
      const StepFigures* every = find(steps, m.name, policy.name, 1);
      if (!off) continue;
      out << "| " << m.name << " | " << m.batch << " | " << policy.name << " | " << fixed(off->median_ms, 3) << " | "
          << fixed(off->samples_per_s, 0) << " | " << (fp32 ? fixed(fp32->median_ms / off->median_ms, 2) + "x" : "n/a")
          << " | " << (ten ? fixed(ten->median_ms, 3) : "n/a") << " | "
          << (ten ? percent(ten->median_ms / off->median_ms) : "n/a") << " | "
          << (every ? fixed(every->median_ms, 3) : "n/a") << " | "
          << (every ? percent(every->median_ms / off->median_ms) : "n/a") << " | "
          << (off->gemm_flops > 0 ? fixed(off->gemm_tflops, 1) : "-") << " |\n";
    }
  }
  const ModelCase& mlp = models.front();
  out << "\nMLP: " << mlp.spec.hidden.size() << " hidden layers of " << mlp.spec.hidden.front()
      << " (ReLU); its GEMMs do "
      << fixed(mlp_gemm_flops(mlp.spec, mlp.batch, core::InputShape{}) * 1e-9, 1)
      << " GFLOP per step. CNN: LeNet-5 (conv 5x5 6, pool, conv 5x5 16, pool, 120, 84, 10).\n";

  out << "\n## GEMM throughput, " << o.gemm_size << "^3, binary32 accumulation\n\n";
  out << "cuBLAS alone: median of " << o.gemm_repetitions
      << " launches with the operands already in the input type. gpu::gemm: median of " << o.gemm_call_repetitions
      << " whole calls (its rounding copies, their allocation and its wait included). In the MLP step: its GEMM "
         "FLOPs over the whole step time (stats off), with the policy whose GEMMs take that input.\n\n";
  out << "| input | cuBLAS ms | cuBLAS TFLOP/s | gpu::gemm ms | gpu::gemm TFLOP/s | MLP step policy | MLP step GEMM "
         "TFLOP/s | step / cuBLAS |\n";
  out << "|---|---|---|---|---|---|---|---|\n";
  for (const auto& g : gemms) {
    std::string policy;
    for (const auto& p : benchmark_policies())
      if (gemm_input_of_policy(p.name) == g.input) policy = p.name;
    const StepFigures* step = find(steps, "mlp", policy, 0);
    out << "| " << g.input << " | " << fixed(g.bare.median_ms, 3) << " | " << fixed(g.bare.tflops, 1) << " | "
        << fixed(g.call_median_ms, 3) << " | " << fixed(g.call_tflops, 1) << " | " << policy << " | "
        << (step ? fixed(step->gemm_tflops, 1) : "n/a") << " | "
        << (step ? fixed(step->gemm_tflops / g.bare.tflops, 2) : "n/a") << " |\n";
  }

  out << "\n## Bars (reported, not asserted)\n\n";
  for (const auto& m : models) {
    const StepFigures* fp32 = find(steps, m.name, "fp32", 0);
    for (const char* mixed : {"fp16-mixed", "bf16-mixed"}) {
      const StepFigures* f = find(steps, m.name, mixed, 0);
      if (!fp32 || !f) continue;
      const double speedup = fp32->median_ms / f->median_ms;
      out << "- " << m.name << ", " << mixed << " step >= 3x faster than fp32: " << fixed(speedup, 2) << "x, "
          << (speedup >= 3.0 ? "met" : "not met") << "\n";
    }
  }
  for (const auto& m : models)
    for (const auto& policy : benchmark_policies()) {
      const StepFigures* off = find(steps, m.name, policy.name, 0);
      const StepFigures* ten = find(steps, m.name, policy.name, 10);
      if (!off || !ten) continue;
      const double ratio = ten->median_ms / off->median_ms;
      out << "- " << m.name << ", " << policy.name << ", stats every 10 steps <= 5% overhead: " << percent(ratio)
          << ", " << (ratio <= 1.05 ? "met" : "not met") << "\n";
    }
  for (const auto& f : steps)
    if (f.skipped_steps > 0)
      out << "- note: " << f.model << " " << f.policy << " (stats interval " << f.stats_interval << ") skipped "
          << f.skipped_steps << " optimiser steps on overflow (dynamic loss scale ended at " << f.final_loss_scale
          << "); a skipped step does less work.\n";
}

std::string report_json(const Options& o, const Environment& env, const std::vector<ModelCase>& models,
                        const std::vector<StepFigures>& steps, const std::vector<GemmFigures>& gemms) {
  std::vector<std::string> model_items;
  for (const auto& m : models) {
    Fields fields{{"name", json(m.name)}, {"kind", json(std::string(core::to_string(m.spec.kind)))}, {"batch", json(m.batch)}};
    if (m.spec.kind == core::ModelKind::mlp)
      fields.emplace_back("hidden", json(std::vector<double>(m.spec.hidden.begin(), m.spec.hidden.end())));
    else fields.emplace_back("layers", json("LeNet-5: conv 5x5 6 (pad 2), pool 2, conv 5x5 16, pool 2, 120, 84, 10"));
    model_items.push_back(object(fields));
  }
  std::vector<std::string> step_items;
  for (const auto& f : steps)
    step_items.push_back(object({{"model", json(f.model)},
                                 {"policy", json(f.policy)},
                                 {"batch", json(f.batch)},
                                 {"stats_interval", json(f.stats_interval)},
                                 {"median_ms_per_step", json(f.median_ms)},
                                 {"samples_per_s", json(f.samples_per_s)},
                                 {"window_ms_per_step", json(f.device_ms)},
                                 {"host_median_ms_per_step", json(f.host_median_ms)},
                                 {"host_window_ms_per_step", json(f.host_ms)},
                                 {"gemm_flops_per_step", json(f.gemm_flops)},
                                 {"gemm_tflops_in_step", f.gemm_flops > 0 ? json(f.gemm_tflops) : "null"},
                                 {"skipped_steps", json(f.skipped_steps)},
                                 {"final_loss_scale", json(f.final_loss_scale)}}));
  std::vector<std::string> gemm_items;
  for (const auto& g : gemms)
    gemm_items.push_back(object({{"input", json(g.input)},
                                 {"m", json(o.gemm_size)},
                                 {"n", json(o.gemm_size)},
                                 {"k", json(o.gemm_size)},
                                 {"cublas_median_ms", json(g.bare.median_ms)},
                                 {"cublas_min_ms", json(g.bare.min_ms)},
                                 {"cublas_max_ms", json(g.bare.max_ms)},
                                 {"cublas_tflops", json(g.bare.tflops)},
                                 {"gpu_gemm_call_ms", json(g.call_ms)},
                                 {"gpu_gemm_median_ms", json(g.call_median_ms)},
                                 {"gpu_gemm_tflops", json(g.call_tflops)}}));
  const Fields settings{{"seed", json(static_cast<std::int64_t>(o.seed))},
                        {"warmup_steps", json(o.warmup_steps)},
                        {"window_steps", json(o.window_steps)},
                        {"windows", json(o.windows)},
                        {"mlp_batch", json(o.mlp_batch)},
                        {"mlp_width", json(o.mlp_width)},
                        {"mlp_depth", json(o.mlp_depth)},
                        {"cnn_batch", json(o.cnn_batch)},
                        {"optimizer", json("sgd, lr 0.05, momentum 0.9")},
                        {"data", json("core::make_synthetic, 1x28x28, 10 classes, uploaded every step")},
                        {"gemm_size", json(o.gemm_size)},
                        {"gemm_repetitions", json(o.gemm_repetitions)},
                        {"gemm_call_repetitions", json(o.gemm_call_repetitions)}};
  std::string out = "{\n  \"program\": \"bench_gpu\",\n";
  out += "  \"mpsim_version\": " + json(MPSIM_VERSION) + ",\n";
  out += "  \"date\": " + json(env.date) + ",\n";
  out += "  \"device\": " + object({{"description", json(env.device)}, {"name", json(env.gpu_name)}}) + ",\n";
  out += "  \"cuda\": " +
         object({{"runtime", json(env.cuda.runtime)},
                 {"driver", json(env.cuda.driver)},
                 {"cublas", json(env.cuda.cublas)},
                 {"nvcc", json(MPSIM_NVCC_VERSION)}}) +
         ",\n";
  out += "  \"settings\": " + object(settings) + ",\n";
  out += "  \"models\": " + array(model_items) + ",\n";
  out += "  \"steps\": " + array(step_items) + ",\n";
  out += "  \"gemm\": " + array(gemm_items) + "\n}\n";
  return out;
}

int run(const Options& o) {
  const gpu::DeviceInfo info = gpu::query_device();
  if (!info.available) {
    std::cerr << "bench_gpu: " << info.description << ": nothing measured\n";
    return exit_no_device;
  }
  Environment env;
  env.date = utc_now();
  env.device = info.description;
  env.gpu_name = gpu_name_of(info.description);
  env.cuda = gpu::cuda_versions();
  std::filesystem::create_directories(o.out_dir);
  const std::filesystem::path json_path = o.out_dir / "bench_gpu.json";
  std::cerr << "bench_gpu: " << env.device << "; CUDA runtime " << env.cuda.runtime << "\n";

  std::vector<ModelCase> models;
  {
    ModelCase mlp{"mlp", {}, o.mlp_batch};
    mlp.spec.kind = core::ModelKind::mlp;
    mlp.spec.hidden.assign(static_cast<std::size_t>(o.mlp_depth), o.mlp_width);
    models.push_back(mlp);
    ModelCase cnn{"cnn", {}, o.cnn_batch};
    cnn.spec.kind = core::ModelKind::cnn;
    models.push_back(cnn);
  }
  std::vector<StepFigures> steps;
  const std::vector<core::Policy> policies = benchmark_policies();
  for (const auto& m : models) {
    // 8 batches of training data (the steps cycle through them, reshuffled per
    // epoch) and one of test data for the final evaluation.
    const core::TrainTest data = core::make_synthetic(o.seed, 8 * m.batch, m.batch);
    auto backend = gpu::make_cuda_backend();  // per model: its cached device memory goes with it
    for (const auto& policy : policies)
      for (const int stats_interval : {0, 10, 1}) {
        steps.push_back(time_steps(*backend, o, m, policy, stats_interval, data));
        const StepFigures& f = steps.back();
        std::cerr << m.name << " " << policy.name << " stats " << stats_interval << ": " << fixed(f.median_ms, 3)
                  << " ms/step (host " << fixed(f.host_median_ms, 3) << ")\n";
      }
  }
  const std::vector<GemmFigures> gemms = time_gemms(o);

  print_tables(std::cout, o, env, models, steps, gemms);
  std::ofstream file(json_path);
  file << report_json(o, env, models, steps, gemms);
  file.close();
  if (!file) throw std::runtime_error("cannot write " + json_path.string());
  std::cerr << "bench_gpu: wrote " << json_path.string() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "bench_gpu: " << e.what() << "\n" << usage_text;
    return exit_usage;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu: error: " << e.what() << "\n";
    return 1;
  }
}
