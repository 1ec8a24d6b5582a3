"""Constant folding of the parts of a graph that read no input (fx_passes/constant_folding.py)."""
import torch

import tinydynamo
from tininductor import config
from tininductor.compile_fx import compiled_graphs


def shifted_window_mask(x):
    """Swin Transformer's attention mask: stores into ``new_zeros``, sizes from the input's shape."""
    h, w = x.shape[-2:]
    mask = x.new_zeros((h, w))
    count = 0
    for hs in (slice(0, -2), slice(-2, -1), slice(-1, None)):
        for ws in (slice(0, -2), slice(-2, -1), slice(-1, None)):
            mask[hs, ws] = count
            count += 1
    mask = mask.view(1, h * w) - mask.view(h * w, 1)
    mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
    return x.flatten(-2).unsqueeze(-1) + mask


def _compile_and_run(fn, *args):
    tinydynamo.reset()
    compiled_graphs.clear()
    out = tinydynamo.compile(fn, backend="tininductor")(*args)
    return out, "\n".join(g.source for g in compiled_graphs)


def test_mask_from_stores_is_folded_and_matches_eager():
    x = torch.randn(2, 6, 6)
    out, source = _compile_and_run(shifted_window_mask, x)
    torch.testing.assert_close(out, shifted_window_mask(x))
    assert "slice_scatter" not in source and "fill" not in source, source
    assert "_folded_constant" in source


def test_folding_off_keeps_the_stores():
    x = torch.randn(2, 6, 6)
    with config.patch({"constant_folding": False}):
        out, source = _compile_and_run(shifted_window_mask, x)
    torch.testing.assert_close(out, shifted_window_mask(x))
    assert "_folded_constant" not in source


def test_parameters_are_not_folded():
    """A parameter is a graph input: changing it later changes the compiled result."""
    lin = torch.nn.Linear(4, 4)
    table = torch.arange(4.0)

    def f(x):
        return lin(x) + (table * 2).exp()

    x = torch.randn(3, 4)
    tinydynamo.reset()
    compiled = tinydynamo.compile(f, backend="tininductor")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), f(x))
        lin.weight.add_(1.0)
        torch.testing.assert_close(compiled(x), f(x))


def test_random_ops_are_not_folded():
    def f(x):
        return x + torch.rand(4, 4).mul(2)

    x = torch.zeros(4, 4)
    out, _ = _compile_and_run(f, x)
    tinydynamo.reset()
    compiled = tinydynamo.compile(f, backend="tininductor")
    a, b = compiled(x), compiled(x)
    assert not torch.equal(a, b)
    assert out.shape == (4, 4)
