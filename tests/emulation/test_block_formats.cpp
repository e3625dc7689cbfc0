// Block-scaled formats and their scale formats against an exact reference
// written here in rational arithmetic (Boost.Multiprecision cpp_rational):
// element and scale values from the specifications' formulas (OCP MX v1.0
// §5.3-5.4; E4M3 as OCP FP8), rounding by brute force over those values, the
// scale rules and NVFP4's binary32 steps as docs/block-formats.md states them,
// each binary32 operation rounded to nearest even here from its exact value.
// Nothing below calls the emulator's rounding: only quantize_blocks and
// round_to_scale, the code under test, and parse_block_format for the presets.
#include <catch2/catch.hpp>

#include <boost/multiprecision/cpp_int.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/block_format.hpp"
#include "mpsim/emulation/block_dot.hpp"
#include "mpsim/emulation/block_gemm.hpp"
#include "mpsim/emulation/block_scaling.hpp"
#include "mpsim/emulation/pattern_format.hpp"
#include "mpsim/emulation/hadamard.hpp"
#include "mpsim/emulation/scale_format.hpp"
#include "mpsim/emulation/simd.hpp"

namespace mpsim {
namespace {

using Q = boost::multiprecision::cpp_rational;
using Z = boost::multiprecision::cpp_int;

Q pow2(int e) {
  static thread_local std::map<int, Q> memo;
  const auto found = memo.find(e);
  if (found != memo.end()) return found->second;
  Q r = 1;
  const Q two = e >= 0 ? Q(2) : Q(1, 2);
  for (int i = 0; i < std::abs(e); ++i) r *= two;
  return memo.emplace(e, r).first->second;
}

// The exact value of a finite binary64 (and so binary32) number.
Q exact(double x) {
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1): m 2^53 is an integer
  const auto n = static_cast<std::int64_t>(std::ldexp(m, 53));
  return Q(Z(n)) * pow2(e - 53);
}

// floor(log2(a)) for a > 0, by comparison.
int floor_log2(const Q& a) {
  int e = 0;
  while (pow2(e) > a) --e;
  while (pow2(e + 1) <= a) ++e;
  return e;
}

// --- Element formats from the specifications --------------------------------------
struct Spec {
  std::string name;
  int e_bits, m_bits, bias;
  int emax;                  // OCP MX v1.0 Table 1's emax_elem
  bool integer = false;      // MXINT8: k * 2^-6, |k| <= 127
  bool nan_at_all_ones = false;  // E4M3: S.1111.111 is NaN
  bool ieee_top = false;         // E5M2: the all-ones exponent is inf/NaN
};

const Spec kE4m3{"e4m3", 4, 3, 7, 8, false, true, false};
const Spec kE5m2{"e5m2", 5, 2, 15, 15, false, false, true};
const Spec kE3m2{"e3m2", 3, 2, 3, 4};
const Spec kE2m3{"e2m3", 2, 3, 1, 2};
const Spec kE2m1{"e2m1", 2, 1, 1, 2};
const Spec kInt8{"int8:f6", 8, 0, 0, 0, true};

// Non-negative values of the element, by code (codes of the positive half),
// without NaN or infinity codes.
struct Table {
  std::vector<std::uint32_t> codes;
  std::vector<Q> values;
  Q largest;
};

Table table(const Spec& s) {
  Table t;
  if (s.integer) {
    for (int k = 0; k <= 127; ++k) {
      t.codes.push_back(static_cast<std::uint32_t>(k));
      t.values.push_back(Q(k) * pow2(-6));
    }
  } else {
    const std::uint32_t half = 1u << (s.e_bits + s.m_bits);
    for (std::uint32_t c = 0; c < half; ++c) {
      const std::uint32_t m = c & ((1u << s.m_bits) - 1), e = c >> s.m_bits;
      const std::uint32_t top = (1u << s.e_bits) - 1;
      if (s.ieee_top && e == top) continue;
      if (s.nan_at_all_ones && e == top && m == (1u << s.m_bits) - 1) continue;
      const Q fraction = Q(m) * pow2(-s.m_bits);
      t.codes.push_back(c);
      t.values.push_back(e == 0 ? fraction * pow2(1 - s.bias) : (1 + fraction) * pow2(static_cast<int>(e) - s.bias));
    }
  }
  t.largest = t.values.back();
  return t;
}

// Nearest even, saturating: the element for the exact y.
struct Pick {  // an element the reference picked
  std::uint32_t code;
  Q value;  // signed; -0 is carried by `negative`
  bool negative;
  bool saturated;
};

// `negative`: the sign of y, given apart so that -0 keeps it.
Pick round_nearest_even(const Spec& s, const Table& t, const Q& y, bool negative) {
  const Q a = y < 0 ? Q(-y) : y;
  Pick r{0, 0, negative, false};
  std::size_t pick = 0;
  if (a >= t.largest) {
    pick = t.values.size() - 1;
    // Saturated: beyond the largest after rounding with an unbounded exponent
    // range. For OCP floats the next value up would be largest + ulp(largest).
    r.saturated = a > t.largest && !(s.integer ? a < t.largest + Q(1, 2) * pow2(-6)
                                                : a - t.largest < (t.largest - t.values[t.values.size() - 2]) / 2 ||
                                                      (a - t.largest == (t.largest - t.values[t.values.size() - 2]) / 2 &&
                                                       (t.codes.back() & 1) == 0));
  } else {
    const std::size_t hi = static_cast<std::size_t>(std::lower_bound(t.values.begin(), t.values.end(), a) - t.values.begin());
    if (t.values[hi] == a) {
      pick = hi;
    } else {
      const std::size_t lo = hi - 1;
      const Q dl = a - t.values[lo], dh = t.values[hi] - a;
      pick = dl < dh ? lo : dh < dl ? hi : ((t.codes[lo] & 1) == 0 ? lo : hi);
    }
  }
  r.code = t.codes[pick];
  r.value = negative ? Q(-t.values[pick]) : t.values[pick];
  if (negative) {
    if (s.integer) r.code = static_cast<std::uint32_t>(-static_cast<std::int32_t>(r.code)) & 0xFF;
    else r.code |= 1u << (s.e_bits + s.m_bits);
  }
  if (s.integer && r.value == 0) r.code = 0, r.negative = false;  // integers have no -0
  return r;
}

// Binary32 rounding to nearest even of an exact value (inf beyond the range).
// A zero result takes `zero_negative`'s sign (the xor of the operands' signs).
float to_binary32(const Q& q, bool zero_negative = false) {
  if (q == 0) return zero_negative ? -0.0f : 0.0f;
  const bool negative = q < 0;
  const Q a = negative ? Q(-q) : q;
  const int e = std::max(floor_log2(a), -126);
  const Q quantum = pow2(e - 23);
  const Q units = a / quantum;
  Z n = boost::multiprecision::numerator(units) / boost::multiprecision::denominator(units);  // floor
  const Q rest = units - Q(n);
  if (rest > Q(1, 2) || (rest == Q(1, 2) && (n & 1) != 0)) ++n;
  const double value = std::ldexp(static_cast<double>(n), e - 23);  // n <= 2^24: exact
  const float f = value >= std::ldexp(1.0, 128) ? std::numeric_limits<float>::infinity() : static_cast<float>(value);
  return negative ? -f : f;
}

// --- The reference quantizers --------------------------------------------------------
struct Expected {
  std::vector<double> values;  // NaN where the reference says NaN
  std::vector<double> scales;
  std::vector<std::uint64_t> saturated;
};

double to_double_exact(const Q& q, bool negative_zero) {
  if (q == 0) return negative_zero ? -0.0 : 0.0;
  const double d = static_cast<double>(q);
  REQUIRE(exact(d) == q);  // every dequantized value is a binary64 value
  return d;
}

Expected reference_mx(const Spec& s, bool ceil_rule, int block, const std::vector<float>& x) {
  const Table t = table(s);
  Expected out;
  for (std::size_t b0 = 0; b0 < x.size(); b0 += static_cast<std::size_t>(block)) {
    const std::size_t b1 = std::min(x.size(), b0 + static_cast<std::size_t>(block));
    bool special = false;
    Q amax = 0;
    for (std::size_t i = b0; i < b1; ++i) {
      if (!std::isfinite(x[i])) special = true;
      else amax = std::max(amax, exact(std::fabs(static_cast<double>(x[i]))));
    }
    std::uint64_t saturated = 0;
    if (special) {
      out.scales.push_back(std::numeric_limits<double>::quiet_NaN());
      for (std::size_t i = b0; i < b1; ++i) out.values.push_back(std::numeric_limits<double>::quiet_NaN());
      out.saturated.push_back(0);
      continue;
    }
    int e = -127;
    if (amax > 0) {
      e = floor_log2(amax) - s.emax;
      if (ceil_rule) {
        e = -400;
        while (amax / pow2(e) > t.largest) ++e;
      }
      e = std::clamp(e, -127, 127);
    }
    out.scales.push_back(std::ldexp(1.0, e));
    for (std::size_t i = b0; i < b1; ++i) {
      const Pick r = round_nearest_even(s, t, exact(static_cast<double>(x[i])) / pow2(e), std::signbit(x[i]));
      saturated += r.saturated;
      out.values.push_back(to_double_exact(r.value * pow2(e), r.negative));
    }
    out.saturated.push_back(saturated);
  }
  return out;
}

Expected reference_nvfp4(bool te_order, const std::vector<float>& x, double& tensor_scale) {
  const Spec& s = kE2m1;
  const Table elements = table(s), scales = table(kE4m3);
  Expected out;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const bool any_nan = std::any_of(x.begin(), x.end(), [](float v) { return std::isnan(v); });
  float amax_t = 0;
  for (float v : x) amax_t = std::max(amax_t, std::fabs(v));
  float s_enc = 1.0f;
  if (amax_t > 0 && std::isfinite(amax_t)) s_enc = std::min(to_binary32(Q(2688) / exact(amax_t)), FLT_MAX);
  const float ts = to_binary32(Q(1) / exact(s_enc));
  tensor_scale = any_nan ? nan : ts;
  const auto f32_product = [](float a, float b) {  // binary32 a * b, infinities kept
    if (std::isinf(a) || std::isinf(b)) return (a == 0 || b == 0) ? std::numeric_limits<float>::quiet_NaN() : a * b;
    return to_binary32(exact(a) * exact(b), std::signbit(a) != std::signbit(b));
  };
  for (std::size_t b0 = 0; b0 < x.size(); b0 += 16) {
    const std::size_t b1 = std::min(x.size(), b0 + 16);
    if (any_nan) {
      out.scales.push_back(nan);
      for (std::size_t i = b0; i < b1; ++i) out.values.push_back(nan);
      out.saturated.push_back(0);
      continue;
    }
    float amax = 0;
    for (std::size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    float sc = 0;
    if (!te_order) {
      const float sixth = std::isinf(amax) ? amax : to_binary32(exact(amax) / 6);
      sc = f32_product(sixth, s_enc);
    } else {
      const float factor = f32_product(s_enc, to_binary32(Q(1, 6)));
      sc = f32_product(amax, factor);
    }
    sc = std::min(std::min(sc, FLT_MAX), 448.0f);
    const Pick sb_r = round_nearest_even(kE4m3, scales, exact(sc), false);
    const float sb = static_cast<float>(static_cast<double>(sb_r.value));
    out.scales.push_back(sb);
    const float product = f32_product(sb, ts);
    const float enc = product == 0 ? FLT_MAX : std::min(to_binary32(Q(1) / exact(product)), FLT_MAX);
    std::uint64_t saturated = 0;
    for (std::size_t i = b0; i < b1; ++i) {
      const float y = f32_product(x[i], enc);
      Pick r{};
      if (std::isinf(y)) r = {0, y > 0 ? elements.largest : Q(-elements.largest), y < 0, true};
      else r = round_nearest_even(s, elements, exact(y), std::signbit(y));
      saturated += r.saturated;
      out.values.push_back(to_double_exact(r.value * exact(sb) * exact(ts), r.negative));
    }
    out.saturated.push_back(saturated);
  }
  return out;
}

Expected reference_tiles(int tile, const std::vector<float>& x) {
  const Table t = table(kE4m3);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Expected out;
  for (std::size_t b0 = 0; b0 < x.size(); b0 += static_cast<std::size_t>(tile)) {
    const std::size_t b1 = std::min(x.size(), b0 + static_cast<std::size_t>(tile));
    bool has_nan = false, has_inf = false;
    float amax = 0;
    for (std::size_t i = b0; i < b1; ++i) {
      if (std::isnan(x[i])) has_nan = true;
      else if (std::isinf(x[i])) has_inf = true;
      else amax = std::max(amax, std::fabs(x[i]));
    }
    if (has_nan || has_inf) {
      out.saturated.push_back(0);
      out.scales.push_back(has_nan ? nan : std::numeric_limits<double>::infinity());
      for (std::size_t i = b0; i < b1; ++i) out.values.push_back(nan);
      continue;
    }
    const float sc = to_binary32(exact(amax) / 448);
    out.scales.push_back(sc);
    std::uint64_t saturated = 0;
    for (std::size_t i = b0; i < b1; ++i) {
      if (sc == 0) {
        if (x[i] == 0) {
          out.values.push_back(static_cast<double>(x[i]));
          continue;
        }
        ++saturated;
        out.values.push_back(x[i] > 0 ? 0.0 : -0.0);  // x / 0 saturates to +-448, times 0
        continue;
      }
      const float y = to_binary32(exact(x[i]) / exact(sc), std::signbit(x[i]));
      const Pick r = round_nearest_even(kE4m3, t, exact(y), std::signbit(y));
      saturated += r.saturated;
      out.values.push_back(to_double_exact(r.value * exact(sc), r.negative));
    }
    out.saturated.push_back(saturated);
  }
  return out;
}

// --- Comparison ------------------------------------------------------------------------
bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

void compare(const std::string& what, const Expected& want, const BlockQuantized& got) {
  INFO(what);
  REQUIRE(got.values.size() == want.values.size());
  REQUIRE(got.scales.size() == want.scales.size());
  int shown = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.values.size(); ++i) {
    if (!same(got.values[i], want.values[i])) {
      ++bad;
      if (shown++ < 5) FAIL_CHECK("value " << i << ": got " << got.values[i] << ", reference " << want.values[i]);
    }
  }
  for (std::size_t b = 0; b < want.scales.size(); ++b) {
    if (!same(got.scales[b], want.scales[b])) {
      ++bad;
      if (shown++ < 10) FAIL_CHECK("scale " << b << ": got " << got.scales[b] << ", reference " << want.scales[b]);
    }
    if (b < want.saturated.size() && got.block_counts[b].saturated != want.saturated[b]) {
      ++bad;
      if (shown++ < 10)
        FAIL_CHECK("block " << b << " saturated: got " << got.block_counts[b].saturated << ", reference " << want.saturated[b]);
    }
  }
  CHECK(bad == 0);
}

// Blocks of `block` values with what breaks quantizers: ties between element
// values (at random scales), an outlier, zeros of both signs, binary32
// subnormals, values just around the element grid's midpoints, and (rarely)
// NaN or infinity.
std::vector<float> random_blocks(std::mt19937_64& rng, int block, int blocks, const Spec& s, bool specials) {
  const Table t = table(s);
  std::vector<float> x;
  for (int b = 0; b < blocks; ++b) {
    const int scale = static_cast<int>(rng() % 200) - 120;
    for (int i = 0; i < block; ++i) {
      float v = 0;
      const std::size_t k = rng() % (t.values.size() - 1);
      const Q mid = (t.values[k] + t.values[k + 1]) / 2;
      switch (rng() % 9) {
        case 0: v = static_cast<float>(static_cast<double>(mid * pow2(scale))); break;  // a tie (when exact)
        case 1: v = std::nextafter(static_cast<float>(static_cast<double>(mid * pow2(scale))), 0.0f); break;
        case 2: v = static_cast<float>(static_cast<double>(t.values[k] * pow2(scale))); break;
        case 3: v = (rng() % 2) ? 0.0f : -0.0f; break;
        case 4: v = std::ldexp(static_cast<float>(rng() % 1000 + 1), -149 + static_cast<int>(rng() % 20)); break;
        case 5: v = std::ldexp(std::uniform_real_distribution<float>(0.5f, 1)(rng), scale + 30); break;  // outlier
        default: v = std::ldexp(std::uniform_real_distribution<float>(0, 8)(rng), scale); break;
      }
      if (!std::isfinite(v)) v = FLT_MAX;
      if (rng() % 2) v = -v;
      if (specials && rng() % 500 == 0) v = (rng() % 2) ? std::numeric_limits<float>::quiet_NaN() : -INFINITY;
      x.push_back(v);
    }
  }
  return x;
}

struct MxCase {
  const char* preset;
  const Spec* spec;
};
const MxCase kMx[] = {{"mxfp8-e4m3", &kE4m3}, {"mxfp8-e5m2", &kE5m2}, {"mxfp6-e3m2", &kE3m2},
                      {"mxfp6-e2m3", &kE2m3}, {"mxfp4", &kE2m1},     {"mxint8", &kInt8}};

}  // namespace

TEST_CASE("E8M0 and UE4M3: every code round-trips, and every mode matches brute force", "[block][scale]") {
  // E8M0: 2^-127 .. 2^127 and NaN.
  for (std::uint32_t c = 0; c < 256; ++c) {
    const double v = scale_value(ScaleFormat::e8m0, c);
    if (c == kE8m0Nan) {
      CHECK(std::isnan(v));
      continue;
    }
    CHECK(v == std::ldexp(1.0, static_cast<int>(c) - 127));
    CHECK(round_to_scale(ScaleFormat::e8m0, Rounding{}, v).bits.value == c);
  }
  // UE4M3: E4M3's non-negative values from the spec's formula.
  const Table t = table(kE4m3);
  for (std::size_t i = 0; i < t.codes.size(); ++i) {
    CHECK(exact(scale_value(ScaleFormat::ue4m3, t.codes[i])) == t.values[i]);
    CHECK(round_to_scale(ScaleFormat::ue4m3, Rounding{}, static_cast<double>(t.values[i])).bits.value == t.codes[i]);
  }
  CHECK(std::isnan(scale_value(ScaleFormat::ue4m3, kUe4m3Nan)));
  // Between neighbours, every directed mode and nearest: brute force over the powers of two.
  for (int e = -127; e < 127; ++e) {
    for (double f : {1.25, 1.5, 1.75}) {
      const double v = std::ldexp(f, e);
      const auto code = [&](RoundingMode m) { return round_to_scale(ScaleFormat::e8m0, Rounding{m}, v).bits.value; };
      const auto lo = static_cast<std::uint64_t>(e + 127);
      CHECK(code(RoundingMode::toward_zero) == lo);
      CHECK(code(RoundingMode::toward_negative) == lo);
      CHECK(code(RoundingMode::toward_positive) == lo + 1);
      CHECK(code(RoundingMode::nearest_even) == (f < 1.5 ? lo : lo + 1));  // a tie goes to the larger power
      CHECK(code(RoundingMode::nearest_away) == (f < 1.5 ? lo : lo + 1));
    }
  }
  // The ends: no zero, no sign, no infinity.
  const Rounded below = round_to_scale(ScaleFormat::e8m0, Rounding{RoundingMode::toward_zero}, std::ldexp(1.0, -130));
  CHECK(below.bits.value == 0);
  CHECK(below.flags.has(Flags::underflow));
  CHECK(round_to_scale(ScaleFormat::e8m0, Rounding{}, 0.0).bits.value == 0);
  CHECK(round_to_scale(ScaleFormat::e8m0, Rounding{}, -1.0).bits.value == kE8m0Nan);
  CHECK(round_to_scale(ScaleFormat::e8m0, Rounding{}, std::ldexp(1.0, 200)).bits.value == kE8m0Nan - 1);
  CHECK(round_to_scale(ScaleFormat::e8m0, Rounding{}, std::ldexp(1.0, 200), false).bits.value == kE8m0Nan);
  CHECK(round_to_scale(ScaleFormat::ue4m3, Rounding{}, 1e6).bits.value == kUe4m3Largest);
  CHECK(round_to_scale(ScaleFormat::ue4m3, Rounding{}, 1e6, false).bits.value == kUe4m3Nan);
  CHECK(round_to_scale(ScaleFormat::ue4m3, Rounding{}, -0.0).bits.value == 0);
  CHECK(round_to_scale(ScaleFormat::ue4m3, Rounding{}, -1.0).flags.has(Flags::invalid));
}

TEST_CASE("MX formats: every element encoding at every reachable E8M0 scale is exact", "[block][mx]") {
  for (const MxCase& m : kMx) {
    const Table t = table(*m.spec);
    BlockFormat f = *parse_block_format(m.preset);
    // One block per scale: every code of both signs; its largest sets the scale.
    const int block = static_cast<int>(2 * t.values.size());
    f.block_cols = block;
    std::vector<float> x;
    for (int e = -127; e <= 127 - m.spec->emax; ++e) {
      for (const Q& v : t.values) {
        x.push_back(static_cast<float>(static_cast<double>(v * pow2(e))));
        x.push_back(-static_cast<float>(static_cast<double>(v * pow2(e))));
      }
    }
    const BlockQuantized got = quantize_blocks(f, x, 1, static_cast<std::int64_t>(x.size()));
    compare(std::string(m.preset) + " every code and scale", reference_mx(*m.spec, false, block, x), got);
    for (std::size_t i = 0; i < x.size(); ++i) {  // integers have no -0
      const double want = m.spec->integer && x[i] == 0 ? 0.0 : static_cast<double>(x[i]);
      CHECK(same(got.values[i], want));
    }
    CHECK(got.counts.saturated == 0);
    CHECK(got.counts.flushed == 0);
  }
}

TEST_CASE("MX formats: random blocks with ties, outliers, zeros, subnormals, NaN and infinity", "[block][mx]") {
  std::mt19937_64 rng(20261126);
  for (const MxCase& m : kMx) {
    for (bool ceil_rule : {false, true}) {
      BlockFormat f = *parse_block_format(m.preset);
      if (ceil_rule) f.rule = ScaleRule::ceil;
      for (int block : {32, 7}) {
        f.block_cols = block;
        const std::vector<float> x = random_blocks(rng, block, 300, *m.spec, true);
        compare(std::string(m.preset) + (ceil_rule ? " ceil" : " floor") + " block " + std::to_string(block),
                reference_mx(*m.spec, ceil_rule, block, x), quantize_blocks(f, x, 1, static_cast<std::int64_t>(x.size())));
      }
    }
  }
}

TEST_CASE("MX corner cases of docs/block-formats.md", "[block][mx]") {
  const BlockFormat mxfp4 = *parse_block_format("mxfp4");
  // A zero block: scale 2^-127, zeros keep their signs.
  std::vector<float> zeros = {0.0f, -0.0f, 0.0f};
  BlockQuantized q = quantize_blocks(mxfp4, zeros, 1, 3);
  CHECK(q.scale_codes[0] == 0);
  CHECK(std::signbit(q.values[1]));
  // NaN or infinity in a block: a NaN scale and NaN values there only.
  std::vector<float> x(64, 1.0f);
  x[3] = -INFINITY;
  q = quantize_blocks(mxfp4, x, 1, 64);
  CHECK(q.scale_codes[0] == kE8m0Nan);
  CHECK(std::isnan(q.values[0]));
  CHECK(q.values[40] == 1.0);
  // Floor saturates (7.9 with scale 1 becomes 6); ceil takes scale 2 and does not.
  std::vector<float> y = {7.9f, 1.0f};
  CHECK(quantize_blocks(mxfp4, y, 1, 2).values[0] == 6.0);
  CHECK(quantize_blocks(mxfp4, y, 1, 2).counts.saturated == 1);
  BlockFormat ceil = mxfp4;
  ceil.rule = ScaleRule::ceil;
  CHECK(quantize_blocks(ceil, y, 1, 2).values[0] == 8.0);
  CHECK(quantize_blocks(ceil, y, 1, 2).counts.saturated == 0);
  // A tiny element in a block with a large one is flushed inside its block.
  std::vector<float> z = {1000.0f, 1.0f};
  const BlockQuantized fz = quantize_blocks(mxfp4, z, 1, 2);
  CHECK(fz.values[1] == 0);
  CHECK(fz.counts.flushed == 1);
  // Subnormal binary32 inputs are not flushed: amax 2^-130 wants 2^-138, gets the smallest scale 2^-127.
  std::vector<float> sub = {std::ldexp(1.0f, -130), std::ldexp(1.0f, -133), std::ldexp(1.0f, -140)};
  const BlockQuantized qs = quantize_blocks(*parse_block_format("mxfp8-e4m3"), sub, 1, 3);
  CHECK(qs.scale_codes[0] == 0);
  CHECK(qs.values[0] == std::ldexp(1.0, -130));
  CHECK(qs.values[1] == std::ldexp(1.0, -133));
  CHECK(qs.values[2] == 0);  // 2^-13 of the scale: below E4M3's 2^-9
  CHECK(qs.counts.flushed == 1);
  CHECK(qs.counts.scale_clamped == 1);
  // MXINT8 is symmetric: -2 in a block of amax 2 is -127/64 * 1... saturating at k = -127.
  std::vector<float> ints = {-2.0f, 1.0f};
  const BlockQuantized qi = quantize_blocks(*parse_block_format("mxint8"), ints, 1, 2);
  CHECK(qi.values[0] == -2.0);  // scale 2^1: -1 = k 2^-6 with k = -64
  CHECK(qi.elements[0] == static_cast<std::uint32_t>(-64 & 0xFF));
}

// The scales of many blocks (each block: its amax, then a quarter of it negated, then zeros) from the fast path
// (whose whole groups of blocks compute their scales together on vectors) against the reference.
void check_scales_against_reference(const BlockFormat& f, const std::vector<float>& amaxes) {
  const std::size_t block = static_cast<std::size_t>(f.block_cols);
  std::vector<float> x(amaxes.size() * block, 0.0f);
  for (std::size_t b = 0; b < amaxes.size(); ++b) {
    x[b * block + b % block] = amaxes[b];
    x[b * block + (b + 1) % block] = -amaxes[b] / 4;
  }
  const auto cols = static_cast<std::int64_t>(x.size());
  const BlockQuantized want = quantize_blocks(f, x, 1, cols);
  std::vector<float> out(x.size());
  const BlockSummary got = quantize_blocks(f, x, out, 1, cols);
  std::size_t bad = 0;
  for (std::size_t b = 0; b < got.scale_codes.size(); ++b)
    if (got.scale_codes[b] != want.scale_codes[b] && bad++ < 3)
      FAIL_CHECK("amax " << amaxes[b] << ": fast scale code " << got.scale_codes[b] << ", reference "
                         << want.scale_codes[b]);
  CHECK(bad == 0);
  CHECK(got.counts == want.counts);
  for (std::size_t i = 0; i < x.size(); ++i)
    bad += std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(static_cast<float>(want.values[i]));
  CHECK(bad == 0);
}

TEST_CASE("MX scales: every binade of amax, both rules, the fast path's scale and clamp against the reference",
          "[block][mx][fast]") {
  // Amax in every binade of binary32, subnormals included, with the significands where floor and ceil part
  // (1, the largest element's own, one ulp either side, the largest): 2^-e can lie beyond binary32's range
  // (amax below 2^(emax - 127)), which an earlier fast path got wrong for ceil at amax = 2^(emax - 128).
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4"}) {
    for (const ScaleRule rule : {ScaleRule::ocp_floor, ScaleRule::ceil}) {
      BlockFormat f = *parse_block_format(name);
      f.rule = rule;
      const auto largest_significand = static_cast<float>(f.element.largest() / std::ldexp(1.0, f.element.emax()));
      std::vector<float> amaxes;
      for (int e = -149; e <= 127; ++e)
        for (const float m : {1.0f, std::nextafter(largest_significand, 0.0f), largest_significand,
                              std::nextafter(largest_significand, 2.0f), std::nextafter(2.0f, 0.0f)}) {
          const float amax = std::ldexp(m, e);
          if (amax != 0 && !std::isinf(amax)) amaxes.push_back(amax);
        }
      amaxes.push_back(0.0f);
      amaxes.push_back(INFINITY);
      amaxes.push_back(NAN);
      INFO(name << " " << to_string(rule));
      check_scales_against_reference(f, amaxes);
    }
  }
}

TEST_CASE("NVFP4 scales: block amaxes across UE4M3's range, its ties and its underflow, against the reference",
          "[block][nvfp4][fast]") {
  // One block of amax 2688 makes S_enc = 1; the others' s = amax / 6 sweep UE4M3's values, the midpoints
  // between them (ties), one ulp either side, below its smallest subnormal 2^-9 and above 448.
  std::vector<float> amaxes = {2688.0f, 0.0f};
  for (std::uint32_t code = 0; code < 0x7E; ++code) {
    const auto lo = static_cast<float>(scale_value(ScaleFormat::ue4m3, code));
    const auto hi = static_cast<float>(scale_value(ScaleFormat::ue4m3, code + 1));
    for (const float s : {lo, (lo + hi) / 2, std::nextafter((lo + hi) / 2, 0.0f), std::nextafter((lo + hi) / 2, 1e9f)})
      for (const float amax : {s * 6, std::nextafter(s * 6, 0.0f), std::nextafter(s * 6, 1e9f)})
        if (amax > 0) amaxes.push_back(amax);
  }
  for (const float amax : {1e-6f, 1e-30f, 1e-40f, 2687.0f, 2688.0f}) amaxes.push_back(amax);
  for (const char* name : {"nvfp4"})
    for (const ScaleRule rule : {ScaleRule::nvfp4, ScaleRule::nvfp4_te}) {
      BlockFormat f = *parse_block_format(name);
      f.rule = rule;
      INFO(to_string(rule));
      check_scales_against_reference(f, amaxes);
      // A tensor scale that is not 1: every amax times 3.
      std::vector<float> scaled = amaxes;
      for (float& a : scaled) a *= 3;
      check_scales_against_reference(f, scaled);
    }
}

TEST_CASE("microxcaling's documented MX cases (mx/tests/test_corners_mx.py): ours, and where its ties differ",
          "[block][mx]") {
  // Its elements round half away from zero; ours to nearest even (docs/block-formats.md). The reference
  // quantizer takes either: with nearest-away it must give microxcaling's values exactly; with nearest-even the
  // same except at the ties, listed.
  const auto values = [](const BlockFormat& f, const std::vector<float>& x, int rows, RoundingMode mode) {
    BlockQuantizeOptions o;
    o.rounding = Rounding{mode};
    return quantize_blocks(f, x, rows, static_cast<std::int64_t>(x.size()) / rows, o).values;
  };
  // test_mx_hw_test: MXINT8 (k 2^-6, |k| <= 127) in blocks of 10, the OCP floor scale.
  BlockFormat mxint8 = *parse_block_format("mxint8");
  mxint8.block_cols = 10;
  const std::vector<float> x = {
      1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,
      1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 2.0f, 2.0f, 2.0f, 2.0f, 2.0f,
      -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -2.0f, -2.0f, -2.0f, -2.0f, -2.0f,
      1.0f, 1.0f, 1.0f, 1.0f, 1.0f, -2.0f, -2.0f, -2.0f, -2.0f, -2.0f,
      1.015625f, 1.0234375f, 1.03125f, 1.0390625f, 1.25f, 1.2578125f, 1.9375f, 1.9453125f, 1.984375f, 1.9921875f,
      -1.984375f, -1.9765625f, -1.96875f, -1.9609375f, -1.9375f, -1.9296875f, -1.75f, -1.7421875f, -1.0f, -1.9921875f,
      1.99609375f, 1.98828125f, 0.0f, 0.00390625f, 0.0078125f, 0.01171875f, -0.015625f, -0.01171875f, -0.0078125f,
      -0.00390625f};
  const std::vector<double> away = {
      1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
      1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0,
      -1.0, -1.0, -1.0, -1.0, -1.0, -2.0, -2.0, -2.0, -2.0, -2.0,
      1.0, 1.0, 1.0, 1.0, 1.0, -2.0, -2.0, -2.0, -2.0, -2.0,
      1.015625, 1.03125, 1.03125, 1.046875, 1.25, 1.265625, 1.9375, 1.953125, 1.984375, 1.984375,
      -1.984375, -1.984375, -1.96875, -1.96875, -1.9375, -1.9375, -1.75, -1.75, -1.0, -1.984375,
      1.984375, 1.984375, 0.0, 0.0, 0.015625, 0.015625, -0.015625, -0.015625, -0.015625, 0.0};
  const std::vector<double> got_away = values(mxint8, x, 7, RoundingMode::nearest_away);
  const std::vector<double> got_even = values(mxint8, x, 7, RoundingMode::nearest_even);
  // The ties (k + 1/2 units of 2^-6 at scale 1) where nearest-even keeps an even k that away does not.
  const std::vector<std::size_t> ties = {43, 45, 47, 51, 64, 68};  // (ties at 41, 49, 53, 55, 57, 59 agree)
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("value " << i << ": " << x[i]);
    CHECK(got_away[i] == away[i]);
    const bool tie = std::find(ties.begin(), ties.end(), i) != ties.end();
    if (!tie) CHECK(got_even[i] == away[i]);
    else CHECK((got_even[i] != away[i] && std::fabs(got_even[i] - away[i]) == 0x1p-6));
  }
  // test_mxfp_rounding: 4-bit symmetric integers with 2 fraction bits, one block per row: -2.0 is not used.
  BlockFormat int4{ElementFormat{std::nullopt, 4, 2}, 1, 4, ScaleFormat::e8m0, ScaleRule::ocp_floor};
  const std::vector<double> r = values(int4, {-1.0f, -1.75f, -1.99f, 1.99f, 1.0f, -1.75f, -1.99f, 1.99f}, 2,
                                       RoundingMode::nearest_away);
  CHECK(r == std::vector<double>{-1.0, -1.75, -1.75, 1.75, 1.0, -1.75, -1.75, 1.75});
  // test_mx_nans: a NaN or an infinity makes every value of its block NaN (microxcaling lets NaN and infinity
  // stand for each other; we give NaN).
  for (const char* name : {"mxfp8-e4m3", "mxfp4"})
    for (const float special : {NAN, INFINITY, -INFINITY}) {
      BlockFormat f = *parse_block_format(name);
      f.block_cols = 4;
      const std::vector<double> v = values(f, {special, 0.0f, 0x1p127f, 0.0f}, 1, RoundingMode::nearest_even);
      INFO(name << " " << special);
      CHECK(std::all_of(v.begin(), v.end(), [](double d) { return std::isnan(d); }));
    }
}

TEST_CASE("NVFP4: two-level scales in the paper's binary32 order, and Transformer Engine's", "[block][nvfp4]") {
  std::mt19937_64 rng(20261127);
  for (bool te : {false, true}) {
    BlockFormat f = *parse_block_format("nvfp4");
    if (te) f.rule = ScaleRule::nvfp4_te;
    for (int round = 0; round < 40; ++round) {
      std::vector<float> x = random_blocks(rng, 16, 20, kE2m1, false);
      if (round % 10 == 9) x[rng() % x.size()] = INFINITY;
      double tensor_scale = 0;
      const Expected want = reference_nvfp4(te, x, tensor_scale);
      const BlockQuantized got = quantize_blocks(f, x, 1, static_cast<std::int64_t>(x.size()));
      compare(std::string(te ? "nvfp4-te" : "nvfp4") + " round " + std::to_string(round), want, got);
      CHECK(same(got.tensor_scale, tensor_scale));
    }
    // Any NaN: all NaN.
    std::vector<float> x(40, 1.0f);
    x[17] = std::numeric_limits<float>::quiet_NaN();
    const BlockQuantized q = quantize_blocks(f, x, 1, 40);
    CHECK(std::all_of(q.values.begin(), q.values.end(), [](double v) { return std::isnan(v); }));
  }
  // A block where the two orders differ (found by search): the paper's (amax_b / 6) * S_enc lands one binary32
  // ulp below E4M3's midpoint 0x1.7p-3, Transformer Engine's amax_b * (S_enc * (1/6)) on it (a tie, to even).
  {
    std::vector<float> two(32, 0.0f);
    two[0] = 0x1.634ad6p-8f;   // the tensor's amax
    two[16] = 0x1.23d8e6p-19f;  // the second block's
    for (bool te : {false, true}) {
      BlockFormat f = *parse_block_format("nvfp4");
      if (te) f.rule = ScaleRule::nvfp4_te;
      double tensor_scale = 0;
      const BlockQuantized got = quantize_blocks(f, two, 1, 32);
      compare(te ? "nvfp4-te, the orders differ" : "nvfp4, the orders differ", reference_nvfp4(te, two, tensor_scale), got);
      CHECK(got.scale_codes[1] == (te ? 0x24u : 0x23u));
    }
  }
  // The block holding the tensor's amax gets the scale 448 and the value amax * (6 / 6).
  std::vector<float> x = {3.0f, -1.5f, 0.25f};
  const BlockQuantized q = quantize_blocks(*parse_block_format("nvfp4"), x, 1, 3);
  CHECK(q.scales[0] == 448.0);
  CHECK(std::fabs(q.values[0] - 3.0) <= 3.0 * 1e-6);
}

TEST_CASE("NVFP4's tensor scale sees the largest magnitude wherever it lies in a long tensor", "[block][nvfp4]") {
  // The tensor's amax pass reads long tensors in a prefetching loop of four vectors, then a loop of four
  // vectors, one vector and single values: an amax at any of those places, of either sign, gives the tensor
  // scale that the reference computes from that one value. On every vector target this CPU runs.
  const BlockFormat f = *parse_block_format("nvfp4");
  const std::size_t n = 3 * 4096 + 100;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 0.5f * static_cast<float>((i * 7919) % 97) / 97.0f - 0.25f;
  std::vector<std::size_t> positions;
  for (std::size_t p = 0; p < n; p += p < 200 || p + 200 >= n ? 1 : 37) positions.push_back(p);
  std::vector<float> out(n);
  for (const simd::Target& target : simd::available_targets()) {
    const simd::ForceTarget forced(target);
    std::size_t bad = 0;
    for (std::size_t p : positions) {
      std::vector<float> y = x;
      y[p] = p % 2 == 0 ? 1000.5f : -1000.5f;
      double want = 0;
      reference_nvfp4(false, std::vector<float>{y[p]}, want);
      const BlockSummary got = quantize_blocks(f, y, out, 1, static_cast<std::int64_t>(n));
      if (!same(got.tensor_scale, want) && bad++ < 3)
        FAIL_CHECK(target.name << ", amax at " << p << ": tensor scale " << got.tensor_scale << ", reference " << want);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("DeepSeek-V3 FP8 tiles: s = amax / 448, y = x / s in binary32", "[block][tiles]") {
  std::mt19937_64 rng(20261128);
  const BlockFormat f = *parse_block_format("fp8-e4m3-1x128");
  for (int round = 0; round < 20; ++round) {
    const std::vector<float> x = random_blocks(rng, 128, 4, kE4m3, round % 4 == 3);
    compare("1x128 round " + std::to_string(round), reference_tiles(128, x),
            quantize_blocks(f, x, 1, static_cast<std::int64_t>(x.size())));
  }
  // 128x128 tiles over a 2-D tensor: tile (r / 128, c / 128); each tile its own scale.
  const BlockFormat tiles = *parse_block_format("fp8-e4m3-128x128");
  std::vector<float> m(130 * 260);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>((i * 2654435761u) % 1000) * 0.01f;
  m[129 * 260 + 259] = 5000.0f;  // only the last tile's scale sees it
  const BlockQuantized q = quantize_blocks(tiles, m, 130, 260);
  REQUIRE(q.scales.size() == 2 * 3);
  CHECK(q.scales[5] == static_cast<double>(5000.0f / 448.0f));
  for (std::size_t tile = 0; tile < 5; ++tile) {  // the others: their own amax
    const std::size_t r0 = tile / 3 * 128, c0 = tile % 3 * 128;
    float amax = 0;
    for (std::size_t r = r0; r < std::min<std::size_t>(130, r0 + 128); ++r)
      for (std::size_t c = c0; c < std::min<std::size_t>(260, c0 + 128); ++c) amax = std::max(amax, m[r * 260 + c]);
    CHECK(q.scales[tile] == static_cast<double>(amax / 448.0f));
  }
  // An all-zero tile: zeros with their signs, scale 0.
  std::vector<float> z = {0.0f, -0.0f};
  const BlockQuantized qz = quantize_blocks(f, z, 1, 2);
  CHECK(qz.scales[0] == 0);
  CHECK(std::signbit(qz.values[1]));
}

TEST_CASE("Block quantization: stochastic elements are reproducible and pick a neighbour", "[block]") {
  const BlockFormat f = *parse_block_format("mxfp4");
  std::vector<float> x(4096);
  std::mt19937_64 rng(7);
  for (float& v : x) v = std::uniform_real_distribution<float>(-6, 6)(rng);
  BlockQuantizeOptions o;
  o.rounding = Rounding{RoundingMode::stochastic};
  o.key = {42, 1};
  const BlockQuantized a = quantize_blocks(f, x, 1, 4096, o), b = quantize_blocks(f, x, 1, 4096, o);
  CHECK(a.values == b.values);
  const BlockQuantized rne = quantize_blocks(f, x, 1, 4096);
  double sum_error = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sum_error += a.values[i] - x[i];
    differ += a.values[i] != rne.values[i];
  }
  CHECK(differ > 0);  // stochastic rounding sometimes goes the other way
  // Unbiased: the mean error is within 5 standard errors (each error at most one E2M1 gap, 2 at this scale).
  CHECK(std::fabs(sum_error / 4096) < 5 * 2 / std::sqrt(4096.0));
}

TEST_CASE("Block quantization: the fast path gives the reference's bits, counts, scales and draws", "[block][fast]") {
  std::mt19937_64 rng(20261129);
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4", "mxint8", "nvfp4",
                           "fp8-e4m3-1x128", "fp8-e4m3-128x128", "int8", "int4"}) {
    for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::stochastic}) {
      for (int round = 0; round < 8; ++round) {
        BlockFormat f = *parse_block_format(name);
        if (round == 1 && f.scale == ScaleFormat::e8m0) f.rule = ScaleRule::ceil;
        if (round == 2 && f.rule == ScaleRule::nvfp4) f.rule = ScaleRule::nvfp4_te;
        const std::int64_t rows = round < 3 || round == 7 ? 1 : round == 6 ? 3 : 37,
                           cols = round < 3 ? 3001 : round == 6 ? 1600 : round == 7 ? 4800 : 300;
        // Rounds 0-5 draw a magnitude per row, so the blocks of a row mostly share a scale; rounds 6 and 7 one
        // per 16 values, so neighbouring blocks of a group (the fast path computes a vector's worth of scales at
        // once) have different scales, with NaN and infinities in some groups in round 7. Rows of whole blocks
        // (round 6; NVFP4's first pass then takes the tensor as one row) and rows ending in a partial block.
        std::vector<float> x = round > 5 ? random_blocks(rng, 16, 300, kE4m3, round == 7)
                                         : random_blocks(rng, static_cast<int>(cols), static_cast<int>(rows), kE4m3,
                                                         round % 2 == 1);
        if (round == 5) std::fill(x.begin() + 40, x.begin() + 400, 0.0f);  // zero blocks
        BlockQuantizeOptions o;
        // Stochastic rounding with fewer random bits in two rounds: 8, and 21 (between E4M3's 20 bits below
        // the quantum and E5M2's 21), on both sides of what the fast path's shortcut needs.
        o.rounding = Rounding{mode, mode == RoundingMode::stochastic && round == 3   ? 8
                                    : mode == RoundingMode::stochastic && round == 4 ? 21
                                                                                     : 32};
        o.key = {static_cast<std::uint64_t>(round), 3};
        o.first_index = 1000;
        const BlockQuantized want = quantize_blocks(f, x, rows, cols, o);
        std::vector<float> out(x.size());
        const BlockSummary got = quantize_blocks(f, x, out, rows, cols, o);
        INFO(name << " " << to_string(mode) << " round " << round << " rule " << to_string(f.rule) << " random bits "
                  << o.rounding.random_bits);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
          const auto expected = static_cast<float>(want.values[i]);  // one rounding of the exact value
          const bool ok = std::isnan(expected) ? std::isnan(out[i])
                                               : std::bit_cast<std::uint32_t>(out[i]) == std::bit_cast<std::uint32_t>(expected);
          if (!ok && bad++ < 3) FAIL_CHECK("value " << i << " of " << x[i] << ": fast " << out[i] << ", reference " << want.values[i]);
        }
        CHECK(bad == 0);
        CHECK(got.scale_codes == want.scale_codes);
        CHECK(got.counts == want.counts);
        CHECK(same(got.tensor_scale, want.tensor_scale));
        // In place: the same.
        std::vector<float> inplace = x;
        const BlockSummary again = quantize_blocks(f, inplace, inplace, rows, cols, o);
        CHECK(std::equal(inplace.begin(), inplace.end(), out.begin(), out.end(), [](float a, float b) {
          return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b));
        }));
        CHECK(again.counts == got.counts);
        // Keeping the elements (training's GEMM operands): the reference's elements, scales and counts.
        const BlockOperand op = quantize_block_operand(f, x, rows, cols, o), ref = to_block_operand(f, want);
        std::size_t bad_elements = 0;
        for (std::size_t i = 0; i < x.size(); ++i)
          bad_elements += !(std::bit_cast<std::uint32_t>(op.elements[i]) == std::bit_cast<std::uint32_t>(ref.elements[i]) ||
                            (std::isnan(op.elements[i]) && std::isnan(ref.elements[i])));
        CHECK(bad_elements == 0);
        CHECK(op.scale_codes == want.scale_codes);
        CHECK(std::equal(op.scales.begin(), op.scales.end(), want.scales.begin(), want.scales.end(),
                         [](double a, double b) { return same(a, b); }));
        CHECK(op.counts == want.counts);
        CHECK(same(op.tensor_scale, want.tensor_scale));
        const BlockFormat shaped = f.for_shape(rows, cols);
        const std::int64_t grid_cols = (cols + shaped.block_cols - 1) / shaped.block_cols;
        for (std::size_t i = 0; i < x.size(); ++i) {  // element x scale x tensor scale: the reference's exact value
          const std::int64_t r = static_cast<std::int64_t>(i) / cols, c = static_cast<std::int64_t>(i) % cols;
          const auto block = static_cast<std::size_t>(r / shaped.block_rows * grid_cols + c / shaped.block_cols);
          const double value = std::isnan(op.scales[block]) ? want.values[i]
                                                            : op.elements[i] * op.scales[block] * op.tensor_scale;
          if (!same(value, want.values[i]) && bad_elements++ < 3)
            FAIL_CHECK("value " << i << ": element x scales " << value << ", reference " << want.values[i]);
        }
      }
    }
  }
}

TEST_CASE("Integer elements (MXINT8, int8, int4): the fast path's ties, saturation and unsigned zeros are the reference's",
          "[block][fast]") {
  // The fast path rounds integer elements on the integer grid's pattern format (integer_pattern_format), the
  // reference by its own integer rule (round_integer): every value here sits on the grid, a quarter, a half or
  // three quarters of a unit off it, or just beside a half, at a scale of exactly 1 (each block starts with its
  // amax: MXINT8's 1.999 gives 2^0; int8's 127 and int4's 7 give amax / largest = 1). Negatives that round to
  // zero must give +0 (an integer code holds no -0), and values beyond the largest integer saturate.
  struct Case {
    const char* name;
    float anchor;  // the block's amax
    int largest;   // the largest integer k
    float unit;    // the grid's unit at scale 1
  };
  for (const Case& c : {Case{"mxint8", 1.999f, 127, 0x1p-6f}, Case{"int8", 127.0f, 127, 1.0f},
                        Case{"int4", 7.0f, 7, 1.0f}}) {
    const BlockFormat f = *parse_block_format(c.name);
    const int block = f.block_cols;
    std::vector<float> x;
    for (int k = -c.largest - 1; k <= c.largest + 1; ++k)
      for (const float offset : {0.0f, 0.25f, 0.5f, 0.75f, 0.5f - 0x1p-12f, 0.5f + 0x1p-12f}) {
        if (x.size() % static_cast<std::size_t>(block) == 0) x.push_back(c.anchor);
        const float v = (static_cast<float>(k) + offset) * c.unit;
        if (std::fabs(v) <= c.anchor) x.push_back(v);
      }
    for (const float tiny : {-0.0f, 0.0f, -0.25f * c.unit, -0.5f * c.unit, -0x1p-30f, 0x1p-30f}) {
      if (x.size() % static_cast<std::size_t>(block) == 0) x.push_back(c.anchor);
      x.push_back(tiny);
    }
    while (x.size() % static_cast<std::size_t>(block) != 0) x.push_back(-0.25f * c.unit);
    const auto cols = static_cast<std::int64_t>(x.size());
    for (const RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::stochastic}) {
      INFO(c.name << " " << to_string(mode));
      BlockQuantizeOptions o;
      o.rounding = Rounding{mode};
      o.key = {17, 4};
      const BlockQuantized want = quantize_blocks(f, x, 1, cols, o);
      std::vector<float> out(x.size());
      const BlockSummary got = quantize_blocks(f, x, out, 1, cols, o);
      const BlockOperand op = quantize_block_operand(f, x, 1, cols, o), ref = to_block_operand(f, want);
      std::size_t bad = 0, negative_zeros = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const bool ok = std::bit_cast<std::uint32_t>(out[i]) == std::bit_cast<std::uint32_t>(static_cast<float>(want.values[i])) &&
                        std::bit_cast<std::uint32_t>(op.elements[i]) == std::bit_cast<std::uint32_t>(ref.elements[i]);
        if (!ok && bad++ < 5)
          FAIL_CHECK("x " << x[i] << ": fast " << out[i] << " (element " << op.elements[i] << "), reference "
                          << want.values[i] << " (element " << ref.elements[i] << ")");
        negative_zeros += std::signbit(out[i]) && out[i] == 0;
      }
      CHECK(bad == 0);
      CHECK(negative_zeros == 0);
      CHECK(got.scale_codes == want.scale_codes);
      CHECK(got.counts == want.counts);
      CHECK(op.counts == want.counts);
      // MXINT8's power-of-two scale leaves values beyond the largest integer (127.5 units and up), which
      // saturate; int8's and int4's amax / largest never does. Every format sees values below half a unit.
      if (f.scale == ScaleFormat::e8m0) CHECK(got.counts.saturated > 0);
      CHECK(got.counts.flushed > 0);
    }
  }
}

// Every vector target compiled into the library (AVX-512, AVX2, SSE4, ...), not only this CPU's best: a
// Highway op whose meaning differs between targets (TestBit with a mask of several bits) once made every
// block's nonzero count 0 on AVX2 while AVX-512 machines passed.
TEST_CASE("Block quantization on every vector target this CPU runs: the reference's bits and counts",
          "[block][fast]") {
  const std::vector<simd::Target> targets = simd::available_targets();
  REQUIRE(!targets.empty());
  std::mt19937_64 rng(20261127);
  // With NaN and infinities (a NaN anywhere makes an NVFP4 tensor NaN), and finite: NVFP4's finite loop leaves
  // x's zeros to its first pass. 3 x 1001: a partial block ends each row.
  const std::vector<float> with_specials = random_blocks(rng, 3001, 1, kE4m3, true);
  const std::vector<float> finite = random_blocks(rng, 1001, 3, kE4m3, false);
  for (const simd::Target& target : targets) {
    const simd::ForceTarget forced(target);
    for (const char* name : {"mxfp8-e4m3", "mxfp4", "nvfp4", "fp8-e4m3-1x128", "mxint8", "int4"}) {
      for (const bool specials : {true, false}) {
        for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::stochastic}) {
          INFO("vector target " << target.name << ", " << name << " " << to_string(mode)
                                << (specials ? ", NaN and infinities" : ", finite"));
          const std::vector<float>& x = specials ? with_specials : finite;
          const std::int64_t rows = specials ? 1 : 3, cols = specials ? 3001 : 1001;
          const BlockFormat f = *parse_block_format(name);
          BlockQuantizeOptions o;
          o.rounding = Rounding{mode};
          o.key = {5, 3};
          const BlockQuantized want = quantize_blocks(f, x, rows, cols, o);
          std::vector<float> out(x.size());
          const BlockSummary got = quantize_blocks(f, x, out, rows, cols, o);
          std::size_t bad = 0;
          for (std::size_t i = 0; i < x.size(); ++i) {
            const auto expected = static_cast<float>(want.values[i]);
            bad += !(std::isnan(expected) ? std::isnan(out[i])
                                          : std::bit_cast<std::uint32_t>(out[i]) == std::bit_cast<std::uint32_t>(expected));
          }
          CHECK(bad == 0);
          CHECK(got.scale_codes == want.scale_codes);
          CHECK(got.counts == want.counts);
          CHECK(got.counts.nonzero > 0);
        }
      }
    }
  }
}

TEST_CASE("Block quantization on every vector target: stochastic draws across a 2^16 window of indices, from "
          "aligned and unaligned first indices", "[block][fast]") {
  // Draws from indices that cross 65536, where the plain quantizer's windows of draws end (AlignedWindowDraws;
  // a block-quantizer version of it was measured and not kept, docs/performance.md). 63552 is a multiple of 16
  // (every x86 target's lane count) whose groups of blocks (64 to 512 values) cross 65536; 63556 is a multiple
  // of 4 but not of 8; 61440 a multiple of every group.
  const std::vector<simd::Target> targets = simd::available_targets();
  std::mt19937_64 rng(20261129);
  const std::vector<float> x = random_blocks(rng, 6016, 1, kE4m3, false);
  for (const simd::Target& target : targets) {
    const simd::ForceTarget forced(target);
    for (const char* name : {"mxfp8-e4m3", "mxfp4", "nvfp4"}) {
      for (const std::uint64_t first : {std::uint64_t{63552}, std::uint64_t{63556}, std::uint64_t{61440}}) {
        INFO("vector target " << target.name << ", " << name << ", first index " << first);
        const BlockFormat f = *parse_block_format(name);
        BlockQuantizeOptions o;
        o.rounding = Rounding{RoundingMode::stochastic};
        o.key = {11, 4};
        o.first_index = first;
        const BlockQuantized want = quantize_blocks(f, x, 1, 6016, o);
        std::vector<float> out(x.size());
        const BlockSummary got = quantize_blocks(f, x, out, 1, 6016, o);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < x.size(); ++i)
          bad += std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(static_cast<float>(want.values[i]));
        CHECK(bad == 0);
        CHECK(got.counts == want.counts);
      }
    }
  }
}

TEST_CASE("Block quantization: stochastic indices across a multiple of 2^32 keep the reference's draws", "[block][fast]") {
  std::mt19937_64 rng(20261133);
  for (const char* name : {"mxfp4", "nvfp4", "fp8-e4m3-1x128", "fp8-e4m3-128x128"}) {
    const BlockFormat f = *parse_block_format(name);
    const std::int64_t rows = 3, cols = 300;
    std::vector<float> x(static_cast<std::size_t>(rows * cols));  // N(0,1): inexact nearly everywhere
    for (float& v : x) v = std::normal_distribution<float>()(rng);
    BlockQuantizeOptions o;
    o.rounding = Rounding{RoundingMode::stochastic};
    o.key = {5, 9};
    o.first_index = (std::uint64_t{1} << 32) - 437;  // inside row 1, and inside a vector
    const BlockQuantized want = quantize_blocks(f, x, rows, cols, o);
    std::vector<float> out(x.size());
    const BlockSummary got = quantize_blocks(f, x, out, rows, cols, o);
    INFO(name);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      bad += std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(static_cast<float>(want.values[i]));
    CHECK(bad == 0);
    CHECK(got.counts == want.counts);
  }
}

TEST_CASE("Block quantization rejects bad shapes and names its presets", "[block]") {
  const BlockFormat f = *parse_block_format("mxfp8-e4m3");
  std::vector<float> x(10);
  CHECK_THROWS_AS(quantize_blocks(f, x, 3, 4), std::invalid_argument);
  CHECK_FALSE(parse_block_format("mxfp9").has_value());
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4", "mxint8", "nvfp4",
                           "fp8-e4m3-1x128", "fp8-e4m3-128x128", "int8", "int4"}) {
    REQUIRE(parse_block_format(name).has_value());
    CHECK(parse_block_format(name)->name() == name);
  }
}

}  // namespace mpsim

namespace mpsim {
namespace {

// The block GEMM's reference: element = value / scale (exact rationals, from
// the quantizer's exact values and scales), block partials exact, acc rounded
// once to binary32 per block (to_binary32 above), NVFP4's alpha last.
std::vector<float> reference_block_gemm(const BlockFormat& fa, const BlockQuantized& a, const BlockFormat& fb,
                                        const BlockQuantized& bt, int m, int n, int k) {
  const int block = fa.block_cols, blocks = (k + block - 1) / block;
  const auto scale = [&](const BlockFormat& f, const BlockQuantized& q, int row, int kb) {
    return q.scales[static_cast<std::size_t>(row / f.block_rows * blocks + kb)];
  };
  std::vector<float> c(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc = 0;
      bool nan = false;
      for (int kb = 0; kb < blocks; ++kb) {
        const double sa = scale(fa, a, i, kb), sb = scale(fb, bt, j, kb);
        if (std::isnan(sa) || std::isnan(sb)) nan = true;
        if (nan) continue;
        Q partial = 0;
        for (int t = kb * block; t < std::min(k, (kb + 1) * block); ++t) {
          // A zero scale (UE4M3 underflow) contributes zero whatever the element.
          // (NVFP4's values also carry the tensor scale: element = value / (scale * tensor scale).)
          const Q ea = sa == 0 ? Q(0) : exact(a.values[static_cast<std::size_t>(i) * k + t]) / (exact(sa) * exact(a.tensor_scale));
          const Q eb = sb == 0 ? Q(0) : exact(bt.values[static_cast<std::size_t>(j) * k + t]) / (exact(sb) * exact(bt.tensor_scale));
          partial += ea * eb;
        }
        acc = to_binary32(exact(acc) + partial * exact(sa) * exact(sb));  // a zero sum is +0: acc starts at +0
      }
      const float alpha = to_binary32(exact(static_cast<float>(a.tensor_scale)) * exact(static_cast<float>(bt.tensor_scale)));
      c[static_cast<std::size_t>(i) * n + j] =
          nan ? std::numeric_limits<float>::quiet_NaN() : alpha == 1.0f ? acc : to_binary32(exact(acc) * exact(alpha));
    }
  }
  return c;
}

bool same_float(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

}  // namespace

TEST_CASE("Block GEMM: exact block partials, binary32 accumulation, against exact rationals", "[block][gemm]") {
  std::mt19937_64 rng(20261130);
  const int m = 5, n = 7;
  for (const auto& [na, nb] : std::vector<std::pair<const char*, const char*>>{
           {"mxfp8-e4m3", "mxfp8-e4m3"}, {"mxfp4", "mxfp4"}, {"mxfp6-e2m3", "mxfp8-e4m3"}, {"mxfp6-e3m2", "mxfp4"},
           {"mxint8", "mxint8"}, {"nvfp4", "nvfp4"},
           {"mxfp8-e5m2", "mxfp8-e5m2"}, {"mxfp8-e5m2", "mxfp8-e4m3"}}) {  // the last two: the exact fixed-point path
    for (int k : {96, 70}) {
      const BlockFormat fa = *parse_block_format(na), fb = *parse_block_format(nb);
      // Magnitudes 2^-20..2^20, some zeros and binary32 subnormals: no sum overflows binary32.
      const auto values = [&](int count) {
        std::vector<float> v(static_cast<std::size_t>(count));
        for (float& e : v) {
          const auto kind = rng() % 10;
          e = kind == 0 ? 0.0f : kind == 1 ? std::ldexp(static_cast<float>(rng() % 100 + 1), -149)
              : std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 40) - 20);
        }
        return v;
      };
      std::vector<float> x = values(m * k), y = values(n * k);
      if (k == 70) x[3] = std::numeric_limits<float>::quiet_NaN();  // row 0's first block: NaN outputs in row 0
      const BlockQuantized a = quantize_blocks(fa, x, m, k), bt = quantize_blocks(fb, y, n, k);
      std::vector<float> c(static_cast<std::size_t>(m) * n);
      block_gemm({}, fa, a, fb, bt, c.data(), m, n, k);
      const std::vector<float> want = reference_block_gemm(fa, a, fb, bt, m, n, k);
      INFO(na << " x " << nb << ", k " << k);
      for (std::size_t i = 0; i < c.size(); ++i) {
        INFO("element " << i << ": got " << c[i] << ", reference " << want[i]);
        CHECK(same_float(c[i], want[i]));
      }
    }
  }
  // E5M2 block sums need more than binary64: 2^30 + 2^-32 - 2^30 is 2^-32, which a binary64 sum in this order loses.
  {
    const BlockFormat e5m2 = *parse_block_format("mxfp8-e5m2");
    std::vector<float> ra = {0x1p15f, 0x1p-16f, 0x1p15f}, rb = {0x1p15f, 0x1p-16f, -0x1p15f};
    const BlockQuantized qa = quantize_blocks(e5m2, ra, 1, 3), qb = quantize_blocks(e5m2, rb, 1, 3);
    REQUIRE(qa.values == std::vector<double>{0x1p15, 0x1p-16, 0x1p15});  // exact elements at scale 2^0
    float out = 1;
    block_gemm({}, e5m2, qa, e5m2, qb, &out, 1, 1, 3);
    CHECK(out == 0x1p-32f);
  }
  // What is refused, with the reason: binary32 scales of several blocks along k without DeepSeek's promotion.
  const BlockFormat tiles = *parse_block_format("fp8-e4m3-1x128");
  BlockFormat e5m2_tiles = tiles;
  e5m2_tiles.element = parse_block_format("mxfp8-e5m2")->element;
  std::vector<float> x(2 * 160, 1.0f), c(4);
  const BlockQuantized qt = quantize_blocks(tiles, x, 2, 160), q5 = quantize_blocks(e5m2_tiles, x, 2, 160);
  CHECK_THROWS_AS(block_gemm({}, tiles, qt, tiles, qt, c.data(), 2, 2, 160), std::invalid_argument);
  CHECK_THROWS_AS(block_gemm({}, e5m2_tiles, q5, e5m2_tiles, q5, c.data(), 2, 2, 160), std::invalid_argument);
}

TEST_CASE("quantize_block_row (the host/device routine of the CUDA kernels) gives the fast path's bits and counts",
          "[block][fast][device]") {
  // Written once for host and device (block_scaling.hpp); here on the host against quantize_blocks' fast path,
  // itself equal to the exact reference (above). Rows of 1 x N blocks with a partial last block.
  std::mt19937_64 rng(20261202);
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4", "nvfp4", "nvfp4-te",
                           "fp8-e4m3-1x128", "mxfp4-ceil", "mxint8", "int8", "int4"}) {
    const std::string text(name);
    BlockFormat f = *parse_block_format(text == "nvfp4-te" ? "nvfp4" : text == "mxfp4-ceil" ? "mxfp4" : text);
    if (text == "nvfp4-te") f.rule = ScaleRule::nvfp4_te;
    if (text == "mxfp4-ceil") f.rule = ScaleRule::ceil;
    for (const RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::stochastic}) {
      for (int round = 0; round < 6; ++round) {
        const int block = f.block_cols, rows = 3, cols = 3 * block + block / 2 + 1;
        std::vector<float> x = random_blocks(rng, cols * rows, 1, kE4m3, round % 3 == 2);
        BlockQuantizeOptions options;
        options.rounding = Rounding{mode};
        options.key = {7, static_cast<std::uint64_t>(round)};
        options.first_index = (std::uint64_t{5} << 32) - 40;  // the draws cross a multiple of 2^32
        std::vector<float> fast(x.size());
        const BlockSummary want = quantize_blocks(f, x, fast, rows, cols, options);

        const detail::BlockRule rule = detail::block_rule(f, x);
        const PatternFormat<std::uint32_t> element = detail::element_pattern_format(f.element);
        const PatternRounding rounding = pattern_rounding(options.rounding);
        const DrawKey key = make_draw_key(options.key);
        std::vector<float> got(x.size()), got_elements(x.size());
        detail::BlockRowCounts counts;
        std::uint64_t clamped = 0;
        std::vector<std::uint32_t> codes;
        for (int r = 0; r < rows; ++r)
          for (int c0 = 0; c0 < cols; c0 += block) {
            const int n = std::min(block, cols - c0);
            const std::size_t at = static_cast<std::size_t>(r) * cols + c0;
            const detail::BlockParams p = detail::quantize_block_row(rule, nullptr, element, rounding, key,
                                                                     options.first_index + at, x.data() + at,
                                                                     got.data() + at, n, counts,
                                                                     got_elements.data() + at);
            codes.push_back(p.code);
            clamped += p.clamped;
          }
        INFO(name << " " << to_string(mode) << " round " << round);
        for (std::size_t i = 0; i < x.size(); ++i) {
          INFO("element " << i << ": x " << x[i] << ", fast " << fast[i] << ", row " << got[i]);
          REQUIRE(same(static_cast<double>(got[i]), static_cast<double>(fast[i])));
        }
        CHECK(codes == want.scale_codes);
        const BlockOperand operand = quantize_block_operand(f, x, rows, cols, options);
        for (std::size_t i = 0; i < x.size(); ++i)
          REQUIRE(same(static_cast<double>(got_elements[i]), static_cast<double>(operand.elements[i])));
        CHECK(counts.nonzero == want.counts.nonzero);
        CHECK(counts.flushed == want.counts.flushed);
        CHECK(counts.saturated == want.counts.saturated);
        CHECK(counts.nan == want.counts.nan);
        CHECK(clamped == want.counts.scale_clamped);
      }
    }
  }
}

TEST_CASE("Per-tensor FP8 (one block, the whole tensor): quantization and GEMM against exact rationals",
          "[block][gemm][tensor]") {
  std::mt19937_64 rng(20261201);
  const BlockFormat e4m3 = *parse_block_format("fp8-e4m3-tensor"), e5m2 = *parse_block_format("fp8-e5m2-tensor");
  CHECK(e4m3.for_shape(3, 70).block_rows == 3);
  CHECK(e4m3.for_shape(3, 70).block_cols == 70);
  for (int round = 0; round < 8; ++round) {
    const std::vector<float> x = random_blocks(rng, 96, 2, kE4m3, round % 4 == 3);
    // As one 1 x 192 tile, and as a 2 x 96 tensor: the same single scale and values.
    const Expected want = reference_tiles(static_cast<int>(x.size()), x);
    compare("per tensor, round " + std::to_string(round), want, quantize_blocks(e4m3, x, 1, 192));
    const BlockQuantized two_rows = quantize_blocks(e4m3, x, 2, 96);
    REQUIRE(two_rows.scales.size() == 1);
    CHECK(same(two_rows.scales[0], want.scales[0]));
  }
  // The GEMM: the exact sum of element products rounded once to binary32, times alpha = sa * sb in binary32
  // (cuBLAS's scale_a, scale_b). E5M2 x E4M3 sums can exceed binary64 (the fixed-point path).
  const int m = 4, n = 5;
  for (int k : {64, 200}) {
    for (const bool wide : {false, true}) {
      std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(n) * k);
      for (float& v : a) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 24) - 12);
      for (float& v : b) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 8) - 4);
      const BlockFormat& fa = wide ? e5m2 : e4m3;
      const BlockQuantized qa = quantize_blocks(fa, a, m, k), qb = quantize_blocks(e4m3, b, n, k);
      std::vector<float> c(static_cast<std::size_t>(m) * n);
      block_gemm({}, fa, qa, e4m3, qb, c.data(), m, n, k);
      const Q sa = exact(qa.scales[0]), sb = exact(qb.scales[0]);
      const float alpha = to_binary32(sa * sb);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          Q sum = 0;
          for (int t = 0; t < k; ++t)
            sum += (exact(qa.values[static_cast<std::size_t>(i) * k + t]) / sa) *
                   (exact(qb.values[static_cast<std::size_t>(j) * k + t]) / sb);
          const float want = to_binary32(exact(to_binary32(sum)) * exact(alpha));
          INFO("k " << k << (wide ? " E5M2 x E4M3" : " E4M3") << ", element " << i << "," << j);
          CHECK(same_float(c[static_cast<std::size_t>(i) * n + j], want));
        }
      }
    }
  }
}

TEST_CASE("Block GEMM: DeepSeek-V3's promotion of H100 FP8 partials every 128 products", "[block][gemm]") {
  std::mt19937_64 rng(20261131);
  const int m = 3, n = 130, k = 256;  // B's 128x128 tiles: two along n, two along k
  const BlockFormat fa = *parse_block_format("fp8-e4m3-1x128"), fb = *parse_block_format("fp8-e4m3-128x128");
  std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(n) * k);
  for (float& v : x) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 8));
  for (float& v : y) v = std::uniform_real_distribution<float>(-1, 1)(rng) * 0.01f;
  const BlockQuantized a = quantize_blocks(fa, x, m, k), bt = quantize_blocks(fb, y, n, k);
  BlockGemmModel model;
  model.promotion_interval = 128;
  model.tensor_core = *tensor_core_preset("H100", formats::e4m3, formats::binary32);
  std::vector<float> c(static_cast<std::size_t>(m) * n);
  block_gemm(model, fa, a, fb, bt, c.data(), m, n, k);
  // Reference: the partial from the H100 model (validated against measured vectors elsewhere), then
  // acc = RN32(partial * RN32(sa * sb) + acc) from the exact value: one fused multiply-add.
  std::size_t different_from_exact = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc = 0, exact_acc = 0;
      for (int kb = 0; kb < 2; ++kb) {
        const float sa = static_cast<float>(a.scales[static_cast<std::size_t>(i * 2 + kb)]);
        const float sb = static_cast<float>(bt.scales[static_cast<std::size_t>(j / 128 * 2 + kb)]);
        std::vector<float> ex(128), ey(128);
        Q exact_partial = 0;
        for (int t = 0; t < 128; ++t) {
          ex[static_cast<std::size_t>(t)] = static_cast<float>(static_cast<double>(exact(a.values[static_cast<std::size_t>(i) * k + kb * 128 + t]) / exact(sa)));
          ey[static_cast<std::size_t>(t)] = static_cast<float>(static_cast<double>(exact(bt.values[static_cast<std::size_t>(j) * k + kb * 128 + t]) / exact(sb)));
          exact_partial += exact(ex[static_cast<std::size_t>(t)]) * exact(ey[static_cast<std::size_t>(t)]);
        }
        const float p = tensor_core_dot(*model.tensor_core, ex, ey, 0.0f);
        const float s = to_binary32(exact(sa) * exact(sb));
        acc = to_binary32(exact(p) * exact(s) + exact(acc), false);
        exact_acc = to_binary32(exact_partial * exact(s) + exact(exact_acc), false);
      }
      const float got = c[static_cast<std::size_t>(i) * n + j];
      INFO("C(" << i << ", " << j << "): got " << got << ", reference " << acc);
      CHECK(same_float(got, acc));
      different_from_exact += acc != exact_acc;
    }
  }
  // The H100's truncating FP8 accumulator shows: some outputs differ from exact partials.
  CHECK(different_from_exact > 0);
  UNSCOPED_INFO("outputs where H100 partials differ from exact ones: " << different_from_exact << " of " << m * n);
}

TEST_CASE("Block GEMM: E5M2 x E4M3 partials through the H100 model keep every E4M3 bit", "[block][gemm]") {
  // fp8-current's dgrad with gemm = "h100": E5M2 gradients times E4M3 weights, one binary32 scale each (both 1
  // here: the amax is each format's largest). The product 57344 x 1.125 = 64512 is exact in the 14-bit
  // accumulator; an E4M3 1.125 rounded to the E5M2 model input (1.0, a tie to even) would give 57344.
  const BlockFormat fa = *parse_block_format("fp8-e5m2-tensor"), fb = *parse_block_format("fp8-e4m3-tensor");
  const std::vector<float> x = {0.0f, 57344.0f}, y = {448.0f, 1.125f};
  const BlockOperand a = quantize_block_operand(fa, x, 1, 2), bt = quantize_block_operand(fb, y, 1, 2);
  REQUIRE(a.scales[0] == 1.0);
  REQUIRE(bt.scales[0] == 1.0);
  REQUIRE(bt.elements[1] == 1.125f);
  BlockGemmModel model;
  model.tensor_core = *tensor_core_preset("h100", formats::e5m2, formats::binary32);
  model.promotion_interval = 2;  // one block spans k
  float c = 0;
  block_gemm(model, fa, a, fb, bt, &c, 1, 1, 2);
  CHECK(c == 64512.0f);
}

TEST_CASE("block_scaled_dot (the host/device routine of the CUDA block GEMM) gives block_gemm's bits",
          "[block][gemm][device]") {
  std::mt19937_64 rng(20261203);
  for (const char* name : {"mxfp8-e4m3", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4", "nvfp4", "nvfp4-16x16"}) {
    const BlockFormat f = *parse_block_format(name);
    const int m = 4, n = 35, k = 3 * f.block_cols + 7;  // a partial last block; 16 x 16 tiles across rows
    std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(n) * k);
    for (float& v : x) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 20) - 10);
    for (float& v : y) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    if (f.scale == ScaleFormat::e8m0) x[static_cast<std::size_t>(k) + 3] = NAN;  // a NaN block in row 1
    std::fill(y.begin(), y.begin() + f.block_cols, 0.0f);  // an all-zero block
    const BlockOperand a = quantize_block_operand(f, x, m, k), bt = quantize_block_operand(f, y, n, k);
    REQUIRE(block_partials_fit_binary64(f, f, f.block_cols));
    std::vector<float> want(static_cast<std::size_t>(m) * n);
    block_gemm({}, f, a, f, bt, want.data(), m, n, k);
    const BlockFormat shaped = f.for_shape(m, k);
    const int grid_cols = (k + shaped.block_cols - 1) / shaped.block_cols;
    const auto alpha = static_cast<float>(static_cast<float>(a.tensor_scale) * static_cast<float>(bt.tensor_scale));
    std::size_t bad = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        float got = block_scaled_dot(a.elements.data() + static_cast<std::size_t>(i) * k,
                                     a.scales.data() + static_cast<std::size_t>(i / shaped.block_rows) * grid_cols,
                                     bt.elements.data() + static_cast<std::size_t>(j) * k,
                                     bt.scales.data() + static_cast<std::size_t>(j / shaped.block_rows) * grid_cols, k,
                                     shaped.block_cols);
        if (alpha != 1.0f) got = got * alpha;
        const float expected = want[static_cast<std::size_t>(i) * n + j];
        if (!same(static_cast<double>(got), static_cast<double>(expected)) && bad++ < 3)
          FAIL_CHECK(name << " C(" << i << ", " << j << "): dot " << got << ", block_gemm " << expected);
      }
    CHECK(bad == 0);
  }
  CHECK(!block_partials_fit_binary64(*parse_block_format("mxfp8-e5m2"), *parse_block_format("mxfp8-e5m2"), 32));
  // Where rounding the sum to binary64 first would be wrong: acc = 1, then a block whose term is
  // 2^-24 + 2^-54 (products 2^12 and 2^-18, scales 2^-18 each). 1 + 2^-24 + 2^-54 rounds to binary32's
  // 1 + 2^-23; through binary64 to nearest it would be the tie 1 + 2^-24 and then 1.
  const BlockFormat f = *parse_block_format("mxfp8-e4m3");
  BlockOperand a, bt;
  a.elements.assign(64, 0.0f);
  a.elements[0] = 1;
  a.elements[32] = 64;
  a.elements[33] = 0x1p-9f;
  bt = a;
  a.scales = bt.scales = {1.0, 0x1p-18};
  a.scale_codes = bt.scale_codes = {127, 127 - 18};
  std::vector<float> c(1);
  block_gemm({}, f, a, f, bt, c.data(), 1, 1, 64);
  CHECK(c[0] == 1.0f + 0x1p-23f);
  CHECK(block_scaled_dot(a.elements.data(), a.scales.data(), bt.elements.data(), bt.scales.data(), 64, 32) ==
        1.0f + 0x1p-23f);
}

// v rounded to binary32, nearest even, from the exact rational: the quantum
// 2^q at v's binade (2^-149 below the normal range), the remainder against one
// half; an overflow is infinity, zero is +0.
float nearest_binary32(const Q& v) {
  if (v == 0) return 0.0f;
  const bool negative = v < 0;
  const Q a = negative ? Q(-v) : v;
  const Z num = boost::multiprecision::numerator(a), den = boost::multiprecision::denominator(a);
  int e = static_cast<int>(boost::multiprecision::msb(num)) - static_cast<int>(boost::multiprecision::msb(den));
  if (pow2(e) > a) --e;  // now 2^e <= a < 2^(e + 1)
  const int q = std::max(e - 23, -149);
  const Q n = a / pow2(q);
  Z t = boost::multiprecision::numerator(n) / boost::multiprecision::denominator(n);
  const Q rest = n - Q(t);
  if (rest > Q(1, 2) || (rest == Q(1, 2) && (t & 1) != 0)) ++t;
  float r = Q(t) * pow2(q) >= pow2(128) ? std::numeric_limits<float>::infinity()
                                         : std::ldexp(static_cast<float>(static_cast<std::int64_t>(t)), q);
  return negative ? -r : r;
}

TEST_CASE("add_exactly_to_binary32 (acc + a 128-bit partial, one rounding) against exact rationals",
          "[block][gemm][device]") {
  std::mt19937_64 rng(20261128);
  const auto pick_acc = [&]() -> float {
    switch (rng() % 6) {
      case 0: return 0.0f;
      case 1: return std::bit_cast<float>(static_cast<std::uint32_t>(rng() % 0x800000u));  // subnormal
      case 2: return std::bit_cast<float>(static_cast<std::uint32_t>(0x7F000000u + rng() % 0x7FFFFFu));  // near FLT_MAX
      default: return std::ldexp(std::uniform_real_distribution<float>(0.5f, 1.0f)(rng), static_cast<int>(rng() % 160) - 80);
    }
  };
  std::size_t checked = 0, bad = 0, cancelled = 0, subnormal = 0, overflow = 0;
  for (int c = 0; c < 20000; ++c) {
    float acc = pick_acc();
    if (rng() & 1) acc = -acc;
    // P: 1 to 128 bits, mostly dense, sometimes a single bit or a run of ones.
    const int bits = 1 + static_cast<int>(rng() % 128);
    std::uint64_t hi = bits > 64 ? rng() : 0, lo = rng();
    if (bits > 64) hi &= bits == 128 ? ~0ull : (1ull << (bits - 64)) - 1;
    else lo &= bits == 64 ? ~0ull : (1ull << bits) - 1;
    if (rng() % 8 == 0) (bits > 64 ? hi : lo) |= 1ull << ((bits - 1) % 64);
    if (hi == 0 && lo == 0) lo = 1;
    const int hi_bit = hi != 0 ? 64 + std::bit_width(hi) : std::bit_width(lo);
    bool negative = (rng() & 1) != 0;
    int e = 0;
    if (acc != 0 && rng() % 3 == 0) {
      // Near cancellation: P 2^e close to -acc (acc's significand shifted up, plus a small change).
      int acc_e = 0;
      const float m = std::frexp(std::fabs(acc), &acc_e);
      const int shift = static_cast<int>(rng() % 100);
      const auto significand = static_cast<std::uint64_t>(std::ldexp(m, 24));
      hi = shift >= 64 ? significand << (shift - 64) : (shift > 40 ? significand >> (64 - shift) : 0);
      lo = shift >= 64 ? 0 : significand << shift;
      const std::uint64_t delta = rng() % 5;
      if (rng() & 1) {
        hi += lo + delta < lo ? 1 : 0;
        lo += delta;
      } else if (lo >= delta || hi != 0) {
        hi -= lo < delta ? 1 : 0;
        lo -= delta;
      }
      if (hi == 0 && lo == 0) lo = 1;
      e = acc_e - 24 - shift;
      negative = !(acc < 0);
    } else {
      e = static_cast<int>(rng() % 360) - 200 - hi_bit / 2;
    }
    const float got = add_exactly_to_binary32(acc, negative, hi, lo, e);
    Q p = Q(Z(hi)) * pow2(64) + Q(Z(lo));
    const Q sum = exact(acc) + (negative ? Q(-p) : p) * pow2(e);
    const float want = nearest_binary32(sum);
    ++checked;
    cancelled += sum != 0 && std::fabs(want) < std::fabs(acc) / 1024;
    subnormal += want != 0 && std::fabs(want) < FLT_MIN;
    overflow += std::isinf(want);
    if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(want) && bad++ < 5)
      FAIL_CHECK("acc " << acc << " + " << (negative ? "-" : "") << "(" << hi << " 2^64 + " << lo << ") 2^" << e
                        << ": got " << got << ", exact rounding " << want);
  }
  CHECK(bad == 0);
  // The test reaches the cases that matter: cancellation, subnormal results and overflow.
  CHECK(cancelled > 100);
  CHECK(subnormal > 100);
  CHECK(overflow > 10);
  UNSCOPED_INFO(checked << " sums; " << cancelled << " cancelling, " << subnormal << " subnormal, " << overflow
                        << " overflowing");
  // By hand: 1 + 2^-24 + 2^-80 is above the tie, up to 1 + 2^-23; 1 + 2^-24 is the tie, to even; 1 - 1 is +0;
  // 2^-150 is half the smallest subnormal, to even (0); FLT_MAX + half its ulp is the tie, to even (infinity).
  CHECK(add_exactly_to_binary32(1.0f, false, 0, (1ull << 56) + 1, -80) == 1.0f + 0x1p-23f);
  CHECK(add_exactly_to_binary32(1.0f, false, 0, 1ull << 56, -80) == 1.0f);
  CHECK(add_exactly_to_binary32(1.0f, true, 0, 1, 0) == 0.0f);
  CHECK(!std::signbit(add_exactly_to_binary32(-1.0f, false, 0, 1, 0)));
  CHECK(add_exactly_to_binary32(0.0f, false, 0, 1, -149) == std::bit_cast<float>(1u));
  CHECK(add_exactly_to_binary32(0.0f, false, 0, 1, -150) == 0.0f);
  CHECK(std::isinf(add_exactly_to_binary32(FLT_MAX, false, 0, 1, 103)));
}

TEST_CASE("block_scaled_dot_exact (the CUDA block GEMM's routine for MXFP8 E5M2) gives block_gemm's bits",
          "[block][gemm][device]") {
  std::mt19937_64 rng(20261129);
  const std::pair<const char*, const char*> pairs[] = {
      {"mxfp8-e5m2", "mxfp8-e5m2"}, {"mxfp8-e5m2", "mxfp8-e4m3"}, {"mxfp8-e4m3", "mxfp8-e4m3"}, {"mxfp4", "mxfp6-e3m2"}};
  std::size_t wide_pairs = 0;
  for (const auto& [a_name, b_name] : pairs) {
    const BlockFormat fa = *parse_block_format(a_name), fb = *parse_block_format(b_name);
    const int m = 6, n = 29, k = 4 * fa.block_cols + 5;  // a partial last block
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(n) * k);
      // Elements spread over many binades inside a block, so that E5M2's block sums span more than 53 bits.
      for (float& v : x) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 30) - 15);
      for (float& v : y) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 30) - 15);
      if (trial == 1) {
        x[static_cast<std::size_t>(k) + 3] = NAN;                     // a NaN block in row 1
        std::fill(y.begin(), y.begin() + fb.block_cols, 0.0f);       // an all-zero block in row 0 of B
        for (int t = 0; t < k; ++t) x[static_cast<std::size_t>(2 * k) + t] = std::ldexp(x[t], 100);  // scales 2^100
        // C(3, 1): every block's products cancel exactly (a nonzero block whose sum is 0).
        const int half = fa.block_cols / 2;
        for (int k0 = 0; k0 + fa.block_cols <= k; k0 += fa.block_cols)
          for (int t = 0; t < half; ++t) {
            x[static_cast<std::size_t>(3 * k + k0 + half + t)] = x[static_cast<std::size_t>(3 * k + k0 + t)];
            y[static_cast<std::size_t>(k + k0 + half + t)] = -y[static_cast<std::size_t>(k + k0 + t)];
          }
      }
      const BlockOperand a = quantize_block_operand(fa, x, m, k), bt = quantize_block_operand(fb, y, n, k);
      std::vector<float> want(static_cast<std::size_t>(m) * n);
      block_gemm({}, fa, a, fb, bt, want.data(), m, n, k);
      const int grid_cols = (k + fa.block_cols - 1) / fa.block_cols;
      std::size_t bad = 0;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          const float got = block_scaled_dot_exact(
              a.elements.data() + static_cast<std::size_t>(i) * k, a.scales.data() + static_cast<std::size_t>(i) * grid_cols,
              smallest_exponent(fa.element), bt.elements.data() + static_cast<std::size_t>(j) * k,
              bt.scales.data() + static_cast<std::size_t>(j) * grid_cols, smallest_exponent(fb.element), k, fa.block_cols);
          const float expected = want[static_cast<std::size_t>(i) * n + j];
          if (!same(static_cast<double>(got), static_cast<double>(expected)) && bad++ < 3)
            FAIL_CHECK(a_name << " x " << b_name << " C(" << i << ", " << j << "): exact dot " << got << ", block_gemm "
                              << expected);
        }
      CHECK(bad == 0);
    }
    wide_pairs += !block_partials_fit_binary64(fa, fb, fa.block_cols);
    CHECK(block_partials_fit_int128(fa, fb, fa.block_cols));
  }
  CHECK(wide_pairs >= 1);  // E5M2 x E5M2 takes block_gemm's 640-bit sums, which this routine must match

  // A zero block adds +0 on both of block_gemm's paths: C(0, 0)'s first block underflows to -0 (a product of
  // -2^-286), its second block is zero while row 1's second block spans 64 bits (57344^2 and 2^-32), which sends
  // that block column through the 640-bit path; there -0 + 0 is +0 as in binary64.
  const BlockFormat f = *parse_block_format("mxfp8-e5m2");
  BlockOperand a, bt;
  a.elements.assign(128, 0.0f);
  bt.elements.assign(64, 0.0f);
  a.elements[0] = -0x1p-16f;
  bt.elements[0] = 0x1p-16f;
  a.elements[64 + 32] = bt.elements[32] = 57344.0f;
  a.elements[64 + 33] = bt.elements[33] = 0x1p-16f;
  a.scales = {0x1p-127, 1.0, 1.0, 1.0};
  a.scale_codes = {0, 127, 127, 127};
  bt.scales = {0x1p-127, 1.0};
  bt.scale_codes = {0, 127};
  std::vector<float> c(2);
  block_gemm({}, f, a, f, bt, c.data(), 2, 1, 64);
  CHECK(std::bit_cast<std::uint32_t>(c[0]) == 0u);
  CHECK(std::bit_cast<std::uint32_t>(block_scaled_dot_exact(a.elements.data(), a.scales.data(), -16, bt.elements.data(),
                                                            bt.scales.data(), -16, 64, 32)) == 0u);
  CHECK(c[1] == block_scaled_dot_exact(a.elements.data() + 64, a.scales.data() + 2, -16, bt.elements.data(),
                                       bt.scales.data(), -16, 64, 32));
  CHECK(c[1] == 57344.0f * 57344.0f);  // 3288334336 + 2^-32 rounds to 57344^2 (exact in binary32)
}

TEST_CASE("per_tensor_exact_dot (the CUDA per-tensor FP8 GEMM's routine) gives block_gemm's bits, E5M2 included",
          "[block][gemm][device]") {
  // Against the exact rational reference of the per-tensor product (the sum rounded once to binary32, times
  // alpha = sa sb, each product rounded once), which block_gemm's per-tensor path must also give (binary64
  // where the sums fit; this routine or the 640-bit fixed point where not); and, for the rounding, against
  // sums worked out by hand.
  std::mt19937_64 rng(20261126);
  const std::pair<const char*, const char*> pairs[] = {{"fp8-e4m3-tensor", "fp8-e4m3-tensor"},
                                                       {"fp8-e5m2-tensor", "fp8-e4m3-tensor"},
                                                       {"fp8-e5m2-tensor", "fp8-e5m2-tensor"}};
  for (const auto& [a_name, b_name] : pairs) {
    const BlockFormat fa = *parse_block_format(a_name), fb = *parse_block_format(b_name);
    const int m = 5, n = 23, k = 300;
    REQUIRE(per_tensor_sums_fit_int128(fa.element, fb.element, k));
    std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(n) * k);
    // Exponents over 40 binades: after the per-tensor scale most values are E5M2 subnormals or zero, and the
    // sums of E5M2 products need more than binary64's 53 bits.
    for (float& v : x) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 40) - 20);
    for (float& v : y) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 40) - 20);
    const BlockOperand a = quantize_block_operand(fa, x, m, k), bt = quantize_block_operand(fb, y, n, k);
    std::vector<float> want(static_cast<std::size_t>(m) * n);
    block_gemm({}, fa, a, fb, bt, want.data(), m, n, k);
    const int min_a = smallest_exponent(fa.element), min_b = smallest_exponent(fb.element);
    const float alpha = to_binary32(exact(static_cast<float>(a.scales[0])) * exact(static_cast<float>(bt.scales[0])));
    std::size_t bad = 0, nonzero = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        Q sum = 0;
        for (int t = 0; t < k; ++t)
          sum += exact(a.elements[static_cast<std::size_t>(i) * k + t]) * exact(bt.elements[static_cast<std::size_t>(j) * k + t]);
        const float reference = to_binary32(exact(to_binary32(sum)) * exact(alpha));
        float got = per_tensor_exact_dot(a.elements.data() + static_cast<std::size_t>(i) * k, min_a,
                                         bt.elements.data() + static_cast<std::size_t>(j) * k, min_b, k);
        got *= static_cast<float>(a.scales[0]) * static_cast<float>(bt.scales[0]);
        const float from_gemm = want[static_cast<std::size_t>(i) * n + j];
        nonzero += got != 0.0f;
        if ((!same_float(got, reference) || !same_float(from_gemm, reference)) && bad++ < 3)
          FAIL_CHECK(a_name << " x " << b_name << " C(" << i << ", " << j << "): dot " << got << ", block_gemm "
                            << from_gemm << ", reference " << reference);
      }
    CHECK(bad == 0);
    CHECK(nonzero > static_cast<std::size_t>(m * n) / 2);
  }
  // Rounding, by hand: E5M2 products 4096 x 4096 = 2^24 and 1 x 1 (and 1.5 x 2 = 3): 2^24 + 1 is a tie and
  // rounds to the even 2^24; 2^24 + 3 rounds up to 2^24 + 4; a sum of 2^30 and 2^-32 (no binary64 could hold
  // it exactly with the -2^30 that follows) leaves 2^-32; opposite products cancel to +0.
  const int e5 = smallest_exponent(parse_block_format("fp8-e5m2-tensor")->element);
  const auto dot = [e5](std::vector<float> a, std::vector<float> b) {
    return per_tensor_exact_dot(a.data(), e5, b.data(), e5, static_cast<int>(a.size()));
  };
  CHECK(dot({4096, 1}, {4096, 1}) == 0x1p24f);
  CHECK(dot({4096, 1.5f}, {4096, 2}) == 0x1p24f + 4);
  CHECK(dot({-4096, -1.5f}, {4096, 2}) == -(0x1p24f + 4));
  CHECK(dot({32768, 0x1p-16f, -32768}, {32768, 0x1p-16f, 32768}) == 0x1p-32f);
  const float zero = dot({3, -3}, {2, 2});
  CHECK((zero == 0.0f && !std::signbit(zero)));
  CHECK(std::isnan(dot({NAN, 1}, {1, 1})));
  // Beyond 64 bits of the accumulator: 57344^2 is 2^63.6 in units of 2^-32; four of them carry into the high
  // word, and a negative sum borrows from it.
  const float big = 57344;  // E5M2's largest value, 1.75 * 2^15; big^2 = 1.53125 * 2^31
  CHECK(dot({big, big, big, big}, {big, big, big, big}) == 4 * (big * big));
  CHECK(dot({big, big, big}, {big, -big, -big}) == -(big * big));
  CHECK(dot({big, big, big, big, 0x1p-16f}, {big, big, -big, -big, 0x1p-16f}) == 0x1p-32f);
  CHECK(dot({0x1p-16f, -big, 0x1p-16f}, {0x1p-16f, big, 0x1p-16f}) == -(big * big));  // 2^-31 is far below its ulp
}

TEST_CASE("Block GEMM: E8M0 and UE4M3 scales inside a tensor-core accumulator, promoted every N products or never",
          "[block][gemm]") {
  // The scaled products (element x scale: the reference quantizer's exact values) through the tensor-core model
  // with binary32 inputs over each interval, each interval's partial added to a binary32 accumulator from +0, or
  // the model's result itself without promotion; NVFP4's alpha last.
  std::mt19937_64 rng(20261201);
  const int m = 3, n = 5, k = 160;
  for (const char* name : {"mxfp8-e4m3", "nvfp4"}) {
    const BlockFormat f = *parse_block_format(name);
    std::vector<float> x(static_cast<std::size_t>(m) * k), y(static_cast<std::size_t>(n) * k);
    for (float& v : x) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 12));
    for (float& v : y) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    const BlockQuantized a = quantize_blocks(f, x, m, k), bt = quantize_blocks(f, y, n, k);
    BlockGemmModel exact_model;
    std::vector<float> exact_c(static_cast<std::size_t>(m) * n);
    block_gemm(exact_model, f, a, f, bt, exact_c.data(), m, n, k);
    for (const int interval : {0, f.block_cols, 2 * f.block_cols}) {
      BlockGemmModel model;
      model.tensor_core = *tensor_core_preset(f.block_cols == 16 ? "b200" : "h100", *f.element.floating, formats::binary32);
      model.promotion_interval = interval;
      std::vector<float> c(static_cast<std::size_t>(m) * n);
      block_gemm(model, f, a, f, bt, c.data(), m, n, k);
      TensorCoreModel tc = *model.tensor_core;
      tc.input = formats::binary32;
      const float alpha = static_cast<float>(a.tensor_scale) * static_cast<float>(bt.tensor_scale);
      std::size_t differ_from_exact = 0;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          float acc = 0;
          const int step = interval == 0 ? k : interval;
          for (int k0 = 0; k0 < k; k0 += step) {
            const int width = std::min(step, k - k0);
            std::vector<float> ex(static_cast<std::size_t>(width)), ey(static_cast<std::size_t>(width));
            for (int t = 0; t < width; ++t) {  // value / tensor scale: element x block scale, exact
              ex[static_cast<std::size_t>(t)] = static_cast<float>(a.values[static_cast<std::size_t>(i) * k + k0 + t] / a.tensor_scale);
              ey[static_cast<std::size_t>(t)] = static_cast<float>(bt.values[static_cast<std::size_t>(j) * k + k0 + t] / bt.tensor_scale);
            }
            const float p = tensor_core_dot(tc, ex, ey, 0.0f);
            acc = interval == 0 ? p : acc + p;
          }
          if (alpha != 1.0f) acc = acc * alpha;
          const float got = c[static_cast<std::size_t>(i) * n + j];
          INFO(name << " interval " << interval << " C(" << i << ", " << j << "): got " << got << ", reference " << acc);
          CHECK(same_float(got, acc));
          differ_from_exact += got != exact_c[static_cast<std::size_t>(i) * n + j];
        }
      UNSCOPED_INFO(name << " interval " << interval << ": " << differ_from_exact << " of " << m * n
                         << " outputs differ from exact block partials");
      if (f.block_cols == 32) CHECK(differ_from_exact > 0);  // the H100's truncating FP8 accumulator shows
    }
    // Refused: an interval that is not a multiple of the block, an interval without a tensor core.
    BlockGemmModel bad;
    bad.tensor_core = *tensor_core_preset("b200", *f.element.floating, formats::binary32);
    bad.promotion_interval = f.block_cols + 8;
    std::vector<float> c(static_cast<std::size_t>(m) * n);
    CHECK_THROWS_WITH(block_gemm(bad, f, a, f, bt, c.data(), m, n, k), Catch::Contains("multiple of the block length"));
    BlockGemmModel no_tc;
    no_tc.promotion_interval = f.block_cols;
    CHECK_THROWS_WITH(block_gemm(no_tc, f, a, f, bt, c.data(), m, n, k), Catch::Contains("needs a tensor-core model"));
  }
}

}  // namespace mpsim

namespace mpsim {

TEST_CASE("Random Hadamard transform: x D H / 4 against exact rationals, its inverse, and GEMMs it leaves", "[block][hadamard]") {
  const auto signs = hadamard_signs(7);
  int negative = 0;
  for (float d : signs) {
    CHECK((d == 1.0f || d == -1.0f));
    negative += d < 0;
  }
  CHECK((negative > 0 && negative < 16));  // a fixed seed's 16 signs are not all alike
  CHECK(hadamard_signs(7) == signs);
  CHECK(hadamard_signs(8) != signs);
  // Forward against the matrix: y_j = RN32(sum_i x_i d_i H_ij / 4), H_ij = (-1)^popcount(i & j) (Sylvester).
  std::mt19937_64 rng(20261132);
  const int rows = 3, cols = 48;
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (float& v : x) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(rng() % 12) - 6);
  std::vector<float> y = x;
  random_hadamard(y, rows, cols, 7);
  for (int c0 = 0; c0 < rows * cols; c0 += 16) {
    for (int j = 0; j < 16; ++j) {
      Q sum = 0;
      for (int i = 0; i < 16; ++i) {
        const int h = (std::popcount(static_cast<unsigned>(i & j)) % 2) ? -1 : 1;
        sum += exact(x[static_cast<std::size_t>(c0 + i)]) * exact(signs[static_cast<std::size_t>(i)]) * h;
      }
      const float want = to_binary32(sum / 4);
      INFO("chunk at " << c0 << ", output " << j);
      CHECK(std::bit_cast<std::uint32_t>(y[static_cast<std::size_t>(c0 + j)]) == std::bit_cast<std::uint32_t>(want));
    }
  }
  // The inverse undoes it, up to the two roundings.
  std::vector<float> back = y;
  random_hadamard(back, rows, cols, 7, true);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c0 = i / 16 * 16;
    float chunk_max = 0;
    for (std::size_t t = c0; t < c0 + 16; ++t) chunk_max = std::max(chunk_max, std::fabs(x[t]));
    CHECK(std::fabs(back[i] - x[i]) <= std::ldexp(chunk_max, -21));
  }
  // Transforming both operands along k keeps A B (to rounding), and spreads an outlier over its chunk.
  const int m = 4, n = 5, k = 32;
  std::vector<float> a(static_cast<std::size_t>(m * k)), bt(static_cast<std::size_t>(n * k));
  for (float& v : a) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (float& v : bt) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  a[5] = 1000.0f;
  std::vector<float> ta = a, tb = bt;
  random_hadamard(ta, m, k, 99);
  random_hadamard(tb, n, k, 99);
  float chunk_amax = 0;
  for (int t = 0; t < 16; ++t) chunk_amax = std::max(chunk_amax, std::fabs(ta[static_cast<std::size_t>(t)]));
  CHECK(chunk_amax < 1000.0f / 4 + 16);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double before = 0, after = 0, scale = 0;
      for (int t = 0; t < k; ++t) {
        before += static_cast<double>(a[static_cast<std::size_t>(i * k + t)]) * bt[static_cast<std::size_t>(j * k + t)];
        after += static_cast<double>(ta[static_cast<std::size_t>(i * k + t)]) * tb[static_cast<std::size_t>(j * k + t)];
        scale += std::fabs(static_cast<double>(a[static_cast<std::size_t>(i * k + t)]) * bt[static_cast<std::size_t>(j * k + t)]);
      }
      CHECK(std::fabs(after - before) <= 1e-5 * scale);
    }
  std::vector<float> bad(10);
  CHECK_THROWS_AS(random_hadamard(bad, 1, 10, 1), std::invalid_argument);
}

}  // namespace mpsim
