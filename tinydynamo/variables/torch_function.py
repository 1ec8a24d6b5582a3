"""Tensor subclasses with ``__torch_function__``: the override is traced, never ignored.

Eagerly, every torch function, tensor method, operator and tensor property called with an instance
of such a subclass first calls ``type(x).__torch_function__(func, types, args, kwargs)``; the
default one (``torch.Tensor.__torch_function__``) runs ``func`` with the subclass switched off and
turns tensor results back into the subclass (``_convert``). TorchDynamo models this with
``TensorWithTFOverrideVariable``; so does tinydynamo:

* the graph itself works on plain tensors: an input ``x`` of subclass ``S`` is guarded by type
  and its graph input is ``x.as_subclass(torch.Tensor)`` (:class:`~tinydynamo.source.PlainTensorSource`);
  a result that is an ``S`` in eager is rebuilt with ``.as_subclass(S)`` after the graph;
* every op on such a variable asks Python which ``__torch_function__`` call eager would make (the
  op runs once on *probe* meta tensors whose override records ``func``/``args`` and stops), then
  inlines the subclass's ``__torch_function__`` with those arguments, like any user classmethod;
* ``super().__torch_function__(...)`` (torch's default) is modelled directly
  (:class:`DefaultTorchFunctionVariable`): ``func`` on plain variables, results converted.

A subclass whose own ``__torch_function__`` is Python code is traced when it is listed in
``tinydynamo.config.traceable_tensor_subclasses`` (torch's name; torch >= 2.5 traces them by
default); otherwise the frame falls back to eager with a reason naming that setting. Subclasses
that switch it off (``nn.Parameter``: ``_disabled_torch_function_impl``) are plain tensors.

Layer: above tensor, torch, user_defined, dicts and misc_ctx.
"""
from __future__ import annotations

import inspect
import operator

import torch

from tinydynamo import config
from tinydynamo.exc import Unsupported, unimplemented
from tinydynamo.source import AttrSource, PlainTensorSource
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.dicts import DictVariable
from tinydynamo.variables.functions import UserFunctionVariable
from tinydynamo.variables.lists import BaseListVariable, ListVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.misc_ctx import NullContextVariable
from tinydynamo.variables.tensor import TensorVariable
from tinydynamo.variables.torch import TorchVariable
from tinydynamo.variables.user_defined import MISSING, class_attribute_variable

_DEFAULT_TF = torch.Tensor.__dict__["__torch_function__"].__func__


def override_kind(cls: type) -> str:
    """"plain" (no override, or switched off), "default" (torch.Tensor's, inherited) or "user"."""
    if cls is torch.Tensor or not issubclass(cls, torch.Tensor):
        return "plain"
    tf = inspect.getattr_static(cls, "__torch_function__", None)
    if tf is torch._C._disabled_torch_function_impl or \
            getattr(tf, "__func__", None) is torch._C._disabled_torch_function_impl:
        return "plain"
    if isinstance(tf, classmethod) and tf.__func__ is _DEFAULT_TF:
        return "default"
    return "user"


def has_torch_function_override(value) -> bool:
    return isinstance(value, torch.Tensor) and override_kind(type(value)) != "plain"


def check_traceable(cls: type) -> None:
    if override_kind(cls) == "user" and cls not in config.traceable_tensor_subclasses:
        unimplemented(f"tensor subclass {cls.__qualname__} overrides __torch_function__ (not traced unless "
                      f"listed in config.traceable_tensor_subclasses)",
                      hint=f"tinydynamo.config.traceable_tensor_subclasses.add({cls.__qualname__}) to trace it")
    tf = inspect.getattr_static(cls, "__torch_function__")
    if override_kind(cls) == "user" and not (isinstance(tf, classmethod) and inspect.isfunction(tf.__func__)):
        unimplemented(f"{cls.__qualname__}.__torch_function__ is not a Python classmethod")


# ---- run time: what the compiled frame does around the plain-tensor graph ------------------------------
def as_plain_tensor(t):
    """``t`` as a plain ``torch.Tensor`` sharing its data and autograd history (non-tensors as they are)."""
    if not isinstance(t, torch.Tensor) or type(t) is torch.Tensor:
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.as_subclass(t, torch.Tensor)


def as_subclass(t: torch.Tensor, cls: type) -> torch.Tensor:
    """A graph output back as the subclass eager would return (torch's ``_convert``)."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.as_subclass(t, cls)


def wrap_subclass_tensor(tx, value: torch.Tensor, source) -> "TensorWithTFOverrideVariable":
    """An input tensor of a ``__torch_function__`` subclass: guarded by type, lifted as a plain tensor."""
    cls = type(value)
    check_traceable(cls)
    plain = as_plain_tensor(value)
    if source is None:
        var = tx.output.lift_tensor(plain, None)
    else:
        tx.output.add_guard("TYPE_MATCH", source, cls)
        var = tx.output.lift_tensor(plain, PlainTensorSource(source, tx.output.scope.constant(as_plain_tensor, "fn")))
    result = TensorWithTFOverrideVariable.of(var, cls)
    result.base_source, result.instance_dict = source, dict(getattr(value, "__dict__", {}))
    return result


class TensorWithTFOverrideVariable(TensorVariable):
    """A tensor of subclass ``class_type`` whose ops go through its ``__torch_function__`` (torch's name)."""

    base_source = None  # the subclass tensor's own source (inputs); ``source`` is its plain view's
    instance_dict: dict = {}

    @classmethod
    def of(cls, var: TensorVariable, class_type: type) -> "TensorWithTFOverrideVariable":
        result = cls(var.node, var.example, var.source)
        result.class_type = result.py_type = class_type
        return result

    def python_type(self) -> type:
        return self.class_type

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "__class__":
            return ConstantVariable(self.class_type)
        if name in self.instance_dict:  # ``x.scale = 2`` set on the input: a guarded constant
            src = AttrSource(self.base_source, name) if self.base_source is not None else None
            return VariableTracker.build(tx, self.instance_dict[name], src)
        own = MISSING
        for klass in self.class_type.__mro__:
            if klass is torch.Tensor:
                break
            if name in vars(klass):
                own = vars(klass)[name]
                break
        if own is not MISSING:  # a method / property / class attribute of the subclass itself
            return class_attribute_variable(tx, self, self.class_type, name, own)
        static = inspect.getattr_static(torch.Tensor, name, None)
        if type(static).__name__ == "getset_descriptor" or isinstance(static, property):
            return dispatch(tx, "getattr", name, [self], {})  # x.shape, x.T: a __torch_function__ call too
        if callable(static):
            return GetAttrVariable(self, name)
        return super().var_getattr(tx, name)

    def call_method(self, tx, name: str, args, kwargs) -> VariableTracker:
        return dispatch(tx, "call_method", name, [self, *args], kwargs)

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        """``for row in x``: ``Tensor.__iter__`` is ``iter(x.unbind(0))`` (it has no override of its own), and
        the override sees that unbind (and a ``dim()`` call first, answered here from metadata)."""
        if self.example.dim() == 0:
            unimplemented("iterating over a 0-d tensor")
        return dispatch(tx, "call_method", "unbind", [self, ConstantVariable(0)], {}).unpack_var_sequence(tx)

    def reconstruct(self, codegen) -> str:
        if self.base_source is not None and self.source is not None:
            return codegen.source_expr(self.base_source)  # the input itself
        return f"{codegen.constant(as_subclass, 'fn')}({codegen.graph_output(self)}, " \
               f"{codegen.constant(self.class_type, 't')})"

    def __repr__(self) -> str:
        return f"TensorWithTFOverrideVariable({self.class_type.__name__}, {self.node.name})"


# ---- which __torch_function__ call eager makes: ask Python, on probe tensors -----------------------------
class _Recorded(Exception):
    def __init__(self, func, types, args, kwargs):
        super().__init__("recorded")
        self.func, self.types, self.args, self.kwargs = func, types, args, kwargs


class _Probe(torch.Tensor):
    """Stands for a subclass tensor: its override records the call and stops it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise _Recorded(func, types, args, kwargs or {})


class _Opaque:
    """Stands for a variable that is neither a tensor nor a constant."""


def _to_probe(var, back: dict):
    if isinstance(var, TensorVariable):
        ex = var.example
        obj = torch.empty(tuple(ex.shape), dtype=ex.dtype, device="meta")
        if isinstance(var, TensorWithTFOverrideVariable):
            obj = obj.as_subclass(_Probe)
    elif var.is_python_constant():
        obj = var.as_python_constant()
    elif isinstance(var, BaseListVariable) and type(var.python_type()) is type and var.python_type() in (tuple, list):
        obj = var.python_type()(_to_probe(v, back) for v in var.items)
    else:
        obj = _Opaque()
    back[id(obj)] = (obj, var)  # the object is kept alive, so its id stays unique
    return obj


def _from_probe(obj, back: dict):
    if id(obj) in back and back[id(obj)][0] is obj:
        return back[id(obj)][1]
    if type(obj) in (tuple, list):
        items = [_from_probe(o, back) for o in obj]
        return TupleVariable(items) if type(obj) is tuple else ListVariable(items)
    if isinstance(obj, torch.Tensor):
        unimplemented("a __torch_function__ call received a tensor made by the call itself")
    return VariableTracker.build_constant(obj)


def _record(kind: str, target, args: list, kwargs: dict):
    back: dict = {}
    pargs = [_to_probe(a, back) for a in args]
    pkw = {k: _to_probe(v, back) for k, v in kwargs.items()}
    name = target if isinstance(target, str) else getattr(target, "__qualname__", str(target))
    # tracing runs with subclass overrides switched off: switch them on for the probe, and set aside any
    # TorchFunctionMode (a mode sees calls before subclasses do; it must not see the probe's)
    modes = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        with torch._C._EnableTorchFunction():
            _probe_call(kind, target, pargs, pkw)
    except _Recorded as r:
        method = getattr(torch.Tensor, target, None) if kind == "call_method" else None
        if inspect.isfunction(method) and r.func is not method:
            # a Python method without an override of its own: its body makes several calls, the probe saw the first
            unimplemented(f"Tensor.{target} on a __torch_function__ subclass (a Python method whose body makes "
                          f"several overridable calls; not traced)")
        return r.func, [_from_probe(a, back) for a in r.args], {k: _from_probe(v, back) for k, v in r.kwargs.items()}
    except Exception as e:
        unimplemented(f"{name} on a __torch_function__ subclass: its __torch_function__ call could not be "
                      f"found ({type(e).__name__}: {e})")
    finally:
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)
    unimplemented(f"{name} does not go through __torch_function__ for a subclass tensor (not traced)")


def _probe_call(kind: str, target, pargs: list, pkw: dict) -> None:
    if kind == "getattr":
        getattr(pargs[0], target)
    elif kind == "call_method":
        getattr(pargs[0], target)(*pargs[1:], **pkw)
    else:
        target(*pargs, **pkw)


def _overloaded(items, found: list) -> list:
    for v in items:
        if isinstance(v, TensorWithTFOverrideVariable) and v.class_type not in found:
            # torch's order: left to right, but a subclass before its base classes
            at = next((i for i, c in enumerate(found) if issubclass(v.class_type, c)), len(found))
            found.insert(at, v.class_type)
        elif isinstance(v, BaseListVariable):
            _overloaded(v.items, found)
    return found


def has_overloaded_args(args, kwargs) -> bool:
    def any_tf(items):
        return any(isinstance(v, TensorWithTFOverrideVariable) or
                   (isinstance(v, BaseListVariable) and any_tf(v.items)) for v in items)

    return any_tf(args) or any_tf(kwargs.values())


def dispatch(tx, kind: str, target, args: list, kwargs: dict) -> VariableTracker:
    """``target`` applied to ``args`` where some are subclass tensors: the subclasses' overrides decide,
    as ``torch.overrides.handle_torch_function`` does (first override not returning NotImplemented)."""
    if tx.output.torch_function_disabled:  # inside ``with torch._C.DisableTorchFunctionSubclass()``
        return _call_plain(tx, kind, target, [plain(a) for a in args], {k: plain(v) for k, v in kwargs.items()})
    func, fargs, fkwargs = _record(kind, target, args, kwargs)
    classes = _overloaded([*fargs, *fkwargs.values()], [])
    types = TupleVariable([ConstantVariable(c) for c in classes])
    for cls in classes:
        check_traceable(cls)
        if override_kind(cls) == "default":
            result = DefaultTorchFunctionVariable(cls).run(tx, func, classes, fargs, fkwargs)
        else:
            tf = inspect.getattr_static(cls, "__torch_function__").__func__
            result = UserFunctionVariable(tf).call_function(
                tx, [ConstantVariable(cls), TorchFunctionFuncVariable(func), types, TupleVariable(list(fargs)),
                     DictVariable(dict(fkwargs))], {})
        if not (result.is_python_constant() and result.as_python_constant() is NotImplemented):
            return result
    unimplemented(f"every __torch_function__ returned NotImplemented for {getattr(func, '__name__', func)} "
                  f"(eager raises TypeError)")


def plain(var: VariableTracker) -> VariableTracker:
    """The same value seen without its subclass (the graph node stays the same)."""
    if isinstance(var, TensorWithTFOverrideVariable):
        out = TensorVariable(var.node, var.example, var.source)
        return out
    if isinstance(var, BaseListVariable) and type(var) in (TupleVariable, ListVariable) and \
            any(isinstance(v, (TensorWithTFOverrideVariable, BaseListVariable)) for v in var.items):
        return type(var)([plain(v) for v in var.items])
    return var


def _call_plain(tx, kind: str, target, args: list, kwargs: dict) -> VariableTracker:
    if kind == "getattr":
        return args[0].var_getattr(tx, target)
    if kind == "call_method":
        return args[0].call_method(tx, target, args[1:], kwargs)
    if kind in ("call_function", "call_function_keep"):
        if kind == "call_function_keep" or target is operator.setitem:
            tx.output.create_node("call_function", target, args, kwargs, keep=True)
            return ConstantVariable(None)
        return tx.output.create_node("call_function", target, args, kwargs)
    # kind == "func": the callable a __torch_function__ received
    owner = getattr(target, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":  # Tensor.shape.__get__ and friends
        return args[0].var_getattr(tx, owner.__name__)
    if getattr(target, "__name__", "") == "__setitem__" and getattr(target, "__objclass__", None) is torch._C.TensorBase:
        tx.output.create_node("call_function", operator.setitem, args, kwargs, keep=True)
        return ConstantVariable(None)
    return TorchVariable(target).call_function(tx, args, kwargs)


def as_subclass_variable(args: list, kwargs: dict) -> VariableTracker:
    """``t.as_subclass(cls)`` on a plain view: the same graph value, typed ``cls`` from here on."""
    cls_var = args[1] if len(args) > 1 else kwargs.get("cls")
    if cls_var is None or not cls_var.is_python_constant():
        unimplemented("Tensor.as_subclass with a class not known at trace time")
    cls = cls_var.as_python_constant()
    var = plain(args[0])
    if override_kind(cls) == "plain":
        if cls is not torch.Tensor:
            unimplemented(f"Tensor.as_subclass({cls.__qualname__}): a subclass without __torch_function__")
        return var
    check_traceable(cls)
    return TensorWithTFOverrideVariable.of(var, cls)


def _convert(var: VariableTracker, cls: type) -> VariableTracker:
    """torch's ``torch._tensor._convert``: tensor results (also inside tuples/lists) become ``cls``."""
    if cls is torch.Tensor:
        return var
    if isinstance(var, TensorVariable) and not issubclass(var.python_type(), cls):
        return TensorWithTFOverrideVariable.of(var, cls)
    if type(var) in (TupleVariable, ListVariable):
        items = [_convert(v, cls) for v in var.items]
        if type(var) is ListVariable:
            return ListVariable(items)
        return TupleVariable(items, tuple_cls=var.tuple_cls) if hasattr(var, "tuple_cls") else TupleVariable(items)
    return var


class TorchFunctionFuncVariable(VariableTracker):
    """The ``func`` a ``__torch_function__`` receives: compares by identity with ``torch.add`` &
    co.; calling it (with the subclass switched off, or on plain tensors) runs the op."""

    def __init__(self, func):
        super().__init__(None)
        self.func = func

    def python_type(self):
        return type(self.func)

    def as_python_constant(self):
        return self.func

    def is_python_constant(self) -> bool:
        return True

    def var_getattr(self, tx, name: str) -> VariableTracker:
        return ConstantVariable(getattr(self.func, name))

    def call_function(self, tx, args, kwargs):
        if has_overloaded_args(args, kwargs) and not tx.output.torch_function_disabled:
            return dispatch(tx, "call_function", self.func, list(args), dict(kwargs)) \
                if _owner_getset(self.func) is None else dispatch(tx, "getattr", _owner_getset(self.func), list(args), {})
        return _call_plain(tx, "func", self.func, list(args), dict(kwargs))

    def __repr__(self) -> str:
        return f"TorchFunctionFuncVariable({getattr(self.func, '__qualname__', self.func)})"


def _owner_getset(func):
    owner = getattr(func, "__self__", None)
    return owner.__name__ if type(owner).__name__ == "getset_descriptor" else None


class DefaultTorchFunctionVariable(VariableTracker):
    """``torch.Tensor.__torch_function__`` bound to ``cls`` (what ``super().__torch_function__`` finds):
    ``func`` runs with the subclass switched off, tensor results come back as ``cls``."""

    def __init__(self, cls: type):
        super().__init__(None)
        self.cls = cls

    def call_function(self, tx, args, kwargs):
        names = ["func", "types", "args", "kwargs"]
        bound = dict(zip(names, args))
        bound.update(kwargs)
        if "func" not in bound or "types" not in bound:
            unimplemented("torch.Tensor.__torch_function__ called without func and types")
        func = bound["func"].as_python_constant()
        types = [t.as_python_constant() for t in bound["types"].unpack_var_sequence(tx)]
        fargs = bound["args"].unpack_var_sequence(tx) if "args" in bound else []
        fkwargs = {}
        if "kwargs" in bound and not (bound["kwargs"].is_python_constant() and bound["kwargs"].as_python_constant() is None):
            fkwargs = dict(bound["kwargs"].items)
        return self.run(tx, func, types, fargs, fkwargs)

    def run(self, tx, func, types, args, kwargs) -> VariableTracker:
        if not all(issubclass(self.cls, t) for t in types):
            return ConstantVariable(NotImplemented)
        result = _call_plain(tx, "func", func, [plain(a) for a in args], {k: plain(v) for k, v in kwargs.items()})
        if func in torch.overrides.get_default_nowrap_functions():
            return result
        return _convert(result, self.cls)

    def __repr__(self) -> str:
        return f"DefaultTorchFunctionVariable({self.cls.__name__})"


def default_torch_function_variable(value):
    """The variable for ``torch.Tensor.__torch_function__`` bound to a class, else None."""
    if getattr(value, "__func__", None) is _DEFAULT_TF and isinstance(getattr(value, "__self__", None), type):
        return DefaultTorchFunctionVariable(value.__self__)
    return None


class DisableTorchFunctionSubclassVariable(NullContextVariable):
    """``with torch._C.DisableTorchFunctionSubclass():``: ops inside see plain tensors (no override)."""

    def __init__(self):
        super().__init__("DisableTorchFunctionSubclass")

    def enter(self, tx):
        tx.output.torch_function_disabled += 1
        return ConstantVariable(None)

    def exit(self, tx, *args):
        tx.output.torch_function_disabled -= 1
        return ConstantVariable(None)


__all__ = ["TensorWithTFOverrideVariable", "DefaultTorchFunctionVariable", "dispatch", "override_kind",
           "has_torch_function_override", "wrap_subclass_tensor", "Unsupported"]
