"""InstructionTranslator: run a frame's bytecode on VariableTrackers instead of real values.

One method per (normalised) opcode, named after it, as in TorchDynamo's symbolic_convert.py.
The stack and the locals hold VariableTrackers; tensor ops append FX nodes to the
OutputGraph; Python-level work (constants, lists, loops over constants, calls of user
functions) is simply carried out at trace time, so loops unroll and constant branches fold.
Anything that cannot be decided at trace time raises :class:`~tinydynamo.exc.Unsupported`.

Opcode handlers live in one registry, ``OPCODE_HANDLERS`` (opname -> function(tx, inst)),
filled from the methods below; :func:`register_opcode` lets a chapter plug in its own.
"""
from __future__ import annotations

import builtins
import contextlib
import dis
import importlib
import inspect
import linecache
import operator
import sys
import types
from typing import Any, Callable, Iterator

import torch

from tinydynamo import bytecode as bc, config, logs
from tinydynamo.bytecode import Instruction
from tinydynamo.exc import ObservedException, Unsupported, raise_observed, unimplemented
from tinydynamo.output_graph import OutputGraph
from tinydynamo.registry import swap
from tinydynamo.resume import enclosing_blocks, resume_depth
from tinydynamo.skip_frame import CompileCallee, compile_callee_at, compile_callees
from tinydynamo.source import GetItemSource, GlobalSource, LocalSource
from tinydynamo.variables import (
    NULL,
    BuiltinVariable,
    CellVariable,
    ConstantVariable,
    DictVariable,
    ListIteratorVariable,
    ListVariable,
    NestedUserFunctionVariable,
    TensorVariable,
    TupleVariable,
    VariableTracker,
)
from tinydynamo.variables.autocast import AutocastModeVariable
from tinydynamo.variables.builder import VariableBuilder, wrap_constant_result
from tinydynamo.variables.ctx_manager import (
    GradModeVariable,
    WithExitFunctionVariable,
    prune_grad_mode_nodes,
    set_grad_enabled,
)
from tinydynamo.variables.dataclasses import DataclassVariable, can_model
from tinydynamo.variables.exceptions import ExceptionVariable
from tinydynamo.variables.functions import shared_cell_tracker
from tinydynamo.variables.generator import LocalGeneratorObjectVariable, close_dead_generators
from tinydynamo.variables.iter import LazyIteratorVariable, SetVariable
from tinydynamo.variables.misc_ctx import (
    GeneratorContextManagerVariable,
    NullContextVariable,
    UserContextManagerVariable,
)
from tinydynamo.variables.numpy import NumpyNdarrayVariable, numpy_unary
from tinydynamo.variables.objects import SuperVariable, zero_arg_super
from tinydynamo.variables.sym_node import SliceVariable, SymNodeVariable
from tinydynamo.variables.tensor import ScalarNodeVariable
from tinydynamo.variables.user_defined import UserDefinedObjectVariable, _python_dunder

#: classes whose construction from constants is a constant (folded at trace time)
FOLDABLE_CLASSES = (torch.finfo, torch.iinfo, torch.device)

OPCODE_HANDLERS: dict[str, Callable[["InstructionTranslatorBase", Instruction], None]] = {}


@contextlib.contextmanager
def use_handlers(**handlers: Callable[["InstructionTranslatorBase", Instruction], None]) -> Iterator[None]:
    """Temporarily replace opcode handlers, e.g. ``use_handlers(BINARY_OP=my_binary_op)`` (the course does):
    a :func:`~tinydynamo.registry.swap` of ``OPCODE_HANDLERS``."""
    with swap(OPCODE_HANDLERS, handlers):
        yield


def register_opcode(opname: str):
    """Decorator: make ``fn(tx, inst)`` the handler for ``opname`` (replacing any earlier one)."""

    def deco(fn):
        OPCODE_HANDLERS[opname] = fn
        return fn

    return deco


class InstructionTranslatorBase:
    def __init__(self, code: types.CodeType, f_globals: dict, symbolic_locals: dict[str, VariableTracker],
                 output: OutputGraph, cells: dict[str, CellVariable], depth: int = 0):
        self.code = code
        self.f_globals = f_globals
        self.symbolic_locals = symbolic_locals
        self.output = output
        self.cells = cells
        self.depth = depth
        self.instructions = bc.get_instructions(code)
        self.stack: list[VariableTracker] = []
        self.ip = 0
        self.current_inst: Instruction | None = None
        self.return_value: VariableTracker | None = None
        self.generator_items: list[VariableTracker] | None = None  # set when a @contextmanager runs
        self.generator = None  # the LocalGeneratorObjectVariable whose body this translator runs
        self.yielded: VariableTracker | None = None  # the value of the YIELD_VALUE just run (suspends)
        self.yield_inst: Instruction | None = None  # the YIELD_VALUE the body is suspended at
        self.yield_from: VariableTracker | None = None  # the sub-iterator of a suspended `yield from`
        self.yield_from_end: int | None = None  # where that `yield from` goes on once it is done
        self.grad_contexts: list[GradModeVariable] = []  # grad-mode `with` blocks entered, outermost first

    # ---- stack ---------------------------------------------------------------------------------
    def push(self, v: VariableTracker) -> None:
        assert isinstance(v, VariableTracker), f"pushed {v!r}"
        self.stack.append(v)

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> list[VariableTracker]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    # ---- the loop --------------------------------------------------------------------------------
    def run(self) -> VariableTracker:
        while self.return_value is None:
            self.step()
        return self.return_value

    def step(self) -> None:
        inst = self.instructions[self.ip]
        self.current_inst = inst
        self.ip += 1
        self.output.instruction_count += 1
        if self.output.instruction_count > config.max_instructions:
            unimplemented(f"more than config.max_instructions={config.max_instructions} instructions "
                          "(a very long or endless loop?)")
        outer, self.output.current_tx = self.output.current_tx, self
        try:
            self.dispatch(inst)
        finally:
            self.output.current_tx = outer

    def dispatch(self, inst: Instruction) -> None:
        handler = OPCODE_HANDLERS.get(inst.opname)
        try:
            if handler is None:
                unimplemented(f"opcode {inst.opname} is not supported")
            handler(self, inst)
        except ObservedException as e:
            if not self.handle_observed_exception(inst, e):
                e.user_stack.append(self.frame_summary(inst))
                raise
        except Unsupported as e:
            e.user_stack.append(self.frame_summary(inst))
            raise

    def handle_observed_exception(self, inst: Instruction, exc: ObservedException) -> bool:
        """An exception raised by the traced code at ``inst``: jump to its handler, as CPython would (the
        exception table entry covering the instruction: cut the stack to its depth, push the exception).
        False when no handler covers it (the caller's frame may catch it). Raised while another one is
        handled, it gets that one as its ``__context__`` (once: a re-raise keeps it), as in CPython."""
        if not hasattr(exc, "context"):
            handled = self.output.exc_stack[-1] if self.output.exc_stack else None
            exc.context = handled if isinstance(handled, ExceptionVariable) and handled.exc is not exc else None
        for entry in getattr(dis.Bytecode(self.code), "exception_entries", ()):
            if entry.start <= inst.offset < entry.end:
                del self.stack[entry.depth:]
                if entry.lasti:
                    self.push(ConstantVariable(inst.offset))
                self.push(ExceptionVariable(exc))
                self.ip = next(i for i, ins in enumerate(self.instructions) if ins.offset >= entry.target)
                return True
        return False

    def frame_summary(self, inst: Instruction) -> str:
        line = linecache.getline(self.code.co_filename, inst.lineno or 0).strip()
        return f'File "{self.code.co_filename}", line {inst.lineno}, in {self.code.co_name}\n  {line}'

    # ---- helpers -------------------------------------------------------------------------------------
    def load_global(self, name: str) -> VariableTracker:
        stored = self.output.side_effects.load_global(self.f_globals, name)
        if stored is not None:  # assigned earlier in this frame (replayed after the graph)
            return stored
        if name in self.f_globals:
            root = self.output.scope.globals_root(self.f_globals)
            return VariableBuilder(self, GlobalSource(name, root)).wrap(self.f_globals[name])
        b = self.f_globals.get("__builtins__", builtins)
        b = b if isinstance(b, dict) else vars(b)
        if name in b:
            return VariableBuilder(self, None).wrap(b[name])
        unimplemented(f"name {name!r} is not defined")

    def call(self, fn: VariableTracker, args: list[VariableTracker], kwargs: dict[str, VariableTracker]) -> VariableTracker:
        if isinstance(fn, ConstantVariable) and fn.value is super:
            return self.make_super(args)
        if isinstance(fn, ConstantVariable) and fn.value in FOLDABLE_CLASSES and not kwargs \
                and all(a.is_python_constant() for a in args):  # torch.finfo(x.dtype): a constant
            return ConstantVariable(fn.value(*[a.as_python_constant() for a in args]))
        if isinstance(fn, ConstantVariable) and isinstance(fn.value, type):
            if can_model(fn.value):  # a dataclass built in the frame (a model's output record)
                return DataclassVariable.create(self, fn.value, args, kwargs)
        return fn.call_function(self, args, kwargs)

    def make_super(self, args: list[VariableTracker]) -> VariableTracker:
        """``super()`` (zero arguments: this frame's ``__class__`` cell and first argument) or ``super(cls, obj)``."""
        if len(args) == 2:
            return SuperVariable(args[0].as_python_constant(), args[1])
        if args:
            unimplemented("super() with one argument")
        return zero_arg_super(self)

    def inlining_translator(self, fn_var, bound: dict) -> InliningInstructionTranslator:
        """A nested translator for ``fn_var``'s code with its arguments ``bound``, sharing this graph
        (variables/ asks for one through ``tx``: it never imports this module)."""
        return InliningInstructionTranslator(fn_var.get_code(), fn_var.get_globals(), bound, self.output,
                                             fn_var.closure_cells(self), self.depth + 1)

    def inline_user_function(self, fn_var, args, kwargs) -> VariableTracker:
        """Trace a user function's bytecode in a nested translator sharing this graph."""
        code = fn_var.get_code()
        if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
            unimplemented(f"calling coroutine function {code.co_name}")
        if self.depth + 1 > config.max_inline_depth:
            unimplemented(f"inlining deeper than config.max_inline_depth={config.max_inline_depth} (recursion?)")
        tx = self.inlining_translator(fn_var, fn_var.bind(self, args, kwargs))
        if code.co_flags & inspect.CO_GENERATOR:
            # a generator (e.g. a generator expression): its body runs when values are asked for
            return LocalGeneratorObjectVariable(tx, code.co_name)
        return tx.run()

    def finish_yield_from(self, result: VariableTracker | None) -> None:
        """The sub-iterator of the suspended ``yield from`` is done: the expression's value is ``result``."""
        self.pop()  # the sub-iterator
        self.push(result if result is not None else ConstantVariable(None))
        self.ip, self.yield_from, self.yield_from_end = self.yield_from_end, None, None

    def jump_if(self, inst: Instruction, cond: bool) -> None:
        if cond:
            self.ip = inst.target


def _handler(fn):
    """Register a method of InstructionTranslatorBase named after its opcode."""
    OPCODE_HANDLERS[fn.__name__] = fn
    return fn


T = InstructionTranslatorBase


# ---- no-ops and stack shuffling ----------------------------------------------------------------------
@_handler
def NOP(tx: T, inst): pass


@_handler
def RESUME(tx: T, inst): pass


@_handler
def COPY_FREE_VARS(tx: T, inst): pass  # cells were set up when the frame started


@_handler
def POP_TOP(tx: T, inst): tx.pop()


@_handler
def PUSH_NULL(tx: T, inst): tx.push(NULL)


@_handler
def COPY(tx: T, inst): tx.push(tx.stack[-inst.argval])


@_handler
def SWAP(tx: T, inst):
    tx.stack[-1], tx.stack[-inst.argval] = tx.stack[-inst.argval], tx.stack[-1]


# ---- loads and stores ---------------------------------------------------------------------------------
@_handler
def LOAD_CONST(tx: T, inst): tx.push(ConstantVariable(inst.argval))


@_handler
def LOAD_FAST(tx: T, inst):
    if inst.argval not in tx.symbolic_locals:
        unimplemented(f"local variable {inst.argval!r} referenced before assignment")
    tx.push(tx.symbolic_locals[inst.argval])


@_handler
def LOAD_FAST_AND_CLEAR(tx: T, inst):  # 3.12+ inlined comprehensions save the outer variable
    tx.push(tx.symbolic_locals.pop(inst.argval, NULL))


@_handler
def STORE_FAST(tx: T, inst):
    value = tx.pop()
    if value is NULL:
        tx.symbolic_locals.pop(inst.argval, None)
    else:
        tx.symbolic_locals[inst.argval] = value


@_handler
def DELETE_FAST(tx: T, inst): tx.symbolic_locals.pop(inst.argval, None)


@_handler
def LOAD_GLOBAL(tx: T, inst):
    value = tx.load_global(inst.argval)
    for v in (bc.with_null(value, NULL) if inst.push_null else [value]):
        tx.push(v)


@_handler
def LOAD_ATTR(tx: T, inst):
    obj = tx.pop()
    value = obj.var_getattr(tx, inst.argval)
    for v in (bc.with_null(value, NULL) if inst.push_null else [value]):
        tx.push(v)


@_handler
def STORE_ATTR(tx: T, inst):
    obj, value = tx.pop(), tx.pop()
    obj.var_setattr(tx, inst.argval, value)  # a side effect: replayed after the graph (tinydynamo.side_effects)


@_handler
def DELETE_ATTR(tx: T, inst):
    tx.pop().var_delattr(tx, inst.argval)  # a side effect too: ``__dict__.pop`` replayed after the graph


@_handler
def STORE_GLOBAL(tx: T, inst):
    tx.output.side_effects.store_global(tx.f_globals, inst.argval, tx.pop())


@_handler
def MAKE_CELL(tx: T, inst):
    tx.cells[inst.argval] = CellVariable(tx.symbolic_locals.pop(inst.argval, None))


@_handler
def LOAD_CLOSURE(tx: T, inst):
    tx.push(tx.cells[inst.argval])


@_handler
def LOAD_DEREF(tx: T, inst):
    if inst.argval not in tx.cells:
        unimplemented(f"closure variable {inst.argval!r} is not available")
    tx.push(tx.cells[inst.argval].get())


@_handler
def STORE_DEREF(tx: T, inst):
    cell = tx.cells.get(inst.argval)
    if cell is not None and cell.external and cell.real_cell is not None and cell.cell_source is not None:
        # a real cell from outside (``nonlocal n; n += 1`` in a compiled closure): a side effect,
        # replayed after the graph as ``cell.cell_contents = value``; later reads see the new value
        value = tx.pop()
        tx.output.side_effects.store_attr(VariableTracker(cell.cell_source), cell.real_cell, "cell_contents", value)
        cell.value = value
        return
    if cell is None or getattr(cell, "external", False):
        unimplemented(f"assigning nonlocal {inst.argval!r} of an enclosing function outside the graph")
    cell.value = tx.pop()


# ---- operators -----------------------------------------------------------------------------------------
@_handler
def BINARY_OP(tx: T, inst):
    b, a = tx.pop(), tx.pop()
    tx.push(BuiltinVariable.binop(tx, bc.BINARY_OPS[inst.argval], a, b))


@_handler
def COMPARE_OP(tx: T, inst):
    b, a = tx.pop(), tx.pop()
    tx.push(BuiltinVariable.binop(tx, bc.COMPARE_OPS[inst.argval], a, b))


@_handler
def IS_OP(tx: T, inst):
    b, a = tx.pop(), tx.pop()
    tx.push(ConstantVariable(BuiltinVariable.is_(tx, a, b) != inst.argval))


@_handler
def CONTAINS_OP(tx: T, inst):
    container, item = tx.pop(), tx.pop()
    result = container.call_method(tx, "__contains__", [item], {})
    tx.push(ConstantVariable(result.as_python_constant() != inst.argval))


def _unary(tx: T, inst):
    v = tx.pop()
    fn = bc.UNARY_OPS[inst.opname]
    if inst.opname == "UNARY_NOT":
        tx.push(ConstantVariable(not v.truth(tx)))
    elif v.is_python_constant():
        tx.push(ConstantVariable(fn(v.as_python_constant())))
    elif isinstance(v, (TensorVariable, SymNodeVariable)):
        tx.push(tx.output.create_node("call_function", fn, [v], {}))
    elif isinstance(v, NumpyNdarrayVariable):
        tx.push(numpy_unary(tx, fn, v))
    elif isinstance(v, ScalarNodeVariable) and inst.opname in ("UNARY_NEGATIVE", "UNARY_POSITIVE"):
        tx.push(v.unary(tx, fn))  # -n of a captured .item() value
    else:
        unimplemented(f"{inst.opname} on {v}")


for _name in bc.UNARY_OPS:
    OPCODE_HANDLERS[_name] = _unary


@_handler
def BINARY_SUBSCR(tx: T, inst):
    key, obj = tx.pop(), tx.pop()
    if isinstance(obj, TensorVariable) and isinstance(key, SymNodeVariable) and key.python_type() is int:
        # ``x[n]`` with a symbolic n (an ``.item()`` value): Tensor.__getitem__ takes no SymInt, select does
        tx.push(tx.output.create_node("call_method", "select", [obj, ConstantVariable(0), key], {}))
    elif isinstance(obj, TensorVariable):
        tx.push(tx.output.create_node("call_function", operator.getitem, [obj, key], {}))
    elif obj.is_python_constant() and isinstance(obj.as_python_constant(), type) and key.is_python_constant() \
            and hasattr(obj.as_python_constant(), "__class_getitem__"):
        # ``list[int]``, ``dict[str, Tensor]``: a class subscripted builds an annotation (folded)
        tx.push(wrap_constant_result(obj.as_python_constant()[key.as_python_constant()]))
    else:
        tx.push(obj.call_method(tx, "__getitem__", [key], {}))


@_handler
def STORE_SUBSCR(tx: T, inst):
    key, obj, value = tx.pop(), tx.pop(), tx.pop()
    if isinstance(obj, TensorVariable):
        tx.output.create_node("call_function", operator.setitem, [obj, key, value], {}, keep=True)
    else:
        obj.call_method(tx, "__setitem__", [key, value], {})


@_handler
def DELETE_SUBSCR(tx: T, inst):
    key, obj = tx.pop(), tx.pop()
    if isinstance(obj, TensorVariable):
        unimplemented("del on a tensor element")
    obj.call_method(tx, "__delitem__", [key], {})


# ---- building containers --------------------------------------------------------------------------------
@_handler
def BUILD_TUPLE(tx: T, inst): tx.push(TupleVariable(tx.popn(inst.argval)))


@_handler
def BUILD_LIST(tx: T, inst): tx.push(ListVariable(tx.popn(inst.argval)))


@_handler
def BUILD_MAP(tx: T, inst):
    items = tx.popn(2 * inst.argval)
    tx.push(DictVariable.from_pairs(tx, list(zip(items[::2], items[1::2]))))


@_handler
def BUILD_CONST_KEY_MAP(tx: T, inst):
    keys = tx.pop().as_python_constant()
    tx.push(DictVariable(dict(zip(keys, tx.popn(inst.argval)))))


@_handler
def BUILD_SLICE(tx: T, inst):
    parts = tx.popn(inst.argval)
    if any(isinstance(p, SymNodeVariable) for p in parts) and \
            all(p.is_python_constant() or isinstance(p, SymNodeVariable) for p in parts):
        tx.push(SliceVariable(parts))  # x[:n] with a symbolic n stays symbolic
        return
    if not all(p.is_python_constant() for p in parts):
        unimplemented("slice with non-constant bounds")
    tx.push(ConstantVariable(slice(*[p.as_python_constant() for p in parts])))


@_handler
def LIST_APPEND(tx: T, inst):
    v = tx.pop()
    tx.stack[-inst.argval].call_method(tx, "append", [v], {})


@_handler
def LIST_EXTEND(tx: T, inst):
    v = tx.pop()
    tx.stack[-inst.argval].call_method(tx, "extend", [v], {})


@_handler
def LIST_TO_TUPLE(tx: T, inst): tx.push(TupleVariable(tx.pop().unpack_var_sequence(tx)))


@_handler
def MAP_ADD(tx: T, inst):
    v, k = tx.pop(), tx.pop()
    tx.stack[-inst.argval].call_method(tx, "__setitem__", [k, v], {})


@_handler
def DICT_UPDATE(tx: T, inst):
    v = tx.pop()
    tx.stack[-inst.argval].call_method(tx, "update", [v], {})


OPCODE_HANDLERS["DICT_MERGE"] = DICT_UPDATE


@_handler
def UNPACK_SEQUENCE(tx: T, inst):
    items = tx.pop().unpack_var_sequence(tx)
    if len(items) != inst.argval:
        unimplemented(f"unpacking {len(items)} values into {inst.argval} names")
    for v in reversed(items):
        tx.push(v)


@_handler
def UNPACK_EX(tx: T, inst):
    items = tx.pop().unpack_var_sequence(tx)
    before, after = inst.argval & 0xFF, inst.argval >> 8
    if len(items) < before + after:
        unimplemented("not enough values to unpack")
    middle = ListVariable(items[before:len(items) - after])
    for v in reversed(items[:before] + [middle] + items[len(items) - after:]):
        tx.push(v)


# ---- iteration and jumps -----------------------------------------------------------------------------------
@_handler
def GET_ITER(tx: T, inst):
    v = tx.pop()
    if isinstance(v, ListIteratorVariable):
        tx.push(v)
    elif isinstance(v, UserDefinedObjectVariable) and _python_dunder(v.python_type(), "__next__") is not None \
            and _python_dunder(v.python_type(), "__iter__") is not None:
        # an iterator object: each item from an inlined __next__ when the loop asks for it
        it = v.call_method(tx, "__iter__", [], {})
        if it is v:
            tx.push(LazyIteratorVariable(v.next_items(tx), f"{v.python_type().__name__} iterator"))
        else:
            tx.push(it if isinstance(it, ListIteratorVariable) else ListIteratorVariable(it.unpack_var_sequence(tx)))
    else:  # remember a list/dict iterated over: changing it inside the loop is not unrolled
        origin = v if isinstance(v, (ListVariable, DictVariable)) else getattr(v, "dict_var", None)
        it = ListIteratorVariable(v.unpack_var_sequence(tx), origin)
        if isinstance(origin, DictVariable) and (v is origin or getattr(v, "kind", None) in ("keys", "values", "items")):
            it.follow_dict_values(None if v is origin or v.kind == "keys" else v)
        tx.push(it)


OPCODE_HANDLERS["GET_YIELD_FROM_ITER"] = GET_ITER  # `yield from x`: iter(x), a generator stays itself


@_handler
def SEND(tx: T, inst):
    """``yield from``'s step (3.11 semantics; bytecode.py drops 3.12's END_SEND): send the value to the
    sub-iterator; what it yields is yielded on; once it is done, its return value replaces both."""
    value, sub = tx.pop(), tx.stack[-1]
    if isinstance(sub, LocalGeneratorObjectVariable):
        out = sub.resume(sent=value)
    elif isinstance(sub, ListIteratorVariable):
        if not (value.is_python_constant() and value.as_python_constant() is None):
            unimplemented(f"sending a value into the iterator {sub} of a `yield from` (it has no send())")
        out = sub.next_item()
    else:
        unimplemented(f"`yield from` {sub}")
    tx.yield_from, tx.yield_from_end = sub, inst.target
    if out is None:
        tx.finish_yield_from(getattr(sub, "return_value", None))
    else:
        tx.push(out)


@_handler
def FOR_ITER(tx: T, inst):
    it = tx.stack[-1]
    if not isinstance(it, ListIteratorVariable):
        unimplemented(f"FOR_ITER over {it}")
    item = it.next_item()
    if item is None:
        tx.pop()
        tx.ip = inst.target
    else:
        tx.push(item)


@_handler
def END_FOR(tx: T, inst):
    unimplemented("END_FOR reached (FOR_ITER's normalised target should skip it)")


@_handler
def JUMP_FORWARD(tx: T, inst): tx.ip = inst.target


OPCODE_HANDLERS["JUMP_BACKWARD"] = JUMP_FORWARD


def assert_message(tx: T) -> str | None:
    """The message of an ``assert`` whose failing path starts at the next instruction (``assert x`` or
    ``assert x, "text"``: LOAD_ASSERTION_ERROR [LOAD_CONST str, CALL] RAISE_VARARGS), else None: an
    assert with a computed message (an f-string, a tensor) is left to the normal jump."""
    names = [i.opname for i in tx.instructions[tx.ip:tx.ip + 4]]
    if names[:2] == ["LOAD_ASSERTION_ERROR", "RAISE_VARARGS"]:
        return "assertion error"
    message = tx.instructions[tx.ip + 1].argval if len(names) > 1 else None
    if names == ["LOAD_ASSERTION_ERROR", "LOAD_CONST", "CALL", "RAISE_VARARGS"] and isinstance(message, str):
        return message
    return None


@_handler
def POP_JUMP_IF_TRUE(tx: T, inst):
    value = tx.pop()
    if isinstance(value, TensorVariable) and sys.flags.optimize == 0:  # `assert <tensor>[, "msg"]`
        message = assert_message(tx)
        if message is not None:  # checked when the graph runs, as TorchDynamo rewrites it
            tx.output.create_node("call_function", torch._assert_async, [value, ConstantVariable(message)], {}, keep=True)
            tx.ip = inst.target
            return
    tx.jump_if(inst, value.truth(tx))


@_handler
def POP_JUMP_IF_FALSE(tx: T, inst): tx.jump_if(inst, not tx.pop().truth(tx))


@_handler
def POP_JUMP_IF_NONE(tx: T, inst): tx.jump_if(inst, BuiltinVariable.is_(tx, tx.pop(), ConstantVariable(None)))


@_handler
def POP_JUMP_IF_NOT_NONE(tx: T, inst):
    tx.jump_if(inst, not BuiltinVariable.is_(tx, tx.pop(), ConstantVariable(None)))


@_handler
def JUMP_IF_TRUE_OR_POP(tx: T, inst):  # 3.11 only
    if tx.stack[-1].truth(tx):
        tx.ip = inst.target
    else:
        tx.pop()


@_handler
def JUMP_IF_FALSE_OR_POP(tx: T, inst):  # 3.11 only
    if not tx.stack[-1].truth(tx):
        tx.ip = inst.target
    else:
        tx.pop()


@_handler
def RETURN_VALUE(tx: T, inst): tx.return_value = tx.pop()


# ---- calls and functions -------------------------------------------------------------------------------------
@_handler
def CALL(tx: T, inst):
    call = bc.call_layout(inst, tx.stack, lambda v: v is NULL)  # the layout rule lives in bytecode.py
    tx.popn(call.depth)
    tx.push(tx.call(call.fn, call.args, call.kwargs))


@_handler
def CALL_FUNCTION_EX(tx: T, inst):
    call = bc.call_layout(inst, tx.stack, lambda v: v is NULL)
    tx.popn(call.depth)
    kwargs = {}
    if call.star_kwargs is not None:
        if not isinstance(call.star_kwargs, DictVariable):
            unimplemented(f"**kwargs from {call.star_kwargs}")
        kwargs = dict(call.star_kwargs.items)
        if not all(isinstance(k, str) for k in kwargs):
            raise_observed(TypeError, "keywords must be strings")
    tx.push(tx.call(call.fn, call.args + call.star_args.unpack_var_sequence(tx), kwargs))


@_handler
def MAKE_FUNCTION(tx: T, inst):
    code = tx.pop().as_python_constant()
    tx.push(NestedUserFunctionVariable(code, tx.f_globals, getattr(code, "co_qualname", code.co_name)))


@_handler
def SET_FUNCTION_ATTRIBUTE(tx: T, inst):
    fn = tx.pop()
    fn.set_attribute(inst.argval, tx.pop())
    tx.push(fn)


@_handler
def RETURN_GENERATOR(tx: T, inst):
    if tx.generator_items is None and tx.generator is None:
        unimplemented("generators")
    tx.push(ConstantVariable(None))  # popped by the POP_TOP that follows


@_handler
def YIELD_VALUE(tx: T, inst):
    if tx.generator is not None:  # suspend: the generator's caller gets the value (resuming pushes the sent one)
        tx.yielded, tx.yield_inst = tx.pop(), inst
        return
    if tx.generator_items is None:
        unimplemented("yield outside an inlined generator")
    tx.generator_items.append(tx.pop())
    tx.push(ConstantVariable(None))  # the value sent back in: always None for a plain iteration


@_handler
def BEFORE_WITH(tx: T, inst):
    """``with ctx:`` pushes ``ctx.__exit__`` (called at the end of the block) and ``ctx.__enter__()``."""
    ctx = tx.pop()

    if isinstance(ctx, UserDefinedObjectVariable) and _python_dunder(ctx.python_type(), "__enter__") \
            and _python_dunder(ctx.python_type(), "__exit__"):
        ctx = UserContextManagerVariable(ctx)  # a class with Python __enter__/__exit__: both inlined

    if isinstance(ctx, (NullContextVariable, UserContextManagerVariable, GeneratorContextManagerVariable,
                        AutocastModeVariable)):
        tx.push(WithExitFunctionVariable(ctx))
        tx.push(ctx.enter(tx))
        return
    if not isinstance(ctx, GradModeVariable):
        unimplemented(f"`with` blocks are not captured yet, except grad-mode ones (torch.no_grad(), "
                      f"torch.enable_grad(), torch.set_grad_enabled(b)); got {ctx}")
    tx.push(WithExitFunctionVariable(ctx))
    tx.push(ctx.enter(tx))


# ---- exceptions raised and caught inside traced code (the handler path of try/except) --------------------
@_handler
def WITH_EXCEPT_START(tx: T, inst):
    """A ``with`` block raised: call its ``__exit__(type, exc, tb)`` (four below the top, under the
    saved ``lasti`` and the previous exception) and push the result; a true one suppresses the exception."""
    exc, exit_fn = tx.stack[-1], tx.stack[-4]
    if not isinstance(exc, ExceptionVariable):
        unimplemented(f"a `with` block's exit on {exc}")
    tx.push(exit_fn.call_function(tx, [ConstantVariable(exc.python_type()), exc, ConstantVariable(None)], {}))


@_handler
def PUSH_EXC_INFO(tx: T, inst):
    exc = tx.pop()
    tx.push(ConstantVariable(None))  # the previous "current exception" (sys.exc_info()), restored by POP_EXCEPT
    tx.push(exc)
    tx.output.exc_stack.append(exc)  # the exception being handled (what a bare `raise` re-raises)


@_handler
def CHECK_EXC_MATCH(tx: T, inst):
    expected = tx.pop().as_python_constant()
    exc = tx.stack[-1]
    if not isinstance(exc, ExceptionVariable):
        unimplemented(f"except clause on {exc}")
    tx.push(ConstantVariable(issubclass(exc.exc.exc_type, expected)))


@_handler
def POP_EXCEPT(tx: T, inst):
    tx.pop()
    if tx.output.exc_stack:
        tx.output.exc_stack.pop()


@_handler
def RERAISE(tx: T, inst):
    exc = tx.pop()
    if not isinstance(exc, ExceptionVariable):
        unimplemented(f"re-raising {exc}")
    raise exc.exc


@_handler
def RAISE_VARARGS(tx: T, inst):
    """``raise E`` / ``raise E("msg")`` / ``raise E(...) from c`` / a bare ``raise`` in an ``except`` block:
    observed, so an enclosing ``try`` in traced code can catch it; anything else (and an uncaught raise)
    is Unsupported."""
    if inst.argval == 0:  # a bare `raise`: the exception being handled
        if not tx.output.exc_stack or not isinstance(tx.output.exc_stack[-1], ExceptionVariable):
            unimplemented("bare `raise` outside a traced except block")
        raise tx.output.exc_stack[-1].exc
    cause = tx.pop() if inst.argval == 2 else None  # `raise exc from cause`
    exc = tx.pop()
    if isinstance(exc, ExceptionVariable):
        if cause is not None:  # __cause__ (an exception, or None: `from None`), which hides __context__
            exc.exc.cause, exc.exc.suppress_context = cause, True
        raise exc.exc
    value = exc.as_python_constant() if exc.is_python_constant() else None
    if isinstance(value, type) and issubclass(value, BaseException):
        raise ObservedException(value)
    unimplemented(f"raise statement ({exc})")


_UNSUPPORTED_OPS = {
    "LOAD_ASSERTION_ERROR": "assert statement failing path",
    "SETUP_ANNOTATIONS": "annotations",
    "YIELD_VALUE": "generators", "RETURN_GENERATOR": "generators", "GET_AWAITABLE": "async code",
    "BUILD_SET": "set displays",
"CALL_INTRINSIC_1": "intrinsic", "STORE_SLICE": "slice assignment",
}
for _name, _reason in _UNSUPPORTED_OPS.items():
    OPCODE_HANDLERS.setdefault(_name, lambda tx, inst, _r=_reason: unimplemented(_r))


# ---- f-strings, sets, imports, super() -------------------------------------------------------------------------
def _format(tx: T, value: VariableTracker, spec: str, convert=None) -> VariableTracker:
    """``format(value, spec)`` at trace time (f-string pieces): only constants can be formatted."""
    if not value.is_python_constant():
        unimplemented(f"formatting {value} in an f-string (its text is only known at run time)",
                      hint="format constants (shapes, dtypes, config values), or move the f-string out")
    v = value.as_python_constant()
    return ConstantVariable(format(convert(v) if convert is not None else v, spec))


@_handler
def CONVERT_VALUE(tx: T, inst):
    value = tx.pop()
    if not value.is_python_constant():
        unimplemented(f"{inst.argval.__name__}() of {value} in an f-string")
    tx.push(ConstantVariable(inst.argval(value.as_python_constant())))


@_handler
def FORMAT_SIMPLE(tx: T, inst): tx.push(_format(tx, tx.pop(), ""))


@_handler
def FORMAT_WITH_SPEC(tx: T, inst):
    spec = tx.pop().as_python_constant()
    tx.push(_format(tx, tx.pop(), spec, inst.argval))


@_handler
def BUILD_STRING(tx: T, inst):
    tx.push(ConstantVariable("".join(p.as_python_constant() for p in tx.popn(inst.argval))))


@_handler
def BUILD_SET(tx: T, inst):
    tx.push(SetVariable(tx.popn(inst.argval)))


@_handler
def SET_ADD(tx: T, inst):
    v = tx.pop()
    tx.stack[-inst.argval].call_method(tx, "add", [v], {})


@_handler
def SET_UPDATE(tx: T, inst):
    v = tx.pop()
    tx.stack[-inst.argval].call_method(tx, "update", [v], {})


@_handler
def IMPORT_NAME(tx: T, inst):
    """``import a.b`` / ``from a import b`` inside the frame: imported at trace time (as TorchDynamo does;
    importing is idempotent), the module becomes a constant of the trace."""
    fromlist, level = tx.pop().as_python_constant(), tx.pop().as_python_constant()
    try:
        module = __import__(inst.argval, tx.f_globals, None, fromlist, level)
    except ImportError as e:
        unimplemented(f"import {inst.argval} failed at trace time: {e}")
    tx.push(VariableBuilder(tx, None).wrap(module))


@_handler
def IMPORT_FROM(tx: T, inst):
    module = tx.stack[-1]
    real = module.as_python_constant()
    if not hasattr(real, inst.argval):  # a submodule not imported yet
        try:
            importlib.import_module(f"{real.__name__}.{inst.argval}")
        except ImportError as e:
            unimplemented(f"from {real.__name__} import {inst.argval} failed at trace time: {e}")
    tx.push(VariableBuilder(tx, None).wrap(getattr(real, inst.argval)))


@_handler
def LOAD_SUPER_ATTR(tx: T, inst):
    """3.12+: ``super().name`` in one instruction (stack: ``super``, the class, the first argument)."""
    obj, cls, fn = tx.pop(), tx.pop(), tx.pop()
    if not (fn.is_python_constant() and fn.as_python_constant() is super):
        unimplemented(f"LOAD_SUPER_ATTR with {fn} rebound from `super`")
    value = SuperVariable(cls.as_python_constant(), obj).var_getattr(tx, inst.argval)
    for v in (bc.with_null(value, NULL) if inst.push_null else [value]):
        tx.push(v)


#: instructions a graph break can split a frame at (run natively, then resume after them)
BREAKABLE = ("CALL", "CALL_FUNCTION_EX", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE",
             "STORE_ATTR", "DELETE_ATTR", "STORE_SUBSCR", "STORE_GLOBAL", "DELETE_SUBSCR")


class GraphBreak:
    """Where and why tracing stopped: the instruction, the reason, the stack and locals before it."""

    def __init__(self, inst: Instruction, error: Unsupported, stack, symbolic_locals):
        self.inst = inst
        self.error = error
        self.stack = stack
        self.symbolic_locals = symbolic_locals

    @property
    def reason(self) -> str:
        return self.error.reason


class InstructionTranslator(InstructionTranslatorBase):
    """The translator of a top-level frame: its arguments come from real values (with sources).

    With ``allow_graph_breaks``, an Unsupported raised by a CALL or a conditional jump (outside any
    try/with block) ends tracing there instead of failing: ``graph_break`` records the instruction
    and the stack/locals just before it, and the OutputGraph compiles the graph so far plus a
    call of a resume function (see tinydynamo.resume).
    """

    def __init__(self, code: types.CodeType, f_globals: dict, f_locals: dict[str, Any], output: OutputGraph,
                 allow_graph_breaks: bool = False):
        super().__init__(code, f_globals, {}, output, {}, depth=0)
        self.allow_graph_breaks = allow_graph_breaks
        self.graph_break: GraphBreak | None = None
        output.frame_values = (f_locals, f_globals)  # L and G: a source's real value, where one is needed
        for name in code.co_varnames[:_n_args(code)]:
            if name in f_locals:
                self.symbolic_locals[name] = VariableBuilder(self, LocalSource(name)).wrap(f_locals[name])
        for i, name in enumerate(code.co_freevars):  # the wrapper puts closure contents into L under their names
            value = VariableBuilder(self, LocalSource(name)).wrap(f_locals[name]) if name in f_locals else None
            cell = CellVariable(value)  # (an empty cell: a resume function's cell not assigned yet)
            cell.external = True
            cell.cell_source = GetItemSource(LocalSource("___closure"), i)  # the real cell (L['___closure'][i])
            if "___closure" in f_locals:
                cell.real_cell = f_locals["___closure"][i]
                shared_cell_tracker(self, cell.real_cell, cell)
            self.cells[name] = cell

    def run(self) -> VariableTracker | None:
        initial_grad_mode = torch.is_grad_enabled()
        while self.return_value is None and self.graph_break is None:
            if self.allow_graph_breaks and self.instructions[self.ip].opname in BREAKABLE:
                self.output.side_effects.checkpoint()  # an undo log for the instruction that may break
            self.step()
        if self.return_value is not None:  # the frame's locals are freed: so are its generators
            close_dead_generators(self, self.return_value)
        if self.graph_break is not None:  # it runs natively instead: undo the side effects it recorded
            self.output.side_effects.restore()
        prune_grad_mode_nodes(self.output.graph, initial_grad_mode)
        return self.return_value

    def dispatch(self, inst: Instruction) -> None:
        if not self.allow_graph_breaks or inst.opname not in BREAKABLE:
            return super().dispatch(inst)

        stack, local_vars = list(self.stack), dict(self.symbolic_locals)
        contexts, grad_mode = list(self.grad_contexts), torch.is_grad_enabled()
        last_node = next(iter(reversed(self.output.graph.nodes)), None)
        # iterators the call may advance before it breaks (a list comprehension inlined halfway):
        # the call runs natively from the start, so they must be where they were
        iterators = [(v, v.index, v.items, v.origin) for v in (*stack, *local_vars.values())
                     if isinstance(v, ListIteratorVariable)]
        generators = [(g, g.steps) for g in self.output.generators]
        try:
            super().dispatch(inst)
        except Unsupported as e:
            for it, index, items, origin in iterators:
                it.index, it.items, it.origin = index, items, origin
            blocks = enclosing_blocks(self.code, inst.offset)
            # a generator the instruction ran part of cannot be put back where it was: the frame runs eagerly
            advanced = any(g.steps != steps for g, steps in generators)
            # one whose clean-up (a `finally` around its suspended yield) would run later: not modelled
            advanced = advanced or any(g.cleanup_pending() for g in self.output.generators)
            if blocks != ["with"] * len(contexts) or e.skip_frame or advanced or self._resumed_too_often(inst):
                # inside try (or a `with` we did not trace), or an instruction that reads the frame
                # itself (eval()), or a generator as above, or a loop that broke in too many
                # iterations already: not resumable, the frame runs eagerly, but the functions and
                # modules it calls are compiled (tinydynamo.skip_frame)
                e.eager_code = self._compile_callees_code(inst, stack)
                raise
            self.stack, self.symbolic_locals = stack, local_vars
            self._undo_instruction(last_node, contexts, grad_mode)
            for ctx in reversed(contexts):  # the graph leaves the `with` blocks; the transformed code re-enters them
                if hasattr(ctx, "leave_for_graph_break"):  # torch.autocast: an exit node
                    ctx.leave_for_graph_break(self)
            grad_contexts = [c for c in contexts if isinstance(c, GradModeVariable)]
            if grad_contexts:
                set_grad_enabled(self, grad_contexts[0].initial_mode)
            self.graph_break = GraphBreak(inst, e, stack, local_vars)
            self.graph_break.cells = dict(self.cells)  # closures rebuilt at the break share these

    def _resumed_too_often(self, inst: Instruction) -> bool:
        """A break inside a ``for``/``while`` loop resumes in a function of its own, which breaks again
        in the next iteration: one more resume function per iteration. After
        ``config.max_loop_resumes`` of them the frame runs natively from here, its callees compiled
        (TorchDynamo runs any frame with a break in a loop so, ``has_backedge``)."""
        if resume_depth(self.code) < config.max_loop_resumes:
            return False
        for later in self.instructions[inst.index + 1:]:  # a jump back to or before inst: a loop around it
            if later.opname in ("RETURN_VALUE", "RETURN_CONST"):
                return False
            if later.target is not None and later.target <= inst.index:
                return True
        return False

    def _compile_callees_code(self, inst: Instruction, stack: list) -> types.CodeType | None:
        """The frame's code with the callables of its calls compiled: every call where this Python's
        call layout is known (:func:`~tinydynamo.skip_frame.compile_callees`), else the call ``inst``
        (None: neither)."""
        if self.output.wrap_for_resume is None:
            return None
        try:
            code = compile_callees(self.code, CompileCallee(self.output.wrap_for_resume))
            if code is not None:
                return code
        except Exception as e:  # noqa: BLE001 - then only the call that broke
            logs.get_logger("graph_breaks").info("not compiling the callees of %s: %s", self.code.co_name, e)
        if inst.opname not in ("CALL", "CALL_FUNCTION_EX"):
            return None
        call = bc.call_layout(inst, stack, lambda v: v is NULL)
        try:
            return compile_callee_at(self.code, inst.offset, len(stack) - 1 - call.fn_index,
                                     CompileCallee(self.output.wrap_for_resume))
        except Exception as e:  # the frame then runs its own code, callees eagerly, as before
            logs.get_logger("graph_breaks").info("not compiling the callee at offset %d of %s: %s",
                                                 inst.offset, self.code.co_name, e)
            return None

    def _undo_instruction(self, last_node, contexts, grad_mode: bool) -> None:
        """Forget what the instruction that broke added to the graph. It runs natively instead (a call
        it inlined runs again in full, as its own frame), so ops it traced before the break must not
        also run in this graph (an in-place ``num_batches_tracked += 1`` would count twice), and
        grad-mode switches it made are undone."""
        nodes = list(self.output.graph.nodes)
        start = nodes.index(last_node) + 1 if last_node is not None else 0
        for node in reversed(nodes[start:]):
            if node.op != "placeholder":  # new inputs stay (placed before the ops); unused ones are harmless
                self.output.graph.erase_node(node)
        for ctx in reversed(self.grad_contexts[len(contexts):]):  # autocast blocks the instruction entered
            if hasattr(ctx, "undo_real"):
                ctx.undo_real(self.output)
        self.grad_contexts = contexts
        torch._C._set_grad_enabled(grad_mode)


class InliningInstructionTranslator(InstructionTranslatorBase):
    """A nested translator for an inlined call; its return value goes back to the caller."""

    def __init__(self, code, f_globals, symbolic_locals, output, cells, depth):
        super().__init__(code, f_globals, symbolic_locals, output, dict(cells), depth)


def _n_args(code: types.CodeType) -> int:
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return n
