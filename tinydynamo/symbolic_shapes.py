"""Dynamic shapes: which input sizes become symbols, and the guards over those symbols.

TorchDynamo does not invent its own symbolic algebra; neither do we. Every OutputGraph's
FakeTensorMode carries a ``torch.fx.experimental.symbolic_shapes.ShapeEnv``, and an input whose
dims should be dynamic is faked with ``fake_mode.from_tensor(t, symbolic_context=
StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC or STATIC per dim]), source=...)``:
its sizes are then ``torch.SymInt`` s (``s0``, ``s1``...). Using torch's machinery is what makes
this general: every ATen meta function already propagates symbols (a view of ``(s0, 8)`` to
``(s0, -1, 4)`` is ``(s0, 2, 4)``, a matmul checks ``s1 == s2`` and the ShapeEnv records it),
so no op needs a shape rule of ours. The ShapeEnv also records every fact the trace relied on
(``if x.shape[0] > 4`` evaluates a SymBool: the guard is ``5 <= s0``), sizes 0 and 1 stay static
(0/1 specialisation), and ``produce_guards`` writes those facts as Python over the inputs'
sources (``2 <= L['x'].size()[1]``, ``L['y'].size()[0] == L['x'].size()[0]``).

This module holds what is ours:

* the policy (as torch.compile's): ``dynamic=False`` static; ``dynamic=True`` symbolic from the
  start; ``dynamic=None`` static first, and on a recompile the dims that changed since the last
  compile of the same code object and input source become dynamic ("automatic dynamic");
  ``mark_dynamic`` / ``maybe_mark_dynamic`` / ``mark_static`` per tensor, ahead of time (the same
  attributes torch._dynamo sets, so either API works); parameters and buffers stay static;
* :class:`TorchSource`, our sources as torch's ShapeEnv sees them, and :class:`SymbolSource`, where a
  SymInt placeholder's value is read at run time (``L['x'].size()[1]``);
* the ``SHAPE_ENV`` guard kind: the relations, checked in the frame's one generated check
  function, with the failing relation as the recompile reason.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch._guards import GuardSource, Source as TorchGuardSource
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    IsNonOverlappingAndDenseIndicator,
    RelaxedUnspecConstraint,
    ShapeEnv,
    StatelessSymbolicContext,
)

from tinydynamo import config, logs
from tinydynamo.source import LocalSource, ModuleMemberSource, Source, SourceScope

log = logs.get_logger("dynamic")


# ---- marking tensors ahead of time (torch._dynamo.mark_dynamic & co., the same attributes) -------
def _dims(t: torch.Tensor, index) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mark_dynamic/mark_static take a tensor, not {type(t).__name__}")
    dims = list(index) if isinstance(index, (list, tuple)) else [index]
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < t.dim():
            raise IndexError(f"dim {d!r} out of range for a {t.dim()}-d tensor")
    return [d % t.dim() for d in dims]


def _add(t: torch.Tensor, attr: str, dims: list[int]) -> None:
    if not hasattr(t, attr):
        setattr(t, attr, set())
    getattr(t, attr).update(dims)


def mark_dynamic(t: torch.Tensor, index) -> None:
    """Dim(s) ``index`` of ``t`` must be compiled symbolically; if the trace specialises one (a
    branch on its exact value, ``range`` over it...), compiling raises ConstraintViolationError."""
    _add(t, "_dynamo_dynamic_indices", _dims(t, index))


def maybe_mark_dynamic(t: torch.Tensor, index) -> None:
    """Like :func:`mark_dynamic`, but specialising the dim is allowed (no error)."""
    _add(t, "_dynamo_weak_dynamic_indices", _dims(t, index))


def mark_static(t: torch.Tensor, index=None) -> None:
    """Dim(s) ``index`` (all dims if None) of ``t`` stay static, whatever the policy says."""
    _add(t, "_dynamo_static_indices", _dims(t, range(t.dim()) if index is None else index))


# ---- the policy ---------------------------------------------------------------------------------
def policy_patch(dynamic: bool | None) -> dict[str, bool]:
    """The config a ``compile(dynamic=...)`` frame is compiled under (as torch.compile patches it)."""
    if dynamic is True:
        return {"assume_static_by_default": False}
    if dynamic is False:
        return {"automatic_dynamic_shapes": False}
    return {}


def current_policy() -> bool | None:
    """The ``dynamic=`` setting the config now expresses (given to resume functions compiled later)."""
    if not config.assume_static_by_default:
        return True
    if not config.automatic_dynamic_shapes:
        return False
    return None


def update_frame_state(before: tuple | None, now: tuple) -> tuple:
    """The sizes remembered for one input after a compile at sizes ``now``: each dim's size while it
    has stayed the same, ``None`` (dynamic from then on) once it changed; every dim once the rank changed."""
    if before is None:
        return tuple(now)
    if len(before) != len(now):
        return (None,) * len(now)
    return tuple(None if b != s else s for b, s in zip(before, now))


def dynamic_dims(value: torch.Tensor, source: Source, frame_state: dict | None) -> tuple[list, list, list[str]]:
    """``(dynamic_sizes, constraint_sizes, reasons)`` for one tensor input: per dim a DimDynamic, a
    constraint (for ``mark_dynamic``: specialising it is an error) and why it is dynamic.

    ``frame_state`` (one per code object) remembers the sizes each input source had at the last
    compile; a dim whose size changed is recorded as ``None`` there, and stays dynamic from then on.
    """
    n = value.dim()
    static = [DimDynamic.STATIC] * n, [None] * n, []
    if isinstance(source, ModuleMemberSource) or isinstance(value, torch.nn.Parameter):
        if config.force_parameter_static_shapes:  # parameters and buffers: static (torch does the same)
            return static
    changed: set[int] = set()
    if frame_state is not None:
        key = source.name()
        before = frame_state.get(key)
        now = tuple(value.shape)
        merged = frame_state[key] = update_frame_state(before, now)
        if config.automatic_dynamic_shapes:
            changed = {i for i, s in enumerate(merged) if s is None}
            if before is not None and len(before) == len(now):
                for i in changed:
                    if before[i] is not None:
                        log.info("automatic dynamic: %s size(%d) changed %s -> %s; compiling it as a symbol",
                                 key, i, before[i], now[i])
    strong = getattr(value, "_dynamo_dynamic_indices", set())
    weak = getattr(value, "_dynamo_weak_dynamic_indices", set())
    pinned = getattr(value, "_dynamo_static_indices", set())
    sizes, constraints, reasons = [], [], []
    for i in range(n):
        constraint, why = None, None
        if i in pinned:
            kind = DimDynamic.STATIC
        elif i in strong:
            kind, why = DimDynamic.DYNAMIC, "mark_dynamic"
            constraint = RelaxedUnspecConstraint(warn_only=False)
        elif i in weak:
            kind, why = DimDynamic.DYNAMIC, "maybe_mark_dynamic"
        elif i in changed:
            kind, why = DimDynamic.DYNAMIC, "automatic dynamic (its size changed)"
        elif not config.assume_static_by_default:  # dynamic=True: equal sizes share a symbol (duck shaping)
            kind, why = DimDynamic.DUCK, "dynamic=True"
        else:
            kind = DimDynamic.STATIC
        sizes.append(kind)
        constraints.append(constraint)
        if why is not None:
            reasons.append(f"size({i})={value.shape[i]}: {why}")
    return sizes, constraints, reasons


def int_is_dynamic(value: int, source: Source, frame_state: dict | None) -> str | None:
    """Why the int argument ``value`` (at ``source``) is compiled as a symbol, or None: as torch does,
    ints are specialised (guarded by value) until one changes ("automatic dynamic"), or from the
    start with ``dynamic=True``. 0 and 1 stay static; so do ints that are not frame arguments
    (module attributes, globals: torch specialises those too)."""
    if not isinstance(source, LocalSource) or value in (0, 1):
        return None
    changed = False
    if frame_state is not None:
        key = source.name()
        before = frame_state.get(key)
        if before is None:
            frame_state[key] = ("int", value)
        elif before != ("int", value):  # changed once: a symbol from now on
            frame_state[key] = ("int", None)
        changed = frame_state[key] == ("int", None)
    if changed and config.automatic_dynamic_shapes:
        log.info("automatic dynamic: int %s changed (now %s); compiling it as a symbol", source.name(), value)
        return "automatic dynamic (its value changed)"
    if not config.assume_static_by_default:
        return "dynamic=True"
    return None


def new_shape_env() -> ShapeEnv:
    """The ShapeEnv of one frame. Data-dependent output shapes (``nonzero``) stay errors (graph breaks);
    so does a value read out of a tensor inside an op (``torch.empty(t)`` reads ``t.item()``) unless
    ``config.capture_scalar_outputs``: then it is an unbacked symbol, as ``.item()`` itself is."""
    return ShapeEnv(allow_scalar_outputs=config.capture_scalar_outputs, allow_dynamic_output_shape_ops=False)


def symbolic_context(sizes: list, constraints: list) -> StatelessSymbolicContext:
    return StatelessSymbolicContext(dynamic_sizes=sizes, constraint_sizes=constraints)


# ---- sources ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TorchSource(TorchGuardSource):
    """One of our sources, seen by torch's ShapeEnv (which names symbols' origins with
    ``torch._guards.Source`` objects: ``TensorPropertySource(TorchSource(L['x']), SIZE, 1)`` is
    ``L['x'].size()[1]``)."""

    ours: Any

    @property
    def _name_template(self) -> str:
        # the expression generated code evaluates (a class attribute's source names the class by its
        # module path, which the check function and the compiled frame cannot evaluate; code() uses
        # the class as a constant of their scope)
        return self.ours.code()

    @property
    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL


@dataclasses.dataclass(frozen=True)
class SymbolSource(Source):
    """Where a size symbol's value is read at run time: ``L['x'].size()[1]``, ``L['x'].stride()[0]``."""

    expr: str

    def name(self) -> str:
        return self.expr


def symbol_source(shape_env: ShapeEnv, symbol) -> SymbolSource:
    return SymbolSource(shape_env.var_to_sources[symbol][0].name)


# ---- SHAPE_ENV guards (the kind itself is registered in tinydynamo.guards) ----------------------
def produce_guards(shape_env: ShapeEnv, tracked: list[tuple], scope: SourceScope) -> list[str]:
    """The ShapeEnv's facts about the inputs, as Python relations over their sources (one SHAPE_ENV
    guard each). Raises torch's ConstraintViolationError if a ``mark_dynamic`` dim was specialised."""
    if not tracked:
        return []
    exprs = shape_env.produce_guards([t[0] for t in tracked], [TorchSource(t[1]) for t in tracked],
                                     input_contexts=[t[3] for t in tracked])
    for value, source, _, _ in tracked:  # an int the trace specialised: guarded by its value
        if isinstance(value, torch.SymInt) and value.node.maybe_as_int() is not None:
            exprs.append(f"{source.code()} == {value.node.maybe_as_int()}")
    if exprs:
        # names the printed relations may use
        for name, value in (("math", math), ("torch", torch),
                            ("IsNonOverlappingAndDenseIndicator", IsNonOverlappingAndDenseIndicator)):
            scope.names.setdefault(name, value)
    return list(exprs)
