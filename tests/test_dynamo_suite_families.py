"""Families of constructs met in PyTorch's own dynamo tests (tests/dynamo_suite), each checked against
eager: tensor metadata methods, builtins over tensors and numbers, exceptions through ``with``
blocks and context managers, exception classes with their own ``__init__``, modules with a
custom ``__getattr__``."""
import collections
import collections.abc
import contextlib
import dataclasses
import itertools
import operator
import typing
from unittest.mock import patch

import pytest
import torch

import tinydynamo
from tests.dynamo_utils import check_same


def compiled(fn, **kw):
    tinydynamo.reset()
    return tinydynamo.compile(fn, fullgraph=True, **kw)


# ---- tensor methods answered from metadata ------------------------------------------------------------
def test_tensor_new_with_a_size_makes_that_shape():
    """``x.new(torch.Size)`` is a tensor of that shape; ``x.new((5, 8))`` (a tuple) is one of that data."""

    def fn(x):
        y = torch.rand(5, 8)
        return x.new(y.size()).shape, x.new(y.shape).shape, x.new(2, 3).shape, x.new((5, 8))

    out = compiled(fn)(torch.randn(3))
    assert out[:3] == (torch.Size([5, 8]), torch.Size([5, 8]), torch.Size([2, 3]))
    torch.testing.assert_close(out[3], torch.tensor([5.0, 8.0]))


def test_is_complex_and_is_floating_point_are_methods():
    def fn(x):
        y = x + 1
        a = y + 1 if y.is_complex() else y - 1
        return a, y.is_floating_point(), torch.is_floating_point(input=y), torch.is_floating_point(y)

    check_same(fn, (torch.randn(3),), (torch.randn(3, dtype=torch.complex64),), frames=2)


# ---- builtins over tensors and numbers -------------------------------------------------------------------
def test_min_max_of_one_element_tensors_and_numbers():
    def fn(a, b):
        c = a + b
        a, b = a.sum(), b.sum()
        a = min(max(a, 0), 1)
        b = max(0, min(1, b))
        return max(a, b) - min(a, b) + c

    check_same(fn, (torch.randn(4), torch.randn(4)), (torch.full((4,), 5.0), torch.full((4,), -5.0)))


@pytest.mark.parametrize("fn", [lambda t: max(t, 0), lambda t: max(0, t), lambda t: min(t, 1.5),
                                lambda t: min(2, t, 0.5)])
@pytest.mark.parametrize("value", [float("nan"), 2.0, -1.0, 0.0])
def test_min_max_pick_what_python_picks(fn, value):
    """Python keeps the first item unless a later one compares greater/less: NaN and ties included."""
    t = torch.tensor(value)
    expected = torch.as_tensor(fn(t), dtype=torch.float32)
    torch.testing.assert_close(compiled(fn)(t), expected, equal_nan=True)


def test_min_max_of_a_many_element_tensor_is_not_traced():
    """``max(t, 0)`` of a many-element tensor raises in eager (bool of a tensor): not traced as elementwise."""
    with pytest.raises(tinydynamo.Unsupported):
        compiled(lambda t: max(t, 0))(torch.randn(3))


def test_number_times_list_and_operator_is():
    def fn(x):
        return sum(4 * [x]), operator.is_(-10, x), operator.is_not(-10, x), operator.is_(x, x)

    check_same(fn, (torch.randn(3),))


# ---- exceptions through `with` blocks --------------------------------------------------------------------
def test_exception_leaving_a_no_grad_block_is_caught_outside():
    def fn(x):
        x = torch.cos(x)
        try:
            with torch.no_grad():
                x = torch.sin(x)
                raise NotImplementedError("no")
        except NotImplementedError:
            x = torch.sigmoid(x)
        return x, torch.is_grad_enabled()

    x = torch.randn(4, requires_grad=True)
    out, mode = compiled(fn)(x)
    ref, ref_mode = fn(x)
    torch.testing.assert_close(out, ref)
    assert mode is ref_mode is True and out.requires_grad == ref.requires_grad
    assert torch.is_grad_enabled()


class Suppress:
    def __init__(self, kind):
        self.kind = kind
        self.seen = None

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        self.seen = typ
        return typ is not None and issubclass(typ, self.kind)


def test_user_context_manager_exit_sees_and_suppresses_the_exception():
    def fn(x):
        with Suppress(KeyError) as s:
            x = x + 1
            raise KeyError("k")
        try:
            with Suppress(KeyError):
                raise ValueError("v")
        except ValueError:
            x = x * 3
        return x, s.seen is KeyError

    check_same(fn, (torch.randn(3),))


def test_contextmanager_defined_in_the_frame_translates_the_exception():
    def fn(x):
        @contextlib.contextmanager
        def translate():
            try:
                yield
            except BaseException:
                raise ValueError  # noqa: B904

        @contextlib.contextmanager
        def passthrough():
            try:
                yield 2
            finally:
                pass

        z = x
        with passthrough() as two:
            try:
                with translate():
                    raise IndexError
            except ValueError:
                z = z * two
            except IndexError:
                z = z - 100
        try:
            with passthrough():
                raise KeyError("k")
        except KeyError:
            z = z + 1
        return z

    check_same(fn, (torch.randn(3),))


def test_contextmanager_that_catches_suppresses():
    @contextlib.contextmanager
    def swallow():
        try:
            yield
        except ZeroDivisionError:
            pass

    def fn(x):
        with swallow():
            x = x + 1
            raise ZeroDivisionError
        return x * 2

    check_same(fn, (torch.randn(3),))


# ---- exception classes with their own __init__ ---------------------------------------------------------
class WithArgs(Exception):
    def __init__(self, a, b=None):
        self.a = a
        self.b = b

    def total(self):
        return self.a + self.b


class WithMessage(ValueError):
    def __init__(self, code):
        super().__init__(f"code {code}", code)
        self.code = code


def test_exception_with_python_init_is_built_in_the_frame():
    def fn(t):
        try:
            raise WithArgs(2, b=t)
        except ValueError:
            return t * 0
        except WithArgs as e:
            return t * e.a + e.total(), e.args

    check_same(fn, (torch.randn(2),))


def test_exception_init_calling_super_sets_args():
    def fn(t):
        try:
            raise WithMessage(7)
        except ValueError as e:
            return t + e.code, e.args, str(e)

    t = torch.randn(2)
    out, args, text = compiled(fn)(t)
    torch.testing.assert_close(out, t + 7)
    assert (args, text) == (("code 7", 7), str(WithMessage(7)))


def test_exception_made_in_the_frame_escapes_with_its_attributes():
    def fn(t):
        return t + 1, WithArgs(3, b=4)

    out, exc = compiled(fn)(torch.ones(2))
    assert type(exc) is WithArgs and exc.args == (3,) and (exc.a, exc.b) == (3, 4)
    torch.testing.assert_close(out, torch.full((2,), 2.0))


# ---- modules with a custom __getattr__ -----------------------------------------------------------------
class GetattrModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.ones(4) * 2)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "a_copy":
                return self.a
            raise

    def forward(self, x):
        return x * self.a * self.a_copy, hasattr(self, "missing")


def test_module_getattr_deferring_to_nn_module_is_inlined():
    mod = GetattrModule()
    x = torch.randn(4)
    out, missing = compiled(mod)(x)
    ref, ref_missing = mod(x)
    torch.testing.assert_close(out, ref)
    assert missing is ref_missing is False


# ---- user classes with their own __getattr__ / __setattr__ -----------------------------------------------
class Prefixed:
    """Stores every attribute under a prefixed name; reads of a missing name look the prefixed one up."""

    def __setattr__(self, key, value):
        super().__setattr__(f"pfx_{key}", value)

    def __getattr__(self, key):
        return self.__dict__[f"pfx_{key}"]


PROBED = []


class Probe:
    def __init__(self, t):
        self.t = t

    def __getattr__(self, key):
        PROBED.append(key)
        raise AttributeError(key)


def _prefixed(**attrs):
    obj = Prefixed()
    for k, v in attrs.items():
        object.__setattr__(obj, k, v)
    return obj


def test_custom_setattr_and_getattr_of_an_outside_object_are_inlined():
    def fn(obj):
        obj.y = obj.x + 1
        obj.z = obj.y * 2  # read back in the frame: the new value
        return obj.z + obj.x

    for start in ({"pfx_x": torch.ones(3)}, {"pfx_x": torch.ones(3), "pfx_y": torch.zeros(3)}):
        eager, comp = _prefixed(**start), _prefixed(**start)
        tinydynamo.reset()
        out = tinydynamo.compile(fn, fullgraph=True)(comp)
        torch.testing.assert_close(out, fn(eager))
        assert eager.__dict__.keys() == comp.__dict__.keys()
        for k in eager.__dict__:
            torch.testing.assert_close(comp.__dict__[k], eager.__dict__[k])


def test_wrapping_an_object_does_not_call_its_getattr():
    """Recognising a value (is it a partial? a disabled function?) must not run the user's __getattr__."""
    PROBED.clear()
    tinydynamo.reset()
    tinydynamo.compile(lambda o: o.t + 1, fullgraph=True)(Probe(torch.ones(2)))
    assert PROBED == []


def test_custom_setattr_of_an_object_made_in_the_frame():
    def fn(x):
        obj = Prefixed()
        obj.x = x
        obj.y = obj.x + 1
        return obj, obj.__dict__["pfx_y"] * 2

    obj, out = compiled(fn)(torch.ones(2))
    assert obj.__dict__.keys() == {"pfx_x", "pfx_y"}
    torch.testing.assert_close(out, torch.full((2,), 4.0))


# ---- containers and records ---------------------------------------------------------------------------
class TensorDict(collections.abc.MutableMapping):
    def __init__(self):
        self._dict = {}

    def __getitem__(self, key):
        return self._dict[key]

    def __setitem__(self, key, value):
        self._dict[key] = value

    def __delitem__(self, key):
        del self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self):
        return len(self._dict)


def test_user_mapping_views_dict_and_star_star():
    td = TensorDict()
    td["a"] = torch.ones(4) * 2
    td["b"] = torch.ones(4) * 3

    def gn(x, a=1, b=1):
        return x * a - b

    def fn(x):
        copy = dict(td)
        total = sum(v.sum() for v in td.values())
        pairs = [len(k) for k, _ in td.items()]
        return x * copy["a"], gn(x, **td), total, pairs, "a" in td.keys(), len(td.keys())

    check_same(fn, (torch.randn(4),))


class Config(collections.OrderedDict):
    pass


class Plain(dict):
    tag = 3


def test_plain_dict_subclasses_made_in_the_frame_keep_their_class():
    def fn(x):
        c = Config(sample=x)
        p = Plain(b=x + 1)
        p["c"] = Plain.tag
        return c, p, c, isinstance(c, Config)

    c, p, c2, is_config = compiled(fn)(torch.ones(2))
    assert type(c) is Config and type(p) is Plain and c is c2 and is_config
    assert list(p) == ["b", "c"] and p["c"] == 3


def test_made_in_frame_ordered_dict_and_dataclass_are_one_object_each():
    @dataclasses.dataclass
    class Rec:
        t: torch.Tensor
        tags: list = dataclasses.field(default_factory=list)

    def fn(x):
        d = collections.OrderedDict(a=x)
        r = Rec(x + 1)
        r.tags.append(1)
        return d, d, r, r

    d1, d2, r1, r2 = compiled(fn)(torch.ones(2))
    assert d1 is d2 and r1 is r2 and r1.tags == [1]


def test_itertools_combinatorics():
    def fn(a):
        out = [torch.ones(size) * a.sum() for size in itertools.combinations((1, 2, 3), 2)]
        out += [p[0] - p[1] for p in itertools.permutations([a, a + 1, a * 2], 2)]
        out += [torch.tensor(c) + a for c in itertools.combinations_with_replacement((1, 2), 2)]
        return out

    check_same(fn, (torch.randn(2),))


class Pair(typing.NamedTuple):
    first: torch.Tensor
    second: torch.Tensor

    def add(self):
        return self.first + self.second

    @staticmethod
    def one():
        return 1

    @classmethod
    def name(cls):
        return cls.__name__


def test_named_tuple_static_and_class_methods():
    def fn(a, b):
        p = Pair(a, b)
        return p.add() * p.one(), p.name()

    out, name = compiled(fn)(torch.ones(2), torch.ones(2))
    assert name == "Pair"
    torch.testing.assert_close(out, torch.full((2,), 2.0))


def test_deque_copy_is_a_deque():
    def fn(a, b):
        d = collections.deque([a, b])
        d = d.copy()
        d.append(d.popleft() * 2)
        return list(d)

    check_same(fn, (torch.randn(2), torch.randn(2)))


# ---- tensors where an op takes a Scalar; small torch helpers ----------------------------------------------
def test_foreach_ops_with_a_tensor_scalar_are_traced_item_by_item():
    def lerp(xs, ys, w):
        return torch._foreach_lerp_(xs, ys, w)

    def pow_(base, exps):
        return torch._foreach_pow(base, exps)

    xs, ys, w = [torch.ones(2, 2) * 4.0, torch.ones(2, 2) * 3.0], [torch.ones(2, 2), torch.zeros(2, 2)], torch.tensor(0.5)
    mine = [x.clone() for x in xs]
    out = compiled(lerp)(mine, ys, w)
    ref = lerp(xs, ys, w)
    assert out is mine  # the in-place op returns its first list
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(compiled(pow_)(torch.tensor(0.8), [torch.tensor(3.4), torch.tensor(7.8)]),
                               pow_(torch.tensor(0.8), [torch.tensor(3.4), torch.tensor(7.8)]))


def test_addcmul_with_a_tensor_value():
    def fn(x, y, z, s):
        return x.addcmul_(y, z, value=s), x.addcdiv(y, z, value=s)

    args = (torch.ones(2, 2), torch.ones(2, 2) + 1, torch.rand(2, 2) + 0.5, torch.tensor(0.3))
    mine = [a.clone() for a in args]
    torch.testing.assert_close(compiled(fn)(*mine), fn(*args))
    torch.testing.assert_close(mine[0], args[0])


def test_tensor_dunder_iter_and_jit_annotate():
    def fn(x):
        x = x.clone()
        for row in x.__iter__():
            row.add_(1.0)
        return torch.jit.annotate(typing.Any, x + 1) + 2

    check_same(fn, (torch.randn(3, 2),))


class DefaultTensorMethod(torch.nn.Module):
    def forward(self, x=torch.zeros((2, 2)), *, kw_x=torch.zeros((1, 2))):
        x.add_(1)
        kw_x.add_(1)
        return x, kw_x


class HoldsDefaultTensorMethod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = DefaultTensorMethod()

    def forward(self):
        return self.m()


def test_dynamic_size_of_a_method_default_is_read_through_the_class():
    """A recompile with another shape makes the default's sizes symbols: their values are read at run
    time through the class (a constant of the generated code), not by its module path."""

    tinydynamo.reset()
    compiled_mod = tinydynamo.compile(HoldsDefaultTensorMethod())
    compiled_mod()
    for shape in ((3, 4, 5), (2, 3, 4)):
        new = torch.ones(shape)
        with patch.object(DefaultTensorMethod.forward, "__defaults__", (new,)):
            x, _ = compiled_mod()
        assert x is new
        torch.testing.assert_close(x, torch.full(shape, 2.0))


class CGetter:
    """A property whose getter is not a Python function (as a pybind11 property's is not)."""

    def __init__(self, flag):
        self._flag = flag

    flag = property(operator.attrgetter("_flag"))


def test_property_with_a_c_getter_is_read_and_guarded():
    def fn(x, obj):
        if obj.flag:
            return torch.cos(x)
        return torch.sin(x)

    x = torch.randn(4)
    cnt = check_same(fn, (x, CGetter(True)), (x, CGetter(False)), frames=2)
    assert cnt.frame_count == 2  # the value is guarded: the second object's False is a recompile
