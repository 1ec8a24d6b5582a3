"""tinydynamo.skip_frame on every CPython version (torch-free, like tests/test_bytecode.py): the code
copy whose call passes its callable through ``compile_callee`` computes what the original does, for a
call with keyword names (3.11/3.12 ``KW_NAMES``, 3.13 ``CALL_KW``), a method call and ``f(*a, **k)``."""
import sys

import pytest

from tinydynamo import skip_frame

NULL_FIRST = sys.version_info < (3, 13)


def g(a, b=1):
    return a + b


class Obj:
    def m(self, a, *, k=0):
        return a * 10 + k


def under_try(x, o, args, kw):
    try:
        return g(x, b=2) + o.m(x, k=1) + g(*args, **kw)
    finally:
        pass


class Recorder:
    def __init__(self):
        self.seen = []

    def __getitem__(self, fn):
        self.seen.append(fn)
        return fn


# depth of the callable from the top of the (normalised) stack before each call, in bytecode order:
# g(x, b=2): [NULL, g, x, 2] / 3.13 [g, NULL, x, 2]; o.m(x, k=1): [sum, m, o, x, 1];
# g(*args, **kw): [sum, NULL, g, args, kw] / 3.13 [sum, g, NULL, args, kw]
CASES = [(0, 2 if NULL_FIRST else 3, g), (1, 3, Obj.m), (2, 2 if NULL_FIRST else 3, g)]


@pytest.mark.parametrize("index,depth,callee", CASES)
def test_compile_callee_at_wraps_that_call_only(monkeypatch, index, depth, callee):
    import dis

    recorder = Recorder()
    calls = [i.offset for i in dis.get_instructions(under_try)
             if i.opname in ("CALL", "CALL_KW", "CALL_FUNCTION_EX")]
    code = skip_frame.compile_callee_at(under_try.__code__, calls[index], depth, recorder)
    fn = type(under_try)(code, under_try.__globals__)
    assert fn(1, Obj(), (3,), {"b": 4}) == under_try(1, Obj(), (3,), {"b": 4}) == 21
    assert recorder.seen == [callee]


class Base:
    def m(self, a):
        return a + 100


class Child(Base):
    def m(self, a):
        try:
            return super().m(a) + sum([g(a), len("ab")]) + self.helper(a)(2)
        finally:
            pass

    def helper(self, a):
        return lambda b: a * b


def test_compile_callees_wraps_every_call_and_keeps_results():
    """Every call of the copy goes through ``compile_callee``: functions, bound methods (a method load
    becomes an attribute load, so the callable is one object), builtins, ``super()`` and a call's result."""
    recorder = Recorder()
    code = skip_frame.compile_callees(under_try.__code__, recorder)
    fn = type(under_try)(code, under_try.__globals__)
    assert fn(1, Obj(), (3,), {"b": 4}) == under_try(1, Obj(), (3,), {"b": 4}) == 21
    assert recorder.seen[0] is g and recorder.seen[1].__func__ is Obj.m and recorder.seen[2] is g
    recorder.seen.clear()
    c = Child()
    code = skip_frame.compile_callees(Child.m.__code__, recorder)
    m = type(Child.m)(code, Child.m.__globals__, "m", None, Child.m.__closure__)
    assert m(c, 1) == Child.m(c, 1) == 101 + (2 + 2) + 2
    names = [getattr(f, "__name__", type(f).__name__) for f in recorder.seen]
    assert names == ["super", "m", "g", "len", "sum", "helper", "<lambda>"]
