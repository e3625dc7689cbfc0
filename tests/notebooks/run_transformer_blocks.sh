#!/bin/bash
# run_transformer_blocks.sh MPSIM SOURCE_DIR
#
# The block-formats-on-a-transformer study (issue #20, section 5) at smoke
# size: `mpsim run experiments/configs/transformer_blocks.toml --smoke` (a tiny
# SwiGLU GPT under bf16-mixed, fp8-delayed, mxfp8 and nvfp4), the module
# writing its PNGs and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_transformer_blocks.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_transformer_blocks.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run transformer_blocks
study_module transformer_blocks
require_pngs "$work/figures/transformer_blocks_" operands outliers training
"$py" - "$work/figures/transformer_blocks_findings.json" <<'PYEOF' || fail "transformer_blocks_findings.json"
import json, math, sys
found = json.load(open(sys.argv[1]))
arms = {a["arm"]: a for a in found["arms"]}
assert sorted(arms) == ["bf16-mixed", "fp8-delayed", "mxfp8", "nvfp4"], sorted(arms)
assert found["reference_arm"] == "bf16-mixed"
# The block-scaled recipes keep per-operand statistics; every operand quantized something.
for name in ("mxfp8", "nvfp4"):
    assert arms[name]["block_scaled"], name
    for operand, s in arms[name]["operands"].items():
        assert s["elements"] > 0, (name, operand)
# NVFP4's 4-bit elements flush more of the forward activations than MXFP8's.
assert arms["nvfp4"]["operands"]["fprop_activations"]["rounded_to_zero"] > arms["mxfp8"]["operands"]["fprop_activations"]["rounded_to_zero"]
for a in arms.values():
    assert math.isfinite(a["glu_top_binade_max"]), a
PYEOF
grep -q "One seed" "$work/figures.txt" || fail "transformer_blocks.py printed no verdict"

echo "== transformer_blocks.ipynb (nbconvert --execute)"
MPSIM_TRANSFORMER_BLOCKS_H5="$log" execute_notebook "$src/notebooks/transformer_blocks.ipynb" transformer_blocks.executed.ipynb 2

status=0
echo "PASS"
