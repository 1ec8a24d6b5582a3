"""Benchmark: the seeds' sequence-length experiment, static against dynamic shapes.

The LayerNorm-MLP block (inference) is called at each sequence length in turn, compiled by
torch.compile and by tiny, each with the default policy (``dynamic=None``: static first, then
automatic dynamic) and with ``dynamic=True``. For each it reports the number of compiles (calls
of the backend), the seconds spent in calls that compiled, and the time per call at each length
against a static compile of that very length (``dynamic=False``, compiled afresh per length):
the price of one graph for every length. Eager's time per call is shown beside them. On a GPU
the time its kernels take per call (torch.profiler's device time) is reported too: a small
block's call is bound by host work (launches, guards), and the kernel column says whether the
kernels compiled for symbolic sizes are themselves as fast as those for one size. Outputs are
checked against eager before timing. The compiles run one after another, so each time is the
fastest of several batches (kernel time: of several profiles): noise only ever adds time.

    python bench/dynamic_shapes.py                          # GPU: 32 x 64..512 x 768 fp16; CPU: 8 x 64..512 x 256 fp32
    python bench/dynamic_shapes.py --seqs 64,128,256 --batch 2 --hidden 48 --device cpu   # host-bound: small calls
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from course import benchmark as harness
from course.models import TinyBlock

COMPILERS = ("torch.compile", "tiny")
POLICIES = {"default": None, "dynamic": True}


class CountingBackend:
    """Compiles each graph a compiler hands it with that compiler's own backend, and counts those that compiled."""

    def __init__(self, compiler: str):
        self.compiles = 0
        if compiler == "torch.compile":
            from torch._inductor.compile_fx import compile_fx

            self.backend = compile_fx
        else:
            from tinydynamo.backends import lookup_backend

            self.backend = lookup_backend("tininductor")

    def __call__(self, gm, example_inputs):
        compiled = self.backend(gm, example_inputs)  # TorchDynamo may raise through here to restart a trace:
        self.compiles += 1                           # only a graph that compiled counts
        return compiled


def compile_with(compiler: str, model, dynamic, backend):
    if compiler == "torch.compile":
        return torch.compile(model, backend=backend, dynamic=dynamic)
    import tinydynamo

    return tinydynamo.compile(model, backend=backend, dynamic=dynamic)


def kernel_ms(fn, x, device: str, calls: int = 30, rounds: int = 3) -> float | None:
    """Milliseconds of GPU kernel time per call, the least of ``rounds`` profiles of ``calls``
    calls each (None on a CPU, where the call time is the kernels')."""
    if not device.startswith("cuda"):
        return None
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    per_round = []
    for _ in range(rounds):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(x)
            torch.cuda.synchronize()
        per_round.append(sum(e.self_device_time_total for e in prof.key_averages()) / calls / 1e3)
    return min(per_round)


def seconds_per_call(fn, x, device: str, warmup: int, iters: int) -> float:
    """The fastest of 7 timed batches: on a shared machine noise only adds time, and this
    benchmark's ratios compare timings taken minutes apart (one compile after another)."""
    return harness.bench_spread(fn, (x,), device, warmup, iters, repeats=7).min


def parse_seqs(text: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        seqs = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seqs {text!r}: give sequence lengths as a comma list of integers, e.g. 64,128,256")
    if not seqs or min(seqs) < 1:
        parser.error(f"--seqs {text!r}: give at least one length, each >= 1")
    return seqs


def sweep(compiler: str, model, dynamic, seqs, make_input, expected, tol) -> tuple[dict, float, int]:
    """Compile once with ``dynamic`` and call at every length: (compiled fn, compile seconds, compiles)."""
    harness.reset_compilers()
    backend = CountingBackend(compiler)
    fn = compile_with(compiler, model, dynamic, backend)
    compile_s = 0.0
    for seq in seqs:
        x = make_input(seq)
        before = backend.compiles
        harness.synchronize(str(x.device))
        start = time.perf_counter()
        out = fn(x)
        harness.synchronize(str(x.device))
        if backend.compiles > before:
            compile_s += time.perf_counter() - start
        harness.check_close(f"{compiler} dynamic={dynamic} seq={seq}", out, expected[seq], rtol=tol, atol=tol)
    return fn, compile_s, backend.compiles


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    gpu = torch.cuda.is_available()
    parser.set_defaults(backends=",".join(COMPILERS), iters=30 if gpu else 5, warmup=5 if gpu else 2)
    parser.add_argument("--seqs", default="64,128,192,256,320,384,448,512" if gpu else "64,128,256,384,512",
                        help="comma list of sequence lengths, called in this order")
    parser.add_argument("--batch", type=int, default=32 if gpu else 8)
    parser.add_argument("--hidden", type=int, default=768 if gpu else 256)
    parser.add_argument("--dtype", default=None, help="float16 on a GPU, float32 on a CPU by default")
    args = parser.parse_args(argv)
    seqs = parse_seqs(args.seqs, parser)
    if args.mode:
        parser.error("--mode: this benchmark counts the graphs each compiler hands its backend, which needs the "
                     "default mode; compare modes with bench/block.py")
    compilers = [c for c in args.backends.split(",") if c]
    unknown = [c for c in compilers if c not in COMPILERS]
    if unknown or not compilers:
        parser.error(f"--backends {args.backends!r}: choose from {', '.join(COMPILERS)}")
    device = args.device
    if not device.startswith("cuda"):
        harness.pin_threads()  # a fixed thread count: CPU timings otherwise swing with the machine's load
    dtype = getattr(torch, args.dtype or ("float16" if device.startswith("cuda") else "float32"))
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    torch.manual_seed(0)
    model = TinyBlock(args.hidden).to(device=device, dtype=dtype).eval()
    inputs = {seq: torch.randn(args.batch, seq, args.hidden, device=device, dtype=dtype) for seq in seqs}
    summary, per_length = [], []
    with torch.no_grad():
        expected = {seq: model(x) for seq, x in inputs.items()}
        eager = {seq: seconds_per_call(model, x, device, args.warmup, args.iters) for seq, x in inputs.items()}
        jobs = [(c, p) for c in compilers for p in ("static", *POLICIES)]
        for i, (compiler, policy) in enumerate(jobs):
            harness.progress(i, len(jobs), f"{compiler} {policy}")
            if policy == "static":  # a fresh static compile per length: the reference, and the storm's cost
                compile_s, compiles, times, kernels = 0.0, 0, {}, {}
                for seq in seqs:
                    fn, seconds, count = sweep(compiler, model, False, [seq], inputs.get, expected, tol)
                    compile_s, compiles = compile_s + seconds, compiles + count
                    times[seq] = seconds_per_call(fn, inputs[seq], device, args.warmup, args.iters)
                    kernels[seq] = kernel_ms(fn, inputs[seq], device)
            else:
                fn, compile_s, compiles = sweep(compiler, model, POLICIES[policy], seqs, inputs.get, expected, tol)
                times, kernels = {}, {}
                for seq in seqs:  # timed in the order the static compiles were: the same drift for both
                    times[seq] = seconds_per_call(fn, inputs[seq], device, args.warmup, args.iters)
                    kernels[seq] = kernel_ms(fn, inputs[seq], device)
            summary.append({"compiler": compiler, "policy": policy, "lengths": len(seqs), "compiles": compiles,
                            "compile s": compile_s})
            for seq in seqs:
                per_length.append({"compiler": compiler, "policy": policy, "seq": seq, "ms": times[seq] * 1e3,
                                   "kernel ms": kernels[seq]})
    static = {(r["compiler"], r["seq"]): r["ms"] for r in per_length if r["policy"] == "static"}
    static_kernels = {(r["compiler"], r["seq"]): r["kernel ms"] for r in per_length if r["policy"] == "static"}
    for row in per_length:
        row["vs static"] = row["ms"] / static[(row["compiler"], row["seq"])]
        if row["kernel ms"] is not None:
            row["kernels vs static"] = row["kernel ms"] / static_kernels[(row["compiler"], row["seq"])]
    shape = f"{args.batch} x seq x {args.hidden} {str(dtype).removeprefix('torch.')}"
    harness.print_table(summary, ["compiler", "policy", "lengths", "compiles", "compile s"],
                        title=f"dynamic shapes, block {shape}, seqs {','.join(map(str, seqs))} on "
                              f"{harness.describe_device(device)} (static: one fresh compile per length)")
    print()
    table = []
    for compiler in compilers:
        for seq in seqs:
            row = {"compiler": compiler, "seq": seq, "eager ms": eager[seq] * 1e3}
            for r in per_length:
                if r["compiler"] == compiler and r["seq"] == seq:
                    row[f"{r['policy']} ms"] = r["ms"]
                    if r["policy"] != "static":
                        row[f"{r['policy']}/static"] = r["vs static"]
            table.append(row)
    columns = list(dict.fromkeys(k for r in table for k in r))
    harness.print_table(table, columns, title="time per call (ratio > 1: slower than a static compile of that length)")
    if device.startswith("cuda"):
        print()
        ktable = []
        for compiler in compilers:
            for seq in seqs:
                row = {"compiler": compiler, "seq": seq}
                for r in per_length:
                    if r["compiler"] == compiler and r["seq"] == seq:
                        row[f"{r['policy']} kernel ms"] = r["kernel ms"]
                        if r["policy"] != "static":
                            row[f"{r['policy']}/static"] = r["kernels vs static"]
                ktable.append(row)
        harness.print_table(ktable, list(dict.fromkeys(k for r in ktable for k in r)),
                            title="GPU kernel time per call (torch.profiler device time; the host's share left out)")
    if set(compilers) == set(COMPILERS):
        print()
        for policy in POLICIES:
            tiny = next(r for r in summary if r["compiler"] == "tiny" and r["policy"] == policy)
            ref = next(r for r in summary if r["compiler"] == "torch.compile" and r["policy"] == policy)
            print(f"{policy:<8} compiles tiny {tiny['compiles']} vs torch.compile {ref['compiles']}; compile seconds "
                  f"tiny {tiny['compile s']:.2f} vs torch.compile {ref['compile s']:.2f}")
    per_length += [{"compiler": "eager", "policy": "-", "seq": seq, "ms": eager[seq] * 1e3, "kernel ms": None}
                   for seq in seqs]
    harness.save("dynamic_shapes", device, summary + per_length, path=args.json,
                 meta={"shape": shape, "seqs": seqs})


if __name__ == "__main__":
    main()
