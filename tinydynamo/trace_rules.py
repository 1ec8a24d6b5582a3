"""Which functions tracing treats specially: ``allow_in_graph`` / ``disallow_in_graph`` marks,
``graph_break()`` and ``is_compiling()`` (PyTorch keeps such rules in torch/_dynamo/trace_rules.py; the
decorators themselves are re-exported by :mod:`tinydynamo.api`, the user-facing module).

:func:`tinydynamo.variables.polyfilled.variable_for` asks :func:`special_variable` about every value
it wraps, so the tracer needs only this module, never the API layer above it.

Layer: in the values layer, above functions (the trackers it hands out); below polyfilled.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import InGraphFunctionVariable, OpaqueCallVariable

#: functions called as ONE node of the graph, their insides not traced (allow_in_graph)
ALLOWED_IN_GRAPH: dict[int, Callable] = {}
#: functions never put in the graph: calling one is a graph break (disallow_in_graph)
DISALLOWED_IN_GRAPH: dict[int, Callable] = {}


def allow_in_graph(fn: Callable) -> Callable:
    """Put calls of ``fn`` into the graph as a single ``call_function`` node (run on fake tensors at
    trace time), as ``torch._dynamo.allow_in_graph`` does. ``fn`` must take and return tensors."""
    if not callable(fn):
        raise TypeError(f"allow_in_graph expects a callable, got {type(fn).__name__}")
    DISALLOWED_IN_GRAPH.pop(id(fn), None)
    ALLOWED_IN_GRAPH[id(fn)] = fn
    return fn


def disallow_in_graph(fn: Callable) -> Callable:
    """Never put ``fn`` (e.g. a torch op) in the graph: each call is a graph break and runs eagerly."""
    if not callable(fn):
        raise TypeError(f"disallow_in_graph expects a callable, got {type(fn).__name__}")
    ALLOWED_IN_GRAPH.pop(id(fn), None)
    DISALLOWED_IN_GRAPH[id(fn)] = fn
    return fn


def graph_break() -> None:
    """Force a graph break here (does nothing when run eagerly)."""


def is_disabled(fn: Any) -> bool:
    """Marked never to be traced: by ``tinydynamo.disable``, or by ``torch._dynamo.disable`` /
    ``torch.compiler.disable`` in code written for torch.compile (libraries mark their helpers)."""
    try:
        return getattr(fn, "_tinydynamo_disabled", False) is True or getattr(fn, "_torchdynamo_disable", False) is True
    except Exception:  # noqa: BLE001 - an object whose __getattr__ raises something else
        return False


def is_compiling() -> bool:
    """True while tinydynamo traces the calling code, False when it runs eagerly."""
    return False


def special_variable(value: Any, source) -> Any:
    """The variable for a function marked by this module (or ``is_compiling``), else None."""
    if value is graph_break or value is _TORCH_GRAPH_BREAK:  # ours, or torch._dynamo's in code written for it
        return OpaqueCallVariable(value, "graph_break() called")
    if any(value is f for f in _IS_COMPILING):
        return InGraphFunctionVariable(lambda *a, **k: True, constant=ConstantVariable(True))
    if id(value) in DISALLOWED_IN_GRAPH and DISALLOWED_IN_GRAPH[id(value)] is value:
        return OpaqueCallVariable(value, f"{getattr(value, '__qualname__', value)} is marked disallow_in_graph")
    if id(value) in ALLOWED_IN_GRAPH and ALLOWED_IN_GRAPH[id(value)] is value:
        return InGraphFunctionVariable(value)
    return None


def _is_compiling_functions() -> tuple:
    fns = [is_compiling, torch.compiler.is_compiling, torch._dynamo.is_compiling]
    fns += [getattr(torch.compiler, "is_dynamo_compiling", is_compiling)]
    return tuple(fns)


_IS_COMPILING = _is_compiling_functions()
_TORCH_GRAPH_BREAK = torch._dynamo.graph_break
