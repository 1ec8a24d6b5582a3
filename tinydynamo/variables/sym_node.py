"""SymNodeVariable: a size that is a symbol (``torch.SymInt``) flowing through Python code.

With dynamic shapes (tinydynamo.symbolic_shapes), ``x.shape[1]`` of a dynamic input is not a
number at trace time but ``s1``. TorchDynamo keeps such values symbolic, as we do here: a
SymNodeVariable is an FX node (the ``s1`` placeholder, or ``operator.floordiv(s1, 4)``, or
``x.size(2)``) plus its example value, a SymInt of the frame's ShapeEnv. Arithmetic on it adds
nodes (the fake run gives the result's symbol); passing it to ``view``/``reshape``/``torch.zeros``
passes the node. Where Python needs a real value, the trace asks the ShapeEnv, which records
the answer as a guard: a branch (``if n > 4``) guards the relation ``5 <= s1``; ``range(n)``,
``int`` contexts and indexing lists specialise the symbol to its value (guard ``s1 == 7``,
logged under ``TINY_LOGS=dynamic``).

Layer: above constant; arithmetic with a symbolic size is a builtin call (base.constructor).
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from tinydynamo import logs
from tinydynamo.exc import unimplemented
from tinydynamo.variables.base import VariableTracker, constructor
from tinydynamo.variables.constant import ConstantVariable

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
log = logs.get_logger("dynamic")


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool that still has a free symbol (not one folded to a number)."""
    return isinstance(value, SYM_TYPES) and bool(value.node.expr.free_symbols)


class SymNodeVariable(VariableTracker):
    def __init__(self, node, sym, source=None):
        super().__init__(source)
        self.node = node
        self.sym = sym  # a SymInt/SymFloat/SymBool of the frame's ShapeEnv

    @classmethod
    def create(cls, output, node, sym, source=None) -> VariableTracker:
        """A node's symbolic result; a plain number (``s0 * 0``) is a constant instead."""
        node.meta["example_value"] = sym
        if not is_symbolic(sym):
            if not node.users and node.op != "placeholder":
                output.graph.erase_node(node)
            value = sym if not isinstance(sym, SYM_TYPES) else _concrete(sym)
            return ConstantVariable(value)
        return cls(node, sym, source)

    def python_type(self) -> type:
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(self.sym)]

    def as_node_arg(self):
        return self.node

    def as_example(self):
        return self.sym

    def is_python_constant(self) -> bool:
        return False  # asking must not specialise (as_python_constant does)

    def as_python_constant(self) -> Any:
        """Python needs the value itself (``range(n)``, a list index, ``math.sqrt(n)``): specialise
        the symbol to it, with a guard (``L['x'].size()[1] == 7``)."""
        expr = self.sym.node.expr
        value = _decided(_concrete, self.sym, "Python needs its value")
        if log.isEnabledFor(20) and expr.free_symbols:
            log.info("specializing %s (%s) = %s: Python needs its value", expr, self.node.name, value)
        return value

    def truth(self, tx) -> bool:
        """``if n > 4``: the ShapeEnv evaluates the SymBool at its example value and records the
        relation it relied on (not the exact size) as a guard."""
        return _decided(bool, self.sym, "a branch on it")

    def call_method(self, tx, name: str, args, kwargs):
        binary = getattr(operator, name.strip("_"), None) if name.startswith("__") else None
        if binary is not None and len(args) == 1 and not kwargs:
            return constructor("BuiltinVariable").binop(tx, binary, self, args[0])
        return ConstantVariable(self.as_python_constant()).call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # a size placeholder: read it from the input again
            return codegen.source_expr(self.source)
        return codegen.graph_output(self)

    def __repr__(self) -> str:
        return f"SymNodeVariable({self.node.name}, {self.sym})"


def _decided(ask, sym, why: str) -> Any:
    """``ask(sym)`` (``bool``, :func:`_concrete`), or Unsupported where the answer is only known at run
    time (an unbacked symbol from ``.item()``: the ShapeEnv cannot decide, and a guess could be wrong)."""
    try:
        return ask(sym)
    except GuardOnDataDependentSymNode as e:
        unimplemented(f"data-dependent value ({why}): {str(e).splitlines()[0]}",
                      hint="keep the value in tensor ops, or promise what holds with torch._check(...)")


def _concrete(sym) -> Any:
    """The value of a SymInt/SymFloat/SymBool, guarded (torch's guard_int / guard_float / guard_bool)."""
    if isinstance(sym, torch.SymBool):
        return bool(sym)
    if isinstance(sym, torch.SymFloat):
        return float(sym.node.guard_float("", 0))
    return int(sym.node.guard_int("", 0))


class SliceVariable(VariableTracker):
    """``x[:, :n]`` with a symbolic bound: a slice whose parts stay graph values."""

    def __init__(self, parts: list[VariableTracker]):
        super().__init__(None)
        self.parts = parts

    def python_type(self) -> type:
        return slice

    def is_python_constant(self) -> bool:
        return False

    def as_python_constant(self):
        return slice(*[p.as_python_constant() for p in self.parts])

    def as_node_arg(self):
        return slice(*[p.as_node_arg() for p in self.parts])

    def as_example(self):
        return slice(*[p.as_example() for p in self.parts])

    def reconstruct(self, codegen) -> str:
        return f"slice({', '.join(p.reconstruct(codegen) for p in self.parts)})"


# ---- sizes of tensors ----------------------------------------------------------------------------
def wrap_size(tx, tensor, value, method: str, *margs, **mkwargs) -> VariableTracker:
    """One size-like number of ``tensor`` (``x.size(1)``, ``x.numel()``, ``x.stride(0)``): a constant
    when static; else the placeholder of its symbol if it is one, or a ``tensor.<method>(*margs)`` node."""
    if not is_symbolic(value):
        return ConstantVariable(int(value) if isinstance(value, torch.SymInt) else value)
    expr = value.node.expr
    lifted = tx.output.symbol_nodes.get(expr)
    if lifted is not None:
        node, source = lifted
        return SymNodeVariable(node, value, source)
    node = tx.output.graph.call_method(method, (tensor.node, *margs), mkwargs)
    return SymNodeVariable.create(tx.output, node, value)


def size_items(tx, tensor) -> list[VariableTracker]:
    """``x.shape`` item by item."""
    return [wrap_size(tx, tensor, s, "size", i) for i, s in enumerate(tensor.example.shape)]
