"""Reliability: guards that see every change made between two calls (compared with eager)."""
from __future__ import annotations

import functools
import types

import pytest
import torch
from torch import nn

from tests.reliability import BACKENDS, CASES, case, check

X = torch.arange(4.0)


@case("guards")
def case_defaults(C, rec):
    def f(x, k=2.0):
        return x * k
    g = C(f)
    rec(g(X))
    f.__defaults__ = (3.0,)
    rec(g(X))


@case("guards")
def case_kwdefaults(C, rec):
    def f(x, *, k=2.0):
        return x * k
    g = C(f)
    rec(g(X))
    f.__kwdefaults__ = {"k": 5.0}
    rec(g(X))


class Scaler:
    def __init__(self):
        self.k = 2.0

    def scale(self, x):
        return x * self.k

    @property
    def bias(self):
        return self.k + 1.0


def _use_scale(obj, x):
    return obj.scale(x) + 1


@case("guards")
def case_method_replaced_on_instance(C, rec):
    obj = Scaler()
    g = C(_use_scale)
    rec(g(obj, X))
    obj.scale = lambda x: x * 10
    rec(g(obj, X))
    del obj.scale
    rec(g(obj, X))


@case("guards")
def case_method_monkeypatched_on_class(C, rec):
    class S(Scaler):
        pass
    obj = S()
    g = C(_use_scale)
    rec(g(obj, X))
    S.scale = lambda self, x: x - 7
    rec(g(obj, X))


def _use_bias(obj, x):
    return x + obj.bias


@case("guards")
def case_property_result_changes(C, rec):
    obj = Scaler()
    g = C(_use_bias)
    rec(g(obj, X))
    obj.k = 4.0
    rec(g(obj, X))


@case("guards")
def case_property_replaced_on_class(C, rec):
    class S(Scaler):
        pass
    obj = S()
    g = C(_use_bias)
    rec(g(obj, X))
    S.bias = property(lambda self: -100.0)
    rec(g(obj, X))


def _use_flag(obj, x):
    if getattr(obj, "flag", False):
        return x + 1
    return x - 1


@case("guards")
def case_getattr_default_absent_then_set(C, rec):
    obj = Scaler()
    g = C(_use_flag)
    rec(g(obj, X))
    obj.flag = True
    rec(g(obj, X))
    del obj.flag
    rec(g(obj, X))


def _use_hasattr(obj, x):
    if hasattr(obj, "extra"):
        return x * obj.extra
    return x


@case("guards")
def case_hasattr_absent_then_set(C, rec):
    obj = Scaler()
    g = C(_use_hasattr)
    rec(g(obj, X))
    obj.extra = 3.0
    rec(g(obj, X))


@case("guards")
def case_class_attr_shadowed_by_instance(C, rec):
    class Cfg:
        k = 2.0
    obj = Cfg()
    g = C(lambda o, x: x * o.k)
    rec(g(obj, X))
    obj.k = 5.0
    rec(g(obj, X))
    Cfg.k = 7.0
    rec(g(obj, X))
    del obj.k
    rec(g(obj, X))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) * (2.0 if self.training else 3.0)


@case("guards")
def case_module_training_flag(C, rec):
    torch.manual_seed(0)
    m = Net()
    g = C(m)
    with torch.no_grad():
        rec(g(X))
        m.eval()
        rec(g(X))
        m.train()
        rec(g(X))
        m.lin.eval()
        rec(g(X))


@case("guards")
def case_forward_replaced_on_instance(C, rec):
    torch.manual_seed(0)
    m = Net()
    g = C(m)
    with torch.no_grad():
        rec(g(X))
        m.forward = lambda x: x * 100
        rec(g(X))


@case("guards")
def case_submodule_method_replaced(C, rec):
    torch.manual_seed(0)
    m = Net()
    g = C(m)
    with torch.no_grad():
        rec(g(X))
        m.lin.forward = lambda x: x[:3] - 1
        rec(g(X))


@case("guards")
def case_module_attr_absent_then_set(C, rec):
    class M(nn.Module):
        def forward(self, x):
            if getattr(self, "scale", None) is not None:
                return x * self.scale
            return x + 1
    m = M()
    g = C(m)
    rec(g(X))
    m.scale = 4.0
    rec(g(X))


def _mutate_first(a, b):
    a.add_(1)
    return a + b


@case("guards")
def case_same_tensor_twice(C, rec):
    g = C(_mutate_first)
    a, b = X.clone(), X.clone()
    rec(g(a, b))
    c = X.clone()
    rec(g(c, c))
    rec(c)


@case("guards")
def case_overlapping_views(C, rec):
    g = C(_mutate_first)
    rec(g(X.clone()[0:3], X.clone()[1:4]))
    base = X.clone()
    rec(g(base[0:3], base[1:4]))
    rec(base)


@case("guards")
def case_views_of_one_base_disjoint(C, rec):
    g = C(_mutate_first)
    base = X.clone()
    rec(g(base[0:2], base[2:4]))
    rec(base)
    base = torch.arange(6.0)
    rec(g(base[0:2], base[1:3]))
    rec(base)


@case("guards")
def case_closure_cells(C, rec):
    def make(k):
        def f(x):
            return x * k
        return f
    f2, f3 = C(make(2.0)), C(make(3.0))
    rec(f2(X))
    rec(f3(X))
    rec(f2(X))


@case("guards")
def case_cache_entries_swap(C, rec):
    class A:
        k = 1.0

    class B:
        k = 2.0
    g = C(lambda o, x: x * o.k)
    a, b = A(), B()
    rec(g(a, X))
    rec(g(b, X))
    A.k, B.k = 5.0, 6.0
    rec(g(a, X))
    rec(g(b, X))


@case("guards")
def case_global_rebound(C, rec):
    global _SCALE
    _SCALE = 2.0
    g = C(_use_global)
    rec(g(X))
    _SCALE = 3.0
    rec(g(X))


_SCALE = 2.0


def _use_global(x):
    return x * _SCALE


@case("guards")
def case_dict_key_absent_then_set(C, rec):
    cfg = {"a": 1.0}
    g = C(lambda d, x: x * d.get("b", 2.0))
    rec(g(cfg, X))
    cfg["b"] = 5.0
    rec(g(cfg, X))


@case("guards")
def case_requires_grad_changes(C, rec):
    g = C(lambda x: (x * 2).sum())
    x = X.clone()
    rec(g(x))
    x.requires_grad_(True)
    out = g(x)
    rec(out)
    out.backward()
    rec(x.grad)


class Pair(nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(x) * self.k


@case("guards")
def case_two_instances_swap_submodules(C, rec):
    torch.manual_seed(0)
    a, b = Pair(2.0), Pair(3.0)
    ga, gb = C(a), C(b)  # one code object (Pair.forward): two cache entries
    with torch.no_grad():
        rec(ga(X))
        rec(gb(X))
        a.inner, b.inner = b.inner, a.inner
        a.k, b.k = b.k, a.k
        rec(ga(X))
        rec(gb(X))


@case("guards")
def case_module_list_appended(C, rec):
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x
    torch.manual_seed(0)
    m = Stack()
    g = C(m)
    with torch.no_grad():
        rec(g(X))
        m.layers.append(nn.Linear(4, 4))
        rec(g(X))
        del m.layers[0]
        rec(g(X))


@case("guards")
def case_tied_parameters_then_untied(C, rec):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            return self.b(self.a(x))
    torch.manual_seed(0)
    m = Tied()
    m.b.weight = m.a.weight
    g = C(m)
    x = X.clone().requires_grad_()
    out = g(x).sum()
    out.backward()
    rec(out)
    rec(m.a.weight.grad)
    m.b.weight = nn.Parameter(torch.ones(4, 4))
    out = g(x).sum()
    rec(out)


@case("guards")
def case_helper_function_replaced(C, rec):
    global _helper
    saved = _helper
    try:
        g = C(_calls_helper)
        rec(g(X))
        _helper = lambda x: x - 100  # noqa: E731
        rec(g(X))
    finally:
        _helper = saved


def _helper(x):
    return x * 2


def _calls_helper(x):
    return _helper(x) + 1


@case("guards")
def case_inlined_defaults_rebound(C, rec):
    def scale(x, k=2.0):
        return x * k

    def f(x):
        return scale(x) + 1
    g = C(f)
    rec(g(X))
    scale.__defaults__ = (10.0,)
    rec(g(X))


@case("guards")
def case_object_class_swapped(C, rec):
    class A:
        def val(self):
            return 1.0

    class B:
        def val(self):
            return 2.0
    o = A()
    g = C(lambda o, x: x * o.val())
    rec(g(o, X))
    o.__class__ = B
    rec(g(o, X))


@case("guards")
def case_grad_mode_switch(C, rec):
    w = torch.ones(4, requires_grad=True)
    g = C(lambda x: (x * w).sum())
    rec(g(X))
    with torch.no_grad():
        rec(g(X))
    out = g(X)
    out.backward()
    rec(w.grad)


@case("guards")
def case_hook_added_to_submodule(C, rec):
    torch.manual_seed(0)
    m = Net()
    g = C(m)
    with torch.no_grad():
        rec(g(X))
        handle = m.lin.register_forward_hook(lambda mod, args, out: out * 0 + 5)
        rec(g(X))
        handle.remove()
        rec(g(X))
        handle = m.lin.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        rec(g(X))
        handle.remove()


@case("guards")
def case_global_hook_added(C, rec):
    torch.manual_seed(0)
    m = Net()
    g = C(m)
    with torch.no_grad():
        rec(g(X))
        handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: out + 1)
        try:
            rec(g(X))
        finally:
            handle.remove()
        rec(g(X))


@case("guards")
def case_default_dtype_changes(C, rec):
    g = C(lambda x: x + torch.ones(4))
    saved = torch.get_default_dtype()
    try:
        rec(g(X).dtype)
        torch.set_default_dtype(torch.float64)
        rec(g(X).dtype)
    finally:
        torch.set_default_dtype(saved)


@case("guards")
def case_float_negative_zero(C, rec):
    g = C(lambda x, s: x / s)
    rec(g(X, 0.0))
    rec(g(X, -0.0))  # 1/-0.0 is -inf: the code compiled for 0.0 must not be reused
    rec(g(X, 0.0))


@case("guards")
def case_float_nan_argument(C, rec):
    g = C(lambda x, s: x + s)
    rec(g(X, float("nan")))  # nan != nan: a guard on == would recompile on every call
    rec(g(X, float("nan")))
    rec(g(X, 1.0))


@case("guards")
def case_kwdefaults_changed_in_place(C, rec):
    def f(x, *, k=2.0):
        return x * k
    g = C(f)
    rec(g(X))
    f.__kwdefaults__["k"] = -1.0
    rec(g(X))


@case("guards")
def case_defaults_tuple_of_list_changed_in_place(C, rec):
    def f(x, ks=[2.0]):  # noqa: B006 - the mutable default is the point
        return x * ks[0]
    g = C(f)
    rec(g(X))
    f.__defaults__[0][0] = -3.0
    rec(g(X))


@case("guards")
def case_instance_method_rebound(C, rec):
    obj = Scaler()
    g = C(_use_scale)
    rec(g(obj, X))
    obj.scale = lambda x: x * 10
    rec(g(obj, X))
    obj.scale = lambda x: x * -7  # another function under the same instance attribute
    rec(g(obj, X))
    obj.scale = types.MethodType(lambda self, x: x * self.k, obj)  # a bound method: same type...
    rec(g(obj, X))
    obj.scale = types.MethodType(lambda self, x: x - self.k, obj)  # ...another __func__
    rec(g(obj, X))
    del obj.scale
    rec(g(obj, X))


@case("guards")
def case_module_method_shadowed_then_rebound(C, rec):
    m = Net()

    def call_fwd(mod, x):
        return mod.helper(x)

    Net.helper = lambda self, x: self.lin(x)
    try:
        g = C(call_fwd)
        with torch.no_grad():
            rec(g(m, X))
            m.helper = lambda x: x * 2
            rec(g(m, X))
            m.helper = lambda x: x * 3
            rec(g(m, X))
            m.helper = types.MethodType(lambda self, x: self.lin(x) * 4, m)
            rec(g(m, X))
            m.helper = types.MethodType(lambda self, x: self.lin(x) * 5, m)
            rec(g(m, X))
            Net.helper = lambda self, x: self.lin(x) + 1
            del m.helper
            rec(g(m, X))
    finally:
        del Net.helper


class _WithClassScale:
    factor = 2.0


@case("guards")
def case_class_attribute_changed(C, rec):
    obj = _WithClassScale()
    g = C(lambda o, x: x * o.factor)
    rec(g(obj, X))
    _WithClassScale.factor = 5.0
    try:
        rec(g(obj, X))
        obj.factor = 7.0  # the instance attribute now shadows the class's
        rec(g(obj, X))
    finally:
        _WithClassScale.factor = 2.0


@case("guards")
def case_attribute_set_on_an_input_tensor(C, rec):
    def f(x):
        return x + 2 if hasattr(x, "tag") else x + 1
    g = C(f)
    rec(g(X))
    t = X.clone()
    t.tag = None  # the same metadata, one attribute more
    rec(g(t))
    rec(g(X))


@case("guards")
def case_hasattr_of_a_partial_made_in_the_frame(C, rec):
    def f(x):
        p = functools.partial(lambda a, b: a * b, b=3)
        hits = [hasattr(p, name) for name in ("__call__", "func", "keywords", "missing")]
        return p(x) if hits == [True, True, True, False] else x * 0
    rec(C(f)(X))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES["guards"]))
def test_guards(name, backend):
    check("guards", name, backend)
