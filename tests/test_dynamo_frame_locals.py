"""Builtins that read the calling frame: ``locals()`` / ``vars()`` are traced as a dict of the
frame's bound locals (run natively at a graph break they would see the generated code's locals and
silently answer differently); ``eval`` / ``exec`` without a namespace make the frame run natively;
a builtin called with arguments its signature rejects raises eager's TypeError."""
import pytest
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def reshape_back(x):
    if x.dim() > 2:
        batch_size, seq_len, hidden_dim = x.shape
        x = x.view(-1, hidden_dim)
    x = x + 1
    if "batch_size" in locals() and "seq_len" in vars():
        x = x.view(batch_size, seq_len, -1)
    return x


@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 4)])
def test_locals_and_vars_see_the_frames_locals(shape):
    x = torch.randn(shape)
    cnt = CompileCounter()
    out = tinydynamo.compile(reshape_back, backend=cnt, fullgraph=True)(x)
    torch.testing.assert_close(out, reshape_back(x))
    assert cnt.frame_count == 1


def eval_after_a_break(x):
    y = x + 1  # noqa: F841 - read by eval below
    print("", end="")
    return eval("y * 2") + 1


def test_eval_after_a_break_sees_every_local():
    x = torch.randn(3)
    torch.testing.assert_close(tinydynamo.compile(eval_after_a_break, backend="eager")(x), eval_after_a_break(x))


def isinstance_with_a_keyword(x):
    x = x.sin()
    if isinstance(x, torch.Tensor, invalid=True):
        x = x.sin()
    return x


def test_builtin_with_invalid_arguments_raises_as_eager():
    with pytest.raises(TypeError, match="keyword"):
        tinydynamo.compile(isinstance_with_a_keyword, backend="eager")(torch.randn(3))
