"""Which ops of the dashboard's vision models fall back to aten, and what tiny's host calls per call.

A fallback is an op tiny has no lowering for: it runs as its own ATen call (a kernel that fuses
with nothing, and host work per call). This script compiles every vision model of
bench/dashboard.py (image inputs) at its small size (tests/model_zoo.py) on the CPU with tiny,
layout optimization forced on (``config.force_layout_optimization``: the channels-last graphs a
GPU gets), and prints per model the fallbacks its output code marks (``# fallback: ...``), then
the ATen ops one cached call runs on the host (``torch.profiler``), the library kernels
(``convolution``, ``addmm``) included. Outputs are checked against eager first.

    python bench/vision_fallbacks.py                         # inference, every vision model
    python bench/vision_fallbacks.py --models resnet18,mobilenet_v2 --suite training
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


def vision_models() -> list[str]:
    """Dashboard models with a small version whose input is an image batch."""
    names = []
    for entry in dashboard.MODELS:
        if entry.small is not None and entry.make("small") is not None:
            _, inputs = entry.make("small")
            if any(isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point() for x in inputs):
                names.append(entry.name)
    return names


def fallbacks_and_host_ops(name: str, suite: str) -> tuple[collections.Counter, collections.Counter]:
    """(fallback reasons over the model's compiled graphs, ATen ops of one cached call)."""
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
    reasons = collections.Counter()
    for graph in compile_fx.compiled_graphs:
        if graph.seq > start:
            reasons.update(re.findall(r"# (fallback: .*)", graph.source))
    compiled(*inputs)
    with profile() as prof:
        compiled(*inputs)
    host = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    return reasons, host


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=None, help="comma list of dashboard models (default: every vision model)")
    p.add_argument("--suite", choices=dashboard.SUITES, default="inference")
    p.add_argument("--top", type=int, default=12, help="host ATen ops shown per model")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    names = args.models.split(",") if args.models else vision_models()
    with patch_config(config, force_layout_optimization=True, cpu_backend="cpp", fallback_to_eager=False):
        for name in names:
            try:
                reasons, host = fallbacks_and_host_ops(name, args.suite)
            except Exception as e:  # report and go on: one model's failure is a finding too
                print(f"=== {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            print(f"=== {name} ({args.suite}): {sum(reasons.values())} fallback calls", flush=True)
            for reason, n in reasons.most_common():
                print(f"  {n:3d}x  {reason}")
            print("  host ATen ops per call: " + ", ".join(f"{op[6:]}:{n}" for op, n in host.most_common(args.top)))


if __name__ == "__main__":
    main()
