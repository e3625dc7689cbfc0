#!/usr/bin/python3
"""Study d of issue #6: a setting where FP16 precision really hurts.

experiments/configs/precision_hurts.toml trains a deep MLP from a small
initialisation (model.init_scale) with Adam in three arms: fp32, FP16 without
loss scaling ("fp16-noscale": fp16-mixed with loss_scale.mode = "none") and
fp16-mixed (dynamic loss scaling). The small weights make the gradients small;
Adam divides them by their own size, so FP32 trains at full speed on gradients
near 2^-24, while FP16 flushes them to zero or keeps them as subnormals with few
significant bits, and those weights move little or not at all.
Loss scaling (Micikevicius et al., "Mixed Precision Training", ICLR 2018, §3.2)
shifts them back into FP16's window.

    /usr/bin/python3 notebooks/precision_hurts.py runs/precision_hurts.h5 [--out docs/figures]

writes precision_hurts_*.png and precision_hurts_findings.json into --out and
prints the verdict.
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":
    os.environ["MPLBACKEND"] = "Agg"  # files only

import numpy as np
from matplotlib.figure import Figure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figures  # noqa: E402  (beside this file)
import mpsim_log as ml  # noqa: E402

FINITE_BINS = figures.FINITE_BINS
EXPONENTS = np.arange(-149, -149 + FINITE_BINS)
GRAD_KINDS = ("activation_grads", "weight_grads")


# --- reading -------------------------------------------------------------------


def find_arms(f) -> dict[str, str]:
    """{"fp32": arm, "noscale": arm, "scaled": arm}: the reference, the FP16 arm
    without a loss scaler and the FP16 arm with one, told apart by their logged
    loss scales (1 throughout means no scaling) rather than by name."""
    roles = {}
    for arm in figures.ordered_arms(f):
        policy = ml.arm_info(f, arm).get("policy", arm)
        scale = ml.steps(f, arm)["loss_scale"]
        if policy == "fp32":
            roles.setdefault("fp32", arm)
        elif len(scale) and np.all(scale == 1.0):
            roles.setdefault("noscale", arm)
        else:
            roles.setdefault("scaled", arm)
    missing = {"fp32", "noscale", "scaled"} - roles.keys()
    if missing:
        raise ValueError(f"the log lacks the arms {sorted(missing)} (has {ml.arms(f)}); "
                         "run experiments/configs/precision_hurts.toml")
    return roles


def roles_by_seed(f) -> dict[int, dict[str, str]]:
    """{seed: {"fp32": arm, "noscale": arm, "scaled": arm}}: find_arms per seed,
    for the accuracy over seeds (every seed shares initial weights and batches
    across the three arms)."""
    by_seed: dict[int, dict[str, str]] = {}
    for arm in figures.ordered_arms(f):
        info = ml.arm_info(f, arm)
        policy = info.get("policy", arm)
        scale = ml.steps(f, arm)["loss_scale"]
        role = "fp32" if policy == "fp32" else ("noscale" if len(scale) and np.all(scale == 1.0) else "scaled")
        by_seed.setdefault(int(info.get("seed", 0)), {}).setdefault(role, arm)
    return {seed: roles for seed, roles in sorted(by_seed.items()) if len(roles) == 3}


def accuracy_over_seeds(f) -> dict:
    """Per role: the final test accuracy of each seed; per FP16 role: its
    difference to FP32 seed by seed, with mean, smallest and largest."""
    by_seed = roles_by_seed(f)
    acc = {role: [final_accuracy(f, roles[role]) for roles in by_seed.values()]
           for role in ("fp32", "noscale", "scaled")}
    result = {"seeds": list(by_seed), "test_accuracy": acc, "difference_to_fp32": {}}
    for role in ("noscale", "scaled"):
        d = [a - b for a, b in zip(acc[role], acc["fp32"])]
        result["difference_to_fp32"][role] = {"per_seed": d, "mean": float(np.mean(d)), "min": float(np.min(d)),
                                              "max": float(np.max(d)), "paired_p": paired_p(d)}
    return result


def paired_p(differences) -> float | None:
    """Two-sided paired t-test of the per-seed differences against 0 (scipy);
    None with fewer than 3 seeds, without scipy, or when every difference is
    the same."""
    if len(differences) < 3 or np.std(differences) == 0:
        return None
    try:
        from scipy import stats
    except ImportError:
        return None
    return float(stats.ttest_1samp(differences, 0.0).pvalue)


def final_accuracy(f, arm: str) -> float:
    """Test accuracy of the last evaluation (nan if the arm never evaluated)."""
    acc = ml.evals(f, arm)["test_accuracy"]
    return float(acc[-1]) if len(acc) else float("nan")


def counter_fractions(f, arm: str, kind: str, layer=None) -> dict[str, float]:
    """Over all instrumented steps (and all layers, or one): the fraction of the
    nonzero values that the arm's rounding flushed to zero, and the fraction that
    lay below 2^-24 before rounding (what FP16 cannot hold)."""
    names = [layer] if layer is not None else ml.layers(f, arm)
    totals = {"elements": 0.0, "nonzero": 0.0, "flushed": 0.0, "below_2^-24": 0.0}
    for name in names:
        c = ml.counters(f, arm, name, kind)
        for key in totals:
            totals[key] += float(c[key].sum())
    n = max(totals["nonzero"], 1.0)
    # "zero": exact zeros before this rounding, e.g. weight gradients whose
    # activation gradient was already flushed (or a ReLU that was off).
    return {"flushed": totals["flushed"] / n, "below_2^-24": totals["below_2^-24"] / n,
            "nonzero": totals["nonzero"], "zero": 1.0 - totals["nonzero"] / max(totals["elements"], 1.0)}


def binade_distribution(f, arm: str, kind: str) -> np.ndarray:
    """Fraction of the nonzero finite values in each binade, all layers and
    instrumented steps summed (binned before rounding, so the scaled arm's values
    include its loss scale)."""
    g = f["arms"][arm]
    ki = list(ml.KINDS).index(kind)
    counts = g["stats/histogram"][:, :, ki, :FINITE_BINS].astype(np.float64).sum(axis=(0, 1))
    return counts / max(counts.sum(), 1.0)


def subnormal_fraction(f, arm: str, kind: str) -> float:
    """Share of the nonzero values in FP16's subnormal binades [2^-24, 2^-14):
    kept, but with fewer significant bits the smaller they are."""
    dist = binade_distribution(f, arm, kind)
    window = (EXPONENTS >= figures.FP16_SUBNORMAL_MIN_LOG2) & (EXPONENTS < figures.FP16_NORMAL_MIN_LOG2)
    return float(dist[window].sum())


def status(f, arm: str) -> str:
    return ml.arm_info(f, arm).get("status", "completed")


# --- figures -------------------------------------------------------------------


def _shade_fp16(ax):
    """FP16's window on a binade axis: normal from 2^-14, subnormal 2^-24..2^-14,
    flushed to zero below 2^-24, overflow above 65504."""
    ax.axvspan(-40, figures.FP16_SUBNORMAL_MIN_LOG2, color=figures.FP16_COLOR, alpha=0.12, lw=0,
               label="FP16 flushes to zero ($<2^{-24}$)")
    ax.axvspan(figures.FP16_SUBNORMAL_MIN_LOG2, figures.FP16_NORMAL_MIN_LOG2, color="orange", alpha=0.15, lw=0,
               label="FP16 subnormal ($2^{-24}..2^{-14}$)")
    ax.axvspan(figures.FP16_NORMAL_MIN_LOG2, figures.FP16_MAX_LOG2, color="green", alpha=0.06, lw=0,
               label="FP16 normal ($2^{-14}..65504$)")


def gradient_histograms(f, roles: dict[str, str]) -> Figure:
    """Activation and weight gradients by binade, all layers and steps, per arm,
    against FP16's window. The no-scaling arm's mass left of 2^-24 is what FP16
    flushes; the scaled arm shows the same values shifted up by log2(S)."""
    fig = Figure(figsize=(12, 5.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    labels = {"fp32": "fp32 (reference)", "noscale": "fp16, no loss scaling", "scaled": "fp16-mixed, dynamic scaling"}
    for ax, kind in zip(axes, GRAD_KINDS):
        _shade_fp16(ax)
        lo, hi = 0, 0
        for i, role in enumerate(("fp32", "noscale", "scaled")):
            arm = roles[role]
            dist = binade_distribution(f, arm, kind)
            used = np.nonzero(dist)[0]
            if len(used):
                lo, hi = min(lo, EXPONENTS[used[0]]), max(hi, EXPONENTS[used[-1]])
            below = counter_fractions(f, arm, kind)["below_2^-24"]
            ax.step(EXPONENTS + 0.5, dist, where="mid", color=f"C{i}", lw=1.8,
                    ls="--" if role == "fp32" else "-",
                    label=f"{labels[role]}: {100 * below:.3g}% below $2^{{-24}}$")
        ax.set_xlim(max(lo - 2, -40), min(hi + 3, 20))
        ax.set_yscale("log")
        ax.set_ylim(1e-6, 1)
        ax.set_xlabel("binade exponent e  ($2^e \\leq |x| < 2^{e+1}$), binned before rounding")
        ax.set_title(f"{kind}, all layers and instrumented steps")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("fraction of the nonzero values")
    for ax in axes:  # below the axes: the curves fill the panel
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.suptitle("Gradients against FP16's window: without scaling the left tail is flushed; "
                 "the loss scale moves it into range", fontsize=11)
    return fig


def underflow_by_layer(f, roles: dict[str, str]) -> Figure:
    """Per layer: the fraction of nonzero gradients flushed to zero, in the
    no-scaling arm and the scaled arm (the deepest layers, farthest from the
    loss, lose the most)."""
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, kind in zip(axes, GRAD_KINDS):
        # A layer whose gradient passes through unrounded (ReLU: already FP16) never
        # flushes anything; leaving it out keeps the bars readable.
        flushed = {role: {name: 100 * counter_fractions(f, roles[role], kind, name)["flushed"]
                          for name in ml.layers(f, roles[role])} for role in ("noscale", "scaled")}
        layers = [name for name in ml.layers(f, roles["noscale"])
                  if flushed["noscale"].get(name, 0) > 0 or flushed["scaled"].get(name, 0) > 0]
        x = np.arange(len(layers))
        for i, (role, label) in enumerate((("noscale", "fp16, no loss scaling"),
                                           ("scaled", "fp16-mixed, dynamic scaling"))):
            ax.bar(x + (i - 0.5) * 0.4, [flushed[role].get(name, 0) for name in layers], width=0.4,
                   color=f"C{i + 1}", label=label)
        ax.set_xticks(x, layers, rotation=45)
        ax.set_xlabel("layer, input to output")
        ax.set_title(f"{kind}: flushed to zero by FP16 rounding")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("% of the nonzero values, all instrumented steps")
    fig.suptitle("Gradients rounded to zero per layer ('loss': the logits' gradient; "
                 "layers that round nothing to zero are left out)", fontsize=11)
    return fig


def all_figures(f, roles: dict[str, str]) -> list[tuple[str, Figure]]:
    """(name, figure) pairs; the names become precision_hurts_NAME.png."""
    return [
        ("accuracy", figures.loss_accuracy(f, arms=[roles["fp32"], roles["noscale"], roles["scaled"]])),
        ("gradient_histograms", gradient_histograms(f, roles)),
        ("underflow_by_layer", underflow_by_layer(f, roles)),
        ("activation_grads_noscale", figures.activation_grad_heatmap(f, arm=roles["noscale"], layer="all")),
        ("weight_grads_noscale", figures.activation_grad_heatmap(f, arm=roles["noscale"], layer="all",
                                                                 kind="weight_grads")),
    ]


# --- verdict -------------------------------------------------------------------


def findings(f, roles: dict[str, str]) -> dict:
    """The key numbers: accuracies, differences to FP32, underflow fractions."""
    acc = {role: final_accuracy(f, arm) for role, arm in roles.items()}
    result = {"arms": roles, "status": {role: status(f, arm) for role, arm in roles.items()},
              "test_accuracy": acc,
              "accuracy_vs_fp32": {role: acc[role] - acc["fp32"] for role in ("noscale", "scaled")},
              "final_loss_scale": float(ml.steps(f, roles["scaled"])["loss_scale"][-1]),
              "skipped_steps_scaled": int(ml.steps(f, roles["scaled"])["skipped"].sum())}
    for kind in GRAD_KINDS:
        result[kind] = {
            "fp32_below_2^-24": counter_fractions(f, roles["fp32"], kind)["below_2^-24"],
            "noscale_flushed": counter_fractions(f, roles["noscale"], kind)["flushed"],
            "scaled_flushed": counter_fractions(f, roles["scaled"], kind)["flushed"],
            "zero": {role: counter_fractions(f, arm, kind)["zero"] for role, arm in roles.items()},
            "noscale_subnormal": subnormal_fraction(f, roles["noscale"], kind),
            "scaled_subnormal": subnormal_fraction(f, roles["scaled"], kind),
        }
    # Over seeds: precision hurts when FP16 without scaling loses a point or
    # more against FP32 on average (or stops); scaling restores parity when its
    # mean difference is within a point (or better). The paired p-values say
    # how sure that is with this many seeds.
    seeds = accuracy_over_seeds(f)
    result["over_seeds"] = seeds
    noscale, scaled = seeds["difference_to_fp32"]["noscale"], seeds["difference_to_fp32"]["scaled"]
    # "Hurts" needs the loss to be significant over the seeds (paired t-test,
    # 5%), not just a mean: one seed's luck must not decide the verdict.
    significant = noscale["paired_p"] is not None and noscale["paired_p"] < 0.05
    result["loses_on_average"] = bool(noscale["mean"] <= -0.01)
    result["hurts"] = bool((result["loses_on_average"] and significant) or "stopped" in result["status"]["noscale"])
    result["restored"] = bool(abs(scaled["mean"]) < 0.01 or scaled["mean"] > 0)
    result["steps"] = int(len(ml.steps(f, roles["fp32"])["loss"]))
    return result


def verdict(r: dict) -> str:
    acc, d = r["test_accuracy"], r["accuracy_vs_fp32"]
    a, w = r["activation_grads"], r["weight_grads"]
    lines = [
        f"test accuracy: fp32 {100 * acc['fp32']:.2f}%, fp16 without loss scaling {100 * acc['noscale']:.2f}% "
        f"({100 * d['noscale']:+.2f} points), fp16-mixed with dynamic scaling {100 * acc['scaled']:.2f}% "
        f"({100 * d['scaled']:+.2f} points; final scale {r['final_loss_scale']:g}, "
        f"{r['skipped_steps_scaled']} steps skipped)",
        f"without loss scaling FP16 flushed {100 * a['noscale_flushed']:.3g}% of the nonzero activation gradients "
        f"and {100 * w['noscale_flushed']:.3g}% of the weight gradients (FP32 arm: {100 * a['fp32_below_2^-24']:.3g}% "
        f"and {100 * w['fp32_below_2^-24']:.3g}% below 2^-24); with scaling {100 * a['scaled_flushed']:.3g}% "
        f"and {100 * w['scaled_flushed']:.3g}%",
        f"in FP16's subnormal range [2^-24, 2^-14) (fewer bits): {100 * a['noscale_subnormal']:.3g}% of the "
        f"activation and {100 * w['noscale_subnormal']:.3g}% of the weight gradients without scaling, "
        f"{100 * a['scaled_subnormal']:.3g}% and {100 * w['scaled_subnormal']:.3g}% with it",
        f"weight gradients exactly zero before rounding (their activation gradients flushed, or ReLUs off): "
        f"fp32 {100 * w['zero']['fp32']:.3g}%, no scaling {100 * w['zero']['noscale']:.3g}%, "
        f"fp16-mixed {100 * w['zero']['scaled']:.3g}%",
    ]
    o = r["over_seeds"]
    if len(o["seeds"]) > 1:
        def span(role):
            d = o["difference_to_fp32"][role]
            p = "" if d["paired_p"] is None else f", paired t-test p = {d['paired_p']:.2g}"
            return (f"{100 * d['mean']:+.2f} points on average (from {100 * d['min']:+.2f} to "
                    f"{100 * d['max']:+.2f}{p})")
        lines.append(f"over {len(o['seeds'])} seeds (same weights and batches per seed): fp32 "
                     f"{100 * np.mean(o['test_accuracy']['fp32']):.2f}% on average; without scaling "
                     f"{span('noscale')}; fp16-mixed {span('scaled')}")
    if r["status"]["noscale"] != "completed":
        lines.append(f"the no-scaling arm {r['status']['noscale']}")
    if r["hurts"] and r["restored"]:
        lines.append("verdict: precision hurts here (FP16 without scaling loses a point or more on average, "
                     "significant over the seeds) and loss scaling restores FP32 parity (within 1 point on average)")
    elif r["hurts"]:
        lines.append("verdict: FP16 without scaling loses accuracy on average, but loss scaling does not "
                     "restore parity")
    elif r["loses_on_average"] and len(o["seeds"]) > 1:
        d = o["difference_to_fp32"]["noscale"]
        p = "n/a" if d["paired_p"] is None else f"{d['paired_p']:.2g}"
        lines.append(f"verdict: FP16 without scaling loses {100 * -d['mean']:.2f} points on average, but the seeds "
                     f"disagree (from {100 * d['min']:+.2f} to {100 * d['max']:+.2f}, paired p = {p}): not "
                     f"significant with {len(o['seeds'])} seeds, so this setting does not show that precision hurts")
    elif r["steps"] < 200:
        lines.append(f"verdict: no loss of 1 point or more without scaling in {r['steps']} steps "
                     "(too short to show it: run the full config)")
    else:
        lines.append("verdict: no loss of 1 point or more without scaling on average here")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Figures and verdict of the precision-hurts study.")
    parser.add_argument("log", help="HDF5 log of experiments/configs/precision_hurts.toml")
    parser.add_argument("--out", default="docs/figures", help="directory for the PNGs and findings JSON")
    args = parser.parse_args(argv)
    with ml.open_log(args.log) as f:
        roles = find_arms(f)
        figs = [(f"precision_hurts_{name}", fig) for name, fig in all_figures(f, roles)]
        r = findings(f, roles)
    for path in figures.save_study(args.out, figs, r, "precision_hurts_findings.json")[:-1]:
        print(path)
    print(verdict(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
