#!/bin/bash
# run_attention_logits.sh MPSIM SOURCE_DIR
#
# The attention-logit study (issue #20, section 5) at smoke size: `mpsim run
# experiments/configs/attention_logits.toml --smoke` (a tiny GPT on fortunes,
# plain, QK-LayerNorm and z-loss at five learning rates), the module writing
# its PNGs and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_attention_logits.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_attention_logits.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run attention_logits
study_module attention_logits
require_pngs "$work/figures/attention_logits_" sensitivity trajectory
# Every sweep point recognised, each with its logit maxima (finite, positive) at every stats step.
"$py" - "$work/figures/attention_logits_findings.json" <<'PYEOF' || fail "attention_logits_findings.json"
import json, math, sys
found = json.load(open(sys.argv[1]))
arms = found["arms"]
assert len(arms) == 15, len(arms)
assert sorted({a["setting"] for a in arms}) == ["plain", "qk-layernorm", "z-loss"], {a["setting"] for a in arms}
assert sorted({a["lr"] for a in arms}) == [0.001, 0.003, 0.01, 0.03, 0.1]
for a in arms:
    assert a["status"] == "completed", a
    assert a["stats_steps"] == len(range(0, a["steps"], 3)), a  # every third step from 0
    assert math.isfinite(a["max_attention_logit"]) and a["max_attention_logit"] > 0, a
    assert math.isfinite(a["max_output_logit"]) and a["max_output_logit"] > 0, a
PYEOF
grep -q "passed FP16" "$work/figures.txt" || fail "attention_logits.py printed no verdict"

echo "== attention_logits.ipynb (nbconvert --execute)"
MPSIM_ATTENTION_LOGITS_H5="$log" execute_notebook "$src/notebooks/attention_logits.ipynb" attention_logits.executed.ipynb 2

status=0
echo "PASS"
