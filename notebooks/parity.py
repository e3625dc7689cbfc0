"""Accuracy parity study (issue #6, study c): final test accuracy of several
precision policies over ten seeds (parity.toml, parity_cnn.toml), compared with FP32 seed by seed, beside
Table 1 of Micikevicius et al., "Mixed Precision Training", ICLR 2018
(arXiv:1710.03740), read from data/micikevicius2018_parity.csv.

    /usr/bin/python3 notebooks/parity.py runs/parity.h5 [--out docs/figures]

Why a paired test: a seed fixes the initial weights and the batch order, and
every policy with that seed starts from the same weights and sees the same
batches. Seed-to-seed variation is shared by all policies, so the difference
policy - FP32 within a seed removes it; a paired t-test on those differences
is more sensitive than Welch's test on the two groups, which treats that
shared variation as noise. How much it gains depends on how far rounding
makes the trajectories of one seed drift apart: the verdict prints both
spreads. Both tests are reported. Needs scipy (scipy.stats).

Parity is an equivalence claim, so the verdict is TOST's (notebooks/equivalence.py): a policy is
"equivalent" to FP32 when the 90% interval of its paired differences lies inside +-MARGIN_POINTS, a margin
fixed before the runs (0.5 accuracy points, as block_formats uses); a difference test that does not reject
is reported as "inconclusive", never as parity. Each row also gives TOST's power at the observed spread and
the seeds that 80% power would need.
"""
from __future__ import annotations

import csv
import math
import os
import sys
import tomllib
from pathlib import Path

import numpy as np

if __name__ == "__main__":
    os.environ["MPLBACKEND"] = "Agg"  # files only; no display needed

import matplotlib.pyplot as plt  # noqa: E402
from scipy import stats  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402  (beside this file)
import figures  # noqa: E402
import mpsim_log as ml  # noqa: E402

REFERENCE = "fp32"
ALPHA = 0.05  # significance level of the tests
# The equivalence margin, fixed before any run (issue 21): 0.5 accuracy points, as a fraction.
MARGIN = 0.005
PAPER_CSV = Path(__file__).resolve().parent.parent / "data" / "micikevicius2018_parity.csv"
# Policies in the order the study lists them; others (if a log has them) follow.
ORDER = ["fp32", "fp16-mixed", "bf16-mixed", "fp16-noscale", "fp16-naive", "fp8"]


# --- reading -----------------------------------------------------------------


def load_runs(path) -> list[dict]:
    """One record per arm: policy, seed, status and the final test accuracy.

    An arm that stopped (a non-finite loss without a loss scaler) has no final
    model: its accuracy is NaN and it counts as diverged. An arm still running
    (or killed) is left out."""
    records = []
    with ml.open_log(path) as f:
        for arm in ml.arms(f):
            info = ml.arm_info(f, arm)
            if info["status"] == "running":
                continue
            ev = ml.evals(f, arm)
            completed = info["status"] == "completed"
            acc = float(ev["test_accuracy"][-1]) if completed and len(ev["test_accuracy"]) else math.nan
            records.append({"arm": arm, "policy": info["policy"], "seed": int(info["seed"]),
                            "status": info["status"], "accuracy": acc})
    return records


def experiment(path) -> dict:
    """What the run was: model, epochs and training-set size, from the config in the log."""
    cfg = tomllib.loads(ml.config(path))
    return {"model": cfg["model"]["kind"], "epochs": cfg["train"]["epochs"],
            "train_limit": cfg["data"].get("train_limit", 0), "dataset": cfg["data"]["dataset"]}


def setup_label(setup) -> str:
    """'mlp, 8 epochs' for figure titles."""
    return f"{setup['model']}, {setup['epochs']} epoch{'s' if setup['epochs'] != 1 else ''}"


def by_policy(records) -> dict[str, dict[int, float]]:
    """{policy: {seed: accuracy}}, policies in the study's order."""
    table: dict[str, dict[int, float]] = {}
    for r in records:
        table.setdefault(r["policy"], {})[r["seed"]] = r["accuracy"]
    rank = {p: i for i, p in enumerate(ORDER)}
    return dict(sorted(table.items(), key=lambda kv: (rank.get(kv[0], len(ORDER)), kv[0])))


def load_paper(path=PAPER_CSV) -> list[dict]:
    """Rows of the paper's Table 1 (accuracies in percent; None where a cell is empty)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))

    def number(text):
        return float(text) if text and text.strip() else None

    return [{"model": r["model"], "fp32": number(r["fp32_top1_percent"]),
             "mixed": number(r["mixed_precision_top1_percent"])} for r in rows]


# --- statistics ----------------------------------------------------------------


def compare(table, reference=REFERENCE) -> dict[str, dict]:
    """Per policy: mean and sample std of the accuracy, and against the reference
    the mean paired difference, its std, the paired t-test and Welch's test.
    Diverged arms (NaN) are left out of every statistic and counted."""
    ref = table[reference]
    result = {}
    for policy, accs in table.items():
        values = np.array([a for a in accs.values() if np.isfinite(a)])
        seeds, diffs = equivalence.paired_by_seed(accs, ref)
        row = {"n": int(len(values)), "diverged": int(sum(not np.isfinite(a) for a in accs.values())),
               "mean": _mean(values), "std": _std(values), "n_pairs": len(seeds),
               "diff_mean": _mean(diffs), "diff_std": _std(diffs),
               "ci95_low": math.nan, "ci95_high": math.nan,
               "t_paired": math.nan, "p_paired": math.nan, "p_welch": math.nan}
        if policy != reference:
            tost = equivalence.paired_equivalence(diffs, MARGIN, ALPHA)
            # The 95% t interval of the mean paired difference (what the difference test can exclude with n
            # seeds) and the 90% one (TOST's), from the one computation in equivalence.py.
            row |= {"ci95_low": tost["ci95"][0], "ci95_high": tost["ci95"][1],
                    "ci90_low": tost["ci90"][0], "ci90_high": tost["ci90"][1], "p_tost": tost["p_tost"],
                    "equivalent": tost["equivalent"], "tost_verdict": tost["verdict"], "power": tost["power"],
                    "seeds_for_80_percent_power": tost["seeds_for_80_percent_power"]}
        if policy != reference and len(seeds) >= 2:
            if np.all(diffs == diffs[0]):
                # Identical differences: the t statistic is undefined; the test has no variance to use.
                row["p_paired"] = 1.0 if diffs[0] == 0 else 0.0
            else:
                t = stats.ttest_rel([accs[s] for s in seeds], [ref[s] for s in seeds])
                row["t_paired"], row["p_paired"] = float(t.statistic), float(t.pvalue)
            ref_values = np.array([a for a in ref.values() if np.isfinite(a)])
            if np.std(values) > 0 or np.std(ref_values) > 0:
                row["p_welch"] = float(stats.ttest_ind(values, ref_values, equal_var=False).pvalue)
        result[policy] = row
    return result


def _mean(x):
    return float(np.mean(x)) if len(x) else math.nan


def _std(x):
    return float(np.std(x, ddof=1)) if len(x) >= 2 else math.nan


def verdict_word(row) -> str:
    """TOST's verdict against +-MARGIN (equivalent, lower, higher, inconclusive), or why there is none."""
    if row["n"] == 0:
        return "diverged"
    if "tost_verdict" not in row:
        return "reference"
    if row["n_pairs"] < 2:
        return "untested"
    return row["tost_verdict"]


# --- figures ---------------------------------------------------------------------


def plot_accuracy(table, comparison, title_extra=""):
    """Final test accuracy of every seed (dots) with mean and std per policy, FP32's mean as a band."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    policies = list(table)
    ref = comparison.get(REFERENCE)
    if ref and np.isfinite(ref["mean"]):
        ax.axhspan(100 * (ref["mean"] - (ref["std"] if np.isfinite(ref["std"]) else 0)),
                   100 * (ref["mean"] + (ref["std"] if np.isfinite(ref["std"]) else 0)),
                   color="0.85", label="fp32 mean ± std")
        ax.axhline(100 * ref["mean"], color="0.5", lw=1)
    for i, policy in enumerate(policies):
        accs = np.array(list(table[policy].values()))
        finite = accs[np.isfinite(accs)]
        jitter = np.linspace(-0.15, 0.15, len(finite)) if len(finite) > 1 else np.zeros(len(finite))
        ax.plot(i + jitter, 100 * finite, "o", ms=4, alpha=0.6, color=f"C{i}")
        row = comparison[policy]
        if row["n"]:
            ax.errorbar(i + 0.3, 100 * row["mean"], yerr=100 * (row["std"] if np.isfinite(row["std"]) else 0),
                        fmt="s", color="k", capsize=4, ms=5)
        if row["diverged"]:
            ax.annotate(f"{row['diverged']} diverged", (i, 0.02), xycoords=("data", "axes fraction"),
                        ha="center", color="C3", fontsize=8)
    # Limits from the data, so no seed hides behind the axis (the band alone would set them otherwise).
    values = 100 * np.array([a for accs in table.values() for a in accs.values() if np.isfinite(a)])
    if len(values):
        pad = max(0.05, 0.15 * (values.max() - values.min()))
        ax.set_ylim(values.min() - pad, values.max() + pad)
    ax.set_xticks(range(len(policies)), policies, rotation=20)
    ax.set_xlabel("precision policy")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("Final test accuracy per seed (dots), mean ± std (squares)" + title_extra)
    ax.legend(fontsize=8, loc="best")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_differences(table, comparison):
    """Paired differences policy - FP32 per seed, with the mean, a 95% confidence interval and the p-value."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ref = table[REFERENCE]
    policies = [p for p in table if p != REFERENCE]
    for i, policy in enumerate(policies):
        row = comparison[policy]
        diffs = 100 * equivalence.paired_by_seed(table[policy], ref)[1]
        ax.plot(np.full(len(diffs), i), diffs, "o", ms=4, alpha=0.6, color=f"C{i + 1}")
        if np.isfinite(row["ci95_low"]):
            ax.errorbar(i + 0.2, 100 * row["diff_mean"], yerr=100 * (row["ci95_high"] - row["diff_mean"]), fmt="s",
                        color="k", capsize=4, ms=5)
        label = "diverged" if row["n"] == 0 else verdict_word(row).split(" ")[0]
        ax.annotate(label, (i, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -12),
                    textcoords="offset points", ha="center", fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(policies)), policies, rotation=20)
    ax.set_xlabel("precision policy")
    ax.set_ylabel("accuracy − fp32, same seed (percentage points)")
    ax.axhspan(-100 * MARGIN, 100 * MARGIN, color="C2", alpha=0.12, lw=0)
    ax.set_title(f"Paired difference to FP32 (dots: seeds; squares: mean, 95% CI; green: the ±{100 * MARGIN:g} point\n"
                 "equivalence margin; label: TOST's verdict)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_paper(comparison, paper):
    """Mixed precision minus FP32 in percentage points: the paper's ILSVRC12 CNNs beside our policies."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names, values, colours = [], [], []
    for row in paper:
        names.append(row["model"] + "\n(paper)")
        have = row["fp32"] is not None and row["mixed"] is not None
        values.append(row["mixed"] - row["fp32"] if have else math.nan)
        colours.append("0.55")
    for policy, row in comparison.items():
        if policy == REFERENCE:
            continue
        names.append(policy + "\n(ours)")
        values.append(100 * row["diff_mean"])
        colours.append("C0")
    x = np.arange(len(names))
    finite = np.isfinite(values)
    ax.bar(x[finite], np.array(values)[finite], color=np.array(colours)[finite])
    for i in x[~finite]:
        ax.annotate("n/a", (i, 0), ha="center", va="bottom", fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, names, rotation=60, fontsize=7)
    ax.set_ylabel("accuracy − FP32 (percentage points)")
    ax.set_title("Mixed precision − FP32: Micikevicius et al. 2018 Table 1 (ILSVRC12 top-1, grey)\n"
                 "beside ours (Fashion-MNIST, mean over seeds, blue)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# --- verdict -------------------------------------------------------------------------


def verdict(comparison, paper, setup) -> str:
    lines = [f"Accuracy parity on {setup['dataset']} ({setup['model']}, {setup['epochs']} epoch(s)"
             + (f", {setup['train_limit']} training samples" if setup["train_limit"] else "") + "); "
             f"policy - fp32 paired over seeds, TOST against ±{100 * MARGIN:g} points at alpha = {ALPHA} "
             f"(equivalent: the 90% CI inside the margin), paired t-test and Welch's beside:"]
    for policy, row in comparison.items():
        if row["n"] == 0:
            lines.append(f"  {policy:<14} diverged in all {row['diverged']} seeds")
            continue
        text = f"  {policy:<14} {100 * row['mean']:6.2f} ± {100 * row['std']:.2f} % (n={row['n']})"
        if policy != REFERENCE:
            text += (f"  diff {100 * row['diff_mean']:+.2f} pp"
                     f" (95% CI {100 * row['ci95_low']:+.2f} .. {100 * row['ci95_high']:+.2f};"
                     f" 90% CI {100 * row['ci90_low']:+.2f} .. {100 * row['ci90_high']:+.2f})"
                     f"  paired p={row['p_paired']:.3g}  Welch p={row['p_welch']:.3g}  TOST p={row['p_tost']:.3g}"
                     f"  power {row['power']:.2f} (80% at {row['seeds_for_80_percent_power']} seeds)"
                     f"  -> {verdict_word(row)}")
        if row["diverged"]:
            text += f"  ({row['diverged']} diverged)"
        lines.append(text)
    ref, others = comparison.get(REFERENCE), [r for p, r in comparison.items() if p != REFERENCE and r["n_pairs"]]
    if ref and others and np.isfinite(ref["std"]):
        # How much pairing helps: if seeds mattered alike for every policy, the differences would vary far less.
        lines.append(f"Pairing: fp32's seed-to-seed std is {100 * ref['std']:.2f} pp; the paired differences' std "
                     f"averages {100 * np.nanmean([r['diff_std'] for r in others]):.2f} pp.")
    diffs = [r["mixed"] - r["fp32"] for r in paper if r["fp32"] is not None and r["mixed"] is not None]
    if diffs:
        lines.append(f"Paper (Table 1, {len(diffs)} ILSVRC12 CNNs, one run each): mixed - FP32 from "
                     f"{min(diffs):+.2f} to {max(diffs):+.2f} pp.")
    else:
        lines.append("Paper: Table 1's numbers are not in data/micikevicius2018_parity.csv yet.")
    return "\n".join(lines)


def findings(comparison, paper, setup) -> dict:
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return {"study": "parity", "reference": REFERENCE, "alpha": ALPHA, "margin_points": 100 * MARGIN,
            "test": "TOST of the paired differences over seeds against the margin (verdict); paired t-test and "
                    "Welch's test beside",
            "setup": setup,
            "ours": {p: {k: clean(v) for k, v in row.items()} | {"verdict": verdict_word(row)}
                     for p, row in comparison.items()},
            "paper": {"source": "Micikevicius et al. 2018, Table 1 (data/micikevicius2018_parity.csv)",
                      "rows": paper}}


def save_all(path, out_dir, paper_csv=PAPER_CSV, prefix="parity"):
    """Writes PREFIX_accuracy.png, PREFIX_difference.png, PREFIX_paper.png and
    PREFIX_findings.json into out_dir; returns their paths and the verdict."""
    table = by_policy(load_runs(path))
    comparison = compare(table)
    paper = load_paper(paper_csv)
    setup = experiment(path)
    figs = [(f"{prefix}_accuracy", plot_accuracy(table, comparison, f" ({setup_label(setup)})")),
            (f"{prefix}_difference", plot_differences(table, comparison)),
            (f"{prefix}_paper", plot_paper(comparison, paper))]
    written = figures.save_study(out_dir, figs, findings(comparison, paper, setup), f"{prefix}_findings.json")
    for _, fig in figs:
        plt.close(fig)
    return written, verdict(comparison, paper, setup)


if __name__ == "__main__":
    sys.exit(figures.study_main(
        None, __doc__.splitlines()[0], "parity.toml", lambda args: save_all(args.log, args.out, prefix=args.prefix),
        add_arguments=lambda parser: parser.add_argument(
            "--prefix", default="parity",
            help="file name prefix of the figures and findings (parity_cnn for parity_cnn.toml's log)")))
