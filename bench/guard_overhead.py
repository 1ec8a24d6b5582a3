"""How long do tinydynamo's guards take on a cache hit? (the target: <= 3 us for 4 tensors)

Measures, for a function of 4 tensor arguments (sizes from the command line):
  * the generated guard function alone (``check_fn(L, G)``);
  * the whole dispatch overhead of a cached call (bind arguments + guards + run wrapper), with a
    backend whose compiled function does nothing, so only tinydynamo's own cost remains;
and prints them next to torch.compile's dispatch overhead measured the same way in the same run.

    python bench/guard_overhead.py [--size 8] [--number 20000]
"""
from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import tinydynamo  # noqa: E402
from course import benchmark  # noqa: E402


def fn(a, b, c, d):
    return a + b * c - d


def noop_backend(gm, example_inputs):
    out = (example_inputs[0],)
    return lambda *args: out


def best_us(stmt, number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--json", type=Path, default=None, help="where to write results (default bench/results/...)")
    args = p.parse_args(argv)
    xs = [torch.randn(args.size, args.size) for _ in range(4)]

    tinydynamo.reset()
    compiled = tinydynamo.optimize(noop_backend)(fn)
    compiled(*xs)
    entry = tinydynamo.cache_info(compiled).entries[0]
    L = dict(zip("abcd", xs))
    G = fn.__globals__
    print(f"guards ({len(entry.check_fn.guards)}):\n" + "\n".join(f"  {g}" for g in entry.check_fn.guards))
    check = entry.check_fn.check  # the generated function itself
    guard_us = best_us(lambda: check(L, G), args.number)
    call_us = best_us(lambda: compiled(*xs), args.number)
    plain_us = best_us(lambda: noop_backend(None, xs)(*xs), args.number)
    print(f"tinydynamo guard check           : {guard_us:6.2f} us per call (target <= 3 us)")
    print(f"tinydynamo cached-call overhead  : {call_us - plain_us:6.2f} us per call (bind + guards + wrapper)")

    torch._dynamo.reset()
    tc = torch.compile(fn, backend=noop_backend)
    tc(*xs)
    torch_us = best_us(lambda: tc(*xs), args.number // 4)
    print(f"torch.compile cached-call overhead: {torch_us - plain_us:6.2f} us per call (C++ guards, PEP 523)")
    print(f"ratio tinydynamo / torch.compile : {(call_us - plain_us) / max(torch_us - plain_us, 1e-9):.2f}x")
    row = {"guards": len(entry.check_fn.guards), "guard check us": guard_us,
           "tiny dispatch us": call_us - plain_us, "torch.compile dispatch us": torch_us - plain_us}
    benchmark.save("guard_overhead", "cpu", [row], path=args.json)


if __name__ == "__main__":
    main()
