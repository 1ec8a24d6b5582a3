"""Benchmark 2 (and 6): host time of one cached call on a tiny input.

On a tiny tensor the kernel is nearly free, so the time per call is the compiler's own
overhead: guard checks, the wrapper, the kernel launch. Calls are issued back to back and the
device is synchronised once at the end, so this measures the host side.

``--model`` does the same for dashboard models (bench/dashboard.py: the architectures at their
published sizes) on a tiny input, batch 1 (a 32x32 image, 16 tokens), inference: a big module
tree's cached call, where the guards read hundreds of parameters and the wrapper runs hundreds
of kernels. tiny's guard check alone is printed beside it. The backends are timed in turns (each
round times every one), so that a busy host weighs on all of them alike.

    python bench/call_overhead.py --calls 20000
    python bench/call_overhead.py --model swin_t,resnet50,llama,bert --calls 200
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from course import benchmark as harness


def add_one(x):
    return x + 1


def chain4(a, b, c, d):
    return (a * b + c).sin() * d


def tiny_input(x, full_images: bool = False):
    """Batch 1 of a dashboard input: a 32x32 image (its full size where the model takes only that one,
    as a ViT's patch embedding does), or 16 tokens (host time, not kernels, dominates)."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.is_floating_point() and x.dim() == 4:
        return x[:1].clone() if full_images else torch.randn(1, x.shape[1], 32, 32)
    return x[:1, :16].contiguous()


def guard_us(compiled, model: torch.nn.Module, inputs: tuple, calls: int) -> float | None:
    """Microseconds of tiny's generated guard check alone, on the cached entry of ``compiled``."""
    import tinydynamo

    entries = tinydynamo.cache_info(compiled).entries
    if not entries:
        return None
    check = entries[0].check_fn.check
    L = compiled._compiled_forward._bind(inputs, {})  # the frame's locals, as a call binds them
    G = type(model).forward.__globals__
    with torch.no_grad():
        if not check(L, G):
            return None  # the frame takes other arguments than the positional ones given here
        return min(timeit.repeat(lambda: check(L, G), number=calls, repeat=3)) / calls * 1e6


def write_profile(compiled, inputs: tuple, args, path: Path) -> None:
    """cProfile of ``args.calls`` cached calls: where tiny's host time goes, function by function."""
    profiler = cProfile.Profile()
    with torch.no_grad():
        profiler.enable()
        for _ in range(args.calls):
            compiled(*inputs)
        harness.synchronize(args.device)
        profiler.disable()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    text.write(f"{args.calls} cached calls\n")
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(45)
    path.write_text(text.getvalue())


def model_rows(args, names: list[str]) -> list[dict]:
    from bench.dashboard import BY_NAME, make_step

    rows = []
    torch.set_num_threads(1)  # host time, not kernels: one thread also keeps OpenMP's spinning out of it
    for i, model_name in enumerate(args.model):
        harness.progress(i, len(args.model), model_name)
        made = BY_NAME[model_name].make("real")
        if made is None:
            print(f"{model_name}: {BY_NAME[model_name].library} missing, skipped", file=sys.stderr)
            continue
        model, inputs = made
        model = model.eval().to(args.device)
        full = tuple(inputs)

        def batch_one(full_images: bool) -> tuple:
            return tuple(x if not isinstance(x, torch.Tensor) else tiny_input(x, full_images).to(args.device)
                         for x in full)

        inputs = batch_one(False)
        with torch.no_grad():
            try:
                expected = model(*inputs)
            except (ValueError, RuntimeError, AssertionError):  # the model takes images of one size only (torch._assert)
                inputs = batch_one(True)
                expected = model(*inputs)
        harness.reset_compilers()
        row = {"model": model_name}
        steps = {}
        for name, make in harness.compilers(names, args.mode).items():
            compiled = make(model)
            with torch.no_grad():
                start = time.perf_counter()
                out = compiled(*inputs)
                row[f"{name} first call s"] = time.perf_counter() - start
                tol = 1e-3 if args.device == "cpu" else 3e-2  # cuDNN convolutions use TF32 by default
                harness.check_close(name, out, expected, rtol=tol, atol=tol)
            steps[name] = make_step(compiled, "inference")
            if name == "tiny":
                row["tiny guards us"] = guard_us(compiled, model, inputs, args.calls)
                if args.profile_dir:
                    write_profile(compiled, inputs, args, Path(args.profile_dir) / f"{model_name}.txt")
        # in turns, round after round: a busy host slows every backend alike
        per_call = harness.bench_interleaved(steps, inputs, args.device, warmup=3, iters=args.calls,
                                             repeats=args.rounds)
        for name, seconds in per_call.items():
            row[f"{name} us/call"] = seconds * 1e6
        steps.clear()
        for other in ("eager", "torch.compile"):
            if "tiny" in names and other in names:
                row[f"tiny vs {other}"] = row[f"{other} us/call"] / row["tiny us/call"]
        rows.append(row)
        if args.json is not None:  # after every model, so that a run stopped by a time limit keeps its rows
            harness.save("call_overhead", args.device, rows, meta={"models": args.model, "partial": True}, path=args.json)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--model", type=lambda s: [m for m in s.split(",") if m], default=None,
                        help="comma list of dashboard models (bench/dashboard.py) instead of the two functions")
    parser.add_argument("--rounds", type=int, default=9,
                        help="with --model: rounds of --calls calls per backend, timed in turns (the median is kept)")
    parser.add_argument("--profile-dir", default=None,
                        help="with --model: write a cProfile of tiny's cached calls per model into this folder")
    args = parser.parse_args(argv)
    device = args.device
    names = args.backends.split(",")
    if args.model is not None:
        from bench.dashboard import BY_NAME

        unknown = [m for m in args.model if m not in BY_NAME]
        if unknown or not args.model:
            parser.error(f"--model: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(BY_NAME)}")
        rows = model_rows(args, names)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        harness.print_table(rows, columns, title=f"host time per cached call (batch 1) on {harness.describe_device(device)}")
        harness.save("call_overhead", device, rows, meta={"models": args.model}, path=args.json)
        return
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
