"""Benchmark 5: row-wise softmax and LayerNorm over a sweep of row lengths.

Each case holds about the same number of elements (rows x cols), so the sweep shows how each
backend's reduction strategy copes with short rows (many rows per block) and long rows (a
looped reduction). Reported in GB/s of the ideal traffic: read once, write once.

    python bench/softmax_layernorm.py --min-log2 7 --max-log2 14
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F

from course import benchmark as harness


def softmax(x):
    return F.softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    gpu = torch.cuda.is_available()
    parser.add_argument("--elements-log2", type=int, default=24 if gpu else 20)
    parser.add_argument("--min-log2", type=int, default=7)
    parser.add_argument("--max-log2", type=int, default=14 if gpu else 12)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    device, dtype = args.device, getattr(torch, args.dtype)
    names = args.backends.split(",")
    jobs = [(op, c) for op in ("softmax", "layer_norm") for c in range(args.min_log2, args.max_log2 + 1)]
    rows = []
    for i, (op, log2) in enumerate(jobs):
        harness.progress(i, len(jobs), f"{op} cols=2^{log2}")
        cols = 1 << log2
        rows_ = max(1, (1 << args.elements_log2) // cols)
        x = torch.randn(rows_, cols, device=device, dtype=dtype)
        inputs = (x,) if op == "softmax" else (x, torch.randn(cols, device=device, dtype=dtype), torch.randn(cols, device=device, dtype=dtype))
        fn = softmax if op == "softmax" else layer_norm
        expected = fn(*inputs)
        harness.reset_compilers()
        row = {"op": op, "shape": f"{rows_}x{cols}"}
        for name, make in harness.compilers(names, args.mode).items():
            compiled = make(fn)
            harness.check_close(name, compiled(*inputs), expected, rtol=1e-4, atol=1e-4)
            seconds = harness.bench(compiled, inputs, device, args.warmup, args.iters)
            row[f"{name} GB/s"] = 2 * x.numel() * x.element_size() / seconds / 1e9
        for other in ("eager", "torch.compile"):
            if "tiny" in names and other in names:
                row[f"tiny vs {other}"] = row["tiny GB/s"] / row[f"{other} GB/s"]
        rows.append(row)
    harness.print_table(rows, list(rows[0]), title=f"row-wise reductions on {harness.describe_device(device)}")
    harness.save("softmax_layernorm", device, rows, path=args.json)


if __name__ == "__main__":
    main()
