#!/usr/bin/python3
"""FP16 attention with FlashAttention-2's binary32 logits: does the attention-logit overflow still happen?

The GPT of attention_overflow.toml at lr 0.3, whose attention logits pass binary16's largest finite value (65504)
within 300 steps, in fp32 and under fp16-mixed, each with the unfused attention (the logits a binary16 GEMM
output) and with `model.fused_attention` (FlashAttention-2's online softmax: logits in binary32, exp(s - m)
rounded to binary16 as the value product's operand; docs/transformers.md). This module reads the log of
`mpsim run experiments/configs/fused_attention.toml` and reports per arm what notebooks/attention_overflow.py
reports (largest attention logit, skipped steps, first non-finite loss, validation loss); per setting the failed
runs over the seeds; Fisher's exact test of fp16-mixed's failures, unfused against fused; and the validation loss
of fused fp16-mixed against fused fp32, paired by seed (TOST, margin 0.02 nats/char, fixed before the runs).

    /usr/bin/python3 notebooks/fused_attention.py runs/fused_attention.h5 [--out docs/figures]

writes fused_attention_*.png and fused_attention_findings.json into --out and prints the verdict.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_overflow as ao  # noqa: E402  (beside this file: the per-arm findings)
import figures as fg  # noqa: E402
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

MARGIN = 0.02  # nats/char: the equivalence margin of fused fp16-mixed against fused fp32


def describe(f, arm: str) -> dict:
    p = ml.policy(f, arm)
    point = ml.sweep_point(f, arm)
    return {"format": p["points"]["gemm_output"]["format"],
            "fused": point.get("fused_attention", "false") == "true"}


def label(a: dict) -> str:
    name = {"binary16": "fp16-mixed", "binary32": "fp32"}.get(a["format"], a["format"])
    return f"{name}, {'fused' if a['fused'] else 'unfused'}"


def failed(a: dict) -> bool:
    return a["first_nonfinite_loss_step"] is not None


def findings(f) -> dict:
    arms = [{**ao.arm_findings(f, arm), **describe(f, arm)} for arm in ml.arms(f)]
    settings = []
    for fmt, fused in sorted({(a["format"], a["fused"]) for a in arms}, key=lambda k: (k[0] != "binary32", k[1])):
        runs = sorted((a for a in arms if a["format"] == fmt and a["fused"] == fused), key=lambda a: a["seed"])
        settings.append({"label": label(runs[0]), "format": fmt, "fused": fused, "seeds": [a["seed"] for a in runs],
                         "runs": len(runs),
                         "above_fp16_max": sum(a["first_stats_step_above_fp16_max"] is not None for a in runs),
                         "failed": sum(failed(a) for a in runs),
                         "skipped_steps": [a["skipped_steps"] for a in runs],
                         "final_test_loss": [a["final_test_loss"] for a in runs]})

    def setting(fmt, fused):
        return next((x for x in settings if x["format"] == fmt and x["fused"] == fused), None)

    found = {"arms": arms, "settings": settings, "seeds": sorted({a["seed"] for a in arms}),
             "seed": min(a["seed"] for a in arms), "fp16_max": ao.FP16_MAX, "margin": MARGIN,
             "fused_test": None, "fp16_vs_fp32_fused": None}
    unfused, fused = setting("binary16", False), setting("binary16", True)
    if unfused and fused and unfused["runs"] >= 2 and fused["runs"] >= 2:
        from scipy import stats  # only the several-seed tests need scipy

        import equivalence

        table = [[unfused["failed"], unfused["runs"] - unfused["failed"]],
                 [fused["failed"], fused["runs"] - fused["failed"]]]
        found["fused_test"] = {"table": table, "fisher_p": float(stats.fisher_exact(table)[1])}
        # Fused fp16-mixed against fused fp32, seed by seed, over the seeds where both trained.
        loss = {(a["format"], a["seed"]): a["final_test_loss"] for a in arms if a["fused"] and not failed(a)}
        seeds = [s for s in found["seeds"] if ("binary16", s) in loss and ("binary32", s) in loss]
        if len(seeds) >= 2:
            differences = np.array([loss[("binary16", s)] - loss[("binary32", s)] for s in seeds])
            found["fp16_vs_fp32_fused"] = {"seeds": seeds, "differences": differences.tolist(),
                                           **equivalence.paired_equivalence(differences, MARGIN)}
    return found


def verdict(found: dict) -> str:
    lines = []
    for a in found["arms"]:
        above = a["first_stats_step_above_fp16_max"]
        text = (f"{a['arm']:<36} {label(a):<20} largest attention logit {a['max_attention_logit']:.4g}"
                f"{f' (first logged above 65504 at step {above})' if above is not None else ' (never above 65504)'}; "
                f"{a['skipped_steps']} of {a['steps']} steps skipped")
        if failed(a):
            text += f", loss not finite from step {a['first_nonfinite_loss_step']}"
        text += f"; validation loss {a['final_test_loss']:.4f}"
        lines.append(text)
    for x in found["settings"]:
        lines.append(f"{x['label']:<20} over seeds {x['seeds']}: largest logit above 65504 in {x['above_fp16_max']} "
                     f"of {x['runs']} runs, loss not finite in {x['failed']} of {x['runs']}")
    test = found["fused_test"]
    if test:
        lines.append(f"fp16-mixed's failures, unfused against fused: {test['table']} (failed, trained); "
                     f"Fisher's exact test, two-sided, p = {test['fisher_p']:.2g}")
    else:
        lines.append("Each line is a single run (its seed in the arm's name), not a tested finding.")
    eq = found["fp16_vs_fp32_fused"]
    if eq:
        import equivalence

        lines.append(f"fused fp16-mixed - fused fp32, validation loss, seeds {eq['seeds']}: "
                     f"{equivalence.describe(eq, 1.0, 'nats/char', 4)} (margin {MARGIN})")
    return "\n".join(lines)


def logits_figure(f, found: dict) -> Figure:
    """The largest attention logit over training per arm of the first seed (log scale), binary16's largest value
    dotted (left); each setting's final validation loss per seed, failed runs marked at the top (right)."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    logit_ax, loss_ax = fig.subplots(1, 2)
    for a in (a for a in found["arms"] if a["seed"] == found["seed"]):
        logits = ao.attention_logit_max(f, a["arm"])
        logit_ax.plot(logits["step"], logits["max"], label=label(a), linestyle="-" if a["fused"] else "--")
    logit_ax.axhline(ao.FP16_MAX, color="black", linewidth=1, linestyle=":")
    logit_ax.text(0, ao.FP16_MAX * 1.3, "binary16's largest finite value, 65504", fontsize=8)
    logit_ax.set_yscale("log")
    logit_ax.set_xlabel("step")
    logit_ax.set_ylabel("largest attention logit (binary32, before rounding)")
    logit_ax.legend(fontsize=8)
    trained = [a["final_test_loss"] for a in found["arms"] if not failed(a) and np.isfinite(a["final_test_loss"])]
    top = max(trained) + 0.1 if trained else 1.0
    for i, x in enumerate(found["settings"]):
        runs = [a for a in found["arms"] if a["format"] == x["format"] and a["fused"] == x["fused"]]
        trained_runs = [a["final_test_loss"] for a in runs if not failed(a) and np.isfinite(a["final_test_loss"])]
        loss_ax.scatter([i] * len(trained_runs), trained_runs, marker="o", color="C0")
        if len(trained_runs) < len(runs):  # the failed runs as one cross, with their count
            loss_ax.scatter([i], [top], marker="x", color="C3")
            loss_ax.annotate(f"{len(runs) - len(trained_runs)} of {len(runs)} failed", (i, top),
                             textcoords="offset points", xytext=(6, -3), fontsize=8)
    loss_ax.set_xticks(range(len(found["settings"])), [x["label"] for x in found["settings"]], fontsize=8)
    loss_ax.set_ylabel("final validation loss (nats/char); x: loss not finite")
    for ax in (logit_ax, loss_ax):
        ax.grid(True, alpha=0.3)
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and fused_attention_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("fused_attention_logits", logits_figure(f, found)),
                ("fused_attention_training",
                 fg.loss_accuracy(f, arms=[a["arm"] for a in found["arms"] if a["seed"] == found["seed"]]))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "fused_attention_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "fused_attention.toml", write)


if __name__ == "__main__":
    sys.exit(main())
