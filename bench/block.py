"""Benchmark 4: the seeds' LayerNorm-MLP block, inference and one training step.

Sizes default to 32x128x768 on a GPU and 8x64x256 on a CPU; dtypes float32 and float16 on a
GPU, float32 on a CPU. The training step is forward + sum loss + backward (gradients checked
against eager before timing). The backends are timed in turns (see ``bench_interleaved``), so
clock and host drift hits them alike.

    python bench/block.py --batch 32 --seq 128 --hidden 768
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from course import benchmark as harness
from course.models import TinyBlock


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    gpu = torch.cuda.is_available()
    parser.add_argument("--batch", type=int, default=32 if gpu else 8)
    parser.add_argument("--seq", type=int, default=128 if gpu else 64)
    parser.add_argument("--hidden", type=int, default=768 if gpu else 256)
    parser.add_argument("--dtypes", default=None)
    parser.add_argument("--phases", default="inference,training")
    args = parser.parse_args(argv)
    device = args.device
    dtypes = (args.dtypes or ("float32,float16" if device.startswith("cuda") else "float32")).split(",")
    names = args.backends.split(",")
    jobs = [(d, p) for d in dtypes for p in args.phases.split(",")]
    rows = []
    for i, (dtype_name, phase) in enumerate(jobs):
        harness.progress(i, len(jobs), f"{phase} {dtype_name}")
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        model = TinyBlock(args.hidden).to(device=device, dtype=dtype)
        x = torch.randn(args.batch, args.seq, args.hidden, device=device, dtype=dtype)
        tol = 2e-2 if dtype != torch.float32 else 1e-4
        harness.reset_compilers()
        row = {"phase": phase, "dtype": dtype_name, "shape": f"{args.batch}x{args.seq}x{args.hidden}"}
        if phase == "inference":
            model.eval()
            with torch.no_grad():
                expected = model(x)
                fns = {}
                for name, make in harness.compilers(names, args.mode).items():
                    fns[name] = make(model)
                    harness.check_close(name, fns[name](x), expected, rtol=tol, atol=tol)
                timings = harness.bench_interleaved(fns, (x,), device, args.warmup, args.iters)
        else:
            reference = copy.deepcopy(model)
            reference(x).sum().backward()
            expected = [p.grad for p in reference.parameters()]
            fns = {}
            for name, make in harness.compilers(names, args.mode).items():
                trained = copy.deepcopy(model)
                fn = make(trained)

                def step(inp, fn=fn, trained=trained):
                    for p in trained.parameters():
                        p.grad = None
                    fn(inp).sum().backward()

                step(x)
                harness.check_close(name, [p.grad for p in trained.parameters()], expected, rtol=tol * 10, atol=tol * 10)
                fns[name] = step
            timings = harness.bench_interleaved(fns, (x,), device, args.warmup, args.iters)
        for name, seconds in timings.items():
            row[f"{name} ms"] = seconds * 1e3
        for other in ("eager", "torch.compile"):
            if "tiny" in names and other in names:
                row[f"tiny vs {other}"] = row[f"{other} ms"] / row["tiny ms"]
        rows.append(row)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    harness.print_table(rows, columns, title=f"LayerNorm-MLP block on {harness.describe_device(device)} (speedup > 1: tiny faster)")
    harness.save("block", device, rows, path=args.json)


if __name__ == "__main__":
    main()
