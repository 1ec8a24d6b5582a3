"""Families of Python that PyTorch's own dynamo tests (test_repros, test_generator) exercise: each
matches eager, and compiles into as many graphs (and ops) as torch.compile does.

PYTEST_DONT_REWRITE: the `assert` statements below must compile as Python compiles them."""
import pytest
import torch

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter


# ---- `assert <tensor>, "message"`: a run-time check in the graph, not a graph break -------------------
def assert_tensor_with_msg(x):
    b = x.sin()
    assert x[0] == 3, "first element must be 3"
    return x.cos() + b


def assert_tensor_without_msg(x):
    b = x.sin()
    assert x[0] == 3
    return x.cos() + b


@pytest.mark.parametrize("fn", [assert_tensor_with_msg, assert_tensor_without_msg])
def test_assert_on_a_tensor_is_checked_in_the_graph(fn):
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(fn)
    x = torch.tensor([3.0, 4.0, 5.0])
    torch.testing.assert_close(g(x), fn(x))
    assert (cnt.frame_count, cnt.op_count) == (1, 6)  # sin, getitem, eq, _assert_async, cos, add: as torch
    with pytest.raises(RuntimeError, match="first element must be 3" if fn is assert_tensor_with_msg else "assertion"):
        g(torch.tensor([5.0, 6.0, 7.0]))  # the same graph (no recompile): the check runs in it


def assert_tensor_computed_msg(x):
    assert x[0] == 3, f"got {x[0]}"  # a message built at run time: a graph break, as torch.compile
    return x.cos()


def test_assert_with_a_computed_message_breaks_the_graph():
    assert compare(assert_tensor_computed_msg, torch.tensor([3.0, 4.0])) == (2, 2)


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
def test_assert_on_a_tensor_survives_autograd_and_codegen(backend):
    """The check has no result: the AOT partitioner keeps it in the forward, tininductor calls it."""
    tinydynamo.reset()
    g = tinydynamo.compile(assert_tensor_with_msg, backend=backend)
    x = torch.tensor([3.0, 4.0, 5.0], requires_grad=True)
    torch.testing.assert_close(g(x), assert_tensor_with_msg(x))
    with pytest.raises(RuntimeError, match="first element must be 3"):
        g(torch.tensor([5.0, 6.0, 7.0], requires_grad=True))


# ---- Python's own exceptions, raised by traced code as eager raises them -------------------------------
def iterate_a_number(x, n):
    try:
        for i in n:
            x = x + i
    except TypeError as e:
        return x - 1, str(e)
    return x, ""


def test_iterating_over_a_number_raises_typeerror_in_traced_code():
    x = torch.randn(3)
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(iterate_a_number)
    got, want = g(x, 3), iterate_a_number(x, 3)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == "'int' object is not iterable" and cnt.frame_count == 1


def double():
    x = yield
    yield x * 2


def send_past_the_end(t):
    gen = double()
    next(gen)
    a = gen.send(t)
    b = gen.send(t)  # StopIteration
    return a + b


def test_an_uncaught_exception_escaping_a_generator_is_eagers_or_unsupported_under_fullgraph():
    t = torch.randn(2)
    tinydynamo.reset()
    with pytest.raises(StopIteration):
        tinydynamo.optimize("eager")(send_past_the_end)(t)
    tinydynamo.reset()
    with pytest.raises(tinydynamo.exc.Unsupported, match="Observed exception: StopIteration"):
        tinydynamo.optimize("eager", nopython=True)(send_past_the_end)(t)
