"""TensorVariable: a tensor during tracing = an FX node + a fake example value (shape, dtype, device).

Ops on it add nodes to the graph. Metadata questions (``.shape``, ``.dtype``, ``.size()``,
``.ndim``) are answered from the example value at trace time, which is sound because
TENSOR_MATCH guards pin the inputs' metadata, and metadata of every later tensor follows.
Questions about *data* (``.item()``, ``if x.sum() > 0``) cannot be answered: Unsupported.

Layer: above lists and sym_node.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from tinydynamo import config
from tinydynamo.exc import unimplemented
from tinydynamo.source import AttrSource
from tinydynamo.utils import mutated_any, tensor_versions
from tinydynamo.variables.base import VariableTracker, constructor
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.lists import ListIteratorVariable, SizeVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.sym_node import SymNodeVariable, size_items, wrap_size

#: methods that need the tensor's data; the graph must stop there (a graph break, later)
DATA_DEPENDENT_METHODS = {
    "item": "Tensor.item() reads a value out of the tensor",
    "tolist": "Tensor.tolist() reads values out of the tensor",
    "__bool__": "bool(tensor) depends on the tensor's value",
    "data_ptr": "Tensor.data_ptr() is a run-time address",
    "backward": "Tensor.backward() inside a compiled frame",
    "__index__": "using a tensor as an index integer reads its value",
}
#: attributes computed from metadata only (answered at trace time)
METADATA_ATTRS = ("dtype", "device", "ndim", "is_cuda", "is_cpu", "requires_grad", "layout", "is_sparse", "is_nested", "is_mps",
                  "is_quantized", "is_meta")
#: methods computed from metadata only
METADATA_METHODS = ("dim", "ndimension", "numel", "nelement", "element_size", "is_contiguous",
                    "is_floating_point", "is_complex", "get_device", "stride", "storage_offset")
#: attributes that are new tensors (views)
TENSOR_ATTRS = ("T", "mT", "H", "mH", "real", "imag")


#: ops whose every element lies in a range known without the data: a uniform draw is in [0, 1]
#: (closed: rounded to bf16 or fp16 a draw just below 1 becomes 1)
ELEMENT_RANGES = {torch.rand: (0.0, 1.0), torch.rand_like: (0.0, 1.0)}
#: comparisons by the ways a traced call names them (an operator, a torch function, a method)
_COMPARISONS = {}
for _name, _fn in (("lt", operator.lt), ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge)):
    for _target in (_fn, getattr(torch, _name), _name, f"__{_name}__"):
        _COMPARISONS[_target] = _fn
del _name, _fn, _target


def element_range(op: str, target, args, kwargs) -> tuple | None:
    """The closed range ``(low, high)`` all elements of ``target(*args)``'s result lie in, where it is
    known at trace time whatever the data: a random draw's, or a comparison's (True or False for
    every element) between such a tensor and a number it is decided by. Like the value ranges
    torch keeps for symbolic sizes, for a few tensors: ``if torch.rand([]) < p`` with ``p = 0``
    (HF's LayerDrop, off) is then no data-dependent branch, and the graph does not break."""
    if op == "call_function" and target in ELEMENT_RANGES:
        return ELEMENT_RANGES[target]
    compare = _COMPARISONS.get(target) if op in ("call_function", "call_method") else None
    if compare is None or len(args) != 2 or kwargs:
        return None
    ranges = [_range_of(a) for a in args]
    if None in ranges:
        return None
    (a_lo, a_hi), (b_lo, b_hi) = ranges
    if compare(a_hi, b_lo) and compare(a_lo, b_hi) and compare(a_lo, b_lo) and compare(a_hi, b_hi):
        return (True, True)  # every pair of values compares True
    if not (compare(a_hi, b_lo) or compare(a_lo, b_hi) or compare(a_lo, b_lo) or compare(a_hi, b_hi)):
        return (False, False)  # no pair of values compares True (NaN among them: never decided)
    return None


def _range_of(value) -> tuple | None:
    if isinstance(value, TensorVariable):
        return value.known_range()
    if isinstance(value, ConstantVariable) and type(value.value) in (int, float) and value.value == value.value:
        return (value.value, value.value)
    return None


class TensorVariable(VariableTracker):
    def __init__(self, node: torch.fx.Node, example: torch.Tensor, source=None):
        super().__init__(source)
        self.node = node
        self.example = example  # a FakeTensor on the real device
        self.py_type: type = torch.Tensor  # nn.Parameter for lifted parameters (isinstance checks)
        self.element_range: tuple | None = None  # see ``element_range``; set by the graph with the
        self.range_versions: list = []  # example's version then (``tensor_versions``: an in-place op voids it)

    def known_range(self) -> tuple | None:
        """``element_range``, unless the tensor (or a view of it) was written in place since."""
        if self.element_range is None or mutated_any(self.range_versions):
            return None
        return self.element_range

    def python_type(self) -> type:
        return self.py_type

    def as_node_arg(self):
        return self.node

    def as_example(self):
        return self.example

    def key_identity(self):
        # a tensor hashes by identity; the fake example value follows it (an in-place op returns
        # the same fake, a view a new one), and one input tensor reached twice is one placeholder
        cls = self.python_type()
        if cls.__hash__ is not torch.Tensor.__hash__ or cls.__eq__ is not torch.Tensor.__eq__:
            return None  # a subclass with its own hashing
        return self.example

    def as_python_constant(self):
        unimplemented(f"tensor {self.node.name} is not a constant")

    def is_python_constant(self) -> bool:
        return False

    def truth(self, tx) -> bool:
        known = self.known_range()
        if known is not None and known[0] == known[1] and isinstance(known[0], bool) \
                and isinstance(self.example.numel(), int) and self.example.numel() == 1:
            return known[0]  # decided whatever the data (``element_range``): no branch, no guard
        unimplemented(
            f"data-dependent branch: `if` on tensor {self.node.name}",
            hint="use torch.where(cond, a, b) to keep both sides in the graph",
        )

    def var_getattr(self, tx, name: str) -> VariableTracker:
        stored = tx.output.side_effects.load_attr(self, self.example, name)  # ``y.foo = v`` earlier in the frame
        if stored is not None:
            return stored
        if name == "shape":
            return SizeVariable(size_items(tx, self))
        if name in METADATA_ATTRS:
            value = getattr(self.example, name)
            return ConstantVariable(value() if callable(value) else value)
        if name in TENSOR_ATTRS:
            return tx.output.create_node("call_function", getattr, [self, ConstantVariable(name)], {})
        if name == "grad":
            return _grad_of(tx, self)
        if name == "__class__":
            return ConstantVariable(self.python_type())
        if name in ("grad", "data", "_version", "grad_fn"):
            unimplemented(f"Tensor.{name} inside a compiled frame")
        if callable(getattr(torch.Tensor, name, None)):
            return GetAttrVariable(self, name)
        real = _real_tensor(tx, self)
        if real is not None and name in getattr(real, "__dict__", {}):  # an attribute a user set on an input
            tx.output.add_guard("HASATTR", self.source, (name, True))
            return VariableTracker.build(tx, real.__dict__[name], AttrSource(self.source, name))
        unimplemented(f"Tensor attribute {name!r}")

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        """``t.foo = v`` (an attribute of the user's) or ``t.grad = g``: a side effect, replayed on the
        real tensor after the graph (an input, or the graph's output); later reads in the frame see
        ``v``. Tensor properties the graph's ops depend on (``requires_grad``, ``data``) are Unsupported."""
        if hasattr(torch.Tensor, name) and name != "grad":
            unimplemented(f"setting Tensor.{name} inside a compiled frame")
        tx.output.side_effects.store_attr(self, self.example, name, value)

    def call_method(self, tx, name: str, args, kwargs) -> VariableTracker:
        if name == "item" and not args and not kwargs and _capture_scalars():
            if _is_integral(self.example.dtype):
                return unbacked_item(tx, self)
            return ScalarNodeVariable.item_of(tx, self)
        if name == "numpy":  # an array over the same memory: NumPy calls on it are traced (variables/numpy.py)
            return constructor("tensor_numpy")(tx, self, args, kwargs)
        if name in DATA_DEPENDENT_METHODS:
            unimplemented(DATA_DEPENDENT_METHODS[name])
        if name == "size" or name in METADATA_METHODS:
            try:
                cargs = [a.as_python_constant() for a in args]
                ckw = {k: v.as_python_constant() for k, v in kwargs.items()}
            except Exception:
                unimplemented(f"Tensor.{name} with non-constant arguments")
            result = getattr(self.example, name)(*cargs, **ckw)
            if name in ("size", "stride", "numel", "nelement", "storage_offset"):  # symbolic with dynamic shapes
                if isinstance(result, tuple):  # x.size(), x.stride(): one item per dim
                    items = [wrap_size(tx, self, r, name, i) for i, r in enumerate(result)]
                    return SizeVariable(items) if name == "size" else TupleVariable(items)
                return wrap_size(tx, self, result, name, *cargs, **ckw)
            if isinstance(result, torch.Size):
                return SizeVariable.of(result)
            return ConstantVariable(tuple(result) if isinstance(result, tuple) else result)
        if name == "type" and not args and not kwargs:
            return ConstantVariable(self.example.type())
        if name in ("addcmul_", "addcdiv_", "addcmul", "addcdiv") and isinstance(kwargs.get("value"), TensorVariable) \
                and kwargs["value"].example.dim() == 0 and len(args) == 2:
            # ``value=`` is a Scalar: a 0-d tensor there is read (item()) at run time, which a fake tensor
            # cannot; ``self + value * (t1 op t2)`` keeps it a tensor in the graph
            t1, t2 = args
            part = tx.output.create_node("call_function", torch.mul if "mul" in name else torch.div, [t1, t2], {})
            part = tx.output.create_node("call_function", torch.mul, [part, kwargs["value"]], {})
            return tx.output.create_node("call_method", "add_" if name.endswith("_") else "add", [self, part], {})
        if name == "__iter__" and not args and not kwargs:  # ``x.__iter__()``: the rows, as ``iter(x)`` gives
            return ListIteratorVariable(self.unpack_var_sequence(tx))
        if name == "new" and args and (isinstance(args[0], SizeVariable) and len(args) == 1 or all(
                a.is_python_constant() and type(a.as_python_constant()) is int for a in args)):
            # ``x.new(torch.Size)`` / ``x.new(5, 8)`` give a tensor of that shape, but the graph holds a
            # Size as a plain tuple, which ``new`` reads as data: ``new_empty`` says the same unambiguously
            return tx.output.create_node("call_method", "new_empty", [self, TupleVariable(list(
                args[0].items if isinstance(args[0], SizeVariable) else args))], kwargs)
        return tx.output.create_node("call_method", name, [self, *args], kwargs)

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        if self.example.dim() == 0:
            unimplemented("iterating over a 0-d tensor")
        return [
            tx.output.create_node("call_function", operator.getitem, [self, ConstantVariable(i)], {})
            for i in range(_static(self.example.shape[0]))  # a symbolic length is specialised (guarded)
        ]

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # an input: fetch it again rather than returning it from the graph
            return codegen.source_expr(self.source)
        return codegen.graph_output(self)

    def __repr__(self) -> str:
        return f"TensorVariable({self.node.name}, {tuple(self.example.shape)}, {self.example.dtype})"


def _static(n) -> int:
    """A size as a Python int (a SymInt is specialised to its value, with a guard)."""
    return int(n.node.guard_int("", 0)) if isinstance(n, torch.SymInt) else int(n)


def _real_tensor(tx, var: "TensorVariable") -> torch.Tensor | None:
    """The real tensor of an input (None for a tensor the graph computes)."""
    if var.source is None:
        return None
    names = [s.name() for s in tx.output.input_sources]
    if var.source.name() not in names:
        return None
    return tx.output.example_inputs[names.index(var.source.name())]


def _grad_of(tx, var: "TensorVariable") -> VariableTracker:
    """``x.grad``: for an input, its real ``.grad`` (a guarded input itself, or None with a guard);
    a tensor computed in the graph is not a leaf that backward() filled: None."""
    if var.source is None:
        return ConstantVariable(None)
    names = [s.name() for s in tx.output.input_sources]
    if var.source.name() not in names:
        unimplemented(f"Tensor.grad of {var.source.name()}, whose real tensor is not known")
    real = tx.output.example_inputs[names.index(var.source.name())]
    return VariableTracker.build(tx, real.grad, AttrSource(var.source, "grad"))


def _is_integral(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def unbacked_item(tx, t: TensorVariable) -> VariableTracker:
    """``t.item()`` of an integer tensor kept in the graph as an *unbacked* symbol ``u0`` of the frame's
    ShapeEnv: a SymInt whose value exists only at run time, so it may be a size (``torch.arange(n)``,
    ``x[:n]``, ``x.repeat(n)``) and meet other sizes. ``torch._check(n >= 0)`` tells the ShapeEnv what
    the code promises about it (and stays in the graph, checked at run time); a branch on it cannot be
    decided at trace time: Unsupported."""
    if t.example.numel() != 1:
        unimplemented("Tensor.item() of a tensor with more than one element")
    node = tx.output.graph.call_method("item", (t.node,))
    sym = tx.output.fake_mode.shape_env.create_unbacked_symint()
    node.meta["example_value"] = sym
    return SymNodeVariable(node, sym)


def _capture_scalars() -> bool:
    return config.capture_scalar_outputs


class ScalarNodeVariable(VariableTracker):
    """``t.item()`` kept in the graph (``config.capture_scalar_outputs``): a node whose value is a Python
    number known only at run time. Without symbolic scalars (tinydynamo specialises shapes) it may only
    meet a tensor in an operator (``x * n``, ``x > n``): the result's shape and dtype do not depend on
    the number. Anything else (a branch, a shape, a torch function argument, ``n + 1``) is Unsupported."""

    def __init__(self, node, py_type: type):
        super().__init__(None)
        self.node = node
        self.py_type = py_type

    @classmethod
    def item_of(cls, tx, t: "TensorVariable") -> "ScalarNodeVariable":
        if t.example.numel() != 1:
            unimplemented("Tensor.item() of a tensor with more than one element")
        node = tx.output.graph.call_method("item", (t.node,))
        dtype = t.example.dtype
        py_type = bool if dtype == torch.bool else float if (dtype.is_floating_point or dtype.is_complex) else int
        node.meta["example_value"] = py_type(1)
        return cls(node, py_type)

    def python_type(self):
        return self.py_type

    def as_node_arg(self):
        return self.node

    def as_example(self):
        unimplemented("a captured .item() value used outside tensor arithmetic (its value is only known at run time)",
                      hint="set tinydynamo.config.capture_scalar_outputs = False to break the graph there instead")

    def binop_with_tensor(self, tx, fn, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        sample = self.py_type(1)  # stands for the run-time value: the result's metadata does not depend on it
        ex = [sample if v is self else v.example for v in (a, b)]
        versions = tensor_versions(ex)
        try:
            with tx.output.fake_mode:
                example = fn(*ex)
        except Exception as e:
            unimplemented(f"{fn.__name__} of a tensor and a captured .item() value: {type(e).__name__}: {e}")
        node = tx.output.graph.call_function(fn, (a.as_node_arg(), b.as_node_arg()))
        if mutated_any(versions):  # ``t += n``: kept even where only another name reads ``t``
            node.meta["mutates_args"] = True
        return VariableTracker.build_fx(tx.output, node, example)

    def binop_with_scalar(self, tx, fn, a: VariableTracker, b: VariableTracker) -> "ScalarNodeVariable":
        """``n + 1``, ``n * m``, ``2 ** n``: arithmetic on captured numbers stays a number node (its Python
        type from the same operation on sample values); it may still only end in tensor arithmetic."""
        return self._apply(tx, fn, [a, b])

    def unary(self, tx, fn) -> "ScalarNodeVariable":
        """``-n``, ``abs(n)``, ``int(n)``, ``float(n)``."""
        return self._apply(tx, fn, [self])

    def _apply(self, tx, fn, operands: list) -> "ScalarNodeVariable":
        samples = [v.py_type(1) if isinstance(v, ScalarNodeVariable) else v.as_python_constant() for v in operands]
        try:
            py_type = type(fn(*samples))
        except Exception as e:
            unimplemented(f"{getattr(fn, '__name__', fn)} of a captured .item() value: {type(e).__name__}: {e}")
        if py_type not in (int, float, bool):
            unimplemented(f"{getattr(fn, '__name__', fn)} of a captured .item() value gives a {py_type.__name__}")
        node = tx.output.graph.call_function(fn, tuple(v.as_node_arg() if isinstance(v, ScalarNodeVariable)
                                                       else v.as_python_constant() for v in operands))
        node.meta["example_value"] = py_type(1)
        return ScalarNodeVariable(node, py_type)

    def reconstruct(self, codegen) -> str:
        return codegen.graph_output(self)

    def __repr__(self) -> str:
        return f"ScalarNodeVariable({self.node.name}, {self.py_type.__name__})"
