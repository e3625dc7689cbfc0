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

smoke_run precision_hurts
study_module precision_hurts
grep -A9 "^w = 1 " "$work/figures.txt" || fail "no verdict line for the unweighted point (w = 1)"
grep -q "the fp32 arm is the same run at every k: per seed, every step.s loss (bit for bit) and the accuracy are identical" "$work/figures.txt" ||
  fail "the fp32 arm differs between loss weights: a power-of-two loss weight with a matching SGD rate must not change it"
require_pngs "$work/figures/precision_hurts_" accuracy_vs_weight accuracy gradient_histograms underflow_by_layer activation_grads_noscale weight_grads_noscale
[ -s "$work/figures/precision_hurts_findings.json" ] || fail "no precision_hurts_findings.json"

echo "== precision_hurts.ipynb (nbconvert --execute)"
MPSIM_PRECISION_HURTS_H5="$log" execute_notebook "$src/notebooks/precision_hurts.ipynb" precision_hurts.executed.ipynb 5

status=0
echo "PASS"
