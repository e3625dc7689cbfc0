#!/bin/bash
# parallel_arms.sh MPSIM CONFIG RUN_DIR OVERRIDES...
#
# Arms in parallel processes write the same file as arms one after another:
# runs a small sweep (2 policies x 2 seeds at each of 2 learning rates) with --jobs 1
# and --jobs 2, then compares every dataset, every arm attribute and every
# dimension-scale attachment of the two logs with h5py (the root attributes
# differ by start time only). Exit 77 (Skipped) without Debian's python3-h5py.
set -euo pipefail
mpsim=${1:?usage: parallel_arms.sh MPSIM CONFIG RUN_DIR OVERRIDES...}
config=${2:?}
dir=${3:?}
shift 3
py=/usr/bin/python3
if ! "$py" -c "import h5py, numpy" 2>/dev/null; then
  echo "SKIP: $py with h5py and numpy is needed to compare the logs (apt install python3-h5py)"
  exit 77
fi
mkdir -p "$dir"
sweep=('arms=["fp32","fp16-naive"]' optimizer.lr=0.01,0.1 "seeds=[1,2]" train.threads=1 train.stats_interval=3)
"$mpsim" run "$config" "$@" "${sweep[@]}" -o "$dir/serial.h5" --force --jobs 1 > "$dir/serial.txt" 2> "$dir/serial.err"
"$mpsim" run "$config" "$@" "${sweep[@]}" -o "$dir/parallel.h5" --force --jobs 2 > "$dir/parallel.txt" 2> "$dir/parallel.err"
grep -q "8 arm(s) over 2 sweep points, 2 at a time" "$dir/parallel.err" || { cat "$dir/parallel.err"; echo "FAIL: not 2 at a time"; exit 1; }
ls -a "$dir" | grep -q "parts" && { echo "FAIL: the parts folder was left behind"; exit 1; }
# The summary tables list the same arms with the same numbers (wall times aside).
summary() { grep -E ' (completed|stopped.*)$' "$1" | awk '{$(NF-1)=""; print}'; }
diff <(summary "$dir/serial.txt") <(summary "$dir/parallel.txt") || { echo "FAIL: summaries differ"; exit 1; }
"$py" - "$dir/serial.h5" "$dir/parallel.h5" <<'PY'
import sys
import h5py
import numpy as np

a, b = (h5py.File(p, "r")["arms"] for p in sys.argv[1:3])
problems = []
count = 0

def compare(name, obj):
    global count
    if name not in b:
        problems.append(f"{name}: missing in the parallel log")
        return
    other = b[name]
    for key, value in obj.attrs.items():
        if key in ("DIMENSION_LIST", "REFERENCE_LIST"):
            continue
        if key not in other.attrs or str(other.attrs[key]) != str(value):
            problems.append(f"{name}: attribute {key} differs")
    if isinstance(obj, h5py.Dataset):
        count += 1
        x, y = obj[()], other[()]
        same = x.shape == y.shape and (np.array_equal(x, y, equal_nan=True) if x.dtype.kind in "fiu" else np.array_equal(x, y))
        if not same:
            problems.append(f"{name}: values differ")
        for axis, dim in enumerate(obj.dims):
            want = [s.name for s in dim.values()]
            got = [s.name for s in other.dims[axis].values()]
            if want != got:
                problems.append(f"{name}: axis {axis} scales {got}, expected {want}")

a.visititems(compare)
if sorted(a) != sorted(b):
    problems.append(f"arms {sorted(b)}, expected {sorted(a)}")
print(f"{len(a)} arms, {count} datasets compared")
if problems:
    print("FAIL:\n  " + "\n  ".join(problems[:20]))
    sys.exit(1)
print("PASS: the parallel log equals the serial one")
PY
