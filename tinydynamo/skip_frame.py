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
import sys
import types
from typing import Callable

from bytecode import Bytecode, Instr

#: the instructions that must stay right in front of the call they prepare
_CALL_PREFIX = {"PRECALL", "KW_NAMES"}


#: callables a wrapped call site passes through unchanged without asking (C functions, classes)
_NEVER_COMPILED = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                   types.WrapperDescriptorType, types.MethodDescriptorType, type)


class CompileCallee:
    """``compile_callee[fn]``: what the call runs instead of ``fn`` (its compiled version,
    ``wrap_for_resume(fn, None)``: the caller's backend)."""

    def __init__(self, wrap_for_resume: Callable):
        self.wrap_for_resume = wrap_for_resume

    def __getitem__(self, fn):
        if isinstance(fn, _NEVER_COMPILED):  # the common case in a frame whose every call is wrapped
            return fn
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
    return _with_body(bc, body)


def compile_callees(code: types.CodeType, compile_callee) -> types.CodeType | None:
    """``code`` with EVERY call's callable passed through ``compile_callee`` (a
    :class:`CompileCallee`; None where this
    Python's call layout is not known here).

    What TorchDynamo's frame hook gives a frame it skips: each user function, method and module it
    calls is compiled as its own frame, not just the one whose call broke the graph. A graph break
    in a model's outermost frame that cannot resume (inside ``try``) then leaves that one frame
    eager; the blocks, attention layers and helpers it calls after the break still get graphs.

    Before 3.13 a call's two slots are ``[NULL, callable]`` or, after a method load, ``[method,
    self]``: known only at run time. Method loads are therefore turned into plain attribute loads
    (a bound method, then a NULL below it), so every callable sits right above a NULL and is wrapped
    there. From 3.13 on the callable is always the lower slot.
    """
    version = sys.version_info[:2]
    if version not in ((3, 11), (3, 12), (3, 13)):
        return None
    bc = Bytecode.from_code(code)
    body: list = []
    for item in bc:
        if not isinstance(item, Instr):
            body.append(item)
            continue
        loc = item.location
        if version < (3, 13) and _is_method_load(item, version):
            body += [_plain_attribute_load(item, version), Instr("PUSH_NULL", location=loc),
                     Instr("SWAP", 2, location=loc)]
            continue
        depth = _callable_depth(item, version)  # the callable's slot below the top, at the call's prefix
        if depth is not None:
            at = len(body)
            while at > 0 and isinstance(body[at - 1], Instr) and (
                    body[at - 1].name in _CALL_PREFIX or (item.name == "CALL_KW" and at == len(body))):
                at -= 1  # in front of PRECALL / KW_NAMES (3.13's CALL_KW: in front of its names' LOAD_CONST)
            swap = [Instr("SWAP", depth + 1, location=loc)] if depth else []
            body[at:at] = swap + [Instr("LOAD_CONST", compile_callee, location=loc), Instr("SWAP", 2, location=loc),
                                  Instr("BINARY_SUBSCR", location=loc)] + swap
        body.append(item)
    return _with_body(bc, body)


def _with_body(bc: Bytecode, body: list) -> types.CodeType:
    """A code object with ``bc``'s signature, names and flags and the instructions ``body``."""
    new = Bytecode(body)
    for attr in ("argcount", "posonlyargcount", "kwonlyargcount", "flags", "name", "filename",
                 "first_lineno", "argnames", "cellvars", "freevars", "docstring"):
        setattr(new, attr, getattr(bc, attr))
    if hasattr(bc, "qualname"):
        new.qualname = bc.qualname
    return new.to_code()


def _is_method_load(instr: Instr, version: tuple[int, int]) -> bool:
    if version == (3, 11):
        return instr.name == "LOAD_METHOD"
    if instr.name == "LOAD_ATTR":
        return isinstance(instr.arg, tuple) and instr.arg[0]
    return instr.name == "LOAD_SUPER_ATTR" and isinstance(instr.arg, tuple) and instr.arg[1]


def _plain_attribute_load(instr: Instr, version: tuple[int, int]) -> Instr:
    if version == (3, 11):
        return Instr("LOAD_ATTR", instr.arg, location=instr.location)
    if instr.name == "LOAD_ATTR":
        return Instr("LOAD_ATTR", (False, instr.arg[1]), location=instr.location)
    return Instr("LOAD_SUPER_ATTR", (instr.arg[0], False, instr.arg[2]), location=instr.location)


def _callable_depth(instr: Instr, version: tuple[int, int]) -> int | None:
    """How deep below the top the callable of a call instruction sits, just before its prefix."""
    if version < (3, 13):
        if instr.name == "PRECALL" or (version == (3, 12) and instr.name == "CALL"):
            return instr.arg  # [NULL, callable, arg1..argn]
        if instr.name == "CALL_FUNCTION_EX":
            return 1 + (instr.arg & 1)  # [NULL, callable, args(, kwargs)]
        return None
    if instr.name in ("CALL", "CALL_KW"):
        return instr.arg + 1  # [callable, self_or_null, arg1..argn] (CALL_KW: before its names)
    if instr.name == "CALL_FUNCTION_EX":
        return 2 + (instr.arg & 1)
    return None
