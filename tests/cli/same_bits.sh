#!/bin/bash
# same_bits.sh MPSIM CONFIG RUN_DIR OVERRIDES...
#
# Same config, same bits (issue 18): trains fp32 and fp16-mixed arms, every
# step instrumented, on products large enough to be threaded, four ways:
#   1 thread; 2 threads; 2 threads with --jobs 2; 1 thread as on an older
#   CPU: mpsim's SIMD target capped at SSE4 (MPSIM_SIMD_TARGET), glibc's
#   libm on its SSE2 paths (GLIBC_TUNABLES hides AVX, AVX2, FMA and AVX-512
#   from it: the initial weights' log and cos, softmax's exp) and OpenBLAS
#   told it runs on another CPU (OPENBLAS_CORETYPE=Prescott), which the
#   default GEMM must not notice.
# Every dataset and arm attribute must equal the 1-thread run's, but the
# arms' `threads` (2 threads) and `gemm` (it names the SIMD target).
# Exit 77 (Skipped) without Debian's python3-h5py.
set -euo pipefail
mpsim=${1:?usage: same_bits.sh MPSIM CONFIG RUN_DIR OVERRIDES...}
config=${2:?}
dir=${3:?}
shift 3
source "$(dirname "$0")/needs_h5py.sh"
mkdir -p "$dir"
run() {
  local name=$1
  shift
  "$mpsim" run "$config" "$@" -o "$dir/$name.h5" --force > "$dir/$name.txt" 2> "$dir/$name.err" ||
    { cat "$dir/$name.err"; echo "FAIL: the $name run failed"; exit 1; }
}
common=("$@" 'arms=["fp32","fp16-mixed"]' "model.hidden=[128,64]" train.stats_interval=1)
run one "${common[@]}" train.threads=1 --jobs 1
run two "${common[@]}" train.threads=2 --jobs 1
run jobs "${common[@]}" train.threads=2 --jobs 2
GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX2,-FMA,-AVX MPSIM_SIMD_TARGET=SSE4 OPENBLAS_CORETYPE=Prescott \
  run sse4 "${common[@]}" train.threads=1 --jobs 1
compare=("$py" "$(dirname "$0")/compare_logs.py")
"${compare[@]}" "$dir/one.h5" "$dir/two.h5" --ignore threads
"${compare[@]}" "$dir/one.h5" "$dir/jobs.h5" --ignore threads
"${compare[@]}" "$dir/one.h5" "$dir/sse4.h5" --ignore gemm
"$py" - "$dir/one.h5" "$dir/two.h5" "$dir/sse4.h5" <<'PY'
import sys
import h5py
one, two, sse4 = (h5py.File(p, "r")["arms/fp32"] for p in sys.argv[1:4])
assert one.attrs["threads"] == 1 and two.attrs["threads"] == 2, "the log records the threads"
assert str(one.attrs["gemm"]).startswith("ordered (") and str(sse4.attrs["gemm"]) == "ordered (SSE4)", \
    f"the log records the GEMM: {one.attrs['gemm']}, {sse4.attrs['gemm']}"
print(f"PASS: threads and GEMM recorded ({one.attrs['gemm']}; {sse4.attrs['gemm']})")
PY
