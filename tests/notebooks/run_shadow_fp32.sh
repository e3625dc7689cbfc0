#!/bin/bash
# run_shadow_fp32.sh MPSIM SOURCE_DIR
#
# The shadow-FP32 study (issue #21, section 3) at smoke size: `mpsim run
# experiments/configs/shadow_fp32.toml --smoke` (the default MLP on a slice of
# Fashion-MNIST, six policies, a shadow every other step), the module writing
# its PNGs and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_shadow_fp32.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_shadow_fp32.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run shadow_fp32
study_module shadow_fp32
require_pngs "$work/figures/shadow_fp32_" over_training per_layer
# The control is exact; the formats rank by their precision (binary16's 11 significant bits against bfloat16's 8
# and FP8's 4), and without a loss scaler binary16 loses more gradient elements to zero than with one.
"$py" - "$work/figures/shadow_fp32_findings.json" <<'PYEOF' || fail "shadow_fp32_findings.json"
import json, sys
found = json.load(open(sys.argv[1]))
assert found["control_exact"] is True, found["control_exact"]
p = {e["policy"]: e for e in found["policies"]}
assert list(p) == ["fp32", "bf16-mixed", "fp16-mixed", "fp16-unscaled", "fp8-delayed", "mxfp8"], list(p)
error = {name: e["relative_error_mean"] for name, e in p.items()}
assert error["fp32"] == 0 < error["fp16-mixed"] < error["bf16-mixed"] < min(error["fp8-delayed"], error["mxfp8"]), error
assert p["fp16-unscaled"]["zeroed_share_mean"] > p["fp16-mixed"]["zeroed_share_mean"], p
assert found["shadow_steps"] == 8 and found["shadow_interval"] == 2, found["shadow_steps"]
PYEOF
grep -q "bit for bit: yes" "$work/figures.txt" || fail "shadow_fp32.py printed no verdict"

echo "== shadow_fp32.ipynb (nbconvert --execute)"
MPSIM_SHADOW_FP32_H5="$log" execute_notebook "$src/notebooks/shadow_fp32.ipynb" shadow_fp32.executed.ipynb 2

status=0
echo "PASS"
