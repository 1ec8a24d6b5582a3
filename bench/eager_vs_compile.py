"""Eager PyTorch vs torch.compile on the seeds' TinyBlock and a pointwise chain, measured in one run.

    python bench/eager_vs_compile.py                              # small CPU defaults
    python bench/eager_vs_compile.py --batch 32 --seq 128 --hidden 768 --mode max-autotune
    python bench/eager_vs_compile.py --workloads pointwise --backends eager,torch.compile[inductor]
    python bench/eager_vs_compile.py --threads 1    # steadier on a busy, shared CPU

Each column is a *backend*: a name and a function ``make(model, args) -> callable``
(:data:`BACKENDS`). Every backend's output is checked against eager before it is timed, the
first call (which compiles) is reported on its own, and steady-state times are medians of
synchronised repeats. Ratios are eager time / backend time (> 1 means faster than eager).
To add a column (tinydynamo / tininductor, later), add one entry to :data:`BACKENDS`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from course.models import TinyBlock


def pointwise_chain(x):
    """Nine pointwise ops: eager runs nine kernels and writes eight temporaries, a fusing compiler one kernel."""
    y = x.sin() * 1.5 + 0.5
    y = torch.tanh(y) * x
    return torch.relu(y - 0.1).exp() + 1.0


# ---- workloads: name -> function(args, device, dtype) -> (model, example inputs)
def _tinyblock(args, device, dtype):
    model = TinyBlock(args.hidden).to(device=device, dtype=dtype).eval()
    return model, (torch.randn(args.batch, args.seq, args.hidden, device=device, dtype=dtype),)


def _pointwise(args, device, dtype):
    return pointwise_chain, (torch.randn(args.batch * args.seq, args.hidden, device=device, dtype=dtype),)


WORKLOADS: dict[str, Callable] = {"tinyblock": _tinyblock, "pointwise": _pointwise}


# ---- backends: name -> function(model, cli args) -> callable. Add columns here.
def _torch_compile(backend: str) -> Callable:
    def make(model, args):
        mode = args.mode if backend == "inductor" else None
        return torch.compile(model, backend=backend, mode=mode, fullgraph=args.fullgraph,
                             dynamic=True if args.dynamic else None)
    return make


BACKENDS: dict[str, Callable] = {
    "eager": lambda model, args: model,
    "torch.compile[eager]": _torch_compile("eager"),
    "torch.compile[aot_eager]": _torch_compile("aot_eager"),
    "torch.compile[inductor]": _torch_compile("inductor"),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable, inputs: tuple, device: torch.device, warmup: int, iters: int) -> tuple[float, float, object]:
    """(first call seconds, median seconds per call, first output); each clock read follows a sync."""
    with torch.inference_mode():
        sync(device)
        start = time.perf_counter()
        out = fn(*inputs)
        sync(device)
        first = time.perf_counter() - start
        for _ in range(warmup):
            fn(*inputs)
        times = []
        for _ in range(iters):
            sync(device)
            start = time.perf_counter()
            fn(*inputs)
            sync(device)
            times.append(time.perf_counter() - start)
    return first, statistics.median(times), out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {list(WORKLOADS)}")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma list of {list(BACKENDS)}")
    parser.add_argument("--mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                        help="torch.compile mode for the inductor column")
    parser.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True)")
    parser.add_argument("--fullgraph", action="store_true", help="torch.compile(fullgraph=True): fail on graph breaks")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (1 gives steadier numbers on a shared CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="default: float16 on CUDA, float32 on CPU")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float16 if device.type == "cuda" else torch.float32)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-4)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name in workloads + backends:
        if name not in WORKLOADS and name not in BACKENDS:
            parser.error(f"unknown workload/backend {name!r}; choose from {list(WORKLOADS)} / {list(BACKENDS)}")
    if "eager" not in backends:
        backends.insert(0, "eager")  # the reference every other column is checked and divided by

    print(f"torch {torch.__version__}  device={device}  dtype={dtype}  mode={args.mode}  "
          f"dynamic={args.dynamic}  fullgraph={args.fullgraph}  threads={torch.get_num_threads()}")
    print(f"shape=({args.batch}, {args.seq}, {args.hidden})  warmup={args.warmup}  iters={args.iters}")
    header = f"{'workload':<11}{'backend':<26}{'first call':>12}{'median':>12}{'vs eager':>10}"
    print(header + "\n" + "-" * len(header))
    failures = 0
    for workload in workloads:
        model, inputs = WORKLOADS[workload](args, device, dtype)
        torch._dynamo.reset()
        eager_first, eager_median, expected = measure(model, inputs, device, args.warmup, args.iters)
        for backend in backends:
            if backend == "eager":
                first, median, out = eager_first, eager_median, expected
            else:
                torch._dynamo.reset()
                try:
                    first, median, out = measure(BACKENDS[backend](model, args), inputs, device, args.warmup, args.iters)
                    torch.testing.assert_close(out, expected, **tol)
                except Exception as error:  # report and go on: one broken column must not hide the others
                    failures += 1
                    print(f"{workload:<11}{backend:<26}  FAILED: {type(error).__name__}: {str(error).splitlines()[0]}")
                    continue
            print(f"{workload:<11}{backend:<26}{first * 1e3:>10.1f}ms{median * 1e3:>10.3f}ms{eager_median / median:>9.2f}x")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
