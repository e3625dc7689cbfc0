#!/bin/bash
# disk_full.sh MPSIM CONFIG RUN_DIR
#
# A log that runs out of room (here a file size limit, `ulimit -f`, standing
# in for a full disk) stops training with one message that names the file,
# the arms and what the file holds, exit 1; the file stays readable: the
# first arm complete, the second up to its last flush.
# Exit 77 (Skipped) without Debian's python3-h5py.
set -euo pipefail
mpsim=${1:?usage: disk_full.sh MPSIM CONFIG RUN_DIR}
config=${2:?}
dir=${3:?}
source "$(dirname "$0")/needs_h5py.sh"
rm -rf "$dir"
mkdir -p "$dir"
set +e
(
  trap '' XFSZ  # a write past the limit then fails with EFBIG instead of killing the process
  ulimit -f 1400
  exec "$mpsim" run "$config" data.dataset=synthetic data.synthetic_train=2048 data.synthetic_test=128 \
    'arms=["fp32","fp16-mixed"]' train.epochs=3 train.stats_interval=1 flush_interval=5 --jobs 1 \
    -o "$dir/full.h5" --quiet
) > "$dir/out.txt" 2> "$dir/err.txt"
code=$?
set -e
cat "$dir/err.txt"
[ "$code" -eq 1 ] || { echo "FAIL: exit $code, expected 1"; exit 1; }
grep -q "the log $dir/full.h5 is out of room" "$dir/err.txt" || { echo "FAIL: the message does not name the file"; exit 1; }
grep -q "complete arms: fp32; unfinished: fp16-mixed (steps up to [0-9]*)" "$dir/err.txt" ||
  { echo "FAIL: the message does not say what the file holds"; exit 1; }
[ "$(grep -c . "$dir/err.txt")" -eq 1 ] || { echo "FAIL: more than one line on stderr"; exit 1; }
"$py" - "$dir/full.h5" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    fp32, fp16 = f["arms/fp32"], f["arms/fp16-mixed"]
    assert fp32.attrs["status"] == "completed", fp32.attrs["status"]
    assert fp32["steps/loss"].shape == (48,), fp32["steps/loss"].shape
    rows = fp16["steps/loss"].shape[0]
    assert 0 < rows < 48, rows
    assert rows - 1 <= fp16["stats/histogram"].shape[0] <= rows, fp16["stats/histogram"].shape
    assert fp16["steps/loss"][()].min() > 0
    print(f"PASS: readable; fp32 complete, fp16-mixed {rows} steps")
PY
