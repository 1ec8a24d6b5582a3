"""Compile-time accounting: where the seconds of a first call go (``torch._dynamo.utils`` names).

``with dynamo_timed("phase"):`` around a compile step adds its wall time to that phase; only
compile steps are timed, never a cached call. ``compile_times()`` prints the table that
``torch._dynamo.utils.compile_times()`` prints for TorchDynamo and Inductor: calls and seconds
per phase. Phases nest (``trace`` runs inside ``compile_frame``), so the rows do not add up to
a total: read each as "of which".

    tinydynamo.compile(f)(x)
    print(tinydynamo.utils.compile_times())

Totals do not say what waited for what. ``with chromium_event_log() as log:`` records each
phase as a span on its thread's track (wall and CPU seconds), and the layers below add theirs
(each kernel a compile worker compiles, each kernel the main process loads): ``log.table()`` is
the first call's timeline, ``log.chrome_trace()`` the same for chrome://tracing or Perfetto
(TorchDynamo's ``ChromiumEventLogger``). ``bench/first_call.py`` prints it for a dashboard model.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import threading
import time
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree

from tinydynamo import config

#: phase -> wall seconds of each call, in order
_times: dict[str, list[float]] = collections.defaultdict(list)


@contextlib.contextmanager
def dynamo_timed(phase: str):
    """Add the wall time of the ``with`` block to ``phase`` (also when it raises); under
    :func:`chromium_event_log`, also a span with its thread's CPU time."""
    start = time.perf_counter()
    cpu = time.thread_time() if _event_logs else None
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
        end = time.perf_counter()
        _times[phase].append(end - start)
        if _event_logs:
            log_event(phase, start, end, cpu=None if cpu is None else time.thread_time() - cpu)


@dataclasses.dataclass
class Event:
    """One span: ``start`` and ``end`` in ``time.perf_counter()`` seconds, on ``track`` (a thread,
    or a worker process); ``cpu``: its thread's CPU seconds, where measured."""

    name: str
    start: float
    end: float
    track: str
    cpu: float | None = None


class ChromiumEventLog:
    """The spans recorded while a :func:`chromium_event_log` block ran."""

    def __init__(self):
        self.origin = time.perf_counter()
        self.events: list[Event] = []

    def table(self, min_seconds: float = 0.0) -> str:
        """The timeline: one span per line, by start, in seconds from the block's start."""
        lines = [f"{'start':>8} {'end':>8} {'wall s':>7} {'cpu s':>6}  {'track':22} name"]
        for e in sorted(self.events, key=lambda e: e.start):
            if e.end - e.start < min_seconds:
                continue
            cpu = f"{e.cpu:6.2f}" if e.cpu is not None else f"{'':6}"
            lines.append(f"{e.start - self.origin:8.3f} {e.end - self.origin:8.3f} {e.end - e.start:7.3f} "
                         f"{cpu}  {e.track[:22]:22} {e.name}")
        return "\n".join(lines)

    def chrome_trace(self) -> dict:
        """The Trace Event Format (``json.dump`` it, open it in chrome://tracing or Perfetto):
        a complete event ("X") per span, in microseconds, one thread row per track."""
        tracks = {track: i for i, track in enumerate(dict.fromkeys(e.track for e in self.events))}
        trace = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": track}}
                 for track, tid in tracks.items()]
        for e in self.events:
            trace.append({"name": e.name, "ph": "X", "pid": 0, "tid": tracks[e.track],
                          "ts": (e.start - self.origin) * 1e6, "dur": (e.end - e.start) * 1e6,
                          "args": {} if e.cpu is None else {"cpu_s": e.cpu}})
        return {"traceEvents": trace, "displayTimeUnit": "ms"}


#: the logs of the active :func:`chromium_event_log` blocks (usually none)
_event_logs: list[ChromiumEventLog] = []
_event_lock = threading.RLock()  # reentrant: a full collection (a span) may start inside


def log_event(name: str, start: float, end: float, track: str | None = None, cpu: float | None = None) -> None:
    """Add a span (``time.perf_counter()`` seconds) to every active event log; a no-op when none
    records. ``track`` defaults to the calling thread's name."""
    if not _event_logs:
        return
    event = Event(name, start, end, track or threading.current_thread().name, cpu)
    with _event_lock:  # spans come from compile threads and worker feeders too
        for log in _event_logs:
            log.events.append(event)


_full_collection_start: list[float] = []  # when the full collection under way began


def _time_full_collections(phase: str, info: dict) -> None:
    """``gc.callbacks``: each full (generation-2) collection as a span on the thread it ran in."""
    if info["generation"] != 2:
        return
    if phase == "start":
        _full_collection_start[:] = [time.perf_counter()]
    elif _full_collection_start:
        log_event(f"gc: full collection ({info['collected']} objects freed)", _full_collection_start.pop(),
                  time.perf_counter())


@contextlib.contextmanager
def chromium_event_log() -> Iterator[ChromiumEventLog]:
    """Record the spans of every compile step while the block runs (TorchDynamo's
    ``ChromiumEventLogger``), and every full garbage collection (it walks every live object: after
    a large compile, a few tenths of a second, wherever it happens to start); nothing is recorded
    outside such a block."""
    log = ChromiumEventLog()
    _event_logs.append(log)
    if _time_full_collections not in gc.callbacks:
        gc.callbacks.append(_time_full_collections)
    try:
        yield log
    finally:
        _event_logs.remove(log)
        if not _event_logs and _time_full_collections in gc.callbacks:
            gc.callbacks.remove(_time_full_collections)


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
