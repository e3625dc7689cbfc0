#include "mpsim/emulation/quantize.hpp"

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>  // _mm_getcsr
#endif

#include "exact.hpp"
#include "mpsim/emulation/pattern_format.hpp"
#include "quantize_kernel.hpp"

namespace mpsim {
namespace {

// Below this many elements a second thread costs more than it saves.
constexpr std::size_t min_elements_per_thread = std::size_t{1} << 17;

template <class T>
T stored_value(const Format& f, Bits bits) {
  if constexpr (std::is_same_v<T, float>) return to_float(f, bits);
  else return to_double(f, bits);
}

// On the bits, so that denormals-are-zero (MXCSR.DAZ) cannot turn a binary32
// subnormal input into a zero one.
template <class T>
bool is_finite_nonzero(T x) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return std::isfinite(x) && (std::bit_cast<U>(x) << 1) != 0;
}

// Every element through the pattern rounding the CUDA kernels run too.
template <class T>
QuantizeCounts quantize_scalar(const Format& f, const QuantizeOptions& o, const T* in, T* out, std::size_t n,
                               std::uint64_t first_index) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  PatternFormat<U> pattern_f;
  if constexpr (sizeof(T) == 4) pattern_f = binary32_pattern_format(f);
  else pattern_f = binary64_pattern_format(f);
  const PatternRounding r = pattern_rounding(o.rounding);
  QuantizeCounts counts;
  counts.elements = n;
  const DrawKey key = make_draw_key(o.stochastic.key);
  const bool stochastic = o.rounding.mode == RoundingMode::stochastic;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t draw = stochastic ? random_draw(key, first_index + i) : 0;
    const RoundedValue<U> rounded = round_pattern<U>(std::bit_cast<U>(in[i]), pattern_f, r, draw);
    counts.inexact += rounded.inexact;
    counts.overflow += rounded.overflow;
    counts.flushed_to_zero += rounded.flushed_to_zero;
    counts.subnormal += rounded.subnormal;
    counts.nan += rounded.nan;
    out[i] = std::bit_cast<T>(rounded.value);
  }
  return counts;
}

// The independent reference: every element through the generic rounding of
// exact values, the result encoded in the format and decoded again.
template <class T>
QuantizeCounts quantize_exact(const Format& f, const QuantizeOptions& o, const T* in, T* out, std::size_t n,
                               std::uint64_t first_index) {
  QuantizeCounts counts;
  counts.elements = n;
  const DrawKey key = make_draw_key(o.stochastic.key);
  const bool stochastic = o.rounding.mode == RoundingMode::stochastic;
  for (std::size_t i = 0; i < n; ++i) {
    const T x = in[i];
    const std::uint32_t draw = stochastic ? random_draw(key, first_index + i) : 0;
    const Rounded r = round_to_format(f, o.rounding, x, draw);
    const FloatClass c = classify(f, r.bits);
    counts.inexact += r.flags.has(Flags::inexact);
    counts.overflow += r.flags.has(Flags::overflow);
    counts.flushed_to_zero += c == FloatClass::zero && is_finite_nonzero(x);
    counts.subnormal += c == FloatClass::subnormal;
    counts.nan += c == FloatClass::nan || x != x;  // a format with no NaN holds a NaN input as +largest
    out[i] = stored_value<T>(f, r.bits);
  }
  return counts;
}

template <class T>
QuantizeCounts quantize_range(const Format& f, const QuantizeOptions& o, const detail::KernelFor<T>* kernel,
                              const T* in, T* out, std::size_t n, std::uint64_t first_index) {
  if (kernel != nullptr) return detail::quantize_vector(*kernel, in, out, n, first_index);
  if (o.path == Path::exact) return quantize_exact(f, o, in, out, n, first_index);
  return quantize_scalar(f, o, in, out, n, first_index);
}

template <class T>
QuantizeCounts quantize_any(const Format& f, std::span<const T> in, std::span<T> out, const QuantizeOptions& o) {
  if (auto reason = f.invalid_reason()) throw std::invalid_argument("quantize: invalid format: " + *reason);
  if (in.size() != out.size())
    throw std::invalid_argument("quantize: input has " + std::to_string(in.size()) + " elements but output has " +
                                std::to_string(out.size()));
  if (std::is_same_v<T, float> && !fits_in_float(f))
    throw std::invalid_argument("quantize: format " + f.name() +
                                " does not fit in float storage (needs precision <= 24 and binary32's range); "
                                "use a double array");
  if (o.rounding.random_bits < 1 || o.rounding.random_bits > 32)
    throw std::invalid_argument("quantize: random_bits must be in 1..32, got " + std::to_string(o.rounding.random_bits));

  const std::size_t n = in.size();
  detail::KernelFor<T> kernel{};
  const detail::KernelFor<T>* vector = nullptr;
  if (o.path == Path::automatic || o.path == Path::vector) {
    kernel = detail::make_kernel<T>(f, o);
    kernel.streaming_stores = o.stores == Stores::streaming;
    vector = &kernel;
  }
  unsigned threads = o.threads > 0 ? static_cast<unsigned>(o.threads) : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(1, n / min_elements_per_thread)));
  const std::uint64_t first = o.stochastic.first_index;
  if (threads <= 1) return quantize_range(f, o, vector, in.data(), out.data(), n, first);

  // Contiguous chunks, each drawing from its own element indices: the result
  // is the same for any number of threads.
  std::vector<QuantizeCounts> partial(threads);
  std::vector<std::thread> workers;
  const std::size_t chunk = (n + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    workers.emplace_back([&, t, begin, end] {
      partial[t] = quantize_range(f, o, vector, in.data() + begin, out.data() + begin, end - begin, first + begin);
    });
  }
  QuantizeCounts total;
  for (unsigned t = 0; t < threads; ++t) {
    workers[t].join();
    total += partial[t];
  }
  return total;
}

}  // namespace

QuantizeCounts quantize(const Format& f, std::span<const float> in, std::span<float> out, const QuantizeOptions& o) {
  return quantize_any<float>(f, in, out, o);
}

QuantizeCounts quantize(const Format& f, std::span<const double> in, std::span<double> out, const QuantizeOptions& o) {
  return quantize_any<double>(f, in, out, o);
}

std::string_view vector_target_name() { return detail::vector_target(); }

namespace detail {

namespace {

// Whether the FPU's additions round to nearest: fegetround reads the x87
// control word only on x86-64, while SSE and AVX follow MXCSR, which a caller
// may set on its own (_mm_setcsr).
bool fpu_rounds_to_nearest() {
#if defined(__x86_64__)
  if ((_mm_getcsr() & 0x6000u) != 0) return false;
#endif
  return std::fegetround() == FE_TONEAREST;
}

// The kernel of a format given on the storage pattern: `quantum_exponent` is
// the exponent of its subnormal quantum 2^(emin - M), `gradual` whether it has
// subnormals, `has_mantissa` whether M > 0.
template <class T>
KernelFor<T> kernel_of(const PatternFormat<std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>>& p,
                       int quantum_exponent, bool gradual, bool has_mantissa, const QuantizeOptions& o) {
  using U = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;
  constexpr int storage_mantissa = std::numeric_limits<T>::digits - 1;
  auto pattern_of = [](double value) { return std::bit_cast<U>(static_cast<T>(value)); };
  KernelFor<T> k{};
  k.mode = o.rounding.mode;
  k.format = p;
  k.quantum = U{1} << p.shift;
  k.below_quantum = k.quantum - 1;
  const bool no_mantissa = p.shift == static_cast<U>(StorageLayout<U>::trailing_bits);
  k.odd_bit = no_mantissa ? 0 : k.quantum;
  k.nearest_parity_mask = p.shift != 0 && !no_mantissa ? 1 : 0;
  k.nearest_bias = p.shift == 0 ? 0 : (U{1} << (p.shift - 1)) - 1 + (no_mantissa ? 1 : 0);
  k.ordinary_span = p.largest_finite - p.smallest_normal + 1;
  const auto mode = static_cast<std::uint8_t>(o.rounding.mode);
  k.overflow_positive = pattern_detail::overflow_result<U>(p, mode, 0);
  k.overflow_negative = pattern_detail::overflow_result<U>(p, mode, StorageLayout<U>::sign);
  // (|x| + C) - C rounds |x| < 2^emin to the subnormal quantum in the FPU's
  // current mode: usable for nearest-even when that mode is to-nearest and every
  // input that could round to nonzero is a normal number of the storage (so
  // denormals-are-zero settings cannot change it).
  if (o.rounding.mode == RoundingMode::nearest_even && gradual && has_mantissa &&
      quantum_exponent - 1 >= std::numeric_limits<T>::min_exponent - 1 && fpu_rounds_to_nearest())
    k.subnormal_magic = pattern_of(std::ldexp(1.0, quantum_exponent + storage_mantissa));
  // Below the smallest normal every mode rounds |x| * 2^(M - emin) to an
  // integer and scales back (QuantizeSubnormalLanes). Exact, and independent of
  // the FPU's rounding mode and of DAZ/FTZ, when the subnormal quantum
  // 2^(emin - M) is a normal number of the storage: the kernel takes the path
  // only for lanes that are zero or normal in the storage, so every operand and
  // result is normal (or zero) and the scalings by powers of two are exact.
  if (gradual && quantum_exponent >= std::numeric_limits<T>::min_exponent - 1) {
    k.subnormal_scale = pattern_of(std::ldexp(1.0, -quantum_exponent));
    k.subnormal_quantum = pattern_of(std::ldexp(1.0, quantum_exponent));
  }
  // Every lane of the short path (at most the largest finite value; binary32
  // subnormals too on x86-64, where the kernel clears DAZ and FTZ for the
  // call) rounds in one FPU addition to 2^(binade + 23 - M)
  // (QuantizeShortLanesFpu). Exact when the subnormal quantum q = 2^(emin - M)
  // is at least 2^-94 (so half of it, its reciprocal and every remainder that
  // can move a stochastic decision are normal numbers, and a binary32
  // subnormal lies below q 2^-32, which StochasticMagnitudeAvx2's fraction
  // needs: the bound is exact there, keep the two together), the format has at
  // most 22 mantissa bits (so the constant lies above |x|) and the largest
  // value's constant is finite.
  if constexpr (sizeof(T) == 4) {
    const int offset = std::numeric_limits<T>::digits - 1 - static_cast<int>(p.mantissa_bits);
    const auto top_binade = std::max<std::uint32_t>(p.largest_finite >> 23, p.min_normal_exponent);
    if (gradual && quantum_exponent >= -94 && offset > 0 && top_binade + offset <= 254) {
      k.fpu_magic_offset = static_cast<std::uint32_t>(offset) << 23;
      k.fpu_min_binade = p.min_normal_exponent << 23;
      k.fpu_shift_offset = static_cast<std::uint32_t>(offset - 24);
    }
  }
  k.random_mask = ~std::uint32_t{0} << (32 - o.rounding.random_bits);
  k.key = make_draw_key(o.stochastic.key);
  return k;
}

}  // namespace

template <class T>
KernelFor<T> make_kernel(const Format& f, const QuantizeOptions& o) {
  // The format on the storage pattern, as the scalar path and the GPU see it.
  if constexpr (sizeof(T) == 4)
    return kernel_of<T>(binary32_pattern_format(f), f.emin() - f.mantissa_bits, f.subnormals == Subnormals::gradual,
                        f.mantissa_bits > 0, o);
  else
    return kernel_of<T>(binary64_pattern_format(f), f.emin() - f.mantissa_bits, f.subnormals == Subnormals::gradual,
                        f.mantissa_bits > 0, o);
}

KernelFor<float> make_integer_kernel(int bits, int fraction_bits, const QuantizeOptions& o) {
  // Every value of the grid lies below its "smallest normal": one subnormal quantum, 2^-fraction_bits.
  return kernel_of<float>(integer_pattern_format(bits, fraction_bits), -fraction_bits, true, bits > 1, o);
}

template KernelFor<float> make_kernel<float>(const Format&, const QuantizeOptions&);
template KernelFor<double> make_kernel<double>(const Format&, const QuantizeOptions&);

}  // namespace detail
}  // namespace mpsim
