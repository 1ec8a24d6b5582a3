"""Lowerings of the pointwise and pooling ops vision models use (ReLU6, hardswish, hardsigmoid, max
pooling): no aten fallback, values against eager in fp32 and bf16 (the kinks and NaN included), and
gradients against eager through their VJP rules' backward ops, lowered too."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from tininductor.testing import compile_graph

compile_fx = importlib.import_module("tininductor.compile_fx")  # the module (the package exports the function)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ACTIVATIONS = {
    "relu6": F.relu6,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 2.0),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
}
TOL = {torch.float32: {}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2}}


def with_kinks(*size, dtype=torch.float32, nan=True):
    """Random values around the activations' kinks, and the kinks themselves, exactly, and a NaN."""
    torch.manual_seed(0)
    x = torch.randn(size) * 4
    flat = x.view(-1)
    kinks = torch.tensor([-3.0, 3.0, 0.0, 6.0, -0.5, 2.0] + [float("nan")] * nan)
    flat[: len(kinks)] = kinks
    return x.to(dtype)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_fuses_without_fallback(name, dtype, backend):
    act = ACTIVATIONS[name]

    def f(x, scale, shift):  # what a batch norm in inference is, then the activation
        return act(x * scale + shift)

    x = with_kinks(2, 3, 4, 5, dtype=dtype)
    scale, shift = torch.ones(3, 1, 1, dtype=dtype), torch.zeros(3, 1, 1, dtype=dtype)
    c = compile_graph(f, [x, scale, shift], backend)
    assert c.fallback_reasons == [], c.fallback_reasons
    assert len(c.kernels) == 1, c.source  # the activation is in the affine's kernel
    torch.testing.assert_close(c(x, scale, shift), f(x, scale, shift), equal_nan=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradient(name, dtype):
    """The backward graph calls the op's ATen backward formula as a lowering (zero gradient at the
    kinks, as eager), not as a fallback."""
    act = ACTIVATIONS[name]
    # no NaN: eager's own CPU kernels disagree on its gradient (hardswish_backward's vectorized loop
    # gives NaN, its scalar tail the incoming gradient)
    x = with_kinks(3, 17, dtype=dtype, nan=False).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(lambda x: act(x) * 2, [x])
    start = compile_fx._compile_count[0]
    grad = torch.randn(3, 17).to(dtype)
    out = c(x)
    out.backward(grad)
    want = act(x_ref) * 2
    want.backward(grad)
    torch.testing.assert_close(out, want, equal_nan=True, **TOL[dtype])
    torch.testing.assert_close(x.grad, x_ref.grad, equal_nan=True, **TOL[dtype])
    graphs = [g for g in compile_fx.compiled_graphs if g.seq >= start]
    assert graphs and all(g.fallback_reasons == [] for g in graphs), [g.fallback_reasons for g in graphs]
