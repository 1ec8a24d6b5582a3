"""tininductor's graph cache: blocks of the same form compile once, each keeps its own parameters.

Eager is the oracle: outputs, gradients and buffers of every block are compared with eager's
after a cache hit; the key must tell apart what changes the compiled code (shapes, dtypes, ops,
constants, requires_grad, a swapped registry entry) and nothing else.
"""
import copy

import pytest
import torch
import torch.fx as fx

import tinydynamo
from tininductor import config, graph_cache
from tininductor.decompositions import DECOMPOSITIONS
from tinydynamo.registry import swap


@pytest.fixture(autouse=True)
def _fresh():
    tinydynamo.reset()  # empties the graph cache too
    yield
    tinydynamo.reset()


class Block(torch.nn.Module):
    def __init__(self, norm: str = "layer"):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16) if norm == "layer" else torch.nn.BatchNorm1d(16)

    def forward(self, x):
        return self.norm(torch.relu(self.linear(x))) + x


class Stack(torch.nn.Module):
    """transformers' LayerDrop: a draw and a data-dependent branch per layer, a graph break each. (The
    draw is scaled: ``torch.rand([]) < 0.0`` alone is decided at trace time, a draw being in [0, 1];
    ``2 * draw - 1 < -1.0`` is never true either, but tinydynamo does not follow the range through
    arithmetic.)"""

    def __init__(self, n: int = 5, norm: str = "layer"):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(norm) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            if 2 * torch.rand([]) - 1 < -1.0:
                continue
            x = layer(x)
        return x


def _train_step(model, x):
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return out.detach()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("norm", ["layer", "batch"])
def test_blocks_share_one_compile_and_keep_their_own_parameters(norm):
    torch.manual_seed(0)
    model = Stack(norm=norm)
    reference = copy.deepcopy(model)
    x = torch.randn(8, 16, requires_grad=True)
    expected = _train_step(reference, x)
    compiled = tinydynamo.compile(model, backend="tininductor")
    got = _train_step(compiled, x)
    assert graph_cache.cache.stats["hit"] >= 2  # the middle blocks: the same graph as the first
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for name, grad in _grads(reference).items():
        torch.testing.assert_close(_grads(model)[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, buf), ref in zip(model.named_buffers(), reference.buffers()):  # running statistics, per block
        torch.testing.assert_close(buf, ref, msg=name)
    # a block's parameters are read at each call: changing one block changes only its output
    with torch.no_grad():
        model.layers[3].linear.weight.mul_(2)
        reference.layers[3].linear.weight.mul_(2)
    torch.testing.assert_close(_train_step(compiled, x), _train_step(reference, x), rtol=1e-5, atol=1e-5)


def test_inference_blocks_hit_and_match_eager():
    torch.manual_seed(0)
    model = Stack(n=4).eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        expected = model(x)
        got = tinydynamo.compile(model, backend="tininductor")(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert graph_cache.cache.stats["hit"] >= 1


def test_the_cache_can_be_turned_off():
    with config.patch({"graph_cache": False}):
        model = Stack(n=4)
        _train_step(tinydynamo.compile(model, backend="tininductor"), torch.randn(8, 16))
    assert graph_cache.cache.stats["hit"] == 0 and len(graph_cache.cache) == 0


def test_reset_empties_it():
    _train_step(tinydynamo.compile(Stack(n=3), backend="tininductor"), torch.randn(8, 16))
    assert len(graph_cache.cache) > 0
    tinydynamo.reset()
    assert len(graph_cache.cache) == 0


# --------------------------------------------------------------------------- the key



def _key(gm, inputs, state_names=(), state=()):
    return graph_cache.graph_key(gm, list(state_names), list(state), inputs, (None, None, None, None))


class Scale(torch.nn.Module):
    def __init__(self, factor=2.0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))
        self.factor = factor

    def forward(self, x):
        return torch.sin(x * self.weight) * self.factor


def _module_key(module, x):
    gm = fx.symbolic_trace(module)
    names = [n for n, _ in gm.named_parameters()]
    return _key(gm, [x], names, [p for _, p in gm.named_parameters()])


def test_the_key_ignores_which_parameters_and_sees_everything_else():
    x = torch.randn(3, 4)
    base = _module_key(Scale(), x)
    assert _module_key(Scale(), x) == base  # other parameter values, same form
    assert _module_key(Scale(3.0), x) != base  # another constant
    assert _module_key(Scale(-0.0), x) != _module_key(Scale(0.0), x)
    assert _module_key(Scale(), torch.randn(2, 4)) != base  # another shape
    assert _module_key(Scale(), x.double()) != base  # another dtype
    assert _module_key(Scale(), x.t().contiguous().t()) != base  # other strides
    assert _module_key(Scale(), x.clone().requires_grad_()) != base
    with torch.no_grad():
        assert _module_key(Scale(), torch.randn(3, 4)) != base  # grad mode
    with config.patch({"partitioner": "default"}):
        assert _module_key(Scale(), torch.randn(3, 4)) != base  # an option
    with swap(DECOMPOSITIONS, {}):
        assert _module_key(Scale(), torch.randn(3, 4)) != base  # a swapped registry entry (a learner's)
    assert _module_key(Scale(), torch.randn(3, 4)) != base  # ... and after the swap: not the old entries either


def test_the_key_tells_ops_and_aliasing_apart():
    x = torch.randn(4)
    sin = _key(fx.symbolic_trace(lambda a, b: torch.sin(a) + b), [x, torch.randn(4)])
    cos = _key(fx.symbolic_trace(lambda a, b: torch.cos(a) + b), [x, torch.randn(4)])
    assert sin != cos
    same = _key(fx.symbolic_trace(lambda a, b: torch.sin(a) + b), [x, x])  # both inputs one tensor
    assert same != sin


def test_a_constant_tensor_attribute_matches_only_itself():
    class WithConstant(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.table = torch.full((4,), value)  # a plain attribute: not a parameter or buffer

        def forward(self, x):
            return x + self.table

    x = torch.randn(4)
    a, b = fx.symbolic_trace(WithConstant(1.0)), fx.symbolic_trace(WithConstant(2.0))
    assert _key(a, [x]) != _key(b, [x])
    assert _key(a, [x]) == _key(a, [x])


def test_cuda_graphs_and_freezing_are_not_cached():
    gm = fx.symbolic_trace(lambda a: a.sin())
    for option in ("triton.cudagraphs", "freezing"):
        with config.patch({option: True}), pytest.raises(graph_cache.Uncacheable):
            _key(gm, [torch.randn(3)])


def test_a_compile_under_a_swapped_rule_is_not_reused_after_it():
    """A graded exercise swaps a learner's entry in: its compile must use that entry, not a cached one
    (each model below is a new object: tinydynamo compiles its frames again, the backend sees one form)."""
    model = Stack(n=4)
    x = torch.randn(8, 16)
    expected = _train_step(copy.deepcopy(model), x)
    _train_step(tinydynamo.compile(copy.deepcopy(model), backend="tininductor"), x)
    wrong = {torch.ops.aten.relu.default: lambda t: t * 0}  # a wrong decomposition
    with swap(DECOMPOSITIONS, wrong):
        got = _train_step(tinydynamo.compile(copy.deepcopy(model), backend="tininductor"), x)
        assert not torch.allclose(got, expected, atol=1e-3)
    got = _train_step(tinydynamo.compile(copy.deepcopy(model), backend="tininductor"), x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert graph_cache.cache.stats["hit"] > 0


class NoGradBlock(torch.nn.Module):
    """A no-grad region inside the block: AOT autograd rewrites the graph before lifting its parameters."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        with torch.no_grad():
            scale = self.linear(x).abs().mean()
        return torch.tanh(self.linear(x)) * scale + x


def test_blocks_with_no_grad_regions_hit_and_match_eager():
    torch.manual_seed(0)
    model = Stack(n=5)
    model.layers = torch.nn.ModuleList(NoGradBlock() for _ in range(5))
    reference = copy.deepcopy(model)
    x = torch.randn(8, 16, requires_grad=True)
    expected = _train_step(reference, x)
    got = _train_step(tinydynamo.compile(model, backend="tininductor"), x)
    assert graph_cache.cache.stats["hit"] >= 2
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for name, grad in _grads(reference).items():
        torch.testing.assert_close(_grads(model)[name], grad, rtol=1e-4, atol=1e-5, msg=name)
