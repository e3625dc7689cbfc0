#!/usr/bin/env python3
"""Turns bench_quantize's JSON (--benchmark_out) into the Markdown tables of docs/performance.md.

usage: bench/summarize.py quantize.json
Medians of the repetitions, in G elements/s, with the ratio of medians to memcpy of the same size and threads.
"""
import json
import sys
from collections import defaultdict


def main(path):
    data = json.load(open(path))
    rate, ratio = {}, {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"].replace("/real_time", "")
        rate[name] = b["items_per_second"] / 1e9
    # Ratios of medians: each row's median over memcpy's median, same size and threads.
    for name in rate:
        parts = name.split("/")
        base = "memcpy/" + "/".join(parts[-2:])
        if base in rate and rate[base] > 0:
            ratio[name] = rate[name] / rate[base]
    ctx = data["context"]
    print(f"Run: {ctx['date']}, host {ctx.get('host_name', '?')}, {ctx['num_cpus']} CPUs at {ctx['mhz_per_cpu']} MHz, "
          f"vector target {ctx.get('vector_target', '?')}, build {ctx.get('library_build_type', '?')} benchmark library.\n")
    for size in ("16M", "32K"):
        for threads in (1, 2):
            suffix = f"/{size}/threads:{threads}"
            if "memcpy" + suffix not in rate:
                continue
            print(f"### {size} floats, {threads} thread{'s' if threads > 1 else ''}\n")
            print(f"Ceilings: memcpy {rate.get('memcpy' + suffix, 0):.2f} G/s; F16C round trip "
                  f"{rate.get('f16c_round_trip' + suffix, 0):.2f} G/s "
                  f"({ratio.get('f16c_round_trip' + suffix, 0):.2f}x memcpy).\n")
            rows = defaultdict(dict)
            modes = []
            for name in rate:
                if not name.startswith("quantize/") or not name.endswith(suffix):
                    continue
                _, fmt, mode, data_kind = name[: -len(suffix)].split("/")
                if mode not in modes:
                    modes.append(mode)
                rows[(fmt, data_kind)][mode] = (rate[name], ratio.get(name, 0))
            print("| format | data | " + " | ".join(modes) + " |")
            print("|---|---|" + "---|" * len(modes))
            for (fmt, data_kind), cells in rows.items():
                print(f"| {fmt} | {data_kind} | " + " | ".join(
                    f"{cells[m][0]:.2f} ({cells[m][1]:.2f}x)" if m in cells else "" for m in modes) + " |")
            for extra in ("quantize_scalar_reference/binary16/nearest-even/normal",
                          "quantize_double_storage/binary16/nearest-even/normal"):
                if extra + suffix in rate:
                    print(f"\n{extra}: {rate[extra + suffix]:.3f} G/s ({ratio.get(extra + suffix, 0):.3f}x memcpy)")
            print()


if __name__ == "__main__":
    main(sys.argv[1])
