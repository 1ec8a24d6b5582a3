"""Graded tests for chapter 5: graph reading, a graph interpreter, and decompositions plugged into
``tininductor.decompositions.decompose``, all compared with eager PyTorch."""
import collections

import pytest
import torch
import torch.nn.functional as F

from course import load
from course.models import TinyBlock
from course.testing import expect_close, expect_equal, expect_true
from tininductor.decompositions import DECOMPOSITIONS, decompose
from tininductor.prims import is_prim

ch = load("ch05")
aten = torch.ops.aten


def _decompose_with(op, fn, inputs, yours):
    """Decompose ``fn`` with the package table, your function swapped in for ``op``."""
    with DECOMPOSITIONS.swap({op: yours}):
        return decompose(fn, inputs)


def _non_prims(gm):
    return sorted({str(n.target) for n in gm.graph.nodes
                   if n.op == "call_function" and not is_prim(n.target)})


# --------------------------------------------------------------------------- 5.1
@pytest.mark.ch05_1
@pytest.mark.parametrize("case", ["softmax", "block"])
def test_count_ops(case):
    torch.manual_seed(0)
    if case == "softmax":
        fn, inputs = (lambda x: torch.softmax(x, -1) * 2), [torch.randn(3, 4)]
    else:
        fn, inputs = TinyBlock(8, 2), [torch.randn(2, 8)]
    gm = decompose(fn, inputs)
    expected = dict(collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
    expect_equal(ch.count_ops(gm), expected, f"op counts of the decomposed {case}", context=gm.code)


@pytest.mark.ch05_1
def test_count_ops_counts_only_op_calls():
    """A traced graph also holds method calls (x.sum()), placeholders and the output: only call_function nodes are ops."""
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x).sum() + torch.sin(x).mean())
    expected = {str(n.target): 1 for n in gm.graph.nodes if n.op == "call_function"}
    expect_equal(ch.count_ops(gm), expected, "op counts of torch.relu(x).sum() + torch.sin(x).mean() "
                                             "(.sum() and .mean() are call_method nodes, not ops)", context=gm.code)


# --------------------------------------------------------------------------- 5.2
@pytest.mark.ch05_2
@pytest.mark.parametrize("shape", [(2, 8), (3, 5, 8)])
def test_interpret_runs_the_graph(shape):
    torch.manual_seed(0)
    block = TinyBlock(8, 2)
    x = torch.randn(*shape)
    gm = decompose(block, [x])  # parameters are get_attr nodes of gm
    expect_close(ch.interpret(gm, x), gm(x), f"interpret(decomposed TinyBlock) on {shape}", context=gm.code)
    fn = lambda a, b: (a.sin() * b, (a + 1).sum(0))  # noqa: E731  (tuple output)
    a, b = torch.randn(3, 4), torch.randn(4)
    gm2 = decompose(fn, [a, b])
    expect_close(ch.interpret(gm2, a, b), fn(a, b), "interpret of a two-output graph", context=gm2.code)


# --------------------------------------------------------------------------- 5.3
@pytest.mark.ch05_3
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gelu_decomposition(approximate, dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 33, dtype=dtype) * 3
    fn = lambda x: F.gelu(x, approximate=approximate)  # noqa: E731
    gm = _decompose_with(aten.gelu.default, fn, [x], ch.gelu)
    expect_equal(_non_prims(gm), [], "ops outside the prim set in your gelu graph", context=gm.code)
    wanted = "aten.tanh.default" if approximate == "tanh" else "aten.erf.default"
    expect_true(any(str(n.target) == wanted for n in gm.graph.nodes),
                f"gelu(approximate={approximate!r}) should use {wanted}", context=gm.code)
    expect_close(gm(x), fn(x), f"gelu(approximate={approximate!r}) {dtype}", context=gm.code)


# --------------------------------------------------------------------------- 5.4
@pytest.mark.ch05_4
@pytest.mark.parametrize("affine", [True, False, "weight only", "bias only"])
@pytest.mark.parametrize("shape, normalized", [((4, 16), (16,)), ((2, 3, 8), (3, 8))])
def test_layer_norm_decomposition(affine, shape, normalized):
    torch.manual_seed(0)
    x = torch.randn(*shape) * 2 + 1
    w = torch.randn(*normalized) if affine in (True, "weight only") else None
    b = torch.randn(*normalized) if affine in (True, "bias only") else None
    fn = lambda x: aten.native_layer_norm(x, list(normalized), w, b, 1e-5)  # noqa: E731
    gm = _decompose_with(aten.native_layer_norm.default, fn, [x], ch.native_layer_norm)
    expect_equal(_non_prims(gm), [], "ops outside the prim set in your layer_norm graph", context=gm.code)
    out, mean, rstd = gm(x)
    want_out, want_mean, want_rstd = fn(x)
    expect_close(out, want_out, f"layer_norm output {shape} over {normalized}, weight "
                                f"{'given' if w is not None else 'None'}, bias {'given' if b is not None else 'None'}",
                 context=gm.code)
    expect_close(mean.reshape(want_mean.shape), want_mean, "mean (keep the reduced dims)")
    expect_close(rstd.reshape(want_rstd.shape), want_rstd, "rstd = 1/sqrt(var + eps)")


@pytest.mark.ch05_4
def test_layer_norm_inside_the_block():
    torch.manual_seed(0)
    block, x = TinyBlock(16, 2), torch.randn(3, 16)
    gm = _decompose_with(aten.native_layer_norm.default, block, [x], ch.native_layer_norm)
    expect_close(gm(x), block(x), "TinyBlock decomposed with your layer_norm")


# --------------------------------------------------------------------------- 5.5
@pytest.mark.ch05_5
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_decomposition(dim):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 7)
    fn = lambda x: torch.softmax(x, dim)  # noqa: E731
    gm = _decompose_with(aten._softmax.default, fn, [x], ch.softmax)
    expect_equal(_non_prims(gm), [], "ops outside the prim set in your softmax graph", context=gm.code)
    expect_close(gm(x), fn(x), f"softmax over dim {dim}", context=gm.code)


@pytest.mark.ch05_5
def test_softmax_is_stable_for_large_inputs():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0], [500.0, -500.0, 0.0]])
    fn = lambda x: torch.softmax(x, -1)  # noqa: E731
    gm = _decompose_with(aten._softmax.default, fn, [x], ch.softmax)
    expect_close(gm(x), fn(x), "softmax of rows [1000, 1001, 999], [-1000, -1002, -1001], [500, -500, 0] "
                               "(exp overflows unless you subtract the row's max)")


def _add_in_place_then_scale(a, b):
    aten.add_.Tensor(a, b)  # writes into a: later reads of a see the sum
    return aten.mul.Tensor(a, 2)


def _clamp_between(a, lo, hi):
    return torch.clamp(a, min=lo, max=hi)  # keyword arguments that are graph values


@pytest.mark.ch05_2
def test_interpret_in_place_ops_keyword_nodes_and_one_element_outputs():
    gm = torch.fx.symbolic_trace(_add_in_place_then_scale)
    a, b = torch.randn(3), torch.randn(3)
    want = _add_in_place_then_scale(a.clone(), b)
    yours_a = a.clone()
    expect_close(ch.interpret(gm, yours_a, b), want, "interpret of aten.add_(a, b) then a * 2 (the in-place op "
                                                      "must write into a itself)", context=gm.code)
    expect_close(yours_a, a + b, "the input a after interpreting aten.add_(a, b) (mutated in place, as eager does)")
    gm = torch.fx.symbolic_trace(_clamp_between)
    x, lo, hi = torch.randn(4), torch.full((4,), -0.2), torch.full((4,), 0.3)
    expect_close(ch.interpret(gm, x, lo, hi), _clamp_between(x, lo, hi),
                 "interpret of torch.clamp(a, min=lo, max=hi) with lo, hi graph inputs (keyword arguments that are nodes)",
                 context=gm.code)
    gm = torch.fx.symbolic_trace(lambda t: (t * 2,))
    out = ch.interpret(gm, x)
    expect_equal(type(out).__name__, "tuple", "type of interpret's result for a graph returning (t * 2,) "
                                              "(a one-element tuple stays a tuple)", context=gm.code)
    expect_close(out, (x * 2,), "interpret of a graph returning (t * 2,)")


@pytest.mark.ch05_2
def test_interpret_lists_kwargs_and_argument_order():
    """Node arguments can be lists of nodes and keywords; placeholders take the arguments in order."""
    def fn(a, b, c):
        joined = torch.cat([a, b, a], dim=1)
        s = torch.sum(joined - c, dim=1, keepdim=True)
        return {"s": s, "parts": [torch.clamp(a, min=-0.5, max=0.5), b]}

    gm = torch.fx.symbolic_trace(fn)
    a, b, c = torch.randn(3, 2), torch.randn(3, 4), torch.randn(3, 8)
    expect_close(ch.interpret(gm, a, b, c), fn(a, b, c), "interpret of a graph with lists, kwargs and a dict output",
                 context=gm.code)
