#!/usr/bin/python3
"""The README's table of findings beside Micikevicius et al. (2018), written from the studies' findings files.

Every number in the "mpsim" column comes from docs/figures/STUDY_findings.json, which each study's module writes
from its log (experiments/studies.sh); the paper's column and the provenance notes are the text below. The table
sits in README.md between the two marker lines; nothing in it is typed by hand (issue #21, section 5).

    /usr/bin/python3 notebooks/findings_table.py                 # print the table
    /usr/bin/python3 notebooks/findings_table.py --write README.md
    /usr/bin/python3 notebooks/findings_table.py --check README.md  # exit 1 when README's table is stale

Run --write after studies.sh has redrawn the findings; CI runs --check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402  (beside this file)

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures"
BEGIN = "<!-- findings table: written by notebooks/findings_table.py from docs/figures/*_findings.json -->"
END = "<!-- end of findings table -->"
MARGIN_POINTS = 0.5  # parity's equivalence margin (parity.py's MARGIN, in points)


def load(study: str, figures: Path = FIGURES) -> dict:
    return json.loads((figures / f"{study}_findings.json").read_text())


def pct(x: float, digits: int = 1) -> str:
    """A share in percent: `digits` decimals, or two significant digits below 0.1% (0.003%, not 0.0%)."""
    value = 100 * x
    return f"{value:.2g}%" if 0 < abs(value) < 0.1 else f"{value:.{digits}f}%"


def points(x: float, digits: int = 2) -> str:
    value = 100 * x
    if round(value, digits) == 0:
        return f"{0:.{digits}f}"
    return f"{value:+.{digits}f}".replace("-", "−")


def underflow_rows(u: dict) -> list[tuple[str, str, str]]:
    m = u["models"]
    paper = u["paper"]
    zero, below = paper["activation_grads_zero"], paper["weight_grads_below_2^-24"]
    seeds = m["mlp"]["over_seeds"]["seeds"]
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}, mean"

    def mean(model, key):
        return pct(sum(m[model]["over_seeds"][key]) / len(m[model]["over_seeds"][key]))

    def span(kind):  # the headroom over the models and seeds, in binades
        values = sorted({int(v) for k in m for v in m[k]["over_seeds"][f"{kind}_headroom_binades"]})
        return f"{values[0]}" if len(values) == 1 else f"{values[0]} to {values[-1]}"

    return [
        (f"activation gradients exactly zero (FP32; {which})",
         f"MLP {mean('mlp', 'activation_grads_zero')}, CNN {mean('cnn', 'activation_grads_zero')} of all values, "
         "each tensor counted once where the policy rounds it; ReLU zeroes the gradient where its output is zero "
         f"(MLP {mean('mlp', 'relu_output_zero')}, CNN {mean('cnn', 'relu_output_zero')} of its values), "
         "selecting values already counted",
         f"{zero['text']} for {zero['model']} (figure {zero['figure']}, as quoted in issue #6; two secondary "
         "summaries agree, the paper's caption not checked)"),
        (f"weight gradients below 2^-24 (FP32; {which})",
         f"MLP {mean('mlp', 'weight_grads_below_2^-24_of_nonzero')}, CNN "
         f"{mean('cnn', 'weight_grads_below_2^-24_of_nonzero')} of the nonzero values (of all values: "
         f"{mean('mlp', 'weight_grads_below_2^-24')}, {mean('cnn', 'weight_grads_below_2^-24')})",
         f"about {below['text'].lstrip('~')} for the {below['model']}: \"approximately 5% of weight gradient values "
         f"have exponents smaller than −24\" (§3.1, figure {below['figure']}; checked against a text extraction of "
         "arXiv v3; the paper states no denominator)"),
        (f"headroom: binades between the largest gradient and FP16's max ({which.removesuffix(', mean')})",
         f"activation {span('activation_grads')}, weight {span('weight_grads')}",
         "the argument for loss scaling: the top of FP16's range goes unused, so shifting gradients up costs nothing"),
    ]


def parity_cell(found: dict, model: str) -> str:
    parts = []
    seeds = set()
    for policy, row in found["ours"].items():
        if policy == found["reference"]:
            continue
        if not row.get("n_pairs"):
            parts.append(f"{policy} diverged")
            continue
        tost = equivalence.summary_equivalence(row["diff_mean"], row["diff_std"], row["n_pairs"],
                                               MARGIN_POINTS / 100)
        seeds.add(row["n_pairs"])
        word = "equivalent" if tost["equivalent"] else tost["verdict"]
        parts.append(f"{policy} {points(row['diff_mean'])} ({word})")
    n = "/".join(str(s) for s in sorted(seeds))
    return f"{model} ({n} seeds): " + ", ".join(parts)


def parity_row(mlp: dict, cnn: dict) -> tuple[str, str, str]:
    rows = [r for r in mlp["paper"]["rows"] if r["fp32"] is not None and r["mixed"] is not None]
    diffs = [r["mixed"] - r["fp32"] for r in rows]
    paper = (f"{min(diffs):+.2f} to {max(diffs):+.2f} points on {len(rows)} ILSVRC12 CNNs, one run each "
             "(`data/micikevicius2018_parity.csv`, whose header says where the numbers come from)").replace("-", "−")
    return ("mixed precision − FP32 test accuracy, points (TOST within ±0.5)",
            parity_cell(mlp, "MLP") + "; " + parity_cell(cnn, "CNN"), paper)


def precision_hurts_row(p: dict) -> tuple[str, str, str]:
    parts = []
    scaled = []
    for point in p["points"]:
        k = int(point["k"])
        d = point["difference_to_fp32"]
        scaled.append(abs(d["scaled"]["mean"]))
        status = point["status"]["noscale"]
        stopped = sum(not s.startswith("completed") for s in status)
        if stopped:
            accs = [a for a, s in zip(point["test_accuracy"]["noscale"], status) if s.startswith("completed")]
            at_chance = sum(a <= 0.11 for a in accs)
            parts.append(f"2^-{k}: {stopped} of {len(status)} stopped with a non-finite loss, {at_chance} at chance")
        else:
            parts.append(f"2^-{k}: {points(d['noscale']['mean'], 2)} points (paired t-test p = "
                         f"{d['noscale']['paired_p']:.2g})")
    seeds = len(p["points"][0]["seeds"])
    return ("FP16 without loss scaling, against FP32",
            f"with the loss weighted by 2^-k (a demonstration: a static loss scale below one), {seeds} seeds: "
            + "; ".join(parts).replace("2^-0:", "unweighted:")
            + f"; dynamic loss scaling within {100 * max(scaled):.2f} point of FP32 at every k",
            "some networks need loss scaling to match FP32, others do not (Table 1's CNNs did not)")


def master_weights_row(mw: dict) -> tuple[str, str, str]:
    per_lr = sorted(mw["per_lr"], key=lambda r: r["lr"])
    big = [r for r in per_lr if r["accuracy_cost"] > 0.005]
    small = [r for r in per_lr if r["accuracy_cost"] <= 0.005]
    text = ", ".join(f"{points(-r['accuracy_cost'], 1)} points at lr {r['lr']:g}" for r in big)
    if small:
        text += (f", {100 * max(r['accuracy_cost'] for r in small):.2f} or less at {min(r['lr'] for r in small):g} "
                 "and above")
    seeds = per_lr[0].get("seeds", [1])
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}, mean"
    return (f"FP16 weights without an FP32 master copy ({which})", text,
            "the reasons for the master copy: updates too small for FP16, and updates below 2^-11 of their weight "
            "(half an FP16 ulp) that vanish in the addition")


def emulator_row(e: dict) -> tuple[str, str, str]:
    agreement = e.get("agreement", {})
    if not agreement:
        return ("emulator against the GPU", "not run on a GPU in the log drawn", "(not in the paper)")
    rel = [a["max_loss_relative_difference"] for a in agreement.values()]
    acc = [abs(a["test_accuracy_difference"]) for a in agreement.values()]
    return ("emulator against the GPU (seed 1; docs/gpu.md)",
            f"{len(agreement)} policies on `cuda` beside the emulator: the trajectories decorrelate as any two "
            f"summation orders do (largest relative loss difference {min(rel):.2f} to {max(rel):.2f}); test "
            f"accuracy within {100 * max(acc):.2f} points",
            "(not in the paper)")


def shadow_row(sh: dict) -> tuple[str, str, str]:
    seeds = sh["policies"][0]["seeds"]
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}, mean"
    errors = ", ".join(f"{p['policy']} {pct(p['relative_error_mean'], 2)}" for p in sh["policies"]
                       if p["policy"] != "fp32")
    zeroed = ", ".join(f"{p['policy']} {pct(p['zeroed_share_mean'], 3)}" for p in sh["policies"]
                       if p["policy"].startswith("fp16"))
    control = "exactly 0 (the control)" if sh["control_exact"] else "NOT 0: the control failed"
    return (f"one step's gradient against its binary32 twin, the same weights and batch (MLP; median over each "
            f"run's {sh['shadow_steps']} shadow steps, {which})",
            f"relative error norm(g − g32) / norm(g32): {errors}; fp32 {control}. Nonzero binary32 gradient "
            f"elements the arm's gradient lost to zero: {zeroed}",
            "(not measured in the paper, which compares final accuracies)")


def rows(figures: Path = FIGURES) -> list[tuple[str, str, str]]:
    def get(study):
        return load(study, figures)

    return (underflow_rows(get("underflow"))
            + [parity_row(get("parity"), get("parity_cnn")), precision_hurts_row(get("precision_hurts")),
               master_weights_row(get("master_weights")), shadow_row(get("shadow_fp32")),
               emulator_row(get("emulator_vs_gpu"))])


def table(figures: Path = FIGURES) -> str:
    lines = [BEGIN, "| question | mpsim on Fashion-MNIST | Micikevicius et al. 2018 |", "|---|---|---|"]
    lines += [f"| {q} | {ours} | {paper} |" for q, ours, paper in rows(figures)]
    lines.append(END)
    return "\n".join(lines) + "\n"


def replace_in(text: str, new: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers are missing: put\n{BEGIN}\n{END}\nwhere the table goes")
    return text[:start] + new + text[end + len(END) + 1:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="README", type=Path, help="rewrite the table in this file")
    group.add_argument("--check", metavar="README", type=Path, help="exit 1 when this file's table differs")
    parser.add_argument("--figures", type=Path, default=FIGURES, help="the findings files' folder (docs/figures)")
    args = parser.parse_args(argv)
    new = table(args.figures)
    if args.write:
        args.write.write_text(replace_in(args.write.read_text(), new))
        print(f"{args.write}: findings table written")
    elif args.check:
        text = args.check.read_text()
        if replace_in(text, new) != text:
            print(f"{args.check}: the findings table differs from docs/figures/*_findings.json; run "
                  f"/usr/bin/python3 notebooks/findings_table.py --write {args.check}", file=sys.stderr)
            return 1
        print(f"{args.check}: findings table up to date")
    else:
        sys.stdout.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
