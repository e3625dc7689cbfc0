#!/bin/bash
# run_findings_table.sh SOURCE_DIR
#
# README's table of findings beside the paper is the one that
# notebooks/findings_table.py writes from docs/figures/*_findings.json
# (issue #21, section 5): --check passes on the committed README, and fails
# once a findings file changes a number (a copy of the folder, altered).
# Exit 77 (CTest: Skipped) when /usr/bin/python3 lacks scipy.
set -uo pipefail
src=${1:?usage: run_findings_table.sh SOURCE_DIR}
py=/usr/bin/python3
if ! "$py" -c "import numpy, scipy.stats, scipy.integrate" 2>/dev/null; then
  echo "SKIP: $py lacks numpy or scipy (Debian: apt install python3-scipy)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" "$src/notebooks/findings_table.py" --check "$src/README.md" || exit 1
cp -r "$src/docs/figures" "$work/figures"
"$py" - "$work/figures/master_weights_findings.json" <<'PY' || exit 1
import json, sys
found = json.load(open(sys.argv[1]))
found["per_lr"][0]["accuracy_cost"] += 0.01  # one point more: the table's cell must change
json.dump(found, open(sys.argv[1], "w"))
PY
if "$py" "$src/notebooks/findings_table.py" --figures "$work/figures" --check "$src/README.md" 2>/dev/null; then
  echo "FAIL: --check passed with an altered findings file"
  exit 1
fi
echo "PASS"
