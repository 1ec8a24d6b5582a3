"""Compiling one frame: a cache miss in, a cache entry (or "run it eagerly") out.

    eval_frame.OptimizedFunction._call     a call, its arguments bound into L; the cache missed
      -> convert_frame(fn, cache, L, G, backend)
           recompile bookkeeping: why every entry failed; config.recompile_limit
           compile_frame(fn, L, G, backend)
             InstructionTranslator(code).run()   bytecode -> FX graph + guards  (symbolic_convert.py)
             OutputGraph.compile(...)            graph -> backend; guards -> check function;
                                                 the code that runs it (output_graph.py, codegen.py)
      <- CompiledFrame (the new entry, inserted first in the cache) or None (Unsupported, an error,
         the recompile limit): the frame runs eagerly, the reason kept in the cache

PyTorch keeps this in ``torch/_dynamo/convert_frame.py`` too; its ``eval_frame`` (the frame hook and
the public API) calls it on a miss. tinydynamo has no frame hook: what the hook does for frames a
compiled frame calls at a graph break, ``eval_frame.wrap_for_resume`` does, and it is passed down
here (with ``call_resume_with_closure``) so this layer never imports ``eval_frame``.
"""
from __future__ import annotations

import collections
import inspect
import types
import warnings
import weakref
from typing import Any, Callable

import torch
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

from tinydynamo import artifacts, bytecode, config, logs, symbolic_shapes
from tinydynamo.backends import compiling_frame
from tinydynamo.decompile import DecompiledCode
from tinydynamo.exc import EagerFallbackWarning, Unsupported
from tinydynamo.guards import note_replaced_modules
from tinydynamo.output_graph import CompiledFrame, OutputGraph
from tinydynamo.skip_frame import CompileCallee, compile_callees
from tinydynamo.source import LocalSource
from tinydynamo.symbolic_convert import InstructionTranslator
from tinydynamo.utils import deferred_full_collections, dynamo_timed
from tinydynamo.variables.autocast import exit_all

#: counters["frames"]["ok"/"unsupported"/...], counters["unsupported"][reason], counters["recompiles"][name]
counters: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

recompiles_log = logs.get_logger("recompiles")
breaks_log = logs.get_logger("graph_breaks")
bytecode_log = logs.get_logger("bytecode")

#: callbacks(event, data) told about every graph break and compiled entry (explain() uses this)
_listeners: list = []


def convert_frame(fn: types.FunctionType, cache, L: dict, G: dict, backend, *, nopython: bool,
                  dynamic: bool | None, wrap_for_resume: Callable,
                  call_resume_with_closure: Callable) -> CompiledFrame | None:
    """Compile a new entry for ``fn``'s code on a cache miss (``cache``: its ``eval_frame.FrameCache``),
    insert it first and return it; or return None after recording why the frame runs eagerly from now on."""
    code = fn.__code__
    name = code.co_qualname if hasattr(code, "co_qualname") else code.co_name
    if cache.entries and not _note_cache_miss(cache, L, G, code, name):
        return None
    try:
        with compiling_frame(strict=nopython or not config.suppress_errors), \
                config.patch(symbolic_shapes.policy_patch(dynamic)):
            entry = compile_frame(fn, L, G, backend, name, allow_graph_breaks=not nopython,
                                  frame_state=cache.frame_state, wrap_for_resume=wrap_for_resume,
                                  call_resume_with_closure=call_resume_with_closure)
    except ConstraintViolationError:  # mark_dynamic(t, d), but the code specialised dim d: the user must know
        raise
    except Unsupported as e:
        counters["frames"]["unsupported"] += 1
        counters["unsupported"][e.reason] += 1
        if nopython:
            raise
        cache.run_eagerly = e.reason
        # the frame runs natively, but what it calls gets frames of its own (tinydynamo.skip_frame)
        cache.eager_code = getattr(e, "eager_code", None) or _eager_code_compiling_callees(fn.__code__, wrap_for_resume)
        breaks_log.info("running %s eagerly: %s", name, e)
        for listener in _listeners:
            listener("eager", (name, e.reason))
        return None
    except Exception as e:
        counters["frames"]["failed"] += 1
        if nopython or not config.suppress_errors:
            raise
        cache.run_eagerly = f"internal error: {type(e).__name__}: {e}"
        warnings.warn(f"tinydynamo: compiling {name} failed ({type(e).__name__}: {e}); running it eagerly. "
                      "Set tinydynamo.config.suppress_errors = False to see the traceback.",
                      EagerFallbackWarning, stacklevel=4)
        return None
    counters["frames"]["ok"] += 1
    cache.entries.insert(0, entry)
    return entry


def _note_cache_miss(cache, L: dict, G: dict, code, name: str) -> bool:
    """A miss with entries already cached: log why each failed (a recompile, or an entry for other objects)
    and count it against the recompile limits. False: a limit is hit, the frame runs eagerly from now on."""
    # every entry failed: say why, newest first (the first failing guard of each)
    reasons = [e.check_fn.failure_reason(L, G) or "compiled for another backend" for e in cache.entries]
    if config.unspecialize_replaced_modules:
        for e in cache.entries:
            note_replaced_modules(e.check_fn, L, G, cache.frame_state)
    reason = cache.last_reason = "; ".join(reasons)
    # only entries pinned to this call's frame arguments are recompiles of it (another block of the
    # same class gets its first entry)
    same = [r for e, r in zip(cache.entries, reasons) if same_id_matched_objects(e, L)]
    limit = _exceeded_limit(len(same), len(cache.entries))
    if limit is not None:
        cache.run_eagerly = f"hit config.{limit} ({getattr(config, limit)})"
        warnings.warn(
            f"tinydynamo: {name} ({code.co_filename}:{code.co_firstlineno}) hit "
            f"config.{limit} ({getattr(config, limit)}); running it eagerly from now on. "
            f"Last recompile reason: {reason}", EagerFallbackWarning, stacklevel=5)
        counters["frames"][limit] += 1
        return False
    if same:  # a new entry for an object already compiled for: a recompile
        counters["recompiles"][name] += 1
        recompiles_log.info("Recompiling function %s in %s:%d\n    triggered by the following guard failure(s):\n%s",
                            name, code.co_filename, code.co_firstlineno,
                            "\n".join(f"    - entry {len(same) - 1 - i}: {r}" for i, r in enumerate(same)))
    else:  # another instance (another block of the same class): its first entry, not a recompile
        recompiles_log.debug("Compiling function %s for other objects (%d entries for others)",
                             name, len(cache.entries))
    return True


def id_matched_objects(entry: CompiledFrame) -> dict[str, Any]:
    """The objects an entry is pinned to by identity *as frame arguments* (``L['self']`` is this module):
    local name -> weak reference or object (PyTorch: the guard manager's ``id_matched_objs``)."""
    return {g.source.local: g.expected for g in entry.check_fn.guards
            if g.kind in ("NN_MODULE", "ID_MATCH") and isinstance(g.source, LocalSource)}


def same_id_matched_objects(entry: CompiledFrame, L: dict) -> bool:
    """Whether ``L`` passes the objects ``entry`` is pinned to: only such entries count against
    ``config.recompile_limit`` (a block class with more instances than the limit compiles each once).
    An entry whose object is gone counts, as in TorchDynamo: modules made anew for every call still
    reach the limit."""
    for local, expected in id_matched_objects(entry).items():
        obj = expected() if isinstance(expected, weakref.ref) else expected
        if obj is not None and L.get(local, _MISSING) is not obj:
            return False
    return True


_MISSING = object()


def _exceeded_limit(same: int, total: int) -> str | None:
    """The limit a new entry would exceed: ``same`` entries pinned to this call's objects, ``total`` in all."""
    if total >= config.accumulated_recompile_limit:
        return "accumulated_recompile_limit"
    if same >= config.recompile_limit:
        return "recompile_limit"
    return None


def compile_frame(fn: types.FunctionType, L: dict, G: dict, backend, name: str,
                  allow_graph_breaks: bool = False, frame_state: dict | None = None, *,
                  wrap_for_resume: Callable | None = None,
                  call_resume_with_closure: Callable | None = None) -> CompiledFrame:
    """Trace ``fn``'s bytecode with the arguments in ``L`` and compile the graph: one cache entry
    (PyTorch: ``convert_frame``'s ``_compile``). The OutputGraph gets the callables a graph break's
    code calls (``wrap_for_resume``, ``call_resume_with_closure``: eval_frame's), so that it never
    imports the layer above."""
    code = fn.__code__
    with artifacts.collecting(name) as arts, dynamo_timed("compile_frame"), deferred_full_collections():
        if code.co_name.startswith("__resume_at_"):  # made by tinydynamo.resume: only bytecode exists
            artifacts.record("source", f"{name} (decompiled)", DecompiledCode(code))
        else:
            try:
                artifacts.record("source", name, inspect.getsource(fn))
            except (OSError, TypeError):
                pass
        listing = bytecode.format_instructions(bytecode.get_instructions(code))
        artifacts.record("bytecode", name, listing)
        bytecode_log.info("BYTECODE %s %s:%d\n%s", name, code.co_filename, code.co_firstlineno, listing)
        output = OutputGraph(G, name.replace(".", "_").replace("<", "").replace(">", ""), frame_state,
                             wrap_for_resume=wrap_for_resume, call_resume_with_closure=call_resume_with_closure)
        tx = InstructionTranslator(code, G, L, output, allow_graph_breaks)
        grad_mode = torch.is_grad_enabled()
        try:
            with torch._C.DisableTorchFunctionSubclass(), dynamo_timed("trace"):
                return_value = tx.run()
        finally:  # tracing `with torch.no_grad():` flips the real mode; the backend must see the frame's
            torch._C._set_grad_enabled(grad_mode)
            exit_all(output.autocast_modes)  # and `with torch.autocast(...)` blocks left open by an error
        brk = tx.graph_break
        if brk is not None:
            counters["graph_breaks"][brk.reason] += 1
            breaks_log.info("Graph break in user code (outermost frame first):\n%s\nReason: %s",
                            "\n".join(reversed(brk.error.user_stack)) or name, brk.reason)
            for listener in _listeners:
                listener("break", brk)
        entry = output.compile(return_value, backend, brk, code)
        for listener in _listeners:
            listener("entry", entry)
    artifacts.dump_debug_dir(arts)
    return entry


def _eager_code_compiling_callees(code: types.CodeType, wrap_for_resume) -> types.CodeType | None:
    """``code`` with every call's callable compiled (None where that cannot be done): what a frame
    that cannot be compiled at all runs, so that one unsupported line in a model's outermost
    ``forward`` does not leave its blocks and layers eager."""
    try:
        return compile_callees(code, CompileCallee(wrap_for_resume)) if wrap_for_resume is not None else None
    except Exception as e:  # noqa: BLE001 - the frame then runs its own code, callees eagerly
        breaks_log.info("not compiling the callees of %s: %s", code.co_name, e)
        return None
