"""tinydynamo.tracer: settrace events, opcode histograms and torch ops attributed to instructions."""
import collections
import inspect
import sys

import pytest
import torch

from tinydynamo import tracer
from tinydynamo.bytecode import get_instructions


def _line(fn, text):
    """Absolute line number of the first source line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def helper(t):
    return t.sin() * 2


def f(x, y):
    z = torch.relu(x) + y
    w = helper(z)
    return w.sum(dim=0, keepdim=True)


def straight(x, y):
    a = x * y
    b = torch.cos(a) - 1.5
    return b.mean()


def loop(x, n):
    for i in range(n):
        x = x + i
    return x


@pytest.mark.parametrize("shape", [(2, 3), (4,), (1, 5, 2)])
def test_trace_returns_eager_result(shape):
    torch.manual_seed(0)
    x, y = torch.randn(shape), torch.randn(shape)
    t = tracer.trace(f, x, y)
    torch.testing.assert_close(t.result, f(x, y))


def test_ops_are_attributed_to_lines_and_instructions():
    t = tracer.trace(f, torch.randn(2, 2), torch.randn(2, 2))
    assert [(op.name, op.code_name, op.opname) for op in t.ops] == [
        ("torch.relu", "f", "CALL"),
        ("torch.Tensor.add", "f", "BINARY_OP"),
        ("torch.Tensor.sin", "helper", "CALL"),
        ("torch.Tensor.mul", "helper", "BINARY_OP"),
        ("torch.Tensor.sum", "f", "CALL"),
    ]
    assert t.lines_with_ops() == {
        _line(f, "torch.relu"): ["torch.relu", "torch.Tensor.add"],
        _line(f, "w.sum"): ["torch.Tensor.sum"],
    }
    assert t.lines_with_ops("helper") == {_line(helper, "t.sin"): ["torch.Tensor.sin", "torch.Tensor.mul"]}
    assert [op.depth for op in t.ops] == [0, 0, 1, 1, 0]


def test_frames_and_events():
    t = tracer.trace(f, torch.randn(3), torch.randn(3))
    assert t.frames() == ["f", "  helper"]
    kinds = collections.Counter(e.kind for e in t.events)
    assert kinds["call"] == kinds["return"] == 2
    lines = [e.lineno for e in t.events if e.kind == "line" and e.code_name == "f"]
    assert lines == [_line(f, "torch.relu"), _line(f, "helper(z)"), _line(f, "w.sum")]
    text = t.format()
    assert "CALL           2 kw=('dim', 'keepdim')" in text and "-> torch.Tensor.sum" in text
    assert "call helper" in text and "return f -> Tensor(shape=(1,)" in text


def test_straight_line_histogram_matches_static_listing():
    """Without jumps every normalised instruction runs once (RESUME raises no opcode event)."""
    t = tracer.trace(straight, torch.randn(3), torch.randn(3))
    static = collections.Counter(i.opname for i in get_instructions(straight) if i.opname != "RESUME")
    assert t.opcode_histogram() == static


@pytest.mark.parametrize("n", [0, 1, 4])
def test_loop_histogram_counts_iterations(n):
    t = tracer.trace(loop, torch.zeros(2), n)
    hist = t.opcode_histogram()
    assert hist["FOR_ITER"] == n + 1
    assert hist["BINARY_OP"] == n
    assert hist["JUMP_BACKWARD"] == n
    assert [op.name for op in t.ops] == ["torch.Tensor.add"] * n
    torch.testing.assert_close(t.result, loop(torch.zeros(2), n))


def test_lines_only_mode_has_no_opcode_events_but_keeps_ops():
    t = tracer.trace(f, torch.randn(2), torch.randn(2), opcodes=False)
    assert not any(e.kind == "opcode" for e in t.events)
    assert len(t.ops) == 5
    assert "-> torch.relu, torch.Tensor.add" in t.format()


def test_library_python_functions_are_not_watched_but_their_op_is_seen():
    def g(x):
        return torch.nn.functional.silu(x)

    t = tracer.trace(g, torch.randn(4))
    assert t.frames() == ["g"]
    assert [op.name for op in t.ops] == ["torch.nn.functional.silu"]


def test_module_forward_is_watched():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x):
            return torch.tanh(self.fc(x))

    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 3)
    t = tracer.trace(net, x)
    assert t.frames() == ["forward"]
    assert "torch.tanh" in [op.name for op in t.ops]
    torch.testing.assert_close(t.result, net(x))


def test_trace_function_restored_and_exceptions_propagate():
    def boom(x):
        _ = x + 1  # an op traced before the raise
        raise ValueError("no")

    before = sys.gettrace()
    with tracer.FrameTracer() as ft:
        with pytest.raises(ValueError):
            boom(torch.ones(1))
    assert sys.gettrace() is before
    assert [e.kind for e in ft.trace.events if e.kind in ("call", "exception", "return")] == [
        "call", "exception", "return"]
    assert [op.name for op in ft.trace.ops] == ["torch.Tensor.add"]


def test_include_filter_and_bad_input():
    t = tracer.trace(f, torch.randn(2), torch.randn(2), include=lambda code: False)
    assert t.frames() == ["f"]  # the traced function itself is always watched
    assert [op.code_name for op in t.ops] == ["f", "f", "f", "f", "f"]  # helper's ops land on its CALL
    everything = tracer.trace(f, torch.randn(2), torch.randn(2), include=lambda code: True)
    assert not any(e.filename == tracer.__file__ for e in everything.events)  # never traces itself
    assert [op.name for op in everything.ops] == [op.name for op in t.ops]
    with pytest.raises(TypeError, match="needs a callable"):
        tracer.trace(f(torch.ones(1), torch.ones(1)))


# ---- the stored bytecode listings chapter 1 shows (notebooks/data) --------------------------

def _listings_module():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "data" / "make_ch01_listings.py"
    spec = importlib.util.spec_from_file_location("make_ch01_listings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_stored_listings_are_what_the_generator_writes(version):
    """The notebook's 3.11/3.12/3.13 listings come from real runs: regenerate and compare."""
    import json
    import subprocess

    make = _listings_module()
    with open(make.listing_path(version)) as fh:
        stored = json.load(fh)
    assert stored["version"].startswith(version + ".")
    assert set(stored["functions"]) == {"add_relu", "sum_keepdim", "scale_if_big", "running_sum", "squares"}
    if sys.version.startswith(version + "."):
        fresh = make.listings_here()
    else:
        python = make.find_interpreter(version)
        if python is None:
            pytest.skip(f"python{version} not on this machine")
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import make_ch01_listings as m; "
                "print(json.dumps(m.listings_here()))")
        out = subprocess.run([python, "-c", code, str(make.HERE)], capture_output=True, text=True, check=True)
        fresh = json.loads(out.stdout)
    assert fresh["functions"] == stored["functions"], "run: python notebooks/data/make_ch01_listings.py"


_LOOP_SNIPPET = """
from tinydynamo import tracer

def loop(x, n):
    for i in range(n):
        if i % 2:
            x = x + i
    return x

t = tracer.trace(loop, 1, 5, torch_ops=False)
# 3.12+ lay the `if` out the other way round (POP_JUMP_IF_TRUE over a JUMP_BACKWARD): the
# compiler's choice, not a normalisation gap, so conditional jumps are counted together here.
hist = {}
for name, count in t.opcode_histogram().items():
    key = "POP_JUMP_IF_*" if name.startswith("POP_JUMP_IF_") else name
    hist[key] = hist.get(key, 0) + count
summary = {"hist": hist, "result": t.result,
           "kinds": [e.kind for e in t.events if e.kind != "opcode"]}
"""


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_tracer_sees_the_same_opcodes_on_other_pythons(version):
    """Opcode events need care on 3.12 (f_trace before f_trace_opcodes, cpython#103615): run
    the torch-free part of the tracer there and compare the normalised histogram with ours."""
    import json
    import subprocess

    make = _listings_module()
    python = make.find_interpreter(version)
    if python is None:
        pytest.skip(f"python{version} not on this machine")
    program = f"import json, sys; sys.path.insert(0, {str(make.ROOT)!r})\n{_LOOP_SNIPPET}\nprint(json.dumps(summary))"
    out = subprocess.run([python, "-c", program], capture_output=True, text=True, check=True)
    theirs = json.loads(out.stdout)
    here: dict = {}
    exec(compile(_LOOP_SNIPPET, "<loop snippet>", "exec"), here)
    ours = here["summary"]
    assert theirs["result"] == ours["result"] == 1 + 1 + 3
    assert theirs["hist"]["FOR_ITER"] == 6 and theirs["hist"]["BINARY_OP"] == 5 + 2
    assert theirs == ours
