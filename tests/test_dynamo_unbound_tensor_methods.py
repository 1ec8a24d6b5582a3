"""``torch.Tensor.method(t, ...)``, the unbound method called with a tensor first, is traced as
``t.method(...)`` (in-place ones included), so it stays in the graph as eager's bound call does."""
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def unbound_calls(x, y):
    torch.Tensor.abs_(x)
    return torch.Tensor.add(x, y, alpha=2), torch.Tensor.sum(x, dim=0)


def test_unbound_tensor_methods_are_graph_ops():
    x, y = torch.randn(3), torch.randn(3)
    x_eager = x.clone()
    cnt = CompileCounter()
    out = tinydynamo.compile(unbound_calls, backend=cnt, fullgraph=True)(x, y)
    ref = unbound_calls(x_eager, y)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(x, x_eager)  # the in-place abs_ reached the input
    assert cnt.frame_count == 1 and cnt.op_count == 3
