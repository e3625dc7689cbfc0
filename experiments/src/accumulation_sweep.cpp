#include "accumulation_sweep.hpp"

#include <fmt/core.h>
#include <fmt/os.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "usage_error.hpp"
#include "value_text.hpp"

namespace mpsim::cli {
namespace {

// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break, as a spelled-out tensor-core
// model ("tc:input=e4m3,output=fp32,...") does.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char ch : text) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return quoted + "\"";
}

namespace fs = std::filesystem;

struct SweepConfig {
  std::string name = "accumulation-sweep";
  std::string output = "runs/accumulation_sweep.csv";
  std::uint64_t seed = 1;
  std::vector<std::string> models{"fp32", "pairwise-fp32", "blocked-fp32-32", "fp16", "h100", "a100", "v100"};
  std::vector<std::string> inputs{"binary16", "bfloat16"};
  std::vector<std::string> distributions{"uniform", "normal", "heavy-tailed"};
  int k_min_log2 = 4, k_max_log2 = 16;
  int trials = 32;     // dot products per (model, input, distribution, K)
  int gemm_size = 16;  // one m x n GEMM per point, m = n = gemm_size (0: none)
};

template <typename T>
void read_key(const toml::table& t, const char* key, T& value) {
  const toml::node* node = t.get(key);
  if (!node) return;
  if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    const toml::array* array = node->as_array();
    if (!array) throw UsageError(fmt::format("config key '{}' must be an array of strings", key));
    value.clear();
    for (const toml::node& item : *array) {
      auto text = item.value<std::string>();
      if (!text) throw UsageError(fmt::format("config key '{}' must be an array of strings", key));
      value.push_back(*text);
    }
  } else {
    auto v = node->value<T>();
    if (!v) throw UsageError(fmt::format("config key '{}' has the wrong type", key));
    value = *v;
  }
}

// Refuses two entries of a list that mean the same (their canonical names
// are equal): the same rows twice.
template <typename Canonical>
void refuse_duplicates(const char* key, const std::vector<std::string>& names, Canonical canonical) {
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (canonical(names[j]) == canonical(names[i]))
        throw UsageError(names[i] == names[j]
                             ? fmt::format("{}: '{}' is given twice; give each once", key, names[i])
                             : fmt::format("{}: '{}' and '{}' are the same ({}); give each once", key, names[j],
                                           names[i], canonical(names[i])));
}

SweepConfig load(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw UsageError(fmt::format("config {}: {}", path, e.description()));
  }
  for (const std::string& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos) throw UsageError(fmt::format("override '{}' is not KEY=VALUE", o));
    try {
      toml::table one = toml::parse(o.substr(0, eq) + " = " + o.substr(eq + 1));
      for (auto&& [k, v] : one) t.insert_or_assign(k, v);
    } catch (const toml::parse_error& e) {
      throw UsageError(fmt::format("override '{}': {} (strings need quotes: models='[\"fp32\"]')", o, e.description()));
    }
  }
  static constexpr std::string_view known[] = {"name", "output", "seed", "models", "inputs", "distributions",
                                               "k_min_log2", "k_max_log2", "trials", "gemm_size"};
  for (auto&& [k, v] : t)
    if (std::find(std::begin(known), std::end(known), k.str()) == std::end(known))
      throw UsageError(fmt::format("unknown config key '{}'; accepted: name, output, seed, models, inputs, "
                                   "distributions, k_min_log2, k_max_log2, trials, gemm_size",
                                   k.str()));
  SweepConfig c;
  read_key(t, "name", c.name);
  read_key(t, "output", c.output);
  std::int64_t seed = static_cast<std::int64_t>(c.seed), k_min = c.k_min_log2, k_max = c.k_max_log2,
               trials = c.trials, gemm = c.gemm_size;
  read_key(t, "seed", seed);
  read_key(t, "models", c.models);
  read_key(t, "inputs", c.inputs);
  read_key(t, "distributions", c.distributions);
  read_key(t, "k_min_log2", k_min);
  read_key(t, "k_max_log2", k_max);
  read_key(t, "trials", trials);
  read_key(t, "gemm_size", gemm);
  if (seed < 0) throw UsageError("seed must be >= 0");
  if (k_min < 0 || k_max > 24 || k_min > k_max) throw UsageError("need 0 <= k_min_log2 <= k_max_log2 <= 24");
  if (trials < 1 || trials > 100000) throw UsageError("trials must be in 1..100000");
  if (gemm < 0 || gemm > 256) throw UsageError("gemm_size must be in 0..256");
  c.seed = static_cast<std::uint64_t>(seed);
  c.k_min_log2 = static_cast<int>(k_min), c.k_max_log2 = static_cast<int>(k_max);
  c.trials = static_cast<int>(trials), c.gemm_size = static_cast<int>(gemm);
  for (const auto& [key, list, example] : {std::tuple{"models", &c.models, "fp32"},
                                           std::tuple{"inputs", &c.inputs, "binary16"},
                                           std::tuple{"distributions", &c.distributions, "uniform"}})
    if (list->empty())
      throw UsageError(fmt::format("{} is empty: nothing to sweep; give at least one, e.g. {}='[\"{}\"]'", key, key,
                                   example));
  for (const std::string& d : c.distributions)
    if (d != "uniform" && d != "normal" && d != "heavy-tailed")
      throw UsageError(fmt::format("unknown distribution '{}'; accepted: uniform, normal, heavy-tailed", d));
  refuse_duplicates("distributions", c.distributions, [](const std::string& d) { return d; });
  return c;
}

// The exact a·b as binary64: every product of inputs of at most 24
// significant bits is exact in binary64 (48 bits), and the sum is kept as an
// unevaluated pair (hi, lo) by TwoSum (Knuth; Ogita, Rump, Oishi 2005), whose
// error relative to sum |a_k b_k| is about K 2^-106: far below every error
// measured here.
double reference_dot(const float* a, const float* b, std::size_t k, std::size_t stride_b) {
  double hi = 0.0, lo = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    const double p = static_cast<double>(a[i]) * static_cast<double>(b[i * stride_b]);
    const double s = hi + p;
    const double bp = s - hi;
    lo += (hi - (s - bp)) + (p - bp);
    hi = s;
  }
  return hi + lo;
}

double absolute_dot(const float* a, const float* b, std::size_t k, std::size_t stride_b) {
  double s = 0.0;
  for (std::size_t i = 0; i < k; ++i) s += std::abs(static_cast<double>(a[i]) * static_cast<double>(b[i * stride_b]));
  return s;
}

// Values rounded once, to nearest-even, into the input format: uniform
// [0, 1); normal N(0, 1); heavy-tailed: a random sign times 2^N(0, 3)
// (log-normal magnitudes over about 20 binades, like a layer's gradients).
void fill(std::vector<float>& v, const std::string& distribution, const Format& input, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> sample(v.size());
  for (double& y : sample) {
    if (distribution == "uniform") y = uniform(rng);
    else if (distribution == "normal") y = normal(rng);
    else y = ((rng() & 1) ? 1.0 : -1.0) * std::exp2(3.0 * normal(rng));
  }
  QuantizeOptions o;
  o.threads = 1;
  quantize(input, sample, sample, o);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(sample[i]);  // exact: the format fits in binary32
}


// A sweep input in any case. It must fit in binary32: reference_dot takes the
// binary64 products of the inputs as exact, which holds for at most 24
// significant bits within binary32's range (and fill stores them as floats).
Format sweep_input(const std::string& name) {
  const auto input = parse_format(lower_case(name));
  if (!input) throw UsageError(fmt::format("inputs: '{}' is not a format; accepted: {}", name, format_names()));
  if (!fits_in_float(*input))
    throw UsageError(fmt::format(
        "inputs: {} would break the exact reference, which takes the binary64 products of the inputs as exact: "
        "that needs inputs of at most 24 significant bits within binary32's range; accepted: the tensor-core input "
        "formats (binary16, bfloat16, tf32, e4m3, e5m2, e3m2, e2m3, e2m1), binary32, or any eXmY that fits in "
        "binary32",
        input->name()));
  return *input;
}

// Whether every value of `data` is a value of `format` (precision and range;
// subnormal handling aside, which is the GPU's own): a tensor core that rounds
// its inputs to `format` then sums the sweep's data as drawn, so the rows
// measure accumulation and nothing else.
bool holds_every_value(const Format& format, const Format& data) {
  return format.mantissa_bits >= data.mantissa_bits && format.largest_finite() >= data.largest_finite() &&
         format.emin() - format.mantissa_bits <= data.emin() - data.mantissa_bits;
}

struct Args {
  std::string config;
  std::vector<std::string> overrides;
  std::string output;
  bool output_given = false;  // -o '' is refused, not read as "the config's"
  bool force = false;
};

int run_sweep(const Args& args) {
  SweepConfig c = load(args.config, args.overrides);
  if (args.output_given) {
    if (args.output.empty())
      throw UsageError(fmt::format("-o is empty; give the CSV file to write, or leave -o out for the config's ({})",
                                   c.output));
    c.output = args.output;
  }
  if (c.output.empty()) throw UsageError("the config's output is empty; give the CSV file to write with -o PATH");
  std::vector<Format> inputs;
  for (const std::string& name : c.inputs) inputs.push_back(sweep_input(name));
  refuse_duplicates("inputs", c.inputs, [](const std::string& name) { return parse_format(lower_case(name))->name(); });
  refuse_duplicates("models", c.models, [](const std::string& name) { return lower_case(name); });
  struct Arm {
    std::string model_name;
    std::string input_name;
    Format input;
    AccumulationModel model;
  };
  std::vector<Arm> arms;
  std::vector<std::string> skipped;
  const auto& gpus = tensor_core_gpus();
  for (const Format& input : inputs) {
    for (const std::string& name : c.models) {
      const bool bare_gpu = std::find(gpus.begin(), gpus.end(), lower_case(name)) != gpus.end();
      if (bare_gpu && !tensor_core_preset(name, input, formats::binary32)) {
        skipped.push_back(fmt::format("{} on {} (no such instruction)", name, input.name()));
        continue;
      }
      AccumulationModel model;
      try {
        model = parse_accumulation_model_or_throw(name, input);
      } catch (const std::invalid_argument& e) {
        throw UsageError(fmt::format("models: {}", e.what()));
      }
      if (model.kind == AccumulationKind::tensor_core && !holds_every_value(model.tensor_core.input, input)) {
        skipped.push_back(fmt::format("{} on {} (its inputs are {}; the sweep's data is {})", name, input.name(),
                                      model.tensor_core.input.name(), input.name()));
        continue;
      }
      // A model twice is refused (fp16 and binary16 are one); two GPUs that share a model (h100, h200) keep a
      // row each, since a sweep comparing GPUs names every one.
      for (const Arm& other : arms)
        if (other.input == input && to_string(other.model) == to_string(model) &&
            (lower_case(other.model_name) == lower_case(name) || model.kind != AccumulationKind::tensor_core))
          throw UsageError(fmt::format("models: '{}' and '{}' are the same model on {} data ({}); give each once",
                                       other.model_name, name, input.name(), to_string(model)));
      arms.push_back({name, input.name(), input, model});
    }
  }
  if (arms.empty()) {
    std::string why;
    for (const std::string& s : skipped) why += (why.empty() ? "" : "; ") + s;
    throw UsageError(fmt::format("nothing to sweep: every model was skipped ({})", why));
  }
  const fs::path output(c.output);
  if (fs::exists(output) && !args.force)
    throw UsageError(fmt::format("output '{}' exists; pass --force to overwrite it, or -o PATH", output.string()));
  if (output.has_parent_path()) fs::create_directories(output.parent_path());
  const fs::path partial = fs::path(output).concat(".partial");
  std::ofstream out(partial);
  if (!out) throw UsageError(fmt::format("cannot write '{}'; choose another path with -o", partial.string()));
  // Comment lines first: the config as run, so the file carries its seed.
  out << "# mpsim tc sweep " << c.name << ", mpsim " << MPSIM_VERSION << "\n# seed = " << c.seed
      << "\n# trials = " << c.trials << ", gemm_size = " << c.gemm_size << ", K = 2^" << c.k_min_log2 << " .. 2^"
      << c.k_max_log2 << "\n";
  for (const auto& s : skipped) out << "# skipped: " << s << "\n";
  // relative_error: (computed - exact) / |exact|, signed (a GEMM row: the
  // largest |.| over its elements); normalised_error: |computed - exact| /
  // sum_k |a_k b_k| (a GEMM row: the largest over its elements), the quantity
  // gamma_K bounds.
  out << "model,input,distribution,K,measure,trial,relative_error,normalised_error,unit_roundoff\n";
  for (const auto& s : skipped) fmt::print(stderr, "skipped: {}\n", s);

  const auto start = std::chrono::steady_clock::now();
  std::size_t arm_index = 0;
  for (const Arm& arm : arms) {
    ++arm_index;
    const double u = arm.model.format.unit_roundoff();  // of the accumulator (a tensor core's: its output)
    for (std::size_t d = 0; d < c.distributions.size(); ++d) {
      const std::string& dist = c.distributions[d];
      for (int e = c.k_min_log2; e <= c.k_max_log2; ++e) {
        const std::size_t k = std::size_t{1} << e;
        // The same inputs for every model: the stream depends on (seed,
        // input, distribution, K) only.
        std::seed_seq seq{c.seed, static_cast<std::uint64_t>(std::hash<std::string>{}(arm.input_name)),
                          static_cast<std::uint64_t>(d), static_cast<std::uint64_t>(e)};
        std::mt19937_64 rng(seq);
        std::vector<float> a(k), b(k);
        for (int t = 0; t < c.trials; ++t) {
          fill(a, dist, arm.input, rng);
          fill(b, dist, arm.input, rng);
          const double exact = reference_dot(a.data(), b.data(), k, 1);
          const double computed = dot(arm.model, a, b, 0.0f);
          const double error = computed - exact;  // signed: truncation shows as a bias toward zero
          out << fmt::format("{},{},{},{},dot,{},{:.9g},{:.9g},{:.9g}\n", csv_field(arm.model_name), arm.input_name, dist, k, t,
                             exact != 0.0 ? error / std::abs(exact) : (error == 0.0 ? 0.0 : error * INFINITY),
                             std::abs(error) / absolute_dot(a.data(), b.data(), k, 1), u);
        }
        if (c.gemm_size > 0) {
          const int n = c.gemm_size;
          std::vector<float> A(static_cast<std::size_t>(n) * k), B(k * static_cast<std::size_t>(n)),
              C(static_cast<std::size_t>(n) * n);
          fill(A, dist, arm.input, rng);
          fill(B, dist, arm.input, rng);
          gemm(arm.model, A.data(), B.data(), C.data(), n, n, static_cast<int>(k), false, 0);
          // Componentwise: max_ij |C - C_exact|_ij / (|A||B|)_ij, the quantity gamma_K bounds.
          double worst = 0.0, worst_relative = 0.0;
          for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j) {
              const float* row = A.data() + static_cast<std::size_t>(i) * k;
              const double exact = reference_dot(row, B.data() + j, k, static_cast<std::size_t>(n));
              const double error = std::abs(static_cast<double>(C[static_cast<std::size_t>(i) * n + j]) - exact);
              worst = std::max(worst, error / absolute_dot(row, B.data() + j, k, static_cast<std::size_t>(n)));
              if (exact != 0.0) worst_relative = std::max(worst_relative, error / std::abs(exact));
            }
          out << fmt::format("{},{},{},{},gemm,0,{:.9g},{:.9g},{:.9g}\n", csv_field(arm.model_name), arm.input_name, dist, k,
                             worst_relative, worst, u);
        }
      }
    }
    fmt::print(stderr, "[{}/{}] {} on {} done ({:.1f} s)\n", arm_index, arms.size(), arm.model_name, arm.input_name,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  out.close();
  if (!out) throw std::runtime_error(fmt::format("writing '{}' failed", partial.string()));
  fs::rename(partial, output);
  fmt::print("wrote {} ({} models x inputs, {} distributions, K = 2^{}..2^{})\n", output.string(), arms.size(),
             c.distributions.size(), c.k_min_log2, c.k_max_log2);
  return 0;
}

}  // namespace

void add_sweep_subcommand(CLI::App& tc, std::function<int()>& run) {
  auto args = std::make_shared<Args>();
  auto* sweep = tc.add_subcommand("sweep", "Error of dot products and GEMMs against the exact result as K grows (CSV)");
  sweep->add_option("config", args->config, "Sweep config (TOML), e.g. experiments/configs/accumulation.toml")
      ->required()
      ->check(CLI::ExistingFile);
  sweep->add_option("overrides", args->overrides, "KEY=VALUE overrides: k_max_log2=10 trials=4");
  sweep->add_option("-o,--output", args->output, "CSV file to write (overrides the config's output)");
  sweep->add_flag("-f,--force", args->force, "Overwrite an existing output file");
  sweep->callback([&run, args, sweep] {
    args->output_given = sweep->count("--output") > 0;
    run = [args] { return run_sweep(*args); };
  });
}

}  // namespace mpsim::cli
