#!/bin/bash
# run_block_formats.sh MPSIM SOURCE_DIR
#
# The block-format study (issue 19, §6) at smoke size: `mpsim run
# experiments/configs/block_formats.toml --smoke` (ten policies, one seed, a
# slice of Fashion-MNIST), notebooks/block_formats.py writing its PNGs and
# findings, and notebooks/block_formats.ipynb executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_block_formats.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_block_formats.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run block_formats
study_module block_formats
cat "$work/figures.txt"
require_pngs "$work/figures/block_formats_" loss accuracy blocks scales
"$py" - "$work/figures/block_formats_findings.json" <<'PY' || fail "block_formats_findings.json is incomplete"
import json, sys
d = json.load(open(sys.argv[1]))["policies"]
assert len(d) == 10, sorted(d)
# Every block-scaled policy logged its operands; the per-tensor ones logged none.
for name in ("fp8-current", "mxfp8", "mxfp6-e2m3", "mxfp4", "nvfp4", "nvfp4-no-rht", "nvfp4-no-sr", "nvfp4-floor"):
    assert set(d[name]["blocks"]) >= {"fprop_activations", "fprop_weights", "wgrad_gradients"}, (name, d[name]["blocks"])
for name in ("bf16-mixed", "fp8-delayed"):
    assert not d[name]["blocks"], name
# MXFP4 flushes a larger share of its gradients inside their blocks than MXFP8 (E2M1 spans 2 binades, E4M3 17).
assert d["mxfp4"]["blocks"]["wgrad_gradients"]["rounded_to_zero_share"] > d["mxfp8"]["blocks"]["wgrad_gradients"]["rounded_to_zero_share"]
PY
grep -q "inconclusive\|lower\|higher\|equivalent" "$work/figures.txt" || fail "block_formats.py printed no verdict"
# The equivalence test (TOST, margin 0.5 point) on differences worked out by hand: n = 3, one-sided t 2.920,
# two-sided 4.303.
"$py" - "$src/notebooks" <<'PY' || fail "block_formats.compare_paired gives a wrong verdict"
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from block_formats import compare_paired
# mean 0.05, sd 0.05, se 0.0289: 90% [-0.034, 0.134] inside +-0.5; 95% [-0.074, 0.174] holds 0.
v = compare_paired(np.array([0.1, 0.0, 0.05]))
assert v["equivalent"] and v["verdict"] == "equivalent within +-0.5 (TOST)", v
# mean 0.167, sd 1.04, se 0.601: 90% [-1.59, 1.92] not inside the margin; 95% holds 0: inconclusive.
v = compare_paired(np.array([1.0, -1.0, 0.5]))
assert not v["equivalent"] and v["verdict"] == "inconclusive", v
# mean -1.0, sd 0.1, se 0.0577: 95% [-1.25, -0.75] below 0: lower, and outside the margin.
v = compare_paired(np.array([-1.0, -1.1, -0.9]))
assert not v["equivalent"] and v["verdict"] == "lower", v
# mean -0.2, sd 0.01: lower, and within the margin: both said.
v = compare_paired(np.array([-0.19, -0.2, -0.21]))
assert v["equivalent"] and v["verdict"] == "equivalent within +-0.5 (TOST), and lower", v
assert compare_paired(np.array([0.3]))["verdict"].startswith("inconclusive")
PY

echo "== block_formats.ipynb (nbconvert --execute)"
MPSIM_BLOCK_FORMATS_H5="$log" execute_notebook "$src/notebooks/block_formats.ipynb" block_formats.executed.ipynb 4

status=0
echo "PASS"
