"""PyCodegen (PyTorch's name, torch/_dynamo/codegen.py): the Python a cache hit runs after the graph.

The OutputGraph builds the FX graph; this module writes the code around its call. TorchDynamo emits
bytecode; tinydynamo emits readable Python source (the "transformed code" of ``show()``), with the
same jobs: rebuild the frame's return value from the graph outputs, and at a graph break run the
instruction that broke natively and call the resume function(s) with the rebuilt stack and locals
(:class:`GraphBreakCodegen`):

    def ___compiled_frame(L, G):
        ___o = ___compiled_fn(L['x'])
        ___r = ___wrap0(___c1, None)('hi')     # print('hi'): the CALL that broke, run natively
        return ___resume2(___r, ___o[0])       # the rest of the frame: __resume_at_<offset>
"""
from __future__ import annotations

import collections
import dis
import math
import types
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx

from tinydynamo import bytecode as bc
from tinydynamo.exc import unimplemented
from tinydynamo.resume import live_locals, make_resume_code, next_offset
from tinydynamo.source import LocalSource, Source, read_parent, source_reader
from tinydynamo.variables.base import NULL
from tinydynamo.variables.ctx_manager import WithExitFunctionVariable, is_grad_mode_node
from tinydynamo.variables.lists import ListIteratorVariable

if TYPE_CHECKING:
    from tinydynamo.output_graph import OutputGraph
    from tinydynamo.variables.tensor import TensorVariable


class PyCodegen:
    """Builds Python expressions that rebuild values after the graph (``VariableTracker.reconstruct``
    asks it for graph outputs, constants and sources). TorchDynamo's ``PyCodegen`` emits bytecode."""

    def __init__(self, output: "OutputGraph"):
        self.output = output
        self.hoist_sources = False  # read sources into temporaries first (when side effects are replayed)
        self._hoisted: dict[str, str] = {}
        self.nodes: list[torch.fx.Node] = []
        self.prelude: list[str] = []  # temporaries built once, before the body uses them
        self._shared: dict[int, str] = {}
        self.resume_codes: list[types.CodeType] = []  # resume functions the body calls (for the views)

    def shared(self, var, build: Callable[[], str]) -> str:
        """A mutable container built once and referred to by name, so that every place holding it
        (a local, a stack slot, a bound method) still shares ONE object after a graph break."""
        if id(var) not in self._shared:
            expr = build()
            name = f"___t{len(self._shared)}"
            self._shared[id(var)] = name
            self.prelude.append(f"{name} = {expr}")
        return self._shared[id(var)]

    def graph_output(self, var: "TensorVariable") -> str:
        if var.node not in self.nodes:
            self.nodes.append(var.node)
        return f"___o[{self.nodes.index(var.node)}]"

    def constant(self, value: Any, hint: str = "c") -> str:
        if value is None or isinstance(value, (bool, str)) or (
                type(value) in (int, float) and math.isfinite(value)):
            return repr(value)
        return self.output.scope.constant(value, hint)

    def compiled_frame_source(self, body: list[str], n_ops: int) -> str:
        """The source of ``___compiled_frame(L, G)``, what a cache hit runs: the graph call on the
        inputs read from their sources (the grad mode restored after it, also when it raises, as
        eager's ``with`` exits), the temporaries of :meth:`shared` / :meth:`source_expr`, then ``body``."""
        output = self.output
        reads, args = read_inputs(output.input_sources)
        inputs = ", ".join(args)
        lines = ["def ___compiled_frame(L, G):"]
        grad_nodes = [n for n in output.graph.nodes if is_grad_mode_node(n)]
        if grad_nodes:
            lines += ["    try:", *(f"        {r}" for r in reads if n_ops),
                      f"        ___o = ___compiled_fn({inputs})" if n_ops else "        pass",
                      "    finally:", f"        {output.scope.constant(torch._C._set_grad_enabled, 'fn')}"
                      f"({grad_nodes[-1].args[0]})  # torch._C._set_grad_enabled"]
        elif self.nodes or n_ops:
            lines += [f"    {r}" for r in reads]
            lines.append(f"    ___o = ___compiled_fn({inputs})")
        lines += [f"    {line}" for line in self.prelude + body]
        return "\n".join(lines) + "\n"

    def source_expr(self, source: Source) -> str:
        """``source``'s expression; with side effects to replay, read once into a temporary before any
        replayed store could rebind it (``self.items = []`` must not change what ``L['self'].items`` was)."""
        if not self.hoist_sources or isinstance(source, LocalSource):
            return source.code()
        key = source.name()
        if key not in self._hoisted:
            self._hoisted[key] = f"___s{len(self._hoisted)}"
            self.prelude.append(f"{self._hoisted[key]} = {source.code()}")
        return self._hoisted[key]


def read_inputs(sources: list[Source]) -> tuple[list[str], list[str]]:
    """(assignments, one expression per source): how a cache hit reads the graph's inputs. A parent
    that several inputs are read through (``L['self']._modules['layer1']``, on the way to each of its
    parameters) is read once into a temporary, ``___i0 = ...``, and the inputs read from it: a
    ResNet's hundred parameters cost two lookups each instead of a walk from ``L['self']``, as the
    guard check reads them (guards.generate_check_code), through the modules' instance dicts."""
    uses: collections.Counter = collections.Counter()
    for source in sources:
        parent, _ = read_parent(source, through_dicts=True)
        while parent is not None:
            uses[parent.name()] += 1
            parent, _ = read_parent(parent, through_dicts=True)
    reads: list[str] = []
    read = source_reader(reads, "___i", bind=lambda source: uses[source.name()] >= 2, through_dicts=True)
    return reads, [read(s) for s in sources]


def _slot_kind(v) -> str:
    """How a stack slot travels to the resume function (its prologue pushes it back the same way)."""
    if isinstance(v, WithExitFunctionVariable):
        return "ctx"
    return "null" if v is NULL else "iter" if isinstance(v, ListIteratorVariable) else "value"


class GraphBreakCodegen:
    """The lines after the graph at a graph break (TorchDynamo: ``create_call_resume_at`` and the
    codegen of the instruction that broke): run that instruction natively, then return the resume
    function's result. One method per kind of breaking instruction."""

    def __init__(self, output: "OutputGraph", brk, codegen: PyCodegen, backend: Any, code: types.CodeType):
        if output.wrap_for_resume is None:
            raise TypeError("OutputGraph(wrap_for_resume=...) is needed to compile a graph break: pass "
                            "tinydynamo.eval_frame.wrap_for_resume (convert_frame.compile_frame passes it)")
        self.output, self.brk, self.codegen, self.backend, self.code = output, brk, codegen, backend, code
        self.all_locals = [n for n in brk.symbolic_locals if not n.startswith("___stack")]  # dead after a prologue

    def lines(self) -> list[str]:
        inst, stack = self.brk.inst, list(self.brk.stack)
        if inst.opname in ("CALL", "CALL_FUNCTION_EX"):
            lines = self._call(inst, stack)
        elif inst.opname in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE"):
            return self._jump(inst, stack)  # decides between two resume points: no native instruction
        else:
            lines = self._store(inst, stack)
        return self._reenter_with_blocks(stack, lines)

    # ---- the rest of the frame ------------------------------------------------------------------
    def _rebuild(self, v) -> str:
        """A stack value's expression; an iterator travels as the list of its remaining items."""
        if hasattr(v, "materialize"):  # a generator made in the frame: its remaining values, computed now
            v.materialize()
        if getattr(v, "gen", None) is not None:  # a lazy one (map, filter, count...) has no list of them
            unimplemented("a graph break inside a loop over a lazy iterator (map/filter/itertools): "
                          "its remaining items are not known")
        if isinstance(v, ListIteratorVariable):
            return f"[{', '.join(i.reconstruct(self.codegen) for i in v.items[v.index:])}]"
        return v.reconstruct(self.codegen)

    def resume_call(self, offset: int, below: list, pushed: list[str]) -> str:
        """``return __resume_at_<offset>(stack..., locals...)``: the frame from ``offset`` on, compiled
        in its turn (``wrap_for_resume``), with the stack ``below`` plus ``pushed`` expressions."""
        kinds = [_slot_kind(v) for v in below] + ["value"] * len(pushed)
        exprs = [self._rebuild(v) for v in below if v is not NULL] + pushed
        local_names = live_locals(self.code, offset, self.all_locals)
        local_exprs = [self.brk.symbolic_locals[n].reconstruct(self.codegen) for n in local_names]
        resume_code = make_resume_code(self.code, offset, kinds, local_names)
        self.codegen.resume_codes.append(resume_code)
        scope, wrap = self.output.scope, self.output.wrap_for_resume
        args = ", ".join(exprs + local_exprs)
        if not resume_code.co_freevars:
            fn = types.FunctionType(resume_code, scope.f_globals, resume_code.co_name)
            return f"return {scope.constant(wrap(fn, self.backend), 'resume')}({args})"
        # the frame's cells travel as the resume function's closure
        cells = [self.brk.cells[n] for n in resume_code.co_freevars]
        template = types.FunctionType(resume_code, scope.f_globals, resume_code.co_name, None,
                                      tuple(types.CellType() for _ in cells))
        name = scope.constant(wrap(template, self.backend), "resume")
        closure = "(" + "".join(f"{c.reconstruct(self.codegen)}, " for c in cells) + ")"
        call = scope.constant(self.output.call_resume_with_closure, "call_resume")
        return f"return {call}({name}, {closure}, {args})"

    # ---- the instruction that broke -------------------------------------------------------------
    def _call(self, inst, stack: list) -> list[str]:
        """CALL / CALL_FUNCTION_EX: ``___r = fn(...)`` (the callee compiled as its own frame)."""
        call = bc.call_layout(inst, stack, lambda v: v is NULL)
        parts = [v.reconstruct(self.codegen) for v in call.args]
        parts += [f"{k}={v.reconstruct(self.codegen)}" for k, v in call.kwargs.items()]
        if inst.opname == "CALL_FUNCTION_EX":
            parts.append(f"*{call.star_args.reconstruct(self.codegen)}")
            if call.star_kwargs is not None:
                parts.append(f"**{call.star_kwargs.reconstruct(self.codegen)}")
        wrap = self.output.scope.constant(self.output.wrap_for_resume, "wrap")
        return [f"___r = {wrap}({call.fn.reconstruct(self.codegen)}, None)({', '.join(parts)})",
                self.resume_call(next_offset(self.code, inst.offset), call.below, ["___r"])]

    def _store(self, inst, stack: list) -> list[str]:
        """A side effect on an object from outside that could not be recorded: do it for real."""
        c = self.codegen
        if inst.opname == "STORE_ATTR":
            obj, value, below = stack[-1], stack[-2], stack[:-2]
            line = f"setattr({obj.reconstruct(c)}, {inst.argval!r}, {value.reconstruct(c)})"
        elif inst.opname == "STORE_SUBSCR":
            key, obj, value, below = stack[-1], stack[-2], stack[-3], stack[:-3]
            line = f"{obj.reconstruct(c)}[{key.reconstruct(c)}] = {value.reconstruct(c)}"
        elif inst.opname == "DELETE_SUBSCR":
            key, obj, below = stack[-1], stack[-2], stack[:-2]
            line = f"del {obj.reconstruct(c)}[{key.reconstruct(c)}]"
        elif inst.opname == "STORE_GLOBAL":
            value, below = stack[-1], stack[:-1]
            line = f"G[{inst.argval!r}] = {value.reconstruct(c)}"
        else:
            raise NotImplementedError(f"no graph-break codegen for {inst.opname} (see symbolic_convert.BREAKABLE)")
        return [line, self.resume_call(next_offset(self.code, inst.offset), below, [])]

    def _jump(self, inst, stack: list) -> list[str]:
        """POP_JUMP_IF_TRUE / POP_JUMP_IF_FALSE on a value only known at run time: branch in Python."""
        cond, below = stack[-1], stack[:-1]
        raw = next(i for i in dis.get_instructions(self.code) if i.offset == inst.offset)
        fall_through = next_offset(self.code, inst.offset)
        when_true, when_false = raw.argval, fall_through
        if inst.opname == "POP_JUMP_IF_FALSE":
            when_true, when_false = when_false, when_true
        return [f"if {cond.reconstruct(self.codegen)}:",
                f"    {self.resume_call(when_true, below, [])}",
                self.resume_call(when_false, below, [])]

    def _reenter_with_blocks(self, stack: list, lines: list[str]) -> list[str]:
        """Inside grad-mode ``with`` blocks (the graph has left them): the instruction runs in them
        again; the resume call (last line) enters them itself."""
        contexts = [v for v in stack if isinstance(v, WithExitFunctionVariable)]
        native, rest = lines[:-1], lines[-1:]
        for ctx in reversed(contexts):
            native = [f"with {ctx.reconstruct(self.codegen)}:  # re-enter {ctx.ctx.describe()}"] + \
                [f"    {line}" for line in native]
        return native + rest
