"""Custom ops (``torch.library.custom_op``) inside compiled code: captured as one op, as TorchDynamo
does, and differentiated with the op's own ``register_autograd`` formula (transformers' Mixture of
Experts routes tokens through such an op). Checked against eager, forward and gradients."""
from __future__ import annotations

import warnings

import pytest
import torch

import tinydynamo
from tinydynamo.testing import CompileCounterWithBackend


@torch.library.custom_op("tinytest::scale_sin", mutates_args=())
def scale_sin(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * w


@scale_sin.register_fake
def _(x, w):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    return grad * torch.cos(x) * w, (grad * torch.sin(x)).sum(0)


scale_sin.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("tinytest::split_scale", mutates_args=())
def split_scale(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x * 3


@split_scale.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x)


split_scale.register_autograd(lambda ctx, g1, g2: g1 * 2 + g2 * 3)


def uses_scale_sin(x, w):
    return scale_sin(x * 2, w).relu().sum()


def uses_one_output(x):
    a, _ = split_scale(x.exp())  # the second output gets no gradient: the formula sees zeros, as in eager
    return (a * a).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
@pytest.mark.parametrize("fn,shapes", [(uses_scale_sin, [(4, 3), (3,)]), (uses_one_output, [(5,)])],
                         ids=["scale_sin", "multi_output"])
def test_custom_op_trains_with_its_autograd_formula(fn, shapes, backend):
    torch.manual_seed(0)
    inputs = [torch.randn(s, requires_grad=True) for s in shapes]
    copies = [t.detach().clone().requires_grad_() for t in inputs]
    fn(*inputs).backward()
    tinydynamo.reset()
    counter = CompileCounterWithBackend(backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would warn
        out = tinydynamo.compile(fn, backend=counter)(*copies)
    out.backward()
    assert counter.frame_count == 1
    targets = [n.target for gm in counter.graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert any("tinytest" in str(t) for t in targets), "the custom op is one node of the graph"
    for t, c in zip(inputs, copies):
        torch.testing.assert_close(c.grad, t.grad)
