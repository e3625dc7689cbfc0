#!/bin/bash
# run_parity.sh MPSIM SOURCE_DIR
#
# The accuracy-parity study at smoke size: experiments/configs/parity.toml with
# --smoke (every policy and seed on a slice of Fashion-MNIST), notebooks/parity.py
# writing its PNGs and findings, and notebooks/parity.ipynb executed headless on
# the log. Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules
# (scipy included: the significance tests) is missing.
set -uo pipefail

mpsim=${1:?usage: run_parity.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_parity.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"
require_scipy

smoke_run parity
study_module parity
cat "$work/figures.txt"
require_pngs "$work/figures/parity_" accuracy difference paper
"$py" -c "import json, sys; d = json.load(open(sys.argv[1])); assert len(d['ours']) == 6, d['ours'].keys()" \
  "$work/figures/parity_findings.json" || fail "parity_findings.json lacks the six policies"
# Parity is TOST's verdict against the margin fixed in parity.py, never "not significant" (issue 21).
"$py" -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['margin_points'] == 0.5, d['margin_points']
for policy, row in d['ours'].items():
    if policy == d['reference'] or row['verdict'] == 'diverged':
        continue
    assert row['verdict'].split(' ')[0] in ('equivalent', 'lower', 'higher', 'inconclusive', 'untested'), row
    assert 'ci90_low' in row and 'p_tost' in row and 'power' in row, row
" "$work/figures/parity_findings.json" || fail "parity_findings.json lacks TOST's verdicts"
# TOST's power (notebooks/equivalence.py, by integration) against a simulation of the test itself: 40,000
# draws of 5 normal differences with sd 0.00231 (parity's fp16-mixed), margin 0.005; standard error 0.0008.
"$py" - "$src/notebooks" <<'PY' || fail "equivalence.tost_power disagrees with the simulated TOST"
import sys
import numpy as np
from scipy import stats
sys.path.insert(0, sys.argv[1])
import equivalence
rng = np.random.default_rng(21)
n, sd, margin = 5, 0.00231, 0.005
x = rng.normal(0.0, sd, (40000, n))
inside = np.abs(x.mean(1)) + stats.t.ppf(0.95, n - 1) * x.std(1, ddof=1) / np.sqrt(n) < margin
power = equivalence.tost_power(sd, n, margin)
assert abs(power - inside.mean()) < 0.005, (power, inside.mean())
assert equivalence.seeds_for_power(sd, margin) == 4
x = rng.normal(0.003, sd, (40000, n))  # a true difference of 0.3 points
lo = x.mean(1) - stats.t.ppf(0.95, n - 1) * x.std(1, ddof=1) / np.sqrt(n)
hi = x.mean(1) + stats.t.ppf(0.95, n - 1) * x.std(1, ddof=1) / np.sqrt(n)
simulated = np.mean((lo > -margin) & (hi < margin))
assert abs(equivalence.tost_power(sd, n, margin, true_difference=0.003) - simulated) < 0.01
# Pairs by seed: only the seeds both runs have, in order, and no pair with a diverged (non-finite) side.
seeds, d = equivalence.paired_by_seed({3: 0.5, 1: 0.25, 2: float("nan"), 7: 1.0}, {1: 0.125, 2: 0.5, 3: 0.25, 4: 0.0})
assert seeds == [1, 3] and d.tolist() == [0.125, 0.25], (seeds, d)
PY

echo "== parity.ipynb (nbconvert --execute)"
MPSIM_PARITY_H5="$log" execute_notebook "$src/notebooks/parity.ipynb" parity.executed.ipynb 3

status=0
echo "PASS"
