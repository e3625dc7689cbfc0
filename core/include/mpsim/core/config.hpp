#pragma once
// Experiment configs: TOML files (toml++) with dotted `key=value` overrides.
// Every key is checked: an unknown key or a value of the wrong type is an
// error that names the key and what is accepted. docs/configs.md lists them.

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/core/model.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/trainer.hpp"

namespace mpsim::core {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DataSpec {
  std::string dataset = "fashion-mnist";  // or "synthetic"
  std::string path = default_fashion_mnist_dir;
  std::int64_t train_limit = 0, test_limit = 0;            // > 0: use the first N samples
  std::int64_t synthetic_train = 4096, synthetic_test = 1024;
};

struct ExperimentConfig {
  std::string name = "default";
  std::string output = "runs/default.h5";
  std::vector<std::string> arms{"fp32", "fp16-mixed", "bf16-mixed", "fp16-naive"};  // policy names
  std::vector<std::uint64_t> seeds{1};
  std::vector<std::string> backends{"cpu"};
  DataSpec data;
  ModelSpec model;
  TrainSpec train;
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  int flush_interval = 100;
  std::map<std::string, Policy> policies;  // every policy the arms name, resolved

  // The complete config, defaults included, as TOML: what the log stores.
  std::string to_toml() const;
};

// Parses TOML text (source names it in messages), applies overrides
// ("train.epochs=2", "arms=[\"fp32\"]"), checks every key and value.
ExperimentConfig parse_config(const std::string& text, const std::string& source,
                              const std::vector<std::string>& overrides = {});
ExperimentConfig load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides = {});

}  // namespace mpsim::core
