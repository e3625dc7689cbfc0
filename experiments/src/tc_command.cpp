#include "tc_command.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "accumulation_sweep.hpp"
#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/tensor_core_vectors.hpp"
#include "usage_error.hpp"
#include "value_text.hpp"

namespace mpsim::cli {
namespace {

namespace fs = std::filesystem;


// Format names in any case, as -m takes them (H100:E4M3).
Format format_named(const std::string& name, const char* option) {
  if (auto f = parse_format(lower_case(name))) return *f;
  throw UsageError(fmt::format("{} '{}' is not a format. Accepted: {}", option, name, format_names()));
}

// --- tc validate -------------------------------------------------------------------

struct ValidateArgs {
  std::string gpu, input, output;  // not given: every one found in DIR
  bool gpu_given = false, input_given = false, output_given = false;
  std::string dir;
  bool verbose = false;
};

constexpr std::array kVectorInputs{formats::binary16, formats::bfloat16, formats::tf32, formats::e4m3, formats::e5m2};
constexpr std::array kVectorOutputs{formats::binary32, formats::binary16};

std::string vector_names(std::span<const Format> formats, bool output) {
  std::string names;
  for (const Format& f : formats) names += (names.empty() ? "" : ", ") + lower_case(tensor_core_vector_name(f, output));
  return names;
}

// The formats --input or --output selects: every one the vectors have when
// not given; an empty value is refused, not read as "every one".
std::vector<Format> formats_asked(const std::string& name, bool given, const char* option,
                                  std::span<const Format> all, bool output) {
  if (!given) return {all.begin(), all.end()};
  if (name.empty())
    throw UsageError(fmt::format("{} is empty; give one of {}, or leave {} out for every one", option,
                                 vector_names(all, output), option));
  const Format f = format_named(name, option);
  if (tensor_core_vector_name(f, output).empty())
    throw UsageError(fmt::format("{} {}: no measured tensor-core vectors hold {} {}; accepted: {}", option, name,
                                 f.name(), output ? "outputs" : "inputs", vector_names(all, output)));
  return {f};
}

// DIR's folder for a GPU ("" when none), two folders differing only in case refused.
std::string folder_for(const fs::path& dir, std::string_view gpu) {
  try {
    return tensor_core_vector_folder(dir, gpu);
  } catch (const std::runtime_error& e) {
    throw UsageError(fmt::format("{}; nothing validated", e.what()));
  }
}

struct GpuFolder {
  std::string gpu, folder;  // the model's name, DIR's spelling
};

std::vector<GpuFolder> gpu_folders(const fs::path& dir) {
  std::vector<GpuFolder> found;
  for (std::string_view gpu : tensor_core_gpus())
    if (std::string folder = folder_for(dir, gpu); !folder.empty()) found.push_back({std::string(gpu), folder});
  return found;
}

std::string folders_held(const fs::path& dir) {
  std::string held;
  for (const GpuFolder& g : gpu_folders(dir)) held += (held.empty() ? "" : ", ") + g.folder + "/";
  return held.empty() ? dir.string() + " holds no GPU folder" : dir.string() + " holds " + held;
}

// "fp16 -> fp32, bf16 -> fp32": the GPU's models that measured vectors could check.
std::string vector_models(std::string_view gpu) {
  std::string list;
  for (const auto& [input, output] : tensor_core_preset_formats(gpu)) {
    const std::string in = tensor_core_vector_name(input, false), out = tensor_core_vector_name(output, true);
    if (!in.empty() && !out.empty()) list += (list.empty() ? "" : ", ") + lower_case(in) + " -> " + out;
  }
  return list;
}

// One GPU, input and output: validated, or said why not.
struct Combination {
  std::string label;    // "H100 fp16 -> fp32"
  std::string skipped;  // why it is not validated; empty when it is
  MeasuredFiles files;
  std::optional<TensorCoreModel> model;
  std::vector<MeasuredCase> cases;
};

int run_validate(const ValidateArgs& args) {
  const fs::path dir(args.dir);
  if (!fs::is_directory(dir))
    throw UsageError(fmt::format("'{}' is not a folder; give the folder that holds V100/, A100/, H100/ "
                                 "(../shared/tensor-core-vectors)",
                                 args.dir));
  const std::vector<Format> inputs = formats_asked(args.input, args.input_given, "--input", kVectorInputs, false);
  const std::vector<Format> outputs = formats_asked(args.output, args.output_given, "--output", kVectorOutputs, true);
  const std::string asked = fmt::format(
      "{} -> {}", args.input_given ? lower_case(tensor_core_vector_name(inputs[0], false)) : "any input",
      args.output_given ? tensor_core_vector_name(outputs[0], true) : "any output");
  std::vector<GpuFolder> gpus;
  if (args.gpu_given) {
    std::string known;
    for (std::string_view model : tensor_core_gpus()) known += (known.empty() ? "" : ", ") + std::string(model);
    if (args.gpu.empty())
      throw UsageError(fmt::format("--gpu is empty; give a GPU (any case: {}), or leave --gpu out for every one in DIR",
                                   known));
    const auto& names = tensor_core_gpus();
    if (std::find(names.begin(), names.end(), lower_case(args.gpu)) == names.end())
      throw UsageError(fmt::format("no model for GPU '{}' (models, any case: {})", args.gpu, known));
    // The model before the files: a GPU without the instruction is said so, whatever DIR holds.
    const bool modelled = std::any_of(inputs.begin(), inputs.end(), [&](const Format& in) {
      return std::any_of(outputs.begin(), outputs.end(),
                         [&](const Format& out) { return tensor_core_preset(args.gpu, in, out).has_value(); });
    });
    if (!modelled)
      throw UsageError(fmt::format("{} has no model for {}: the GPU has no such instruction, or no model of it is "
                                   "published (docs/tensor_cores.md); its models: {}. Nothing validated",
                                   args.gpu, asked, vector_models(args.gpu)));
    const std::string folder = folder_for(dir, args.gpu);
    if (folder.empty())
      throw UsageError(fmt::format("no measured vectors for {} in {}: it has no {}/ folder (nothing validated; {})",
                                   args.gpu, dir.string(), args.gpu, folders_held(dir)));
    gpus.push_back({lower_case(args.gpu), folder});
  } else {
    gpus = gpu_folders(dir);
  }

  // Every file is found and read before anything is reported, so damaged
  // vectors stop the command before its first line.
  std::vector<Combination> combinations;
  for (const GpuFolder& gpu : gpus)
    for (const Format& input : inputs)
      for (const Format& output : outputs) {
        Combination one;
        one.label = fmt::format("{} {} -> {}", gpu.folder, tensor_core_vector_name(input, false),
                                tensor_core_vector_name(output, true));
        try {
          one.files = find_measured_files(dir, gpu.gpu, input, output);
        } catch (const std::runtime_error& e) {
          throw UsageError(fmt::format("{}; nothing validated", e.what()));
        }
        one.model = tensor_core_preset(gpu.gpu, input, output);
        if (!one.model && !one.files.d.found) continue;  // no such instruction, and nothing measured
        if (!one.model)
          one.skipped = fmt::format("measured, but {} has no model for it (no such instruction, or none published: "
                                    "docs/tensor_cores.md); skipped",
                                    gpu.folder);
        else if (!one.files.d.found)
          one.skipped = fmt::format("not measured (no {}, nor .txt); skipped", one.files.d.path.string());
        combinations.push_back(std::move(one));
      }
  const bool none = std::all_of(combinations.begin(), combinations.end(),
                                [](const Combination& c) { return !c.skipped.empty(); });
  if (none) {
    std::string why;
    for (const Combination& c : combinations) why += fmt::format("; {}: {}", c.label, c.skipped);
    throw UsageError(fmt::format("no measured vectors with a model for {} under {} ({}){}. Nothing validated", asked,
                                 dir.string(), folders_held(dir), why));
  }
  for (Combination& c : combinations) {
    if (!c.skipped.empty()) continue;
    try {
      c.cases = read_measured_cases(c.files);
    } catch (const std::runtime_error& e) {
      throw UsageError(fmt::format("{}. Nothing validated", e.what()));
    }
  }

  std::size_t passed = 0, failed = 0;
  for (const Combination& c : combinations) {
    if (!c.skipped.empty()) {
      fmt::print("{}: {}\n", c.label, c.skipped);
      continue;
    }
    const VectorCheck check = check_measured_cases(c.cases, *c.model);
    passed += check.passed;
    failed += check.failed;
    fmt::print("{}: {} passed, {} failed\n", c.label, check.passed, check.failed);
    const std::size_t shown = args.verbose ? check.first_failures.size() : std::min<std::size_t>(3, check.first_failures.size());
    for (std::size_t i = 0; i < shown; ++i) fmt::print("  {}\n", check.first_failures[i]);
  }
  fmt::print("{} passed, {} failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

// --- tc dot ------------------------------------------------------------------------

struct DotArgs {
  std::string models = "h100,fp32,fp16,pairwise-fp32,exact";
  std::string input = "binary16";
  std::string output = "binary32";
  std::vector<std::string> a, b;
  std::string c = "0";
};

// The text's values in `format`, each rounded once to nearest-even; a note for each that changes.
std::vector<float> values_in(const Format& format, const std::vector<std::string>& tokens, const char* name,
                             std::vector<std::string>& notes) {
  std::vector<float> v;
  for (const std::string& token : tokens) {
    const ParsedNumber number = parse_number(token);
    const Rounded r = round_text(format, Rounding{}, number, 0);
    const double value = to_double(format, r.bits);
    if (!(value == number.nearest) && !std::isnan(value))
      notes.push_back(fmt::format("-{} value {} is not a {} value; rounded to nearest-even: {}", name, token,
                                  format.name(), exact_scientific(value)));
    v.push_back(static_cast<float>(value));
  }
  return v;
}

// -m's comma-separated names; a piece with '=' continues a custom "tc:KEY=VALUE,..." model.
std::vector<std::string> model_names(const std::string& list) {
  if (list.empty()) throw UsageError("-m is empty; give models, e.g. -m h100,fp32");
  std::vector<std::string> names;
  std::size_t piece_count = 0;
  for (std::size_t start = 0;; ++piece_count) {
    const std::size_t comma = list.find(',', start);
    std::string piece = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (piece.empty())
      throw UsageError(fmt::format("-m '{}' has an empty model name {}; remove the extra comma", list,
                                   piece_count == 0 ? "before its first comma"
                                   : comma == std::string::npos ? "after its last comma"
                                                                : "between commas"));
    if (!names.empty() && piece.find('=') != std::string::npos && piece.rfind("tc:", 0) != 0 &&
        names.back().rfind("tc:", 0) == 0)
      names.back() += "," + piece;
    else
      names.push_back(std::move(piece));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

bool same_value(float x, float y) {
  return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y) || (std::isnan(x) && std::isnan(y));
}

// Notes where dot() rounds an operand that the header shows otherwise: a
// tensor core rounds a and b to its input format and c to its output format
// (nearest-even); recursive, pairwise and blocked sums start from c rounded
// into their format in their mode. The exact model rounds a·b + c once only.
void note_operand_rounding(const std::string& name, const AccumulationModel& model, const std::vector<float>& a,
                           const std::vector<float>& b, float c, std::vector<std::string>& notes) {
  if (model.kind == AccumulationKind::exact) return;
  if (model.kind == AccumulationKind::tensor_core) {
    const Format& in = model.tensor_core.input;
    for (const auto& [which, values] : {std::pair{"a", &a}, std::pair{"b", &b}})
      for (const float x : *values)
        if (const float seen = to_float(in, round_to_format(in, Rounding{}, x).bits); !same_value(seen, x))
          notes.push_back(fmt::format("{} takes {} inputs: -{} value {} is {}", name, in.name(), which,
                                      exact_scientific(x),
                                      seen == 0.0f && in.subnormals == Subnormals::flush_to_zero
                                          ? std::string("flushed to zero (its input format flushes subnormals)")
                                          : "rounded to nearest-even: " + exact_scientific(seen)));
  }
  const float start = dot(model, {}, {}, c);  // no products: the c the model starts from
  if (same_value(start, c)) return;
  if (model.kind == AccumulationKind::tensor_core)
    notes.push_back(fmt::format("{} takes c in its {} output format: c = {} is rounded to nearest-even: {}", name,
                                model.tensor_core.output.name(), exact_scientific(c), exact_scientific(start)));
  else
    notes.push_back(fmt::format("{} starts its sum from c rounded into {} ({}): c = {} becomes {}", name,
                                model.format.name(), to_string(model.mode), exact_scientific(c),
                                exact_scientific(start)));
}

int run_dot(const DotArgs& args) {
  const Format input = format_named(args.input, "--input");
  const Format output = format_named(args.output, "--output");
  if (args.a.size() != args.b.size())
    throw UsageError(fmt::format("-a has {} values and -b has {}; give K values to each", args.a.size(), args.b.size()));
  if (args.a.empty()) throw UsageError("give the vectors, e.g. -a 1 2 3 -b 0.5 0.25 1");
  std::vector<std::string> notes;
  const std::vector<float> a = values_in(input, args.a, "a", notes), b = values_in(input, args.b, "b", notes);
  const float c = values_in(output, {args.c}, "c", notes)[0];
  // Every model is read and run before anything is printed: a bad one leaves no output behind.
  struct Result {
    std::string name;
    float d;
  };
  std::vector<Result> results;
  for (const std::string& name : model_names(args.models)) {
    AccumulationModel model;
    try {
      model = parse_accumulation_model_or_throw(name, input, output);  // a bare GPU takes --input and --output
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    note_operand_rounding(name, model, a, b, c, notes);
    try {
      results.push_back({name, dot(model, a, b, c)});
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("{}: {}", name, e.what()));
    }
  }
  for (const std::string& note : notes) fmt::print(stderr, "note: {}\n", note);
  fmt::print("K = {}, inputs {}, c = {}\n", a.size(), input.name(), exact_scientific(c));
  for (const Result& r : results) fmt::print("{:<18} {:>28}  {}\n", r.name, exact_scientific(r.d), hex_float(r.d));
  return 0;
}

}  // namespace

void add_tc_command(CLI::App& app, std::function<int()>& run) {
  auto* tc = app.add_subcommand("tc", "Tensor-core and accumulation models: validate, evaluate, sweep K");
  tc->require_subcommand(1);

  auto v = std::make_shared<ValidateArgs>();
  auto* validate = tc->add_subcommand(
      "validate", "Check the tensor-core models bit for bit against vectors measured on GPUs; ends with 'N passed, M failed'");
  validate->add_option("--gpu", v->gpu,
                       "Any case: V100, A100, A30, A2, H100, H200, Ada, L40S, RTX6000Ada, B200, B200RN, RTXPRO6000, "
                       "MI100, MI210, MI250, MI300A, MI300X (default: every one with a folder in DIR; only V100, "
                       "A100 and H100 have measured vectors in shared/)");
  validate->add_option("--input", v->input,
                       "Input format, any case: fp16, bf16, tf32, e4m3, e5m2 (default: every one)");
  validate->add_option("--output", v->output, "Output format, any case: fp32 or fp16 (default: both)");
  validate->add_option("dir", v->dir, "Folder of the measured vectors (GPU/FORMAT/*.txt.gz or *.txt), e.g. ../shared/tensor-core-vectors")
      ->required();
  validate->add_flag("-v,--verbose", v->verbose, "Show up to 10 failing cases a folder instead of 3");
  validate->callback([&run, v, validate] {
    v->gpu_given = validate->count("--gpu") > 0;
    v->input_given = validate->count("--input") > 0;
    v->output_given = validate->count("--output") > 0;
    run = [v] { return run_validate(*v); };
  });

  auto d = std::make_shared<DotArgs>();
  auto* dot_cmd = tc->add_subcommand("dot", "One inner product a·b + c under several accumulation models");
  dot_cmd->add_option("--models,-m", d->models, "Comma-separated models: " + std::string(accumulation_model_names()))
      ->capture_default_str();
  dot_cmd->add_option("--input", d->input, "Format of a and b (any case)")->capture_default_str();
  dot_cmd->add_option("--output", d->output,
                      "Format of c and of a tensor core's result (binary32 or binary16, any case)")
      ->capture_default_str();
  dot_cmd->add_option("-a", d->a, "The K values of a (decimal or 0x1.8p-3)")->required()->expected(1, -1);
  dot_cmd->add_option("-b", d->b, "The K values of b")->required()->expected(1, -1);
  dot_cmd->add_option("-c", d->c, "The addend c")->capture_default_str();
  dot_cmd->callback([&run, d] { run = [d] { return run_dot(*d); }; });

  add_sweep_subcommand(*tc, run);
}

}  // namespace mpsim::cli
