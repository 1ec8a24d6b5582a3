"""Side effects: mutations of outside lists/dicts/attributes/globals are replayed after the graph.

Every test runs the compiled function and eager PyTorch on two copies of the same state, several
calls in a row, and compares the results *and* the state afterwards: a mutation that is lost, done
twice, or done out of order shows up as a difference.
"""
import copy

import pytest
import torch
from torch import nn

import tinydynamo
from tinydynamo.testing import CompileCounter


class State:
    """A plain Python object holding the lists/dicts/attributes the functions below mutate."""

    def __init__(self):
        self.xs = [torch.ones(3)]
        self.d = {"a": torch.zeros(3), "n": 1}
        self.count = 0
        self.cache = None


def same_state(a, b):
    assert vars(a).keys() == vars(b).keys()
    for k in vars(a):
        if k == "log":  # strings (Loud below)
            assert a.log == b.log
        else:
            torch.testing.assert_close(getattr(a, k), getattr(b, k), msg=lambda m: f"state.{k}: {m}")


def run_both(fn, calls=3, make_state=State, shapes=((3,), (3,), (3,))):
    """Compiled vs eager on their own copies of the state; returns the CompileCounter and compiled fn."""
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(fn)
    mine, theirs = make_state(), make_state()
    gen = torch.Generator().manual_seed(0)
    for i in range(calls):
        x = torch.randn(shapes[i % len(shapes)], generator=gen)
        torch.testing.assert_close(compiled(x, mine), fn(x, theirs))
        same_state(mine, theirs)
    return cnt, compiled


def counts_equal_torch(fn, make_state=State):
    """Our (graph_count, graph_break_count) equal ``torch._dynamo.explain``'s for the same call."""
    x = torch.randn(3)
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(fn)(x, make_state())
    ours = tinydynamo.explain(fn)(x, make_state())
    assert (ours.graph_count, ours.graph_break_count) == (theirs.graph_count, theirs.graph_break_count), str(ours)
    return ours


# ---- one function per mutation kind ----------------------------------------------------------------------
def list_append(x, s):
    s.xs.append(x * 2)
    return x + len(s.xs)


def list_extend_insert_iadd(x, s):
    s.xs.extend([x, x + 1])
    s.xs.insert(0, x.sin())
    s.xs += [x.cos()]
    return s.xs[0] + s.xs[-1]


def list_pop_setitem_del_clear(x, s):
    s.xs.append(x)
    s.xs.append(x * 3)
    first = s.xs.pop(0)
    s.xs[0] = s.xs[0] + first
    del s.xs[-1]
    out = s.xs[0] * 2
    s.xs.clear()
    s.xs.append(out)
    return out


def order_append_pop_setitem(x, s):
    s.xs.append(x + 1)
    s.xs.append(x + 2)
    s.xs.pop()
    s.xs[0] = x - 1
    s.xs.append(len(s.xs))
    return x


def dict_mutations(x, s):
    s.d["b"] = x * 2
    s.d.update({"c": x + 1, "a": s.d["a"] + 1})
    n = s.d.pop("n")
    s.d["n"] = n + 1  # moves "n" to the end: order is replayed too
    s.d.setdefault("e", 5)
    del s.d["c"]
    return s.d["a"] + s.d["b"] * n


def dict_clear_and_refill(x, s):
    s.d.clear()
    s.d["z"] = x.exp()
    return x


def attr_store(x, s):
    s.cache = x * 2
    s.count = s.count + 1
    return s.cache + s.count  # reads see the new values


class Defaults(State):
    count = 100  # a class attribute: what ``s.count`` reads once the instance's own is deleted


def attr_delete_toggles(x, s):
    """``del`` on an outside object, replayed after the graph; every other call the attribute is back."""
    if hasattr(s, "cache"):
        del s.cache
        return x + 1
    s.cache = x
    return x - 1


def attr_delete_then_class_attribute(x, s):
    had = s.count  # the instance's own
    delattr(s, "count")
    out = x * had + s.count  # the class attribute now
    s.count = had + 1  # back, for the next call
    return out


def attr_delete_missing_caught(x, s):
    try:
        del s.nothing
    except AttributeError:
        return x + 1
    return x


DELETIONS = [attr_delete_toggles, attr_delete_missing_caught]


MUTATIONS = [list_append, list_extend_insert_iadd, list_pop_setitem_del_clear, order_append_pop_setitem,
             dict_mutations, dict_clear_and_refill, attr_store]


@pytest.mark.parametrize("fn", MUTATIONS, ids=lambda f: f.__name__)
def test_mutation_replayed_equal_eager(fn):
    cnt, compiled = run_both(fn)
    assert cnt.frame_count >= 1 and cnt.op_count >= 1
    assert tinydynamo.explain(fn)(torch.randn(3), State()).graph_break_count == 0  # no break any more


@pytest.mark.parametrize("fn", MUTATIONS + DELETIONS, ids=lambda f: f.__name__)
def test_counts_equal_torchdynamo(fn):
    ours = counts_equal_torch(fn)
    assert ours.graph_count == 1 and ours.graph_break_count == 0


def test_transformed_code_replays_after_the_graph():
    _, compiled = run_both(order_append_pop_setitem, calls=1)
    code = tinydynamo.cache_info(compiled).entries[0].code
    lines = [line.strip() for line in code.splitlines()]
    call = next(i for i, line in enumerate(lines) if "___compiled_fn(" in line)
    replay = next(i for i, line in enumerate(lines) if "[:] = [" in line)
    assert call < replay < len(lines) - 1 and lines[-1].startswith("return")
    assert "[:] = [___o[0], ___o[1], 2]" in code  # final contents: one list rebuild, not three calls


def rebind_then_mutate_old(x, s):
    old = s.xs
    s.xs = [x * 2]  # rebinds the attribute...
    old.append(x)  # ...while the old list is still changed in place
    s.cache = old
    return x + len(s.xs)


def test_sources_read_before_any_replayed_store():
    _, compiled = run_both(rebind_then_mutate_old, calls=2)
    code = tinydynamo.cache_info(compiled).entries[0].code
    assert "___s0 = L['s'].xs" in code  # read once, before setattr(..., 'xs', ...) rebinds it
    counts_equal_torch(rebind_then_mutate_old)


# ---- cached calls: the transformed code alone, effects neither repeated nor lost --------------------------
def store_tensor_in_dict(x, s):
    s.d["a"] = s.d["a"] + x  # keys stay the same: the entry is reused
    s.cache = x.relu()
    s.xs[0] = s.xs[0] * 2  # length stays the same
    return x * 2


def test_cached_calls_run_only_the_transformed_code():
    cnt, compiled = run_both(store_tensor_in_dict, calls=5)
    assert cnt.frame_count == 1  # compiled once; every later call replays through the cache entry
    state = State()
    x = torch.ones(3)
    for _ in range(4):
        compiled(x, state)
    torch.testing.assert_close(state.d["a"], 4 * x)  # applied exactly once per call
    torch.testing.assert_close(state.xs[0], torch.full((3,), 16.0))
    assert cnt.frame_count == 1
    counts_equal_torch(store_tensor_in_dict)


def test_growing_list_recompiles_on_its_length_guard():
    cnt, _ = run_both(list_append, calls=3)
    assert cnt.frame_count == 3  # the length is guarded (as in TorchDynamo): each call sees a new length


# ---- around graph breaks -------------------------------------------------------------------------------------
SEEN = []


def mutate_then_break(x, s):
    s.xs.append(x + 1)
    s.count = s.count + 1
    SEEN.append(len(s.xs))  # native code after the break must see the replayed effects...
    print("break", len(s.xs), s.count)
    s.xs.append(x * 3)  # ...and effects after the break are replayed by the resume function
    s.d["b"] = x
    return x.sum() + s.count


def test_effects_before_a_break_are_visible_to_the_native_instruction(capsys):
    SEEN.clear()
    cnt, compiled = run_both(mutate_then_break, calls=2)
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["break 2 1", "break 2 1", "break 4 2", "break 4 2"]  # compiled, eager; per call
    assert SEEN == [2, 2, 4, 4]
    counts_equal_torch(mutate_then_break)


def helper_appends_then_prints(xs, x):
    xs.append(x * 2)
    print("in helper", len(xs))
    xs.append(x + 5)
    return x.cos()


def break_inside_inlined_mutator(x, s):
    s.xs.append(x)
    y = helper_appends_then_prints(s.xs, x + 1)  # a break inside: the call runs natively, once
    return y + len(s.xs)


def test_half_traced_call_is_rolled_back_not_repeated(capsys):
    run_both(break_inside_inlined_mutator, calls=2)
    out = capsys.readouterr().out.splitlines()
    assert out == ["in helper 3", "in helper 3", "in helper 6", "in helper 6"]


def break_in_loop(x, s):
    for i in range(3):
        s.xs.append(x * i)
        if x.sum() > 100:  # data-dependent: a break inside the loop
            s.xs.pop()
    return x + len(s.xs)


def test_break_inside_a_loop():
    run_both(break_in_loop, calls=3)


# ---- loops, inlined functions, modules, globals, closures ---------------------------------------------------
def push(s, v):
    s.xs.append(v)
    s.count += 1


def mutate_in_loop_and_inlined(x, s):
    for i in range(3):
        push(s, x * i)
    total = x
    for v in s.xs[1:]:
        total = total + v
    return total


def test_mutations_in_loops_and_inlined_functions():
    cnt, _ = run_both(mutate_in_loop_and_inlined)
    assert counts_equal_torch(mutate_in_loop_and_inlined).graph_count == 1


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0
        self.last = None
        self.history = []

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        self.last = y.detach()
        self.history.append(self.calls)
        return y * self.calls


def test_module_attributes_replayed():
    torch.manual_seed(0)
    mine = Counter()
    theirs = copy.deepcopy(mine)
    compiled = tinydynamo.compile(mine, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(compiled(x), theirs(x))
        assert mine.calls == theirs.calls and mine.history == theirs.history
        torch.testing.assert_close(mine.last, theirs.last)
    torch._dynamo.reset()
    theirs_explain = torch._dynamo.explain(Counter())(torch.randn(2, 3))
    ours = tinydynamo.explain(Counter())(torch.randn(2, 3))
    assert (ours.graph_count, ours.graph_break_count) == (theirs_explain.graph_count, theirs_explain.graph_break_count)


def test_module_parameter_assignment_still_breaks():
    class Swap(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            self.w = nn.Parameter(x.detach().clone())
            return x * 2

    m = Swap()
    out = tinydynamo.explain(m)(torch.randn(3))
    assert any("parameter" in r.reason or "submodule" in r.reason or "nn.Parameter" in str(r) for r in out.break_reasons)
    x = torch.randn(3)
    torch.testing.assert_close(tinydynamo.compile(m, backend="eager")(x), x * 2)
    torch.testing.assert_close(m.w.data, x)


STEP = 0
TABLE = {}


def global_mutations(x, s):
    global STEP
    STEP = STEP + 1
    TABLE["x"] = x * STEP  # reads the new STEP
    s.count = STEP
    return x + STEP


def test_global_assignment_and_global_dict():
    global STEP
    tinydynamo.reset()
    compiled = tinydynamo.optimize("eager")(global_mutations)
    x = torch.randn(3)
    STEP, s = 0, State()
    out = [compiled(x, s) for _ in range(3)]
    mine = (STEP, dict(TABLE), s.count)
    STEP, s = 0, State()
    TABLE.clear()
    ref = [global_mutations(x, s) for _ in range(3)]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(mine, (STEP, dict(TABLE), s.count))
    STEP = 0
    counts_equal_torch(global_mutations)


def test_closure_list_and_alias_through_two_sources():
    acc = []

    def f(x, s):
        acc.append(x + 1)
        a = s.xs
        a.append(x)
        return x * len(s.xs)  # the same list reached through s.xs: sees the append

    cnt, _ = run_both(f, make_state=State)
    assert len(acc) == 6  # compiled and eager calls share the closure list: 3 appends each
    tinydynamo.reset()
    acc.clear()
    s = State()
    compiled = tinydynamo.optimize("eager")(f)
    compiled(torch.ones(3), s)
    torch.testing.assert_close(acc, [torch.full((3,), 2.0)])


def aliased(x, a, b):
    a.append(x)
    return x + len(b)


def test_aliased_arguments_guarded():
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(aliased)
    shared = []
    assert compiled(torch.zeros(1), shared, shared).item() == 1  # a is b: b sees the append
    first, second = [], []
    assert compiled(torch.zeros(1), first, second).item() == 0  # not aliased: a new entry
    assert len(first) == 1 and second == []
    assert cnt.frame_count == 2


def test_distinct_then_aliased_recompiles():
    """Traced with two distinct lists/objects, then called with one object twice: the not-aliased
    guards fail and it recompiles (replaying the first trace would return a stale length/attribute)."""
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(aliased)
    assert compiled(torch.zeros(1), [], []).item() == 0
    shared = []
    assert compiled(torch.zeros(1), shared, shared).item() == 1 == len(shared)
    assert cnt.frame_count == 2

    def attr_alias(x, a, b):
        a.count = a.count + 1
        return x + b.count

    tinydynamo.reset()
    compiled = tinydynamo.optimize("eager")(attr_alias)
    torch.testing.assert_close(compiled(torch.zeros(1), State(), State()), torch.zeros(1))
    s = State()
    torch.testing.assert_close(compiled(torch.zeros(1), s, s), torch.ones(1))
    assert s.count == 1


# ---- what cannot be replayed stays a clean break, never silently wrong ---------------------------------------
class Loud:
    def __init__(self):
        self.log = []

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name != "log":
            self.log.append(name)


def custom_setattr(x, s):
    s.thing = x + 1
    return x * 2


def mutate_while_iterating(x, s):
    for v in s.xs:
        if len(s.xs) < 4:
            s.xs.append(v + 1)
    return x + len(s.xs)


def setattr_builtin(x, s):
    setattr(s, "cache", x + 1)
    return x * s.cache


def enumerate_while_mutating(x, s):
    for i, v in enumerate(s.xs):
        if i < 2:
            s.xs.append(v * 2)
    return x + len(s.xs)


def test_unreplayable_mutations_break_cleanly():
    run_both(setattr_builtin)
    assert counts_equal_torch(setattr_builtin).graph_break_count == 0
    run_both(enumerate_while_mutating)
    # a Python __setattr__ is inlined: its plain stores (object.__setattr__) and its list append replay
    out = tinydynamo.explain(custom_setattr)(torch.randn(3), Loud())
    assert out.graph_break_count == 0, out.break_reasons
    run_both(custom_setattr, make_state=Loud)
    tinydynamo.reset()
    # a list that grows while a loop walks it is read live, as Python's list iterator does: one graph
    run_both(mutate_while_iterating)
    assert tinydynamo.explain(mutate_while_iterating)(torch.randn(3), State()).graph_break_count == 0


def del_items(x, s):
    s.d["b"] = x + 1
    if "q" in s.d:
        del s.d["q"]
    del s.d["b"]  # recorded: the dict ends as it started
    s.xs.append(x)
    del s.xs[0]
    return x * 2


def test_delete_subscr_recorded_and_breakable():
    run_both(del_items)
    counts_equal_torch(del_items)
    assert tinydynamo.explain(del_items)(torch.ones(3), State()).graph_break_count == 0

    class Weird(dict):
        pass

    def f(x, d):
        y = x + 1
        del d["k"]  # a dict subclass: not tracked, the del runs natively at a graph break
        return y * 2

    d = Weird(k=1)
    out = tinydynamo.explain(f)(torch.ones(2), d)
    assert out.graph_break_count == 1 and "k" not in d


OTHER_MODULE = '''
COUNTER = 0
BOX = []

def bump(x):
    global COUNTER
    COUNTER = COUNTER + 1
    BOX.append(x * COUNTER)
    return x + COUNTER
'''


def test_globals_of_another_module_and_an_op_free_frame():
    import types

    mod = types.ModuleType("side_effects_other_module")
    exec(OTHER_MODULE, mod.__dict__)

    def g(x):
        return mod.bump(x) * 2  # inlined: its global stores go to the other module's globals

    tinydynamo.reset()
    compiled = tinydynamo.optimize("eager", nopython=True)(g)
    outs = [compiled(torch.ones(1)) for _ in range(2)]
    torch.testing.assert_close(outs, [torch.full((1,), 4.0), torch.full((1,), 6.0)])
    assert mod.COUNTER == 2 and len(mod.BOX) == 2
    torch.testing.assert_close(mod.BOX, [torch.ones(1), torch.full((1,), 2.0)])

    def no_ops(x, xs):
        xs.append(1)

    xs = []
    tinydynamo.optimize("eager", nopython=True)(no_ops)(torch.ones(1), xs)
    assert xs == [1]


def _make_counter_closure():
    acc = []

    def inner(x):
        acc.append(x * 2)
        return x + len(acc)

    return inner, acc


INNER, INNER_ACC = _make_counter_closure()


def calls_closure(x):
    return INNER(x) * 2  # inlined: acc is reached as G['INNER'].__closure__[0].cell_contents


def test_list_in_a_closure_cell_of_an_inlined_function():
    tinydynamo.reset()
    INNER_ACC.clear()
    compiled = tinydynamo.optimize("eager", nopython=True)(calls_closure)
    outs = [compiled(torch.ones(1)) for _ in range(2)]
    torch.testing.assert_close(outs, [torch.full((1,), 4.0), torch.full((1,), 6.0)])
    torch.testing.assert_close(INNER_ACC, [torch.full((1,), 2.0)] * 2)
    assert "__closure__[0].cell_contents" in tinydynamo.cache_info(compiled).entries[0].code


# ---- deleting attributes -------------------------------------------------------------------------------------
def test_attribute_deletions_replayed_equal_eager():
    run_both(attr_delete_toggles, calls=4)
    run_both(attr_delete_missing_caught)
    run_both(attr_delete_then_class_attribute, make_state=Defaults)


def test_deleting_an_attribute_replays_a_pop_after_the_graph():
    _, compiled = run_both(attr_delete_toggles, calls=1)
    code = tinydynamo.cache_info(compiled).entries[0].code
    assert ".__dict__.pop('cache', None)" in code


class Point:
    def __init__(self, x):
        self.x = x
        self.y = x + 1


def test_deleting_an_attribute_of_an_object_made_in_the_frame():
    def fn(x):
        p = Point(x)
        del p.y
        return x + hasattr(p, "y"), p

    tinydynamo.reset()
    cnt = CompileCounter()
    out, p = tinydynamo.optimize(cnt)(fn)(torch.ones(2))
    assert cnt.frame_count == 1
    torch.testing.assert_close(out, torch.ones(2))
    assert vars(p).keys() == {"x"}  # the escaping object is rebuilt without it


class Config:
    """A model config: encoder_*/decoder_* keys that a copy renames (transformers' ``get_text_config``)."""

    def __init__(self):
        self.decoder_layers = 3
        self.scale = 2.0

    def to_dict(self):
        return dict(self.__dict__)


CONFIG = Config()


def renamed_copy_of_a_config(x):
    c = copy.deepcopy(CONFIG)
    for key in c.to_dict():
        if key.startswith("decoder_"):
            value = getattr(c, key)
            delattr(c, key)
            setattr(c, "num_" + key[len("decoder_"):], value)
    return x * c.num_layers * c.scale + hasattr(c, "decoder_layers")


def test_a_deep_copy_of_a_config_is_changed_in_one_graph():
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(renamed_copy_of_a_config)
    for _ in range(2):
        torch.testing.assert_close(compiled(torch.ones(2)), renamed_copy_of_a_config(torch.ones(2)))
    assert cnt.frame_count == 1
    assert vars(CONFIG) == {"decoder_layers": 3, "scale": 2.0}  # the original is untouched
    ours = tinydynamo.explain(renamed_copy_of_a_config)(torch.ones(2))
    theirs = torch._dynamo.explain(renamed_copy_of_a_config)(torch.ones(2))
    assert (ours.graph_count, ours.graph_break_count) == (theirs.graph_count, theirs.graph_break_count) == (1, 0)
