// The config keys described by their field tables (config.cpp, config_keys()):
// every key written with a value other than its default reads back equal
// through the resolved TOML; a value outside each key's allowed range or
// names is refused with a message naming the key (and the value); the tables
// cover every member of the config's structs; the markdown lists every key.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "mpsim/core/config.hpp"
#include "mpsim/core/fields.hpp"

namespace mpsim::core {
namespace {

const std::string policy_prefix = "policies.NAME.";

// The overrides that set `key` (a policy's key on the custom policy "p").
std::string override_key(const ConfigKey& k) {
  if (k.key.starts_with(policy_prefix)) return "policies.p." + k.key.substr(policy_prefix.size());
  return k.key;
}

std::string unquote(std::string s) {
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"')) s = s.substr(1, s.size() - 2);
  return s;
}

std::vector<std::string> choices(const ConfigKey& k) {
  std::vector<std::string> out;
  const std::string allowed = k.allowed.starts_with("each ") ? k.allowed.substr(5) : k.allowed;
  const std::string prefix = "one of: ";
  if (!allowed.starts_with(prefix)) return out;
  std::string rest = allowed.substr(prefix.size());
  rest = rest.substr(0, rest.find(';'));  // "cpu, cuda; not empty, no value twice"
  for (std::size_t start = 0;;) {
    const auto comma = rest.find(", ", start);
    out.push_back(rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 2;
  }
  return out;
}

// A valid value for key k other than its default, as an override's TOML.
std::string other_value(const ConfigKey& k) {
  const std::string d = unquote(k.default_value);
  if (k.key == "policies.NAME.gemm") return "\"pairwise-fp32\"";
  if (k.key == "arms") return "[\"p\", \"bf16-mixed\"]";
  if (k.type == "bool") return d == "true" ? "false" : "true";
  if (k.type == "integer") return std::to_string(std::stoll(d) + 1);
  if (k.type == "number") {
    const double v = std::stod(d);
    return std::to_string(v == 0 ? 0.5 : v * 0.75);
  }
  // An op's internal arithmetic takes no stochastic rounding (policy.hpp's internal_rounding).
  if (k.key.ends_with("softmax_internals") || k.key.ends_with("norm_statistics") || k.key.ends_with("loss_internals"))
    return "\"bfloat16/toward-zero\"";
  if (k.type == "rounding point") return "\"bfloat16/stochastic\"";
  if (k.type == "block point") return "\"mxfp8-e4m3/stochastic\"";
  if (k.type == "array of integers") return "[3, 7]";
  const auto names = choices(k);
  if (k.type == "array of strings") return "[\"" + names.back() + "\"]";
  for (const auto& name : names)
    if (name != d) return "\"" + name + "\"";
  return "\"other-" + d + "\"";
}

// A value outside the allowed ones of k, or "" when any value of its type goes.
std::string bad_value(const ConfigKey& k) {
  if (!choices(k).empty()) return k.type == "array of strings" ? "[\"bogus\"]" : "\"bogus\"";
  std::string a = k.allowed;
  const bool each = a.starts_with("each ");
  if (each) a = a.substr(5);
  if (a.starts_with("a finite number ")) a = a.substr(16);
  std::string value;
  if (a.starts_with(">= ")) value = std::to_string(std::stod(a.substr(3)) - 1);
  else if (a.starts_with("> ")) value = a.substr(2, a.find(';') == std::string::npos ? std::string::npos : a.find(';') - 2);
  else if (a.starts_with("in [")) value = std::to_string(std::stoll(a.substr(4)) - 1);
  else if (a.starts_with("in (")) value = a.substr(4, a.find(',') - 4);
  else if (a.starts_with("not empty")) return "[]";
  else return "";
  if (k.type == "integer" || k.type == "array of integers") value = std::to_string(std::stoll(value));
  return each ? "[" + value + "]" : value;
}

const std::vector<std::string> base_overrides{"arms=[\"p\"]", "policies.p.base=fp32"};

ExperimentConfig parse_with(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), base_overrides.begin(), base_overrides.end());
  return parse_config("", "test.toml", overrides);
}

TEST_CASE("config fields: every key round-trips through the resolved TOML", "[core][config][fields]") {
  const std::string defaults = parse_with({}).to_toml();
  for (const ConfigKey& k : config_keys()) {
    if (k.key == "policies.NAME.base") continue;  // not kept: the policy's settings are
    INFO(k.key);
    std::vector<std::string> overrides{override_key(k) + "=" + other_value(k)};
    if (k.key == "policies.NAME.weight_storage") overrides.push_back("policies.p.master_weights=false");
    if (k.type == "block point")  // a role's two operands are block-scaled together
      for (const auto& b : block_points)
        overrides.insert(overrides.begin(), "policies.p." + std::string(b.name) + "=\"mxfp8-e4m3\"");
    const ExperimentConfig changed = parse_with(overrides);
    const std::string written = changed.to_toml();
    CHECK(written != defaults);
    CHECK(parse_config(written, "resolved").to_toml() == written);
  }
}

TEST_CASE("config fields: a list of what a run is made of repeats no value", "[core][config][fields]") {
  // arms, seeds, backends: a repeat would plan two arms of one name, which the log cannot hold.
  int lists = 0;
  for (const ConfigKey& k : config_keys()) {
    if (k.allowed.find("no value twice") == std::string::npos) continue;
    ++lists;
    const std::string one = k.key == "arms" ? "\"p\"" : k.type == "array of integers" ? "1" : "\"" + choices(k).front() + "\"";
    INFO(k.key);
    CHECK_THROWS_WITH(parse_with({k.key + "=[" + one + ", " + one + "]"}),
                      Catch::Matchers::Contains(k.key + " lists ") && Catch::Matchers::Contains(" twice"));
  }
  CHECK(lists == 3);
}

TEST_CASE("config fields: a value outside the allowed ones is refused, naming the key", "[core][config][fields]") {
  int ranged = 0;
  for (const ConfigKey& k : config_keys()) {
    const std::string bad = bad_value(k);
    if (bad.empty()) continue;
    ++ranged;
    INFO(k.key << " = " << bad);
    std::string message = "no error";
    try {
      parse_with({override_key(k) + "=" + bad});
    } catch (const ConfigError& e) {
      message = e.what();
    }
    const std::string key = k.key.starts_with(policy_prefix) && k.key != "policies.NAME.base"
                                ? override_key(k)
                                : k.key == "policies.NAME.base" ? "policies.p.base" : k.key;
    CHECK_THAT(message, Catch::Matchers::Contains(key));
    if (k.type == "integer" || k.type == "number") CHECK_THAT(message, Catch::Matchers::Contains("(got "));
  }
  CHECK(ranged >= 20);
  // The message says what is allowed.
  CHECK_THAT([] {
    try {
      parse_with({"policies.p.loss_scale.backoff_factor=2"});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  }(),
             Catch::Matchers::Equals("policies.p.loss_scale.backoff_factor must be in (0, 1] (got 2)"));
}

TEST_CASE("config fields: the tables cover every member, each key once", "[core][config][fields]") {
  const std::vector<ConfigKey> keys = config_keys();
  std::set<std::string> names;
  for (const auto& k : keys) {
    CHECK(names.insert(k.key).second);
    CHECK_FALSE(k.type.empty());
    CHECK_FALSE(k.doc.empty());
  }
  // Members that are sections of their own are not keys: ExperimentConfig's
  // data, model, train, optimizer, schedule, policies; TrainSpec's loss;
  // Policy's name, loss_scaling, delayed_scaling. policies.NAME.base is a key
  // and no member.
  const std::size_t members = (member_count_v<ExperimentConfig> - 6) + member_count_v<DataSpec> +
                              member_count_v<ModelSpec> + (member_count_v<TrainSpec> - 1) +
                              member_count_v<LossDefinition> + member_count_v<OptimizerSpec> +
                              member_count_v<ScheduleSpec> + (member_count_v<Policy> - 3) +
                              member_count_v<LossScaling> + member_count_v<DelayedScaling>;
  CHECK(keys.size() == members + 1);
  const std::string markdown = config_keys_markdown();
  for (const auto& k : keys) CHECK_THAT(markdown, Catch::Matchers::Contains("| `" + k.key + "` |"));
}

TEST_CASE("config fields: the nonsense a new user tried is refused (issue 18)", "[core][config][fields]") {
  const auto error = [](const std::vector<std::string>& overrides) {
    try {
      parse_with(overrides);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error({"optimizer.lr=inf"}) == "optimizer.lr must be a finite number > 0 (got inf)");
  CHECK(error({"optimizer.weight_decay=nan"}) == "optimizer.weight_decay must be a finite number >= 0 (got nan)");
  CHECK(error({"optimizer.momentum=5"}) == "optimizer.momentum must be in [0, 1) (got 5)");
  CHECK(error({"optimizer.beta2=1"}) == "optimizer.beta2 must be in [0, 1) (got 1)");
  CHECK(error({"policies.p.loss_scale.min=1e6", "policies.p.loss_scale.max=10"}) ==
        "policies.p.loss_scale.min = 1000000 is above policies.p.loss_scale.max = 10; give min <= max (0 turns a "
        "bound off)");
  CHECK(error({"policies.p.loss_scale.min=1", "policies.p.loss_scale.max=0"}) == "accepted");  // 0: no maximum
}

}  // namespace
}  // namespace mpsim::core
