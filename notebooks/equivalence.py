"""Equivalence of paired differences: two one-sided tests (TOST) against a margin fixed before the runs.

"No significant difference" is not parity: with few seeds a difference test has no power to find anything,
so its failure to reject says nothing. Equivalence is the claim that the true mean difference lies inside
(-margin, +margin); TOST (Schuirmann 1987) accepts it at level alpha when both one-sided t-tests reject
H0: difference <= -margin and H0: difference >= +margin, which is the same as the 1 - 2 alpha (90%) t-interval
lying inside the margin. The verdicts:

    equivalent   the 90% interval lies inside (-margin, margin) (TOST at alpha = 0.05)
    lower/higher the 95% interval excludes 0 and the interval is not inside the margin
    inconclusive neither: the seeds cannot tell (the power below says how many would)

`power` is TOST's power against a true difference of 0 with the observed spread of the differences taken as
the true one (a planning figure, not a property of the data): P(the 90% interval of n new paired differences
lies inside the margin), computed exactly by integrating over the sample standard deviation's chi distribution.
Needs scipy.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import integrate, stats

ALPHA = 0.05


def tost_power(sd: float, n: int, margin: float, alpha: float = ALPHA, true_difference: float = 0.0) -> float:
    """TOST's power for n paired differences of standard deviation sd (planning value) and the given true
    mean difference: P(|mean - 0| + t_{1-alpha,n-1} s / sqrt(n) < margin over the sampling of mean and s)."""
    if n < 2 or not np.isfinite(sd) or margin <= 0:
        return math.nan
    if sd == 0:
        return 1.0 if abs(true_difference) < margin else 0.0
    df = n - 1
    t = float(stats.t.ppf(1 - alpha, df))
    se = sd / math.sqrt(n)

    def given_s(q: float) -> float:  # q = (n - 1) s^2 / sd^2 ~ chi2(df)
        half = margin - t * sd * math.sqrt(q / df) / math.sqrt(n)
        if half <= 0:
            return 0.0
        p = stats.norm.cdf((half - true_difference) / se) - stats.norm.cdf((-half - true_difference) / se)
        return float(p) * float(stats.chi2.pdf(q, df))

    upper = df * (margin * math.sqrt(n) / (t * sd)) ** 2  # s beyond this makes the interval wider than the margin
    value, _ = integrate.quad(given_s, 0.0, upper, limit=200)
    return min(1.0, max(0.0, value))


def seeds_for_power(sd: float, margin: float, target: float = 0.8, alpha: float = ALPHA, most: int = 200) -> int | None:
    """The fewest seeds whose TOST power at a true difference of 0 reaches `target`; None past `most`."""
    for n in range(2, most + 1):
        if tost_power(sd, n, margin, alpha) >= target:
            return n
    return None


def paired_by_seed(values: dict, reference: dict) -> tuple[list, np.ndarray]:
    """The seeds both runs have, sorted, and values minus reference at each: the pairs of a paired test (a seed
    fixes the initial weights and the batch order, the same under every policy). A pair with a non-finite side
    (a run that diverged) is left out; the caller counts those from its own table."""
    seeds = sorted(s for s in values if s in reference and np.isfinite(values[s]) and np.isfinite(reference[s]))
    return seeds, np.array([values[s] - reference[s] for s in seeds], dtype=float)


def paired_equivalence(differences, margin: float, alpha: float = ALPHA) -> dict:
    """TOST and the difference test on paired differences (any unit; margin in the same unit)."""
    d = np.asarray([x for x in differences if np.isfinite(x)], dtype=float)
    n = len(d)
    return summary_equivalence(float(d.mean()) if n else math.nan, float(d.std(ddof=1)) if n >= 2 else math.nan,
                               n, margin, alpha)


def summary_equivalence(mean: float, sd: float, n: int, margin: float, alpha: float = ALPHA) -> dict:
    """paired_equivalence from the differences' mean, sample standard deviation and count alone (all a t-test
    uses), for findings that stored those and not the differences."""
    row = {"n": n, "margin": margin, "alpha": alpha, "mean": mean, "sd": sd if n >= 2 else math.nan,
           "ci95": [math.nan, math.nan],
           "ci90": [math.nan, math.nan], "p_difference": math.nan, "p_tost": math.nan, "equivalent": False,
           "power": math.nan, "seeds_for_80_percent_power": None, "direction": "",
           "verdict": "inconclusive (fewer than 2 seeds: no interval)"}
    if n < 2:
        return row
    se = sd / math.sqrt(n)
    df = n - 1
    half95 = float(stats.t.ppf(1 - alpha / 2, df)) * se
    half90 = float(stats.t.ppf(1 - alpha, df)) * se
    row["ci95"] = [mean - half95, mean + half95]
    row["ci90"] = [mean - half90, mean + half90]
    if se > 0:
        row["p_difference"] = float(2 * stats.t.sf(abs(mean) / se, df))
        p_low = float(stats.t.sf((mean + margin) / se, df))  # H0: difference <= -margin
        p_high = float(stats.t.cdf((mean - margin) / se, df))  # H0: difference >= +margin
        row["p_tost"] = max(p_low, p_high)
    else:  # every difference the same: no spread to test with; the interval is the point
        row["p_difference"] = 1.0 if mean == 0 else 0.0
        row["p_tost"] = 0.0 if abs(mean) < margin else 1.0
    row["equivalent"] = bool(row["ci90"][0] > -margin and row["ci90"][1] < margin)
    row["power"] = tost_power(sd, n, margin, alpha)
    row["seeds_for_80_percent_power"] = seeds_for_power(sd, margin, 0.8, alpha)
    # The difference test's outcome: the 95% interval below or above 0, or "" when it holds 0.
    different = row["direction"] = "lower" if row["ci95"][1] < 0 else "higher" if row["ci95"][0] > 0 else ""
    if row["equivalent"]:
        row["verdict"] = "equivalent" + (f" (and {different})" if different else "")
    else:
        row["verdict"] = different or "inconclusive"
    return row


def describe(row: dict, scale: float = 100.0, unit: str = "points", digits: int = 2) -> str:
    """One line for a paired_equivalence result: mean difference, 90% interval and verdict, values times scale."""
    return (f"difference {scale * row['mean']:+.{digits}f} {unit} (90% CI {scale * row['ci90'][0]:+.{digits}f} .. "
            f"{scale * row['ci90'][1]:+.{digits}f}) -> {row['verdict']}")
