#!/usr/bin/python3
"""Which block-scaled format fails where (issue 19, §6).

Reads the log of `mpsim run experiments/configs/block_formats.toml` (the MLP on Fashion-MNIST under
bf16-mixed, the FP8 recipes, MXFP8/6/4 and NVFP4 with parts of its recipe taken out), and draws:

- the training loss of every policy (mean over seeds, the band from the lowest to the highest seed);
- each policy's final test accuracy minus bf16-mixed's, seed by seed (paired: a seed fixes the initial
  weights and the batches in every arm), with the mean and its 95% t-interval, and an equivalence test
  (TOST, margin 0.5 point fixed in advance: the 90% t-interval inside +-0.5). A difference whose 95%
  interval holds 0 is inconclusive unless the equivalence test passes; it is never called parity;
- the per-block statistics that explain a gap: per GEMM operand, the share of nonzero elements
  rounded to zero inside their block and the share saturated, and the median per-block quantization
  error in units of the element format's epsilon, summed over the instrumented steps and layers;
- the block scales of the weight-gradient GEMM's gradient operand, by binade.

    /usr/bin/python3 notebooks/block_formats.py runs/block_formats.h5 [--out docs/figures]

writes block_formats_*.png and block_formats_findings.json into --out and prints the findings.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402  (beside this file)
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

BASELINE = "bf16-mixed"
OPERANDS = ("fprop_activations", "fprop_weights", "dgrad_gradients", "dgrad_weights", "wgrad_gradients",
            "wgrad_activations")
# The equivalence margin, fixed before any run: a policy is "equivalent" to bf16-mixed when both one-sided
# tests reject a difference of this many accuracy points or more (TOST; the 90% interval inside the margin).
MARGIN_POINTS = 0.5


def policies(f) -> dict[str, dict[int, str]]:
    """{policy: {seed: arm}} in the config's order."""
    result: dict[str, dict[int, str]] = {}
    for arm in ml.arms(f):
        info = ml.arm_info(f, arm)
        result.setdefault(info["policy"], {})[int(info["seed"])] = arm
    return result


def final_accuracy(f, arm: str) -> float:
    e = ml.evals(f, arm)
    return float(e["test_accuracy"][-1]) if len(e["test_accuracy"]) else math.nan


def compare_paired(d: np.ndarray) -> dict:
    """Paired differences d (points): mean, 95% t-interval (the difference test) and 90% t-interval (TOST
    against +-MARGIN_POINTS, the equivalence test; notebooks/equivalence.py), and the verdict they give."""
    tost = equivalence.paired_equivalence(d, MARGIN_POINTS)
    verdict = tost["verdict"]
    if tost["equivalent"]:
        also = f", and {tost['direction']}" if tost["direction"] else ""
        verdict = f"equivalent within +-{MARGIN_POINTS} (TOST){also}"
    elif tost["n"] < 2:
        verdict = "inconclusive (one seed: no interval)"
    return {"differences_points": np.asarray(d, dtype=float).tolist(), "mean_points": tost["mean"],
            "ci95_points": tost["ci95"], "ci90_points": tost["ci90"], "margin_points": MARGIN_POINTS,
            "equivalent": tost["equivalent"], "p_tost": tost["p_tost"], "power": tost["power"],
            "seeds_for_80_percent_power": tost["seeds_for_80_percent_power"], "verdict": verdict}


def paired_difference(f, arms: dict[int, str], base: dict[int, str]) -> dict:
    """Accuracy minus the baseline's, seed by seed, in points (compare_paired)."""
    seeds, d = equivalence.paired_by_seed({s: final_accuracy(f, a) for s, a in arms.items()},
                                          {s: final_accuracy(f, a) for s, a in base.items()})
    return {"seeds": seeds, **compare_paired(100 * d)}


def block_summary(f, arm: str) -> dict:
    """Per operand: rounded-to-zero and saturated shares of nonzero elements, median per-block error (x epsilon)."""
    if not ml.has_block_stats(f, arm):
        return {}
    out = {}
    for operand in OPERANDS:
        b = ml.block_stats(f, arm, operand=operand)
        if b["elements"] == 0:
            continue
        error = b["error"]
        finite = len(b["error_log2"]) - 2  # then the exact blocks, then the NaN blocks
        # Exact blocks (error 0) first, then the quarter binades upwards; NaN blocks left out.
        ordered = np.concatenate([error[finite:finite + 1], error[:finite]])
        cumulative = np.cumsum(ordered)
        median = math.nan
        if cumulative[-1]:
            i = int(np.searchsorted(cumulative, cumulative[-1] / 2))
            # The bin's geometric centre, or 0 for the exact blocks.
            median = 0.0 if i == 0 else float(2.0 ** (b["error_log2"][i - 1] + 0.125))
        out[operand] = {"elements": b["elements"], "nonzero": b["nonzero"], "blocks": b["blocks"],
                        "rounded_to_zero_share": ml.ratio(b["rounded_to_zero"], b["nonzero"]),
                        "saturated_share": ml.ratio(b["saturated"], b["nonzero"]),
                        "scale_clamped_share": ml.ratio(b["scale_clamped"], b["blocks"]),
                        "median_block_error_eps": median}
    return out


def findings(f) -> dict:
    groups = policies(f)
    base = groups.get(BASELINE, {})
    result = {"baseline": BASELINE, "policies": {}}
    for name, arms in groups.items():
        first = arms[min(arms)]
        entry = {"arms": list(arms.values()), "seeds": sorted(arms),
                 "final_test_accuracy": {s: final_accuracy(f, a) for s, a in sorted(arms.items())},
                 "blocks_seed": min(arms), "blocks": block_summary(f, first)}
        if name != BASELINE and base:
            entry["vs_baseline"] = paired_difference(f, arms, base)
        result["policies"][name] = entry
    return result


# --- figures -------------------------------------------------------------------------------------------


def loss_figure(f) -> Figure:
    fig = Figure(figsize=(9, 5))
    ax = fig.add_subplot()
    for name, arms in policies(f).items():
        losses = [ml.steps(f, a)["loss"] for a in arms.values()]
        n = min(len(x) for x in losses)
        stack = np.array([x[:n] for x in losses])
        steps = np.arange(n)
        line, = ax.plot(steps, stack.mean(axis=0), lw=1.2, label=name)
        if len(losses) > 1:
            ax.fill_between(steps, stack.min(axis=0), stack.max(axis=0), color=line.get_color(), alpha=0.15)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (batch mean)")
    ax.set_title("Training loss by policy (line: mean over seeds; band: lowest to highest seed)")
    ax.legend(fontsize=8, ncol=2)
    return fig


def accuracy_figure(found: dict) -> Figure:
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    names = [n for n, e in found["policies"].items() if "vs_baseline" in e]
    for i, name in enumerate(names):
        v = found["policies"][name]["vs_baseline"]
        ax.scatter(np.full(len(v["differences_points"]), i), v["differences_points"], s=12, color="0.5")
        low, high = v["ci95_points"]
        if not math.isnan(low):
            ax.errorbar(i, v["mean_points"], yerr=[[v["mean_points"] - low], [high - v["mean_points"]]], fmt="o",
                        color="C3", capsize=4)
        else:
            ax.plot(i, v["mean_points"], "o", color="C3")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"test accuracy minus {BASELINE} (points)")
    ax.set_title("Final test accuracy against bf16-mixed, seed by seed (grey), mean and 95% t-interval (red)")
    fig.tight_layout()
    return fig


def block_figure(found: dict) -> Figure:
    names = [n for n, e in found["policies"].items() if e["blocks"]]
    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    width = 0.8 / max(1, len(names))
    for measure, ax, title in (("rounded_to_zero_share", axes[0], "rounded to zero inside their block"),
                               ("saturated_share", axes[1], "saturated (clipped)")):
        for i, name in enumerate(names):
            blocks = found["policies"][name]["blocks"]
            values = [blocks.get(o, {}).get(measure, math.nan) for o in OPERANDS]
            ax.bar(np.arange(len(OPERANDS)) + i * width, values, width, label=name)
        ax.set_xticks(np.arange(len(OPERANDS)) + 0.4 - width / 2, OPERANDS, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.set_ylabel("share of nonzero elements")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.suptitle("What each format does inside its blocks (first seed, all instrumented steps and layers)")
    fig.tight_layout()
    return fig


def scale_figure(f, found: dict, operand: str = "wgrad_gradients") -> Figure:
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    bins = None
    for name, e in found["policies"].items():
        if not e["blocks"] or operand not in e["blocks"]:
            continue
        arm = e["arms"][0]
        b = ml.block_stats(f, arm, operand=operand)
        if bins is None:
            bins = ml.bins(f, arm)
        counts = b["scale_binades"][bins.finite]
        total = counts.sum()
        if total:
            ax.step(bins.exponents, counts / total, where="post", label=name)
    ax.set_xlabel("block scale binade e (2^e <= scale < 2^(e+1))")
    ax.set_ylabel("share of blocks")
    ax.set_title(f"Block scales of {operand} (first seed)")
    ax.legend(fontsize=8)
    return fig


def verdict(found: dict) -> str:
    lines = [f"Final test accuracy against {BASELINE} (paired by seed, points, mean [95% t-interval] "
             f"[90% t-interval, TOST margin +-{MARGIN_POINTS}]):"]
    for name, e in found["policies"].items():
        if "vs_baseline" not in e:
            continue
        v = e["vs_baseline"]
        low, high = v["ci95_points"]
        low90, high90 = v["ci90_points"]
        lines.append(f"  {name:<14} {v['mean_points']:+.2f} [{low:+.2f}, {high:+.2f}] [{low90:+.2f}, {high90:+.2f}] "
                     f"over seeds {v['seeds']}: {v['verdict']}")
    lines.append("Inside the blocks (first seed; share of nonzero elements rounded to zero / saturated, median block "
                 "error in element epsilons):")
    for name, e in found["policies"].items():
        for operand, b in e["blocks"].items():
            lines.append(f"  {name:<14} {operand:<18} to zero {b['rounded_to_zero_share']:.3g}  saturated "
                         f"{b['saturated_share']:.3g}  median error {b['median_block_error_eps']:.3g}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path)
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    with ml.open_log(a.log) as f:
        found = findings(f)
        loss_figure(f).savefig(a.out / "block_formats_loss.png", dpi=110)
        accuracy_figure(found).savefig(a.out / "block_formats_accuracy.png", dpi=110)
        block_figure(found).savefig(a.out / "block_formats_blocks.png", dpi=110)
        scale_figure(f, found).savefig(a.out / "block_formats_scales.png", dpi=110)
    (a.out / "block_formats_findings.json").write_text(json.dumps(found, indent=1, default=float) + "\n")
    print(verdict(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
