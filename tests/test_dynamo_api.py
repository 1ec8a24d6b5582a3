"""The public surface: backends by name or callable, compile/optimize/reset, config, logs, artifacts."""
import logging

import pytest
import torch

import tinydynamo
from tinydynamo import artifacts, logs
from tinydynamo.testing import CompileCounterWithBackend


def fn(x):
    return torch.nn.functional.gelu(x) * 2 + 1


def test_backend_by_name_and_callable_and_registry():
    tinydynamo.reset()
    x = torch.randn(3)
    torch.testing.assert_close(tinydynamo.compile(fn, backend="eager")(x), fn(x))
    seen = []

    def my_backend(gm, example_inputs):
        seen.append([tuple(t.shape) for t in example_inputs])
        return gm.forward

    tinydynamo.reset()
    torch.testing.assert_close(tinydynamo.compile(fn, backend=my_backend)(x), fn(x))
    assert seen == [[(3,)]]
    tinydynamo.register_backend("mine", my_backend)
    assert "mine" in tinydynamo.list_backends() and {"eager", "aot_eager", "tininductor", "inductor"} <= set(
        tinydynamo.list_backends())
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        tinydynamo.compile(fn, backend="nope")


def test_default_backend_is_config_default():
    assert tinydynamo.config.default_backend in tinydynamo.list_backends()
    assert tinydynamo.lookup_backend(None) is tinydynamo.lookup_backend(tinydynamo.config.default_backend)


@pytest.mark.slow  # ~20 s of C++ compilation on CPU: run with --runslow (done on the GPU machine too)
def test_torch_inductor_backend_plugs_in():
    pytest.importorskip("torch._inductor.compile_fx")
    tinydynamo.reset()
    cnt = CompileCounterWithBackend("inductor")
    x = torch.randn(8)
    g = tinydynamo.optimize(cnt, nopython=True)(lambda t: (t.sin() + 1).relu())
    torch.testing.assert_close(g(x), (x.sin() + 1).relu())
    assert cnt.frame_count == 1


def test_decorator_forms():
    tinydynamo.reset()

    @tinydynamo.compile(backend="eager", fullgraph=True)
    def g(x):
        return x + 1

    @tinydynamo.optimize("eager")
    def h(x):
        return x * 2

    assert torch.equal(g(torch.zeros(1)), torch.ones(1)) and torch.equal(h(torch.ones(1)), torch.full((1,), 2.0))


def test_config_patch_validates_and_restores():
    with tinydynamo.config.patch("recompile_limit", 1):
        assert tinydynamo.config.recompile_limit == 1
    assert tinydynamo.config.recompile_limit == 8
    with pytest.raises(AttributeError, match="no setting 'recompile_limt'"):
        with tinydynamo.config.patch(recompile_limt=1):
            pass


def test_reset_forgets_compiled_frames():
    tinydynamo.reset()
    g = tinydynamo.optimize("eager")(fn)
    g(torch.randn(2))
    assert len(tinydynamo.cache_info(g).entries) == 1 and tinydynamo.counters["frames"]["ok"] == 1
    tinydynamo.reset()
    assert len(tinydynamo.cache_info(g).entries) == 0 and not tinydynamo.counters["frames"]


def test_artifacts_recorded_per_frame():
    tinydynamo.reset()
    tinydynamo.optimize("eager")(fn)(torch.randn(2))
    arts = artifacts.history[-1]
    assert arts.name == "fn"
    kinds = set(arts.items)
    assert {"source", "bytecode", "graph", "guards", "transformed_code"} <= kinds
    assert "def fn(x):" in arts.get("source")[0][1]
    assert "BINARY_OP" in arts.get("bytecode")[0][1]
    assert "gelu" in arts.get("graph")[0][1]
    assert "TENSOR_MATCH" in arts.get("guards")[0][1]


def test_logs_kinds_and_env(monkeypatch, caplog):
    with pytest.raises(ValueError, match="unknown log kind"):
        logs.get_logger("nope")
    monkeypatch.setenv("TINY_LOGS", "guards,graph_code")
    logs._from_env()
    try:
        assert logs.enabled("guards") and logs.enabled("graph_code") and not logs.enabled("bytecode")
        tinydynamo.reset()
        with caplog.at_level(logging.INFO, logger="tinydynamo"):
            logs.get_logger("guards").propagate = True
            logs.get_logger("graph_code").propagate = True
            tinydynamo.optimize("eager")(fn)(torch.randn(2))
        assert "TENSOR_MATCH" in caplog.text and "TRACED GRAPH" in caplog.text
    finally:
        logs.set_logs(guards=False, graph_code=False)


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
def test_tininductor_backends_behind_tinydynamo(backend):
    """The whole stack: capture with tinydynamo, compile with the tininductor layer, train a step."""
    from course.models import TinyBlock

    try:
        tinydynamo.lookup_backend(backend)
    except ValueError as e:
        pytest.skip(str(e))
    torch.manual_seed(0)
    m = TinyBlock(16, 2)
    tinydynamo.reset()
    cm = tinydynamo.compile(m, backend=backend, fullgraph=True)
    x = torch.randn(2, 4, 16, requires_grad=True)
    out = cm(x)
    torch.testing.assert_close(out, m(x), atol=1e-4, rtol=1e-4)
    out.sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-4)


def test_compile_times_account_for_compile_steps_only():
    from tinydynamo.utils import compile_times, reset_compile_times

    tinydynamo.reset()
    reset_compile_times()
    fn = tinydynamo.compile(lambda x: (x.sin() + 1).sum(-1), backend="tininductor")
    x = torch.randn(4, 8)
    torch.testing.assert_close(fn(x), (x.sin() + 1).sum(-1))
    first = compile_times(repr="dict")
    for phase in ("compile_frame", "trace", "backend_compile", "decompose", "lowering", "scheduling", "codegen"):
        assert first[phase][0] == 1 and first[phase][1] > 0, phase
    assert first["trace"][1] < first["compile_frame"][1]  # phases nest: "of which"
    fn(x)  # a cached call: nothing is timed
    assert compile_times(repr="dict") == first
    table = compile_times()
    assert table.splitlines()[0].split() == ["phase", "calls", "total", "s", "mean", "s"]
    assert any(line.startswith("backend_compile") for line in table.splitlines())
    with pytest.raises(ValueError, match="'str' or 'dict'"):
        compile_times(repr="csv")


def test_chromium_event_log_records_full_collections():
    """A full garbage collection inside the block is a span on the thread it ran in (it walks
    every live object: after a compile, tenths of a second wherever it starts); younger
    generations' collections are not spans, and outside the block nothing is recorded."""
    import gc

    from tinydynamo.utils import chromium_event_log

    with chromium_event_log() as log:
        gc.collect(0)
        gc.collect(1)
        assert log.events == []
        gc.collect()
    (span,) = log.events
    assert span.name.startswith("gc: full collection (") and span.track == "MainThread"
    assert 0 <= span.end - span.start < 60
    gc.collect()
    assert len(log.events) == 1


def test_chromium_event_log_records_a_timeline_of_the_compile():
    """Inside ``chromium_event_log()`` each compile phase is a span on its thread's track, nested
    in the frame's compile, with CPU seconds of that thread; a span another layer adds (a kernel
    load) lands on its own track; outside the block nothing is recorded. The Chrome trace has one
    complete event per span and names each track."""
    import json
    import threading

    from tinydynamo.utils import chromium_event_log, log_event

    tinydynamo.reset()
    fn = tinydynamo.compile(lambda x: (x.cos() * 3).sum(-1), backend="tininductor")
    x = torch.randn(4, 8)
    with chromium_event_log() as log:
        torch.testing.assert_close(fn(x), (x.cos() * 3).sum(-1))
        done = threading.Event()
        threading.Thread(target=lambda: (log_event("load k", 1.0, 1.5), done.set()), name="loader").start()
        done.wait(10)
        fn(x)  # cached: no compile step, no span
    names = [e.name for e in log.events]
    for phase in ("compile_frame", "trace", "backend_compile", "lowering", "codegen"):
        assert names.count(phase) == 1, (phase, names)
    frame = next(e for e in log.events if e.name == "compile_frame")
    for e in log.events:
        if e.track == "MainThread" and e is not frame and not e.name.startswith("gc: "):
            assert frame.start <= e.start <= e.end <= frame.end, e
            assert e.cpu is not None and 0 <= e.cpu <= (e.end - e.start) + 0.05, e
    assert next(e for e in log.events if e.name == "load k").track == "loader"
    count = len(log.events)
    log_event("after", 0.0, 1.0)
    tinydynamo.reset()
    tinydynamo.compile(lambda x: x.sin() - 1, backend="tininductor")(x)
    assert len(log.events) == count  # the block is over
    trace = json.loads(json.dumps(log.chrome_trace()))["traceEvents"]
    spans = [t for t in trace if t["ph"] == "X"]
    assert len(spans) == count and all(t["dur"] >= 0 for t in spans)
    # (with an empty kernel cache, g++ builds add a track per build thread)
    assert {"MainThread", "loader"} <= {t["args"]["name"] for t in trace if t["ph"] == "M"}
    lines = log.table().splitlines()
    assert lines[0].split() == ["start", "end", "wall", "s", "cpu", "s", "track", "name"]
    assert len(lines) == count + 1 and any(line.endswith("compile_frame") for line in lines)


def test_full_collections_wait_while_a_frame_compiles():
    """config.defer_full_gc: generation 2's threshold is raised while the backend runs, nested
    blocks leave it to the outermost, and it is restored after (also after an error); off: untouched."""
    import gc

    from tinydynamo.utils import deferred_full_collections

    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.get_threshold())
        return gm.forward

    before = gc.get_threshold()
    tinydynamo.reset()
    tinydynamo.compile(lambda x: x.cos() * 2, backend=backend)(torch.randn(3))
    assert seen and seen[0][:2] == before[:2] and seen[0][2] > 10**6
    assert gc.get_threshold() == before
    with deferred_full_collections():
        with deferred_full_collections():
            inner = gc.get_threshold()
        assert gc.get_threshold() == inner and inner[2] > 10**6
    assert gc.get_threshold() == before
    with pytest.raises(ZeroDivisionError), deferred_full_collections():
        1 / 0
    assert gc.get_threshold() == before
    seen.clear()
    with tinydynamo.config.patch(defer_full_gc=False):
        tinydynamo.reset()
        tinydynamo.compile(lambda x: x.sin() * 2, backend=backend)(torch.randn(3))
    assert seen == [before]


def test_builtins_and_op_overloads_compile_through_a_python_frame():
    from tinydynamo.testing import CompileCounter

    x = torch.randn(4)
    for fn in (torch.add, torch.ops.aten.mul.Tensor):
        cnt = CompileCounter()
        assert torch.equal(tinydynamo.compile(fn, backend=cnt, fullgraph=True)(x, x), fn(x, x))
        assert cnt.frame_count == 1


def test_an_active_torch_dispatch_mode_runs_the_frame_eagerly():
    from torch.utils._python_dispatch import TorchDispatchMode

    from tinydynamo.testing import CompileCounter

    seen = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    cnt = CompileCounter()
    compiled = tinydynamo.compile(lambda x: x.sin() + 1, backend=cnt)
    x = torch.randn(3)
    with Recording():
        out = compiled(x)
    assert torch.equal(out, x.sin() + 1) and cnt.frame_count == 0  # the mode saw eager's ops
    assert torch.ops.aten.sin.default in seen
    compiled(x)
    assert cnt.frame_count == 1  # outside the mode it compiles
