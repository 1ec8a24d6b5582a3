"""Watch a function run, frame by frame and opcode by opcode, and see which torch ops each
instruction called: a ``sys.settrace`` tracer for chapter 1.

Two CPython hooks are combined:

* ``sys.settrace(fn)`` calls ``fn`` with a ``'call'`` event for every new Python frame; when it
  returns a *local* trace function, that one then gets ``'line'``, ``'return'`` and
  ``'exception'`` events for the frame, and ``'opcode'`` events too once
  ``frame.f_trace_opcodes = True``. ``frame.f_lasti`` says which instruction is running.
* a :class:`torch.overrides.TorchFunctionMode` sees every overridable torch call (``torch.relu``,
  ``Tensor.sum``, ``Tensor.__add__`` ...); we attribute each one to the innermost watched frame
  and the instruction it is executing (the ``CALL`` or ``BINARY_OP`` that triggered it).

This *watches*; it cannot *replace* what runs. Replacing a frame's bytecode before it runs
needs PEP 523's frame-evaluation hook, which only C code can install (TorchDynamo does; pure
Python tinydynamo wraps the callable instead). Tracing is also slow: every event is a Python
call, so expect tens of times slower with opcode events on.

    trace = tinydynamo.tracer.trace(fn, x, y)
    print(trace.format())            # call/line/opcode/return listing, torch ops marked
    trace.ops                        # [OpCall(name='torch.relu', lineno=3, opname='CALL', ...), ...]
    trace.opcode_histogram()         # Counter of normalised opnames executed
    trace.lines_with_ops()           # {3: ['torch.relu', 'torch.Tensor.__add__'], ...}

Opcodes are reported as :mod:`tinydynamo.bytecode` normalised instructions, so listings read
the same on CPython 3.11, 3.12 and 3.13 (3.11's ``PRECALL`` executes but has no normalised
instruction; a 3.12 ``RETURN_CONST`` counts as ``LOAD_CONST`` + ``RETURN_VALUE``).
"""
from __future__ import annotations

import collections
import dataclasses
import linecache
import os
import sys
import sysconfig
import types
from typing import Any, Callable

from tinydynamo import bytecode

_THIS_FILE = os.path.abspath(__file__)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


@dataclasses.dataclass(frozen=True)
class TraceEvent:
    """One settrace event in a watched frame. ``instructions``: the normalised instructions that
    came from the running raw instruction (empty for dropped ones such as 3.11's ``PRECALL``)."""

    kind: str  # 'call' | 'line' | 'opcode' | 'return' | 'exception'
    frame_id: int  # serial number of the frame (1 = the traced function's frame)
    depth: int  # 0 for the traced function, 1 for a watched function it calls, ...
    code_name: str
    filename: str
    lineno: int | None
    offset: int
    instructions: tuple[bytecode.Instruction, ...] = ()
    value: Any = None  # 'return': the returned value; 'exception': the exception type


@dataclasses.dataclass(frozen=True)
class OpCall:
    """A torch op called while a watched frame executed one instruction."""

    name: str  # e.g. 'torch.relu', 'torch.Tensor.__add__' (torch.overrides.resolve_name)
    frame_id: int
    depth: int
    code_name: str
    lineno: int | None
    offset: int
    opname: str  # normalised opname of the instruction that called it (CALL, BINARY_OP, ...)
    event_index: int  # index in Trace.events of that frame's latest event when the op ran


@dataclasses.dataclass
class Trace:
    """What :func:`trace` saw: events in order, the torch ops, and the function's result."""

    events: list[TraceEvent]
    ops: list[OpCall]
    result: Any = None

    def frames(self) -> list[str]:
        """Names of the watched frames in the order they were entered (indented by depth)."""
        return ["  " * e.depth + e.code_name for e in self.events if e.kind == "call"]

    def opcode_histogram(self, depth: int | None = 0) -> collections.Counter:
        """Normalised opnames executed (``depth=None``: all watched frames; default: the traced one)."""
        counts: collections.Counter = collections.Counter()
        for e in self.events:
            if e.kind == "opcode" and (depth is None or e.depth == depth):
                counts.update(inst.opname for inst in e.instructions)
        return counts

    def lines_with_ops(self, code_name: str | None = None) -> dict[int, list[str]]:
        """``{line: [torch op names in call order]}`` for one function (default: the traced one)."""
        out: dict[int, list[str]] = {}
        for op in self.ops:
            if (op.code_name == code_name) if code_name else op.depth == 0:
                out.setdefault(op.lineno, []).append(op.name)
        return out

    def format(self, opcodes: bool = True, source: bool = True) -> str:
        """A readable listing: frames, source lines, (opcodes), and ``-> torch op`` marks."""
        ops_at: dict[int, list[str]] = collections.defaultdict(list)
        for op in self.ops:
            ops_at[op.event_index].append(op.name)
        lines: list[str] = []
        for index, e in enumerate(self.events):
            pad = "    " * e.depth
            if e.kind == "call":
                lines.append(f"{pad}call {e.code_name}")
            elif e.kind == "line":
                text = linecache.getline(e.filename, e.lineno or 0).strip() if source else ""
                lines.append(f"{pad}  line {e.lineno:<4} {text}".rstrip())
            elif e.kind == "opcode" and opcodes:
                for inst in e.instructions:
                    arg = f"to #{inst.target}" if inst.target is not None else inst.argrepr
                    arg += " (+NULL)" if inst.push_null else ""
                    lines.append(f"{pad}      {inst.opname:<14} {arg}".rstrip())
            elif e.kind == "return":
                lines.append(f"{pad}return {e.code_name} -> {_short(e.value)}")
            elif e.kind == "exception":
                lines.append(f"{pad}exception in {e.code_name}: {getattr(e.value, '__name__', e.value)}")
            if ops_at.get(index) and lines:  # mark the last line shown for this event
                names = ", ".join(ops_at[index])
                lines[-1] = (f"{lines[-1]}, {names}" if " -> torch" in lines[-1]
                             else f"{lines[-1]:<48} -> {names}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _short(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_user_code(code: types.CodeType) -> bool:
    """Default frame filter: watch your code, not torch's, installed packages', the standard
    library's, or the tracer's own (pass ``include=`` to choose otherwise)."""
    filename = code.co_filename
    if filename.startswith("<frozen"):
        return False
    path = os.path.abspath(filename)
    if path == _THIS_FILE or "site-packages" in path or "dist-packages" in path:
        return False
    return not path.startswith(_STDLIB) and not path.startswith(_torch_dir())


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return "\0"  # matches no path
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


class _Instructions:
    """Normalised instructions per code object, grouped by the raw offset they came from."""

    def __init__(self) -> None:
        self._by_code: dict[types.CodeType, tuple[list[bytecode.Instruction], dict[int, tuple]]] = {}

    def _decode(self, code: types.CodeType):
        if code not in self._by_code:
            insts = bytecode.get_instructions(code)
            grouped: dict[int, list] = collections.defaultdict(list)
            for inst in insts:
                grouped[inst.offset].append(inst)
            self._by_code[code] = (insts, {k: tuple(v) for k, v in grouped.items()})
        return self._by_code[code]

    def at(self, code: types.CodeType, offset: int) -> tuple[bytecode.Instruction, ...]:
        """The normalised instructions that came from the raw instruction at ``offset``."""
        return self._decode(code)[1].get(offset, ())

    def running(self, code: types.CodeType, offset: int) -> bytecode.Instruction | None:
        """The last normalised instruction starting at or before ``offset`` (what is executing)."""
        best = None
        for inst in self._decode(code)[0]:
            if inst.offset > offset:
                break
            best = inst
        return best


class FrameTracer:
    """Records settrace events of watched frames and the torch ops they call.

    Use as a context manager (``with FrameTracer() as t: fn(x)``, then ``t.trace``), or call
    :func:`trace`. ``include(code) -> bool`` chooses the frames to watch (default
    :func:`is_user_code`); ``opcodes=False`` records only call/line/return events (cheaper).
    """

    def __init__(self, include: Callable[[types.CodeType], bool] | None = None, opcodes: bool = True,
                 torch_ops: bool = True) -> None:
        self.include = include or is_user_code
        self.opcodes = opcodes
        self.torch_ops = torch_ops
        self.trace = Trace(events=[], ops=[])
        self._insts = _Instructions()
        self._frames: dict[types.FrameType, tuple[int, int]] = {}  # frame -> (frame_id, depth)
        self._last_event: dict[types.FrameType, int] = {}
        self._serial = 0
        self._busy = False  # True while we record a torch op: our own frames are not watched
        self._previous = None
        self._mode = None

    # -- settrace callbacks ------------------------------------------------------------------
    def _global(self, frame: types.FrameType, event: str, arg: Any):
        code = frame.f_code
        if event != "call" or self._busy or code.co_filename == __file__ or not self.include(code):
            return None  # never watch the tracer itself, whatever ``include`` says
        parent = frame.f_back
        while parent is not None and parent not in self._frames:
            parent = parent.f_back
        depth = 0 if parent is None else self._frames[parent][1] + 1
        self._serial += 1
        self._frames[frame] = (self._serial, depth)
        self._record(frame, "call", None)
        frame.f_trace = self._local  # f_trace must be set before f_trace_opcodes (CPython 3.12)
        if self.opcodes:
            frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame: types.FrameType, event: str, arg: Any):
        if frame in self._frames:
            self._record(frame, event, arg)
            if event == "return":
                del self._frames[frame]
                self._last_event.pop(frame, None)
        return self._local

    def _record(self, frame: types.FrameType, kind: str, arg: Any) -> None:
        frame_id, depth = self._frames[frame]
        code = frame.f_code
        offset = max(frame.f_lasti, 0)
        insts = self._insts.at(code, offset) if kind == "opcode" else ()
        value = arg[0] if kind == "exception" and arg else arg
        self._last_event[frame] = len(self.trace.events)
        self.trace.events.append(TraceEvent(kind, frame_id, depth, code.co_name, code.co_filename,
                                            frame.f_lineno, offset, insts, value))

    # -- torch ops ----------------------------------------------------------------------------
    def _on_torch_op(self, func: Any) -> None:
        frame = sys._getframe(2)  # skip this method and the mode's __torch_function__
        while frame is not None and frame not in self._frames:
            frame = frame.f_back
        if frame is None:
            return
        self._busy = True
        try:
            frame_id, depth = self._frames[frame]
            inst = self._insts.running(frame.f_code, frame.f_lasti)
            self.trace.ops.append(OpCall(_op_name(func), frame_id, depth, frame.f_code.co_name,
                                         frame.f_lineno, frame.f_lasti, inst.opname if inst else "?",
                                         self._last_event.get(frame, len(self.trace.events) - 1)))
        finally:
            self._busy = False

    # -- install / remove ---------------------------------------------------------------------
    def __enter__(self) -> "FrameTracer":
        if self.torch_ops:
            self._mode = _make_mode(self)
            self._mode.__enter__()
        self._previous = sys.gettrace()
        me = sys._getframe()
        # CPython 3.12.0/3.12.1 only enable opcode events if some frame asked for them before
        # settrace (python/cpython#103615); harmless on other versions.
        me.f_trace_opcodes = self.opcodes
        sys.settrace(self._global)
        me.f_trace_opcodes = False
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        self._frames.clear()
        self._last_event.clear()


def _op_name(func: Any) -> str:
    import torch.overrides  # lazy: the tracer runs without torch (torch_ops=False), e.g. on other Pythons

    try:
        return torch.overrides.resolve_name(func) or getattr(func, "__name__", repr(func))
    except Exception:  # resolve_name can fail on unusual callables; a name is enough
        return getattr(func, "__name__", repr(func))


def _make_mode(tracer: FrameTracer):
    from torch.overrides import TorchFunctionMode  # lazy: torch is only needed to record torch ops

    class _RecordTorchOps(TorchFunctionMode):
        """Tell the tracer about each torch op, then run it unchanged."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            tracer._on_torch_op(func)
            return func(*args, **(kwargs or {}))

    return _RecordTorchOps()


def trace(fn: Callable, *args: Any, include: Callable[[types.CodeType], bool] | None = None,
          opcodes: bool = True, torch_ops: bool = True, **kwargs: Any) -> Trace:
    """Call ``fn(*args, **kwargs)`` under a :class:`FrameTracer`; return the :class:`Trace`.

    ``fn`` itself is always watched (even if ``include`` would skip its file); other frames
    are watched when ``include(code)`` is true (default :func:`is_user_code`).
    """
    if not callable(fn):
        raise TypeError(f"trace() needs a callable, got {type(fn).__name__}; pass the function, not its result")
    target = getattr(getattr(fn, "__func__", fn), "__code__", None)  # functions and bound methods
    base = include or is_user_code
    tracer = FrameTracer(lambda code: code is target or base(code), opcodes=opcodes, torch_ops=torch_ops)
    with tracer:
        result = fn(*args, **kwargs)
    tracer.trace.result = result
    return tracer.trace
