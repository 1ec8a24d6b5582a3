"""What tinydynamo cannot capture yet: a precise reason, eager fallback, or an error with nopython."""
import threading

import pytest
import torch

import tinydynamo
from tinydynamo.exc import Unsupported
from tinydynamo.testing import CompileCounter


def data_dependent(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def calls_print(x):
    y = x * 2
    print("hello from traced code")
    return y


def calls_item(x):
    return x * x.sum().item()


def in_try(x):
    try:
        return x * x.sum().item()
    except ValueError:
        return x


CTX = threading.Lock()  # a context manager written in C: its __enter__/__exit__ cannot be inlined


def in_with(x):  # grad-mode and Python-defined `with` blocks are captured (test_dynamo_ctx_managers.py,
    with CTX:    # test_dynamo_statements.py); C ones are not
        return x + 1


@pytest.mark.parametrize("fn,reason", [
    (in_try, "Tensor.item()"),
    (in_with, "`with` blocks"),
])
def test_unresumable_frames_run_eagerly_and_record_reason(fn, reason):
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt)(fn)
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(g(x), fn(x))
    assert cnt.frame_count == 0
    assert any(reason in r for r in tinydynamo.counters["unsupported"]), dict(tinydynamo.counters["unsupported"])
    out = tinydynamo.explain(fn)(torch.randn(4))
    assert any(reason in why for _, why in out.eager_frames) and "Frames run eagerly" in str(out)


def test_nopython_raises_with_reason_and_user_line():
    tinydynamo.reset()
    g = tinydynamo.optimize("eager", nopython=True)(data_dependent)
    with pytest.raises(Unsupported) as info:
        g(torch.randn(3))
    text = str(info.value)
    assert "data-dependent branch" in text
    assert "if x.sum() > 0:" in text and "test_dynamo_unsupported.py" in text
    assert "torch.where" in text  # the hint


def test_fullgraph_reports_innermost_and_outer_lines():
    def outer(x):
        return calls_item(x) + 1

    tinydynamo.reset()
    with pytest.raises(Unsupported) as info:
        tinydynamo.compile(outer, backend="eager", fullgraph=True)(torch.randn(2))
    text = str(info.value)
    assert text.index("return calls_item(x) + 1") < text.index("return x * x.sum().item()")


def test_disable():
    @tinydynamo.disable
    def opaque(t):
        return t + 1

    def f(x):
        return opaque(x) * 2

    tinydynamo.reset()
    assert opaque(torch.ones(1)).item() == 2.0
    with pytest.raises(Unsupported, match="tinydynamo.disable"):
        tinydynamo.optimize("eager", nopython=True)(f)(torch.ones(1))


def test_internal_errors_fall_back_with_warning_unless_suppress_errors_false():
    def bad_backend(gm, example_inputs):
        raise RuntimeError("backend exploded")

    def f(x):
        return x + 1

    tinydynamo.reset()
    g = tinydynamo.optimize(bad_backend)(f)
    with pytest.warns(UserWarning, match="backend exploded"):
        assert torch.equal(g(torch.zeros(2)), torch.ones(2))
    tinydynamo.reset()
    with tinydynamo.config.patch(suppress_errors=False), pytest.raises(RuntimeError, match="backend exploded"):
        tinydynamo.optimize(bad_backend)(f)(torch.zeros(2))


def test_side_effects_on_inputs_are_unsupported_not_lost():
    def f(x, xs):
        xs.append(x)
        return x + 1

    tinydynamo.reset()
    xs = []
    g = tinydynamo.optimize("eager")(f)
    g(torch.ones(1), xs)
    assert len(xs) == 1  # replayed after the graph: the append happened exactly once
