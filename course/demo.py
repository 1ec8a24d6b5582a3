"""The headless demo (``make course HEADLESS=1``): the whole course's compiler on the seeds' block.

Compiles the LayerNorm-MLP block with tinydynamo + tininductor, checks it against eager,
prints every artefact the layers recorded (source, bytecode, FX graph, guards, transformed
code, IR, kernels, wrapper), then times eager vs torch.compile vs tiny on it.

    python -m course.demo [--hidden 256] [--full]   # --full: print artefacts unabridged
"""
from __future__ import annotations

import argparse
import sys


def _abridge(text: str, lines: int) -> str:
    rows = str(text).splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    return "\n".join(rows[:lines] + [f"    ... ({len(rows) - lines} more lines)"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--full", action="store_true", help="print every artefact in full")
    args = parser.parse_args(argv)

    import torch

    import tinydynamo
    from course import benchmark
    from course.models import TinyBlock
    from tinydynamo import artifacts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, device {benchmark.describe_device(device)}\n")
    torch.manual_seed(0)
    model = TinyBlock(args.hidden).to(device).eval()
    x = torch.randn(8, 64, args.hidden, device=device)
    compiled = tinydynamo.compile(model, backend="tininductor")
    with torch.no_grad():
        out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    print("tinydynamo.compile(TinyBlock) output equals eager.\n")

    frame = artifacts.history[-1]
    for kind in artifacts.KINDS:
        for title, value in frame.get(kind):
            print(f"=== {kind}: {title}")
            print(value if args.full else _abridge(value, 25))
            print()

    with torch.no_grad():
        rows = [{"backend": name} for name in benchmark.BACKENDS]
        for row, (name, make) in zip(rows, benchmark.compilers(list(benchmark.BACKENDS)).items()):
            benchmark.reset_compilers()
            fn = make(model)
            benchmark.check_close(name, fn(x), model(x), rtol=1e-4, atol=1e-4)
            row["ms per call"] = benchmark.bench(fn, (x,), device, warmup=3, iters=20) * 1e3
        for row in rows:
            row["speedup vs eager"] = rows[0]["ms per call"] / row["ms per call"]
    benchmark.print_table(rows, ["backend", "ms per call", "speedup vs eager"],
                          title=f"TinyBlock({args.hidden}) inference, input {tuple(x.shape)}")
    print("\nNext: `make course` opens the notebooks in JupyterLab, chapter 00 first.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
