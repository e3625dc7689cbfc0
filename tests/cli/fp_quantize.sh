#!/usr/bin/env bash
# fp_quantize.sh MPSIM: `mpsim fp quantize`'s machine-readable outputs, line for
# line, against values worked out by hand from OCP MX v1.0 (docs/block-formats.md).
set -u
mpsim=$1
status=0
check() {  # check NAME EXPECTED -- ARGS...
  local name=$1 expected=$2
  shift 3
  local got
  got=$("$mpsim" fp quantize "$@" 2>&1)
  if [ "$got" != "$expected" ]; then
    printf 'FAIL %s\n  mpsim fp quantize %s\n  expected:\n%s\n  got:\n%s\n' "$name" "$*" "$expected" "$got"
    status=1
  else
    echo "ok   $name"
  fi
}
# amax 100: scale 2^(6 - 2) = 16; 1/16 -> 0, 7/16 -> 0.5, 100/16 -> 6 (saturated), -0.01/16 -> -0.
check "mxfp4 values" $'0x0p+0\n0x1p+3\n0x1.8p+6\n-0x0p+0' -- --format mxfp4 --values-only 1 7 100 -0.01
# The same values on stdin.
got=$(printf '1\n7 100\n-0.01\n' | "$mpsim" fp quantize --format mxfp4 --values-only)
[ "$got" = $'0x0p+0\n0x1p+3\n0x1.8p+6\n-0x0p+0' ] && echo "ok   stdin" || { echo "FAIL stdin: $got"; status=1; }
# Blocks of 2: amax 7 -> 2^0, amax 100 -> 2^4.
check "mxfp4 scales, blocks of 2" $'0x1p+0\n0x1p+4' -- --format mxfp4 --block 2 --scales 1 7 100 -0.01
# floor: 7.9 at scale 1 saturates to 6; ceil: scale 2, 3.95 -> 4, 0.5 -> 0.5.
check "mxfp4 floor saturates" $'0x1.8p+2\n0x1p+0' -- --format mxfp4 --values-only 7.9 1
check "mxfp4 ceil does not" $'0x1p+3\n0x1p+0' -- --format mxfp4 --scale-rounding ceil --values-only 7.9 1
# NaN or infinity in a block: that block is NaN, the others are not.
check "mx NaN block" $'nan\nnan\n0x1p+0' -- --format mxfp8-e4m3 --block 2 --values-only 1 inf 1
check "mx NaN scale" $'nan\n0x1p-8' -- --format mxfp8-e4m3 --block 2 --scales 1 inf 1
# NVFP4: amax 6: S_enc = 448, tensor scale 1/448 (0x1.24924ap-9 in binary32, 8/7 = 0x1.249249249...); the block scale 448.
check "nvfp4 scales" $'tensor_scale 0x1.24924ap-9\n0x1.cp+8' -- --format nvfp4 --scales 6 1 -0.2
# Per-tensor FP8 (one block, the whole tensor): s = 896 / 448 = 2 exactly; 896 / 2 = 448, 3 / 2 = 1.5 (E4M3).
check "fp8 per-tensor scale" $'0x1p+1' -- --format fp8-e4m3-tensor --scales 3 896 1
check "fp8 per-tensor values" $'0x1.8p+1\n0x1.cp+9\n0x1p+0' -- --format fp8-e4m3-tensor --values-only 3 896 1
got=$("$mpsim" fp quantize --format fp8-e4m3-tensor 3 896 1 2>&1)
grep -q "^format: fp8-e4m3-tensor (e4m3, 1x3 blocks" <<<"$got" && echo "ok   per-tensor table" \
  || { echo "FAIL per-tensor table: $got"; status=1; }
exit $status
