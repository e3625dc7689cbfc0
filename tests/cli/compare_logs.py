#!/usr/bin/python3
"""compare_logs.py EXPECTED.h5 ACTUAL.h5 [--ignore ATTR]...

Compares two mpsim logs arm by arm: every dataset bit for bit (NaNs equal),
every attribute of every group and dataset but those named by --ignore (the
root attributes, start time and the like, are not compared), and every
dimension-scale attachment. Prints what differs and exits 1, or 0 when the
logs are the same.
"""
import argparse
import sys

import h5py
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("expected")
parser.add_argument("actual")
parser.add_argument("--ignore", action="append", default=[], help="an attribute name not to compare")
args = parser.parse_args()
ignored = {"DIMENSION_LIST", "REFERENCE_LIST", *args.ignore}

a, b = (h5py.File(p, "r")["arms"] for p in (args.expected, args.actual))
problems = []
count = 0


def compare(name, obj):
    global count
    if name not in b:
        problems.append(f"{name}: missing in {args.actual}")
        return
    other = b[name]
    for key, value in obj.attrs.items():
        if key in ignored:
            continue
        if key not in other.attrs or str(other.attrs[key]) != str(value):
            problems.append(f"{name}: attribute {key} differs")
    if isinstance(obj, h5py.Dataset):
        count += 1
        x, y = obj[()], other[()]
        same = x.shape == y.shape and (np.array_equal(x, y, equal_nan=True) if x.dtype.kind in "fiu"
                                       else np.array_equal(x, y))
        if not same:
            problems.append(f"{name}: values differ")
        for axis, dim in enumerate(obj.dims):
            want = [s.name for s in dim.values()]
            got = [s.name for s in other.dims[axis].values()]
            if want != got:
                problems.append(f"{name}: axis {axis} scales {got}, expected {want}")


a.visititems(compare)
if sorted(a) != sorted(b):
    problems.append(f"arms {sorted(b)}, expected {sorted(a)}")
print(f"{args.actual}: {len(a)} arms, {count} datasets compared with {args.expected}")
if problems:
    print("FAIL:\n  " + "\n  ".join(problems[:20]))
    sys.exit(1)
print("PASS: the same")
