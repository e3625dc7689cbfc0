#!/usr/bin/python3
"""The dynamic loss scaler at work: backoffs, growths and skipped steps, and what they cost (issue #21, section 3).

Reads the log of `mpsim run experiments/configs/loss_scaler_dynamics.toml`: the default MLP under fp16-mixed with
GradScaler's defaults, with a start 8 binades higher, with growth after 100 clean steps, and with that plus a
hysteresis of 4, several seeds each, and fp32. Per arm: the skipped steps (non-finite gradients), the backoffs
(steps after which the scale fell) and growths, the first and last of each, the scale's range, and the final test
accuracy; per policy, the accuracy against fp32 seed by seed, tested for equivalence within 0.5 points (TOST,
notebooks/equivalence.py).

    /usr/bin/python3 notebooks/loss_scaler_dynamics.py runs/loss_scaler_dynamics.h5 [--out docs/figures]

writes loss_scaler_dynamics_*.png and loss_scaler_dynamics_findings.json into --out and prints the verdict.
"""

from __future__ import annotations

import math
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402  (beside this file)
import figures as fg  # noqa: E402
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

REFERENCE = "fp32"
MARGIN = 0.005  # the equivalence margin, fixed before the runs: 0.5 accuracy points


def arm_findings(f, arm: str) -> dict:
    info = ml.arm_info(f, arm)
    st = ml.steps(f, arm)
    step, scale, skipped = st["step"], st["loss_scale"].astype(np.float64), st["skipped"].astype(bool)
    # The scale a step ran with is recorded per step: it fell after step i when scale[i + 1] < scale[i].
    change = np.sign(np.diff(scale)) if len(scale) > 1 else np.zeros(0)
    backoffs, growths = step[:-1][change < 0], step[:-1][change > 0]
    evals = ml.evals(f, arm)
    return {"arm": arm, "policy": info["policy"], "seed": int(info["seed"]), "status": info["status"],
            "steps": int(len(step)), "skipped_steps": int(skipped.sum()),
            "skipped_at": [int(s) for s in step[skipped][:20]],
            "backoffs": int(len(backoffs)), "growths": int(len(growths)),
            "first_backoff": int(backoffs[0]) if len(backoffs) else None,
            "last_backoff": int(backoffs[-1]) if len(backoffs) else None,
            "scale_min": float(scale.min()) if len(scale) else math.nan,
            "scale_max": float(scale.max()) if len(scale) else math.nan,
            "final_scale": float(scale[-1]) if len(scale) else math.nan,
            "test_accuracy": float(evals["test_accuracy"][-1]) if len(evals["test_accuracy"]) else math.nan}


def findings(f) -> dict:
    arms = [arm_findings(f, arm) for arm in ml.arms(f)]
    order = list(dict.fromkeys(a["policy"] for a in arms))
    reference = {a["seed"]: a["test_accuracy"] for a in arms if a["policy"] == REFERENCE}
    policies = []
    for policy in order:
        runs = [a for a in arms if a["policy"] == policy]
        row = {"policy": policy, "seeds": sorted(a["seed"] for a in runs),
               "skipped_steps": [a["skipped_steps"] for a in runs], "backoffs": [a["backoffs"] for a in runs],
               "growths": [a["growths"] for a in runs], "scale_range": [min(a["scale_min"] for a in runs),
                                                                         max(a["scale_max"] for a in runs)],
               "test_accuracy": [a["test_accuracy"] for a in runs]}
        if policy != REFERENCE:
            diffs = [a["test_accuracy"] - reference[a["seed"]] for a in runs if a["seed"] in reference]
            row["equivalence"] = equivalence.paired_equivalence(diffs, MARGIN)
        policies.append(row)
    return {"arms": arms, "policies": policies, "reference": REFERENCE, "margin_points": 100 * MARGIN}


def verdict(found: dict) -> str:
    lines = [f"Per policy over seeds {found['policies'][0]['seeds']}: skipped steps, backoffs and growths per seed; "
             f"the scale's range; test accuracy against {found['reference']} (TOST within ±{found['margin_points']:g} "
             "points):"]
    for p in found["policies"]:
        text = (f"  {p['policy']:<12} skipped {p['skipped_steps']}, backoffs {p['backoffs']}, growths {p['growths']}, "
                f"scale {p['scale_range'][0]:g}..{p['scale_range'][1]:g}, "
                f"accuracy {100 * np.mean(p['test_accuracy']):.2f}%")
        if "equivalence" in p:
            text += ", " + equivalence.describe(p["equivalence"])
        lines.append(text)
    first = [(a["arm"], a["first_backoff"], a["last_backoff"]) for a in found["arms"] if a["backoffs"]]
    if first:
        lines.append("First and last backoff: " + "; ".join(f"{arm} steps {b0}..{b1}" for arm, b0, b1 in first[:6]))
    lines.append("Counts of single runs per seed; the accuracy verdicts are TOST's, not 'no significant difference'.")
    return "\n".join(lines)


def accuracy_figure(found: dict) -> Figure:
    """Test accuracy per policy and seed (dots), fp32's mean dashed, the equivalence margin shaded."""
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    reference = [p for p in found["policies"] if p["policy"] == found["reference"]]
    if reference:
        mean = 100 * float(np.mean(reference[0]["test_accuracy"]))
        ax.axhline(mean, color="black", linestyle="--", linewidth=1)
        ax.axhspan(mean - found["margin_points"], mean + found["margin_points"], color="C2", alpha=0.12, lw=0)
    for i, p in enumerate(found["policies"]):
        ax.plot([i] * len(p["test_accuracy"]), 100 * np.array(p["test_accuracy"]), "o", color=f"C{i}")
    ax.set_xticks(range(len(found["policies"])), [p["policy"] for p in found["policies"]], rotation=15)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Final test accuracy per seed; dashed: fp32's mean, green: ±0.5 points", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110):
    """Writes every figure and loss_scaler_dynamics_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        first_seed = min(a["seed"] for a in found["arms"])
    seed_arms = [a["arm"] for a in found["arms"] if a["seed"] == first_seed]
    figs = [("loss_scaler_dynamics_scale", fg.loss_scale(path, arms=seed_arms)),
            ("loss_scaler_dynamics_accuracy", accuracy_figure(found))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "loss_scaler_dynamics_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "loss_scaler_dynamics.toml", write)


if __name__ == "__main__":
    sys.exit(main())
