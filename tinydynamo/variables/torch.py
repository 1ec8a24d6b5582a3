"""TorchVariable: a function from the ``torch`` namespace (``torch.add``, ``F.gelu``, ``torch.Tensor.view``).

Calling it adds one node to the graph: TorchDynamo treats such functions as opaque graph ops
rather than inlining their Python bodies. A few answer questions about global state instead.

Layer: above functions and lists.
"""
from __future__ import annotations

import functools
import types

import torch
import torch._dynamo
import torch.compiler

from tinydynamo.exc import unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import UserFunctionVariable
from tinydynamo.variables.lists import ListVariable, SizeVariable, TupleVariable
from tinydynamo.variables.tensor import TensorVariable

#: torch functions that are about global state or leave the graph, with the reason
UNSUPPORTED_TORCH = {
    torch.manual_seed: "torch.manual_seed changes global RNG state",
    torch.seed: "torch.seed changes global RNG state",
    torch.set_rng_state: "torch.set_rng_state changes global RNG state",
    torch.get_rng_state: "torch.get_rng_state reads global RNG state (the graph's random ops move it)",
    torch.initial_seed: "torch.initial_seed reads global RNG state",
    torch.random.fork_rng: "torch.random.fork_rng saves and restores global RNG state",
}
for _name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "get_rng_state",
              "set_rng_state_all", "get_rng_state_all", "initial_seed"):  # the same for CUDA's generators
    if hasattr(torch.cuda, _name):
        UNSUPPORTED_TORCH[getattr(torch.cuda, _name)] = f"torch.cuda.{_name} reads or changes CUDA RNG state"


def _compiling_queries() -> tuple:
    names = [(torch.compiler, "is_compiling"), (torch.compiler, "is_dynamo_compiling"),
             (torch._dynamo, "is_compiling"), (torch._utils, "is_compiling")]
    return tuple(getattr(mod, name) for mod, name in names if hasattr(mod, name))


#: torch.compiler.is_compiling() & co.: True while tinydynamo traces (as under torch.compile)
COMPILING_QUERIES = _compiling_queries()


def is_torch_callable(value) -> bool:
    """Is ``value`` a function of the torch namespace that should become a graph node?"""
    if isinstance(value, type):
        return False
    if getattr(value, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor):  # torch.Tensor.view
        return True
    module = getattr(value, "__module__", None) or ""
    if module == "torch" or module.startswith(("torch.", "torch._C")):
        # a lambda or nested function has no importable name for the graph: trace into it
        return callable(value) and "<" not in (getattr(value, "__qualname__", "") or "")
    self_obj = getattr(value, "__self__", None)  # builtins bound to torch._C._VariableFunctions
    return callable(value) and type(self_obj).__name__ == "module" and getattr(self_obj, "__name__", "").startswith("torch")


def _takes_callable(args) -> bool:
    """Is any argument a function, method or module (something an FX graph cannot hold as an argument)?"""
    callables = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial, torch.nn.Module)
    for a in args:
        try:
            if issubclass(a.python_type(), callables):
                return True
        except Exception:  # noqa: BLE001 - a variable that cannot say its type: not a callable we know
            continue
    return False


#: torch functions that take a NumPy array: ``from_numpy`` / ``as_tensor`` / ``asarray`` share its memory,
#: ``tensor`` copies it
NUMPY_TO_TENSOR = (torch.from_numpy, torch.as_tensor, torch.asarray, torch.tensor)


def _tensor_from_numpy(tx, fn, args, kwargs) -> VariableTracker:
    """``torch.from_numpy(a)`` of an array held as a tensor node (variables/numpy.py): that node seen
    as a tensor again, copied for ``torch.tensor``, converted where ``dtype=`` / ``device=`` ask."""
    array = args[0]
    if array.scalar and fn is torch.from_numpy:
        unimplemented("torch.from_numpy of a NumPy scalar (eager raises: it takes an ndarray)")
    if len(args) > 1 or set(kwargs) - {"dtype", "device"}:
        unimplemented(f"torch.{fn.__name__} of a NumPy array with arguments {sorted(kwargs)}")
    tensor = array.as_tensor()
    if fn is torch.tensor:
        tensor = tx.output.create_node("call_method", "clone", [tensor], {})
    if kwargs and fn is not torch.from_numpy:
        tensor = tx.output.create_node("call_method", "to", [tensor], kwargs)
    return tensor


#: ``torch._check(cond)`` & co. over a value known only at run time (a symbol from ``.item()``): the
#: ShapeEnv learns the promise at trace time, and the node stays in the graph, which raises as eager
#: does when the promise is broken
RUNTIME_CHECKS = frozenset({torch._check, torch._check_is_size, torch._check_index, torch._check_value,
                            torch._check_type, torch._check_not_implemented,
                            torch._assert_async})


def _runtime_check(tx, fn, args, kwargs) -> VariableTracker:
    """A kept check node; a message that is not a constant (a lambda building it) is left out: a broken
    promise raises eager's exception type, with torch's default message."""
    args = [a for i, a in enumerate(args) if i == 0 or a.is_python_constant()]
    kwargs = {k: v for k, v in kwargs.items() if v.is_python_constant()}
    tx.output.create_node("call_function", fn, args, kwargs, keep=True)
    return ConstantVariable(None)


def _unrolled_foreach(tx, name: str, args: list, kwargs: dict) -> VariableTracker:
    """``torch._foreach_<op>(lists..., scalar)`` where a scalar argument is a tensor (``weight=t``,
    ``_foreach_pow(t, exponents)``): the op takes a Scalar there and would read the tensor's value,
    which a fake tensor cannot give. A foreach op is its op applied list item by list item, so it is
    traced as that: ``<op>(a[i], b[i], scalar)`` per item (in place: the ``<op>_`` method of the first)."""
    op = name[len("_foreach_"):]
    inplace = op.endswith("_")
    lists = [a for a in [*args, *kwargs.values()] if isinstance(a, (ListVariable, TupleVariable))]
    lengths = {len(a.items) for a in lists}
    if len(lengths) != 1 or (inplace and not isinstance(args[0], (ListVariable, TupleVariable))) or \
            (not inplace and not hasattr(torch, op)) or (inplace and not hasattr(torch.Tensor, op)):
        unimplemented(f"torch.{name} with a tensor where it takes a Scalar")

    def item(v, i):
        return v.items[i] if isinstance(v, (ListVariable, TupleVariable)) else v

    results = []
    for i in range(lengths.pop()):
        a = [item(v, i) for v in args]
        kw = {k: item(v, i) for k, v in kwargs.items()}
        if inplace:
            tx.output.create_node("call_method", op, a, kw, keep=True)
        else:
            results.append(tx.output.create_node("call_function", getattr(torch, op), a, kw))
    return args[0] if inplace else ListVariable(results)  # in place: the first list itself, as eager returns


class TorchVariable(VariableTracker):
    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return type(self.fn)

    def as_python_constant(self):
        return self.fn

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        if isinstance(fn, torch._library.custom_ops.CustomOpDef):  # @torch.library.custom_op: its op, as torch does
            fn = fn._opoverload
        if fn in UNSUPPORTED_TORCH:
            unimplemented(UNSUPPORTED_TORCH[fn])
        if fn in COMPILING_QUERIES:  # code that asks "am I being compiled?" takes its compile path
            return ConstantVariable(True)
        if fn is torch.is_grad_enabled:  # the frame's GRAD_MODE guard fixes the mode at entry; traced
            return ConstantVariable(torch.is_grad_enabled())  # `with no_grad()` blocks set it from there
        if fn in (torch.is_tensor,) and len(args) == 1:
            return ConstantVariable(issubclass(args[0].python_type(), torch.Tensor))
        if fn in (torch.get_default_dtype, torch.is_floating_point, torch.is_complex, torch.numel) or \
                getattr(fn, "__name__", "") in ("is_autocast_enabled",):
            try:
                return ConstantVariable(fn(*[a.as_example() for a in args],
                                           **{k: v.as_example() for k, v in kwargs.items()}))
            except Exception as e:
                unimplemented(f"{fn.__name__}: {e}")
        if getattr(fn, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor) and args:
            return args[0].call_method(tx, fn.__name__, list(args[1:]), kwargs)  # torch.Tensor.view(x, ...)
        if getattr(fn, "__name__", "").startswith("_foreach_") and any(
                isinstance(a, TensorVariable) for a in [*args, *kwargs.values()]):
            return _unrolled_foreach(tx, fn.__name__, list(args), dict(kwargs))
        if fn is torch.jit.annotate and len(args) == 2 and not kwargs:  # a TorchScript type hint: the value itself
            return args[1]
        if fn is torch.Size:
            return SizeVariable(args[0].unpack_var_sequence(tx) if args else [])
        grad_kwarg = kwargs.get("requires_grad")
        if grad_kwarg is not None and grad_kwarg.is_python_constant() and grad_kwarg.as_python_constant() is True:
            # a new autograd leaf: made natively, so that gradients reach the tensor the frame returns
            # (inside a graph an AOT backend would make it an intermediate of its own autograd.Function)
            unimplemented(f"{getattr(fn, '__name__', fn)}(..., requires_grad=True): a new autograd leaf in the frame")
        if fn in RUNTIME_CHECKS and not all(a.is_python_constant() for a in args[:1]):
            return _runtime_check(tx, fn, args, kwargs)
        if fn in NUMPY_TO_TENSOR and args and getattr(args[0], "is_numpy_array", False):
            return _tensor_from_numpy(tx, fn, args, kwargs)
        if isinstance(fn, types.FunctionType) and _takes_callable(list(args) + list(kwargs.values())):
            # a torch helper written in Python that calls back into a function or module it is given
            # (torch.testing's wrapper_set_seed(op, ...)): a graph node cannot hold the callable, so trace
            # the helper's body, as TorchDynamo inlines torch's Python functions

            return UserFunctionVariable(fn, self.source).call_function(tx, args, kwargs)
        return tx.output.create_node("call_function", fn, list(args), kwargs)

    def __repr__(self) -> str:
        return f"TorchVariable({getattr(self.fn, '__qualname__', self.fn)})"
