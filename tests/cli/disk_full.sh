#!/bin/bash
# disk_full.sh MPSIM CONFIG RUN_DIR
#
# A log that runs out of room (here a file size limit, `ulimit -f`, standing
# in for a full disk) stops training with one message that names the file,
# the arms and what the file holds, exit 1; the file stays readable, and
# holds what the message says: the complete arms with every step and status
# `completed`, the unfinished ones up to their last flush with status
# `running`. Two limits: one stops the second arm (after the first is
# complete, with the deflate ratios of this model), one the first.
# Exit 77 (Skipped) without Debian's python3-h5py.
set -euo pipefail
mpsim=${1:?usage: disk_full.sh MPSIM CONFIG RUN_DIR}
config=${2:?}
dir=${3:?}
source "$(dirname "$0")/needs_h5py.sh"
rm -rf "$dir"
mkdir -p "$dir"
run_with_limit() {  # KIB NAME
  set +e
  (
    trap '' XFSZ  # a write past the limit then fails with EFBIG instead of killing the process
    ulimit -f "$1"
    exec "$mpsim" run "$config" data.dataset=synthetic data.synthetic_train=2048 data.synthetic_test=128 \
      'arms=["fp32","fp16-mixed"]' train.epochs=3 train.stats_interval=1 flush_interval=5 --jobs 1 \
      -o "$dir/$2.h5" --quiet
  ) > "$dir/$2.out" 2> "$dir/$2.err"
  local code=$?
  set -e
  cat "$dir/$2.err"
  [ "$code" -eq 1 ] || { echo "FAIL: exit $code, expected 1"; exit 1; }
  grep -q "the log $dir/$2.h5 is out of room" "$dir/$2.err" || { echo "FAIL: the message does not name the file"; exit 1; }
  [ "$(grep -c . "$dir/$2.err")" -eq 1 ] || { echo "FAIL: more than one line on stderr"; exit 1; }
  "$py" - "$dir/$2.h5" "$dir/$2.err" <<'PY'
import re
import sys
import h5py
message = open(sys.argv[2]).read()
said = re.search(r"complete arms: (.*?); unfinished: (.*?); their status", message)
assert said, "the message does not say what the file holds"
complete = [] if said.group(1) == "none" else said.group(1).split(", ")
with h5py.File(sys.argv[1], "r") as f:
    for name, arm in f["arms"].items():
        rows = arm["steps/loss"].shape[0]
        status = arm.attrs["status"]
        if name in complete:
            assert status == "completed" and rows == 48, f"{name}: {status}, {rows} steps"
        else:
            assert status == "running" and rows < 48, f"{name}: {status}, {rows} steps"
            assert f"{name} (" in said.group(2), f"{name} missing from the message's unfinished arms"
        assert (arm["steps/loss"][()] > 0).all()
    print(f"PASS: readable and as the message says: complete {complete}; unfinished {said.group(2)}")
PY
}
run_with_limit 2660 second
grep -q "complete arms: fp32;" "$dir/second.err" || echo "note: at this limit fp32 did not complete here"
run_with_limit 1400 first
