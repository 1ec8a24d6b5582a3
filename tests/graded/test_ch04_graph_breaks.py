"""Graded: chapter 4's branch handler, resume-function locals, torch.where rewrite and break sites, inside tinydynamo."""
import inspect

import pytest
import torch
import torch._dynamo

import tinydynamo
from course import load
from course.testing import expect_close, expect_equal, expect_raises, expect_true, stack_effect_checked
from tinydynamo.bytecode import get_instructions
from tinydynamo.exc import Unsupported
from tinydynamo.resume import live_locals, make_resume_code
from tinydynamo.symbolic_convert import use_handlers

ch = load("ch04")


def branchy(x):
    y = torch.relu(x)
    if x.sum() > 0:
        return y * 2
    return y - 1


def flag_branch(x, flag):
    if flag:
        return x.sin()
    return x.cos()


def print_between(x):
    a = x.sin()
    print("between ops")
    return a.cos()


def item_branch(x):
    y = x * 2
    if y.sum().item() > 0:
        return y + 1
    return y - 1


def looped(x, n):
    acc = x
    for i in range(n):
        acc = acc * 2
        print(i)
        acc = acc + x
    return acc


#: (graphs, breaks) that torch._dynamo.explain reports for this file's own functions, on any input:
#: written down because a TorchDynamo trace costs a second per grading run (tests/test_course_mechanics.py
#: checks these against torch._dynamo.explain); a learner's function is still explained by torch here
TORCH_EXPLAIN = {"branchy": (2, 1), "print_between": (2, 1), "item_branch": (2, 1)}


def torch_counts(fn, *args):
    if fn.__module__ == __name__ and fn.__name__ in TORCH_EXPLAIN:
        return TORCH_EXPLAIN[fn.__name__]
    return torch_explain_counts(fn, *args)


def torch_explain_counts(fn, *args):
    torch._dynamo.reset()
    out = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return out.graph_count, out.graph_break_count


def line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


BRANCH_EFFECTS = {name: (lambda tx, inst, jumped: -1) for name in ("POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE")}


@pytest.mark.ch04_1
def test_branch_handler_breaks_on_tensor_conditions():
    torch.manual_seed(0)
    with use_handlers(**stack_effect_checked(dict(ch.BRANCH_HANDLERS), BRANCH_EFFECTS)):
        out = tinydynamo.explain(branchy)(torch.randn(5))
        expect_equal((out.graph_count, out.graph_break_count), torch_counts(branchy, torch.randn(5)),
                     "(graphs, breaks) of branchy vs torch._dynamo.explain")
        reason = out.break_reasons[0].reason
        expect_true(reason.startswith("data-dependent branch") and "guard" in reason,
                    f"break reason starts with 'data-dependent branch' and says why no guard decides it (got {reason!r})")
        flag = tinydynamo.explain(flag_branch)(torch.randn(3), True)
        expect_equal((flag.graph_count, flag.graph_break_count), (1, 0), "(graphs, breaks) of `if flag:` (a constant)")
        tinydynamo.reset()
        g = tinydynamo.compile(branchy, backend="eager")
        for shape in [(4,), (3, 2), (6,)]:
            for sign in (1.0, -1.0):
                x = sign * (torch.rand(shape) + 0.1)
                expect_close(g(x), branchy(x), f"compiled branchy on {shape}, sign {sign}")
        h = tinydynamo.compile(flag_branch, backend="eager")
        x = torch.randn(4)
        for flag in (True, False, True):
            expect_close(h(x, flag), flag_branch(x, flag), f"compiled flag_branch(x, {flag})")
        tinydynamo.reset()
        error = expect_raises(Unsupported, lambda: tinydynamo.compile(branchy, backend="eager", fullgraph=True)(
            torch.randn(4)), "branchy(torch.randn(4)) compiled with fullgraph=True (a tensor branch)")
        expect_true("torch.where" in str(error), f"the fullgraph error of branchy names torch.where: {error}")
    tinydynamo.reset()


def branch_in_an_expression(x, flag, items):
    # the conditions are tested while other values sit on the stack; `items` is a list holding a tensor
    return x * 2 + (x.sin() if flag else x.cos()) - (x[0] if items else 0)


@pytest.mark.ch04_1
@pytest.mark.parametrize("flag, full", [(True, True), (False, True), (True, False), (False, False)])
def test_branch_handler_in_one_graph_on_python_conditions(flag, full):
    """Conditions known at trace time (a bool, a list's truth) fold: one graph, no break, with values on the stack."""
    x = torch.randn(3)
    items = [x] if full else []
    with use_handlers(**stack_effect_checked(dict(ch.BRANCH_HANDLERS), BRANCH_EFFECTS)):
        tinydynamo.reset()
        out = tinydynamo.explain(branch_in_an_expression)(x, flag, items)
        expect_equal((out.graph_count, out.graph_break_count), (1, 0),
                     f"(graphs, breaks) of branch_in_an_expression(x, flag={flag}, items={'[x]' if full else '[]'}) "
                     "(a bool and a list's truth are known while tracing: no break)",
                     "\n".join(r.reason for r in out.break_reasons))
        g = tinydynamo.compile(branch_in_an_expression, backend="eager", fullgraph=True)
        expect_close(g(x, flag, items), branch_in_an_expression(x, flag, items),
                     f"branch_in_an_expression(x, flag={flag}, items={'[x]' if full else '[]'}) compiled with fullgraph=True")
    tinydynamo.reset()


@pytest.mark.ch04_2
def test_resume_locals_match_the_package_and_run():
    def straight(x, y, z):
        a = x + y
        print("break")
        return a * z

    cases = [(straight, "print"), (print_between, "print"), (looped, "print"), (item_branch, "item")]
    for fn, marker in cases:
        code = fn.__code__
        insts = get_instructions(code)
        call_line = line_of(fn, marker)
        offsets = sorted({i.offset for i in insts if i.lineno == call_line})
        names = list(code.co_varnames)
        for off in offsets:
            expect_equal(ch.resume_locals(insts, off, names), live_locals(code, off, names),
                         f"resume locals of {fn.__name__} at offset {off}")
    # plug in: resume `straight` after its print (the CALL's result and the frame's live locals)
    code = straight.__code__
    insts = get_instructions(code)
    call = next(i for i in insts if i.opname == "CALL" and i.lineno == line_of(straight, "print"))
    after = next(i.offset for i in insts if i.offset > call.offset)
    names = ch.resume_locals(insts, after, list(code.co_varnames))
    expect_equal(names, ["z", "a"], "locals needed after straight's print")
    resume = make_resume_code(code, after, ["value"], names)
    fn = type(straight)(resume, straight.__globals__)
    for shape in [(3,), (2, 4)]:
        x, y, z = torch.randn(shape), torch.randn(shape), torch.randn(shape)
        expect_close(fn(None, z, x + y), (x + y) * z, f"resume function of straight on {shape}")


@pytest.mark.ch04_3
def test_where_rewrite_is_one_graph_and_equals_eager():
    torch.manual_seed(0)
    probe = torch.tensor([3.0, -1.0, -1.5])  # eagerly first: an unfinished stub raises its own error here
    expect_close(ch.where_rewrite(probe), branchy(probe), "where_rewrite([3.0, -1.0, -1.5]) run eagerly")
    tinydynamo.reset()
    g = tinydynamo.compile(ch.where_rewrite, backend="eager", fullgraph=True)
    for shape in [(4,), (3, 5), (2, 2, 3)]:
        for sign in (1.0, -1.0):
            x = sign * (torch.rand(shape) + 0.1)
            expect_close(g(x), branchy(x), f"where_rewrite vs eager branchy on {shape}, sign {sign}")
    # mixed signs (the branch depends on the sum, not on each element), and a sum of exactly 0
    for x in [torch.tensor([3.0, -1.0, -1.5]), torch.tensor([-3.0, 1.0, 1.5]), torch.zeros(3),
              torch.tensor([[2.0, -2.0], [0.5, -0.5]]), torch.tensor([[3.0, -1.0], [-4.0, 1.0]])]:
        expect_close(g(x), branchy(x), f"where_rewrite vs eager branchy on {x.tolist()}")
    for x in [torch.tensor([float("nan"), 1.0, -2.0]), torch.tensor([2.0, float("nan")])]:  # NaN flows like eager's
        expect_close(g(x), branchy(x), f"where_rewrite vs eager branchy on {x.tolist()} (relu keeps NaN)", equal_nan=True)
    out = tinydynamo.explain(ch.where_rewrite)(torch.randn(4))
    expect_equal((out.graph_count, out.graph_break_count), (1, 0), "(graphs, breaks) of where_rewrite")
    expect_equal(torch_counts(ch.where_rewrite, torch.randn(4)), (1, 0), "torch._dynamo.explain of where_rewrite")
    tinydynamo.reset()


def inner_print(x):
    y = x.cos()
    print("inside a called function")
    return y + 1


def calls_inner(x):
    a = x * 3
    return inner_print(a) - 1


@pytest.mark.ch04_4
def test_break_sites_from_explain():
    x = torch.randn(4)
    nested = tinydynamo.explain(calls_inner)(x)
    expect_equal(ch.break_sites(nested)[:1], [("inner_print", line_of(inner_print, "print(\"inside"))],
                 "the break inside a called function is reported where it happens (the innermost frame)", str(nested))
    cases = [(print_between, (x,), ["print("]), (item_branch, (x,), [".item()"]), (branchy, (x,), ["if x.sum()"]),
             (looped, (x, 2), ["print(i)", "print(i)"])]
    for fn, args, markers in cases:
        out = tinydynamo.explain(fn)(*args)
        expected = [(fn.__name__, line_of(fn, m)) for m in markers]
        # a break after the first one happens in a resume function, which reports its own name
        yours = [(fn.__name__ if name.startswith("__resume_at_") else name, line) for name, line in ch.break_sites(out)]
        expect_equal(yours, expected, f"break sites of {fn.__name__}", str(out))
        if fn is not looped:  # torch 2.13 skips a frame that breaks inside a loop
            expect_equal(len(ch.break_sites(out)), torch_counts(fn, *args)[1],
                         f"number of breaks of {fn.__name__} vs torch._dynamo.explain")
    tinydynamo.reset()


def reads_and_loops(x, y, n):
    a = x + y
    b = a * 2
    for i in range(n):
        b = b + i
        if b.sum() > 0:
            break
    c = y - 1
    while n > 0:
        n = n - 1
        c = c + a
    return c, b


@pytest.mark.ch04_2
@pytest.mark.parametrize("fn", [reads_and_loops, looped, item_branch, print_between])
def test_resume_locals_at_every_offset(fn):
    """Wherever the break happens (every instruction offset), the same locals as the package's live_locals."""
    code = fn.__code__
    insts = get_instructions(code)
    names = list(code.co_varnames)
    for inst in insts:
        expect_equal(ch.resume_locals(insts, inst.offset, names), live_locals(code, inst.offset, names),
                     f"resume locals of {fn.__name__} at offset {inst.offset} ({inst.opname} {inst.argrepr})")


def breaks_then_calls(x):
    a = x.sin()
    print("a break in this function first")
    return inner_print(a)  # then one inside inner_print, whose line comes earlier in the file


@pytest.mark.ch04_4
def test_break_sites_in_the_order_they_happen():
    out = tinydynamo.explain(breaks_then_calls)(torch.randn(3))
    yours = [("breaks_then_calls" if name.startswith("__resume_at_") else name, line) for name, line in ch.break_sites(out)]
    expect_equal(yours[:2], [("breaks_then_calls", line_of(breaks_then_calls, 'print("a break')),
                         ("inner_print", line_of(inner_print, 'print("inside'))],
                 "first two break sites of breaks_then_calls, in the order the breaks happen (not sorted by line)", str(out))
    tinydynamo.reset()


def calls_inner_twice(x):
    return inner_print(x) * inner_print(x + 1)


@pytest.mark.ch04_4
def test_break_sites_repeated_at_one_line():
    out = tinydynamo.explain(calls_inner_twice)(torch.randn(3))
    sites = ch.break_sites(out)
    where = ("inner_print", line_of(inner_print, 'print("inside'))
    expect_equal(sites, [where] * len(out.break_reasons), "one site per break, even when two breaks share a line",
                 str(out))
    expect_true(len(sites) >= 2, f"calls_inner_twice breaks twice (got {len(sites)} sites)")
    tinydynamo.reset()
