"""The rest of ``torch._dynamo``'s public API: ``allow_in_graph``, ``disallow_in_graph``, ``graph_break``,
``run``, ``export``, ``is_compiling`` (``torch.compiler``-style names live in :mod:`tinydynamo.compiler`).

Functions marked here (the marks are kept in :mod:`tinydynamo.trace_rules`) are found by
:func:`tinydynamo.variables.polyfilled.variable_for` (VariableBuilder asks it about every value it
wraps), so marking takes effect at the next trace (``tinydynamo.reset()`` to forget graphs already
compiled, as with torch).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from tinydynamo.convert_frame import compile_frame
from tinydynamo.eval_frame import OptimizedFunction, OptimizedModule, _current_backend, _user_function, get_cache
from tinydynamo.exc import unimplemented
from tinydynamo.trace_rules import (  # noqa: F401  (the marks live where the tracer reads them)
    ALLOWED_IN_GRAPH,
    DISALLOWED_IN_GRAPH,
    allow_in_graph,
    disallow_in_graph,
    graph_break,
    is_compiling,
    special_variable,
)


# ---- run: cached code only ---------------------------------------------------------------------------------
def run(fn: Callable | None = None):
    """``run(compiled_fn)``: use the graphs compiled so far, never compile a new one (a cache miss runs
    eagerly), like ``torch._dynamo.run``."""
    if fn is None:
        return run
    if isinstance(fn, OptimizedModule):
        fn = fn._compiled_forward
    if not isinstance(fn, OptimizedFunction):
        _user_function(fn)  # a clear TypeError for what cannot be compiled at all
        fn = OptimizedFunction(fn, backend="eager")
    return RunOnlyFunction(fn)


class RunOnlyFunction:
    def __init__(self, compiled):
        self._compiled = compiled

    def __call__(self, /, *args, **kwargs):
        c = self._compiled
        L = c._bind(args, kwargs)
        for entry in get_cache(c._code).entries:  # any backend: only cached code runs
            if entry.check_fn(L, c._globals):
                _current_backend.append(entry.backend)
                try:
                    return entry.run(L, c._globals)
                finally:
                    _current_backend.pop()
        return c._orig_fn(*args, **kwargs)


# ---- export: one graph with its guards ------------------------------------------------------------------------
class ExportResult(NamedTuple):
    graph_module: torch.fx.GraphModule
    guards: list  # tinydynamo.guards.Guard: what must hold for the graph to be valid


def export(f: Callable, *extra_args, aten_graph: bool = False, decomposition_table: dict | None = None,
           **extra_kwargs):
    """``export(f)(*args)`` -> ExportResult(graph_module, guards): the whole of ``f`` as ONE graph (any
    graph break raises Unsupported, as fullgraph does). The graph's placeholders are the frame's inputs
    (arguments, then lifted parameters/buffers), in the order ``graph_module.meta['input_sources']`` names;
    ``graph_module.meta['call_like_f']`` calls it as ``f`` is called and returns what ``f`` returns.

    ``aten_graph=True`` (torch._dynamo.export's flag): the captured graph is traced once more with
    ``make_fx`` on fake copies of the inputs, so its nodes are ATen ops (``aten.mm.default``...), further
    decomposed by ``decomposition_table`` if given; it takes the same inputs in the same order."""

    if isinstance(f, OptimizedModule):
        f = f._orig_mod
    if isinstance(f, OptimizedFunction):
        f = f._orig_fn
    if isinstance(f, torch.nn.Module):
        f = f.forward

    def inner(*args, **kwargs):
        captured = {}

        def backend(gm, example_inputs):
            captured["gm"], captured["inputs"] = gm, list(example_inputs)
            return gm.forward

        wrapper = OptimizedFunction(f, backend, nopython=True)
        L = wrapper._bind(args, kwargs)
        entry = compile_frame(wrapper._fn, L, wrapper._globals, wrapper._backend, f.__qualname__)
        if entry.break_reason is not None:
            unimplemented(f"export needs one graph; the frame breaks: {entry.break_reason}")
        gm = captured.get("gm", entry.graph_module)
        sources = [n.meta.get("source") for n in gm.graph.nodes if n.op == "placeholder"]
        if aten_graph:
            gm = _aten_graph(gm, captured.get("inputs", []), decomposition_table)
        gm.meta["input_sources"] = sources
        # f's calling convention: arguments as f takes them, f's return value rebuilt from the graph's outputs
        # (the guards are not checked: an exported graph is reused as it is)
        gm.meta["call_like_f"] = lambda *a, **k: entry.run(wrapper._bind(a, k), wrapper._globals)
        return ExportResult(gm, list(entry.check_fn.guards))

    if extra_args or extra_kwargs:  # the old spelling export(f, *args)
        return inner(*extra_args, **extra_kwargs)
    return inner


def _aten_graph(gm: torch.fx.GraphModule, example_inputs: list, decomposition_table) -> torch.fx.GraphModule:
    """The captured (torch-level) graph re-traced to ATen ops by ``make_fx`` on fake tensors."""
    fake_mode = FakeTensorMode()
    fakes = [fake_mode.from_tensor(t, static_shapes=True) for t in example_inputs]
    with fake_mode:
        aten = make_fx(gm, decomposition_table=decomposition_table, tracing_mode="real")(*fakes)
    aten.graph.eliminate_dead_code()  # unused aten.detach nodes autograd records for saved tensors
    aten.recompile()
    return aten
