"""``config.mm_bias_epilogue`` (fx_passes/mm_bias.py): a linear layer's bias is added by the matmul's
library kernel (``addmm``) where only library kernels and graph outputs read the sum, and by the
consumer's generated kernel otherwise. Values against eager, on the C++ backend and the Triton
interpreter."""
import pytest
import torch
import torch.nn.functional as F

from tininductor.testing import compile_graph

BACKENDS = ["cpp", "triton"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def _calls(source: str, op: str) -> int:
    return sum(f"torch.{op}(" in line for line in source.splitlines())


@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_read_by_a_matmul_goes_into_addmm(backend):
    """Two linear layers in a row: the first sum is read (through a transpose) by the second
    matmul, the second sum is the output; both biases are added by addmm, no kernel is generated."""
    fn = lambda x, w1, b1, w2, b2: F.linear(F.linear(x, w1, b1).t(), w2, b2)  # noqa: E731
    args = [torch.randn(6, 4), torch.randn(8, 4), torch.randn(8), torch.randn(5, 6), torch.randn(5)]
    c = compile_graph(fn, args, backend)
    torch.testing.assert_close(c(*args), fn(*args))
    assert _calls(c.source, "addmm") == 2, c.source
    assert c.kernels == [], c.kernels


@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_read_by_a_generated_kernel_stays_fused(backend):
    """Under an activation the bias is part of the activation's kernel: mm, then one kernel."""
    fn = lambda x, w, b: torch.relu(F.linear(x, w, b))  # noqa: E731
    args = [torch.randn(6, 4), torch.randn(8, 4), torch.randn(8)]
    c = compile_graph(fn, args, backend)
    torch.testing.assert_close(c(*args), fn(*args))
    assert _calls(c.source, "addmm") == 0 and _calls(c.source, "mm") == 1, c.source
    assert len(c.kernels) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_off_switch(backend):
    fn = lambda x, w, b: F.linear(x, w, b)  # noqa: E731
    args = [torch.randn(6, 4), torch.randn(8, 4), torch.randn(8)]
    c = compile_graph(fn, args, backend, mm_bias_epilogue=False)
    torch.testing.assert_close(c(*args), fn(*args))
    assert _calls(c.source, "addmm") == 0 and len(c.kernels) == 1, c.source
