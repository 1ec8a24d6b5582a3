"""Statements and everyday Python in traced code: user context managers, try blocks that do
not raise, generators, assert, enums, dict comprehensions and **kwargs, hasattr/getattr on new objects,
class attribute stores, type(x).__name__, list.sort(key=), str.format / %, zip(*...), star unpacking,
slicing, local @torch.no_grad() functions, getattr(self, name), while loops, walrus, chained comparisons.
Each matches eager and compiles into as many graphs as torch.compile (backend "eager")."""
import contextlib
import enum
import operator

import pytest
import torch
from torch import nn

from tests.dynamo_compare import compare


class Ctx:
    def __init__(self): self.entered = 0
    def __enter__(self): self.entered += 1; return self
    def __exit__(self, *a): return False

def user_ctx_manager(x):
    with Ctx() as c:
        y = x * 2
    return y + c.entered

@contextlib.contextmanager
def cm():
    yield 3

def contextlib_cm(x):
    with cm() as v:
        y = x * v
    return y

def try_except(x):
    try:
        y = x * 2
    except ValueError:
        y = x
    return y + 1

def try_finally(x):
    try:
        y = x * 2
    finally:
        z = 1
    return y + z

def gen(x):
    for i in range(3):
        yield x * i

def generator_fn(x):
    return sum(gen(x)) + sum(list(gen(x)))

def assert_stmt(x):
    assert x.dim() == 2, "2d"
    return x + 1

class Color(enum.Enum):
    R = 1
    G = 2

def enums(x):
    c = Color.R
    return x * c.value + (c == Color.R) + (c is Color.G) + (Color(2) is Color.G)

def dict_stuff(x):
    d = {"a": x, "b": x * 2}
    e = {k: v + 1 for k, v in d.items()}
    tot = sum(v.sum() for v in e.values())
    def kw(**k): return k["a"] * 2
    return kw(**d) + tot + len(d) + d.get("zz", 3)

class Obj:
    cnt = 0
    def __init__(self): self.a = 1

def hasattr_getattr_new(x):
    o = Obj()
    return x * (hasattr(o, "a") + hasattr(o, "b") + getattr(o, "zz", 5) + getattr(o, "a"))

def class_attr_counter(x):
    Obj.cnt += 1
    return x * 2

def type_name(x):
    return x * len(type(x).__name__) + len(x.__class__.__name__)

def list_sort(x):
    l = [3, 1, 2]
    l.sort()
    l.sort(key=lambda v: -v)
    return x * l[0]

def str_format(x):
    s = "{}-{:.2f}".format("a", 1.5) + "%d" % 3
    return x * len(s)

def zip_star(x):
    pairs = [(x, 1), (x * 2, 2)]
    a, b = zip(*pairs)
    return sum(a) * sum(b)

def shape_unpack(x):
    b, n = x.shape
    *rest, last = x.size()
    return x.view(b * n) * last + len(rest)

def slicing(x):
    l = list(range(10))
    l[2:4] = [0]
    return x * sum(l[::2]) + x[..., 1:3].sum() + x[None, :, ::2].sum()

def nograd_decorated(x):
    @torch.no_grad()
    def g(t): return t * 2
    return g(x) + 1

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(5, 5)
    def forward(self, x):
        name = "l"
        return getattr(self, name)(x) + self.training

m = M()
def getattr_module(x):
    return m(x)

def while_loop(x):
    i = 0
    while i < 3:
        x = x + i
        i += 1
    return x

def walrus_ternary(x):
    y = (n := 3) * x if x.dim() > 1 else x
    return y + n

def str_isinstance(x):
    v = "abc"
    return x * isinstance(v, str) + isinstance(3, (int, float)) + callable(len)

def chained_cmp(x):
    a = 3
    return x * (1 < a < 5) + (x.shape[0] in (4, 5))

def torch_dtype_stuff(x):
    return x.to(torch.float64).to(x.dtype) * torch.tensor(2.0, dtype=x.dtype) + torch.get_default_dtype().is_floating_point

def partial_method(x):
    import functools
    f = functools.partial(x.add, other=1)
    return f() * 2

def any_all_tensors(x):
    xs = [x, x]
    return torch.stack(xs).sum() + all(t.shape == x.shape for t in xs)

def nested_tuple_return(x):
    return {"a": (x, [x + 1, {"b": x * 2}])}["a"][1][1]["b"]

def del_local(x):
    y = x * 2
    del y
    y = x + 1
    return y


CASES = [
    (user_ctx_manager, 1, 1),
    (contextlib_cm, 1, 1),
    (try_except, 1, 1),
    (try_finally, 1, 1),
    (generator_fn, 1, 1),
    (assert_stmt, 1, 1),
    (enums, 1, 1),
    (dict_stuff, 1, 1),
    (hasattr_getattr_new, 1, 1),
    (class_attr_counter, 2, 2),
    (type_name, 1, 1),
    (list_sort, 1, 1),
    (str_format, 1, 1),
    (zip_star, 1, 1),
    (shape_unpack, 1, 1),
    (slicing, 1, 1),
    (nograd_decorated, 1, 1),
    (getattr_module, 1, 1),
    (while_loop, 1, 1),
    (walrus_ternary, 1, 1),
    (str_isinstance, 1, 1),
    (chained_cmp, 1, 1),
    (torch_dtype_stuff, 1, 1),
    (partial_method, 1, 1),
    (any_all_tensors, 1, 1),
    (nested_tuple_return, 1, 1),
    (del_local, 1, 1),
]


@pytest.mark.parametrize("fn,tiny,torch_graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_statement_construct(fn, tiny, torch_graphs):
    assert compare(fn, torch.randn(4, 5)) == (tiny, torch_graphs)


@contextlib.contextmanager
def logged(log):
    log.append("enter")
    yield 2
    log.append("exit")


def uses_logged(x, log):
    with logged(log) as k:
        y = x * k
        log.append("body")
    return y + len(log)


def test_contextmanager_generator_runs_its_halves_in_order():
    import tinydynamo
    from tinydynamo.testing import CompileCounter

    tinydynamo.reset()
    cnt = CompileCounter()
    f = tinydynamo.optimize(cnt, nopython=True)(uses_logged)
    log = []
    torch.testing.assert_close(f(torch.ones(2), log), torch.full((2,), 5.0))
    assert log == ["enter", "body", "exit"] and cnt.frame_count == 1


TAPE = []


def test_loop_over_a_list_that_changes_reads_it_live():
    """Python's list iterators read the list at each step: ``for x in lst`` sees an append made in
    the loop, ``reversed(lst)`` walks down from where it began and stops once past the end (a
    gradient tape iterated in reverse while the backward records more entries)."""
    import tinydynamo
    from tinydynamo.testing import CompileCounter

    def f(x):
        TAPE.clear()
        TAPE.extend([1, 2, 3])
        out = x
        for t in reversed(TAPE):
            if t > 1:
                TAPE.append(t * 10)
            out = out * t
        lst = [1, 2]
        for v in lst:
            if v < 4:
                lst.append(v + 2)
            out = out + v
        shrink = [1, 2, 3, 4]
        for v in reversed(shrink):
            shrink.pop()
            if len(shrink) > 2:
                shrink.pop()
            out = out - v
        return out, list(TAPE), lst

    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(f)
    x = torch.ones(2)
    expected = f(x)
    for _ in range(2):
        out, tape, lst = g(x)
        assert torch.equal(out, expected[0]) and (tape, lst) == expected[1:] == ([1, 2, 3, 30, 20], [1, 2, 3, 4, 5])
    assert cnt.frame_count == 1


def test_enumerate_over_a_list_yields_index_pairs_and_reads_it_live():
    """``enumerate(lst)`` yields ``(i, lst[i])`` pairs read at each step: its elements unpack as pairs
    (tuples inside included), and an append made in the loop is seen, as in Python."""
    import tinydynamo
    from tinydynamo.testing import CompileCounter

    def f(x, y):
        d = {"b": y, "a": x}
        out = x
        for i, (k, v) in enumerate(sorted(d.items())):
            out = out + v * (i + 1)
        grow = [1, 2]
        for i, v in enumerate(grow, start=10):
            if len(grow) < 4:
                grow.append(v + i)
            out = out * v
        return out, grow

    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(f)
    x, y = torch.randn(3), torch.randn(3)
    want, got = f(x, y), g(x, y)
    assert torch.allclose(got[0], want[0]) and got[1] == want[1] == [1, 2, 11, 13]
    assert cnt.frame_count == 1


# ---- `is` between containers: one object reached two ways, or two objects equal by value ----------------
TABLE_A, TABLE_B, ITEMS = {"k": 1}, {"k": 1}, [1, 2]


def container_identity(x, d, items):
    mine = [1, 2]
    return (x + (d is TABLE_A) + 2 * (d is not TABLE_B) + 4 * (items is ITEMS) + 8 * (mine is ITEMS)
            + 16 * (mine is mine) + 32 * (d is d) + 64 * (operator.is_(items, ITEMS)))


@pytest.mark.parametrize("args", ["same_objects", "equal_copies"])
def test_is_between_containers_is_identity_not_equality(args):
    """A dict or list is ``is`` another only if it is that object: their values (equal here) do not
    decide. Each case compiles one graph, guarded to the objects' identity."""
    d, items = (TABLE_A, ITEMS) if args == "same_objects" else (dict(TABLE_A), list(ITEMS))
    assert compare(container_identity, torch.zeros(2), d, items) == (1, 1)
