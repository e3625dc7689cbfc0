#pragma once
// Fields described once: a struct's members as one constexpr table of
// {name, member pointer, unit, doc}, from which the code that writes, reads,
// checks and documents them is generated (the step and eval records of the
// HDF5 log, run_log.hpp; the arm result file, arm_result_file.hpp; the config
// keys, config.hpp). A table must name every member of its struct:
// `describes_every_member` makes the build fail when one is added without a line.

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <variant>

namespace mpsim::core {

// One member of S, of one of the types Ts.
template <typename S, typename... Ts>
struct Field {
  std::string_view name;
  std::variant<Ts S::*...> member;
  std::string_view unit;  // "" for a plain number, a count or a flag
  std::string_view doc;
};

namespace fields_detail {
// Converts to any member type, so that `S{AnyMember{}, ...}` tells how many
// members the aggregate S has.
struct AnyMember {
  template <typename T>
  constexpr operator T() const;  // never defined: only used unevaluated
};

template <typename S, typename... Given>
constexpr std::size_t member_count() {
  if constexpr (requires { S{Given{}..., AnyMember{}}; })
    return member_count<S, Given..., AnyMember>();
  else
    return sizeof...(Given);
}
}  // namespace fields_detail

// The number of members of the aggregate S (no base classes).
template <typename S>
inline constexpr std::size_t member_count_v = fields_detail::member_count<S>();

// True when `table` names every member of S exactly once, under distinct names.
template <typename S, typename Table>
constexpr bool describes_every_member(const Table& table) {
  for (std::size_t i = 0; i < table.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (table[i].member == table[j].member || table[i].name == table[j].name) return false;
  return table.size() == member_count_v<S>;
}

// The value of field f in s, passed to fn with its own type.
template <typename S, typename... Ts, typename Fn>
constexpr decltype(auto) visit_field(const Field<S, Ts...>& f, S& s, Fn&& fn) {
  return std::visit([&](auto member) -> decltype(auto) { return fn(s.*member); }, f.member);
}
template <typename S, typename... Ts, typename Fn>
constexpr decltype(auto) visit_field(const Field<S, Ts...>& f, const S& s, Fn&& fn) {
  return std::visit([&](auto member) -> decltype(auto) { return fn(s.*member); }, f.member);
}

// A markdown table, one row per entry of `rows` (each a std::array of cells);
// `|` in a cell is escaped.
template <std::size_t N, typename Rows>
std::string markdown_table(const std::array<std::string_view, N>& header, const Rows& rows) {
  const auto line = [](const auto& cells) {
    std::string out = "|";
    for (const auto& cell : cells) {
      out += ' ';
      for (const char c : std::string_view(cell)) out += c == '|' ? std::string("\\|") : std::string(1, c);
      out += " |";
    }
    return out + "\n";
  };
  std::string out = line(header);
  out += "|";
  for (std::size_t i = 0; i < N; ++i) out += " --- |";
  out += "\n";
  for (const auto& row : rows) out += line(row);
  return out;
}

}  // namespace mpsim::core
