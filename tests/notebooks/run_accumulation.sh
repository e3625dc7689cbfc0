#!/bin/bash
# run_accumulation.sh MPSIM SOURCE_DIR
#
# The accumulation study at smoke size: `mpsim tc sweep` (K up to 2^10, 4
# trials), notebooks/accumulation.py writing its PNGs, and
# notebooks/accumulation.ipynb executed headless on the CSV.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_accumulation.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_accumulation.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

echo "== mpsim tc sweep (smoke size)"
csv="$work/sweep.csv"
"$mpsim" tc sweep "$src/experiments/configs/accumulation.toml" k_max_log2=10 trials=4 -o "$csv" \
  > "$work/sweep.txt" 2>&1 || { cat "$work/sweep.txt"; fail "mpsim tc sweep exited with an error"; }
tail -n 2 "$work/sweep.txt"
[ -s "$csv" ] || fail "no CSV at $csv"

echo "== accumulation.py"
"$py" "$src/notebooks/accumulation.py" "$csv" --out "$work/figures" > "$work/figures.txt" \
  || { cat "$work/figures.txt"; fail "accumulation.py exited with an error"; }
for f in dot gemm bias; do
  require_pngs "$work/figures/accumulation_${f}_" binary16 bfloat16
done

echo "== accumulation.ipynb (nbconvert --execute)"
MPSIM_ACCUMULATION_CSV="$csv" execute_notebook "$src/notebooks/accumulation.ipynb" accumulation.executed.ipynb 6

status=0
echo "PASS"
