"""Matmul operands padded to aligned sizes (``config.shape_padding``, fx_passes/pad_mm.py): off on
CPU by default, forced here; values (and gradients) against eager, on C++ and the Triton interpreter."""
import pytest
import torch

from tininductor.testing import compile_graph

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
BACKENDS = ["cpp", "triton"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)



def padded(c) -> bool:
    return "(8, 12)" in c.source and "(12, 16)" in c.source


@pytest.mark.parametrize("backend", BACKENDS)
def test_mm_addmm_padded_when_forced(backend):
    a, b, bias = torch.randn(6, 10), torch.randn(10, 13), torch.randn(13)
    for fn in (lambda a, b, bias: a @ b, lambda a, b, bias: torch.addmm(bias, a, b).relu()):
        c = compile_graph(fn, [a, b, bias], backend, force_shape_padding=True)
        torch.testing.assert_close(c(a, b, bias), fn(a, b, bias), rtol=1e-5, atol=1e-5)
        assert padded(c), c.source
        off = compile_graph(fn, [a, b, bias], backend)  # CPU, float32: not worth it by default
        assert not padded(off), off.source


@pytest.mark.parametrize("backend", BACKENDS)
def test_bmm_and_linear_padded(backend):
    x, w, bias = torch.randn(3, 6, 10), torch.randn(13, 10), torch.randn(13)
    for fn in (lambda x, w, bias: torch.bmm(x, w.t().expand(3, 10, 13)),
               lambda x, w, bias: torch.nn.functional.linear(x, w, bias)):
        c = compile_graph(fn, [x, w, bias], backend, force_shape_padding=True)
        torch.testing.assert_close(c(x, w, bias), fn(x, w, bias), rtol=1e-5, atol=1e-5)
        assert "constant_pad" in "".join(k for k in c.kernels) or "(12, 16)" in c.source, c.source


def test_half_precision_padded_and_aligned_left_alone():
    a, b = torch.randn(6, 10, dtype=torch.bfloat16), torch.randn(10, 13, dtype=torch.bfloat16)
    c = compile_graph(lambda a, b: a @ b, [a, b], "cpp", force_shape_padding=True)
    torch.testing.assert_close(c(a, b), a @ b)
    assert "(8, 16)" in c.source and "(16, 16)" in c.source, c.source  # 8 bf16 elements = 16 bytes
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    c = compile_graph(lambda a, b: a @ b, [a, b], "cpp", force_shape_padding=True)
    assert "constant_pad" not in "".join(c.kernels)


def test_padded_mm_gradients():
    a = torch.randn(6, 10, requires_grad=True)
    b = torch.randn(10, 13, requires_grad=True)
    c = compile_graph(lambda a, b: (a @ b).tanh(), [a, b], "cpp", force_shape_padding=True)
    out = c(a, b)
    ga, gb = torch.autograd.grad(out.pow(2).sum(), [a, b])
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ra, rb = torch.autograd.grad((a2 @ b2).tanh().pow(2).sum(), [a2, b2])
    torch.testing.assert_close(out, (a2 @ b2).tanh())
    torch.testing.assert_close(ga, ra)
    torch.testing.assert_close(gb, rb)
    assert any(padded(g) for g in c.compiled_graphs)


def test_transposed_operand_padded_in_its_own_order():
    """``x @ w.t()`` (a linear layer): the weight is padded along its rows, then transposed back."""
    x, w = torch.randn(6, 10), torch.randn(13, 10)
    c = compile_graph(lambda x, w: x @ w.t(), [x, w], "cpp", force_shape_padding=True)
    torch.testing.assert_close(c(x, w), x @ w.t())
    assert "(16, 12)" in c.source, c.source  # the padded weight, rows first
