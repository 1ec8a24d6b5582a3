"""Graded tests for chapter 12: DDP's buckets, the DDP optimizer's split points, the step timeline."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tinydynamo
from course import load
from course.testing import expect_close, expect_equal
from tinydynamo.distributed import DDPOptimizer, assign_buckets

ch = load("ch12")
KB = 1024


def _reference_buckets(params, cap, first):
    ready = list(reversed(params))
    return [[ready[i][0] for i in b] for b in assign_buckets([n for _, n in ready], cap, first)]


MODELS = {
    "mlp": [("fc1.weight", 4 * KB), ("fc1.bias", 64), ("fc2.weight", 16 * KB), ("fc2.bias", 64),
            ("fc3.weight", 2 * KB), ("fc3.bias", 16)],
    "transformer": [(f"h{i}.{n}", s) for i in range(3) for n, s in
                    (("ln.w", 256), ("attn.w", 12 * KB), ("attn.b", 256), ("mlp.w", 24 * KB), ("mlp.b", 512))],
}


@pytest.mark.ch12_1
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("cap, first", [(16 * KB, 16 * KB), (20 * KB, 2 * KB), (64 * KB, 1 * KB), (1, 1)])
def test_ddp_buckets(model, cap, first):
    params = MODELS[model]
    expect_equal(ch.ddp_buckets(params, cap, first), _reference_buckets(params, cap, first),
                 f"ddp_buckets({model}, bucket_cap={cap}, first_bucket_cap={first})", context=str(params))


@pytest.mark.ch12_1
def test_ddp_buckets_close_at_the_cap_exactly():
    params = [("a", 100), ("b", 100), ("c", 100), ("d", 100)]
    # reversed: d, c fill the first bucket to exactly 200 = its cap: closed; b, a the next (cap 300)
    expect_equal(ch.ddp_buckets(params, 300, 200), [["d", "c"], ["b", "a"]], "a bucket that reaches its cap exactly")
    expect_equal(ch.ddp_buckets([("small", 10), ("big", 10_000), ("tiny", 5)], 100, 100), [["tiny", "big"], ["small"]],
                 "a parameter larger than the cap closes its bucket")


@pytest.mark.ch12_1
def test_ddp_buckets_without_parameters_and_with_an_empty_one():
    expect_equal(ch.ddp_buckets([], 100, 100), [], "ddp_buckets([], 100, 100): a model without parameters has no bucket")
    params = [("a", 100), ("empty", 0), ("b", 100)]
    # reversed: b fills the first bucket; the 0-byte parameter still has a gradient to all-reduce: it opens the next
    expect_equal(ch.ddp_buckets(params, 100, 100), [["b"], ["empty", "a"]],
                 f"ddp_buckets({params}, 100, 100): a parameter of 0 bytes is in a bucket too")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        x = x * 2 + 1  # a preamble without parameters
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Tied(nn.Module):
    """The embedding's weight is used again by the output layer (GPT-2's tied weights)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, idx):
        return F.linear(self.fc2(torch.relu(self.fc1(self.emb(idx)))), self.emb.weight)


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ln, self.attn, self.proj, self.mlp = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.attn(self.ln(x)).chunk(3, dim=-1)
        x = x + self.proj((q @ k.transpose(-1, -2)).softmax(-1) @ v)
        return x + self.mlp(x)


def _captured(model, *inputs):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    tinydynamo.compile(model, backend=capture, fullgraph=True)(*inputs)
    return graphs[0]


CASES = [
    (MLP, (torch.randn(2, 8),), 4 * KB, 4 * KB),
    (MLP, (torch.randn(2, 8),), 4 * KB, 512),
    (MLP, (torch.randn(2, 8),), 1, 1),
    (MLP, (torch.randn(2, 8),), 528, 528),  # fc3's weight and bias: 528 bytes, the cap exactly
    (Tied, (torch.randint(0, 64, (2, 5)),), 1 * KB, 1 * KB),
    (Tied, (torch.randint(0, 64, (2, 5)),), 2 * KB, 256),
    (Block, (torch.randn(2, 4, 16),), 1 * KB, 1 * KB),
    (Block, (torch.randn(2, 4, 16),), 2 * KB, 100),
]


@pytest.mark.ch12_2
@pytest.mark.parametrize("model, inputs, cap, first", CASES,
                         ids=[f"{c[0].__name__}-{c[2]}-{c[3]}" for c in CASES])
def test_split_points_match_the_ddp_optimizer(model, inputs, cap, first):
    torch.manual_seed(0)
    gm, example_inputs = _captured(model(), *inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_bytes = {n.name: x.numel() * x.element_size() for n, x in zip(placeholders, example_inputs)
                   if isinstance(x, nn.Parameter)}
    buckets = DDPOptimizer(cap, None, first).split_points(gm, example_inputs)
    expected = {n.name: i for i, b in enumerate(buckets) for n in b.nodes}
    expect_equal(ch.split_points(gm, param_bytes, cap, first), expected,
                 f"the pieces of {model.__name__} (bucket_cap={cap}, first_bucket_cap={first})", context=gm.code)


class NoParams(nn.Module):
    def forward(self, x):
        return (x * 2).relu() + 1


def _hand_built():
    """A graph tinydynamo does not make from a module: a constant read with get_attr, one node that uses
    two parameters, and a parameter placeholder that no node uses."""
    root = nn.Module()
    root.scale = torch.full((4,), 0.5)
    graph = torch.fx.Graph()
    x, w, unused, b = (graph.placeholder(name) for name in ("x", "w", "unused", "b"))
    scale = graph.get_attr("scale")
    y = graph.call_function(torch.mul, (x, scale))
    z = graph.call_function(torch.relu, (graph.call_function(F.linear, (y, w, b)),))
    graph.output(graph.call_function(torch.add, (z, 1)))
    torch.manual_seed(0)
    inputs = [torch.randn(2, 4), nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.randn(8)),
              nn.Parameter(torch.randn(4))]
    return torch.fx.GraphModule(root, graph), inputs


@pytest.mark.ch12_2
@pytest.mark.parametrize("case, cap, first", [("no parameters", 1, 1), ("hand-built", 1, 1), ("hand-built", 1 * KB, 8)])
def test_split_points_without_parameters_unused_ones_and_get_attr(case, cap, first):
    gm, example_inputs = _captured(NoParams(), torch.randn(2, 3)) if case == "no parameters" else _hand_built()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_bytes = {n.name: x.numel() * x.element_size() for n, x in zip(placeholders, example_inputs)
                   if isinstance(x, nn.Parameter)}
    buckets = DDPOptimizer(cap, None, first).split_points(gm, example_inputs)
    expected = {n.name: i for i, b in enumerate(buckets) for n in b.nodes}
    expect_equal(ch.split_points(gm, param_bytes, cap, first), expected,
                 f"the pieces of a {case} graph (bucket_cap={cap}, first_bucket_cap={first}, parameters {param_bytes})",
                 context=gm.code)


@pytest.mark.ch12_3
@pytest.mark.parametrize("backward, allreduce, split, expected", [
    ([2, 2, 2], [1, 1, 1], True, 7),     # communication hidden behind the next piece's backward
    ([2, 2, 2], [1, 1, 1], False, 9),    # one compiled backward: everything after it
    ([1, 1, 1], [3, 3, 3], True, 10),    # communication-bound: all-reduces queue one after another
    ([1, 1, 1], [3, 3, 3], False, 12),
    ([5, 1, 1], [0.5, 0.5, 4], True, 7.5),   # uneven: the last piece (backward first) has the big bucket
    ([5, 1, 1], [0.5, 0.5, 4], False, 12),
    ([4], [2], True, 6),
    ([], [], True, 0),   # a model without parameters: no piece, nothing to wait for
    ([], [], False, 0),
])
def test_step_time(backward, allreduce, split, expected):
    expect_close(float(ch.step_time(backward, allreduce, split)), float(expected),
                 f"step_time(backward={backward}, allreduce={allreduce}, split={split})")
