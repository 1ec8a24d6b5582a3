"""Where the interpreter meets a polyfill: the trackers that :mod:`tinydynamo.polyfills` become.

Three mechanisms, tried in this order by :func:`variable_for` (VariableBuilder asks it about every
value it wraps) and by ``call_class`` (for classes):

1. **Pure functions over constants** (``polyfills.PURE_FUNCTIONS``): a ``PureFunctionVariable``, run
   at trace time over constant arguments.
2. **Python reimplementations** (``polyfills.FUNCTION_POLYFILLS``): a
   :class:`PolyfilledFunctionVariable`. Calling it inlines the polyfill; everywhere else it is the
   original function: ``fn is functools.reduce`` holds, and after a graph break the compiled code
   calls the original natively (calling the polyfill there would trace it again, and again).
3. **Class handlers** (:func:`class_handler`): ``map``, ``filter``, ``itertools.count`` / ``islice`` /
   ``repeat``... are :class:`~tinydynamo.variables.iter.LazyIteratorVariable`s that produce their
   items when the loop asks (``count()`` is infinite, so it cannot be unrolled up front);
   ``functools.partial``, ``collections.*``, numpy scalars, ``record_function``, ``nullcontext`` and
   ``torch.autocast`` have trackers of their own.

Layer: above iter (its class handlers make lazy iterators) and below objects (``call_class`` asks
:func:`class_handler`).
"""
from __future__ import annotations

import collections
import collections.abc
import contextlib
import functools
import itertools
import operator
import types
from typing import Any

import torch

from tinydynamo import polyfills, trace_rules
from tinydynamo.exc import unimplemented
from tinydynamo.source import AttrSource
from tinydynamo.variables import autocast, iter as iter_variables, misc_ctx
from tinydynamo.variables.autocast import make_autocast
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import OpaqueCallVariable, UserFunctionVariable
from tinydynamo.variables.iter import PartialVariable, PureFunctionVariable
from tinydynamo.variables.lists import ListIteratorVariable, TupleVariable
from tinydynamo.variables.misc_ctx import ContextManagerDecoratorVariable, ContextManagerFunctionVariable
from tinydynamo.variables.torch_function import DisableTorchFunctionSubclassVariable, default_torch_function_variable


class PolyfilledFunctionVariable(UserFunctionVariable):
    def __init__(self, original, polyfill: types.FunctionType, source=None):
        super().__init__(polyfill, None)  # the polyfill's defaults/closure are not the user's: no source
        self.original = original
        self.original_source = source

    def as_python_constant(self):
        return self.original

    def reconstruct(self, codegen) -> str:
        if self.original_source is not None:
            return codegen.source_expr(self.original_source)
        return codegen.constant(self.original, "fn")

    def __repr__(self) -> str:
        return f"PolyfilledFunctionVariable({getattr(self.original, '__qualname__', self.original)})"


class MappingViewVariable(VariableTracker):
    """``KeysView(m)`` / ``ValuesView(m)`` / ``ItemsView(m)`` of ``collections.abc`` (what a user
    ``Mapping``'s inherited ``keys()`` / ``values()`` / ``items()`` return): a live view, read through
    the mapping's own ``__iter__``, ``__getitem__`` and ``__len__`` each time it is used, as the real
    view does (its class has ``__slots__``, so it is not built as a plain object)."""

    def __init__(self, kind: type, mapping: VariableTracker):
        super().__init__(None)
        self.kind = kind
        self.mapping = mapping

    def python_type(self):
        return self.kind

    def unpack_var_sequence(self, tx):
        keys = self.mapping.unpack_var_sequence(tx)
        if self.kind is collections.abc.KeysView:
            return keys
        values = [self.mapping.call_method(tx, "__getitem__", [k], {}) for k in keys]
        if self.kind is collections.abc.ValuesView:
            return values
        return [TupleVariable([k, v]) for k, v in zip(keys, values)]

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__" and not args and not kwargs:
            return self.mapping.call_method(tx, "__len__", [], {})
        if name == "__iter__" and not args and not kwargs:
            return ListIteratorVariable(self.unpack_var_sequence(tx))
        if name == "__contains__" and len(args) == 1 and self.kind is collections.abc.KeysView:
            return self.mapping.call_method(tx, "__contains__", args, {})
        return super().call_method(tx, name, args, kwargs)

    def __repr__(self) -> str:
        return f"MappingViewVariable({self.kind.__name__}, {self.mapping})"


def _mapping_view(kind):
    def handler(tx, args, kwargs):
        if len(args) != 1 or kwargs:
            unimplemented(f"{kind.__name__}() takes one mapping")
        return MappingViewVariable(kind, args[0])

    return handler


def _partial_handler(tx, args, kwargs):
    return PartialVariable(args[0], list(args[1:]), dict(kwargs))


def _disable_torch_function_subclass(tx, args, kwargs):
    return DisableTorchFunctionSubclassVariable()


def _autocast_handler(cls):
    def handler(tx, args, kwargs):
        return make_autocast(tx, cls, list(args), dict(kwargs))

    return handler


def _class_handlers() -> dict:
    return {
        torch.autograd.profiler.record_function: misc_ctx.record_function,
        contextlib.nullcontext: misc_ctx.nullcontext,
        torch._C.DisableTorchFunctionSubclass: _disable_torch_function_subclass,
        **{cls: _autocast_handler(cls) for cls in autocast.AUTOCAST_CLASSES},
        map: iter_variables.map_, filter: iter_variables.filter_, itertools.count: iter_variables.count, itertools.repeat: iter_variables.repeat,
        itertools.islice: iter_variables.islice, itertools.cycle: iter_variables.cycle, functools.partial: _partial_handler,
        collections.deque: iter_variables.deque, collections.OrderedDict: iter_variables.ordered_dict,
        collections.defaultdict: iter_variables.defaultdict, set: iter_variables.set_, frozenset: iter_variables.frozenset_,
        itertools.chain: _inline(polyfills.chain), itertools.product: _inline(polyfills.product),
        itertools.accumulate: _inline(polyfills.accumulate), itertools.starmap: _inline(polyfills.starmap),
        itertools.combinations: _inline(polyfills.combinations), itertools.permutations: _inline(polyfills.permutations),
        itertools.combinations_with_replacement: _inline(polyfills.combinations_with_replacement),
        itertools.pairwise: _inline(polyfills.pairwise), itertools.zip_longest: _inline(polyfills.zip_longest),
        operator.itemgetter: _inline(polyfills.itemgetter), operator.attrgetter: _inline(polyfills.attrgetter),
        operator.methodcaller: _inline(polyfills.methodcaller),
        **{kind: _mapping_view(kind) for kind in (collections.abc.KeysView, collections.abc.ValuesView,
                                                   collections.abc.ItemsView)},
        **{t: _numpy_scalar(t) for t in polyfills.numpy_scalar_types()},
        **{t: _numpy_constant(t) for t in polyfills.numpy_constant_types()},
    }


def _numpy_constant(t):
    """``np.dtype('float')``, ``np.finfo(np.float32)`` over constants: folded to the constant object."""

    def handler(tx, args, kwargs):
        if not all(a.is_python_constant() for a in [*args, *kwargs.values()]):
            unimplemented(f"numpy.{t.__name__}() of a value not known at trace time")
        try:
            return ConstantVariable(t(*[a.as_python_constant() for a in args],
                                      **{k: v.as_python_constant() for k, v in kwargs.items()}))
        except Exception as e:  # noqa: BLE001 - NumPy raises it again when the call runs natively
            unimplemented(f"numpy.{t.__name__}(...) raised {e!r} at trace time")

    return handler


def _numpy_scalar(t):
    """``np.float32(2.0)`` over a constant: folded to the Python number it holds (rounded to the numpy
    type), a constant of the trace that FX can print into the graph's code."""

    def handler(tx, args, kwargs):
        if not all(a.is_python_constant() for a in args) or kwargs:
            unimplemented(f"numpy.{t.__name__}() of a value not known at trace time")
        return ConstantVariable(t(*[a.as_python_constant() for a in args]).item())  # a Python number in the graph

    return handler


def _inline(fn):
    def handler(tx, args, kwargs):
        return UserFunctionVariable(fn).call_function(tx, args, kwargs)

    return handler


_CLASS_HANDLERS: dict = {}


def class_handler(cls):
    """handler(tx, args, kwargs) -> VariableTracker for calling ``cls`` (``call_class`` asks), or None."""
    if not _CLASS_HANDLERS:
        _CLASS_HANDLERS.update(_class_handlers())
    try:
        return _CLASS_HANDLERS.get(cls)
    except TypeError:
        return None


_CONTEXTMANAGER_CODE = contextlib.contextmanager(lambda: iter(())).__code__  # the helper every decorated function shares
_BY_ID: dict[int, tuple[Any, Any]] = {}  # id(function) -> (function, its polyfill or None for a pure one)


def variable_for(value: Any, source) -> Any:
    """The VariableTracker to use for ``value`` instead of the usual wrapping, or None.

    Looked up by identity (``id``), never by ``==``: values such as numpy arrays compare elementwise."""
    special = trace_rules.special_variable(value, source)  # allow_in_graph, disallow_in_graph, graph_break...
    if special is not None:
        return special

    default_tf = default_torch_function_variable(value)  # torch.Tensor.__torch_function__, bound
    if default_tf is not None:
        return default_tf
    if value is polyfills.copy_other:
        return OpaqueCallVariable(value, "copy.copy of an object other than a list, dict, set or tuple")
    if value is contextlib.contextmanager:
        return ContextManagerDecoratorVariable()
    if getattr(value, "__code__", None) is _CONTEXTMANAGER_CODE and hasattr(value, "__wrapped__"):
        inner = UserFunctionVariable(value.__wrapped__, AttrSource(source, "__wrapped__") if source else None)
        return ContextManagerFunctionVariable(inner)  # @contextlib.contextmanager: its generator is inlined
    if not _BY_ID:
        _BY_ID.update({_key(f): (f, None) for f in polyfills.PURE_FUNCTIONS})
        _BY_ID.update({_key(f): (f, poly) for f, poly in polyfills.FUNCTION_POLYFILLS.items()})
    entry = _BY_ID.get(_key(value))
    if entry is None or (entry[0] is not value and _key(value) == id(value)):
        return None
    if entry[1] is None:
        return PureFunctionVariable(value, source)

    return PolyfilledFunctionVariable(value, entry[1], source)


def _key(value: Any):
    """Identity of a function; a classmethod of a C class (``itertools.chain.from_iterable``) is a new
    bound object at each attribute read, so it is known by (its class, its name)."""
    owner = getattr(value, "__self__", None)
    if isinstance(owner, type) and type(value).__name__ == "builtin_function_or_method":
        return (id(owner), value.__name__)
    return id(value)
