"""One way to swap entries of any registry for a while: ``with swap(registry, {key: fn}):``.

Every extension point of both packages is a registry, a dict from a key to the function that
does the work: opcode handlers (``symbolic_convert.OPCODE_HANDLERS``), guard kinds
(``guards.GUARD_KINDS``), the check-function generator and the cache lookup (one-entry dicts in
``guards`` and ``eval_frame``), and tininductor's op tables (decompositions, lowerings, VJP rules:
``tininductor/registry.py``). The course plugs a learner's version of any entry in with
:func:`swap`, and every ``use_*`` helper is this one context manager.

It is ``unittest.mock.patch.dict`` restricted to the keys given: only those entries are saved and
put back (an entry that was absent is removed again), also when the block raises, and entries
registered inside the block under other keys are kept. Keys are compared exactly (an
``OpRegistry``'s packet fallback does not apply: swapping ``aten.add.Tensor`` adds that entry, it
does not overwrite ``aten.add``'s). tinydynamo is the lower package, so the mechanism lives here.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

_ABSENT = object()

#: bumped whenever a swap begins or ends: what was compiled under other entries is not reused
#: (tininductor's graph cache keys on it)
generation = 0


@contextlib.contextmanager
def swap(registry: dict, entries: Mapping[Any, Any]) -> Iterator[dict]:
    """Set ``registry[key] = value`` for each of ``entries`` for the ``with`` block, then restore
    exactly what was there before (absent keys are removed again), even if the block raises."""
    if not isinstance(registry, dict):
        raise TypeError(f"swap() takes a registry dict, got {type(registry).__name__}: pass the dict "
                        f"itself (e.g. OPCODE_HANDLERS, lowerings), not {registry!r}")
    global generation
    saved = [(key, dict.get(registry, key, _ABSENT)) for key in entries]
    generation += 1
    try:
        for key, value in entries.items():
            registry[key] = value
        yield registry
    finally:
        for key, old in reversed(saved):
            if old is _ABSENT:
                dict.pop(registry, key, None)
            else:
                registry[key] = old
        generation += 1
