"""Graded: chapter 2's opcode handlers, run inside tinydynamo's real translator and compared with eager."""
import pytest
import torch
import torch.nn.functional as F

import tinydynamo
from course import load
from course.testing import expect_close, expect_equal, expect_raises, stack_effect_checked
from tinydynamo.bytecode import format_instructions
from tinydynamo.symbolic_convert import use_handlers
from tinydynamo.testing import CompileCounter

ch = load("ch02")
SCALE = 3.0


# How each handler changes the depth of the stack (``jumped``: it set tx.ip). The translator relies
# on it: a handler that reads a value without popping it leaves garbage for the code that follows.
EFFECTS = {
    "BINARY_OP": lambda tx, inst, jumped: -1,
    "POP_JUMP_IF_FALSE": lambda tx, inst, jumped: -1,
    "POP_JUMP_IF_TRUE": lambda tx, inst, jumped: -1,
    "CALL": lambda tx, inst, jumped: -(inst.argval + 1),  # two call slots and the arguments, then the result
    "FOR_ITER": lambda tx, inst, jumped: -1 if jumped else +1,
}


def capture(fn, handlers, *input_sets):
    """Compile ``fn`` with the learner's handlers plugged in; compare every input set with eager.

    Every handler call is checked for its stack effect, and the stack must be empty at the return.
    """
    tinydynamo.reset()
    cnt = CompileCounter()
    with use_handlers(**stack_effect_checked(handlers, EFFECTS)):
        compiled = tinydynamo.optimize(cnt, nopython=True)(fn)
        for args in input_sets:
            expect_close(compiled(*args), fn(*args), f"{fn.__name__}{tuple(tuple(a.shape) if hasattr(a, 'shape') else a for a in args)}",
                         context=format_instructions(fn))
    return cnt


def arith(x, y):
    z = x * SCALE + y
    z -= 1
    return z @ y.T / 2, 2 ** 3 + z.shape[0]


def branches(x, flag: bool, mode: str):
    if flag:
        x = x + 1
    else:
        x = x - 1
    if mode == "relu" and not flag:
        x = x.relu()
    return x if x.dim() == 2 else None


def calls(x, y):
    a = F.softmax(x, dim=-1)
    b = torch.cat([x, y], dim=0).sum(dim=0, keepdim=True)
    return a.transpose(0, 1), b.view(-1), max(1, 2, key=lambda v: -v)


def loops(x, n: int):
    out = []
    for i in range(n):
        out.append(x * i)
    for t in out[1:]:
        x = x + t
    return x, len(out)


def _rand(*shape):
    return torch.randn(*shape)


@pytest.mark.ch02_1
def test_binary_op():
    cnt = capture(arith, {"BINARY_OP": ch.BINARY_OP}, (_rand(4, 3), _rand(4, 3)), (_rand(4, 3), _rand(4, 3)))
    expect_equal(cnt.op_count, 6, "ops in the graph of arith (mul, add, isub, getattr T, matmul, truediv)")


@pytest.mark.ch02_2
def test_pop_jump_if():
    handlers = {"POP_JUMP_IF_FALSE": ch.POP_JUMP_IF_FALSE, "POP_JUMP_IF_TRUE": ch.POP_JUMP_IF_TRUE}
    x = _rand(3, 2)
    for flag, mode in [(True, "relu"), (False, "relu"), (False, "id")]:
        tinydynamo.reset()
        cnt = CompileCounter()
        with use_handlers(**stack_effect_checked(handlers, EFFECTS)):
            out = tinydynamo.optimize(cnt, nopython=True)(branches)(x, flag, mode)
        expect_close(out, branches(x, flag, mode), f"branches(x, {flag}, {mode!r})", context=format_instructions(branches))
        expect_equal(cnt.op_count, 2 if (mode == "relu" and not flag) else 1,
                     f"ops for flag={flag}, mode={mode!r} (the branch not taken must leave no node)")


@pytest.mark.ch02_3
def test_call():
    cnt = capture(calls, {"CALL": ch.CALL}, (_rand(2, 5), _rand(3, 5)), (_rand(2, 5), _rand(3, 5)))
    expect_equal(cnt.frame_count, 1, "frames compiled")
    expect_equal(cnt.op_count, 5, "ops in the graph of calls (softmax, cat, sum, transpose, view)")


@pytest.mark.ch02_4
def test_for_iter():
    cnt = capture(loops, {"FOR_ITER": ch.FOR_ITER}, (_rand(3), 4), (_rand(3), 4))
    expect_equal(cnt.op_count, 3 + 3, "ops after unrolling both loops (muls by 1, 2, 3 and 3 adds; x * 0 is unused)")


def operators(x, y, n: int):
    a = x - y
    b = y / (x.abs() + 1)
    c = (n - 1) // 2 + n % 3 - n ** 2
    a -= b
    return a * c, x ** 2 - y, b @ a.T, n - 10


@pytest.mark.ch02_1
@pytest.mark.parametrize("n", [0, 3, 7])
def test_binary_op_operand_order_and_inplace_forms(n):
    """Non-commutative operators on tensors and constants: the top of the stack is the right operand."""
    cnt = capture(operators, {"BINARY_OP": ch.BINARY_OP}, (_rand(3, 3), _rand(3, 3), n))
    expect_equal(cnt.frame_count, 1, "frames compiled")


def inplace_on_an_input(x, y):
    x += y  # in place: the caller's tensor changes too
    return x * 2


@pytest.mark.ch02_1
def test_binary_op_inplace_operator_mutates_the_input():
    """`x += y` on a tensor is torch's add_ on x itself: the caller sees its tensor changed."""
    x, y = _rand(2, 3), _rand(2, 3)
    eager_x, yours_x = x.clone(), x.clone()
    expected = inplace_on_an_input(eager_x, y)
    tinydynamo.reset()
    with use_handlers(**stack_effect_checked({"BINARY_OP": ch.BINARY_OP}, EFFECTS)):
        out = tinydynamo.optimize(CompileCounter(), nopython=True)(inplace_on_an_input)(yours_x, y)
    expect_close(out, expected, "inplace_on_an_input(x, y) (x += y; return x * 2)")
    expect_close(yours_x, eager_x, "the caller's x after inplace_on_an_input(x, y): `x += y` must change it in place")
    tinydynamo.reset()


def nested_branches(x, a: int, b, items: list):
    y = x
    if a > 2 and b is not None:
        y = y * 2
    if not items or a == 0:
        y = y + 1
    elif b:
        y = y - 3
    while a > 0:
        a = a - 1
        y = y + a
    return y


@pytest.mark.ch02_2
@pytest.mark.parametrize("a, b, items", [(3, 1, [1]), (0, None, []), (5, 0, [2]), (1, "s", [])])
def test_pop_jump_if_in_loops_and_conditions(a, b, items):
    capture(nested_branches, {"POP_JUMP_IF_FALSE": ch.POP_JUMP_IF_FALSE, "POP_JUMP_IF_TRUE": ch.POP_JUMP_IF_TRUE},
            (_rand(2, 2), a, b, items))


def on_an_argument(x, n: int):
    if n > 2:
        return x + n
    return x * n


@pytest.mark.ch02_2
def test_pop_jump_if_decided_on_an_argument_stays_right_for_other_values():
    """The branch folds at trace time on n's value; the compiled code must not be reused for an n on the
    other side (the guard on n sends it to a new compile)."""
    handlers = {"POP_JUMP_IF_FALSE": ch.POP_JUMP_IF_FALSE, "POP_JUMP_IF_TRUE": ch.POP_JUMP_IF_TRUE}
    tinydynamo.reset()
    cnt = CompileCounter()
    x = _rand(3)
    with use_handlers(**stack_effect_checked(handlers, EFFECTS)):
        compiled = tinydynamo.optimize(cnt, nopython=True)(on_an_argument)
        for n in (3, 0, 3, 2, 5):
            expect_close(compiled(x, n), on_an_argument(x, n), f"on_an_argument(x, n={n}) after calls with other n",
                         context=format_instructions(on_an_argument))
    expect_equal(cnt.op_count, cnt.frame_count, "ops per compiled graph of on_an_argument (one: the side taken)")
    tinydynamo.reset()


def on_a_tensor(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@pytest.mark.ch02_2
def test_pop_jump_if_on_a_tensor_is_not_decided_while_tracing():
    """A tensor's truth exists only when the graph runs: the translator must break the graph there (both
    sides stay reachable), never fold the branch on the example value of the first call."""
    handlers = {"POP_JUMP_IF_FALSE": ch.POP_JUMP_IF_FALSE, "POP_JUMP_IF_TRUE": ch.POP_JUMP_IF_TRUE}
    tinydynamo.reset()
    with use_handlers(**stack_effect_checked(handlers, EFFECTS)):
        compiled = tinydynamo.optimize(CompileCounter())(on_a_tensor)
        for sign in (1.0, -1.0, 1.0):
            x = torch.full((2, 3), sign)
            expect_close(compiled(x), on_a_tensor(x), f"on_a_tensor(x) with x.sum() = {6 * sign:+}",
                         context=format_instructions(on_a_tensor))
        tinydynamo.reset()
        expect_raises(tinydynamo.Unsupported,
                      lambda: tinydynamo.optimize(CompileCounter(), nopython=True)(on_a_tensor)(torch.ones(2)),
                      "on_a_tensor(torch.ones(2)) with nopython=True (a branch on a tensor cannot be traced)")
    tinydynamo.reset()


def helper(t, scale=1.0, *, shift=0.0):
    return t * scale + shift


def more_calls(x, y):
    a = helper(x, 2.0, shift=1.0)
    b = helper(y, shift=-1.0)
    c = torch.clamp(x - y, max=0.5, min=-0.5)
    return a.add(b, alpha=3), c.sum(1, keepdim=True), len([a, b, c])


@pytest.mark.ch02_3
def test_call_keywords_methods_and_user_functions():
    cnt = capture(more_calls, {"CALL": ch.CALL}, (_rand(3, 4), _rand(3, 4)))
    expect_equal(cnt.frame_count, 1, "frames compiled")


def loop_shapes(x, xs: list, n: int):
    total = x
    for t in xs:
        total = total + t
    for i in range(n):
        for j in range(2):
            total = total * (i + j + 1)
    for _ in []:
        total = total - 100
    return total


@pytest.mark.ch02_4
@pytest.mark.parametrize("n", [0, 1, 3])
def test_for_iter_nested_and_empty_loops(n):
    capture(loop_shapes, {"FOR_ITER": ch.FOR_ITER}, (_rand(2), [_rand(2), _rand(2)], n))


class FakeTx:
    """Just the stack part of a translator, to run one CALL handler on a prepared stack."""

    def __init__(self, stack):
        self.stack = list(stack)
        self.ip = 0

    def push(self, value):
        self.stack.append(value)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items


class FakeCallable:
    """A callable variable that records how it was called."""

    def __init__(self, name):
        self.name = name
        self.calls = []

    def call_function(self, tx, args, kwargs):
        self.calls.append((list(args), dict(kwargs)))
        return f"result of {self.name}"

    def __repr__(self):
        return self.name


@pytest.mark.ch02_3
@pytest.mark.parametrize("slots", ["NULL first", "NULL second", "method and self"])
def test_call_reads_both_slot_orders_and_self(slots):
    """The two slots as CPython 3.11/3.12 (NULL below), 3.13 (NULL above) and a method load (method, self) leave them."""
    from tinydynamo.bytecode import get_instructions
    from tinydynamo.variables import NULL

    inst = [i for i in get_instructions(lambda o, a, b: o.m(a, k=b)) if i.opname == "CALL"][-1]
    expect_equal((inst.argval, tuple(inst.kw_names)), (2, ("k",)), "the CALL instruction (test setup)")
    fn, self_ = FakeCallable("fn"), FakeCallable("self")
    marker = object()
    bottom = {"NULL first": [NULL, fn], "NULL second": [fn, NULL], "method and self": [fn, self_]}[slots]
    tx = FakeTx([marker, *bottom, "a", "b"])
    ch.CALL(tx, inst)
    lead = [self_] if slots == "method and self" else []
    expect_equal(fn.calls, [(lead + ["a"], {"k": "b"})], f"how the callable was called ({slots})")
    expect_equal(len(tx.stack), 2, "stack depth after CALL (the result on what was below)")
    expect_equal(tx.stack[0] is marker, True, "CALL must leave what was below its slots alone")
    expect_equal(tx.stack[1], "result of fn", "pushed result")
