#pragma once
// Experiment configs: TOML files (toml++) with dotted `key=value` overrides.
// Every key is checked: an unknown key, a value of the wrong type or out of
// range is an error that names the key, the value and what is accepted.
// Every key is one line of a table in config.cpp (name, member, type, unit,
// allowed values, meaning), which reads, checks, writes and documents it:
// config_keys() below, docs/configs.md, `mpsim docs configs`.

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
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
  std::string dataset = "fashion-mnist";  // or "synthetic", "fortunes"
  std::string path;  // empty: the dataset's Debian directory (data_directory)
  std::int64_t train_limit = 0, test_limit = 0;            // > 0: use the first N samples
  std::int64_t synthetic_train = 4096, synthetic_test = 1024;
  std::int64_t context = 128;  // fortunes: tokens per sample
};

// Where a dataset's files are read from: `path`, or when it is empty the
// directory Debian's package installs them to.
std::string data_directory(const DataSpec& data);

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

// One config key as the tables describe it, for docs and --help.
struct ConfigKey {
  std::string key;            // dotted: "train.epochs", "policies.NAME.loss_scale.initial"
  std::string type;           // "integer", "number", "bool", "string", "array of strings", ...
  std::string default_value;  // as TOML; a policy's keys show the fp32 preset's
  std::string unit;           // "steps", "samples", ...; empty for plain numbers
  std::string allowed;        // ">= 1", "in (0, 1]", "one of: mlp, cnn"; empty: any value of the type
  std::string doc;
};
// Every key, in the order of the tables: the top level, then each section.
std::vector<ConfigKey> config_keys();
// config_keys() as a markdown table (docs/configs.md).
std::string config_keys_markdown();

// A policy as the log stores it (/arms/<arm>/policy/, docs/hdf5-schema.md),
// from the same tables: `name`, `points` (the rounding points in the order a
// step meets them), each point split into parts a program reads without
// parsing (`<point>.format`, `.exponent_bits`, ...), then every other key of a
// policy as the config writes it (`loss_scale.*`, `delayed_scaling.*` with dots).
struct PolicyAttribute {
  std::string name;  // "weights.format", "loss_scale.initial"
  std::string row;   // its row in the docs: "<point>.format" for every point's, else the name
  std::variant<std::string, int, double, bool, std::vector<std::string>> value;
  std::string doc;
};
std::vector<PolicyAttribute> policy_attributes(const Policy& policy);

}  // namespace mpsim::core
