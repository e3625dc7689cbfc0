#!/usr/bin/python3
"""Zero-centred norm scales with the weights in bfloat16: which updates of the norms' gammas survive?

A norm's gamma sits near 1, where bfloat16's spacing is 2^-7; AdamW moves a weight by about the learning rate per
step, so with the weights stored only in bfloat16 (no FP32 master copy) most of a gamma's updates round back to
the stored value: "swallowed" (docs/hdf5-schema.md). `model.zero_centered_gamma` stores gamma - 1 instead and
scales by 1 + gamma in binary32 (Transformer Engine's zero_centered_gamma, Megatron-LM's apply_layernorm_1p),
near 0, where bfloat16 resolves such steps. This module reads the log of
`mpsim run experiments/configs/zero_centered_gamma.toml` (a GPT with RMSNorm before and after each branch,
bf16-mixed with and without FP32 master weights, each with zero-centred gamma off and on, the same seeds) and
reports per arm: the share of the norms' nonzero updates that were swallowed, the same for the other layers,
and the final validation loss; per seed, the difference that zero-centring makes to that loss.

    /usr/bin/python3 notebooks/zero_centered_gamma.py runs/zero_centered_gamma.h5 [--out docs/figures]

writes zero_centered_gamma_*.png and zero_centered_gamma_findings.json into --out and prints the verdict.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figures as fg  # noqa: E402  (beside this file)
import mpsim_log as ml  # noqa: E402


def is_norm(layer: str) -> bool:
    """The norm layers core/src/model.cpp and layer_table.hpp name: `ln`, `blockN.ln1`, `blockN.ln2_post`, ..."""
    return layer == "ln" or ".ln" in layer


def zero_centered(f, arm: str) -> bool:
    point = {key.rsplit(".", 1)[-1]: value for key, value in ml.sweep_point(f, arm).items()}
    if "zero_centered_gamma" not in point:
        raise ValueError(f"arm {arm} has no zero_centered_gamma sweep point: not a log of zero_centered_gamma.toml")
    return point["zero_centered_gamma"] in ("true", "1")


def summed(f, arm: str, layers: list[str], per_step: bool = False) -> dict:
    """The `updates` counters of these layers, summed (one read of the arm's counters)."""
    pick = [ml.layers(f, arm).index(layer) for layer in layers]
    c = ml.kind_counters(f, arm, "updates", per_step=per_step, per_layer=True)
    return {name: value if name == "step" else value[..., pick].sum(axis=-1) for name, value in c.items()}


def arm_findings(f, arm: str) -> dict:
    info, evals = ml.arm_info(f, arm), ml.evals(f, arm)
    layers = ml.layers(f, arm)
    norms = [layer for layer in layers if is_norm(layer)]
    others = [layer for layer in layers if not is_norm(layer)]
    norm_counts, other_counts = summed(f, arm, norms), summed(f, arm, others)
    return {"arm": arm, "policy": info["policy"], "seed": int(info["seed"]), "status": info["status"],
            "zero_centered_gamma": zero_centered(f, arm), "norm_layers": norms,
            "norm_updates_nonzero": int(norm_counts.get("nonzero", 0)),
            "norm_updates_swallowed": int(norm_counts.get("swallowed", 0)),
            "norm_swallowed_share": ml.fraction(norm_counts, "swallowed"),
            "other_swallowed_share": ml.fraction(other_counts, "swallowed"),
            "final_test_loss": float(evals["test_loss"][-1]) if len(evals["test_loss"]) else math.nan}


def sign_test(differences: list[float]) -> dict:
    """Two-sided exact sign test of 'the median paired difference is 0' (ties dropped): no distribution assumed."""
    below = sum(d < 0 for d in differences)
    n = sum(d != 0 for d in differences)
    k = min(below, n - below)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else math.nan
    return {"n": n, "negative": below, "p_two_sided": p}


def findings(f) -> dict:
    arms = sorted((arm_findings(f, arm) for arm in ml.arms(f)),
                  key=lambda a: (a["policy"], a["seed"], a["zero_centered_gamma"]))
    paired = []
    for policy in sorted({a["policy"] for a in arms}):
        for seed in sorted({a["seed"] for a in arms if a["policy"] == policy}):
            pair = {a["zero_centered_gamma"]: a for a in arms if a["policy"] == policy and a["seed"] == seed}
            if set(pair) == {False, True}:
                paired.append({"policy": policy, "seed": seed,
                               "loss_zero_centered_minus_plain": pair[True]["final_test_loss"]
                               - pair[False]["final_test_loss"]})
    tests = {}
    for policy in sorted({p["policy"] for p in paired}):
        d = [p["loss_zero_centered_minus_plain"] for p in paired if p["policy"] == policy]
        tests[policy] = {"mean": float(np.mean(d)), "std": float(np.std(d, ddof=1)) if len(d) > 1 else math.nan,
                         **sign_test(d)}
    return {"arms": arms, "paired": paired, "tests": tests}


def verdict(found: dict) -> str:
    lines = []
    for a in found["arms"]:
        lines.append(f"{a['arm']:<48} norms' nonzero updates swallowed {100 * a['norm_swallowed_share']:6.2f}% "
                     f"(of {a['norm_updates_nonzero']}), other layers' {100 * a['other_swallowed_share']:6.2f}%; "
                     f"final validation loss {a['final_test_loss']:.4f}")
    for policy, t in found["tests"].items():
        d = [p["loss_zero_centered_minus_plain"] for p in found["paired"] if p["policy"] == policy]
        lines.append(f"{policy}: final validation loss, zero-centred minus plain, per seed "
                     f"[{', '.join(f'{x:+.4f}' for x in d)}]: mean {t['mean']:+.4f} (sd {t['std']:.4f}); "
                     f"{t['negative']} of {t['n']} below 0, two-sided sign test p = {t['p_two_sided']:.3g}")
    seeds = sorted({a["seed"] for a in found["arms"]})
    lines.append(f"Seeds {seeds}, paired (the same initial function and batches). The swallowed shares count every "
                 "instrumented step's updates (docs/hdf5-schema.md, tensor kind `updates`).")
    return "\n".join(lines)


def swallowed_figure(f, found: dict):
    """The norms' swallowed share per instrumented step, one line per arm (seeds averaged)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    groups = sorted({(a["policy"], a["zero_centered_gamma"]) for a in found["arms"]})
    for policy, centred in groups:
        series = []
        for a in found["arms"]:
            if a["policy"] == policy and a["zero_centered_gamma"] == centred:
                c = summed(f, a["arm"], a["norm_layers"], per_step=True)
                series.append((c["step"], ml.fraction(c, "swallowed")))
        if not series:
            continue
        steps = series[0][0]
        share = np.nanmean([s for _, s in series], axis=0)
        ax.plot(steps, 100 * share, label=f"{policy}, {'1 + gamma' if centred else 'gamma'} ({len(series)} seeds)")
    ax.set_xlabel("step")
    ax.set_ylabel("norms' nonzero updates swallowed (%)")
    ax.set_title("Norm scales' updates lost to the stored weight format")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def loss_difference_figure(found: dict):
    """Per seed, the final validation loss with a zero-centred gamma minus the plain one's, per policy: the
    paired comparison the verdict tests (the master-copy policy is the control)."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    policies = sorted(found["tests"])
    for i, policy in enumerate(policies):
        d = [p["loss_zero_centered_minus_plain"] for p in found["paired"] if p["policy"] == policy]
        t = found["tests"][policy]
        ax.plot(np.full(len(d), i) + np.linspace(-0.08, 0.08, len(d)), d, "o", color=f"C{i}", alpha=0.8)
        ax.hlines(t["mean"], i - 0.25, i + 0.25, color=f"C{i}", lw=2)
        ax.annotate(f"mean {t['mean']:+.3f}\n{t['negative']} of {t['n']} < 0, sign test p = {t['p_two_sided']:.2g}",
                    (i + 0.28, t["mean"]), fontsize=8, va="center")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(policies)), policies)
    ax.set_xlim(-0.5, len(policies) + 0.5)
    ax.set_ylabel("validation loss difference (nats/char)")
    ax.set_title("Zero-centred against plain gamma, paired per seed")
    fig.tight_layout()
    return fig


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and zero_centered_gamma_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("zero_centered_gamma_swallowed", swallowed_figure(f, found)),
                ("zero_centered_gamma_loss_difference", loss_difference_figure(found))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "zero_centered_gamma_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "zero_centered_gamma.toml", write)


if __name__ == "__main__":
    sys.exit(main())
