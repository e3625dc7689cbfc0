#!/usr/bin/env bash
# run_crosscheck.sh DUMP_EXE CROSSCHECK_PY CASE [PYTHON]
# Runs torch_crosscheck_dump for CASE into a temporary folder, then
# crosscheck.py on it with PYTHON (default /usr/bin/python3, Debian's
# interpreter with python3-torch). Exits 77 (Skipped) when PYTHON cannot
# import torch; otherwise with the script's status. Builds nothing.
set -u
if [ $# -lt 3 ] || [ $# -gt 4 ]; then
  echo "usage: $0 DUMP_EXE CROSSCHECK_PY CASE [PYTHON]" >&2
  exit 2
fi
dump=$1 script=$2 case=$3 python=${4:-/usr/bin/python3}

if [ ! -x "$python" ]; then
  echo "SKIP: $python not found; the cross-check needs Debian's python3-torch (apt install python3-torch)"
  exit 77
fi
if ! why=$("$python" -I -c 'import torch, numpy' 2>&1); then
  echo "SKIP: $python cannot import torch/numpy; install Debian's python3-torch. Python said:"
  echo "$why" | tail -n 3
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpsim-torch-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
"$dump" "$tmp/$case" "$case" || { echo "FAIL: $dump $case exited with $?"; exit 1; }
# -I: isolated mode (no user site-packages, no PYTHONPATH): Debian's torch only.
"$python" -I "$script" "$tmp/$case"
