// mpsim: the numerics of mixed-precision training, from the command line.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <functional>

#include "docs_command.hpp"
#include "fp_command.hpp"
#include "mpsim/core/experiment.hpp"
#include "run_command.hpp"
#include "tc_command.hpp"
#include "usage_error.hpp"
#ifdef MPSIM_WITH_CUDA
#include "mpsim/gpu/backend.hpp"
#endif

int main(int argc, char** argv) {
  CLI::App app{"mpsim " MPSIM_VERSION ": numerics of mixed-precision training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "mpsim " MPSIM_VERSION);
  std::function<int()> run;
#ifdef MPSIM_WITH_CUDA
  mpsim::gpu::register_cuda_backend();  // backend = "cuda" in a config
#endif
  mpsim::cli::add_fp_command(app, run);
  mpsim::cli::add_run_command(app, run);
  mpsim::cli::add_tc_command(app, run);
  mpsim::cli::add_docs_command(app, run);
  try {
    app.parse(argc, argv);
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
  } catch (const std::exception& e) {
    fmt::print(stderr, "mpsim: error: {}\n", e.what());
    return 1;
  }
}
