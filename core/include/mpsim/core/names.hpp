#pragma once
// An enum's names as one table, the enum's values in order: the config
// reads and writes them, the log stores them, messages quote them, and the
// training step compares enums, never strings.

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mpsim::core {

template <typename Enum, std::size_t N>
struct EnumNames {
  std::array<std::string_view, N> names;

  constexpr std::string_view operator()(Enum value) const { return names.at(static_cast<std::size_t>(value)); }
  constexpr std::optional<Enum> parse(std::string_view text) const {
    for (std::size_t i = 0; i < N; ++i)
      if (names[i] == text) return static_cast<Enum>(i);
    return std::nullopt;
  }
  // "a, b or c", for messages.
  std::string list() const {
    std::string out;
    for (std::size_t i = 0; i < N; ++i) out += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(names[i]);
    return out;
  }
};

}  // namespace mpsim::core
