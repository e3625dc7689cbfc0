"""Read the HDF5 experiment logs that `mpsim run` writes (docs/hdf5-schema.md).

Needs h5py and numpy; `to_xarray` also needs xarray. Every function takes a
path or an already open h5py.File (from `open_log`), so a notebook can keep one
file open for many calls:

    import mpsim_log as ml
    steps, binades, counts = ml.histogram("run.h5", "fp16", "fc1", "weight_grads")
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Union

import h5py
import numpy as np

SCHEMA_VERSION = 1
# Values of the `binade` coordinate for the bins that are not binades.
ZERO_BIN = 1000
INFINITY_BIN = 1001
NAN_BIN = 1002
KINDS = ("weights", "activations", "activation_grads", "weight_grads", "updates", "gemm_inputs")

PathOrFile = Union[str, "os.PathLike[str]", h5py.File]


def open_log(path: Union[str, "os.PathLike[str]"]) -> h5py.File:
    """Opens a log read-only and checks its schema version."""
    f = h5py.File(path, "r")
    version = int(f.attrs.get("schema_version", -1))
    if version != SCHEMA_VERSION:
        f.close()
        raise ValueError(f"{path}: schema_version {version}, this reader knows {SCHEMA_VERSION}")
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


def _arm(f: h5py.File, arm: str) -> h5py.Group:
    if arm not in f["arms"]:
        raise KeyError(f"no arm {arm!r}; the log has {sorted(f['arms'])}")
    return f["arms"][arm]


def _index(names: list[str], name_or_index, what: str) -> int:
    if isinstance(name_or_index, (int, np.integer)):
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
    """The file's root attributes (config, mpsim_version, git_revision, start_time, host, seed, schema_version)."""
    with _log(path) as f:
        return {k: (_text(v) if isinstance(v, (str, bytes)) else v.item()) for k, v in f.attrs.items()}


def arms(path: PathOrFile) -> list[str]:
    """Names of the arms, sorted."""
    with _log(path) as f:
        return sorted(f["arms"])


def arm_info(path: PathOrFile, arm: str) -> dict:
    """An arm's attributes (name, backend, policy, policy_description, seed, status) and its layer names."""
    with _log(path) as f:
        g = _arm(f, arm)
        result = {k: (_text(v) if isinstance(v, (str, bytes)) else v.item()) for k, v in g.attrs.items()}
        result["layers"] = _names(g["layer"])
        return result


def layers(path: PathOrFile, arm: str) -> list[str]:
    """An arm's layer names, in model order."""
    with _log(path) as f:
        return _names(_arm(f, arm)["layer"])


def steps(path: PathOrFile, arm: str) -> dict[str, np.ndarray]:
    """Per-step records: step, loss, loss_scale, found_inf, skipped (bool), learning_rate, grad_norm."""
    with _log(path) as f:
        g = _arm(f, arm)["steps"]
        result = {name: g[name][()] for name in g}
        for flag in ("found_inf", "skipped"):
            result[flag] = result[flag].astype(bool)
        return result


def evals(path: PathOrFile, arm: str) -> dict[str, np.ndarray]:
    """Evaluations: step, epoch, train_loss, train_accuracy, test_loss, test_accuracy."""
    with _log(path) as f:
        g = _arm(f, arm)["eval"]
        return {name: g[name][()] for name in g}


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
        for i, name in enumerate(_names(g["counter"])):
            result[name] = values[:, i]
        return result


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
            "counter": _names(g["counter"]),
        }
        variables = {name: ("step", s[name][()]) for name in s if name != "step"}
        for flag in ("found_inf", "skipped"):
            variables[flag] = ("step", s[flag][()].astype(bool))
        variables.update({f"eval_{name}": ("eval_step", e[name][()]) for name in e if name != "step"})
        variables["histogram"] = (("stats_step", "layer", "kind", "binade"), g["stats/histogram"][()])
        variables["counters"] = (("stats_step", "layer", "kind", "counter"), g["stats/counters"][()])
        attrs = {k: (_text(v) if isinstance(v, (str, bytes)) else v.item()) for k, v in g.attrs.items()}
        return _xr.Dataset(variables, coords=coords, attrs=attrs)
