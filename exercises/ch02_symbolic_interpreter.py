# GENERATED from solutions/ch02_symbolic_interpreter.py by `python -m course.exercises`: edit the marked parts.
"""Chapter 2: the symbolic interpreter. Four opcode handlers of tinydynamo's InstructionTranslator.

Each handler has the signature ``handler(tx, inst)``: ``tx`` is the translator (its ``stack`` of
VariableTrackers, ``push``/``pop``/``popn``, ``ip`` the index of the next instruction, ``output``
the OutputGraph), ``inst`` a normalised :class:`tinydynamo.bytecode.Instruction`. Plug them into
the real translator with ``tinydynamo.symbolic_convert.use_handlers(BINARY_OP=BINARY_OP, ...)``.
"""
from __future__ import annotations

from tinydynamo import bytecode as bc
from tinydynamo.exc import unimplemented
from tinydynamo.variables import NULL, BuiltinVariable, ListIteratorVariable


def BINARY_OP(tx, inst) -> None:
    """``BINARY_OP`` (``inst.argval`` is the operator's symbol: ``'-'``, ``'**'``, ``'-='``, ...).

    Contract: the stack ends one value shorter, its top the result of ``a <op> b``, where ``a``
    and ``b`` were the two values on top (``b`` the top one), exactly as CPython computes it.

    Examples (``x``, ``y`` tensors): ``x - y`` puts one ``sub`` node in the graph, never ``y - x``;
    ``2 ** 3`` leaves no node at all, the stack then holds the constant 8; ``x -= 1`` on an input
    changes the caller's tensor, as it does in eager.

    Tools: ``bc.BINARY_OPS`` maps each symbol to Python's operator function (``operator.sub``,
    ``operator.isub``, ...); ``BuiltinVariable.binop(tx, fn, a, b)`` is ``fn(a, b)`` on two
    VariableTrackers, whatever they hold.
    """
    raise NotImplementedError("Exercise 2.1: the symbolic BINARY_OP: a <op> b as a variable; checked inside the real translator on tensors and constants, non-commutative and in-place operators, with every handler's stack effect (notebook 02, sections 2 and 3). Stuck? course.hint('2.1')")


def pop_jump_if(tx, inst, jump_when: bool) -> None:
    """``POP_JUMP_IF_TRUE`` (``jump_when=True``) and ``POP_JUMP_IF_FALSE`` (``False``), at trace time.

    Contract: CPython pops the condition and goes to ``inst.target`` (an instruction index) when
    its truth is ``jump_when``, else to the next instruction (``tx.ip`` is the index of the
    instruction that runs next). The graph then holds only the side that was taken.

    Examples: in ``if flag: x = x + 1`` with ``flag=False`` the graph has no ``add``;
    ``if n > 2`` with ``n=3`` an int argument keeps the ``then`` side, and a later call with
    ``n=0`` must still be right; ``if not items`` with ``items == []`` jumps as CPython does;
    ``if x.sum() > 0`` on a tensor ``x`` has no answer while tracing (see notebook 02): the
    compiled function must still give eager's result for positive and negative sums.

    Tools: ``tx.pop()``; a VariableTracker's ``truth(tx)`` is ``bool(value)`` where that is
    known at trace time and raises ``Unsupported`` where it is not.
    """
    raise NotImplementedError("Exercise 2.2: the symbolic conditional jump, decided at trace time; checked on branches, and/or, loops and not-taken branches, a branch on an argument called again with other values, a branch on a tensor, with every handler's stack effect (notebook 02, sections 2 and 3). Stuck? course.hint('2.2')")


def POP_JUMP_IF_FALSE(tx, inst) -> None:
    pop_jump_if(tx, inst, False)


def POP_JUMP_IF_TRUE(tx, inst) -> None:
    pop_jump_if(tx, inst, True)


def CALL(tx, inst) -> None:
    """Call with ``inst.argval`` arguments, the last ``len(inst.kw_names)`` of them by keyword.

    The stack holds two call slots, then the arguments. ``bc.resolve_call_slots(slot0, slot1,
    is_null)`` reads the slots the same way on every CPython version and returns the callable
    and any leading argument (``self`` of a method). Push ``fn.call_function(tx, args, kwargs)``.
    """
    raise NotImplementedError("Exercise 2.3: the symbolic CALL: positional and keyword arguments, every call-slot layout; checked in the translator and on a prepared stack (notebook 02, sections 2 and 3). Stuck? course.hint('2.3')")


def FOR_ITER(tx, inst) -> None:
    """Advance the iterator on top of the stack (a ListIteratorVariable).

    ``it.next_item()`` returns the next variable, or None when exhausted. Push the item and
    go on; when exhausted, pop the iterator and continue at ``inst.target`` (already past
    the loop's END_FOR cleanup, on every version). Because the interpreter really runs the
    loop at trace time, the loop is unrolled into the graph.
    """
    it = tx.stack[-1]
    if not isinstance(it, ListIteratorVariable):
        unimplemented(f"FOR_ITER over {it}")
    raise NotImplementedError("Exercise 2.4: the symbolic FOR_ITER that unrolls a loop; checked on nested, empty and list loops, with the stack effect of every step and an empty stack at return (notebook 02, sections 2 and 3). Stuck? course.hint('2.4')")


HANDLERS = {
    "BINARY_OP": BINARY_OP,
    "POP_JUMP_IF_FALSE": POP_JUMP_IF_FALSE,
    "POP_JUMP_IF_TRUE": POP_JUMP_IF_TRUE,
    "CALL": CALL,
    "FOR_ITER": FOR_ITER,
}
