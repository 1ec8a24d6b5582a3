"""Benchmark 1: the pointwise chain ``gelu(x*s + b, tanh) + r`` over sizes and dtypes.

Prints time, GB/s and percent of the device's measured copy bandwidth for eager,
torch.compile and tiny, and tiny's ratio to each. A pointwise chain is memory bound, so the
ideal kernel reads x and r once and writes the result once: 3 * n * itemsize bytes.

    python bench/pointwise_chain.py --min-log2 10 --max-log2 26 --dtypes float32,float16
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F

from course import benchmark as harness


def chain(x, s, b, r):
    return F.gelu(x * s + b, approximate="tanh") + r


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    parser.add_argument("--min-log2", type=int, default=10)
    parser.add_argument("--max-log2", type=int, default=None, help="default: 26 on GPU, 23 on CPU")
    parser.add_argument("--dtypes", default=None, help="default: float32,float16 on GPU, float32 on CPU")
    args = parser.parse_args(argv)
    device = args.device
    max_log2 = args.max_log2 if args.max_log2 is not None else (26 if device.startswith("cuda") else 23)
    if not 0 <= args.min_log2 <= max_log2:
        parser.error(f"sizes run from 2^--min-log2 to 2^--max-log2, so 0 <= --min-log2 <= --max-log2; "
                     f"got --min-log2 {args.min_log2} and --max-log2 {max_log2} (e.g. --min-log2 0 --max-log2 0 for n=1)")
    dtypes = (args.dtypes or ("float32,float16" if device.startswith("cuda") else "float32")).split(",")
    names = args.backends.split(",")
    peak = harness.copy_bandwidth(device)
    print(f"device: {harness.describe_device(device)}; measured copy bandwidth {peak / 1e9:.0f} GB/s")
    configs = [(d, p) for d in dtypes for p in range(args.min_log2, max_log2 + 1, 2 if max_log2 - args.min_log2 > 8 else 1)]
    rows = []
    for i, (dtype_name, log2) in enumerate(configs):
        harness.progress(i, len(configs), f"{dtype_name} n=2^{log2}")
        dtype = getattr(torch, dtype_name)
        n = 1 << log2
        x, r = (torch.randn(n, device=device, dtype=dtype) for _ in range(2))
        s = torch.tensor(1.5, device=device, dtype=dtype)
        b = torch.tensor(0.25, device=device, dtype=dtype)
        args_ = (x, s, b, r)
        expected = chain(*args_)
        row = {"dtype": dtype_name, "n": f"2^{log2}"}
        harness.reset_compilers()
        for name, make in harness.compilers(names, args.mode).items():
            fn = make(chain)
            tol = 1e-2 if dtype != torch.float32 else 1e-5
            harness.check_close(name, fn(*args_), expected, rtol=tol, atol=tol)
            seconds = harness.bench(fn, args_, device, args.warmup, args.iters)
            gbps = 3 * n * x.element_size() / seconds / 1e9
            row[f"{name} us"] = seconds * 1e6
            row[f"{name} GB/s"] = gbps
            row[f"{name} %bw"] = 100 * gbps * 1e9 / peak
        for other in ("eager", "torch.compile"):
            if "tiny" in names and other in names:
                row[f"tiny vs {other}"] = row[f"{other} us"] / row["tiny us"]
        rows.append(row)
    columns = list(rows[0])
    harness.print_table(rows, columns, title="pointwise chain gelu(x*s+b, tanh) + r (speedup > 1: tiny faster)")
    harness.save("pointwise_chain", device, rows, {"copy_bandwidth_GBps": peak / 1e9}, args.json)


if __name__ == "__main__":
    main()
