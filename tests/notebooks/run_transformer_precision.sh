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

# Seeds from two runs: merge_logs.py joins a second run (seed 2) to the first, and the module pairs each arm with
# fp32 and its preset of the same seed and tests the differences (TOST); a merge of one log with itself, or of
# another study's log, is refused with exit 2 before anything is written.
echo "== merge_logs.py: seed 1's log and seed 2's"
first=$work/seed1.h5
cp "$log" "$first"
smoke_run transformer_precision 'seeds=[2]'
mv "$log" "$work/seed2.h5"
"$py" "$src/notebooks/merge_logs.py" "$work/merged.h5" "$first" "$work/seed2.h5" || fail "merge_logs.py could not merge"
"$py" "$src/notebooks/merge_logs.py" "$work/twice.h5" "$first" "$first" 2> "$work/twice.txt"
[ $? -eq 2 ] && grep -q "the same seed twice" "$work/twice.txt" && [ ! -e "$work/twice.h5" ] \
  || fail "merge_logs.py merged a log with itself"
"$py" "$src/notebooks/transformer_precision.py" "$work/merged.h5" --out "$work/merged" > "$work/merged.txt" \
  || { cat "$work/merged.txt"; fail "transformer_precision.py could not read the merged log"; }
"$py" - "$work/merged/transformer_precision_findings.json" <<'PYEOF' || fail "merged transformer_precision_findings.json"
import json, sys
found = json.load(open(sys.argv[1]))
assert found["seeds"] == [1, 2], found["seeds"]
assert len(found["arms"]) == 24 and len(found["policies"]) == 12, (len(found["arms"]), len(found["policies"]))
by = {p["policy"]: p for p in found["policies"]}
assert [p["policy"] for p in found["policies"]][:2] == ["fp32", "bf16-mixed"]  # the config's order
assert by["bf16-norm"]["preset"] == "bf16-mixed" and by["bf16-norm"]["vs_preset"]["n"] == 2, by["bf16-norm"]
assert by["fp16-mixed"]["vs_fp32"]["n"] == 2 and "vs_preset" not in by["fp16-mixed"], by["fp16-mixed"]
for a in found["arms"]:  # each arm against fp32 of its own seed
    ref = next(b for b in found["arms"] if b["policy"] == "fp32" and b["seed"] == a["seed"])
    assert abs(a["loss_vs_fp32"] - (a["final_test_loss"] - ref["final_test_loss"])) < 1e-12, a
PYEOF
grep -q "2 seeds: " "$work/merged.txt" || fail "transformer_precision.py gave no tested verdict on two seeds"
# /agreement (a run on two backends) follows the arms' new names: checked on copies given a stand-in group.
"$py" - "$src/notebooks" "$first" "$work/seed2.h5" "$work" <<'PYEOF' || fail "merge_logs.py and /agreement"
import shutil, sys
import h5py
sys.path.insert(0, sys.argv[1])
import merge_logs
copies = []
for i, path in enumerate(sys.argv[2:4]):
    copies.append(shutil.copy(path, f"{sys.argv[4]}/agreement{i}.h5"))
    with h5py.File(copies[-1], "a") as f:
        f.create_group("agreement/fp16-mixed").attrs["reference"] = "fp32"
merge_logs.merge(f"{sys.argv[4]}/agreement.h5", copies)
with h5py.File(f"{sys.argv[4]}/agreement.h5") as f:
    assert sorted(f["agreement"]) == ["fp16-mixed.seed1", "fp16-mixed.seed2"], list(f["agreement"])
    assert f["agreement/fp16-mixed.seed2"].attrs["reference"] == "fp32.seed2"
    assert f["arms/fp32.seed2"].attrs["name"] == "fp32.seed2"
PYEOF
cp "$first" "$log"

echo "== transformer_precision.ipynb (nbconvert --execute)"
MPSIM_TRANSFORMER_PRECISION_H5="$log" execute_notebook "$src/notebooks/transformer_precision.ipynb" transformer_precision.executed.ipynb 4

status=0
echo "PASS"
