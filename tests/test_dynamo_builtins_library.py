"""Builtins and library code in traced code: f-strings, sets, sequence arithmetic,
min/max/sum/sorted/map/filter/zip/enumerate, functools, itertools, collections, operator, math,
copy, dataclasses.fields, inspect.signature, string methods, id(), numpy scalars, torch.finfo/iinfo/
device/Size, tensor.new_*, Tensor.grad, imports, record_function. Each matches eager, and compiles
into as many graphs as torch.compile (backend "eager")."""
import collections
import copy
import functools
import inspect
import itertools
import math
import operator
import unittest
import warnings

import numpy as np
import pytest
import torch

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter


def fstrings(x):
    n, name = x.shape[0], "w"
    s = f"{name}{n}_{3.5:.1f}_{name!r}_{n:>4}_{x.dtype}"
    return x * len(s) + (s == "w4_3.5_'w'_   4_torch.float32")


def sets(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    f = frozenset([1, 2])
    u = {k * 2 for k in s}
    return x * len(s | f) + (2 in s) + len(u - {4}) + sum(sorted(s & {2, 3, 9})) + len(set([x.shape[0], 4]))


def sequence_arithmetic(x):
    t = (1, 2) + (3,)
    lst = [1] * 3 + [2]
    xs = [x] * 2 + [x + 1]
    return x * sum(t) + len(lst) + sum(xs) + t.index(2) + lst.count(1)


def iteration_builtins(x):
    xs = [x, x * 2, x * 3]
    a = sum(xs)
    b = [t for t in reversed(xs)]
    c = list(filter(lambda t: True, xs)) + list(filter(None, [0, 1, 2]))
    d = sorted([3, 1, 2], key=lambda v: -v)
    e = max([1, 5, 3]) + min(4, 2) + max(xs[:1], key=lambda t: 1)[0].shape[0]
    f = any([False, True]) + all(v > 0 for v in [1, 2])
    for i, (p, q) in enumerate(zip(xs, b), start=1):
        a = a + p * q * i
    m = list(map(lambda p, q: p - q, xs, b))
    return a + len(c) + d[0] + e + f + m[0]


def functools_calls(x):
    p = functools.partial(torch.add, alpha=2)
    r = functools.reduce(operator.add, [x, x, x])
    r2 = functools.reduce(lambda acc, v: acc * v, [1, 2, 3], 10)
    return p(x, r) + r2 + p.keywords["alpha"]


def itertools_calls(x):
    a = list(itertools.chain([x], [x * 2]))
    b = list(itertools.islice(itertools.count(), 3))
    c = list(itertools.product([1, 2], [3]))
    d = list(itertools.accumulate([1, 2, 3]))
    e = list(itertools.repeat(x, 2))
    z = [i * t for i, t in zip(itertools.count(1), [x, x])]
    pairs = list(itertools.pairwise([1, 2, 3]))
    return sum(a) + sum(b) + len(c) + d[-1] + sum(e) + sum(z) + len(pairs) + sum(itertools.chain.from_iterable([[1], [2]]))


def collections_calls(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["a"].append(1)
    o = collections.OrderedDict()
    o["k"] = x * 2
    o["j"] = 1
    o.move_to_end("k")
    q = collections.deque([1, 2])
    q.append(3)
    q.appendleft(0)
    q.popleft()
    P = collections.namedtuple("P", "u v")
    return d["a"][0] + o["k"] + len(q) + q[0] + list(o)[-1].__len__() + P(1, 2).v


def operator_math(x):
    g = operator.itemgetter(1)
    a = operator.attrgetter("shape")
    return (operator.mul(x, 2) + math.sqrt(4) + math.pi + g([1, 2]) + a(x)[0] + math.gcd(6, 4)
            + operator.methodcaller("sum")(x) + math.floor(2.5) + math.prod([2, 3]))


def copies(x):
    lst = [x, 1]
    l2 = copy.copy(lst)
    d = copy.deepcopy({"a": 1, "b": [2, 3]})
    l2.append(2)
    d["b"].append(4)
    return l2[0] * d["a"] + len(lst) + len(d["b"])


def sig(a, b=2, *rest, c, **kw):
    pass


def inspect_signature(x):
    s = inspect.signature(sig)
    names = list(s.parameters)
    return x * len(names) + (s.parameters["b"].default == 2) + ("c" in s.parameters)


def string_methods(x):
    s = "a,b,c".split(",")
    t = "-".join(s).upper()
    return x * len(t) + ("A" in t) + "abc".startswith("a") + len("  q ".strip()) + "x{}".format(3).count("3")


def ids(x):
    return x * (id(torch) == id(torch)) + (id(ids) != 0)


def torch_constants(x):
    fi, ii = torch.finfo(torch.float32), torch.iinfo(torch.int8)
    d, s = torch.device("cpu"), torch.Size([2, 3])
    return x * fi.eps + ii.max + s[1] + s.numel() + (d.type == "cpu") + (x.device == d) + torch.finfo(x.dtype).max * 0


def tensor_new(x):
    return x.new_zeros(3).sum() + x.new_ones((2,)).sum() + x.new_full((2,), 3.0).sum() + x.new_empty(2).shape[0] + x.new_tensor([1.0, 2.0]).sum()


def imports_inside(x):
    import math as m

    import torch.nn.functional
    from torch.nn import functional as F
    return F.relu(x) * m.e + torch.nn.functional.gelu(x)


def record_function_block(x):
    with torch.profiler.record_function("block"):
        y = x * 2
    return y + 1


def numpy_scalars(x):
    return x * np.float32(2.0) + np.int64(3)


def grad_read(x):
    return x * 2 if x.grad is None else x * x.grad


CASES = [
    (fstrings, 1, 1), (sets, 1, 1), (sequence_arithmetic, 1, 1), (iteration_builtins, 1, 2),
    (functools_calls, 1, 1), (itertools_calls, 1, 1), (collections_calls, 1, 1), (operator_math, 1, 1),
    (copies, 1, 1), (inspect_signature, 1, 1), (string_methods, 1, 1), (ids, 1, 1), (torch_constants, 1, 1),
    (tensor_new, 1, 1), (imports_inside, 1, 1), (record_function_block, 1, 1), (numpy_scalars, 1, 1),
]


@pytest.mark.parametrize("fn,tiny,torch_graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_builtin_or_library_construct(fn, tiny, torch_graphs):
    assert compare(fn, torch.randn(4, 5)) == (tiny, torch_graphs)


def test_tensor_grad_reads_are_guarded():
    x = torch.randn(3, requires_grad=True)
    assert compare(grad_read, x) == (1, 1)
    tinydynamo.reset()
    cnt = CompileCounter()
    f = tinydynamo.optimize(cnt, nopython=True)(grad_read)
    torch.testing.assert_close(f(x), x * 2)
    x.grad = torch.full((3,), 3.0)
    torch.testing.assert_close(f(x), x * 3)  # .grad appeared: the None guard failed, recompiled
    assert cnt.frame_count == 2


def test_formatting_a_tensor_is_a_clean_break():
    def f(x):
        s = f"{x}"
        return x * len(s)

    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported, match="f-string"):
        tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.randn(2))


def test_count_is_lazy_and_unpacking_it_is_refused():
    def f(x):
        return x * len(list(itertools.count()))

    tinydynamo.reset()
    with tinydynamo.config.patch(max_instructions=2000), pytest.raises(tinydynamo.Unsupported, match="infinite"):
        tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.randn(2))


def test_escaping_containers_keep_their_types():
    def f(x):
        d = collections.defaultdict(int)
        d["a"] += 1
        return collections.deque([x]), d, {1, 2}, functools.partial(torch.mul, 2), collections.OrderedDict(a=x)

    tinydynamo.reset()
    q, d, s, p, o = tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.ones(2))
    assert type(q) is collections.deque and type(d) is collections.defaultdict and d["a"] == 1 and d["zz"] == 0
    assert s == {1, 2} and p(torch.ones(1)).item() == 2 and type(o) is collections.OrderedDict


def test_break_inside_a_loop_over_map_runs_the_frame_eagerly():
    log = []

    def f(x):
        for y in map(lambda t: t * 2, [x, x + 1, x + 2]):
            log.append(y)
            print("", end="")  # a break with the lazy map iterator on the stack
        return sum(log)

    tinydynamo.reset()
    g = tinydynamo.optimize(CompileCounter())(f)
    x = torch.ones(2)
    for _ in range(2):
        log.clear()
        torch.testing.assert_close(g(x), torch.full((2,), 12.0))
        assert len(log) == 3


def test_copy_of_other_objects_is_a_clean_break():
    class Box:
        def __init__(self, v):
            self.v = v

    box = Box(2)

    def f(x):
        return x * copy.copy(box).v + len(copy.copy({1, 2}))

    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported, match="copy.copy of an object"):
        tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.ones(2))
    tinydynamo.reset()
    torch.testing.assert_close(tinydynamo.optimize(CompileCounter())(f)(torch.ones(2)), f(torch.ones(2)))


class _CheckpointedBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)

    def layer(self, x, scale=1.0):
        return torch.tanh(self.a(x)) * scale

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        y = checkpoint(self.layer, x, use_reentrant=False, scale=2.0)
        part = functools.partial(checkpoint, use_reentrant=False)  # how transformers calls it
        return self.b(part(self.layer, y, preserve_rng_state=False))


def test_activation_checkpoint_is_traced_as_its_function():
    """torch.utils.checkpoint.checkpoint (HF models' gradient checkpointing) is one graph with the
    checkpointed function's ops, gradients equal to eager (it used to fail: a graph node cannot hold
    the function it is given)."""
    torch.manual_seed(0)
    model = _CheckpointedBlock()
    x = torch.randn(3, 6, requires_grad=True)
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback to eager
        out = tinydynamo.compile(model, backend=counter)(x)
    ref = _CheckpointedBlock()
    ref.load_state_dict(model.state_dict())
    x2 = x.detach().clone().requires_grad_()
    expected = ref(x2)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert counter.frame_count == 1 and counter.op_count >= 5


def _apply_twice(fn, x):
    return fn(fn(x))


_apply_twice.__module__ = "torch.testing._helpers"  # as torch.testing's wrapper_set_seed(op, ...)


def test_torch_python_helper_taking_a_function_is_traced_into():
    """A torch function written in Python that is handed a callable is traced into (the callable
    cannot be an argument of a graph node), as TorchDynamo inlines torch's Python functions."""
    def f(x):
        return _apply_twice(torch.sin, x) + _apply_twice(lambda t: t * 2, x)

    x = torch.randn(5)
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        out = tinydynamo.compile(f, backend=counter)(x)
    torch.testing.assert_close(out, f(x))
    assert counter.frame_count == 1



def test_annotations_are_folded_constants():
    """``Dict[str, Tensor]``, ``Optional[...]``, ``list[int]`` and ``typing.get_origin`` in the frame
    (annotated locals, type checks): immutable, folded at trace time, one graph."""
    import typing

    def f(x):
        cache: typing.Dict[str, torch.Tensor] = {}
        kinds = (typing.List[int], typing.Optional[torch.Tensor], list[int], dict[str, float])
        if typing.get_origin(kinds[0]) is list and typing.get_args(kinds[3]) == (str, float):
            cache["y"] = x + 1
        return cache["y"] * 2

    g = tinydynamo.optimize(CompileCounter(), nopython=True)(f)
    x = torch.randn(3)
    torch.testing.assert_close(g(x), f(x))


def test_callable_and_hasattr_ask_the_class_as_python_does():
    """``callable(x)`` is true when ``type(x)`` defines ``__call__`` (an instance of a class with one,
    the class itself); ``hasattr`` of a partial made in the frame finds ``func`` but not ``__name__``
    (the *type* ``functools.partial`` has a ``__name__``, its instances do not)."""
    import functools

    import tinydynamo

    class WithCall:
        def __call__(self):
            return 1

    class Plain:
        pass

    def f(x, arg):
        return x if callable(arg) else x + 1

    g = tinydynamo.optimize("eager", nopython=True)(f)
    x = torch.zeros(2)
    for arg in (WithCall(), Plain(), WithCall, Plain, 1, 1.5, x):
        assert torch.equal(g(x, arg), f(x, arg)), arg

    for attr in ("__name__", "__qualname__", "func", "keywords"):
        def h(t, attr=attr):
            p = functools.partial(lambda a, b: a + b, b=t)
            return p(t) if hasattr(p, attr) else t * 0

        out = tinydynamo.optimize("eager")(h)(x + 1)
        assert torch.equal(out, h(x + 1)), attr


def test_partial_made_in_the_frame_lacks_its_functions_attributes_in_one_graph():
    """A partial object has ``func`` / ``args`` / ``keywords`` and its class's attributes, not the
    wrapped function's (``__code__``, ``__name__``, ``__defaults__``...): ``hasattr`` answers False
    at trace time, in one graph, and ``p.__name__`` raises AttributeError that ``except`` catches."""
    for attr in ("__code__", "__name__", "__defaults__", "__globals__", "__closure__", "__call__", "func"):
        def h(t, attr=attr):
            p = functools.partial(lambda a, b: a.sin() + b, b=t)
            return p(t) if hasattr(p, attr) else t * 0

        def k(t):
            p = functools.partial(lambda a, b: a + b, b=t)
            try:
                return p.__qualname__
            except AttributeError:
                return t - 1

        x = torch.randn(3)
        for fn in (h, k):
            out = tinydynamo.optimize("eager", nopython=True)(fn)(x)
            torch.testing.assert_close(out, fn(x)), attr


class _AssertsInTheFrame(unittest.TestCase):
    def runTest(self):  # noqa: N802 - unittest's name
        pass


def test_unittest_assert_raises_callable_form_traces_and_the_context_form_breaks():
    case = _AssertsInTheFrame()

    def gen():
        yield 1

    def callable_form(x):
        g = gen()
        next(g)
        case.assertRaises(StopIteration, next, g)
        return x + 1

    cnt = CompileCounter()
    x = torch.ones(2)
    assert torch.equal(tinydynamo.optimize(cnt, nopython=True)(callable_form)(x), x + 1) and cnt.frame_count == 1

    def regex_form(x):
        def bad():
            raise TypeError("fie!", 2)
        case.assertRaisesRegex(TypeError, r"\('fie!', 2\)", bad)
        return x * 2

    assert torch.equal(tinydynamo.optimize("eager", nopython=True)(regex_form)(x), x * 2)

    def not_raised(x):
        case.assertRaises(StopIteration, next, iter([1]))
        return x

    with pytest.raises(AssertionError, match="StopIteration not raised"):
        tinydynamo.optimize("eager")(not_raised)(x)

    def context_form(x):
        with case.assertRaises(ZeroDivisionError):
            1 / 0  # noqa: B018
        return x - 1

    cnt = CompileCounter()
    assert torch.equal(tinydynamo.optimize(cnt)(context_form)(x), x - 1)
    with pytest.raises(tinydynamo.exc.Unsupported):
        tinydynamo.optimize("eager", nopython=True)(context_form)(x)
