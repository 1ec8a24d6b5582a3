"""Benchmark 2 (and 6): host time of one cached call on a tiny input.

On a tiny tensor the kernel is nearly free, so the time per call is the compiler's own
overhead: guard checks, the wrapper, the kernel launch. Calls are issued back to back and the
device is synchronised once at the end, so this measures the host side.

    python bench/call_overhead.py --calls 20000
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from course import benchmark as harness


def add_one(x):
    return x + 1


def chain4(a, b, c, d):
    return (a * b + c).sin() * d


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    device = args.device
    names = args.backends.split(",")
    rows = []
    cases = [("x + 1", add_one, 1), ("(a*b+c).sin()*d", chain4, 4)]
    for i, (label, fn, arity) in enumerate(cases):
        harness.progress(i, len(cases), label)
        inputs = tuple(torch.randn(8, device=device) for _ in range(arity))
        expected = fn(*inputs)
        harness.reset_compilers()
        row = {"function": label}
        for name, make in harness.compilers(names, args.mode).items():
            compiled = make(fn)
            harness.check_close(name, compiled(*inputs), expected, rtol=1e-5, atol=1e-5)
            for _ in range(100):
                compiled(*inputs)
            harness.synchronize(device)
            start = time.perf_counter()
            for _ in range(args.calls):
                compiled(*inputs)
            harness.synchronize(device)
            row[f"{name} us/call"] = (time.perf_counter() - start) / args.calls * 1e6
        if "tiny" in names:
            for other in ("eager", "torch.compile"):
                if other in names:
                    row[f"tiny vs {other}"] = row[f"{other} us/call"] / row["tiny us/call"]
        rows.append(row)
    harness.print_table(rows, list(rows[0]), title=f"host time per cached call on {harness.describe_device(device)}")
    harness.save("call_overhead", device, rows, path=args.json)


if __name__ == "__main__":
    main()
