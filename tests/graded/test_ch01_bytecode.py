"""Graded tests for chapter 1 (bytecode and frames): run your code, compare with Python and eager torch."""
import collections
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from course import load
from course.testing import expect_close, expect_equal, expect_true
from tinydynamo import tracer
from tinydynamo.bytecode import format_instructions, get_instructions

ch = load("ch01")

SCALE = 0.5


# ---- functions the exercises run on ---------------------------------------------------------

def uses_globals(x):
    return torch.tanh(x) * SCALE + math.pi


def uses_comprehension(xs):
    return sum([torch.sigmoid(x) * SCALE for x in xs])


def uses_inner_function(x):
    def inner(y):
        return F.relu(y) + len(x.shape)

    return inner(x) + abs(SCALE)


def arithmetic(x, y):
    z = x * y + 2.0
    w = z - x / 3
    z = w ** 2
    return z @ z.T


def countdown(x, n):
    while n > 0:
        x = x * 1.5 - 0.25
        n = n - 1
    return -x


def branches(x, k):
    if k > 2:
        y = x + k
    else:
        y = x - k
    return y * y


def calls(x, w):
    h = torch.matmul(x, w)
    h = F.softmax(h, dim=-1)
    s = h.sum(dim=1, keepdim=True)
    return torch.clamp(h / s, min=0.1, max=0.9), max(h.shape)


def method_calls(x):
    y = x.transpose(0, 1).contiguous()
    return y.reshape(-1).cumsum(0)


def looping(x, n):
    for i in range(n):
        x = torch.sin(x) + i
    return x


def straight(x, y):
    a = torch.cos(x) * y
    return a.sum(dim=0)


# ---- Exercise 1.1 ---------------------------------------------------------------------------

@pytest.mark.ch01_1
@pytest.mark.parametrize("fn, expected", [
    (uses_globals, {"torch", "SCALE", "math"}),
    (uses_comprehension, {"sum", "torch", "SCALE"}),
    (uses_inner_function, {"F", "len", "abs", "SCALE"}),
])
def test_global_names_match_reference(fn, expected):
    expect_equal(ch.global_names(fn), expected, f"global names of {fn.__name__}",
                 context=format_instructions(fn))


@pytest.mark.ch01_1
def test_global_names_are_enough_to_run_the_function():
    """Rebuild each function over a globals dict holding only the names you found: it must still run."""
    torch.manual_seed(0)
    for fn, args in [(uses_globals, (torch.randn(3),)), (uses_comprehension, ([torch.randn(2), torch.randn(2)],)),
                     (uses_inner_function, (torch.randn(2, 3),))]:
        names = ch.global_names(fn)
        only = {n: fn.__globals__[n] for n in names if n in fn.__globals__}
        only["__builtins__"] = __builtins__
        rebuilt = types.FunctionType(fn.__code__, only, fn.__name__)
        try:
            yours = rebuilt(*args)
        except NameError as error:
            raise AssertionError(f"{fn.__name__}: a global is missing from your answer: {error}") from None
        expect_close(yours, fn(*args), f"{fn.__name__} run with only your globals")


# ---- Exercise 1.2 ---------------------------------------------------------------------------

@pytest.mark.ch01_2
@pytest.mark.parametrize("shape", [(2, 2), (3, 5), (1, 4)])
def test_stack_machine_arithmetic_matches_eager(shape):
    torch.manual_seed(sum(shape))
    x, y = torch.randn(shape), torch.randn(shape)
    expect_close(ch.StackMachine().run(arithmetic, x, y), arithmetic(x, y), "arithmetic(x, y)",
                 context=format_instructions(arithmetic))


@pytest.mark.ch01_2
@pytest.mark.parametrize("n", [0, 1, 3])
def test_stack_machine_loops_and_branches(n):
    torch.manual_seed(n)
    x = torch.randn(4, dtype=torch.float64)
    expect_close(ch.StackMachine().run(countdown, x, n), countdown(x, n), f"countdown(x, {n})",
                 context=format_instructions(countdown))
    for k in (n, n + 2):
        expect_close(ch.StackMachine().run(branches, x, k), branches(x, k), f"branches(x, {k})")


@pytest.mark.ch01_2
def test_stack_machine_plain_python_values():
    expect_equal(ch.StackMachine().run(countdown, 2.0, 2), countdown(2.0, 2), "countdown(2.0, 2)")
    expect_equal(ch.StackMachine().run(branches, 1, 5), branches(1, 5), "branches(1, 5)")


# ---- Exercise 1.3 ---------------------------------------------------------------------------

def _call_instruction(fn):
    """The (last) normalised CALL instruction of ``fn``."""
    return [i for i in get_instructions(fn) if i.opname == "CALL"][-1]


def _clamp(x):
    return torch.clamp(x, min=0.1, max=0.9)


def _run_call(stack, inst):
    """Run only your CALL handler on a prepared stack; return the stack afterwards."""
    frame = ch.Frame(_clamp, (None,))
    frame.stack = list(stack)
    ch.StackMachine().CALL(frame, inst)
    return frame.stack


@pytest.mark.ch01_3
def test_call_handler_with_null_slot_and_keywords():
    torch.manual_seed(3)
    x = torch.randn(5)
    inst = _call_instruction(_clamp)
    expect_equal((inst.argval, inst.kw_names), (3, ("min", "max")), "the CALL instruction (test setup)")
    marker = object()  # something below the call: CALL must leave it alone
    stack = _run_call([marker, *ch.bytecode.with_null(torch.clamp, ch.NULL), x, 0.1, 0.9], inst)
    expect_equal(len(stack), 2, "stack depth after CALL (one result pushed on what was below)")
    expect_true(stack[0] is marker, "CALL must pop exactly its slots and arguments")
    expect_close(stack[1], _clamp(x), "result of torch.clamp(x, min=0.1, max=0.9)",
                 context=format_instructions(_clamp))


@pytest.mark.ch01_3
def test_call_handler_method_and_self_slots():
    """CPython's own method form: slots ``method, self`` (no NULL); self is the first argument."""
    x = torch.arange(6.0).reshape(2, 3)
    inst = _call_instruction(lambda t: t.sum(1))
    stack = _run_call([torch.Tensor.sum, x, 1], inst)
    expect_equal(len(stack), 1, "stack depth after CALL")
    expect_close(stack[0], x.sum(1), "Tensor.sum(x, 1) from slots (method, self)")


@pytest.mark.ch01_3
@pytest.mark.parametrize("shape", [(2, 3), (4, 4)])
def test_stack_machine_calls_with_keywords(shape):
    torch.manual_seed(7)
    x, w = torch.randn(shape), torch.randn(shape[1], 5)
    yours, expected = ch.StackMachine().run(calls, x, w), calls(x, w)
    expect_close(yours[0], expected[0], "calls(x, w)[0]", context=format_instructions(calls))
    expect_equal(yours[1], expected[1], "calls(x, w)[1] (the builtin max)")


@pytest.mark.ch01_3
def test_stack_machine_method_calls():
    x = torch.arange(12.0).reshape(3, 4)
    expect_close(ch.StackMachine().run(method_calls, x), method_calls(x), "method_calls(x)",
                 context=format_instructions(method_calls))


@pytest.mark.ch01_3
def test_stack_machine_calls_user_functions():
    x = torch.linspace(-1, 1, 6)
    expect_close(ch.StackMachine().run(uses_globals, x), uses_globals(x), "uses_globals(x)")
    expect_equal(ch.StackMachine().run(max_of_three, 3, 9), max_of_three(3, 9), "max_of_three(3, 9)")


def max_of_three(a, b):
    return max(a, b, 5, key=abs)


# ---- Exercise 1.4 ---------------------------------------------------------------------------

@pytest.mark.ch01_4
def test_histogram_of_straight_code_matches_listing():
    x, y = torch.randn(3, 2), torch.randn(3, 2)
    result, counts = ch.opcode_histogram(straight, x, y)
    expect_close(result, straight(x, y), "opcode_histogram's result")
    static = collections.Counter(i.opname for i in get_instructions(straight) if i.opname != "RESUME")
    expect_equal(dict(counts), dict(static), "opcode counts of straight()", context=format_instructions(straight))


@pytest.mark.ch01_4
@pytest.mark.parametrize("n", [0, 2, 5])
def test_histogram_counts_loop_iterations(n):
    before = sys.gettrace()
    x = torch.randn(3)
    result, counts = ch.opcode_histogram(looping, x, n)
    expect_true(sys.gettrace() is before, "opcode_histogram must restore the previous trace function")
    expect_close(result, looping(x, n), "opcode_histogram's result")
    reference = tracer.trace(looping, x, n, torch_ops=False).opcode_histogram()
    expect_equal(dict(counts), dict(reference), f"opcode counts of looping(x, {n})",
                 context=format_instructions(looping))
    expect_equal(counts["FOR_ITER"], n + 1, "FOR_ITER count")


# ---- Exercise 1.5 ---------------------------------------------------------------------------

def _scaled(t):
    return torch.sigmoid(t) * SCALE


def layered(x, w):
    h = x @ w
    h = _scaled(h) + 1
    for _ in range(2):
        h = h.tanh()
    return F.relu(h).mean(dim=-1)


@pytest.mark.ch01_5
@pytest.mark.parametrize("fn, make_args", [
    (layered, lambda: (torch.randn(3, 4), torch.randn(4, 2))),
    (calls, lambda: (torch.randn(2, 3), torch.randn(3, 5))),
    (branches, lambda: (torch.randn(4), 3)),
    (looping, lambda: (torch.randn(2), 3)),
])
def test_torch_op_lines_match_the_tracer(fn, make_args):
    torch.manual_seed(11)
    args = make_args()
    result, lines = ch.torch_op_lines(fn, *args)
    expect_close(result, fn(*args), f"{fn.__name__}'s result")
    reference = tracer.trace(fn, *args, include=lambda code: False).lines_with_ops()
    expect_equal(lines, reference, f"torch ops per line of {fn.__name__}", context=format_instructions(fn))


@pytest.mark.ch01_5
def test_torch_op_lines_of_code_without_torch_ops():
    result, lines = ch.torch_op_lines(branches, 2.0, 5)
    expect_equal((result, lines), (branches(2.0, 5), {}), "plain numbers run no torch ops")
