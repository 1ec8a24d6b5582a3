"""Closures in traced code (issue 15): nested functions made and returned, nonlocal writes (in the
frame and to cells from outside), lambdas, decorators, and graph breaks in frames with cells and free
variables (resume functions take the frame's cells as their closure). Each matches eager and
compiles into as many graphs as torch.compile (backend "eager")."""
import functools

import pytest
import torch

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter


def nested_call(x):
    def inner(y):
        return y * x

    return inner(2)


def made_and_returned(x):
    def mk(s):
        def f(y):
            return y * s

        return f

    return mk(3)(x) + mk(4)(x)


def nonlocal_in_frame(x):
    n = 0

    def inc():
        nonlocal n
        n += 1

    inc()
    inc()
    return x * n


def lambdas(x):
    fs = [lambda t, k=k: t * k for k in range(3)]
    return sum(f(x) for f in fs) + (lambda: x.sum())()


def deco(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1

    return wrapper


@deco
def decorated(x):
    return x * 2


def calls_decorated(x):
    return decorated(x) + deco(lambda t: t * 3)(x)


def break_with_cell(x):
    k = 2

    def f(y):
        return y * k

    y = f(x)
    print("", end="")
    return f(y) + k


def break_in_loop_with_cell(x):
    scale = 3

    def f(y):
        return y * scale

    for _ in range(2):
        x = f(x)
        if x.sum() > 0:
            x = x - 1
    return x


def make_free_var_fn():
    s = torch.ones(1)

    def inner(x):
        z = x * s
        print("", end="")
        return z + s

    return inner


free_var_break = make_free_var_fn()


def returns_closure(x):
    k = x.shape[0]

    def g(y):
        return y * k

    return g


CASES = [
    (nested_call, 1, 1), (made_and_returned, 1, 1), (nonlocal_in_frame, 1, 1), (lambdas, 1, 1),
    (calls_decorated, 1, 1), (break_with_cell, 2, 2), (free_var_break, 2, 2),
]


@pytest.mark.parametrize("fn,tiny,torch_graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_closure_construct(fn, tiny, torch_graphs):
    assert compare(fn, torch.randn(4, 5)) == (tiny, torch_graphs)


def test_break_in_a_loop_with_a_cell():
    # torch.compile (2.13) runs a frame that breaks inside a loop mostly eagerly (1 graph); tiny resumes
    assert compare(break_in_loop_with_cell, torch.ones(3)) == (3, 1)


def test_returned_closure_is_a_real_function_sharing_its_cell():
    tinydynamo.reset()
    g = tinydynamo.optimize(CompileCounter(), nopython=True)(returns_closure)(torch.randn(3, 2))
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 3.0))
    assert g.__closure__[0].cell_contents == 3


def test_nonlocal_write_to_an_outside_cell_is_replayed():
    def make_counter():
        n = 0

        def inc(x):
            nonlocal n
            n += 1
            return x * n

        return inc, lambda: n

    inc, read = make_counter()
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt, nopython=True)(inc)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), x * 1)
    torch.testing.assert_close(compiled(x), x * 2)
    assert read() == 2 and cnt.frame_count == 2  # n is guarded as a constant: each value recompiles


def test_cells_are_shared_after_a_break():
    def f(x):
        n = 1

        def bump():
            nonlocal n
            n += 1

        bump()
        print("", end="")  # break: bump and n cross it; bump() after it must change the same n
        bump()
        return x * n

    tinydynamo.reset()
    cnt = CompileCounter()
    torch.testing.assert_close(tinydynamo.optimize(cnt)(f)(torch.ones(2)), torch.full((2,), 3.0))


def test_decorator_made_in_the_frame_keeps_wraps_metadata():
    def f(x):
        def named(t):
            """doc"""
            return t * 2

        return deco(named), x + 1

    tinydynamo.reset()
    g, _ = tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.ones(2))
    assert g.__name__ == "named" and g.__doc__ == "doc" and g.__wrapped__.__name__ == "named"
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 3.0))


def test_wrapped_of_a_decorator_made_in_the_frame_is_read_in_the_graph():
    """``functools.wraps`` in the frame sets ``__wrapped__``; reading it back calls the inner function."""
    def f(x):
        def inner(y):
            return y + 1

        @functools.wraps(inner)
        def wrapper(y):
            return inner(y) * 2

        return wrapper.__wrapped__(x) + wrapper(x)

    tinydynamo.reset()
    cnt = CompileCounter()
    torch.testing.assert_close(tinydynamo.optimize(cnt, nopython=True)(f)(torch.ones(2)), f(torch.ones(2)))
    assert cnt.frame_count == 1
