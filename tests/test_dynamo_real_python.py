"""Python that real models (transformers, timm, torchvision) use, captured like TorchDynamo captures it.

Each test compares with eager and, where meaningful, with torch.compile's graph count on the same code
(wrappers with ``__wrapped__``, third-party code traced, ``super()``, ``fn.__code__``, attribute
precedence, ops traced twice after a break in an inlined call, references kept by compiled code...).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import sys
import textwrap
import weakref

import pytest
import torch
from torch import nn

import tinydynamo
from tinydynamo.testing import CompileCounter
from tinydynamo.variables.functions import is_library_function, is_torch_internal


def tiny_count(fn, *args, fullgraph=False):
    """(result, graphs) of ``fn(*args)`` through tinydynamo with a counting backend (fresh cache)."""
    tinydynamo.reset()
    cnt = CompileCounter()
    out = tinydynamo.compile(fn, backend=cnt, fullgraph=fullgraph)(*args)
    return out, cnt.frame_count


def torch_count(fn, *args):
    """(result, graphs) of ``fn(*args)`` through torch.compile with torch's CompileCounter."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter as TorchCounter

    torch._dynamo.reset()
    cnt = TorchCounter()
    out = torch.compile(fn, backend=cnt)(*args)
    torch._dynamo.reset()
    return out, cnt.frame_count


def check_like_torch(fn, *args, graphs=1, fullgraph=True):
    """fn through tinydynamo equals eager, with ``graphs`` graphs, as many as torch.compile makes."""
    expected = fn(*args)
    out, n = tiny_count(fn, *args, fullgraph=fullgraph)
    torch.testing.assert_close(out, expected)
    _, n_torch = torch_count(fn, *args)
    assert n == graphs == n_torch, f"tinydynamo {n} graphs, torch.compile {n_torch}, expected {graphs}"


# ---- (1) a decorator's wrapper(self, *args, **kwargs) with __wrapped__ --------------------------------
def _hf_style(func):
    @functools.wraps(func)  # sets __wrapped__: inspect.signature(wrapper) would report func's parameters
    def wrapper(self, *args, **kwargs):
        kwargs.setdefault("scale", 2.0)
        return func(self, *args, **kwargs)

    return wrapper


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @_hf_style
    def forward(self, x, scale=1.0):
        return self.fc(x) * scale


def test_forward_wrapped_by_a_decorator_binds_the_wrappers_own_parameters():
    torch.manual_seed(0)
    m, x = Wrapped(), torch.randn(2, 4)
    check_like_torch(m, x)
    out, n = tiny_count(m, x)
    torch.testing.assert_close(out, m.fc(x) * 2.0)


# ---- (2) library code: decided by file location, third-party Python is traced ------------------------
def test_standard_library_is_skipped_and_torch_is_not_library():
    import inspect

    assert is_library_function(inspect.signature)
    assert not is_library_function(torch.nn.functional.relu)  # torch's own: graph ops, not "library"
    assert is_torch_internal(torch.nn.functional.relu)
    assert not is_library_function(tiny_count)  # this test file: user code


def test_installed_third_party_python_is_traced():
    from tests.model_zoo import import_torchvision

    tv = import_torchvision()
    if tv is None:
        pytest.skip("torchvision is not installed")
    from torchvision.ops.misc import Conv2dNormActivation

    assert not is_library_function(Conv2dNormActivation.forward)
    torch.manual_seed(0)
    m = Conv2dNormActivation(3, 4).eval()
    check_like_torch(m, torch.randn(1, 3, 8, 8))


@pytest.fixture
def torchfoo(tmp_path, monkeypatch):
    """A user package whose name starts with "torch": user code, compiled after a graph break."""
    pkg = tmp_path / "torchfoo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import torch

        def helper(x):
            return torch.sin(x) * 2

        def helper_with_break(x, log):
            y = torch.cos(x) + 1
            log(y)  # a call tinydynamo cannot trace: a graph break
            return y * 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import torchfoo as mod

    yield mod
    sys.modules.pop("torchfoo", None)


def test_user_package_named_torch_something_is_user_code(torchfoo):
    assert not is_torch_internal(torchfoo.helper) and not is_library_function(torchfoo.helper)

    def f(x):
        return torchfoo.helper(x) + 1

    check_like_torch(f, torch.randn(5))


def test_a_function_called_at_a_graph_break_gets_its_own_graphs(torchfoo):
    log = tinydynamo.disable(lambda t: None)

    def f(x, pkg, log):  # arguments, not closure variables: a frame with free variables is not resumable yet
        return pkg.helper_with_break(x + 1, log) - 1

    x = torch.randn(5)
    out, n = tiny_count(f, x, torchfoo, log)
    torch.testing.assert_close(out, f(x, torchfoo, log))
    # f up to the call, helper_with_break before and after its own break, f's resume: not one eager call
    assert n >= 3, f"{n} graphs: the called function ran eagerly"


# ---- (3) fn.__code__, fn.__module__, zero-argument super(), f-strings, import ------------------------------
def _scaled(x):
    return x * 2


class Base(nn.Module):
    def forward(self, x):
        return x + 1

    def extra(self, x):
        return x * 3


class Child(Base):
    def forward(self, x):
        n = len(_scaled.__code__.co_varnames) + len(_scaled.__module__)
        label = f"{type(self).__name__}-{n:02d}"
        import math

        return super().forward(x) * n + super().extra(x) * len(label) + math.pi


def test_function_attributes_super_fstrings_and_import_are_traced():
    check_like_torch(Child(), torch.randn(3))


# ---- (4) a break inside an inlined call must not run the ops before it twice ----------------------------
@tinydynamo.disable
def _tiny_opaque(t):
    return t


@torch._dynamo.disable
def _torch_opaque(t):
    return t


class BreaksAfterBatchNorm(nn.Module):
    def __init__(self, opaque):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.opaque = opaque

    def forward(self, x):
        y = self.bn(x)  # num_batches_tracked += 1, running stats updated
        return self.opaque(y) * 2  # a graph break inside this (inlined) call


class Outer(nn.Module):
    def __init__(self, opaque):
        super().__init__()
        self.inner = BreaksAfterBatchNorm(opaque)

    def forward(self, x):
        return self.inner(x + 1) - 1


def test_ops_before_a_break_in_an_inlined_call_run_once():
    torch.manual_seed(0)
    eager = Outer(_tiny_opaque).train()
    compiled_model = copy.deepcopy(eager)
    x = torch.randn(8, 4)
    expected = eager(x)
    out, n = tiny_count(compiled_model, x)
    torch.testing.assert_close(out, expected)
    assert compiled_model.inner.bn.num_batches_tracked.item() == eager.inner.bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(compiled_model.inner.bn.running_mean, eager.inner.bn.running_mean)
    torch.testing.assert_close(compiled_model.inner.bn.running_var, eager.inner.bn.running_var)
    torch_model = Outer(_torch_opaque).train()
    torch_model.load_state_dict(copy.deepcopy(eager).state_dict())
    torch_model.inner.bn.num_batches_tracked.zero_()
    _, n_torch = torch_count(torch_model, x)
    assert torch_model.inner.bn.num_batches_tracked.item() == 1
    assert n == n_torch, f"tinydynamo {n} graphs, torch.compile {n_torch}"


# ---- (5) attribute lookup follows Python's precedence ---------------------------------------------------
class MethodShadowsSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)  # Module.__setattr__ puts it in _modules: found only by Module.__getattr__

    def linear(self, x):  # a class attribute: Python finds this first
        return x * 5

    @staticmethod
    def double(x):
        return x * 2

    @classmethod
    def name_len(cls):
        return len(cls.__name__)

    @property
    def offset(self):
        return 7

    def forward(self, x):
        return self.linear(x) + self.double(x) + self.name_len() + self.offset


def test_attribute_lookup_follows_python_precedence():
    m, x = MethodShadowsSubmodule(), torch.randn(2, 4)
    torch.testing.assert_close(m(x), x * 5 + x * 2 + len("MethodShadowsSubmodule") + 7)  # what Python does
    check_like_torch(m, x)


# ---- try/except, dataclass outputs, os.environ ------------------------------------------------------------
class Registry(dict):
    def get(self, key):  # like transformers' registries: super().get of a dict subclass
        return super().get(key) or 1.0


REGISTRY = Registry(scale=3.0)


def _lookup(table, key):
    try:
        return table[key]
    except KeyError:
        return -1.0


@dataclasses.dataclass
class Output:
    value: torch.Tensor
    extra: torch.Tensor | None = None


def test_caught_exception_dict_subclass_and_dataclass_output():
    def f(x):
        a = _lookup({"a": 2.0}, "a") + _lookup({"a": 2.0}, "b")
        out = Output(x * a * REGISTRY.get("scale") * REGISTRY.get("missing"))
        out.extra = out.value + 1
        return out

    x = torch.randn(3)
    expected = f(x)
    got, n = tiny_count(f, x, fullgraph=True)
    assert type(got) is Output and n == 1
    torch.testing.assert_close(got.value, expected.value)
    torch.testing.assert_close(got.extra, expected.extra)


def test_environment_reads_are_guarded(monkeypatch):
    import os

    def f(x):
        return x * 2 if os.environ.get("TINY_TEST_FLAG", "0") == "1" else x * 3

    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    monkeypatch.delenv("TINY_TEST_FLAG", raising=False)
    torch.testing.assert_close(compiled(x), x * 3)
    monkeypatch.setenv("TINY_TEST_FLAG", "1")
    torch.testing.assert_close(compiled(x), x * 2)  # the guard sees the change: recompiled
    assert cnt.frame_count == 2


def test_number_augmented_by_a_tensor():
    def f(x):
        total = 0
        for i in range(3):
            total += x * i
        return total

    check_like_torch(f, torch.randn(4))


# ---- (6) references, deepcopy, torch.cond, named_parameters under fullgraph ---------------------------------
def test_compiled_function_keeps_no_reference_to_its_module_or_inputs():
    def f(x, mod):
        return mod(x) + 1

    compiled = tinydynamo.compile(f, backend="eager")
    mod, x = nn.Linear(3, 3), torch.randn(2, 3)
    compiled(x, mod)
    refs = weakref.ref(mod), weakref.ref(x)
    del mod, x
    gc.collect()
    assert [r() is None for r in refs] == [True, True]
    torch.testing.assert_close(compiled(torch.ones(1, 3), nn.Identity()), torch.ones(1, 3) + 1)  # new module: recompiles


def test_compiled_module_can_be_deep_copied():
    torch.manual_seed(0)
    compiled = tinydynamo.compile(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), backend="eager")
    x = torch.randn(2, 3)
    compiled(x)
    copied = copy.deepcopy(compiled)
    assert isinstance(copied, tinydynamo.OptimizedModule) and copied._orig_mod is not compiled._orig_mod
    torch.testing.assert_close(copied(x), compiled(x))


def test_torch_cond_runs_correctly():
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))

    for x in (torch.ones(3), -torch.ones(3)):
        tinydynamo.reset()
        torch.testing.assert_close(tinydynamo.compile(f, backend="eager")(x), f(x))


def test_named_parameters_in_forward_under_fullgraph():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(3, 3)

        def forward(self, x):
            n = sum(p.numel() for _, p in self.named_parameters())
            return self.l(x) * n

    check_like_torch(M(), torch.randn(2, 3))


def test_signature_of_a_bound_method_leaves_out_self():
    """transformers' apply_chunking_to_forward counts ``inspect.signature(self.ff_chunk).parameters``
    and raises if it is not one: folding the signature of the plain function said two (BERT ran
    100% eagerly)."""
    import inspect

    class Layer(nn.Module):
        def chunk(self, x):
            return x * 2

        def forward(self, x):
            if len(inspect.signature(self.chunk).parameters) != 1:
                raise ValueError("wrong parameter count")
            return self.chunk(x) + 1

    x = torch.randn(3)
    out, n = tiny_count(Layer(), x, fullgraph=True)
    torch.testing.assert_close(out, x * 2 + 1)
    assert n == 1
