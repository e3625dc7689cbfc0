#include "mpsim/core/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace mpsim::core {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s;
}

// Reads the keys of one table, remembering which were used, so that any key
// left over is reported as unknown.
class Section {
 public:
  Section(const toml::table* table, std::string path) : table_(table), path_(std::move(path)) {}

  std::string key_path(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }

  template <class T>
  void read(std::string_view key, T& out) {
    used_.insert(std::string(key));
    if (!table_) return;
    const toml::node* node = table_->get(key);
    if (!node) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node->value_exact<bool>()) return void(out = *v);
      fail_type(key, "true or false");
    } else if constexpr (std::is_integral_v<T>) {
      if (auto v = node->value_exact<std::int64_t>()) {
        if (*v < 0) throw ConfigError(key_path(key) + " must not be negative (got " + std::to_string(*v) + ")");
        return void(out = static_cast<T>(*v));
      }
      fail_type(key, "an integer");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = node->value<double>()) return void(out = *v);
      fail_type(key, "a number");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (auto v = node->value_exact<std::string>()) return void(out = *v);
      fail_type(key, "a string");
    }
  }

  template <class T>
  void read_array(std::string_view key, std::vector<T>& out) {
    used_.insert(std::string(key));
    if (!table_) return;
    const toml::node* node = table_->get(key);
    if (!node) return;
    if constexpr (std::is_same_v<T, std::string>) {
      if (auto single = node->value_exact<std::string>()) return void(out = {*single});  // arms=fp32
    }
    const toml::array* array = node->as_array();
    if (!array) fail_type(key, "an array");
    std::vector<T> values;
    for (const toml::node& item : *array) {
      if constexpr (std::is_same_v<T, std::string>) {
        auto v = item.value_exact<std::string>();
        if (!v) fail_type(key, "an array of strings");
        values.push_back(*v);
      } else {
        auto v = item.value_exact<std::int64_t>();
        if (!v || *v < 0) fail_type(key, "an array of non-negative integers");
        values.push_back(static_cast<T>(*v));
      }
    }
    out = std::move(values);
  }

  // The value must be one of `choices`.
  void read_choice(std::string_view key, std::string& out, const std::vector<std::string>& choices) {
    read(key, out);
    for (const auto& c : choices)
      if (c == out) return;
    throw ConfigError(key_path(key) + " = \"" + out + "\" is not accepted; expected one of: " + join(choices));
  }

  // An enum by its name in the enum's one table.
  template <typename Enum, std::size_t N>
  void read_enum(std::string_view key, Enum& out, const EnumNames<Enum, N>& names) {
    std::string text(names(out));
    read_choice(key, text, std::vector<std::string>(names.names.begin(), names.names.end()));
    out = *names.parse(text);
  }

  const toml::table* subtable(std::string_view key) {
    used_.insert(std::string(key));
    if (!table_) return nullptr;
    const toml::node* node = table_->get(key);
    if (!node) return nullptr;
    if (!node->is_table()) fail_type(key, "a table");
    return node->as_table();
  }

  void check_unknown(const std::vector<std::string>& also_known = {}) const {
    if (!table_) return;
    for (const auto& [key, node] : *table_) {
      const std::string k(key.str());
      if (used_.count(k)) continue;
      bool known = false;
      for (const auto& a : also_known) known = known || a == k;
      if (!known) {
        std::vector<std::string> names(used_.begin(), used_.end());
        throw ConfigError("unknown config key '" + key_path(k) + "'" +
                          (names.empty() ? std::string() : "; known keys here: " + join(names)));
      }
    }
  }

 private:
  [[noreturn]] void fail_type(std::string_view key, const char* expected) const {
    throw ConfigError(key_path(key) + " must be " + expected);
  }
  const toml::table* table_;
  std::string path_;
  std::set<std::string> used_;
};

RoundingPoint read_point(Section& s, std::string_view key, const RoundingPoint& current) {
  std::string text = to_string(current);
  s.read(key, text);
  std::string error;
  const auto point = parse_rounding_point(text, &error);
  if (!point) throw ConfigError(s.key_path(key) + ": " + error);
  return *point;
}

Policy read_policy(const std::string& name, const toml::table* table) {
  Section s(table, "policies." + name);
  std::string base = preset_policy(name) ? name : "fp32";
  s.read("base", base);
  auto policy = preset_policy(base);
  if (!policy)
    throw ConfigError("policies." + name + ".base = \"" + base + "\" is not a preset; expected one of: " +
                      join(preset_policy_names()));
  Policy p = *policy;
  p.name = name;
  for (const auto& [key, point] : rounding_points) p.*point = read_point(s, key, p.*point);
  s.read("master_weights", p.master_weights);
  s.read("gemm", p.gemm);
  // Every GEMM's operand pair, as the layers form them.
  try {
    gemm_model(p, p.activations, p.weights);
    gemm_model(p, p.gradient_operands, p.activations);
    gemm_model(p, p.gradient_operands, p.weights);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("policies." + name + ": " + e.what());
  }
  s.read_array("fp32_ops", p.fp32_ops);
  const std::vector<std::string> fp32_ops = fp32_op_names();
  for (const auto& op : p.fp32_ops)
    if (std::find(fp32_ops.begin(), fp32_ops.end(), op) == fp32_ops.end())
      throw ConfigError("policies." + name + ".fp32_ops: unknown op '" + op + "'; expected one of: " + join(fp32_ops));
  if (p.master_weights && !p.weight_storage.is_identity())
    throw ConfigError("policies." + name + ": weight_storage must be binary32 when master_weights = true");

  Section ls(s.subtable("loss_scale"), "policies." + name + ".loss_scale");
  auto& l = p.loss_scaling;
  std::string mode(to_string(l.mode));
  ls.read_choice("mode", mode, {"none", "static", "dynamic"});
  l.mode = mode == "none" ? LossScaleMode::none : mode == "static" ? LossScaleMode::fixed : LossScaleMode::dynamic;
  ls.read("initial", l.initial_scale);
  ls.read("growth_factor", l.growth_factor);
  ls.read("backoff_factor", l.backoff_factor);
  ls.read("growth_interval", l.growth_interval);
  ls.read("hysteresis", l.hysteresis);
  ls.read("min", l.min_scale);
  ls.read("max", l.max_scale);
  ls.check_unknown();
  if (!(l.initial_scale > 0) || !(l.growth_factor >= 1) || !(l.backoff_factor > 0 && l.backoff_factor <= 1) ||
      l.growth_interval < 1 || l.hysteresis < 1)
    throw ConfigError("policies." + name +
                      ".loss_scale: need initial > 0, growth_factor >= 1, 0 < backoff_factor <= 1, "
                      "growth_interval >= 1, hysteresis >= 1");

  Section ds(s.subtable("delayed_scaling"), "policies." + name + ".delayed_scaling");
  ds.read("history", p.delayed_scaling.history);
  ds.read("margin", p.delayed_scaling.margin);
  ds.check_unknown();
  if (p.delayed_scaling.history < 1) throw ConfigError("policies." + name + ".delayed_scaling.history must be >= 1");
  s.check_unknown();
  return p;
}

// "a.b.c=value": value is TOML (2, 0.5, true, "x", [..]) or else a bare string.
void apply_override(toml::table& root, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("override '" + text + "' is not key=value (example: train.epochs=2)");
  const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};
  }
  toml::table* table = &root;
  std::size_t start = 0;
  for (;;) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw ConfigError("override '" + text + "' has an empty key part");
    if (dot == std::string::npos) {
      table->insert_or_assign(part, *parsed.get("v"));
      return;
    }
    toml::node* next = table->get(part);
    if (!next) {
      table->insert(part, toml::table{});
      next = table->get(part);
    }
    if (!next->is_table()) throw ConfigError("override '" + text + "': '" + part + "' is not a table");
    table = next->as_table();
    start = dot + 1;
  }
}

}  // namespace

ExperimentConfig parse_config(const std::string& text, const std::string& source,
                              const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    throw ConfigError(msg.str());
  }
  for (const auto& o : overrides) apply_override(root, o);

  ExperimentConfig c;
  Section top(&root, "");
  top.read("name", c.name);
  top.read("output", c.output);
  top.read_array("arms", c.arms);
  top.read_array("seeds", c.seeds);
  top.read_array("backends", c.backends);
  top.read("flush_interval", c.flush_interval);
  if (c.arms.empty()) throw ConfigError("arms is empty; name at least one policy, e.g. arms = [\"fp32\"]");
  if (c.seeds.empty()) throw ConfigError("seeds is empty; give at least one, e.g. seeds = [1]");
  for (const auto& b : c.backends)
    if (b != "cpu" && b != "cuda")
      throw ConfigError("backends: unknown backend '" + b + "'; expected cpu or cuda");
  if (c.flush_interval < 1) throw ConfigError("flush_interval must be >= 1");

  Section data(top.subtable("data"), "data");
  data.read_choice("dataset", c.data.dataset, {"fashion-mnist", "synthetic"});
  data.read("path", c.data.path);
  data.read("train_limit", c.data.train_limit);
  data.read("test_limit", c.data.test_limit);
  data.read("synthetic_train", c.data.synthetic_train);
  data.read("synthetic_test", c.data.synthetic_test);
  data.check_unknown();

  Section model(top.subtable("model"), "model");
  model.read_choice("kind", c.model.kind, {"mlp", "cnn"});
  model.read_array("hidden", c.model.hidden);
  model.read_enum("activation", c.model.activation, activation_names);
  model.read("layer_norm", c.model.layer_norm);
  std::string init(to_string(c.model.init));
  model.read_choice("init", init, {"he", "xavier", "normal"});
  c.model.init = init == "he" ? InitScheme::he : init == "xavier" ? InitScheme::xavier : InitScheme::normal;
  model.read("init_scale", c.model.init_scale);
  model.check_unknown();
  for (const auto h : c.model.hidden)
    if (h < 1) throw ConfigError("model.hidden: every width must be >= 1");

  Section train(top.subtable("train"), "train");
  train.read("epochs", c.train.epochs);
  train.read("max_steps", c.train.max_steps);
  train.read("batch_size", c.train.batch_size);
  train.read("eval_interval", c.train.eval_interval);
  train.read("eval_batch", c.train.eval_batch);
  train.read("stats_interval", c.train.stats_interval);
  train.read("threads", c.train.threads);
  train.check_unknown();
  if (c.train.batch_size < 1 || c.train.eval_batch < 1) throw ConfigError("train.batch_size and train.eval_batch must be >= 1");
  if (c.train.epochs < 1) throw ConfigError("train.epochs must be >= 1");

  Section loss(top.subtable("loss"), "loss");
  std::string reduction = c.train.loss.reduction == LossReduction::mean ? "mean" : "sum";
  loss.read_choice("reduction", reduction, {"mean", "sum"});
  c.train.loss.reduction = reduction == "mean" ? LossReduction::mean : LossReduction::sum;
  loss.read("weight", c.train.loss.weight);
  loss.check_unknown();
  if (!(c.train.loss.weight > 0) || !is_finite(c.train.loss.weight))
    throw ConfigError("loss.weight must be a finite number > 0 (it multiplies the loss the backward pass differentiates)");

  Section opt(top.subtable("optimizer"), "optimizer");
  opt.read_enum("kind", c.optimizer.kind, optimizer_kind_names);
  opt.read("lr", c.optimizer.lr);
  opt.read("momentum", c.optimizer.momentum);
  opt.read("weight_decay", c.optimizer.weight_decay);
  opt.read("beta1", c.optimizer.beta1);
  opt.read("beta2", c.optimizer.beta2);
  opt.read("eps", c.optimizer.eps);
  opt.check_unknown();
  if (!(c.optimizer.lr > 0)) throw ConfigError("optimizer.lr must be > 0");

  Section sched(top.subtable("schedule"), "schedule");
  sched.read_enum("kind", c.schedule.kind, schedule_kind_names);
  sched.read("step_size", c.schedule.step_size);
  sched.read("gamma", c.schedule.gamma);
  sched.read("min_lr", c.schedule.min_lr);
  sched.check_unknown();

  const toml::table* policies = top.subtable("policies");
  std::vector<std::string> custom;
  if (policies)
    for (const auto& [key, node] : *policies) {
      if (!node.is_table()) throw ConfigError("policies." + std::string(key.str()) + " must be a table");
      const std::string name(key.str());
      c.policies[name] = read_policy(name, node.as_table());
      custom.push_back(name);
    }
  for (const auto& arm : c.arms) {
    if (c.policies.count(arm)) continue;
    auto p = preset_policy(arm);
    if (!p) {
      std::vector<std::string> known = preset_policy_names();
      known.insert(known.end(), custom.begin(), custom.end());
      throw ConfigError("arms: unknown policy '" + arm + "'; expected a preset or a [policies." + arm +
                        "] table. Known: " + join(known));
    }
    c.policies[arm] = *p;
  }
  top.check_unknown({"sweep", "smoke"});  // read by parse_sweep (sweep.hpp)
  return c;
}

ExperimentConfig load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read config file '" + file.string() + "': check the path");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), file.string(), overrides);
}

std::string ExperimentConfig::to_toml() const {
  const auto strings = [](const std::vector<std::string>& v) {
    toml::array a;
    for (const auto& s : v) a.push_back(s);
    return a;
  };
  toml::array seed_array, hidden;
  for (const auto s : seeds) seed_array.push_back(static_cast<std::int64_t>(s));
  for (const auto h : model.hidden) hidden.push_back(h);
  toml::table t{
      {"name", name},
      {"output", output},
      {"arms", strings(arms)},
      {"seeds", seed_array},
      {"backends", strings(backends)},
      {"flush_interval", flush_interval},
      {"data", toml::table{{"dataset", data.dataset},
                           {"path", data.path},
                           {"train_limit", data.train_limit},
                           {"test_limit", data.test_limit},
                           {"synthetic_train", data.synthetic_train},
                           {"synthetic_test", data.synthetic_test}}},
      {"model", toml::table{{"kind", model.kind},
                            {"hidden", hidden},
                            {"activation", to_string(model.activation)},
                            {"layer_norm", model.layer_norm},
                            {"init", to_string(model.init)},
                            {"init_scale", model.init_scale}}},
      {"train", toml::table{{"epochs", train.epochs},
                            {"max_steps", train.max_steps},
                            {"batch_size", train.batch_size},
                            {"eval_interval", train.eval_interval},
                            {"eval_batch", train.eval_batch},
                            {"stats_interval", train.stats_interval},
                            {"threads", train.threads}}},
      {"loss", toml::table{{"reduction", train.loss.reduction == LossReduction::mean ? "mean" : "sum"},
                           {"weight", train.loss.weight}}},
      {"optimizer", toml::table{{"kind", to_string(optimizer.kind)},
                                {"lr", optimizer.lr},
                                {"momentum", optimizer.momentum},
                                {"weight_decay", optimizer.weight_decay},
                                {"beta1", optimizer.beta1},
                                {"beta2", optimizer.beta2},
                                {"eps", optimizer.eps}}},
      {"schedule", toml::table{{"kind", to_string(schedule.kind)},
                               {"step_size", schedule.step_size},
                               {"gamma", schedule.gamma},
                               {"min_lr", schedule.min_lr}}},
  };
  toml::table ps;
  for (const auto& [pname, p] : policies) {
    toml::array ops;
    for (const auto& op : p.fp32_ops) ops.push_back(op);
    const auto& l = p.loss_scaling;
    toml::table table{{"master_weights", p.master_weights},
                      {"gemm", p.gemm},
                      {"fp32_ops", ops},
                      {"loss_scale", toml::table{{"mode", to_string(l.mode)},
                                                 {"initial", l.initial_scale},
                                                 {"growth_factor", l.growth_factor},
                                                 {"backoff_factor", l.backoff_factor},
                                                 {"growth_interval", l.growth_interval},
                                                 {"hysteresis", l.hysteresis},
                                                 {"min", l.min_scale},
                                                 {"max", l.max_scale}}},
                      {"delayed_scaling", toml::table{{"history", p.delayed_scaling.history},
                                                      {"margin", p.delayed_scaling.margin}}}};
    for (const auto& [key, point] : rounding_points) table.insert(key, to_string(p.*point));
    ps.insert(pname, std::move(table));
  }
  t.insert("policies", ps);
  std::ostringstream out;
  out << t << "\n";
  return out.str();
}

}  // namespace mpsim::core
