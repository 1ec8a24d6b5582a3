"""Polyfills: plain-Python stand-ins for C functions and library code the interpreter does not trace.

TorchDynamo cannot look inside C functions (``functools.reduce``, ``itertools.chain``, ``copy.copy``
of a list) and does not trace most of the standard library, yet user code calls them all the
time. This module holds what replaces them, as plain Python with no trackers (a leaf of the package):

1. **Pure functions over constants** (``PURE_FUNCTIONS``): a vetted table of functions with no
   side effects; called with constant arguments they simply run at trace time (the result is a
   constant of the graph, e.g. ``math.gcd(6, 4)``, ``dataclasses.fields(Cfg)``).
2. **Python reimplementations** (``FUNCTION_POLYFILLS``): plain Python functions with the same
   behaviour (``reduce``, ``accumulate``, ``sorted(key=...)``, ``copy.copy``...) that the translator
   *inlines* like user code, so tensors flowing through them become graph nodes.
3. **Constant library objects** (``constant_object_types``): immutable objects (a signature, a
   ``torch.finfo``, an annotation) whose attributes and methods run at trace time.

How the interpreter uses them (which tracker a polyfilled function or class becomes) is
:mod:`tinydynamo.variables.polyfilled`, in the layer of the trackers.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import inspect
import itertools
import math
import operator
import re
import types
import typing
import unittest

import torch
import torch.utils.checkpoint

from tinydynamo.exc import unimplemented

try:
    import numpy as np
except ImportError:  # numpy is optional (torch imports it when it is installed)
    np = None


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


def _index_choices(n, r, next_indices):
    """Every list of ``r`` indices below ``n``, in lexicographic order, each index drawn from
    ``next_indices(chosen so far)``: the shared core of combinations and permutations."""
    chosen = [[]]
    for _ in range(r):
        chosen = [c + [i] for c in chosen for i in next_indices(c, n)]
    return chosen


def combinations(iterable, r):
    pool = tuple(iterable)
    for c in _index_choices(len(pool), r, lambda c, n: range(c[-1] + 1 if c else 0, n)):
        yield tuple([pool[i] for i in c])


def combinations_with_replacement(iterable, r):
    pool = tuple(iterable)
    for c in _index_choices(len(pool), r, lambda c, n: range(c[-1] if c else 0, n)):
        yield tuple([pool[i] for i in c])


def permutations(iterable, r=None):
    pool = tuple(iterable)
    r = len(pool) if r is None else r
    for c in _index_choices(len(pool), r, lambda c, n: [i for i in range(n) if i not in c]):
        yield tuple([pool[i] for i in c])


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


def tee(iterable, n=2):
    """``itertools.tee``: ``n`` generators over one iterator, each with a buffer of the values the others
    have read ahead; the iterator advances only when a generator needs its next value, as tee's does."""
    it = iter(iterable)
    buffers = [[] for _ in range(n)]

    def gen(mine):
        while True:
            if not mine:
                try:
                    value = next(it)
                except StopIteration:
                    return
                for b in buffers:
                    b.append(value)
            yield mine.pop(0)

    return tuple([gen(b) for b in buffers])


def sorted_(iterable, /, *, key=None, reverse=False):
    items = list(iterable)
    keys = items if key is None else [key(x) for x in items]
    return [items[i] for i in argsort(keys, reverse)]


def argsort(keys, reverse=False):
    """Indices that sort ``keys`` (constants: folded at trace time, see PURE_FUNCTIONS)."""
    return sorted(range(len(keys)), key=keys.__getitem__, reverse=reverse)


def _fromkeys(make):
    """``cls.fromkeys(iterable, value=None)`` of a dict class: each key of ``iterable`` -> ``value``."""

    def fromkeys(iterable, value=None):
        d = make()
        for k in iterable:
            d[k] = value
        return d

    return fromkeys


def regex_matches(pattern, text) -> bool:
    """``re.search(pattern, text) is not None`` (a pure function: run at trace time on constants)."""
    return re.search(pattern, text) is not None


def assert_raises(self, expected_exception, fn, *args, **kwargs):
    """``TestCase.assertRaises(exc, fn, *args)``, the callable form, as a try/except the translator traces
    (unittest's own goes through a context manager's ``__exit__``)."""
    try:
        fn(*args, **kwargs)
    except expected_exception:
        return None
    raise self.failureException(f"{getattr(expected_exception, '__name__', expected_exception)} not raised")


def assert_raises_regex(self, expected_exception, expected_regex, fn, *args, **kwargs):
    """``TestCase.assertRaisesRegex(exc, regex, fn, *args)``, the callable form (see :func:`assert_raises`)."""
    try:
        fn(*args, **kwargs)
    except expected_exception as e:
        if not regex_matches(expected_regex, str(e)):
            raise self.failureException(f'"{expected_regex}" does not match "{e}"') from None
        return None
    raise self.failureException(f"{getattr(expected_exception, '__name__', expected_exception)} not raised")


#: library methods -> (a traceable stand-in, the fewest positional arguments it takes after ``self``); a call
#: with fewer (``with self.assertRaises(E):``, the context-manager form) is not replaced
METHOD_POLYFILLS = {
    unittest.TestCase.assertRaises: (assert_raises, 2),
    unittest.TestCase.assertRaisesRegex: (assert_raises_regex, 3),
}

dict_fromkeys = _fromkeys(dict)
ordered_dict_fromkeys = _fromkeys(collections.OrderedDict)
defaultdict_fromkeys = _fromkeys(collections.defaultdict)


def copy_copy(x):
    if isinstance(x, list):
        return list(x)
    if isinstance(x, dict):
        return dict(x)
    if isinstance(x, tuple):
        return x
    if isinstance(x, set):
        return set(x)
    return copy_other(x)


def copy_other(x):
    """Copying any other object (its __copy__, __reduce_ex__...) is not traced: a graph break (variables/polyfilled.py)."""
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
    """Folded at trace time over constants and objects from outside (a model's config): the copy is a
    new object that only the trace holds (``FRESH_RESULTS``), so the frame may set and delete its
    attributes, which happen on it at once. The copy is taken when compiling and the original is not
    guarded (a later change to it is not seen). A tensor is not a constant: Unsupported."""
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
    itertools.tee: tee,
    copy.copy: copy_copy,
    copy.deepcopy: deepcopy_,
    dict.fromkeys: dict_fromkeys,
    collections.OrderedDict.fromkeys: ordered_dict_fromkeys,
    collections.defaultdict.fromkeys: defaultdict_fromkeys,
}

# ---- 1. pure functions over constants ---------------------------------------------------------------------
#: pure functions whose result is a new object nothing else refers to (``SideEffects.track_private``)
FRESH_RESULTS = {_deepcopy_atom}
PURE_FUNCTIONS = {
    argsort, _deepcopy_atom, dataclasses.fields, dataclasses.is_dataclass,  # (not asdict: it reads values)
    inspect.isclass, inspect.getmro,  # (signature/isfunction/ismethod: functions.FOLDABLE_LIBRARY_FUNCTIONS,
    # which rebuild a bound method, so that ``inspect.signature(self.forward)`` leaves out ``self``)
    math.gcd, math.prod, math.isclose, math.comb, math.perm, operator.index,
    collections.namedtuple,
    typing.get_origin, typing.get_args, regex_matches,  # annotations are constants (typing_types)
}


def numpy_scalar_types() -> tuple:
    if np is None:
        return ()
    return (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_)


def numpy_constant_types() -> tuple:
    """NumPy's dtype and type-limit objects (``np.dtype('float32')``, ``np.finfo(t)``): immutable, made
    from constants, so folded at trace time."""
    if np is None:
        return ()
    return (np.dtype, np.finfo, np.iinfo)


def python_number(value):
    """A NumPy number (``np.float64(1.5)``, from ``np.finfo(t).max``) as the Python number it holds;
    any other value as it is. ``np.bool_`` is refused: torch ops promote it unlike ``True``."""
    if np is None or not isinstance(value, np.generic):
        return value
    if isinstance(value, np.bool_):
        unimplemented("a NumPy bool in a torch op (torch promotes it unlike a Python bool)")
    return value.item()


def constant_object_types() -> tuple:
    """Immutable library objects kept as constants of the trace (attributes and methods run at trace time)."""

    return (inspect.Signature, inspect.Parameter, types.MappingProxyType, dataclasses.Field, torch.finfo,
            torch.iinfo) + typing_types() + numpy_scalar_types() + numpy_constant_types()


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
