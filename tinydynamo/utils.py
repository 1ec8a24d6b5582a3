"""Compile-time accounting: where the seconds of a first call go (``torch._dynamo.utils`` names).

``with dynamo_timed("phase"):`` around a compile step adds its wall time to that phase; only
compile steps are timed, never a cached call. ``compile_times()`` prints the table that
``torch._dynamo.utils.compile_times()`` prints for TorchDynamo and Inductor: calls and seconds
per phase. Phases nest (``trace`` runs inside ``compile_frame``), so the rows do not add up to
a total: read each as "of which".

    tinydynamo.compile(f)(x)
    print(tinydynamo.utils.compile_times())
"""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import time
from typing import Any

import torch
import torch.utils._pytree as pytree

from tinydynamo import config

#: phase -> wall seconds of each call, in order
_times: dict[str, list[float]] = collections.defaultdict(list)


@contextlib.contextmanager
def dynamo_timed(phase: str):
    """Add the wall time of the ``with`` block to ``phase`` (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    except BaseException as e:  # name the innermost phase that raised (BackendCompilerFailed shows it)
        if getattr(e, "tiny_stage", None) is None:
            try:
                e.tiny_stage = phase
            except AttributeError:
                pass
        raise
    finally:
        _times[phase].append(time.perf_counter() - start)


_deferring = [0]  # 1 while a block defers (a compile inside a compile leaves the thresholds to the outer one)


@contextlib.contextmanager
def deferred_full_collections():
    """No full garbage collection inside the block (``config.defer_full_gc``): generation 2's
    threshold is raised, generations 0 and 1 still collect, and refcounting still frees what
    dies. A full collection walks every live object; a compile grows the heap by about a million
    of them, so the default thresholds rescan it a dozen times. After the block the deferred
    collection runs once, at the next generation-1 collection (TorchDynamo defers them too)."""
    if not config.defer_full_gc or _deferring[0]:  # off, or an outer block already defers
        yield
        return
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
        gc.set_threshold(*thresholds)


def timed(phase: str):
    """Decorator form of :func:`dynamo_timed`."""
    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with dynamo_timed(phase):
                return fn(*args, **kwargs)
        return wrapper
    return decorator


def compile_times(repr: str = "str") -> str | dict[str, tuple[int, float]]:
    """``repr="str"``: a table of phase, calls, total and mean seconds; ``repr="dict"``:
    ``{phase: (calls, total seconds)}``."""
    table = {phase: (len(t), sum(t)) for phase, t in _times.items()}
    if repr == "dict":
        return table
    if repr != "str":
        raise ValueError(f"compile_times(repr={repr!r}): use 'str' or 'dict'")
    lines = [f"{'phase':24} {'calls':>6} {'total s':>9} {'mean s':>9}"]
    for phase, (calls, total) in table.items():
        lines.append(f"{phase:24} {calls:6d} {total:9.4f} {total / calls:9.4f}")
    return "\n".join(lines)


def reset_compile_times() -> None:
    _times.clear()


def tensor_versions(values: Any) -> list[tuple[torch.Tensor, int]]:
    """Each tensor among ``values`` (nested lists, tuples, dicts) with its version counter now.

    A version counter is bumped by every in-place op (``add_``, ``+=``, ``out=``, ``x[i] = v``,
    ``inplace=True``), fake tensors included: comparing before and after running an op on the
    example values says whether the op mutated one of its arguments, whatever it is called.
    """
    return [(t, t._version) for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]


def mutated_any(versions: list[tuple[torch.Tensor, int]]) -> bool:
    """Whether a tensor recorded by :func:`tensor_versions` was mutated since."""
    return any(t._version != v for t, v in versions)


class Identity:
    """``obj`` compared by ``is`` in a dict key or a set (its own ``__eq__`` never runs: a tensor's is
    elementwise); the key keeps it alive, so its ``id`` is not reused while the key exists."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other) -> bool:
        return isinstance(other, Identity) and other.obj is self.obj
