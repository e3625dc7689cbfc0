// mpsim: the numerics of mixed-precision training, from the command line.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cuda_plugin.hpp"
#include "docs_command.hpp"
#include "fp_command.hpp"
#include "mpsim/core/experiment.hpp"
#include "mpsim/emulation/simd.hpp"
#include "run_command.hpp"
#include "tc_command.hpp"
#include "usage_error.hpp"

namespace {

// `mpsim frobnicate` or `mpsim fp rnd`: name the word and the commands there
// are (CLI11 would only say an argument was not expected). Walks the words
// down the command tree while the command reached has subcommands; those
// commands take no positional values, so a word that is not an option must
// name one.
void check_command_words(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "mpsim";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto subcommands = at->get_subcommands([](CLI::App*) { return true; });
    if (subcommands.empty()) return;
    if (word.empty() || word[0] == '-') continue;
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subcommands) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      if (sub->check_name(word)) next = sub;
    }
    if (!next)
      throw mpsim::cli::UsageError(
          fmt::format("unknown command '{}' for '{}'. Commands: {} (see {} --help)", word, path, names, path));
    at = next;
    path += " " + word;
  }
}

// CLI11 reads "-inf", "-nan" or "-.5" as short options (-i, -n, -.); a
// negative number that starts with a digit ("-1e-8") it already takes as a
// value. No option of ours is spelled like a number, so such a word becomes
// " -inf": CLI11 takes it as a value, and the number reader (strtod) skips the
// leading space.
std::vector<std::string> negative_numbers_as_values(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string lower = args[i];
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool special = lower == "-inf" || lower == "-infinity" || lower == "-nan";
    const bool point = lower.size() > 2 && lower[0] == '-' && lower[1] == '.' &&
                       std::isdigit(static_cast<unsigned char>(lower[2]));
    if (special || point) args[i] = " " + args[i];
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mpsim " MPSIM_VERSION ": numerics of mixed-precision training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "mpsim " MPSIM_VERSION);
  std::function<int()> run;
  mpsim::cli::register_cuda_plugin();  // backend = "cuda" in a config, when gpu/ was built
  mpsim::cli::add_fp_command(app, run);
  mpsim::cli::add_run_command(app, run);
  mpsim::cli::add_tc_command(app, run);
  mpsim::cli::add_docs_command(app, run);
  try {
    check_command_words(app, argc, argv);
    std::vector<std::string> args = negative_numbers_as_values(argc, argv);
    args.erase(args.begin());               // the program's name
    std::reverse(args.begin(), args.end());  // CLI11 takes the words last to first
    app.parse(std::move(args));
    // MPSIM_SIMD_TARGET=SSE4 (any Highway target this CPU runs) caps every
    // vector kernel at that target: a run can show that its bits do not
    // depend on the instruction set (children of --jobs inherit it).
    std::optional<mpsim::simd::ForceTarget> forced_target;
    if (const char* target = std::getenv("MPSIM_SIMD_TARGET"); target && *target) {
      try {
        forced_target.emplace(std::string_view(target));
      } catch (const std::invalid_argument& e) {
        throw mpsim::cli::UsageError(fmt::format("MPSIM_SIMD_TARGET: {}", e.what()));
      }
    }
    return run ? run() : 0;
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return mpsim::cli::usage_exit_code;
  } catch (const mpsim::cli::UsageError& e) {
    fmt::print(stderr, "mpsim: {}\n", e.what());
    return mpsim::cli::usage_exit_code;
  } catch (const mpsim::core::SetupError& e) {  // the experiment cannot start as asked: a usage error too
    fmt::print(stderr, "mpsim: {}\n", e.what());
    return mpsim::cli::usage_exit_code;
  } catch (const mpsim::core::LogWriteError& e) {
    // The log could not be written. Leave without libhdf5's exit handler,
    // which crashes closing a file whose write failed (1.10.8).
    fmt::print(stderr, "mpsim: error: {}\n", e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "mpsim: error: {}\n", e.what());
    return 1;
  }
}
