#!/bin/bash
# run_emulator_vs_gpu.sh MPSIM SOURCE_DIR
#
# Study f of issue #6 at smoke size, on the emulator only: the config asks for
# backends ["cpu", "cuda"], which needs a GPU, so the test overrides
# backends=cpu. It checks that notebooks/emulator_vs_gpu.py and the notebook
# then say plainly "no GPU arms in this file" and still draw the CPU arms'
# curves. (The GPU half runs where a device is: not in this test.)
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_emulator_vs_gpu.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_emulator_vs_gpu.sh MPSIM SOURCE_DIR}
source "$(dirname "${BASH_SOURCE[0]}")/notebook_env.sh"

smoke_run emulator_vs_gpu backends=cpu
study_module emulator_vs_gpu
cat "$work/figures.txt"
grep -q "no GPU arms in this file" "$work/figures.txt" || fail "emulator_vs_gpu.py did not say that no arm ran on a GPU"
require_pngs "$work/figures/emulator_vs_gpu_" loss accuracy
[ ! -e "$work/figures/emulator_vs_gpu_histogram_distance.png" ] || fail "a histogram-distance figure without GPU arms"
[ -s "$work/figures/emulator_vs_gpu_findings.json" ] || fail "no emulator_vs_gpu_findings.json"

echo "== emulator_vs_gpu.ipynb (nbconvert --execute)"
MPSIM_EMULATOR_VS_GPU_H5="$log" execute_notebook "$src/notebooks/emulator_vs_gpu.ipynb" emulator_vs_gpu.executed.ipynb 2
grep -q "no GPU arms in this file" "$work/emulator_vs_gpu.executed.ipynb" \
  || fail "the executed notebook does not say that no arm ran on a GPU"

status=0
echo "PASS"
