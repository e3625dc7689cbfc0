// The vector loops of block quantization (block_vector.hpp), per Highway
// target. Each block is a few vectors; partial vectors are masked.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "emulation/src/block_vector.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>

#include "emulation/src/block_vector.hpp"

HWY_BEFORE_NAMESPACE();
namespace mpsim::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Calls body(in, out, lanes_valid) on whole vectors of [begin, end): `in`
// points at the input, `out` at the output (null when there is none). The last
// partial vector goes through zero-padded buffers, so nothing outside the
// arrays is read or written.
template <class D, class T, class Body>
HWY_INLINE void ForVectors(D d, const T* in, T* out, std::size_t begin, std::size_t end, Body body) {
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = begin;
  for (; i + lanes <= end; i += lanes) body(in + i, out ? out + i : nullptr, lanes);
  if (i < end) {
    HWY_ALIGN T in_buffer[HWY_MAX_BYTES / sizeof(T)] = {};
    HWY_ALIGN T out_buffer[HWY_MAX_BYTES / sizeof(T)] = {};
    std::copy(in + i, in + end, in_buffer);
    body(in_buffer, out ? out_buffer : nullptr, end - i);
    if (out) std::copy(out_buffer, out_buffer + (end - i), out + i);
  }
}

void BlockAmaxBits(const float* x, std::size_t n, std::size_t block, std::uint32_t* amax) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto magnitude = hn::Set(du, 0x7FFFFFFFu);
  for (std::size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    auto m = hn::Zero(du);
    ForVectors(df, x, static_cast<float*>(nullptr), begin, std::min(n, begin + block),
               [&](const float* in, float*, std::size_t) {  // padding lanes are +0
                 m = hn::Max(m, hn::And(hn::BitCast(du, hn::LoadU(df, in)), magnitude));
               });
    amax[b] = hn::GetLane(hn::MaxOfLanes(du, m));
  }
}

ScaleCounts ScaleBlocks(const float* x, std::size_t n, std::size_t block, const float* factor, float* y) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto magnitude = hn::Set(du, 0x7FFFFFFFu);
  const auto one = hn::Set(du, 1u);
  const auto below_infinity = hn::Set(du, 0x7F7FFFFFu);
  ScaleCounts counts;
  for (std::size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const auto f = hn::Set(df, factor[b]);
    ForVectors(df, x, y, begin, std::min(n, begin + block), [&](const float* in, float* out, std::size_t) {
      const auto v = hn::LoadU(df, in);
      const auto scaled = hn::Mul(v, f);
      hn::StoreU(scaled, df, out);
      // Finite nonzero: |x| - 1 < 0x7F7FFFFF as unsigned (padding lanes are 0: not counted).
      const auto a = hn::And(hn::BitCast(du, v), magnitude);
      const auto finite_nonzero = hn::Lt(hn::Sub(a, one), below_infinity);
      const auto zero_y = hn::Eq(hn::And(hn::BitCast(du, scaled), magnitude), hn::Zero(du));
      counts.nonzero += hn::CountTrue(du, finite_nonzero);
      counts.lost += hn::CountTrue(du, hn::And(finite_nonzero, zero_y));
    });
  }
  return counts;
}

void DequantizeBlocks(const float* e, std::size_t n, std::size_t block, const float* dequant, float tensor_scale,
                      bool two_step, float* out) {
  const hn::ScalableTag<float> df;
  const auto ts = hn::Set(df, tensor_scale);
  for (std::size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const auto d = hn::Set(df, dequant[b]);
    ForVectors(df, e, out, begin, std::min(n, begin + block), [&](const float* in, float* o, std::size_t) {
      auto v = hn::Mul(hn::LoadU(df, in), d);
      if (two_step) v = hn::Mul(v, ts);
      hn::StoreU(v, df, o);
    });
  }
}

}  // namespace mpsim::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mpsim::detail {

HWY_EXPORT(BlockAmaxBits);
HWY_EXPORT(ScaleBlocks);
HWY_EXPORT(DequantizeBlocks);

void block_amax_bits(const float* x, std::size_t n, std::size_t block, std::uint32_t* amax) {
  HWY_DYNAMIC_DISPATCH(BlockAmaxBits)(x, n, block, amax);
}
ScaleCounts scale_blocks(const float* x, std::size_t n, std::size_t block, const float* factor, float* y) {
  return HWY_DYNAMIC_DISPATCH(ScaleBlocks)(x, n, block, factor, y);
}
void dequantize_blocks(const float* e, std::size_t n, std::size_t block, const float* dequant, float tensor_scale,
                       bool two_step, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeBlocks)(e, n, block, dequant, tensor_scale, two_step, out);
}

}  // namespace mpsim::detail
#endif
