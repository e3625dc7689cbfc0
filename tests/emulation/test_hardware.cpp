// The emulator's binary32 -> binary16 and binary32 -> bfloat16 conversions
// against the conversion instructions of x86 CPUs, an oracle independent of
// our code: F16C's VCVTPS2PH (four rounding directions) and AVX512-BF16's
// VCVTNEPS2BF16 (nearest-even only). Three emulator paths are compared with the
// hardware: the scalar round_to_format, and quantize on float arrays with
// Path::vector and Path::automatic. Results are compared as encodings (the
// quantized floats against the hardware's result widened back to binary32,
// exactly); NaNs are compared by class, since payloads are not part of the
// emulator's contract. Flags are not compared: the instructions report them
// only summarily in MXCSR (VCVTPS2PH sets them there even with
// _MM_FROUND_NO_EXC, which the VEX encoding ignores; they stay masked).
//
// VCVTNEPS2BF16 differs from IEEE conversion in one documented way (Intel SDM,
// VCVTNEPS2BF16, and its convert_fp32_to_bfloat16 pseudo-code): a zero or
// denormal input gives a zero of the same sign ("denormal go to zero"), as if
// MXCSR.DAZ were set, whatever MXCSR says. So the 2*(2^23-1) binary32
// subnormal inputs are excluded from the bfloat16 comparison; for them the test
// checks instead that the hardware did give the signed zero, so exactly that
// set is left out. Every other input (normal, zero, infinite, NaN) is compared:
// a normal binary32 input cannot round to a bfloat16 subnormal (same exponent
// range), so the hardware's rounding is IEEE nearest-even there, overflow to
// infinity included. The instruction raises no flags and ignores MXCSR.RC.
//
// CPUs without F16C or AVX512-BF16 skip visibly. The long suites over all 2^32
// inputs share one process ("[.exhaustive]"), where a skip would end the others
// too: there they warn and return instead, and the fast sampled case of the
// same instruction is the one CTest reports as Skipped.
#include <catch2/catch.hpp>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "support/test_support.hpp"

namespace mpsim {
namespace {

// --- The instructions ---------------------------------------------------------------

bool cpu_has_f16c() { return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2"); }
bool cpu_has_avx512bf16() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }

// The rounding directions F16C's immediate can select, with ours.
constexpr RoundingMode kF16cModes[] = {RoundingMode::nearest_even, RoundingMode::toward_negative,
                                       RoundingMode::toward_positive, RoundingMode::toward_zero};

// VCVTPS2PH with the rounding direction in the immediate (not MXCSR.RC), then
// VCVTPH2PS to widen the result back, exactly.
__attribute__((target("f16c,avx2"))) void f16c_to_binary16(const float* in, std::size_t n, RoundingMode mode,
                                                           std::uint16_t* bits, float* value) {
  for (std::size_t i = 0; i < n; i += 8) {
    const std::size_t lanes = std::min<std::size_t>(8, n - i);
    alignas(32) float lane_in[8] = {};
    std::memcpy(lane_in, in + i, lanes * sizeof(float));
    const __m256 v = _mm256_load_ps(lane_in);
    __m128i h;
    switch (mode) {
      case RoundingMode::toward_negative: h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); break;
      case RoundingMode::toward_positive: h = _mm256_cvtps_ph(v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); break;
      case RoundingMode::toward_zero: h = _mm256_cvtps_ph(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); break;
      default: h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); break;
    }
    alignas(16) std::uint16_t lane_bits[8];
    alignas(32) float lane_value[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(lane_bits), h);
    _mm256_store_ps(lane_value, _mm256_cvtph_ps(h));
    std::memcpy(bits + i, lane_bits, lanes * sizeof(std::uint16_t));
    std::memcpy(value + i, lane_value, lanes * sizeof(float));
  }
}

// VCVTNEPS2BF16: nearest-even, denormal inputs read as zero. A bfloat16 is the
// top half of a binary32, so widening is a shift.
__attribute__((target("avx512f,avx512bf16"))) void avx512bf16_to_bfloat16(const float* in, std::size_t n,
                                                                         std::uint16_t* bits, float* value) {
  for (std::size_t i = 0; i < n; i += 16) {
    const std::size_t lanes = std::min<std::size_t>(16, n - i);
    alignas(64) float lane_in[16] = {};
    std::memcpy(lane_in, in + i, lanes * sizeof(float));
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_load_ps(lane_in));
    alignas(32) std::uint16_t lane_bits[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lane_bits), reinterpret_cast<const __m256i&>(h));
    std::memcpy(bits + i, lane_bits, lanes * sizeof(std::uint16_t));
    for (std::size_t k = 0; k < lanes; ++k) value[i + k] = std::bit_cast<float>(std::uint32_t{lane_bits[k]} << 16);
  }
}

// --- Comparing ----------------------------------------------------------------------

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

bool is_binary32_subnormal(std::uint32_t bits) { return (bits & 0x7F800000u) == 0 && (bits & 0x007FFFFFu) != 0; }

// NaN by the IEEE encoding rule, for the 16-bit formats (not the emulator's classify).
bool is_nan_encoding(const Format& format, std::uint64_t bits) {
  const std::uint64_t exponent_mask = (std::uint64_t{1} << format.exponent_bits) - 1;
  const std::uint64_t mantissa_mask = (std::uint64_t{1} << format.mantissa_bits) - 1;
  return (bits >> format.mantissa_bits & exponent_mask) == exponent_mask && (bits & mantissa_mask) != 0;
}

// alignas(64): each thread counts into its own cache line. Two tallies sharing
// one line (false sharing) made the 2^32-input case twice as slow.
struct alignas(64) Tally {
  std::uint64_t compared = 0;
  std::uint64_t mismatches = 0;
  std::uint64_t excluded = 0;
  std::uint64_t exclusion_violations = 0;  // excluded inputs where the hardware broke its documented rule
  std::vector<std::string> first;

  void note(std::string message) {
    if (first.size() < 20) first.push_back(std::move(message));
  }
  void merge(Tally&& other) {
    compared += other.compared;
    mismatches += other.mismatches;
    excluded += other.excluded;
    exclusion_violations += other.exclusion_violations;
    for (auto& m : other.first) note(std::move(m));
  }
  std::string report() const {
    std::string text = std::to_string(compared) + " compared, " + std::to_string(mismatches) + " mismatches, " +
                       std::to_string(excluded) + " excluded, " + std::to_string(exclusion_violations) +
                       " excluded inputs not converted to signed zero";
    for (const auto& m : first) text += "\n  " + m;
    return text;
  }
};

std::string hex(std::uint64_t value, int digits) {
  char text[20];
  std::snprintf(text, sizeof text, "%0*llX", digits, static_cast<unsigned long long>(value));
  return text;
}

// Buffers reused from chunk to chunk by one thread.
struct Workspace {
  std::vector<float> in, hardware_value, vector_out, automatic_out;
  std::vector<std::uint16_t> hardware_bits;
  void resize(std::size_t n) {
    in.resize(n);
    hardware_value.resize(n);
    vector_out.resize(n);
    automatic_out.resize(n);
    hardware_bits.resize(n);
  }
};

// Compares the three emulator paths with the hardware results already in `w`.
// `automatic_threads` is QuantizeOptions::threads for Path::automatic.
void compare_with_hardware(const Format& format, RoundingMode mode, Workspace& w, bool exclude_subnormal_inputs,
                           int automatic_threads, Tally& tally) {
  const std::size_t n = w.in.size();
  QuantizeOptions vector_options;
  vector_options.rounding.mode = mode;
  vector_options.path = Path::vector;
  vector_options.threads = 1;
  QuantizeOptions automatic_options = vector_options;
  automatic_options.path = Path::automatic;
  automatic_options.threads = automatic_threads;
  quantize(format, std::span<const float>(w.in), std::span<float>(w.vector_out), vector_options);
  quantize(format, std::span<const float>(w.in), std::span<float>(w.automatic_out), automatic_options);

  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t input = bits_of(w.in[i]);
    const std::uint16_t hw = w.hardware_bits[i];
    if (exclude_subnormal_inputs && is_binary32_subnormal(input)) {
      ++tally.excluded;
      if (hw != (input >> 16 & 0x8000u)) {
        ++tally.exclusion_violations;
        tally.note("input " + hex(input, 8) + ": subnormal input gave " + hex(hw, 4) + ", not a signed zero");
      }
      continue;
    }
    ++tally.compared;
    const Rounded scalar = round_to_format(format, Rounding{mode}, w.in[i]);
    const bool hw_nan = is_nan_encoding(format, hw);
    const bool scalar_ok = hw_nan ? scalar.bits.value >> 16 == 0 && is_nan_encoding(format, scalar.bits.value)
                                  : scalar.bits.value == hw;
    const bool vector_ok = hw_nan ? std::isnan(w.vector_out[i]) : bits_of(w.vector_out[i]) == bits_of(w.hardware_value[i]);
    const bool automatic_ok =
        hw_nan ? std::isnan(w.automatic_out[i]) : bits_of(w.automatic_out[i]) == bits_of(w.hardware_value[i]);
    if (scalar_ok && vector_ok && automatic_ok) continue;
    ++tally.mismatches;
    tally.note("input " + hex(input, 8) + " to " + format.name() + " " + std::string(to_string(mode)) +
               ": hardware " + hex(hw, 4) + " (" + hex(bits_of(w.hardware_value[i]), 8) + "), round_to_format " +
               hex(scalar.bits.value, 4) + ", quantize vector " + hex(bits_of(w.vector_out[i]), 8) +
               ", quantize automatic " + hex(bits_of(w.automatic_out[i]), 8));
  }
}

void check_binary16(Workspace& w, int automatic_threads, Tally& tally) {
  for (RoundingMode mode : kF16cModes) {
    f16c_to_binary16(w.in.data(), w.in.size(), mode, w.hardware_bits.data(), w.hardware_value.data());
    compare_with_hardware(formats::binary16, mode, w, false, automatic_threads, tally);
  }
}

void check_bfloat16(Workspace& w, int automatic_threads, Tally& tally) {
  avx512bf16_to_bfloat16(w.in.data(), w.in.size(), w.hardware_bits.data(), w.hardware_value.data());
  compare_with_hardware(formats::bfloat16, RoundingMode::nearest_even, w, true, automatic_threads, tally);
}

// --- Inputs -------------------------------------------------------------------------

// SplitMix64: a fixed-seed generator for the sampled inputs.
std::uint64_t mix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// About 2^20 binary32 patterns: one random pattern in every block of 4096 (so
// every exponent and sign is visited evenly), every pattern within 64 of the
// edges of binary16 and bfloat16 (zeros, smallest subnormals and their halves,
// the subnormal/normal boundary, the largest finite and the overflow
// threshold, infinities, NaN boundaries) and of binary32's own, and patterns
// just below, at and above the rounding midpoints of both formats.
std::vector<float> sampled_inputs() {
  std::vector<std::uint32_t> bits;
  std::uint64_t state = 20240601;
  for (std::uint64_t block = 0; block < (std::uint64_t{1} << 20); ++block)
    bits.push_back(static_cast<std::uint32_t>(block << 12 | (mix(state) & 0xFFF)));

  const std::uint32_t edges[] = {
      0x00000000, 0x00000040, 0x007FFFFF, 0x00800000,  // binary32 zero, subnormals, smallest normal
      0x33000000, 0x33400000, 0x33800000, 0x33C00000,  // binary16: half the smallest subnormal, 2^-24, 1.5*2^-24
      0x387FC000, 0x38800000, 0x38000000,              // binary16 largest subnormal, smallest normal, 2^-15
      0x3F800000, 0x3F801000, 0x3F808000,              // 1 and the binary16/bfloat16 ties above it
      0x477FE000, 0x477FF000, 0x47800000,              // binary16 largest finite, overflow tie, 2^16
      0x7F7F8000, 0x7F7FC000, 0x7F7FFFFF,              // bfloat16 largest finite, its overflow tie, binary32 max
      0x7F800000, 0x7FC00000, 0x7FFFFFFF,              // infinity, quiet NaN, the last NaN
  };
  for (std::uint32_t edge : edges)
    for (std::int64_t d = -64; d <= 64; ++d) {
      const std::int64_t b = static_cast<std::int64_t>(edge) + d;
      if (b < 0 || b > 0x7FFFFFFF) continue;
      bits.push_back(static_cast<std::uint32_t>(b));
      bits.push_back(static_cast<std::uint32_t>(b) | 0x80000000u);
    }

  // Midpoints and their neighbours over binary16's range (exponent fields 0x60
  // to 0x90) for binary16's 13 dropped bits, and over every exponent for
  // bfloat16's 16.
  for (std::uint32_t exponent = 0; exponent < 0xFF; ++exponent)
    for (int k = 0; k < 32; ++k) {
      const auto r = static_cast<std::uint32_t>(mix(state));
      const std::uint32_t sign = r & 0x80000000u;
      const std::uint32_t top = exponent << 23 | (r & 0x007F0000u);
      for (std::uint32_t low : {0x7FFFu, 0x8000u, 0x8001u}) bits.push_back(sign | top | low);
      if (exponent >= 0x60 && exponent <= 0x90) {
        const std::uint32_t high = exponent << 23 | (r & 0x007FE000u);
        for (std::uint32_t low : {0x0FFFu, 0x1000u, 0x1001u}) bits.push_back(sign | high | low);
      }
    }

  std::vector<float> values(bits.size());
  std::transform(bits.begin(), bits.end(), values.begin(), [](std::uint32_t b) { return std::bit_cast<float>(b); });
  return values;
}

// Runs `check(workspace, tally)` over all 2^32 binary32 patterns, 2^20 at a
// time, on two threads; the Catch assertions stay on the calling thread.
template <class Check>
Tally over_all_binary32(Check check) {
  constexpr std::uint64_t chunk = std::uint64_t{1} << 20;
  constexpr std::uint64_t chunks = (std::uint64_t{1} << 32) / chunk;
  std::atomic<std::uint64_t> next{0};
  Tally tallies[2];
  auto work = [&](Tally& tally) {
    Workspace w;
    w.resize(chunk);
    for (std::uint64_t c = next++; c < chunks; c = next++) {
      for (std::uint64_t i = 0; i < chunk; ++i) w.in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(c * chunk + i));
      check(w, tally);
    }
  };
  std::thread helper(work, std::ref(tallies[1]));
  work(tallies[0]);
  helper.join();
  tallies[0].merge(std::move(tallies[1]));
  return std::move(tallies[0]);
}

}  // namespace

TEST_CASE("hardware: binary32 to binary16 matches F16C (sampled inputs)", "[hardware]") {
  if (!cpu_has_f16c()) test::skip("this CPU has no F16C/AVX2: binary16 conversion not checked against hardware");
  Workspace w;
  w.in = sampled_inputs();
  w.resize(w.in.size());
  Tally tally;
  check_binary16(w, 0, tally);
  INFO(tally.report());
  CHECK(tally.compared == 4 * w.in.size());
  CHECK(tally.mismatches == 0);
}

TEST_CASE("hardware: binary32 to bfloat16 matches AVX512-BF16 (sampled inputs)", "[hardware]") {
  if (!cpu_has_avx512bf16())
    test::skip("this CPU has no AVX512-BF16: bfloat16 conversion not checked against hardware");
  Workspace w;
  w.in = sampled_inputs();
  w.resize(w.in.size());
  Tally tally;
  check_bfloat16(w, 0, tally);
  INFO(tally.report());
  CHECK(tally.excluded > 0);
  CHECK(tally.compared + tally.excluded == w.in.size());
  CHECK(tally.exclusion_violations == 0);
  CHECK(tally.mismatches == 0);
}

TEST_CASE("hardware: binary32 to binary16 matches F16C (all binary32 inputs)", "[.exhaustive][hardware]") {
  if (!cpu_has_f16c()) test::skip("this CPU has no F16C/AVX2: binary16 conversion not checked against hardware");
  const Tally tally = over_all_binary32([](Workspace& w, Tally& t) { check_binary16(w, 1, t); });
  INFO(tally.report());
  CHECK(tally.compared == 4 * (std::uint64_t{1} << 32));
  CHECK(tally.mismatches == 0);
}

TEST_CASE("hardware: binary32 to bfloat16 matches AVX512-BF16 (all binary32 inputs)", "[.exhaustive][hardware]") {
  if (!cpu_has_avx512bf16())
    test::skip("this CPU has no AVX512-BF16: bfloat16 conversion not checked against hardware");
  const Tally tally = over_all_binary32([](Workspace& w, Tally& t) { check_bfloat16(w, 1, t); });
  INFO(tally.report());
  // Every binary32 subnormal, both signs, is excluded; nothing else.
  CHECK(tally.excluded == 2 * ((std::uint64_t{1} << 23) - 1));
  CHECK(tally.compared == (std::uint64_t{1} << 32) - tally.excluded);
  CHECK(tally.exclusion_violations == 0);
  CHECK(tally.mismatches == 0);
}

}  // namespace mpsim
