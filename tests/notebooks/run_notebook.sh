#!/bin/bash
# run_notebook.sh MPSIM SOURCE_DIR
#
# Makes a small synthetic run with MPSIM, then, with Debian's /usr/bin/python3:
#   1. notebooks/figures.py on the log: every PNG it names must exist, be a PNG and not be empty;
#   2. notebooks/quickstart.ipynb executed headless with nbconvert (MPSIM_LOG pointing at the
#      log): every cell must run, and the figures must come out as images.
# All output goes to a temporary directory (kept, and named, when the test fails).
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_notebook.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_notebook.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

echo "== mpsim run (synthetic, 2 epochs)"
log="$work/small.h5"
"$mpsim" run "$src/experiments/configs/default.toml" data.dataset=synthetic train.epochs=2 \
  train.stats_interval=1 train.threads=2 -o "$log" --force > "$work/run.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$work/run.txt"; fail "mpsim run exited $rc"; }
tail -n 8 "$work/run.txt"
[ -s "$log" ] || fail "mpsim run wrote no log at $log"

echo "== figures.py"
"$py" "$src/notebooks/figures.py" "$log" --out "$work/figures" > "$work/figures.txt" \
  || { cat "$work/figures.txt"; fail "figures.py exited with an error"; }
cat "$work/figures.txt"
count=0
while IFS= read -r png; do
  [ -s "$png" ] || fail "figures.py named $png, which is missing or empty"
  [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$png is not a PNG"
  count=$((count + 1))
done < "$work/figures.txt"
for name in loss_accuracy loss_scale activation_grads_all underflow; do
  [ -s "$work/figures/small_$name.png" ] || fail "no small_$name.png"
done
[ "$count" -ge 5 ] || fail "figures.py wrote $count PNGs, expected 5"

echo "== quickstart.ipynb (nbconvert --execute)"
MPSIM_LOG="$log" execute_notebook "$src/notebooks/quickstart.ipynb" quickstart.executed.ipynb 5

status=0
echo "PASS"
