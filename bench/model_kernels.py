"""Where a dashboard model's GPU time goes, per backend: its kernels, summed per name.

The dashboard (bench/dashboard.py) times whole calls, host included. This script separates the
kernels' share: for each model and backend (eager, torch.compile, tiny; bf16 inference at the
dashboard's real sizes) it prints the wall time per call, the summed kernel time per call and the
kernel count (``torch.profiler``), then the top kernels by time and the ATen ops the host called. Two
compilers' tables side by side show what one runs that the other does not (a fallback op, a copy,
a bias added in a kernel of its own). With ``--debug-dir`` tiny's compile artefacts (its output code,
its kernels) are written there (``TINY_COMPILE_DEBUG``).

    python bench/model_kernels.py --models bert,gpt2 --backends torch.compile,tiny --top 15
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.profiler import ProfilerActivity, profile

from bench import dashboard
from course import benchmark as harness


def profiled_call(step, calls: int) -> tuple[float, int, list[tuple[str, float, float]], collections.Counter]:
    """(kernel ms per call, kernels per call, [(name, ms per call, launches per call)], host ATen ops)."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    per_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in kernels:
        per_name[e.name][0] += e.device_time / calls / 1e3
        per_name[e.name][1] += 1 / calls
    table = sorted(((name, ms, n) for name, (ms, n) in per_name.items()), key=lambda row: -row[1])
    host = collections.Counter(e.name for e in events
                               if e.device_type != torch.autograd.DeviceType.CUDA and e.name.startswith("aten::"))
    return sum(e.device_time for e in kernels) / calls / 1e3, round(len(kernels) / calls), table, host


def run(name: str, backend: str, args) -> list[str]:
    model, inputs = dashboard.BY_NAME[name].make("real")
    dashboard._no_dropout(model)
    model = model.to("cuda", torch.bfloat16).eval()
    inputs = tuple(dashboard._cast(x, torch.bfloat16, "cuda") for x in inputs)
    harness.reset_compilers()
    if backend == "tiny" and args.debug_dir:
        os.environ["TINY_COMPILE_DEBUG"] = "1"
        os.environ["TINY_COMPILE_DEBUG_DIR"] = os.path.join(args.debug_dir, name)
    fn = harness.compilers([backend])[backend](copy.deepcopy(model)) if backend != "eager" else model

    def step():
        with torch.no_grad():
            return fn(*inputs)

    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    os.environ.pop("TINY_COMPILE_DEBUG", None)
    wall = harness.bench(step, (), "cuda", warmup=5, iters=20, repeats=3) * 1e3
    gpu_ms, count, table, host = profiled_call(step, args.calls)
    lines = [f"=== {name} {backend}: wall {wall:.3f} ms/call, GPU {gpu_ms:.3f} ms/call, "
             f"{count} kernels/call, first call {first:.1f}s"]
    lines += [f"  {ms:8.3f} ms {n:6.0f}x  {kernel[:150]}" for kernel, ms, n in table[:args.top]]
    lines.append("  host ATen ops per call: " + ", ".join(f"{op}:{n // args.calls}" for op, n in host.most_common(14)))
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert,vit_b_16,gpt2", help="comma list of dashboard models")
    p.add_argument("--backends", default="eager,torch.compile,tiny")
    p.add_argument("--top", type=int, default=15, help="kernels listed per model and backend")
    p.add_argument("--calls", type=int, default=3, help="calls profiled (the figures are per call)")
    p.add_argument("--out", default=None, help="also write the tables to this file")
    p.add_argument("--debug-dir", default=None, help="write tiny's compile artefacts here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("model_kernels.py profiles CUDA kernels: run it on a machine with a GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    print(harness.describe_device("cuda"))
    report = open(args.out, "w") if args.out else None
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            for line in run(name, backend, args):
                print(line, flush=True)
                if report:
                    report.write(line + "\n")
            torch.cuda.empty_cache()
    if report:
        report.close()


if __name__ == "__main__":
    main()
