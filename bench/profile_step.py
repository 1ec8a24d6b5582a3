"""Where a step's time goes: device time vs host time, per backend, and tiny's host profile.

A compiled step can lose to eager for two different reasons: its kernels are slower (device
time), or the Python around them is (host time: guards, wrappers, launches, autograd glue).
For the seeds' block this script prints, per backend, the wall time per step, the summed kernel
time per step (``torch.profiler``, GPU only), and the kernel count, then the top entries of a
``cProfile`` of tiny's cached step, which names the host-side costs.

    python bench/profile_step.py --phase training --dtype float16
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from course import benchmark as harness
from course.models import TinyBlock


def make_step(fn, model, phase):
    if phase == "inference":
        def step(x):
            with torch.no_grad():
                return fn(x)
        return step

    def step(x):
        for p in model.parameters():
            p.grad = None
        fn(x).sum().backward()
    return step


def kernel_time(step, x, device: str, steps: int) -> tuple[float | None, float | None]:
    """(summed device-kernel seconds per step, kernels per step); (None, None) on a CPU."""
    if not device.startswith("cuda"):
        return None, None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(x)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time for e in events)
    return total_us * 1e-6 / steps, len(events) / steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    gpu = torch.cuda.is_available()
    parser.add_argument("--phase", default="training", choices=["inference", "training"])
    parser.add_argument("--dtype", default="float16" if gpu else "float32")
    parser.add_argument("--batch", type=int, default=32 if gpu else 8)
    parser.add_argument("--seq", type=int, default=128 if gpu else 64)
    parser.add_argument("--hidden", type=int, default=768 if gpu else 256)
    parser.add_argument("--top", type=int, default=25, help="cProfile entries to print")
    args = parser.parse_args(argv)
    device, dtype = args.device, getattr(torch, args.dtype)
    torch.manual_seed(0)
    base = TinyBlock(args.hidden).to(device=device, dtype=dtype)
    if args.phase == "inference":
        base.eval()
    x = torch.randn(args.batch, args.seq, args.hidden, device=device, dtype=dtype)
    steps = {}
    for name, make in harness.compilers(args.backends.split(","), args.mode).items():
        model = copy.deepcopy(base)
        steps[name] = make_step(make(model), model, args.phase)
        steps[name](x)
    wall = harness.bench_interleaved(steps, (x,), device, args.warmup, args.iters)
    rows = []
    for name, step in steps.items():
        kernel_s, kernels = kernel_time(step, x, device, steps=20)
        row = {"backend": name, "wall ms": wall[name] * 1e3}
        if kernel_s is not None:
            row.update({"kernel ms": kernel_s * 1e3, "kernels/step": kernels,
                        "device busy %": 100 * kernel_s / wall[name]})
        rows.append(row)
    harness.print_table(rows, list(dict.fromkeys(k for r in rows for k in r)),
                        title=f"{args.phase} step, {args.dtype}, {args.batch}x{args.seq}x{args.hidden} "
                              f"on {harness.describe_device(device)}")
    if "tiny" in steps:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200):
            steps["tiny"](x)
        harness.synchronize(device)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print("tiny's cached step, 200 calls, by own time (tottime):")
        print(text.getvalue())
    harness.save(f"profile_step_{args.phase}_{args.dtype}", device, rows, path=args.json)


if __name__ == "__main__":
    main()
