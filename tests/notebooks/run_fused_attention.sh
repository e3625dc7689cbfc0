#!/bin/bash
# run_fused_attention.sh MPSIM SOURCE_DIR
#
# The fused-attention study (issue #20) at smoke size:
# `mpsim run experiments/configs/fused_attention.toml --smoke` (a tiny GPT in
# fp32 and fp16-mixed, unfused and fused, two seeds), the module writing its
# PNGs and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_fused_attention.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_fused_attention.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"
require_scipy

smoke_run fused_attention
study_module fused_attention
require_pngs "$work/figures/fused_attention_" logits training
# Eight arms recognised by their policy and sweep point, the 2 x 2 settings over two seeds, both tests' inputs.
"$py" - "$work/figures/fused_attention_findings.json" <<'PYEOF' || fail "fused_attention_findings.json"
import json, math, sys
found = json.load(open(sys.argv[1]))
arms = found["arms"]
assert len(arms) == 8, len(arms)
assert sorted({(a["format"], a["fused"]) for a in arms}) == [
    ("binary16", False), ("binary16", True), ("binary32", False), ("binary32", True)], arms
for a in arms:
    assert a["status"] == "completed" and a["steps"] == 8, a
    assert math.isfinite(a["max_attention_logit"]) and a["max_attention_logit"] > 0, a
for s in found["settings"]:
    assert s["runs"] == 2 and s["seeds"] == [1, 2] and 0 <= s["failed"] <= 2, s
assert 0 <= found["fused_test"]["fisher_p"] <= 1, found["fused_test"]
eq = found["fp16_vs_fp32_fused"]
assert eq is None or (eq["seeds"] and len(eq["differences"]) == len(eq["seeds"])), eq
PYEOF
grep -q "Fisher" "$work/figures.txt" || fail "fused_attention.py printed no verdict"

echo "== fused_attention.ipynb (nbconvert --execute)"
MPSIM_FUSED_ATTENTION_H5="$log" execute_notebook "$src/notebooks/fused_attention.ipynb" fused_attention.executed.ipynb 2

status=0
echo "PASS"
