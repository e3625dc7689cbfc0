#!/bin/bash
# run_precision_hurts.sh MPSIM SOURCE_DIR
#
# Study d of issue #6 at smoke size: `mpsim run precision_hurts.toml --smoke`,
# notebooks/precision_hurts.py writing its PNGs and findings, and
# notebooks/precision_hurts.ipynb executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_precision_hurts.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_precision_hurts.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

echo "== mpsim run precision_hurts.toml --smoke"
h5="$work/precision_hurts.h5"
"$mpsim" run "$src/experiments/configs/precision_hurts.toml" --smoke -o "$h5" --quiet \
  > "$work/run.txt" 2>&1 || { cat "$work/run.txt"; fail "mpsim run exited with an error"; }
tail -n 6 "$work/run.txt"
[ -s "$h5" ] || fail "no log at $h5"

echo "== precision_hurts.py"
"$py" "$src/notebooks/precision_hurts.py" "$h5" --out "$work/figures" > "$work/figures.txt" \
  || { cat "$work/figures.txt"; fail "precision_hurts.py exited with an error"; }
grep -A9 "^test accuracy" "$work/figures.txt"
require_pngs "$work/figures/precision_hurts_" accuracy gradient_histograms underflow_by_layer activation_grads_noscale weight_grads_noscale
[ -s "$work/figures/precision_hurts_findings.json" ] || fail "no precision_hurts_findings.json"

echo "== precision_hurts.ipynb (nbconvert --execute)"
MPSIM_PRECISION_HURTS_H5="$h5" execute_notebook "$src/notebooks/precision_hurts.ipynb" precision_hurts.executed.ipynb 5

status=0
echo "PASS"
