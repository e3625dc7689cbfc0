#!/usr/bin/env bash
# experiments/studies.sh [--smoke] [--runs DIR] [--figures DIR] [STUDY ...]
#
# Runs the studies of issues #6 and #19 and draws their figures: for each study S
# (parity_cnn is parity on the CNN, drawn by parity.py),
#   mpsim run experiments/configs/S.toml -o RUNS/S.h5 --force [--smoke]
#   /usr/bin/python3 notebooks/S.py RUNS/S.h5 --out FIGURES
# At full size (the default) the figures go to docs/figures/, the README's
# gallery; --smoke runs the [smoke] size into a scratch folder. Prints each
# study's wall time and the total. The mpsim binary is build/default's
# (MPSIM overrides); build it first (.ci/mpsim main builds it).
#
# emulator_vs_gpu trains on the CPU and on the GPU; without a usable CUDA
# device its run stops before training (exit 2, "backend 'cuda' cannot
# start"), and the script runs it again on the CPU alone and says so; its
# figures then go to RUNS/cpu-only-figures, leaving the gallery's (drawn
# from a run with a GPU) in place.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mpsim=${MPSIM:-$root/build/default/experiments/mpsim}
py=/usr/bin/python3
all=(underflow loss_scale parity parity_cnn precision_hurts master_weights emulator_vs_gpu block_formats attention_logits attention_overflow transformer_precision transformer_blocks range_vs_precision loss_scaler_dynamics fp16_accumulation shadow_fp32 fused_attention vit zero_centered_gamma)

smoke=()
runs=runs
figures=docs/figures
studies=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=(--smoke); runs=${runs/#runs/runs/smoke}; figures=runs/smoke/figures; shift ;;
    --runs) runs=${2:?--runs needs a folder}; shift 2 ;;
    --figures) figures=${2:?--figures needs a folder}; shift 2 ;;
    -h|--help) sed -n 2,16p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "studies.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) studies+=("$1"); shift ;;
  esac
done
[ ${#studies[@]} -eq 0 ] && studies=("${all[@]}")
for s in "${studies[@]}"; do
  [ -f "experiments/configs/$s.toml" ] || { echo "studies.sh: no study '$s' (known: ${all[*]})" >&2; exit 2; }
done
[ -x "$mpsim" ] || { echo "studies.sh: $mpsim not found; build first: cmake --preset default && cmake --build --preset default" >&2; exit 2; }
mkdir -p "$runs" "$figures"

total_start=$(date +%s)
summary=()
for s in "${studies[@]}"; do
  start=$(date +%s)
  echo "== $s: mpsim run experiments/configs/$s.toml ${smoke[*]}"
  log="$runs/$s.run.txt"
  set +e
  "$mpsim" run "experiments/configs/$s.toml" -o "$runs/$s.h5" --force "${smoke[@]}" 2> >(tee "$log.err" >&2) | tee "$log"
  code=${PIPESTATUS[0]}
  set -e
  study_figures=$figures
  if [ "$code" -eq 2 ] && grep -q "backend 'cuda' cannot start" "$log.err"; then
    # The gallery keeps the figures of the last run that had a GPU: a CPU-only
    # run draws its own beside its log instead of replacing them.
    study_figures=$runs/cpu-only-figures
    mkdir -p "$study_figures"
    echo "== $s: no usable CUDA device here; running its CPU arms only (backends=cpu), figures in $study_figures"
    "$mpsim" run "experiments/configs/$s.toml" -o "$runs/$s.h5" --force "${smoke[@]}" backends=cpu | tee "$log"
  elif [ "$code" -ne 0 ]; then
    echo "studies.sh: $s failed (exit $code)" >&2
    exit "$code"
  fi
  # A study on another model (parity_cnn) shares its module (parity.py), its
  # figures named by a prefix.
  module=$s
  extra=()
  if [ ! -f "notebooks/$s.py" ] && [ -f "notebooks/${s%_cnn}.py" ]; then
    module=${s%_cnn}
    extra=(--prefix "$s")
  fi
  echo "== $s: notebooks/$module.py ${extra[*]}"
  MPLBACKEND=Agg "$py" "notebooks/$module.py" "$runs/$s.h5" --out "$study_figures" "${extra[@]}"
  seconds=$(( $(date +%s) - start ))
  summary+=("$(printf '%-16s %5d s' "$s" "$seconds")")
done
echo
echo "study            wall"
printf '%s\n' "${summary[@]}"
echo "total            $(( $(date +%s) - total_start )) s on $(nproc) cores, $(date -u +%Y-%m-%d)"
echo "figures: $figures/   logs: $runs/"
# The README's findings table comes from the findings files just drawn (docs/figures at full size).
if [ "$figures" = "$root/docs/figures" ] || [ "$figures" = "docs/figures" ]; then
  "$py" notebooks/findings_table.py --write README.md
fi
