#!/usr/bin/python3
"""Block-scaled formats on a transformer: a SwiGLU GPT under bf16-mixed, fp8-delayed, mxfp8 and nvfp4 (issue #20).

The recipes of issue #19 (docs/policies.md) on a character-level GPT with LLaMA's SwiGLU MLPs and RMSNorm. This
module reads the log of `mpsim run experiments/configs/transformer_blocks.toml` and puts side by side: each arm's
validation loss against bf16-mixed's; per layer and GEMM operand, the share of nonzero elements the block
quantization rounded to zero and the share it saturated; and the SwiGLU outputs' largest magnitude over training
(the top binade of their histogram), the activation outliers Fishman et al. (2024, "Scaling FP8 training to
trillion-token LLMs") trace FP8's late failures to.

    /usr/bin/python3 notebooks/transformer_blocks.py runs/transformer_blocks.h5 [--out docs/figures]

writes transformer_blocks_*.png and transformer_blocks_findings.json into --out and prints the verdict.
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
import equivalence  # noqa: E402  (beside this file)
import figures as fg  # noqa: E402
import mpsim_log as ml  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

# The equivalence margin for a validation-loss difference, as in transformer_precision.py: 0.02 nats/char.
MARGIN = 0.02

OPERANDS = ("fprop_activations", "fprop_weights", "dgrad_gradients", "dgrad_weights", "wgrad_gradients",
            "wgrad_activations")


def glu_layers(f, arm: str) -> list[str]:
    return [name for name in ml.layers(f, arm) if name.endswith("_glu")]


def glu_top_binade(f, arm: str) -> dict:
    """The SwiGLU outputs' top binade (log2 of their largest magnitude, to within a factor of 2) at each stats step,
    over every gated layer: {"step": steps, "top_binade": values}."""
    steps, tops = None, None
    b = ml.bins(f, arm)
    for layer in glu_layers(f, arm):
        s, _, counts = ml.histogram(f, arm, layer, "activations")
        top = ml.top_binade(counts, b).astype(float)
        steps, tops = s, top if tops is None else np.fmax(tops, top)
    return {"step": steps if steps is not None else np.array([]),
            "top_binade": tops if tops is not None else np.array([])}


def findings(f) -> dict:
    arms = []
    for arm in ml.arms(f):
        evals = ml.evals(f, arm)
        info = ml.arm_info(f, arm)
        entry = {"arm": arm, "policy": info["policy"], "seed": int(info["seed"]), "status": info["status"],
                 "final_test_loss": float(evals["test_loss"][-1]) if len(evals["test_loss"]) else math.nan,
                 "block_scaled": ml.has_block_stats(f, arm), "operands": {}}
        if entry["block_scaled"]:
            for operand in OPERANDS:
                b = ml.block_stats(f, arm, operand=operand)
                entry["operands"][operand] = {"rounded_to_zero": ml.ratio(b["rounded_to_zero"], b["nonzero"]),
                                              "saturated": ml.ratio(b["saturated"], b["elements"]),
                                              "elements": int(b["elements"])}
        top = glu_top_binade(f, arm)
        entry["glu_top_binade_first"] = float(top["top_binade"][0]) if len(top["top_binade"]) else math.nan
        entry["glu_top_binade_max"] = float(np.nanmax(top["top_binade"])) if len(top["top_binade"]) else math.nan
        arms.append(entry)
    # The reference: the config's first policy without block points (bf16-mixed in transformer_blocks.toml).
    plain = [a["policy"] for a in arms if not a["block_scaled"]]
    if not plain:
        raise ValueError("no arm without block points to compare with: not a log of transformer_blocks.toml")
    reference_policy = ml.config_order(f, plain)[0]
    references = {a["seed"]: a for a in arms if a["policy"] == reference_policy}
    for a in arms:  # against the reference of the same seed
        a["loss_vs_reference"] = (a["final_test_loss"] - references[a["seed"]]["final_test_loss"]
                                  if a["seed"] in references else math.nan)
    first = min(references)
    policies = []
    for name in ml.config_order(f, [a["policy"] for a in arms]):
        runs = sorted((a for a in arms if a["policy"] == name), key=lambda a: a["seed"])
        row = {"policy": name, "seeds": [a["seed"] for a in runs],
               "final_test_loss": [a["final_test_loss"] for a in runs],
               "loss_vs_reference": [a["loss_vs_reference"] for a in runs]}
        if name != references[first]["policy"]:
            row["equivalence"] = equivalence.paired_equivalence(row["loss_vs_reference"], MARGIN)
        policies.append(row)
    return {"arms": arms, "policies": policies, "reference_arm": references[first]["arm"],
            "reference_policy": references[first]["policy"], "seeds": sorted(references), "seed": first,
            "margin_nats": MARGIN}


def verdict(found: dict) -> str:
    lines = []
    for a in found["arms"]:
        text = f"{a['arm']:<18} validation loss {a['final_test_loss']:.4f} ({a['loss_vs_reference']:+.4f} vs " \
               f"{found['reference_policy']}); SwiGLU outputs' top binade 2^{a['glu_top_binade_first']:.0f} at the " \
               f"first stats step, 2^{a['glu_top_binade_max']:.0f} at most"
        if a["block_scaled"]:
            def share(kv):
                return kv[1]["rounded_to_zero"] if math.isfinite(kv[1]["rounded_to_zero"]) else -1

            worst = max(a["operands"].items(), key=share)
            text += (f"; most rounded to zero: operand {worst[0]} ({worst[1]['rounded_to_zero']:.1%} of its nonzero "
                     "elements)")
        lines.append(text)
    if len(found["seeds"]) < 2:
        lines.append("One seed: differences are single runs, not tested findings.")
    else:
        lines.append(f"Against {found['reference_policy']}, paired by seed over seeds {found['seeds']} (TOST within "
                     f"±{found['margin_nats']:g} nats/char):")
        for p in found["policies"]:
            if "equivalence" in p:
                lines.append(f"  {p['policy']:<12} " + equivalence.describe(p["equivalence"], 1.0, "nats/char", 4))
    return "\n".join(lines)


def operands_figure(found: dict) -> Figure:
    """Flushed (of nonzero) and saturated (of all) shares per GEMM operand, one group of bars per arm."""
    arms = [a for a in found["arms"] if a["block_scaled"] and a["seed"] == found["seed"]]  # the first seed's
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(OPERANDS))
    height = 0.8 / max(1, len(arms))
    for k, a in enumerate(arms):
        for ax, key in zip(axes, ("rounded_to_zero", "saturated")):
            values = [100 * a["operands"][o][key] if math.isfinite(a["operands"][o][key]) else 0.0 for o in OPERANDS]
            ax.barh(y + k * height, values, height=height, label=a["arm"])
    for ax, title in zip(axes, ("rounded to zero (% of nonzero elements)", "saturated (% of elements)")):
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(y + 0.4 - height / 2, OPERANDS)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8)
    return fig


def outliers_figure(f, found: dict) -> Figure:
    """Validation loss against the reference (left) and the SwiGLU outputs' top binade over training (right)."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    loss_ax, glu_ax = fig.subplots(1, 2)
    policies = found["policies"]
    for i, p in enumerate(policies):  # each seed a dot
        loss_ax.plot(p["loss_vs_reference"], [i] * len(p["loss_vs_reference"]), "o", color="tab:gray")
    loss_ax.set_yticks(np.arange(len(policies)), [p["policy"] for p in policies])
    loss_ax.invert_yaxis()
    arms = [a for a in found["arms"] if a["seed"] == found["seed"]]  # outlier curves: the first seed's
    loss_ax.axvline(0.0, color="black", linewidth=1)
    loss_ax.set_xlabel(f"final validation loss minus {found['reference_policy']}'s, same seed (nats/char)")
    for a in arms:
        top = glu_top_binade(f, a["arm"])
        glu_ax.plot(top["step"], top["top_binade"], label=a["arm"])
    glu_ax.set_xlabel("step")
    glu_ax.set_ylabel("top binade of SwiGLU outputs (log2)")
    glu_ax.set_title("activation outliers")
    glu_ax.legend(fontsize=8)
    for ax in (loss_ax, glu_ax):
        ax.grid(True, alpha=0.3)
    return fig


# --- script --------------------------------------------------------------------------------------------------


def write_all(path, out_dir="docs/figures", dpi: int = 110) -> tuple[list[Path], dict]:
    """Writes every figure and transformer_blocks_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        found = findings(f)
        figs = [("transformer_blocks_operands", operands_figure(found)),
                ("transformer_blocks_outliers", outliers_figure(f, found)),
                ("transformer_blocks_training", fg.loss_accuracy(f, arms=[a["arm"] for a in found["arms"]]))]
    found["log"] = str(path)
    return fg.save_study(out_dir, figs, found, "transformer_blocks_findings.json", dpi), found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "transformer_blocks.toml", write)


if __name__ == "__main__":
    sys.exit(main())
