#!/bin/bash
# parallel_arms.sh MPSIM CONFIG RUN_DIR OVERRIDES...
#
# Arms in parallel processes write the same file as arms one after another:
# runs a small sweep (2 policies x 2 seeds at each of 2 learning rates) with --jobs 1
# and --jobs 2, then compares every dataset, every arm attribute and every
# dimension-scale attachment of the two logs (compare_logs.py; the root
# attributes differ by start time only). Exit 77 (Skipped) without Debian's python3-h5py.
set -euo pipefail
mpsim=${1:?usage: parallel_arms.sh MPSIM CONFIG RUN_DIR OVERRIDES...}
config=${2:?}
dir=${3:?}
shift 3
source "$(dirname "$0")/needs_h5py.sh"
mkdir -p "$dir"
sweep=('arms=["fp32","fp16-naive"]' optimizer.lr=0.01,0.1 "seeds=[1,2]" train.threads=1 train.stats_interval=3)
"$mpsim" run "$config" "$@" "${sweep[@]}" -o "$dir/serial.h5" --force --jobs 1 > "$dir/serial.txt" 2> "$dir/serial.err"
"$mpsim" run "$config" "$@" "${sweep[@]}" -o "$dir/parallel.h5" --force --jobs 2 > "$dir/parallel.txt" 2> "$dir/parallel.err"
grep -q "8 arm(s) over 2 sweep points, 2 at a time" "$dir/parallel.err" || { cat "$dir/parallel.err"; echo "FAIL: not 2 at a time"; exit 1; }
ls -a "$dir" | grep -q "parts" && { echo "FAIL: the parts folder was left behind"; exit 1; }
# The summary tables list the same arms with the same numbers (wall times aside).
summary() { grep -E ' (completed|stopped.*)$' "$1" | awk '{$(NF-1)=""; print}'; }
diff <(summary "$dir/serial.txt") <(summary "$dir/parallel.txt") || { echo "FAIL: summaries differ"; exit 1; }
"$py" "$(dirname "$0")/compare_logs.py" "$dir/serial.h5" "$dir/parallel.h5"
