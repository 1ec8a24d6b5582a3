"""NumPy in traced code: arrays as tensor nodes, NumPy calls on them as graph ops (``torch._numpy``).

``torch._numpy`` is NumPy's API written with torch ops: ``tnp.mean(tnp.ndarray(t), 1)`` computes
what ``np.mean`` would, on a tensor. So a NumPy array met while tracing (``x.numpy()``, an ndarray
argument, the result of a NumPy call) is held as a tensor node of the graph, seen as an array
(:class:`NumpyNdarrayVariable`), and a NumPy function, method, attribute or operator applied to it
becomes one graph node, a :class:`NumpyOp`, that runs the ``torch._numpy`` counterpart on tensors
viewed as arrays. Its fake run gives the result's shape and dtype, as for any op; backends see torch
ops when they trace the node (``make_fx``). An array the frame returns is turned back into a
``numpy.ndarray`` after the graph (:func:`to_numpy`), a NumPy scalar where NumPy gives one.

Where NumPy's semantics cannot be kept, the call is a graph break and NumPy itself runs it:
calls without any array argument (``np.random.randn(2)`` draws from NumPy's generator, which the
graph does not have), data-dependent questions (``bool(a)``, ``a.tolist()``), an array met by a torch
function (eager raises or converts: whatever it does, it does it natively), tensors that NumPy
refuses (``requires_grad``, not on the CPU).

Layer: above tensor, torch and lists; builtin (operators), the builder (inputs, NumPy functions) and the
translator (unary operators) call into it.
"""
from __future__ import annotations

import functools
import operator
import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from tinydynamo.exc import unimplemented
from tinydynamo.source import NumpyTensorSource, Source
from tinydynamo.variables.base import VariableTracker, register_construction
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.dicts import DictVariable
from tinydynamo.variables.lists import BaseListVariable, ListVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.tensor import TensorVariable

try:
    import numpy as np
    import torch._numpy as tnp
except ImportError:  # NumPy is optional: without it, no value is ever an array
    np = tnp = None


# ---- the graph ops (what runs on tensors at run time) ------------------------------------------------
def _as_arrays(value: Any) -> Any:
    return tree_map_only(torch.Tensor, tnp.ndarray, value)


def _as_tensors(value: Any) -> Any:
    return tree_map_only(tnp.ndarray, lambda a: a.tensor, value)


class NumpyOp:
    """A graph op that applies NumPy's ``kind`` of thing ``target`` to tensors seen as arrays: a
    ``torch._numpy`` function (``"function"``), an ndarray method or attribute by name (``"method"``,
    ``"attribute"``) or an operator function (``"operator"``). Tensors in, tensors out."""

    takes_numpy_arrays = True  # the graph builder lets arrays (as tensors) in to this op only

    def __init__(self, kind: str, target: Any):
        self.kind, self.target = kind, target
        name = target if isinstance(target, str) else target.__name__
        self.__name__ = self.__qualname__ = f"numpy_{name.strip('_')}"
        self.__module__ = __name__

    def __call__(self, *args, **kwargs):
        args, kwargs = _as_arrays(args), _as_arrays(kwargs)
        if self.kind == "method":
            result = getattr(args[0], self.target)(*args[1:], **kwargs)
        elif self.kind == "attribute":
            result = getattr(args[0], self.target)
        else:  # "function", "operator"
            result = self.target(*args, **kwargs)
        return _as_tensors(result)

    def __eq__(self, other):
        return isinstance(other, NumpyOp) and (self.kind, self.target) == (other.kind, other.target)

    def __hash__(self):
        return hash((self.kind, self.target))

    def __reduce__(self):
        return numpy_op, (self.kind, self.target)

    def __repr__(self) -> str:
        return f"NumpyOp({self.kind}, {self.__name__})"


@functools.cache
def numpy_op(kind: str, target: Any) -> NumpyOp:
    """One op object per (kind, target), so that equal calls have equal node targets."""
    return NumpyOp(kind, target)


def to_numpy(t: torch.Tensor, scalar: bool = False):
    """A graph output that the frame returns as a NumPy array (sharing memory, as ``Tensor.numpy()``
    does), or as a NumPy scalar where NumPy's own call gives one."""
    array = t.detach().numpy()
    return array[()] if scalar else array


def numpy_as_tensor(value: Any) -> torch.Tensor | None:
    """An ndarray argument as the tensor sharing its memory (the graph's input); None for anything else
    (the guards then fail, and the next trace looks at the new value)."""
    if type(value) is not np.ndarray:
        return None
    with warnings.catch_warnings():  # a read-only array: the graph writes to it only where eager NumPy would
        warnings.simplefilter("ignore", UserWarning)
        return torch.as_tensor(value)


# ---- NumPy's callables and their torch._numpy counterparts ---------------------------------------------
@functools.cache
def _counterparts() -> dict[int, tuple[Any, Any]]:
    """id(NumPy callable) -> (it, its torch._numpy counterpart), for NumPy's main namespace, ``linalg``
    and ``fft``. ``numpy.random`` is left out on purpose: its calls draw from NumPy's generator."""
    table = {}
    for np_module, tnp_module in ((np, tnp), (np.linalg, tnp.linalg), (np.fft, tnp.fft)):
        for name in dir(tnp_module):
            ours, theirs = getattr(tnp_module, name), getattr(np_module, name, None)
            if name.startswith("_") or theirs is None or isinstance(theirs, type) or not callable(ours) \
                    or not callable(theirs):
                continue
            table[id(theirs)] = (theirs, ours)
    return table


def torch_numpy_counterpart(value: Any) -> Any:
    """``torch._numpy``'s version of NumPy function ``value`` (None if it is not one, or has none)."""
    if np is None:
        return None
    entry = _counterparts().get(id(value))
    return entry[1] if entry is not None and entry[0] is value else None


def is_numpy_array_type(value: Any) -> bool:
    """Is ``value`` an ndarray the graph can hold as a tensor (a dtype torch has, no object arrays)?"""
    if np is None or type(value) is not np.ndarray:
        return False
    try:
        numpy_as_tensor(value)
    except (TypeError, ValueError, RuntimeError):  # object/str dtypes, negative strides...
        return False
    return True


# ---- trackers -----------------------------------------------------------------------------------------
class NumpyNdarrayVariable(VariableTracker):
    """A NumPy array (or NumPy scalar: ``scalar``) in traced code: a tensor node of the graph, seen as an
    array. Attributes that are metadata (``shape``, ``dtype``, ``strides``...) are answered at trace time;
    methods, array attributes (``T``, ``real``) and operators are :class:`NumpyOp` nodes."""

    is_numpy_array = True  # asked by layers below this one (a torch op meeting an array)

    def __init__(self, node, example: torch.Tensor, source: Source | None = None, scalar: bool = False):
        super().__init__(source)
        self.node = node
        self.example = example
        self.scalar = scalar and example.dim() == 0

    def python_type(self) -> type:
        if self.scalar:
            return np.dtype(self._array().dtype.name).type
        return np.ndarray

    def as_node_arg(self):
        return self.node

    def as_example(self):
        return self.example

    def is_python_constant(self) -> bool:
        return False

    def truth(self, tx) -> bool:
        unimplemented(f"data-dependent branch: `if` on a NumPy array ({self.node.name})")

    def _array(self):
        return tnp.ndarray(self.example)

    def as_tensor(self) -> TensorVariable:
        """The same node seen as a tensor (``torch.from_numpy(a)`` shares the memory)."""
        return TensorVariable(self.node, self.example)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "__class__":
            return ConstantVariable(self.python_type())
        if name in ("shape", "ndim", "size", "itemsize", "nbytes", "strides"):
            value = getattr(self._array(), name)
            return VariableTracker.build_constant(tuple(int(v) for v in value) if isinstance(value, tuple)
                                                  else int(value))  # sizes are specialised (guarded)
        if name == "dtype":
            return ConstantVariable(np.dtype(self._array().dtype.name))
        if name in ("T", "real", "imag"):
            return _call(tx, numpy_op("attribute", name), [self], {}, probe=None)
        if callable(getattr(tnp.ndarray, name, None)) and callable(getattr(np.ndarray, name, None)):
            return GetAttrVariable(self, name)
        unimplemented(f"ndarray attribute {name!r} in a compiled frame")

    def call_method(self, tx, name: str, args, kwargs) -> VariableTracker:
        if name in DATA_DEPENDENT:
            unimplemented(f"ndarray.{name}() reads values out of the array")
        if name == "__len__":
            if self.example.dim() == 0:
                unimplemented("len() of a 0-d array")
            return ConstantVariable(int(self.example.shape[0]))
        if not (callable(getattr(tnp.ndarray, name, None)) and callable(getattr(np.ndarray, name, None))):
            unimplemented(f"ndarray.{name}() in a compiled frame (torch._numpy has no such method)")
        return _call(tx, numpy_op("method", name), [self, *args], kwargs,
                     probe=lambda a, *rest, **kw: getattr(a, name)(*rest, **kw), keep=name == "__setitem__")

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        if self.example.dim() == 0:
            unimplemented("iterating over a 0-d array")
        return [self.call_method(tx, "__getitem__", [ConstantVariable(i)], {}) for i in range(int(self.example.shape[0]))]

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # an input array: the same object (the graph wrote to its memory)
            return codegen.source_expr(self.source)
        fn = codegen.output.scope.constant(to_numpy, "fn")
        return f"{fn}({codegen.graph_output(self)}{', True' if self.scalar else ''})"

    def __repr__(self) -> str:
        kind = "scalar" if self.scalar else "ndarray"
        return f"NumpyNdarrayVariable({self.node.name}, {kind} {tuple(self.example.shape)}, {self.example.dtype})"


#: ndarray methods that need the array's values at trace time
DATA_DEPENDENT = frozenset({"item", "tolist", "tobytes", "__bool__", "__int__", "__float__", "__index__",
                            "__complex__", "__array__", "__iter__", "__repr__", "__str__", "__format__",
                            "nonzero", "tofile", "dump", "dumps"})


class NumpyFunctionVariable(VariableTracker):
    """A NumPy function with a ``torch._numpy`` counterpart. Called on arrays (or tensors, which NumPy
    converts), it is a graph op; called on constants only, it is what it was before (``fallback``: a
    folded constant or a graph break that lets NumPy run it)."""

    def __init__(self, fn, counterpart, fallback: VariableTracker, source: Source | None = None):
        super().__init__(source)
        self.fn, self.counterpart, self.fallback = fn, counterpart, fallback

    def python_type(self):
        return type(self.fn)

    def as_python_constant(self):
        return self.fn

    def var_getattr(self, tx, name: str) -> VariableTracker:
        return self.fallback.var_getattr(tx, name)

    def call_function(self, tx, args, kwargs) -> VariableTracker:
        if not any(isinstance(v, (NumpyNdarrayVariable, TensorVariable)) for v in _leaves([*args, *kwargs.values()])):
            return self.fallback.call_function(tx, args, kwargs)
        return _call(tx, numpy_op("function", self.counterpart), list(args), dict(kwargs), probe=self.fn)

    def __repr__(self) -> str:
        return f"NumpyFunctionVariable({getattr(self.fn, '__name__', self.fn)})"


# ---- building the nodes --------------------------------------------------------------------------------
def _leaves(values) -> list[VariableTracker]:
    """Every tracker inside ``values``, lists, tuples and dicts opened."""
    out = []
    for v in values:
        if isinstance(v, BaseListVariable):
            out += _leaves(v.items)
        elif isinstance(v, DictVariable):
            out += _leaves(list(v.items.values()))
        else:
            out.append(v)
    return out


def _argument(tx, v: VariableTracker) -> VariableTracker:
    """An argument as the graph op takes it: a tensor NumPy would convert (checked as NumPy checks it),
    a NumPy dtype as torch's (``torch._numpy`` takes both; an FX graph prints only the latter), a NumPy
    scalar constant as a 0-d tensor constant (it keeps its type in NumPy's promotion)."""
    if isinstance(v, TensorVariable):
        ex = v.example
        if ex.requires_grad:
            unimplemented("a tensor that requires grad passed to NumPy (eager raises: use tensor.detach())")
        if ex.device.type != "cpu" or ex.layout != torch.strided:
            unimplemented(f"a {ex.device.type} / {ex.layout} tensor passed to NumPy (eager raises)")
        return v
    if isinstance(v, BaseListVariable) and type(v) in (ListVariable, TupleVariable):
        return type(v)([_argument(tx, i) for i in v.items])
    if isinstance(v, ConstantVariable):
        value = v.value
        if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
            try:
                return ConstantVariable(tnp.dtype(np.dtype(value).name).torch_dtype)
            except (TypeError, KeyError, AttributeError):
                unimplemented(f"NumPy dtype {value} (torch has no such dtype)")
        if isinstance(value, np.generic):
            t = tx.output.lift_tensor(torch.as_tensor(value), None)
            return NumpyNdarrayVariable(t.node, t.example, scalar=True)
        if isinstance(value, np.ndarray):
            unimplemented("a NumPy array constant in a NumPy call")
    return v


def _probe_value(v: VariableTracker) -> Any:
    """A real NumPy stand-in for an argument, to ask NumPy what type its call returns: arrays are
    read-only zeros of the same shape and dtype that take no memory (``broadcast_to``)."""
    if isinstance(v, (NumpyNdarrayVariable, TensorVariable)):
        dtype = np.dtype(tnp.ndarray(v.example).dtype.name)
        shape = tuple(int(s) for s in v.example.shape)
        if isinstance(v, NumpyNdarrayVariable) and v.scalar:
            return dtype.type(0)
        return np.broadcast_to(np.zeros((), dtype), shape)
    if isinstance(v, BaseListVariable):
        return v.python_type()(_probe_value(i) for i in v.items)
    if isinstance(v, ConstantVariable):
        return v.value
    raise TypeError(f"no stand-in for {v}")


def _scalar_results(probe, args, kwargs) -> list[bool]:
    """For each array NumPy's own call returns (in pytree order), whether it is a NumPy scalar
    (``np.sum(a)`` is an ``np.float32``, ``np.asarray(s)`` a 0-d array): asked of NumPy itself on
    stand-ins of the arguments. [] where NumPy cannot say (it raised): 0-d results are arrays then."""
    try:
        real_args = [_probe_value(a) for a in args]
        real_kwargs = {k: _probe_value(v) for k, v in kwargs.items()}
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            result = probe(*real_args, **real_kwargs)
    except Exception:  # noqa: BLE001 - a stand-in NumPy refuses (read-only, singular...): no answer
        return []
    leaves, _ = tree_flatten(result)
    return [isinstance(x, np.generic) for x in leaves if isinstance(x, (np.ndarray, np.generic))]


def _call(tx, op: NumpyOp, args: list, kwargs: dict, probe, keep: bool = False) -> VariableTracker:
    """``op(*args, **kwargs)`` as a graph node; its tensor results seen as arrays."""
    args = [_argument(tx, a) for a in args]
    kwargs = {k: _argument(tx, v) for k, v in kwargs.items()}
    result = tx.output.create_node("call_function", op, args, kwargs, keep=keep)
    if keep:
        return ConstantVariable(None)
    tensors = [v for v in _leaves([result]) if isinstance(v, TensorVariable)]
    scalars = _scalar_results(probe, args, kwargs) if probe is not None and any(
        t.example.dim() == 0 for t in tensors) else []
    flags = iter(scalars if len(scalars) == len(tensors) else [False] * len(tensors))
    return _as_arrays_of(result, flags)


def _as_arrays_of(v: VariableTracker, flags) -> VariableTracker:
    if isinstance(v, TensorVariable):
        return NumpyNdarrayVariable(v.node, v.example, scalar=next(flags))
    if type(v) in (ListVariable, TupleVariable):
        return type(v)([_as_arrays_of(i, flags) for i in v.items])
    return v


def numpy_binop(tx, fn, a: VariableTracker, b: VariableTracker) -> VariableTracker | None:
    """``a + b``, ``a[i]``, ``a < b`` with a NumPy array: a graph op (None: no array involved). An array
    with a tensor is left to eager (the result depends on which side's operator runs)."""
    if not (isinstance(a, NumpyNdarrayVariable) or isinstance(b, NumpyNdarrayVariable)):
        return None
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        unimplemented(f"{getattr(fn, '__name__', fn)} of a NumPy array and a tensor")
    if fn is operator.getitem:
        return a.call_method(tx, "__getitem__", [b], {})
    return _call(tx, numpy_op("operator", fn), [a, b], {}, probe=fn)


def numpy_unary(tx, fn, a: "NumpyNdarrayVariable") -> VariableTracker:
    """``-a``, ``~a``, ``abs(a)``."""
    return _call(tx, numpy_op("operator", fn), [a], {}, probe=fn)


def tensor_numpy(tx, t: TensorVariable, args, kwargs) -> NumpyNdarrayVariable:
    """``t.numpy()``: the array sharing the tensor's memory (a ``detach`` node); ``force=True`` also
    copies to the CPU. Tensors that ``numpy()`` refuses (eager raises) break the graph."""
    if np is None:
        unimplemented("Tensor.numpy() without NumPy installed")
    force = False
    if args or kwargs:
        given = (args or [kwargs.get("force")])[0]
        if len(args) + len(kwargs) != 1 or given is None or not given.is_python_constant():
            unimplemented("Tensor.numpy() with arguments other than a constant force=")
        force = bool(given.as_python_constant())
    ex = t.example
    if ex.layout != torch.strided or not force and (ex.requires_grad or ex.device.type != "cpu"):
        unimplemented("Tensor.numpy() of a tensor that requires grad or is not a CPU tensor (eager raises)")
    try:
        torch.empty(0, dtype=ex.dtype).numpy()
    except TypeError:
        unimplemented(f"Tensor.numpy() of a {ex.dtype} tensor (NumPy has no such dtype)")
    out = tx.output.create_node("call_method", "detach", [t], {})
    if force:
        out = tx.output.create_node("call_method", "cpu", [out], {})
        out = tx.output.create_node("call_method", "resolve_conj", [out], {})
    return NumpyNdarrayVariable(out.node, out.example)


def wrap_numpy_input(tx, value, source: Source | None) -> NumpyNdarrayVariable:
    """An ndarray from outside the frame: the graph's input is ``torch.as_tensor(a)`` (the same memory),
    guarded by type, then as a tensor (shape, strides, dtype)."""
    tensor = numpy_as_tensor(value)
    if source is None:
        var = tx.output.lift_tensor(tensor.clone(), None)  # a constant of the graph
        return NumpyNdarrayVariable(var.node, var.example)
    tx.output.add_guard("TYPE_MATCH", source, np.ndarray)
    var = tx.output.lift_tensor(tensor, NumpyTensorSource(source, tx.output.scope.constant(numpy_as_tensor, "fn")))
    return NumpyNdarrayVariable(var.node, var.example, source)


register_construction(tensor_numpy=tensor_numpy)
