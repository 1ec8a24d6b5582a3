"""Decompositions: every decomposed graph matches eager, and contains prims only."""
from __future__ import annotations

import logging
import zlib

import pytest
import torch
import torch.nn.functional as F

from tininductor.aot_autograd import aot_eager
from tininductor.decompositions import DECOMPOSITIONS, decompose, fake_inputs
from tininductor.joint_graph import create_joint
from tininductor.prims import PRIM_SET, is_prim
from tininductor.testing import compile_graph


def _randn(*shape):
    return lambda dtype: torch.randn(*shape, dtype=dtype)


def _randint(high, *shape):
    return lambda dtype: torch.randint(0, high, shape)


def _mask(*shape):
    return lambda dtype: torch.rand(*shape) > 0.5


def _mask_with_full_row(dtype):
    """A mask whose first row masks everything, second nothing, the rest at random."""
    m = torch.rand(4, 5) > 0.5
    m[0], m[1] = True, False
    return m


CASES = {
    "linear": (lambda x, w, b: F.linear(x, w, b), [_randn(2, 3, 5), _randn(4, 5), _randn(4)]),
    "linear_nobias_1d": (lambda x, w: F.linear(x, w), [_randn(5), _randn(4, 5)]),
    "linear_noncontiguous": (lambda x, w: F.linear(x.transpose(0, 1), w), [_randn(3, 2, 5), _randn(4, 5)]),
    "addmm": (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), [_randn(4), _randn(3, 5), _randn(5, 4)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), [_randn(2, 3, 6), _randn(6), _randn(6)]),
    "layer_norm_2d_noaffine": (lambda x: F.layer_norm(x, (3, 6)), [_randn(2, 3, 6)]),
    "gelu": (lambda x: F.gelu(x), [_randn(4, 7)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [_randn(4, 7)]),
    "softmax": (lambda x: torch.softmax(x * 10, -1), [_randn(3, 4, 5)]),
    "softmax_dim0": (lambda x: F.softmax(x, 0), [_randn(3, 4)]),
    "log_softmax": (lambda x: F.log_softmax(x, 1), [_randn(3, 4, 5)]),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), [_randn(6, 5), _randint(5, 6)]),
    "cross_entropy_sum_ignore": (lambda x, t: F.cross_entropy(x, t.masked_fill(t == 0, -100),
                                                              reduction="sum"),
                                 [_randn(6, 5), _randint(5, 6)]),
    "nll_none": (lambda x, t: F.nll_loss(x, t, reduction="none"), [_randn(6, 5), _randint(5, 6)]),
    "dropout_p0": (lambda x: F.dropout(x, 0.0, training=True), [_randn(3, 4)]),
    "dropout_eval": (lambda x: F.dropout(x, 0.5, training=False), [_randn(3, 4)]),
    "relu": (lambda x: F.relu(x), [_randn(3, 4)]),
    "silu": (lambda x: F.silu(x), [_randn(3, 4)]),
    "tanh_sigmoid": (lambda x: torch.tanh(x) + torch.sigmoid(x), [_randn(3, 4)]),
    "masked_fill": (lambda x, m: x.masked_fill(m, float("-inf")).softmax(-1), [_randn(3, 4), _mask(3, 4)]),
    "masked_fill_not_mask": (lambda x, m: x.masked_fill(~m, -1.0), [_randn(3, 4), _mask(3, 4)]),
    "masked_fill_broadcast": (lambda x, m: x.masked_fill(m, 0.5), [_randn(2, 3, 4), _mask(3, 4)]),
    "views": (lambda x: x.transpose(0, 2).reshape(-1, 3).t().unsqueeze(1).squeeze(1).permute(1, 0)
              .view(4, 6).expand(2, 4, 6) * 2, [_randn(3, 2, 4)]),
    "flatten_contiguous": (lambda x: x.transpose(1, 2).contiguous().flatten(1), [_randn(2, 3, 4)]),
    "embedding": (lambda i, w: F.embedding(i, w), [_randint(7, 2, 5), _randn(7, 3)]),
    "index_slice": (lambda x: x[:, 1:3] + x[:, ::2][:, :2] + x[1, :2], [_randn(2, 4)]),
    "split_chunk": (lambda x: [a * 2 for a in x.split(2, dim=1)] + list(x.chunk(2, dim=0)), [_randn(4, 5)]),
    "unbind": (lambda x: [a + 1 for a in x.unbind(1)], [_randn(2, 3)]),
    "tril_triu": (lambda x: torch.tril(x) + torch.triu(x, 1) * 3 + torch.tril(x, -1), [_randn(2, 4, 5)]),
    "safe_softmax": (lambda x, m: torch.ops.aten._safe_softmax(x.masked_fill(m, float("-inf")), -1),
                     [_randn(4, 5), _mask_with_full_row]),
    "safe_softmax_upcast": (lambda x, m: torch.ops.aten._safe_softmax(x.masked_fill(m, float("-inf")), 0,
                                                                      torch.float64), [_randn(4, 5), _mask_with_full_row]),
    "causal_mask": (lambda x: x.masked_fill(torch.tril(torch.ones(4, 4)) == 0, float("-inf")).softmax(-1),
                    [_randn(2, 4, 4)]),
    "alpha_rsub": (lambda x, y: torch.add(x, y, alpha=2) - torch.sub(x, y, alpha=3) + (1 - x),
                   [_randn(3, 4), _randn(4)]),
    "creation": (lambda x: torch.zeros_like(x) + torch.ones_like(x) * 2 + torch.full_like(x, 3.0)
                 + x.new_zeros(x.shape) + x.new_ones(4), [_randn(3, 4)]),
    "clamp": (lambda x: x.clamp(-0.5, 0.5) + x.clamp_min(0.1) + x.clamp(max=0.2), [_randn(3, 4)]),
    "to_dtype": (lambda x: x.to(torch.float16).to(x.dtype) + x.float().to(x.dtype), [_randn(3, 4)]),
    "reductions": (lambda x: (x.sum(), x.mean(-1), x.var(0), x.amax(1, keepdim=True), x.square().mean()),
                   [_randn(3, 4)]),
    "matmul_4d": (lambda q, k: (q @ k.transpose(-2, -1)) * 0.5, [_randn(2, 3, 4, 5), _randn(2, 3, 4, 5)]),
}


def _check(name, dtype, atol=None, rtol=None):
    fn, makers = CASES[name]
    torch.manual_seed(zlib.crc32(name.encode()))
    inputs = [make(dtype) for make in makers]
    decomposed = decompose(fn, inputs)  # make_fx traces any callable, not only GraphModules
    bad = [str(n.target) for n in decomposed.graph.nodes
           if n.op == "call_function" and not is_prim(n.target) and "getitem" not in str(n.target)]
    assert not bad, f"{name}: ops outside the prim set: {bad}"
    assert decomposed.meta["fallbacks"] == []
    torch.testing.assert_close(decomposed(*inputs), fn(*inputs), atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_decomposition_matches_eager_float32(name):
    _check(name, torch.float32)


@pytest.mark.parametrize("name", ["layer_norm", "gelu_tanh", "softmax", "cross_entropy", "linear", "views"])
def test_decomposition_matches_eager_float64(name):
    _check(name, torch.float64)


def test_layer_norm_half_keeps_dtype_and_matches():
    x, w, b = torch.randn(4, 16).half(), torch.randn(16).half(), torch.randn(16).half()
    fn = lambda x, w, b: F.layer_norm(x, (16,), w, b)  # noqa: E731
    out = decompose(torch.fx.symbolic_trace(fn), [x, w, b])(x, w, b)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, fn(x, w, b), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("shape", [(3, 5), (2, 4, 7), (1, 9)])
def test_shapes_vary(shape):
    x = torch.randn(*shape)
    fn = lambda x: F.gelu(F.layer_norm(x, shape[-1:])).softmax(-1)  # noqa: E731
    torch.testing.assert_close(decompose(torch.fx.symbolic_trace(fn), [x])(x), fn(x))


def test_decomposed_nodes_carry_fake_values():
    x = torch.randn(3, 4)
    gm = decompose(torch.fx.symbolic_trace(lambda x: F.softmax(x, -1)), [x])
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_function"]
    assert vals and all(isinstance(v, torch._subclasses.fake_tensor.FakeTensor) for v in vals)
    assert vals[-1].shape == (3, 4)


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, -1),
    lambda x: F.log_softmax(x, 0),
    lambda x: torch.ops.aten._safe_softmax(x.masked_fill(x > 1.5, float("-inf")), -1),
], ids=["softmax", "log_softmax", "safe_softmax"])
def test_no_gradient_goes_through_the_subtracted_row_max(fn):
    """The max only keeps exp from overflowing: the joint graph does not differentiate it (no
    ``eq`` of the input with its max, no count of ties), and the gradient is eager's, ties included."""
    x = torch.randn(5, 6, dtype=torch.float64)
    x[0, :3] = 1.25  # a row whose max is taken three times
    fakes, mode = fake_inputs([x])
    joint = create_joint(decompose(fn, fakes), fakes, [True], mode)
    targets = {n.target for n in joint.gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.amax.default in targets and torch.ops.aten.eq.Tensor not in targets
    leaf = x.clone().requires_grad_()
    out = fn(leaf)
    tangent = torch.randn_like(out)
    (expected,) = torch.autograd.grad(out, leaf, tangent)
    outs_and_grads = joint.gm([x], [tangent])
    torch.testing.assert_close(outs_and_grads[-1], expected)


def test_op_without_decomposition_is_a_logged_fallback(caplog):
    fn = lambda x, y: torch.cumprod(x, 0) * y  # noqa: E731
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    with caplog.at_level(logging.INFO, logger="tininductor.decompositions"):
        gm = decompose(torch.fx.symbolic_trace(fn), [x, y])
    assert [name for name, _ in gm.meta["fallbacks"]] == ["aten.cumprod.default"]
    assert "no decomposition" in gm.meta["fallbacks"][0][1]
    assert "aten.cumprod.default" in caplog.text
    torch.testing.assert_close(gm(x, y), fn(x, y))


def test_stack_decomposes_to_cat():
    fn = lambda a, b: torch.stack([a, b], dim=1)  # noqa: E731
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    gm = decompose(fn, [a, b])
    assert gm.meta["fallbacks"] == []  # cat is a prim
    assert any(n.target is torch.ops.aten.cat.default for n in gm.graph.nodes)
    torch.testing.assert_close(gm(a, b), fn(a, b))


def test_declined_decomposition_is_a_logged_fallback():
    """Random dropout is not decomposed: it stays torch's, reported, and still drops."""
    fn = lambda x: F.dropout(x, 0.5, training=True)  # noqa: E731
    x = torch.ones(100)
    gm = decompose(torch.fx.symbolic_trace(fn), [x])
    assert gm.meta["fallbacks"], "random dropout must be reported as a fallback"
    out = gm(x)
    assert set(out.unique().tolist()) <= {0.0, 2.0}


def test_table_is_ours_and_outputs_prims():
    """Every decomposition target is outside the prim set (or normalises a prim's rare form)."""
    normalised = {"add", "sub", "constant_pad_nd"}  # constant_pad_nd: a crop becomes a slice
    for op in DECOMPOSITIONS.overload_table():
        if op.overloadpacket in PRIM_SET:
            assert op.overloadpacket.__name__ in normalised, op
        assert DECOMPOSITIONS[op].__module__ == "tininductor.decompositions"
        # a CompositeImplicitAutograd op never reaches the table: an entry for one is dead code
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"), op


def test_safe_softmax_fully_masked_row_has_zero_gradient():
    """A row masked by adding ``-inf`` (the math attention path) is 0 and passes back 0, not NaN."""
    fn = lambda x, m: torch.ops.aten._safe_softmax(x + torch.where(m, float("-inf"), 0.0), -1)  # noqa: E731
    x, m = torch.randn(4, 5, requires_grad=True), _mask_with_full_row(torch.float32)
    compiled = aot_eager(fn, [x, m])
    assert torch.ops.aten._safe_softmax.default not in [n.target for n in compiled.aot.prim_gm.graph.nodes]
    weights = torch.randn(4, 5)
    expected, actual = fn(x, m), compiled(x, m)
    torch.testing.assert_close(actual, expected)
    want, = torch.autograd.grad((expected * weights).sum(), x)
    got, = torch.autograd.grad((actual * weights).sum(), x)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_safe_softmax_is_one_kernel_with_its_mask(backend):
    """The mask, the masked rows' test and softmax's two reductions share one kernel."""
    fn = lambda x, m: torch.ops.aten._safe_softmax(x.masked_fill(m, float("-inf")) * 2, -1)  # noqa: E731
    x, m = torch.randn(4, 5), _mask_with_full_row(torch.float32)
    compiled = compile_graph(fn, [x, m], backend=backend)
    torch.testing.assert_close(compiled(x, m), fn(x, m))
    assert len(compiled.kernels) == 1, compiled.source
