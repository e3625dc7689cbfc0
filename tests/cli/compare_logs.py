#!/usr/bin/python3
"""compare_logs.py EXPECTED.h5 ACTUAL.h5 [--ignore ATTR]...

Compares two mpsim logs arm by arm: every dataset bit for bit (dtype, shape
and the bit patterns of floats: -0 is not +0, and NaNs must have the same
payload), every attribute of every group and dataset but those named by
--ignore (the root attributes, start time and the like, are not compared),
every dimension-scale attachment, and that neither log has an object the
other lacks. Prints what differs and exits 1, or 0 when the logs are the same.
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
        if obj.dtype != other.dtype:
            problems.append(f"{name}: dtype {other.dtype}, expected {obj.dtype}")
        elif x.shape != y.shape:
            problems.append(f"{name}: shape {y.shape}, expected {x.shape}")
        else:
            if x.dtype.kind == "f":  # bit patterns: -0 against +0 and NaN payloads count
                x, y = x.view(f"u{x.dtype.itemsize}"), y.view(f"u{y.dtype.itemsize}")
            if not np.array_equal(x, y):
                problems.append(f"{name}: values differ")
        for axis, dim in enumerate(obj.dims):
            want = [s.name for s in dim.values()]
            got = [s.name for s in other.dims[axis].values()]
            if want != got:
                problems.append(f"{name}: axis {axis} scales {got}, expected {want}")


a.visititems(compare)
b.visititems(lambda name, obj: None if name in a else problems.append(f"{name}: only in {args.actual}"))
if sorted(a) != sorted(b):
    problems.append(f"arms {sorted(b)}, expected {sorted(a)}")
print(f"{args.actual}: {len(a)} arms, {count} datasets compared with {args.expected}")
if problems:
    print("FAIL:\n  " + "\n  ".join(problems[:20]))
    sys.exit(1)
print("PASS: the same")
