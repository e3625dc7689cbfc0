#include "tc_command.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
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

Format format_named(const std::string& name, const char* option) {
  if (auto f = parse_format(name)) return *f;
  throw UsageError(fmt::format("{} '{}' is not a format. Accepted: {}", option, name, format_names()));
}

// --- tc validate -------------------------------------------------------------------

struct ValidateArgs {
  std::string gpu, input, output;  // empty: every one found in DIR
  std::string dir;
  bool verbose = false;
};

int run_validate(const ValidateArgs& args) {
  const fs::path dir(args.dir);
  if (!fs::is_directory(dir))
    throw UsageError(fmt::format("'{}' is not a folder; give the folder that holds V100/, A100/, H100/ "
                                 "(../shared/tensor-core-vectors)",
                                 args.dir));
  // GPU names in any case; each GPU's folder in DIR in any case too (V100, Ada).
  const auto lower = [](std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  };
  std::vector<std::string> gpus;  // the folders' spellings
  std::string known;
  for (std::string_view model : tensor_core_gpus()) known += (known.empty() ? "" : ", ") + std::string(model);
  if (!args.gpu.empty()) {
    const auto& names = tensor_core_gpus();
    if (std::find(names.begin(), names.end(), lower(args.gpu)) == names.end())
      throw UsageError(fmt::format("no model for GPU '{}' (models, any case: {})", args.gpu, known));
    const std::string folder = tensor_core_vector_folder(dir, args.gpu);
    if (folder.empty())
      throw UsageError(fmt::format("no measured vectors for {} in {}: it has no {}/ folder (nothing validated; "
                                   "shared/tensor-core-vectors holds V100, A100 and H100 only)",
                                   args.gpu, dir.string(), args.gpu));
    gpus.push_back(folder);
  } else {
    for (std::string_view model : tensor_core_gpus())
      if (const std::string folder = tensor_core_vector_folder(dir, model); !folder.empty()) gpus.push_back(folder);
  }
  std::vector<Format> inputs, outputs;
  if (args.input.empty())
    inputs = {formats::binary16, formats::bfloat16, formats::tf32, formats::e4m3, formats::e5m2};
  else
    inputs = {format_named(args.input, "--input")};
  if (args.output.empty())
    outputs = {formats::binary32, formats::binary16};
  else
    outputs = {format_named(args.output, "--output")};

  std::size_t passed = 0, failed = 0, folders = 0;
  for (const std::string& gpu : gpus)
    for (const Format& input : inputs)
      for (const Format& output : outputs) {
        const std::string in_name = tensor_core_vector_name(input, false);
        const std::string out_name = tensor_core_vector_name(output, true);
        if (in_name.empty() || out_name.empty())
          throw UsageError(fmt::format("no tensor-core vectors exist for {} -> {}; inputs: fp16, bf16, tf32, e4m3, "
                                       "e5m2; outputs: fp32, fp16",
                                       input.name(), output.name()));
        const fs::path folder = dir / gpu / in_name;
        fs::path d_file = folder / fmt::format("d_{}_{}.txt.gz", gpu, out_name);
        if (!fs::exists(d_file)) d_file.replace_extension();  // d_GPU_OUT.txt, uncompressed
        const bool asked = !args.gpu.empty() && !args.input.empty() && !args.output.empty();
        if (!fs::exists(d_file)) {
          if (asked) throw UsageError(fmt::format("no measured vectors at {}", d_file.string()));
          continue;
        }
        VectorCheck check;
        try {
          check = validate_tensor_core_vectors(dir, gpu, input, output);
        } catch (const std::invalid_argument& e) {
          if (asked) throw UsageError(e.what());
          fmt::print("{} {} -> {}: no model ({})\n", gpu, in_name, out_name, e.what());
          continue;
        }
        ++folders;
        passed += check.passed;
        failed += check.failed;
        fmt::print("{} {} -> {}: {} passed, {} failed\n", gpu, in_name, out_name, check.passed, check.failed);
        const std::size_t shown = args.verbose ? check.first_failures.size() : std::min<std::size_t>(3, check.first_failures.size());
        for (std::size_t i = 0; i < shown; ++i) fmt::print("  {}\n", check.first_failures[i]);
      }
  if (folders == 0) throw UsageError(fmt::format("no measured vectors found under {}", dir.string()));
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

std::vector<float> values_in(const Format& format, const std::vector<std::string>& tokens, const char* name) {
  std::vector<float> v;
  for (const std::string& token : tokens) {
    const ParsedNumber number = parse_number(token);
    std::string note;
    const Rounded r = round_text(format, Rounding{}, number, 0, note);
    const double value = to_double(format, r.bits);
    if (!(value == number.nearest) && !std::isnan(value))
      fmt::print("note: {} value {} is not a {} value; rounded to nearest-even: {}\n", name, token, format.name(),
                 exact_scientific(value));
    v.push_back(static_cast<float>(value));
  }
  return v;
}

int run_dot(const DotArgs& args) {
  const Format input = format_named(args.input, "--input");
  const Format output = format_named(args.output, "--output");
  if (args.a.size() != args.b.size())
    throw UsageError(fmt::format("-a has {} values and -b has {}; give K values to each", args.a.size(), args.b.size()));
  if (args.a.empty()) throw UsageError("give the vectors, e.g. -a 1 2 3 -b 0.5 0.25 1");
  const std::vector<float> a = values_in(input, args.a, "a"), b = values_in(input, args.b, "b");
  const std::vector<float> c = values_in(output, {args.c}, "c");
  fmt::print("K = {}, inputs {}, c = {}\n", a.size(), input.name(), exact_scientific(c[0]));
  // Models are comma-separated; a piece with '=' continues a custom "tc:KEY=VALUE,..." model.
  std::vector<std::string> names;
  for (std::size_t start = 0; start <= args.models.size();) {
    const std::size_t comma = args.models.find(',', start);
    std::string piece = args.models.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!names.empty() && piece.find('=') != std::string::npos && piece.rfind("tc:", 0) != 0 &&
        names.back().rfind("tc:", 0) == 0)
      names.back() += "," + piece;
    else
      names.push_back(std::move(piece));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (const std::string& name : names) {
    auto model = parse_accumulation_model(name, input);
    // A bare GPU name takes --input and --output.
    if (model && model->kind == AccumulationKind::tensor_core && name.find(':') == std::string::npos)
      model = parse_accumulation_model(fmt::format("{}:{}:{}", name, input.name(), output.name()));
    if (!model && name.rfind("tc:", 0) == 0) {
      try {
        parse_tensor_core_model(name);
      } catch (const std::invalid_argument& e) {
        throw UsageError(fmt::format("'{}': {}", name, e.what()));
      }
    }
    if (!model)
      throw UsageError(fmt::format("unknown accumulation model '{}' for {} -> {}. Accepted: {}", name,
                                   input.name(), output.name(), accumulation_model_names()));
    float d = 0.0f;
    try {
      d = dot(*model, a, b, c[0]);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("{}: {}", name, e.what()));
    }
    fmt::print("{:<18} {:>28}  {}\n", name, exact_scientific(d), hex_float(d));
  }
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
  validate->add_option("--input", v->input, "Input format: fp16, bf16, tf32, e4m3, e5m2 (default: every one)");
  validate->add_option("--output", v->output, "Output format: fp32 or fp16 (default: both)");
  validate->add_option("dir", v->dir, "Folder of the measured vectors (GPU/FORMAT/*.txt.gz or *.txt), e.g. ../shared/tensor-core-vectors")
      ->required();
  validate->add_flag("-v,--verbose", v->verbose, "Show up to 10 failing cases a folder instead of 3");
  validate->callback([&run, v] { run = [v] { return run_validate(*v); }; });

  auto d = std::make_shared<DotArgs>();
  auto* dot_cmd = tc->add_subcommand("dot", "One inner product a·b + c under several accumulation models");
  dot_cmd->add_option("--models,-m", d->models, "Comma-separated models: " + std::string(accumulation_model_names()))
      ->capture_default_str();
  dot_cmd->add_option("--input", d->input, "Format of a and b")->capture_default_str();
  dot_cmd->add_option("--output", d->output, "Format of c and of a tensor core's result (binary32 or binary16)")
      ->capture_default_str();
  dot_cmd->add_option("-a", d->a, "The K values of a (decimal or 0x1.8p-3)")->required()->expected(1, -1);
  dot_cmd->add_option("-b", d->b, "The K values of b")->required()->expected(1, -1);
  dot_cmd->add_option("-c", d->c, "The addend c")->capture_default_str();
  dot_cmd->callback([&run, d] { run = [d] { return run_dot(*d); }; });

  add_sweep_subcommand(*tc, run);
}

}  // namespace mpsim::cli
