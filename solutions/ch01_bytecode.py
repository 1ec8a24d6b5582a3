"""Chapter 1 exercises: bytecode and frames.

You work on *normalised* instructions from :func:`tinydynamo.bytecode.get_instructions`, so
your answers run unchanged on CPython 3.11, 3.12 and 3.13. Each instruction has ``opname``,
``argval`` (a name, a constant, an operator symbol such as ``'+'``), ``lineno``, ``offset``,
``push_null`` / ``is_method`` (call slots), ``kw_names`` (for ``CALL``) and ``target`` (the
index of a jump's destination).

* Exercise 1.1 ``global_names``: which globals (and builtins) a function reads.
* Exercise 1.2 ``StackMachine.stack_op``: the stack basics of a tiny bytecode interpreter.
* Exercise 1.3 ``StackMachine.CALL``: calls, with call slots and keyword names.
* Exercise 1.4 ``opcode_histogram``: count the instructions a call executes, with ``sys.settrace``.
* Exercise 1.5 ``torch_op_lines``: which torch ops each source line ran (a ``TorchFunctionMode``).
"""
from __future__ import annotations

import collections
import sys
import types
from typing import Any

from course.chapters.ch01_bytecode import show_stack  # prints the value stack for verbose=True
from tinydynamo import bytecode
from tinydynamo.bytecode import Instruction, get_instructions

# ---------------------------------------------------------------------------------------------
# Exercise 1.1
# ---------------------------------------------------------------------------------------------


def global_names(fn_or_code: Any) -> set[str]:
    """Names that ``fn_or_code`` (a function or code object) reads with ``LOAD_GLOBAL``.

    Include the code objects nested in it (they sit in ``co_consts``): lambdas, inner
    functions, and on CPython 3.11 list/dict/set comprehensions, which 3.12 inlines (PEP 709).
    Walking the nested ones too makes the answer the same on every version. Builtins such as
    ``len`` count: ``LOAD_GLOBAL`` looks in the module's globals, then in builtins.
    Returns a set of names.
    """
    code = fn_or_code if isinstance(fn_or_code, types.CodeType) else fn_or_code.__code__
    # BEGIN SOLUTION (Exercise 1.1: the names the code reads as globals or builtins, nested code included; checked by running each function with only those globals, on CPython 3.11-3.13 (notebook 01, Exercise 1.1))
    names = {inst.argval for inst in get_instructions(code) if inst.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names
    # END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercises 1.2 and 1.3: a tiny stack machine
# ---------------------------------------------------------------------------------------------


class _Null:
    """The NULL call slot (``PUSH_NULL``, ``LOAD_GLOBAL`` with ``push_null``)."""

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


class Frame:
    """The state of one call being interpreted: instructions, locals, value stack, pc."""

    def __init__(self, fn: types.FunctionType, args: tuple) -> None:
        code = fn.__code__
        if code.co_flags & (0x04 | 0x08) or code.co_kwonlyargcount or code.co_freevars:
            raise TypeError(f"StackMachine runs plain functions with positional arguments; "
                            f"{fn.__name__} has *args/**kwargs, keyword-only args or a closure")
        if len(args) != code.co_argcount:
            raise TypeError(f"{fn.__name__} takes {code.co_argcount} arguments, got {len(args)}")
        self.instructions = get_instructions(fn)
        self.locals: dict[str, Any] = dict(zip(code.co_varnames, args))
        self.globals = fn.__globals__
        self.stack: list[Any] = []
        self.pc = 0  # index of the next instruction
        self.returned = False
        self.return_value: Any = None


class StackMachine:
    """Run a function by interpreting its normalised bytecode: one method per opname
    (after :meth:`stack_op`, which handles the five stack basics in one place).

    This is the *concrete* twin of tinydynamo's ``InstructionTranslator``: the same dispatch
    over the same instructions, but with real values on the stack instead of symbolic ones.
    ``StackMachine().run(fn, *args)`` must return what ``fn(*args)`` returns.
    ``verbose=True`` prints each instruction with the stack after it.
    """

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self.executed: list[str] = []  # opnames in execution order

    def run(self, fn: types.FunctionType, *args: Any) -> Any:
        frame = Frame(fn, args)
        while not frame.returned:
            inst = frame.instructions[frame.pc]
            frame.pc += 1
            if not self.stack_op(frame, inst):
                handler = getattr(self, inst.opname, None)
                if handler is None:
                    raise NotImplementedError(
                        f"StackMachine has no handler for {inst.opname} (line {inst.lineno} of "
                        f"{fn.__name__}); add a method named {inst.opname}\n"
                        + bytecode.format_instructions(frame.instructions, current=inst.index))
                handler(frame, inst)
            self.executed.append(inst.opname)
            if self.verbose:
                print(f"{inst.opname:<13} {inst.argrepr:<26} stack: {show_stack(frame.stack)}")
        return frame.return_value

    # -- given: no-ops, globals, attributes, comparisons, jumps --------------------------------
    def RESUME(self, frame: Frame, inst: Instruction) -> None:
        pass

    NOP = RESUME

    def POP_TOP(self, frame: Frame, inst: Instruction) -> None:
        frame.stack.pop()

    def PUSH_NULL(self, frame: Frame, inst: Instruction) -> None:
        frame.stack.append(NULL)

    def LOAD_GLOBAL(self, frame: Frame, inst: Instruction) -> None:
        name = inst.argval
        if name in frame.globals:
            value = frame.globals[name]
        else:
            builtins = frame.globals.get("__builtins__", __builtins__)
            value = builtins[name] if isinstance(builtins, dict) else getattr(builtins, name)
        frame.stack.extend(bytecode.with_null(value, NULL) if inst.push_null else [value])

    def LOAD_ATTR(self, frame: Frame, inst: Instruction) -> None:
        # A method load (is_method) pushes the bound method with a NULL slot; CALL's rule reads both.
        value = getattr(frame.stack.pop(), inst.argval)
        frame.stack.extend(bytecode.with_null(value, NULL) if inst.push_null else [value])

    def UNARY_NEGATIVE(self, frame: Frame, inst: Instruction) -> None:
        frame.stack.append(-frame.stack.pop())

    def COMPARE_OP(self, frame: Frame, inst: Instruction) -> None:
        right, left = frame.stack.pop(), frame.stack.pop()
        frame.stack.append(bytecode.COMPARE_OPS[inst.argval](left, right))

    def BUILD_TUPLE(self, frame: Frame, inst: Instruction) -> None:
        items = frame.stack[len(frame.stack) - inst.argval:]
        del frame.stack[len(frame.stack) - inst.argval:]
        frame.stack.append(tuple(items) if inst.opname == "BUILD_TUPLE" else items)

    BUILD_LIST = BUILD_TUPLE

    def JUMP_FORWARD(self, frame: Frame, inst: Instruction) -> None:
        frame.pc = inst.target

    JUMP_BACKWARD = JUMP_FORWARD

    def POP_JUMP_IF_FALSE(self, frame: Frame, inst: Instruction) -> None:
        if bytecode.POP_JUMP_CONDITIONS[inst.opname](frame.stack.pop()):
            frame.pc = inst.target

    POP_JUMP_IF_TRUE = POP_JUMP_IF_NONE = POP_JUMP_IF_NOT_NONE = POP_JUMP_IF_FALSE

    # -- Exercise 1.2: the stack basics -----------------------------------------------------
    def stack_op(self, frame: Frame, inst: Instruction) -> bool:
        """Execute one of the stack basics and return True; return False for any other opname.

        ``run`` offers every instruction to this method first, then to the method named after
        the opname. Handle:

        * ``LOAD_FAST``: push ``frame.locals[inst.argval]``;
        * ``STORE_FAST``: pop the top of ``frame.stack`` into ``frame.locals[inst.argval]``;
        * ``LOAD_CONST``: push the constant ``inst.argval``;
        * ``BINARY_OP``: pop ``right``, then ``left``; push ``left <op> right``, where
          ``bytecode.BINARY_OPS[inst.argval]`` is the function for the symbol (``'+'``, ``'@'``...);
        * ``RETURN_VALUE``: pop the result into ``frame.return_value``; set ``frame.returned``.
        """
        # BEGIN SOLUTION (Exercise 1.2: execute the five stack basics and say whether you did; checked on arithmetic, loops and branches, with the stack effect of every instruction and an empty stack at return (notebook 01, section 3))
        op, stack = inst.opname, frame.stack
        if op == "LOAD_FAST":
            stack.append(frame.locals[inst.argval])
        elif op == "STORE_FAST":
            frame.locals[inst.argval] = stack.pop()
        elif op == "LOAD_CONST":
            stack.append(inst.argval)
        elif op == "BINARY_OP":
            right, left = stack.pop(), stack.pop()
            stack.append(bytecode.BINARY_OPS[inst.argval](left, right))
        elif op == "RETURN_VALUE":
            frame.return_value = stack.pop()
            frame.returned = True
        else:
            return False
        return True
        # END SOLUTION

    # -- Exercise 1.3: calls ------------------------------------------------------------------
    def CALL(self, frame: Frame, inst: Instruction) -> None:
        """Call a function and push its result.

        The stack holds, bottom to top: two call slots, then ``inst.argval`` arguments, the last
        ``len(inst.kw_names)`` of which are keyword arguments named by ``inst.kw_names``.
        ``bytecode.resolve_call_slots(slot0, slot1, is_null)`` (``slot0`` is the deeper one)
        returns ``(callable, leading_args)``; the NULL slot is the object ``NULL``.
        """
        # BEGIN SOLUTION (Exercise 1.3: call what the two call slots and the arguments describe, keywords included, and push the result; checked on every slot layout (3.11/3.12, 3.13, method and self) and on whole functions (notebook 01, section 3))
        count = inst.argval
        args = frame.stack[len(frame.stack) - count:]
        del frame.stack[len(frame.stack) - count:]
        slot1, slot0 = frame.stack.pop(), frame.stack.pop()
        func, leading = bytecode.resolve_call_slots(slot0, slot1, lambda v: v is NULL)
        n_kw = len(inst.kw_names)
        positional = args[:count - n_kw]
        keywords = dict(zip(inst.kw_names, args[count - n_kw:]))
        frame.stack.append(func(*leading, *positional, **keywords))
        # END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.4
# ---------------------------------------------------------------------------------------------


def opcode_histogram(fn: types.FunctionType, *args: Any) -> tuple[Any, collections.Counter]:
    """Call ``fn(*args)`` under ``sys.settrace``; count the instructions *its* frame executes.

    Returns ``(result, counts)`` where ``counts`` maps *normalised* opnames to how many times
    they ran (a loop body counts once per iteration). Only ``fn``'s own frame counts, not the
    functions it calls. How:

    * ``sys.settrace(global_fn)``: ``global_fn(frame, event, arg)`` is called with
      ``event == 'call'`` for each new frame; for ``fn``'s frame (``frame.f_code is fn.__code__``)
      set ``frame.f_trace = local_fn`` and *then* ``frame.f_trace_opcodes = True``, and return
      ``local_fn``; return None for other frames.
    * ``local_fn`` gets ``'opcode'`` events; ``frame.f_lasti`` is the offset of the raw
      instruction about to run. Count the normalised instructions that came from that offset
      (``inst.offset``): none for 3.11's ``PRECALL``, two for 3.12's ``RETURN_CONST``.
    * CPython 3.12.0/1 only deliver opcode events if some frame had ``f_trace_opcodes = True``
      *before* ``sys.settrace`` (python/cpython#103615): set it on ``sys._getframe()`` first.
    * Restore the previous trace function (``sys.gettrace()``) afterwards, even on errors.
    """
    # BEGIN SOLUTION (Exercise 1.4: count the normalised instructions fn's own frame executes; checked against the listing and the tracer on 3.11-3.13, with a debugger's trace function installed and with fn raising (notebook 01, section 4))
    by_offset: dict[int, list[str]] = collections.defaultdict(list)
    for inst in get_instructions(fn):
        by_offset[inst.offset].append(inst.opname)
    counts: collections.Counter = collections.Counter()

    def local_fn(frame, event, arg):
        if event == "opcode":
            counts.update(by_offset.get(frame.f_lasti, ()))
        return local_fn

    def global_fn(frame, event, arg):
        if event == "call" and frame.f_code is fn.__code__:
            frame.f_trace = local_fn
            frame.f_trace_opcodes = True
            return local_fn
        return None

    previous = sys.gettrace()
    me = sys._getframe()
    me.f_trace_opcodes = True
    sys.settrace(global_fn)
    me.f_trace_opcodes = False
    try:
        result = fn(*args)
    finally:
        sys.settrace(previous)
    return result, counts
    # END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.5
# ---------------------------------------------------------------------------------------------


def torch_op_lines(fn: types.FunctionType, *args: Any) -> tuple[Any, dict[int, list[str]]]:
    """Call ``fn(*args)``; report which torch ops ran on which source line of ``fn``.

    Returns ``(result, lines)`` where ``lines`` maps a line number of ``fn`` to the names of
    the torch ops it ran, in call order (``torch.overrides.resolve_name(func)``, e.g.
    ``'torch.relu'``, ``'torch.Tensor.add'``). An op run inside a function that ``fn`` calls
    counts for the line of ``fn`` that made that call. Lines without torch ops are absent.
    How: subclass ``torch.overrides.TorchFunctionMode``; its
    ``__torch_function__(self, func, types, args=(), kwargs=None)`` sees every torch op before
    it runs (call ``func(*args, **(kwargs or {}))`` and return the result). Walk back from
    ``sys._getframe()`` through ``f_back`` to the frame whose ``f_code is fn.__code__``; its
    ``f_lineno`` is the line. This is the information FX records as a node's stack trace.
    """
    # BEGIN SOLUTION (Exercise 1.5: map each line of fn to the torch ops it ran (ops in called functions count for the calling line); checked against tinydynamo.tracer (notebook 01, section 4, 'Which torch op ran at which line?'))
    from torch.overrides import TorchFunctionMode, resolve_name

    lines: dict[int, list[str]] = {}

    class RecordLines(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code is not fn.__code__:
                frame = frame.f_back
            if frame is not None:
                lines.setdefault(frame.f_lineno, []).append(resolve_name(func) or func.__name__)
            return func(*args, **(kwargs or {}))

    with RecordLines():
        result = fn(*args)
    return result, lines
    # END SOLUTION
