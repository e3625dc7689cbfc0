#!/bin/bash
# run_underflow.sh MPSIM SOURCE_DIR
#
# The underflow study (issue #6, §1a) at smoke size: `mpsim run
# experiments/configs/underflow.toml --smoke` (the MLP and the CNN in FP32 on a
# slice of Fashion-MNIST), notebooks/underflow.py writing its PNGs and
# findings, and notebooks/underflow.ipynb executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_underflow.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_underflow.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run underflow
study_module underflow
require_pngs "$work/figures/underflow_" activation_grads_mlp weight_grads_mlp activation_grads_cnn weight_grads_cnn per_layer headroom
"$py" -c 'import json, sys; m = json.load(open(sys.argv[1]))["models"]; assert set(m) == {"mlp", "cnn"}, m.keys()' \
  "$work/figures/underflow_findings.json" || fail "underflow_findings.json lacks the mlp and cnn models"
grep -q "below 2^-24" "$work/figures.txt" || fail "underflow.py printed no verdict"

echo "== underflow.ipynb (nbconvert --execute)"
MPSIM_UNDERFLOW_H5="$log" execute_notebook "$src/notebooks/underflow.ipynb" underflow.executed.ipynb 6

status=0
echo "PASS"
