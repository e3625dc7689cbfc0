#pragma once
// Where cuBLASLt's block-scaled GEMMs (MXFP8's E8M0 scales per 32 along k,
// NVFP4's UE4M3 scales per 16) read each block's scale: the cuBLAS
// documentation's "1D Block Scaling Factors Layout". The scales of an operand
// with `rows` rows (m for A, n for B) and `groups` blocks along k form tiles of
// 128 rows x 4 blocks, 512 bytes each, the tiles in row-major order over the
// grid of tiles (along k fastest), and inside a tile, row r's block j at byte
// (r mod 32) 16 + (r div 32) 4 + j (the 128 rows as four interleaved groups of
// 32). Rows and groups are padded up to whole tiles. Index math only, no CUDA
// type: tests/gpu/test_device.cpp checks it against the documentation's
// worked example on any machine.

#include <cstdint>

namespace mpsim::gpu {

// Tiles of scales along k for `groups` blocks.
constexpr std::int64_t block_scale_tile_columns(std::int64_t groups) { return (groups + 3) / 4; }

// Bytes of the padded scale array.
constexpr std::int64_t block_scale_bytes(std::int64_t rows, std::int64_t groups) {
  return (rows + 127) / 128 * block_scale_tile_columns(groups) * 512;
}

// The byte of row `row`'s block `group` (of `groups` along k).
constexpr std::int64_t block_scale_offset(std::int64_t row, std::int64_t group, std::int64_t groups) {
  const std::int64_t tile = row / 128 * block_scale_tile_columns(groups) + group / 4;
  return tile * 512 + row % 32 * 16 + row % 128 / 32 * 4 + group % 4;
}

}  // namespace mpsim::gpu
