"""Readable Python for generated code objects (resume functions), for the instructor's view.

A resume function exists only as bytecode (tinydynamo.resume assembles it), so to read it we
decompile it with the maintained ``depyf`` package, as PyTorch's own debugging tools do for
TorchDynamo's transformed code. Where depyf is missing or cannot handle a code object (a new
CPython, an unusual jump), the view falls back to the ``dis`` listing, commented out so the
text is still a valid Python file, with a note saying why.

Decompiling is done only when someone looks (:class:`DecompiledCode` is recorded as the
artefact; its ``str`` decompiles), and under a time limit: depyf can loop forever on some
control flow (a resume function entered inside a ``for`` loop, seen with depyf 0.20), and a
debugging view must never hang the program it is showing.
"""
from __future__ import annotations

import dis
import sys
import time
import types

#: seconds depyf may take on one code object before the view falls back to ``dis``
TIME_LIMIT = 5.0


class _TimeLimit(Exception):
    pass


def _run_with_time_limit(fn, seconds: float):
    """``fn()``, aborted from a trace function once ``seconds`` have passed (same thread, no signals)."""
    deadline = time.monotonic() + seconds

    def tracer(frame, event, arg):
        if time.monotonic() > deadline:
            raise _TimeLimit(f"gave up after {seconds:g} s")
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(previous)


def decompile(code: types.CodeType) -> str:
    """Python source for ``code`` (via depyf), else its commented ``dis`` listing with the reason."""
    try:
        import depyf  # optional, and slow to import: only asked for when a listing is shown

        source = _run_with_time_limit(lambda: depyf.decompile(code), TIME_LIMIT)
        compile(source, f"<decompiled {code.co_name}>", "exec")  # never hand out text that does not parse
        return "# decompiled by depyf: a reading aid (the bytecode is what runs)\n" + source
    except Exception as e:  # ImportError, the time limit, or depyf's own failure on this code object
        listing = dis.Bytecode(code).dis()
        note = f"depyf could not decompile {code.co_name} ({type(e).__name__}: {e}); its bytecode instead:"
        return "\n".join(["# " + note] + ["# " + line for line in listing.splitlines()]) + "\n"


class DecompiledCode:
    """An artefact value: ``str()`` decompiles ``code`` on first use (compiling never waits for it)."""

    def __init__(self, code: types.CodeType):
        self.code = code
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = decompile(self.code)
        return self._text
