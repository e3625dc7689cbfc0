#!/bin/bash
# run_vit.sh MPSIM SOURCE_DIR
#
# FP16 without loss scaling on the ViT (issue #20, section 5) at smoke size:
# `mpsim run experiments/configs/vit.toml --smoke` (fp32, bf16-mixed,
# fp16-mixed and fp16-mixed without loss scaling), the module writing its PNGs
# and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_vit.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_vit.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run vit
study_module vit
require_pngs "$work/figures/vit_" training loss_scale underflow
# Four arms recognised by their stored policies, each completed, with finite accuracy and counted gradients.
"$py" - "$work/figures/vit_findings.json" <<'PYEOF' || fail "vit_findings.json"
import json, math, sys
found = json.load(open(sys.argv[1]))
arms = found["arms"]
assert sorted((a["format"], a["loss_scaling"]) for a in arms) == [
    ("bfloat16", "none"), ("binary16", "dynamic"), ("binary16", "none"), ("binary32", "none")], arms
for a in arms:
    assert a["status"] == "completed", a
    assert math.isfinite(a["final_test_accuracy"]) and 0 <= a["final_test_accuracy"] <= 1, a
    assert math.isfinite(a["activation_grads_below_2^-24"]), a
ref = next(a for a in arms if a["format"] == "binary32")
assert ref["accuracy_vs_fp32"] == 0 and ref["activation_grads_rounded_to_zero"] == 0, ref
PYEOF
grep -q "not a tested finding" "$work/figures.txt" || fail "vit.py printed no verdict"

echo "== vit.ipynb (nbconvert --execute)"
MPSIM_VIT_H5="$log" execute_notebook "$src/notebooks/vit.ipynb" vit.executed.ipynb 3

status=0
echo "PASS"
