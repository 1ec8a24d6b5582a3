"""Guards and the cache: recompile exactly when an assumption changes, never otherwise; readable reasons."""
import copy
import gc
import logging
import warnings

import pytest
import torch
from torch import nn

import tinydynamo
from tinydynamo.exc import EagerFallbackWarning
from tinydynamo.guards import Guard, GuardBuilder, TensorMeta
from tinydynamo.source import AttrSource, LocalSource, SourceScope
from tinydynamo.testing import CompileCounter

FACTOR = 2.0


def f(x, y):
    return x * FACTOR + y


def compiled(fn=f):
    tinydynamo.reset()
    cnt = CompileCounter()
    return tinydynamo.optimize(cnt)(fn), cnt


def reason(fn):
    return tinydynamo.cache_info(fn).last_reason


def test_no_recompile_for_new_values_of_same_metadata():
    g, cnt = compiled()
    for _ in range(5):
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        torch.testing.assert_close(g(x, y), f(x, y))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("change,expected", [
    (lambda x: torch.randn(1, 3), "tensor L['x'] size mismatch at index 0: expected 4, actual 1"),
    (lambda x: x.double(), "tensor L['x'] dtype mismatch: expected torch.float32, actual torch.float64"),
    (lambda x: x.clone().requires_grad_(), "tensor L['x'] requires_grad mismatch: expected False, actual True"),
    (lambda x: x.t().contiguous().t(), "tensor L['x'] stride mismatch at index 0: expected 3, actual 1"),
    (lambda x: torch.randn(2, 4, 3), "tensor L['x'] rank mismatch: expected 2, actual 3"),
    (lambda x: 3.0, "L['x'] type mismatch: expected torch.Tensor, actual float"),
])
def test_recompile_on_tensor_change_with_reason(change, expected):
    g, cnt = compiled()
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    g(x, y)
    x2 = change(x)
    torch.testing.assert_close(g(x2, y), f(x2, y))
    assert cnt.frame_count == 2
    assert reason(g) == expected
    g(x, y)  # the first entry still serves the old inputs
    g(x2, y)
    assert cnt.frame_count == 2


def test_recompile_on_global_constant_change():
    global FACTOR
    g, cnt = compiled()
    x, y = torch.randn(2), torch.randn(2)
    g(x, y)
    FACTOR = 3.0
    try:
        torch.testing.assert_close(g(x, y), x * 3.0 + y)
        assert cnt.frame_count == 2
        assert reason(g) == "G['FACTOR'] == 2.0 failed: actual 3.0"
    finally:
        FACTOR = 2.0


def test_recompile_on_int_argument_and_bool_is_not_int():
    def h(x, n):
        return x * n

    g, cnt = compiled(h)
    x = torch.randn(2)
    g(x, 2), g(x, 2)
    assert cnt.frame_count == 1
    g(x, 3)
    assert cnt.frame_count == 2 and reason(g) == "L['n'] == 2 failed: actual 3"
    g(x, True)  # True == 1 but is a different type: must not reuse an int entry
    assert cnt.frame_count == 3


def test_recompile_on_module_attribute_and_module_swap():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.k = 2

        def forward(self, x):
            return self.fc(x) * self.k

    m = Scale()
    tinydynamo.reset()
    cnt = CompileCounter()
    cm = tinydynamo.compile(m, backend=cnt)
    x = torch.randn(2, 3)
    cm(x), cm(x)
    assert cnt.frame_count == 1
    m.k = 5
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 2 and tinydynamo.cache_info(cm).last_reason == "L['self'].k == 2 failed: actual 5"
    old = f"<Linear at {hex(id(m.fc))}>"
    m.fc = nn.Linear(3, 3)  # a new submodule: its identity guard fails
    gc.collect()  # the replaced module is gone: the reason still names it
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 3
    assert tinydynamo.cache_info(cm).last_reason.startswith(f"module L['self'].fc was replaced: expected {old}, actual <Linear")
    with torch.no_grad():
        m.fc.weight.mul_(2)  # new values in the same parameter: no recompile, new result
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 3


def test_grad_mode_guard():
    g, cnt = compiled()
    x, y = torch.randn(2), torch.randn(2)
    g(x, y)
    with torch.no_grad():
        g(x, y)
    assert cnt.frame_count == 2
    assert reason(g) == "grad mode changed: expected enabled, actual disabled"


def test_sequence_length_and_dict_keys_guards():
    def h(xs, d):
        out = d["w"]
        for t in xs:
            out = out + t
        return out

    g, cnt = compiled(h)
    a = torch.randn(2)
    g([a, a], {"w": a}), g([a, a], {"w": a})
    assert cnt.frame_count == 1
    torch.testing.assert_close(g([a, a, a], {"w": a}), h([a, a, a], {"w": a}))
    assert cnt.frame_count == 2 and reason(g) == "len(L['xs']) == 2 failed: actual 3"
    g([a, a], {"w": a, "z": a})
    assert cnt.frame_count == 3 and "L['d'] keys changed: expected ['w'], actual ['w', 'z']" in reason(g)


def test_recompile_limit_falls_back_with_one_warning():
    def h(x, n):
        return x + n

    g, cnt = compiled(h)
    x = torch.randn(2)
    with tinydynamo.config.patch(recompile_limit=3):
        with pytest.warns(EagerFallbackWarning, match="recompile_limit") as record:
            for n in range(6):
                torch.testing.assert_close(g(x, n), x + n)
    assert cnt.frame_count == 3
    assert sum("recompile_limit" in str(w.message) for w in record) == 1
    assert tinydynamo.config.recompile_limit == 8  # patch restored it


@tinydynamo.config.patch(unspecialize_replaced_modules=False)
def test_recompile_limit_counts_entries_per_module_instance():
    """With modules pinned by identity, twelve blocks of one class each pin the frame's ``self`` to
    themselves: twelve first entries, not eleven recompiles (TorchDynamo counts the limit per
    id-matched frame argument); one block recompiling past the limit still falls back, and the
    accumulated limit caps the total."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, n):
            return self.fc(x) * n

    blocks = [Block() for _ in range(12)]
    g, cnt = compiled(Block.forward)
    x = torch.randn(2, 4)
    with tinydynamo.config.patch(recompile_limit=3), warnings.catch_warnings():
        warnings.simplefilter("error")  # no recompile-limit warning for twelve instances
        for b in blocks:
            torch.testing.assert_close(g(b, x, 1.0), b(x, 1.0))
    assert cnt.frame_count == 12 and not tinydynamo.convert_frame.counters["recompiles"]
    with tinydynamo.config.patch(recompile_limit=3), pytest.warns(EagerFallbackWarning, match="config.recompile_limit"):
        for n in (2.0, 3.0, 4.0, 5.0):  # a constant per call: one block recompiles until the limit
            g(blocks[0], x, n)
    assert cnt.frame_count == 14
    tinydynamo.reset()
    g, cnt = compiled(Block.forward)
    with tinydynamo.config.patch(accumulated_recompile_limit=5), \
            pytest.warns(EagerFallbackWarning, match="config.accumulated_recompile_limit"):
        for b in blocks[:6]:
            g(b, x, 1.0)
    assert cnt.frame_count == 5


class _Block(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=bias)
        self.scale = 2.0

    def forward(self, x):
        return self.fc(x) * self.scale


def test_blocks_of_one_class_share_one_entry_after_the_second():
    """The first block pins ``self``; the second, a module of the same class at the same source,
    makes that source guarded by type: one more entry, then every block hits it."""
    blocks = [_Block() for _ in range(12)]
    g, cnt = compiled(_Block.forward)
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for b in blocks:
            torch.testing.assert_close(g(b, x), b(x))
        blocks[3].scale = 3.0  # an attribute the frame read: guarded by value still
        torch.testing.assert_close(g(blocks[3], x), blocks[3](x))
    assert cnt.frame_count == 3


def test_a_module_made_for_every_call_compiles_once_more_not_every_call():
    """``copy.deepcopy(self.net)`` in every call (MAML's fine-tuning): without a type guard each copy
    misses, and the frame would reach the recompile limit and run eagerly."""

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _Block()

        def forward(self, x):
            net = copy.deepcopy(self.net)
            return helper(net, x)

    def helper(net, x):
        return net(x).relu()

    outer, x = Outer(), torch.randn(2, 4)
    g, cnt = compiled(helper)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recompile-limit fallback
        for _ in range(12):
            torch.testing.assert_close(g(copy.deepcopy(outer.net), x), outer.net(x).relu())
    assert cnt.frame_count == 2


def test_a_module_guarded_by_type_is_still_checked_for_what_the_frame_read():
    """Another module of the class with other parameters (shapes, a missing bias), other children,
    or other entries in the tables ``parameters()`` lists: a miss, never the other module's graph."""
    def total(model, x):
        return model(x).sum() + sum(p.sum() for p in model.parameters())

    g, cnt = compiled(total)
    x = torch.randn(2, 4)
    for m in [_Block(), _Block(), _Block(bias=False), _Block()]:
        torch.testing.assert_close(g(m, x), total(m, x))
    m = _Block()
    g(m, x)
    m.register_parameter("extra", nn.Parameter(torch.ones(3)))  # the same module, one more parameter
    torch.testing.assert_close(g(m, x), total(m, x))


def test_recompiles_are_logged(caplog):
    g, cnt = compiled()
    with caplog.at_level(logging.INFO, logger="tinydynamo.recompiles"):
        g(torch.randn(2), torch.randn(2))
        g(torch.randn(3), torch.randn(3))
    text = caplog.text
    assert "Recompiling function f" in text and "size mismatch at index 0: expected 2, actual 3" in text


def test_check_function_is_one_generated_function_with_readable_guards():
    scope = SourceScope({})
    gb = GuardBuilder(scope)
    x = torch.randn(2, 3)
    gb.add("TENSOR_MATCH", LocalSource("x"), TensorMeta.of(x))
    gb.add("TENSOR_MATCH", LocalSource("x"), TensorMeta.of(x))  # deduplicated
    gb.add("CONSTANT_MATCH", AttrSource(LocalSource("cfg"), "eps"), 1e-5)
    check = gb.build()
    assert len(check.guards) == 2
    assert check.code.count("def ") == 1 and "___v0.shape == (2, 3)" in check.code
    assert "check_tensor(L['x']" in str(check.guards[0])

    class Cfg:
        eps = 1e-5

    assert check({"x": torch.randn(2, 3), "cfg": Cfg()}, {})
    assert not check({"x": torch.randn(2, 3)}, {})  # missing source: a miss, not an exception
    Cfg.eps = 1e-6
    assert check.failure_reason({"x": x, "cfg": Cfg()}, {}) == "L['cfg'].eps == 1e-05 failed: actual 1e-06"
    with pytest.raises(ValueError, match="unknown guard kind"):
        gb.add("NOT_A_KIND", LocalSource("x"))


def test_guard_kinds_cover_the_issue_list():
    from tinydynamo.guards import GUARD_KINDS

    assert {"TENSOR_MATCH", "TYPE_MATCH", "ID_MATCH", "CONSTANT_MATCH", "SEQUENCE_LENGTH", "GRAD_MODE",
            "NN_MODULE", "DICT_KEYS"} <= set(GUARD_KINDS)
    g = Guard("ID_MATCH", LocalSource("f"), len)
    assert g.readable().startswith("L['f'] is <len")


def test_aliased_inputs_share_a_placeholder_and_are_guarded():
    from torch import nn

    m = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    tinydynamo.reset()
    cnt = CompileCounter()
    cm = tinydynamo.compile(m, backend=cnt, fullgraph=True)
    x, k = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    torch.testing.assert_close(cm(x, x, x), m(x, x, x))  # self-attention: query is key is value
    torch.testing.assert_close(cm(x, k, k), m(x, k, k))  # different objects: `query is not key`
    assert cnt.frame_count == 2
    assert "aliasing changed: L['key'] is L['query']" in tinydynamo.cache_info(cm).last_reason
    torch.testing.assert_close(cm(k, x, x), m(k, x, x))
    assert cnt.frame_count == 2


def test_float_constants_are_guarded_by_their_bits():
    """``0.0 == -0.0`` and ``nan != nan``: a float specialised into a graph is compared by its bits, so
    -0.0 recompiles (``1 / x`` differs) and a NaN argument reuses the graph compiled for a NaN."""
    g, cnt = compiled(lambda x, s: x / s)
    x = torch.ones(3)
    assert torch.equal(g(x, 0.0), x / 0.0)
    assert torch.equal(g(x, -0.0), x / -0.0)
    assert cnt.frame_count == 2
    assert "L['s'] == 0.0 failed: actual -0.0" in reason(g)
    g, cnt = compiled(lambda x, s: x + s)
    for _ in range(3):
        assert g(x, float("nan")).isnan().all()
    assert cnt.frame_count == 1


def _many_tensor_check(*tensors):
    scope = SourceScope({})
    gb = GuardBuilder(scope)
    for i, t in enumerate(tensors):
        gb.add("TENSOR_MATCH", LocalSource(f"x{i}"), TensorMeta.of(t))
    return gb.build()


def test_many_plain_tensors_are_checked_by_one_cpp_call_that_misses_what_python_would():
    ts = [torch.randn(3, 4), torch.nn.Parameter(torch.randn(5)), torch.randn(2, 3).t(), torch.randn(6)]
    check = _many_tensor_check(*ts)
    assert "tensor_guards" in check.code and ".shape ==" not in check.code

    def L(*vals):
        return {f"x{i}": v for i, v in enumerate(vals)}

    assert check(L(*ts), {})
    changed = {
        "size": torch.randn(3, 5), "stride": ts[2].contiguous(), "dtype": ts[0].double(),
        "Parameter -> Tensor": ts[1].detach(), "requires_grad": ts[3].clone().requires_grad_(),
        "not a tensor": 3.0,
    }
    slots = {"size": 0, "stride": 2, "dtype": 0, "Parameter -> Tensor": 1, "requires_grad": 3, "not a tensor": 3}
    for what, value in changed.items():
        vals = list(ts)
        vals[slots[what]] = value
        assert not check(L(*vals), {}), what
        assert check.failure_reason(L(*vals), {}) is not None, what
    with torch.inference_mode():
        inference = torch.randn(3, 4)
    assert not check(L(inference, *ts[1:]), {})
    assert "dispatch keys mismatch" in check.failure_reason(L(inference, *ts[1:]), {})


def test_cpp_tensor_check_leaves_dynamic_dims_and_subclasses_to_python():
    class Sub(torch.Tensor):
        pass

    x = torch.randn(4, 3)
    metas = [TensorMeta(torch.Tensor, torch.float32, torch.device("cpu"), (None, 3), (3, 1), False, TensorMeta.of(x).template)]
    scope = SourceScope({})
    gb = GuardBuilder(scope)
    for i in range(4):
        gb.add("TENSOR_MATCH", LocalSource(f"x{i}"), metas[0])
    sub = torch.randn(2).as_subclass(Sub)
    gb.add("TENSOR_MATCH", LocalSource("s"), TensorMeta.of(sub))
    check = gb.build()
    assert TensorMeta.of(sub).template is None and "type(___v4) is" in check.code
    vals = {f"x{i}": torch.randn(7, 3) for i in range(4)} | {"s": sub}
    assert check(vals, {})
    assert not check(vals | {"x1": torch.randn(7, 4)}, {})
    assert not check(vals | {"s": torch.randn(2)}, {})


def test_compiled_module_recompiles_when_one_of_many_parameters_changes():
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(model)
    x = torch.randn(2, 4)
    compiled(x)
    compiled(x)
    assert cnt.frame_count == 1
    model[2].weight = torch.nn.Parameter(model[2].weight.detach().double())
    model[2].bias = torch.nn.Parameter(model[2].bias.detach().double())
    model[3].double()
    with pytest.raises(RuntimeError):  # eager raises too: float input, double weights
        model(x)
    with pytest.raises(RuntimeError):
        compiled(x)
    assert cnt.frame_count == 2  # the changed dtype was seen: recompiled, not the float graph reused


def test_hooks_of_many_modules_are_checked_together_and_still_seen():
    """A big module tree's NO_HOOKS guards become one check over every module; a hook registered
    on any one of them after compiling is still seen (a recompile that traces it)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(6)])
    x = torch.randn(2, 4)
    fn, cnt = compiled(model)
    fn(x)
    code = tinydynamo.cache_info(fn).entries[0].check_fn.code
    assert "NO_HOOKS of 6 modules in C-level loops" in code and "_forward_pre_hooks" not in code
    for register in (lambda m, h: m.register_forward_hook(lambda mod, i, o: (h.append(1), o * 2)[1]),
                     lambda m, h: m.register_forward_pre_hook(lambda mod, i: h.append(1))):
        seen = []
        handle = register(model[4], seen)
        torch.testing.assert_close(fn(x), model(x))  # model(x) runs the hook too
        assert len(seen) == 2, "the compiled call ran without the hook"
        handle.remove()
    torch.testing.assert_close(fn(x), model(x))
    # each of the four hook dicts, on any module, fails the batched check
    L, G = {"self": model, "input": x}, type(model).forward.__globals__
    [check] = [e.check_fn.check for e in tinydynamo.cache_info(fn).entries if e.check_fn.check(L, G)]
    for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        hooks = getattr(model[3], name)
        hooks[12345] = lambda *args: None
        assert not check(L, G), f"a hook in {name} went unseen"
        del hooks[12345]
    assert check(L, G)
