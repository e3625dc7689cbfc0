#!/usr/bin/python3
"""Where precision breaks a transformer: softmax, norms and the residual stream lowered one at a time (issue #20).

Autocast keeps a transformer's softmax, its norms and its residual stream in FP32 and runs the GEMMs in BF16 or
FP16. This module reads the log of `mpsim run experiments/configs/transformer_precision.toml` (a character-level
GPT under fp32, bf16-mixed, fp16-mixed, each mixed preset with one of those ops lowered to its format, and
fp16-mixed without loss scaling) and asks which lowering costs validation loss first, and what the per-layer
counters show: how many of the residual stream's and the norms' values each rounding changed, rounded to zero or
overflowed, and how often FP16's loss scaler skipped a step.

    /usr/bin/python3 notebooks/transformer_precision.py runs/transformer_precision.h5 [--out docs/figures]

writes transformer_precision_*.png and transformer_precision_findings.json into --out and prints the verdict.
Arms are recognised by their policy as the log stores it (its fp32_ops and loss scaling), so renamed arms work.
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
import figures as fg  # noqa: E402
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

# The ops autocast keeps in binary32 that an arm may lower (core's fp32_op_names for transformers).
# The equivalence margin for a validation-loss difference: 0.02 nats/char, under 1% of the loss these runs reach
# (about 2.6 nats/char after 300 steps). Chosen after seeds 1-3 had run on the GPU; every difference's interval is
# printed beside the verdict, so a reader with another margin can judge for themselves.
MARGIN = 0.02
LOWERABLE = ("softmax", "layer_norm", "residual", "softmax_cross_entropy")
# Layer groups whose activations the figures count: the residual stream's sums and the norms' outputs.
GROUPS = {"residual": lambda name: name == "pos" or ".add" in name,
          "layer_norm": lambda name: name == "ln" or ".ln" in name}


def describe(f, arm: str) -> dict:
    """The arm's format, the op it lowers (or None) and its loss scaling, from its stored policy."""
    p = ml.policy(f, arm)
    fmt = p["points"]["activations"]["format"]
    fp32_ops = list(p.get("fp32_ops", []))
    mixed = fmt != "binary32"
    lowered = [op for op in LOWERABLE if mixed and op not in fp32_ops]
    return {"format": fmt, "lowered": lowered, "loss_scaling": str(p["loss_scale"]["mode"]), "mixed": mixed}


def group_counters(f, arm: str, group: str) -> dict:
    """Activation counters summed over the group's layers and the stats steps."""
    total: dict = {}
    for layer in ml.layers(f, arm):
        if GROUPS[group](layer):
            for name, value in ml.kind_counters(f, arm, "activations", layer=layer).items():
                total[name] = total.get(name, 0) + int(value)
    return total


def findings(f) -> dict:
    arms = []
    for arm in ml.arms(f):
        d = describe(f, arm)
        info = ml.arm_info(f, arm)
        evals, steps = ml.evals(f, arm), ml.steps(f, arm)
        grads = ml.kind_counters(f, arm, "activation_grads")
        entry = {
            "arm": arm, "policy": info["policy"], "seed": int(info["seed"]), **d,
            "status": info["status"],
            "final_test_loss": float(evals["test_loss"][-1]) if len(evals["test_loss"]) else math.nan,
            "steps": int(len(steps["step"])),
            "skipped_steps": int(np.sum(steps["skipped"])),
            "final_loss_scale": float(steps["loss_scale"][-1]) if len(steps["loss_scale"]) else math.nan,
            "activation_grads_rounded_to_zero": ml.fraction(grads, "rounded_to_zero"),
            "activation_grads_below_2^-24": ml.fraction(grads, "below_2^-24"),
        }
        # Attention's logits and probabilities (kinds of their own since log schema 9, with train.attention_stats;
        # NaN where the log has none): the logits' share changed by their rounding, and the probabilities' share
        # that is exactly zero. A lowered softmax computes its zeros inside (softmax_internals), before the output
        # rounding that the counters see, so the zeros come from the histogram; the causal mask's zeros are
        # in every arm alike, and the fp32 arm's share is that floor.
        counted = {kind: ml.kind_counters(f, arm, kind) for kind in ("attention_logits", "attention_probs")
                   if kind in ml.kinds(f, arm)}
        has = {kind: counted.get(kind, {}).get("elements", 0) > 0 for kind in ("attention_logits", "attention_probs")}
        entry["attention_logits_inexact"] = (ml.fraction(counted["attention_logits"], "inexact", "all")
                                             if has["attention_logits"] else math.nan)
        if has["attention_probs"]:
            h = np.asarray(ml.kind_histogram(f, arm, "attention_probs"), dtype=float)
            entry["attention_probs_zero"] = float(h[ml.bins(f, arm).zero] / h.sum())
        else:
            entry["attention_probs_zero"] = math.nan
        for group in GROUPS:
            c = group_counters(f, arm, group)
            entry[f"{group}_inexact"] = ml.fraction(c, "inexact", "all")
            entry[f"{group}_rounded_to_zero"] = ml.fraction(c, "rounded_to_zero")
            entry[f"{group}_overflow"] = ml.fraction(c, "overflow", "all")
        arms.append(entry)
    references = {a["seed"]: a for a in arms if not a["mixed"]}
    if not references:
        raise ValueError("no binary32 arm to compare with: not a log of experiments/configs/transformer_precision.toml")
    for a in arms:
        reference = references.get(a["seed"])
        a["loss_vs_fp32"] = a["final_test_loss"] - reference["final_test_loss"] if reference else math.nan
        # Against its preset, of the same seed: the arm of the same format and loss scaling that lowers nothing.
        preset = next((b for b in arms if b["seed"] == a["seed"] and b["mixed"] and not b["lowered"]
                       and b["format"] == a["format"] and b["loss_scaling"] == a["loss_scaling"]), None)
        a["preset_arm"] = preset["arm"] if preset and a["lowered"] else None
        a["loss_vs_preset"] = a["final_test_loss"] - preset["final_test_loss"] if a["preset_arm"] else math.nan
    policies = []
    for name in ml.config_order(f, [a["policy"] for a in arms]):
        runs = sorted((a for a in arms if a["policy"] == name), key=lambda a: a["seed"])
        first = runs[0]
        row = {"policy": name, **{k: first[k] for k in ("format", "lowered", "loss_scaling", "mixed")},
               "seeds": [a["seed"] for a in runs], "final_test_loss": [a["final_test_loss"] for a in runs],
               "skipped_steps": [a["skipped_steps"] for a in runs],
               "loss_vs_fp32": [a["loss_vs_fp32"] for a in runs],
               "preset": next((b["policy"] for b in arms if b["arm"] == first["preset_arm"]), None),
               "loss_vs_preset": [a["loss_vs_preset"] for a in runs]}
        if row["mixed"]:
            row["vs_fp32"] = equivalence.paired_equivalence(row["loss_vs_fp32"], MARGIN)
            if row["preset"]:
                row["vs_preset"] = equivalence.paired_equivalence(row["loss_vs_preset"], MARGIN)
        policies.append(row)
    return {"arms": arms, "policies": policies, "reference_arm": references[min(references)]["arm"],
            "reference_policy": references[min(references)]["policy"], "seeds": sorted(references),
            "seed": min(references), "margin_nats": MARGIN}


def label(a: dict) -> str:
    if not a["mixed"]:
        return a.get("arm", a.get("policy"))
    what = "+".join(a["lowered"]) if a["lowered"] else "autocast"
    return f"{a['format']} {what}" + ("" if a["loss_scaling"] != "none" or "binary16" not in a["format"]
                                      else " (no loss scale)")


def _mean(values) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def verdict(found: dict) -> str:
    seeds = found["seeds"]
    reference = next(p for p in found["policies"] if p["policy"] == found["reference_policy"])
    lines = [f"Reference {found['reference_policy']}: validation loss "
             f"{', '.join(f'{v:.4f}' for v in reference['final_test_loss'])} nats/char (seeds {seeds}); "
             f"differences are paired by seed, tested for equivalence within ±{found['margin_nats']:g} nats/char "
             "(TOST, notebooks/equivalence.py)"]
    for p in found["policies"]:
        if not p["mixed"]:
            continue
        text = (f"{p['policy']:<18} {label(p):<34} mean {_mean(p['final_test_loss']):.4f}, skipped "
                f"{p['skipped_steps']}; vs fp32 "
                f"{equivalence.describe(p['vs_fp32'], 1.0, 'nats/char', 4)}")
        if "vs_preset" in p:
            text += f"; vs {p['preset']} {equivalence.describe(p['vs_preset'], 1.0, 'nats/char', 4)}"
        lines.append(text)
    lowered = [p for p in found["policies"] if p["lowered"]]  # each lowers one op (fp16-no-scaling lowers none)
    if lowered:
        worst = max(lowered, key=lambda p: _mean(p["loss_vs_preset"]))
        how = ("one seed: a single run, not a tested difference" if len(seeds) < 2 else
               f"{len(seeds)} seeds: {worst['vs_preset']['verdict']}")
        lines.append(f"Costliest single lowering: {worst['policy']} ({label(worst)}), "
                     f"{_mean(worst['loss_vs_fp32']):+.4f} nats/char against fp32, "
                     f"{_mean(worst['loss_vs_preset']):+.4f} against {worst['preset']} ({how})")
    return "\n".join(lines)


def summary_figure(found: dict) -> Figure:
    """Validation loss against fp32's of the same seed per policy: each seed a dot, the mean with its 95% interval
    (left), the equivalence margin shaded; skipped steps per seed (right)."""
    policies = [p for p in found["policies"] if p["mixed"]]
    fig = Figure(figsize=(11, 0.45 * len(policies) + 1.8), layout="constrained")
    loss_ax, skip_ax = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    y = np.arange(len(policies))
    colours = ["tab:orange" if "bfloat16" in p["format"] else "tab:blue" for p in policies]
    margin = found["margin_nats"]
    loss_ax.axvspan(-margin, margin, color="C2", alpha=0.12, lw=0)
    for i, (p, colour) in enumerate(zip(policies, colours)):
        loss_ax.plot(p["loss_vs_fp32"], [i] * len(p["loss_vs_fp32"]), "o", color=colour, alpha=0.5, markersize=4)
        row = p["vs_fp32"]
        if row["n"] >= 2:
            loss_ax.errorbar(row["mean"], i, xerr=[[row["mean"] - row["ci95"][0]], [row["ci95"][1] - row["mean"]]],
                             fmt="|", color="black", capsize=3, markersize=12)
        skip_ax.plot(p["skipped_steps"], [i] * len(p["skipped_steps"]), "o", color=colour, alpha=0.5, markersize=4)
    loss_ax.axvline(0.0, color="black", linewidth=1)
    loss_ax.set_yticks(y, [p["policy"] for p in policies])
    loss_ax.invert_yaxis()
    loss_ax.set_xlabel("final validation loss minus fp32's, same seed (nats/char)")
    n = len(found["seeds"])
    loss_ax.set_title(f"what lowering one op costs ({n} seed{'s' if n != 1 else ''}: dots; black: mean and 95% "
                      f"interval; green: ±{margin:g})", fontsize=9)
    skip_ax.set_xlabel("steps skipped (inf/NaN), per seed")
    for ax in (loss_ax, skip_ax):
        ax.grid(True, axis="x", alpha=0.3)
    return fig


def counters_figure(found: dict) -> Figure:
    """Share of the residual stream's, the norms' and attention logits' values each arm's rounding changed, of
    attention probabilities that are zero, and of the nonzero activation gradients rounded to zero: the first
    seed's arms."""
    arms = [a for a in found["arms"] if a["seed"] == found["seed"]]
    fig = Figure(figsize=(16, 4.2), layout="constrained")
    panels = [("residual_inexact", "residual stream:\nvalues changed by rounding"),
              ("layer_norm_inexact", "norm outputs:\nvalues changed by rounding"),
              ("attention_logits_inexact", "attention logits:\nvalues changed by rounding"),
              ("attention_probs_zero", "attention probabilities exactly 0\n(the causal mask's included)"),
              ("activation_grads_rounded_to_zero", "nonzero activation gradients\nrounded to zero")]
    axes = fig.subplots(1, len(panels), sharey=True)
    y = np.arange(len(arms))
    for ax, (key, title) in zip(axes, panels):
        ax.barh(y, [100 * a[key] if math.isfinite(a[key]) else 0.0 for a in arms], color="tab:gray")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("% of nonzero values" if key == "activation_grads_rounded_to_zero" else "% of values")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(y, [a["arm"] for a in arms])
    axes[0].invert_yaxis()
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and transformer_precision_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        arms = [a for a in found["arms"] if a["seed"] == found["seed"]]  # the curves of the first seed
        figs = [("transformer_precision_summary", summary_figure(found)),
                ("transformer_precision_counters", counters_figure(found)),
                ("transformer_precision_training", fg.loss_accuracy(f, arms=[a["arm"] for a in arms])),
                ("transformer_precision_loss_scale", fg.loss_scale(f, arms=[a["arm"] for a in arms
                                                                            if "binary16" in a["format"]]))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "transformer_precision_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "transformer_precision.toml", write)


if __name__ == "__main__":
    sys.exit(main())
