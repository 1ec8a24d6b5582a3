"""Iterators, ``functools.partial``, sets and the ``collections`` containers made in the frame.

* :class:`LazyIteratorVariable`: an iterator whose items are produced when a loop asks for them
  (``map``, ``filter``, ``itertools.count/repeat/islice/cycle``): ``count()`` is infinite, so it
  cannot be unpacked up front like a list. It is a ListIteratorVariable, so FOR_ITER, ``next``,
  ``list(...)`` and every builtin that unpacks a sequence accept it.
* :class:`PartialVariable`: ``functools.partial(fn, *args, **kw)``; calling it calls ``fn``.
* :class:`SetVariable`: a set of constants (``{1, 2}``, ``set(xs)``), changed in place.
* :class:`DequeVariable`, :class:`DefaultDictVariable`, :class:`OrderedDictVariable`: a list / dict
  with the extra methods, rebuilt as the right type if they escape the frame.
* :class:`PureFunctionVariable`: a function from ``polyfills.PURE_FUNCTIONS``: run at trace time
  on constant arguments.

Layer: above builtin (the items of a lazy iterator are builtin calls); it registers the builtins
that make its trackers (``set`` of non-constant items, ``zip``/``enumerate`` of a lazy iterator) in
``builtin.HANDLERS_FROM_ABOVE``.
"""
from __future__ import annotations

import collections
import functools
import itertools
import operator
from typing import Callable, Iterator

from tinydynamo import config, polyfills
from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.builtin import BuiltinVariable, register_handlers_from_above
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.dicts import DictVariable, constant_keys, dict_key, guard_distinct_keys, key_code
from tinydynamo.variables.lists import ListIteratorVariable, ListVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable


class LazyIteratorVariable(ListIteratorVariable):
    """An iterator producing its items on demand from ``gen``, a Python generator of VariableTrackers."""

    def __init__(self, gen: Iterator[VariableTracker], name: str):
        super().__init__([])
        self.gen = gen
        self.name = name

    def next_item(self) -> VariableTracker | None:
        item = next(self.gen, None)
        if item is not None:
            self.items.append(item)
            self.index = len(self.items)
        return item

    def unpack_var_sequence(self, tx):
        rest = []
        while True:
            item = self.next_item()
            if item is None:
                return rest
            rest.append(item)
            if len(rest) > config.max_instructions:
                unimplemented(f"unpacking the infinite iterator {self.name}")

    def reconstruct(self, codegen) -> str:
        unimplemented(f"a {self.name} iterator alive at the end of the graph")

    def __repr__(self) -> str:
        return f"LazyIteratorVariable({self.name})"


def iterate(tx, v: VariableTracker) -> Iterator[VariableTracker]:
    """The items of ``v``, lazily when ``v`` is itself a lazy iterator."""
    if isinstance(v, ListIteratorVariable):
        while True:
            item = v.next_item()
            if item is None:
                return
            yield item
    else:
        yield from v.unpack_var_sequence(tx)


def map_(tx, args, kwargs):
    fn, iters = args[0], [iterate(tx, a) for a in args[1:]]

    def gen():
        for items in zip(*iters):
            yield fn.call_function(tx, list(items), {})

    return LazyIteratorVariable(gen(), "map")


def filter_(tx, args, kwargs):
    fn, it = args[0], iterate(tx, args[1])
    is_none = fn.is_python_constant() and fn.as_python_constant() is None

    def gen():
        for item in it:
            keep = item if is_none else fn.call_function(tx, [item], {})
            if keep.truth(tx):
                yield item

    return LazyIteratorVariable(gen(), "filter")


def count(tx, args, kwargs):
    start = args[0] if args else kwargs.get("start", ConstantVariable(0))
    step = args[1] if len(args) > 1 else kwargs.get("step", ConstantVariable(1))

    def gen():
        value = start
        while True:
            yield value
            value = BuiltinVariable.binop(tx, operator.add, value, step)

    return LazyIteratorVariable(gen(), "count")


def repeat(tx, args, kwargs):
    obj = args[0]
    times = args[1] if len(args) > 1 else kwargs.get("times")
    n = None if times is None else times.as_python_constant()
    return LazyIteratorVariable(iter([obj] * n) if n is not None else itertools.repeat(obj), "repeat")


def islice(tx, args, kwargs):
    bounds = slice(*[a.as_python_constant() for a in args[1:]])
    it = iterate(tx, args[0])
    return LazyIteratorVariable(itertools.islice(it, bounds.start, bounds.stop, bounds.step), "islice")


def cycle(tx, args, kwargs):
    items = list(iterate(tx, args[0]))
    return LazyIteratorVariable(itertools.cycle(items) if items else iter(()), "cycle")


class PartialVariable(VariableTracker):
    """``functools.partial(fn, *args, **keywords)`` made in the frame."""

    def __init__(self, fn: VariableTracker, args: list[VariableTracker], keywords: dict[str, VariableTracker]):
        super().__init__(None)
        self.fn, self.args, self.keywords = fn, args, keywords

    def python_type(self):
        return functools.partial

    def call_function(self, tx, args, kwargs):
        return self.fn.call_function(tx, [*self.args, *args], {**self.keywords, **kwargs})

    def var_getattr(self, tx, name: str):
        if name == "func":
            return self.fn
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "keywords":
            return DictVariable(dict(self.keywords))
        if not any(name in vars(k) for k in functools.partial.__mro__):
            # a partial made in the frame has no attributes of its own beyond these (none can be set on
            # it here): ``hasattr(p, '__name__')`` is False, as in Python (a function's attributes are not a partial's)
            raise_observed(AttributeError, f"'functools.partial' object has no attribute {name!r}")
        unimplemented(f"functools.partial attribute {name!r}")

    def reconstruct(self, codegen) -> str:
        parts = [self.fn.reconstruct(codegen)] + [a.reconstruct(codegen) for a in self.args]
        parts += [f"{k}={v.reconstruct(codegen)}" for k, v in self.keywords.items()]
        return f"{codegen.constant(functools.partial, 'partial')}({', '.join(parts)})"

    def __repr__(self) -> str:
        return f"PartialVariable({self.fn})"


class PureFunctionVariable(VariableTracker):
    """A function with no side effects (``polyfills.PURE_FUNCTIONS``): folded over constant arguments."""

    def __init__(self, fn: Callable, source=None):
        super().__init__(source)
        self.fn = fn

    def as_python_constant(self):
        return self.fn

    def call_function(self, tx, args, kwargs):
        def const(v):
            if v.is_python_constant():
                return v.as_python_constant()
            value = getattr(v, "value", None)  # an object from outside (a dataclass instance...)
            if value is not None and not isinstance(v, ConstantVariable):
                return value
            cls = v.python_type()  # an object made in the frame: enough for dataclasses.fields & co
            if getattr(v, "cls", None) is cls:
                return cls
            unimplemented(f"{self.fn.__qualname__}() of {v}, which is not a constant")

        try:
            result = self.fn(*[const(a) for a in args], **{k: const(v) for k, v in kwargs.items()})
        except Exception as e:
            unimplemented(f"{self.fn.__qualname__}(...) raised {e!r} at trace time")
        if self.fn in polyfills.FRESH_RESULTS:  # a new object only this trace holds: changed in place
            tx.output.side_effects.track_private(result)
        return VariableTracker.build_constant(result)

    def __repr__(self) -> str:
        return f"PureFunctionVariable({self.fn.__qualname__})"


# ---- sets ---------------------------------------------------------------------------------------------------
class SetVariable(VariableTracker):
    """A set (or frozenset): ``items`` maps each element, as a dict key (``dicts.dict_key``: a constant,
    or a tensor / object hashed by identity), to its variable. Methods run on a real set of those keys."""

    version = 0

    def __init__(self, items: list[VariableTracker], frozen: bool = False, source=None):
        super().__init__(source)
        self.frozen = frozen
        self.items: dict = {}
        for v in items:
            self.items.setdefault(dict_key(v), v)

    def python_type(self):
        return frozenset if self.frozen else set

    def as_python_constant(self):
        if not constant_keys(self.items):
            unimplemented(f"{self}: a set of tensors or objects as a constant")
        return self.python_type()(self.items)

    def truth(self, tx) -> bool:
        return bool(self.items)

    def unpack_var_sequence(self, tx):
        if constant_keys(self.items):
            return [ConstantVariable(k) for k in self.as_python_constant()]  # in the real set's order
        return list(self.items.values())  # elements hashed by identity: in insertion order

    def var_getattr(self, tx, name: str):
        if callable(getattr(self.python_type(), name, None)):
            return GetAttrVariable(self, name)
        raise_observed(AttributeError, f"{self.python_type().__name__!r} object has no attribute {name!r}")

    def _keys_of(self, tx, v: VariableTracker, variables: dict):
        """``v`` (an element, or an iterable of them) as stored keys; ``variables`` collects key -> variable."""
        elements = list(v.items.values()) if isinstance(v, SetVariable) else list(iterate(tx, v))
        keys = []
        for e in elements:
            k = dict_key(e)
            if k not in self.items:
                guard_distinct_keys(tx, k, self.items)
            variables.setdefault(k, e)
            keys.append(k)
        return keys

    def call_method(self, tx, name, args, kwargs):
        cls = self.python_type()
        if name == "__len__" and not args:
            return ConstantVariable(len(self.items))
        if name == "__iter__" and not args:
            return BuiltinVariable(iter).call_function(tx, [self], {})
        method = getattr(cls, name, None)
        if method is None or kwargs:
            unimplemented(f"{cls.__name__}.{name}")
        variables = dict(self.items)
        if name in ("add", "discard", "remove", "__contains__"):  # one element
            real_args = [self._keys_of(tx, TupleVariable(args[:1]), variables)[0]]
        else:
            real_args = [set(self._keys_of(tx, a, variables)) for a in args]
        real = set(self.items) if not self.frozen else frozenset(self.items)
        try:
            result = method(real, *real_args)
        except KeyError as e:  # remove/pop of a missing element: the frame sees it
            raise_observed(KeyError, str(e))
        except TypeError as e:
            raise_observed(TypeError, str(e))
        if name in ("add", "update", "discard", "remove", "clear", "pop", "difference_update",
                    "intersection_update", "symmetric_difference_update", "__ior__", "__iand__", "__isub__",
                    "__ixor__"):
            tx.output.side_effects.mutation(self)
            self.items = {k: variables[k] for k in self.items if k in real}
            self.items.update((k, variables[k]) for k in real if k not in self.items)
            if name == "pop":
                return variables[result]
            return self if name.startswith("__i") else ConstantVariable(None)
        if isinstance(result, (set, frozenset)):
            order = list(self.items) + [k for a in real_args if isinstance(a, set) for k in a]
            return SetVariable([variables[k] for k in dict.fromkeys(order) if k in result],
                               frozen=type(result) is frozenset)
        if isinstance(result, (bool, int)):
            return ConstantVariable(result)
        unimplemented(f"{cls.__name__}.{name} returned {type(result).__name__}")

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source_expr(self.source)
        elements = ", ".join(key_code(codegen, k) for k in self.items)
        if self.frozen and constant_keys(self.items):
            return codegen.constant(self.as_python_constant())
        if self.frozen:
            return f"frozenset(({elements}{',' if len(self.items) == 1 else ''}))"
        return codegen.shared(self, lambda: f"set(({elements}{',' if len(self.items) == 1 else ''}))")

    def __repr__(self) -> str:
        return f"SetVariable({list(self.items)})"


def set_(tx, args, kwargs):
    return SetVariable(list(iterate(tx, args[0])) if args else [])


def frozenset_(tx, args, kwargs):
    return SetVariable(list(iterate(tx, args[0])) if args else [], frozen=True)


def _builtin_set(fn):
    """``set(xs)`` / ``frozenset(xs)`` of items not all known at trace time (constants are folded)."""
    make = set_ if fn is set else frozenset_

    def handler(tx, args, kwargs):
        if len(args) <= 1 and not kwargs and not all(a.is_python_constant() for a in args):
            return make(tx, args, kwargs)
        return None

    return handler


class ZipIteratorVariable(LazyIteratorVariable):
    """``zip(...)`` over a lazy iterator (a generator, a map...): lazy too, its items made when the loop asks.
    Alive after the graph, it is rebuilt as ``zip`` of its iterators where they are (each rebuilt as itself:
    a list's rest, a generator as LocalGeneratorObjectVariable rebuilds one), or as an empty iterator once
    it has run out."""

    def __init__(self, tx, args: list[VariableTracker]):
        self.iterators = [a if isinstance(a, ListIteratorVariable) else ListIteratorVariable(a.unpack_var_sequence(tx))
                          for a in args]
        self.exhausted = False
        super().__init__((TupleVariable(list(t)) for t in zip(*[iterate(tx, it) for it in self.iterators])), "zip")

    def next_item(self) -> VariableTracker | None:
        item = super().next_item()
        self.exhausted = self.exhausted or item is None
        return item

    def reconstruct(self, codegen) -> str:
        if self.exhausted:
            return "iter(())"
        return codegen.shared(self, lambda: f"zip({', '.join(it.reconstruct(codegen) for it in self.iterators)})")


def _builtin_zip(tx, args, kwargs):
    """``zip`` over a lazy iterator: lazy too (its items are made when the loop asks)."""
    if any(isinstance(a, LazyIteratorVariable) for a in args) and not kwargs:  # generators too
        return ZipIteratorVariable(tx, list(args))
    return None


def _builtin_enumerate(tx, args, kwargs):
    if any(isinstance(a, LazyIteratorVariable) for a in args):
        start = (args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))).as_python_constant()
        return LazyIteratorVariable((TupleVariable([ConstantVariable(i), v]) for i, v in
                                     enumerate(iterate(tx, args[0]), start)), "enumerate")
    return None


register_handlers_from_above({set: _builtin_set(set), frozenset: _builtin_set(frozenset), zip: _builtin_zip,
                              enumerate: _builtin_enumerate})


# ---- collections --------------------------------------------------------------------------------------------
class DequeVariable(ListVariable):
    """``collections.deque`` without ``maxlen``: a list with the left-hand methods."""

    def python_type(self):
        return collections.deque

    def as_python_constant(self):
        return collections.deque(v.as_python_constant() for v in self.items)

    def call_method(self, tx, name, args, kwargs):
        if name in ("appendleft", "popleft", "extendleft", "rotate"):
            tx.output.side_effects.mutation(self)
            if name == "appendleft":
                self.items.insert(0, args[0])
            elif name == "popleft":
                if not self.items:
                    unimplemented("popleft from an empty deque (an IndexError)")
                return self.items.pop(0)
            elif name == "extendleft":
                for v in iterate(tx, args[0]):  # a generator's items are made one by one (they may read the deque)
                    self.items.insert(0, v)
            else:
                k = args[0].as_python_constant() if args else 1
                if self.items:
                    k %= len(self.items)
                    self.items[:] = self.items[-k:] + self.items[:-k] if k else self.items
            return ConstantVariable(None)
        if name == "copy" and not args and not kwargs:  # a new deque made in the frame, same items
            return DequeVariable(list(self.items))
        return super().call_method(tx, name, args, kwargs)

    def rebuild(self, items):
        return ListVariable(items)

    def reconstruct(self, codegen) -> str:
        return codegen.shared(self, lambda: f"{codegen.constant(collections.deque, 'deque')}"
                                            f"([{', '.join(v.reconstruct(codegen) for v in self.items)}])")


def deque(tx, args, kwargs):
    maxlen = kwargs.get("maxlen", args[1] if len(args) > 1 else None)
    if maxlen is not None and not (maxlen.is_python_constant() and maxlen.as_python_constant() is None):
        unimplemented("collections.deque(maxlen=...)")
    return DequeVariable(list(iterate(tx, args[0])) if args else [])


class OrderedDictVariable(DictVariable):
    def python_type(self):
        return collections.OrderedDict

    def call_method(self, tx, name, args, kwargs):
        if name == "move_to_end":
            tx.output.side_effects.mutation(self)
            key = self._key(args[0])
            value = self.items.pop(key)
            last = kwargs.get("last", args[1] if len(args) > 1 else ConstantVariable(True)).as_python_constant()
            self.items = {key: value, **self.items} if not last else {**self.items, key: value}
            return ConstantVariable(None)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source_expr(self.source)
        # one object however many places hold it (as DictVariable's)
        return codegen.shared(self, lambda: f"{codegen.constant(collections.OrderedDict, 'OrderedDict')}"
                                            f"({self.literal(codegen)})")


def ordered_dict(tx, args, kwargs):
    plain = BuiltinVariable(dict).call_function(tx, args, kwargs)
    return OrderedDictVariable(plain.items)


#: what a class body defines without changing how its instances behave
_INERT_CLASS_NAMES = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__",
                      "__orig_bases__", "__parameters__", "__firstlineno__", "__static_attributes__"}


def plain_dict_subclass(cls) -> bool:
    """A Python subclass of ``dict`` / ``OrderedDict`` that adds no methods, properties or slots
    (``class Config(OrderedDict): pass``): its instances behave as the base does."""
    if not isinstance(cls, type) or type(cls) is not type or not issubclass(cls, dict) \
            or issubclass(cls, (collections.defaultdict, collections.Counter)):
        return False
    base = collections.OrderedDict if issubclass(cls, collections.OrderedDict) else dict
    if cls is base:
        return False
    for k in cls.__mro__[:cls.__mro__.index(base)]:
        if not k.__flags__ & (1 << 9):  # Py_TPFLAGS_HEAPTYPE: another C base
            return False
        extra = set(vars(k)) - _INERT_CLASS_NAMES
        if any(callable(vars(k)[n]) or hasattr(type(vars(k)[n]), "__get__") or n == "__slots__" for n in extra):
            return False
    return True


class DictSubclassVariable(OrderedDictVariable):
    """An instance of a :func:`plain_dict_subclass` made in the frame: a dict (an OrderedDict's
    ``move_to_end`` where the class has it) whose type, and whose rebuilt object, is the subclass."""

    def __init__(self, cls: type, items: dict, source=None):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def as_python_constant(self):
        return self.cls(super().as_python_constant())

    def call_method(self, tx, name, args, kwargs):
        if name == "move_to_end" and not issubclass(self.cls, collections.OrderedDict):
            raise_observed(AttributeError, f"{self.cls.__name__!r} object has no attribute 'move_to_end'")
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source_expr(self.source)
        return codegen.shared(self, lambda: f"{codegen.constant(self.cls, 'cls')}({self.literal(codegen)})")


def dict_subclass(tx, cls, args, kwargs):
    plain = BuiltinVariable(dict).call_function(tx, args, kwargs)
    return DictSubclassVariable(cls, plain.items)


class DefaultDictVariable(DictVariable):
    """``collections.defaultdict(factory)``: a missing key calls ``factory()`` and stores the result."""

    def __init__(self, factory: VariableTracker, items: dict, source=None):
        super().__init__(items, source)
        self.factory = factory

    def python_type(self):
        return collections.defaultdict

    def var_getattr(self, tx, name: str):
        if name == "default_factory":
            return self.factory
        return super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__" and not self.lookup(tx, args[0])[1]:
            if self.factory.is_python_constant() and self.factory.as_python_constant() is None:
                raise_observed(KeyError, f"defaultdict without a factory has no key {self._key(args[0])!r}")
            value = self.factory.call_function(tx, [], {})
            super().call_method(tx, "__setitem__", [args[0], value], {})
            return value
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source_expr(self.source)
        return codegen.shared(self, lambda: f"{codegen.constant(collections.defaultdict, 'defaultdict')}"
                                            f"({self.factory.reconstruct(codegen)}, {self.literal(codegen)})")


def defaultdict(tx, args, kwargs):
    factory = args[0] if args else ConstantVariable(None)
    plain = BuiltinVariable(dict).call_function(tx, list(args[1:]), kwargs)
    return DefaultDictVariable(factory, plain.items)
