#pragma once
// mpsim's one SIMD mechanism: Google Highway's run-time dispatch. Every vector
// kernel (array quantization, the exponent histogram, the tensor-core GEMM) is
// compiled once per target with hwy/foreach_target.h and called through
// HWY_DYNAMIC_DISPATCH, which picks the best target this CPU supports. The
// portable target (Highway's EMU128, plain C++ on 128-bit arrays, or SCALAR,
// one lane, with compilers whose EMU128 Highway marks broken: GCC before 12.3,
// Debian 12's) is always compiled; tests run every target and compare it with
// the portable one bit for bit.
//
// Adding a kernel: write it inside HWY_BEFORE_NAMESPACE() / namespace
// ...::HWY_NAMESPACE, HWY_EXPORT it and call it with HWY_DYNAMIC_DISPATCH
// (emulation/src/accumulation_gemm.cpp is a short example). A file that wants
// the AVX-512 VBMI2 target (AVX3_DL) defines HWY_WANT_AVX3_DL before its first
// Highway include (core/src/stats.cpp).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mpsim::simd {

// A Highway target: its bit (HWY_AVX2, ...) and name ("AVX2", "EMU128", ...).
struct Target {
  std::int64_t bits = 0;
  std::string_view name;
  friend bool operator==(const Target& a, const Target& b) { return a.bits == b.bits; }
};

// The targets mpsim compiles that this CPU can run, best first; the last is
// the portable one. Independent of any ForceTarget in effect.
std::vector<Target> available_targets();
// The portable target (the last of available_targets()).
Target portable_target();
// The target that dispatch uses now (the best one, or the one forced).
Target current_target();
// The available target with this name (case-insensitive), or a std::invalid_argument.
Target target_named(std::string_view name);

// While it lives, dispatch runs no target better than `target`: each kernel
// runs the best one it compiles at or below it. For tests and benchmarks:
// make and destroy it while no kernel runs (it changes Highway's process-wide
// choice); scopes nest.
class ForceTarget {
 public:
  explicit ForceTarget(Target target);
  explicit ForceTarget(std::string_view name) : ForceTarget(target_named(name)) {}
  ~ForceTarget();
  ForceTarget(const ForceTarget&) = delete;
  ForceTarget& operator=(const ForceTarget&) = delete;

 private:
  std::int64_t previous_;
};

}  // namespace mpsim::simd
