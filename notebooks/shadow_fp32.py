#!/usr/bin/python3
"""Shadow FP32: each format's gradient against the binary32 gradient of the same weights and batch (issue #21, §3).

Reads the log of `mpsim run experiments/configs/shadow_fp32.toml` (train.shadow_interval > 0): at every shadow step
the trainer ran the arm's batch from the arm's weights once more in binary32, and logged per layer the relative error
norm(g - g32) / norm(g32) of the arm's unscaled gradient g, the cosine similarity, the norm ratio and the elements
that binary32 keeps nonzero and the arm's gradient lost to zero (docs/hdf5-schema.md, `/arms/<arm>/shadow/`). Two
arms are never compared with each other: each step is measured against its own binary32 twin, so the numbers are the
cost of one step's rounding, free of the divergence of two trajectories.

    /usr/bin/python3 notebooks/shadow_fp32.py runs/shadow_fp32.h5 [--out docs/figures]

writes shadow_fp32_*.png and shadow_fp32_findings.json into --out and prints the verdict. Per policy and seed:
the median over the shadow steps of the whole model's relative error, cosine and norm ratio, the share of binary32's
nonzero gradient elements lost to zero (denominator: those nonzero elements, summed over the shadow steps), the
same per layer, and the change over training (the median of the last quarter of the shadow steps over the first
quarter's). The spread is shown as each seed's value; no test is claimed beyond what the seeds show.
"""

from __future__ import annotations

import math
import os
import sys
import tomllib

import numpy as np

if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only; no display needed

import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figures as fg  # noqa: E402  (beside this file)
import mpsim_log as ml  # noqa: E402

CONTROL = "fp32"  # its shadow is its own gradient: every relative error exactly 0


# --- reading -----------------------------------------------------------------------


def load(f) -> list[dict]:
    """One record per finished arm with shadow rows: arm, policy, seed, status, layers, rows (ml.shadow)."""
    records = []
    for arm in ml.arms(f):
        info = ml.arm_info(f, arm)
        if info["status"] == "running":
            continue  # killed or unfinished
        rows = ml.shadow(f, arm)
        if not len(rows["step"]):
            continue
        records.append({"arm": arm, "policy": info["policy"], "seed": int(info["seed"]), "status": info["status"],
                        "layers": ml.layers(f, arm), "rows": rows})
    return records


def policies(f, records) -> list[str]:
    """The policies in the config's order."""
    return ml.config_order(f, {r["policy"] for r in records})


def _pick(rows: dict, layer: int) -> dict:
    keep = rows["layer"] == layer
    return {name: values[keep] for name, values in rows.items()}


# --- numbers -----------------------------------------------------------------------


def _finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[np.isfinite(values)]


def _median(values) -> float:
    finite = _finite(values)
    return float(np.median(finite)) if len(finite) else math.nan


def _quantile(values, q: float) -> float:
    finite = _finite(values)
    return float(np.quantile(finite, q)) if len(finite) else math.nan


def summary(rows: dict) -> dict:
    """One layer's (or the model's) rows over training: medians over the shadow steps with finite values, the lost
    share over all of them, the change from the first quarter of the steps to the last, and the step-to-step spread
    of the relative error (10th and 90th percentiles over the steps)."""
    n = len(rows["step"])
    quarter = max(1, n // 4)
    early, late = _median(rows["relative_error"][:quarter]), _median(rows["relative_error"][-quarter:])
    nonzero = int(rows["nonzero_fp32"].sum())

    def lost(part):
        total = part["nonzero_fp32"].sum()
        return float(part["zeroed"].sum() / total) if total else math.nan

    first = {name: values[:quarter] for name, values in rows.items()}
    last = {name: values[-quarter:] for name, values in rows.items()}
    return {
        "shadow_steps": n,
        "nonfinite_steps": int(np.sum(~np.isfinite(rows["relative_error"]))),
        "relative_error": _median(rows["relative_error"]),
        "relative_error_max": float(np.nanmax(rows["relative_error"])) if n else math.nan,
        "relative_error_p10": _quantile(rows["relative_error"], 0.1),
        "relative_error_p90": _quantile(rows["relative_error"], 0.9),
        "cosine": _median(rows["cosine"]),
        "cosine_min": float(np.nanmin(rows["cosine"])) if n else math.nan,
        "norm_ratio": _median(rows["norm_ratio"]),
        "zeroed": int(rows["zeroed"].sum()),
        "nonzero_fp32": nonzero,
        "zeroed_share": rows["zeroed"].sum() / nonzero if nonzero else math.nan,
        "relative_error_first_quarter": early,
        "relative_error_last_quarter": late,
        "growth": late / early if early > 0 else math.nan,
        "zeroed_share_first_quarter": lost(first),
        "zeroed_share_last_quarter": lost(last),
        "norm_fp32_first_quarter": _median(first["norm_fp32"]),
        "norm_fp32_last_quarter": _median(last["norm_fp32"]),
    }


def per_arm(record) -> dict:
    rows = record["rows"]
    layers = {record["layers"][int(layer)]: summary(_pick(rows, int(layer)))
              for layer in np.unique(rows["layer"]) if layer >= 0}
    return {"arm": record["arm"], "policy": record["policy"], "seed": record["seed"], "status": record["status"],
            "model": summary(_pick(rows, -1)), "layers": layers}


def findings(f, records=None) -> dict:
    """The study's numbers; `records` is load(f), read here when not given."""
    records = load(f) if records is None else records
    if not records:
        raise ValueError("no finished arm has shadow rows: run the config with train.shadow_interval > 0")
    arms = [per_arm(r) for r in records]
    result = {"study": "shadow_fp32", "arms": arms, "policies": []}
    for policy in policies(f, records):
        mine = sorted((a for a in arms if a["policy"] == policy), key=lambda a: a["seed"])
        keys = ("relative_error", "cosine", "norm_ratio", "zeroed_share", "growth", "zeroed_share_first_quarter",
                "zeroed_share_last_quarter", "norm_fp32_first_quarter", "norm_fp32_last_quarter")
        entry = {"policy": policy, "seeds": [a["seed"] for a in mine]}
        for key in keys:
            values = [a["model"][key] for a in mine]
            entry[key] = values  # per seed, in seed order
            entry[key + "_mean"] = float(np.mean(values)) if values else math.nan
        entry["grew_in"] = sum(1 for g in entry["growth"] if g > 1)
        entry["nonfinite_steps"] = [a["model"]["nonfinite_steps"] for a in mine]
        entry["layers"] = {layer: [a["layers"][layer]["relative_error"] for a in mine] for layer in mine[0]["layers"]}
        entry["layers_zeroed_share"] = {layer: [a["layers"][layer]["zeroed_share"] for a in mine]
                                        for layer in mine[0]["layers"]}
        # How far one step's error lies from another's: the 10th and 90th percentiles over the steps, per seed.
        entry["layers_p10_p90"] = {layer: [[a["layers"][layer]["relative_error_p10"],
                                            a["layers"][layer]["relative_error_p90"]] for a in mine]
                                   for layer in mine[0]["layers"]}
        result["policies"].append(entry)
    control = [a for a in arms if a["policy"] == CONTROL]
    result["control_exact"] = bool(control) and all(
        _exactly_zero(r["rows"]) for r in records if r["policy"] == CONTROL)
    first = records[0]["rows"]
    result["shadow_steps"] = int(len(np.unique(first["step"])))
    result["shadow_interval"] = int(tomllib.loads(ml.config(f))["train"]["shadow_interval"])
    return result


def _exactly_zero(rows) -> bool:
    return bool(np.all(rows["relative_error"] == 0) and np.all(rows["cosine"] == 1) and np.all(rows["zeroed"] == 0))


# --- figures --------------------------------------------------------------------------


def _colors(found) -> dict:
    return {p["policy"]: f"C{i}" for i, p in enumerate(found["policies"])}


def over_training(records, found):
    """Relative error (top), 1 − cosine (middle) and the share of binary32's nonzero gradient elements lost to zero
    (bottom; a step with none lost is not drawn on the log axis) at every shadow step, per layer with parameters and
    for the whole model (right): each seed a line, each policy a colour."""
    colors = _colors(found)
    shown = [r for r in records if r["policy"] != CONTROL]
    layers = [int(layer) for layer in np.unique(shown[0]["rows"]["layer"]) if layer >= 0] + [-1] if shown else [-1]
    fig, axes = plt.subplots(3, len(layers), figsize=(3.6 * len(layers), 9), sharex=True, squeeze=False)
    labelled = set()
    for r in shown:
        label = r["policy"] if r["policy"] not in labelled else None
        labelled.add(r["policy"])
        for column, layer in enumerate(layers):
            rows = _pick(r["rows"], layer)
            axes[0][column].semilogy(rows["step"], rows["relative_error"], color=colors[r["policy"]], lw=0.8,
                                     alpha=0.8, label=label if column == 0 else None)
            axes[1][column].semilogy(rows["step"], np.maximum(1 - rows["cosine"], 1e-12), color=colors[r["policy"]],
                                     lw=0.8, alpha=0.8)
            share = np.where(rows["nonzero_fp32"] > 0, rows["zeroed"] / np.maximum(rows["nonzero_fp32"], 1), np.nan)
            axes[2][column].semilogy(rows["step"], share, color=colors[r["policy"]], lw=0.8, alpha=0.8)
    for column, layer in enumerate(layers):
        name = "all parameters" if layer == -1 else shown[0]["layers"][layer]
        axes[0][column].set_title(name)
        axes[2][column].set_xlabel("step")
        for row in (0, 1, 2):
            axes[row][column].grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("norm(g − g32) / norm(g32)")
    axes[1][0].set_ylabel("1 − cosine(g, g32)")
    axes[2][0].set_ylabel("lost to zero / nonzero in binary32")
    axes[0][0].legend(fontsize=7)
    seeds = sorted({r["seed"] for r in records})
    fig.suptitle(f"Each step's gradient against its binary32 shadow (seeds {', '.join(map(str, seeds))}; "
                 f"{CONTROL}: exactly 0, not drawn)")
    fig.tight_layout()
    return fig


def per_layer(found):
    """Per layer: the median relative error over training (bars: mean over seeds; dots: each seed), and the share of
    binary32's nonzero gradient elements that the arm lost to zero."""
    shown = [p for p in found["policies"] if p["policy"] != CONTROL]
    layers = list(shown[0]["layers"]) if shown else []
    colors = _colors(found)
    fig, (ax, ax_zero) = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(1, len(shown))
    for i, p in enumerate(shown):
        x = np.arange(len(layers)) + (i - (len(shown) - 1) / 2) * width
        for a, data in ((ax, p["layers"]), (ax_zero, p["layers_zeroed_share"])):
            means = [np.mean(data[layer]) for layer in layers]
            a.bar(x, means, width, color=colors[p["policy"]], label=p["policy"], alpha=0.8)
            for j, layer in enumerate(layers):
                a.plot([x[j]] * len(data[layer]), data[layer], "k.", ms=3)
    for a in (ax, ax_zero):
        a.set_xticks(np.arange(len(layers)), layers)
        a.set_yscale("log")
        a.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_ylabel("median over steps of norm(g − g32) / norm(g32)")
    ax.set_title("Per layer: relative error")
    ax_zero.set_ylabel("lost to zero / nonzero in binary32")
    ax_zero.set_title("Per layer: gradient elements lost to zero")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- verdict ----------------------------------------------------------------------------


def verdict(found: dict) -> str:
    def each(values, fmt):
        return ", ".join(format(v, fmt) for v in values)

    seeds = found["policies"][0]["seeds"]
    lines = [f"Shadow FP32: {found['shadow_steps']} shadow steps per arm, seeds {seeds}; per policy, each seed's "
             "median over the steps (whole model):"]
    for p in found["policies"]:
        lines.append(f"  {p['policy']}: relative error {each(p['relative_error'], '.2e')}; 1 - cosine "
                     f"{each([1 - c for c in p['cosine']], '.1e')}; norm ratio {each(p['norm_ratio'], '.4f')}")
        indent = " " * (len(p["policy"]) + 4)
        lines.append(f"{indent}lost to zero / nonzero {each(p['zeroed_share'], '.1e')}: first quarter of the steps "
                     f"{each(p['zeroed_share_first_quarter'], '.1e')}, last "
                     f"{each(p['zeroed_share_last_quarter'], '.1e')}")
        lines.append(f"{indent}relative error, last quarter / first: {each(p['growth'], '.2f')} (grew in "
                     f"{p['grew_in']} of {len(p['seeds'])})")
        spread = "; ".join(f"{layer} " + ", ".join(f"{lo:.1e}-{hi:.1e}" for lo, hi in seeds_)
                           for layer, seeds_ in p["layers_p10_p90"].items())
        lines.append(f"{indent}relative error from step to step, 10th-90th percentile per seed: {spread}")
    if any(p["policy"] == CONTROL for p in found["policies"]):
        lines.append(f"Control: the {CONTROL} arm's shadow is its own gradient bit for bit: "
                     f"{'yes' if found['control_exact'] else 'NO'}.")
    else:
        lines.append(f"No control: this log has no {CONTROL} arm.")
    lines.append("Medians over shadow steps of one run per seed; no significance test is claimed.")
    return "\n".join(lines)


def write_all(path, out_dir="docs/figures", dpi: int = 110):
    """Writes every figure and shadow_fp32_findings.json; returns (paths, findings)."""
    with ml.open_log(path) as f:
        records = load(f)
        found = findings(f, records)
    figs = [("shadow_fp32_over_training", over_training(records, found)), ("shadow_fp32_per_layer", per_layer(found))]
    found["log"] = str(path)
    written = fg.save_study(out_dir, figs, found, "shadow_fp32_findings.json", dpi)
    for _, fig in figs:
        plt.close(fig)
    return written, found


def main(argv=None) -> int:
    def write(args):
        written, found = write_all(args.log, args.out)
        return written, verdict(found)

    return fg.study_main(argv, __doc__.splitlines()[0], "shadow_fp32.toml", write)


if __name__ == "__main__":
    sys.exit(main())
