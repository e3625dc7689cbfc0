#!/usr/bin/env bash
# The GPU benchmark of issue #4 §5 in one run: bench_gpu (mpsim's "cuda"
# training step per policy, with and without statistics, and GEMM throughput)
# and the same steps in PyTorch (bench/torch_gpu_step.py, when PyTorch sees a
# CUDA device), same models, batches, optimiser and step count, all timed with
# CUDA events. Prints the tables, the side-by-side comparison and the bars, and
# leaves in OUT_DIR: bench_gpu.json, torch_gpu.json (when run), the merged
# gpu_vs_torch.json and gpu_vs_torch.md. Extra arguments go to bench_gpu (its
# sizes are passed on to PyTorch).
# Usage: bench/gpu_vs_torch.sh [BUILD_DIR] [OUT_DIR] [bench_gpu options...]
# Exit status: 0 done (PyTorch may have been skipped: the output says so);
# 77 no CUDA device for bench_gpu (nothing measured); otherwise a failure.
set -euo pipefail
build=${1:-build/default}
out=${2:-runs/gpu-bench}
shift $(($# < 2 ? $# : 2))
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${MPSIM_TORCH_PYTHON:-/usr/bin/python3}  # Debian's python3-torch by default
mkdir -p "$out"

host="$(hostname), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
smi=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null | head -1 || true)
revision=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
echo "machine: $host; nvidia-smi: ${smi:-not available}; mpsim revision $revision" >&2

status=0
"$build/bench/bench_gpu" --out "$out" "$@" > "$out/bench_gpu.md" || status=$?
if [ "$status" -eq 77 ]; then
  echo "bench_gpu found no CUDA device: nothing measured (PyTorch not run either)" >&2
  exit 77
elif [ "$status" -ne 0 ]; then
  echo "bench_gpu failed with exit status $status" >&2
  exit "$status"
fi

# PyTorch with bench_gpu's own settings, read back from its report.
torch_note=""
if "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  read -r -a torch_args <<< "$("$python" -c '
import json, sys
s = json.load(open(sys.argv[1]))["settings"]
print(" ".join(f"--{flag} {s[key]}" for flag, key in (
    ("mlp-batch", "mlp_batch"), ("mlp-width", "mlp_width"), ("mlp-depth", "mlp_depth"), ("cnn-batch", "cnn_batch"),
    ("warmup", "warmup_steps"), ("window-steps", "window_steps"), ("windows", "windows"), ("seed", "seed"))))
' "$out/bench_gpu.json")"
  "$python" "$root/bench/torch_gpu_step.py" --out "$out/torch_gpu.json" "${torch_args[@]}" > "$out/torch_gpu.md"
else
  rm -f "$out/torch_gpu.json" "$out/torch_gpu.md"
  torch_note=$("$python" -c 'import torch; print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")' 2>/dev/null ||
               echo "$python cannot import torch")
  torch_note="$torch_note: the PyTorch half was skipped"
  echo "$torch_note" >&2
fi

# Merge: both tables, mpsim beside PyTorch, the bars; one JSON with everything.
"$python" - "$out" "$host" "$smi" "$revision" "$torch_note" <<'PY' | tee "$out/gpu_vs_torch.md"
import json, os, sys

out, host, smi, revision, torch_note = sys.argv[1:6]
mpsim = json.load(open(os.path.join(out, "bench_gpu.json")))
torch_path = os.path.join(out, "torch_gpu.json")
torch = json.load(open(torch_path)) if os.path.exists(torch_path) else None

# bench_gpu's tables without its list of bars: the full list, PyTorch's bar included, comes last.
print(open(os.path.join(out, "bench_gpu.md")).read().split("## Bars")[0].rstrip() + "\n")
if torch is not None:
    print(open(os.path.join(out, "torch_gpu.md")).read())

step = {(r["model"], r["policy"], r["stats_interval"]): r for r in mpsim["steps"]}
pairs = (("fp32", "fp32"), ("tf32", "tf32"), ("fp16-mixed", "amp-fp16"), ("bf16-mixed", "amp-bf16"))
comparison, bars = [], []

for model in ("mlp", "cnn"):
    fp32 = step.get((model, "fp32", 0))
    for policy in ("fp16-mixed", "bf16-mixed"):
        r = step.get((model, policy, 0))
        if fp32 and r:
            value = fp32["median_ms_per_step"] / r["median_ms_per_step"]
            bars.append({"bar": f"{model}: mpsim {policy} step >= 3x faster than fp32", "value": value,
                         "unit": "x", "met": value >= 3.0})
    for policy, _ in pairs:
        off, ten = step.get((model, policy, 0)), step.get((model, policy, 10))
        if off and ten:
            value = ten["median_ms_per_step"] / off["median_ms_per_step"] - 1.0
            bars.append({"bar": f"{model}: mpsim {policy}, stats every 10 steps <= 5% overhead", "value": value,
                         "unit": "fraction", "met": value <= 0.05})

if torch is not None:
    theirs = {(r["model"], r["mode"]): r for r in torch["results"]}
    print(f"## mpsim beside PyTorch (throughput ratio: mpsim samples/s over PyTorch's; stats off)\n")
    print("| model | batch | mpsim policy | mpsim ms/step | PyTorch mode | PyTorch ms/step | mpsim / PyTorch |")
    print("|---|---|---|---|---|---|---|")
    for model in ("mlp", "cnn"):
        for policy, mode in pairs:
            m, t = step.get((model, policy, 0)), theirs.get((model, mode))
            if not (m and t):
                continue
            ratio = m["samples_per_s"] / t["samples_per_s"]
            comparison.append({"model": model, "batch": m["batch"], "mpsim_policy": policy, "torch_mode": mode,
                               "mpsim_ms_per_step": m["median_ms_per_step"],
                               "torch_ms_per_step": t["median_ms_per_step"], "throughput_ratio": ratio})
            print(f"| {model} | {m['batch']} | {policy} | {m['median_ms_per_step']:.3f} | {mode} | "
                  f"{t['median_ms_per_step']:.3f} | {ratio:.2f}x |")
            if policy == "fp16-mixed":
                bars.append({"bar": f"{model}: mpsim fp16-mixed throughput >= 0.9x PyTorch AMP fp16",
                             "value": ratio, "unit": "x", "met": ratio >= 0.9})
    print()
else:
    print(f"PyTorch: {torch_note}.\n")

print("## Bars (reported, not asserted)\n")
for b in bars:
    value = f"{100 * b['value']:+.1f}%" if b["unit"] == "fraction" else f"{b['value']:.2f}x"
    print(f"- {b['bar']}: {value}, {'met' if b['met'] else 'not met'}")

merged = {"host": host, "nvidia_smi": smi or None, "mpsim_revision": revision, "mpsim": mpsim, "torch": torch,
          "torch_skipped": torch_note or None, "comparison": comparison, "bars": bars}
with open(os.path.join(out, "gpu_vs_torch.json"), "w") as f:
    json.dump(merged, f, indent=1)
print(f"\n(all figures: {os.path.join(out, 'gpu_vs_torch.json')})")
PY
