#!/usr/bin/python3
"""Merge logs of one study run with different seeds into one log that every study module reads.

A study's seeds may come from several runs (more seeds added later, or seeds split across device calls). This
copies every arm of each log into OUT (and the /agreement groups of a run with two backends), after checking that
the logs are runs of the same config apart from its seeds and output (the resolved configs stored in the logs,
compared as TOML), of the same schema version, and share no arm name (two runs of one seed would). A run of one
seed names its arms without the seed (`fp32`, `fp32@qk_norm=true`); its arms get the name a run of several seeds
gives them (`fp32.seed2`, `fp32.seed2@qk_norm=true`, core/src/experiment.cpp's arm_name), here and in /agreement.
OUT's root attributes are the first log's, with `seeds` the union of the configs' seeds and `merged_from` naming
each log with its revision, host and start time; the arms keep their own attributes, so each still says its
backend, seed and policy.

    /usr/bin/python3 notebooks/merge_logs.py OUT.h5 LOG.h5 LOG.h5 [...]

Exit 2, before writing anything, when the logs cannot be merged (the message names the difference); OUT must
not already exist (nothing already written is lost).
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpsim_log as ml  # noqa: E402  (beside this file)

import h5py  # noqa: E402

# Keys of the resolved config that may differ between the runs being merged.
FREE_KEYS = ("seeds", "output")


def _config(f: h5py.File, path: str) -> dict:
    try:
        return tomllib.loads(ml.config(f))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: its stored config is not TOML ({e})") from e


def merged_name(arm: str, seeds: list[int]) -> str:
    """The arm's name in the merged log: a log of one seed adds `.seed<N>` before any sweep point."""
    if len(seeds) != 1:
        return arm
    base, at, sweep = arm.partition("@")
    return f"{base}.seed{seeds[0]}{at}{sweep}"


def check(paths: list[str]) -> list[list[int]]:
    """Raises ValueError naming the first difference that forbids a merge; returns each log's seeds."""
    if len(paths) < 2:
        raise ValueError("give at least two logs to merge")
    seeds: list[list[int]] = []
    arms: dict[str, str] = {}
    first_config, first_version = None, None
    for path in paths:
        with ml.open_log(path) as f:
            config = _config(f, path)
            version = int(f.attrs["schema_version"])
            fixed = {k: v for k, v in config.items() if k not in FREE_KEYS}
            if first_config is None:
                first_config, first_version = fixed, version
            else:
                if version != first_version:
                    raise ValueError(f"{path}: schema_version {version}, {paths[0]}: {first_version}")
                if fixed != first_config:
                    keys = sorted(k for k in set(fixed) | set(first_config) if fixed.get(k) != first_config.get(k))
                    raise ValueError(f"{path}: not the same config as {paths[0]} (they differ in {', '.join(keys)}); "
                                     "only seeds and output may differ")
            own = [int(s) for s in config.get("seeds", [])]
            for arm in f["arms"]:
                name = merged_name(arm, own)
                if name in arms:
                    raise ValueError(f"arm {name!r} is in both {arms[name]} and {path}: the same seed twice?")
                arms[name] = path
            seeds.append(own)
    return seeds


def merge(out: str, paths: list[str]) -> list[int]:
    """Writes OUT from the logs (check() first); returns the merged seeds."""
    if os.path.exists(out):
        raise ValueError(f"{out} exists: name a new file (nothing is overwritten)")
    per_log = check(paths)
    with h5py.File(out, "w") as dst:
        group = dst.create_group("arms")
        sources = []
        for i, (path, own) in enumerate(zip(paths, per_log)):
            with ml.open_log(path) as src:
                if i == 0:
                    for key, value in src.attrs.items():
                        dst.attrs[key] = value
                for arm in src["arms"]:
                    name = merged_name(arm, own)
                    src.copy(src["arms"][arm], group, name=name)
                    group[name].attrs["name"] = name
                for arm in src.get("agreement", {}):
                    name = merged_name(arm, own)
                    src.copy(src["agreement"][arm], dst.require_group("agreement"), name=name)
                    reference = ml._text(src["agreement"][arm].attrs["reference"])
                    dst["agreement"][name].attrs["reference"] = merged_name(reference, own)
                info = ml.info(src)
                sources.append(f"{path} ({info.get('git_revision', '?')}, {info.get('host', '?')}, "
                               f"{info.get('start_time', '?')})")
        seeds = [seed for own in per_log for seed in own]
        dst.attrs["seeds"] = seeds
        dst.attrs["merged_from"] = sources
    return seeds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the merged log to write (must not exist)")
    parser.add_argument("logs", nargs="+", help="logs of one config with different seeds")
    args = parser.parse_args(argv)
    try:
        seeds = merge(args.out, args.logs)
    except (OSError, KeyError, ValueError) as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(args.logs)} logs, seeds {seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
