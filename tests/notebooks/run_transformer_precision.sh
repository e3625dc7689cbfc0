#!/bin/bash
# run_transformer_precision.sh MPSIM SOURCE_DIR
#
# The transformer-precision study (issue #20, section 5) at smoke size: `mpsim
# run experiments/configs/transformer_precision.toml --smoke` (a tiny GPT under
# fp32, the mixed presets, each with one of softmax, the norms and the residual
# stream or the loss lowered, and FP16 without loss scaling), the module writing its PNGs
# and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_transformer_precision.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_transformer_precision.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run transformer_precision
study_module transformer_precision
require_pngs "$work/figures/transformer_precision_" summary counters training loss_scale
# Every arm recognised from its stored policy: what it lowers and how it scales the loss.
"$py" - "$work/figures/transformer_precision_findings.json" <<'PYEOF' || fail "transformer_precision_findings.json"
import json, sys
found = json.load(open(sys.argv[1]))
arms = {a["arm"]: a for a in found["arms"]}
assert found["reference_arm"] == "fp32", found["reference_arm"]
assert len(arms) == 12, sorted(arms)
for fmt in ("bf16", "fp16"):
    assert arms[f"{fmt}-mixed"]["lowered"] == [], arms[f"{fmt}-mixed"]
    for op, lowered in (("softmax", "softmax"), ("norm", "layer_norm"), ("residual", "residual"),
                        ("loss", "softmax_cross_entropy")):
        assert arms[f"{fmt}-{op}"]["lowered"] == [lowered], arms[f"{fmt}-{op}"]
        assert arms[f"{fmt}-{op}"]["preset_arm"] == f"{fmt}-mixed", arms[f"{fmt}-{op}"]
assert arms["fp16-no-scaling"]["loss_scaling"] == "none" and arms["fp16-mixed"]["loss_scaling"] == "dynamic"
# A lowered op's rounding changes values that its preset leaves alone.
assert arms["bf16-residual"]["residual_inexact"] > 0 and arms["bf16-mixed"]["residual_inexact"] == 0
assert arms["bf16-norm"]["layer_norm_inexact"] > 0 and arms["bf16-mixed"]["layer_norm_inexact"] == 0
# The lowered loss reaches training: its trajectory leaves its preset's (the evaluation itself stays binary32).
assert arms["bf16-loss"]["final_test_loss"] != arms["bf16-mixed"]["final_test_loss"], arms["bf16-loss"]
PYEOF
grep -q "Costliest single lowering" "$work/figures.txt" || fail "transformer_precision.py printed no verdict"

echo "== transformer_precision.ipynb (nbconvert --execute)"
MPSIM_TRANSFORMER_PRECISION_H5="$log" execute_notebook "$src/notebooks/transformer_precision.ipynb" transformer_precision.executed.ipynb 4

status=0
echo "PASS"
