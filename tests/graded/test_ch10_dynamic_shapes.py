"""Graded tests for chapter 10: guards on size symbols, sizes over symbols, the recompile policy,
and index expressions of a kernel that takes its sizes as arguments."""
from __future__ import annotations

import itertools

import pytest
import sympy
import torch

from course import load
from course.chapters.ch10_dynamic_shapes import SymInt, check_fn, pointwise_kernel, run_pointwise, simulate_cache
from course.testing import expect_equal, expect_raises, expect_true

ch = load("ch10")
S0, S1, S2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)


def _holds(guards, values) -> bool:
    return all(bool(sympy.sympify(g).xreplace(values)) for g in guards)


# ---- 10.1: guards -----------------------------------------------------------------------------------


def _env():
    env = ch.ShapeEnv()
    s0, s1 = env.create_sizes("x", (6, 8))
    return env, s0, s1


@pytest.mark.ch10_1
def test_evaluate_expr_answers_at_the_example_sizes_and_guards_the_answer():
    env, s0, s1 = _env()
    answers = [env.evaluate_expr(s1 > 4), env.evaluate_expr(sympy.Eq(s0, 8)), env.evaluate_expr(s0 + s1 > 20)]
    expect_equal(answers, [True, False, False], "evaluate_expr at x of size (6, 8): s1 > 4, s0 == 8, s0 + s1 > 20")
    expect_true(all(type(a) is bool for a in answers), "evaluate_expr returns a Python bool",
                context=[type(a).__name__ for a in answers])
    expect_equal(len(env.guards), 3, "one guard per question asked", context=env.guards)
    # the guards must hold exactly where every question has the answer it had at (6, 8)
    for a, b in itertools.product(range(2, 12), repeat=2):
        expected = (b > 4) and a != 8 and not (a + b > 20)
        expect_equal(_holds(env.guards, {s0: a, s1: b}), expected,
                     f"the recorded guards {env.guards} at s0={a}, s1={b}")


@pytest.mark.ch10_1
def test_evaluate_expr_records_a_guard_once_and_none_for_constants():
    env, s0, s1 = _env()
    env.evaluate_expr(s1 > 4)
    env.evaluate_expr(s1 > 4)
    expect_equal(env.evaluate_expr(sympy.Gt(3, 2)), True, "a question without symbols")
    expect_equal(env.evaluate_expr(s0 > 0), True, "s0 > 0 (sympy knows it: the symbol is positive)")
    expect_equal(len(env.guards), 1, "guards after s1 > 4 twice, then two questions without symbols", context=env.guards)


@pytest.mark.ch10_1
def test_a_branch_on_a_size_through_symint_guards_the_relation():
    env, s0, s1 = _env()
    n = SymInt(s1, env)
    taken = "big" if n * 2 > 20 else "small"
    expect_equal(taken, "small", "branch on x.size(1) * 2 > 20 at size 8")
    expect_true(_holds(env.guards, {s0: 6, s1: 10}) and not _holds(env.guards, {s0: 6, s1: 11}),
                "after the branch, sizes that take the other side must fail the guards", context=env.guards)


@pytest.mark.ch10_1
def test_produce_guards_strings_and_what_they_accept():
    env = ch.ShapeEnv()
    s0, s1 = env.create_sizes("x", (6, 8))
    env.create_sizes("y", (6, 1))  # duck sizing: y's 6 is x's s0; 1 is specialised
    env.guards.extend([s1 > 4, sympy.Ne(s0, 8)])
    expected = ["L['y'].size()[0] == L['x'].size()[0]", "2 <= L['x'].size()[0]", "2 <= L['x'].size()[1]",
                "L['x'].size()[1] > 4", "L['x'].size()[0] != 8"]
    guards = env.produce_guards()
    expect_equal(guards, expected, "produce_guards for x (6, 8), y (6, 1) with s1 > 4 and s0 != 8 recorded")
    check = check_fn(guards)
    cases = [((6, 9), (6, 1), True), ((3, 5), (3, 1), True), ((6, 9), (5, 1), False), ((1, 9), (1, 1), False),
             ((6, 4), (6, 1), False), ((8, 9), (8, 1), False)]
    for xs, ys, ok in cases:
        L = {"x": torch.empty(xs), "y": torch.empty(ys)}
        expect_equal(check(L), ok, f"the check function on x {xs}, y {ys}", context=check.source)


# ---- 10.2: sizes over symbols --------------------------------------------------------------------------


@pytest.mark.ch10_2
@pytest.mark.parametrize("a, b, expected", [
    ((S0, 1), (S1,), (S0, S1)),
    ((S0, S1), (1,), (S0, S1)),
    ((1,), (S0, S1), (S0, S1)),
    ((S0, 3), (5, 1, 3), (5, S0, 3)),
    ((2, 1), (1, 3), (2, 3)),
    ((S0, S1), (S0, S1), (S0, S1)),
])
def test_broadcast_without_guards(a, b, expected):
    guards = []
    expect_equal(ch.broadcast_shapes(a, b, guards), expected, f"broadcast_shapes({a}, {b})")
    expect_equal(guards, [], f"guards recorded by broadcast_shapes({a}, {b})")


@pytest.mark.ch10_2
def test_broadcast_of_unequal_sizes_guards_their_equality():
    guards = []
    out = ch.broadcast_shapes((S0, 4), (S1, 4), guards)
    expect_true(out in ((S0, 4), (S1, 4)), "broadcast_shapes((s0, 4), (s1, 4)) is (s0, 4) or (s1, 4)", context=out)
    expect_equal(len(guards), 1, "guards for s0 against s1", context=guards)
    expect_true(_holds(guards, {S0: 3, S1: 3}) and not _holds(guards, {S0: 3, S1: 4}), "the guard is s0 == s1",
                context=guards)
    guards = []
    expect_equal(ch.broadcast_shapes((S0,), (7,), guards), (7,), "broadcast_shapes((s0,), (7,)): the constant wins")
    expect_true(len(guards) == 1 and _holds(guards, {S0: 7}) and not _holds(guards, {S0: 6}), "the guard is s0 == 7",
                context=guards)


@pytest.mark.ch10_2
def test_broadcast_of_two_different_constants_raises():
    expect_raises(ValueError, lambda: ch.broadcast_shapes((S0, 3), (4,), []),
                  "broadcast_shapes((s0, 3), (4,)) (3 against 4 cannot broadcast)")


@pytest.mark.ch10_2
@pytest.mark.parametrize("numel, shape, expected", [
    (S0 * S1 * 4, (S0, -1), (S0, 4 * S1)),
    (S0 * S1 * 4, (-1, 2), (2 * S0 * S1, 2)),
    (12, (3, -1), (3, 4)),
    (S0 * S1, (S1, S0), (S1, S0)),
    (S0 * 6, (-1, 3, 2), (S0, 3, 2)),
])
def test_view_shape(numel, shape, expected):
    got = ch.view_shape(numel, shape)
    expect_true(len(got) == len(expected) and all(sympy.simplify(sympy.sympify(g) - e) == 0 for g, e in zip(got, expected)),
                f"view_shape({numel}, {shape}): yours {got} vs expected {expected}")


@pytest.mark.ch10_2
@pytest.mark.parametrize("numel, shape", [(12, (5, -1)), (12, (-1, -1)), (S0 * 6, (4, -1)), (S0, (S1,)), (12, (3, 5))])
def test_view_shape_refuses(numel, shape):
    expect_raises(ValueError, lambda: ch.view_shape(numel, shape), f"view_shape({numel}, {shape})")


# ---- 10.3: the recompile policy -------------------------------------------------------------------


@pytest.mark.ch10_3
def test_update_frame_state():
    state = ch.update_frame_state(None, (4, 8))
    expect_equal(list(state), [4, 8], "frame state after the first compile at (4, 8)")
    state = ch.update_frame_state(state, (4, 16))
    expect_equal(list(state), [4, None], "then at (4, 16)")
    state = ch.update_frame_state(state, (4, 8))
    expect_equal(list(state), [4, None], "then at (4, 8) again: a dynamic dim stays dynamic")
    expect_equal(list(ch.update_frame_state([4, 8], (4, 8, 2))), [None, None, None], "after a change of rank")


@pytest.mark.ch10_3
@pytest.mark.parametrize("state, sizes, dynamic, marked, expected", [
    ([4, 8], (4, 8), None, (), []),
    ([4, None], (4, 16), None, (), [1]),
    ([None, None], (1, 16), None, (), [1]),
    ([4, 8], (4, 8), True, (), [0, 1]),
    ([4, 1], (4, 1), True, (), [0]),
    ([None, None], (4, 16), False, (), []),
    ([4, 8], (4, 8), False, (1,), [1]),
    ([4, 8], (4, 8), None, (0,), [0]),
    ([1, 8], (1, 8), None, (0,), []),
])
def test_symbolic_dims(state, sizes, dynamic, marked, expected):
    expect_equal(list(ch.symbolic_dims(state, sizes, dynamic, marked)), expected,
                 f"symbolic_dims(state={state}, sizes={sizes}, dynamic={dynamic}, marked={marked})")


# Compile counts of torch.compile (torch 2.13, backend counting frames) on f(x) = (x * 2).sin()
# over these input sizes; mark_dynamic(x, 1) on every input where marked.
SEQUENCES = {
    "A": [(4, 8), (4, 16), (4, 32), (8, 32), (1, 32), (4, 1), (4, 64), (1, 1), (8, 8)],
    "B": [(2, 3, 4), (2, 5, 4), (2, 5, 4), (3, 5, 4), (3, 5, 1), (2, 5, 6), (7, 7, 7)],
    "C": [(4, 8), (4, 8, 2), (4, 16), (5, 8, 2)],
    "D": [(1, n) for n in range(64, 704, 64)],
    "E": [(8, 8), (4, 8), (8, 4), (4, 4), (3, 3)],
    "F": [(0, 8), (2, 8), (3, 8), (0, 9)],
}
TORCH_COUNTS = {  # (sequence, dynamic, marked) -> graphs compiled
    ("A", None, ()): 6, ("A", None, (1,)): 5, ("A", True, ()): 4, ("A", True, (1,)): 4, ("A", False, ()): 8,
    ("A", False, (1,)): 5, ("B", None, ()): 5, ("B", None, (1,)): 4, ("B", True, ()): 2, ("B", True, (1,)): 2,
    ("B", False, ()): 6, ("B", False, (1,)): 5, ("C", None, ()): 3, ("C", True, ()): 2, ("C", False, ()): 4,
    ("D", None, ()): 2, ("D", None, (1,)): 1, ("D", True, ()): 1, ("D", True, (1,)): 1, ("D", False, ()): 8,
    ("D", False, (1,)): 1, ("E", None, ()): 3, ("E", None, (1,)): 2, ("E", True, ()): 2, ("E", True, (1,)): 1,
    ("E", False, ()): 5, ("E", False, (1,)): 3, ("F", None, ()): 3, ("F", None, (1,)): 2, ("F", True, ()): 2,
    ("F", True, (1,)): 2, ("F", False, ()): 4, ("F", False, (1,)): 3,
}


@pytest.mark.ch10_3
def test_the_policy_compiles_as_often_as_torch_compile():
    wrong = []
    for (name, dynamic, marked), count in TORCH_COUNTS.items():
        patterns = simulate_cache(ch.update_frame_state, ch.symbolic_dims, SEQUENCES[name], dynamic, marked)
        if len(patterns) != count:
            wrong.append(f"{name} dynamic={dynamic} marked={marked}: yours {len(patterns)} compiles {patterns} "
                         f"vs torch.compile's {count}")
    expect_true(not wrong, f"{len(wrong)} of {len(TORCH_COUNTS)} call sequences compile a different number of times "
                           f"than torch.compile: {wrong[:1]}", context="\n".join(wrong))


@pytest.mark.ch10_3
def test_the_default_policy_compiles_static_first_then_symbolic():
    expected = [(4, 8), (4, "u1"), ("u0", "u1"), (1, "u1"), ("u0", 1), (1, 1)]
    expect_equal(simulate_cache(ch.update_frame_state, ch.symbolic_dims, SEQUENCES["A"], None), expected,
                 "the graphs compiled for sequence A, dynamic=None")


# ---- 10.4: index expressions over symbols ------------------------------------------------------------


@pytest.mark.ch10_4
@pytest.mark.parametrize("sizes, expected", [
    ((S0, S1, S2), (S1 * S2, S2, 1)),
    ((S0, 4, S1), (4 * S1, S1, 1)),
    ((3, 4), (4, 1)),
    ((5,), (1,)),
    ((), ()),
])
def test_contiguous_strides(sizes, expected):
    got = ch.contiguous_strides(sizes)
    expect_true(len(got) == len(expected) and all(sympy.simplify(sympy.sympify(g) - e) == 0 for g, e in zip(got, expected)),
                f"contiguous_strides({sizes}): yours {got} vs expected {expected}")


CASES = [  # out sizes, input sizes, concrete sizes to try (s0, s1, s2)
    ((S0, S1), (S1,), [(3, 4, 0), (5, 2, 0)]),
    ((S0, S1), (S0, 1), [(3, 4, 0), (2, 6, 0)]),
    ((S0, S1, S2), (S0, 1, S2), [(2, 3, 4), (3, 5, 2)]),
    ((S0, S1, S2), (S1, 1), [(2, 3, 4), (4, 2, 3)]),
    ((S0, S1, S2), (S0, S1, S2), [(2, 3, 4)]),
    ((S0, 3, S1), (3, 1), [(2, 5, 0), (4, 2, 0)]),
]


@pytest.mark.ch10_4
@pytest.mark.parametrize("out_sizes, in_sizes, tries", CASES)
def test_broadcast_index_reads_what_expand_reads(out_sizes, in_sizes, tries):
    expr = ch.broadcast_index(out_sizes, in_sizes, ch.XINDEX)
    for values in tries:
        env = dict(zip((S0, S1, S2), values))
        out = [int(sympy.sympify(s).xreplace(env)) for s in out_sizes]
        shape = [int(sympy.sympify(s).xreplace(env)) for s in in_sizes]
        expected = torch.arange(max(1, torch.Size(shape).numel())).view(shape).expand(out).flatten().tolist()
        got = [int(sympy.sympify(expr).xreplace({**env, ch.XINDEX: i})) for i in range(len(expected))]
        expect_equal(got, expected, f"offsets read by output elements 0.. with out {tuple(out)} from input "
                                    f"{tuple(shape)}", context=f"your expression: {expr}")


@pytest.mark.ch10_4
def test_one_kernel_source_runs_at_every_size():
    out_sizes, shapes = (S0, S1, S2), [(S0, S1, S2), (S0, 1, S2), (S1, 1)]
    source = pointwise_kernel(ch.broadcast_index, "kernel", out_sizes, shapes, "{0} + {1} * {2}")
    for a, b, c in [(2, 3, 4), (3, 5, 2), (4, 2, 7)]:
        x, y, z = torch.randn(a, b, c), torch.randn(a, 1, c), torch.randn(b, 1)
        got = run_pointwise(source, out_sizes, shapes, [x, y, z])
        expect_true(torch.allclose(got, x + y * z, rtol=1e-5, atol=1e-6), f"one kernel source at sizes ({a}, {b}, {c}) against eager",
                    context=source)


# ---- the input classes each piece must handle: a Python bool, sizes 0, constants against symbols --------


@pytest.mark.ch10_1
def test_evaluate_expr_of_a_plain_bool():
    env = ch.ShapeEnv()
    env.create_sizes("L['x']", (4, 5))
    expect_equal(env.evaluate_expr(True), True, "evaluate_expr(True) (a question already answered: a Python bool)")
    expect_equal(env.guards, [], "guards after evaluate_expr(True)")


@pytest.mark.ch10_2
def test_broadcast_and_view_edge_cases():
    guards = []
    expect_equal(ch.broadcast_shapes((3,), (S1,), guards), (3,), "broadcast_shapes((3,), (s1,)) (the constant wins)")
    expect_equal(guards, [sympy.Eq(3, S1)], "guards of broadcast_shapes((3,), (s1,))")
    expect_raises(ValueError, lambda: ch.broadcast_shapes((0, 3), (5, 3), []),
                  "broadcast_shapes((0, 3), (5, 3)) (0 is a size like any other: only 1 broadcasts)")
    got = ch.view_shape(S0 * S1 + S0, (S0, S1 + 1))
    expect_true(all(sympy.simplify(g - e) == 0 for g, e in zip(got, (S0, S1 + 1))),
                f"view_shape(s0*s1 + s0, (s0, s1 + 1)) (the same size written differently): yours {got}")
    got = ch.view_shape(2 * S0 + 2, (-1, S0 + 1))
    expect_equal(tuple(sympy.simplify(g) for g in got), (2, S0 + 1), "view_shape(2*s0 + 2, (-1, s0 + 1))")


@pytest.mark.ch10_3
def test_sizes_zero_and_one_stay_static_even_when_dynamic():
    expect_equal(list(ch.symbolic_dims([None, None, None], (0, 1, 7), True)), [2],
                 "symbolic_dims(state, sizes (0, 1, 7), dynamic=True) (0 and 1 are specialised)")


@pytest.mark.ch10_4
def test_contiguous_strides_is_a_tuple():
    expect_equal(ch.contiguous_strides((S0, 3)), (3, 1), "contiguous_strides((s0, 3))")


@pytest.mark.ch10_2
def test_view_shape_infers_a_simplified_size():
    """The inferred size is simplified: later sizes and guards compare expressions as written (``==``)."""
    got = ch.view_shape(S0**2 + 2 * S0, (S0 + 2, -1))
    expect_equal(tuple(got), (S0 + 2, S0), "view_shape(s0**2 + 2*s0, (s0 + 2, -1)) (the -1 is s0, written as s0)")
    got = ch.view_shape(S0 * S1 + S0, (-1, S1 + 1))
    expect_equal(tuple(got), (S0, S1 + 1), "view_shape(s0*s1 + s0, (-1, s1 + 1)) (the -1 is s0, written as s0)")
