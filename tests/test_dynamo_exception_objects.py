"""Exception objects built in traced code (``ValueError("msg")``, ``KeyError(k)``, a subclass with no
``__init__`` of its own) are raised and caught in the graph, with their arguments: ``e.args``, a bare
``raise`` re-raising the exception being handled, ``raise ... from None``, ``StopIteration.value``
carrying a generator's return value. Each compiles into one graph (fullgraph) and matches eager."""
import pytest
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def raises_not_implemented():
    raise NotImplementedError("foo")


def caught_from_a_callee(x):
    x = torch.cos(x)
    try:
        x = torch.sin(x)
        raises_not_implemented()
        x = x * 100
    except Exception:
        x = torch.sigmoid(x)
    return x


class Mapping:
    def __init__(self, d):
        self._d = d

    def __getitem__(self, key):
        try:
            return self._d[key]
        except KeyError:
            raise KeyError(key) from None


def raise_from_none(x):
    try:
        return x + Mapping({"a": 1})["m"]
    except KeyError as e:
        return x - len(e.args) * 10


def bare_reraise(x):
    try:
        try:
            raise ValueError("a", 3)
        except ValueError:
            x = x + 1
            raise
    except ValueError as e:
        return x * e.args[1]


def returns_five():
    yield 1
    return 5


def stop_iteration_value(x):
    it = returns_five()
    next(it)
    try:
        next(it)
    except StopIteration as e:
        return x + e.value
    return x


class MyError(Exception):
    pass


def user_subclass(x):
    try:
        raise MyError("boom")
    except MyError as e:
        return x + len(e.args[0])


def folded_error_caught(x, n: int):
    try:
        x = x + 1 / n  # a Python error at trace time (n == 0) is the traced code's own
    except ZeroDivisionError:
        x = x - 1
    try:
        x = x + {"a": 1}["b"]
    except KeyError:
        x = x * 2
    try:
        x = x + [1][1]
    except IndexError as e:
        x = x * len(e.args)
    return x


def context_chain(x):
    try:
        try:
            [][1]
        except IndexError:
            try:
                raise KeyError("k")
            except KeyError as e:  # raised while IndexError was handled: that is its __context__
                assert isinstance(e.__context__, IndexError) and e.__cause__ is None
                x = x + 1
            raise  # re-raises IndexError, whose own __context__ is None
    except IndexError as e:
        assert e.__context__ is None
        return x * 2


@pytest.mark.parametrize("fn", [caught_from_a_callee, raise_from_none, bare_reraise, stop_iteration_value,
                                user_subclass, folded_error_caught, context_chain])
def test_exception_objects_in_one_graph(fn):
    args = (torch.randn(3), 0) if fn is folded_error_caught else (torch.randn(3),)
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt, nopython=True)(fn)
    for _ in range(2):
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert cnt.frame_count == 1


def test_an_exception_that_escapes_still_runs_eagerly():
    def f(x):
        raise ValueError(x.shape[0])

    compiled = tinydynamo.optimize("eager")(f)
    with pytest.raises(ValueError, match="3"):
        compiled(torch.randn(3))
