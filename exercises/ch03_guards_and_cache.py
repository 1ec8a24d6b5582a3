# GENERATED from solutions/ch03_guards_and_cache.py by `python -m course.exercises`: edit the marked parts.
"""Chapter 3: guards and the cache. A guard kind, a failure reason, the check-function generator, the lookup.

Plug them into tinydynamo with the context managers the package provides:
``guards.use_guard_kind("CONSTANT_MATCH", code=constant_match_code)``,
``guards.use_guard_kind("TENSOR_MATCH", failure=tensor_match_failure)``,
``guards.use_check_codegen(generate_check_code)`` and ``eval_frame.use_cache_lookup(lookup_entry)``.
"""
from __future__ import annotations

from typing import Any

from tinydynamo.guards import GUARD_KINDS, Guard, TensorMeta
from tinydynamo.source import Source, SourceScope


def constant_match_code(guard: Guard, ref: str, scope: SourceScope) -> list[str]:
    """CONSTANT_MATCH as Python conditions over ``ref`` (a local holding the guarded value).

    ``guard.expected`` is the constant the graph was specialised on. Singletons (None, True,
    False) compare with ``is``. ``int``/``float``/``str`` need the *type* too, because
    ``True == 1`` and ``1 == 1.0``: check ``type(ref) is int`` and then ``ref == 3``
    (``repr`` writes the literal). Anything else: bind it with ``scope.constant(value)`` (a
    name usable in the generated code) and compare type and value through names.
    """
    v = guard.expected
    raise NotImplementedError("Exercise 3.1: conditions that pass exactly for the same constant (type and value); checked with property tests over constants of every type and by recompiles (notebook 03, section 3). Stuck? course.hint('3.1')")


def tensor_match_failure(guard: Guard, value: Any) -> str | None:
    """Why TENSOR_MATCH failed, in words (None if it passes), checking in this order:

    type -> ``"{name} type mismatch: expected {Tensor}, actual {float}"`` (``__name__`` of types,
    ``torch.Tensor`` written as ``torch.Tensor``), dtype, device, rank, each size, each stride,
    requires_grad, e.g. ``"tensor L['x'] size mismatch at index 0: expected 4, actual 5"``.
    ``guard.expected`` is a :class:`TensorMeta`; ``guard.name`` the source (``L['x']``). A ``None``
    size or stride is a dynamic dimension (chapter 10): any value passes here, the SHAPE_ENV
    guards check the relations on it.
    """
    m: TensorMeta = guard.expected
    name = guard.name
    raise NotImplementedError("Exercise 3.2: say in words why TENSOR_MATCH fails, in the documented order and format; checked on every kind of change, device and subclasses included, and in the recompile reason (notebook 03, section 4). Stuck? course.hint('3.2')")


def generate_check_code(guards: list[Guard], scope: SourceScope) -> str:
    """The source of ONE function ``def ___check_guards(L, G):`` that returns True iff all guards pass.

    For each guard: read its source into a local once (``___v0 = L['x']``; ``source.name()``
    is the expression; guards with ``source is None``, like GRAD_MODE, use ``None``), get its
    conditions from ``GUARD_KINDS[g.kind].code(g, ref, scope)``, and emit
    ``if not (c1 and c2 ...): return False``. End with ``return True``.
    """
    raise NotImplementedError("Exercise 3.3: one check function for all guards, each source read once; checked by running it on matching and changed inputs and inside the cache (notebook 03, section 5). Stuck? course.hint('3.3')")


def lookup_entry(entries: list, L: dict, G: dict, backend) -> Any:
    """The cache lookup: the first entry (entries are newest first) compiled for ``backend``
    (``entry.backend is backend``) whose guards pass (``entry.check_fn(L, G)``); None on a miss."""
    raise NotImplementedError("Exercise 3.4: the cache lookup (newest first, this backend only); checked on hand-made entries and inside the real cache (notebook 03, section 5). Stuck? course.hint('3.4')")
