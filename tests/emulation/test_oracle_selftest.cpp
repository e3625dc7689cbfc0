// Checks the MPFR oracle itself, before it judges the emulator: against the
// machine's IEEE 754 binary64/binary32 arithmetic and conversions (x86 SSE,
// FMA and F16C instructions, all four IEEE rounding directions, exception
// flags read back from the floating-point environment; x86 detects tininess
// after rounding, as the contract does) and against the Berkeley TestFloat
// vectors in shared/testfloat (which also cover ties-away and round-to-odd).
// No emulator code runs here.
#include <catch2/catch.hpp>

#include <bit>
#include <cfenv>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "support/test_support.hpp"
#include "test_oracle_common.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mpsim::oracle::testing {
namespace {

constexpr Format kBinary64{11, 52};
constexpr Format kBinary32{8, 23};
constexpr Format kBinary16{5, 10};
constexpr Format kBfloat16{8, 7};

constexpr RoundingMode kIeeeModes[] = {RoundingMode::nearest_even, RoundingMode::toward_zero,
                                       RoundingMode::toward_positive, RoundingMode::toward_negative};

#if defined(__x86_64__)

int fenv_rounding(RoundingMode mode) {
  switch (mode) {
    case RoundingMode::toward_zero: return FE_TOWARDZERO;
    case RoundingMode::toward_positive: return FE_UPWARD;
    case RoundingMode::toward_negative: return FE_DOWNWARD;
    default: return FE_TONEAREST;
  }
}

Flags flags_from_fenv() {
  const int raised = std::fetestexcept(FE_ALL_EXCEPT);
  Flags flags;
  if (raised & FE_INEXACT) flags.bits |= Flags::inexact;
  if (raised & FE_UNDERFLOW) flags.bits |= Flags::underflow;
  if (raised & FE_OVERFLOW) flags.bits |= Flags::overflow;
  if (raised & FE_DIVBYZERO) flags.bits |= Flags::divide_by_zero;
  if (raised & FE_INVALID) flags.bits |= Flags::invalid;
  return flags;
}

// Runs `op` (which reads its operands from volatiles and writes its result to
// a volatile, so the compiler keeps it between the environment calls) in `mode`.
template <class Op>
Flags run_in_mode(RoundingMode mode, Op op) {
  std::fesetround(fenv_rounding(mode));
  std::feclearexcept(FE_ALL_EXCEPT);
  op();
  const Flags flags = flags_from_fenv();
  std::fesetround(FE_TONEAREST);
  return flags;
}

Rounded hardware_binary64(Operation op, RoundingMode mode, double a, double b) {
  volatile double va = a, vb = b, vr = 0;
  const Flags flags = run_in_mode(mode, [&] {
    const __m128d x = _mm_set_sd(va), y = _mm_set_sd(vb);
    switch (op) {
      case Operation::add: vr = _mm_cvtsd_f64(_mm_add_sd(x, y)); break;
      case Operation::sub: vr = _mm_cvtsd_f64(_mm_sub_sd(x, y)); break;
      case Operation::mul: vr = _mm_cvtsd_f64(_mm_mul_sd(x, y)); break;
      case Operation::div: vr = _mm_cvtsd_f64(_mm_div_sd(x, y)); break;
      case Operation::sqrt: vr = _mm_cvtsd_f64(_mm_sqrt_sd(x, x)); break;
      case Operation::fma: break;
    }
  });
  return {Bits{std::bit_cast<std::uint64_t>(static_cast<double>(vr))}, flags};
}

Rounded hardware_binary32(Operation op, RoundingMode mode, float a, float b) {
  volatile float va = a, vb = b, vr = 0;
  const Flags flags = run_in_mode(mode, [&] {
    const __m128 x = _mm_set_ss(va), y = _mm_set_ss(vb);
    switch (op) {
      case Operation::add: vr = _mm_cvtss_f32(_mm_add_ss(x, y)); break;
      case Operation::sub: vr = _mm_cvtss_f32(_mm_sub_ss(x, y)); break;
      case Operation::mul: vr = _mm_cvtss_f32(_mm_mul_ss(x, y)); break;
      case Operation::div: vr = _mm_cvtss_f32(_mm_div_ss(x, y)); break;
      case Operation::sqrt: vr = _mm_cvtss_f32(_mm_sqrt_ss(x)); break;
      case Operation::fma: break;
    }
  });
  return {Bits{std::bit_cast<std::uint32_t>(static_cast<float>(vr))}, flags};
}

__attribute__((target("fma"))) double fused_multiply_add(double a, double b, double c) {
  return _mm_cvtsd_f64(_mm_fmadd_sd(_mm_set_sd(a), _mm_set_sd(b), _mm_set_sd(c)));
}

Rounded hardware_fma(RoundingMode mode, double a, double b, double c) {
  volatile double va = a, vb = b, vc = c, vr = 0;
  const Flags flags = run_in_mode(mode, [&] { vr = fused_multiply_add(va, vb, vc); });
  return {Bits{std::bit_cast<std::uint64_t>(static_cast<double>(vr))}, flags};
}

Rounded hardware_double_to_float(RoundingMode mode, double a) {
  volatile double va = a;
  volatile float vr = 0;
  const Flags flags = run_in_mode(mode, [&] { vr = _mm_cvtss_f32(_mm_cvtsd_ss(_mm_setzero_ps(), _mm_set_sd(va))); });
  return {Bits{std::bit_cast<std::uint32_t>(static_cast<float>(vr))}, flags};
}

// VCVTPS2PH takes its rounding direction from an immediate (and raises MXCSR flags).
__attribute__((target("f16c"))) int narrow_to_half(float value, RoundingMode mode) {
  const __m128 x = _mm_set_ss(value);
  switch (mode) {
    case RoundingMode::toward_negative: return _mm_extract_epi16(_mm_cvtps_ph(x, 1), 0);
    case RoundingMode::toward_positive: return _mm_extract_epi16(_mm_cvtps_ph(x, 2), 0);
    case RoundingMode::toward_zero: return _mm_extract_epi16(_mm_cvtps_ph(x, 3), 0);
    default: return _mm_extract_epi16(_mm_cvtps_ph(x, 0), 0);
  }
}

__attribute__((target("f16c"))) float widen_half(unsigned short bits) { return _cvtsh_ss(bits); }

Rounded hardware_float_to_half(RoundingMode mode, float a) {
  volatile float va = a;
  volatile int vr = 0;
  const Flags flags = run_in_mode(RoundingMode::nearest_even, [&] { vr = narrow_to_half(va, mode); });
  return {Bits{static_cast<std::uint64_t>(vr) & 0xFFFF}, flags};
}

double as_double(Bits b) { return std::bit_cast<double>(b.value); }

float as_float(Bits b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b.value)); }

Rounded oracle_op(const Format& f, Operation op, RoundingMode mode, Bits a, Bits b, Bits c) {
  switch (op) {
    case Operation::add: return oracle::add(f, mode, a, b);
    case Operation::sub: return oracle::sub(f, mode, a, b);
    case Operation::mul: return oracle::mul(f, mode, a, b);
    case Operation::div: return oracle::div(f, mode, a, b);
    case Operation::sqrt: return oracle::sqrt(f, mode, a);
    case Operation::fma: return oracle::fma(f, mode, a, b, c);
  }
  return {};
}

// Operands: every pair of edge encodings, then structured random ones.
template <class Check>
void for_operands(const Format& f, Operation op, int random_cases, std::uint64_t seed, Check check) {
  const std::vector<Bits> edges = edge_bits(f);
  for (Bits a : edges) {
    for (Bits b : edges) {
      if (!check(a, b, edges[(a.value + b.value) % edges.size()])) return;
    }
  }
  Rng rng(seed);
  for (int i = 0; i < random_cases; ++i) {
    const Bits a = interesting_bits(f, rng);
    const Bits b = partner_bits(f, rng, op, a);
    const Bits c = addend_bits(f, rng, a, b);
    if (!check(a, b, c)) return;
  }
}

#endif  // __x86_64__

constexpr Operation kOperations[] = {Operation::add, Operation::sub, Operation::mul,
                                     Operation::div, Operation::sqrt, Operation::fma};

}  // namespace

TEST_CASE("oracle self-test: binary64 arithmetic matches the hardware", "[oracle][selftest]") {
#if !defined(__x86_64__)
  mpsim::test::skip("the hardware comparison needs x86-64");
#else
  if (!__builtin_cpu_supports("fma")) mpsim::test::skip("this CPU has no FMA instructions");
  MismatchLog log;
  const std::uint64_t seed = 20240601;
  INFO("seed " << seed);
  for (Operation op : kOperations) {
    for_operands(kBinary64, op, 20000, seed + static_cast<int>(op), [&](Bits a, Bits b, Bits c) {
      for (RoundingMode mode : kIeeeModes) {
        const Rounded want = oracle_op(kBinary64, op, mode, a, b, c);
        const Rounded got = op == Operation::fma
                                ? hardware_fma(mode, as_double(a), as_double(b), as_double(c))
                                : hardware_binary64(op, mode, as_double(a), as_double(b));
        // Here the hardware is the reference and the oracle is checked.
        log.check(kBinary64, [&] {
          return std::string(operation_name(op)) + " " + std::string(mode_name(mode)) + " a=" + hex(a.value) +
                 " b=" + hex(b.value) + " c=" + hex(c.value) + " (expected: hardware, got: oracle)";
        }, got, want);
        if (log.full()) return false;
      }
      return true;
    });
  }
  log.finish();
#endif
}

TEST_CASE("oracle self-test: binary32 arithmetic and binary64->binary32 conversion match the hardware",
          "[oracle][selftest]") {
#if !defined(__x86_64__)
  mpsim::test::skip("the hardware comparison needs x86-64");
#else
  MismatchLog log;
  const std::uint64_t seed = 20240602;
  INFO("seed " << seed);
  for (Operation op : {Operation::add, Operation::sub, Operation::mul, Operation::div, Operation::sqrt}) {
    for_operands(kBinary32, op, 20000, seed + static_cast<int>(op), [&](Bits a, Bits b, Bits) {
      for (RoundingMode mode : kIeeeModes) {
        const Rounded want = oracle_op(kBinary32, op, mode, a, b, b);
        const Rounded got = hardware_binary32(op, mode, as_float(a), as_float(b));
        log.check(kBinary32, [&] {
          return std::string(operation_name(op)) + " " + std::string(mode_name(mode)) + " a=" + hex(a.value) +
                 " b=" + hex(b.value) + " (expected: hardware, got: oracle)";
        }, got, want);
        if (log.full()) return false;
      }
      return true;
    });
  }
  // binary64 -> binary32: the double's bits concentrated on binary32's
  // neighbours, midpoints, overflow threshold and subnormal range.
  Rng rng(seed);
  const std::vector<Bits> edges = edge_bits(kBinary64);
  for (int i = 0; i < 200000 && !log.full(); ++i) {
    double x = 0;
    if (i < static_cast<int>(edges.size())) {
      x = as_double(edges[i]);
    } else if (i % 2 == 0) {
      x = as_double(interesting_bits(kBinary64, rng));
    } else {
      // Near a binary32 value: on it, at a midpoint, or a fraction of the gap away; maybe +- 1 ulp.
      const Bits v = interesting_bits(kBinary32, rng);
      const FloatClass kind = oracle::classify(kBinary32, v);
      if (kind == FloatClass::nan || kind == FloatClass::infinite) continue;
      x = near_format_value(kBinary32, v, rng);
      if (rng() % 2) x = std::nextafter(x, rng() % 2 ? HUGE_VAL : -HUGE_VAL);
    }
    for (RoundingMode mode : kIeeeModes) {
      const Rounded want = oracle::from_double(kBinary32, mode, x);
      const Rounded got = hardware_double_to_float(mode, x);
      log.check(kBinary32, [&] {
        return "binary64->binary32 " + std::string(mode_name(mode)) + " x=" + hex(std::bit_cast<std::uint64_t>(x)) +
               " (expected: hardware, got: oracle)";
      }, got, want);
    }
  }
  log.finish();
#endif
}

TEST_CASE("oracle self-test: binary32->binary16 conversion matches F16C", "[oracle][selftest]") {
#if !defined(__x86_64__)
  mpsim::test::skip("the hardware comparison needs x86-64");
#else
  if (!__builtin_cpu_supports("f16c")) mpsim::test::skip("this CPU has no F16C instructions");
  MismatchLog log;
  const std::uint64_t seed = 20240603;
  INFO("seed " << seed);
  Rng rng(seed);
  const std::vector<Bits> edges = edge_bits(kBinary32);
  const std::vector<Bits> half_edges = edge_bits(kBinary16);
  for (int i = 0; i < 300000 && !log.full(); ++i) {
    float x = 0;
    if (i < static_cast<int>(edges.size())) {
      x = as_float(edges[i]);
    } else if (i % 3 == 0) {
      x = as_float(interesting_bits(kBinary32, rng));
    } else {
      // Around binary16 values: exact, midpoints, +- a few binary32 ulps.
      const Bits h = i % 3 == 1 ? half_edges[rng() % half_edges.size()] : interesting_bits(kBinary16, rng);
      const FloatClass kind = oracle::classify(kBinary16, h);
      if (kind == FloatClass::nan || kind == FloatClass::infinite) continue;
      x = static_cast<float>(near_format_value(kBinary16, h, rng));  // exact: k/64 of a binary16 gap fits in binary32
      if (rng() % 2) x = std::nextafter(x, rng() % 2 ? HUGE_VALF : -HUGE_VALF);
    }
    for (RoundingMode mode : kIeeeModes) {
      const Rounded want = oracle::from_float(kBinary16, mode, x);
      const Rounded got = hardware_float_to_half(mode, x);
      log.check(kBinary16, [&] {
        return "binary32->binary16 " + std::string(mode_name(mode)) + " x=" + hex(std::bit_cast<std::uint32_t>(x)) +
               " (expected: F16C, got: oracle)";
      }, got, want);
    }
  }
  // And every binary16 encoding widens exactly (VCVTPH2PS).
  for (std::uint32_t h = 0; h < 65536 && !log.full(); ++h) {
    const Decoded d = decode(kBinary16, Bits{h});
    const float wide = widen_half(static_cast<unsigned short>(h));
    log.count();
    if (d.kind == FloatClass::nan ? wide == wide : std::bit_cast<std::uint32_t>(wide) != std::bit_cast<std::uint32_t>(static_cast<float>(d.value.to_double()))) {
      log.fail("binary16 " + describe(kBinary16, Bits{h}) + " widens to " + hex(std::bit_cast<std::uint32_t>(wide)));
    }
  }
  log.finish();
#endif
}

// --- TestFloat vectors ------------------------------------------------------------
namespace {

struct VectorFile {
  const char* function;
  int operands;
  Format operand_format;  // binary16 for the f16 operations
  Format result_format;
};

constexpr VectorFile kVectorFiles[] = {
    {"f16_add", 2, kBinary16, kBinary16},   {"f16_sub", 2, kBinary16, kBinary16},
    {"f16_mul", 2, kBinary16, kBinary16},   {"f16_div", 2, kBinary16, kBinary16},
    {"f16_sqrt", 1, kBinary16, kBinary16},  {"f16_mulAdd", 3, kBinary16, kBinary16},
    {"f32_to_f16", 1, kBinary32, kBinary16}, {"f64_to_f16", 1, kBinary64, kBinary16},
    {"f32_to_bf16", 1, kBinary32, kBfloat16},
};

struct ModeFile {
  const char* suffix;
  RoundingMode mode;
};
constexpr ModeFile kModeFiles[] = {{"rnear_even", RoundingMode::nearest_even},
                                   {"rnear_maxMag", RoundingMode::nearest_away},
                                   {"rminMag", RoundingMode::toward_zero},
                                   {"rmax", RoundingMode::toward_positive},
                                   {"rmin", RoundingMode::toward_negative},
                                   {"rodd", RoundingMode::odd}};

// Reads a gzip-compressed vector file line by line through `gzip -dc`.
template <class Line>
bool read_gzip_lines(const std::filesystem::path& path, Line line) {
  const std::string command = "gzip -dc '" + path.string() + "'";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return false;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe.get()) != nullptr) {
    if (!line(buffer)) break;
  }
  return true;
}

Rounded oracle_vector_case(const VectorFile& file, RoundingMode mode, const std::uint64_t* in) {
  const std::string_view name = file.function;
  const Format& f = file.operand_format;
  if (name == "f16_add") return oracle::add(f, mode, Bits{in[0]}, Bits{in[1]});
  if (name == "f16_sub") return oracle::sub(f, mode, Bits{in[0]}, Bits{in[1]});
  if (name == "f16_mul") return oracle::mul(f, mode, Bits{in[0]}, Bits{in[1]});
  if (name == "f16_div") return oracle::div(f, mode, Bits{in[0]}, Bits{in[1]});
  if (name == "f16_sqrt") return oracle::sqrt(f, mode, Bits{in[0]});
  if (name == "f16_mulAdd") return oracle::fma(f, mode, Bits{in[0]}, Bits{in[1]}, Bits{in[2]});
  return oracle::convert(f, Bits{in[0]}, file.result_format, mode);
}

}  // namespace

TEST_CASE("oracle self-test: agrees with the TestFloat binary16 vectors", "[oracle][selftest]") {
  const auto shared = mpsim::test::shared_dir();
  if (!shared || !std::filesystem::is_directory(*shared / "testfloat")) {
    mpsim::test::skip("no shared/testfloat folder with the TestFloat vectors");
  }
  MismatchLog log;
  int files = 0;
  const auto check_file = [&](const VectorFile& file, const ModeFile& mode, const std::filesystem::path& path) {
    ++files;
    read_gzip_lines(path, [&](const char* text) {
      std::uint64_t fields[5] = {};
      int n = 0;
      const char* p = text;
      char* end = nullptr;
      while (n < 5) {
        const std::uint64_t v = std::strtoull(p, &end, 16);
        if (end == p) break;
        fields[n++] = v;
        p = end;
      }
      if (n != file.operands + 2) return true;  // not a case line
      const Rounded expected{Bits{fields[file.operands]},
                             Flags{static_cast<std::uint8_t>(fields[file.operands + 1])}};
      const Rounded got = oracle_vector_case(file, mode.mode, fields);
      log.check(file.result_format, [&] {
        return std::string(file.function) + "." + mode.suffix + ": " + text + " (expected: TestFloat, got: oracle)";
      }, expected, got);
      return !log.full();
    });
  };
  for (const VectorFile& file : kVectorFiles) {
    for (const ModeFile& mode : kModeFiles) {
      const auto path = *shared / "testfloat" / (std::string(file.function) + "." + mode.suffix + ".txt.gz");
      if (std::filesystem::exists(path)) check_file(file, mode, path);
    }
  }
  // Exact widenings: one file each, no mode.
  const VectorFile widenings[] = {{"f16_to_f32", 1, kBinary16, kBinary32}, {"bf16_to_f32", 1, kBfloat16, kBinary32}};
  for (const VectorFile& file : widenings) {
    const auto path = *shared / "testfloat" / (std::string(file.function) + ".txt.gz");
    if (std::filesystem::exists(path)) check_file(file, kModeFiles[0], path);
  }
  INFO(files << " vector files");
  CHECK(files >= 50);
  log.finish();
}

}  // namespace mpsim::oracle::testing
