"""Grad-mode context managers in traced code: ``with torch.no_grad():`` and friends.

Like TorchDynamo's ``GradModeVariable``: entering or leaving a grad-mode context does not stop
tracing; it adds a ``torch._C._set_grad_enabled(False/True)`` node to the graph and flips the
real grad mode for the rest of the trace, so the fake example values of the ops inside get
the right ``requires_grad``. Backends see the nodes (the "eager" backend simply runs them;
AOT autograd turns the no-grad regions into stopped gradients).

    torch.no_grad()            enter: grad off;   exit: the mode from before ``__enter__``
    torch.enable_grad()        enter: grad on;    exit: the mode from before ``__enter__``
    torch.set_grad_enabled(b)  sets the mode when *called* (also outside ``with``); exit restores

``BEFORE_WITH`` (in symbolic_convert) calls :meth:`GradModeVariable.enter` and pushes a
:class:`WithExitFunctionVariable`, which the ``__exit__(None, None, None)`` call at the end of
the block calls. At a graph break inside such a block, the stack holds that exit function;
the transformed code re-enters the context around the unsupported instruction and passes a
fresh context manager to the resume function, whose prologue enters it (see tinydynamo.resume).
Other context managers are not captured (the frame runs eagerly, with the reason).
A function decorated with ``@torch.no_grad()`` / ``@torch.enable_grad()`` is inlined between an
enter and an exit (:class:`GradModeDecoratedFunctionVariable`).

Layer: above functions, misc_ctx and constant.
"""
from __future__ import annotations

import types

import torch

from tinydynamo.exc import ObservedException, unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import UserFunctionVariable
from tinydynamo.variables.misc_ctx import ContextManagerVariable

#: the grad-mode context manager classes; torch.inference_mode is recognised only to say that it
#: is not captured (inference tensors behave differently from no_grad ones)
GRAD_MODE_CLASSES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled, torch.inference_mode)


def set_grad_enabled(tx, mode: bool) -> None:
    """Switch grad mode while tracing: one graph node, and the real mode for the rest of the trace."""
    if torch.is_grad_enabled() == mode:
        return
    tx.output.graph.call_function(torch._C._set_grad_enabled, (mode,))
    torch._C._set_grad_enabled(mode)


def prune_grad_mode_nodes(graph, initial_mode: bool) -> None:
    """Drop switches that change nothing: a switch straight back with no op between
    (``with torch.no_grad(): pass``), or a switch to the mode already on."""
    mode, pending = initial_mode, None  # pending: (the last switch, the mode before it) if no op since
    for node in list(graph.nodes):
        if is_grad_mode_node(node):
            if node.args[0] == mode:
                graph.erase_node(node)
            elif pending is not None and node.args[0] == pending[1]:
                graph.erase_node(node)
                graph.erase_node(pending[0])
                mode, pending = node.args[0], None
            else:
                pending, mode = (node, mode), node.args[0]
        elif node.op in ("call_function", "call_method", "call_module"):
            pending = None


def is_grad_mode_node(node) -> bool:
    return node.op == "call_function" and node.target is torch._C._set_grad_enabled


class GradModeClassVariable(VariableTracker):
    """``torch.no_grad`` / ``torch.enable_grad`` / ``torch.set_grad_enabled`` itself (the class)."""

    def __init__(self, cls, source=None):
        super().__init__(source)
        self.cls = cls

    def python_type(self):
        return type

    def as_python_constant(self):
        return self.cls

    def call_function(self, tx, args, kwargs):
        if self.cls is torch.inference_mode:
            unimplemented("torch.inference_mode() inside a compiled frame is not captured yet (use torch.no_grad(), "
                          "or call the compiled function under inference_mode)")
        if self.cls is torch.set_grad_enabled:
            if len(args) + len(kwargs) != 1 or not (args or kwargs)[0 if args else "mode"].is_python_constant():
                unimplemented("torch.set_grad_enabled(mode) needs one constant bool argument (a tensor or a "
                              "value only known at run time cannot be traced)")
            mode = bool((args[0] if args else kwargs["mode"]).as_python_constant())
            before = torch.is_grad_enabled()
            set_grad_enabled(tx, mode)  # like eager: the call itself switches the mode
            return GradModeVariable(mode, initial_mode=before, entered=True)
        if args or kwargs:
            unimplemented(f"{self.cls.__name__}() with arguments")
        return GradModeVariable(self.cls is torch.enable_grad)

    def __repr__(self) -> str:
        return f"GradModeClassVariable({self.cls.__name__})"


class GradModeVariable(ContextManagerVariable):
    """A grad-mode context manager object: the mode it sets, and the mode its exit restores."""

    def __init__(self, target_mode: bool, initial_mode: bool | None = None, entered: bool = False, source=None):
        super().__init__(source)
        self.target_mode = target_mode
        self.initial_mode = initial_mode  # known once entered (set_grad_enabled: once called)
        self.entered = entered  # set_grad_enabled(b) switches on the call, its __enter__ does nothing

    def python_type(self):
        return torch.enable_grad if self.target_mode else torch.no_grad

    def enter(self, tx) -> VariableTracker:
        if not self.entered:
            self.initial_mode = torch.is_grad_enabled()
            set_grad_enabled(tx, self.target_mode)
        self.entered = True
        tx.grad_contexts.append(self)
        return ConstantVariable(None)  # what no_grad().__enter__() returns

    def exit(self, tx) -> VariableTracker:
        set_grad_enabled(tx, self.initial_mode)
        if self in tx.grad_contexts:
            tx.grad_contexts.remove(self)
        return ConstantVariable(None)  # exceptions are not swallowed

    def call_function(self, tx, args, kwargs):
        """``torch.no_grad()(fn)``: a decorator applied in the frame (``@torch.no_grad()`` on a local def)."""
        if len(args) == 1 and not kwargs and not self.entered:
            return GradModeWrappedVariable(self.target_mode, args[0])
        return super().call_function(tx, args, kwargs)

    def reconstruct(self, codegen) -> str:
        """A fresh, not yet entered context manager with the same effect (for a resume function)."""
        return f"{codegen.constant(torch.enable_grad if self.target_mode else torch.no_grad, 'ctx')}()"

    def describe(self) -> str:
        return "torch.enable_grad()" if self.target_mode else "torch.no_grad()"

    def __repr__(self) -> str:
        return f"GradModeVariable({'enable_grad' if self.target_mode else 'no_grad'})"


class GradModeWrappedVariable(VariableTracker):
    """A function decorated in the frame with ``torch.no_grad()`` / ``enable_grad()``: calling it
    enters the mode, inlines the function, and leaves the mode."""

    def __init__(self, mode: bool, fn: VariableTracker):
        super().__init__(None)
        self.mode = mode
        self.fn = fn

    def call_function(self, tx, args, kwargs):
        ctx = GradModeVariable(self.mode)
        ctx.enter(tx)
        try:
            result = self.fn.call_function(tx, args, kwargs)
        except ObservedException:  # raised through the decorated function: the mode is restored on the way
            ctx.exit(tx)
            raise
        ctx.exit(tx)
        return result


class WithExitFunctionVariable(VariableTracker):
    """The ``__exit__`` that BEFORE_WITH leaves on the stack; the end of the block calls it."""

    def __init__(self, ctx: GradModeVariable):
        super().__init__(None)
        self.ctx = ctx

    def call_function(self, tx, args, kwargs):
        """``__exit__(None, None, None)`` at the end of the block; ``__exit__(type, exc, tb)`` from
        WITH_EXCEPT_START when the block raised: a context manager that can suppress the exception
        (a user class, a ``@contextmanager`` generator) answers with its own ``exit_with_exception``;
        the others leave as usual and let it propagate (False)."""
        exc = args[1] if len(args) == 3 else None
        if exc is None or (exc.is_python_constant() and exc.as_python_constant() is None):
            return self.ctx.exit(tx)
        if hasattr(self.ctx, "exit_with_exception"):
            return self.ctx.exit_with_exception(tx, exc)
        self.ctx.exit(tx)
        return ConstantVariable(False)

    def reconstruct(self, codegen) -> str:
        return self.ctx.reconstruct(codegen)

    def __repr__(self) -> str:
        return f"WithExitFunctionVariable({self.ctx})"


def unwrap_grad_mode_decorator(fn) -> tuple[bool, types.FunctionType] | None:
    """``(mode, the user's function)`` for a function decorated with ``@torch.no_grad()`` or
    ``@torch.enable_grad()`` (torch wraps it in ``torch.utils._contextlib``'s ``decorate_context``), else None."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_name != "decorate_context" or not code.co_filename.endswith("_contextlib.py") \
            or not fn.__closure__:
        return None
    try:
        cells = {name: cell.cell_contents for name, cell in zip(code.co_freevars, fn.__closure__)}
    except ValueError:  # an empty cell
        return None
    owner, inner = getattr(cells.get("ctx_factory"), "__self__", None), cells.get("func")
    if type(owner) not in (torch.no_grad, torch.enable_grad) or not isinstance(inner, types.FunctionType):
        return None
    return type(owner) is torch.enable_grad, inner


class GradModeDecoratedFunctionVariable(VariableTracker):
    """``@torch.no_grad()``-decorated function: called = enter, inline the function, exit."""

    def __init__(self, mode: bool, fn: types.FunctionType, source=None, self_obj=None):
        super().__init__(source)
        self.mode = mode
        self.fn = fn
        self.self_obj = self_obj  # the object of a decorated method (passed as its first argument)

    def python_type(self):
        return types.FunctionType

    def call_function(self, tx, args, kwargs):
        ctx = GradModeVariable(self.mode)
        ctx.enter(tx)
        if self.self_obj is not None:
            args = [self.self_obj, *args]
        try:
            result = tx.inline_user_function(UserFunctionVariable(self.fn), args, kwargs)
        except ObservedException:  # raised through the decorated function: the mode is restored on the way
            ctx.exit(tx)
            raise
        ctx.exit(tx)
        return result

    def __repr__(self) -> str:
        return f"GradModeDecoratedFunctionVariable({'enable_grad' if self.mode else 'no_grad'}, {self.fn.__qualname__})"
