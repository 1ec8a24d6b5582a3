"""Version-normalised CPython bytecode: the ONE place that knows how 3.11, 3.12 and 3.13 differ.

Everything else in tinydynamo (the symbolic interpreter, graph breaks, the course notebooks)
reads :class:`Instruction` objects from :func:`get_instructions` and never looks at raw opargs
or at ``sys.version_info``. The differences smoothed over here:

================================  =====================================================
CPython difference                 what :func:`get_instructions` gives instead
================================  =====================================================
3.11 ``PRECALL``; ``CACHE``;       dropped (they have no effect on the value stack)
``EXTENDED_ARG``
``KW_NAMES`` (3.11/3.12) and       folded into the ``CALL`` that follows:
3.13 ``LOAD_CONST names; CALL_KW`` ``CALL`` with ``argval`` = number of arguments
                                   (positional + keyword) and ``kw_names`` = the names
3.11 ``LOAD_METHOD``; 3.12+        ``LOAD_ATTR`` with ``is_method=True`` and
``LOAD_ATTR`` with low bit set     ``push_null=True`` (see "call slots" below)
``LOAD_GLOBAL`` low bit            ``push_null=True``
3.11 ``POP_JUMP_FORWARD_IF_*`` /   ``POP_JUMP_IF_*`` (``FALSE``, ``TRUE``, ``NONE``,
``POP_JUMP_BACKWARD_IF_*``         ``NOT_NONE``)
``JUMP_BACKWARD_NO_INTERRUPT``     ``JUMP_BACKWARD``
``COMPARE_OP`` encodings (3.13's   ``argval`` = the operator string: ``'<'``, ``'=='``
``bool(<)``)
``BINARY_OP`` oparg                ``argval`` = the operator symbol: ``'+'``, ``'-='``
``IS_OP`` / ``CONTAINS_OP`` oparg  ``argval`` = ``True`` when negated (``is not``,
                                   ``not in``)
3.12+ ``RETURN_CONST c``           ``LOAD_CONST c`` + ``RETURN_VALUE``
3.12+ ``BINARY_SLICE`` /           ``BUILD_SLICE 2`` + ``BINARY_SUBSCR`` /
``STORE_SLICE``                    ``BUILD_SLICE 2`` + ``STORE_SUBSCR`` (as 3.11 emits)
3.12+ ``LOAD_FAST_CHECK``          ``LOAD_FAST``
3.11/3.12 ``MAKE_FUNCTION flags``  3.13's form: ``MAKE_FUNCTION`` (code only) then one
                                   ``SET_FUNCTION_ATTRIBUTE`` per attribute, argval its
                                   name (``'closure'``, ``'annotations'``,
                                   ``'kwdefaults'``, ``'defaults'``; topmost first)
3.12 ``CALL_INTRINSIC_1``          ``LIST_TO_TUPLE`` / ``UNARY_POSITIVE`` (3.11 names);
                                   other intrinsics keep the name in ``argval``
3.13 ``LOAD_FAST_LOAD_FAST``,      expanded into two plain instructions
``STORE_FAST_STORE_FAST``,
``STORE_FAST_LOAD_FAST``
3.13 ``LOAD_FAST`` of a cell      ``LOAD_CLOSURE`` (as 3.11/3.12 emit it)
variable (building a closure)
3.11/3.12 ``FORMAT_VALUE``       3.13's ``CONVERT_VALUE`` (argval = ``str``/``repr``/
                                   ``ascii``) + ``FORMAT_SIMPLE``; with a format spec
                                   ``FORMAT_WITH_SPEC`` (argval = the conversion or None)
3.12+ ``LOAD_SUPER_ATTR``          argval = the name, ``push_null`` for a method load
3.12+ ``END_SEND``                 dropped: ``SEND``'s exit pops the sub-iterator itself
                                   (3.11's ``SEND``), so a jump to it goes on after it
3.13 ``TO_BOOL``                   dropped: its only consumers (``POP_JUMP_IF_*``,
                                   ``UNARY_NOT``) take the truth value themselves
``FOR_ITER`` exit target           ``target`` = where execution goes on once the iterator
                                   is exhausted *and popped* (3.12 skips ``END_FOR``,
                                   3.13 ``END_FOR; POP_TOP``), so ``END_FOR`` is never
                                   reached by a correct interpreter
jump ``argval`` = target offset    ``target`` = index of the target in the list
================================  =====================================================

**Call slots.** ``CALL n`` finds ``n + 2`` values on the stack: two *call slots*, then the
``n`` arguments. What fills the two slots differs by version:

* 3.11 / 3.12: ``NULL, callable`` (after ``PUSH_NULL`` or ``LOAD_GLOBAL`` with ``push_null``),
  or ``method, self`` (after a method ``LOAD_ATTR``);
* 3.13: ``callable, NULL``, or ``method, self``.

One rule reads all three (:func:`resolve_call_slots`): *if one slot is NULL, the callable is
the other; otherwise the first slot is the callable and the second is its first argument.*
To push the slots the version-correct way round, use :func:`with_null` (the interpreter asks
for ``with_null(value)`` whenever an instruction has ``push_null``). ``CALL_FUNCTION_EX`` has
the same two slots below its argument tuple.

This module imports no torch, so it can be tested on every CPython version.
"""
from __future__ import annotations

import dataclasses
import dis
import functools
import operator
import sys
import types
from typing import Any, Callable, Iterable, Sequence

#: True on 3.11/3.12 (``NULL, callable``); False on 3.13+ (``callable, NULL``).
NULL_BEFORE_CALLABLE: bool = sys.version_info < (3, 13)

SUPPORTED_VERSIONS = ((3, 11), (3, 12), (3, 13))


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One normalised bytecode instruction (see the module docstring for what is normalised)."""

    opname: str
    argval: Any
    argrepr: str
    offset: int  # offset of the original instruction (several normalised ones may share it)
    lineno: int | None
    is_jump_target: bool = False
    target: int | None = None  # index of the jump target in the instruction list
    push_null: bool = False  # also push a NULL call slot (use with_null)
    is_method: bool = False  # LOAD_ATTR that loads a method for a following CALL
    kw_names: tuple[str, ...] = ()  # CALL: names of the last len(kw_names) arguments
    orig_opname: str = ""  # the CPython opname this came from
    index: int = -1  # position in the list

    def __str__(self) -> str:
        return format_instruction(self)


# ---------------------------------------------------------------------------------------------
# operator tables (symbol -> Python function), shared by interpreters of normalised bytecode
# ---------------------------------------------------------------------------------------------

BINARY_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}

COMPARE_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge,
}

UNARY_OPS: dict[str, Callable[[Any], Any]] = {
    "UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos,
    "UNARY_INVERT": operator.invert, "UNARY_NOT": operator.not_,
}

#: Conditional jumps that pop their operand: opname -> predicate on the popped value; jump if True.
POP_JUMP_CONDITIONS: dict[str, Callable[[Any], bool]] = {
    "POP_JUMP_IF_TRUE": lambda v: bool(v),
    "POP_JUMP_IF_FALSE": lambda v: not v,
    "POP_JUMP_IF_NONE": lambda v: v is None,
    "POP_JUMP_IF_NOT_NONE": lambda v: v is not None,
}


def with_null(value: Any, null: Any) -> list[Any]:
    """The two call slots for ``value`` pushed with a NULL, in this version's order (bottom first)."""
    return [null, value] if NULL_BEFORE_CALLABLE else [value, null]


def resolve_call_slots(slot0: Any, slot1: Any, is_null: Callable[[Any], bool]) -> tuple[Any, list[Any]]:
    """Read CALL's two slots (``slot0`` deeper): return ``(callable, leading_args)``.

    The version-independent rule: if one slot is NULL the callable is the other one;
    otherwise (a method load) ``slot0`` is the callable and ``slot1`` its first argument.
    """
    if is_null(slot0):
        return slot1, []
    if is_null(slot1):
        return slot0, []
    return slot0, [slot1]


@dataclasses.dataclass
class CallLayout:
    """What a CALL / CALL_FUNCTION_EX finds on the stack, decoded once (the translator runs it, the
    graph-break codegen rebuilds it): the callable, its arguments, and the stack ``below`` the call."""

    fn: Any
    args: list[Any]  # positional, the method's ``self`` (a leading argument) first
    kwargs: dict[str, Any]  # CALL's keyword arguments (KW_NAMES / CALL_KW)
    star_args: Any = None  # CALL_FUNCTION_EX: the ``*args`` sequence
    star_kwargs: Any = None  # CALL_FUNCTION_EX: the ``**kwargs`` mapping, if any
    below: list[Any] = dataclasses.field(default_factory=list)
    depth: int = 0  # how many stack items the call consumes
    fn_index: int = 0  # the callable's position in ``stack`` (slot0, or slot1 when slot0 is NULL)


def call_layout(inst: "Instruction", stack: list[Any], is_null: Callable[[Any], bool]) -> CallLayout:
    """Decode the top of ``stack`` for ``inst`` (a normalised CALL or CALL_FUNCTION_EX).

    CALL ``n``: ``[..., slot0, slot1, arg1 .. argn]``, the last ``len(inst.kw_names)`` arguments
    are keywords. CALL_FUNCTION_EX: ``[..., slot0, slot1, args(, kwargs if inst.argval)]``.
    """
    if inst.opname == "CALL":
        n = inst.argval
        depth = n + 2
        slot0, slot1 = stack[len(stack) - depth], stack[len(stack) - depth + 1]
        args = stack[len(stack) - n:]
        fn, lead = resolve_call_slots(slot0, slot1, is_null)
        nkw = len(inst.kw_names)
        return CallLayout(fn, lead + args[:n - nkw], dict(zip(inst.kw_names, args[n - nkw:])),
                          below=stack[:len(stack) - depth], depth=depth,
                          fn_index=len(stack) - depth + (1 if is_null(slot0) else 0))
    if inst.opname == "CALL_FUNCTION_EX":
        has_kw = 1 if inst.argval else 0
        depth = 3 + has_kw
        slot0, slot1 = stack[len(stack) - depth], stack[len(stack) - depth + 1]
        fn, lead = resolve_call_slots(slot0, slot1, is_null)
        return CallLayout(fn, lead, {}, star_args=stack[len(stack) - depth + 2],
                          star_kwargs=stack[-1] if has_kw else None, below=stack[:len(stack) - depth], depth=depth,
                          fn_index=len(stack) - depth + (1 if is_null(slot0) else 0))
    raise ValueError(f"call_layout: {inst.opname} is not a call instruction (CALL or CALL_FUNCTION_EX)")


# ---------------------------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------------------------

_DROPPED = {"CACHE", "PRECALL", "EXTENDED_ARG", "TO_BOOL", "END_SEND"}
_RENAMED = {
    "LOAD_FAST_CHECK": "LOAD_FAST",
    "JUMP_BACKWARD_NO_INTERRUPT": "JUMP_BACKWARD",
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
}
_INTRINSICS = {"INTRINSIC_LIST_TO_TUPLE": "LIST_TO_TUPLE", "INTRINSIC_UNARY_POSITIVE": "UNARY_POSITIVE"}
_SUPER = {  # 3.13 superinstructions: opname -> the two plain opnames, applied to argval[0], argval[1]
    "LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
    "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
    "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
}
#: MAKE_FUNCTION flag bit -> the function attribute it sets (SET_FUNCTION_ATTRIBUTE's argval)
_FUNCTION_ATTRS = {0x01: "defaults", 0x02: "kwdefaults", 0x04: "annotations", 0x08: "closure"}
_JUMP_OPCODES = set(dis.hasjrel) | set(dis.hasjabs)


def _code_of(obj: Any) -> types.CodeType:
    if isinstance(obj, types.CodeType):
        return obj
    obj = getattr(obj, "__func__", obj)  # bound methods
    code = getattr(obj, "__code__", None)
    if code is None:
        raise TypeError(f"expected a function or code object, got {type(obj).__name__}")
    return code


def get_instructions(code_or_fn: Any) -> list[Instruction]:
    """Decode ``code_or_fn`` (a code object or function) into version-normalised instructions."""
    return list(_decode(_code_of(code_or_fn)))


@functools.lru_cache(maxsize=4096)
def _decode(code: types.CodeType) -> tuple[Instruction, ...]:
    """The instructions of ``code``, decoded once: a model's forward methods and the library
    functions they call are inlined many times while one frame is traced (instructions are frozen)."""
    if sys.version_info[:2] not in SUPPORTED_VERSIONS:
        raise RuntimeError(
            f"tinydynamo supports CPython {', '.join('%d.%d' % v for v in SUPPORTED_VERSIONS)}; "
            f"this is {sys.version_info.major}.{sys.version_info.minor}"
        )
    raw = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    # Each entry: (fields for Instruction without index/target/is_jump_target, jump target offset | None)
    out: list[tuple[dict[str, Any], int | None]] = []
    lineno: int | None = code.co_firstlineno
    pending_kw: tuple[str, ...] = ()
    cellvars = set(code.co_cellvars)
    for k, ins in enumerate(raw):
        pos_line = ins.positions.lineno if ins.positions is not None else None
        if pos_line is not None:
            lineno = pos_line
        name = ins.opname
        if name == "KW_NAMES":  # 3.11/3.12: names for the next CALL
            pending_kw = tuple(code.co_consts[ins.arg])
            continue
        if name in _DROPPED:
            continue
        if name == "LOAD_CONST" and k + 1 < len(raw) and raw[k + 1].opname == "CALL_KW":
            pending_kw = tuple(ins.argval)  # 3.13: names loaded right before CALL_KW
            continue
        jump = ins.argval if ins.opcode in _JUMP_OPCODES else None
        base = dict(offset=ins.offset, lineno=lineno, orig_opname=name)

        def emit(opname: str, argval: Any = None, argrepr: str | None = None, **extra: Any) -> None:
            rep = argrepr if argrepr is not None else ("" if argval is None else repr(argval))
            if opname == "LOAD_FAST" and argval in cellvars and sys.version_info >= (3, 13):
                opname = "LOAD_CLOSURE"  # 3.13 loads a cell for a closure tuple with LOAD_FAST
            out.append((dict(base, opname=opname, argval=argval, argrepr=rep, **extra), None))

        name = _RENAMED.get(name, name)
        if name in ("CALL", "CALL_KW"):
            emit("CALL", ins.argval, str(ins.argval) + (f" kw={pending_kw}" if pending_kw else ""),
                 kw_names=pending_kw)
            pending_kw = ()
        elif jump is not None:
            emit(name, jump, f"to {jump}")
            out[-1] = (out[-1][0], jump)
        elif not (_normalise_operand(name, ins, emit) or _normalise_function_or_format(name, ins, emit)):
            rep = ins.argrepr or ("" if ins.argval is None else str(ins.argval))
            emit(name, ins.argval, rep)
    return _resolve_jumps(out, code)


def _normalise_operand(name: str, ins: dis.Instruction, emit: Callable[..., None]) -> bool:
    """Loads, operators and instructions that 3.12/3.13 fused or split: emit the normalised form
    (False: ``name`` is not one of them)."""
    if name == "LOAD_GLOBAL":
        emit(name, ins.argval, ins.argval, push_null=bool(ins.arg & 1))
    elif name == "LOAD_SUPER_ATTR":  # 3.12+: `super().name`; low bit: a method load (like LOAD_ATTR's)
        method = bool(ins.arg & 1)
        emit(name, ins.argval, ins.argval, push_null=method, is_method=method)
    elif name == "LOAD_METHOD":  # 3.11
        emit("LOAD_ATTR", ins.argval, ins.argval, push_null=True, is_method=True)
    elif name == "LOAD_ATTR":
        method = sys.version_info >= (3, 12) and bool(ins.arg & 1)
        emit(name, ins.argval, ins.argval, push_null=method, is_method=method)
    elif name == "COMPARE_OP":
        op = str(ins.argval)
        if op.startswith("bool(") and op.endswith(")"):
            op = op[5:-1]
        emit(name, op, op)
    elif name == "BINARY_OP":
        emit(name, ins.argrepr, ins.argrepr)
    elif name in ("IS_OP", "CONTAINS_OP"):
        neg = bool(ins.argval)
        word = "is" if name == "IS_OP" else "in"
        emit(name, neg, f"{word} not" if (neg and word == "is") else (f"not {word}" if neg else word))
    elif name == "RETURN_CONST":
        emit("LOAD_CONST", ins.argval, repr(ins.argval))
        emit("RETURN_VALUE")
    elif name in ("BINARY_SLICE", "STORE_SLICE"):
        emit("BUILD_SLICE", 2, "2")
        emit("BINARY_SUBSCR" if name == "BINARY_SLICE" else "STORE_SUBSCR")
    elif name == "CALL_INTRINSIC_1":
        if ins.argrepr in _INTRINSICS:
            emit(_INTRINSICS[ins.argrepr])
        else:
            emit(name, ins.argrepr, ins.argrepr)
    elif name in _SUPER:
        first, second = _SUPER[name]
        emit(first, ins.argval[0], ins.argval[0])
        emit(second, ins.argval[1], ins.argval[1])
    elif name == "CALL_FUNCTION_EX":
        emit(name, bool(ins.argval & 1), "kwargs" if ins.argval & 1 else "")
    else:
        return False
    return True


def _normalise_function_or_format(name: str, ins: dis.Instruction, emit: Callable[..., None]) -> bool:
    """MAKE_FUNCTION and f-string formatting in 3.13's form (False: ``name`` is neither)."""
    if name == "MAKE_FUNCTION":  # 3.11/3.12 flags -> 3.13's MAKE_FUNCTION + SET_FUNCTION_ATTRIBUTE
        emit(name)
        flags = ins.arg if sys.version_info < (3, 13) else 0
        for bit in (0x08, 0x04, 0x02, 0x01):  # topmost attribute first, as 3.13 emits them
            if flags & bit:
                emit("SET_FUNCTION_ATTRIBUTE", _FUNCTION_ATTRS[bit], _FUNCTION_ATTRS[bit])
    elif name == "SET_FUNCTION_ATTRIBUTE":
        emit(name, _FUNCTION_ATTRS[ins.arg], _FUNCTION_ATTRS[ins.arg])
    elif name == "FORMAT_VALUE":  # 3.11/3.12 -> 3.13's CONVERT_VALUE + FORMAT_SIMPLE / FORMAT_WITH_SPEC
        convert, has_spec = ins.argval
        if has_spec:  # the spec is on top of the value: the conversion goes with the formatting
            emit("FORMAT_WITH_SPEC", convert, getattr(convert, "__name__", ""))
        else:
            if convert is not None:
                emit("CONVERT_VALUE", convert, convert.__name__)
            emit("FORMAT_SIMPLE")
    elif name == "CONVERT_VALUE":  # 3.13: argval = the conversion function (str, repr, ascii)
        convert = (None, str, repr, ascii)[ins.arg]
        emit(name, convert, getattr(convert, "__name__", ""))
    elif name == "FORMAT_WITH_SPEC":
        emit(name, None, "")
    else:
        return False
    return True


def _resolve_jumps(out: list[tuple[dict[str, Any], int | None]], code: types.CodeType) -> list[Instruction]:
    """Jump offsets to instruction indices. A jump to a dropped instruction lands on the next kept one."""
    first_index_at: dict[int, int] = {}
    for idx, (fields, _) in enumerate(out):
        first_index_at.setdefault(fields["offset"], idx)
    offsets = sorted(first_index_at)

    def index_of(offset: int) -> int:
        for off in offsets:
            if off >= offset:
                return first_index_at[off]
        raise ValueError(f"jump to offset {offset} past the end of {code.co_name}")

    targets: list[int | None] = []
    for fields, jump in out:
        if jump is None:
            targets.append(None)
            continue
        t = index_of(jump)
        if fields["opname"] == "FOR_ITER":  # skip the loop-exit cleanup CPython skips too
            if out[t][0]["opname"] == "END_FOR":
                t += 1
                if sys.version_info >= (3, 13) and out[t][0]["opname"] == "POP_TOP":
                    t += 1
        targets.append(t)
    jump_targets = {t for t in targets if t is not None}
    return tuple(
        Instruction(**fields, index=idx, target=targets[idx], is_jump_target=idx in jump_targets)
        for idx, (fields, _) in enumerate(out)
    )


# ---------------------------------------------------------------------------------------------
# readable listings
# ---------------------------------------------------------------------------------------------


def format_instruction(inst: Instruction) -> str:
    """One line: ``index offset opname argrepr`` with call-slot and jump annotations."""
    arg = inst.argrepr
    if inst.push_null:
        arg = f"{arg} (+NULL{' method' if inst.is_method else ''})"
    if inst.target is not None:
        arg = f"to #{inst.target}"
    return f"{inst.index:>4} {inst.offset:>5} {inst.opname:<22} {arg}".rstrip()


def format_instructions(
    instructions: Iterable[Instruction] | Any, current: int | None = None, show_lines: bool = True
) -> str:
    """A readable listing (like ``dis``): line numbers, ``>>`` at jump targets, ``-->`` at ``current``.

    Accepts a list of instructions, or a function / code object (decoded first).
    """
    if not isinstance(instructions, (list, tuple)):
        instructions = get_instructions(instructions)
    lines: list[str] = []
    last_line = None
    for inst in instructions:
        line = ""
        if show_lines and inst.lineno != last_line:
            line = str(inst.lineno)
            last_line = inst.lineno
        mark = "-->" if current == inst.index else (">>" if inst.is_jump_target else "")
        lines.append(f"{line:>4} {mark:>3} {format_instruction(inst)}")
    return "\n".join(lines)


def index_of_offset(instructions: Sequence[Instruction], offset: int) -> int:
    """Index of the first normalised instruction that came from the original ``offset``."""
    for inst in instructions:
        if inst.offset == offset:
            return inst.index
    raise KeyError(f"no instruction at offset {offset}")
