"""Which ATen ops a dashboard model's compiled code still hands to torch, and what one cached call
runs on the host (CPU, small sizes).

Every op that tininductor neither decomposes nor lowers runs as a *fallback*: a library call between
generated kernels, one more host call per call and a point fusion cannot cross. This script compiles
each dashboard model's small version (tests/model_zoo.py) with tiny on the CPU, layout optimization
forced on (``config.force_layout_optimization``: the channels-last graphs a GPU gets), checks the
output against eager, and prints per model the fallbacks its output code marks (``# fallback: ...``),
the library matmuls (``mm`` / ``addmm``, the latter with the bias in the library's epilogue,
fx_passes/mm_bias.py) and the ATen ops one cached call runs on the host (``torch.profiler``).

    python bench/model_fallbacks.py                                   # inference, every model
    python bench/model_fallbacks.py --models resnet18,opt --suite training
"""
from __future__ import annotations

import argparse
import collections
import importlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.profiler import profile

import tinydynamo
from bench import dashboard
from tests.model_zoo import first_tensor
from tininductor import config
from tininductor.testing import patch_config

compile_fx = importlib.import_module("tininductor.compile_fx")  # the module (the package exports the function)

LIBRARY = re.compile(r"= torch\.(mm|addmm|bmm|baddbmm)\(")


def survey(name: str, suite: str) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """(fallback reasons, library matmuls) over the model's compiled graphs, and the ATen ops of one
    cached call."""
    model, inputs = dashboard.BY_NAME[name].make("small")
    dashboard._no_dropout(model)
    model.train(suite == "training")
    step = dashboard.make_step(model, suite)
    expected = step(*inputs) if suite == "inference" else None
    tinydynamo.reset()
    start = compile_fx._compile_count[0]
    compiled = dashboard.make_step(tinydynamo.compile(model, backend="tininductor", dynamic=False), suite)
    out = compiled(*inputs)
    if expected is not None:
        torch.testing.assert_close(first_tensor(out), first_tensor(expected), rtol=1e-3, atol=1e-3)
    reasons, matmuls = collections.Counter(), collections.Counter()
    for graph in compile_fx.compiled_graphs:
        if graph.seq > start:
            reasons.update(re.findall(r"# (fallback: .*)", graph.source))
            matmuls.update(LIBRARY.findall(graph.source))
    compiled(*inputs)
    with profile() as prof:
        compiled(*inputs)
    host = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    return reasons, matmuls, host


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=None, help="comma list of dashboard models (default: every model "
                                                  "with a small version whose library is installed)")
    p.add_argument("--suite", choices=dashboard.SUITES, default="inference")
    p.add_argument("--top", type=int, default=12, help="host ATen ops shown per model")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    names = args.models.split(",") if args.models else [
        m.name for m in dashboard.MODELS if m.small is not None and m.make("small") is not None]
    with patch_config(config, force_layout_optimization=True, cpu_backend="cpp", fallback_to_eager=False):
        for name in names:
            try:
                reasons, matmuls, host = survey(name, args.suite)
            except Exception as e:  # report and go on: one model's failure is a finding too
                print(f"=== {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            mms = " ".join(f"{op}:{n}" for op, n in sorted(matmuls.items())) or "none"
            print(f"=== {name} ({args.suite}): {sum(reasons.values())} fallback calls; matmuls {mms}", flush=True)
            for reason, n in reasons.most_common():
                print(f"  {n:3d}x  {reason}")
            print("  host ATen ops per call: " + ", ".join(f"{op[6:]}:{n}" for op, n in host.most_common(args.top)))


if __name__ == "__main__":
    main()
