#!/bin/bash
# run_fp16_accumulation.sh MPSIM SOURCE_DIR
#
# The FP16-accumulation study (issue #21, section 3) at smoke size: `mpsim run
# experiments/configs/fp16_accumulation.toml --smoke` (a small MLP on a slice of
# Fashion-MNIST, fp32 and fp16-mixed with binary32, binary16 and H100
# tensor-core sums, two seeds), the module writing its PNGs and findings, and
# its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_fp16_accumulation.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_fp16_accumulation.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"
require_scipy

smoke_run fp16_accumulation
study_module fp16_accumulation
require_pngs "$work/figures/fp16_accumulation_" accuracy training
# The four summations recognised from the stored policies; FP16 sums change the run (its accuracy or loss
# differs from fp16-mixed's in some seed).
"$py" - "$work/figures/fp16_accumulation_findings.json" <<'PYEOF' || fail "fp16_accumulation_findings.json"
import json, sys
found = json.load(open(sys.argv[1]))
sums = {p["policy"]: (p["accumulation"], p["gemm"]) for p in found["policies"]}
assert sums == {"fp32": ("binary32", "ieee"), "fp16-mixed": ("binary32", "ieee"),
                "fp16-accumulate": ("binary16", "ieee"), "fp16-h100": ("binary32", "h100")}, sums
acc = {p["policy"]: p["test_accuracy"] for p in found["policies"]}
assert acc["fp16-accumulate"] != acc["fp16-mixed"], acc
assert all(p["seeds"] == [1, 2] for p in found["policies"])
PYEOF
grep -q "TOST" "$work/figures.txt" || fail "fp16_accumulation.py printed no verdict"

echo "== fp16_accumulation.ipynb (nbconvert --execute)"
MPSIM_FP16_ACCUMULATION_H5="$log" execute_notebook "$src/notebooks/fp16_accumulation.ipynb" fp16_accumulation.executed.ipynb 2

status=0
echo "PASS"
