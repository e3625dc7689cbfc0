// mpsim docs configs|root|arm|policy|steps|eval|shadow: prints a field table as markdown. The tables
// live in core (config.hpp, run_log.hpp); docs/*.md hold this output between
// markers, and a CLI test fails when they differ.
#include "docs_command.hpp"

#include <fmt/core.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpsim/core/config.hpp"
#include "mpsim/core/run_log.hpp"

namespace mpsim::cli {

void add_docs_command(CLI::App& app, std::function<int()>& action) {
  static const std::map<std::string, std::string (*)()> tables{
      {"configs", &core::config_keys_markdown},
      {"root", &core::root_attributes_markdown},
      {"arm", &core::arm_attributes_markdown},
      {"policy", &core::policy_attributes_markdown},
      {"steps", &core::step_fields_markdown},
      {"eval", &core::eval_fields_markdown},
      {"shadow", &core::shadow_fields_markdown},
  };
  std::vector<std::string> names;
  for (const auto& entry : tables) names.push_back(entry.first);
  auto which = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("docs", "Print a field table as markdown (docs/configs.md, docs/hdf5-schema.md)");
  cmd->add_option("table", *which, "configs: every config key; root, arm, policy: the log's attributes; steps, eval, shadow: its record datasets")
      ->required()
      ->check(CLI::IsMember(names));
  cmd->callback([&action, which] {
    action = [which] {
      fmt::print("{}", tables.at(*which)());
      return 0;
    };
  });
}

}  // namespace mpsim::cli
