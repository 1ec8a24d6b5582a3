"""Chapter 4: graph breaks and resume functions. A branch handler, resume-function locals, a rewrite, break sites.

Plug them into tinydynamo the way the package does it:
``symbolic_convert.use_handlers(**BRANCH_HANDLERS)`` (Exercise 4.1),
``resume.make_resume_code(code, offset, stack_slots, resume_locals(...))`` (Exercise 4.2),
``tinydynamo.compile(where_rewrite, fullgraph=True)`` (Exercise 4.3) and
``break_sites(tinydynamo.explain(fn)(*args))`` (Exercise 4.4).
"""
from __future__ import annotations

import re

import torch

from tinydynamo.bytecode import Instruction
from tinydynamo.exc import unimplemented
from tinydynamo.explanation import ExplainOutput
from tinydynamo.variables.tensor import TensorVariable


def branch_on(tx, inst: Instruction, jump_when: bool) -> None:
    """The handler of ``POP_JUMP_IF_TRUE`` (``jump_when=True``) and ``POP_JUMP_IF_FALSE`` (``False``).

    Pop the condition from ``tx``'s stack. A *tensor* condition (a :class:`TensorVariable`, e.g.
    ``x.sum() > 0``) has no value at trace time: its value is computed by the graph, after every
    guard has run, so no guard can decide the branch. Raise ``unimplemented(reason, hint=...)``
    with a reason that starts ``"data-dependent branch"`` and says why no *guard* can decide it
    (use the word "guard"), and a hint naming ``torch.where``; the
    translator turns that into a graph break. Any other condition: ``cond.truth(tx)`` gives
    its Python truth value; jump (``tx.jump_if(inst, True)``) when it equals ``jump_when``.
    """
    # BEGIN SOLUTION (Exercise 4.1: the branch handler: fold Python conditions, break on tensor ones with a reason and a hint; checked against torch._dynamo.explain, with the handler's stack effect (notebook 04, Exercise 4.1))
    cond = tx.pop()
    if isinstance(cond, TensorVariable):
        unimplemented(f"data-dependent branch: `if` on tensor {cond.node.name} "
                      "(its value exists only after the graph runs, so no guard can check it)",
                      hint="use torch.where(cond, a, b) to keep both sides in the graph")
    tx.jump_if(inst, cond.truth(tx) == jump_when)
    # END SOLUTION


#: ``use_handlers(**BRANCH_HANDLERS)`` plugs Exercise 4.1 into the translator
BRANCH_HANDLERS = {
    "POP_JUMP_IF_FALSE": lambda tx, inst: branch_on(tx, inst, False),
    "POP_JUMP_IF_TRUE": lambda tx, inst: branch_on(tx, inst, True),
}

_READS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST", "LOAD_CLOSURE", "LOAD_DEREF"}


def resume_locals(instructions: list[Instruction], offset: int, names: list[str]) -> list[str]:
    """The locals among ``names`` (in that order) a resume function starting at ``offset`` must receive.

    ``instructions`` are tinydynamo's normalised ones (``tinydynamo.bytecode.get_instructions``):
    each has ``opname``, ``argval`` and ``offset``; jumps have ``target`` (an *index* into the
    list). A name is needed when an instruction at or after ``offset`` reads it (an opname in
    ``_READS``; ``LOAD_FAST_LOAD_FAST`` (3.13) reads the two names in its ``argval`` tuple). If a
    jump at or after ``offset`` goes back to an instruction before ``offset`` (the break is in a
    loop), code before the break runs again: return every name.
    """
    # BEGIN SOLUTION (Exercise 4.2: the locals a resume function needs; checked against the package's live_locals at every offset, loops included, and by running a resume function (notebook 04, Exercise 4.2))
    read: set[str] = set()
    for ins in instructions:
        if ins.offset < offset:
            continue
        if ins.target is not None and instructions[ins.target].offset < offset:
            return list(names)
        if ins.opname in _READS:
            read.add(ins.argval)
        elif ins.opname == "LOAD_FAST_LOAD_FAST":
            read.update(ins.argval)
        elif ins.opname == "STORE_FAST_LOAD_FAST":
            read.add(ins.argval[1])
    return [n for n in names if n in read]
    # END SOLUTION


def branchy(x: torch.Tensor) -> torch.Tensor:
    """The seeds' data-dependent branch: one graph break at the ``if``."""
    y = torch.relu(x)
    if x.sum() > 0:
        return y * 2
    return y - 1


def where_rewrite(x: torch.Tensor) -> torch.Tensor:
    """``branchy`` without the break: the same values for every ``x``, using only tensor ops.

    It must compile with ``fullgraph=True`` (one graph, no Python ``if`` on a tensor).
    """
    # BEGIN SOLUTION (Exercise 4.3: branchy's values for every x, in one graph; checked with fullgraph=True on inputs of both signs, mixed signs and a zero sum (notebook 04, Exercise 4.3))
    y = torch.relu(x)
    return torch.where(x.sum() > 0, y * 2, y - 1)
    # END SOLUTION


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def break_sites(out: ExplainOutput) -> list[tuple[str, int]]:
    """``(function name, line number)`` of each graph break in an ``explain()`` result, in order.

    ``out.break_reasons[i].user_stack`` is a list of frames, *innermost first*, each a string
    ``'File "/path/f.py", line 12, in fn\\n    source line'``. Report the innermost frame: the
    line that actually broke the graph.
    """
    # BEGIN SOLUTION (Exercise 4.4: (function, line) of each graph break, where it happened; checked against the source lines, for nested calls and repeated breaks (notebook 04, Exercise 4.4))
    sites = []
    for br in out.break_reasons:
        m = _FRAME.search(br.user_stack[0])
        sites.append((m["fn"], int(m["line"])))
    return sites
    # END SOLUTION
