"""Master-weights study (issue #6, study e): how many weight updates does FP16
storage swallow, against an FP32 master copy, across learning rates, and what
does it cost in accuracy? Micikevicius et al., "Mixed Precision Training",
ICLR 2018 (arXiv:1710.03740), Section 3.1.

    /usr/bin/python3 notebooks/master_weights.py runs/master_weights.h5 [--out docs/figures]

A "swallowed" update is a nonzero update u with round(w + u) == w: the weight
did not move. With weights stored in FP16 that happens when |u| is below half
an FP16 ulp of w, i.e. roughly |w| > 2^11 |u| (the paper's ratio argument), and
whenever |u| < 2^-25 (below half of FP16's smallest subnormal). The log counts
them per layer on instrumented steps (counter `swallowed` of tensor kind
`updates`, docs/hdf5-schema.md).

Arms of a sweep are named POLICY@LABEL (docs/configs.md); this module reads an
arm's policy, seed and learning rate from its attributes and its per-step
records, so it works on sweeps and on logs of separate runs alike.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

if __name__ == "__main__":
    os.environ["MPLBACKEND"] = "Agg"  # files only; no display needed

import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402  (beside this file)
import figures  # noqa: E402
import mpsim_log as ml  # noqa: E402

MASTER, NO_MASTER = "fp16-master", "fp16-nomaster"
LABELS = {MASTER: "FP16 compute, FP32 master weights", NO_MASTER: "FP16 weights, no master copy"}


# --- reading -----------------------------------------------------------------


def update_counts(f, arm) -> dict[str, dict[str, int]]:
    """Per layer with parameters: counters of its updates summed over the instrumented steps."""
    result = {}
    for layer in ml.layers(f, arm):
        totals = ml.kind_counters(f, arm, "updates", layer=layer)
        if totals["elements"]:  # layers without parameters (ReLU) have no updates
            result[layer] = totals
    return result


def load_runs(path) -> list[dict]:
    """One record per finished arm: policy, seed, learning rate, final accuracy, per-layer update counters.

    The learning rate is the first step's (the study's schedule is constant);
    a stopped arm (non-finite loss) keeps accuracy NaN."""
    records = []
    with ml.open_log(path) as f:
        for arm in ml.arms(f):
            info = ml.arm_info(f, arm)
            if info["status"] == "running":
                continue  # not finished (still running, or killed)
            st, ev = ml.steps(f, arm), ml.evals(f, arm)
            lr = float(st["learning_rate"][0]) if len(st["learning_rate"]) else float(
                ml.sweep_point(f, arm).get("lr", "nan"))
            completed = info["status"] == "completed"
            records.append({
                "arm": arm, "policy": info["policy"], "seed": int(info["seed"]), "lr": lr,
                "status": info["status"],
                "accuracy": float(ev["test_accuracy"][-1]) if completed and len(ev["test_accuracy"]) else math.nan,
                "layers": update_counts(f, arm),
                "totals": ml.kind_counters(f, arm, "updates"),  # all layers
                "swallowed_by_step": swallowed_by_step(f, arm),
            })
    return sorted(records, key=lambda r: (r["policy"], r["lr"], r["seed"]))


def swallowed_by_step(f, arm) -> tuple[np.ndarray, np.ndarray]:
    """(steps, fraction of nonzero updates swallowed at that step, all layers together)."""
    c = ml.kind_counters(f, arm, "updates", per_step=True)
    return c["step"], ml.fraction(c, "swallowed", "nonzero")


# --- numbers -------------------------------------------------------------------


def fraction(counts: dict, counter: str) -> float:
    """counter / nonzero updates: the share of the updates that were meant to move a weight."""
    return ml.fraction(counts, counter, "nonzero")


def total(record) -> dict:
    """A record's counters summed over its layers."""
    return record["totals"]


# The margin of "no cost" in the per-seed test of the accuracy cost: 0.5 points, as the parity study's.
COST_MARGIN = 0.005


def policies(records) -> list[str]:
    found = sorted({r["policy"] for r in records})
    return [p for p in (MASTER, NO_MASTER) if p in found] + [p for p in found if p not in (MASTER, NO_MASTER)]


def curve(records, policy, value) -> tuple[np.ndarray, np.ndarray]:
    """(learning rates, mean over seeds of value(record)) for one policy."""
    lrs = sorted({r["lr"] for r in records if r["policy"] == policy})
    ys = [np.nanmean([value(r) for r in records if r["policy"] == policy and r["lr"] == lr]) for lr in lrs]
    return np.array(lrs), np.array(ys)


def table(records) -> list[dict]:
    """Per learning rate: swallowed share and accuracy of both policies, and the accuracy cost."""
    rows = []
    for lr in sorted({r["lr"] for r in records}):
        row = {"lr": lr}
        for policy in policies(records):
            picked = [r for r in records if r["policy"] == policy and r["lr"] == lr]
            if not picked:
                continue
            row[policy] = {
                "swallowed": float(np.nanmean([fraction(total(r), "swallowed") for r in picked])),
                "below_2^-24": float(np.nanmean([fraction(total(r), "below_2^-24") for r in picked])),
                "accuracy": float(np.nanmean([r["accuracy"] for r in picked])) if any(
                    np.isfinite(r["accuracy"]) for r in picked) else math.nan,
                "stopped": sum(r["status"] != "completed" for r in picked),
                "per_layer_swallowed": {layer: float(np.mean([fraction(r["layers"][layer], "swallowed")
                                                              for r in picked if layer in r["layers"]]))
                                        for layer in picked[0]["layers"]},
            }
        if MASTER in row and NO_MASTER in row:
            row["accuracy_cost"] = row[MASTER]["accuracy"] - row[NO_MASTER]["accuracy"]
            # Per seed, the two policies paired (same initial weights and batches), with its 95% interval.
            by_seed = {p: {r["seed"]: r["accuracy"] for r in records if r["policy"] == p and r["lr"] == lr}
                       for p in (MASTER, NO_MASTER)}
            seeds, costs = equivalence.paired_by_seed(by_seed[MASTER], by_seed[NO_MASTER])
            row["seeds"] = seeds
            row["accuracy_cost_per_seed"] = costs.tolist()
            if len(seeds) >= 2:
                test = equivalence.paired_equivalence(row["accuracy_cost_per_seed"], COST_MARGIN)
                row["accuracy_cost_ci95"] = test["ci95"]
                row["accuracy_cost_verdict"] = test["verdict"]
        rows.append(row)
    return rows


# --- figures ---------------------------------------------------------------------


def plot_swallowed(records):
    """Swallowed share of nonzero updates per layer against the learning rate, both policies."""
    layers = list(records[0]["layers"]) if records else []
    fig, axes = plt.subplots(1, len(layers), figsize=(4 * len(layers), 4), sharey=True, squeeze=False)
    for ax, layer in zip(axes[0], layers):
        for i, policy in enumerate(policies(records)):
            lrs, ys = curve(records, policy, lambda r: fraction(r["layers"][layer], "swallowed"))
            ax.semilogx(lrs, 100 * ys, marker="o", color=f"C{i}", label=LABELS.get(policy, policy))
        ax.set_title(f"{layer}: updates lost in the weight")
        ax.set_xlabel("learning rate (SGD, constant)")
        ax.set_ylim(-3, 103)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("swallowed / nonzero updates (%)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("Swallowed weight updates: round(w + u) == w although u != 0")
    fig.tight_layout()
    return fig


def plot_accuracy(records):
    """Final test accuracy against the learning rate (left) and the cost of dropping the master copy (right)."""
    fig, (ax, ax_cost) = plt.subplots(1, 2, figsize=(10, 4))
    for i, policy in enumerate(policies(records)):
        lrs, ys = curve(records, policy, lambda r: r["accuracy"])
        ax.semilogx(lrs, 100 * ys, marker="o", color=f"C{i}", label=LABELS.get(policy, policy))
    ax.set_xlabel("learning rate (SGD, constant)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("Accuracy against learning rate")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    rows = [r for r in table(records) if "accuracy_cost" in r]
    ax_cost.semilogx([r["lr"] for r in rows], [100 * r["accuracy_cost"] for r in rows], marker="s", color="k",
                     label="mean over seeds")
    for r in rows:  # each seed's paired cost
        ax_cost.plot([r["lr"]] * len(r["accuracy_cost_per_seed"]), [100 * c for c in r["accuracy_cost_per_seed"]],
                     "o", color="0.5", ms=4, alpha=0.7)
    ax_cost.axhline(0, color="0.5", lw=0.8)
    ax_cost.set_xlabel("learning rate (SGD, constant)")
    ax_cost.set_ylabel("accuracy: master − no master (pp)")
    ax_cost.set_title("Accuracy cost of FP16-only weights")
    ax_cost.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_over_training(records, policy=NO_MASTER):
    """Swallowed share at each instrumented step, one line per learning rate: does it persist?"""
    fig, ax = plt.subplots(figsize=(7, 4))
    picked = [r for r in records if r["policy"] == policy]
    for i, r in enumerate(sorted(picked, key=lambda r: r["lr"])):
        steps, frac = r["swallowed_by_step"]
        ax.plot(steps, 100 * frac, color=plt.cm.viridis(i / max(1, len(picked) - 1)), label=f"lr={r['lr']:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("swallowed / nonzero updates (%)")
    ax.set_title(f"{LABELS.get(policy, policy)}: swallowed updates during training")
    ax.set_ylim(-3, 103)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


# --- verdict -------------------------------------------------------------------------


def verdict(records) -> str:
    rows = table(records)
    lines = ["Master weights: swallowed share of nonzero updates (all layers) and final test accuracy per lr:",
             f"  {'lr':>8}  {'swallowed, FP32 master':>22}  {'swallowed, FP16 weights':>23}"
             f"  {'acc master':>10}  {'acc FP16':>8}  {'cost (pp)':>9}"]
    for r in rows:
        m, n = r.get(MASTER), r.get(NO_MASTER)
        if not (m and n):
            continue
        ci = (f"  (95% CI {100 * r['accuracy_cost_ci95'][0]:+.2f} .. {100 * r['accuracy_cost_ci95'][1]:+.2f} over "
              f"seeds {r['seeds']}: {r['accuracy_cost_verdict']})" if "accuracy_cost_ci95" in r else "")
        lines.append(f"  {r['lr']:>8g}  {100 * m['swallowed']:>21.2f}%  {100 * n['swallowed']:>22.2f}%"
                     f"  {100 * m['accuracy']:>9.2f}%  {100 * n['accuracy']:>7.2f}%  {100 * r['accuracy_cost']:>+9.2f}"
                     + ci)
    full = [r for r in rows if "accuracy_cost" in r and np.isfinite(r["accuracy_cost"])]
    if full:
        worst = max(full, key=lambda r: r["accuracy_cost"])
        n = worst[NO_MASTER]
        lines.append(f"Largest cost at lr={worst['lr']:g}: {100 * worst['accuracy_cost']:+.2f} pp "
                     f"({100 * n['swallowed']:.1f}% of FP16-stored updates swallowed, "
                     f"{100 * worst[MASTER]['swallowed']:.2f}% with the FP32 master copy; "
                     f"{100 * n['below_2^-24']:.1f}% of the updates were below 2^-24).")
        best = min(full, key=lambda r: abs(r["accuracy_cost"]))
        lines.append(f"Smallest cost at lr={best['lr']:g}: {100 * best['accuracy_cost']:+.2f} pp "
                     f"({100 * best[NO_MASTER]['swallowed']:.1f}% swallowed).")
    return "\n".join(lines)


def findings(records) -> dict:
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return {"study": "master_weights", "policies": {p: LABELS.get(p, p) for p in policies(records)},
            "per_lr": [clean(r) for r in table(records)],
            "paper": {"source": "Micikevicius et al. 2018, Section 3.1 and Figure 2a",
                      "claim": "updating FP16 weights without an FP32 master copy cost their Mandarin speech "
                               "model 80% relative accuracy; about 5% of its weight gradients were below 2^-24"}}


def save_all(path, out_dir):
    records = load_runs(path)
    if not records:
        raise SystemExit(f"{path}: no finished arms")
    figs = [("master_weights_swallowed", plot_swallowed(records)),
            ("master_weights_accuracy", plot_accuracy(records)),
            ("master_weights_over_training", plot_over_training(records))]
    written = figures.save_study(out_dir, figs, findings(records), "master_weights_findings.json")
    for _, fig in figs:
        plt.close(fig)
    return written, verdict(records)


if __name__ == "__main__":
    sys.exit(figures.study_main(None, __doc__.splitlines()[0], "master_weights.toml",
                                lambda args: save_all(args.log, args.out)))
