#!/usr/bin/python3
"""Study f of issue #6: the emulator against the GPU.

experiments/configs/emulator_vs_gpu.toml trains the same policies with the
same initial weights and batches on backend "cpu" (the emulator) and backend
"cuda" (the GPU). This module overlays the two backends' loss and accuracy
curves and draws the per-layer histogram distances that `mpsim run` stores
under /agreement (docs/hdf5-schema.md). A file in which no arm ran on the GPU
(a machine without one: `backends=cpu`) gets the CPU arms' curves and the
plain statement "no GPU arms in this file"; nothing is made up for the GPU.

    /usr/bin/python3 notebooks/emulator_vs_gpu.py runs/emulator_vs_gpu.h5 [--out docs/figures]

writes emulator_vs_gpu_*.png and emulator_vs_gpu_findings.json into --out and
prints the verdict.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

if __name__ == "__main__":
    os.environ["MPLBACKEND"] = "Agg"  # files only

import numpy as np
from matplotlib.figure import Figure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figures  # noqa: E402  (beside this file)
import mpsim_log as ml  # noqa: E402

REFERENCE_BACKEND = "cpu"
NO_GPU = "no GPU arms in this file"
BACKEND_STYLE = {"cpu": dict(ls="-", marker="o"), "cuda": dict(ls="--", marker="s")}


# --- reading -------------------------------------------------------------------


def arm_pairs(f) -> dict[tuple, dict[str, str]]:
    """{(policy, seed, sweep): {backend: arm}}: the arms that saw the same
    initial weights and batches, keyed by what they share."""
    pairs: dict[tuple, dict[str, str]] = defaultdict(dict)
    for arm in figures.ordered_arms(f):
        a = ml.arm_info(f, arm)
        pairs[(a.get("policy", arm), a.get("seed", 0), a.get("sweep", ""))][a.get("backend", "cpu")] = arm
    return dict(pairs)


def gpu_arms(f) -> list[str]:
    """Arms that ran on a backend other than the emulator."""
    return [arm for arm in ml.arms(f) if ml.arm_info(f, arm).get("backend", "cpu") != REFERENCE_BACKEND]


def agreement(f) -> dict[str, dict]:
    """The /agreement group: {gpu arm: {reference, max_loss_relative_difference,
    test_accuracy_difference, layers, kinds, histogram_distance[layer, kind]}}.
    Empty when the file has no such group (only one backend ran)."""
    return ml.agreement(f)


def final_accuracy(f, arm: str) -> float:
    acc = ml.evals(f, arm)["test_accuracy"]
    return float(acc[-1]) if len(acc) else float("nan")


def _running_mean(x: np.ndarray, w: int) -> np.ndarray:
    return np.convolve(x, np.ones(w) / w, mode="valid") if len(x) >= w > 1 else x


def _label(key: tuple, backend: str) -> str:
    policy, seed, sweep = key
    return f"{policy}{'@' + sweep if sweep else ''} on {backend}"


# --- figures -------------------------------------------------------------------


def loss_overlay(f, pairs) -> Figure:
    """Training loss (running mean) per policy, emulator solid, GPU dashed; with
    GPU arms, a second panel with the GPU's loss relative to the emulator's."""
    has_gpu = any(len(b) > 1 for b in pairs.values())
    fig = Figure(figsize=(12 if has_gpu else 7.5, 4.4), layout="constrained")
    axes = fig.subplots(1, 2 if has_gpu else 1, squeeze=False)[0]
    for i, (key, backends) in enumerate(pairs.items()):
        curves = {}
        for backend, arm in backends.items():
            s = ml.steps(f, arm)
            finite = np.isfinite(s["loss"])
            w = max(1, len(s["step"]) // 40)
            mean = _running_mean(s["loss"][finite], w)
            axes[0].plot(s["step"][finite][len(s["step"][finite]) - len(mean):], mean, color=f"C{i}",
                         ls=BACKEND_STYLE.get(backend, {}).get("ls", ":"), lw=1.8, label=_label(key, backend))
            curves[backend] = s
        if has_gpu and REFERENCE_BACKEND in curves:
            ref = curves[REFERENCE_BACKEND]
            for backend, s in curves.items():
                if backend == REFERENCE_BACKEND:
                    continue
                n = min(len(ref["loss"]), len(s["loss"]))
                rel = np.abs(s["loss"][:n] - ref["loss"][:n]) / np.abs(ref["loss"][:n])
                axes[1].plot(ref["step"][:n], np.where(rel > 0, rel, np.nan), color=f"C{i}", lw=1,
                             label=f"{key[0]}: {backend} vs {REFERENCE_BACKEND}")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss (running mean)")
    axes[0].set_title("Training loss: emulator (solid) vs GPU (dashed)" if has_gpu
                      else f"Training loss on the emulator only ({NO_GPU})")
    axes[0].grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    if has_gpu:
        axes[1].set_yscale("log")
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("|loss_gpu - loss_cpu| / loss_cpu (each step)")
        axes[1].set_title("Per-step loss difference (identical steps are gaps)")
        axes[1].grid(True, which="both", alpha=0.3)
        axes[1].legend(fontsize=8)
    return fig


def accuracy_overlay(f, pairs) -> Figure:
    """Test accuracy at each evaluation, emulator solid with circles, GPU dashed with squares."""
    has_gpu = any(len(b) > 1 for b in pairs.values())
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, (key, backends) in enumerate(pairs.items()):
        for backend, arm in backends.items():
            e = ml.evals(f, arm)
            style = BACKEND_STYLE.get(backend, dict(ls=":", marker="^"))
            ax.plot(e["step"], 100 * np.asarray(e["test_accuracy"]), color=f"C{i}", ms=5, lw=1.5, **style,
                    label=f"{_label(key, backend)}: {100 * final_accuracy(f, arm):.2f}%")
    ax.set_xlabel("step")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Test accuracy: emulator vs GPU" if has_gpu else f"Test accuracy on the emulator only ({NO_GPU})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, title="final")
    return fig


def histogram_distance(agree: dict[str, dict]) -> Figure:
    """Per GPU arm, the total-variation distance between its binade histograms and
    the emulator's, per layer (rows) and tensor kind (columns): 0 = same shape."""
    fig = Figure(figsize=(4 + 3.2 * len(agree), 4.8), layout="constrained")
    axes = fig.subplots(1, len(agree), squeeze=False)[0]
    mesh = None
    for ax, (arm, a) in zip(axes, agree.items()):
        d = np.ma.masked_invalid(a["histogram_distance"])
        mesh = ax.imshow(d, cmap="magma_r", vmin=0, vmax=max(0.05, float(np.nanmax(a["histogram_distance"]))
                                                              if np.isfinite(a["histogram_distance"]).any() else 1),
                         aspect="auto")
        ax.set_xticks(range(len(a["kinds"])), a["kinds"], rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(a["layers"])), a["layers"], fontsize=8)
        ax.set_title(f"{arm} vs {a['reference']}", fontsize=9)
        ax.set_xlabel("tensor kind")
    axes[0].set_ylabel("layer")
    fig.colorbar(mesh, ax=list(axes), label="total-variation distance")
    fig.suptitle("Binade-histogram distance, GPU against emulator, all instrumented steps "
                 "(0: same shape, 1: disjoint; blank: no values)", fontsize=11)
    return fig


def all_figures(f) -> list[tuple[str, Figure]]:
    """(name, figure) pairs, named emulator_vs_gpu_NAME.png; the distance figure only with GPU arms."""
    pairs = arm_pairs(f)
    result = [("loss", loss_overlay(f, pairs)), ("accuracy", accuracy_overlay(f, pairs))]
    agree = agreement(f)
    if agree:
        result.append(("histogram_distance", histogram_distance(agree)))
    return result


# --- verdict -------------------------------------------------------------------


def findings(f) -> dict:
    """The key numbers: per arm backend, policy and final accuracy; per GPU arm the agreement."""
    agree = agreement(f)
    result = {
        "gpu_arms": gpu_arms(f),
        "arms": {arm: {"backend": ml.arm_info(f, arm).get("backend", "cpu"),
                       "policy": ml.arm_info(f, arm).get("policy", arm),
                       "status": ml.arm_info(f, arm).get("status", ""),
                       "test_accuracy": final_accuracy(f, arm)} for arm in figures.ordered_arms(f)},
        "agreement": {},
    }
    for arm, a in agree.items():
        d = a["histogram_distance"]
        worst = np.unravel_index(np.nanargmax(d), d.shape) if np.isfinite(d).any() else None
        result["agreement"][arm] = {
            "reference": a["reference"],
            "max_loss_relative_difference": a["max_loss_relative_difference"],
            "test_accuracy_difference": a["test_accuracy_difference"],
            "max_histogram_distance": float(d[worst]) if worst else float("nan"),
            "max_histogram_distance_at": f"{a['layers'][worst[0]]}/{a['kinds'][worst[1]]}" if worst else "",
        }
    return result


def verdict(r: dict) -> str:
    accs = ", ".join(f"{arm} ({a['backend']}) {100 * a['test_accuracy']:.2f}%" for arm, a in r["arms"].items())
    if not r["gpu_arms"]:
        return (f"{NO_GPU}: every arm ran on the emulator (backend cpu), so there is nothing to compare; "
                f"run the config on a machine with a GPU (backends = [\"cpu\", \"cuda\"]).\n"
                f"emulator test accuracy: {accs}")
    lines = [f"test accuracy: {accs}"]
    for arm, a in r["agreement"].items():
        lines.append(f"{arm} vs {a['reference']}: accuracy {100 * a['test_accuracy_difference']:+.2f} points, "
                     f"largest relative loss difference {a['max_loss_relative_difference']:.3g}, "
                     f"largest histogram distance {a['max_histogram_distance']:.3g} "
                     f"({a['max_histogram_distance_at']})")
    if not r["agreement"]:
        lines.append("GPU arms present but no /agreement group (no emulator arm of the same policy and seed)")
    return "\n".join(lines)


def write_all(path, out_dir="docs/figures"):
    """Writes every figure and emulator_vs_gpu_findings.json; returns (paths, verdict)."""
    with ml.open_log(path) as f:
        figs = [(f"emulator_vs_gpu_{name}", fig) for name, fig in all_figures(f)]
        r = findings(f)
    return figures.save_study(out_dir, figs, r, "emulator_vs_gpu_findings.json"), verdict(r)


def main(argv=None) -> int:
    return figures.study_main(argv, __doc__.splitlines()[0], "emulator_vs_gpu.toml",
                              lambda args: write_all(args.log, args.out))


if __name__ == "__main__":
    sys.exit(main())
