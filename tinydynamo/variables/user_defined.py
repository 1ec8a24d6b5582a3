"""UserDefinedObjectVariable: an instance of a user class (a config object, a dataclass...).

Attribute reads are wrapped with guarded sources; methods are inlined. Writes to plain Python
objects are side effects, recorded by the OutputGraph's SideEffects and replayed after the graph.
A dict subclass from outside (a ModelOutput) is read through dict's own methods as a guarded DictVariable.

Layer: above ctx_manager and functions, beside dicts (objects made in the frame are objects.py's, above).
"""
from __future__ import annotations

import collections
import functools
import inspect
import types
from typing import Any

from tinydynamo import polyfills
from tinydynamo.exc import ObservedException, raise_observed, unimplemented
from tinydynamo.source import AttrSource, BaseMethodSource, ClassSource, Source, is_data_descriptor
from tinydynamo.variables.base import DELETED, VariableTracker, check_plain_setattr
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.ctx_manager import GradModeDecoratedFunctionVariable, unwrap_grad_mode_decorator
from tinydynamo.variables.dicts import DictVariable, DictViewVariable
from tinydynamo.variables.functions import UserFunctionVariable, UserMethodVariable
from tinydynamo.variables.misc import GetAttrVariable

#: dict's C methods that only read: on a dict subclass from outside the frame (a transformers ModelOutput),
#: ``obj.values()``, ``list(obj)``, ``len(obj)``... read a guarded snapshot of its items (``_dict_items``)
DICT_READS = frozenset({"keys", "values", "items", "__iter__", "__len__", "__contains__", "get", "__getitem__"})


def _inherited_dict_read(cls: type, name: str) -> bool:
    """``cls.<name>`` is a reading method of dict (or OrderedDict) itself: the subclass did not override it.
    ``__getitem__`` of a class with ``__missing__`` is not one (a missing key runs it: a defaultdict stores)."""
    if name not in DICT_READS or (name == "__getitem__" and hasattr(cls, "__missing__")):
        return False
    attr = inspect.getattr_static(cls, name, None)
    return attr is not None and any(attr is vars(base).get(name) for base in (dict, collections.OrderedDict))


def guard_class_lookup(tx, obj: Any, source: Source | None, name: str, cls_attr: Any) -> Source | None:
    """``obj.<name>`` was found on ``type(obj)`` (a method, a property, a class's ``forward``):
    guard that the class still holds that object (a method monkeypatched on the class is a
    miss) and that the instance's ``__dict__`` does not shadow it (``obj.scale = lambda...``).
    Returns the source of the class attribute (for the guards of what is read through it)."""
    if source is None or tx is None:
        return None

    data_descriptor = hasattr(type(cls_attr), "__set__")  # a property wins over the instance dict
    if not data_descriptor and isinstance(getattr(obj, "__dict__", None), dict):
        tx.output.add_guard("DICT_CONTAINS", AttrSource(source, "__dict__"), (name, False))
    # the instance's class is pinned by its TYPE_MATCH / NN_MODULE guard: guard the class's
    # attribute once per class (the class is a constant of the check function)
    cls = type(obj)
    cls_source = AttrSource(ClassSource(cls, tx.output.scope.constant(cls, "cls")), name)
    tx.output.add_guard("ID_MATCH", cls_source, cls_attr)
    return cls_source


class UserDefinedObjectVariable(VariableTracker):
    #: True for an object made in the frame (objects.NewObjectVariable): it has exactly one tracker, so
    #: another tracker is another object (``is`` answers False); an object from outside may have several
    made_in_frame = False

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def key_identity(self):
        """A plain object hashes by identity (an object made in the frame has one tracker: itself)."""
        cls = self.python_type()
        if cls.__hash__ is object.__hash__ and cls.__eq__ is object.__eq__:
            return self if self.made_in_frame else self.value
        return None

    def truth(self, tx) -> bool:
        cls = self.python_type()
        if not hasattr(cls, "__bool__") and not hasattr(cls, "__len__"):
            return True  # plain objects are always true
        if not hasattr(cls, "__bool__") and self._outside_dict() and _inherited_dict_read(cls, "__len__"):
            guard_class_lookup(tx, self.value, self.source, "__len__", inspect.getattr_static(cls, "__len__"))
            return bool(self._dict_items(tx).items)  # dict's own __len__: true iff it holds items
        for name in ("__bool__", "__len__"):  # Python asks __bool__ first, then __len__
            fn = _python_dunder(cls, name)
            if fn is not None:
                result = self.call_method(tx, name, [], {})
                if result.is_python_constant():
                    return bool(result.as_python_constant())
                return result.truth(tx)
        unimplemented(f"truth value of a {cls.__name__} (it defines __bool__ or __len__ in C)")

    def var_getattr(self, tx, name: str) -> VariableTracker:
        """``obj.name`` with Python's precedence: a data descriptor of the class (property), the instance
        ``__dict__``, other class attributes (methods, static/class methods, constants), then absent."""
        stored = tx.output.side_effects.load_attr(self, self.value, name)
        deleted = stored is DELETED  # ``del obj.name`` earlier in this frame: no instance attribute
        if stored is not None and not deleted:  # written earlier in this frame
            return stored
        cls = type(self.value)
        if self._outside_dict() and _inherited_dict_read(cls, name) and _plain_getattribute(cls):
            tracked = self._tracked_dict(tx)
            if tracked is not None:
                in_instance = name in tracked.items
            else:
                in_instance = name in getattr(self.value, "__dict__", {}) and not deleted
            if not in_instance:  # dict's own reading method: a call reads the snapshot of the items
                guard_class_lookup(tx, self.value, self.source, name, inspect.getattr_static(cls, name))
                return DictReadMethodVariable(self, name)
        source = AttrSource(self.source, name) if self.source else None
        py_getattr = inspect.getattr_static(cls, "__getattr__", MISSING)
        if cls.__getattribute__ is not object.__getattribute__ or (
                py_getattr is not MISSING and not isinstance(py_getattr, types.FunctionType)):
            cls_attr = inspect.getattr_static(cls, name, MISSING)  # custom lookup: only methods are inlined
            if isinstance(cls_attr, (types.FunctionType, staticmethod, classmethod)):
                return class_attribute_variable(tx, self, cls, name, cls_attr)
            if deleted:
                unimplemented(f"{cls.__name__}.{name} read through a custom __getattribute__ after it was deleted")
            try:
                value = getattr(self.value, name)
            except AttributeError:
                raise_observed(AttributeError, f"{cls.__name__} has no attribute {name!r}")
            return VariableTracker.build(tx, value, source)
        cls_attr = inspect.getattr_static(cls, name, MISSING)
        instance_dict = getattr(self.value, "__dict__", {})
        if cls_attr is not MISSING and is_data_descriptor(cls_attr) and not isinstance(cls_attr, property):
            if name == "__dict__" and any(k[0] == "attr" and k[1] == id(self.value)
                                          for k in tx.output.side_effects.pending):
                unimplemented(f"{cls.__name__}.__dict__ read after attributes were set in the frame")
            return VariableTracker.build(tx, getattr(self.value, name), source)  # __slots__ member, getset
        tracked = self._tracked_dict(tx)  # its __dict__, read (and maybe changed) in the frame: that wins
        if tracked is not None:
            in_instance = name in tracked.items
        else:
            in_instance = name in instance_dict and not deleted
        if cls_attr is not MISSING and (isinstance(cls_attr, property) or not in_instance):
            return class_attribute_variable(tx, self, cls, name, cls_attr, source)
        if in_instance:
            if tracked is not None:
                return tracked.items[name]
            return VariableTracker.build(tx, instance_dict[name], source)
        if isinstance(py_getattr, types.FunctionType):  # Python calls it for what the lookup did not find
            if self.source is not None and isinstance(instance_dict, dict):
                tx.output.add_guard("DICT_CONTAINS", AttrSource(self.source, "__dict__"), (name, False))
            getattr_fn = class_attribute_variable(tx, self, cls, "__getattr__", py_getattr)
            return getattr_fn.call_function(tx, [ConstantVariable(name)], {})
        raise_observed(AttributeError, f"{cls.__name__} has no attribute {name!r}")

    def _outside_dict(self) -> bool:
        """A dict subclass instance from outside the frame (reached through a source)."""
        return not self.made_in_frame and self.source is not None and isinstance(self.value, dict)

    def _dict_items(self, tx) -> DictVariable:
        """The object's dict part as a read-only snapshot (no source: nothing is ever written to it): its
        keys guarded in order, each value read through ``dict.__getitem__`` (bypassing a Python override)."""
        value, cls = self.value, type(self.value)
        if not self._outside_dict():
            unimplemented(f"reading the items of a {cls.__name__} that is not a dict from outside the frame")
        if not _inherited_dict_read(cls, "__iter__"):  # the keys guard, list(obj), must run no user code
            unimplemented(f"reading the items of a {cls.__name__}, which defines its own __iter__")
        side_effects = tx.output.side_effects
        tracker = side_effects.id_to_variable.get(id(value))
        if tracker is not None and ("items", id(tracker)) in side_effects.pending:
            unimplemented(f"reading the items of a {cls.__name__} changed earlier in the frame")
        keys = list(value)
        if not all(type(k) in (str, int) for k in keys):
            unimplemented(f"reading the items of a {cls.__name__} whose keys are not all str or int")
        guard_class_lookup(tx, value, self.source, "__iter__", inspect.getattr_static(cls, "__iter__"))
        tx.output.add_guard("DICT_KEYS", self.source, (cls, tuple(keys)))
        return DictVariable({k: VariableTracker.build(tx, dict.__getitem__(value, k),
                                                      BaseMethodSource(self.source, "dict.__getitem__", (k,)))
                             for k in keys})

    def _tracked_dict(self, tx):
        """The tracker of this object's ``__dict__`` if the frame reached it (``self.__dict__[k]``)."""
        real = getattr(self.value, "__dict__", None)
        return tx.output.side_effects.id_to_variable.get(id(real)) if isinstance(real, dict) else None

    def _is_private(self, tx) -> bool:
        """The trace made this real object itself (see ``SideEffects.track_private``): change it in place."""
        return self.source is None and tx.output.side_effects.is_private(self.value)

    def _change_private(self, change, name: str, *value: VariableTracker) -> None:
        """``change`` (``setattr`` / ``delattr``, the class's own, run natively) on the private object, now."""
        if value and not value[0].is_python_constant():
            unimplemented(f"setting {name!r} on a {type(self.value).__name__} made at trace time to {value[0]}")
        try:
            change(self.value, name, *(v.as_python_constant() for v in value))
        except AttributeError as e:
            raise_observed(AttributeError, str(e))

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        if self._is_private(tx):
            return self._change_private(setattr, name, value)
        setattr_fn = inspect.getattr_static(type(self.value), "__setattr__", None)
        if isinstance(setattr_fn, types.FunctionType):  # the class's own __setattr__, inlined
            method = class_attribute_variable(tx, self, type(self.value), "__setattr__", setattr_fn)
            method.call_function(tx, [ConstantVariable(name), value], {})
            return
        check_plain_setattr(self.value, name, object.__setattr__)
        tracked = self._tracked_dict(tx)
        if tracked is not None:  # its __dict__ is read in the frame too: one place holds the new value
            tracked.call_method(tx, "__setitem__", [ConstantVariable(name), value], {})
            return
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def var_delattr(self, tx, name: str) -> None:
        """``del obj.name``: the class's own ``__delattr__`` inlined; else, as a store, the instance
        ``__dict__`` entry goes (replayed after the graph as a pop; a private object changes now)."""
        if self._is_private(tx):
            return self._change_private(delattr, name)
        cls = type(self.value)
        delattr_fn = inspect.getattr_static(cls, "__delattr__", None)
        if isinstance(delattr_fn, types.FunctionType):
            method = class_attribute_variable(tx, self, cls, "__delattr__", delattr_fn)
            method.call_function(tx, [ConstantVariable(name)], {})
            return
        if cls.__delattr__ is not object.__delattr__ or hasattr(getattr(cls, name, None), "__delete__"):
            unimplemented(f"deleting {name!r} of a {cls.__name__}: its class defines __delattr__ or a descriptor")
        tracked = self._tracked_dict(tx)
        if tracked is not None:  # its __dict__ is read in the frame too: one place holds the state
            try:
                tracked.call_method(tx, "__delitem__", [ConstantVariable(name)], {})
            except ObservedException as e:
                if e.exc_type is not KeyError:
                    raise
                raise_observed(AttributeError, f"{cls.__name__} object has no attribute {name!r}")
            return
        stored = tx.output.side_effects.load_attr(self, self.value, name)
        if stored is None:
            present = name in getattr(self.value, "__dict__", {})
            if self.source is not None:
                tx.output.add_guard("DICT_CONTAINS", AttrSource(self.source, "__dict__"), (name, present))
        else:
            present = stored is not DELETED
        if not present:
            raise_observed(AttributeError, f"{cls.__name__} object has no attribute {name!r}")
        tx.output.side_effects.delete_attr(self, self.value, name)

    def store(self, tx, name: str, value: VariableTracker) -> None:
        """``object.__setattr__(obj, name, value)`` (a custom ``__setattr__`` calling its base's): a plain
        store into the instance ``__dict__``, through the tracker of that dict (replayed after the graph)."""
        if self._is_private(tx):
            return self._change_private(object.__setattr__, name, value)  # (the class's __setattr__ calls its base's)
        cls_attr = inspect.getattr_static(type(self.value), name, MISSING)
        if cls_attr is not MISSING and is_data_descriptor(cls_attr):
            unimplemented(f"object.__setattr__ of {name!r} on a {type(self.value).__name__}: a descriptor of the class")
        if not isinstance(getattr(self.value, "__dict__", None), dict) or self.source is None:
            unimplemented(f"object.__setattr__ on a {type(self.value).__name__} without a __dict__ or a source")
        self.var_getattr(tx, "__dict__").call_method(tx, "__setitem__", [ConstantVariable(name), value], {})

    def call_function(self, tx, args, kwargs):
        if _python_dunder(self.python_type(), "__call__") is not None:
            return self.call_method(tx, "__call__", args, kwargs)
        unimplemented(*describe_opaque_call(self.value))

    def unpack_var_sequence(self, tx):
        """``for v in obj`` / ``list(obj)``: ``__iter__`` (or the ``__getitem__`` protocol is Unsupported)."""
        if _python_dunder(self.python_type(), "__iter__") is None:
            if self._outside_dict():  # dict's (OrderedDict's) own __iter__: the snapshot's keys
                return self._dict_items(tx).unpack_var_sequence(tx)
            unimplemented(f"iterating over a {self.python_type().__name__} (no Python __iter__)")
        it = self.call_method(tx, "__iter__", [], {})
        if it is self:
            return list(self.next_items(tx))
        return it.unpack_var_sequence(tx)

    def next_items(self, tx):
        """The items of an iterator object, each from an inlined ``__next__`` call made when the loop
        asks for it (so the loop body's effects on the object are seen), until it raises StopIteration."""
        if _python_dunder(self.python_type(), "__next__") is None:
            unimplemented(f"{self.python_type().__name__}.__iter__ returns self, which has no Python __next__")
        while True:
            try:
                yield self.call_method(tx, "__next__", [], {})
            except ObservedException as e:
                if issubclass(e.exc_type, StopIteration):
                    return
                raise

    def call_method(self, tx, name, args, kwargs):
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def __repr__(self) -> str:
        return f"UserDefinedObjectVariable({type(self.value).__name__})"


class DictReadMethodVariable(GetAttrVariable):
    """``obj.values`` (one of ``DICT_READS``, dict's own) of a dict subclass from outside: a call reads the
    snapshot of its items (``UserDefinedObjectVariable._dict_items``); rebuilt as ``getattr(obj, name)``."""

    def call_function(self, tx, args, kwargs):
        result = self.obj._dict_items(tx).call_method(tx, self.name, args, kwargs)
        if isinstance(result, DictViewVariable):
            return DictPartViewVariable(result.dict_var, result.kind, self.obj)
        return result


class DictPartViewVariable(DictViewVariable):
    """``obj.values()`` of a dict subclass from outside: a view of the snapshot that, left on the stack at a
    graph break, is rebuilt as the real object's own view (its type, ``odict_values``, and live)."""

    def __init__(self, dict_var: DictVariable, kind: str, owner: UserDefinedObjectVariable):
        super().__init__(dict_var, kind)
        self.owner = owner

    def python_type(self):
        return type(getattr(type(self.owner.value), self.kind)(self.owner.value))

    def reconstruct(self, codegen) -> str:
        return f"{self.owner.reconstruct(codegen)}.{self.kind}()"


#: C methods of builtin base classes that only read: ``super().get(key)`` in a dict subclass is folded
READ_ONLY_BASE_METHODS = {(dict, "get"), (dict, "__getitem__"), (dict, "__contains__"), (dict, "__len__"),
                          (list, "__getitem__"), (list, "__len__"), (tuple, "__getitem__"), (tuple, "__len__")}


class BaseMethodVariable(VariableTracker):
    """``super().get`` where the base is dict (list, tuple): called at trace time on the real object with
    constant arguments; the result is guarded through a source that calls the base method again."""

    def __init__(self, klass: type, name: str, obj: "UserDefinedObjectVariable"):
        super().__init__(None)
        self.klass, self.name, self.obj = klass, name, obj

    def call_function(self, tx, args, kwargs):
        if kwargs or not all(a.is_python_constant() for a in args):
            unimplemented(f"{self.klass.__name__}.{self.name} with non-constant arguments")
        consts = tuple(a.as_python_constant() for a in args)
        try:
            value = getattr(self.klass, self.name)(self.obj.value, *consts)
        except Exception as e:
            unimplemented(f"{self.klass.__name__}.{self.name} raised {type(e).__name__}: {e}")
        source = None
        if self.obj.source is not None:
            source = BaseMethodSource(self.obj.source, f"{self.klass.__name__}.{self.name}", consts)
        return VariableTracker.build(tx, value, source)


MISSING = object()


def class_attribute_variable(tx, obj: VariableTracker, cls: type, name: str, attr, source=None) -> VariableTracker:
    """``obj.name`` found on the class as ``attr`` (``inspect.getattr_static``): a method bound to ``obj``,
    a static or class method, a property's value, a decorated ``@torch.no_grad()`` method, or a plain value."""
    # guard the lookup (a method monkeypatched on the class, or shadowed on the instance, is a miss)
    real = getattr(obj, "module", None) if hasattr(obj, "module") else getattr(obj, "value", None)
    cls_source = None
    if isinstance(attr, (property, types.FunctionType)) and real is not None:
        cls_source = guard_class_lookup(tx, real, obj.source, name, attr)
    if isinstance(attr, staticmethod):
        return VariableTracker.build(tx, attr.__func__)
    if isinstance(attr, classmethod):
        return UserMethodVariable(attr.__func__, ConstantVariable(cls))
    if isinstance(attr, property):
        if not isinstance(attr.fget, types.FunctionType):
            if real is not None and source is not None and isinstance(obj, UserDefinedObjectVariable) \
                    and not obj.made_in_frame:
                # a getter in C (a pybind11 property of an object from outside): read at trace time,
                # its value guarded through ``obj.name`` (read again, and compared, on every call)
                try:
                    value = getattr(real, name)
                except Exception as e:  # noqa: BLE001 - it raises natively too
                    unimplemented(f"property {cls.__name__}.{name} raised {e!r} at trace time")
                return VariableTracker.build(tx, value, source)
            unimplemented(f"property {cls.__name__}.{name} whose getter is not a Python function")
        fget_source = AttrSource(cls_source, "fget") if cls_source is not None else None
        return UserFunctionVariable(attr.fget, fget_source).call_function(tx, [obj], {})
    if isinstance(attr, types.FunctionType):
        decorated = unwrap_grad_mode_decorator(attr)  # @torch.no_grad() def forward(self, ...)
        if decorated is not None:
            return GradModeDecoratedFunctionVariable(*decorated, self_obj=obj)
        return method_variable(attr, obj, cls_source)
    if isinstance(attr, functools._lru_cache_wrapper) and isinstance(getattr(attr, "__wrapped__", None),
                                                                       types.FunctionType):
        if real is not None and obj.source is not None:
            guard_class_lookup(tx, real, obj.source, name, attr)
        return LruCacheMethodVariable(attr, obj)
    if hasattr(type(attr), "__get__") and not isinstance(attr, type):
        unimplemented(f"{cls.__name__}.{name} is a {type(attr).__name__} descriptor")
    return VariableTracker.build(tx, attr, source)


def method_variable(fn: types.FunctionType, obj: VariableTracker, source=None) -> UserMethodVariable:
    """``fn`` bound to ``obj``; a library method with a stand-in in ``polyfills.METHOD_POLYFILLS`` traces that."""
    if fn in polyfills.METHOD_POLYFILLS:
        return PolyfilledMethodVariable(fn, obj)
    return UserMethodVariable(fn, obj, source)


class PolyfilledMethodVariable(UserMethodVariable):
    """A library method (``TestCase.assertRaises``) whose calls trace a stand-in, where the stand-in
    covers the call's form; another form is a graph break, and the original method runs there."""

    def __init__(self, original: types.FunctionType, obj: VariableTracker):
        polyfill, self.min_args = polyfills.METHOD_POLYFILLS[original]
        super().__init__(polyfill, obj)
        self.original = original

    def call_function(self, tx, args, kwargs):
        if len(args) < self.min_args:
            unimplemented(f"{self.original.__qualname__} in this form (a context manager)")
        return super().call_function(tx, args, kwargs)

    def reconstruct(self, codegen) -> str:
        return f"{codegen.constant(types.MethodType, 'MethodType')}({codegen.constant(self.original, 'fn')}, " \
               f"{self.obj.reconstruct(codegen)})"


class LruCacheMethodVariable(VariableTracker):
    """``obj.method`` where the class holds a ``functools.lru_cache`` wrapper (transformers'
    ``logger.warning_once``): a descriptor binding ``obj`` as the cache's first argument.

    Called with constant arguments, it is called for real at trace time, as the cache would be:
    the first call runs the function (the warning is printed once, as in eager), every later
    one is a cache hit with no effect, so the compiled code need not call it again. The object
    is guarded by identity (the cache is keyed by it). Called with other arguments (tensors), the
    function under the cache is traced."""

    def __init__(self, wrapper, obj: VariableTracker):
        super().__init__(None)
        self.wrapper, self.obj = wrapper, obj

    def call_function(self, tx, args, kwargs):
        real = getattr(self.obj, "value", None)
        if real is not None and all(a.is_python_constant() for a in [*args, *kwargs.values()]):
            consts = [a.as_python_constant() for a in args]
            kw = {k: v.as_python_constant() for k, v in kwargs.items()}
            try:
                hash((real, *consts, *kw.items()))
            except TypeError:
                pass  # unhashable: the cache would raise; trace the function instead
            else:
                if self.obj.source is not None:
                    tx.output.add_guard("ID_MATCH", self.obj.source, real)
                try:
                    result = self.wrapper(real, *consts, **kw)
                except Exception as e:  # noqa: BLE001 - it runs natively instead, and raises there
                    unimplemented(f"{self.wrapper.__qualname__}(...) raised {e!r} at trace time")
                return VariableTracker.build_constant(result)
        return UserMethodVariable(self.wrapper.__wrapped__, self.obj).call_function(tx, args, kwargs)

    def __repr__(self) -> str:
        return f"LruCacheMethodVariable({self.wrapper.__qualname__})"


def describe_opaque_call(value) -> tuple[str, str]:
    """(reason, hint) for a call tinydynamo cannot look inside: name the function and its module,
    since ``call of <object>`` tells a learner nothing about which line to change."""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or type(value).__name__
    module = getattr(value, "__module__", None) or getattr(type(getattr(value, "__self__", None)), "__module__", "")
    where = f"{module}.{name}" if module and module != "builtins" else name
    if module.split(".")[0] == "numpy" or type(getattr(value, "__self__", None)).__module__.startswith("numpy"):
        return (f"call to {where}: numpy runs outside the graph",
                "use the torch equivalent on tensors (torch.as_tensor, Tensor.sum, torch.where, ...)")
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return (f"call to {where}, a C function tinydynamo cannot trace into",
                "call it outside the compiled function, or pass its result in as an argument")
    return (f"call of a {type(value).__name__} object ({where})",
            "tinydynamo traces Python functions, torch functions and nn.Modules; wrap others with "
            "tinydynamo.disable to run them outside the graph on purpose")


def _plain_getattribute(cls: type) -> bool:
    """``cls`` looks attributes up as object/dict do (no ``__getattribute__`` of its own)."""
    attr = inspect.getattr_static(cls, "__getattribute__", None)
    return attr is object.__getattribute__ or attr is vars(dict).get("__getattribute__")


def _python_dunder(cls: type, name: str):
    """The Python function that defines ``name`` on ``cls`` (found along the MRO), or None."""
    for base in cls.__mro__:
        if name in vars(base):
            fn = vars(base)[name]
            return fn if isinstance(fn, types.FunctionType) else None
    return None
