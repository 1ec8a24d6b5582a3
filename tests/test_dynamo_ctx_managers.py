"""Grad-mode `with` blocks: traced into the graph, graph breaks inside them resumed, the decompiled view."""
import sys
import threading

import pytest
import torch
import torch._dynamo

import tinydynamo
from tinydynamo import artifacts
from tinydynamo.testing import CompileCounter

LOG = []


def no_grad_block(x, w):
    y = x * w
    with torch.no_grad():
        z = y * 2
    return y + z, z


def enable_grad_inside_no_grad(x, w):
    with torch.no_grad():
        a = x * w
        with torch.enable_grad():
            b = a * w
        c = b + 1
    return a, b, c


def set_grad_enabled_both_ways(x, w):
    torch.set_grad_enabled(False)  # a call, not a `with`: switches the mode at once
    a = x * w
    torch.set_grad_enabled(True)
    with torch.set_grad_enabled(False):
        b = a * w
    return a, b, a + w


def return_inside_with(x, w):
    with torch.no_grad():
        return (x * w).sin()


def empty_with(x, w):
    with torch.no_grad():
        pass
    return x * w


def asks_grad_mode(x, w):
    with torch.no_grad():
        scale = 2.0 if torch.is_grad_enabled() else 3.0
    return x * w * scale, torch.is_grad_enabled()


@torch.no_grad()
def decorated_helper(t, w):
    return t * w + 1


@torch.enable_grad()
def decorated_enable(t, w):
    return t * w


def calls_decorated(x, w):
    y = decorated_helper(x, w)
    with torch.no_grad():
        z = decorated_enable(y, w)
    return y, z, y + z * w


def helper_enables_and_breaks(t, w):
    with torch.enable_grad():
        u = t * w
        print("helper")  # a break in an inlined function: the caller's graph ends at the call
        return u + 1


def break_in_inlined_in_no_grad(x, w):
    y = x * w
    with torch.no_grad():
        z = helper_enables_and_breaks(y, w)  # the enable_grad switch right after no_grad's: undone at the break
    return y, z, z * w


CAPTURED = [calls_decorated, asks_grad_mode, no_grad_block, enable_grad_inside_no_grad, set_grad_enabled_both_ways,
            return_inside_with, empty_with]


def print_in_no_grad(x, w):
    y = x * w
    with torch.no_grad():
        z = y * 2
        print("inside no_grad")
        z = z + 1
    return y + z, z


def branch_in_no_grad(x, w):
    y = x * w
    with torch.no_grad():
        if y.sum() > 0:  # a data-dependent jump: both resume functions re-enter no_grad
            z = y * 2
        else:
            z = y - 1
        z = z.cos()
    return y + z, z


def break_in_nested(x, w):
    with torch.no_grad():
        a = x * w
        with torch.enable_grad():
            b = a * w
            print("nested")
            c = b * w
        d = c + 1
    return a, b, c, d


def item_in_set_grad_enabled(x, w):
    with torch.set_grad_enabled(False):
        s = (x * w).sum().item()
        y = w * s
    return y, x + w


BREAKING = [break_in_inlined_in_no_grad, print_in_no_grad, branch_in_no_grad, break_in_nested, item_in_set_grad_enabled]


def inputs():
    torch.manual_seed(0)  # the same branches every time
    x = torch.randn(4)
    return [(x, torch.randn(4, requires_grad=True)), (-x.abs(), torch.randn(4, requires_grad=True)),
            (x.double(), torch.randn(4, dtype=torch.float64, requires_grad=True))]


def same_as_eager(got, want):
    torch.testing.assert_close(got, want)
    for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if not isinstance(e, torch.Tensor):
            assert g == e
            continue
        assert g.requires_grad == e.requires_grad and (g.grad_fn is None) == (e.grad_fn is None)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", CAPTURED + BREAKING, ids=lambda f: f.__name__)
def test_outputs_and_requires_grad_equal_eager(fn, backend, capsys):
    tinydynamo.reset()
    cnt = CompileCounter()
    counting = tinydynamo.optimize(lambda gm, ex: (cnt(gm, ex), tinydynamo.backends.lookup_backend(backend)(gm, ex))[1])
    compiled = counting(fn)
    for x, w in inputs():
        for _ in range(2):
            same_as_eager(compiled(x, w), fn(x, w))
            assert torch.is_grad_enabled()
        with torch.no_grad():  # grad mode is guarded: a recompile, and still equal
            same_as_eager(compiled(x, w), fn(x, w))
        assert torch.is_grad_enabled()
    frames = cnt.frame_count
    for x, w in inputs():
        compiled(x, w)
    assert cnt.frame_count == frames  # cached calls: nothing recompiles
    cache = tinydynamo.cache_info(fn)
    assert cache.run_eagerly is None and len(cache.entries) == 4  # 2 dtypes x grad mode on/off at the call
    if fn in CAPTURED:
        assert not tinydynamo.counters["graph_breaks"] and not tinydynamo.counters["unsupported"]


@pytest.mark.parametrize("fn", CAPTURED, ids=lambda f: f.__name__)
def test_one_graph_with_set_grad_enabled_nodes_like_dynamo(fn):
    x, w = inputs()[0]
    ours, theirs = tinydynamo.explain(fn)(x, w), torch._dynamo.explain(fn)(x, w)
    assert ours.graph_count == theirs.graph_count == 1 and ours.graph_break_count == 0
    functions = [[op.__name__ for op in ops if not isinstance(op, str)] for ops in ours.ops_per_graph]
    assert functions == [[op.__name__ for op in ops] for ops in theirs.ops_per_graph]  # torch lists no methods


@pytest.mark.parametrize("fn", BREAKING, ids=lambda f: f.__name__)
def test_breaks_inside_with_blocks_resume_with_graph_counts_of_dynamo(fn, capsys):
    x, w = inputs()[0]
    ours, theirs = tinydynamo.explain(fn)(x, w), torch._dynamo.explain(fn)(x, w)
    assert ours.graph_count == theirs.graph_count >= 2
    if fn is break_in_inlined_in_no_grad:  # torch counts a break per frame it crosses, tinydynamo per site
        assert (ours.graph_break_count, theirs.graph_break_count) == (2, 3)
    else:
        assert ours.graph_break_count == theirs.graph_break_count
    assert not ours.eager_frames  # resumed, not run eagerly


def test_training_through_a_no_grad_sub_block():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

        def forward(self, x):
            h = self.fc1(x).relu()
            with torch.no_grad():  # a statistic that must not receive gradients
                centre = h.mean(0, keepdim=True) * 0.5
            return (self.fc2(h - centre) ** 2).mean()

    for backend in ("eager", "aot_eager", "tininductor"):
        tinydynamo.reset()
        model = Net()
        compiled = tinydynamo.compile(model, backend=backend)
        for _ in range(2):
            x = torch.randn(5, 6)
            model.zero_grad()
            compiled(x).backward()
            got = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            model(x).backward()
            for g, e in zip(got, [p.grad for p in model.parameters()]):
                torch.testing.assert_close(g, e)
        assert not tinydynamo.counters["unsupported"], backend


def raises_inside_no_grad(x, idx):
    with torch.no_grad():
        y = x.sin()
        return y[idx]  # an index out of range fails only at run time, inside the graph


def test_grad_mode_restored_when_the_compiled_graph_raises():
    tinydynamo.reset()
    compiled = tinydynamo.optimize("eager")(raises_inside_no_grad)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, torch.tensor([1, 2])), raises_inside_no_grad(x, torch.tensor([1, 2])))
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([1, 7]))
    assert torch.is_grad_enabled()


def test_set_grad_enabled_call_leaves_the_mode_like_eager():
    def switch_off(x):
        torch.set_grad_enabled(False)
        return x * 2

    for backend in ("eager", "aot_eager"):
        tinydynamo.reset()
        try:
            out = tinydynamo.optimize(backend)(switch_off)(torch.randn(3, requires_grad=True))
            assert not torch.is_grad_enabled() and not out.requires_grad
        finally:
            torch.set_grad_enabled(True)


def test_resume_function_reenters_the_context():
    tinydynamo.reset()
    compiled = tinydynamo.optimize("eager")(print_in_no_grad)
    compiled(*inputs()[0])
    codes = [code for code in tinydynamo.eval_frame._caches if code.co_name.startswith("__resume_at_")]
    assert len(codes) == 1
    assert "BEFORE_WITH" in {i.opname for i in tinydynamo.bytecode.get_instructions(codes[0])}
    entry = tinydynamo.cache_info(print_in_no_grad).entries[0]
    assert "with ___ctx" in entry.code  # print runs inside no_grad again, after the graph left it


def log_grad_mode():
    LOG.append(torch.is_grad_enabled())


def calls_out_in_no_grad(x):
    y = x * 2
    with torch.no_grad():
        log_grad_mode()  # compiled as its own frame, but it must see grad mode off
        y = y + 1
    log_grad_mode()
    return y


def test_the_unsupported_call_runs_inside_the_context():
    tinydynamo.reset()
    LOG.clear()
    tinydynamo.optimize("eager")(calls_out_in_no_grad)(torch.randn(3, requires_grad=True))
    assert LOG == [False, True]


def in_try_in_no_grad(x):
    try:
        with torch.no_grad():
            print("in try")
            return x + 1
    except ValueError:
        return x


C_LOCK = threading.Lock()  # a context manager written in C (Python-defined ones are inlined: test_dynamo_statements.py)


def in_other_with(x):
    with C_LOCK:
        return x.sin()


def in_inference_mode(x):
    with torch.inference_mode():
        return x.sin()


@pytest.mark.parametrize("fn,reason", [(in_try_in_no_grad, "print"), (in_other_with, "`with` blocks"),
                                       (in_inference_mode, "`with` blocks")])
def test_other_blocks_still_run_eagerly_with_a_reason(fn, reason, capsys):
    tinydynamo.reset()
    cnt = CompileCounter()
    x = torch.randn(3)
    torch.testing.assert_close(tinydynamo.optimize(cnt)(fn)(x), fn(x))
    assert cnt.frame_count == 0
    assert any(reason in r for r in tinydynamo.counters["unsupported"]), dict(tinydynamo.counters["unsupported"])
    assert torch.is_grad_enabled()


def test_debug_dir_holds_the_decompiled_resume_function(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TINY_COMPILE_DEBUG", "1")
    monkeypatch.setenv("TINY_COMPILE_DEBUG_DIR", str(tmp_path))
    tinydynamo.reset()
    tinydynamo.optimize("eager")(print_in_no_grad)(*inputs()[0])
    frame_dir, resume_dir = sorted(tmp_path.iterdir())  # the function, then its resume function
    resume_name = resume_dir.name.split("__resume_at_")[1]
    views = {p.name: p.read_text() for p in frame_dir.glob("transformed_code*.py")}
    decompiled = [text for text in views.values() if "(decompiled)" in text.splitlines()[0]]
    assert len(decompiled) == 1 and f"def __resume_at_{resume_name}(" in decompiled[0]
    assert "with ___stack0" in decompiled[0]  # the resume function enters no_grad again
    for text in views.values():
        compile(text, "view.py", "exec")  # every view is valid Python
    if sys.version_info[:2] == (3, 11):
        # and means what the bytecode does. Only checked on 3.11: on CPython 3.12.3 depyf 0.20 puts
        # the statements after the `with` block inside it (a reading aid, not what runs; the
        # compiled path is checked against eager above on every version)
        ns = {}
        exec(compile(decompiled[0], "view.py", "exec"), {"torch": torch}, ns)
        resume = ns[f"__resume_at_{resume_name}"]
        x, w = inputs()[0]
        y = x * w
        z = resume(torch.no_grad(), None, y, (y * 2).detach())
        same_as_eager(z, print_in_no_grad(x, w))
    source = (resume_dir / "source.py").read_text()
    assert "(decompiled)" in source and f"def __resume_at_{resume_name}(" in source


def test_decompile_falls_back_to_the_bytecode_listing(monkeypatch):
    import sys

    from tinydynamo.decompile import decompile

    monkeypatch.setitem(sys.modules, "depyf", None)  # as if depyf were not installed
    text = decompile(no_grad_block.__code__)
    assert "depyf could not decompile no_grad_block" in text and "BEFORE_WITH" in text
    compile(text, "view.py", "exec")


def test_pytorch_aot_autograd_takes_these_graphs():
    """The graphs follow TorchDynamo's conventions, so PyTorch's own AOT autograd runs them too."""
    backend = torch._dynamo.lookup_backend("aot_eager")
    for fn in (no_grad_block, enable_grad_inside_no_grad, print_in_no_grad):
        tinydynamo.reset()
        for x, w in inputs()[:2]:
            same_as_eager(tinydynamo.optimize(backend)(fn)(x, w), fn(x, w))


@pytest.mark.parametrize("fn", [no_grad_block, enable_grad_inside_no_grad, print_in_no_grad, calls_decorated],
                         ids=lambda f: f.__name__)
def test_tininductor_backend(fn, capsys):
    x, w = inputs()[0]
    for requires_grad in (True, False):
        w = w.detach().requires_grad_(requires_grad)
        tinydynamo.reset()
        same_as_eager(tinydynamo.optimize("tininductor")(fn)(x, w), fn(x, w))
        assert torch.is_grad_enabled()


def test_decompiled_view_never_hangs(monkeypatch):
    """depyf 0.20 loops forever on a resume function entered inside a for loop: compiling must not
    wait for the view, and reading it gives up after the time limit (the dis listing instead)."""
    from tinydynamo import decompile as decompile_mod

    monkeypatch.setattr(decompile_mod, "TIME_LIMIT", 0.5)

    def loop_with_break(x):
        xs = []
        for i in range(3):
            xs.append(x * i)
            if x.sum() > 100:
                xs.pop()
        return xs

    x = torch.randn(4)
    before = list(artifacts.history)
    got = tinydynamo.optimize("eager")(loop_with_break)(x)
    for a, b in zip(got, loop_with_break(x)):
        torch.testing.assert_close(a, b)
    frames = [f for f in artifacts.history if not any(f is b for b in before)]
    views = [value for f in frames for kind in ("transformed_code", "source")
             for title, value in f.get(kind) if "(decompiled)" in title]
    assert views, "the resume functions' decompiled views should be recorded"
    for view in views:
        text = str(view)  # returns: decompiled source, or the commented dis listing with the reason
        compile(text, "<view>", "exec")
