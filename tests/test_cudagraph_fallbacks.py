"""CUDA graphs (mode="reduce-overhead") where they cannot apply: the graph runs without them, correctly.

Runs on any machine: on the CPU the mode must compile and run like the default one; a graph with a
CPU tensor input is never recorded (a replay would reuse the value that tensor had at record time).
"""
from __future__ import annotations

import torch

import tinydynamo
from tininductor.aot_autograd import aot_autograd
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


def test_parameters_and_buffers_are_static_inputs_of_the_compiled_graphs():
    """AOT autograd flags the module state's placeholders ``static_address``: a CUDA graph reads a
    batch norm's running statistics and the weights in place instead of copying them in before
    every replay (the user's input is still copied). Inference and training forward graphs."""
    graphs = []

    def spy(gm, example_inputs):
        graphs.append(gm)
        return gm

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(2, 3, 6, 6)
    for train in (False, True):
        graphs.clear()
        tinydynamo.reset()
        model.train(train)
        with torch.set_grad_enabled(train):
            tinydynamo.compile(model, backend=aot_autograd(spy))(x)
        placeholders = [n for n in graphs[0].graph.nodes if n.op == "placeholder"]
        flags = [bool(n.meta.get("static_address")) for n in placeholders]
        # conv weight and bias, BN weight, bias, running mean and var (and, training, the batch count)
        assert flags.count(False) == 1 and sum(flags) == (7 if train else 6), (train, flags)
