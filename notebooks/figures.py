#!/usr/bin/python3
"""Figures from an `mpsim run` HDF5 log (docs/hdf5-schema.md).

As a module (the quickstart notebook uses it this way) every function takes the
log's path, or an h5py.File from `mpsim_log.open_log`, and returns a
matplotlib Figure; nothing here touches pyplot's global state, so the figures
display once in a notebook and can be saved with `fig.savefig(...)`:

    import figures
    fig = figures.activation_grad_heatmap("runs/default.h5", arm="fp32", layer="fc3")

As a script it writes PNGs beside the log (or into --out), named after the
log's stem, and prints their paths:

    /usr/bin/python3 notebooks/figures.py runs/default.h5 [--out DIR] [--arm ARM] [--layer NAME]

Figures:
  loss_accuracy           training loss per step and test accuracy per arm
  loss_scale              loss-scale trajectory per arm (log2 axis), skipped steps marked
  activation_grads_all    exponent histogram of all activation gradients over steps, with the
                          FP16 and BF16 ranges (Micikevicius et al. 2018, Figure 3)
  activation_grads_LAYER  the same for one layer (default: the input gradient of the output
                          layer, that is, the gradient of the last hidden layer's output)
  underflow               fraction of nonzero activation gradients rounded to zero
                          by the arm's rounding, and below 2^-24 before rounding (FP16's
                          smallest subnormal: outside its range), per arm (log axis)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tomllib
from pathlib import Path

if __name__ == "__main__":
    os.environ["MPLBACKEND"] = "Agg"  # files only; no display needed

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpsim_log as ml  # noqa: E402  (beside this file)

from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

# Representable ranges, as log2 of the magnitude. Bin e of a histogram holds
# 2^e <= |x| < 2^(e+1), so a line at y = e separates the bins below 2^e.
FP16_MAX_LOG2 = math.log2(65504.0)  # 15.9998: FP16's largest finite value
FP16_NORMAL_MIN_LOG2 = -14          # smallest normal
FP16_SUBNORMAL_MIN_LOG2 = -24       # smallest subnormal; smaller magnitudes are outside FP16's range: under
                                    # round-to-nearest-even those below 2^-25 become zero, those between round
                                    # up to 2^-24
BF16_NORMAL_MIN_LOG2 = -126
BF16_SUBNORMAL_MIN_LOG2 = -133

FP16_COLOR = "#d62728"
BF16_COLOR = "#1f77b4"


# --- reading -----------------------------------------------------------------


class _Log:
    """An open log: a path is opened (and closed on exit), an h5py.File is used as is."""

    def __init__(self, path):
        self.path = path
        self.owned = not hasattr(path, "attrs")

    def __enter__(self):
        self.f = ml.open_log(self.path) if self.owned else self.path
        return self.f

    def __exit__(self, *exc):
        if self.owned:
            self.f.close()


def ordered_arms(path) -> list[str]:
    """Arm names in the experiment's order (the config's `arms`, then backend, then seed)."""
    with _Log(path) as f:
        names = ml.arms(f)
        try:
            cfg = tomllib.loads(ml.config(f))
        except (KeyError, tomllib.TOMLDecodeError):
            return names
        policies = list(cfg.get("arms", []))
        backends = list(cfg.get("backends", []))
        seeds = list(cfg.get("seeds", []))

        def key(name):
            a = ml.arm_info(f, name)
            pos = lambda seq, v: seq.index(v) if v in seq else len(seq)  # noqa: E731
            return (pos(policies, a.get("policy")), pos(backends, a.get("backend")), pos(seeds, a.get("seed")), name)

        return sorted(names, key=key)


def default_arm(path) -> str:
    """The fp32 arm if there is one (its histograms show what FP16 would lose), else the first."""
    with _Log(path) as f:
        names = ordered_arms(f)
        for name in names:
            if ml.arm_info(f, name).get("policy") == "fp32" or name == "fp32":
                return name
        return names[0]


def default_layer(path, arm: str) -> str:
    """The output layer, whose activation gradient (with respect to its input) is the
    gradient of the last hidden layer's output; "loss" (the logits' gradient) is skipped."""
    with _Log(path) as f:
        names = ml.layers(f, arm)
        elements = ml.kind_counters(f, arm, "activation_grads", per_layer=True)["elements"]
        candidates = [i for i, n in enumerate(names) if n != "loss" and elements[i] > 0]
        if not candidates:
            candidates = [i for i, n in enumerate(names) if n != "loss"] or [len(names) - 1]
        return names[candidates[-1]]


def _histogram(f, arm: str, layer, kind: str):
    """(steps, counts[n, bins]); layer None or "all" sums every layer."""
    layer = None if layer == "all" else layer
    return ml.stats_steps(f, arm), ml.kind_histogram(f, arm, kind, layer=layer, per_step=True)


def _arm_label(f, arm: str) -> str:
    """The arm's name, with "(stopped)" or "(running)" when it did not complete."""
    status = ml.arm_info(f, arm).get("status", "completed")
    return arm if status == "completed" else f"{arm} ({status.split(':')[0]})"


def _scale_text(scale: float) -> str:
    e = math.log2(scale) if scale > 0 else float("nan")
    return f"$2^{{{int(e)}}}$" if e == int(e) else f"{scale:g}"


def _pow2_formatter():
    return FuncFormatter(lambda y, _: f"$2^{{{int(round(math.log2(y)))}}}$" if y > 0 else "0")


# --- figures -----------------------------------------------------------------


def loss_accuracy(path, arms=None, smooth: int | None = None) -> Figure:
    """Training loss per step (faint: every step; bold: running mean) and test accuracy per arm."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    nonfinite = False
    with _Log(path) as f:
        arms = arms or ordered_arms(f)
        for i, arm in enumerate(arms):
            color = f"C{i}"
            s = ml.steps(f, arm)
            step, loss = s["step"], s["loss"].astype(np.float64)
            finite = np.isfinite(loss)
            w = smooth or max(1, len(step) // 40)
            ax_loss.plot(step[finite], loss[finite], color=color, alpha=0.15 if w > 1 else 0.9, lw=0.8 if w > 1 else 1.2,
                         label=None if w > 1 else _arm_label(f, arm))
            if finite.sum() >= w > 1:
                kernel = np.ones(w) / w
                mean = np.convolve(loss[finite], kernel, mode="valid")
                ax_loss.plot(step[finite][w - 1:], mean, color=color, lw=2, label=_arm_label(f, arm))
            elif w > 1:
                ax_loss.plot([], [], color=color, lw=2, label=_arm_label(f, arm))
            if (~finite).any():
                nonfinite = True
                ax_loss.plot(step[~finite], np.full((~finite).sum(), 0.97), "x", color=color, ms=7,
                             transform=ax_loss.get_xaxis_transform())
            e = ml.evals(f, arm)
            if len(e["step"]):
                ax_acc.plot(e["step"], 100 * np.asarray(e["test_accuracy"]), "o-", color=color,
                            label=f"{arm}: {100 * e['test_accuracy'][-1]:.2f}%")
    if nonfinite:
        ax_loss.plot([], [], "kx", ms=7, label="non-finite loss (at the top edge)")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (cross-entropy)")
    ax_loss.set_title("Training loss (faint: each step; bold: running mean)")
    ax_loss.grid(True, which="both", alpha=0.3)
    ax_loss.legend()
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("test accuracy (%)")
    ax_acc.set_title("Test accuracy at each evaluation")
    ax_acc.grid(True, alpha=0.3)
    ax_acc.legend(title="final")
    return fig


def loss_scale(path, arms=None) -> Figure:
    """Loss scale per step (log2 axis); steps that were skipped (non-finite gradients) are marked x."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax = fig.subplots()
    flat = []
    any_skipped = False
    with _Log(path) as f:
        arms = arms or ordered_arms(f)
        for i, arm in enumerate(arms):
            s = ml.steps(f, arm)
            step, scale, skipped = s["step"], s["loss_scale"].astype(np.float64), s["skipped"]
            if len(arms) > 1 and np.all(scale == 1.0) and not skipped.any():
                flat.append(arm)  # no loss scaling: drawn once below, not on top of each other
                continue
            ax.step(step, scale, where="post", color=f"C{i}", lw=1.8,
                    label=f"{_arm_label(f, arm)}: {int(skipped.sum())} skipped")
            if skipped.any():
                any_skipped = True
                ax.plot(step[skipped], scale[skipped], "x", color=f"C{i}", ms=8, mew=2)
        if flat:
            ax.axhline(1.0, color="0.5", lw=1.2, ls="--", label="scale 1 (no loss scaling): " + ", ".join(flat))
    if any_skipped:
        ax.plot([], [], "kx", ms=8, mew=2, label="skipped step (non-finite gradients; scale backs off)")
    ax.set_yscale("log", base=2)
    lines = [ln.get_ydata() for ln in ax.get_lines()]
    values = np.concatenate([np.asarray(v, dtype=np.float64) for v in lines if len(v)] or [np.ones(1)])
    values = values[np.isfinite(values) & (values > 0)]
    lo = math.floor(math.log2(values.min())) if values.size else 0
    hi = math.ceil(math.log2(values.max())) if values.size else 0
    lo, hi = min(lo, (lo + hi) // 2 - 3), max(hi, (lo + hi) // 2 + 3)  # some context around a flat line
    every = max(1, math.ceil((hi - lo + 2) / 12))
    ax.set_yticks([2.0 ** e for e in range(math.floor((lo - 1) / every) * every, hi + 2, every)])
    ax.yaxis.set_major_formatter(_pow2_formatter())
    ax.set_ylim(2.0 ** (lo - 1), 2.0 ** (hi + 1))
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.set_title("Loss scale (the loss and so every gradient is multiplied by it in the backward pass)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best")
    return fig


def activation_grad_heatmap(path, arm: str | None = None, layer: str | None = None,
                            kind: str = "activation_grads", ylim: tuple[float, float] | None = None) -> Figure:
    """Exponent histogram of one tensor kind over steps, with FP16's and BF16's ranges.

    x: step; y: binade exponent e (the bin holds 2^e <= |x| < 2^(e+1)); colour: the
    fraction of all the kind's elements at that step in the bin (log scale). The
    panel on the right is the histogram over all instrumented steps. When the
    values stay well above BF16's smallest numbers, the empty stretch of the y
    axis is cut out and BF16's lower limits are drawn in a strip below.

    layer: a layer name, or "all" (every layer summed, as in Micikevicius et al.
    2018, Figure 3), or None for `default_layer` (the last hidden layer's output
    gradient). Values are binned BEFORE rounding, so the fp32 arm shows what an
    FP16 tensor would lose; an arm with a loss scaler shows the scaled values.
    ylim: (low, high) exponents for one unbroken axis.
    """
    with _Log(path) as f:
        arm = arm or default_arm(f)
        if layer is None:
            layer = default_layer(f, arm)
        steps, counts = _histogram(f, arm, layer, kind)
        bins = ml.bins(f, arm)
        scales = ml.steps(f, arm)
        scale_at = dict(zip(scales["step"].tolist(), scales["loss_scale"].tolist()))
    where = "all layers" if layer == "all" else f"layer {layer}"
    title = f"{kind} exponents, arm {arm}, {where} (binned before rounding)"
    if len(steps) == 0:
        fig = Figure(figsize=(8, 3), layout="constrained")
        ax = fig.subplots()
        ax.text(0.5, 0.5, "no instrumented steps in this arm", ha="center", transform=ax.transAxes)
        ax.set_title(title)
        return fig

    frac = ml.binade_shares(counts, bins, "all")  # [step, binade]: of the step's values, zeros included
    exps = bins.exponents
    used = np.nonzero(counts[:, bins.finite].sum(axis=0))[0]
    data_lo = int(exps[used[0]]) if len(used) else FP16_SUBNORMAL_MIN_LOG2
    data_hi = int(exps[used[-1]]) + 1 if len(used) else 16

    # One axis, or two with the empty middle cut out: main (data and FP16) above, BF16's limits below.
    if ylim is not None:
        ranges = [tuple(ylim)]
    else:
        top = max(20, data_hi + 3)
        main_lo = min(data_lo, FP16_SUBNORMAL_MIN_LOG2) - 6
        if main_lo > BF16_NORMAL_MIN_LOG2 + 12:
            ranges = [(main_lo, top), (BF16_SUBNORMAL_MIN_LOG2 - 4, BF16_NORMAL_MIN_LOG2 + 5)]
        else:
            ranges = [(min(data_lo - 2, BF16_SUBNORMAL_MIN_LOG2 - 4), top)]
    heights = [r[1] - r[0] for r in ranges]
    if len(ranges) == 2:
        heights[1] = max(heights[1], heights[0] * 0.22)

    fig = Figure(figsize=(12, 7), layout="constrained")
    grid = fig.add_gridspec(len(ranges), 2, width_ratios=[4, 1.2], height_ratios=heights, hspace=0.02)
    rows = []
    for r in range(len(ranges)):
        ax = fig.add_subplot(grid[r, 0], sharex=rows[0][0] if rows else None)
        side = fig.add_subplot(grid[r, 1], sharey=ax, sharex=rows[0][1] if rows else None)
        rows.append((ax, side))

    if len(steps) > 1:  # column edges halfway between instrumented steps
        mids = (steps[1:] + steps[:-1]) / 2.0
        xedges = np.concatenate([[steps[0] - (mids[0] - steps[0])], mids, [steps[-1] + (steps[-1] - mids[-1])]])
    else:
        xedges = np.array([steps[0] - 0.5, steps[0] + 0.5])
    yedges = bins.edges
    positive = frac[frac > 0]
    norm = LogNorm(vmin=max(positive.min(), 1e-8) if positive.size else 1e-8, vmax=1.0)
    masked = np.ma.masked_less_equal(frac.T, 0)
    overall = ml.binade_shares(counts.sum(axis=0), bins, "all")
    nz = overall > 0

    lines = [
        (FP16_MAX_LOG2, FP16_COLOR, "-", "FP16 max 65504 ($\\approx 2^{16}$); above: overflow to inf"),
        (FP16_NORMAL_MIN_LOG2, FP16_COLOR, "--", "FP16 normal min $2^{-14}$; below: subnormal, fewer bits"),
        (FP16_SUBNORMAL_MIN_LOG2, FP16_COLOR, "-",
         "FP16 subnormal min $2^{-24}$; below: outside FP16's range (zero under $2^{-25}$)"),
        (BF16_NORMAL_MIN_LOG2, BF16_COLOR, "--", "BF16 normal min $2^{-126}$ (BF16 max $\\approx 2^{128}$)"),
        (BF16_SUBNORMAL_MIN_LOG2, BF16_COLOR, "-",
         "BF16 subnormal min $2^{-133}$; below: outside BF16's range (zero under $2^{-134}$)"),
    ]
    mesh = None
    for (ax, side), (lo, hi) in zip(rows, ranges):
        mesh = ax.pcolormesh(xedges, yedges, masked, cmap="viridis", norm=norm, shading="flat", rasterized=True)
        ax.set_facecolor("0.94")
        if nz.any():
            side.barh(exps[nz], overall[nz], height=1.0, align="edge", color="0.2")
        side.axhspan(FP16_NORMAL_MIN_LOG2, FP16_MAX_LOG2, color=FP16_COLOR, alpha=0.07, lw=0)
        side.axhspan(FP16_SUBNORMAL_MIN_LOG2, FP16_NORMAL_MIN_LOG2, color=FP16_COLOR, alpha=0.2, lw=0)
        side.axhspan(BF16_SUBNORMAL_MIN_LOG2, FP16_SUBNORMAL_MIN_LOG2, color=BF16_COLOR, alpha=0.07, lw=0)
        for y, color, ls, label in lines:
            if lo <= y <= hi:
                for a in (ax, side):
                    a.axhline(y, color=color, ls=ls, lw=1.4)
                ax.text(0.005, y + 0.25, label, transform=ax.get_yaxis_transform(), color=color, fontsize=8,
                        va="bottom", ha="left", bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.75))
        ax.set_ylim(lo, hi)
        step_y = 5 if hi - lo <= 80 else 10
        ax.set_yticks(np.arange(math.ceil(lo / step_y) * step_y, hi + 1, step_y))
        ax.grid(True, axis="y", alpha=0.2)
        side.set_xscale("log")
        side.tick_params(labelleft=False)
    side_lo = max(overall[nz].min() / 3, 1e-10) if nz.any() else 1e-8
    rows[0][1].set_xlim(side_lo, 1.5)
    for y, text in ((FP16_NORMAL_MIN_LOG2 + 1, "FP16\nnormal"), (FP16_SUBNORMAL_MIN_LOG2 + 0.5, "FP16\nsubnormal"),
                    (FP16_SUBNORMAL_MIN_LOG2 - 1.5, "below FP16's range;\nBF16 holds")):
        if ranges[0][0] <= y <= ranges[0][1]:
            rows[0][1].text(0.97, y, text, transform=rows[0][1].get_yaxis_transform(), ha="right",
                            va="bottom" if y > FP16_SUBNORMAL_MIN_LOG2 else "top", fontsize=7.5, color="0.2",
                            bbox=dict(boxstyle="square,pad=0.15", fc="white", ec="none", alpha=0.8))

    if len(rows) == 2:  # the cut between the two axes
        (a0, s0), (a1, s1) = rows
        for top_ax, bottom_ax in ((a0, a1), (s0, s1)):
            top_ax.spines["bottom"].set_visible(False)
            bottom_ax.spines["top"].set_visible(False)
            top_ax.tick_params(labelbottom=False, bottom=False)
            kw = dict(marker=[(-1, -0.5), (1, 0.5)], markersize=10, linestyle="none", color="k", mec="k",
                      mew=1, clip_on=False)
            top_ax.plot([0, 1], [0, 0], transform=top_ax.transAxes, **kw)
            bottom_ax.plot([0, 1], [1, 1], transform=bottom_ax.transAxes, **kw)
    rows[-1][0].set_xlabel("step")
    rows[-1][1].set_xlabel("fraction, all steps")
    fig.supylabel("binade exponent e  ($2^e \\leq |x| < 2^{e+1}$)", fontsize=10)
    cbar = fig.colorbar(mesh, ax=[r[1] for r in rows], location="right", pad=0.02, aspect=40)
    cbar.set_label("fraction of the step's elements in the binade")

    share = lambda sel: 100 * overall[sel].sum()  # noqa: E731
    total = max(ml.histogram_total(counts, bins, "all").sum(), 1)
    zeros = 100 * counts[:, bins.special("zero")].sum() / total
    nonfinite = 100 * counts[:, bins.special("infinity", "nan")].sum() / total
    summary = (f"all steps, of all values: {share(exps < FP16_SUBNORMAL_MIN_LOG2):.3g}% below $2^{{-24}}$ "
               f"(outside FP16's range), "
               f"{share((exps >= FP16_SUBNORMAL_MIN_LOG2) & (exps < FP16_NORMAL_MIN_LOG2)):.3g}% FP16 subnormal, "
               f"{share(exps >= 16):.3g}% above FP16 max, {share(exps < BF16_SUBNORMAL_MIN_LOG2):.3g}% below BF16's min, "
               f"{zeros:.3g}% exact zeros (not drawn)" + (f", {nonfinite:.3g}% inf/NaN" if nonfinite else ""))
    scaled = sorted({s for s in (scale_at.get(int(t)) for t in steps) if s is not None and s != 1.0})
    if scaled:
        summary += (f"\nvalues include the loss scale ({_scale_text(scaled[0])}"
                    + (f" to {_scale_text(scaled[-1])}" if len(scaled) > 1 else "")
                    + "): divide by it for the true gradients")
    rows[0][0].set_title(title + "\n" + summary, fontsize=9.5, loc="left")
    return fig


def underflow(path, arms=None, kind: str = "activation_grads") -> Figure:
    """Per arm and instrumented step, summed over layers: rounded_to_zero / nonzero (nonzero values that the arm's
    rounding made zero; 0 in an fp32 arm) and below_2^-24 / nonzero (values below FP16's smallest subnormal
    before rounding, whatever the arm: outside FP16's range; under round-to-nearest-even those below 2^-25
    become zero and those between round up to 2^-24)."""
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    ax_f, ax_b = fig.subplots(1, 2, sharey=True)
    with _Log(path) as f:
        arms = arms or ordered_arms(f)
        for i, arm in enumerate(arms):
            per_step = ml.kind_counters(f, arm, kind, per_step=True)
            totals = ml.kind_counters(f, arm, kind)
            steps = per_step["step"]
            for ax, counter in zip((ax_f, ax_b), ("rounded_to_zero", "below_2^-24")):
                rate = ml.fraction(per_step, counter, "nonzero")
                overall = ml.fraction(totals, counter, "nonzero", empty=0.0)
                shown = np.where(rate > 0, rate, np.nan)
                label = f"{arm}: {100 * overall:.3g}% overall" if overall > 0 else f"{arm}: none"
                ax.plot(steps, shown, ".-", color=f"C{i}", lw=1, ms=3, label=label)
    ax_f.set_yscale("log")
    for ax in (ax_f, ax_b):
        ax.set_xlabel("step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_f.set_ylabel(f"fraction of nonzero {kind}")
    ax_f.set_title("Rounded to zero by the arm's rounding")
    ax_b.set_title("Below $2^{-24}$ before rounding (outside FP16's range)")
    fig.suptitle(f"Underflow of {kind}, summed over layers (steps with none are gaps on the log axis)", fontsize=11)
    return fig


# --- script ------------------------------------------------------------------


def save_study(out_dir, figs, findings: dict, findings_name: str, dpi: int = 110) -> list[Path]:
    """How every study module writes its outputs: each (stem, Figure) of figs as
    OUT_DIR/stem.png, then findings as the JSON file OUT_DIR/findings_name (NaN
    kept). Returns the paths in that order. Closing pyplot figures is the caller's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, fig in figs:
        written.append(out / f"{stem}.png")
        fig.savefig(written[-1], dpi=dpi)
    written.append(out / findings_name)
    written[-1].write_text(json.dumps(findings, indent=2, allow_nan=True) + "\n")
    return written


def study_main(argv, description: str, config: str, write, add_arguments=None) -> int:
    """The command line every study module shares: `STUDY.py LOG [--out DIR]`.
    write(args) writes the figures and findings and returns (paths, verdict
    text); the paths and the verdict are printed. A log that cannot be read
    gives a message naming it and exit status 1. add_arguments(parser) adds a
    module's own options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("log", help=f"HDF5 log of `mpsim run experiments/configs/{config}`")
    parser.add_argument("--out", default="docs/figures", help="directory for the PNGs and the findings JSON")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        paths, text = write(args)
    except (OSError, KeyError, ValueError) as e:
        print(f"{parser.prog}: {args.log}: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    print(text)
    return 0


def write_all(path, out_dir=None, arm=None, layer=None, dpi: int = 120) -> list[Path]:
    """Writes every figure as a PNG; returns the paths."""
    path = Path(path)
    out = Path(out_dir) if out_dir else path.parent
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with ml.open_log(path) as f:
        arm = arm or default_arm(f)
        layer = layer or default_layer(f, arm)
        figs = [
            ("loss_accuracy", loss_accuracy(f)),
            ("loss_scale", loss_scale(f)),
            ("activation_grads_all", activation_grad_heatmap(f, arm=arm, layer="all")),
            (f"activation_grads_{layer}", activation_grad_heatmap(f, arm=arm, layer=layer)),
            ("underflow", underflow(f)),
        ]
    for name, fig in figs:
        p = out / f"{path.stem}_{name}.png"
        fig.savefig(p, dpi=dpi)
        written.append(p)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Figures from an mpsim run log (PNG files).")
    parser.add_argument("log", help="HDF5 log written by `mpsim run`")
    parser.add_argument("--out", help="directory for the PNGs (default: beside the log)")
    parser.add_argument("--arm", help="arm for the histogram heatmaps (default: fp32 if present, else the first)")
    parser.add_argument("--layer", help="layer for the second heatmap (default: the last hidden layer's output "
                                        "gradient, i.e. the output layer's input gradient)")
    parser.add_argument("--dpi", type=int, default=120)
    args = parser.parse_args(argv)
    try:
        paths = write_all(args.log, args.out, args.arm, args.layer, args.dpi)
    except (OSError, KeyError, ValueError) as e:
        print(f"figures.py: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
