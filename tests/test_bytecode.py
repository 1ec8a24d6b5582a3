"""tinydynamo.bytecode: version-normalised instructions. Torch-free; runs on CPython 3.11, 3.12, 3.13.

The strongest check here is a tiny *concrete* interpreter over the normalised instructions:
if normalisation lost or garbled anything (call slots, kw names, jump targets, FOR_ITER exits,
superinstructions, slices), running real functions through it would give a different answer.
"""
import math
import subprocess
import sys
import types

import pytest

from tinydynamo import bytecode as bc
from tinydynamo.bytecode import get_instructions


def test_bytecode_layer_imports_without_torch():
    """Checked in a fresh interpreter: in a full test run other modules have imported torch already."""
    code = "import sys, tinydynamo.bytecode; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=__file__.rsplit("/tests/", 1)[0])


class _Null:
    def __repr__(self):
        return "NULL"


NULL = _Null()


def run(fn, *args, **kwargs):
    """Execute ``fn`` by interpreting its normalised instructions with real values (no closures)."""
    code = fn.__code__
    insts = get_instructions(fn)
    names = code.co_varnames
    bound = {}
    pos = list(args)
    nargs = code.co_argcount + code.co_kwonlyargcount
    defaults = dict(zip(code.co_varnames[code.co_argcount - len(fn.__defaults__ or ()) : code.co_argcount],
                        fn.__defaults__ or ()))
    defaults.update(fn.__kwdefaults__ or {})
    for i, n in enumerate(names[: code.co_argcount]):
        bound[n] = pos[i] if i < len(pos) else kwargs.pop(n, defaults.get(n))
    for n in names[code.co_argcount:nargs]:
        bound[n] = kwargs.pop(n, defaults.get(n))
    if code.co_flags & 0x04:
        bound[names[nargs]] = tuple(pos[code.co_argcount:])
        nargs += 1
    if code.co_flags & 0x08:
        bound[names[nargs]] = kwargs
    local = dict(bound)
    stack = []
    pc = 0
    glb = fn.__globals__
    while True:
        inst = insts[pc]
        pc += 1
        op, arg = inst.opname, inst.argval
        if op in ("RESUME", "NOP"):
            pass
        elif op == "LOAD_FAST":
            stack.append(local[arg])
        elif op == "LOAD_FAST_AND_CLEAR":
            stack.append(local.pop(arg, NULL))
        elif op == "STORE_FAST":
            v = stack.pop()
            if v is NULL:
                local.pop(arg, None)
            else:
                local[arg] = v
        elif op == "LOAD_CONST":
            stack.append(arg)
        elif op == "LOAD_GLOBAL":
            v = glb[arg] if arg in glb else __builtins__[arg] if isinstance(__builtins__, dict) else getattr(__builtins__, arg)
            stack.extend(bc.with_null(v, NULL) if inst.push_null else [v])
        elif op == "LOAD_ATTR":
            v = getattr(stack.pop(), arg)
            stack.extend(bc.with_null(v, NULL) if inst.push_null else [v])
        elif op == "PUSH_NULL":
            stack.append(NULL)
        elif op == "CALL":
            n = inst.argval
            argv = stack[len(stack) - n :]
            del stack[len(stack) - n :]
            slot1, slot0 = stack.pop(), stack.pop()
            f, lead = bc.resolve_call_slots(slot0, slot1, lambda v: v is NULL)
            k = len(inst.kw_names)
            kw = dict(zip(inst.kw_names, argv[n - k :])) if k else {}
            stack.append(f(*lead, *argv[: n - k], **kw))
        elif op == "CALL_FUNCTION_EX":
            kw = stack.pop() if inst.argval else {}
            a = stack.pop()
            slot1, slot0 = stack.pop(), stack.pop()
            f, lead = bc.resolve_call_slots(slot0, slot1, lambda v: v is NULL)
            stack.append(f(*lead, *a, **kw))
        elif op == "BINARY_OP":
            b, a = stack.pop(), stack.pop()
            stack.append(bc.BINARY_OPS[arg](a, b))
        elif op == "COMPARE_OP":
            b, a = stack.pop(), stack.pop()
            stack.append(bc.COMPARE_OPS[arg](a, b))
        elif op in ("IS_OP", "CONTAINS_OP"):
            b, a = stack.pop(), stack.pop()
            r = (a is b) if op == "IS_OP" else (a in b)
            stack.append(r != arg)
        elif op in bc.UNARY_OPS:
            stack.append(bc.UNARY_OPS[op](stack.pop()))
        elif op == "BINARY_SUBSCR":
            k, c = stack.pop(), stack.pop()
            stack.append(c[k])
        elif op == "STORE_SUBSCR":
            k, c, v = stack.pop(), stack.pop(), stack.pop()
            c[k] = v
        elif op == "BUILD_SLICE":
            items = [stack.pop() for _ in range(arg)][::-1]
            stack.append(slice(*items))
        elif op in ("BUILD_TUPLE", "BUILD_LIST"):
            items = stack[len(stack) - arg :]
            del stack[len(stack) - arg :]
            stack.append(tuple(items) if op == "BUILD_TUPLE" else list(items))
        elif op == "BUILD_MAP":
            items = stack[len(stack) - 2 * arg :]
            del stack[len(stack) - 2 * arg :]
            stack.append(dict(zip(items[::2], items[1::2])))
        elif op == "LIST_APPEND":
            v = stack.pop()
            stack[-arg].append(v)
        elif op == "LIST_EXTEND":
            v = stack.pop()
            stack[-arg].extend(v)
        elif op == "DICT_MERGE":
            v = stack.pop()
            stack[-arg].update(v)
        elif op == "MAKE_FUNCTION":
            stack.append(types.FunctionType(stack.pop(), glb))
        elif op == "SET_FUNCTION_ATTRIBUTE":
            f, v = stack.pop(), stack.pop()
            setattr(f, "__" + arg + "__", v) if arg != "closure" else None
            stack.append(f)
        elif op == "LIST_TO_TUPLE":
            stack.append(tuple(stack.pop()))
        elif op == "UNPACK_SEQUENCE":
            stack.extend(reversed(list(stack.pop())))
        elif op == "GET_ITER":
            stack.append(iter(stack.pop()))
        elif op == "FOR_ITER":
            try:
                stack.append(next(stack[-1]))
            except StopIteration:
                stack.pop()
                pc = inst.target
        elif op in ("JUMP_FORWARD", "JUMP_BACKWARD"):
            pc = inst.target
        elif op in bc.POP_JUMP_CONDITIONS:
            if bc.POP_JUMP_CONDITIONS[op](stack.pop()):
                pc = inst.target
        elif op in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"):
            if bool(stack[-1]) == (op == "JUMP_IF_TRUE_OR_POP"):
                pc = inst.target
            else:
                stack.pop()
        elif op == "POP_TOP":
            stack.pop()
        elif op == "COPY":
            stack.append(stack[-arg])
        elif op == "SWAP":
            stack[-1], stack[-arg] = stack[-arg], stack[-1]
        elif op == "RETURN_VALUE":
            return stack.pop()
        else:
            raise NotImplementedError(f"test interpreter: {op}\n{bc.format_instructions(insts, current=inst.index)}")


# ---- functions covering the normalised differences ------------------------------------------

def f_calls(x, y):
    a = max(x, y, key=abs)  # LOAD_GLOBAL push_null + CALL with kw_names
    b = "-".join([str(x), str(y)])  # method call: LOAD_ATTR is_method
    c = math.hypot(x, y)  # module attribute call
    d = sorted([y, x], reverse=True)[0]
    return a, b, c, d


def f_loops(n):
    total = 0
    for i in range(n):
        if i % 2 == 0 and i != 4:
            total += i
        elif i > 7:
            break
        else:
            total -= 1
    while total > 10:
        total -= 3
    return total


def f_slices(xs):
    ys = list(xs)
    ys[1:3] = [100, 200]
    return ys[::2], ys[1:-1], xs[:2]


def f_super(a, b):
    a, b = b, a  # STORE_FAST_STORE_FAST on 3.13
    c = a + b  # LOAD_FAST_LOAD_FAST
    return [t * 2 for t in (a, b, c)]  # inlined comprehension on 3.12+, STORE_FAST_LOAD_FAST


def f_compare(a, b):
    return (a < b, a <= b, a == b, a != b, a > b, a >= b, a is None, a is not None,
            a in (1, 2), a not in (1, 2), not a, -a, ~a)


def f_return_const(flag):
    if flag:
        return None
    return 7


def f_star(*args, **kwargs):
    return max(*args, **kwargs), [*args, 9]


def f_or(a, b):
    return (a or b), (a and b), (a if b else -1)


def f_nested_loops(rows):
    out = []
    for r in rows:
        for c in r:
            if c is None:
                continue
            out.append(c)
    return out


def f_default(x, k=3, *, m=2):
    return x * k + m


CASES = [
    (f_calls, (3, -5)), (f_calls, (2, 1)),
    (f_loops, (3,)), (f_loops, (20,)), (f_loops, (9,)),
    (f_slices, ([1, 2, 3, 4, 5],)),
    (f_super, (1, 2)), (f_super, (5, -1)),
    (f_compare, (1, 2)), (f_compare, (3, 3)),
    (f_return_const, (True,)), (f_return_const, (False,)),
    (f_star, (1, 5, 2)),
    (f_or, (0, 4)), (f_or, (3, 0)),
    (f_nested_loops, ([[1, None, 2], [], [None, 3]],)),
    (f_default, (2,)), (f_default, (2, 5)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_concrete_interpreter_matches_python(fn, args):
    assert run(fn, *args) == fn(*args)


def test_default_keyword_only():
    assert run(f_default, 2, m=10) == f_default(2, m=10)


def test_no_version_specific_opnames_survive():
    forbidden = {"PRECALL", "CACHE", "EXTENDED_ARG", "KW_NAMES", "CALL_KW", "LOAD_METHOD", "TO_BOOL",
                 "RETURN_CONST", "BINARY_SLICE", "STORE_SLICE", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST",
                 "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST", "JUMP_BACKWARD_NO_INTERRUPT"}
    for fn, _ in CASES:
        names = {i.opname for i in get_instructions(fn)}
        assert not names & forbidden, (fn.__name__, names & forbidden)
        assert not any(n.startswith(("POP_JUMP_FORWARD", "POP_JUMP_BACKWARD")) for n in names)


def test_call_facts():
    insts = get_instructions(f_calls)
    calls = [i for i in insts if i.opname == "CALL"]
    assert calls[0].argval == 3 and calls[0].kw_names == ("key",)
    g = next(i for i in insts if i.opname == "LOAD_GLOBAL" and i.argval == "max")
    assert g.push_null and not g.is_method
    m = next(i for i in insts if i.opname == "LOAD_ATTR" and i.argval == "join")
    assert m.is_method and m.push_null
    h = next(i for i in insts if i.opname == "LOAD_ATTR" and i.argval == "hypot")
    mod = insts[h.index - 1]
    assert mod.opname == "LOAD_GLOBAL" and mod.argval == "math"
    # exactly one instruction provides the NULL call slot (which one differs by version)
    near = insts[h.index - 1 : h.index + 2]
    assert sum(i.push_null or i.opname == "PUSH_NULL" for i in near) == 1
    assert all(not isinstance(i.argval, int) or i.opname not in ("LOAD_ATTR", "LOAD_GLOBAL") for i in insts)


def test_operator_argvals():
    ops = {i.argval for i in get_instructions(f_compare) if i.opname == "COMPARE_OP"}
    assert ops == {"<", "<=", "==", "!=", ">", ">="}
    assert all(i.argrepr == i.argval for i in get_instructions(f_compare) if i.opname == "COMPARE_OP")
    bins = [i.argval for i in get_instructions(f_loops) if i.opname == "BINARY_OP"]
    assert "%" in bins and "+=" in bins and "-=" in bins
    negs = [i.argval for i in get_instructions(f_compare) if i.opname in ("IS_OP", "CONTAINS_OP")]
    assert negs == [False, True, False, True]


def test_jump_targets_are_indices():
    insts = get_instructions(f_loops)
    for i in insts:
        assert i.index == insts.index(i)
        if i.target is not None:
            assert 0 <= i.target < len(insts)
            assert insts[i.target].is_jump_target
    fi = next(i for i in insts if i.opname == "FOR_ITER")
    assert insts[fi.target].opname not in ("END_FOR", "POP_TOP")


def test_slices_normalised_to_build_slice():
    names = [i.opname for i in get_instructions(f_slices)]
    assert "BUILD_SLICE" in names and "STORE_SUBSCR" in names and "BINARY_SUBSCR" in names


def test_resolve_call_slots_rule():
    null = object()
    isn = lambda v: v is null  # noqa: E731
    assert bc.resolve_call_slots(null, len, isn) == (len, [])
    assert bc.resolve_call_slots(len, null, isn) == (len, [])
    assert bc.resolve_call_slots(str.join, "-", isn) == (str.join, ["-"])
    slots = bc.with_null(len, null)
    assert bc.resolve_call_slots(*slots, isn) == (len, [])


def test_call_layout_decodes_calls():
    """One decoder of CALL / CALL_FUNCTION_EX stacks (the translator and the graph-break codegen use it)."""
    null = object()
    isn = lambda v: v is null  # noqa: E731

    def method_call(o, a, b):
        return o.m(a, k=b)

    def star_call(g, a, kw):
        return g(*a, **kw)

    call = next(i for i in bc.get_instructions(method_call.__code__) if i.opname == "CALL")
    layout = bc.call_layout(call, ["below", "M", "O", "A", "B"], isn)  # a method load: [method, self]
    assert (layout.fn, layout.args, layout.kwargs) == ("M", ["O", "A"], {"k": "B"})
    assert (layout.below, layout.depth, layout.fn_index) == (["below"], 4, 1)
    ex = next(i for i in bc.get_instructions(star_call.__code__) if i.opname == "CALL_FUNCTION_EX")
    stack = ["below", *bc.with_null("G", null), "ARGS", "KW"]
    layout = bc.call_layout(ex, stack, isn)
    assert (layout.fn, layout.args, layout.star_args, layout.star_kwargs) == ("G", [], "ARGS", "KW")
    assert (layout.below, layout.depth, stack[layout.fn_index]) == (["below"], 4, "G")
    with pytest.raises(ValueError, match="not a call instruction"):
        bc.call_layout(bc.get_instructions(star_call.__code__)[0], stack, isn)


def test_format_instructions_listing():
    text = bc.format_instructions(f_loops, current=3)
    assert "FOR_ITER" in text and ">>" in text and "-->" in text
    assert str(f_loops.__code__.co_firstlineno + 2) in text
    assert "(+NULL" in bc.format_instructions(get_instructions(f_calls))


def test_accepts_code_object_and_method():
    class A:
        def m(self, x):
            return x + 1

    assert [i.opname for i in get_instructions(A().m)] == [i.opname for i in get_instructions(A.m.__code__)]
    with pytest.raises(TypeError, match="function or code object"):
        get_instructions(42)


def f_closure(x):
    a, b = x, 2 * x

    def inner(y):
        return a * y + b

    return inner(3)


def test_closure_cells_load_closure_on_every_version():
    insts = get_instructions(f_closure)
    names = [i.opname for i in insts]
    assert names.count("LOAD_CLOSURE") == 2 and "MAKE_CELL" in names
    assert [i.argval for i in insts if i.opname == "SET_FUNCTION_ATTRIBUTE"] == ["closure"]


def g_outer(t):
    return t * 10


def g_inner(t):
    return t + 1


def f_resume(x, y):
    z = x * 2
    w = g_outer(g_inner(z))  # break at the inner call: the outer call's slots are on the stack
    if w > y:
        return w - y, "gt"
    return w + y, "le"


def test_resume_code_continues_after_a_call_on_every_version():
    pytest.importorskip("bytecode")
    from tinydynamo.resume import make_resume_code, next_offset

    insts = get_instructions(f_resume)
    inner_call = [i for i in insts if i.opname == "CALL"][0]  # g_inner(z) runs before g_outer(...)
    # the stack just before the inner CALL: [outer slots] + [inner slots] + [z]; after it: [outer slots, result]
    outer_slots = bc.with_null("g_outer", NULL)
    is_null = [v is NULL for v in outer_slots] + [False]
    code = make_resume_code(f_resume.__code__, next_offset(f_resume.__code__, inner_call.offset), is_null,
                            ["x", "y", "z"])
    resume = types.FunctionType(code, f_resume.__globals__)
    stack_args = [g_outer] + [g_inner(6)]  # the non-NULL outer slot (the callable), then the call's result
    for y in (0, 100):
        assert resume(*stack_args, 3, y, 6) == f_resume(3, y)
    assert code.co_name == f"__resume_at_{next_offset(f_resume.__code__, inner_call.offset)}"


def test_resume_at_a_jump_target():
    pytest.importorskip("bytecode")
    from tinydynamo.resume import make_resume_code

    insts = get_instructions(f_resume)
    jump = next(i for i in insts if i.opname in ("POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE"))
    taken = insts[jump.target]
    code = make_resume_code(f_resume.__code__, taken.offset, [], ["x", "y", "z", "w"])
    resume = types.FunctionType(code, f_resume.__globals__)
    expected_tag = "le" if jump.opname == "POP_JUMP_IF_FALSE" else "gt"
    assert resume(3, 5, 6, 70)[1] == expected_tag


class Recorder:
    """A context manager that logs its enter and exit (and the exception type it saw)."""

    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, exc_type, exc, tb):
        self.log.append(("exit", exc_type))
        return False


def f_with(ctx, x, log):
    with ctx:
        y = x * 2
        log.append(y)  # a graph break here: the resume function must enter `ctx` again
        if x < 0:
            raise ValueError("negative")
        z = y + 1
    return z


def f_try_with(ctx, x, log):
    try:
        with ctx:
            log.append(x)
    except ValueError:
        pass
    log.append(x)
    return x


def test_enclosing_blocks_tell_with_from_try():
    from tinydynamo.resume import enclosing_blocks

    calls = [i for i in get_instructions(f_try_with) if i.opname == "CALL"]
    assert enclosing_blocks(f_try_with.__code__, calls[0].offset) == ["with", "try"]
    assert enclosing_blocks(f_try_with.__code__, calls[-1].offset) == []
    call = next(i for i in get_instructions(f_with) if i.opname == "CALL")
    assert enclosing_blocks(f_with.__code__, call.offset) == ["with"]


def test_resume_inside_a_with_block_reenters_it_on_every_version():
    pytest.importorskip("bytecode")
    from tinydynamo.resume import CTX_SLOT, VALUE_SLOT, make_resume_code, next_offset

    call = next(i for i in get_instructions(f_with) if i.opname == "CALL")
    # after the call the stack holds the with block's __exit__ and the call's result
    code = make_resume_code(f_with.__code__, next_offset(f_with.__code__, call.offset), [CTX_SLOT, VALUE_SLOT],
                            ["x", "log", "y"])
    assert "BEFORE_WITH" in {i.opname for i in get_instructions(code)}
    resume = types.FunctionType(code, f_with.__globals__)
    log = []
    assert resume(Recorder(log), None, 3, log, 6) == f_with(Recorder([]), 3, []) == 7
    assert log == ["enter", ("exit", None)]
    log = []
    with pytest.raises(ValueError, match="negative"):  # the original exception table still runs __exit__
        resume(Recorder(log), None, -3, log, -6)
    assert log == ["enter", ("exit", ValueError)]


def _make_closure_frame():
    k = 10

    def f(x):
        n = 1

        def add(v):
            return v + n

        y = add(x + k)
        n = 5
        return add(y) * k

    return f


def test_resume_code_takes_the_frames_cells_as_its_closure():
    """A frame with a free variable (k) and a cell (n): the resume function gets both as its closure
    (the cell variable becomes a free variable), so `n = 5` after the break changes the cell that the
    nested function made before the break reads."""
    from tinydynamo.resume import closure_names, make_resume_code

    f = _make_closure_frame()
    code = f.__code__
    at = next(i for i in get_instructions(code) if i.opname == "LOAD_CONST" and i.argval == 5)
    resume = make_resume_code(code, at.offset, [], ["y", "add"])
    assert resume.co_freevars == tuple(closure_names(code)) == ("k", "n") and resume.co_cellvars == ()
    n_cell = types.CellType(1)  # the frame's cell, made before the break
    add_code = next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == "add")
    add = types.FunctionType(add_code, globals(), "add", None, (n_cell,))
    y = add(1 + 10)
    fn = types.FunctionType(resume, globals(), resume.co_name, None, (f.__closure__[0], n_cell))
    assert fn(y, add) == f(1) == (12 + 5) * 10
    assert n_cell.cell_contents == 5


def test_fstrings_and_super_normalised_to_313_forms():
    def f(x, y):
        return f"a{x!r:>4}b{y}{x!s}"

    class A:
        def m(self):
            return super().m() + super().n

    ops = [(i.opname, i.argval) for i in get_instructions(f.__code__)
           if i.opname in ("CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "BUILD_STRING", "FORMAT_VALUE")]
    names = [op for op, _ in ops]
    assert "FORMAT_VALUE" not in names and names.count("FORMAT_SIMPLE") == 2 and names.count("FORMAT_WITH_SPEC") == 1
    assert ("CONVERT_VALUE", str) in ops and ("BUILD_STRING", 5) in ops
    # {x!r:>4}: the repr conversion is either its own CONVERT_VALUE (3.13) or FORMAT_WITH_SPEC's argval (3.11/3.12)
    assert ("CONVERT_VALUE", repr) in ops or ("FORMAT_WITH_SPEC", repr) in ops
    supers = [i for i in get_instructions(A.m.__code__) if i.opname == "LOAD_SUPER_ATTR"]
    if sys.version_info >= (3, 12):
        assert [(i.argval, i.push_null) for i in supers] == [("m", True), ("n", False)]
    else:
        assert supers == []  # 3.11: LOAD_GLOBAL super; CALL 0; LOAD_ATTR
