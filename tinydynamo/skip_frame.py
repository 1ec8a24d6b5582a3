"""A frame that must run eagerly still compiles the call that broke it.

A graph break inside a ``try`` block (or a ``with`` block tinydynamo does not trace) is not
resumable: the frame runs eagerly. TorchDynamo skips such a frame too, but its PEP 523 hook still
sees every frame the skipped one calls, so the callee gets its own graphs: transformers 5.x wraps
every model's ``forward`` in ``try: output = func(self, *args, **kwargs) finally: ...``, and the
forward inside is compiled, not run eagerly in full.

tinydynamo has no frame hook, so it changes the frame's code instead: :func:`compile_callee_at`
returns a copy of the original code object in which the callable of the call that broke is
passed through ``wrap_for_resume`` (eval_frame's, handed down by convert_frame) just before the call
(user functions, methods and modules get compiled as their own frames; anything else as is).
Three instructions are inserted in front of the call, inside the same exception-table range, so
the ``try``/``finally`` still protects it::

    SWAP k            # the callable to the top of the stack (k: its depth from the top, + 1)
    LOAD_CONST <compile_callee>; SWAP 2; BINARY_SUBSCR     # callable = compile_callee[callable]
    SWAP k            # and back into its call slot

(``BINARY_SUBSCR`` is the one instruction that calls back into Python with one value and no NULL
call slots, on every supported version.) The frame runs this code natively, every call.
"""
from __future__ import annotations

import dis
import types
from typing import Callable

from bytecode import Bytecode, Instr

#: the instructions that must stay right in front of the call they prepare
_CALL_PREFIX = {"PRECALL", "KW_NAMES"}


class CompileCallee:
    """``compile_callee[fn]``: what the call runs instead of ``fn`` (its compiled version,
    ``wrap_for_resume(fn, None)``: the caller's backend)."""

    def __init__(self, wrap_for_resume: Callable):
        self.wrap_for_resume = wrap_for_resume

    def __getitem__(self, fn):
        return self.wrap_for_resume(fn, None)

    def __repr__(self) -> str:
        return "compile_callee"


def compile_callee_at(code: types.CodeType, offset: int, depth_from_top: int, compile_callee) -> types.CodeType:
    """``code`` with the callable ``depth_from_top`` slots below the top of the stack (0: the top)
    replaced by ``compile_callee[callable]`` (a :class:`CompileCallee`) just before the call
    instruction at ``offset``."""
    raw = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "EXTENDED_ARG")]
    k = next(n for n, i in enumerate(raw) if i.offset == offset)
    bc = Bytecode.from_code(code)
    body = list(bc)
    instrs = [i for i in body if isinstance(i, Instr)]
    call = instrs[k]
    at = body.index(call)
    if call.name == "CALL_KW":  # 3.13: LOAD_CONST <names>; CALL_KW (the names are not on our stack)
        if not (isinstance(body[at - 1], Instr) and body[at - 1].name == "LOAD_CONST"):
            raise ValueError(f"CALL_KW at offset {offset} without its LOAD_CONST of names right before it")
        at -= 1
    while at > 0 and isinstance(body[at - 1], Instr) and body[at - 1].name in _CALL_PREFIX:
        at -= 1
    line = call.lineno
    swap = [Instr("SWAP", depth_from_top + 1, lineno=line)] if depth_from_top else []
    wrap = swap + [Instr("LOAD_CONST", compile_callee, lineno=line), Instr("SWAP", 2, lineno=line),
                   Instr("BINARY_SUBSCR", lineno=line)] + swap
    body[at:at] = wrap
    new = Bytecode(body)
    for attr in ("argcount", "posonlyargcount", "kwonlyargcount", "flags", "name", "filename",
                 "first_lineno", "argnames", "cellvars", "freevars", "docstring"):
        setattr(new, attr, getattr(bc, attr))
    if hasattr(bc, "qualname"):
        new.qualname = bc.qualname
    return new.to_code()
