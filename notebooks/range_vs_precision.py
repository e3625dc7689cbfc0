#!/usr/bin/python3
"""Range against precision: which of FP16's two limits breaks a transformer that fails by itself (issue #21, section 3).

The GPT of attention_overflow.toml at lr 0.3, whose attention logits pass binary16's largest value in 300 steps,
under fp16-mixed's recipe with its 16-bit format replaced: binary16 (5 exponent bits, 10 mantissa bits), e5m7,
bfloat16 (e8m7) and e8m10 (tf32's layout), a 2 x 2 design of exponent and mantissa widths, several seeds each, and
fp32. This module reads the log of `mpsim run experiments/configs/range_vs_precision.toml` and reports per format:
how many runs failed (a non-finite training loss), the steps the loss scaler skipped, the largest attention logit,
and the validation loss of the runs that trained; then the two effects of the design (runs failed with 5 against
8 exponent bits; with 7 against 10 mantissa bits).

    /usr/bin/python3 notebooks/range_vs_precision.py runs/range_vs_precision.h5 [--out docs/figures]

writes range_vs_precision_*.png and range_vs_precision_findings.json into --out and prints the verdict.
"""

from __future__ import annotations

import math
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

import numpy as np
from scipy import stats

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_overflow as ao  # noqa: E402  (beside this file: the per-arm findings)
import figures as fg  # noqa: E402
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402


def findings(f) -> dict:
    """Per arm: attention_overflow's findings plus the format's widths, policy and seed; per policy: the summary."""
    arms = []
    for entry in ao.findings(f)["arms"]:
        info = ml.arm_info(f, entry["arm"])
        point = ml.policy(f, entry["arm"])["points"]["gemm_output"]
        entry |= {"policy": info["policy"], "seed": int(info["seed"]),
                  "exponent_bits": int(point["exponent_bits"]), "mantissa_bits": int(point["mantissa_bits"]),
                  "failed": entry["first_nonfinite_loss_step"] is not None}
        arms.append(entry)
    policies = {}
    for a in arms:
        policies.setdefault(a["policy"], []).append(a)
    summary = []
    for policy, runs in policies.items():
        trained = [r["final_test_loss"] for r in runs if not r["failed"] and math.isfinite(r["final_test_loss"])]
        summary.append({
            "policy": policy, "format": runs[0]["format"], "exponent_bits": runs[0]["exponent_bits"],
            "mantissa_bits": runs[0]["mantissa_bits"], "runs": len(runs), "failed": sum(r["failed"] for r in runs),
            "seeds": sorted(r["seed"] for r in runs),
            "skipped_steps": [r["skipped_steps"] for r in runs],
            "max_attention_logit": [r["max_attention_logit"] for r in runs],
            "trained_test_loss_mean": float(np.mean(trained)) if trained else math.nan,
            "trained_test_loss": trained})
    narrow = [s for s in summary if s["format"] != "binary32"]

    def failed_share(rows):
        runs = sum(s["runs"] for s in rows)
        return {"failed": sum(s["failed"] for s in rows), "runs": runs}

    effects = {
        "exponent_bits_5": failed_share([s for s in narrow if s["exponent_bits"] == 5]),
        "exponent_bits_8": failed_share([s for s in narrow if s["exponent_bits"] == 8]),
        "mantissa_bits_7": failed_share([s for s in narrow if s["mantissa_bits"] == 7]),
        "mantissa_bits_10": failed_share([s for s in narrow if s["mantissa_bits"] == 10]),
    }
    # Fisher's exact test (two-sided) on each factor's 2 x 2 table of failed and trained runs.
    for factor, (a, b) in {"exponent": ("exponent_bits_5", "exponent_bits_8"),
                           "mantissa": ("mantissa_bits_7", "mantissa_bits_10")}.items():
        x, y = effects[a], effects[b]
        table = [[x["failed"], x["runs"] - x["failed"]], [y["failed"], y["runs"] - y["failed"]]]
        effects[f"{factor}_fisher_p"] = float(stats.fisher_exact(table)[1]) if x["runs"] and y["runs"] else math.nan
    return {"arms": arms, "policies": summary, "effects": effects, "fp16_max": ao.FP16_MAX}


def verdict(found: dict) -> str:
    lines = ["Runs failed (non-finite training loss) / runs, per format, and the validation loss of those that "
             "trained:"]
    for s in found["policies"]:
        loss = (f"validation loss {s['trained_test_loss_mean']:.4f} (mean of {len(s['trained_test_loss'])})"
                if s["trained_test_loss"] else "no run trained")
        lines.append(f"  {s['policy']:<14} {s['format']:<9} e{s['exponent_bits']}m{s['mantissa_bits']:<3} "
                     f"failed {s['failed']}/{s['runs']} (seeds {s['seeds']}); skipped steps {s['skipped_steps']}; "
                     f"largest attention logit {max(s['max_attention_logit']):.4g}; {loss}")
    e = found["effects"]
    lines.append(f"Exponent bits: 5 -> {e['exponent_bits_5']['failed']}/{e['exponent_bits_5']['runs']} failed, "
                 f"8 -> {e['exponent_bits_8']['failed']}/{e['exponent_bits_8']['runs']}; mantissa bits: "
                 f"7 -> {e['mantissa_bits_7']['failed']}/{e['mantissa_bits_7']['runs']}, "
                 f"10 -> {e['mantissa_bits_10']['failed']}/{e['mantissa_bits_10']['runs']} (Fisher's exact test, "
                 f"two-sided: exponent p = {e['exponent_fisher_p']:.2g}, mantissa p = {e['mantissa_fisher_p']:.2g}).")
    lines.append("Runs are counted over the seeds named; the p-values test the failed/trained tables, nothing else.")
    return "\n".join(lines)


def outcome_figure(found: dict) -> Figure:
    """Left: each run's validation loss by format (x: failed runs, drawn at the top); right: the largest
    attention logit over training per run, binary16's largest value dotted."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    loss_ax, logit_ax = fig.subplots(1, 2)
    policies = [s["policy"] for s in found["policies"]]
    finite = [a["final_test_loss"] for a in found["arms"] if not a["failed"] and math.isfinite(a["final_test_loss"])]
    top = max(finite) * 1.05 if finite else 1.0
    for i, policy in enumerate(policies):
        runs = [a for a in found["arms"] if a["policy"] == policy]
        ok = [a["final_test_loss"] for a in runs if not a["failed"]]
        loss_ax.plot([i] * len(ok), ok, "o", color=f"C{i}")
        failed = sum(a["failed"] for a in runs)
        if failed:
            loss_ax.plot([i] * failed, [top] * failed, "x", color=f"C{i}", markersize=9)
        s = next(s for s in found["policies"] if s["policy"] == policy)
        for a in runs:
            logit_ax.plot(a["seed"] + 0.12 * (i - len(policies) / 2), a["max_attention_logit"], "o" if not a["failed"]
                          else "x", color=f"C{i}", label=f"{policy} (e{s['exponent_bits']}m{s['mantissa_bits']})"
                          if a is runs[0] else None)
    loss_ax.set_xticks(range(len(policies)), policies, rotation=20)
    loss_ax.set_ylabel("validation loss (nats/char); x: loss not finite")
    logit_ax.axhline(found["fp16_max"], color="black", linewidth=1, linestyle=":")
    logit_ax.set_yscale("log")
    logit_ax.set_xlabel("seed")
    logit_ax.set_ylabel("largest attention logit over training")
    logit_ax.legend(fontsize=7)
    for ax in (loss_ax, logit_ax):
        ax.grid(True, alpha=0.3)
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110):
    """Writes every figure and range_vs_precision_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("range_vs_precision_outcome", outcome_figure(found)),
                ("range_vs_precision_training", fg.loss_accuracy(f, arms=[a["arm"] for a in found["arms"]]))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "range_vs_precision_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "range_vs_precision.toml", write)


if __name__ == "__main__":
    sys.exit(main())
