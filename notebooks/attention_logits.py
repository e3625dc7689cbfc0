#!/usr/bin/python3
"""Attention-logit growth and its stabilisers (issue #20, section 5).

Wortsman et al., "Small-scale proxies for large-scale Transformer training instabilities" (2023, arXiv:2309.14322),
sections 3.1 and 3.2: at high learning rates the attention logits of a small Transformer grow until the softmax
saturates (one key takes all the weight) and the loss diverges; QK-LayerNorm (Dehghani et al. 2023) removes that
growth, and PaLM's z-loss (Chowdhery et al. 2022) keeps the output logits' normaliser near 1. Their figure: final
loss against the learning rate, one curve per setting ("learning-rate sensitivity"). This module reads the log of
`mpsim run experiments/configs/attention_logits.toml` (a character-level GPT in FP32, three settings times five
learning rates) and draws that curve, each arm's largest attention logit over training, and where that largest
logit passes FP16's largest finite value 65504: an FP16 logit there would overflow to infinity.

    /usr/bin/python3 notebooks/attention_logits.py runs/attention_logits.h5 [--out docs/figures]

writes attention_logits_*.png and attention_logits_findings.json into --out and prints the verdict. Arms are
recognised by their sweep point (`qk_norm`, `z_loss`, `lr`), so any log of that config's sweep works.
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

FP16_MAX = 65504.0
SETTINGS = ("plain", "qk-layernorm", "z-loss", "qk-layernorm + z-loss")
COLOURS = {"plain": "tab:red", "qk-layernorm": "tab:blue", "z-loss": "tab:green", "qk-layernorm + z-loss": "tab:purple"}


def setting_of(point: dict) -> str:
    """The stabiliser setting of a sweep point: plain, qk-layernorm, z-loss or both."""
    qk = point.get("qk_norm", "false") == "true"
    z = float(point.get("z_loss", "0")) > 0.0
    return SETTINGS[(1 if qk else 0) + (2 if z else 0)]


def findings(f) -> dict:
    """Per arm: setting, learning rate, status, final validation loss, the largest attention logit over the
    stats steps (all attention layers), the output logits' largest, the stats steps where an attention
    maximum passed FP16's 65504 (the denominator: the stats steps), and the skipped or non-finite steps."""
    arms = []
    for arm in ml.arms(f):
        point = ml.sweep_point(f, arm)
        if "lr" not in point:
            continue
        maxima = ml.logit_max(f, arm)
        attention = [name for name in maxima if name.endswith(".attn")]
        steps = maxima["step"]
        attn = np.vstack([maxima[name] for name in attention]) if attention else np.zeros((0, len(steps)))
        per_step = attn.max(axis=0) if attn.size else np.full(len(steps), math.nan)
        evals = ml.evals(f, arm)
        records = ml.steps(f, arm)
        over = int(np.sum(per_step > FP16_MAX))
        arms.append({
            "arm": arm,
            "seed": int(ml.arm_info(f, arm)["seed"]),
            "setting": setting_of(point),
            "lr": float(point["lr"]),
            "status": ml.arm_info(f, arm)["status"],
            "final_test_loss": float(evals["test_loss"][-1]) if len(evals["test_loss"]) else math.nan,
            "max_attention_logit": float(np.nanmax(per_step)) if len(steps) else math.nan,
            "final_attention_logit": float(per_step[-1]) if len(steps) else math.nan,
            "max_output_logit": float(np.nanmax(maxima["loss"])) if "loss" in maxima else math.nan,
            "stats_steps": int(len(steps)),
            "stats_steps_over_fp16_max": over,
            "nonfinite_losses": int(np.sum(~np.isfinite(records["loss"]))),
            "steps": int(len(records["step"])),
        })
    if not arms:
        raise ValueError("no arm with a sweep point `lr`: not a log of experiments/configs/attention_logits.toml")
    arms.sort(key=lambda a: (SETTINGS.index(a["setting"]), a["lr"], a["seed"]))
    # Per setting and learning rate over the seeds: the final loss and the largest logit, each seed's and their
    # mean (the curves), and in how many seeds the largest logit passed 65504.
    points = []
    for setting in SETTINGS:
        for lr in sorted({a["lr"] for a in arms if a["setting"] == setting}):
            runs = [a for a in arms if a["setting"] == setting and a["lr"] == lr]
            losses = [a["final_test_loss"] for a in runs]
            logits = [a["max_attention_logit"] for a in runs]
            points.append({"setting": setting, "lr": lr, "seeds": [a["seed"] for a in runs],
                           "final_test_loss": losses, "max_attention_logit": logits,
                           "mean_final_test_loss": float(np.mean(losses)),
                           "mean_max_attention_logit": float(np.mean(logits)),
                           "seeds_over_fp16_max": sum(a["stats_steps_over_fp16_max"] > 0 for a in runs)})
    seeds = sorted({a["seed"] for a in arms})
    return {"arms": arms, "points": points, "fp16_max": FP16_MAX, "seeds": seeds, "seed": seeds[0]}


def verdict(found: dict) -> str:
    seeds = found["seeds"]
    lines = [f"Seeds {seeds}: per setting, the learning rate of the best mean validation loss, and the largest "
             "attention logit per lr (the mean over the seeds" + (", with the range)" if len(seeds) > 1 else ")")]
    for setting in SETTINGS:
        points = [p for p in found["points"] if p["setting"] == setting]
        if not points:
            continue
        best = min(points, key=lambda p: p["mean_final_test_loss"] if math.isfinite(p["mean_final_test_loss"])
                   else math.inf)
        spread = (f" ({min(best['final_test_loss']):.4f}-{max(best['final_test_loss']):.4f})"
                  if len(best["seeds"]) > 1 else "")
        lines.append(f"{setting:<22} best validation loss {best['mean_final_test_loss']:.4f}{spread} nats/char at lr "
                     f"{best['lr']:g}; largest attention logit per lr: " +
                     ", ".join(f"{p['lr']:g}: {p['mean_max_attention_logit']:.3g}"
                               + (f" ({min(p['max_attention_logit']):.3g}-{max(p['max_attention_logit']):.3g})"
                                  if len(p["seeds"]) > 1 else "") for p in points))
    over = [a for a in found["arms"] if a["stats_steps_over_fp16_max"]]
    lines.append(f"Arms whose largest attention logit passed FP16's 65504 (an FP16 logit would overflow): {len(over)} "
                 f"of {len(found['arms'])}" + (": " + ", ".join(a["arm"] for a in over) if over else ""))
    return "\n".join(lines)


def sensitivity_figure(found: dict) -> Figure:
    """Final validation loss (left) and the largest attention logit (right) against the learning rate: the mean
    over the seeds as a line, each seed a dot."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    loss_ax, logit_ax = fig.subplots(1, 2)
    for setting in SETTINGS:
        points = [p for p in found["points"] if p["setting"] == setting]
        if not points:
            continue
        lr = [p["lr"] for p in points]
        loss_ax.plot(lr, [p["mean_final_test_loss"] for p in points], "-", color=COLOURS[setting], label=setting)
        logit_ax.plot(lr, [p["mean_max_attention_logit"] for p in points], "-", color=COLOURS[setting], label=setting)
        for p in points:
            loss_ax.plot([p["lr"]] * len(p["seeds"]), p["final_test_loss"], "o", color=COLOURS[setting], ms=4)
            logit_ax.plot([p["lr"]] * len(p["seeds"]), p["max_attention_logit"], "o", color=COLOURS[setting], ms=4)
    logit_ax.axhline(FP16_MAX, color="black", linestyle="--", linewidth=1, label="FP16 max 65504")
    for ax in (loss_ax, logit_ax):
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.grid(True, alpha=0.3)
    loss_ax.set_ylabel("final validation loss (nats/char)")
    n = len(found["seeds"])
    loss_ax.set_title(f"learning-rate sensitivity ({n} seed{'s' if n != 1 else ''}: dots; line: mean)")
    logit_ax.set_yscale("log")
    logit_ax.set_ylabel("largest |attention logit| over training")
    logit_ax.set_title("attention-logit growth")
    loss_ax.legend(fontsize=8)
    logit_ax.legend(fontsize=8)
    return fig


def trajectory_figure(f, found: dict) -> Figure:
    """Each arm's largest attention logit (top) and output logit (bottom) over the stats steps, one panel per setting
    (the first seed's arms)."""
    settings = [s for s in SETTINGS if any(a["setting"] == s for a in found["arms"])]
    fig = Figure(figsize=(4.2 * len(settings), 6.5), layout="constrained")
    axes = np.atleast_2d(fig.subplots(2, len(settings), sharey="row", squeeze=False))
    rates = sorted({a["lr"] for a in found["arms"]})
    shades = {lr: 0.25 + 0.75 * i / max(1, len(rates) - 1) for i, lr in enumerate(rates)}
    for col, setting in enumerate(settings):
        for a in (a for a in found["arms"] if a["setting"] == setting and a["seed"] == found["seed"]):
            maxima = ml.logit_max(f, a["arm"])
            attention = [n for n in maxima if n.endswith(".attn")]
            colour = (0.0, 0.0, 0.0, shades[a["lr"]])
            if attention:
                axes[0, col].plot(maxima["step"], np.vstack([maxima[n] for n in attention]).max(axis=0), color=colour,
                                  label=f"lr {a['lr']:g}")
            if "loss" in maxima:
                axes[1, col].plot(maxima["step"], maxima["loss"], color=colour, label=f"lr {a['lr']:g}")
        axes[0, col].set_title(setting)
        axes[0, col].axhline(FP16_MAX, color="tab:red", linestyle="--", linewidth=1)
        axes[1, col].set_xlabel("step")
        for row in range(2):
            axes[row, col].set_yscale("log")
            axes[row, col].grid(True, alpha=0.3)
        axes[0, col].legend(fontsize=7)
    axes[0, 0].set_ylabel("largest |attention logit|")
    axes[1, 0].set_ylabel("largest |output logit|")
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and attention_logits_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("attention_logits_sensitivity", sensitivity_figure(found)),
                ("attention_logits_trajectory", trajectory_figure(f, found))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "attention_logits_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "attention_logits.toml", write)


if __name__ == "__main__":
    sys.exit(main())
