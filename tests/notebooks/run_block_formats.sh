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
assert d["mxfp4"]["blocks"]["wgrad_gradients"]["flushed_share"] > d["mxfp8"]["blocks"]["wgrad_gradients"]["flushed_share"]
PY
grep -q "inconclusive\|lower\|higher" "$work/figures.txt" || fail "block_formats.py printed no verdict"

echo "== block_formats.ipynb (nbconvert --execute)"
MPSIM_BLOCK_FORMATS_H5="$log" execute_notebook "$src/notebooks/block_formats.ipynb" block_formats.executed.ipynb 4

status=0
echo "PASS"
