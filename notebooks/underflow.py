#!/usr/bin/python3
"""Underflow study (issue #6, §1a): how much of an FP32 training run's gradients FP16 could hold.

Micikevicius et al., "Mixed Precision Training", ICLR 2018 (arXiv:1710.03740), figures 2b and 3, histogram
the gradients of FP32 training by binade: values below 2^-24 (FP16's smallest subnormal) lie outside FP16's
range (under round-to-nearest-even those below 2^-25 become zero and those between round up to 2^-24), values
in [2^-24, 2^-14) are FP16 subnormals with fewer significant bits, and the top of FP16's range (65504) goes
unused, which is the room a loss scale can shift the gradients into. This module reads the log of
`mpsim run experiments/configs/underflow.toml` (the fp32 arm of the MLP and of the CNN), computes per layer
the fraction of activation and weight gradients that is zero, below 2^-24 and FP16-subnormal, and the
loss-scale headroom, and draws them beside the paper's numbers.

    /usr/bin/python3 notebooks/underflow.py runs/underflow.h5 [--out docs/figures]

writes underflow_*.png and underflow_findings.json into --out and prints the verdict.
"""

from __future__ import annotations

import math
import os
import sys
import tomllib
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figures as fg  # noqa: E402  (beside this file: the binade heatmap and the FP16 constants)
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

KINDS = ("activation_grads", "weight_grads")
KIND_TITLE = {"activation_grads": "activation gradients", "weight_grads": "weight gradients"}
# The bin layout (binade exponents, the zero, inf and NaN bins) is the log's: mpsim_log.bins().
# FP16's largest finite value is 65504 < 2^16, so its top binade is e = 15.
FP16_TOP_BINADE = 15

# The paper's reference figures, exactly as issue #6 quotes them (nothing else is claimed about the paper).
PAPER = {
    "weight_grads_below_2^-24": {"value": 0.05, "text": "~5%", "model": "Mandarin speech recognition model",
                                 "figure": "2b"},
    "activation_grads_zero": {"value": 0.67, "text": "67%", "model": "Multibox SSD", "figure": "3"},
    "source": "Micikevicius et al., Mixed Precision Training, ICLR 2018 (arXiv:1710.03740), as quoted in issue #6; "
              "the 5% sentence (Section 3.1) checked against a text extraction of arXiv v3 on 2026-11-27",
}


# --- reading -------------------------------------------------------------------------------------------------


def model_groups(f) -> list[tuple[str, list[str]]]:
    """(model label, its arms by seed) for every fp32 arm, MLP first. The label is the sweep point's model kind
    (`fp32@kind=cnn` -> "cnn"), else the config's model.kind; arms of one model that differ only in their seed
    share it (the first seed's arm draws the figures, every seed enters the spread). Arms of one model under
    several policies keep apart by the arm's name. Falls back to every arm when none is fp32."""
    names = ml.arms(f)
    infos = {a: ml.arm_info(f, a) for a in names}
    chosen = [a for a in names if infos[a].get("policy") == "fp32"] or names
    try:
        default_kind = tomllib.loads(ml.config(f)).get("model", {}).get("kind", "mlp")
    except tomllib.TOMLDecodeError:
        default_kind = "model"

    def kind_of(arm):
        return ml.sweep_point(f, arm).get("kind", default_kind)

    groups: dict[tuple[str, str], list[str]] = {}
    for a in chosen:
        groups.setdefault((kind_of(a), infos[a].get("policy", "")), []).append(a)
    kinds = [k for k, _ in groups]
    result = []
    for (kind, policy), arms in groups.items():
        arms = sorted(arms, key=lambda a: int(infos[a].get("seed", 0)))
        if kinds.count(kind) == 1:
            result.append((kind, arms))
        else:  # several policies of one model: each arm apart
            result += [(f"{kind} ({a})", [a]) for a in arms]
    order = {"mlp": 0, "cnn": 1}
    return sorted(result, key=lambda g: (order.get(g[0].split()[0], 2), g[0]))


def model_arms(f) -> list[tuple[str, str]]:
    """(arm, model label) for each model: its first seed's arm (model_groups)."""
    return [(arms[0], model) for model, arms in model_groups(f)]


def layer_histograms(f, arm: str, kind: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(layers, steps, counts[n_steps, n_layers, bins]) for the layers that have this kind of tensor."""
    counts = ml.kind_histogram(f, arm, kind, per_step=True, per_layer=True)
    present = counts.sum(axis=(0, 2)) > 0
    names = [n for n, p in zip(ml.layers(f, arm), present) if p]
    return names, ml.stats_steps(f, arm), counts[:, present, :]


# --- computing -----------------------------------------------------------------------------------------------


def fractions(counts: np.ndarray, bins: ml.Bins) -> dict:
    """Shares of a histogram (summed over whatever axes) by what FP16 makes of them.

    Denominator: every element, zeros included (the paper's 67% is a share of all activation gradients).
    `below_2^-24_of_nonzero` divides by the finite nonzero elements instead."""
    def share(selected, denominator="all"):
        return ml.histogram_fraction(counts, bins, selected, denominator)

    below = bins.select(hi=fg.FP16_SUBNORMAL_MIN_LOG2)
    return {
        "elements": int(ml.histogram_total(counts, bins, "all")),
        "zero": share(bins.special("zero")),
        "below_2^-24": share(below),
        "below_2^-24_of_nonzero": share(below, "finite_nonzero"),
        "fp16_subnormal": share(bins.select(fg.FP16_SUBNORMAL_MIN_LOG2, fg.FP16_NORMAL_MIN_LOG2)),
        "fp16_normal": share(bins.select(fg.FP16_NORMAL_MIN_LOG2, FP16_TOP_BINADE + 1)),
        "above_fp16_max_binade": share(bins.select(lo=FP16_TOP_BINADE + 1)),
        "nonfinite": share(bins.special("infinity", "nan")),
    }


def headroom(counts_over_steps: np.ndarray, bins: ml.Bins) -> dict:
    """The unused top of FP16's range for one kind (counts[n_steps, bins], all layers summed).

    The largest gradient lies below 2^(e_max+1), so it sits at least 15 - e_max binades below FP16's top
    binade [2^15, 65504]: a loss scale of 2^(15 - e_max) still cannot overflow it, except for values in
    the last 0.05% below 2^(e_max+1). `lifted_*` is what such a scale would leave below 2^-24."""
    per_step = FP16_TOP_BINADE - ml.top_binade(counts_over_steps, bins)
    total = counts_over_steps.sum(axis=0)
    e_max = ml.top_binade(total, bins)
    room = float(FP16_TOP_BINADE - e_max)
    shift = int(room) if math.isfinite(room) else 0
    still_below = bins.select(hi=fg.FP16_SUBNORMAL_MIN_LOG2 - shift)  # below 2^-24 once scaled by 2^shift
    return {
        "largest_binade": float(e_max),
        "headroom_binades": room,
        "headroom_binades_median_step": float(np.nanmedian(per_step)) if np.isfinite(per_step).any() else float("nan"),
        "below_2^-24_of_nonzero_after_scaling_by_headroom": ml.histogram_fraction(total, bins, still_below,
                                                                                  "finite_nonzero"),
    }


def per_layer(names: list[str], counts: np.ndarray, bins: ml.Bins) -> list[tuple[str, dict]]:
    """[(layer, fractions over all instrumented steps)], in model order, then ("all layers", ...); names and
    counts as layer_histograms gives them."""
    rows = [(name, fractions(counts[:, i, :].sum(axis=0), bins)) for i, name in enumerate(names)]
    rows.append(("all layers", fractions(counts.sum(axis=(0, 1)), bins)))
    return rows


def over_training(counts: np.ndarray, bins: ml.Bins, parts: int = 8) -> list[float]:
    """Share of nonzero values below 2^-24 in each of `parts` equal stretches of the instrumented steps (counts
    as layer_histograms gives them): whether underflow grows as the loss (and with it the gradients) shrinks."""
    summed = counts.sum(axis=1)
    return [fractions(chunk.sum(axis=0), bins)["below_2^-24_of_nonzero"]
            for chunk in np.array_split(summed, min(parts, len(summed))) if len(chunk)]


def findings(f) -> dict:
    """The key numbers per model and tensor kind (the first seed's), their spread over the seeds, and the
    paper's, for the README's table."""
    result = {"study": "underflow", "paper": PAPER, "models": {}}
    for model, arms in model_groups(f):
        runs = []
        for arm in arms:
            e = ml.evals(f, arm)
            info = ml.arm_info(f, arm)
            entry = {"arm": arm, "seed": int(info.get("seed", 0)), "status": info.get("status"),
                     "steps": int(ml.steps(f, arm)["step"].size),
                     "test_accuracy": float(e["test_accuracy"][-1]) if len(e["step"]) else float("nan")}
            bins = ml.bins(f, arm)
            for kind in KINDS:
                names, _, counts = layer_histograms(f, arm, kind)
                entry[kind] = {
                    "all_layers": fractions(counts.sum(axis=(0, 1)), bins),
                    "per_layer": dict(per_layer(names, counts, bins)[:-1]),
                    "headroom": headroom(counts.sum(axis=1), bins),
                    "below_2^-24_of_nonzero_by_eighth_of_training": over_training(counts, bins),
                }
            # ReLU's input gradient selects from its output gradient (dy where the input was positive, else 0)
            # and is not a tensor of its own in the counts (each tensor once: docs/hdf5-schema.md); the zeros it
            # puts into the gradient are where its output is zero, which its activations' histogram counts.
            relu = [i for i, name in enumerate(ml.layers(f, arm)) if name.startswith("relu")]
            acts = ml.kind_histogram(f, arm, "activations", per_layer=True)
            entry["relu_output_zero"] = (fractions(acts[relu].sum(axis=0), bins)["zero"]
                                         if relu else float("nan"))
            runs.append(entry)
        first = runs[0]
        # Over the seeds: each key number per seed, in seed order (the first is the entry's own).
        first["over_seeds"] = {
            "seeds": [r["seed"] for r in runs],
            "test_accuracy": [r["test_accuracy"] for r in runs],
            "relu_output_zero": [r["relu_output_zero"] for r in runs],
            **{f"{kind}_{key}": [r[kind]["all_layers"][key] for r in runs]
               for kind in KINDS for key in ("zero", "below_2^-24", "below_2^-24_of_nonzero")},
            **{f"{kind}_headroom_binades": [r[kind]["headroom"]["headroom_binades"] for r in runs] for kind in KINDS},
        }
        result["models"][model] = first
    return result


def spread(values) -> str:
    """`a-b%` over the seeds (one value: that value)."""
    lo, hi = min(values), max(values)
    return _pct(lo) if lo == hi else f"{100 * lo:.3g}-{_pct(hi)}"


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.3g}%"


def verdict(found: dict) -> str:
    """One paragraph per model: our numbers with the paper's beside them."""
    lines = []
    for model, m in found["models"].items():
        a, w = m["activation_grads"], m["weight_grads"]
        aa, wa = a["all_layers"], w["all_layers"]
        lines.append(
            f"{model} (FP32, {m['steps']} steps, test accuracy {_pct(m['test_accuracy'])}; shares of all values): "
            f"activation gradients {_pct(aa['zero'])} zero (paper, SSD: 67%), {_pct(aa['below_2^-24'])} below 2^-24 "
            f"(outside FP16's range), "
            f"{_pct(aa['fp16_subnormal'])} FP16-subnormal [2^-24, 2^-14); weight gradients {_pct(wa['zero'])} zero, "
            f"{_pct(wa['below_2^-24'])} below 2^-24 (paper, Mandarin speech: ~5%), "
            f"{_pct(wa['fp16_subnormal'])} FP16-subnormal. ReLU outputs zero (the gradient values it zeroes): "
            f"{_pct(m['relu_output_zero'])}.")
        for kind, k in (("activation", a), ("weight", w)):
            h = k["headroom"]
            lines.append(
                f"  {kind} gradients: largest in binade 2^{h['largest_binade']:.0f}, so {h['headroom_binades']:.0f} "
                f"binades of headroom below FP16's max (median step {h['headroom_binades_median_step']:.0f}); "
                f"below 2^-24: {_pct(k['all_layers']['below_2^-24_of_nonzero'])} of nonzero values, "
                f"{_pct(h['below_2^-24_of_nonzero_after_scaling_by_headroom'])} after a loss scale of "
                f"2^{h['headroom_binades']:.0f}; first -> last eighth of training: "
                f"{_pct(k['below_2^-24_of_nonzero_by_eighth_of_training'][0])} -> "
                f"{_pct(k['below_2^-24_of_nonzero_by_eighth_of_training'][-1])} of nonzero.")
        o = m["over_seeds"]
        if len(o["seeds"]) > 1:
            lines.append(
                f"  over seeds {o['seeds']}: activation gradients zero {spread(o['activation_grads_zero'])}, "
                f"below 2^-24 {spread(o['activation_grads_below_2^-24_of_nonzero'])} of nonzero; weight gradients "
                f"below 2^-24 {spread(o['weight_grads_below_2^-24_of_nonzero'])} of nonzero "
                f"({spread(o['weight_grads_below_2^-24'])} of all); test accuracy {spread(o['test_accuracy'])}.")
    return "\n".join(lines)


# --- figures -------------------------------------------------------------------------------------------------


def histogram_figure(f, arm: str, kind: str, model: str) -> Figure:
    """All layers' gradients of one kind by binade over training, FP16's ranges marked (the paper's Figure 3
    layout): figures.activation_grad_heatmap with every layer summed."""
    fig = fg.activation_grad_heatmap(f, arm=arm, layer="all", kind=kind)
    fig.suptitle(f"Underflow study, {model}: {KIND_TITLE[kind]} of FP32 training against FP16's range",
                 fontsize=12, fontweight="bold")
    return fig


def per_layer_figure(f, arms: list[tuple[str, str]]) -> Figure:
    """Per layer: share of all values that is zero, below 2^-24 (outside FP16's range) and FP16-subnormal;
    one row per model, one column per tensor kind, the paper's reference figures as dashed lines."""
    fig = Figure(figsize=(13, 3.9 * len(arms)), layout="constrained")
    axes = fig.subplots(len(arms), 2, squeeze=False)
    bars = (("zero", "exactly zero", "0.45"),
            ("below_2^-24", "below $2^{-24}$: outside FP16's range", fg.FP16_COLOR),
            ("fp16_subnormal", "in $[2^{-24}, 2^{-14})$: FP16 subnormal", "#ff9896"))
    floor = 1e-6  # a log axis cannot show 0; zero shares are drawn as a stub at the floor and labelled "0"
    for row, (arm, model) in zip(axes, arms):
        for ax, kind in zip(row, KINDS):
            names, _, counts = layer_histograms(f, arm, kind)
            rows = per_layer(names, counts, ml.bins(f, arm))
            x = np.arange(len(rows))
            width = 0.8 / len(bars)
            for j, (key, label, color) in enumerate(bars):
                values = np.array([r[key] for _, r in rows])
                shown = np.where(values > 0, values, floor)
                ax.bar(x + (j - 1) * width, shown, width, color=color, label=label, edgecolor="k", lw=0.4)
                for xi, v in zip(x, values):
                    if v == 0:
                        ax.text(xi + (j - 1) * width, floor * 1.4, "0", ha="center", fontsize=7)
            if kind == "activation_grads":
                ax.axhline(PAPER["activation_grads_zero"]["value"], color="0.2", ls="--", lw=1.2,
                           label="paper: 67% of Multibox SSD's activation gradients zero")
            else:
                ax.axhline(PAPER["weight_grads_below_2^-24"]["value"], color=fg.FP16_COLOR, ls="--", lw=1.2,
                           label="paper: ~5% of a Mandarin speech model's weight gradients below $2^{-24}$")
            ax.set_yscale("log")
            ax.set_ylim(floor, 80)
            ax.set_xticks(x)
            ax.set_xticklabels([name for name, _ in rows], rotation=30, ha="right", fontsize=8)
            ax.set_ylabel("share of all values, all steps")
            ax.set_xlabel("layer (activation gradient of a layer = gradient w.r.t. its input; loss: d logits)"
                          if kind == "activation_grads" else "layer")
            ax.set_title(f"{model}: {KIND_TITLE[kind]} per layer (FP32 training)", fontsize=10)
            ax.grid(True, axis="y", which="major", alpha=0.3)
            ax.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.9)  # in the space above the bars
    fig.suptitle("What FP16 would make of FP32 training's gradients, per layer (a zero share is drawn as \"0\")",
                 fontsize=12)
    return fig


def headroom_figure(f, arms: list[tuple[str, str]]) -> Figure:
    """Per model and kind, over training: the top of the gradients (highest binade) and their low end
    (the binade below which 0.1% of nonzero values lie) against FP16's window; the gap between the top and
    FP16's max is the loss-scale headroom."""
    fig = Figure(figsize=(13, 4.2 * len(arms)), layout="constrained")
    axes = fig.subplots(len(arms), 2, squeeze=False, sharey=True)
    for row, (arm, model) in zip(axes, arms):
        for ax, kind in zip(row, KINDS):
            _, steps, counts = layer_histograms(f, arm, kind)
            bins = ml.bins(f, arm)
            summed = counts.sum(axis=1)
            top = ml.top_binade(summed, bins) + 1  # the largest value is below 2^(e_max+1)
            low = ml.binade_quantile(summed, bins, 0.001)  # 0.1% of the nonzero values lie below
            med = ml.binade_quantile(summed, bins, 0.5)
            ax.axhspan(fg.FP16_NORMAL_MIN_LOG2, fg.FP16_MAX_LOG2, color=fg.FP16_COLOR, alpha=0.07, lw=0,
                       label="FP16 normal $[2^{-14}, 65504]$")
            ax.axhspan(fg.FP16_SUBNORMAL_MIN_LOG2, fg.FP16_NORMAL_MIN_LOG2, color=fg.FP16_COLOR, alpha=0.2, lw=0,
                       label="FP16 subnormal $[2^{-24}, 2^{-14})$")
            ax.axhline(fg.FP16_MAX_LOG2, color=fg.FP16_COLOR, lw=1.4)
            ax.axhline(fg.FP16_SUBNORMAL_MIN_LOG2, color=fg.FP16_COLOR, lw=1.4)
            ax.plot(steps, top, color="k", lw=1.5, label="largest |gradient| (upper edge of its binade)")
            ax.plot(steps, med, color="0.4", lw=1.0, ls="-.", label="median nonzero |gradient|")
            ax.plot(steps, low, color="C0", lw=1.2, ls="--", label="0.1% of nonzero values lie below")
            h = headroom(summed, bins)
            if math.isfinite(h["headroom_binades"]):
                x = steps[len(steps) // 2] if len(steps) else 0
                e_top = h["largest_binade"] + 1
                ax.annotate("", xy=(x, fg.FP16_MAX_LOG2), xytext=(x, e_top),
                            arrowprops=dict(arrowstyle="<->", color="k", lw=1.2))
                ax.text(x, (fg.FP16_MAX_LOG2 + e_top) / 2, f"  headroom {h['headroom_binades']:.0f} binades\n"
                        f"  (loss scale up to $2^{{{h['headroom_binades']:.0f}}}$)", va="center", fontsize=8)
            bottom = min(fg.FP16_SUBNORMAL_MIN_LOG2 - 6, float(np.nanmin(low, initial=0)) - 2)
            ax.axhspan(bottom, fg.FP16_SUBNORMAL_MIN_LOG2, color="0.5", alpha=0.15, lw=0,
                       label="below $2^{-24}$: outside FP16's range")
            ax.set_ylim(bottom, 20)
            ax.text(0.99, fg.FP16_SUBNORMAL_MIN_LOG2 - 0.5, "below: outside FP16's range (zero under $2^{-25}$)",
                    ha="right", va="top", fontsize=8, color=fg.FP16_COLOR, transform=ax.get_yaxis_transform())
            ax.set_title(f"{model}: {KIND_TITLE[kind]}, all layers (FP32 training)", fontsize=10)
            ax.set_xlabel("step")
            ax.grid(True, alpha=0.3)
        row[0].set_ylabel("$\\log_2 |x|$")
        row[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Gradient range over training against FP16's window: the unused top is the loss-scale headroom",
                 fontsize=12)
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and underflow_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        arms = model_arms(f)
        figs = [(f"underflow_{kind}_{model.split()[0]}", histogram_figure(f, arm, kind, model))
                for arm, model in arms for kind in KINDS]
        figs += [("underflow_per_layer", per_layer_figure(f, arms)), ("underflow_headroom", headroom_figure(f, arms))]
        found = findings(f)
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "underflow_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "underflow.toml", write)


if __name__ == "__main__":
    sys.exit(main())
