#!/bin/bash
# run_loss_scale.sh MPSIM SOURCE_DIR
#
# The loss-scale study (issue #6, §1b) at smoke size: `mpsim run
# experiments/configs/loss_scale.toml --smoke` (fp16-mixed with six static
# scales and a dynamic scaler, and fp32, on a slice of Fashion-MNIST),
# notebooks/loss_scale.py writing its PNGs and findings, and
# notebooks/loss_scale.ipynb executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_loss_scale.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_loss_scale.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run loss_scale
study_module loss_scale
require_pngs "$work/figures/loss_scale_" summary range_offset range_offset_weight_grads training trajectory
# Every static scale of the config and the dynamic scaler must have been recognised.
"$py" - "$work/figures/loss_scale_findings.json" <<'PYEOF' || fail "loss_scale_findings.json"
import json, sys
found = json.load(open(sys.argv[1]))
scales = sorted(a["initial_scale"] for a in found["arms"] if a["mode"] == "static")
assert scales == [1, 8, 128, 1024, 32768, 2 ** 20], scales
assert [a["mode"] for a in found["arms"]].count("dynamic") == 1
assert found["reference_arm"] == "fp32"
PYEOF
grep -q "Within" "$work/figures.txt" || fail "loss_scale.py printed no verdict"
# A log of schema 6 named the counter rounded_to_zero "flushed": mpsim_log.py reads it under today's name, so the
# module finds the same shares in a copy of this log given the old name.
"$py" - "$src/notebooks" "$log" "$work/schema6.h5" <<'PYEOF' || fail "a schema-6 log's \"flushed\" counter"
import shutil, sys
import h5py
sys.path.insert(0, sys.argv[1])
import loss_scale
shutil.copy(sys.argv[2], sys.argv[3])
with h5py.File(sys.argv[3], "a") as f:
    f.attrs["schema_version"] = 6
    for arm in f["arms"].values():
        names = arm["counter"][()]
        assert names[2] == b"rounded_to_zero", names
        arm["counter"][2] = b"flushed"
new, old = (loss_scale.findings(h5py.File(p)) for p in sys.argv[2:4])
for a, b in zip(new["arms"], old["arms"]):
    for kind in ("activation_grads", "weight_grads"):
        assert a[kind]["rounded_to_zero_of_nonzero"] == b[kind]["rounded_to_zero_of_nonzero"], (a["arm"], kind)
assert any(a["activation_grads"]["rounded_to_zero_of_nonzero"] > 0 for a in new["arms"])  # a share that can differ
PYEOF

echo "== loss_scale.ipynb (nbconvert --execute)"
MPSIM_LOSS_SCALE_H5="$log" execute_notebook "$src/notebooks/loss_scale.ipynb" loss_scale.executed.ipynb 5

status=0
echo "PASS"
