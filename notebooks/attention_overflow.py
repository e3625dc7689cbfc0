#!/usr/bin/python3
"""FP16 attention-logit overflow by itself, and QK-LayerNorm removing it (issue #20, section 5).

The GPT of attention_logits.toml at a learning rate (0.3) where its attention logits grow past binary16's largest
finite value, 65504, in 300 steps, trained in fp32 and under fp16-mixed, each plain and with QK-LayerNorm
(Dehghani et al. 2023; Wortsman et al. 2023). This module reads the log of
`mpsim run experiments/configs/attention_overflow.toml` and reports per arm: the largest attention logit over
training (logged before any rounding), the first stats step at which it passed 65504, the steps the loss scaler
skipped, the first step whose loss was not finite, and the final validation loss.

    /usr/bin/python3 notebooks/attention_overflow.py runs/attention_overflow.h5 [--out docs/figures]

writes attention_overflow_*.png and attention_overflow_findings.json into --out and prints the verdict.
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

FP16_MAX = 65504.0  # binary16's largest finite value: a logit above it rounds to infinity


def attention_logit_max(f, arm: str) -> dict:
    """The largest attention logit over every attention layer at each stats step: {"step", "max"}."""
    lm = ml.logit_max(f, arm)
    layers = [v for name, v in lm.items() if name not in ("step", "loss")]
    largest = np.nanmax(np.vstack(layers), axis=0) if layers else np.full(len(lm["step"]), math.nan)
    return {"step": lm["step"], "max": largest}


def describe(f, arm: str) -> dict:
    p = ml.policy(f, arm)
    point = ml.sweep_point(f, arm)
    return {"format": p["points"]["gemm_output"]["format"],
            "qk_norm": point.get("qk_norm", "false") == "true",
            "z_loss": float(point.get("z_loss", "0"))}


def arm_findings(f, arm: str) -> dict:
    """One arm's outcome: its largest attention logit and when it passed 65504, skipped steps, the first
    non-finite loss, the final loss scale and validation loss."""
    info = ml.arm_info(f, arm)
    entry = {"arm": arm, "seed": int(info["seed"]), "status": info["status"]}
    logits = attention_logit_max(f, arm)
    entry["max_attention_logit"] = float(np.nanmax(logits["max"])) if len(logits["max"]) else math.nan
    above = np.flatnonzero(logits["max"] > FP16_MAX)
    entry["first_stats_step_above_fp16_max"] = int(logits["step"][above[0]]) if len(above) else None
    st = ml.steps(f, arm)
    entry["steps"] = int(len(st["step"]))
    entry["skipped_steps"] = int(np.count_nonzero(st["skipped"]))
    skipped = np.flatnonzero(st["skipped"])
    entry["first_skipped_step"] = int(st["step"][skipped[0]]) if len(skipped) else None
    bad = np.flatnonzero(~np.isfinite(st["loss"]))
    entry["first_nonfinite_loss_step"] = int(st["step"][bad[0]]) if len(bad) else None
    entry["final_loss_scale"] = float(st["loss_scale"][-1]) if len(st["loss_scale"]) else math.nan
    evals = ml.evals(f, arm)
    entry["final_test_loss"] = float(evals["test_loss"][-1]) if len(evals["test_loss"]) else math.nan
    return entry


def findings(f) -> dict:
    arms = [{**arm_findings(f, arm), **describe(f, arm)} for arm in ml.arms(f)]
    # Per setting (format, QK-LayerNorm, z-loss) over the seeds: how many runs overflowed and how many failed.
    settings = []
    for fmt, qk, z in sorted({(a["format"], a["qk_norm"], a["z_loss"]) for a in arms},
                             key=lambda k: (k[0] != "binary32", k[1], k[2])):
        runs = sorted((a for a in arms if a["format"] == fmt and a["qk_norm"] == qk and a["z_loss"] == z),
                      key=lambda a: a["seed"])
        settings.append({"label": label(runs[0]), "format": fmt, "qk_norm": qk, "z_loss": z,
                         "seeds": [a["seed"] for a in runs],
                         "runs": len(runs),
                         "above_fp16_max": sum(a["first_stats_step_above_fp16_max"] is not None for a in runs),
                         "nonfinite_loss": sum(a["first_nonfinite_loss_step"] is not None for a in runs),
                         "final_test_loss": [a["final_test_loss"] for a in runs]})
    # Does QK-LayerNorm, or z-loss, change how often fp16-mixed fails? Fisher's exact test (two-sided) on the
    # 2 x 2 table of failed (loss not finite) and trained runs, plain against the stabiliser alone; None with
    # fewer than 2 seeds each.
    def setting(qk, with_z):
        return next((x for x in settings if x["format"] == "binary16" and x["qk_norm"] == qk
                     and (x["z_loss"] > 0) == with_z), None)

    def fisher(plain, other):
        if not (plain and other and plain["runs"] >= 2 and other["runs"] >= 2):
            return None
        from scipy import stats  # only the several-seed test needs scipy

        table = [[plain["nonfinite_loss"], plain["runs"] - plain["nonfinite_loss"]],
                 [other["nonfinite_loss"], other["runs"] - other["nonfinite_loss"]]]
        return {"table": table, "fisher_p": float(stats.fisher_exact(table)[1])}

    plain = setting(False, False)
    return {"arms": arms, "settings": settings, "qk_norm_test": fisher(plain, setting(True, False)),
            "z_loss_test": fisher(plain, setting(False, True)),
            "seeds": sorted({a["seed"] for a in arms}), "seed": min(a["seed"] for a in arms), "fp16_max": FP16_MAX}


def label(a: dict) -> str:
    name = {"binary16": "fp16-mixed", "binary32": "fp32"}.get(a["format"], a["format"])
    text = name + (" + QK-LayerNorm" if a["qk_norm"] else "")
    if a.get("z_loss"):
        text += f" + z-loss {a['z_loss']:g}"
    return text


def verdict(found: dict) -> str:
    lines = []
    for a in found["arms"]:
        above = a["first_stats_step_above_fp16_max"]
        text = (f"{a['arm']:<32} {label(a):<26} largest attention logit {a['max_attention_logit']:.4g}"
                f"{f' (first logged above 65504 at step {above})' if above is not None else ' (never above 65504)'}; "
                f"{a['skipped_steps']} of {a['steps']} steps skipped")
        if a["first_nonfinite_loss_step"] is not None:
            text += f", loss not finite from step {a['first_nonfinite_loss_step']}"
        text += f"; validation loss {a['final_test_loss']:.4f}"
        lines.append(text)
    for x in found["settings"]:
        lines.append(f"{x['label']:<26} over seeds {x['seeds']}: largest logit above 65504 in {x['above_fp16_max']} "
                     f"of {x['runs']} runs, loss not finite in {x['nonfinite_loss']} of {x['runs']}")
    tests = [(what, found.get(key)) for what, key in (("QK-LayerNorm", "qk_norm_test"), ("z-loss", "z_loss_test"))]
    for what, test in tests:
        if test:
            lines.append(f"fp16-mixed's failures, plain against {what}: {test['table']} (failed, trained); "
                         f"Fisher's exact test, two-sided, p = {test['fisher_p']:.2g}")
    if not any(test for _, test in tests):
        lines.append("Each line is a single run (its seed in the arm's name), not a tested finding.")
    return "\n".join(lines)


def logits_figure(f, found: dict) -> Figure:
    """The largest attention logit over training per arm of the first seed (log scale), binary16's largest value
    dashed (left); the fp16 arms' cumulative skipped steps (right)."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    logit_ax, skip_ax = fig.subplots(1, 2)
    for a in (a for a in found["arms"] if a["seed"] == found["seed"]):
        logits = attention_logit_max(f, a["arm"])
        logit_ax.plot(logits["step"], logits["max"], label=label(a),
                      linestyle="-" if a["format"] == "binary16" else "--")
        if a["format"] == "binary16":
            st = ml.steps(f, a["arm"])
            skip_ax.plot(st["step"], np.cumsum(st["skipped"]), label=label(a))
    logit_ax.axhline(FP16_MAX, color="black", linewidth=1, linestyle=":")
    logit_ax.text(0, FP16_MAX * 1.3, "binary16's largest finite value, 65504", fontsize=8)
    logit_ax.set_yscale("log")
    logit_ax.set_xlabel("step")
    logit_ax.set_ylabel("largest attention logit (before rounding)")
    logit_ax.legend(fontsize=8)
    skip_ax.set_xlabel("step")
    skip_ax.set_ylabel("steps skipped so far (inf/NaN gradient)")
    skip_ax.legend(fontsize=8)
    for ax in (logit_ax, skip_ax):
        ax.grid(True, alpha=0.3)
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and attention_overflow_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("attention_overflow_logits", logits_figure(f, found)),
                ("attention_overflow_training",
                 fg.loss_accuracy(f, arms=[a["arm"] for a in found["arms"] if a["seed"] == found["seed"]]))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "attention_overflow_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "attention_overflow.toml", write)


if __name__ == "__main__":
    sys.exit(main())
