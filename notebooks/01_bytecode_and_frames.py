# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 1: Bytecode and frames
#
# TorchDynamo never reads your source code. It waits until CPython is about to run a function,
# looks at the function's **bytecode**, and interprets that bytecode symbolically to build a
# graph. Before we can write such an interpreter (chapter 2 onwards) we need to be fluent in
# what it reads.
#
# **What you will learn**
#
# 1. What a *code object* holds: `co_code`, constants, variable names, global names, flags and
#    the line table, and how `dis` shows it.
# 2. How the bytecode of one function differs between CPython 3.11, 3.12 and 3.13, why those
#    differences hurt anyone writing a bytecode interpreter, and how `tinydynamo.bytecode`
#    hides them behind one *normalised* view.
# 3. How a tiny stack machine executes that bytecode (Exercises 1.2 and 1.3 make you write it).
# 4. What a *frame* is, how `sys.settrace` lets pure Python watch frames, lines and even single
#    opcodes (Exercise 1.4), and how to see which torch op each line and instruction ran
#    (Exercise 1.5).
# 5. PEP 523: the hook TorchDynamo uses to take over frames, why pure Python cannot install it,
#    and what tinydynamo does instead (wrap the callable, cache per code object), with its limits.

# %%
import collections
import contextlib
import dis
import functools
import json
import sys
import time

import torch

from course import load
from course.loader import ROOT

ch = load("ch01", unfinished="package")  # your exercises (or the reference solutions when TINY_COURSE_MODE=solutions)
torch.manual_seed(0)
print(f"Python {sys.version_info.major}.{sys.version_info.minor}, torch {torch.__version__.split('+')[0]}")

# %% [markdown]
# ## 1. Code objects
#
# `def` compiles the body once into a **code object** (`fn.__code__`); every call of the
# function runs that same code object in a fresh *frame*. Here is the function we will take
# apart throughout the chapter:

# %%
def f(x, y):
    z = torch.relu(x) + y
    return z.sum(dim=0, keepdim=True)


code = f.__code__
print("co_name       ", code.co_name)
print("co_argcount   ", code.co_argcount)
print("co_varnames   ", code.co_varnames, "  <- arguments first, then other locals")
print("co_names      ", code.co_names, "  <- globals, attributes and methods used by name")
print("co_consts     ", code.co_consts, "  <- literals, and the keyword-name tuple of a call")
print("co_stacksize  ", code.co_stacksize, "  <- the deepest the value stack ever gets")
print("co_flags      ", code.co_flags, "=", dis.pretty_flags(code.co_flags))
print("co_code       ", len(code.co_code), "bytes, starting", code.co_code[:12].hex(" "))

# %% [markdown]
# `co_code` is a string of 2-byte *code units*: an opcode byte and an argument byte. The
# argument is usually an index into one of the tables above (`LOAD_FAST 0` means
# `co_varnames[0]`). Since 3.11 many instructions are followed by `CACHE` units, room for the
# *specialising adaptive interpreter* (PEP 659) to remember what it saw last time; they are
# why offsets jump by more than 2.
#
# The **line table** maps instruction offsets to source lines (and, since 3.11, to columns,
# which is how tracebacks draw `^^^^` under the failing sub-expression):

# %%
first = code.co_firstlineno
spans = collections.defaultdict(list)
for start, end, line in code.co_lines():
    spans[line - first if line else None].append((start, end))
for line, ranges in spans.items():
    print(f"line {line} of f: offsets {ranges[0][0]}..{ranges[-1][1]} ({len(ranges)} entries)")

# %% [markdown]
# `dis` decodes all of this into readable instructions. `CACHE` entries are hidden by default;
# the offsets on the left still count them.

# %%
dis.dis(f)

# %% [markdown]
# CPython runs this as a **stack machine**. Read the listing as:
#
# | instructions | value stack after them |
# |---|---|
# | `LOAD_GLOBAL torch`, `LOAD_METHOD relu` | `NULL, torch.relu` (two *call slots*: `relu` is a plain function of a module, so the first is NULL) |
# | `LOAD_FAST x` | `NULL, torch.relu, x` |
# | `PRECALL 1`, `CALL 1` | `relu(x)` |
# | `LOAD_FAST y`, `BINARY_OP +` | `relu(x) + y` |
# | `STORE_FAST z` | *(empty)* |
# | `LOAD_FAST z`, `LOAD_METHOD sum` | `Tensor.sum, z` (the slots hold a method and its `self`) |
# | `LOAD_CONST 0`, `LOAD_CONST True`, `KW_NAMES ('dim', 'keepdim')`, `CALL 2` | the result |
# | `RETURN_VALUE` | |
#
# A symbolic interpreter such as TorchDynamo's runs exactly this loop, but pushes *stand-ins*
# for values (a graph node for a tensor, a constant for `0`) instead of the values.

# %% [markdown]
# ## 2. The same function on CPython 3.11, 3.12 and 3.13
#
# Bytecode is an implementation detail of CPython, and it changes in every release. This
# notebook runs on one interpreter, so the other versions' listings come from files that
# `notebooks/data/make_ch01_listings.py` wrote by running `dis` on each interpreter it found
# (a test re-runs it and checks they are current). The example functions live in
# `notebooks/data/ch01_examples.py`:

# %%
DATA = ROOT / "notebooks" / "data"
print((DATA / "ch01_examples.py").read_text().split('"""', 2)[2].strip())
listings = {v: json.loads((DATA / f"ch01_listings_py{v.replace('.', '')}.json").read_text())
            for v in ("3.11", "3.12", "3.13")}
print("\nlistings from:", ", ".join(f"Python {d['version']}" for d in listings.values()))


def side_by_side(name, versions=("3.11", "3.12"), kind="dis"):
    """Print one example's listings for two or three versions next to each other."""
    columns = [listings[v]["functions"][name][kind].rstrip().splitlines() for v in versions]
    widths = [max(len(line) for line in c) + 3 for c in columns]
    height = max(len(c) for c in columns)
    print("".join(f"{'Python ' + listings[v]['version']:<{w}}" for v, w in zip(versions, widths)).rstrip())
    for row in range(height):
        print("".join(f"{(c[row] if row < len(c) else ''):<{w}}" for c, w in zip(columns, widths)).rstrip())


# %% [markdown]
# **Calls.** 3.11 needs `PRECALL n; CALL n`; 3.12 drops `PRECALL`. The NULL call slot that
# 3.11 gets from `LOAD_METHOD` (or `LOAD_GLOBAL`'s low argument bit) is, in 3.12, one more flag
# bit on `LOAD_ATTR` (`NULL|self + relu`). 3.13 keeps the flag but pushes the slots the other
# way round: `relu + NULL|self`. An interpreter that gets the slot order wrong calls `NULL`.

# %%
side_by_side("add_relu", ("3.11", "3.12", "3.13"))

# %% [markdown]
# **Keyword arguments.** 3.11 and 3.12 put a `KW_NAMES` instruction before `CALL`; 3.13 loads
# the names as a constant and uses a separate `CALL_KW`.

# %%
side_by_side("sum_keepdim", ("3.11", "3.13"))

# %% [markdown]
# **Comparisons, jumps and returns.** The `COMPARE_OP` argument is an encoded number that
# changed meaning twice: `>` is `4` on 3.11; `68` on 3.12 (the operator index shifted left by
# 4 bits, the low bits a hint for the specialising interpreter); `148` on 3.13 (shifted by 5,
# and bit 4 set: `bool(>)`, convert the result to a bool, which 3.13 otherwise does with a
# separate `TO_BOOL` before a conditional jump). 3.11 has
# direction-specific jumps (`POP_JUMP_FORWARD_IF_FALSE`); 3.12 renamed them to
# `POP_JUMP_IF_FALSE`. 3.12 adds `RETURN_CONST` for `return <constant>`.

# %%
side_by_side("scale_if_big", ("3.11", "3.12", "3.13"))

# %% [markdown]
# **Loops.** When the iterator is exhausted, 3.11's `FOR_ITER` pops it and jumps past the loop.
# 3.12 places an `END_FOR` cleanup after the loop (3.13: `END_FOR; POP_TOP`), and `FOR_ITER`'s
# jump argument points at it, yet the exhausted `FOR_ITER` pops the iterator itself and skips
# that cleanup. An interpreter that trusts the jump argument pops twice. 3.13 also fuses pairs
# of instructions into *superinstructions* such as `LOAD_FAST_LOAD_FAST`.

# %%
side_by_side("running_sum", ("3.11", "3.13"))

# %% [markdown]
# **Comprehensions (PEP 709).** On 3.11 a list comprehension is a separate function: a nested
# code object that is built with `MAKE_FUNCTION` and called. 3.12 *inlines* it into the
# enclosing function, saving `x` with `LOAD_FAST_AND_CLEAR` and restoring it afterwards. A
# tracer that follows calls sees one more frame on 3.11; an analysis that reads one code object
# sees the loop only on 3.12 (Exercise 1.1 must handle both).

# %%
side_by_side("squares", ("3.11", "3.12"))

# %% [markdown]
# ### One view for every version: `tinydynamo.bytecode`
#
# tinydynamo keeps all these differences in one module. `get_instructions(fn)` returns
# `Instruction` records whose `argval` is always the meaningful value (a name, a constant, the
# operator symbol `'>'`), with `PRECALL`/`CACHE`/`TO_BOOL` dropped, `KW_NAMES` folded into the
# following `CALL` (as `kw_names`), NULL slots as a `push_null` flag, jump names unified,
# superinstructions split, `RETURN_CONST` turned back into `LOAD_CONST` + `RETURN_VALUE`, and
# jump targets given as instruction indices. Here are the same three functions, normalised:

# %%
side_by_side("scale_if_big", ("3.11", "3.12", "3.13"), kind="normalised")

# %%
side_by_side("sum_keepdim", ("3.11", "3.12", "3.13"), kind="normalised")


# %% [markdown]
# Apart from offsets, the normalised listings agree. Let us check that for every example by
# comparing the instruction names and arguments only:

# %%
def shape_of(text):
    """Opname + argument of each listing line: drop index, offset and jump-target markers."""
    rows = []
    for line in text.splitlines():
        parts = line.replace(">>", "").split()
        if len(parts) >= 3 and parts[0].isdigit():
            rows.append(" ".join(parts[2:]))
    return rows


for name in listings["3.11"]["functions"]:
    shapes = {v: shape_of(listings[v]["functions"][name]["normalised"]) for v in listings}
    raw_sizes = {v: len(listings[v]["functions"][name]["dis"].splitlines()) for v in listings}
    same = shapes["3.11"] == shapes["3.12"] == shapes["3.13"]
    print(f"{name:<14} normalised identical on 3.11/3.12/3.13: {same!s:<5}  "
          f"(raw dis lines: {raw_sizes['3.11']}/{raw_sizes['3.12']}/{raw_sizes['3.13']})")

# %% [markdown]
# Two differ. Here is what remains, as a diff of the normalised instructions:

# %%
import difflib

for name, (a, b) in {"running_sum": ("3.11", "3.13"), "squares": ("3.11", "3.12")}.items():
    print(f"--- {name}: Python {a} vs {b}")
    diff = difflib.unified_diff(shape_of(listings[a]["functions"][name]["normalised"]),
                                shape_of(listings[b]["functions"][name]["normalised"]), lineterm="", n=1)
    print("\n".join(list(diff)[2:]))

# %% [markdown]
# What is left is real and has to be handled by the interpreter, not hidden:
#
# * **loop exits**: 3.12 and 3.13 still *contain* the `END_FOR` (and `POP_TOP`) cleanup, but
#   the normalised `FOR_ITER`'s `target` already points past it, so an interpreter that follows
#   `target` never runs it, exactly like CPython;
# * **call-slot order**: on 3.13 `LOAD_GLOBAL` pushes `callable, NULL`, on 3.11/3.12 `NULL,
#   callable`. `bytecode.with_null(value, NULL)` pushes them the right way round and
#   `bytecode.resolve_call_slots` reads them back with one rule for all versions: *if one slot
#   is NULL, the callable is the other; otherwise the first is the callable and the second its
#   first argument*;
# * **comprehensions**: inlined on 3.12+ (`LOAD_FAST_AND_CLEAR`, `SWAP`, an exception-table
#   cleanup), a nested function on 3.11.
#
# The live, normalised view of our `f`:

# %%
from tinydynamo import bytecode

print(bytecode.format_instructions(f))
call = [i for i in bytecode.get_instructions(f) if i.opname == "CALL"][-1]
print("\nthe last CALL:", call.argval, "arguments, keyword names", call.kw_names)

# %% [markdown]
# ### Exercise 1.1: which globals does a function read?
#
# Guards (chapter 3) must check every global a compiled function depends on, so the first
# question about a code object is which names it loads with `LOAD_GLOBAL`. Implement
# `global_names(fn)` in `exercises/ch01_bytecode.py`; remember nested code objects (the 3.11
# comprehension above). The graded test rebuilds each function with *only* the globals you
# found and checks it still runs.

# %%
SCALE = 0.5


def uses_comprehension(xs):
    return sum([torch.sigmoid(x) * SCALE for x in xs])


print(sorted(ch.global_names(f)))
print(sorted(ch.global_names(uses_comprehension)))

# %% [markdown]
# ## 3. A tiny stack machine (Exercises 1.2 and 1.3)
#
# `ch.StackMachine` runs a function by walking its normalised instructions: a `Frame` holds
# the locals, the value stack and the index of the next instruction, and the machine calls the
# method named after each opname, just as TorchDynamo's `InstructionTranslator` has one method
# per opcode. The dispatch loop, jumps, globals and attributes are given. You write the five
# stack basics in `stack_op`, which sees every instruction first (Exercise 1.2: `LOAD_FAST`,
# `STORE_FAST`, `LOAD_CONST`, `BINARY_OP`, `RETURN_VALUE`), and the `CALL` method with its call
# slots and keyword names (Exercise 1.3). With `verbose=True` it prints the stack after every
# instruction:

# %%
x, y = torch.randn(2, 3), torch.randn(2, 3)
machine = ch.StackMachine(verbose=True)
ours = machine.run(f, x, y)
torch.testing.assert_close(ours, f(x, y))
print("\nsame as calling f:", torch.equal(ours, f(x, y)))


# %% [markdown]
# Because it reads normalised instructions, the same machine works on 3.11, 3.12 and 3.13, on
# tensors and on plain numbers alike. Loops and branches come for free from the given jump
# handlers:

# %%
def countdown(x, n):
    while n > 0:
        x = x * 1.5 - 0.25
        n = n - 1
    return -x


for n in (0, 3):
    print(n, ch.StackMachine().run(countdown, 2.0, n), countdown(2.0, n))
t = torch.linspace(0, 1, 4, dtype=torch.float64)
print(ch.StackMachine().run(countdown, t, 2), countdown(t, 2))

# %% [markdown]
# ## 4. Frames, and watching them with `sys.settrace`
#
# A **frame** is one running call: the code object plus its locals, value stack, the index of
# the current instruction (`f_lasti`, a byte offset) and a link to the caller (`f_back`). Pure
# Python can look at frames (`sys._getframe()`) but cannot make CPython run a frame
# differently. What it *can* do is ask to be told about them: `sys.settrace(fn)` calls `fn`
# with a `'call'` event whenever a new frame starts; if `fn` returns a *local* trace function,
# that one gets `'line'`, `'return'` and `'exception'` events for the frame, and `'opcode'`
# events for every instruction once `frame.f_trace_opcodes = True`. A minimal tracer:

# %%
def show_events(fn, *args, opcodes=False):
    """Print the settrace events of fn's own frame."""
    def local(frame, event, arg):
        op = dis.opname[frame.f_code.co_code[frame.f_lasti]] if event == "opcode" else ""
        print(f"  {event:<7} line {frame.f_lineno - fn.__code__.co_firstlineno}  offset {frame.f_lasti:>3}  {op}")
        return local

    def on_call(frame, event, arg):
        if frame.f_code is not fn.__code__:
            return None  # not interested in other frames
        print(f"  {event:<7} {frame.f_code.co_name}{tuple(frame.f_locals)}")
        frame.f_trace = local  # (3.12 wants f_trace set before f_trace_opcodes)
        frame.f_trace_opcodes = opcodes
        return local

    sys.settrace(on_call)
    try:
        return fn(*args)
    finally:
        sys.settrace(None)


print("lines only:")
show_events(f, x, y)
print("\nwith opcode events:")
_ = show_events(f, x, y, opcodes=True)

# %% [markdown]
# Opcode events report *raw* instructions (note 3.11's `PRECALL` and `KW_NAMES`). Mapping
# `f_lasti` to the normalised instructions that came from that offset gives counts that read
# the same on every version. That is Exercise 1.4: `opcode_histogram(fn, *args)` returns the
# result and a `Counter` of the normalised opnames `fn`'s frame executed. For straight-line
# code it must equal the static listing (minus `RESUME`, which raises no event); in a loop the
# body counts once per iteration:

# %%
def looping(x, n):
    for i in range(n):
        x = torch.sin(x) + i
    return x


result, counts = ch.opcode_histogram(looping, torch.zeros(2), 3)
print(dict(sorted(counts.items())))
static = collections.Counter(i.opname for i in bytecode.get_instructions(looping) if i.opname != "RESUME")
print("static listing:", dict(sorted(static.items())))

# %% [markdown]
# (The test suite also runs the tracer's histogram on 3.12 and 3.13. The counts agree, with one
# instructive exception: for an `if` inside a loop, 3.12+ lay the branch out the other way
# round and use `POP_JUMP_IF_TRUE` where 3.11 uses `POP_JUMP_IF_FALSE`. Normalisation smooths
# over *encodings*; it cannot undo a different decision of the compiler.)
#
# ### Which torch op ran at which line?
#
# settrace tells us *where* we are; it does not see into C calls. To see the torch ops we add
# a `TorchFunctionMode`: while it is active, every overridable torch call (`torch.relu`,
# `Tensor.sum`, `Tensor.__add__`, ...) goes through its `__torch_function__` first, where we
# may log it, then run it:

# %%
from torch.overrides import TorchFunctionMode, resolve_name


class PrintOps(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        print("torch op:", resolve_name(func))
        return func(*args, **(kwargs or {}))


with PrintOps():
    f(x, y)

# %% [markdown]
# Inside `__torch_function__` the Python frames of the caller are still on the stack:
# `sys._getframe()` and `f_back` lead to the frame of `f`, whose `f_lineno` and `f_lasti` say
# which line and which instruction asked for the op. **Exercise 1.5**: `torch_op_lines(fn,
# *args)` returns the result and `{line: [op names]}` for `fn`'s lines; an op run inside a
# function that `fn` calls counts for the line of `fn` that made the call. (FX keeps the same
# information per graph node as its stack trace; chapter 2's graphs will show it.)

# %%
def two_layers(x, w):
    h = x @ w
    h = helper(h) + 1
    return torch.nn.functional.relu(h).mean(dim=-1)


def helper(t):
    return t.sin() * 2


_, op_lines = ch.torch_op_lines(two_layers, torch.randn(3, 4), torch.randn(4, 2))
first_line = two_layers.__code__.co_firstlineno
for line, ops in op_lines.items():
    print(f"line {line - first_line} of two_layers: {ops}")

# %% [markdown]
# ### How PyTorch really does it
#
# TorchDynamo does not watch frames with `sys.settrace` (section 6 says why it cannot: a trace
# function sees a frame only while CPython runs it). Its counterpart of `tinydynamo.bytecode` is
# `torch/_dynamo/bytecode_transformation.py`: `cleaned_instructions(code)` turns a code object
# into a list of its own `Instruction` dataclass (jump targets as references to instructions, not
# offsets), and `transform_code_object` / `assemble` write a new code object back, rebuilding what
# ours only reads: the 3.11+ exception table (`compute_exception_table`), the line table,
# `EXTENDED_ARG` prefixes for large arguments and the stack size. `torch/_dynamo/bytecode_analysis.py`
# adds liveness (which locals are read later: what a resume function must receive, chapter 4).
# Like ours, it supports only the CPython versions it was written for.

# %% [markdown]
# ## 5. From the package: `tinydynamo.tracer`
#
# `tinydynamo.tracer.trace(fn, *args)` combines both hooks: it watches every frame of *your*
# code (not torch's, the standard library's or installed packages'), records call / line /
# opcode / return events as normalised instructions, and attributes each torch op to the frame
# and instruction that called it, however deeply nested.

# %%
from tinydynamo import tracer


def g(x, y):
    z = torch.relu(x) + y
    w = helper(z)
    return w.sum(dim=0, keepdim=True)


traced = tracer.trace(g, x, y)
print(traced.format())

# %%
print(traced.format(opcodes=False))
print("\nframes:", traced.frames())
print("torch ops by line of g:", traced.lines_with_ops())
print("torch ops by line of helper:", traced.lines_with_ops("helper"))
torch.testing.assert_close(traced.result, g(x, y))


# %% [markdown]
# The trace also shows why a **data-dependent branch is a graph break, not a guard**. Python
# has to decide which way `if x.sum() > 0:` goes, so it calls `Tensor.__bool__` on the
# comparison's result at the conditional jump. A graph records tensor operations; it has no way
# to return "which line runs next" to the Python interpreter. TorchDynamo therefore stops the
# graph at that jump, runs the jump in ordinary Python, and resumes tracing in a new graph on
# whichever side was taken (chapter 4). A guard, by contrast, only checks cheap properties of
# the *inputs* (types, shapes, dtypes, constant values) before reusing a compiled graph.

# %%
def branchy(x):
    if x.sum() > 0:
        return x * 2
    return x + 1


print(tracer.trace(branchy, torch.ones(3)).format())

# %% [markdown]
# ## 6. PEP 523, and what pure Python can and cannot intercept
#
# CPython runs every Python frame in its interpreter loop, the C function
# `_PyEval_EvalFrameDefault`: a large loop over the instructions, like our `StackMachine`.
# (Since 3.11 a Python-to-Python call even stays inside the same invocation of that loop,
# unless a PEP 523 hook is installed.)
# **PEP 523** (Python 3.6) lets a C extension replace that function for the whole interpreter:
# `_PyInterpreterState_SetEvalFrameFunc(interp, my_eval_frame)`. From then on *every* frame, in
# any module, called from anywhere, goes through `my_eval_frame` before it runs.
#
# TorchDynamo installs such a callback (in `torch/csrc/dynamo/eval_frame.c`). For each frame,
# in outline:
#
# 1. **cache lookup**: the code object carries a list of `(guards, compiled code)` entries
#    (stored in the code object's "extra" slot). If one entry's guards pass on this frame's
#    locals and globals, evaluate the *compiled* code object instead of the original, with the
#    same locals; no Python-level tracing happens at all;
# 2. **compile**: otherwise call back into Python: symbolically run the bytecode, build an FX
#    graph, hand it to the backend, generate a new code object that calls the compiled graph,
#    build the guards, and add the entry to the cache;
# 3. **fall back**: if compiling fails or the frame should be skipped (torch's own code,
#    recompile limit reached), evaluate the original frame with the default evaluator.
#
# Pure Python cannot do any of this: there is no Python-level API for the frame-evaluation
# function (it takes C function pointers and a C frame struct), and `sys.settrace` only
# *observes*: its callbacks run beside the frame, cannot replace the code being run, and cost a
# Python call per event. So tinydynamo takes the other route: **wrap the callable**.
# `tinydynamo.compile(fn)` returns a wrapper that, on each call, looks up a cache keyed by
# `fn.__code__`, checks guards, and runs the compiled version or compiles a new one. What can
# the wrapper see?

# %%
calls_seen = collections.Counter()


def watch(fn):
    """A pure-Python 'frame hook': see the calls that go through this wrapper, per code object."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls_seen[fn.__code__.co_name] += 1
        return fn(*args, **kwargs)
    return wrapper


pipeline = [helper]  # someone kept a reference to the original helper
helper = watch(helper)  # g looks up the global `helper` at call time: it will get the wrapper
g(x, y)
pipeline[0](x)  # the saved reference bypasses the wrapper
print("seen by the wrapper:", dict(calls_seen))

seen_by_trace = collections.Counter()
for fn, args in ((g, (x, y)), (pipeline[0], (x,))):
    seen_by_trace.update(name.strip() for name in tracer.trace(fn, *args).frames())
print("seen by settrace:  ", dict(seen_by_trace))

# %% [markdown]
# The wrapper sees `helper` once: through `g`, because `LOAD_GLOBAL helper` finds the wrapper in
# the module globals. It misses the call through the saved reference, and it would miss calls
# from inside a compiled library, callbacks registered before wrapping, and so on. settrace sees
# every frame (here `g`, `helper`, `wrapper` and `helper` again). For tinydynamo the gap matters
# less than it seems: when the wrapper compiles `g`, the symbolic interpreter *inlines* the
# functions `g` calls, so one wrapper covers the whole call tree it captures.
#
# And settrace's price? Every event is a Python function call. Measured on this machine (the
# numbers vary; the ratio is what to look at):

# %% tags=["nbval-ignore-output"]
def per_call(setting=None, number=200, repeat=5):
    """Best time per call of g over `number` calls, inside `setting` (a tracer) if given."""
    best = float("inf")
    for _ in range(repeat):
        with setting() if setting else contextlib.nullcontext():
            start = time.perf_counter()
            for _ in range(number):
                g(small_x, small_y)
            best = min(best, (time.perf_counter() - start) / number)
    return best


small_x, small_y = torch.randn(4), torch.randn(4)
eager = per_call()
runs = {
    "settrace, lines only": functools.partial(tracer.FrameTracer, opcodes=False, torch_ops=False),
    "settrace + opcodes": functools.partial(tracer.FrameTracer, torch_ops=False),
    "settrace + opcodes + torch ops": tracer.FrameTracer,
}
print(f"{'eager':<32}{eager * 1e6:8.1f} us per call")
for name, setting in runs.items():
    seconds = per_call(setting)
    print(f"{name:<32}{seconds * 1e6:8.1f} us per call  ({seconds / eager:.1f}x)")

# %% [markdown]
# Several times slower with line events, tens of times with opcode events, on a small
# function (torch ops are cheap here, Python overhead dominates). Fine for a debugger or for
# this chapter, useless as the basis of a compiler, whose whole point is to make the cached call *cheaper* than
# eager. That is why TorchDynamo needs PEP 523, and why tinydynamo's wrapper does as little
# as possible on a cache hit.
#
# ## Summary
#
# * A code object is bytecode plus tables (`co_consts`, `co_varnames`, `co_names`), flags and a
#   line table; `dis` decodes it. CPython executes it on a value stack, frame by frame.
# * Bytecode changes in every CPython release (calls and their NULL slots, keyword names,
#   compare encodings, jump names, `RETURN_CONST`, `END_FOR`, inlined comprehensions,
#   superinstructions, `TO_BOOL`). `tinydynamo.bytecode.get_instructions` gives one normalised
#   view; the rest of tinydynamo reads only that.
# * `sys.settrace` watches frames, lines and opcodes; with a `TorchFunctionMode` it tells which
#   instruction ran which torch op (`tinydynamo.tracer`). It observes but cannot replace code,
#   and it is slow.
# * PEP 523 lets C code take over frame evaluation: TorchDynamo's cache lookup / compile /
#   fall back loop. Pure Python wraps the callable instead and caches per code object.
#
# Next chapter: the stack machine becomes *symbolic*: tensors on the stack become FX graph
# nodes, and running the bytecode builds a graph.
