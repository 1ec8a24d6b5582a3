"""``roll`` decomposed into slices joined by ``cat`` (tininductor/decompositions.py): no library
fallback left, values equal eager's."""
import pytest
import torch

from tininductor.testing import compile_graph


@pytest.mark.parametrize("shifts,dims", [((-3, -3), (1, 2)), ((3, 3), (1, 2)), (2, 0), (5, None), ((0, 7), (1, 2)),
                                         (-1, -1)])
def test_roll_matches_eager_without_a_fallback(shifts, dims):
    x = torch.randn(2, 7, 7, 3)

    def f(x):
        y = torch.roll(x, shifts, dims) if dims is not None else torch.roll(x, shifts)
        return y * 2

    compiled = compile_graph(f, [x], "cpp")
    torch.testing.assert_close(compiled(x), f(x))
    source = "\n".join(g.source for g in compiled.compiled_graphs)
    assert "aten.roll" not in source and "aten.cat" not in source, source


def test_roll_gradient_matches_eager():
    import tinydynamo

    x = torch.randn(2, 7, 7, 3, requires_grad=True)

    def f(x):
        return (torch.roll(x.sin(), (-3, 2), (1, 2)) * torch.arange(3.0)).sum()

    tinydynamo.reset()
    f(x).backward()
    expected, x.grad = x.grad, None
    tinydynamo.compile(f, backend="tininductor")(x).backward()
    torch.testing.assert_close(x.grad, expected)
