"""CUDA graphs (mode="reduce-overhead") where they cannot apply: the graph runs without them, correctly.

Runs on any machine: on the CPU the mode must compile and run like the default one; a graph with a
CPU tensor input is never recorded (a replay would reuse the value that tensor had at record time).
"""
from __future__ import annotations

import torch

import tinydynamo
from tininductor.runtime.cudagraphs import CUDAGraphRunner


def test_reduce_overhead_on_the_cpu_runs_like_the_default_mode():
    tinydynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = tinydynamo.compile(model, mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(5, 8)
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
        out.sum().backward()  # training graphs too
    assert tinydynamo.counters["frames"]["ok"] >= 1


def test_a_cpu_tensor_input_is_never_recorded():
    calls = []

    def graph(x, scale):
        calls.append(scale.item())
        return (x * scale,)

    runner = CUDAGraphRunner(graph, "inference")
    for value in (2.0, 3.0):
        out = runner(torch.ones(3), torch.tensor(value))
        torch.testing.assert_close(out[0], torch.full((3,), value))
    assert runner.disabled and "cpu tensor" in runner.disabled
    assert runner.graph is None and runner.recordings == 0 and calls == [2.0, 3.0]
