#!/usr/bin/python3
"""FP16 without loss scaling on the ViT: does it fail by itself? (issue #20, section 5).

The small Vision Transformer of experiments/configs/vit.toml on Fashion-MNIST, trained in fp32, bf16-mixed,
fp16-mixed (dynamic loss scaling) and fp16-mixed without loss scaling, the same initial weights and batches, no
loss weighting. This module reads the log of `mpsim run experiments/configs/vit.toml` and reports per arm: the
final test accuracy and loss, the steps the loss scaler skipped and its backoffs, and the share of nonzero
activation and weight gradients that the arm's rounding made zero (and of those below binary16's smallest
subnormal, 2^-24, before rounding).

    /usr/bin/python3 notebooks/vit.py runs/vit.h5 [--out docs/figures]

writes vit_*.png and vit_findings.json into --out and prints the verdict.
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


def arm_findings(f, arm: str) -> dict:
    """One arm's outcome, from its own records and its stored policy."""
    info, p = ml.arm_info(f, arm), ml.policy(f, arm)
    evals, st = ml.evals(f, arm), ml.steps(f, arm)
    skipped = np.flatnonzero(st["skipped"])
    scale = np.asarray(st["loss_scale"], dtype=float)
    entry = {"arm": arm, "policy": info["policy"], "seed": int(info["seed"]), "status": info["status"],
             "format": p["points"]["activations"]["format"], "loss_scaling": str(p["loss_scale"]["mode"]),
             "final_test_accuracy": float(evals["test_accuracy"][-1]) if len(evals["test_accuracy"]) else math.nan,
             "final_test_loss": float(evals["test_loss"][-1]) if len(evals["test_loss"]) else math.nan,
             "steps": int(len(st["step"])), "skipped_steps": int(len(skipped)),
             "skipped_step_numbers": [int(st["step"][i]) for i in skipped],  # the scaler backs off after each
             "final_loss_scale": float(scale[-1]) if len(scale) else math.nan}
    for kind in ("activation_grads", "weight_grads"):
        c = ml.kind_counters(f, arm, kind)
        entry[f"{kind}_rounded_to_zero"] = ml.fraction(c, "rounded_to_zero")
        entry[f"{kind}_below_2^-24"] = ml.fraction(c, "below_2^-24")
    return entry


def findings(f) -> dict:
    arms = [arm_findings(f, arm) for arm in ml.arms(f)]
    reference = next((a for a in arms if a["format"] == "binary32"), None)
    if reference is None:
        raise ValueError("no binary32 arm to compare with: not a log of experiments/configs/vit.toml")
    for a in arms:
        a["accuracy_vs_fp32"] = a["final_test_accuracy"] - reference["final_test_accuracy"]
        a["loss_vs_fp32"] = a["final_test_loss"] - reference["final_test_loss"]
    return {"arms": arms, "reference_arm": reference["arm"], "seed": reference["seed"]}


def verdict(found: dict) -> str:
    lines = []
    for a in found["arms"]:
        text = (f"{a['arm']:<18} test accuracy {100 * a['final_test_accuracy']:.2f}% "
                f"({100 * a['accuracy_vs_fp32']:+.2f} points against fp32), test loss {a['final_test_loss']:.4f}; "
                f"{a['skipped_steps']} of {a['steps']} steps skipped")
        if a["skipped_step_numbers"]:
            text += (f" (steps {a['skipped_step_numbers'][:10]}, the loss scale halved after each; "
                     f"{a['final_loss_scale']:g} at the end)")
        text += (f"; activation gradients rounded to zero {100 * a['activation_grads_rounded_to_zero']:.3f}% "
                 f"of nonzero ({100 * a['activation_grads_below_2^-24']:.3f}% below 2^-24)")
        lines.append(text)
    lines.append("One seed: each line is a single run, not a tested finding.")
    return "\n".join(lines)


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and vit_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("vit_training", fg.loss_accuracy(f)),
                ("vit_loss_scale", fg.loss_scale(f, arms=[a["arm"] for a in found["arms"]
                                                          if a["format"] == "binary16"])),
                ("vit_underflow", fg.underflow(f))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "vit_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "vit.toml", write)


if __name__ == "__main__":
    sys.exit(main())
