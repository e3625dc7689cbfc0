#!/bin/bash
# run_master_weights.sh MPSIM SOURCE_DIR
#
# The master-weights study at smoke size: experiments/configs/master_weights.toml
# with --smoke (the learning-rate sweep on a slice of Fashion-MNIST, arms named
# POLICY@lr=...), notebooks/master_weights.py writing its PNGs and findings, and
# notebooks/master_weights.ipynb executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_master_weights.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_master_weights.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run master_weights
study_module master_weights
cat "$work/figures.txt"
require_pngs "$work/figures/master_weights_" swallowed accuracy over_training
"$py" -c "import json, sys; d = json.load(open(sys.argv[1])); assert len(d['per_lr']) == 5, d['per_lr']" \
  "$work/figures/master_weights_findings.json" || fail "master_weights_findings.json lacks the five learning rates"

echo "== master_weights.ipynb (nbconvert --execute)"
MPSIM_MASTER_WEIGHTS_H5="$log" execute_notebook "$src/notebooks/master_weights.ipynb" master_weights.executed.ipynb 3

status=0
echo "PASS"
