#pragma once
// The config's field machinery (config.cpp): one ConfigField per key of a
// section struct, generated from the member (key<&S::member>), which reads,
// validates, writes and documents that key. Internal to core: config.cpp
// builds its tables from it, and layer_table.hpp gives each optional layer
// its own keys.

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpsim/core/config.hpp"

namespace mpsim::core::config_field {

inline std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s;
}

inline std::string join(std::span<const std::string_view> items) {
  return join(std::vector<std::string>(items.begin(), items.end()));
}

// A number as messages and docs write it: integers without a point.
inline std::string number_text(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream out;
  out << v;
  return out.str();
}

// "the string \"2\"", "the number 1.5", "an array", "a table": a value as a type error names it.
inline std::string describe_value(const toml::node& node) {
  std::ostringstream out;
  if (node.is_string()) out << "the string \"" << **node.as_string() << "\"";
  else if (node.is_integer()) out << "the integer " << **node.as_integer();
  else if (node.is_floating_point()) out << "the number " << number_text(**node.as_floating_point());
  else if (node.is_boolean()) out << (**node.as_boolean() ? "true" : "false");
  else if (node.is_array()) out << "an array";
  else if (node.is_table()) out << "a table";
  else out << "a date or time";
  return out.str();
}

// The documented key nearest an unknown one, or "" when none is near: the
// same last part under another table (train.lr -> optimizer.lr), else a key
// at most two edits away (config.cpp, from config_keys()).
std::string closest_config_key(const std::string& unknown);

// Reads the keys of one table, remembering which were used, so that any key
// left over is reported as unknown.
class Section {
 public:
  Section(const toml::table* table, std::string path) : table_(table), path_(std::move(path)) {}

  std::string key_path(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }

  // The node of `key`, or nullptr when the table does not set it.
  const toml::node* take(std::string_view key) {
    used_.insert(std::string(key));
    return table_ ? table_->get(key) : nullptr;
  }

  const toml::table* subtable(std::string_view key) {
    const toml::node* node = take(key);
    if (!node) return nullptr;
    if (!node->is_table()) fail_type(key, "a table", *node);
    return node->as_table();
  }

  [[noreturn]] void fail_type(std::string_view key, const char* expected) const {
    throw ConfigError(key_path(key) + " must be " + expected);
  }
  // The same, saying what was given: `train.epochs must be an integer (got the string "2")`.
  [[noreturn]] void fail_type(std::string_view key, const char* expected, const toml::node& given) const {
    throw ConfigError(key_path(key) + " must be " + expected + " (got " + describe_value(given) + ")");
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
        const std::string suggestion = closest_config_key(key_path(k));
        throw ConfigError("unknown config key '" + key_path(k) + "'" +
                          (suggestion.empty() ? std::string() : "; did you mean '" + suggestion + "'?") +
                          (names.empty() ? std::string()
                                         : (suggestion.empty() ? "; known keys here: " : " Known keys here: ") +
                                               join(names)));
      }
    }
  }

 private:
  const toml::table* table_;
  std::string path_;
  std::set<std::string> used_;
};

// --- The field machinery -----------------------------------------------------------

// The values a number (or each number of an array) may take.
struct Limits {
  bool has_min = false, min_open = false, has_max = false, max_open = false, finite = false;
  double min = 0, max = 0;
  double type_max = std::numeric_limits<double>::infinity();  // an int member's INT_MAX; not shown in docs

  bool accepts(double v) const {
    if (finite && !std::isfinite(v)) return false;
    if (v > type_max) return false;
    if (has_min && !(min_open ? v > min : v >= min)) return false;
    if (has_max && !(max_open ? v < max : v <= max)) return false;
    return true;
  }
  bool any() const { return has_min || has_max || finite; }
  // ">= 1", "> 0", "in (0, 1]", "a finite number > 0".
  std::string text() const {
    const std::string low = std::string(min_open ? "> " : ">= ") + number_text(min);
    if (has_min && has_max)
      return "in " + std::string(min_open ? "(" : "[") + number_text(min) + ", " + number_text(max) +
             (max_open ? ")" : "]");
    if (has_max) return std::string(max_open ? "< " : "<= ") + number_text(max);
    if (finite) return "a finite number" + (has_min ? " " + low : std::string());
    return has_min ? low : std::string();
  }
};
constexpr Limits at_least(double v) { return {.has_min = true, .min = v}; }
constexpr Limits above(double v) { return {.has_min = true, .min_open = true, .min = v}; }
constexpr Limits finite_above(double v) { return {.has_min = true, .min_open = true, .finite = true, .min = v}; }
constexpr Limits above_at_most(double low, double high) {
  return {.has_min = true, .min_open = true, .has_max = true, .min = low, .max = high};
}
inline std::string inverted_bounds_message(const std::string& table, double min, double max) {
  return table + ".min = " + number_text(min) + " is above " + table + ".max = " + number_text(max) +
         "; give min <= max (0 turns a bound off)";
}
constexpr Limits finite_at_least(double v) { return {.has_min = true, .finite = true, .min = v}; }
// [low, high): momentum and Adam's betas (1 would never forget).
constexpr Limits at_least_below(double low, double high) {
  return {.has_min = true, .has_max = true, .max_open = true, .min = low, .max = high};
}
constexpr Limits between(double low, double high) { return {.has_min = true, .has_max = true, .min = low, .max = high}; }
constexpr Limits no_limits{};

template <typename S>
struct ConfigField;
template <typename S>
using ReadField = void (*)(Section&, const ConfigField<S>&, S&);
template <typename S>
using WriteField = void (*)(toml::table&, const ConfigField<S>&, const S&);

// One config key of section struct S. `read` and `write` are generated from
// the member (key<&S::member>); the rest is what the key means.
template <typename S>
struct ConfigField {
  std::string_view name;
  std::string_view type;  // as the docs say it: "integer", "number", "array of strings", ...
  std::string_view unit;
  std::string_view doc;
  Limits limits;                               // numbers: the value; arrays of numbers: each element
  std::span<const std::string_view> choices;  // strings and enums: the accepted names (empty: any string)
  // Arrays naming what a run is made of (arms, seeds, backends): at least one
  // element and none twice, since a repeat would plan two arms of one name.
  bool distinct = false;
  ReadField<S> read = nullptr;
  WriteField<S> write = nullptr;
};

template <auto M>
struct MemberTraits;
template <typename S, typename T, T S::*M>
struct MemberTraits<M> {
  using Struct = S;
  using Type = T;
};

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

template <typename T>
constexpr std::string_view type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_enum_v<T>) return "string";
  else if constexpr (std::is_integral_v<T>) return "integer";
  else if constexpr (std::is_floating_point_v<T>) return "number";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, RoundingPoint>) return "rounding point";
  else if constexpr (std::is_same_v<T, BlockPoint>) return "block point";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "array of strings";
  else return "array of integers";
}

// Integers are never negative, and an int member holds at most INT_MAX.
template <typename T>
constexpr Limits integer_limits(Limits limits) {
  if (!limits.has_min) {
    limits.has_min = true;
    limits.min_open = false;
    limits.min = 0;
  }
  if (sizeof(T) < sizeof(std::int64_t)) limits.type_max = static_cast<double>(std::numeric_limits<T>::max());
  return limits;
}

template <typename S>
void check_number(const Section& s, const ConfigField<S>& f, double v, bool element) {
  if (f.limits.accepts(v)) return;
  if (v > f.limits.type_max)
    throw ConfigError(s.key_path(f.name) + " must be at most " + number_text(f.limits.type_max) +
                      ", the largest value it holds (got " + number_text(v) + ")");
  throw ConfigError(s.key_path(f.name) + (element ? ": every element must be " : " must be ") + f.limits.text() +
                    " (got " + number_text(v) + ")");
}

template <typename S>
void check_choice(const Section& s, const ConfigField<S>& f, const std::string& v, bool element) {
  if (f.choices.empty()) return;
  for (const auto c : f.choices)
    if (c == v) return;
  throw ConfigError(s.key_path(f.name) + (element ? ": '" + v + "'" : " = \"" + v + "\"") +
                    " is not accepted; expected one of: " + join(f.choices));
}

// Reads one value of type T from `node` (an array's element when `element`).
template <typename S, typename T>
T read_value(const Section& s, const ConfigField<S>& f, const toml::node& node, bool element) {
  if constexpr (std::is_same_v<T, bool>) {
    if (auto v = node.value_exact<bool>()) return *v;
    s.fail_type(f.name, "true or false", node);
  } else if constexpr (std::is_integral_v<T>) {
    if (auto v = node.value_exact<std::int64_t>()) {
      check_number(s, f, static_cast<double>(*v), element);
      return static_cast<T>(*v);
    }
    s.fail_type(f.name, element ? "an array of integers" : "an integer", node);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (auto v = node.value<double>()) {
      check_number(s, f, *v, element);
      return *v;
    }
    s.fail_type(f.name, "a number", node);
  } else {
    if (auto v = node.value_exact<std::string>()) {
      check_choice(s, f, *v, element);
      return *v;
    }
    s.fail_type(f.name, element ? "an array of strings" : "a string", node);
  }
}

template <auto M, auto Names = nullptr>
void read_member(Section& s, const ConfigField<typename MemberTraits<M>::Struct>& f,
                 typename MemberTraits<M>::Struct& out) {
  using S = typename MemberTraits<M>::Struct;
  using T = typename MemberTraits<M>::Type;
  const toml::node* node = s.take(f.name);
  if (!node) return;  // the default stays
  if constexpr (std::is_enum_v<T>) {
    out.*M = *Names->parse(read_value<S, std::string>(s, f, *node, false));
  } else if constexpr (std::is_same_v<T, RoundingPoint>) {
    std::string error;
    const auto point = parse_rounding_point(read_value<S, std::string>(s, f, *node, false), &error);
    if (!point) throw ConfigError(s.key_path(f.name) + ": " + error);
    out.*M = *point;
  } else if constexpr (std::is_same_v<T, BlockPoint>) {
    std::string error;
    const auto point = parse_block_point(read_value<S, std::string>(s, f, *node, false), &error);
    if (!point) throw ConfigError(s.key_path(f.name) + ": " + error);
    out.*M = *point;
  } else if constexpr (IsVector<T>::value) {
    using E = typename T::value_type;
    T values;
    if constexpr (std::is_same_v<E, std::string>) {
      if (node->is_string()) values = {read_value<S, E>(s, f, *node, true)};  // arms=fp32
    }
    if (!node->is_string()) {
      const toml::array* array = node->as_array();
      if (!array) s.fail_type(f.name, "an array", *node);
      for (const toml::node& item : *array) values.push_back(read_value<S, E>(s, f, item, true));
    }
    if (f.distinct && values.empty()) throw ConfigError(s.key_path(f.name) + " must not be empty");
    if (f.distinct)
      for (auto v = values.begin(); v != values.end(); ++v)
        if (std::find(std::next(v), values.end(), *v) != values.end()) {
          std::string text;
          if constexpr (std::is_same_v<E, std::string>) text = "'" + *v + "'";
          else text = std::to_string(*v);
          throw ConfigError(s.key_path(f.name) + " lists " + text + " twice; give each value once");
        }
    out.*M = std::move(values);
  } else {
    out.*M = read_value<S, T>(s, f, *node, false);
  }
}

template <auto M, auto Names = nullptr>
void write_member(toml::table& t, const ConfigField<typename MemberTraits<M>::Struct>& f,
                  const typename MemberTraits<M>::Struct& in) {
  using T = typename MemberTraits<M>::Type;
  const T& v = in.*M;
  if constexpr (std::is_enum_v<T>) {
    t.insert(f.name, std::string((*Names)(v)));
  } else if constexpr (std::is_same_v<T, RoundingPoint> || std::is_same_v<T, BlockPoint>) {
    t.insert(f.name, to_string(v));
  } else if constexpr (IsVector<T>::value) {
    toml::array a;
    for (const auto& e : v) {
      if constexpr (std::is_integral_v<typename T::value_type>)
        a.push_back(static_cast<std::int64_t>(e));
      else
        a.push_back(e);
    }
    t.insert(f.name, std::move(a));
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    t.insert(f.name, static_cast<std::int64_t>(v));
  } else {
    t.insert(f.name, v);
  }
}

// A key of member M: `key<&TrainSpec::epochs>("epochs", "epochs", "...", at_least(1))`.
template <auto M>
constexpr ConfigField<typename MemberTraits<M>::Struct> key(std::string_view name, std::string_view unit,
                                                            std::string_view doc, Limits limits = no_limits,
                                                            bool distinct = false) {
  using T = typename MemberTraits<M>::Type;
  using E = std::conditional_t<IsVector<T>::value, T, std::vector<T>>;
  if constexpr (std::is_integral_v<typename E::value_type> && !std::is_same_v<T, bool>)
    limits = integer_limits<typename E::value_type>(limits);
  return {name, type_name<T>(), unit, doc, limits, {}, distinct, &read_member<M>, &write_member<M>};
}

// A string key (or array of strings) whose values are one of `choices`.
template <auto M>
constexpr ConfigField<typename MemberTraits<M>::Struct> choice(std::string_view name,
                                                               std::span<const std::string_view> choices,
                                                               std::string_view doc, bool distinct = false) {
  auto f = key<M>(name, "", doc, no_limits, distinct);
  f.choices = choices;
  return f;
}

// An enum by its names in the enum's one table.
template <auto M, const auto& Names>
constexpr ConfigField<typename MemberTraits<M>::Struct> enum_key(std::string_view name, std::string_view doc) {
  return {name,  "string", "", doc, no_limits, std::span<const std::string_view>(Names.names),
          false, &read_member<M, &Names>, &write_member<M, &Names>};
}

template <typename S, std::size_t N>
void read_fields(Section& s, const std::array<ConfigField<S>, N>& fields, S& out) {
  for (const auto& f : fields) f.read(s, f, out);
}

template <typename S, std::size_t N>
toml::table write_fields(const std::array<ConfigField<S>, N>& fields, const S& in) {
  toml::table t;
  for (const auto& f : fields) f.write(t, f, in);
  return t;
}

}  // namespace mpsim::core::config_field
