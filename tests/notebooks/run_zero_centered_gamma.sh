#!/bin/bash
# run_zero_centered_gamma.sh MPSIM SOURCE_DIR
#
# The zero-centred gamma study at smoke size: experiments/configs/zero_centered_gamma.toml with --smoke (bf16-mixed
# with and without FP32 master weights, zero_centered_gamma off and on, two seeds), and
# notebooks/zero_centered_gamma.py writing its PNGs and findings, and its notebook executed headless. Beyond running, it checks the study's mechanism:
# with the weights only in bfloat16 the plain gammas (near 1) swallow their updates and the zero-centred ones
# (near 0) do not; with a master copy none are swallowed.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_zero_centered_gamma.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_zero_centered_gamma.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run zero_centered_gamma
study_module zero_centered_gamma
cat "$work/figures.txt"
require_pngs "$work/figures/zero_centered_gamma_" swallowed loss_difference
"$py" - "$work/figures/zero_centered_gamma_findings.json" <<'PYEOF' || fail "the study's mechanism did not show"
import json, sys
arms = json.load(open(sys.argv[1]))["arms"]
assert len(arms) == 8, len(arms)  # two policies x zero_centered_gamma off and on x two seeds
for a in arms:
    assert a["norm_updates_nonzero"] > 0, a
    share = a["norm_swallowed_share"]
    if a["policy"] == "bf16-nomaster" and not a["zero_centered_gamma"]:
        assert share > 0.5, a  # gamma near 1: AdamW's steps of ~lr are below half of bfloat16's 2^-7 there
    else:
        assert share < 0.05, a
PYEOF

echo "== zero_centered_gamma.ipynb (nbconvert --execute)"
MPSIM_ZERO_CENTERED_GAMMA_H5="$log" execute_notebook "$src/notebooks/zero_centered_gamma.ipynb" \
  zero_centered_gamma.executed.ipynb 2

status=0
echo "PASS"
