"""Context managers: the base class of those the interpreter enters and exits itself, and those that
change nothing the graph can see: ``torch.profiler.record_function``, ``contextlib.nullcontext``.
``with`` blocks over the latter are traced straight through (TorchDynamo also ignores
``record_function`` in the graph, with a warning).

Layer: above constant.
"""
from __future__ import annotations

import contextlib

from tinydynamo.exc import ObservedException, unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable


class ContextManagerVariable(VariableTracker):
    """A context manager the interpreter knows how to enter and exit (TorchDynamo's
    ``ContextWrappingVariable``): ``with`` calls :meth:`enter` and :meth:`exit`, and so do explicit
    ``cm.__enter__()`` / ``cm.__exit__(...)`` calls."""

    def enter(self, tx) -> VariableTracker:
        raise NotImplementedError

    def exit(self, tx) -> VariableTracker:
        raise NotImplementedError

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            return self.enter(tx)
        if name == "__exit__":
            return self.exit(tx)
        return super().call_method(tx, name, args, kwargs)


class NullContextVariable(ContextManagerVariable):
    def __init__(self, what: str, enter_result: VariableTracker | None = None):
        super().__init__(None)
        self.what = what
        self.enter_result = enter_result or ConstantVariable(None)

    def enter(self, tx) -> VariableTracker:
        return self.enter_result

    def exit(self, tx) -> VariableTracker:
        return ConstantVariable(None)


    def __repr__(self) -> str:
        return f"NullContextVariable({self.what})"


def record_function(tx, args, kwargs):
    return NullContextVariable("record_function")


def nullcontext(tx, args, kwargs):
    return NullContextVariable("nullcontext", args[0] if args else kwargs.get("enter_result"))


class UserContextManagerVariable(VariableTracker):
    """``with obj:`` on a user object whose class defines ``__enter__``/``__exit__`` in Python: both are
    inlined (a graph break inside the block is not resumable: the frame runs eagerly)."""

    def __init__(self, obj: VariableTracker):
        super().__init__(None)
        self.obj = obj

    def enter(self, tx) -> VariableTracker:
        return self.obj.call_method(tx, "__enter__", [], {})

    def exit(self, tx) -> VariableTracker:
        none = ConstantVariable(None)
        return self.obj.call_method(tx, "__exit__", [none, none, none], {})

    def exit_with_exception(self, tx, exc: VariableTracker) -> VariableTracker:
        """``__exit__(type, exc, None)`` for an exception raised in the block: a true result suppresses it."""
        return self.obj.call_method(tx, "__exit__", [ConstantVariable(exc.python_type()), exc,
                                                     ConstantVariable(None)], {})


class ContextManagerDecoratorVariable(VariableTracker):
    """``contextlib.contextmanager`` itself, applied in the frame (a ``@contextmanager`` on a local def)."""

    def as_python_constant(self):
        return contextlib.contextmanager

    def call_function(self, tx, args, kwargs):
        if len(args) != 1 or kwargs or not hasattr(args[0], "get_code"):
            unimplemented(f"contextlib.contextmanager applied to {args} {kwargs or ''}")
        return ContextManagerFunctionVariable(args[0])


class ContextManagerFunctionVariable(VariableTracker):
    """A ``@contextlib.contextmanager`` function: calling it makes a GeneratorContextManagerVariable."""

    def __init__(self, gen_fn: VariableTracker):
        super().__init__(None)
        self.gen_fn = gen_fn

    def call_function(self, tx, args, kwargs):
        return GeneratorContextManagerVariable(self.gen_fn, list(args), dict(kwargs))


class GeneratorContextManagerVariable(VariableTracker):
    """``with cm(...) as v:`` for a generator-based context manager: entering runs the generator's
    code (inlined, in the same graph) up to its ``yield`` (whose value is ``v``); exiting runs the
    rest, as ``contextlib`` does when the block ends without an exception."""

    def __init__(self, gen_fn: VariableTracker, args: list, kwargs: dict):
        super().__init__(None)
        self.gen_fn, self.args, self.kwargs = gen_fn, args, kwargs
        self.gen_tx = None
        self.yield_inst = None  # the `yield` the generator is suspended at (where an exception is thrown in)

    def enter(self, tx) -> VariableTracker:
        self.gen_tx = tx.inlining_translator(self.gen_fn, self.gen_fn.bind(tx, self.args, self.kwargs))
        self.gen_tx.generator_items = []
        self._run(stop_at_yield=True)
        if not self.gen_tx.generator_items:
            unimplemented("a @contextmanager generator that did not yield (RuntimeError)")
        self.yield_inst = self.gen_tx.current_inst
        return self.gen_tx.generator_items[0]

    def exit(self, tx) -> VariableTracker:
        self._run(stop_at_yield=False)
        if len(self.gen_tx.generator_items) > 1:
            unimplemented("a @contextmanager generator that yields twice (RuntimeError)")
        return ConstantVariable(None)

    def exit_with_exception(self, tx, exc: VariableTracker) -> VariableTracker:
        """The block raised ``exc``: thrown into the generator at its ``yield``, as ``contextlib`` does. If
        the generator catches it and finishes, the exception is suppressed (True); if it lets it through
        or re-raises it, it propagates (False); another exception it raises replaces it."""
        g, thrown = self.gen_tx, exc.exc
        g.pop()  # the value the `yield` would have received
        if not g.handle_observed_exception(self.yield_inst, thrown):
            return ConstantVariable(False)
        n = len(g.generator_items)
        try:
            self._run(stop_at_yield=False)
        except ObservedException as e:
            if e is thrown:
                return ConstantVariable(False)
            raise
        if len(g.generator_items) > n:
            unimplemented("a @contextmanager generator that yields again after an exception (RuntimeError)")
        return ConstantVariable(True)

    def _run(self, stop_at_yield: bool) -> None:
        g = self.gen_tx
        n = len(g.generator_items)
        while g.return_value is None:
            g.step()
            if stop_at_yield and len(g.generator_items) > n:
                return
            if not stop_at_yield and len(g.generator_items) > n:
                return  # a second yield: reported by exit()

    def __repr__(self) -> str:
        return f"GeneratorContextManagerVariable({self.gen_fn})"
