"""Dynamic shapes in tinydynamo (tinydynamo.symbolic_shapes), against torch.compile and eager.

A length sweep compiles at most 2 graphs with the default policy (static, then automatic dynamic)
and 1 with ``dynamic=True`` or ``mark_dynamic``, as torch.compile does on the same code; values
and gradients equal eager; guards are relations over sizes.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from torch import nn

import tinydynamo
from tinydynamo.testing import CompileCounter, CompileCounterWithBackend

LENGTHS = [2, 3, 5, 8, 17, 33, 64]


@pytest.fixture(autouse=True)
def _fresh():
    tinydynamo.reset()
    torch._dynamo.reset()
    yield
    tinydynamo.reset()
    torch._dynamo.reset()


# ---- the functions swept --------------------------------------------------------------------------------
def pointwise(x):
    return (x.sin() * 2 + 1).relu() - x.cos()


def softmax_rows(x):
    return torch.softmax(x * x.shape[-1] ** -0.5, dim=-1)


def view_by_size(x):
    return x.view(x.shape[0], -1, 4).sum(-1) + torch.zeros(x.size(0), x.shape[1] // 4)


class Block(nn.Module):
    """LayerNorm + self-attention (scaled_dot_product_attention) + MLP, sizes read from x."""

    def __init__(self, c=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


def _inputs(name, n, requires_grad=False):
    g = torch.Generator().manual_seed(n)
    shape = {"pointwise": (n, 3), "softmax": (4, n), "view": (n, 8)}[name]
    return torch.randn(shape, generator=g, requires_grad=requires_grad)


FUNCTIONS = {"pointwise": pointwise, "softmax": softmax_rows, "view": view_by_size}


def _sweep(fn, name, backend, dynamic, mark=None, lengths=LENGTHS):
    compiled = tinydynamo.compile(fn, backend=backend, dynamic=dynamic)
    for n in lengths:
        x = _inputs(name, n, requires_grad=True)
        if mark is not None:
            tinydynamo.mark_dynamic(x, mark)
        x_ref = x.detach().clone().requires_grad_()
        out, ref = compiled(x), fn(x_ref)
        torch.testing.assert_close(out, ref)
        out.square().sum().backward()
        ref.square().sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)


def _torch_frames(fn, name, dynamic, lengths=LENGTHS):
    cnt = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(fn, backend=cnt, dynamic=dynamic)
    for n in lengths:
        compiled(_inputs(name, n))
    return cnt.frame_count


DYN_DIM = {"pointwise": 0, "softmax": 1, "view": 0}


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_sweep_compiles_like_torch(name, backend):
    fn = FUNCTIONS[name]
    for dynamic, most in ((None, 2), (True, 1)):
        tinydynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        _sweep(fn, name, cnt, dynamic)
        assert cnt.frame_count <= most, (dynamic, cnt.frame_count)
        assert cnt.frame_count == _torch_frames(fn, name, dynamic), dynamic
    tinydynamo.reset()
    cnt = CompileCounterWithBackend(backend)
    _sweep(fn, name, cnt, None, mark=DYN_DIM[name])
    assert cnt.frame_count == 1


def test_dynamic_false_recompiles_per_size():
    cnt = CompileCounter()
    _sweep(pointwise, "pointwise", cnt, False, lengths=LENGTHS[:4])
    assert cnt.frame_count == 4


def test_symint_placeholders_follow_torch_convention():
    """Free symbols are SymInt placeholders just before their tensor; the backend gets SymInts."""
    seen = {}

    def backend(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, example_inputs
        return gm.forward

    tinydynamo.compile(view_by_size, backend=backend, dynamic=True)(torch.randn(6, 8))
    placeholders = [n for n in seen["gm"].graph.nodes if n.op == "placeholder"]
    assert [type(e) for e in seen["inputs"]] == [torch.SymInt, torch.SymInt, torch.Tensor]
    assert [str(p.target).startswith("s") for p in placeholders] == [True, True, False]
    view = next(n for n in seen["gm"].graph.nodes if n.target == "view")
    assert view.args[1] is placeholders[0]  # x.shape[0] is the symbol's placeholder, not 6
    tseen = {}

    def tbackend(gm, example_inputs):
        tseen["inputs"] = example_inputs
        return gm.forward

    torch.compile(view_by_size, backend=tbackend, dynamic=True)(torch.randn(6, 8))
    assert [type(e) for e in tseen["inputs"]] == [type(e) for e in seen["inputs"]]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("training", [False, True])
def test_transformer_block_sweep(backend, training):
    torch.manual_seed(0)
    model = Block()
    ref_model = copy.deepcopy(model)
    for dynamic, most in ((None, 2), (True, 1)):
        tinydynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        compiled = tinydynamo.compile(model, backend=cnt, dynamic=dynamic)
        for T in LENGTHS[:6]:
            x = torch.randn(4, T, 16, generator=torch.Generator().manual_seed(T))  # B=4: no T equals it (duck sizing)
            with torch.set_grad_enabled(training):
                out, ref = compiled(x), ref_model(x)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
            if training:
                model.zero_grad()
                ref_model.zero_grad()
                out.square().mean().backward()
                ref.square().mean().backward()
                for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
                    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
        assert cnt.frame_count <= most, (dynamic, cnt.frame_count)
        tcnt = torch._dynamo.testing.CompileCounter()
        tcompiled = torch.compile(copy.deepcopy(model), backend=tcnt, dynamic=dynamic)
        for T in LENGTHS[:6]:
            with torch.set_grad_enabled(training):
                tcompiled(torch.randn(4, T, 16))
        assert cnt.frame_count == tcnt.frame_count


def test_parameters_stay_static():
    model = Block()
    compiled = tinydynamo.compile(model, backend="eager", dynamic=True)
    compiled(torch.randn(2, 5, 16))
    guards = tinydynamo.cache_info(compiled).entries[0].check_fn.guards
    params = [g for g in guards if g.kind == "TENSOR_MATCH" and "qkv" in g.name]
    assert params and all(None not in g.expected.size for g in params)
    x_guard = next(g for g in guards if g.kind == "TENSOR_MATCH" and g.name == "L['x']")
    assert x_guard.expected.size == (None, None, 16)  # batch and time symbolic; C fixed by the weights


@pytest.mark.filterwarnings("ignore:tininductor failed to compile")  # graphs with SymInt inputs, for now
def test_tininductor_stays_correct():
    """tininductor gets graphs with SymInt inputs (its aot_autograd specialises them per shape)."""
    compiled = tinydynamo.compile(view_by_size, backend="tininductor")
    for n in (2, 5, 9, 12):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x), view_by_size(x))
    assert len(tinydynamo.cache_info(compiled).entries) <= 2
    torch.manual_seed(0)
    model = Block()
    compiled = tinydynamo.compile(model, backend="tininductor", dynamic=True)
    for T in (3, 6, 10):
        x = torch.randn(4, T, 16)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(tinydynamo.cache_info(compiled).entries) == 1


def test_size_one_and_zero_stay_static_and_correct():
    cnt = CompileCounter()
    compiled = tinydynamo.compile(pointwise, backend=cnt, dynamic=True)
    for n in (1, 5, 1, 7, 0, 9):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x), pointwise(x))
    guards = [str(g) for e in tinydynamo.cache_info(compiled).entries for g in e.check_fn.guards]
    assert any("size=[1, None]" in g for g in guards)  # 0/1 specialisation: size 1 is its own graph
    assert any("size=[0, None]" in g for g in guards)
    assert cnt.frame_count == 3  # size 1, sizes >= 2 (one symbolic graph), size 0


def branchy(x):
    if x.shape[0] > 4:
        return x * 2
    return x - 1


def test_branch_on_size_guards_the_relation():
    cnt = CompileCounter()
    compiled = tinydynamo.compile(branchy, backend=cnt, dynamic=True)
    for n in (6, 9, 30, 2, 3, 4, 5, 64):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), branchy(x))
    assert cnt.frame_count == 2  # one graph per side of the relation, not per size
    entries = tinydynamo.cache_info(compiled).entries
    relations = [g.expected for e in entries for g in e.check_fn.guards if g.kind == "SHAPE_ENV"]
    assert "5 <= L['x'].size()[0]" in relations
    assert "shape guard failed: 5 <= L['x'].size()[0]" in tinydynamo.cache_info(compiled).last_reason
    tcnt = torch._dynamo.testing.CompileCounter()
    tcompiled = torch.compile(branchy, backend=tcnt, dynamic=True)
    for n in (6, 9, 30, 2, 3, 4, 5, 64):
        tcompiled(torch.randn(n, 3))
    assert tcnt.frame_count == cnt.frame_count


def two_inputs(x, y):
    return x + y.sum(-1, keepdim=True).expand(len(y), x.shape[1])


def test_equal_sizes_become_an_equality_guard():
    compiled = tinydynamo.compile(two_inputs, backend="eager", dynamic=True)
    x, y = torch.randn(5, 3), torch.randn(5, 4)
    torch.testing.assert_close(compiled(x, y), two_inputs(x, y))
    relations = [g.expected for g in tinydynamo.cache_info(compiled).entries[0].check_fn.guards
                 if g.kind == "SHAPE_ENV"]
    assert "L['y'].size()[0] == L['x'].size()[0]" in relations
    check = tinydynamo.cache_info(compiled).entries[0].check_fn
    assert check(dict(x=torch.randn(7, 3), y=torch.randn(7, 9)), {})
    assert not check(dict(x=torch.randn(7, 3), y=torch.randn(6, 9)), {})


def loop_over_size(x):
    total = x[0]
    for i in range(1, x.shape[0]):
        total = total + x[i] * i
    return total


def test_range_over_a_symbolic_size_specializes_with_a_guard():
    compiled = tinydynamo.compile(loop_over_size, backend="eager", dynamic=True)
    x = torch.randn(4, 3)
    torch.testing.assert_close(compiled(x), loop_over_size(x))
    guards = tinydynamo.cache_info(compiled).entries[0].check_fn.guards
    x_guard = next(g for g in guards if g.kind == "TENSOR_MATCH")
    assert x_guard.expected.size == (4, None)  # the loop specialised size(0); size(1) stays symbolic
    x = torch.randn(6, 3)
    torch.testing.assert_close(compiled(x), loop_over_size(x))
    assert "size mismatch at index 0: expected 4, actual 6" in tinydynamo.cache_info(compiled).last_reason


def test_mark_dynamic_then_specialized_raises():
    x = torch.randn(4, 3)
    tinydynamo.mark_dynamic(x, 0)
    assert x._dynamo_dynamic_indices == {0}  # torch._dynamo's attribute: either API works
    with pytest.raises(Exception, match="(?i)constraint|specializ|not all values"):
        tinydynamo.compile(loop_over_size, backend="eager")(x)


def test_torch_mark_dynamic_is_honoured_and_mark_static_wins():
    cnt = CompileCounter()
    compiled = tinydynamo.compile(pointwise, backend=cnt)
    for n in (3, 4, 5):
        x = torch.randn(n, 6)
        torch._dynamo.mark_dynamic(x, 0)
        compiled(x)
    assert cnt.frame_count == 1
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.compile(pointwise, backend=cnt, dynamic=True)
    for n in (3, 4, 5):
        x = torch.randn(n, 6)
        tinydynamo.mark_static(x, 0)
        compiled(x)
    assert cnt.frame_count == 3


def test_maybe_mark_dynamic_allows_specialization():
    x = torch.randn(4, 3)
    tinydynamo.maybe_mark_dynamic(x, 0)
    torch.testing.assert_close(tinydynamo.compile(loop_over_size, backend="eager")(x), loop_over_size(x))


def sizes_in_python(x):
    n, m = x.shape
    k = x.size(-1) * 2 - 1
    flat = x.reshape(n * m)
    return flat.new_zeros(k) + flat[:k].sum() + x.numel() + max(n, 3), n + m


def test_size_arithmetic_stays_symbolic_and_is_returned():
    cnt = CompileCounter()
    compiled = tinydynamo.compile(sizes_in_python, backend=cnt, dynamic=True)
    for n, m in ((2, 5), (4, 7), (9, 3)):
        x = torch.randn(n, m)
        out, ref = compiled(x), sizes_in_python(x)
        torch.testing.assert_close(out[0], ref[0])
        assert out[1] == ref[1] and type(out[1]) is int
    assert cnt.frame_count == 1


def with_break(x):
    n = x.shape[0]
    y = x.view(n, -1) * 2
    tinydynamo.graph_break()
    return y.sum(0) + y.new_ones(y.shape[1]) * n


def test_graph_break_with_symbolic_sizes():
    cnt = CompileCounter()
    compiled = tinydynamo.compile(with_break, backend=cnt)
    for n in LENGTHS:
        x = torch.randn(n, 2, 2)
        torch.testing.assert_close(compiled(x), with_break(x))
    first = tinydynamo.cache_info(compiled).entries
    assert len(first) <= 2 and first[0].break_reason is not None
    from tinydynamo.eval_frame import _caches

    # the resume function gets n as an int: specialised first, then an automatic-dynamic SymInt
    resume = [c for code, c in _caches.items() if code.co_name.startswith("__resume_at_")]
    assert resume and all(len(c.entries) <= 2 and c.run_eagerly is None for c in resume)


def scale_by(x, n):
    return x * n + torch.arange(n).sum()


def test_int_arguments_become_dynamic_after_a_change():
    cnt = CompileCounter()
    compiled = tinydynamo.compile(scale_by, backend=cnt)
    for n in (2, 3, 4, 7, 1, 9):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, n), scale_by(x, n))
    tcnt = torch._dynamo.testing.CompileCounter()
    tcompiled = torch.compile(scale_by, backend=tcnt)
    for n in (2, 3, 4, 7, 1, 9):
        tcompiled(torch.randn(3), n)
    assert cnt.frame_count == tcnt.frame_count


def test_guards_print_and_tensor_match_skips_dynamic_dims():
    compiled = tinydynamo.compile(view_by_size, backend="eager")
    compiled(torch.randn(6, 8))
    compiled(torch.randn(10, 8))
    entry = tinydynamo.cache_info(compiled).entries[0]
    text = "\n".join(str(g) for g in entry.check_fn.guards)
    assert "size=[None, 8]" in text and "SHAPE_ENV" in text and "L['x'].size()[0]" in text
    assert "shape ==" not in entry.check_fn.code.split("TENSOR_MATCH")[1].split("\n")[1]
    assert entry.check_fn(dict(x=torch.randn(40, 8)), {})
    assert not entry.check_fn(dict(x=torch.randn(40, 12)), {})  # the static dim is still checked


def same_shape(x, y):
    if x.shape == y.shape:
        return x + y
    return x - y.sum()


def test_shape_comparison_is_a_relation():
    cnt = CompileCounter()
    compiled = tinydynamo.compile(same_shape, backend=cnt, dynamic=True)
    for n, m in ((3, 3), (5, 5), (4, 6), (7, 2)):
        x, y = torch.randn(n, 2), torch.randn(m, 2)
        torch.testing.assert_close(compiled(x, y), same_shape(x, y))
    assert cnt.frame_count == 2  # equal / not equal, whatever the sizes


@pytest.mark.slow  # ~60 s on the shared 2-core machine (torch.compile of the GPT twice): run with --runslow
def test_course_gpt_sweep_training():
    """The course's GPT (causal-mask buffer sliced by T, positions by arange(T)): losses and gradients
    equal eager over T, with no more graphs than torch.compile makes."""
    from course.models import GPT

    torch.manual_seed(0)
    model = GPT(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16)
    lengths = (3, 8, 16)  # 16 = block_size: slicing the mask buffer to its full length is a guarded case
    for dynamic, backend in ((None, "eager"), (True, "aot_eager")):
        tinydynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        compiled = tinydynamo.compile(model, backend=cnt, dynamic=dynamic)
        for T in lengths:
            idx, tgt = torch.randint(0, 32, (2, T)), torch.randint(0, 32, (2, T))
            loss, ref = compiled(idx, tgt)[1], model(idx, tgt)[1]
            torch.testing.assert_close(loss, ref)
            params = list(model.parameters())
            for g, r in zip(torch.autograd.grad(loss, params), torch.autograd.grad(ref, params)):
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
        torch._dynamo.reset()
        tcnt = torch._dynamo.testing.CompileCounter()
        tcompiled = torch.compile(model, backend=tcnt, dynamic=dynamic)
        for T in lengths:
            tcompiled(torch.randint(0, 32, (2, T)), torch.randint(0, 32, (2, T)))
        assert cnt.frame_count <= tcnt.frame_count <= 3, (dynamic, cnt.frame_count, tcnt.frame_count)


def size_arguments(x, d, k):
    return (x.sum(d), torch.topk(x, k).values, F.pad(x, (k, k)), x.transpose(d, 0), x.size(dim=1),
            x.narrow(1, 0, k), x.roll(k, d))


@pytest.mark.parametrize("dynamic", [None, True])
def test_int_arguments_as_sizes_and_dims(dynamic):
    compiled = tinydynamo.compile(size_arguments, backend="eager", dynamic=dynamic)
    for k in (2, 3, 4):
        x = torch.randn(5, 6)
        for a, b in zip(compiled(x, 1, k), size_arguments(x, 1, k)):
            torch.testing.assert_close(a, b)
    cache = tinydynamo.cache_info(compiled)
    assert cache.run_eagerly is None and all(e.break_reason is None for e in cache.entries)
    assert len(cache.entries) == (2 if dynamic is None else 1)


@pytest.mark.parametrize("name", ["softmax", "view"])
def test_pytorch_aot_eager_backend_sees_the_symbols(name):
    """PyTorch's own aot_eager finds the frame's ShapeEnv (a TracingContext around the backend call,
    as under torch.compile): one graph serves every length, with values and gradients equal eager
    (without the context it would bake the first sizes in and be wrong on the next length)."""
    cnt = CompileCounterWithBackend(torch._dynamo.lookup_backend("aot_eager"))
    _sweep(FUNCTIONS[name], name, cnt, True)
    assert cnt.frame_count == 1


def test_pytorch_aot_eager_backend_trains_the_block():
    torch.manual_seed(0)
    model = Block()
    ref_model = copy.deepcopy(model)
    compiled = tinydynamo.compile(model, backend=torch._dynamo.lookup_backend("aot_eager"), dynamic=True)
    for T in (3, 6, 10):
        x = torch.randn(4, T, 16)
        out, ref = compiled(x), ref_model(x)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        model.zero_grad()
        ref_model.zero_grad()
        out.square().mean().backward()
        ref.square().mean().backward()
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert len(tinydynamo.cache_info(compiled).entries) == 1


@pytest.mark.slow  # ~25 s of C++ compilation on CPU: run with --runslow
def test_pytorch_inductor_backend_compiles_one_symbolic_graph():
    cnt = CompileCounterWithBackend("inductor")
    compiled = tinydynamo.compile(softmax_rows, backend=cnt, dynamic=True)
    for n in (3, 5, 7, 12):
        x = _inputs("softmax", n)
        torch.testing.assert_close(compiled(x), softmax_rows(x))
    assert cnt.frame_count == 1


def test_tuples_join_symbolic_shapes():
    """``(-1,) + x.shape[1:]`` (transformers' GPT-2 attention) with a symbolic size: a graph break
    made every length after the first recompile the frame again (6 graphs for 4 lengths)."""
    def f(x):
        flat = x.reshape((-1,) + x.shape[2:]) * 2
        rows = x.reshape(x.shape[:1] + (x.shape[1] * x.shape[2],)) + 1
        return flat, rows, type(x.shape[:1] + (3,)) is torch.Size

    counts = []
    for compile_fn, reset in ((tinydynamo.compile, tinydynamo.reset), (torch.compile, torch._dynamo.reset)):
        reset()
        cnt = torch._dynamo.testing.CompileCounter()
        g = compile_fn(f, backend=cnt, dynamic=True)
        for n in (3, 5, 7):
            x = torch.randn(2, n, 4)
            got, want = g(x), f(x)
            torch.testing.assert_close(got[:2], want[:2])
            assert got[2] is want[2] is True
        counts.append(cnt.frame_count)
    assert counts[0] == counts[1] == 1
