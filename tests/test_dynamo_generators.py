"""Generator objects made in the frame run lazily, as Python runs them: ``next`` / ``send`` / ``throw`` /
``close`` reach the suspended body, ``yield from`` delegates, an endless generator is fine, the body's
effects happen in Python's order, a generator freed at the frame's end is closed (its ``finally`` runs),
and one that a graph break would leave half-run makes the frame run eagerly (never a wrong value)."""
import collections
import warnings

import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def compiled(fn, fullgraph=True):
    tinydynamo.reset()
    cnt = CompileCounter()
    return tinydynamo.optimize(cnt, nopython=fullgraph)(fn), cnt


def check(fn, *args, graphs=1):
    """``fn`` compiled in one graph (fullgraph) equals eager, twice (the second call from the cache)."""
    expected = fn(*args)
    c, cnt = compiled(fn)
    for _ in range(2):
        torch.testing.assert_close(c(*args), expected)
    assert cnt.frame_count == graphs


def counting():
    i = 0
    while True:
        yield i
        i += 1


def test_endless_generator_advanced_with_next():
    def f(t):
        gen = counting()
        return t + next(gen) + next(gen) * 10 + next(gen) * 100

    check(f, torch.randn(3))


def echo():
    got = yield 1
    got = yield got * 2
    return got


def test_send_sets_the_value_of_the_suspended_yield():
    def f(t):
        g = echo()
        return t + next(g) + g.send(5)

    check(f, torch.randn(3))


def test_yield_from_delegates_send_and_evaluates_to_the_return_value():
    def outer():
        r = yield from echo()
        yield r + 100

    def f(t):
        g = outer()
        a = next(g)
        b = g.send(3)
        c = g.send(4)
        return t + a + b + c

    check(f, torch.randn(3))


def test_throw_is_raised_at_the_yield_and_caught_by_the_body():
    def body(t):
        try:
            yield t + 1
        except ValueError:
            yield t * 10

    def f(t):
        g = body(t)
        next(g)
        return g.throw(ValueError)

    check(f, torch.randn(3))


def test_stop_iteration_from_an_exhausted_generator_is_catchable():
    def two(t):
        yield t + 1

    def f(t):
        g = two(t)
        out = next(g)
        try:
            next(g)
        except StopIteration:
            out = out * 2
        return out

    check(f, torch.randn(3))


STATE = {"closed": 0}


def with_cleanup(t):
    try:
        yield t + 1
        yield t + 2
    finally:
        STATE["closed"] += 1


def test_close_and_freeing_run_the_finally_block():
    def closes(t):
        g = with_cleanup(t)
        y = next(g)
        g.close()
        return y

    def frees(t):  # the generator dies with the frame: CPython closes it then
        g = with_cleanup(t)
        return next(g) * 3

    for fn in (closes, frees):
        STATE["closed"] = 0
        expected = fn(torch.ones(2))
        assert STATE["closed"] == 1
        c, _ = compiled(fn)
        torch.testing.assert_close(c(torch.ones(2)), expected)
        assert STATE["closed"] == 2, fn.__name__


def pairs(t):
    yield 1, t + 1
    yield 2, t + 2


def test_containers_built_from_a_generator():
    def f(t):
        d = dict(pairs(t))
        return d[1] + d[2] + sum(v for _, v in pairs(t))

    check(f, torch.randn(3))


def test_extend_takes_a_generators_items_one_by_one():
    """The generator reads the container it extends: each item is added before the next is made."""
    def f(x):
        y = [1]
        y.extend(y[-1] + z for z in range(3))
        d = collections.deque([1])
        d.extendleft(d[0] + z for z in range(3))
        return x + sum(y) * 100 + sum(d)

    check(f, torch.ones(3))


def test_returned_generator_keeps_its_remaining_values():
    def body(t):
        yield t.sin()
        yield t.cos()
        yield t.tan()

    def f(t):
        g = body(t)
        first = next(g)
        return first, g

    t = torch.randn(3)
    c, _ = compiled(f)
    first, g = c(t)
    torch.testing.assert_close(first, t.sin())
    torch.testing.assert_close(list(g), [t.cos(), t.tan()])


def test_graph_break_inside_a_running_generator_runs_the_frame_eagerly():
    """The break happens halfway through the generator's body: it cannot be put back, so the frame
    runs eagerly (with a warning), and the values are eager's."""
    def body(t):
        yield t + 1
        print("", end="")  # a graph break inside the body
        yield t + 2

    def f(t):
        g = body(t)
        a = next(g)
        b = next(g)
        return a * b

    t = torch.randn(3)
    c, _ = compiled(f, fullgraph=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(c(t), f(t))
