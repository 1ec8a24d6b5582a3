"""Graded tests for chapter 1 (bytecode and frames): run your code, compare with Python and eager torch.

The tests that need no torch also run on CPython 3.12 and 3.13 (scripts/test_other_pythons.sh),
where the bytecode differs: an answer that only works on one version fails there.
"""
import collections
import math
import sys
import types

import pytest

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the other CPythons have no torch: the torch-free tests still run
    torch = F = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

from course import load
from course.testing import expect_close, expect_equal, expect_raises, expect_true
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


def writes_a_global(a):
    global WRITTEN  # stored, never read: not a name the code needs to run
    WRITTEN = abs(a)
    return a


# ---- Exercise 1.1 ---------------------------------------------------------------------------

@pytest.mark.ch01_1
@pytest.mark.parametrize("fn, expected", [
    (uses_globals, {"torch", "SCALE", "math"}),
    (uses_comprehension, {"sum", "torch", "SCALE"}),
    (uses_inner_function, {"F", "len", "abs", "SCALE"}),
    (writes_a_global, {"abs"}),
])
def test_global_names_match_reference(fn, expected):
    expect_equal(ch.global_names(fn), expected, f"global names of {fn.__name__}",
                 context=format_instructions(fn))


@needs_torch
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

@needs_torch
@pytest.mark.ch01_2
@pytest.mark.parametrize("shape", [(2, 2), (3, 5), (1, 4)])
def test_stack_machine_arithmetic_matches_eager(shape):
    torch.manual_seed(sum(shape))
    x, y = torch.randn(shape), torch.randn(shape)
    expect_close(ch.StackMachine().run(arithmetic, x, y), arithmetic(x, y), "arithmetic(x, y)",
                 context=format_instructions(arithmetic))


@needs_torch
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


@needs_torch
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


@needs_torch
@pytest.mark.ch01_3
def test_call_handler_method_and_self_slots():
    """CPython's own method form: slots ``method, self`` (no NULL); self is the first argument."""
    x = torch.arange(6.0).reshape(2, 3)
    inst = _call_instruction(lambda t: t.sum(1))
    stack = _run_call([torch.Tensor.sum, x, 1], inst)
    expect_equal(len(stack), 1, "stack depth after CALL")
    expect_close(stack[0], x.sum(1), "Tensor.sum(x, 1) from slots (method, self)")


@needs_torch
@pytest.mark.ch01_3
@pytest.mark.parametrize("shape", [(2, 3), (4, 4)])
def test_stack_machine_calls_with_keywords(shape):
    torch.manual_seed(7)
    x, w = torch.randn(shape), torch.randn(shape[1], 5)
    yours, expected = ch.StackMachine().run(calls, x, w), calls(x, w)
    expect_close(yours[0], expected[0], "calls(x, w)[0]", context=format_instructions(calls))
    expect_equal(yours[1], expected[1], "calls(x, w)[1] (the builtin max)")


@needs_torch
@pytest.mark.ch01_3
def test_stack_machine_method_calls():
    x = torch.arange(12.0).reshape(3, 4)
    expect_close(ch.StackMachine().run(method_calls, x), method_calls(x), "method_calls(x)",
                 context=format_instructions(method_calls))


@needs_torch
@pytest.mark.ch01_3
def test_stack_machine_calls_user_functions():
    x = torch.linspace(-1, 1, 6)
    expect_close(ch.StackMachine().run(uses_globals, x), uses_globals(x), "uses_globals(x)")
    expect_equal(ch.StackMachine().run(max_of_three, 3, 9), max_of_three(3, 9), "max_of_three(3, 9)")


def max_of_three(a, b):
    return max(a, b, 5, key=abs)


# ---- Exercise 1.4 ---------------------------------------------------------------------------

@needs_torch
@pytest.mark.ch01_4
def test_histogram_of_straight_code_matches_listing():
    x, y = torch.randn(3, 2), torch.randn(3, 2)
    result, counts = ch.opcode_histogram(straight, x, y)
    expect_close(result, straight(x, y), "opcode_histogram's result")
    static = collections.Counter(i.opname for i in get_instructions(straight) if i.opname != "RESUME")
    expect_equal(dict(counts), dict(static), "opcode counts of straight()", context=format_instructions(straight))


@needs_torch
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


@needs_torch
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


def _raises_after_an_op(x):
    x.sin()
    raise ValueError("bad input")


@needs_torch
@pytest.mark.ch01_5
def test_torch_op_lines_leaves_no_mode_active_when_fn_raises():
    from torch.overrides import _get_current_function_mode_stack

    expect_raises(ValueError, lambda: ch.torch_op_lines(_raises_after_an_op, torch.randn(2)),
                  "torch_op_lines(fn, x) where fn raises ValueError('bad input') after an op (pass it on)",
                  match="bad input")
    active = [type(m).__name__ for m in _get_current_function_mode_stack()]
    expect_equal(active, [], "TorchFunctionModes still active after fn raised inside torch_op_lines "
                             "(leave the mode with a with block or try/finally)")


@needs_torch
@pytest.mark.ch01_5
def test_torch_op_lines_of_code_without_torch_ops():
    result, lines = ch.torch_op_lines(branches, 2.0, 5)
    expect_equal((result, lines), (branches(2.0, 5), {}), "plain numbers run no torch ops")


# ---- torch-free tests: run on every CPython (3.11, 3.12, 3.13) ---------------------------------

def nested_twice(a):
    def outer(b):
        def inner(c):
            return hypot(c, b) + len(str(c))
        return [inner(i) for i in range(b)] + list(map(abs, [b]))
    return outer(a), sorted


hypot = math.hypot


@pytest.mark.ch01_1
def test_global_names_of_code_nested_twice():
    expect_equal(ch.global_names(nested_twice), {"hypot", "len", "str", "range", "list", "map", "abs", "sorted"},
                 "global names of nested_twice (a function inside a function inside it)",
                 context=format_instructions(nested_twice))
    expect_equal(ch.global_names(nested_twice.__code__), ch.global_names(nested_twice),
                 "global_names of the code object vs of the function")


class CheckedMachine:
    """Your StackMachine, with each stack basic checked for its effect on the stack as it runs."""

    EFFECTS = {"LOAD_FAST": +1, "STORE_FAST": -1, "LOAD_CONST": +1, "BINARY_OP": -1, "RETURN_VALUE": -1}

    @classmethod
    def make(cls):
        class Checked(ch.StackMachine):
            def stack_op(self, frame, inst):
                before, local_names = list(frame.stack), dict(frame.locals)
                handled = super().stack_op(frame, inst)
                if inst.opname not in cls.EFFECTS:
                    expect_equal(handled, False, f"stack_op's answer for {inst.opname} (not a stack basic)")
                    expect_true(frame.stack == before and frame.locals == local_names,
                                f"stack_op changed the frame on {inst.opname}, which it must leave alone")
                    return handled
                expect_equal(handled, True, f"stack_op's answer for {inst.opname}")
                change = len(frame.stack) - len(before)
                expect_equal(change, cls.EFFECTS[inst.opname],
                             f"{inst.opname} (line {inst.lineno}) changed the stack depth by {change:+d}")
                if inst.opname == "RETURN_VALUE":
                    expect_equal(frame.stack, [], "the stack after RETURN_VALUE (every value pushed must be popped)")
                    expect_true(frame.returned, "RETURN_VALUE must set frame.returned")
                return handled

        return Checked()


def py_arith(a, b):
    c = a - b
    d = c / 4 - b ** 2 // 3
    e = a % 5 - d
    c = e - c
    return c * 2 - a


def py_loop(n, x):
    total = 0
    while n > 0:
        total = total - x * n
        n = n - 1
    if total < -10:
        total = total + 1
    return total


@pytest.mark.ch01_2
@pytest.mark.parametrize("a, b", [(7, 2), (2.5, -1.0), (-3, 8)])
def test_stack_basics_have_the_right_stack_effects(a, b):
    expect_equal(CheckedMachine.make().run(py_arith, a, b), py_arith(a, b), f"py_arith({a}, {b})",
                 context=format_instructions(py_arith))
    for n in (0, 1, 4):
        expect_equal(CheckedMachine.make().run(py_loop, n, a), py_loop(n, a), f"py_loop({n}, {a})",
                     context=format_instructions(py_loop))


def py_swap(a, b):
    a, b = b, a  # two loads, then two stores: the first STORE_FAST runs with two values on the stack
    c = a - b * 2  # BINARY_OP with three values on the stack
    return c - a


@pytest.mark.ch01_2
@pytest.mark.parametrize("a, b", [(7, 2), (-1.5, 4.0)])
def test_stack_basics_with_two_values_on_the_stack(a, b):
    expect_equal(CheckedMachine.make().run(py_swap, a, b), py_swap(a, b),
                 f"py_swap({a}, {b}) (a, b = b, a; each STORE_FAST pops the top)", context=format_instructions(py_swap))


def py_calls(a, b):
    m = max(a, b, 3, key=abs)
    r = round(a / 3, ndigits=2)
    s = "-".join([str(a), str(b)])
    return divmod(m, 4), r, s.split("-", maxsplit=1), sorted([b, a], reverse=True)


@pytest.mark.ch01_3
@pytest.mark.parametrize("a, b", [(7, -9), (1, 2)])
def test_calls_with_keywords_methods_and_builtins(a, b):
    expect_equal(ch.StackMachine().run(py_calls, a, b), py_calls(a, b), f"py_calls({a}, {b})",
                 context=format_instructions(py_calls))
    expect_equal(ch.StackMachine().run(max_of_three, a, b), max_of_three(a, b), f"max_of_three({a}, {b})")


@pytest.mark.ch01_3
def test_call_handler_on_every_slot_layout():
    """NULL below the callable (3.11/3.12), above it (3.13), and a method load (method, self)."""
    inst = _call_instruction(lambda s: s.split("-", maxsplit=1))
    expect_equal((inst.argval, tuple(inst.kw_names)), (2, ("maxsplit",)), "the CALL instruction (test setup)")
    marker = object()
    bound = "a-b-c".split
    for what, slots in [("NULL, callable", [ch.NULL, bound]), ("callable, NULL", [bound, ch.NULL])]:
        stack = _run_call([marker, *slots, "-", 1], inst)
        expect_equal(stack[1:], [["a", "b-c"]], f"stack after CALL with slots {what}")
        expect_true(stack[0] is marker, f"CALL with slots {what} must leave what was below alone")
    stack = _run_call([marker, str.split, "a-b-c", "-", 1], inst)
    expect_equal(stack[1:], [["a", "b-c"]], "stack after CALL with slots (method, self)")


def py_straight(a, b):
    c = a * b + 1
    d = [c, a, b]
    d.append(c - a)
    return None


def py_helper(v):
    w = v + 1
    return w * 2


def py_looping(n):
    out = 0
    for i in range(n):
        out = out + py_helper(i)
    if out > 100:
        return out
    return None


def py_raises(a):
    b = a + 1
    raise ValueError(f"bad {b}")


def _static_counts(fn):
    return collections.Counter(i.opname for i in get_instructions(fn) if i.opname != "RESUME")


@pytest.mark.ch01_4
def test_histogram_counts_every_normalised_instruction():
    """Straight-line code runs each instruction once; 3.12's RETURN_CONST is LOAD_CONST + RETURN_VALUE."""
    result, counts = ch.opcode_histogram(py_straight, 3, 4)
    expect_equal(result, None, "opcode_histogram's result")
    expect_equal(dict(counts), dict(_static_counts(py_straight)), "opcode counts of py_straight",
                 context=format_instructions(py_straight))


@pytest.mark.ch01_4
@pytest.mark.parametrize("n", [0, 3, 40])
def test_histogram_of_a_loop_counts_only_the_function_itself(n):
    result, counts = ch.opcode_histogram(py_looping, n)
    expect_equal(result, py_looping(n), "opcode_histogram's result")
    reference = tracer.trace(py_looping, n, torch_ops=False).opcode_histogram()
    expect_equal(dict(counts), dict(reference), f"opcode counts of py_looping({n}) (py_helper's own do not count)",
                 context=format_instructions(py_looping))


@pytest.mark.ch01_4
def test_histogram_restores_the_previous_trace_function():
    events = []

    def previous(frame, event, arg):  # a trace function already installed (a debugger, coverage)
        events.append(event)
        return None

    sys.settrace(previous)
    try:
        result, counts = ch.opcode_histogram(py_straight, 1, 2)
        restored = sys.gettrace()
        expect_raises(ValueError, lambda: ch.opcode_histogram(py_raises, 1),
                      "opcode_histogram(py_raises, 1) where py_raises raises ValueError('bad 2') (pass it on)",
                      match="bad 2")
        restored_after_error = sys.gettrace()
    finally:
        sys.settrace(None)
    expect_true(restored is previous, f"after opcode_histogram the trace function is {restored!r}, "
                                      "not the one installed before it: restore sys.gettrace()'s value")
    expect_true(restored_after_error is previous, "when fn raises, opcode_histogram must still restore the "
                                                  f"previous trace function (got {restored_after_error!r})")
    expect_equal(dict(counts), dict(_static_counts(py_straight)), "opcode counts with another tracer installed")
