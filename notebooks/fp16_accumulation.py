#!/usr/bin/python3
"""FP16 accumulation in training: FP32 sums against FP16 sums and the H100 tensor core's (issue #21, section 3).

Reads the log of `mpsim run experiments/configs/fp16_accumulation.toml`: an MLP (784-64-64-10) on Fashion-MNIST
under fp16-mixed with its GEMMs summed in binary32 (the paper's third technique), in binary16 (every partial sum
rounded), and as the H100 tensor core sums binary16 products, several seeds each, and fp32. Per policy: the test
accuracy per seed and against fp32 seed by seed, tested for equivalence within 0.5 points (TOST,
notebooks/equivalence.py), and the loss scaler's skipped steps; the training curves of the first seed.

    /usr/bin/python3 notebooks/fp16_accumulation.py runs/fp16_accumulation.h5 [--out docs/figures]

writes fp16_accumulation_*.png and fp16_accumulation_findings.json into --out and prints the verdict.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402  (beside this file)
import figures as fg  # noqa: E402
import loss_scaler_dynamics as lsd  # noqa: E402  (per-arm records and the accuracy test, shared)
import mpsim_log as ml  # noqa: E402


def findings(f) -> dict:
    found = lsd.findings(f)
    for p in found["policies"]:
        policy = ml.policy(f, next(a["arm"] for a in found["arms"] if a["policy"] == p["policy"]))
        p["accumulation"] = policy["points"]["accumulation"]["format"]
        p["gemm"] = str(policy.get("gemm", "ieee"))
    return found


def verdict(found: dict) -> str:
    lines = [f"Test accuracy per policy over seeds {found['policies'][0]['seeds']} against {found['reference']} "
             f"(TOST within ±{found['margin_points']:g} points):"]
    for p in found["policies"]:
        text = (f"  {p['policy']:<16} accumulation {p['accumulation']:<9} gemm {p['gemm']:<5} accuracy "
                f"{', '.join(f'{100 * a:.2f}%' for a in p['test_accuracy'])}; skipped steps {p['skipped_steps']}")
        if "equivalence" in p:
            text += "; " + equivalence.describe(p["equivalence"])
        lines.append(text)
    lines.append("Single runs per seed; the verdicts are TOST's, not 'no significant difference'.")
    return "\n".join(lines)


def write_all(path, out_dir="docs/figures", dpi: int = 110):
    """Writes every figure and fp16_accumulation_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        first = min(a["seed"] for a in found["arms"])
        training = fg.loss_accuracy(f, arms=[a["arm"] for a in found["arms"] if a["seed"] == first])
    figs = [("fp16_accumulation_accuracy", lsd.accuracy_figure(found)), ("fp16_accumulation_training", training)]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "fp16_accumulation_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "fp16_accumulation.toml", write)


if __name__ == "__main__":
    sys.exit(main())
