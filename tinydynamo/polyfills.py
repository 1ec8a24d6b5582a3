"""Polyfills: what the interpreter does instead of calling a C function or a library it does not trace.

TorchDynamo cannot look inside C functions (``functools.reduce``, ``itertools.chain``, ``copy.copy``
of a list) and does not trace most of the standard library, yet user code calls them all the
time. Three mechanisms, tried in this order by :func:`variable_for` (VariableBuilder asks it about
every value it wraps) and by ``call_class`` (for classes):

1. **Pure functions over constants** (``PURE_FUNCTIONS``): a vetted table of functions with no
   side effects; called with constant arguments they simply run at trace time (the result is a
   constant of the graph, e.g. ``math.gcd(6, 4)``, ``dataclasses.fields(Cfg)``).
2. **Python reimplementations** (``FUNCTION_POLYFILLS``): plain Python functions with the same
   behaviour (``reduce``, ``accumulate``, ``sorted(key=...)``, ``copy.copy``...) that the translator
   *inlines* like user code, so tensors flowing through them become graph nodes.
3. **Lazy iterators** (``CLASS_HANDLERS``): ``map``, ``filter``, ``itertools.count`` / ``islice`` /
   ``repeat``... are :class:`~tinydynamo.variables.iter.LazyIteratorVariable`s that produce their
   items when the loop asks (``count()`` is infinite, so it cannot be unrolled up front).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import inspect
import itertools
import math
import operator
import types
import typing
from typing import Any

import torch
import torch.utils.checkpoint

from tinydynamo.exc import unimplemented
from tinydynamo.source import AttrSource


# ---- 2. Python reimplementations, inlined --------------------------------------------------------------
def reduce(function, iterable, *initial):
    it = iter(iterable)
    if initial:
        value = initial[0]
    else:
        value = next(it)
    for element in it:
        value = function(value, element)
    return value


def accumulate(iterable, func=None, *, initial=None):
    total = initial
    first = initial is None
    if not first:
        yield total
    for element in iterable:
        if first:
            total = element
            first = False
        elif func is None:
            total = total + element
        else:
            total = func(total, element)
        yield total


def chain(*iterables):
    for it in iterables:
        for element in it:
            yield element


def chain_from_iterable(iterables):
    for it in iterables:
        for element in it:
            yield element


def product(*iterables, repeat=1):
    pools = [tuple(pool) for pool in iterables] * repeat
    result = [()]
    for pool in pools:
        result = [x + (y,) for x in result for y in pool]
    for prod in result:
        yield prod


def starmap(function, iterable):
    for args in iterable:
        yield function(*args)


def pairwise(iterable):
    items = list(iterable)
    for i in range(len(items) - 1):
        yield items[i], items[i + 1]


def zip_longest(*iterables, fillvalue=None):
    seqs = [list(it) for it in iterables]
    n = max(len(s) for s in seqs) if seqs else 0
    for i in range(n):
        yield tuple(s[i] if i < len(s) else fillvalue for s in seqs)


def sorted_(iterable, /, *, key=None, reverse=False):
    items = list(iterable)
    keys = items if key is None else [key(x) for x in items]
    return [items[i] for i in argsort(keys, reverse)]


def argsort(keys, reverse=False):
    """Indices that sort ``keys`` (constants: folded at trace time, see PURE_FUNCTIONS)."""
    return sorted(range(len(keys)), key=keys.__getitem__, reverse=reverse)


def copy_copy(x):
    if isinstance(x, list):
        return list(x)
    if isinstance(x, dict):
        return dict(x)
    if isinstance(x, tuple):
        return x
    if isinstance(x, set):
        return set(x)
    return _copy_other(x)


def _copy_other(x):
    """Copying any other object (its __copy__, __reduce_ex__...) is not traced: a graph break (variable_for)."""
    return copy.copy(x)


def deepcopy_(x, memo=None):
    if isinstance(x, list):
        return [deepcopy_(v) for v in x]
    if isinstance(x, dict):
        return {k: deepcopy_(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(deepcopy_(v) for v in x)
    return _deepcopy_atom(x)


def _deepcopy_atom(x):
    """Constants deep-copy to themselves; anything else (a tensor, an object) is Unsupported."""
    return copy.deepcopy(x)


def itemgetter(*items):
    if len(items) == 1:
        item = items[0]
        return lambda obj: obj[item]
    return lambda obj: tuple(obj[i] for i in items)


def attrgetter(*names):
    def resolve(obj, name):
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    if len(names) == 1:
        return lambda obj: resolve(obj, names[0])
    return lambda obj: tuple(resolve(obj, n) for n in names)


def methodcaller(name, *args, **kwargs):
    return lambda obj: getattr(obj, name)(*args, **kwargs)


def wraps(wrapped, assigned=functools.WRAPPER_ASSIGNMENTS, updated=functools.WRAPPER_UPDATES):
    """functools.wraps: remembers ``wrapped`` on the new function (its name, docstring... are copied by
    functools.update_wrapper when the function is rebuilt after the graph)."""
    def decorator(wrapper):
        wrapper.__wrapped__ = wrapped
        return wrapper

    return decorator


def checkpoint(function, *args, use_reentrant=None, context_fn=None, determinism_check="default", debug=False,
               early_stop=True, **kwargs):
    """torch.utils.checkpoint.checkpoint, traced as the plain call it computes. The values (and
    gradients) are the same; which activations the backward keeps or recomputes is then decided
    for the whole graph by AOT autograd's partitioner. (TorchDynamo traces ``function`` into a
    tagged subgraph instead, so that its partitioner recomputes exactly those ops.)"""
    kwargs.pop("preserve_rng_state", None)
    return function(*args, **kwargs)


def _torch_checkpoint():
    return torch.utils.checkpoint.checkpoint


FUNCTION_POLYFILLS = {
    _torch_checkpoint(): checkpoint,
    functools.wraps: wraps,
    functools.reduce: reduce,
    itertools.chain.from_iterable: chain_from_iterable,
    copy.copy: copy_copy,
    copy.deepcopy: deepcopy_,
}

# ---- 1. pure functions over constants ---------------------------------------------------------------------
PURE_FUNCTIONS = {
    argsort, _deepcopy_atom, dataclasses.fields, dataclasses.is_dataclass,  # (not asdict: it reads values)
    inspect.isclass, inspect.getmro,  # (signature/isfunction/ismethod: functions.FOLDABLE_LIBRARY_FUNCTIONS,
    # which rebuild a bound method, so that ``inspect.signature(self.forward)`` leaves out ``self``)
    math.gcd, math.prod, math.isclose, math.comb, math.perm, operator.index,
    collections.namedtuple,
    typing.get_origin, typing.get_args,  # annotations are constants (typing_types)
}


def _partial_handler(tx, args, kwargs):
    from tinydynamo.variables.iter import PartialVariable

    return PartialVariable(args[0], list(args[1:]), dict(kwargs))


def _disable_torch_function_subclass(tx, args, kwargs):
    from tinydynamo.variables.torch_function import DisableTorchFunctionSubclassVariable

    return DisableTorchFunctionSubclassVariable()


def _autocast_handler(cls):
    def handler(tx, args, kwargs):
        from tinydynamo.variables.autocast import make_autocast

        return make_autocast(tx, cls, list(args), dict(kwargs))

    return handler


def _class_handlers() -> dict:

    from tinydynamo.variables import autocast, iter as it, misc_ctx

    return {
        torch.autograd.profiler.record_function: misc_ctx.record_function,
        contextlib.nullcontext: misc_ctx.nullcontext,
        torch._C.DisableTorchFunctionSubclass: _disable_torch_function_subclass,
        **{cls: _autocast_handler(cls) for cls in autocast.AUTOCAST_CLASSES},
        map: it.map_, filter: it.filter_, itertools.count: it.count, itertools.repeat: it.repeat,
        itertools.islice: it.islice, itertools.cycle: it.cycle, functools.partial: _partial_handler,
        collections.deque: it.deque, collections.OrderedDict: it.ordered_dict,
        collections.defaultdict: it.defaultdict, set: it.set_, frozenset: it.frozenset_,
        itertools.chain: _inline(chain), itertools.product: _inline(product),
        itertools.accumulate: _inline(accumulate), itertools.starmap: _inline(starmap),
        itertools.pairwise: _inline(pairwise), itertools.zip_longest: _inline(zip_longest),
        operator.itemgetter: _inline(itemgetter), operator.attrgetter: _inline(attrgetter),
        operator.methodcaller: _inline(methodcaller),
        **{t: _numpy_scalar(t) for t in _numpy_scalar_types()},
    }


def _numpy_scalar_types() -> tuple:
    try:
        import numpy as np
    except ImportError:
        return ()
    return (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_)


def _numpy_scalar(t):
    """``np.float32(2.0)`` over a constant: folded to the Python number it holds (rounded to the numpy
    type), a constant of the trace that FX can print into the graph's code."""

    def handler(tx, args, kwargs):
        from tinydynamo.variables.constant import ConstantVariable

        if not all(a.is_python_constant() for a in args) or kwargs:
            unimplemented(f"numpy.{t.__name__}() of a value not known at trace time")
        return ConstantVariable(t(*[a.as_python_constant() for a in args]).item())  # a Python number in the graph

    return handler


def constant_object_types() -> tuple:
    """Immutable library objects kept as constants of the trace (attributes and methods run at trace time)."""

    return (inspect.Signature, inspect.Parameter, types.MappingProxyType, dataclasses.Field, torch.finfo,
            torch.iinfo) + typing_types() + _numpy_scalar_types()


def typing_types() -> tuple:
    """Annotations (``Dict[str, int]``, ``Optional``, ``list[int]``, a TypeVar): immutable, and what
    they compute (subscripts, ``get_origin``) depends on nothing else, so they are folded."""
    found = [types.GenericAlias, typing.TypeVar]
    for name in ("_GenericAlias", "_SpecialGenericAlias", "_SpecialForm", "_UnionGenericAlias",
                 "_CallableGenericAlias", "_LiteralGenericAlias", "_TupleType"):
        cls = getattr(typing, name, None)
        if isinstance(cls, type):
            found.append(cls)
    if hasattr(types, "UnionType"):
        found.append(types.UnionType)
    return tuple(found)


def _inline(fn):
    def handler(tx, args, kwargs):
        from tinydynamo.variables.functions import UserFunctionVariable

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
    from tinydynamo import trace_rules

    special = trace_rules.special_variable(value, source)  # allow_in_graph, disallow_in_graph, graph_break...
    if special is not None:
        return special
    from tinydynamo.variables.torch_function import default_torch_function_variable

    default_tf = default_torch_function_variable(value)  # torch.Tensor.__torch_function__, bound
    if default_tf is not None:
        return default_tf
    if value is _copy_other:
        from tinydynamo.variables.objects import OpaqueCallVariable

        return OpaqueCallVariable(value, "copy.copy of an object other than a list, dict, set or tuple")
    if getattr(value, "__code__", None) is _CONTEXTMANAGER_CODE and hasattr(value, "__wrapped__"):
        from tinydynamo.variables.functions import UserFunctionVariable
        from tinydynamo.variables.misc_ctx import ContextManagerFunctionVariable

        inner = UserFunctionVariable(value.__wrapped__, AttrSource(source, "__wrapped__") if source else None)
        return ContextManagerFunctionVariable(inner)  # @contextlib.contextmanager: its generator is inlined
    if not _BY_ID:
        _BY_ID.update({_key(f): (f, None) for f in PURE_FUNCTIONS})
        _BY_ID.update({_key(f): (f, poly) for f, poly in FUNCTION_POLYFILLS.items()})
    entry = _BY_ID.get(_key(value))
    if entry is None or (entry[0] is not value and _key(value) == id(value)):
        return None
    if entry[1] is None:
        from tinydynamo.variables.iter import PureFunctionVariable

        return PureFunctionVariable(value, source)
    from tinydynamo.variables.polyfilled import PolyfilledFunctionVariable

    return PolyfilledFunctionVariable(value, entry[1], source)


def _key(value: Any):
    """Identity of a function; a classmethod of a C class (``itertools.chain.from_iterable``) is a new
    bound object at each attribute read, so it is known by (its class, its name)."""
    owner = getattr(value, "__self__", None)
    if isinstance(owner, type) and type(value).__name__ == "builtin_function_or_method":
        return (id(owner), value.__name__)
    return id(value)
