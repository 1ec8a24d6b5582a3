"""``Fn.apply(*args)`` of a custom ``torch.autograd.Function``, captured as one graph node.

TorchDynamo traces a Function's forward into the graph and keeps the user's backward
(``autograd_function_apply``). Here each Function class (with its non-tensor arguments) becomes a
custom op (``torch.library.custom_op``, namespace ``tinydynamo``) whose implementation runs
``Fn.forward`` with a :class:`RecordingCtx`, and whose autograd formula (``register_autograd``) is
the user's ``Fn.backward``:

* the backward replays ``Fn.forward`` on the saved inputs with a fresh ctx, to get back what the
  forward saved (``ctx.save_for_backward``, tensors or values set as ctx attributes), then calls
  ``Fn.backward(ctx, *grads)``. The replay costs a second forward, and is only sound when the forward
  draws no random numbers: such a Function (and one that calls ``mark_dirty`` or
  ``set_materialize_grads(False)``) is a graph break, as are forwards fake tensors cannot run;
* the "eager" backend runs the node through torch's autograd for custom ops; AOT autograd
  (tininductor) turns the same ``register_autograd`` formula into a VJP rule
  (``tininductor.vjp_rules.custom_op_vjp``), so a straight-through estimator keeps its gradient;
* outputs the forward marks with ``ctx.mark_non_differentiable`` are ``detach``-ed in the graph.

Layer: above tensor and lists.
"""

from __future__ import annotations

import re

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tinydynamo.exc import unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.lists import TupleVariable
from tinydynamo.variables.tensor import TensorVariable

_TENSOR = object()  # a tensor slot in an argument template


class RecordingCtx:
    """The ``ctx`` handed to ``Fn.forward``/``Fn.backward``: it keeps what the forward saves."""

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.non_differentiable: tuple = ()
        self.dirty: tuple = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    @property
    def saved_variables(self):  # the old name
        return self.saved_tensors

    def save_for_forward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    def mark_dirty(self, *tensors):
        self.dirty = tensors

    def set_materialize_grads(self, value: bool):
        self.materialize_grads = value


def run_forward(fn_cls, ctx: RecordingCtx, args: tuple):
    """``Fn.forward`` as ``Fn.apply`` runs it: old style ``forward(ctx, *args)``, or new style
    ``forward(*args)`` followed by ``setup_context(ctx, inputs, output)``."""
    if torch.autograd.function._is_setup_context_defined(fn_cls.setup_context):
        out = fn_cls.forward(*args)
        fn_cls.setup_context(ctx, args, out)
        return out
    return fn_cls.forward(ctx, *args)


class FunctionOp:
    """The custom op standing for one Function class called with one argument template
    (the non-tensor arguments are part of the op: they are constants of the trace)."""

    _count = 0

    def __init__(self, fn_cls, template: tuple, n_outputs: int | None):
        self.fn_cls, self.template, self.n_outputs = fn_cls, template, n_outputs
        n_tensors = sum(a is _TENSOR for a in template)
        params = ", ".join(f"Tensor t{i}" for i in range(n_tensors))
        ret = "Tensor" if n_outputs is None else "(" + ", ".join(["Tensor"] * n_outputs) + ")"
        FunctionOp._count += 1
        name = re.sub(r"\W", "_", fn_cls.__qualname__)
        op = torch.library.custom_op(f"tinydynamo::autograd_fn_{name}_{FunctionOp._count}", self._forward,
                                     mutates_args=(), schema=f"({params}) -> {ret}")
        op.register_fake(self._forward)
        op.register_autograd(self._backward, setup_context=self._setup_context)
        self.op = op._opoverload

    def args(self, tensors) -> tuple:
        it = iter(tensors)
        return tuple(next(it) if a is _TENSOR else a for a in self.template)

    def _needs_input_grad(self, tensor_flags) -> tuple[bool, ...]:
        it = iter(tensor_flags)
        return tuple(bool(next(it)) if a is _TENSOR else False for a in self.template)

    def _forward(self, *tensors):
        with torch.no_grad():
            out = run_forward(self.fn_cls, RecordingCtx(self._needs_input_grad(t.requires_grad for t in tensors)),
                              self.args(tensors))
        outs = (out,) if self.n_outputs is None else tuple(out)
        # a custom op's outputs are new tensors: one that is (a view of) an input is copied
        outs = tuple(o.clone() if any(torch._C._is_alias_of(o, t) for t in tensors)
                     or any(torch._C._is_alias_of(o, p) for p in outs[:i]) else o for i, o in enumerate(outs))
        return outs[0] if self.n_outputs is None else outs

    @staticmethod
    def _setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def _backward(self, ctx, *grads):
        tensors = ctx.saved_tensors
        rctx = RecordingCtx(self._needs_input_grad(ctx.needs_input_grad))
        with torch.no_grad():  # replayed to get back what the forward saved
            run_forward(self.fn_cls, rctx, self.args(tensors))
        result = self.fn_cls.backward(rctx, *grads)
        result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        return tuple(g for g, a in zip(result, self.template) if a is _TENSOR)


_OPS: dict[tuple, FunctionOp] = {}


class _RandomOpRecorder(TorchDispatchMode):
    """Notes whether an op that draws random numbers ran (a replayed forward would differ)."""

    def __init__(self):
        super().__init__()
        self.random_op = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.random_op = func
        return func(*args, **(kwargs or {}))


class AutogradFunctionApplyVariable(VariableTracker):
    """``Fn.apply`` of a ``torch.autograd.Function`` subclass ``Fn``."""

    def __init__(self, fn_cls, source=None):
        super().__init__(source)
        self.fn_cls = fn_cls

    def as_python_constant(self):
        return self.fn_cls.apply

    def call_function(self, tx, args, kwargs):
        name = f"{self.fn_cls.__name__}.apply"
        if kwargs:
            unimplemented(f"{name} with keyword arguments")
        template, tensors = [], []
        for a in args:
            if isinstance(a, TensorVariable):
                template.append(_TENSOR)
                tensors.append(a)
                continue
            try:
                value = a.as_python_constant()
                hash(value)
            except Exception:
                unimplemented(f"{name}: argument {a} is neither a tensor nor a constant")
            template.append(value)
        if not tensors:
            unimplemented(f"{name} without tensor arguments")
        ctx, out = self._fake_forward(tx, name, tuple(template), [t.as_example() for t in tensors])
        if isinstance(out, torch.Tensor):
            n_outputs = None
        elif isinstance(out, tuple) and out and all(isinstance(o, torch.Tensor) for o in out):
            n_outputs = len(out)
        else:
            unimplemented(f"{name}: its forward returns {type(out).__name__}, not a tensor or a tuple of tensors")
        key = (self.fn_cls, tuple((type(a), a) for a in template), n_outputs)
        if key not in _OPS:
            _OPS[key] = FunctionOp(self.fn_cls, tuple(template), n_outputs)
        result = tx.output.create_node("call_function", _OPS[key].op, tensors, {})
        if not ctx.non_differentiable:
            return result
        outs = (out,) if n_outputs is None else out
        results = [result] if n_outputs is None else list(result.unpack_var_sequence(tx))
        results = [r.call_method(tx, "detach", [], {}) if any(o is nd for nd in ctx.non_differentiable) else r
                   for o, r in zip(outs, results)]

        return results[0] if n_outputs is None else TupleVariable(results)

    def _fake_forward(self, tx, name: str, template: tuple, examples: list):
        """Run the forward on fake tensors once: what it returns, and what it did to its ctx."""
        it = iter(examples)
        fake_args = tuple(next(it) if a is _TENSOR else a for a in template)
        ctx = RecordingCtx(tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args))
        recorder = _RandomOpRecorder()
        try:
            with tx.output.fake_mode, recorder, torch.no_grad():
                out = run_forward(self.fn_cls, ctx, fake_args)
        except Exception as e:
            unimplemented(f"{name}: its forward could not run on fake tensors ({type(e).__name__}: {e})")
        if recorder.random_op is not None:
            unimplemented(f"{name}: its forward draws random numbers ({recorder.random_op}); the captured "
                          "backward replays the forward, which would not see the same ones")
        if ctx.dirty:
            unimplemented(f"{name}: its forward modifies an input in place (ctx.mark_dirty)")
        if not ctx.materialize_grads:
            unimplemented(f"{name}: ctx.set_materialize_grads(False) (the captured backward gets zeros, not None)")
        return ctx, out

    def __repr__(self) -> str:
        return f"AutogradFunctionApplyVariable({self.fn_cls.__name__})"
