"""Graded tests must leave the interpreter as they found it, and so must the code they grade.

An answer that installs a trace function and never removes it, leaves grad mode off, or keeps
a dispatch mode or a patched handler active breaks whatever runs next, in a notebook or in the
compiler. After every graded test this fixture compares the global state the course touches
with what it was before, and fails the test if anything changed.
"""
from __future__ import annotations

import sys

import pytest


def _public_settings(obj) -> dict:
    return {k: v for k, v in vars(obj).items()
            if not k.startswith("_") and not callable(v) and not isinstance(v, type(sys))}


def global_state() -> dict:
    """What a graded answer must restore: trace functions, torch modes and flags, compiler config."""
    state = {"sys.gettrace()": sys.gettrace(), "sys.getprofile()": sys.getprofile()}
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        state["torch.is_grad_enabled()"] = torch.is_grad_enabled()
        state["torch.get_default_dtype()"] = torch.get_default_dtype()
        state["active TorchFunctionModes"] = [type(m).__name__ for m in _get_current_function_mode_stack()]
        state["active TorchDispatchModes"] = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
    config = sys.modules.get("tinydynamo.config")
    if config is not None:
        state.update({f"tinydynamo.config.{k}": getattr(config, k) for k in config._SETTINGS})
    handlers = sys.modules.get("tinydynamo.symbolic_convert")
    if handlers is not None:
        state["tinydynamo opcode handlers"] = dict(handlers.OPCODE_HANDLERS)
    guards = sys.modules.get("tinydynamo.guards")
    if guards is not None:
        state["tinydynamo guard kinds"] = dict(guards.GUARD_KINDS)
    inductor = sys.modules.get("tininductor.config")
    if inductor is not None:
        state.update({f"tininductor.config.{k}": v for k, v in _public_settings(inductor).items()})
        state.update({f"tininductor.config.triton.{k}": v for k, v in _public_settings(inductor.triton).items()})
    return state


@pytest.fixture(autouse=True)
def global_state_is_restored():
    before = global_state()
    yield
    after = global_state()
    changed = [k for k in before if k in after and before[k] != after[k]]
    if changed:
        if "sys.gettrace()" in changed:  # put back what is cheap to put back, so later tests are not affected
            sys.settrace(before["sys.gettrace()"])
        if "torch.is_grad_enabled()" in changed:
            sys.modules["torch"].set_grad_enabled(before["torch.is_grad_enabled()"])
        detail = "; ".join(f"{k}: {before[k]!r} before, {after[k]!r} after" for k in changed[:3]
                           if not isinstance(before[k], dict))
        names = ", ".join(changed)
        pytest.fail(f"global state not restored ({names}): {detail} -- restore what you change, "
                    "also when an error is raised (try/finally or a with block)", pytrace=False)
