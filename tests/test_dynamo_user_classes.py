"""User-defined classes in traced code: objects made in the frame, their attributes
(reads, writes, properties), methods, classmethod/staticmethod, super(), dunder methods,
dataclasses and named tuples, isinstance/issubclass, custom autograd.Function. Each case
matches eager, and compiles into as many graphs as torch.compile (backend "eager")."""
import abc
import collections
import dataclasses
import typing

import pytest
import torch

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter


class Point:
    def __init__(self, x, s):
        self.x = x
        self.s = s

    def scaled(self):
        return self.x * self.s

    @property
    def double(self):
        return self.x * 2

    @classmethod
    def make(cls, x):
        return cls(x, 3)

    @staticmethod
    def helper(x):
        return x + 1

    def __add__(self, other):
        return Point(self.x + other.x, self.s)

    def __radd__(self, other):
        return Point(self.x + other, self.s)

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return self.x[i]

    def __call__(self, y):
        return self.x * y

    def __iter__(self):
        return iter([self.x, self.x + 1])

    def __contains__(self, k):
        return k == 1

    def __eq__(self, other):
        return self.s == other.s


class Sub(Point):
    def scaled(self):
        return super().scaled() + 1

    @classmethod
    def make(cls, x):
        return super().make(x * 2)


class Counter:
    """Reads a data descriptor (property with a setter) before the instance dict, as Python does."""

    def __init__(self):
        self._n = 0

    @property
    def n(self):
        return self._n

    @n.setter
    def n(self, v):
        self._n = v + 100

    def __getattr__(self, name):
        return 7


@dataclasses.dataclass
class Cfg:
    a: int = 1
    b: float = 2.0
    tags: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.c = self.a * 10


NT = collections.namedtuple("NT", "a b", defaults=[5])


class TNT(typing.NamedTuple):
    a: torch.Tensor
    b: int = 4


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x  # deliberately not the derivative of forward: the custom backward must run


def instance_attrs(x):
    p = Point(x, 2)
    p.y = p.x + 1
    p.s += 1
    return p.scaled() + p.y


def property_classmethod_staticmethod(x):
    p = Point.make(x)
    return p.double + Point.helper(x) + p.s + p.make(x).s


def super_calls(x):
    return Sub(x, 2).scaled() + Sub.make(x).x


def dunders(x):
    p, q = Point(x, 2), Point(x, 3)
    r = p + q
    r2 = 1 + p
    a = r.x + r2.x + len(p) + p[0] + p(2)
    for t in p:
        a = a + t
    if 1 in p and 2 not in p and p and not (p == q):
        a = a + 1
    return a


def descriptors_and_getattr(x):
    c = Counter()
    c.n = 1
    return x * c.n + c.missing


def dataclass_and_fields(x):
    c = Cfg(3)
    c.tags.append(1)
    names = [f.name for f in dataclasses.fields(c)]
    return x * c.a + c.b + c.c + len(names) + len(c.tags) + dataclasses.is_dataclass(c)


def named_tuples(x):
    n, t = NT(x), TNT(x)
    a, b = n
    return n.a * n.b + t.a * t[1] + a + b + t._replace(b=1).b if False else n.a * n.b + t.a * t[1] + a + b


def isinstance_checks(x):
    p = Sub(x, 2)
    return x + isinstance(p, Point) + issubclass(Sub, Point) + isinstance(x, torch.Tensor) + isinstance(p, (int, Sub))


def returns_new_object(x):
    p = Point(x * 2, 5)
    return p


def object_stored_in_outside_list(x, out):
    out.append(Point(x + 1, 1))
    return x * 2


CASES = [
    (instance_attrs, 1, 1), (property_classmethod_staticmethod, 1, 1), (super_calls, 1, 1),
    (dunders, 1, 1), (descriptors_and_getattr, 1, 1), (dataclass_and_fields, 1, 1),
    (named_tuples, 1, 1), (isinstance_checks, 1, 1),
]


@pytest.mark.parametrize("fn,tiny,torch_graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_user_class_construct(fn, tiny, torch_graphs):
    assert compare(fn, torch.randn(4, 5)) == (tiny, torch_graphs)


def test_new_object_escapes_as_a_real_object():
    tinydynamo.reset()
    cnt = CompileCounter()
    f = tinydynamo.optimize(cnt, nopython=True)(returns_new_object)
    x = torch.randn(3)
    p = f(x)
    assert type(p) is Point and p.s == 5 and p.scaled().equal(x * 10)
    assert f(x) is not p  # a fresh object each call, as eager makes
    out = []
    g = tinydynamo.optimize(cnt, nopython=True)(object_stored_in_outside_list)
    g(x, out)
    g(x, out)
    assert [type(o) for o in out] == [Point, Point] and out[0] is not out[1]
    torch.testing.assert_close(out[1].x, x + 1)
    assert cnt.frame_count == 3  # returns_new_object once; the list grew between g's calls: its length guard recompiles


def test_new_object_at_a_graph_break_is_rebuilt_once():
    def f(x):
        p = Point(x + 1, 2)
        q = p
        print("", end="")  # graph break: p (and q, the same object) cross it
        q.s = 3
        return p.scaled()

    assert compare(f, torch.randn(3)) == (2, 1)  # torch.compile (2.13) runs the part after print eagerly


def test_autograd_function_keeps_its_backward():
    def f(x):
        return Double.apply(x + 1).sin()

    x = torch.randn(5, requires_grad=True)
    tiny, torch_graphs = compare(f, x, grad=True)
    assert torch_graphs == 1 and tiny == 1  # one graph; the node's gradient is the custom backward's


class Slotted:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v


def test_class_that_cannot_be_made_in_the_frame_is_a_clean_break():
    def f(x):
        return x * Slotted(2).v

    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported, match="__slots__"):
        tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.randn(3))
    assert compare(f, torch.randn(3)) == (1, 1)  # tiny: a graph break at Slotted(2), then the rest


def test_tensor_subclass_with_torch_function_falls_back_cleanly():
    class Scaled(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return super().__torch_function__(func, types, args, kwargs or {})

    def f(x):
        return x * 2 + 1

    x = torch.randn(3).as_subclass(Scaled)
    tinydynamo.reset()
    out = tinydynamo.optimize(CompileCounter())(f)(x)
    torch.testing.assert_close(torch.Tensor(out), torch.Tensor(f(x)))


def test_identity_of_objects_made_in_the_frame():
    def f(x):
        p, q = Point(x, 1), Point(x, 1)
        r = p
        return x * ((p is r) + 2 * (p is q) + 4 * (p is not q) + 8 * (p is None))

    assert compare(f, torch.randn(3)) == (1, 1)


def test_self_referencing_object_escaping_is_a_clean_error():
    def f(x):
        p = Point(x, 1)
        p.me = p
        return p

    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported, match="refers to itself"):
        tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.randn(3))


@dataclasses.dataclass(frozen=True)
class FrozenCfg:
    a: int
    b: float = 1.0


class Shape(typing.NamedTuple):
    w: torch.Tensor
    k: int

    def total(self):
        return self.w * self.k

    @property
    def twice(self):
        return self.k * 2


class Abstract(abc.ABC):
    @abc.abstractmethod
    def g(self):
        ...


class Concrete(Abstract):
    def g(self):
        return 3


def frozen_dataclass(x):
    f = FrozenCfg(2)
    return x * f.a + f.b


def namedtuple_methods_and_isinstance(x):
    p = Shape(x, 3)
    return p.total() + p.twice + isinstance(p, Shape) + isinstance(p, tuple)


def abc_subclass(x):
    return x * Concrete().g()


@pytest.mark.parametrize("fn", [frozen_dataclass, namedtuple_methods_and_isinstance, abc_subclass],
                         ids=lambda f: f.__name__)
def test_more_class_kinds(fn):
    assert compare(fn, torch.randn(4, 5)) == (1, 1)


def test_named_tuple_returned_keeps_its_type():
    def f(x):
        return Shape(x + 1, 2), torch.max(x, 0)

    tinydynamo.reset()
    shape, mx = tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.ones(3, 2))
    assert type(shape) is Shape and shape.k == 2 and type(mx) is torch.return_types.max
    torch.testing.assert_close(mx.values, torch.ones(2))


def test_frozen_dataclass_assignment_is_a_clean_break():
    def f(x):
        c = FrozenCfg(1)
        c.a = 3  # raises FrozenInstanceError in Python
        return x

    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported):
        tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.ones(2))
