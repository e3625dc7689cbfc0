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
if ! "$py" -c "import scipy.stats" 2>/dev/null; then
  echo "SKIP: $py lacks scipy (Debian: apt install python3-scipy)"
  status=0
  exit $skip
fi

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

echo "== parity.ipynb (nbconvert --execute)"
MPSIM_PARITY_H5="$log" execute_notebook "$src/notebooks/parity.ipynb" parity.executed.ipynb 3

status=0
echo "PASS"
