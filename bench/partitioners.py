"""Saved-for-backward bytes of the default and min-cut partitioners on the LayerNorm-MLP block.

    python bench/partitioners.py [--hidden 256] [--expansion 4] [--batch 8] [--seq 128]

Prints, for our partitioners and for PyTorch's own (torch._functorch), how many values and
bytes the forward keeps alive for the backward, and the time of one forward+backward step
(eager, ours through aot_eager, PyTorch's aot_eager), measured in this run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course.models import TinyBlock  # noqa: E402
from tininductor.aot_autograd import aot_eager, aot_eager_min_cut  # noqa: E402


def torch_saved(model, x, partition_fn):
    """Saved values/bytes of PyTorch's own AOTAutograd with ``partition_fn``."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    found = {}

    def fw_compiler(gm, example_inputs):
        (out,) = [n for n in gm.graph.nodes if n.op == "output"]
        saved = [a for a in out.args[0][1:] if hasattr(a, "meta") and "val" in a.meta]
        vals = [a.meta["val"] for a in saved if isinstance(a.meta["val"], torch.Tensor)]
        found["saved"] = (len(vals), sum(v.numel() * v.element_size() for v in vals))
        return make_boxed_func(gm)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=fw_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm),
                           partition_fn=partition_fn)
    torch.compile(model, backend=backend)(x).sum().backward()
    return found["saved"]


def step_time(fn, x, reps):
    fn(x).sum().backward()  # warm up (and compile)
    start = time.perf_counter()
    for _ in range(reps):
        fn(x).sum().backward()
    return (time.perf_counter() - start) / reps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--expansion", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyBlock(args.hidden, args.expansion)
    x = torch.randn(args.batch, args.seq, args.hidden, requires_grad=True)
    gm = torch.fx.symbolic_trace(model)
    print(f"LayerNorm-MLP block: hidden={args.hidden} expansion={args.expansion} "
          f"input={tuple(x.shape)} float32")
    print(f"{'partitioner':<34}{'saved values':>14}{'saved bytes':>14}{'vs default':>12}")
    ours = {name: be(gm, [x]).aot.partition for name, be in
            [("default", aot_eager), ("min_cut", aot_eager_min_cut)]}
    base = ours["default"].saved_bytes
    rows = [(f"tininductor {name}", len(p.saved), p.saved_bytes) for name, p in ours.items()]
    try:
        from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
        for name, fn in [("default", default_partition), ("min_cut", min_cut_rematerialization_partition)]:
            rows.append((f"torch._functorch {name}", *torch_saved(model, x, fn)))
    except Exception as e:  # noqa: BLE001 - the comparison is optional
        print(f"(torch's partitioners not measured: {e})")
    for name, count, nbytes in rows:
        print(f"{name:<34}{count:>14}{nbytes:>14,}{nbytes / base:>11.2f}x")

    torch._dynamo.reset()
    eager = step_time(model, x, args.reps)
    timings = [("eager", eager)]
    for name, be in [("tininductor aot_eager", aot_eager), ("tininductor aot_eager_min_cut", aot_eager_min_cut),
                     ("torch aot_eager", "aot_eager")]:
        torch._dynamo.reset()
        timings.append((name, step_time(torch.compile(model, backend=be), x, args.reps)))
    print(f"\n{'forward+backward step':<34}{'ms':>14}{'vs eager':>12}")
    for name, seconds in timings:
        print(f"{name:<34}{seconds * 1e3:>14.2f}{seconds / eager:>11.2f}x")


if __name__ == "__main__":
    main()
