"""Graded tests for chapter 0: the instruments that measure what eager PyTorch costs.

Each exercise is checked by running it on real functions and comparing with an independent
reference: ``make_fx``'s ATen trace (0.1), hand-derived byte counts (0.2), a fake clock and
device queue (0.3), and the graphs TorchDynamo hands a backend (0.4, what ``torch._dynamo.explain`` counts).
"""
from __future__ import annotations

import collections
import statistics

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from course import load
from course.models import TinyBlock
from course.testing import expect_close, expect_equal, expect_true

ch = load("ch00")


def pointwise_chain(x):
    return (x.sin() * 2 + 1).relu()


def aten_trace_counts(fn, *args) -> collections.Counter:
    """Reference for 0.1: the ATen ops make_fx records while tracing ``fn``."""
    gm = make_fx(fn)(*args)
    return collections.Counter(
        str(node.target) for node in gm.graph.nodes
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
    )


# ---------------------------------------------------------------- Exercise 0.1
@pytest.mark.ch00_1
def test_count_aten_ops_of_a_pointwise_chain():
    yours = ch.count_aten_ops(pointwise_chain, torch.randn(4, 5))
    expected = collections.Counter(
        {"aten.sin.default": 1, "aten.mul.Tensor": 1, "aten.add.Tensor": 1, "aten.relu.default": 1}
    )
    expect_equal(dict(yours), dict(expected), "ATen ops of (x.sin() * 2 + 1).relu()")


@pytest.mark.ch00_1
@pytest.mark.parametrize("shape", [(3, 8), (2, 5, 8)])
def test_count_aten_ops_matches_make_fx_trace(shape):
    torch.manual_seed(0)
    block = TinyBlock(8)
    x = torch.randn(shape)
    functions = {
        "TinyBlock": block,
        "softmax+sum": lambda t: torch.softmax(t, -1).sum(),
        "matmul chain": lambda t: (t @ t.mT).tanh() @ t,
        "loop of adds": lambda t: sum((t * i for i in range(4)), t),
    }
    for name, fn in functions.items():
        yours = ch.count_aten_ops(fn, x)
        expected = aten_trace_counts(fn, x)
        expect_equal(dict(sorted(yours.items())), dict(sorted(expected.items())), f"ATen ops of {name} on {shape}")


@pytest.mark.ch00_1
def test_count_aten_ops_keeps_what_the_program_computes_keyword_arguments_included():
    """Counting must not change the program: ATen calls with keyword arguments (dtype=, layout=) run as written."""
    seen = {}

    def fn(t):
        seen["full"] = torch.full((2, 3), 2.5, dtype=torch.float64)
        seen["zeros"] = torch.zeros_like(t, dtype=torch.int32)
        return seen["full"] * t.sum()

    x = torch.randn(2, 3)
    ch.count_aten_ops(fn, x)
    expect_equal(seen["full"].dtype, torch.float64,
                 "dtype of torch.full((2, 3), 2.5, dtype=torch.float64) run under your mode (keyword arguments kept?)")
    expect_equal(seen["zeros"].dtype, torch.int32,
                 "dtype of torch.zeros_like(x, dtype=torch.int32) run under your mode (keyword arguments kept?)")


# ---------------------------------------------------------------- Exercise 0.2
@pytest.mark.ch00_2
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 5)])
def test_intermediate_bytes_of_a_pointwise_chain(shape, dtype):
    x = torch.randn(shape, dtype=dtype)
    # sin, mul and add each write a fresh tensor that the next op reads; relu's is returned
    expected = 3 * x.numel() * x.element_size()
    expect_equal(ch.intermediate_bytes(pointwise_chain, x), expected, f"intermediate bytes, {shape} {dtype}")


@pytest.mark.ch00_2
@pytest.mark.parametrize("shape", [(4, 6), (5, 2)])
def test_intermediate_bytes_reductions_views_inplace_and_tuples(shape):
    x = torch.randn(shape)
    n, row = x.numel() * 4, x[0].numel() * 4

    def centred(t):  # mean(0) is a small intermediate, the subtraction a full-size one
        return (t - t.mean(0)).abs()

    def views_and_inplace(t):  # t() and view share storage, mul_ writes in place: nothing is thrown away
        z = t.t().sin()
        z.mul_(2)
        return z.t()[0:]

    def two_outputs(t):  # a is returned, so only b is an intermediate
        a = t.exp()
        b = a + 1
        return a, b * 2

    def discarded_view(t):  # the temporary is only read through a view of it
        return t.cos().t().contiguous()

    cases = [
        ("(x - x.mean(0)).abs()", centred, row + n),
        ("views and in-place ops", views_and_inplace, 0),
        ("a returned, b temporary", two_outputs, n),
        ("x.cos().t().contiguous()", discarded_view, n),
    ]
    for what, fn, expected in cases:
        expect_equal(ch.intermediate_bytes(fn, x), expected, f"intermediate bytes of {what} on {shape}")


@pytest.mark.ch00_2
def test_intermediate_bytes_counts_the_whole_storage_of_a_padded_buffer():
    """A buffer with padded rows (strides wider than the sizes, as alignment padding makes) holds more
    bytes than its elements: the memory thrown away is the storage's, not numel * element_size."""
    x = torch.randn(3, 5)

    def padded(t):  # rows of 5 floats, each padded to 8: 3 * 8 - 3 = 21 floats of storage for 15 elements
        buffer = t.new_empty_strided((3, 5), (8, 1))
        buffer.copy_(t)
        return buffer.sum(1)

    storage = (2 * 8 + 5) * 4
    expect_equal(ch.intermediate_bytes(padded, x), storage,
                 "intermediate bytes of a (3, 5) buffer with strides (8, 1) (its storage holds 21 floats)")


# ---------------------------------------------------------------- Exercise 0.3
class FakeDevice:
    """A clock and an asynchronous queue: a call costs LAUNCH of host time and queues its
    kernel time; only ``synchronize()`` moves the clock past the queued work."""

    LAUNCH = 0.5
    QUEUED_BEFORE = 30.0  # work queued before benchmark() was called (creating the inputs, say)

    def __init__(self, kernel_times):
        self.kernel_times = list(kernel_times)
        self.now = 0.0
        self.pending = self.QUEUED_BEFORE
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def synchronize(self) -> None:
        self.now += self.pending
        self.pending = 0.0

    def fn(self, *args):
        self.calls += 1
        self.now += self.LAUNCH
        self.pending += self.kernel_times.pop(0)


@pytest.mark.ch00_3
@pytest.mark.parametrize("warmup, timed", [(2, [5.0, 1.0, 3.0]), (0, [2.0]), (3, [4.0, 8.0, 1.0, 2.0])])
def test_benchmark_excludes_first_call_and_synchronises(warmup, timed):
    compile_time, warmup_time = 100.0, 50.0
    device = FakeDevice([compile_time] + [warmup_time] * warmup + timed)
    result = ch.benchmark(device.fn, torch.ones(1), warmup=warmup, repeat=len(timed),
                          clock=device.clock, synchronize=device.synchronize)
    expected = [FakeDevice.LAUNCH + t for t in timed]
    expect_equal(device.calls, 1 + warmup + len(timed), "number of calls to fn (first + warmup + repeat)")
    expect_equal(result.first_call_s, FakeDevice.LAUNCH + compile_time, "first_call_s (the first call alone, synchronised)")
    expect_equal(list(result.times_s), expected, "times_s (each timed call, synchronised before each clock read)")
    expect_equal(result.median_s, statistics.median(expected), "median_s")


@pytest.mark.ch00_3
def test_benchmark_on_cpu_uses_no_sync_and_real_calls():
    ticks = iter(float(i) for i in range(1000))
    calls = []

    def fn(x):
        calls.append(x.sum().item())
        return x * 2

    result = ch.benchmark(fn, torch.ones(3), warmup=4, repeat=5, clock=lambda: next(ticks))
    expect_equal(len(calls), 10, "calls to fn with warmup=4, repeat=5")
    expect_equal(list(result.times_s), [1.0] * 5, "times_s with a clock that ticks once per read")
    expect_equal(result.median_s, 1.0, "median_s")
    expect_true(result.first_call_s == 1.0, f"first_call_s should be one tick, got {result.first_call_s}")


# ---------------------------------------------------------------- Exercise 0.4
def _print_break(x):
    y = torch.sin(x) * 2
    print("graph break here")
    return torch.cos(y) + 1


def _two_breaks(x):
    x = x.relu()
    torch._dynamo.graph_break()
    x = x * 3
    torch._dynamo.graph_break()
    return x.sum(-1)


def _data_dependent(x):
    y = x.exp()
    if y.sum() > 10:  # a jump on a tensor's value: Dynamo must break here
        return y - 1
    return y + 1


def _no_break(x):
    return F.gelu(x @ x.mT).mean()


@pytest.mark.ch00_4
def test_graph_recorder_follows_the_backend_contract():
    gm = torch.fx.symbolic_trace(lambda x, y: torch.relu(x * y) + 1)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    recorder = ch.GraphRecorder()
    compiled = recorder(gm, [x, y])  # called directly, as TorchDynamo would
    expect_true(callable(compiled), f"the backend must return a callable, got {compiled!r}")
    expect_close(compiled(x, y), torch.relu(x * y) + 1, "the returned callable's output vs eager")
    expect_equal(len(recorder.graphs), 1, "graphs recorded after one backend call")
    expect_true(recorder.graphs[0] is gm, "recorder.graphs[0] should be the GraphModule it was given")
    expect_equal([tuple(t.shape) for t in recorder.example_inputs[0]], [(3, 4), (3, 4)], "recorded example input shapes")
    expect_equal(type(recorder.example_inputs[0]).__name__, "list", "type of recorder.example_inputs[0] (a list per graph)")
    scaled = torch.fx.symbolic_trace(lambda x, n: x * n)  # a graph input that is not a tensor (a size, say)
    recorder(scaled, [x, 3])
    expect_equal(len(recorder.example_inputs[1]), 2, "example inputs recorded for a graph called with [x, 3] "
                                                      "(every input, not only the tensors)")
    expect_equal(recorder.example_inputs[1][1], 3, "recorded example input 1 of a graph called with [x, 3]")


@pytest.mark.ch00_4
@pytest.mark.parametrize("fn", [_print_break, _two_breaks, _data_dependent, _no_break, TinyBlock(6)],
                         ids=["print", "two_breaks", "data_dependent", "no_break", "TinyBlock"])
def test_graph_recorder_sees_the_graphs_explain_sees(fn, capsys):
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    recorder = ch.GraphRecorder()
    delivered = []  # what TorchDynamo hands the backend (what explain counts), seen on the way to your recorder

    def backend(gm, example_inputs):
        delivered.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return recorder(gm, example_inputs)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(x)  # one compile: explain would trace everything a second time
    torch._dynamo.reset()
    expect_close(out, fn(x), "compiled output vs eager")
    expect_equal(len(recorder.graphs), len(delivered), "number of graphs the backend received")
    yours = [[str(n.target) for n in gm.graph.nodes if n.op == "call_function"] for gm in recorder.graphs]
    expect_equal(yours, delivered, "call_function ops in each graph")
    expect_equal(len(recorder.example_inputs), len(recorder.graphs), "one example_inputs list per graph")
    for gm, inputs in zip(recorder.graphs, recorder.example_inputs):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        expect_equal(len(inputs), len(placeholders), "example inputs vs graph placeholders", context=gm.code)
