"""``with torch.autocast(device, dtype=...):`` in traced code (TorchDynamo's ``AutocastModeVariable``).

Entering adds ``torch.amp.autocast_mode._enter_autocast(device, dtype, enabled, cache_enabled)`` to the
graph and exiting ``_exit_autocast(<the enter node>)``, exactly the nodes torch.compile records; the
real autocast state is switched while tracing too, so the fake results inside get autocast's dtypes
(``bfloat16`` for a matmul). Backends see the nodes: the "eager" backend runs them, and ``make_fx``
based AOT tracing records the casts they cause as explicit ops.

Like a grad-mode block, an autocast block can hold a graph break: the graph leaves the block (an
exit node), the transformed code runs the unsupported instruction inside a fresh ``torch.autocast``
with the same arguments, and the resume function enters that one again (see tinydynamo.resume).
Tracing never leaves the real autocast state changed: the modes it entered are exited when the
frame's trace ends, whatever the outcome (``OutputGraph.autocast_modes``).

Layer: above misc_ctx and constant.
"""
from __future__ import annotations

import torch
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

from tinydynamo.exc import unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.misc_ctx import ContextManagerVariable

#: the context manager classes (torch.autocast is torch.amp.autocast; the old per-device names subclass it)
AUTOCAST_CLASSES = (torch.amp.autocast, torch.cpu.amp.autocast, torch.cuda.amp.autocast)
AUTOCAST_NODE_TARGETS = (_enter_autocast, _exit_autocast)


def make_autocast(tx, cls: type, args: list, kwargs: dict) -> "AutocastModeVariable":
    """``torch.autocast(...)`` called in the frame: its arguments must be constants."""
    try:
        cargs = [a.as_python_constant() for a in args]
        ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
    except Exception:
        unimplemented(f"{cls.__qualname__}(...) with arguments only known at run time")
    return AutocastModeVariable.of(cls(*cargs, **ckwargs))


class AutocastModeVariable(ContextManagerVariable):
    """An autocast context manager: its (device, dtype, enabled, cache_enabled), the graph node and
    real mode of its ``__enter__`` while the block is open."""

    def __init__(self, device: str, dtype: torch.dtype, enabled: bool, cache_enabled: bool | None, source=None):
        super().__init__(source)
        self.vals = (device, dtype, enabled, cache_enabled)
        self.enter_node = None
        self.real_mode = None

    @classmethod
    def of(cls, value, source=None) -> "AutocastModeVariable":
        """From a real (not yet entered) ``torch.autocast`` object, whose constructor resolved the defaults."""
        return cls(value.device, value.fast_dtype, value._enabled, value._cache_enabled, source)

    def python_type(self):
        return torch.amp.autocast

    def enter(self, tx) -> VariableTracker:
        self.enter_node = tx.output.graph.call_function(_enter_autocast, self.vals)
        self.real_mode = _enter_autocast(*self.vals)
        tx.output.autocast_modes.append(self.real_mode)
        tx.grad_contexts.append(self)  # the `with` blocks a graph break must leave and re-enter
        return ConstantVariable(None)

    def exit(self, tx) -> VariableTracker:
        if self.enter_node is None:
            unimplemented("torch.autocast.__exit__ without __enter__")
        tx.output.graph.call_function(_exit_autocast, (self.enter_node,))
        self.undo_real(tx.output)
        if self in tx.grad_contexts:
            tx.grad_contexts.remove(self)
        return ConstantVariable(None)

    def leave_for_graph_break(self, tx) -> None:
        """The graph ends inside the block: it must end outside (the transformed code re-enters)."""
        tx.output.graph.call_function(_exit_autocast, (self.enter_node,))
        self.undo_real(tx.output)

    def undo_real(self, output) -> None:
        """Leave the real autocast mode entered while tracing."""
        if self.real_mode is not None:
            _exit_autocast(self.real_mode)
            if any(m is self.real_mode for m in output.autocast_modes):
                output.autocast_modes.remove(self.real_mode)
        self.real_mode = None

    def reconstruct(self, codegen) -> str:
        """A fresh, not yet entered ``torch.autocast`` with the same arguments (for a resume function)."""
        device, dtype, enabled, cache = self.vals
        return f"{codegen.constant(torch.amp.autocast, 'ctx')}({device!r}, dtype={codegen.constant(dtype, 'dt')}, " \
               f"enabled={enabled!r}, cache_enabled={cache!r})"

    def describe(self) -> str:
        device, dtype, enabled, _ = self.vals
        return f"torch.autocast({device!r}, dtype={dtype}, enabled={enabled})"

    def __repr__(self) -> str:
        return f"AutocastModeVariable({self.describe()})"


def exit_all(modes: list) -> None:
    """After a trace: leave the real modes it entered and did not leave (an error, or a break inside)."""
    while modes:
        mode = modes.pop()
        try:
            _exit_autocast(mode)
        except Exception:
            pass
