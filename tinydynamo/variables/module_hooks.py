"""Forward pre-hooks and forward hooks of an ``nn.Module``, inlined around its ``forward``.

``module(x)`` runs ``nn.Module._call_impl``: each forward pre-hook may replace the arguments, then
``forward``, then each forward hook may replace the output. Tracing does the same with the hook
functions inlined, so the hooks' ops land in the graph. The hook dicts are read through their
sources (``L['self']._forward_hooks``), which guards their keys: adding or removing a hook later
recompiles. Backward hooks and global hooks are not captured (Unsupported).

Layer: beside nn_module, above functions, lists and dicts.
"""
from __future__ import annotations

from torch.nn.modules import module as module_mod

from tinydynamo.exc import unimplemented
from tinydynamo.source import AttrSource
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.dicts import DictVariable
from tinydynamo.variables.functions import UserMethodVariable
from tinydynamo.variables.lists import TupleVariable


def _hooks(tx, module_var, name: str) -> list[tuple[object, VariableTracker]]:
    """(hook id, hook variable) for the module's ``name`` dict, guarded on its keys when it has a source."""
    real = getattr(module_var.module, name)
    if module_var.source is None:
        return [(k, VariableTracker.build(tx, v)) for k, v in real.items()]
    wrapped = VariableTracker.build(tx, real, AttrSource(module_var.source, name))
    return list(wrapped.items.items())


def call_with_hooks(tx, module_var, args: list, kwargs: dict) -> VariableTracker:
    m = module_var.module
    if getattr(m, "_backward_hooks", None) or getattr(m, "_backward_pre_hooks", None) or \
            module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks or \
            module_mod._global_backward_hooks or getattr(module_mod, "_global_backward_pre_hooks", None):
        unimplemented(f"{type(m).__name__} has backward or global hooks (not captured)")
    for hook_id, hook in _hooks(tx, module_var, "_forward_pre_hooks"):
        if hook_id in m._forward_pre_hooks_with_kwargs:
            result = hook.call_function(tx, [module_var, TupleVariable(list(args)), _dict(kwargs)], {})
            if not (result.is_python_constant() and result.as_python_constant() is None):
                new_args, new_kwargs = result.unpack_var_sequence(tx)
                args, kwargs = new_args.unpack_var_sequence(tx), dict(new_kwargs.items)
            continue
        result = hook.call_function(tx, [module_var, TupleVariable(list(args))], {})
        if not (result.is_python_constant() and result.as_python_constant() is None):
            args = result.unpack_var_sequence(tx) if isinstance(result, TupleVariable) else [result]
    forward = type(m).forward
    output = UserMethodVariable(forward, module_var).call_function(tx, list(args), kwargs)
    for hook_id, hook in _hooks(tx, module_var, "_forward_hooks"):
        if hook_id in m._forward_hooks_with_kwargs:
            result = hook.call_function(tx, [module_var, TupleVariable(list(args)), _dict(kwargs), output], {})
        else:
            result = hook.call_function(tx, [module_var, TupleVariable(list(args)), output], {})
        if not (result.is_python_constant() and result.as_python_constant() is None):
            output = result
    return output


def _dict(kwargs: dict) -> VariableTracker:
    return DictVariable(dict(kwargs))
