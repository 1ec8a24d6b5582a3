"""NNModuleVariable: an ``nn.Module`` during tracing.

Calling it inlines its ``forward``; its parameters and buffers become graph inputs with
sources like ``L['self'].fc1.weight`` (as modern TorchDynamo lifts them), so AOT autograd
later sees them as ordinary primals. Plain attributes become guarded constants, submodules
are guarded by identity (NN_MODULE), and containers (Sequential, ModuleList, ModuleDict,
ParameterList) can be indexed and iterated.

Layer: above module_hooks, tensor, user_defined and trace_rules.
"""
from __future__ import annotations

import inspect
import types

from torch import nn
from torch.nn.modules import module as module_mod

from tinydynamo import trace_rules
from tinydynamo.distributed import native_call_reason
from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.source import AttrSource, ContainerItemSource, is_data_descriptor, module_member_source
from tinydynamo.variables.base import VariableTracker, check_plain_setattr
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import UserMethodVariable
from tinydynamo.variables.lists import ListIteratorVariable, ListVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.module_hooks import call_with_hooks
from tinydynamo.variables.tensor import TensorVariable
from tinydynamo.variables.user_defined import MISSING, class_attribute_variable


def _has_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or getattr(m, "_backward_hooks", None)
                or module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks)


#: methods answered directly from the real module (their nn.Module code uses sets and generators)
SPECIAL_METHODS = {"parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
                   "modules", "named_modules", "keys", "values", "items"}


class NNModuleVariable(VariableTracker):
    def __init__(self, module: nn.Module, source=None):
        super().__init__(source)
        self.module = module

    def python_type(self):
        return type(self.module)

    def truth(self, tx) -> bool:
        return True

    def key_identity(self):
        return self.module  # nn.Module hashes by identity (its NN_MODULE guard pins the object)

    def _child_source(self, name: str):
        if self.source is None:
            return None
        if name.isdigit() and isinstance(self.module, (nn.Sequential, nn.ModuleList, nn.ParameterList)):
            # L['self'].h[0] rather than getattr(..., '0'); indexing is by position, and a slice of a
            # Sequential keeps its children's keys ('1', '2' at positions 0, 1): index by position
            table = "_parameters" if isinstance(self.module, nn.ParameterList) else "_modules"
            return ContainerItemSource(self.source, list(getattr(self.module, table)).index(name), name, table)
        return module_member_source(self.module, self.source, name)

    def _wrap_child(self, tx, name: str, value) -> VariableTracker:
        return VariableTracker.build(tx, value, self._child_source(name))

    def var_getattr(self, tx, name: str) -> VariableTracker:

        m = self.module
        d = m.__dict__
        stored = tx.output.side_effects.load_attr(self, m, name)
        if stored is not None:  # written earlier in this frame (``self.count += 1``)
            return stored
        if name in SPECIAL_METHODS:
            return GetAttrVariable(self, name)  # answered by call_method, not by inlining nn.Module's code
        # Python's precedence: class data descriptors (properties), the instance __dict__, other class
        # attributes (a method ``linear`` wins over a submodule ``linear``), then Module.__getattr__'s tables
        cls = type(m)
        cls_attr = inspect.getattr_static(cls, name, MISSING)
        if cls_attr is not MISSING and is_data_descriptor(cls_attr):
            if isinstance(cls_attr, property):
                return class_attribute_variable(tx, self, cls, name, cls_attr)
            return self._wrap_child(tx, name, getattr(m, name))  # __class__, a __slots__ member
        if name in d:
            return self._wrap_child(tx, name, d[name])
        if cls_attr is not MISSING:
            if isinstance(cls_attr, (types.FunctionType, staticmethod, classmethod)) or hasattr(type(cls_attr), "__get__"):
                return class_attribute_variable(tx, self, cls, name, cls_attr)
            return self._wrap_child(tx, name, getattr(m, name))
        if cls.__getattr__ is not nn.Module.__getattr__:
            if not isinstance(cls.__getattr__, types.FunctionType):
                unimplemented(f"{cls.__name__} defines its own __getattr__ (reading {name!r})")
            # Python calls it for what the normal lookup did not find; its super().__getattr__ is
            # module_getattr (the parameter, buffer and submodule tables)
            return UserMethodVariable(cls.__getattr__, self).call_function(tx, [ConstantVariable(name)], {})
        return self.module_getattr(tx, name)

    def module_getattr(self, tx, name: str) -> VariableTracker:
        """``nn.Module.__getattr__``: a parameter, buffer or submodule by name, else AttributeError."""
        d = self.module.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d.get(table, {}):
                return self._wrap_child(tx, name, d[table][name])
        raise_observed(AttributeError, f"{type(self.module).__name__} has no attribute {name!r}")

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        """``self.count = ...`` / ``self.cache = t``: a plain attribute (or buffer), replayed after the
        graph with ``setattr``. Parameters and submodules change the module's structure: a graph break."""
        m = self.module
        if name in m._parameters or name in m._modules or isinstance(value, NNModuleVariable):
            unimplemented(f"assigning parameter/submodule {name!r} of {type(m).__name__} (changes the module)")
        if name in m._buffers and not isinstance(value, TensorVariable):
            unimplemented(f"assigning a non-tensor to buffer {name!r} of {type(m).__name__}")
        check_plain_setattr(m, name, nn.Module.__setattr__)
        tx.output.side_effects.store_attr(self, m, name, value)

    def call_function(self, tx, args, kwargs):

        if trace_rules.is_disabled(self.module.__dict__.get("forward")):
            unimplemented(f"{type(self.module).__name__}.forward is marked tinydynamo.disable")
        native = native_call_reason(self.module)  # FSDP's hooks, DDP's reducer: not traced
        if native is not None:
            unimplemented(native)
        if _has_hooks(self.module):
            return call_with_hooks(tx, self, args, kwargs)
        if self.source is not None:  # a hook registered later would run around forward: a miss
            tx.output.add_guard("NO_HOOKS", self.source)
        tx.output.add_guard("NO_GLOBAL_HOOKS", None)
        return self.var_getattr(tx, "forward").call_function(tx, args, kwargs)  # also a @no_grad() forward

    # ---- containers and iteration ------------------------------------------------------------------
    def _items(self, tx=None) -> list[tuple[str, object]]:
        """The container's entries; with ``tx``, guarded by their names (an appended or deleted
        layer changes what a loop over the container unrolls to: a miss)."""
        m = self.module
        table = "_parameters" if isinstance(m, (nn.ParameterList, nn.ParameterDict)) else "_modules"
        entries = getattr(m, table)
        if tx is not None and self.source is not None:
            tx.output.add_guard("DICT_KEYS", AttrSource(self.source, table), (type(entries), tuple(entries)))
        return list(entries.items())

    def unpack_var_sequence(self, tx):
        m = self.module
        if isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
            return [ConstantVariable(k) for k, _ in self._items(tx)]
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ParameterList)):
            return [self._wrap_child(tx, k, v) for k, v in self._items(tx)]
        unimplemented(f"iterating over {type(m).__name__}")

    def call_method(self, tx, name, args, kwargs):
        m = self.module
        if name == "__len__":
            return ConstantVariable(len(self._items(tx)))
        if name == "__getitem__" and len(args) == 1:
            key = args[0].as_python_constant()
            if isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
                return self._wrap_child(tx, key, m[key])
            items = self._items(tx)
            if isinstance(key, slice):
                children = [self._wrap_child(tx, k, v) for k, v in items[key]]
                return SequentialSliceVariable(children) if isinstance(m, nn.Sequential) else ListVariable(children)
            k, v = items[key]
            return self._wrap_child(tx, k, v)
        if name == "__contains__" and len(args) == 1:
            self._items(tx)  # guards the names
            return ConstantVariable(args[0].as_python_constant() in m)
        if name in ("keys", "values", "items") and isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
            pairs = [(k, self._wrap_child(tx, k, v)) for k, v in self._items(tx)]
            if name == "keys":
                return ListVariable([ConstantVariable(k) for k, _ in pairs])
            if name == "values":
                return ListVariable([v for _, v in pairs])
            return ListVariable([TupleVariable([ConstantVariable(k), v]) for k, v in pairs])
        named = {"named_parameters": "parameters", "named_buffers": "buffers", "named_children": "children",
                 "named_modules": "modules"}
        if name in named or name in named.values():
            kind = named.get(name, name)
            real = dict(getattr(m, "named_" + kind)(*[a.as_python_constant() for a in args],
                                                    **{k: v.as_python_constant() for k, v in kwargs.items()}))
            self._guard_tables(tx, kind)
            pairs = [(k, self._wrap_dotted(tx, k, v)) for k, v in real.items()]
            if name in named:
                return ListIteratorVariable([TupleVariable([ConstantVariable(k), v]) for k, v in pairs])
            return ListIteratorVariable([v for _, v in pairs])
        if name == "forward" or name == "__call__":
            return self.call_function(tx, args, kwargs)
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def _guard_tables(self, tx, kind: str) -> None:
        """Guard the names in the tables ``parameters()`` / ``buffers()`` / ``children()`` /
        ``modules()`` read, through every submodule: another module of the class, or this one with a
        parameter registered since, lists other entries (a miss)."""
        if self.source is None:
            return
        tables = {"parameters": ("_parameters",), "buffers": ("_buffers",)}.get(kind, ())
        todo = [(self.source, self.module)]
        while todo:
            source, module = todo.pop()
            for table in (*tables, "_modules"):
                entries = module.__dict__.get(table)
                if entries is not None:
                    tx.output.add_guard("DICT_KEYS", AttrSource(source, table), (type(entries), tuple(entries)))
            if kind != "children":
                todo += [(module_member_source(module, source, k), child)
                         for k, child in module._modules.items() if child is not None]

    def _wrap_dotted(self, tx, dotted: str, value) -> VariableTracker:
        source, owner = self.source, self.module
        if dotted == "":
            return self
        for part in dotted.split("."):
            source = module_member_source(owner, source, part) if source is not None else None
            owner = getattr(owner, part)
        return VariableTracker.build(tx, value, source)

    #: ``(cls, args, kwargs)`` of a module built in the frame from constants (objects.py), else None
    construction = None

    def reconstruct(self, codegen) -> str:
        if self.source is None and self.construction is not None:
            return codegen.shared(self, lambda: self._reconstruct_construction(codegen))
        if self.source is None:
            unimplemented("returning a module with no source")
        return codegen.source_expr(self.source)

    def _reconstruct_construction(self, codegen) -> str:
        """A module built in the frame leaves it as a new one, built again by the same call (each call of
        the frame makes its own, as in eager), if the trace left it as that call makes it."""
        cls, args, kwargs = self.construction
        if not _same_state(self.module, cls(*args, **kwargs)):
            unimplemented(f"returning a {cls.__name__} built in the frame and changed since")
        parts = [codegen.constant(a, "arg") for a in args] + [f"{k}={codegen.constant(v, 'arg')}" for k, v in kwargs.items()]
        return f"{codegen.constant(cls, 'cls')}({', '.join(parts)})"

    def __repr__(self) -> str:
        return f"NNModuleVariable({type(self.module).__name__}, {self.source})"



def _same_state(a: nn.Module, b: nn.Module) -> bool:
    """Two modules with equal ``__dict__`` entries (no tensors: such a module has no parameters or buffers)."""
    if vars(a).keys() != vars(b).keys():
        return False
    try:
        return all(v is vars(b)[k] or bool(v == vars(b)[k]) for k, v in vars(a).items())
    except Exception:  # noqa: BLE001 - values that do not compare: not known to be the same
        return False


class SequentialSliceVariable(VariableTracker):
    """``seq[1:3]``: eager builds a new ``nn.Sequential`` of those children, usually to call it at
    once. Tracked as its children; a call chains them as ``Sequential.forward`` does."""

    def __init__(self, children: list[VariableTracker]):
        super().__init__()
        self.children = children

    def call_function(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            unimplemented("calling a slice of nn.Sequential with other than one positional input")
        value = args[0]
        for child in self.children:
            value = child.call_function(tx, [value], {})
        return value

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__" and not args:
            return ConstantVariable(len(self.children))
        if name == "__getitem__" and len(args) == 1 and isinstance(args[0].as_python_constant(), int):
            return self.children[args[0].as_python_constant()]
        unimplemented(f"{name} on a slice of nn.Sequential")

    def unpack_var_sequence(self, tx):
        return list(self.children)

    def reconstruct(self, codegen) -> str:
        unimplemented("a slice of nn.Sequential that leaves the compiled frame")
