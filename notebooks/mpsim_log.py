"""Read the HDF5 experiment logs that `mpsim run` writes (docs/hdf5-schema.md).

Needs h5py and numpy; `to_xarray` also needs xarray. Every function that
reads takes a path or an already open h5py.File (from `open_log`), so a
notebook can keep one file open for many calls:

    import mpsim_log as ml
    steps, binades, counts = ml.histogram("run.h5", "fp16", "fc1", "weight_grads")

This module is the one reader of the logs: the study modules in notebooks/ take
from it an arm's policy (`policy`, read from the log's attributes, never from
its `policy_description` text), its sweep point (`sweep_point`), the bin layout
(`bins`: binade exponents, edges and the zero, infinity and NaN bins), totals of
a tensor kind (`kind_histogram`, `kind_counters`) and shares with a named
denominator (`fraction` for counters, `histogram_fraction` and `binade_shares`
for histograms).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Iterator, Union

import h5py
import numpy as np

SCHEMA_VERSION = 9
# Version 1 lacks /arms/<arm>/policy/: everything but `policy` reads it. Version 2
# lacks the root `cpu` and the arms' `threads` and `gemm` attributes (nothing here needs them).
# Version 3 lacks stats/logit_max: everything but `logit_max` reads it. Version 4 lacks the policy
# points softmax_internals and norm_statistics, version 5 loss_internals (policy() returns the
# points the log has). Version 6 and earlier also count ReLU's and max pooling's input gradients as tensors of their
# own: their activation_grads aggregates over layers count those values twice (docs/hdf5-schema.md).
# Version 7 and earlier lack /arms/<arm>/shadow/: everything but `shadow` reads them.
# Version 8 and earlier have no attention_logits and attention_probs kinds (kinds() lists what a log has).
OLDEST_SCHEMA_VERSION = 1
# Values of the `binade` coordinate for the bins that are not binades.
ZERO_BIN = 1000
INFINITY_BIN = 1001
NAN_BIN = 1002

PathOrFile = Union[str, "os.PathLike[str]", h5py.File]


def open_log(path: Union[str, "os.PathLike[str]"]) -> h5py.File:
    """Opens a log read-only and checks its schema version."""
    f = h5py.File(path, "r")
    version = int(f.attrs.get("schema_version", -1))
    if not OLDEST_SCHEMA_VERSION <= version <= SCHEMA_VERSION:
        f.close()
        raise ValueError(f"{path}: schema_version {version}, this reader knows "
                         f"{OLDEST_SCHEMA_VERSION} to {SCHEMA_VERSION}")
    return f


@contextlib.contextmanager
def _log(path: PathOrFile) -> Iterator[h5py.File]:
    if isinstance(path, h5py.File):
        yield path
    else:
        with open_log(path) as f:
            yield f


def _text(value) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8")
    return str(value)


def _names(dataset: h5py.Dataset) -> list[str]:
    return [_text(v).rstrip("\0") for v in dataset[()]]


# Counter names of older logs, by today's: schema 6 and earlier called rounded_to_zero "flushed".
LEGACY_COUNTER_NAMES = {"flushed": "rounded_to_zero"}


def _counter_names(dataset: h5py.Dataset) -> list[str]:
    """A "counter" coordinate's names, older logs' names mapped to today's (LEGACY_COUNTER_NAMES)."""
    return [LEGACY_COUNTER_NAMES.get(name, name) for name in _names(dataset)]


def _arm(f: h5py.File, arm: str) -> h5py.Group:
    if arm not in f["arms"]:
        raise KeyError(f"no arm {arm!r}; the log has {sorted(f['arms'])}")
    return f["arms"][arm]


def _index(names: list[str], name_or_index, what: str) -> int:
    if isinstance(name_or_index, (bool, np.bool_)):
        raise TypeError(f"{what} {name_or_index!r}: give a name or an index, not a bool")
    if isinstance(name_or_index, (int, np.integer)):
        # No negative indices: a slice from -1 would be empty and sum to zeros without a word.
        if not 0 <= name_or_index < len(names):
            raise KeyError(f"no {what} {int(name_or_index)}: indices run 0..{len(names) - 1} ({names})")
        return int(name_or_index)
    try:
        return names.index(name_or_index)
    except ValueError:
        raise KeyError(f"no {what} {name_or_index!r}; there are {names}") from None


def config(path: PathOrFile) -> str:
    """The fully resolved TOML config of the experiment."""
    with _log(path) as f:
        return _text(f.attrs["config"])


def info(path: PathOrFile) -> dict:
    """The file's root attributes (config, mpsim_version, git_revision, start_time, host, cpu, seed, schema_version;
    a log written by notebooks/merge_logs.py adds `seeds` and `merged_from`, lists)."""
    with _log(path) as f:
        return {k: _value(v) for k, v in f.attrs.items()}


def config_order(path: PathOrFile, policies) -> list[str]:
    """The distinct names in `policies` in the order of the config's `arms` list (names it lacks last, in the
    order given): study modules list policies as the config does, whatever the seeds and sweeps."""
    import tomllib  # Python 3.11's; only this function needs it

    distinct = list(dict.fromkeys(policies))
    try:
        listed = [str(a) for a in tomllib.loads(config(path)).get("arms", [])]
    except tomllib.TOMLDecodeError:
        listed = []
    rank = {name: i for i, name in enumerate(listed)}
    return sorted(distinct, key=lambda name: (rank.get(name, len(rank)), distinct.index(name)))


def arms(path: PathOrFile) -> list[str]:
    """Names of the arms, sorted."""
    with _log(path) as f:
        return sorted(f["arms"])


def arm_info(path: PathOrFile, arm: str) -> dict:
    """An arm's attributes (name, backend, policy, policy_description, seed, sweep, status) and its layer
    names. `policy` here is the policy's name; `policy()` reads the policy itself."""
    with _log(path) as f:
        g = _arm(f, arm)
        result = {k: (_text(v) if isinstance(v, (str, bytes)) else v.item()) for k, v in g.attrs.items()}
        result["layers"] = _names(g["layer"])
        return result


def _value(v):
    """An attribute as Python: str, bool (uint8 flags), int, float, or a list (1-D attributes: str or numbers)."""
    if isinstance(v, (str, bytes, np.bytes_)):
        return _text(v)
    if isinstance(v, np.ndarray) and v.ndim == 1:
        return [_text(x) if isinstance(x, (str, bytes, np.bytes_)) else x.item() for x in v]
    if isinstance(v, np.bool_) or (isinstance(v, np.integer) and v.dtype == np.uint8):
        return bool(v)
    return v.item() if isinstance(v, np.generic) else v


def policy(path: PathOrFile, arm: str) -> dict:
    """The arm's precision policy as it ran, from its `policy/` attributes (docs/hdf5-schema.md):

        {"name": "fp16-mixed",
         "points": {"weights": {"format": "binary16", "exponent_bits": 5, "mantissa_bits": 10,
                                "rounding": "nearest-even", "random_bits": 32, "scaled": False}, ...},
         "master_weights": True, "gemm": "ieee", "fp32_ops": ["layer_norm", ...],
         "loss_scale": {"mode": "dynamic", "initial": 65536.0, "growth_factor": 2.0, ...},
         "delayed_scaling": {"history": 16, "margin": 0}}

    "points" holds every rounding point, in the order the log lists them (a step's order)."""
    with _log(path) as f:
        g = _arm(f, arm)
        if "policy" not in g:
            raise KeyError(f"arm {arm!r} has no policy group: the log was written with schema_version "
                           f"{int(f.attrs['schema_version'])}; run it again with this mpsim")
        attrs = {k: _value(v) for k, v in g["policy"].attrs.items()}
    points = attrs.pop("points")
    result: dict = {"points": {name: {} for name in points}}
    for key, value in attrs.items():
        head, dot, field = key.partition(".")
        if not dot:
            result[key] = value
        elif head in result["points"]:
            result["points"][head][field] = value
        else:
            result.setdefault(head, {})[field] = value
    return result


def rounding_point_text(point: dict) -> str:
    """A rounding point of `policy()` as the config spells it: format[/rounding][/scaled]."""
    text = point["format"]
    if point["rounding"] != "nearest-even":
        text += "/" + point["rounding"]
    return text + ("/scaled" if point["scaled"] else "")


def sweep_point(path: PathOrFile, arm: str) -> dict[str, str]:
    """The arm's sweep point as {key: value text}: `lr=0.1,initial=8` -> {"lr": "0.1", "initial": "8"};
    {} outside a sweep."""
    with _log(path) as f:
        label = _text(_arm(f, arm).attrs.get("sweep", ""))
    return dict(part.split("=", 1) for part in label.split(",") if "=" in part)


def kinds(path: PathOrFile, arm: str) -> list[str]:
    """The tensor kinds an arm's statistics are kept for, in the log's order (core's TensorKind table)."""
    with _log(path) as f:
        return _names(_arm(f, arm)["kind"])


def counter_names(path: PathOrFile, arm: str) -> list[str]:
    """The counters kept per layer and kind, in the log's order (core's Counter table)."""
    with _log(path) as f:
        return _counter_names(_arm(f, arm)["counter"])


def layers(path: PathOrFile, arm: str) -> list[str]:
    """An arm's layer names, in model order."""
    with _log(path) as f:
        return _names(_arm(f, arm)["layer"])


def steps(path: PathOrFile, arm: str) -> dict[str, np.ndarray]:
    """Per-step records: step, loss, loss_scale, found_inf, skipped (bool), learning_rate, grad_norm."""
    with _log(path) as f:
        g = _arm(f, arm)["steps"]
        result = {name: g[name][()] for name in g}
        for name, values in result.items():  # flags are uint8 0 or 1 (docs/hdf5-schema.md)
            if values.dtype == np.uint8:
                result[name] = values.astype(bool)
        return result


def evals(path: PathOrFile, arm: str) -> dict[str, np.ndarray]:
    """Evaluations: step, epoch, train_loss, train_accuracy, test_loss, test_accuracy."""
    with _log(path) as f:
        g = _arm(f, arm)["eval"]
        return {name: g[name][()] for name in g}


def shadow(path: PathOrFile, arm: str) -> dict[str, np.ndarray]:
    """The FP32 shadow's rows (train.shadow_interval > 0), one per layer with parameters and one for the whole model
    (layer -1) at each shadow step: step, layer, loss_fp32, relative_error, cosine, norm_ratio, norm_fp32, elements,
    nonzero_fp32, zeroed (docs/hdf5-schema.md). Empty arrays where the run had no shadow."""
    with _log(path) as f:
        g = _arm(f, arm)
        if "shadow" not in g:
            raise ValueError(f"{f.filename}: arm {arm!r} has no shadow/ group: the log is older than schema "
                             "version 8; rerun it with train.shadow_interval > 0")
        return {name: g["shadow"][name][()] for name in g["shadow"]}


def histogram(path: PathOrFile, arm: str, layer, kind) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, binade, counts[n_steps, 280]) for one layer (name or index) and tensor kind (name or index).

    binade[i] is the exponent e of bin i (values with 2^e <= |x| < 2^(e+1)),
    then ZERO_BIN, INFINITY_BIN, NAN_BIN for the last three bins. Counts are int64.
    """
    with _log(path) as f:
        g = _arm(f, arm)
        li = _index(_names(g["layer"]), layer, "layer")
        ki = _index(_names(g["kind"]), kind, "kind")
        counts = g["stats/histogram"][:, li, ki, :].astype(np.int64)
        return g["stats/step"][()], g["binade"][()], counts


def counters(path: PathOrFile, arm: str, layer, kind) -> dict[str, np.ndarray]:
    """{"step": steps, <counter name>: values[n_steps], ...} for one layer and tensor kind."""
    with _log(path) as f:
        g = _arm(f, arm)
        li = _index(_names(g["layer"]), layer, "layer")
        ki = _index(_names(g["kind"]), kind, "kind")
        values = g["stats/counters"][:, li, ki, :]
        result = {"step": g["stats/step"][()]}
        for i, name in enumerate(_counter_names(g["counter"])):
            result[name] = values[:, i]
        return result


def has_block_stats(path: PathOrFile, arm: str) -> bool:
    """Whether the arm logged block-scaled GEMM operands (its policy has block points)."""
    with _log(path) as f:
        return "block_stats" in _arm(f, arm)


def block_stats(path: PathOrFile, arm: str, operand=None, layer=None, per_step: bool = False,
                per_layer: bool = False) -> dict:
    """What block quantization did to the arm's GEMM operands, in one line:

        b = ml.block_stats("run.h5", "nvfp4", operand="wgrad_gradients")
        b["rounded_to_zero"] / b["nonzero"], b["scale_binades"], b["error"]

    Summed over the instrumented steps, the layers (or one layer, by name or index) and the operands
    (or one, by name or index: fprop_activations, fprop_weights, dgrad_gradients, dgrad_weights,
    wgrad_gradients, wgrad_activations). per_step keeps the step axis (first), per_layer the layer axis.
    Returns the counters (elements, nonzero, saturated, rounded_to_zero, nan, blocks, scale_clamped) as ints or
    int64 arrays, "scale_binades" (bins as `bins`), "scale_codes" (256: E8M0 code = exponent + 127, or
    the UE4M3 encoding), "error" (blocks by relative error in units of the element's epsilon, by quarter
    binade; each bin's lower edge as log2 in "error_log2", then the exact and the NaN blocks), and "step"
    with per_step."""
    with _log(path) as f:
        g = _arm(f, arm)
        if "block_stats" not in g:
            raise KeyError(f"arm {arm!r} has no block_stats: its policy has no block points")
        b = g["block_stats"]
        oi = slice(None) if operand is None else _index(_names(b["operand"]), operand, "operand")
        li = slice(None) if layer is None else _index(_names(g["layer"]), layer, "layer")

        def read(name):
            values = b[name][()].astype(np.int64)  # [steps, layers, operands, bins]
            values = values[:, li] if layer is not None else values
            if layer is not None:
                values = values[:, np.newaxis]
            values = values[:, :, oi] if operand is not None else values.sum(axis=2)
            if not per_layer:
                values = values.sum(axis=1)
            return values if per_step else values.sum(axis=0)

        counters = read("counters")
        result = {"step": b["step"][()]} if per_step else {}
        for i, name in enumerate(_counter_names(b["counter"])):
            v = counters[..., i]
            result[name] = int(v) if v.ndim == 0 else v
        for name in ("scale_binades", "scale_codes", "error"):
            result[name] = read(name)
        result["error_log2"] = b["error_log2"][()]
        return result


def agreement(path: PathOrFile) -> dict[str, dict]:
    """The /agreement group: {compared arm: {reference, max_loss_relative_difference,
    test_accuracy_difference, layers, kinds, histogram_distance[layer, kind]}}; {} when the
    file has none (only one backend ran)."""
    with _log(path) as f:
        if "agreement" not in f:
            return {}
        return {name: {"reference": _text(g.attrs["reference"]),
                       "max_loss_relative_difference": float(g.attrs["max_loss_relative_difference"]),
                       "test_accuracy_difference": float(g.attrs["test_accuracy_difference"]),
                       "layers": _names(g["layer"]),
                       "kinds": _names(g["kind"]),
                       "histogram_distance": g["histogram_distance"][()]}
                for name, g in f["agreement"].items()}


# --- bins ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bins:
    """The bin layout of an arm's histograms, from its `binade` and `bin_label` coordinates.

    Binade bin i (i in `finite`) holds the finite nonzero values with 2^e <= |x| < 2^(e+1),
    e = exponents[i]; `zero`, `infinity` and `nan` are the indices of the other bins."""

    binade: np.ndarray  # the `binade` coordinate, one value per bin
    labels: list[str]   # the `bin_label` coordinate
    finite: slice       # the binade bins
    zero: int
    infinity: int
    nan: int

    @property
    def exponents(self) -> np.ndarray:
        """e of each binade bin, in bin order."""
        return self.binade[self.finite].astype(np.int64)

    @property
    def edges(self) -> np.ndarray:
        """Bin edges in log2 of the magnitude: binade bin i spans [edges[i], edges[i + 1])."""
        e = self.exponents
        return np.append(e, e[-1] + 1)

    def select(self, lo: float = -math.inf, hi: float = math.inf) -> np.ndarray:
        """Boolean mask over every bin: the binade bins with lo <= e < hi."""
        mask = np.zeros(len(self.binade), dtype=bool)
        e = self.exponents
        mask[self.finite] = (e >= lo) & (e < hi)
        return mask

    def special(self, *names: str) -> np.ndarray:
        """Boolean mask over every bin: the named bins among "zero", "infinity", "nan"."""
        mask = np.zeros(len(self.binade), dtype=bool)
        for name in names:
            mask[getattr(self, name)] = True
        return mask


def bins(path: PathOrFile, arm: str | None = None) -> Bins:
    """The bin layout of an arm (default: the first arm; every arm of a log shares it)."""
    with _log(path) as f:
        g = _arm(f, arm if arm is not None else sorted(f["arms"])[0])
        binade = g["binade"][()]
        labels = _names(g["bin_label"])
    where = {value: int(np.flatnonzero(binade == value)[0]) for value in (ZERO_BIN, INFINITY_BIN, NAN_BIN)}
    finite = np.flatnonzero(~np.isin(binade, list(where)))
    if not len(finite) or np.any(np.diff(finite) != 1):
        raise ValueError("the binade bins are not one contiguous run")
    return Bins(binade, labels, slice(int(finite[0]), int(finite[-1]) + 1), where[ZERO_BIN], where[INFINITY_BIN],
                where[NAN_BIN])


# --- totals and shares ------------------------------------------------------------------------


def stats_steps(path: PathOrFile, arm: str) -> np.ndarray:
    """The steps at which stats (histograms, counters) were taken."""
    with _log(path) as f:
        return _arm(f, arm)["stats/step"][()]


def logit_max(path: PathOrFile, arm: str, layer=None) -> dict:
    """The largest finite |logit| at each stats step: {"step": steps, layer name: values} for every
    layer that has logits (attention layers, and "loss" for the output logits), or for `layer` alone
    (by name or index). Masked logits (-inf) do not count."""
    with _log(path) as f:
        g = _arm(f, arm)
        if "logit_max" not in g["stats"]:
            raise KeyError(f"arm {arm!r} has no stats/logit_max: the log was written with schema_version "
                           f"{int(f.attrs['schema_version'])}; run it again with this mpsim")
        values = g["stats/logit_max"][()]
        names = _names(g["layer"])
        result = {"step": g["stats/step"][()]}
        if layer is not None:
            li = _index(names, layer, "layer")
            result[names[li]] = values[:, li]
            return result
        for li, name in enumerate(names):
            if values.shape[0] and not np.all(np.isnan(values[:, li])):
                result[name] = values[:, li]
        return result


def _stats(path: PathOrFile, arm: str, dataset: str, kind, layer, per_step: bool, per_layer: bool) -> np.ndarray:
    with _log(path) as f:
        g = _arm(f, arm)
        ki = _index(_names(g["kind"]), kind, "kind")
        values = g[dataset][:, :, ki, :].astype(np.int64)
        if layer is not None:
            li = _index(_names(g["layer"]), layer, "layer")
            values = values[:, li:li + 1, :]
    if not per_layer or layer is not None:
        values = values.sum(axis=1)
    return values if per_step else values.sum(axis=0)


def kind_histogram(path: PathOrFile, arm: str, kind, layer=None, per_step: bool = False,
                   per_layer: bool = False) -> np.ndarray:
    """Histogram counts (int64) of one tensor kind, summed over the instrumented steps and the layers
    (or one layer, by name or index). per_step keeps the step axis (first), per_layer the layer axis;
    the bins are the last axis (see `bins`)."""
    return _stats(path, arm, "stats/histogram", kind, layer, per_step, per_layer)


def kind_counters(path: PathOrFile, arm: str, kind, layer=None, per_step: bool = False,
                  per_layer: bool = False) -> dict:
    """{counter name: total} of one tensor kind, summed as `kind_histogram` sums: Python ints, or int64
    arrays (step axis first, then layers) with per_step or per_layer. per_step adds "step"."""
    values = _stats(path, arm, "stats/counters", kind, layer, per_step, per_layer)
    with _log(path) as f:
        names = _counter_names(_arm(f, arm)["counter"])
    result = {"step": stats_steps(path, arm)} if per_step else {}
    for i, name in enumerate(names):
        v = values[..., i]
        result[name] = int(v) if v.ndim == 0 else v
    return result


# Denominators of `fraction`: the counter each divides by.
COUNTER_DENOMINATORS = {"nonzero": "nonzero",  # values that were nonzero before rounding (NaN and inf included)
                        "all": "elements"}     # every value rounded


def ratio(numerator, denominator, empty: float = math.nan):
    """numerator / denominator, `empty` where the denominator is 0 (elementwise for arrays)."""
    if np.ndim(numerator) == 0 and np.ndim(denominator) == 0:
        return float(numerator / denominator) if denominator else float(empty)
    num, den = np.asarray(numerator), np.asarray(denominator)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, empty)


def fraction(counters: dict, counter: str, denominator: str = "nonzero", empty: float = math.nan):
    """A counter of `kind_counters` as a share: of the nonzero values (denominator="nonzero") or of every
    value (denominator="all"); `empty` where there is no value to divide by."""
    if denominator not in COUNTER_DENOMINATORS:
        raise ValueError(f"denominator {denominator!r}; expected one of {tuple(COUNTER_DENOMINATORS)}")
    if counter not in counters:
        raise KeyError(f"no counter {counter!r}; there are {sorted(k for k in counters if k != 'step')}")
    return ratio(counters[counter], counters[COUNTER_DENOMINATORS[denominator]], empty)


# Denominators of the histogram shares: which bins count.
HISTOGRAM_DENOMINATORS = ("all", "finite_nonzero")


def histogram_total(counts: np.ndarray, bins: Bins, denominator: str = "all") -> np.ndarray:
    """Values counted along the last axis: every value ("all") or the finite nonzero ones, the binade
    bins ("finite_nonzero"; zeros, infinities and NaNs left out)."""
    counts = np.asarray(counts)
    if denominator == "all":
        return counts.sum(axis=-1)
    if denominator == "finite_nonzero":
        return counts[..., bins.finite].sum(axis=-1)
    raise ValueError(f"denominator {denominator!r}; expected one of {HISTOGRAM_DENOMINATORS}")


def histogram_fraction(counts: np.ndarray, bins: Bins, selected: np.ndarray, denominator: str = "all",
                       empty: float = math.nan):
    """The share of the values in the `selected` bins (a mask over every bin: `bins.select`,
    `bins.special`) along the last axis, of the values `denominator` counts."""
    counts = np.asarray(counts)
    return ratio(counts[..., selected].sum(axis=-1), histogram_total(counts, bins, denominator), empty)


def binade_shares(counts: np.ndarray, bins: Bins, denominator: str = "all", empty: float = 0.0) -> np.ndarray:
    """Each binade bin's share along the last axis (binade bins only, in `bins.exponents` order) of the
    values `denominator` counts; `empty` where it counts none."""
    counts = np.asarray(counts)
    total = histogram_total(counts, bins, denominator)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.expand_dims(total, -1) > 0, counts[..., bins.finite] / np.expand_dims(total, -1), empty)


def binade_quantile(counts: np.ndarray, bins: Bins, quantile: float) -> np.ndarray:
    """Exponent of the binade holding the given quantile of the finite nonzero magnitudes along the last
    axis (float; NaN where there is none)."""
    if not 0 <= quantile <= 1:
        raise ValueError(f"quantile {quantile!r} is outside [0, 1]")
    finite = np.asarray(counts, dtype=np.float64)[..., bins.finite]
    cum = np.cumsum(finite, axis=-1)
    total = cum[..., -1:]
    # The first binade whose cumulative count reaches the quantile's rank, at least the first value (quantile 0:
    # the lowest occupied binade, not the first bin).
    idx = np.argmax(cum >= np.maximum(quantile * total, 1), axis=-1)
    return np.where(total[..., 0] > 0, bins.exponents[idx], np.nan).astype(np.float64)


def top_binade(counts: np.ndarray, bins: Bins) -> np.ndarray:
    """Exponent of the highest occupied binade along the last axis (float; NaN where no value is finite
    and nonzero)."""
    occupied = np.asarray(counts)[..., bins.finite] > 0
    n = occupied.shape[-1]
    idx = n - 1 - np.argmax(occupied[..., ::-1], axis=-1)
    return np.where(occupied.any(axis=-1), bins.exponents[idx], np.nan).astype(np.float64)


try:
    import xarray as _xr
except ImportError:  # optional
    _xr = None


def to_xarray(path: PathOrFile, arm: str):
    """One arm as an xarray.Dataset (needs xarray).

    Dimensions: step (per-step records), stats_step (histogram, counters),
    eval_step (evaluations), layer, kind, binade, counter; bin_label is a
    coordinate along binade.
    """
    if _xr is None:
        raise ImportError("to_xarray needs xarray (Debian: python3-xarray)")
    with _log(path) as f:
        g = _arm(f, arm)
        s = g["steps"]
        e = g["eval"]
        coords = {
            "step": s["step"][()],
            "stats_step": g["stats/step"][()],
            "eval_step": e["step"][()],
            "layer": _names(g["layer"]),
            "kind": _names(g["kind"]),
            "binade": g["binade"][()],
            "bin_label": ("binade", _names(g["bin_label"])),
            "counter": _counter_names(g["counter"]),
        }
        variables = {name: ("step", s[name][()]) for name in s if name != "step"}
        for flag in ("found_inf", "skipped"):
            variables[flag] = ("step", s[flag][()].astype(bool))
        variables.update({f"eval_{name}": ("eval_step", e[name][()]) for name in e if name != "step"})
        variables["histogram"] = (("stats_step", "layer", "kind", "binade"), g["stats/histogram"][()])
        variables["counters"] = (("stats_step", "layer", "kind", "counter"), g["stats/counters"][()])
        if "logit_max" in g["stats"]:
            variables["logit_max"] = (("stats_step", "layer"), g["stats/logit_max"][()])
        attrs = {k: (_text(v) if isinstance(v, (str, bytes)) else v.item()) for k, v in g.attrs.items()}
        return _xr.Dataset(variables, coords=coords, attrs=attrs)
