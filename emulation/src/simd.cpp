// The target list and forcing of emulation/include/mpsim/emulation/simd.hpp.
// This file compiles the same target set as the widest kernel (AVX3_DL
// included), so its list names every target any kernel may run.
#define HWY_WANT_AVX3_DL
#include "mpsim/emulation/simd.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "hwy/highway.h"

namespace mpsim::simd {
namespace {

// The mask that ForceTarget passed to Highway (0: none).
std::int64_t forced_mask = 0;

Target make_target(std::int64_t bits) { return {bits, hwy::TargetName(bits)}; }

}  // namespace

std::vector<Target> available_targets() {
  // Read once, before any ForceTarget changes what Highway reports.
  static const std::vector<Target> targets = [] {
    std::vector<Target> list;
    const std::int64_t supported = hwy::SupportedTargets() & HWY_TARGETS;
    for (std::int64_t rest = supported; rest != 0; rest &= rest - 1) list.push_back(make_target(rest & -rest));
    return list;  // lower bits are better targets
  }();
  return targets;
}

Target portable_target() { return available_targets().back(); }

Target current_target() {
  const std::int64_t mask = forced_mask != 0 ? forced_mask : hwy::SupportedTargets();
  for (const Target& t : available_targets())
    if ((mask & t.bits) != 0) return t;
  return portable_target();
}

Target target_named(std::string_view name) {
  auto same = [](std::string_view a, std::string_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                      [](char x, char y) { return std::toupper(x) == std::toupper(y); });
  };
  std::string known;
  for (const Target& t : available_targets()) {
    if (same(t.name, name)) return t;
    known += (known.empty() ? "" : ", ") + std::string(t.name);
  }
  throw std::invalid_argument("unknown or unavailable SIMD target '" + std::string(name) + "' (this CPU: " + known +
                              ")");
}

ForceTarget::ForceTarget(Target target) : previous_(forced_mask) {
  std::int64_t mask = 0;  // the target and every available one below it (higher bits)
  for (const Target& t : available_targets())
    if (t.bits >= target.bits) mask |= t.bits;
  forced_mask = mask;
  hwy::SetSupportedTargetsForTest(mask);
}

ForceTarget::~ForceTarget() {
  forced_mask = previous_;
  hwy::SetSupportedTargetsForTest(previous_);
}

}  // namespace mpsim::simd
