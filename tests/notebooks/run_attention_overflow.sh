#!/bin/bash
# run_attention_overflow.sh MPSIM SOURCE_DIR
#
# The FP16 attention-overflow study (issue #20, section 5) at smoke size:
# `mpsim run experiments/configs/attention_overflow.toml --smoke` (a tiny GPT
# in fp32 and fp16-mixed, plain, with QK-LayerNorm, z-loss and both), the module writing its
# PNGs and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_attention_overflow.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_attention_overflow.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run attention_overflow
study_module attention_overflow
require_pngs "$work/figures/attention_overflow_" logits training
# Eight arms recognised by their policy and sweep point, each with finite logit maxima and its step records.
"$py" - "$work/figures/attention_overflow_findings.json" <<'PYEOF' || fail "attention_overflow_findings.json"
import json, math, sys
found = json.load(open(sys.argv[1]))
arms = found["arms"]
assert len(arms) == 8, len(arms)
assert sorted((a["format"], a["qk_norm"], a["z_loss"]) for a in arms) == sorted(
    (f, q, z) for f in ("binary16", "binary32") for q in (False, True) for z in (0.0, 1e-4)), arms
assert len(found["settings"]) == 8, found["settings"]
for a in arms:
    assert a["status"] == "completed", a
    assert a["steps"] == 8, a
    assert math.isfinite(a["max_attention_logit"]) and a["max_attention_logit"] > 0, a
    assert found["fp16_max"] == 65504.0
PYEOF
grep -q "not a tested finding" "$work/figures.txt" || fail "attention_overflow.py printed no verdict"

echo "== attention_overflow.ipynb (nbconvert --execute)"
MPSIM_ATTENTION_OVERFLOW_H5="$log" execute_notebook "$src/notebooks/attention_overflow.ipynb" attention_overflow.executed.ipynb 2

status=0
echo "PASS"
