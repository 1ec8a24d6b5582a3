"""Graph breaks: split the frame, run the unsupported instruction natively, resume in a new code object."""
import functools
import logging
import zlib

import numpy as np
import pytest
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter

LOG = []


def print_between(x):
    y = x.sin() + 1
    print("between ops")
    return y * 2


def item_in_middle(x):
    s = x.sum().item()
    return x * s + 1


def data_dependent(x, y):
    z = x + y
    if z.sum() > 0:
        z = z * 2
    else:
        z = z - 1
    return z.cos()


def two_breaks(x):
    a = x.relu()
    LOG.append(1)
    b = a + x.mean().item()
    c = torch.from_numpy(np.ones(3, dtype=np.float32))
    return b * c


def helper_with_print(t):
    t = t * 3
    print("inside helper")
    return t - 1


def break_in_inlined(x):
    return helper_with_print(x + 1).exp()


def keyword_call_break(x):
    y = x + 1
    msg = "x".join(["a", "b"])
    print(msg, sep="|", end="\n")
    return y * len(msg)


CASES = [print_between, item_in_middle, data_dependent, two_breaks, break_in_inlined, keyword_call_break]


def inputs(fn):
    if fn is data_dependent:
        return [(torch.ones(3), torch.ones(3)), (-torch.ones(3), -torch.ones(3))]  # both sides of the branch
    return [(torch.randn(3),), (torch.randn(3),)]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_results_equal_eager_and_cached_calls(fn, capsys):
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt)(fn)
    input_sets = inputs(fn)
    for args in input_sets:
        for _ in range(2):
            torch.testing.assert_close(g(*args), fn(*args))
    frames = cnt.frame_count
    for args in input_sets:
        g(*args)
    if fn is not two_breaks:  # two_breaks grows the global LOG, whose length is guarded: it recompiles
        assert cnt.frame_count == frames  # cached: nothing recompiles
    assert frames >= 2  # split into several graphs


def test_side_effects_not_lost_or_repeated():
    LOG.clear()
    tinydynamo.reset()
    g = tinydynamo.optimize("eager")(two_breaks)
    x = torch.randn(3)
    g(x)
    g(x)
    assert LOG == [1, 1]


def torch_counts(fn, *args):
    torch._dynamo.reset()
    out = torch._dynamo.explain(fn)(*args)
    return out.graph_count, out.graph_break_count


@pytest.mark.parametrize("fn", [print_between, item_in_middle, data_dependent, keyword_call_break],
                         ids=lambda f: f.__name__)
def test_counts_equal_torchdynamo(fn, capsys):
    args = inputs(fn)[0]
    ours = tinydynamo.explain(fn)(*args)
    assert (ours.graph_count, ours.graph_break_count) == torch_counts(fn, *args), str(ours)


def test_break_inside_inlined_function(capsys):
    """The caller's graph ends at the call; the callee is compiled as its own frame (with its own
    break). Graph count equals TorchDynamo's; TorchDynamo reports 3 breaks here (it counts the
    inlined break once per frame plus once more), tinydynamo 2 (one per break site)."""
    x = torch.randn(3)
    ours = tinydynamo.explain(break_in_inlined)(x)
    assert ours.graph_count == torch_counts(break_in_inlined, x)[0] == 4
    assert ours.graph_break_count == 2
    outer = str(ours.break_reasons[0])
    assert outer.index("return helper_with_print(x + 1).exp()") < outer.index('print("inside helper")')


def test_explain_output_reads_like_torch():
    out = tinydynamo.explain(data_dependent)(torch.ones(3), torch.ones(3))
    assert out.graph_count == 2 and out.graph_break_count == 1
    br = out.break_reasons[0]
    assert "data-dependent branch" in br.reason
    assert "if z.sum() > 0:" in str(br) and "test_dynamo_graph_breaks.py" in str(br)
    text = str(out)
    assert text.startswith("Graph Count: 2\nGraph Break Count: 1")
    assert "TENSOR_MATCH" in text
    assert out.op_count == sum(len(ops) for ops in out.ops_per_graph)


def test_fullgraph_raises_at_first_break_with_hint():
    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported, match="data-dependent branch") as info:
        tinydynamo.compile(data_dependent, backend="eager", fullgraph=True)(torch.ones(2), torch.ones(2))
    assert "torch.where" in str(info.value) and "if z.sum() > 0:" in str(info.value)


def c_function_call(x):
    y = x.cos()
    return y + zlib.crc32(b"abc")


def numpy_call(x):
    y = x * 2  # NumPy on constants only (no array to trace as torch ops): NumPy runs it
    return y + torch.from_numpy(np.asarray([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("fn,reason,hint", [
    (c_function_call, "call to zlib.crc32, a C function", "outside the compiled function"),
    (numpy_call, "call to numpy.asarray: numpy runs outside the graph", "torch equivalent"),
])
def test_opaque_calls_are_named_with_a_hint(fn, reason, hint):
    tinydynamo.reset()
    x = torch.randn(3)
    assert reason in tinydynamo.explain(fn)(x).break_reasons[0].reason
    torch.testing.assert_close(tinydynamo.compile(fn, backend="eager")(x), fn(x))
    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported, match=reason) as info:
        tinydynamo.compile(fn, backend="eager", fullgraph=True)(x)
    assert hint in str(info.value)


def test_cached_call_does_not_enter_the_interpreter(monkeypatch):
    from tinydynamo import symbolic_convert

    tinydynamo.reset()
    g = tinydynamo.optimize("eager")(data_dependent)
    for args in inputs(data_dependent):
        g(*args)

    def boom(*a, **k):
        raise AssertionError("the interpreter ran on a cached call")

    monkeypatch.setattr(symbolic_convert.InstructionTranslatorBase, "step", boom)
    for args in inputs(data_dependent):
        torch.testing.assert_close(g(*args), data_dependent(*args))


def test_transformed_code_is_readable():
    tinydynamo.reset()
    g = tinydynamo.optimize("eager")(print_between)
    g(torch.randn(2))
    code = tinydynamo.cache_info(g).entries[0].code
    assert "___compiled_fn(L['x'])" in code and "___resume" in code


def test_show_lists_every_frame_and_debug_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TINY_COMPILE_DEBUG", "1")
    monkeypatch.setenv("TINY_COMPILE_DEBUG_DIR", str(tmp_path))
    view = tinydynamo.show(print_between, torch.ones(2))
    torch.testing.assert_close(view.result, print_between(torch.ones(2)))
    names = [f.name for f in view.frames]
    assert names[0] == "print_between" and names[1].startswith("print_between.__resume_at_")
    text = str(view)
    assert "transformed_code" in text and "___resume" in text and "TENSOR_MATCH" in text
    assert "<pre>" in view._repr_html_()
    dirs = sorted(p.name for p in tmp_path.iterdir())
    assert len(dirs) == 2 and (tmp_path / dirs[0] / "transformed_code.py").exists()
    assert (tmp_path / dirs[0] / "bytecode.txt").read_text().count("CALL") >= 1


def loop_print(x):
    for i in range(3):
        x = x + i
        print(i)
    return x.sin()


def test_break_inside_a_loop_resumes_with_the_rest_of_the_loop(capsys):
    """The loop's iterator travels to the resume function as a list of the remaining items (made an
    iterator again by the prologue), so each resume function traces — and unrolls — the rest."""
    x = torch.randn(3)
    out = tinydynamo.explain(loop_print)(x)
    assert (out.graph_count, out.graph_break_count) == (4, 3)
    assert out.ops_per_graph[-1] == ["sin"]
    tinydynamo.reset()
    g = tinydynamo.optimize("eager")(loop_print)
    for _ in range(2):
        torch.testing.assert_close(g(x), loop_print(x))
    assert capsys.readouterr().out.split() == ["0", "1", "2"] * 5  # explain, then 2 x (compiled + eager)


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.calls = 0
        self.last = None

    def forward(self, x, cache: dict):
        y = self.fc(x)
        self.last = "seen"  # attribute writes on the module: done for real at a graph break
        cache["y"] = y  # a write into a dict from outside
        return y.relu()


def test_stores_to_outside_objects_happen_exactly_once():
    m, ref = Counter(), Counter()
    ref.load_state_dict(m.state_dict())
    tinydynamo.reset()
    cm = tinydynamo.compile(m, backend="eager")
    x = torch.randn(2, 3)
    c1, c2 = {}, {}
    torch.testing.assert_close(cm(x, c1), ref(x, c2))
    assert m.last == "seen" and set(c1) == {"y"}
    torch.testing.assert_close(c1["y"], c2["y"])
    g = tinydynamo.optimize("eager")(_set_global)
    g(5)
    assert GLOBAL_STATE == 5


GLOBAL_STATE = 0


def _set_global(v):
    global GLOBAL_STATE
    GLOBAL_STATE = v
    return v + 1


def shared_list(x):
    xs = [x]
    xs.append(print("break while the list's bound method is on the stack") or x * 2)
    xs.append(x + 1)
    return xs


def test_a_list_stays_one_object_across_a_break(capsys):
    tinydynamo.reset()
    g = tinydynamo.optimize("eager")(shared_list)
    x = torch.randn(2)
    out = g(x)
    assert len(out) == 3
    torch.testing.assert_close(out, shared_list(x))
    assert "___t0 = [" in tinydynamo.cache_info(g).entries[0].code


def test_resume_functions_get_only_live_locals():
    def f(x, unused):
        y = x + 1
        if y.sum() > 0:
            return y * 2
        return y

    tinydynamo.reset()
    g = tinydynamo.optimize("eager")(f)
    g(torch.ones(2), torch.ones(5))
    g(torch.ones(2), torch.ones(6))  # `unused` changed shape: only the first frame (which guards it) recompiles
    recompiles = dict(tinydynamo.counters["recompiles"])
    assert [n.rsplit(".", 1)[-1] for n in recompiles] == ["f"] and sum(recompiles.values()) == 1, recompiles


# ---- a frame that runs eagerly still compiles what it calls ---------------------------------------
class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


class _OpaqueDescriptor:  # a descriptor tinydynamo does not model: reading it is unsupported
    def __get__(self, obj, cls):
        return 2.0


class _Config:
    scale = _OpaqueDescriptor()


_CONFIG = _Config()


class _OuterBreaksLM(torch.nn.Module):
    """A model whose outermost forward cannot be compiled (unsupported in the frame itself, or a
    break inside ``try``): its blocks, a Sequential of blocks and its helpers still get graphs."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(2)])
        self.seq = torch.nn.Sequential(_Block(), _Block())
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        try:
            h = x * _CONFIG.scale if self.how == "unsupported" else x
            if self.how == "try":
                print("a break inside try")
            for b in self.blocks:
                h = b(h)
            return self.head(self.seq(h))
        finally:
            pass


@pytest.mark.parametrize("how", ["unsupported", "try"])
def test_frame_that_runs_eagerly_compiles_its_callees(how, capsys):
    torch.manual_seed(0)
    m = _OuterBreaksLM(how)
    cnt = CompileCounter()
    g = tinydynamo.compile(m, backend=cnt)
    x = torch.randn(2, 8)
    for _ in range(2):
        torch.testing.assert_close(g(x), m(x))
    # each block of the ModuleList (its own guards: one entry each), and the Sequential's two blocks in one graph
    assert cnt.frame_count == 3
    assert cnt.op_count == 3 * 2 + 6


@functools.lru_cache(None)
def _warning_once(self, *args):
    self.warning(*args)


def test_lru_cache_method_on_a_library_object_does_not_break(caplog):
    """transformers' ``logger.warning_once``: an ``lru_cache`` wrapper stored on ``logging.Logger``,
    bound to the logger as a method. Called with constants it runs at trace time (the warning is
    logged once, as in eager) and the forward compiles in one graph."""
    logger = logging.getLogger("tinydynamo.test.warning_once")
    logging.Logger.tiny_warning_once = _warning_once
    try:
        class LM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = torch.nn.ModuleList([_Block() for _ in range(2)])

            def forward(self, x):
                logger.tiny_warning_once("%s is deprecated", "this")
                for b in self.blocks:
                    x = b(x)
                return x

        m = LM()
        cnt = CompileCounter()
        g = tinydynamo.compile(m, backend=cnt)
        x = torch.randn(2, 8)
        with caplog.at_level(logging.WARNING, logger="tinydynamo.test.warning_once"):
            for _ in range(3):
                torch.testing.assert_close(g(x), m(x))
        assert cnt.frame_count == 1 and cnt.op_count == 6
        assert [r.getMessage() for r in caplog.records if r.name == logger.name] == ["this is deprecated"]
    finally:
        del logging.Logger.tiny_warning_once
