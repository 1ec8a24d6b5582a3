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


def keyword_rich(x, a=2, *rest, k, m=3, **kw):
    return x


def positional_only(x, y, /, z=1):
    return x


@pytest.mark.parametrize("fn, args, kwargs", [
    (keyword_rich, (1,), {"k": 2}), (keyword_rich, (1, 2, 3, 4), {"k": 1, "q": 2}), (keyword_rich, (1,), {}),
    (keyword_rich, (), {"x": 1, "k": 1}), (positional_only, (1, 2), {}), (positional_only, (1,), {"y": 2}),
    (positional_only, (1, 2, 3), {}), (positional_only, (1, 2), {"z": 5}), (positional_only, (1, 2, 3, 4), {}),
])
def test_a_frames_arguments_bind_as_python_binds_them(fn, args, kwargs):
    """The frame's locals L are the call's arguments bound as CPython binds them: defaults filled
    in, extra ones in *args/**kwargs, in parameter order; a call Python rejects raises its TypeError."""
    import inspect

    from tinydynamo.eval_frame import OptimizedFunction

    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        with pytest.raises(TypeError, match=fn.__name__):
            OptimizedFunction(fn, "eager")._bind(args, kwargs)
        return
    bound.apply_defaults()
    got = OptimizedFunction(fn, "eager")._bind(args, kwargs)
    assert list(got.items()) == list(bound.arguments.items())


def scaled(x, factor=2.0):
    return x * factor


def test_the_current_defaults_are_bound():
    """Defaults rebound after the first call (or changed in place, for keyword-only ones) are what
    the next call binds, and the guards on them recompile."""
    x = torch.randn(3)
    compiled = tinydynamo.compile(scaled, backend="eager")
    torch.testing.assert_close(compiled(x), x * 2)
    saved = scaled.__defaults__
    try:
        scaled.__defaults__ = (5.0,)
        torch.testing.assert_close(compiled(x), x * 5)
    finally:
        scaled.__defaults__ = saved
    torch.testing.assert_close(compiled(x), x * 2)


def test_a_comprehensions_frame_binds_its_iterator():
    """A comprehension's own code object (Python 3.11) takes its iterator as ``.0``: not a name a
    ``def`` can have, so the binder calls it something else and keeps ``.0`` in the locals."""
    import types

    from tinydynamo.eval_frame import argument_binder

    code = next(c for c in compile("[v * 2 for v in values]", "<comprehension>", "eval").co_consts
                if isinstance(c, types.CodeType))
    if not code.co_varnames or code.co_varnames[0] != ".0":
        pytest.skip("comprehensions are inlined into their function (Python 3.12+)")
    it = iter([1, 2])
    assert argument_binder(types.FunctionType(code, {}))(it) == {".0": it}
