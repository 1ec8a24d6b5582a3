"""Builtins (``len``, ``isinstance``, ``range``, ``zip``...), ``operator`` and ``math`` functions.

On constants they are folded (run at trace time). On tensors, arithmetic and comparisons
become graph nodes (``operator.add`` etc.); everything else is Unsupported with a reason.

Layer: above every kind of value a builtin takes (tensors, sequences, dicts, modules, user
objects); trackers below it reach ``BuiltinVariable`` through base.constructor (a list's ``in``),
and iter registers the builtins that make its trackers (:data:`HANDLERS_FROM_ABOVE`).
"""
from __future__ import annotations

import inspect
import math
import operator
from typing import Any, Callable

import torch

from tinydynamo import polyfills
from tinydynamo.exc import ObservedException, Unsupported, raise_folded, raise_observed, unimplemented
from tinydynamo.variables.base import DELETED, VariableTracker, constructor, register_construction
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.dicts import DictVariable, pairs_of
from tinydynamo.variables.exceptions import ExceptionVariable
from tinydynamo.variables.functions import BaseUserFunctionVariable, UserFunctionVariable
from tinydynamo.variables.lists import BaseListVariable, ListIteratorVariable, ListVariable, SizeVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.nn_module import NNModuleVariable
from tinydynamo.variables.numpy import NumpyNdarrayVariable, numpy_binop, numpy_unary
from tinydynamo.variables.sym_node import SymNodeVariable, wrap_size
from tinydynamo.variables.tensor import ScalarNodeVariable, TensorVariable, TensorVariable as _T
from tinydynamo.variables.torch import TorchVariable
from tinydynamo.variables.user_defined import UserDefinedObjectVariable, _python_dunder

#: pure builtins: on constant arguments, just run them
FOLDABLE = {
    abs, all, any, bool, callable, chr, divmod, float, format, hash, int, isinstance, issubclass,
    len, max, min, ord, pow, range, repr, reversed, round, sorted, str, sum, tuple, list, dict,
    set, frozenset, slice, type, enumerate, zip, getattr, hasattr,
}
#: operator functions that become graph nodes when a tensor is involved
TENSOR_OPERATORS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.matmul, operator.and_, operator.or_, operator.xor, operator.lshift,
    operator.rshift, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior,
    operator.ixor, operator.neg, operator.pos, operator.invert, operator.lt, operator.le,
    operator.eq, operator.ne, operator.gt, operator.ge, operator.getitem,
}
#: arithmetic that keeps a captured ``.item()`` number a number (in-place forms: numbers have none)
SCALAR_ARITHMETIC = {
    **{f: f for f in (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
                      operator.mod, operator.pow)},
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
    operator.ipow: operator.pow,
    # comparisons: a bool node, whose ``if`` is a data-dependent branch (a graph break resuming on each side)
    **{f: f for f in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne)},
}
#: side effects or values the graph cannot hold
UNSUPPORTED_BUILTINS = {
    print: "print() has a side effect outside the graph",
    input: "input() reads from the user",
    open: "open() touches the file system",
    id: "id() of a traced value is not known at trace time",
    globals: "globals()",
}
#: builtins that read the calling frame's locals when called without a namespace: run at a graph
#: break in a resumed frame they would see the generated code's locals, so the frame runs natively
FRAME_READING_BUILTINS = {exec: 1, eval: 1, dir: 0, vars: 0}  # fn -> arguments before the namespace


def is_foldable(fn: Any) -> bool:
    return (fn in FOLDABLE or fn in TENSOR_OPERATORS or getattr(fn, "__module__", None) in ("math", "_operator", "operator")
            or getattr(fn, "__self__", None) is math)


#: ``a op= b`` where ``a`` is not a tensor (nor mutable) is ``a = a op b``
INPLACE_TO_OUT_OF_PLACE = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
    operator.ipow: operator.pow, operator.imatmul: operator.matmul, operator.iand: operator.and_,
    operator.ior: operator.or_, operator.ixor: operator.xor, operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}


class BuiltinVariable(VariableTracker):
    def __init__(self, fn: Callable, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return type(self.fn)

    def as_python_constant(self):
        return self.fn

    def __repr__(self) -> str:
        return f"BuiltinVariable({getattr(self.fn, '__name__', self.fn)})"

    def var_getattr(self, tx, name: str) -> VariableTracker:
        """``dict.fromkeys``, ``int.from_bytes``: an attribute of a builtin class, looked up as on any class."""
        if not isinstance(self.fn, type):
            return super().var_getattr(tx, name)
        try:
            value = getattr(self.fn, name)
        except AttributeError:
            raise_observed(AttributeError, f"type object {self.fn.__name__!r} has no attribute {name!r}")
        return constructor("class_attribute")(tx, ConstantVariable(self.fn), name, value)

    # ---- helpers reused by the translator ------------------------------------------------------
    @staticmethod
    def binop(tx, fn: Callable, a: VariableTracker, b: VariableTracker) -> VariableTracker:
        """``fn(a, b)`` for an operator function (BINARY_OP, COMPARE_OP, ``operator.*``)."""
        user = _user_binop(tx, fn, a, b)  # a user class's __add__ / __radd__ / __eq__ ...
        if user is not None:
            return user
        array = numpy_binop(tx, fn, a, b)  # NumPy's operator on arrays (a torch._numpy graph op)
        if array is not None:
            return array

        for s, other in ((a, b), (b, a)):  # a captured .item() value with a tensor (config.capture_scalar_outputs)
            if isinstance(s, ScalarNodeVariable) and isinstance(other, _T) and fn in TENSOR_OPERATORS:
                return s.binop_with_tensor(tx, fn, a, b)
            if isinstance(s, ScalarNodeVariable) and fn in SCALAR_ARITHMETIC and (isinstance(other, ScalarNodeVariable) or (
                    other.is_python_constant() and type(other.as_python_constant()) in (int, float, bool))):
                return s.binop_with_scalar(tx, SCALAR_ARITHMETIC[fn], a, b)  # n + 1: still a number node
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            if not isinstance(a, TensorVariable) and fn in INPLACE_TO_OUT_OF_PLACE:
                fn = INPLACE_TO_OUT_OF_PLACE[fn]  # ``total = 0; total += t``: a number has no in-place add
            if isinstance(a, BaseListVariable) or isinstance(b, BaseListVariable):
                if not (a.is_python_constant() or b.is_python_constant()):
                    unimplemented(f"{fn.__name__} of a tensor and a sequence of tensors")
            return tx.output.create_node("call_function", fn, [a, b], {})
        sym = _sym_binop(tx, fn, a, b)  # a symbolic size in arithmetic or a comparison
        if sym is not None:
            return sym
        if fn is operator.iadd and isinstance(a, ListVariable) and isinstance(b, BaseListVariable):
            a.call_method(tx, "extend", [b], {})  # ``xs += ys`` changes xs in place (a side effect if xs is from outside)
            return a
        if a.is_python_constant() and b.is_python_constant():
            try:
                return VariableTracker.build_constant(fn(a.as_python_constant(), b.as_python_constant()))
            except Exception as e:
                raise_folded(e, f"{fn.__name__}({a.as_python_constant()!r}, {b.as_python_constant()!r})")
        if fn in (operator.add, operator.iadd) and (isinstance(a, BaseListVariable) or isinstance(b, BaseListVariable)):
            a, b = _as_sequence(a), _as_sequence(b)  # ``(-1,) + x.shape[1:]`` with symbolic sizes
        if isinstance(a, BaseListVariable) and isinstance(b, BaseListVariable) and fn in (operator.add, operator.iadd):
            if fn is operator.iadd and isinstance(a, ListVariable):
                a.call_method(tx, "extend", [b], {})
                return a

            if isinstance(a, SizeVariable):  # torch.Size + tuple is a torch.Size (tuple + Size a tuple)
                return SizeVariable(a.items + b.items)
            return (ListVariable if a.container is list else TupleVariable)(a.items + b.items)
        if isinstance(b, BaseListVariable) and fn is operator.mul and a.is_python_constant():
            a, b = b, a  # ``4 * [x]`` is ``[x] * 4``
        if isinstance(a, BaseListVariable) and fn in (operator.mul,) and b.is_python_constant():
            return type(a)(a.items * b.as_python_constant()) if type(a) in (ListVariable, TupleVariable) \
                else TupleVariable(a.items * b.as_python_constant())
        if fn is operator.getitem:
            return a.call_method(tx, "__getitem__", [b], {})
        if fn in (operator.eq, operator.ne) and isinstance(a, BaseListVariable) and isinstance(b, BaseListVariable):
            # ``x.shape == y.shape`` with symbolic sizes: item by item (each relation guarded)
            same = len(a.items) == len(b.items) and all(
                BuiltinVariable.binop(tx, operator.eq, i, j).truth(tx) for i, j in zip(a.items, b.items))
            return ConstantVariable(same if fn is operator.eq else not same)
        if fn in (operator.eq, operator.ne) and _identity_known(a) and _identity_known(b):
            same = _identity(a) is _identity(b)
            return ConstantVariable(same if fn is operator.eq else not same)
        if fn in _SET_DUNDERS and all(_type_of(v) in (set, frozenset) for v in (a, b)):
            return a.call_method(tx, _SET_DUNDERS[fn], [b], {})  # ``s | t``, ``s -= t``, ``s <= t``...
        unimplemented(f"{getattr(fn, '__name__', fn)} of {a} and {b}")

    @staticmethod
    def is_(tx, a: VariableTracker, b: VariableTracker) -> bool:
        """``a is b`` when it is known at trace time."""
        a, b = (ConstantVariable(getattr(v.obj.value, v.name)) if isinstance(v, GetAttrVariable) and
                isinstance(v.obj, ConstantVariable) and isinstance(v.obj.value, type) else v for v in (a, b))
        if _is_container(a) or _is_container(b):
            return _container_is(tx, a, b)  # (their python constants are new objects: never ``is``)
        if a.is_python_constant() and b.is_python_constant():  # (``func is torch.Tensor.add``: a class's method)
            return a.as_python_constant() is b.as_python_constant()
        if a is b:
            return True

        if any(isinstance(v, UserDefinedObjectVariable) and v.made_in_frame for v in (a, b)):
            return False  # an object made in the frame has one tracker: another tracker is another object

        if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
            if a.node is b.node or a.example is b.example:  # (an in-place op hands back the same fake tensor)
                return True
            if a.source is not None and b.source is not None:  # two distinct inputs: guard it stays so
                tx.output.add_guard("ALIAS_MATCH", a.source, (b.source, False))
                return False
            unimplemented("`is` between tensors computed in the graph (views and in-place results alias)")
        for x, y in ((a, b), (b, a)):  # a real object is never None / a constant
            if isinstance(x, ConstantVariable) and not y.is_python_constant():
                return False
        if _identity_known(a) and _identity_known(b):
            return _identity(a) is _identity(b)
        unimplemented(f"`is` between {a} and {b}")

    @staticmethod
    def contains(tx, items: list[VariableTracker], needle: VariableTracker) -> ConstantVariable:
        if needle.is_python_constant() and all(i.is_python_constant() for i in items):
            return ConstantVariable(needle.as_python_constant() in [i.as_python_constant() for i in items])
        for i in items:  # as list.__contains__: ``i is needle or i == needle``, in order, up to the first hit
            if i is needle:
                return ConstantVariable(True)
            if not (i.is_python_constant() and needle.is_python_constant()):
                unimplemented(f"`in` on non-constant items ({needle} == {i} is not known at trace time)")
            if i.as_python_constant() == needle.as_python_constant():
                return ConstantVariable(True)
        return ConstantVariable(False)

    # ---- calls -------------------------------------------------------------------------------
    def call_function(self, tx, args, kwargs):
        """Dispatch through :data:`BUILTIN_HANDLERS` (TorchDynamo's ``BuiltinVariable`` looks up a
        ``call_<name>`` method the same way). A handler returns None where it does not apply."""
        fn = self.fn
        extra = _call_extra(tx, fn, args, kwargs)  # sets, sorted(key=), next(it, default), id()...
        if extra is not None:
            return extra
        if fn in (locals, vars) and not args and not kwargs:
            return _frame_locals(tx)
        if fn in FRAME_READING_BUILTINS and len(args) <= FRAME_READING_BUILTINS[fn] and not kwargs:
            unimplemented(f"{fn.__name__}() reads the frame's own locals", skip_frame=True)
        if fn in UNSUPPORTED_BUILTINS:
            unimplemented(UNSUPPORTED_BUILTINS[fn])
        _check_arguments(fn, args, kwargs)
        handler = BUILTIN_HANDLERS.get(fn)
        if fn in TENSOR_OPERATORS and not kwargs:
            handler = BuiltinVariable.call_operator
        # handlers that read variables (an attribute, a length) run before constant folding
        if handler is not None and fn not in HANDLED_AFTER_FOLDING:
            result = handler(self, tx, args, kwargs)
            if result is not None:
                return result
        sym = _sym_call(tx, fn, args, kwargs)  # int(n), max(n, 4) of symbolic sizes; else n is specialised
        if sym is not None:
            return sym
        folded = self._fold_constants(args, kwargs)
        if folded is not None:
            return folded
        if handler is not None and fn in HANDLED_AFTER_FOLDING:  # sequences and non-constant items
            result = handler(self, tx, args, kwargs)
            if result is not None:
                return result
        unimplemented(f"builtin {getattr(fn, '__qualname__', fn)} with arguments {args} {kwargs or ''}")

    def _fold_constants(self, args, kwargs) -> VariableTracker | None:
        """Everything else on constants: run it at trace time."""
        fn = self.fn
        if not (all(a.is_python_constant() for a in args) and all(v.is_python_constant() for v in kwargs.values())
                and is_foldable(fn)):
            return None
        if fn in (iter, reversed, enumerate) and any(_origin(a) is not None for a in args):
            return None  # an iterator over a list the frame may change under it: read live (its handler)
        cargs = [a.as_python_constant() for a in args]
        ckw = {k: v.as_python_constant() for k, v in kwargs.items()}
        try:
            return VariableTracker.build_constant(fn(*cargs, **ckw))
        except Exception as e:
            raise_folded(e, f"{getattr(fn, '__name__', fn)}(...)")

    # ---- handlers that read variables (before folding) -------------------------------------
    def call_operator(self, tx, args, kwargs):
        """``operator.add(a, b)``, ``operator.neg(t)``...: a graph node when a tensor is involved."""
        if len(args) == 2:
            return self.binop(tx, self.fn, *args)
        if len(args) == 1 and isinstance(args[0], TensorVariable):
            return tx.output.create_node("call_function", self.fn, args, {})
        if len(args) == 1 and isinstance(args[0], NumpyNdarrayVariable):
            return numpy_unary(tx, self.fn, args[0])
        return None

    def call_setattr(self, tx, args, kwargs):
        if len(args) == 3 and not kwargs and args[1].is_python_constant():
            args[0].var_setattr(tx, args[1].as_python_constant(), args[2])  # a side effect, like STORE_ATTR
            return ConstantVariable(None)
        return None

    def call_delattr(self, tx, args, kwargs):
        if len(args) == 2 and not kwargs and args[1].is_python_constant():
            args[0].var_delattr(tx, args[1].as_python_constant())  # a side effect, like DELETE_ATTR
            return ConstantVariable(None)
        return None

    def call_isinstance(self, tx, args, kwargs):
        if len(args) != 2:
            return None
        cls = args[1].as_python_constant()
        return ConstantVariable(issubclass(args[0].python_type(), cls))

    def call_len(self, tx, args, kwargs):
        if len(args) != 1:
            return None
        if not isinstance(args[0], TensorVariable):
            return args[0].call_method(tx, "__len__", [], {})
        if args[0].example.dim() == 0:
            unimplemented("len() of a 0-d tensor")

        return wrap_size(tx, args[0], args[0].example.shape[0], "size", 0)

    def call_getattr(self, tx, args, kwargs):
        if len(args) not in (2, 3):
            return None
        name = args[1].as_python_constant()
        if len(args) == 2:
            return args[0].var_getattr(tx, name)
        try:
            return args[0].var_getattr(tx, name)
        except Exception as e:
            if not _attribute_absent(tx, args[0], name, e):
                unimplemented(f"getattr of {name!r} on {args[0]}: present, but not traceable ({e})")
            return args[2]

    def call_hasattr(self, tx, args, kwargs):
        if len(args) != 2:
            return None
        name = args[1].as_python_constant()
        try:
            args[0].var_getattr(tx, name)
            return ConstantVariable(True)
        except Exception as e:
            if _attribute_absent(tx, args[0], name, e):
                return ConstantVariable(False)
            return ConstantVariable(True)

    # ---- handlers for what folding could not do (after it) -----------------------------------
    def call_tuple_or_list(self, tx, args, kwargs):
        make = TupleVariable if self.fn is tuple else ListVariable
        if len(args) == 1 and not kwargs:
            return make(args[0].unpack_var_sequence(tx))
        if not args:
            return make([])
        return None

    def call_enumerate(self, tx, args, kwargs):
        start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
        start = start.as_python_constant()
        return ListIteratorVariable([TupleVariable([ConstantVariable(i + start), v])
                                     for i, v in enumerate(args[0].unpack_var_sequence(tx))], _origin(args[0]),
                                    enumerate_start=start)

    def call_zip(self, tx, args, kwargs):
        if not set(kwargs) <= {"strict"}:
            return None
        seqs = [a.unpack_var_sequence(tx) for a in args]
        if kwargs and kwargs["strict"].as_python_constant() and len({len(q) for q in seqs}) > 1:
            unimplemented("zip(strict=True) of sequences of different lengths raises")
        return ListIteratorVariable([TupleVariable(list(t)) for t in zip(*seqs)])

    def call_reversed(self, tx, args, kwargs):
        if len(args) != 1:
            return None
        return ListIteratorVariable(list(reversed(args[0].unpack_var_sequence(tx))), _origin(args[0]), reverse=True)

    def call_iter(self, tx, args, kwargs):
        if len(args) != 1:
            return None
        return ListIteratorVariable(args[0].unpack_var_sequence(tx), _origin(args[0]))

    def call_next(self, tx, args, kwargs):
        if len(args) != 1 or not isinstance(args[0], ListIteratorVariable):
            return None
        if hasattr(args[0], "resume"):  # a generator: its StopIteration carries the return value
            return args[0].call_method(tx, "__next__", [], {})
        item = args[0].next_item()
        if item is None:  # an observed StopIteration: an enclosing `except StopIteration` in the frame sees it
            raise_observed(StopIteration)
        return item

    def call_dict(self, tx, args, kwargs):
        if len(args) > 1:
            raise_observed(TypeError, f"dict expected at most 1 argument, got {len(args)}")
        new = DictVariable.from_pairs(tx, pairs_of(tx, args[0]) if args else [])
        new.add_pairs(tx, list(kwargs.items()))
        return new

    def call_sorted(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            return None
        items = args[0].unpack_var_sequence(tx)
        if all(isinstance(i, TupleVariable) and i.items and i.items[0].is_python_constant() for i in items):
            firsts = [i.items[0].as_python_constant() for i in items]
            if len(set(firsts)) == len(firsts):  # (key, value) pairs with distinct constant keys
                return ListVariable([items[k] for k in sorted(range(len(items)), key=firsts.__getitem__)])
        unimplemented("sorted() of values that are not constants")

    def call_sum(self, tx, args, kwargs):
        if not 1 <= len(args) <= 2 or set(kwargs) - {"start"} or len(args) == 2 and kwargs:
            return None
        total = args[1] if len(args) == 2 else kwargs.get("start", ConstantVariable(0))
        for item in args[0].unpack_var_sequence(tx):
            total = self.binop(tx, operator.add, total, item)
        return total

    def call_all_or_any(self, tx, args, kwargs):
        if len(args) != 1:
            return None
        return ConstantVariable(self.fn([v.truth(tx) for v in args[0].unpack_var_sequence(tx)]))

    def call_min_or_max(self, tx, args, kwargs):
        fn = self.fn
        if set(kwargs) not in ({"key"}, set()):
            return None
        items = args[0].unpack_var_sequence(tx) if len(args) == 1 else list(args)
        if kwargs:
            keys = [kwargs["key"].call_function(tx, [i], {}) for i in items]
            if all(k.is_python_constant() for k in keys):
                return items[fn(range(len(items)), key=lambda j: keys[j].as_python_constant())]
            unimplemented(f"{fn.__name__}(key=...) with non-constant keys")
        if all(i.is_python_constant() for i in items):
            return ConstantVariable(fn(i.as_python_constant() for i in items))
        if items and all(_one_element_tensor(i) or (i.is_python_constant() and type(i.as_python_constant())
                                                    in (int, float, bool)) for i in items):
            return _min_or_max_of_scalars(tx, fn, items)
        unimplemented(f"{fn.__name__}() of tensors compares values (use torch.maximum / torch.max)")

    def call_abs(self, tx, args, kwargs):
        scalar = self._scalar_unary(tx, args, kwargs)
        if scalar is not None:
            return scalar
        if len(args) == 1 and isinstance(args[0], TensorVariable):
            return tx.output.create_node("call_function", torch.abs, args, {})
        if len(args) == 1 and isinstance(args[0], NumpyNdarrayVariable):
            return numpy_unary(tx, abs, args[0])
        return None

    def call_int_or_float(self, tx, args, kwargs):
        scalar = self._scalar_unary(tx, args, kwargs)
        if scalar is not None:
            return scalar
        self._reject_tensor_value(args)
        return None

    def call_bool(self, tx, args, kwargs):
        self._reject_tensor_value(args)
        return ConstantVariable(args[0].truth(tx)) if len(args) == 1 else None

    def call_type(self, tx, args, kwargs):
        return ConstantVariable(args[0].python_type()) if len(args) == 1 else None

    def call_callable(self, tx, args, kwargs):
        """``callable(x)``: whether ``type(x)`` defines ``__call__`` (what CPython checks), so an instance
        of a user class with ``__call__`` is callable and the class itself (a ``type``) is too."""
        if len(args) != 1:
            return None
        if isinstance(args[0], _callable_kinds()):
            return ConstantVariable(True)
        try:
            cls = args[0].python_type()
        except Exception:  # noqa: BLE001 - no type known: not folded
            return None
        return ConstantVariable(_on_class(cls, "__call__"))

    def call_str(self, tx, args, kwargs):
        """``str(exc)`` of an exception built in the frame from constant arguments: what
        ``BaseException.__str__`` gives (nothing, the one argument, or the tuple of them)."""
        if len(args) == 1 and not kwargs and isinstance(args[0], ExceptionVariable) \
                and args[0].python_type().__str__ is BaseException.__str__:
            exc_args = args[0].var_getattr(tx, "args")
            if exc_args.is_python_constant():
                return ConstantVariable(str(BaseException(*exc_args.as_python_constant())))
        return None

    def _scalar_unary(self, tx, args, kwargs):
        """``abs(n)``, ``int(n)``, ``float(n)`` of a captured ``.item()`` number: stays a graph number."""
        if len(args) == 1 and not kwargs and isinstance(args[0], ScalarNodeVariable):
            return args[0].unary(tx, self.fn)
        return None

    def _reject_tensor_value(self, args) -> None:
        if len(args) == 1 and isinstance(args[0], TensorVariable):
            unimplemented(f"{self.fn.__name__}(tensor) reads the tensor's value",
                          hint="keep it a tensor, or accept a graph break here")


#: builtin -> its ``call_<name>`` handler (one method may serve two builtins: tuple/list, min/max)
BUILTIN_HANDLERS: dict[Any, Callable] = {
    setattr: BuiltinVariable.call_setattr, delattr: BuiltinVariable.call_delattr, isinstance: BuiltinVariable.call_isinstance,
    len: BuiltinVariable.call_len, getattr: BuiltinVariable.call_getattr, hasattr: BuiltinVariable.call_hasattr,
    tuple: BuiltinVariable.call_tuple_or_list, list: BuiltinVariable.call_tuple_or_list,
    enumerate: BuiltinVariable.call_enumerate, zip: BuiltinVariable.call_zip,
    reversed: BuiltinVariable.call_reversed, iter: BuiltinVariable.call_iter, next: BuiltinVariable.call_next,
    dict: BuiltinVariable.call_dict, sorted: BuiltinVariable.call_sorted, sum: BuiltinVariable.call_sum,
    all: BuiltinVariable.call_all_or_any, any: BuiltinVariable.call_all_or_any,
    min: BuiltinVariable.call_min_or_max, max: BuiltinVariable.call_min_or_max,
    abs: BuiltinVariable.call_abs, int: BuiltinVariable.call_int_or_float, float: BuiltinVariable.call_int_or_float,
    bool: BuiltinVariable.call_bool, type: BuiltinVariable.call_type, callable: BuiltinVariable.call_callable,
    str: BuiltinVariable.call_str,
}
#: handled only where constant folding could not (non-constant items); the others run before folding
HANDLED_AFTER_FOLDING = set(BUILTIN_HANDLERS) - {setattr, delattr, isinstance, len, getattr, hasattr}


def _one_element_tensor(v: VariableTracker) -> bool:
    return isinstance(v, TensorVariable) and v.example.numel() == 1


def _min_or_max_of_scalars(tx, fn, items: list[VariableTracker]) -> VariableTracker:
    """``max(t, 0)``, ``min(a, b)`` over one-element tensors and numbers, as Python runs it: the first
    item, replaced by each later one that compares greater (``max``) or less (``min``). A comparison
    with a tensor is only known at run time, so each step is ``torch.where(item > best, item, best)``
    (NaN and ties pick what Python picks); the result is a tensor where eager may give the number."""
    compare = operator.gt if fn is max else operator.lt
    best = items[0]
    for item in items[1:]:
        if best.is_python_constant() and item.is_python_constant():
            best = item if compare(item.as_python_constant(), best.as_python_constant()) else best
            continue
        cond = BuiltinVariable.binop(tx, compare, item, best)
        best = tx.output.create_node("call_function", torch.where, [cond, item, best], {})
    return best


def _sym_binop(tx, fn, a: VariableTracker, b: VariableTracker) -> VariableTracker | None:
    """``n * 4``, ``n // m``, ``n > 4`` with a symbolic size: a graph node whose fake run gives the
    result's symbol. With anything but a number, the size is specialised (Python needs its value)."""
    if not (isinstance(a, SymNodeVariable) or isinstance(b, SymNodeVariable)):
        return None
    if fn in INPLACE_TO_OUT_OF_PLACE:  # ``n += 1``: ints have no in-place add
        fn = INPLACE_TO_OUT_OF_PLACE[fn]

    def numeric(v):
        return isinstance(v, SymNodeVariable) or (
            v.is_python_constant() and type(v.as_python_constant()) in (int, float, bool))

    if fn in TENSOR_OPERATORS and fn is not operator.getitem and numeric(a) and numeric(b):
        return tx.output.create_node("call_function", fn, [a, b], {})
    specialized = [ConstantVariable(v.as_python_constant()) if isinstance(v, SymNodeVariable) else v for v in (a, b)]
    return BuiltinVariable.binop(tx, fn, *specialized)


def _sym_call(tx, fn, args, kwargs) -> VariableTracker | None:
    """Builtins of symbolic sizes: ``int``/``float`` and ``min``/``max`` stay symbolic (torch.sym_*);
    other foldable builtins (``range(n)``, ``math.sqrt(n)``) specialise them (guarded)."""
    if not any(isinstance(a, SymNodeVariable) for a in [*args, *kwargs.values()]):
        return None
    if fn is int and len(args) == 1 and args[0].python_type() is int:
        return args[0]
    if fn in (int, float) and len(args) == 1 and not kwargs:
        return tx.output.create_node("call_function", torch.sym_int if fn is int else torch.sym_float, args, {})
    if fn in (min, max) and len(args) >= 2 and not kwargs and all(
            isinstance(a, SymNodeVariable) or a.is_python_constant() for a in args):
        result = args[0]
        for a in args[1:]:
            result = tx.output.create_node("call_function", torch.sym_min if fn is min else torch.sym_max,
                                           [result, a], {})
        return result
    if is_foldable(fn) and fn not in (isinstance, type, callable, bool, getattr, hasattr, len, sum):
        return BuiltinVariable(fn).call_function(
            tx, [ConstantVariable(a.as_python_constant()) if isinstance(a, SymNodeVariable) else a for a in args],
            {k: ConstantVariable(v.as_python_constant()) if isinstance(v, SymNodeVariable) else v
             for k, v in kwargs.items()})
    return None


def _callable_kinds():
    return (BaseUserFunctionVariable, UserFunctionVariable, NNModuleVariable, TorchVariable, BuiltinVariable)


def _on_class(cls: type, name: str) -> bool:
    """Whether an instance of ``cls`` finds ``name`` on its class, as attribute lookup does: in the
    dicts of the MRO. ``hasattr(cls, name)`` is not that: it also sees the type's own attributes
    (``functools.partial.__name__`` exists, a partial object's ``__name__`` does not)."""
    return any(name in vars(k) for k in getattr(cls, "__mro__", (cls,)))


#: set operators -> the set method that implements them
_SET_DUNDERS = {
    operator.or_: "__or__", operator.and_: "__and__", operator.sub: "__sub__", operator.xor: "__xor__",
    operator.ior: "__ior__", operator.iand: "__iand__", operator.isub: "__isub__", operator.ixor: "__ixor__",
    operator.eq: "__eq__", operator.ne: "__ne__", operator.le: "__le__", operator.lt: "__lt__",
    operator.ge: "__ge__", operator.gt: "__gt__",
}


def _type_of(v: VariableTracker):
    try:
        return v.python_type()
    except Unsupported:
        return None


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a static C type


def _attribute_absent(tx, obj: VariableTracker, name: str, error: Exception) -> bool:
    """Reading ``obj.name`` failed with ``error``: is the attribute absent (True), or present but not
    traceable (False, only for ``hasattr``: a class attribute every instance has, ``__call__`` of a
    partial)? An AttributeError the traced code raised means absent. Any other failure says only
    that tinydynamo could not read it: the class is asked, and where it cannot answer, Unsupported
    (never a guessed False: ``hasattr(p, '__call__')`` would take the wrong branch)."""
    if isinstance(error, ObservedException) and issubclass(error.exc_type, AttributeError):
        _guard_absent(tx, obj, name)
        return True
    try:
        cls = obj.python_type()
    except Exception:  # noqa: BLE001 - no type known either
        cls = None
    if cls is not None and _on_class(cls, name):
        return False
    if cls is not None and not cls.__flags__ & _HEAPTYPE and cls.__dictoffset__ == 0 and not hasattr(cls, "__getattr__"):
        return True  # a static C type whose instances have no __dict__ (dict, tuple, torch.Size): only the class

    if isinstance(obj, TensorVariable) and not hasattr(torch.Tensor, name):
        # an attribute a user set on a tensor (``x.test = None``): an input is guarded to lack it,
        # a tensor the graph computes is new and has none
        if obj.source is not None:
            L, G = getattr(tx.output, "frame_values", (None, None))
            try:
                present = hasattr(tx.output.scope.evaluate(obj.source, L, G), name)
            except Exception as e:  # noqa: BLE001 - the real tensor cannot be read back: do not guess
                unimplemented(f"hasattr of {name!r} on {obj.source.name()}, which cannot be read back: {e}")
            tx.output.add_guard("HASATTR", obj.source, (name, present))
            return not present
        return True
    if _identity_known(obj) or not isinstance(error, Unsupported):
        _guard_absent(tx, obj, name)
        return True
    unimplemented(f"getattr/hasattr of {name!r} on {obj}: tinydynamo cannot tell whether it exists ({error})")


def _guard_absent(tx, obj: VariableTracker, name: str) -> None:
    """``getattr(obj, name, default)`` / ``hasattr`` took the "absent" branch: the graph now
    depends on ``name`` NOT being there, so guard that (setting it later is a miss). An object
    that does have it (tracing it failed for another reason) is not guessed about: Unsupported."""
    real = _identity(obj) if _identity_known(obj) else None
    if real is not None and tx.output.side_effects.load_attr(obj, real, name) is DELETED \
            and not hasattr(type(real), name):
        return  # the frame deleted it (its presence before was guarded there)
    if real is None or obj.source is None:
        if real is not None and hasattr(real, name):
            unimplemented(f"getattr/hasattr of {name!r} on a {type(real).__name__}: present, but not traceable")
        return
    if hasattr(real, name):
        unimplemented(f"getattr/hasattr of {name!r} on a {type(real).__name__}: present, but not traceable")
    tx.output.add_guard("HASATTR", obj.source, (name, False))


def _as_sequence(v: VariableTracker) -> VariableTracker:
    """A constant tuple or list as a sequence variable of its items (so it joins one with symbolic items)."""
    if isinstance(v, BaseListVariable) or not v.is_python_constant():
        return v
    value = v.as_python_constant()
    if type(value) not in (tuple, list):
        return v
    return (ListVariable if type(value) is list else TupleVariable)([ConstantVariable(x) for x in value])


def _is_container(v: VariableTracker) -> bool:
    """A list, tuple, dict or set tracker (sets are traced above this module: by their type)."""
    if isinstance(v, (BaseListVariable, DictVariable)):
        return True
    try:
        return not isinstance(v, ConstantVariable) and v.python_type() is set
    except Exception:  # noqa: BLE001 - a tracker with no Python type of its own
        return False


def _container_is(tx, a: VariableTracker, b: VariableTracker) -> bool:
    """``a is b`` where one is a list, tuple, dict or set: one tracker per object (a container from
    outside the frame has one tracker however it is reached: tinydynamo.side_effects), so another
    tracker is another object, as long as each is from outside (guarded to stay distinct) or made in
    the frame. A tuple from outside has no tracker of its own: two of them may be one object."""
    if a is b:
        return True
    if not (_is_container(a) and _is_container(b)) or a.python_type() is not b.python_type():
        return False  # a container is no object of another kind
    real_a, real_b = (tx.output.side_effects.real_object(v) for v in (a, b))
    made_in_frame = (a.source is None and real_a is None) or (b.source is None and real_b is None)
    if made_in_frame or (real_a is not None and real_b is not None):
        if a.source is not None and b.source is not None:
            tx.output.add_guard("ALIAS_MATCH", a.source, (b.source, False))
        return False
    unimplemented(f"`is` between {a} and {b}: two {a.python_type().__name__}s from outside the frame")


def _identity_known(v: VariableTracker) -> bool:
    return hasattr(v, "module") or hasattr(v, "value") and not isinstance(v, ConstantVariable)


def _identity(v: VariableTracker) -> Any:
    return getattr(v, "module", None) or getattr(v, "value", None)



def _origin(v):
    """The list/dict an iterator walks (changing it inside the unrolled loop is then Unsupported)."""
    if getattr(v, "dict_var", None) is not None:  # a dict's keys()/values()/items() view: the dict
        return v.dict_var
    return v if isinstance(v, (ListVariable, DictVariable)) else None


#: operator -> (the left operand's dunder, the right operand's reflected dunder)
_DUNDERS = {
    operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
    operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
    operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
    operator.pow: ("__pow__", "__rpow__"), operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__"),
    operator.xor: ("__xor__", "__rxor__"), operator.lshift: ("__lshift__", "__rlshift__"),
    operator.rshift: ("__rshift__", "__rrshift__"),
    operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"), operator.lt: ("__lt__", "__gt__"),
    operator.le: ("__le__", "__ge__"), operator.gt: ("__gt__", "__lt__"), operator.ge: ("__ge__", "__le__"),
}
_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
            operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
            operator.ipow: operator.pow, operator.imatmul: operator.matmul, operator.iand: operator.and_,
            operator.ior: operator.or_, operator.ixor: operator.xor}


def _user_binop(tx, fn, a, b):
    """``a + b`` where an operand is a user object whose class defines the operator in Python, as
    Python does it: ``__iadd__``, then ``a.__add__(b)``, then ``b.__radd__(a)`` (None: not applicable)."""
    if not (isinstance(a, UserDefinedObjectVariable) or isinstance(b, UserDefinedObjectVariable)):
        return None
    if fn in _INPLACE:
        if isinstance(a, UserDefinedObjectVariable) and _python_dunder(a.python_type(), "__i" + _DUNDERS[_INPLACE[fn]][0][2:]):
            result = a.call_method(tx, "__i" + _DUNDERS[_INPLACE[fn]][0][2:], [b], {})
            if not (result.is_python_constant() and result.as_python_constant() is NotImplemented):
                return result
        fn = _INPLACE[fn]
    if fn not in _DUNDERS:
        return None
    name, rname = _DUNDERS[fn]
    for obj, other, dunder in ((a, b, name), (b, a, rname)):
        if isinstance(obj, UserDefinedObjectVariable) and _python_dunder(obj.python_type(), dunder) is not None:
            result = obj.call_method(tx, dunder, [other], {})
            if not (result.is_python_constant() and result.as_python_constant() is NotImplemented):
                return result
    if fn in (operator.eq, operator.ne):  # no __eq__ of their own: identity
        same = a is b or (getattr(a, "value", None) is not None and getattr(a, "value", None) is getattr(b, "value", 0))
        return ConstantVariable(same == (fn is operator.eq))
    return None


def _frame_locals(tx) -> VariableTracker:
    """``locals()`` / ``vars()``: a dict of the traced frame's bound locals and cells, in
    ``co_varnames`` then ``co_cellvars`` / ``co_freevars`` order as CPython builds it (names
    of a resume function's own stack and context slots, ``___*``, are left out)."""
    items = {}
    code = tx.code
    for name in code.co_varnames + code.co_cellvars + code.co_freevars:
        if name.startswith("___") or name in items:
            continue
        if name in tx.symbolic_locals:
            items[name] = tx.symbolic_locals[name]
        elif name in tx.cells and tx.cells[name].value is not None:
            items[name] = tx.cells[name].value
    return DictVariable(items)


_SIGNATURES: dict = {}


def _check_arguments(fn, args, kwargs) -> None:
    """A builtin called with arguments its signature rejects (``isinstance(x, T, invalid=True)``)
    breaks the graph: run natively, the call raises the TypeError eager raises. Handlers then
    see only well-formed calls."""
    if fn not in _SIGNATURES:
        try:
            _SIGNATURES[fn] = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature for this builtin (max, getattr...)
            _SIGNATURES[fn] = None
    sig = _SIGNATURES[fn]
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        unimplemented(f"{getattr(fn, '__qualname__', fn)}() called with invalid arguments: {e}")


#: builtins whose result is a tracker of a module above this one, fn -> handler(tx, args, kwargs) (None: not
#: applicable), tried first; that module registers them when it is imported (variables/iter.py: a set of
#: items not known at trace time, ``zip`` and ``enumerate`` over a lazy iterator)
HANDLERS_FROM_ABOVE: dict[Any, Callable] = {}


def register_handlers_from_above(handlers: dict[Any, Callable]) -> None:
    HANDLERS_FROM_ABOVE.update(handlers)


def _call_extra(tx, fn, args, kwargs):
    """Builtins handled beyond folding (None: let BuiltinVariable.call_function go on)."""
    registered = HANDLERS_FROM_ABOVE.get(fn)
    if registered is not None:
        return registered(tx, args, kwargs)
    if fn is sorted and len(args) == 1 and kwargs:
        return UserFunctionVariable(polyfills.sorted_).call_function(tx, args, kwargs)
    if fn is next and len(args) == 2 and isinstance(args[0], ListIteratorVariable):
        item = args[0].next_item()
        return args[1] if item is None else item
    if fn is iter and len(args) == 1 and isinstance(args[0], ListIteratorVariable):
        return args[0]
    if fn in (operator.is_, operator.is_not) and len(args) == 2 and not kwargs:  # as the IS_OP opcode
        return ConstantVariable(BuiltinVariable.is_(tx, *args) == (fn is operator.is_))
    if fn is id and len(args) == 1:
        value = getattr(args[0], "module", None) or getattr(args[0], "value", None) or getattr(args[0], "fn", None)
        if value is not None and not isinstance(args[0], ConstantVariable):
            if args[0].source is not None:
                tx.output.add_guard("ID_MATCH", args[0].source, value)
            return ConstantVariable(id(value))
        if args[0].is_python_constant() and isinstance(args[0].as_python_constant(), (type, type(None), bool)):
            return ConstantVariable(id(args[0].as_python_constant()))
        return None
    return None


register_construction(BuiltinVariable=BuiltinVariable)
