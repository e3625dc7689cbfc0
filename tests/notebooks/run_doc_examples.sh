#!/bin/bash
# run_doc_examples.sh MPSIM SOURCE_DIR
#
# The Python examples of docs/hdf5-schema.md run as written (issue 18): from a
# folder laid out like the repository root (notebooks/ beside runs/), with the
# main job's log at runs/default.h5 (made here at smoke size, the same arms and
# layers), every ```python block of the page is executed by Debian's
# /usr/bin/python3 and must exit 0. Exit 77 (Skipped) without python's modules.
set -uo pipefail

mpsim=${1:?usage: run_doc_examples.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_doc_examples.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

cd "$work" || fail "cannot enter $work"
ln -s "$src/notebooks" notebooks
echo "== mpsim run default.toml at smoke size -> runs/default.h5"
"$mpsim" run "$src/experiments/configs/default.toml" --smoke train.max_steps=20 -o runs/default.h5 \
  > run.txt 2>&1 || { cat run.txt; fail "mpsim run failed"; }

"$py" - "$src/docs/hdf5-schema.md" <<'PYEOF' || fail "an example of docs/hdf5-schema.md"
import re
import subprocess
import sys

page = open(sys.argv[1]).read()
blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
if not blocks:
    sys.exit("no ```python block found in docs/hdf5-schema.md")
for i, code in enumerate(blocks, 1):
    print(f"-- example {i}:\n{code}", flush=True)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print(run.stdout + run.stderr, flush=True)
    if run.returncode != 0:
        sys.exit(f"example {i} exited {run.returncode}")
print(f"{len(blocks)} examples ran")
PYEOF

# The reader refuses what it cannot answer, rather than returning zeros (a black-box review's findings).
"$py" - <<'PYEOF' || fail "the reader's checks"
import sys
sys.path.insert(0, "notebooks")
import numpy as np
import mpsim_log as ml

log, arm = "runs/default.h5", "fp16-mixed"
n = len(ml.layers(log, arm))
for bad in (-1, n, True):
    try:
        ml.kind_counters(log, arm, "activation_grads", layer=bad)
    except (KeyError, TypeError) as e:
        print(f"layer={bad!r} refused: {e}")
    else:
        sys.exit(f"layer={bad!r} was accepted")
counts, bins = ml.kind_histogram(log, arm, "weights"), ml.bins(log, arm)
lowest = bins.exponents[np.flatnonzero(counts[bins.finite])[0]]
assert ml.binade_quantile(counts, bins, 0.0) == lowest, "quantile 0 is the lowest occupied binade"
for q in (-0.5, 1.5):
    try:
        ml.binade_quantile(counts, bins, q)
    except ValueError as e:
        print(f"quantile {q} refused: {e}")
    else:
        sys.exit(f"quantile {q} was accepted")
try:
    ml.fraction(ml.kind_counters(log, arm, "weights"), "inexact", "elements")
except ValueError as e:
    print(f"denominator refused: {e}")
else:
    sys.exit("an unknown denominator was accepted")
print("reader checks ok")
PYEOF
status=0
echo "ok"
