#!/bin/bash
# run_loss_scaler_dynamics.sh MPSIM SOURCE_DIR
#
# The loss-scaler study (issue #21, section 3) at smoke size: `mpsim run
# experiments/configs/loss_scaler_dynamics.toml --smoke` (the MLP on a slice of
# Fashion-MNIST, fp32 and four fp16-mixed scalers, two seeds), the module
# writing its PNGs and findings, and its notebook executed headless on the log.
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_loss_scaler_dynamics.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_loss_scaler_dynamics.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"
require_scipy

smoke_run loss_scaler_dynamics
study_module loss_scaler_dynamics
require_pngs "$work/figures/loss_scaler_dynamics_" scale accuracy
# Starting at 2^24 overflows the first steps: the scaler backs off at each (hysteresis 1) until the gradients
# fit, and skips exactly those steps; the default scaler never changes in 16 steps.
"$py" - "$work/figures/loss_scaler_dynamics_findings.json" <<'PYEOF' || fail "loss_scaler_dynamics_findings.json"
import json, sys
found = json.load(open(sys.argv[1]))
arms = {a["arm"]: a for a in found["arms"]}
assert len(arms) == 10, sorted(arms)
high = arms["start-high.seed1"]
assert high["skipped_steps"] > 0 and high["backoffs"] == high["skipped_steps"], high
assert high["skipped_at"] == list(range(high["skipped_steps"])), high
assert high["scale_max"] == 2.0 ** 24 and high["final_scale"] == 2.0 ** 24 / 2 ** high["backoffs"], high
default = arms["fp16-mixed.seed1"]
assert default["skipped_steps"] == 0 and default["backoffs"] == 0 and default["final_scale"] == 65536.0, default
for p in found["policies"]:
    if p["policy"] != "fp32":
        assert p["equivalence"]["verdict"].split(" ")[0] in ("equivalent", "lower", "higher", "inconclusive"), p
PYEOF
grep -q "TOST" "$work/figures.txt" || fail "loss_scaler_dynamics.py printed no verdict"

echo "== loss_scaler_dynamics.ipynb (nbconvert --execute)"
MPSIM_LOSS_SCALER_DYNAMICS_H5="$log" execute_notebook "$src/notebooks/loss_scaler_dynamics.ipynb" loss_scaler_dynamics.executed.ipynb 2

status=0
echo "PASS"
