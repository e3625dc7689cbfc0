#include "mpsim/core/sweep.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mpsim::core {
namespace {

// Splits at commas outside brackets, braces and quotes: "1,8,128" has three
// values, '["fp32","fp8"]' one.
std::vector<std::string> top_level_values(const std::string& text) {
  std::vector<std::string> values;
  int depth = 0;
  char quote = 0;
  std::string current;
  for (const char ch : text) {
    if (quote) {
      if (ch == quote) quote = 0;
    } else if (ch == '"' || ch == '\'') {
      quote = ch;
    } else if (ch == '[' || ch == '{') {
      ++depth;
    } else if (ch == ']' || ch == '}') {
      --depth;
    } else if (ch == ',' && depth == 0) {
      values.push_back(current);
      current.clear();
      continue;
    }
    current += ch;
  }
  values.push_back(current);
  return values;
}

std::string value_text(const toml::node& node) {
  if (const auto v = node.value_exact<double>()) {
    // The shortest text that reads back as the same binary64 (not toml++'s 17
    // digits), kept a TOML float.
    char buffer[64];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, *v).ptr;
    std::string text(buffer, end);
    if (std::isfinite(*v) && text.find_first_of(".e") == std::string::npos) text += ".0";
    return text;
  }
  std::ostringstream out;
  node.visit([&](const auto& v) { out << toml::toml_formatter(v, toml::format_flags::none); });
  return out.str();
}

// Leaves of a table under dotted keys: `optimizer.lr = [..]` and
// `"optimizer.lr" = [..]` both give "optimizer.lr".
void flatten(const toml::table& table, const std::string& prefix,
             std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [key, node] : table) {
    const std::string name = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const toml::table* sub = node.as_table()) flatten(*sub, name, out);
    else out.emplace_back(name, &node);
  }
}

// "policies.fp16-mixed.loss_scale.initial" -> "initial"
std::string short_key(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// "loss.weight+optimizer.lr" -> {"loss.weight", "optimizer.lr"}
std::vector<std::string> split_keys(const std::string& name) {
  std::vector<std::string> keys;
  std::size_t start = 0;
  for (std::size_t plus; (plus = name.find('+', start)) != std::string::npos; start = plus + 1)
    keys.push_back(name.substr(start, plus - start));
  keys.push_back(name.substr(start));
  for (const std::string& key : keys)
    if (key.empty()) throw ConfigError("sweep.\"" + name + "\": an empty key between '+' signs");
  return keys;
}

std::string label_value(std::string value) {
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
  return value;
}

}  // namespace

Sweep parse_sweep(const std::string& text, const std::string& source, const std::vector<std::string>& overrides,
                  bool smoke) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error&) {
    parse_config(text, source, overrides);  // throws the located message
    throw;
  }
  std::vector<SweepAxis> axes;
  if (const toml::node* sweep = root.get("sweep")) {
    if (!sweep->is_table()) throw ConfigError("sweep must be a table of key = [values]");
    std::vector<std::pair<std::string, const toml::node*>> leaves;
    flatten(*sweep->as_table(), "", leaves);
    for (const auto& [key, node] : leaves) {
      const toml::array* values = node->as_array();
      if (!values || values->empty())
        throw ConfigError("sweep.\"" + key + "\" must be a non-empty array of values, e.g. \"optimizer.lr\" = [0.01, 0.1]");
      SweepAxis axis{split_keys(key), {}};
      for (const toml::node& v : *values) {
        if (axis.keys.size() == 1) {
          axis.values.push_back({value_text(v)});
          continue;
        }
        const toml::array* tuple = v.as_array();
        if (!tuple || tuple->size() != axis.keys.size())
          throw ConfigError("sweep.\"" + key + "\": keys joined by '+' vary together; each value must be an array of " +
                            std::to_string(axis.keys.size()) + " values, one per key, e.g. [[1.0, 0.05], [0.25, 0.2]]");
        std::vector<std::string> texts;
        for (const toml::node& t : *tuple) texts.push_back(value_text(t));
        axis.values.push_back(std::move(texts));
      }
      axes.push_back(std::move(axis));
    }
  }
  // The tables themselves are read from the file only: an override into them would change nothing.
  for (const std::string& o : overrides)
    for (const std::string_view table : {"sweep.", "smoke."})
      if (o.starts_with(table))
        throw ConfigError("override '" + o + "': the [" + std::string(table.substr(0, 5)) +
                          "] table is read from the config file only; " +
                          (table == "sweep." ? "give the key itself with several values instead, e.g. "
                                               "optimizer.lr=[0.01,0.1]"
                                             : "give the key itself (train.epochs=1), or edit [smoke] in the file"));
  std::vector<std::string> fixed, smoke_overrides;
  const toml::node* smoke_table = root.get("smoke");
  if (smoke_table) {
    if (!smoke_table->is_table()) throw ConfigError("smoke must be a table of key = value overrides");
    std::vector<std::pair<std::string, const toml::node*>> leaves;
    flatten(*smoke_table->as_table(), "", leaves);
    for (const auto& [key, node] : leaves) smoke_overrides.push_back(key + "=" + value_text(*node));
  }
  if (smoke) {
    const toml::node* table = smoke_table;
    if (!table) throw ConfigError("--smoke: this config has no [smoke] table of overrides");
    fixed = smoke_overrides;
    // A smoke run never lands on the full run's log: unless [smoke] names an
    // output, it writes beside it as STEM-smoke.EXT (an override or -o still wins).
    if (!table->as_table()->contains("output")) {
      const toml::node* output = root.get("output");
      std::filesystem::path path = output && output->is_string() ? std::filesystem::path(**output->as_string())
                                                                  : std::filesystem::path(ExperimentConfig{}.output);
      path.replace_filename(path.stem().string() + "-smoke" + path.extension().string());
      fixed.push_back("output=" + value_text(toml::value<std::string>(path.string())));
    }
  }
  for (const std::string& o : overrides) {
    const auto eq = o.find('=');
    const std::vector<std::string> values = eq == std::string::npos ? std::vector<std::string>{}
                                                                     : top_level_values(o.substr(eq + 1));
    if (values.size() > 1) {
      // An override with several values replaces an axis of the same key.
      const std::string key = o.substr(0, eq);
      if (key.find('+') != std::string::npos)
        throw ConfigError("override " + o + ": keys that vary together go in a [sweep] table, not on the command line");
      std::erase_if(axes, [&](const SweepAxis& a) { return a.keys.size() == 1 && a.keys.front() == key; });
      SweepAxis axis{{key}, {}};
      for (const std::string& v : values) axis.values.push_back({v});
      axes.push_back(std::move(axis));
    } else {
      fixed.push_back(o);
    }
  }

  // Axes in the order of their keys (a TOML table has no order of its own),
  // so a written config runs the points in the same order.
  std::stable_sort(axes.begin(), axes.end(), [](const SweepAxis& a, const SweepAxis& b) { return a.name() < b.name(); });
  std::vector<SweepPoint> points(1);
  for (const SweepAxis& axis : axes) {
    std::vector<SweepPoint> next;
    for (const SweepPoint& p : points)
      for (const std::vector<std::string>& value : axis.values) {
        SweepPoint q = p;
        for (std::size_t k = 0; k < axis.keys.size(); ++k) {
          q.overrides.push_back(axis.keys[k] + "=" + value[k]);
          q.label += (q.label.empty() ? "" : ",") + short_key(axis.keys[k]) + "=" + label_value(value[k]);
        }
        std::replace(q.label.begin(), q.label.end(), '/', ':');  // labels name HDF5 groups
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  for (SweepPoint& p : points) {
    std::vector<std::string> all = fixed;
    all.insert(all.end(), p.overrides.begin(), p.overrides.end());
    try {
      p.config = parse_config(text, source, all);
    } catch (const ConfigError& e) {
      throw ConfigError(p.label.empty() ? std::string(e.what()) : "sweep point " + p.label + ": " + e.what());
    }
    if (p.config.output != points.front().config.output)
      throw ConfigError("sweep: output differs between points; one experiment writes one file");
  }
  if (!smoke && smoke_table) {
    // Checked though unused, as every key is (a typo in [smoke] should not wait for the first --smoke run): what
    // --smoke would read, the command line winning, once the file itself has passed.
    std::vector<std::string> as_smoke = smoke_overrides;
    for (const std::string& o : overrides)
      if (top_level_values(o.substr(o.find('=') + 1)).size() <= 1) as_smoke.push_back(o);
    try {
      parse_config(text, source, as_smoke);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("[smoke] (checked without --smoke too): ") + e.what());
    }
  }
  return {std::move(axes), std::move(points)};
}

std::string SweepAxis::name() const {
  std::string joined;
  for (const std::string& key : keys) joined += (joined.empty() ? "" : "+") + key;
  return joined;
}

std::string Sweep::to_toml() const {
  std::string text = points.front().config.to_toml();
  if (axes.empty()) return text;
  text += "\n[sweep]\n";
  const auto toml_value = [](std::string v) {
    try {
      (void)toml::parse("v = " + v);
    } catch (const toml::parse_error&) {
      v = "\"" + v + "\"";  // a bare string from the command line
    }
    return v;
  };
  for (const SweepAxis& axis : axes) {
    text += "\"" + axis.name() + "\" = [";
    for (std::size_t i = 0; i < axis.values.size(); ++i) {
      text += i ? ", " : "";
      if (axis.keys.size() > 1) text += "[";
      for (std::size_t k = 0; k < axis.values[i].size(); ++k) text += (k ? ", " : "") + toml_value(axis.values[i][k]);
      if (axis.keys.size() > 1) text += "]";
    }
    text += "]\n";
  }
  return text;
}

Sweep load_sweep(const std::filesystem::path& file, const std::vector<std::string>& overrides, bool smoke) {
  // A folder opens as an empty stream on Linux and would run the defaults.
  if (std::filesystem::is_directory(file))
    throw ConfigError("'" + file.string() + "' is a folder, not a config file; give a .toml file, e.g. " +
                      (file / "default.toml").string());
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read config file '" + file.string() + "': check the path");
  std::stringstream text;
  text << in.rdbuf();
  return parse_sweep(text.str(), file.string(), overrides, smoke);
}

}  // namespace mpsim::core
