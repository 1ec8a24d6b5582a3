"""``V`` and ``ops``: the swappable handler that gives one IR body many meanings.

An IR node's body is a Python function ``inner_fn(index)`` that calls ``ops.load``,
``ops.add``, ``ops.store``... It never says *what* those calls do. Whoever runs the body
installs a handler first::

    with V.set_ops_handler(PlainTextHandler()):
        print(body(index))          # -> "add(load(arg0_1, i0), 1.0)"

The scheduler installs a handler that records reads and writes, the Triton backend one that
prints Triton expressions, the C++ backend one that prints C++. This single indirection
keeps every code generator small: they are dictionaries of op -> format string.

The ops every handler understands (the *ops protocol*, shared by all backends):

=====================================  =================================================
``load(name, index)``                  read buffer ``name`` at flat sympy ``index``
``store(name, index, value[, mode])``  write ``value``; ``mode="atomic_add"`` adds it instead
                                       (a scatter-add; several elements may hit one place)
``reduction(dtype, src_dtype,          combine ``value`` over the reduction loop;
  reduction_type, value)``             types: ops_table.REDUCTION_TYPES
``constant(value, dtype)``             a Python scalar
``index_expr(expr, dtype)``            an index expression used as a value (arange, masks)
``indirect_indexing(value, size[,     a loaded integer as an index *variable* (a sympy
  check])``                            symbol; negative values wrap by ``size``); with
                                       ``check`` (the default) the kernel raises if it is
                                       still out of range (runtime/index_check.py)
``to_dtype(x, dtype)``                 an explicit cast (``prims.convert_element_type``)
``where(cond, a, b)``                  select
``masked(mask, body, other)``          ``body()`` where ``mask`` holds, ``other`` elsewhere; the
                                       loads inside need not touch memory in the other lanes
                                       (Triton masks them). A handler without its own
                                       ``masked`` gets ``where(mask, body(), other)``, so the
                                       body's indices must stay in bounds in every lane.
unary, binary: ``neg exp ... add mul ...``  one row each in ops_table.py (the op table), which
                                       also says how each prints for Triton and C++
=====================================  =================================================
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Iterator

import sympy
import torch

from .ops_table import OP_TABLE, OPS

#: the pointwise ops, by arity (from the op table, ops_table.py); ``where`` is the one ternary op
UNARY_OPS = [op.name for op in OP_TABLE if op.arity == 1]
BINARY_OPS = [op.name for op in OP_TABLE if op.arity == 2]
#: the ops that are not pointwise format strings: memory, reductions, constants, indexing, casts
OTHER_OPS = "load store reduction constant index_expr indirect_indexing to_dtype masked".split()
POINTWISE_OPS = frozenset(OPS)
ALL_OPS = POINTWISE_OPS | frozenset(OTHER_OPS)


class NullHandler:
    """The handler installed when nobody installed one: a clear error instead of a silent no-op."""

    def __getattr__(self, name: str):
        raise RuntimeError(
            f"ops.{name}() called with no ops handler installed; run IR bodies inside "
            "`with V.set_ops_handler(handler):`"
        )


class PlainTextHandler:
    """Turns a body into a readable nested expression string (for teaching and debugging).

    PyTorch's counterpart is ``MockHandler`` (torch/_inductor/ops_handler.py). It accepts the
    ops of the op table (ops_table.py) and the other ops of the protocol; any other name is an error.
    """

    def __getattr__(self, name: str):
        if name not in ALL_OPS:
            raise AttributeError(f"unknown op {name!r}; the ops protocol is listed in virtualized.py "
                                 "and its pointwise ops in ops_table.py")

        def op(*args):
            return f"{name}({', '.join(_fmt(a) for a in args)})"

        return op

    def load(self, name, index):
        return f"load({name}, {_index_str(index)})"

    def store(self, name, index, value, mode=None):
        return f"store({name}, {_index_str(index)}, {value}{', ' + mode if mode else ''})"

    def indirect_indexing(self, value, size, check=True):
        return sympy.Symbol(f"({value})", integer=True)


@functools.lru_cache(maxsize=4096)
def _index_str(index) -> str:
    """An index printed once: a graph's buffers load at the same few expressions again and again,
    and sympy's printer is slow (the IR text of BART's training graphs takes 0.32 s printing each
    load's index, 0.07 s printing each distinct index once)."""
    return str(index)


def _fmt(a: Any) -> str:
    if isinstance(a, torch.dtype):
        return str(a).replace("torch.", "")
    return str(a)


class _Virtualized:
    """Thread-local slots for the current ops handler, graph being lowered and kernel being generated."""

    def __init__(self):
        self._local = threading.local()

    def _get(self, slot: str, default=None):
        return getattr(self._local, slot, default)

    @contextlib.contextmanager
    def _set(self, slot: str, value) -> Iterator[Any]:
        prior = self._get(slot)
        setattr(self._local, slot, value)
        try:
            yield value
        finally:
            setattr(self._local, slot, prior)

    def set_ops_handler(self, handler):
        """``with V.set_ops_handler(h):`` makes every ``ops.xyz(...)`` call ``h.xyz(...)``."""
        return self._set("ops", handler)

    def set_graph_handler(self, graph):
        return self._set("graph", graph)

    def set_kernel_handler(self, kernel):
        return self._set("kernel", kernel)

    @property
    def ops(self):
        return self._get("ops") or NullHandler()

    @property
    def graph(self):
        graph = self._get("graph")
        if graph is None:
            raise RuntimeError("no GraphLowering is active (use `with V.set_graph_handler(graph):`)")
        return graph

    @property
    def kernel(self):
        return self._get("kernel")


V = _Virtualized()


class _OpsProxy:
    """``ops.add(a, b)`` forwards to whichever handler is installed *when it is called*.

    (``ops.add`` itself is a small function, so lowerings can pass ``ops.exp`` around before
    any handler exists.)
    """

    def __getattr__(self, name: str):
        if name == "constant":
            return _constant
        if name == "masked":
            return _masked

        def call_current_handler(*args, **kwargs):
            return getattr(V.ops, name)(*args, **kwargs)

        call_current_handler.__name__ = name
        return call_current_handler


#: how ``ops.constant`` computes a size expression: set by lowering.py (its ``symbolic_scalar``), the
#: layer that turns sympy into ops; this module never imports it
symbolic_constant: dict = {"fn": None}


def _constant(value, dtype):
    """``ops.constant``; a "constant" that is a size expression (``s0 - 1``, a bound an index_put
    lowering computed from a symbolic size) is computed by the kernel from its size arguments."""
    if isinstance(value, sympy.Basic) and value.free_symbols:
        return symbolic_constant["fn"](value, dtype)
    return V.ops.constant(value, dtype)


def _masked(mask, body, other):
    """``ops.masked``: the handler's own (TorchInductor's masked subblock: Triton loads nothing in
    the lanes outside ``mask``), else a ``where`` over the body evaluated in every lane."""
    handler = V.ops
    own = getattr(type(handler), "masked", None)
    if own is not None:
        return own(handler, mask, body, other)
    return handler.where(mask, body(), other)


ops = _OpsProxy()
