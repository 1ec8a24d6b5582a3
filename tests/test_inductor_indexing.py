"""Indexing in the IR: gathers (embedding, index, gather) are indirect loads fused into their
consumers; scatters (index_put, scatter_add, the embedding backward) are kernels of atomic adds;
every indirect index is bounds-checked inside the kernel. Each test runs on the C++ backend and
on Triton (the interpreter on CPU), against eager.
"""
import pytest
import torch
import torch.nn.functional as F

import tininductor
from tininductor.testing import DEVICE, check, compile_graph, patch_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
aten = torch.ops.aten


@pytest.fixture(params=["cpp", "triton"] if DEVICE == "cpu" else ["triton"], autouse=True)
def backend(request, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("TINY_CPU_BACKEND", request.param)
    monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tiny_cache"))
    return request.param


def no_fallback(compiled):
    assert not compiled.fallback_reasons, compiled.fallback_reasons
    return compiled


def test_index_put_accumulate_adds_repeated_indices():
    x, v = torch.randn(6, 5, device=DEVICE), torch.randn(7, 5, device=DEVICE)
    i = torch.tensor([0, 3, 3, 5, -1, 0, 3], device=DEVICE)
    c = no_fallback(check(lambda x, i, v: aten.index_put(x, [i], v, True) * 2, x, i, v, atol=1e-5, rtol=1e-5))
    assert "atomic_add" in c.source or "+ tmp" in c.source


def test_index_put_overwrite_and_scalar_value_and_second_dim():
    x = torch.randn(4, 6, device=DEVICE)
    i, v = torch.tensor([5, 1, 2], device=DEVICE), torch.randn(4, 3, device=DEVICE)
    no_fallback(check(lambda x, i, v: (aten.index_put(x, [None, i], v),
                                       aten.index_put(x, [None, i], torch.tensor(0.0, device=DEVICE))), x, i, v))


def test_scatter_add_along_each_dim():
    x = torch.randn(3, 5, device=DEVICE)
    src = torch.randn(3, 5, device=DEVICE)
    i0 = torch.randint(0, 3, (2, 5), device=DEVICE)
    i1 = torch.randint(0, 5, (3, 4), device=DEVICE)
    no_fallback(check(lambda x, s, a, b: (torch.scatter_add(x, 0, a, s), torch.scatter_add(x, 1, b, s)),
                      x, src, i0, i1, atol=1e-5, rtol=1e-5))


@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_embedding_dense_backward(padding_idx):
    g = torch.randn(4, 6, 8, device=DEVICE)
    idx = torch.randint(0, 10, (4, 6), device=DEVICE)
    idx[0, :3] = 2
    no_fallback(check(lambda g, i: aten.embedding_dense_backward(g, i, 10, padding_idx, False), g, idx,
                      atol=1e-5, rtol=1e-5))


def test_low_precision_scatter_adds_in_float32():
    g = torch.randn(64, 8, device=DEVICE).to(torch.bfloat16)
    idx = torch.zeros(64, dtype=torch.long, device=DEVICE)  # 64 adds into one row
    c = no_fallback(compile_graph(lambda g, i: aten.embedding_dense_backward(g, i, 3, -1, False), [g, idx]))
    out = c(g, idx)
    assert out.dtype == torch.bfloat16
    exact = g.float().sum(0)
    torch.testing.assert_close(out[0].float(), exact, atol=0.05, rtol=0.01)  # one rounding, not 64


def test_embedding_training_step_gradients():
    """F.embedding's backward (an index_put of the gradient rows) runs in kernels, not torch."""
    emb = torch.nn.Embedding(12, 8).to(DEVICE)  # padding_idx: the VJP rule is the ad helper's work
    pos = torch.nn.Parameter(torch.randn(5, 8, device=DEVICE))

    def f(idx):
        return ((emb(idx) + pos) ** 2).sum()

    idx = torch.tensor([[1, 0, 3, 3, 11], [2, 2, 2, 0, 7]], device=DEVICE)
    compiled = torch.compile(f, backend=tininductor.compile_fx)
    with tininductor.config.patch({"fallback_to_eager": False}):
        loss = compiled(idx)
        loss.backward()
    got = emb.weight.grad.clone(), pos.grad.clone()
    emb.weight.grad = pos.grad = None
    f(idx).backward()
    torch.testing.assert_close(loss, f(idx))
    torch.testing.assert_close(got[0], emb.weight.grad)
    torch.testing.assert_close(got[1], pos.grad)


# ----------------------------------------------------------------------------- bounds checks
def _raises_like_eager(fn, *args):
    with pytest.raises(Exception) as expected:
        fn(*args)
    compiled = no_fallback(compile_graph(fn, list(args)))
    with pytest.raises(type(expected.value)) as got:
        compiled(*args)
    assert "out of bounds" in str(got.value)
    return got.value


@pytest.mark.skipif(DEVICE != "cpu", reason="on CUDA an out-of-range index is a device-side assert")
def test_out_of_range_indices_raise_eagers_error():
    w = torch.randn(10, 4)
    assert isinstance(_raises_like_eager(lambda w, i: F.embedding(i, w) * 2, w, torch.tensor([1, 10])), IndexError)
    _raises_like_eager(lambda w, i: w[i] + 1, w, torch.tensor([[0], [-11]]))
    e = _raises_like_eager(lambda w, i: torch.gather(w, 1, i), w, torch.tensor([[0, 4]]).expand(10, 2))
    assert isinstance(e, RuntimeError)
    _raises_like_eager(lambda w, i: aten.index_put(w, [i], torch.ones(2, 4), True), w, torch.tensor([3, 12]))
    # eager's CPU embedding backward does not check (it writes out of bounds); the kernel does
    g, i = torch.randn(2, 4), torch.tensor([3, 10])
    compiled = no_fallback(compile_graph(lambda g, i: aten.embedding_dense_backward(g, i, 10, -1, False), [g, i]))
    with pytest.raises(IndexError, match="out of bounds"):
        compiled(g, i)


def test_negative_indices_wrap_and_in_range_calls_after_an_error_work():
    w = torch.randn(10, 4, device=DEVICE)
    f = lambda w, i: F.embedding(i, w) * 2  # noqa: E731
    compiled = no_fallback(compile_graph(f, [w, torch.tensor([1, 2], device=DEVICE)]))
    if DEVICE == "cpu":
        with pytest.raises(IndexError):
            compiled(w, torch.tensor([1, 10]))
    i = torch.tensor([1, 9], device=DEVICE)
    torch.testing.assert_close(compiled(w, i), f(w, i))
    neg = lambda w, i: w[i] * 2  # noqa: E731
    check(neg, w, torch.tensor([-1, -10, 3], device=DEVICE))


def _train_check(f, *params):
    """Compile ``f`` (a loss of ``params``) with tininductor, compare loss and gradients with eager;
    returns the backward graph's wrapper source."""
    compiled = torch.compile(f, backend=tininductor.compile_fx)
    with tininductor.config.patch({"fallback_to_eager": False}):
        loss = compiled(*params)
        loss.backward()
    got = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    ref = f(*params)
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    for g, p in zip(got, params):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-5)


def test_slice_select_and_split_gradients_are_pointwise_selects():
    """A slice's gradient is an index_put at ``start + step * arange(n)``: lowered as a select
    that fuses into the sum of the pieces' gradients, not as a scatter."""
    from tinydynamo import artifacts

    x = torch.randn(4, 12, device=DEVICE, requires_grad=True)

    def f(x):
        a, b, c = x.split(4, dim=1)
        return (a * b.sin() + c.exp()).sum() + (x[:, 1:11:3] ** 2).sum() + x[2].sum() * 3

    with artifacts.collecting("slices") as arts:
        _train_check(f, x)
    source = "\n".join(str(code) for _, code in arts.get("output_code"))
    assert "atomic_add" not in source and "fallback" not in source


def test_position_embedding_of_arange_is_a_direct_load():
    from tinydynamo import artifacts

    wpe = torch.randn(16, 8, device=DEVICE, requires_grad=True)

    def f(wpe):
        pos = torch.arange(2, 8, device=wpe.device)
        return (F.embedding(pos, wpe) ** 2).sum()

    with artifacts.collecting("wpe") as arts:
        _train_check(f, wpe)
    source = "\n".join(str(code) for _, code in arts.get("output_code"))
    assert "device_assert" not in source and "tiny_check_index" not in source and "atomic_add" not in source


def test_index_printer_parenthesizes_the_operands_of_floordiv_and_mod():
    """``//`` and ``%`` bind as tightly as ``*``: ``FloorDiv(x + 4, 4)`` must print as
    ``(x + 4) // 4``, never ``x + 4 // 4`` (which is ``x + 1``: silently wrong indices)."""
    from tininductor.indexing import FloorDiv, ModularIndexing, pexpr, sym

    x, y = sym("x"), sym("y")
    fd = lambda a, b: a // b  # noqa: E731
    mod = lambda a, b: a % b  # noqa: E731
    exprs = [FloorDiv(x + 4, 4), ModularIndexing(x + 4, 4), 36 * FloorDiv(x + 4, 4), FloorDiv(x, 2 * y),
             ModularIndexing(x, y + 1), ModularIndexing(FloorDiv(x + 1, 3), 5), FloorDiv(2 * x + y, 4)]
    for expr in exprs:
        text = pexpr(expr)
        for xv in range(12):
            for yv in (1, 3):
                want = expr.subs({x: xv, y: yv}).replace(FloorDiv, fd).replace(ModularIndexing, mod)
                assert eval(text, {"x": xv, "y": yv}) == int(want), (text, xv, yv)


def test_slice_of_a_channel_shuffle():
    """A slice of a shuffled view (ShuffleNet's channel shuffle, then ``chunk``): the load's index
    divides a shifted channel, ``(c + 4) // 4``; the gradient of ``cat`` does the same."""
    x = torch.randn(2, 8, 3, device=DEVICE, requires_grad=True)

    def shuffle(t):
        return t.view(2, 2, 4, 3).transpose(1, 2).reshape(2, 8, 3)

    check(lambda t: shuffle(t)[:, 4:] * 2, x.detach())

    def f(x):
        a, b = x.chunk(2, dim=1)
        return (shuffle(torch.cat([a, torch.relu(b * 3)], 1)) ** 2 * torch.arange(8.0, device=x.device)[:, None]).sum()

    _train_check(f, x)


def test_join_dimensions_is_exact_and_joins_contiguous_walks():
    """indexing.join_dimensions: a row-major walk over the dimensions ``unflatten`` split out of a
    flat counter is the counter again, with symbolic sizes too; any other sum (a permuted or
    strided walk, a broadcast) keeps its value at every position."""
    import random

    import sympy

    from tininductor.indexing import flatten, join_dimensions, sym, unflatten

    X = sym("xindex")
    s0 = sym("s0")
    assert join_dimensions(flatten(unflatten(X, [4, 3, 9]), [4, 3, 9])) == X
    assert join_dimensions(flatten(unflatten(X, [2, s0, 768]), [2, s0, 768])) == X
    rng = random.Random(0)
    for _ in range(40):
        sizes = [rng.randint(1, 5) for _ in range(rng.randint(2, 4))]
        dims = unflatten(X, sizes)
        coeffs = [rng.choice([0, 1, 2, 3, 5, 7, 12, 20]) for _ in dims]
        expr = sympy.expand(sum(c * d for c, d in zip(coeffs, dims)) + rng.randint(0, 3))
        joined = join_dimensions(expr)
        numel = 1
        for s in sizes:
            numel *= s
        for k in range(numel):
            assert joined.subs(X, k) == expr.subs(X, k), (sizes, coeffs, expr, joined)


def test_size_expressions_print_as_python_integer_arithmetic():
    """Sizes from the ShapeEnv (sympy's Mod, torch's PythonMod and FloorDiv, a fractional coefficient
    the ShapeEnv knows is exact) print as Python/Triton integer arithmetic, evaluated equal."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, PythonMod

    from tininductor.indexing import pexpr

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    exprs = [sympy.Mod(s0, 8), PythonMod(s0 + 1, s1), FloorDiv(3 * s0, s1 + 1), s0 * s1 / 2, 8 - sympy.Mod(s0, 8)]
    for expr in exprs:
        text = pexpr(expr)
        assert "Mod" not in text and "/" not in text.replace("//", ""), text
        for a, b in ((6, 4), (10, 3), (7, 2)):
            want = expr.subs({s0: a, s1: b})
            if want.is_Integer:
                assert eval(text, {"s0": a, "s1": b}) == int(want), (text, a, b)


def _shuffle_unit(x):
    """ShuffleNet's unit: half the channels pass, half are transformed; then the channels are shuffled."""
    a, b = x.chunk(2, dim=1)
    out = torch.cat((a, torch.relu(b) * 2), 1)
    n, c, h, w = out.shape
    return out.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_index_of_a_loaded_value_is_not_named_before_the_load(backend):
    """The unit's backward writes each slice's gradient at an index computed from a loaded value
    (``tmp // c``, ``tmp % c``): those stay inline, as the named index variables are defined at the
    kernel's top. Compiled (no fallback), its gradient is eager's."""
    torch._dynamo.reset()
    x = torch.randn(2, 8, 3, 5, device=DEVICE, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend=backend):
        out = torch.compile(_shuffle_unit, backend=tininductor.compile_fx)(x)
        grad = torch.randn_like(out)
        out.backward(grad)  # (a backward kernel that failed to compile would raise here)
    _shuffle_unit(ref).backward(grad)
    torch.testing.assert_close(x.grad, ref.grad)
