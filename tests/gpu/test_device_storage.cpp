// The device storage codec (gpu/include/mpsim/gpu/device_storage.hpp),
// compiled for the host, against the emulator's encodings:
// - decode_storage of every encoding of every format of at most 16 bits is
//   mpsim::to_float of it, bit for bit (signalling NaNs: class and sign only,
//   since rounding never makes one and the CUDA backend stores only rounded values);
// - encode_storage of every value round_float makes (from binary32 patterns
//   at a prime stride, and from every format value and its binary32
//   neighbours, in several modes) is the encoding mpsim::round_to_format
//   gives for the same input and draw, and decode_storage gives the value back.
// Formats: the presets of at most 16 bits and custom ones that exercise
// flushing, saturation, NaN-only specials, no mantissa bits and a one-bit mantissa.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/rounding.hpp"
#include "mpsim/gpu/device_format.hpp"
#include "mpsim/gpu/device_rounding.hpp"
#include "mpsim/gpu/device_storage.hpp"
#include "host_check.hpp"

namespace mpsim::gpu {
namespace {

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }

using namespace host_check;

// The formats of at most 16 bits that the rounding tests run, and two more
// small custom ones.
std::vector<Format> stored_formats() {
  std::vector<Format> list;
  for (const Format& f : kFormats)
    if (f.total_bits() <= 16) list.push_back(f);
  for (const Format& f : kEdgeFormats)
    if (f.total_bits() <= 16) list.push_back(f);
  list.push_back(Format{3, 4});
  list.push_back(Format{6, 1});
  return list;
}

TEST_CASE("storage_bytes: 1 byte up to 8 bits, 2 up to 16, else binary32", "[gpu][storage]") {
  CHECK(storage_bytes(make_device_format(formats::e4m3)) == 1);
  CHECK(storage_bytes(make_device_format(formats::e5m2)) == 1);
  CHECK(storage_bytes(make_device_format(formats::binary16)) == 2);
  CHECK(storage_bytes(make_device_format(formats::bfloat16)) == 2);
  CHECK(storage_bytes(make_device_format(Format{3, 4})) == 1);
  CHECK(storage_bytes(make_device_format(Format{5, 3})) == 2);
  CHECK(storage_bytes(make_device_format(formats::tf32)) == 4);
  CHECK(storage_bytes(make_device_format(formats::binary32)) == 4);
}

TEST_CASE("decode_storage is to_float on every encoding", "[gpu][storage]") {
  for (const Format& f : stored_formats()) {
    INFO(f.name());
    const DeviceFormat df = make_device_format(f);
    REQUIRE(storage_bytes(df) < 4);
    Tally bad;
    const std::uint32_t count = std::uint32_t{1} << f.total_bits();
    for (std::uint32_t code = 0; code < count; ++code) {
      const float expected = to_float(f, Bits{code});
      const float got = decode_storage(code, df);
      const bool signaling = classify(f, Bits{code}) == FloatClass::nan && is_signaling_nan(f, Bits{code});
      const bool same = signaling ? std::isnan(got) && std::signbit(got) == std::signbit(expected)
                                  : bits_of(got) == bits_of(expected);
      if (!same) bad.add("code " + hex_bits(code) + ": got " + hex_bits(bits_of(got)) + ", to_float " + hex_bits(bits_of(expected)));
    }
    INFO(bad.mismatched << " of " << count << " encodings differ:" << bad.first);
    CHECK(bad.mismatched == 0);
  }
}

// Inputs: binary32 patterns at a prime stride (every class), and every value
// of the format with its two binary32 neighbours.
std::vector<float> inputs_for(const Format& f) {
  std::vector<float> in;
  for (std::uint64_t p = 5; p < (std::uint64_t{1} << 32); p += 65537 * 7 + 2) in.push_back(float_of(static_cast<std::uint32_t>(p)));
  for (std::uint32_t u : {0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC12345u, 0x7F812345u, 1u})
    in.push_back(float_of(u));
  const std::uint32_t count = std::uint32_t{1} << f.total_bits();
  for (std::uint32_t code = 0; code < count; ++code) {
    const float v = to_float(f, Bits{code});
    in.push_back(v);
    if (std::isfinite(v)) {
      in.push_back(std::nextafter(v, INFINITY));
      in.push_back(std::nextafter(v, -INFINITY));
    }
  }
  return in;
}

TEST_CASE("encode_storage is the emulator's encoding of every rounded value, and decode_storage inverts it",
          "[gpu][storage]") {
  const Rounding roundings[] = {{RoundingMode::nearest_even}, {RoundingMode::toward_zero},
                                {RoundingMode::toward_positive}, {RoundingMode::odd}, {RoundingMode::stochastic, 32}};
  const DrawKey key = make_draw_key({42, 7});
  for (const Format& f : stored_formats()) {
    const DeviceFormat df = make_device_format(f);
    const std::vector<float> in = inputs_for(f);
    for (const Rounding& r : roundings) {
      INFO(f.name() << ", " << to_string(r.mode));
      const DeviceRounding dr = make_device_rounding(r);
      Tally bad;
      for (std::size_t i = 0; i < in.size(); ++i) {
        const std::uint32_t draw = random_draw(key, i);
        const float value = round_float(in[i], df, dr, draw).value;
        const std::uint32_t expected = static_cast<std::uint32_t>(round_to_format(f, r, in[i], draw).bits.value);
        const std::uint32_t code = encode_storage(value, df);
        const float back = decode_storage(code, df);
        if (code != expected || bits_of(back) != bits_of(value))
          bad.add("input " + hex_bits(bits_of(in[i])) + ": value " + hex_bits(bits_of(value)) + ", code " + hex_bits(code) +
                  ", round_to_format " + hex_bits(expected) + ", decoded " + hex_bits(bits_of(back)));
      }
      INFO(bad.mismatched << " of " << in.size() << " differ:" << bad.first);
      CHECK(bad.mismatched == 0);
    }
  }
}

}  // namespace
}  // namespace mpsim::gpu
