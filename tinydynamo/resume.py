"""Resume functions: the rest of a frame after a graph break, as a new code object (PyTorch:
resume_execution.py, ``ContinueExecutionCache``).

When tracing stops at an unsupported instruction (a call of ``print``, ``.item()``, a jump on a
tensor's value), tinydynamo compiles the graph so far, runs that one instruction natively, then
calls a *resume function*: a copy of the original function's bytecode with a prologue that

1. takes the values that were on the value stack, and the live locals, as arguments;
2. pushes the stack values back (``PUSH_NULL`` for CPython's NULL call slots);
3. jumps to the instruction after the break.

The resume function is an ordinary Python function, so tinydynamo compiles it in turn (its
own graphs, guards and cache). Code objects are assembled with the ``bytecode`` package
(pure Python, CPython 3.8-3.14), never by hand. A break inside grad-mode ``with`` blocks
resumes: the prologue enters the context again (``with torch.no_grad():``), like TorchDynamo's
``ReenterWith``. Breaks inside ``try`` blocks or other ``with`` blocks are not resumable: the
frame runs eagerly instead.
"""
from __future__ import annotations

import dis
import inspect
import types

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label

_PREFIX_OPS = {"RESUME", "COPY_FREE_VARS", "MAKE_CELL", "NOP"}


def in_exception_region(code: types.CodeType, offset: int) -> bool:
    """Is ``offset`` inside a try/with block (an exception-table entry)?"""
    for entry in getattr(dis.Bytecode(code), "exception_entries", ()):
        if entry.start <= offset < entry.end:
            return True
    return False


def enclosing_blocks(code: types.CodeType, offset: int) -> list[str]:
    """The try/with blocks around ``offset``, innermost first: ``"with"`` or ``"try"`` each.

    CPython 3.11+ keeps blocks only in the exception table, flattened: an offset has one
    handler. A ``with`` block's handler is ``PUSH_EXC_INFO; WITH_EXCEPT_START``; any other
    ``PUSH_EXC_INFO`` handler belongs to a try statement; handlers without it are cleanups.
    The handler's own code is covered by the entry of the next enclosing block, so following
    handler -> entry -> handler walks outwards.
    """
    entries = list(getattr(dis.Bytecode(code), "exception_entries", ()))
    insts = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    after = {a.offset: b for a, b in zip(insts, insts[1:])}
    kinds: list[str] = []
    seen: set[int] = set()
    pos = offset
    while True:
        entry = next((e for e in entries if e.start <= pos < e.end), None)
        if entry is None or entry.target in seen:
            return kinds
        seen.add(entry.target)
        handler = next(i for i in insts if i.offset == entry.target)
        if handler.opname == "PUSH_EXC_INFO":
            kinds.append("with" if after[handler.offset].opname == "WITH_EXCEPT_START" else "try")
        pos = entry.target


def next_offset(code: types.CodeType, offset: int) -> int:
    """Offset of the original instruction that follows the one at ``offset``."""
    for ins in dis.get_instructions(code):
        if ins.offset > offset and ins.opname not in ("CACHE",):
            return ins.offset
    raise ValueError(f"no instruction after offset {offset}")


NULL_SLOT, VALUE_SLOT, ITER_SLOT, CTX_SLOT = "null", "value", "iter", "ctx"

_READS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST", "LOAD_CLOSURE", "LOAD_DEREF"}
#: builtins that read every local of the frame by name (``eval("y * 2")``, ``locals()``)
_READ_ALL_LOCALS = {"locals", "vars", "eval", "exec", "dir"}


def live_locals(code: types.CodeType, offset: int, names: list[str]) -> list[str]:
    """The locals among ``names`` that code from ``offset`` on may still read.

    Conservative and simple: a name read by any instruction at or after ``offset``; and if a
    backward jump from there lands before ``offset`` (we are inside a loop), or the code may call
    a builtin that reads locals by name (``eval``, ``locals``...), every name. Passing fewer locals
    means fewer guards on the resume function, so fewer needless recompiles.
    """
    jumps = set(dis.hasjrel) | set(dis.hasjabs)
    tail = [ins for ins in dis.get_instructions(code) if ins.offset >= offset]
    if any(ins.opcode in jumps and isinstance(ins.argval, int) and ins.argval < offset for ins in tail):
        return list(names)
    return locals_read(tail, names)


def locals_read(instructions, names: list[str]) -> list[str]:
    """The names among ``names`` (in that order) that ``instructions`` read (``dis`` instructions or
    normalised ones: only ``opname`` and ``argval`` are used); every name if they may call a builtin
    that reads locals by name."""
    read: set[str] = set()
    for ins in instructions:
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in _READ_ALL_LOCALS:
            return list(names)
        if ins.opname in _READS:
            read.add(ins.argval)
        elif ins.opname == "LOAD_FAST_LOAD_FAST":
            read.update(ins.argval)
        elif ins.opname == "STORE_FAST_LOAD_FAST":
            read.add(ins.argval[1])
    return [n for n in names if n in read]


def make_resume_code(code: types.CodeType, resume_offset: int, stack_slots: list,
                     local_names: list[str]) -> types.CodeType:
    """A code object running ``code`` from ``resume_offset``, given the stack and locals as arguments.

    ``stack_slots`` says what each stack slot holds, bottom first: ``"value"`` (passed as an
    argument), ``"null"`` (recreated with PUSH_NULL) or ``"iter"`` (a loop's iterator: passed as
    the list of its remaining items and turned back into an iterator with GET_ITER, so the resume
    function's own trace can unroll the rest of the loop) or ``"ctx"`` (the ``__exit__`` of a
    ``with`` block the break was in: passed as a fresh context manager and entered again with
    BEFORE_WITH, so the original exception table still runs its exit if the rest raises).
    Arguments: ``___stack0 ...`` for the non-NULL slots, then ``local_names``. (``True``/``False`` are accepted for null/value.)
    """
    stack_slots = [NULL_SLOT if s is True else VALUE_SLOT if s is False else s for s in stack_slots]
    raw = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "EXTENDED_ARG")]
    try:
        k = next(n for n, i in enumerate(raw) if i.offset == resume_offset)
    except StopIteration:
        raise ValueError(f"no instruction at offset {resume_offset} in {code.co_name}") from None
    bc = Bytecode.from_code(code)
    instrs = [i for i in bc if isinstance(i, Instr)]
    target_instr = instrs[k]
    label = Label()
    body = []
    for item in bc:
        if item is target_instr:
            body.append(label)
        body.append(item)
    # keep CPython's required prefix (RESUME...) first, then the prologue
    n_prefix = 0
    while n_prefix < len(body) and isinstance(body[n_prefix], Instr) and body[n_prefix].name in _PREFIX_OPS:
        n_prefix += 1
    lineno = target_instr.lineno if isinstance(target_instr.lineno, int) else code.co_firstlineno
    stack_args = [f"___stack{i}" for i, kind in enumerate(stack_slots) if kind != NULL_SLOT]
    prologue = _prologue(stack_slots, stack_args, label, lineno)
    if code.co_freevars or code.co_cellvars:
        body, n_prefix = _cells_to_free_vars(body, n_prefix, code)
    new = Bytecode(body[:n_prefix] + prologue + body[n_prefix:])
    if code.co_freevars or code.co_cellvars:
        new.freevars = list(code.co_freevars) + list(code.co_cellvars)
        new.cellvars = []
    new.argnames = stack_args + list(local_names)
    new.argcount = len(new.argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    new.flags = bc.flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    new.name = f"__resume_at_{resume_offset}"
    if hasattr(new, "qualname"):
        new.qualname = f"{getattr(code, 'co_qualname', code.co_name)}.__resume_at_{resume_offset}"
    new.filename = bc.filename
    new.first_lineno = bc.first_lineno
    new.docstring = None
    return new.to_code()


def _prologue(stack_slots: list, stack_args: list[str], label: Label, lineno: int) -> list:
    """Push the saved stack back (NULLs, values, iterators, re-entered ``with`` blocks), then jump
    to the instruction after the break."""
    prologue: list = []
    j = 0
    for kind in stack_slots:
        if kind == NULL_SLOT:
            prologue.append(Instr("PUSH_NULL", lineno=lineno))
        else:
            prologue.append(Instr("LOAD_FAST", stack_args[j], lineno=lineno))
            if kind == ITER_SLOT:
                prologue.append(Instr("GET_ITER", lineno=lineno))
            elif kind == CTX_SLOT:  # `with ___stackN:` -- leaves its __exit__ where the original's was
                prologue.append(Instr("BEFORE_WITH", lineno=lineno))
                prologue.append(Instr("POP_TOP", lineno=lineno))
            j += 1
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    return prologue


def resume_depth(code: types.CodeType) -> int:
    """How many graph breaks led to ``code``: 0 for a user's function, n for the resume function of
    a resume function ... (its qualified name nests ``.__resume_at_<offset>`` once per break)."""
    return getattr(code, "co_qualname", code.co_name).count(".__resume_at_")


def closure_names(code: types.CodeType) -> list[str]:
    """The free variables of a resume function made from ``code``: the original's free variables,
    then its cell variables (the cells the original frame made, passed in as a closure)."""
    return list(code.co_freevars) + list(code.co_cellvars)


def _cells_to_free_vars(body: list, n_prefix: int, code: types.CodeType) -> tuple[list, int]:
    """A resume function does not make its cells: the frame's cells come in as its closure (as
    TorchDynamo's resume functions receive them). So every cell variable becomes a free variable,
    MAKE_CELL goes, and COPY_FREE_VARS copies all of them."""
    out, prefix_left = [], n_prefix
    for k, item in enumerate(body):
        if isinstance(item, Instr):
            if item.name in ("MAKE_CELL", "COPY_FREE_VARS"):
                if k < n_prefix:
                    prefix_left -= 1
                continue
            if isinstance(item.arg, CellVar):
                item = Instr(item.name, FreeVar(item.arg.name), lineno=item.lineno)
        out.append(item)
    n_free = len(code.co_freevars) + len(code.co_cellvars)
    first = out[0] if out else None
    lineno = first.lineno if isinstance(first, Instr) else code.co_firstlineno
    return [Instr("COPY_FREE_VARS", n_free, lineno=lineno)] + out, prefix_left + 1
