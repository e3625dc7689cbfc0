#!/usr/bin/env python3
"""Cost of instrumentation at every step, in pairs: bench_train's step with and
without statistics, run interleaved (--benchmark_enable_random_interleaving), so
that each repetition times both variants of a policy within the same round.
Reports per policy and thread count the median of the per-round ratios
(with-stats / without) and the ratio of the medians. Pairing by round keeps the
slow drifts of a shared machine out of the ratio.

usage: bench/stats_overhead.py [BUILD_DIR] [REPETITIONS] [BENCHMARK_FILTER]
(for example BM_gpt_step/ for the charlm GPT alone)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict


def main(build="build/default", repetitions=15, benchmark_filter="."):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "train.json")
        subprocess.run([os.path.join(build, "bench", "bench_train"), f"--benchmark_repetitions={repetitions}",
                        f"--benchmark_filter={benchmark_filter}",
                        "--benchmark_enable_random_interleaving=true", f"--benchmark_out={out}",
                        "--benchmark_out_format=json", "--benchmark_format=console"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        data = json.load(open(out))
    # times[(threads, policy)][stats] = per-repetition step times, in repetition order
    times = defaultdict(lambda: defaultdict(dict))
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        fields = dict(part.split(":") for part in b["run_name"].split("/")[1:] if ":" in part)
        policy = b["label"].replace(" +stats", "")
        times[(int(fields["threads"]), policy)][int(fields["stats"])][b["repetition_index"]] = b["real_time"]
    ctx = data["context"]
    print(f"{ctx['date']}, {ctx['num_cpus']} CPUs at {ctx['mhz_per_cpu']} MHz, {repetitions} interleaved repetitions")
    print("| threads | policy | ms/step | with stats | overhead: median of paired ratios (quartiles) | ratio of medians |")
    print("|---|---|---|---|---|---|")
    for (threads, policy), by in sorted(times.items()):
        pairs = [(by[0][r], by[1][r]) for r in by[0] if r in by[1]]
        ratios = sorted(s / p for p, s in pairs)
        paired = statistics.median(ratios)
        # The paired ratios' quartiles: how far one round's pair strays.
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (paired, paired, paired)
        plain, stats = statistics.median(p for p, _ in pairs), statistics.median(s for _, s in pairs)
        print(f"| {threads} | {policy} | {plain:.3f} | {stats:.3f} | {100 * (paired - 1):+.1f}% "
              f"({100 * (low - 1):+.1f}% .. {100 * (high - 1):+.1f}%) "
              f"| {100 * (stats / plain - 1):+.1f}% |")


if __name__ == "__main__":
    main(*(sys.argv[1:2] or []), *(int(a) for a in sys.argv[2:3]), *sys.argv[3:4])
