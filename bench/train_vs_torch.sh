#!/usr/bin/env bash
# The training step of the default MLP (or, with MODEL gpt, of the charlm
# GPT), side by side in one run: mpsim's CPU backend per policy (with and
# without instrumentation at every step) and PyTorch CPU, same model, batch,
# optimiser and thread count. Prints medians and ratios.
# Usage: bench/train_vs_torch.sh [BUILD_DIR] [REPETITIONS] [mlp|gpt]
set -euo pipefail
build=${1:-build/default}
reps=${2:-5}
model=${3:-mlp}
case "$model" in
  mlp) benchmark=BM_train_step policies="fp32 fp16-mixed bf16-mixed fp16-naive fp8" ;;
  gpt) benchmark=BM_gpt_step policies="fp32 bf16-mixed fp16-mixed" ;;
  *) echo "usage: bench/train_vs_torch.sh [BUILD_DIR] [REPETITIONS] [mlp|gpt]" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%Y-%m-%d)"
for threads in 1 2; do
  OPENBLAS_NUM_THREADS=$threads "$build/bench/bench_train" --benchmark_filter="$benchmark/.*threads:$threads(/|\$)" \
    --benchmark_repetitions="$reps" --benchmark_format=json > "$out/mpsim_$threads.json" 2>/dev/null
  OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads /usr/bin/python3 "$root/bench/torch_step.py" \
    --threads "$threads" --repetitions "$reps" --model "$model" > "$out/torch_$threads.json"
done
/usr/bin/python3 - "$out" $policies <<'PY'
import json, statistics, sys, os
out, policies = sys.argv[1], sys.argv[2:]
for threads in (1, 2):
    torch = json.load(open(os.path.join(out, f"torch_{threads}.json")))["median_ms"]
    runs = json.load(open(os.path.join(out, f"mpsim_{threads}.json")))["benchmarks"]
    by_label = {}
    for r in runs:
        if r.get("run_type") == "iteration":
            by_label.setdefault(r["label"], []).append(r["real_time"])
    med = {k: statistics.median(v) for k, v in by_label.items()}
    fp32 = med["fp32"]
    print(f"\nthreads {threads}: PyTorch {torch:.3f} ms/step (median)")
    print(f"| policy | ms/step | / PyTorch | / mpsim fp32 | +stats ms/step | stats overhead |")
    print(f"|---|---|---|---|---|---|")
    for name in policies:
        m, s = med[name], med[name + " +stats"]
        print(f"| {name} | {m:.3f} | {m / torch:.2f}x | {m / fp32:.2f}x | {s:.3f} | {100 * (s / m - 1):+.0f}% |")
PY
