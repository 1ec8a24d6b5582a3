"""Where one dashboard model's first call through tinydynamo goes: a timeline of its compile.

The dashboard reports a first call as one number. This runs it once, in this process, with the
compile caches empty (``--warm-caches`` keeps them), after one eager step (as the dashboard runs
eager first), and records it with ``tinydynamo.utils.chromium_event_log``: every compile phase on
its thread's track with its wall and CPU seconds, each kernel a compile worker compiled, each
kernel the main process loaded. A phase whose CPU time is well below its wall time waited (for
the GIL, a core, a lock); a worker's first kernels taking much longer than its later ones paid
its start-up; a main thread idle in ``triton_wait_precompile`` waited for the workers.

    python bench/first_call.py bart --suite training --trace bart_first_call.json
    python bench/first_call.py resnet18 --device cpu --sizes small --suite inference

``--trace`` writes the Trace Event Format: open it in chrome://tracing or https://ui.perfetto.dev.
``--profile N`` also runs the call under torch.profiler and prints the N longest operations that
started after the compile had finished (with their longest parts): where the first *run* goes, such
as a library's own first-call set-up (cuDNN building its attention plans, say).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import dashboard  # noqa: E402
from course import benchmark as harness  # noqa: E402
from tinydynamo.utils import chromium_event_log  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=list(dashboard.BY_NAME))
    p.add_argument("--suite", choices=dashboard.SUITES, default="training")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(dashboard.DTYPES), default="bf16" if torch.cuda.is_available() else "fp32")
    p.add_argument("--sizes", choices=("small", "real"), default="real")
    p.add_argument("--mode", choices=dashboard.MODES, default="default")
    p.add_argument("--min-ms", type=float, default=20.0, help="leave out spans shorter than this (0: all)")
    p.add_argument("--trace", type=Path, default=None, help="write the timeline as a Chrome trace (JSON)")
    p.add_argument("--warm-caches", action="store_true", help="keep the on-disk compile caches")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile the call too (torch.profiler, CPU side): the N longest operations after the compile")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.warm_caches:
        dashboard.use_fresh_caches()
    made = dashboard.BY_NAME[args.model].make(args.sizes)
    if made is None:
        print(f"{args.model}: not available at --sizes {args.sizes} (or its library is missing)", file=sys.stderr)
        return 2
    model, inputs = made
    dashboard._no_dropout(model)
    dtype = dashboard.DTYPES[args.dtype]
    model = model.to(args.device, dtype).train(args.suite == "training")
    inputs = tuple(dashboard._cast(x, dtype, args.device) for x in inputs)
    cuda = args.device.startswith("cuda")
    harness.reset_compilers()
    dashboard.make_step(model, args.suite)(*inputs)  # eager first, as in the dashboard
    step = dashboard.make_step(dashboard.compiler("tiny", args.mode)(model), args.suite)
    if cuda:
        torch.cuda.synchronize()
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if args.profile \
        else contextlib.nullcontext()
    with chromium_event_log() as log, profiler as profiled:
        start = time.perf_counter()
        step(*inputs)
        if cuda:
            torch.cuda.synchronize()
        total = time.perf_counter() - start
    print(f"{args.model} {args.suite} {args.dtype} on {args.device}: first call {total:.2f} s")
    print(log.table(min_seconds=args.min_ms / 1000))
    workers = [e for e in log.events if e.name.startswith("compile ")]
    if workers:
        longest = max(workers, key=lambda e: e.end - e.start)
        print(f"{len(workers)} kernels compiled in worker processes, {sum(e.end - e.start for e in workers):.2f} s "
              f"in all; the longest {longest.end - longest.start:.2f} s ({longest.name[8:]})")
    waits = sum(e.end - e.start for e in log.events if e.name == "triton_wait_precompile")
    print(f"waited for kernels: {waits:.2f} s")
    if args.trace is not None:
        args.trace.write_text(json.dumps(log.chrome_trace()))
        print(f"trace: {args.trace} (chrome://tracing, ui.perfetto.dev)")
    if args.profile:
        compiled = max((e.end for e in log.events if e.name == "compile_frame"), default=start) - start
        print(longest_after(profiled, compiled, args.profile))
    return 0


def longest_after(profiled, after: float, count: int) -> str:
    """The ``count`` longest top-level operations of a torch.profiler run that started ``after``
    seconds into it or later (its event times count from the profiler's start), each with its
    three longest parts."""

    def span(e):
        return (e.time_range.end - e.time_range.start) / 1e3  # ms

    late = [e for e in profiled.events() if e.cpu_parent is None and e.time_range.start / 1e6 >= after]
    lines = [f"the {count} longest operations after the compile ({after:.2f} s), of {len(late)}:",
             "   start s        ms  thread  name"]
    for e in sorted(late, key=span, reverse=True)[:count]:
        parts = ", ".join(f"{c.name} {span(c):.1f}" for c in sorted(e.cpu_children, key=span, reverse=True)[:3])
        lines.append(f"{e.time_range.start / 1e6:8.3f} {span(e):9.1f}  {e.thread:6d}  {e.name}"
                     + (f"  <- {parts}" if parts else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
