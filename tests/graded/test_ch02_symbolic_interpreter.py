"""Graded: chapter 2's opcode handlers, run inside tinydynamo's real translator and compared with eager."""
import pytest
import torch
import torch.nn.functional as F

import tinydynamo
from course import load
from course.testing import expect_close, expect_equal
from tinydynamo.bytecode import format_instructions
from tinydynamo.symbolic_convert import use_handlers
from tinydynamo.testing import CompileCounter

ch = load("ch02")
SCALE = 3.0


def capture(fn, handlers, *input_sets):
    """Compile ``fn`` with the learner's handlers plugged in; compare every input set with eager."""
    tinydynamo.reset()
    cnt = CompileCounter()
    with use_handlers(**handlers):
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
        with use_handlers(**handlers):
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
