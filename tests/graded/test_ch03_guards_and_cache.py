"""Graded: chapter 3's guard kind, failure reason, check-function generator and cache lookup, inside tinydynamo."""
import types

import pytest
import torch

import tinydynamo
from course import load
from course.testing import expect_close, expect_equal, expect_true
from tinydynamo.eval_frame import use_cache_lookup
from tinydynamo.guards import CheckFunction, Guard, TensorMeta, use_check_codegen, use_guard_kind
from tinydynamo.source import AttrSource, LocalSource, SourceScope
from tinydynamo.testing import CompileCounter

ch = load("ch03")


def scale(x, n):
    return x * n


def compiled(fn):
    tinydynamo.reset()
    cnt = CompileCounter()
    return tinydynamo.optimize(cnt)(fn), cnt


@pytest.mark.ch03_1
def test_constant_match_guard_kind():
    with use_guard_kind("CONSTANT_MATCH", code=ch.constant_match_code):
        scope = SourceScope({})
        for expected, same, different in [(2, [2], [3, True, 2.0, "2"]), (None, [None], [0, False]),
                                          (True, [True], [1, False]), (0.5, [0.5], [1, "0.5"]), ("a", ["a"], ["b"])]:
            check = CheckFunction([Guard("CONSTANT_MATCH", LocalSource("n"), expected)], scope)
            for v in same:
                expect_equal(check({"n": v}, {}), True, f"CONSTANT_MATCH {expected!r} on {v!r}", check.code)
            for v in different:
                expect_equal(check({"n": v}, {}), False, f"CONSTANT_MATCH {expected!r} on {v!r}", check.code)
        g, cnt = compiled(scale)
        x = torch.randn(3)
        for n in (2, 2, 3, True, 3):
            expect_close(g(x, n), scale(x, n), f"scale(x, {n!r})")
        expect_equal(cnt.frame_count, 3, "frames compiled for n = 2, 2, 3, True, 3")


@pytest.mark.ch03_2
def test_tensor_match_failure_reason():
    x = torch.randn(4, 3)
    guard = Guard("TENSOR_MATCH", LocalSource("x"), TensorMeta.of(x))
    cases = [
        (x.clone(), None),
        (torch.randn(5, 3), "tensor L['x'] size mismatch at index 0: expected 4, actual 5"),
        (torch.randn(4, 2), "tensor L['x'] size mismatch at index 1: expected 3, actual 2"),
        (x.double(), "tensor L['x'] dtype mismatch: expected torch.float32, actual torch.float64"),
        (torch.randn(4, 3, 1), "tensor L['x'] rank mismatch: expected 2, actual 3"),
        (torch.randn(3, 4).t(), "tensor L['x'] stride mismatch at index 0: expected 3, actual 1"),
        (x.clone().requires_grad_(), "tensor L['x'] requires_grad mismatch: expected False, actual True"),
        (3.0, "L['x'] type mismatch: expected torch.Tensor, actual float"),
    ]
    for value, expected in cases:
        expect_equal(ch.tensor_match_failure(guard, value), expected, f"reason for {value!r:.40}")
    with use_guard_kind("TENSOR_MATCH", failure=ch.tensor_match_failure):
        g, cnt = compiled(scale)
        g(x, 2)
        g(torch.randn(6, 3), 2)
        expect_equal(tinydynamo.cache_info(g).last_reason,
                     "tensor L['x'] size mismatch at index 0: expected 4, actual 6", "recompile reason")


@pytest.mark.ch03_3
def test_generate_check_code():
    class Cfg:
        eps = 1e-5

    scope = SourceScope({})
    x = torch.randn(2, 3)
    guards = [Guard("GRAD_MODE", None, torch.is_grad_enabled()),
              Guard("TENSOR_MATCH", LocalSource("x"), TensorMeta.of(x)),
              Guard("CONSTANT_MATCH", AttrSource(LocalSource("cfg"), "eps"), 1e-5),
              Guard("SEQUENCE_LENGTH", LocalSource("xs"), (list, 2))]
    code = ch.generate_check_code(guards, scope)
    expect_equal(code.count("def "), 1, "functions in the generated code", code)
    ns = dict(scope.names)
    exec(code, ns)
    check = ns["___check_guards"]
    good = {"x": torch.randn(2, 3), "cfg": Cfg(), "xs": [1, 2]}
    expect_equal(check(good, {}), True, "check on matching inputs", code)
    for bad in ({**good, "x": torch.randn(3, 3)}, {**good, "xs": [1]}, {**good, "x": x.double()}):
        expect_equal(check(bad, {}), False, "check on changed inputs", code)
    with torch.no_grad():
        expect_equal(check(good, {}), False, "check with grad mode off", code)
    with use_check_codegen(ch.generate_check_code):
        g, cnt = compiled(lambda x, xs: x + xs[0] * len(xs))
        for xs in ([1, 2], [3, 4], [1, 2, 3], [5, 6, 7]):
            expect_close(g(x, xs), x + xs[0] * len(xs), f"xs={xs}")
        expect_equal(cnt.frame_count, 4, "frames (the int values are guarded too)")


@pytest.mark.ch03_4
def test_cache_lookup():
    b1, b2 = object(), object()

    def entry(name, backend, ok):
        return types.SimpleNamespace(name=name, backend=backend, check_fn=lambda L, G: ok)

    entries = [entry("new-other", b2, True), entry("new-fail", b1, False), entry("mid", b1, True), entry("old", b1, True)]
    found = ch.lookup_entry(entries, {}, {}, b1)
    expect_equal(getattr(found, "name", found), "mid", "entry found (newest passing one for this backend)")
    expect_equal(ch.lookup_entry(entries[:2], {}, {}, b1), None, "lookup when nothing passes")
    with use_cache_lookup(ch.lookup_entry):
        g, cnt = compiled(lambda x: x.relu() + 1)
        a, b = torch.randn(2), torch.randn(3)
        for t in (a, b, a, b, a):
            expect_close(g(t), t.relu() + 1, f"call on shape {tuple(t.shape)}")
        expect_equal(cnt.frame_count, 2, "frames for shapes (2,), (3,), (2,), (3,), (2,)")
        expect_true(len(tinydynamo.cache_info(g).entries) == 2, "two cache entries")
