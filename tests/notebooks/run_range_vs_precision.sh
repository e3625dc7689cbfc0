#!/bin/bash
# run_range_vs_precision.sh MPSIM SOURCE_DIR
#
# The range-against-precision study (issue #21, section 3) at smoke size:
# `mpsim run experiments/configs/range_vs_precision.toml --smoke` (a tiny GPT
# under fp16-mixed's recipe in binary16, e5m7, bfloat16 and e8m10, and fp32,
# two seeds), the module writing its PNGs and findings, and its notebook
# executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_range_vs_precision.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_range_vs_precision.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"
require_scipy

smoke_run range_vs_precision
study_module range_vs_precision
require_pngs "$work/figures/range_vs_precision_" outcome training
# The 2 x 2 design recognised from the stored policies' formats, two seeds each, and the effects' denominators.
"$py" - "$work/figures/range_vs_precision_findings.json" <<'PYEOF' || fail "range_vs_precision_findings.json"
import json, sys
found = json.load(open(sys.argv[1]))
widths = sorted((s["exponent_bits"], s["mantissa_bits"]) for s in found["policies"])
assert widths == [(5, 7), (5, 10), (8, 7), (8, 10), (8, 23)], widths
for s in found["policies"]:
    assert s["runs"] == 2 and s["seeds"] == [1, 2], s
    assert 0 <= s["failed"] <= s["runs"], s
effects = found["effects"]
for key in ("exponent_bits_5", "exponent_bits_8", "mantissa_bits_7", "mantissa_bits_10"):
    assert effects[key]["runs"] == 4, (key, effects[key])
assert 0 <= effects["exponent_fisher_p"] <= 1 and 0 <= effects["mantissa_fisher_p"] <= 1, effects
assert len(found["arms"]) == 10 and all(a["status"] == "completed" for a in found["arms"])
PYEOF
grep -q "Fisher" "$work/figures.txt" || fail "range_vs_precision.py printed no verdict"

echo "== range_vs_precision.ipynb (nbconvert --execute)"
MPSIM_RANGE_VS_PRECISION_H5="$log" execute_notebook "$src/notebooks/range_vs_precision.ipynb" range_vs_precision.executed.ipynb 2

status=0
echo "PASS"
