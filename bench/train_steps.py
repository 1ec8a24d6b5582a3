"""Shared by the real-training benchmarks (gpt_train.py, resnet_train.py): one training step per
backend, checked against eager, timed in turns, plus its first-call and cold-compile seconds.

* *first call*: seconds of the first step after ``torch.compile`` / ``tinydynamo.compile`` in
  the benchmark's process (tracing, compiling, loading, running), with whatever caches exist;
* *cold compile*: the same in a fresh process with empty compile caches (``--cold``): a child
  process runs this module's ``cold_child`` with fresh TORCHINDUCTOR/TRITON/TINY cache dirs.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from course import benchmark as harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_fn(model, fn, loss_of):
    """A training step: zero the gradients, forward, loss, backward."""
    params = list(model.parameters())

    def step(*inputs):
        for p in params:
            p.grad = None
        loss = loss_of(fn, *inputs)
        loss.backward()
        return loss

    return step


def measure_training(model, inputs, loss_of, names, device, warmup, iters, tol) -> dict:
    """Per backend: check loss and gradients against eager, note the first call's seconds, time steps."""
    reference = copy.deepcopy(model)
    ref_loss = step_fn(reference, reference, loss_of)(*inputs)
    expected = [ref_loss] + [p.grad for p in reference.parameters()]
    fns, row = {}, {}
    for name, make in harness.compilers(names).items():
        trained = copy.deepcopy(model)
        step = step_fn(trained, make(trained), loss_of)
        harness.synchronize(device)
        start = time.perf_counter()
        loss = step(*inputs)
        harness.synchronize(device)
        if name != "eager":
            row[f"{name} first call s"] = time.perf_counter() - start
        try:
            torch.testing.assert_close([loss] + [p.grad for p in trained.parameters()], expected, rtol=tol, atol=tol)
        except AssertionError as error:  # never time a wrong step; say so and time the others
            row[f"{name} error"] = "loss or gradients differ from eager: " + str(error).splitlines()[0][:200]
            print(f"{name}: {row[f'{name} error']}; not timing it", flush=True)
            continue
        fns[name] = step
    timings = harness.bench_interleaved(fns, tuple(inputs), device, warmup, iters, repeats=7)
    for name, seconds in timings.items():
        row[f"{name} ms"] = seconds * 1e3
    for other in ("eager", "torch.compile"):
        if "tiny" in fns and other in fns:
            row[f"tiny vs {other}"] = row[f"{other} ms"] / row["tiny ms"]
    return row


def cold_compile(script: str, backend: str, child_args: list[str], pycache: str) -> float:
    """Seconds of the first compiled step in a fresh process with empty compile caches."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"), TINY_CACHE_DIR=os.path.join(cache, "tiny"),
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        env.setdefault("PYTHONPYCACHEPREFIX", pycache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        run = subprocess.run([sys.executable, script, "--cold-child", backend, *child_args], env=env,
                             capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise SystemExit(f"cold compile of {backend} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def cold_child(backend: str, model, inputs, loss_of, device: str) -> None:
    """In the child: compile, run one step, print ``{"seconds": ..., "phases": {...}}``."""
    harness.synchronize(device)
    start = time.perf_counter()
    fn = harness.compilers([backend])[backend](model)
    step_fn(model, fn, loss_of)(*inputs)
    harness.synchronize(device)
    seconds = time.perf_counter() - start
    phases = {}
    if backend == "tiny":
        from tinydynamo.utils import compile_times

        phases = {phase: total for phase, (calls, total) in compile_times(repr="dict").items()}
    print(json.dumps({"seconds": seconds, "phases": phases}))
