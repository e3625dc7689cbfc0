#!/usr/bin/python3
"""Where precision breaks a transformer: softmax, norms and the residual stream lowered one at a time (issue #20).

Autocast keeps a transformer's softmax, its norms and its residual stream in FP32 and runs the GEMMs in BF16 or
FP16. This module reads the log of `mpsim run experiments/configs/transformer_precision.toml` (a character-level
GPT under fp32, bf16-mixed, fp16-mixed, each mixed preset with one of those ops lowered to its format, and
fp16-mixed without loss scaling) and asks which lowering costs validation loss first, and what the per-layer
counters show: how many of the residual stream's and the norms' values each rounding changed, flushed to zero or
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
import figures as fg  # noqa: E402  (beside this file)
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

# The ops autocast keeps in binary32 that an arm may lower (core's fp32_op_names for transformers).
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
        evals, steps = ml.evals(f, arm), ml.steps(f, arm)
        grads = ml.kind_counters(f, arm, "activation_grads")
        entry = {
            "arm": arm, **d,
            "status": ml.arm_info(f, arm)["status"],
            "final_test_loss": float(evals["test_loss"][-1]) if len(evals["test_loss"]) else math.nan,
            "steps": int(len(steps["step"])),
            "skipped_steps": int(np.sum(steps["skipped"])),
            "final_loss_scale": float(steps["loss_scale"][-1]) if len(steps["loss_scale"]) else math.nan,
            "activation_grads_flushed": ml.fraction(grads, "flushed"),
            "activation_grads_below_2^-24": ml.fraction(grads, "below_2^-24"),
        }
        for group in GROUPS:
            c = group_counters(f, arm, group)
            entry[f"{group}_inexact"] = ml.fraction(c, "inexact", "all")
            entry[f"{group}_flushed"] = ml.fraction(c, "flushed")
            entry[f"{group}_overflow"] = ml.fraction(c, "overflow", "all")
        arms.append(entry)
    reference = next((a for a in arms if not a["mixed"]), None)
    if reference is None:
        raise ValueError("no binary32 arm to compare with: not a log of experiments/configs/transformer_precision.toml")
    for a in arms:
        a["loss_vs_fp32"] = a["final_test_loss"] - reference["final_test_loss"]
        # Against its preset: the arm of the same format and loss scaling that lowers nothing.
        preset = next((b for b in arms if b["mixed"] and not b["lowered"] and b["format"] == a["format"]
                       and b["loss_scaling"] == a["loss_scaling"]), None)
        a["preset_arm"] = preset["arm"] if preset and a["lowered"] else None
        a["loss_vs_preset"] = a["final_test_loss"] - preset["final_test_loss"] if a["preset_arm"] else math.nan
    return {"arms": arms, "reference_arm": reference["arm"], "seed": int(ml.info(f)["seed"])}


def label(a: dict) -> str:
    if not a["mixed"]:
        return a["arm"]
    what = "+".join(a["lowered"]) if a["lowered"] else "autocast"
    return f"{a['format']} {what}" + ("" if a["loss_scaling"] != "none" or "binary16" not in a["format"]
                                      else " (no loss scale)")


def verdict(found: dict) -> str:
    lines = [f"Reference {found['reference_arm']}: validation loss "
             f"{next(a for a in found['arms'] if a['arm'] == found['reference_arm'])['final_test_loss']:.4f} nats/char"]
    for a in found["arms"]:
        if a["mixed"]:
            vs_preset = f", {a['loss_vs_preset']:+.4f} vs {a['preset_arm']}" if a["preset_arm"] else ""
            lines.append(f"{a['arm']:<18} {label(a):<34} {a['final_test_loss']:.4f} ({a['loss_vs_fp32']:+.4f} vs fp32"
                         f"{vs_preset}), "
                         f"{a['skipped_steps']} skipped, residual inexact {a['residual_inexact']:.1%}, "
                         f"norm inexact {a['layer_norm_inexact']:.1%}")
    lowered = [a for a in found["arms"] if a["lowered"]]  # each lowers one op (fp16-no-scaling lowers none)
    if lowered:
        worst = max(lowered, key=lambda a: a["loss_vs_fp32"])
        lines.append(f"Costliest single lowering: {worst['arm']} ({label(worst)}), {worst['loss_vs_fp32']:+.4f} nats/char "
                     f"against fp32, {worst['loss_vs_preset']:+.4f} against {worst['preset_arm']} (one seed: a single "
                     "run, not a tested difference)")
    return "\n".join(lines)


def summary_figure(found: dict) -> Figure:
    """Validation loss against fp32's per arm (left) and skipped steps (right)."""
    arms = [a for a in found["arms"] if a["mixed"]]
    fig = Figure(figsize=(11, 0.45 * len(arms) + 1.8), layout="constrained")
    loss_ax, skip_ax = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    y = np.arange(len(arms))
    colours = ["tab:orange" if "bfloat16" in a["format"] else "tab:blue" for a in arms]
    loss_ax.barh(y, [a["loss_vs_fp32"] for a in arms], color=colours)
    loss_ax.axvline(0.0, color="black", linewidth=1)
    loss_ax.set_yticks(y, [f"{a['arm']}" for a in arms])
    loss_ax.invert_yaxis()
    loss_ax.set_xlabel("final validation loss minus fp32's (nats/char)")
    loss_ax.set_title("what lowering one op costs (one seed)")
    skip_ax.barh(y, [a["skipped_steps"] for a in arms], color=colours)
    skip_ax.set_xlabel("steps skipped (inf/NaN)")
    for ax in (loss_ax, skip_ax):
        ax.grid(True, axis="x", alpha=0.3)
    return fig


def counters_figure(found: dict) -> Figure:
    """Share of the residual stream's and the norms' values each arm's rounding changed, and of the activation
    gradients it flushed to zero."""
    arms = found["arms"]
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    y = np.arange(len(arms))
    for ax, (key, title) in zip(axes, [("residual_inexact", "residual stream: values changed by rounding"),
                                       ("layer_norm_inexact", "norm outputs: values changed by rounding"),
                                       ("activation_grads_flushed", "activation gradients flushed to zero")]):
        ax.barh(y, [100 * a[key] if math.isfinite(a[key]) else 0.0 for a in arms], color="tab:gray")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("% of values")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(y, [a["arm"] for a in arms])
    axes[0].invert_yaxis()
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and transformer_precision_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        arms = [a["arm"] for a in found["arms"]]
        figs = [("transformer_precision_summary", summary_figure(found)),
                ("transformer_precision_counters", counters_figure(found)),
                ("transformer_precision_training", fg.loss_accuracy(f, arms=arms)),
                ("transformer_precision_loss_scale", fg.loss_scale(f, arms=[a["arm"] for a in found["arms"]
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
