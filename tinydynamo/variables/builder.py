"""VariableBuilder: turn a real Python value met during tracing into a VariableTracker, with guards.

This is where guards come from. A value with a source (an argument ``L['x']``, a global
``G['scale']``, an attribute ``L['self'].fc1.weight``) gets the guard that makes reusing the
graph safe: tensors TENSOR_MATCH, constants CONSTANT_MATCH, sequences SEQUENCE_LENGTH (and
their items, recursively), modules NN_MODULE, functions ID_MATCH, other objects TYPE_MATCH.
Values with no source (results of folding, defaults) need no guard.

Layer: the top of the values layer. It makes every kind of tracker, so it imports every tracker
module; trackers reach it through ``VariableTracker.build`` (registered here, see base.py).
"""
from __future__ import annotations

import collections
import enum
import functools
import inspect
import math
import operator
import os
import types
from typing import Any

import torch
from torch import nn

from tinydynamo import registry, trace_rules
from tinydynamo.exc import unimplemented
from tinydynamo.guards import ModuleRef, is_unspecialized_module
from tinydynamo.polyfills import constant_object_types, np, numpy_constant_types, typing_types
from tinydynamo.source import AttrSource, DictKeySource, DictValueSource, GetItemSource, Source
from tinydynamo.variables import polyfilled, torch_function
from tinydynamo.variables.autocast import AUTOCAST_CLASSES, AutocastModeVariable
from tinydynamo.variables.base import VariableTracker, register_construction
from tinydynamo.variables.builtin import BuiltinVariable, is_foldable
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.ctx_manager import (
    GRAD_MODE_CLASSES,
    GradModeClassVariable,
    GradModeDecoratedFunctionVariable,
    GradModeVariable,
    unwrap_grad_mode_decorator,
)
from tinydynamo.variables.dicts import DictVariable, dict_key
from tinydynamo.variables.functions import (
    DisabledFunctionVariable,
    SkippedFunctionVariable,
    UserFunctionVariable,
    UserMethodVariable,
    is_library_function,
    is_torch_internal,
)
from tinydynamo.variables.iter import (
    DefaultDictVariable,
    OrderedDictVariable,
    PartialVariable,
    PureFunctionVariable,
    SetVariable,
)
from tinydynamo.variables.list_subclass import ListSubclassVariable, is_traceable_list_subclass
from tinydynamo.variables.lists import ListIteratorVariable, ListVariable, SizeVariable, TupleVariable
from tinydynamo.variables.misc import EnvironVariable, PythonModuleVariable
from tinydynamo.variables.nn_module import NNModuleVariable
from tinydynamo.variables.numpy import (
    NumpyFunctionVariable,
    is_numpy_array_type,
    torch_numpy_counterpart,
    wrap_numpy_input,
)
from tinydynamo.variables.sym_node import SYM_TYPES, SymNodeVariable
from tinydynamo.variables.tensor import TensorVariable
from tinydynamo.variables.torch import TorchVariable, is_torch_callable
from tinydynamo.variables.user_defined import UserDefinedObjectVariable

CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), range, slice,
                  torch.dtype, torch.device, torch.layout, torch.memory_format, enum.Enum)


class VariableBuilder:
    def __init__(self, tx, source: Source | None):
        self.tx = tx
        self.source = source

    def guard(self, kind: str, expected: Any = None) -> None:
        if self.source is not None:
            self.tx.output.add_guard(kind, self.source, expected)

    def wrap(self, value: Any) -> VariableTracker:

        src = self.source
        if isinstance(value, torch.Tensor):
            if torch_function.has_torch_function_override(value):  # its ops go through __torch_function__
                return torch_function.wrap_subclass_tensor(self.tx, value, src)
            return self.tx.output.lift_tensor(value, src)
        if isinstance(value, nn.Module):
            if is_unspecialized_module(src, self.tx.output.frame_state if self.tx is not None else None):
                self.guard("TYPE_MATCH", type(value))  # made anew for every call: any module of its type
                self.tx.output.add_guard("REGISTRY_GENERATION", None, registry.generation)
            else:
                self.guard("NN_MODULE", ModuleRef(value))  # weak: compiled code does not keep modules alive
            return NNModuleVariable(value, src)
        if is_numpy_array_type(value) and self.tx is not None:  # held as the tensor over its memory
            return wrap_numpy_input(self.tx, value, src)
        if type(value) is torch.Size:
            self.guard("CONSTANT_MATCH", value)
            return SizeVariable.of(value)
        if type(value) is int and src is not None and self.tx is not None:
            symbolic = self.tx.output.lift_int(value, src)  # an int argument that changed: a symbol
            if symbolic is not None:
                return symbolic
        if isinstance(value, CONSTANT_TYPES) and type(value) not in (tuple, list):
            self.guard("CONSTANT_MATCH", value)
            return ConstantVariable(value, src)
        if isinstance(value, numpy_constant_types()):  # np.dtype: by value; np.finfo / np.iinfo: by their dtype
            if isinstance(value, (np.finfo, np.iinfo)):
                self.guard("TYPE_MATCH", type(value))
                if src is not None:
                    self.tx.output.add_guard("CONSTANT_MATCH", AttrSource(src, "dtype"), value.dtype)
            else:
                self.guard("CONSTANT_MATCH", value)
            return ConstantVariable(value, src)
        if is_traceable_list_subclass(type(value)) and src is not None and self.tx is not None:
            return self.tx.output.side_effects.track_object_existing(value, src, lambda: self._wrap_list_subclass(value))
        if type(value) in (list, dict, collections.OrderedDict, collections.defaultdict, set) and src is not None \
                and self.tx is not None:
            # a mutable container from outside: one tracker per real object, so mutations made in the
            # frame are seen by every later read (and replayed after the graph: tinydynamo.side_effects)
            return self.tx.output.side_effects.track_object_existing(value, src, lambda: self._wrap_container(value))
        return self._wrap_container(value)

    def _wrap_list_subclass(self, value: list) -> VariableTracker:
        """A list subclass from outside (tinydynamo.variables.list_subclass): its type and length guarded,
        each item through its own source."""
        self.guard("TYPE_MATCH", type(value))
        self.guard("LENGTH", len(value))
        items = [VariableBuilder(self.tx, GetItemSource(self.source, i)).wrap(v) for i, v in enumerate(value)]
        return ListSubclassVariable(items, type(value), value, self.source)

    def _wrap_container(self, value: Any) -> VariableTracker:
        """Everything that is not a tensor, a constant or an nn.Module: the first of these wrappers
        that recognises ``value`` decides (their order matters: a partial is callable, a class a type)."""
        var = None
        wrappers = (self._wrap_collection, self._wrap_marked_callable, self._wrap_context_or_torch, self._wrap_function)
        if _has_python_getattr(value):  # asking it for marks (``__wrapped__``, ``__func__``...) would run user code
            wrappers = (self._wrap_collection,)
        for wrap in wrappers:
            var = wrap(value)
            if var is not None:
                break
        var = var if var is not None else self._wrap_other(value)
        counterpart = torch_numpy_counterpart(value)
        if counterpart is not None:  # np.mean & co.: traced on arrays (torch._numpy), as before on constants
            self.guard("ID_MATCH", value)
            return NumpyFunctionVariable(value, counterpart, var, self.source)
        return var

    def _wrap_collection(self, value: Any) -> VariableTracker | None:
        """Tuples, lists, named tuples, dicts (each item wrapped through its own source) and modules."""
        src = self.source
        if type(value) in (tuple, list) or (isinstance(value, tuple) and hasattr(type(value), "_fields")):
            if type(value) in (tuple, list):
                self.guard("SEQUENCE_LENGTH", (type(value), len(value)))
            else:
                self.guard("TYPE_MATCH", type(value))
            items = [VariableBuilder(self.tx, GetItemSource(src, i) if src else None).wrap(v) for i, v in enumerate(value)]
            if type(value) is list:
                return ListVariable(items, src)
            return TupleVariable(items, src, tuple_cls=None if type(value) is tuple else type(value))
        if type(value) in (dict, collections.OrderedDict, collections.defaultdict):
            make = functools.partial(DictVariable, source=src) if type(value) is dict else \
                functools.partial(OrderedDictVariable, source=src) if type(value) is collections.OrderedDict else \
                functools.partial(DefaultDictVariable, VariableBuilder(
                    self.tx, AttrSource(src, "default_factory") if src else None).wrap(value.default_factory), source=src)
            if all(type(k) in (str, int) for k in value):
                self.guard("DICT_KEYS", (type(value), tuple(value)))
                return make({k: VariableBuilder(self.tx, GetItemSource(src, k) if src else None).wrap(v)
                             for k, v in value.items()})
            # other keys (tensors, objects, tuples, torch.Size): keys and values read by position,
            # each key guarded through its own source (a constant's type and value, a tensor's metadata)
            self.guard("TYPE_MATCH", type(value))
            self.guard("LENGTH", len(value))
            pairs = [(VariableBuilder(self.tx, DictKeySource(src, i) if src else None).wrap(k),
                      VariableBuilder(self.tx, DictValueSource(src, i) if src else None).wrap(v))
                     for i, (k, v) in enumerate(value.items())]
            new = make({})
            new.add_pairs(self.tx, [(dict_key(k), v) for k, v in pairs])
            return new
        if type(value) is set and src is not None and all(type(v) in CONSTANT_TYPES for v in value):
            # a set of constants from outside (changed in place in the frame: replayed); the guard holds
            # a copy, as the set itself may change between calls
            self.guard("CONSTANT_MATCH", set(value))
            return SetVariable([ConstantVariable(v) for v in value], source=src)
        if isinstance(value, types.ModuleType):
            if src is not None and not value.__name__.startswith(("torch", "math", "operator")):
                self.guard("ID_MATCH", value)
            return PythonModuleVariable(value, src)
        return None

    def _wrap_marked_callable(self, value: Any) -> VariableTracker | None:
        """Compiled, disabled, partial, lru_cache-wrapped, polyfilled and builtin functions."""
        src = self.source
        if getattr(type(value), "_tinydynamo_compiled", False):  # a compiled function called from traced code
            self.guard("ID_MATCH", value)

            return VariableBuilder(self.tx, AttrSource(src, "_orig_fn") if src else None).wrap(value._orig_fn)
        if trace_rules.is_disabled(value):
            self.guard("ID_MATCH", value)
            return DisabledFunctionVariable(value, src)
        if type(value) is functools.partial:
            return self._wrap_partial(value)
        if isinstance(value, functools._lru_cache_wrapper) and isinstance(
                getattr(value, "__wrapped__", None), types.FunctionType):
            # @functools.lru_cache: the cache is not traced, the function under it is (as TorchDynamo
            # does); a call computes what the cache holds or would hold for pure functions
            self.guard("ID_MATCH", value)

            return VariableBuilder(self.tx, AttrSource(src, "__wrapped__") if src else None).wrap(value.__wrapped__)
        if isinstance(value, (torch.jit.ScriptFunction, torch.jit.ScriptModule)) and isinstance(
                getattr(value, "_torchdynamo_inline", None), types.FunctionType):
            # @torch.jit.script / torch.jit.trace keep the Python function as _torchdynamo_inline:
            # it is traced instead of the TorchScript object (as TorchDynamo does; deberta in
            # transformers < 5.2 scripts its position helpers)
            self.guard("ID_MATCH", value)

            return VariableBuilder(self.tx, AttrSource(src, "_torchdynamo_inline") if src else None).wrap(
                value._torchdynamo_inline)

        replacement = polyfilled.variable_for(value, src)  # a C/library function done another way
        if replacement is not None:
            self.guard("ID_MATCH", value)
            return replacement
        if _is_builtin(value):
            self.guard("ID_MATCH", value)
            return BuiltinVariable(value, src)
        return None

    def _wrap_context_or_torch(self, value: Any) -> VariableTracker | None:
        """Grad-mode and autocast context managers, and torch functions."""
        src = self.source
        if any(value is cls for cls in GRAD_MODE_CLASSES):  # torch.no_grad, ... (classes)
            self.guard("ID_MATCH", value)
            return GradModeClassVariable(value, src)

        if type(value) in AUTOCAST_CLASSES and src is not None:  # a torch.autocast passed to a resume function

            self.guard("TYPE_MATCH", type(value))
            for name in ("device", "fast_dtype", "_enabled", "_cache_enabled"):
                self.tx.output.add_guard("CONSTANT_MATCH", AttrSource(src, name), getattr(value, name))
            return AutocastModeVariable.of(value, src)
        if type(value) in (torch.no_grad, torch.enable_grad):  # a context manager passed to a resume function
            self.guard("TYPE_MATCH", type(value))
            return GradModeVariable(type(value) is torch.enable_grad, source=src)
        if is_torch_callable(value):
            self.guard("ID_MATCH", value)
            return TorchVariable(value, src)
        return None

    def _wrap_function(self, value: Any) -> VariableTracker | None:
        """Python functions and bound methods (inlined when called)."""
        src = self.source
        if isinstance(value, types.FunctionType):
            if getattr(value, "_tinydynamo_rebuilt", False) and src is not None:
                # a function the compiled code rebuilt from a frame's lambda/def: a new object each call,
                # the same code; its closure cells and defaults are read (and guarded) through sources
                self.tx.output.add_guard("ID_MATCH", AttrSource(src, "__code__"), value.__code__)
                return UserFunctionVariable(value, src)
            if value.__closure__ and not value.__dict__ and src is not None and self.tx is not None \
                    and not is_library_function(value):
                # a closure (made anew by each call of the function that defines it): guarded by its
                # code and, through sources as they are read, its cells and defaults (TorchDynamo's
                # CLOSURE_MATCH), so another closure of the same `def` reuses the entry; its empty
                # __dict__ too (a decorator's mark or __wrapped__ would change how it is traced)
                self.tx.output.add_guard("ID_MATCH", AttrSource(src, "__code__"), value.__code__)
                self.tx.output.add_guard("DICT_KEYS", AttrSource(src, "__dict__"), (dict, ()))
                output = self.tx.output
                return UserFunctionVariable(value, src, lambda: output.add_guard("ID_MATCH", src, value))
            self.guard("ID_MATCH", value)
            if getattr(value, "_dynamo_marked_constant", False):  # torch._dynamo.assume_constant_result:
                return PureFunctionVariable(value, src)
            decorated = unwrap_grad_mode_decorator(value)  # @torch.no_grad() def f(...)
            if decorated is not None:
                return GradModeDecoratedFunctionVariable(*decorated, src)
            if is_library_function(value):
                return SkippedFunctionVariable(value, src)
            return UserFunctionVariable(value, src)
        if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
            # a bound method: wrap its object, inline its function. Both are guarded through their own
            # sources (``obj.helper = MethodType(other, obj)`` keeps the type, changes ``__func__``), and
            # the function's defaults and closure through ``__func__`` as a plain function's are
            self_src = AttrSource(src, "__self__") if src is not None else None
            func_src = AttrSource(src, "__func__") if src is not None else None
            obj = VariableBuilder(self.tx, self_src).wrap(value.__self__)
            if func_src is not None and self.tx is not None:
                self.tx.output.add_guard("ID_MATCH", func_src, value.__func__)
            return UserMethodVariable(value.__func__, obj, func_src)
        return None

    def _wrap_other(self, value: Any) -> VariableTracker:
        """Classes, frozensets, ``os.environ``; any other object is a user-defined object."""
        src = self.source
        if isinstance(value, type):
            self.guard("ID_MATCH", value)
            return ConstantVariable(value, src)
        if isinstance(value, (frozenset,)):
            self.guard("CONSTANT_MATCH", value)
            return ConstantVariable(value, src)
        if value is os.environ:
            return EnvironVariable(src)

        if isinstance(value, typing_types()):  # Dict, Optional[int], list[int]: folded as constants
            self.guard("ID_MATCH", value)
            return ConstantVariable(value, src)
        if isinstance(value, (set, types.GeneratorType)):
            unimplemented(f"{type(value).__name__} values are not supported")
        self.guard("TYPE_MATCH", type(value))
        if src is not None and self.tx is not None:  # remembered for the not-aliased guards of attribute stores
            self.tx.output.side_effects.track_object_seen(value, src)
        return UserDefinedObjectVariable(value, src)

    def _wrap_partial(self, value: functools.partial) -> VariableTracker:
        """A ``functools.partial`` from outside the frame: its ``func``, ``args`` and ``keywords``
        are wrapped (and guarded) through their own sources, as TorchDynamo's
        ``FunctoolsPartialVariable`` does, so calling it inlines ``func`` with the merged arguments
        and a partial rebuilt with other contents recompiles."""
        src = self.source
        self.guard("TYPE_MATCH", type(value))

        def part(name: str, v: Any) -> VariableTracker:
            return VariableBuilder(self.tx, AttrSource(src, name) if src else None).wrap(v)

        args = part("args", value.args).unpack_var_sequence(self.tx)
        keywords = part("keywords", value.keywords)
        return PartialVariable(part("func", value.func), list(args), dict(keywords.items))


def _has_python_getattr(value: Any) -> bool:
    """An instance of a user class with its own Python ``__getattr__`` / ``__getattribute__`` (not a
    class, function or module): reading an attribute it lacks runs that code."""
    if isinstance(value, (type, types.FunctionType, types.MethodType, types.ModuleType, torch.nn.Module)):
        return False
    cls = type(value)
    hooks = [inspect.getattr_static(cls, name, None) for name in ("__getattr__", "__getattribute__")]
    # (torch's own objects with one, such as torch.ops packets, are recognised by the wrappers as before)
    return any(isinstance(fn, types.FunctionType) and not is_torch_internal(fn) for fn in hooks)


def _is_builtin(value: Any) -> bool:
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)) or any(value is t for t in (
            range, enumerate, zip, reversed, slice, int, float, bool, str, tuple, list, dict, type, set)):
        try:
            hash(value)
        except TypeError:
            return False
        module = getattr(value, "__module__", None)
        return module in ("builtins", "math", "_operator", "operator") or is_foldable(value) or \
            getattr(value, "__self__", None) is math
    return False


def wrap_constant_result(value: Any) -> VariableTracker:
    """Wrap the result of a folded (trace-time) computation: no source, so no guards."""
    if type(value) is torch.Size:
        return SizeVariable.of(value)
    if type(value) is tuple:
        return TupleVariable([wrap_constant_result(v) for v in value])
    if type(value) is list:
        return ListVariable([wrap_constant_result(v) for v in value])
    if type(value) is dict:
        return DictVariable({k: wrap_constant_result(v) for k, v in value.items()})
    if isinstance(value, CONSTANT_TYPES) or isinstance(value, type):
        return ConstantVariable(value)

    if isinstance(value, constant_object_types()):  # inspect.Signature, dataclasses.Field, numpy scalars...
        return ConstantVariable(value)
    if type(value) in (set, frozenset):
        return SetVariable([wrap_constant_result(v) for v in value], frozen=type(value) is frozenset)
    if isinstance(value, (map, filter, zip, enumerate, reversed, type(iter([])), type(iter(range(0))),
                          type(reversed([])))):
        return ListIteratorVariable([wrap_constant_result(v) for v in value])
    if isinstance(value, torch.Tensor):
        unimplemented("a tensor produced outside the graph at trace time")
    return VariableBuilder(None, None).wrap(value)


def wrap_fx_result(output, node, example: Any) -> VariableTracker:
    """Wrap what a graph node produced at trace time (its fake value) as a variable."""
    if isinstance(example, torch.Tensor):
        node.meta["example_value"] = example
        return TensorVariable(node, example)
    if isinstance(example, SYM_TYPES):  # a symbolic size (dynamic shapes)
        return SymNodeVariable.create(output, node, example)
    if isinstance(example, (tuple, list)) and any(isinstance(e, (torch.Tensor, *SYM_TYPES)) for e in example):
        node.meta["example_value"] = example
        items = []
        for i, e in enumerate(example):  # tensors get a getitem node; other items (None, ints) are constants
            if isinstance(e, torch.Tensor):
                item = output.graph.call_function(operator.getitem, (node, i))
                item.meta["example_value"] = e
                items.append(TensorVariable(item, e))
            elif isinstance(e, SYM_TYPES):
                items.append(SymNodeVariable.create(output, output.graph.call_function(operator.getitem, (node, i)), e))
            elif isinstance(e, CONSTANT_TYPES) or type(e) in (tuple, list, torch.Size):
                items.append(wrap_constant_result(e))
            else:
                unimplemented(f"op {node.target} returned a {type(e).__name__} inside a tuple")
        if type(example) is list:
            return ListVariable(items)
        return TupleVariable(items, tuple_cls=None if type(example) is tuple else type(example))
    # a non-tensor result (a size, a dtype, a bool from metadata): a constant, no node needed
    if not node.users:
        output.graph.erase_node(node)
    if isinstance(example, CONSTANT_TYPES) or type(example) in (tuple, list, torch.Size):
        return wrap_constant_result(example)
    unimplemented(f"op {node.target} returned {type(example).__name__}, which the graph cannot hold")


register_construction(build=lambda tx, value, source: VariableBuilder(tx, source).wrap(value),
                      build_constant=wrap_constant_result, build_fx=wrap_fx_result)
