#!/usr/bin/python3
"""Loss-scale study and gradient range offset (issue #6, §1b).

Micikevicius et al., "Mixed Precision Training", ICLR 2018 (arXiv:1710.03740), scale the loss by S so that
every gradient of the backward pass is multiplied by S: the gradient histogram moves up by log2(S) binades
("gradients range offset"), up out of the region below 2^-24 that lies outside FP16's range (under
round-to-nearest-even those below 2^-25 become zero and those between round up to 2^-24), and, when S is too
large, past FP16's maximum 65504, where a scaler must skip the step. This module reads the log of
`mpsim run experiments/configs/loss_scale.toml` (fp16-mixed with static scales and a dynamic scaler, and an
fp32 reference) and puts accuracy, underflow and overflow/skips against the scale, and the shifted
histograms against FP16's window.

    /usr/bin/python3 notebooks/loss_scale.py runs/loss_scale.h5 [--out docs/figures]

writes loss_scale_*.png and loss_scale_findings.json into --out and prints the verdict. Arms are recognised by
their policy's loss scaling as the log stores it (`mpsim_log.policy`), so arms named by a sweep
(`fp16-mixed@initial=8`) work too.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402  (beside this file)
import figures as fg  # noqa: E402  (FP16 constants, loss and loss-scale figures)
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

KINDS = ("activation_grads", "weight_grads")
KIND_TITLE = {"activation_grads": "activation gradients", "weight_grads": "weight gradients"}
# The parity margin, in points of test accuracy: with several seeds, TOST's equivalence margin (as parity.py's);
# with one seed, a judgement (about the spread of one seed's final accuracy on Fashion-MNIST), not a test.
PARITY_POINTS = 0.5

PAPER = {
    "source": "Micikevicius et al., Mixed Precision Training, ICLR 2018 (arXiv:1710.03740)",
    "note": "issue #6 quotes no numbers of the paper for this study; the comparison is with its method: "
            "scaling by S shifts the gradient histogram by log2(S) binades into FP16's range",
}


# --- reading -------------------------------------------------------------------------------------------------


def arm_table(f) -> list[dict]:
    """One dict per arm: name, label, mode ("none", "static", "dynamic"), initial scale, log2 of it,
    policy, status; ordered fp32 (and other unscaled arms), static by scale, dynamic."""
    rows = []
    for arm in ml.arms(f):
        info = ml.arm_info(f, arm)
        scaling = ml.policy(f, arm)["loss_scale"]
        mode = scaling["mode"]
        initial = scaling["initial"] if mode != "none" else 1.0
        if mode == "static":
            label = f"S=2^{math.log2(initial):g}" if math.log2(initial).is_integer() else f"S={initial:g}"
        elif mode == "dynamic":
            label = "dynamic"
        else:
            label = info.get("policy", arm)
        seed = int(info.get("seed", 0))
        base = arm.split("@")[0].removesuffix(f".seed{seed}")  # a run of several seeds names them
        if base not in (label, info.get("policy")):
            label = f"{label} ({base})"
        rows.append({"arm": arm, "label": label, "mode": mode, "initial_scale": initial,
                     "log2_initial_scale": math.log2(initial), "policy": info.get("policy", ""),
                     "seed": seed, "status": info.get("status", "")})
    order = {"none": 0, "static": 1, "dynamic": 2}
    return sorted(rows, key=lambda r: (r["seed"], order.get(r["mode"], 3), r["initial_scale"], r["arm"]))


def reference_arm(rows: list[dict]) -> str | None:
    """The fp32 arm (the accuracy and histogram reference), if the log has one."""
    for r in rows:
        if r["policy"] == "fp32" or r["arm"] == "fp32":
            return r["arm"]
    return None


def kind_histogram(f, arm: str, kind: str) -> np.ndarray:
    """Counts of one tensor kind, summed over layers and instrumented steps (binned before rounding,
    so an arm with a loss scale shows the scaled values)."""
    return ml.kind_histogram(f, arm, kind)


# --- computing -----------------------------------------------------------------------------------------------


def median_binade(counts: np.ndarray, bins: ml.Bins) -> float:
    """Exponent of the binade holding the median nonzero finite magnitude (NaN when there is none)."""
    return float(ml.binade_quantile(counts, bins, 0.5))


def arm_numbers(f, row: dict, ref_hist: dict | None) -> dict:
    """Accuracy, underflow and overflow numbers of one arm."""
    arm = row["arm"]
    s = ml.steps(f, arm)
    e = ml.evals(f, arm)
    n = dict(row)
    n["steps"] = int(s["step"].size)
    n["skipped_steps"] = int(s["skipped"].sum())
    n["found_inf_steps"] = int(s["found_inf"].sum())
    scale = s["loss_scale"].astype(np.float64)
    n["final_scale"] = float(scale[-1]) if scale.size else float("nan")
    n["median_scale"] = float(np.median(scale)) if scale.size else float("nan")
    n["min_scale"] = float(scale.min()) if scale.size else float("nan")
    n["test_accuracy"] = float(e["test_accuracy"][-1]) if len(e["step"]) else float("nan")
    n["test_loss"] = float(e["test_loss"][-1]) if len(e["step"]) else float("nan")
    bins = ml.bins(f, arm)
    for kind in KINDS:
        counters = ml.kind_counters(f, arm, kind)
        hist = kind_histogram(f, arm, kind)
        below = hist[bins.select(hi=fg.FP16_SUBNORMAL_MIN_LOG2)].sum()
        n[kind] = {
            # `rounded_to_zero`: nonzero values the arm's rounding made zero (0 in an fp32 arm, which rounds nothing).
            "rounded_to_zero_of_nonzero": ml.fraction(counters, "rounded_to_zero", "nonzero"),
            # below 2^-24 before rounding, scale included: outside FP16's range, whatever the arm's format.
            # Of the values the counter `nonzero` counts, as `rounded_to_zero_of_nonzero`.
            "below_2^-24_of_nonzero": ml.ratio(below, counters["nonzero"]),
            "overflow_values": counters["overflow"],
            "median_binade": median_binade(hist, bins),
        }
        ref = ref_hist.get(kind) if ref_hist else None
        n[kind]["median_shift_vs_fp32"] = (n[kind]["median_binade"] - median_binade(ref, bins)
                                           if ref is not None else float("nan"))
    return n


def findings(f) -> dict:
    """Every arm's numbers, the fp32 reference and the scales that keep parity, for the README's table. With
    several seeds, `arms` are the first seed's (the figures and the per-arm lines) and `over_seeds` has each
    scale's numbers per seed with its accuracy tested against fp32 of the same seed (TOST within
    PARITY_POINTS, notebooks/equivalence.py); parity is then TOST's verdict, not a judgement."""
    rows = arm_table(f)
    seeds = sorted({r["seed"] for r in rows})
    every = []
    for seed in seeds:
        mine = [r for r in rows if r["seed"] == seed]
        ref = reference_arm(mine)
        ref_hist = {k: kind_histogram(f, ref, k) for k in KINDS} if ref else None
        arms = [arm_numbers(f, r, ref_hist) for r in mine]
        ref_acc = next((a["test_accuracy"] for a in arms if a["arm"] == ref), float("nan"))
        for a in arms:
            a["accuracy_minus_fp32_points"] = 100 * (a["test_accuracy"] - ref_acc)
        every.append((seed, ref, ref_acc, arms))
    _, ref, ref_acc, arms = every[0]
    over_seeds = []
    for a in arms:
        runs = [next(b for b in arms_s if b["label"] == a["label"]) for _, _, _, arms_s in every]
        row = {"label": a["label"], "mode": a["mode"], "seeds": seeds,
               "test_accuracy": [b["test_accuracy"] for b in runs],
               "accuracy_minus_fp32_points": [b["accuracy_minus_fp32_points"] for b in runs],
               "skipped_steps": [b["skipped_steps"] for b in runs],
               **{f"{kind}_rounded_to_zero_of_nonzero": [b[kind]["rounded_to_zero_of_nonzero"] for b in runs]
                  for kind in KINDS}}
        if a["mode"] != "none" and len(seeds) >= 2:
            row["equivalence"] = equivalence.paired_equivalence(
                [d / 100 for d in row["accuracy_minus_fp32_points"]], PARITY_POINTS / 100)
        over_seeds.append(row)
    scaled = [a for a in arms if a["mode"] != "none"]
    if len(seeds) >= 2:
        parity = [r["label"] for r in over_seeds if r.get("equivalence", {}).get("equivalent")]
    else:
        parity = [a["label"] for a in scaled if abs(a["accuracy_minus_fp32_points"]) <= PARITY_POINTS]
    return {"study": "loss_scale", "paper": PAPER, "reference_arm": ref, "fp32_test_accuracy": ref_acc,
            "parity_points": PARITY_POINTS, "scales_at_parity": parity, "arms": arms, "seeds": seeds,
            "over_seeds": over_seeds}


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else ("0%" if x == 0 else f"{100 * x:.3g}%")


def verdict(found: dict) -> str:
    """One line per arm with its numbers, then the conclusion."""
    lines = [f"fp32 reference ({found['reference_arm']}): test accuracy {_pct(found['fp32_test_accuracy'])}"]
    for a in found["arms"]:
        if a["mode"] == "none":
            continue
        act, wg = a["activation_grads"], a["weight_grads"]
        scale = ""
        if a["mode"] == "dynamic":
            lo, end = math.log2(a["min_scale"]), math.log2(a["final_scale"])
            scale = f"; scale stayed 2^{end:g}" if lo == end else f"; scale fell to 2^{lo:g}, ended at 2^{end:g}"
        lines.append(
            f"{a['label']:<10} acc {_pct(a['test_accuracy']):>7} ({a['accuracy_minus_fp32_points']:+.2f} pt vs fp32); "
            f"rounded to zero: act. grads {_pct(act['rounded_to_zero_of_nonzero'])}, weight grads "
            f"{_pct(wg['rounded_to_zero_of_nonzero'])} of nonzero; "
            f"overflowed values {act['overflow_values'] + wg['overflow_values']}; "
            f"skipped {a['skipped_steps']}/{a['steps']} steps; act.-grad histogram shifted "
            f"{act['median_shift_vs_fp32']:+.0f} binades vs fp32 (log2 S = {a['log2_initial_scale']:g}){scale}")
    parity = found["scales_at_parity"]
    if len(found["seeds"]) >= 2:
        lines.append(f"Over seeds {found['seeds']}, test accuracy against fp32 of the same seed (TOST within "
                     f"±{found['parity_points']} points), and the activation gradients rounded to zero per seed:")
        for r in found["over_seeds"]:
            if "equivalence" in r:
                lines.append(f"  {r['label']:<10} " + equivalence.describe(r["equivalence"])
                             + "; act. grads rounded to zero "
                             + ", ".join(_pct(x) for x in r["activation_grads_rounded_to_zero_of_nonzero"])
                             + f"; skipped {r['skipped_steps']}")
        lines.append(f"Equivalent to fp32 within {found['parity_points']} points (TOST): "
                     f"{', '.join(parity) if parity else 'none'}.")
    else:
        lines.append(f"Within {found['parity_points']} points of fp32 (one seed: a judgement, not a test): "
                     f"{', '.join(parity) if parity else 'none'}.")
    statics = [a for a in found["arms"] if a["mode"] == "static"]
    clean = [a for a in statics if a["skipped_steps"] == 0]
    if len(clean) >= 2:
        lo, hi = clean[0], clean[-1]
        lines.append(f"Without overflow, raising S from {lo['label'][2:]} to {hi['label'][2:]} cuts the activation "
                     f"gradients rounded to zero from {_pct(lo['activation_grads']['rounded_to_zero_of_nonzero'])} to "
                     f"{_pct(hi['activation_grads']['rounded_to_zero_of_nonzero'])} of nonzero values.")
    for a in statics:
        if a["skipped_steps"]:
            frozen = a["skipped_steps"] == a["steps"]
            lines.append(f"{a['label'][2:]} overflows: {a['skipped_steps']}/{a['steps']} steps skipped; "
                         "a static scaler "
                         f"never backs off, so the weights {'never moved' if frozen else 'moved less'} "
                         f"(test accuracy {_pct(a['test_accuracy'])}"
                         + ("; its histogram is the untrained net's, hence a shift unlike log2 S)." if frozen
                            else ")."))
    return "\n".join(lines)


# --- figures -------------------------------------------------------------------------------------------------


def _x_positions(arms: list[dict]) -> tuple[list[dict], list[float], float]:
    """(scaled arms, x = log2 of their scale, x of the dynamic arm): the dynamic arm sits right of the
    largest static scale, 3 binades apart, as its own category."""
    scaled = [a for a in arms if a["mode"] != "none"]
    statics = [a["log2_initial_scale"] for a in scaled if a["mode"] == "static"]
    dyn_x = (max(statics) if statics else 16) + 3
    xs = [a["log2_initial_scale"] if a["mode"] == "static" else dyn_x for a in scaled]
    return scaled, xs, dyn_x


def summary_figure(found: dict) -> Figure:
    """Three panels against the loss scale: final test accuracy, share of nonzero gradients rounded to
    zero, and steps skipped for overflow. Static scales on a log2 axis; the dynamic scaler on the right."""
    scaled, xs, dyn_x = _x_positions(found["arms"])
    fig = Figure(figsize=(15, 4.4), layout="constrained")
    ax_acc, ax_uf, ax_of = fig.subplots(1, 3, sharex=True)
    static = [i for i, a in enumerate(scaled) if a["mode"] == "static"]
    dynamic = [i for i, a in enumerate(scaled) if a["mode"] == "dynamic"]

    def draw(ax, values, color, label, marker="o"):
        v = np.asarray(values, dtype=np.float64)
        ax.plot([xs[i] for i in static], v[static], marker + "-", color=color, label=label)
        ax.plot([xs[i] for i in dynamic], v[dynamic], "*", color=color, ms=14)

    draw(ax_acc, [100 * a["test_accuracy"] for a in scaled], "C0", "fp16-mixed")
    if math.isfinite(found["fp32_test_accuracy"]):
        ref = 100 * found["fp32_test_accuracy"]
        ax_acc.axhline(ref, color="k", ls="--", lw=1, label=f"fp32: {ref:.2f}%")
        ax_acc.axhspan(ref - found["parity_points"], ref + found["parity_points"], color="k", alpha=0.08, lw=0,
                       label=f"fp32 $\\pm${found['parity_points']} points")
    ax_acc.set_ylabel("final test accuracy (%)")
    ax_acc.set_title("Accuracy against the loss scale")

    floor = 1e-7  # a log axis cannot show 0: zero shares are drawn at the floor
    for kind, color in (("activation_grads", "C3"), ("weight_grads", "C1")):
        shares = [a[kind]["rounded_to_zero_of_nonzero"] for a in scaled]
        draw(ax_uf, [max(s, floor) for s in shares], color, KIND_TITLE[kind])
    ax_uf.set_yscale("log")
    ax_uf.set_ylim(floor / 2, 1)
    ax_uf.axhline(floor, color="0.6", lw=0.8, ls=":")
    ax_uf.text(0.01, floor * 1.3, "zero (none rounded to zero)", transform=ax_uf.get_yaxis_transform(), fontsize=7,
               color="0.4")
    ax_uf.set_ylabel("share of nonzero gradients rounded to zero")
    ax_uf.set_title("Underflow: nonzero gradients rounded to zero")

    draw(ax_of, [100 * a["skipped_steps"] / max(a["steps"], 1) for a in scaled], "C4", "steps skipped (overflow)")
    ax_of.set_ylabel("steps skipped for inf/NaN gradients (%)")
    ax_of.set_ylim(-5, 105)
    ax_of.set_title("Overflow: skipped steps")
    for a, x in zip(scaled, xs):
        total = a["activation_grads"]["overflow_values"] + a["weight_grads"]["overflow_values"]
        if total:
            ax_of.annotate(f"{total} values\noverflowed", (x, 100 * a["skipped_steps"] / max(a["steps"], 1)),
                           textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)

    statics = sorted({xs[i] for i in static})
    for ax in (ax_acc, ax_uf, ax_of):
        ax.set_xticks(statics + ([dyn_x] if dynamic else []))
        ax.set_xticklabels([f"$2^{{{x:g}}}$" for x in statics] + (["dynamic\n(star)"] if dynamic else []))
        ax.set_xlabel("loss scale S (static, log2 axis)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("fp16-mixed: what the loss scale does to accuracy, underflow and overflow", fontsize=12)
    return fig


def _tex_label(label: str) -> str:
    """"S=2^20" as mathtext, other labels as they are."""
    if label.startswith("S=2^"):
        head, _, rest = label[4:].partition(" ")
        return f"$S=2^{{{head}}}$" + (f" {rest}" if rest else "")
    return label


def range_offset_figure(f, found: dict, kind: str = "activation_grads") -> Figure:
    """The "gradients range offset": one ridge per arm with the histogram of one gradient kind (all layers,
    all instrumented steps, scale included) against FP16's window; the dashed outline is the fp32 arm's
    histogram moved up by log2(S), the shift the scale should cause."""
    arms = found["arms"]
    ref = found["reference_arm"]
    ref_counts = kind_histogram(f, ref, kind) if ref else None
    fig = Figure(figsize=(12, 0.95 * len(arms) + 1.8), layout="constrained")
    ax = fig.subplots()
    lo, hi = -50, 24
    ax.axvspan(lo, fg.FP16_SUBNORMAL_MIN_LOG2, color="0.5", alpha=0.18, lw=0,
               label="below $2^{-24}$: outside FP16's range")
    ax.axvspan(fg.FP16_SUBNORMAL_MIN_LOG2, fg.FP16_NORMAL_MIN_LOG2, color=fg.FP16_COLOR, alpha=0.22, lw=0,
               label="FP16 subnormal $[2^{-24}, 2^{-14})$")
    ax.axvspan(fg.FP16_NORMAL_MIN_LOG2, fg.FP16_MAX_LOG2, color=fg.FP16_COLOR, alpha=0.07, lw=0,
               label="FP16 normal $[2^{-14}, 65504]$")
    ax.axvspan(fg.FP16_MAX_LOG2, hi, color="C4", alpha=0.15, lw=0, label="above 65504: overflow to inf")
    bins = ml.bins(f)
    edges = bins.edges
    labels = []
    for i, a in enumerate(arms):
        counts = kind_histogram(f, a["arm"], kind)
        share = ml.binade_shares(counts, bins, "all")
        height = share / share.max() * 0.85 if share.max() > 0 else share
        ax.stairs(height + i, edges, baseline=i, fill=True, color=f"C{i % 10}", alpha=0.55)
        if ref_counts is not None and a["mode"] != "none":
            ref_share = ml.binade_shares(ref_counts, bins, "all")
            ref_height = ref_share / ref_share.max() * 0.85 if ref_share.max() > 0 else ref_share
            used = np.nonzero(ref_share)[0]
            if used.size:  # only the occupied stretch, else a dashed line runs along every ridge's base
                cut = slice(used[0], used[-1] + 1)
                ax.stairs(ref_height[cut] + i, edges[used[0]:used[-1] + 2] + a["log2_initial_scale"],
                          baseline=None, color="k", ls="--", lw=0.9,
                          label="fp32 histogram moved up by $\\log_2 S$" if not labels else None)
                labels.append(a["arm"])
        k = a[kind]
        if a["mode"] == "none":  # an fp32 arm rounds nothing: say what lies outside FP16's range instead
            note = f"{_pct(k['below_2^-24_of_nonzero'])} of nonzero below $2^{{-24}}$ (outside FP16's range)"
        else:
            note = (f"{_pct(k['rounded_to_zero_of_nonzero'])} of nonzero rounded to zero, "
                    f"{k['overflow_values']} overflowed\n"
                    f"{a['skipped_steps']}/{a['steps']} steps skipped")
        ax.text(hi - 0.3, i + 0.45, note, ha="right", va="center", fontsize=7.5,
                bbox=dict(boxstyle="square,pad=0.15", fc="white", ec="none", alpha=0.8))
    for x in (fg.FP16_SUBNORMAL_MIN_LOG2, fg.FP16_NORMAL_MIN_LOG2, fg.FP16_MAX_LOG2):
        ax.axvline(x, color=fg.FP16_COLOR, lw=1)
    ax.set_yticks(np.arange(len(arms)) + 0.35)
    ax.set_yticklabels([_tex_label(a["label"]) + (f"\n(median $2^{{{math.log2(a['median_scale']):g}}}$)"
                                                  if a["mode"] == "dynamic" else "") for a in arms])
    ax.set_ylim(-0.1, len(arms) + 0.1)
    ax.set_xlim(lo, hi)
    ax.set_xticks(np.arange(lo, hi + 1, 5))
    ax.set_xlabel("binade exponent e of the (scaled) gradient  ($2^e \\leq |x| < 2^{e+1}$)")
    ax.set_ylabel("arm (loss scale S)")
    ax.set_title(f"Gradients range offset: {KIND_TITLE[kind]}, all layers and steps, binned before rounding "
                 f"(each ridge scaled to its peak; exact zeros not drawn)", fontsize=10)
    ax.legend(fontsize=7.5, loc="upper left", ncol=3, bbox_to_anchor=(0, -0.12), frameon=False)
    return fig


def training_figure(f, found: dict) -> Figure:
    """Training loss and test accuracy per arm (figures.loss_accuracy) in the study's arm order."""
    return fg.loss_accuracy(f, arms=[a["arm"] for a in found["arms"]])


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and loss_scale_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("loss_scale_summary", summary_figure(found)),
                ("loss_scale_range_offset", range_offset_figure(f, found, "activation_grads")),
                ("loss_scale_range_offset_weight_grads", range_offset_figure(f, found, "weight_grads")),
                ("loss_scale_training", training_figure(f, found)),
                ("loss_scale_trajectory", fg.loss_scale(f, arms=[a["arm"] for a in found["arms"]]))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "loss_scale_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "loss_scale.toml", write)


if __name__ == "__main__":
    sys.exit(main())
