"""Figures of the accumulation study (issue #5): `mpsim tc sweep` writes a CSV
of dot-product and GEMM errors against the exact result as K grows; these
functions plot them against the deterministic bound gamma_K = Ku/(1-Ku) and
the probabilistic sqrt(K)u (Higham and Mary, "A new approach to probabilistic
rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019).

    python3 notebooks/accumulation.py runs/accumulation_sweep.csv --out docs/figures
"""
import argparse
import csv
import math
from pathlib import Path

import numpy as np
import matplotlib

matplotlib.use("Agg") if __name__ == "__main__" else None
import matplotlib.pyplot as plt

COLUMNS = ("model", "input", "distribution", "K", "measure", "trial", "relative_error", "normalised_error",
           "unit_roundoff")


def load(path):
    """Rows of the sweep CSV as a dict of numpy arrays, plus its '#' header lines."""
    header, rows = [], []
    with open(path, newline="") as f:
        lines = []
        for line in f:
            (header if line.startswith("#") else lines).append(line)
    reader = csv.DictReader(lines)
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"{path}: not an `mpsim tc sweep` CSV (columns {reader.fieldnames})")
    rows = list(reader)
    data = {c: np.array([r[c] for r in rows]) for c in ("model", "input", "distribution", "measure")}
    for c in ("K", "trial"):
        data[c] = np.array([int(r[c]) for r in rows])
    for c in ("relative_error", "normalised_error", "unit_roundoff"):
        data[c] = np.array([float(r[c]) for r in rows])
    return data, [h[1:].strip() for h in header]


def ordered(values):
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def curve(data, model, input_format, distribution, measure, column, reduce):
    """(K, reduce(column over the trials)) for one model, input and distribution."""
    pick = ((data["model"] == model) & (data["input"] == input_format) & (data["distribution"] == distribution)
            & (data["measure"] == measure))
    ks = np.unique(data["K"][pick])
    return ks, np.array([reduce(data[column][pick & (data["K"] == k)]) for k in ks])


def gamma(k, u):
    ku = k * u
    return np.where(ku < 1, ku / (1 - ku), np.inf)


def plot_errors(data, input_format, measure="dot", u=2.0 ** -24):
    """Normalised error |s - exact| / sum|a_k b_k| against K, one panel per distribution:
    the mean over trials (dots) for dot products, the largest element for a GEMM."""
    distributions = ordered(data["distribution"])
    fig, axes = plt.subplots(1, len(distributions), figsize=(5 * len(distributions), 4.2), sharey=True,
                             squeeze=False)
    reduce = np.mean if measure == "dot" else np.max
    for ax, dist in zip(axes[0], distributions):
        for model in ordered(data["model"]):
            ks, err = curve(data, model, input_format, dist, measure, "normalised_error", reduce)
            if len(ks) == 0:
                continue
            err = np.where(err > 0, err, np.nan)  # exact results cannot be drawn on a log axis
            ax.loglog(ks, err, marker="o", ms=3, label=model)
        ks = np.unique(data["K"])
        ax.loglog(ks, gamma(ks, u), "k--", lw=1, label=r"$\gamma_K$, $u=2^{-24}$")
        ax.loglog(ks, np.sqrt(ks) * u, "k:", lw=1, label=r"$\sqrt{K}u$")
        ax.set_title(f"{dist} {input_format} inputs")
        ax.set_xlabel("K")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel(("mean" if measure == "dot" else "largest") + r" $|s-\hat s| / \sum|a_kb_k|$")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{'Dot product' if measure == 'dot' else 'GEMM (16x16)'} error against the exact result")
    fig.tight_layout()
    return fig


def plot_bias(data, input_format, distribution="uniform"):
    """Mean signed relative error against K: truncating models drift below zero."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for model in ordered(data["model"]):
        ks, bias = curve(data, model, input_format, distribution, "dot", "relative_error", np.mean)
        if len(ks):
            ax.semilogx(ks, bias, marker="o", ms=3, label=model, base=2)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-8)
    ax.set_xlabel("K")
    ax.set_ylabel(r"mean $(s-\hat s)/|\hat s|$")
    ax.set_title(f"Bias of long sums: {distribution} {input_format} inputs")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def summary(data, k=None):
    """Per model and input: mean normalised error and mean signed relative error
    of uniform and normal dot products at the largest K, and gamma_K."""
    k = k or int(data["K"].max())
    lines = [f"K = {k}: gamma_K(2^-24) = {float(gamma(k, 2.0 ** -24)):.2e}, sqrt(K) 2^-24 = {math.sqrt(k) * 2 ** -24:.2e}",
             f"{'model':<18}{'input':<10}{'uniform err':>13}{'uniform bias':>14}{'normal err':>12}"]
    for input_format in ordered(data["input"]):
        for model in ordered(data["model"]):
            values = []
            for dist, column in (("uniform", "normalised_error"), ("uniform", "relative_error"),
                                 ("normal", "normalised_error")):
                pick = ((data["model"] == model) & (data["input"] == input_format) & (data["distribution"] == dist)
                        & (data["measure"] == "dot") & (data["K"] == k))
                values.append(float(np.mean(data[column][pick])) if pick.any() else float("nan"))
            if not all(math.isnan(v) for v in values):
                lines.append(f"{model:<18}{input_format:<10}{values[0]:>13.2e}{values[1]:>+14.2e}{values[2]:>12.2e}")
    return "\n".join(lines)


def save_all(csv_path, out_dir):
    data, _ = load(csv_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for input_format in ordered(data["input"]):
        for name, fig in ((f"accumulation_dot_{input_format}", plot_errors(data, input_format, "dot")),
                          (f"accumulation_gemm_{input_format}", plot_errors(data, input_format, "gemm")),
                          (f"accumulation_bias_{input_format}", plot_bias(data, input_format))):
            path = out / f"{name}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--out", default="docs/figures")
    args = parser.parse_args()
    for path in save_all(args.csv, args.out):
        print(path)
    print(summary(load(args.csv)[0]))
