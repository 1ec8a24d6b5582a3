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
# # Chapter 4 — Graph breaks and resume functions
#
# Chapters 2 and 3 captured whole functions. Real code is messier: a `print` between two layers,
# a `.item()` to log a loss, an `if` on a tensor's value. The symbolic interpreter cannot put
# those in an FX graph. Giving up on the whole function (running it eagerly) would waste every op
# around them, so TorchDynamo does something smarter: a **graph break**. It compiles the graph
# traced so far, runs the one unsupported instruction as ordinary Python, and continues in a
# **resume function** — a new code object holding the rest of the function, which is itself
# compiled, with its own graphs and guards.
#
# What you will learn:
#
# 1. to read `tinydynamo.explain()`: graph count, break count, and each break's reason and line
#    (and to compare with `torch._dynamo.explain`);
# 2. what the transformed code of a broken frame does, and what a resume function looks like;
# 3. why `if x.sum() > 0:` is a graph break and *not* a guard;
# 4. `fullgraph=True`, `TINY_LOGS=graph_breaks`, and removing breaks with `torch.where`;
# 5. how mutations of lists, dicts, attributes and globals are replayed after the graph.
#
# Exercises: 4.1 the branch handler that decides when a jump breaks the graph, 4.2 the locals a
# resume function needs, 4.3 a break-free rewrite, 4.4 break sites from an `explain()` result.

# %%
import logging
import sys
import warnings

import torch
import torch._dynamo

import tinydynamo
from course import load
from tinydynamo.bytecode import get_instructions
from tinydynamo.resume import make_resume_code
from tinydynamo.symbolic_convert import use_handlers

ch = load("ch04", unfinished="package")
_ = torch.manual_seed(0)
warnings.filterwarnings("ignore")
logging.getLogger("torch._dynamo").setLevel(logging.ERROR)


def print_between(x):
    a = x.sin()
    print("between ops")
    return a.cos()


def item_branch(x):
    y = x * 2
    if y.sum().item() > 0:
        return y + 1
    return y - 1


def branchy(x):
    y = torch.relu(x)
    if x.sum() > 0:
        return y * 2
    return y - 1


x = torch.randn(4)

# %% [markdown]
# ## 1. Three breaks, as `explain()` reports them
#
# `tinydynamo.explain(fn)(*args)` runs `fn` once under tinydynamo with a recording backend and
# reports what happened: how many graphs, how many breaks, why each break happened and where
# (file and line, like a traceback), the ops in each graph and the guards.

# %%
out = tinydynamo.explain(print_between)(x)
print(out)

# %% [markdown]
# Two graphs (`sin`, then `cos`), one break at the `print`. The other two examples:

# %%
for fn in (item_branch, branchy):
    out = tinydynamo.explain(fn)(x)
    print(f"{fn.__name__}: graphs={out.graph_count} breaks={out.graph_break_count}")
    for br in out.break_reasons:
        print("  reason:", br.reason)
        print("  at:    ", br.user_stack[0].splitlines()[0].split(", ", 1)[1])

# %% [markdown]
# PyTorch's own `torch._dynamo.explain` counts the same graphs and breaks on these functions
# (its reasons are worded differently):

# %%
for fn in (print_between, item_branch, branchy):
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(fn)(x)
    ours = tinydynamo.explain(fn)(x)
    print(f"{fn.__name__:14s} tinydynamo {ours.graph_count} graphs / {ours.graph_break_count} breaks | "
          f"torch {theirs.graph_count} graphs / {theirs.graph_break_count} breaks")
torch._dynamo.reset()

# %% [markdown]
# ## 2. What the transformed code does
#
# For a broken frame the cache entry's code (chapter 3's "transformed code") is no longer one call
# of the compiled graph. `tinydynamo.show` collects every artefact of a compile; here are the
# transformed code and the graphs of `print_between`:

# %%
def show_kinds(result, kinds):
    for frame in result.frames:
        for kind in kinds:
            for title, value in frame.get(kind):
                print(f"--- {kind}: {title} ---")
                print(str(value).rstrip())


tinydynamo.reset()
shown = tinydynamo.show(print_between, x, backend="eager")
show_kinds(shown, ["transformed_code", "graph"])

# %% [markdown]
# Read the first transformed code top to bottom:
#
# 1. `___compiled_fn(L['x'])` runs graph 1 (`sin`). Its outputs are everything the rest of the
#    frame needs: the live local `a` (and any values that were on the value stack).
# 2. The unsupported instruction — the `CALL` of `print` — runs natively, with the real values.
# 3. The locals and stack are handed to `__resume_at_<offset>`, whose name says where in the
#    original bytecode it picks up.
#
# The resume function is a real code object: the original bytecode with a prologue that pushes
# the saved stack and jumps to the instruction after the break. tinydynamo compiles it like any
# other frame — hence the second graph (`cos`) and its own guards. Its bytecode:

# %%
for title, value in shown.frames[1].get("bytecode"):
    print(value)

# %% [markdown]
# The prologue is two instructions: `LOAD_FAST ___stack0` puts back what the `CALL` left on the
# stack (`print`'s result, `___r` in the transformed code), and `JUMP_FORWARD` lands on the
# `POP_TOP` right after the original call. The old code before the jump is still there but never
# runs. `a` arrives as an ordinary argument — the only local the rest of the function reads.

# %% [markdown]
# ## 3. A tensor branch resumes on both sides
#
# At `if x.sum() > 0:` the graph computes the condition and returns it as an output; the
# transformed code does the `if` in Python, on the real value, and calls one resume function per
# side. Each side is compiled the first time it is taken.

# %%
tinydynamo.reset()
shown = tinydynamo.show(branchy, x, backend="eager")
show_kinds(shown, ["transformed_code"])
g = tinydynamo.compile(branchy, backend="eager")
for sign in (1.0, -1.0):
    xs = sign * (torch.rand(4) + 0.1)
    print(f"sign {sign:+}: matches eager: {torch.allclose(g(xs), branchy(xs))}")

# %% [markdown]
# **A correction to a common belief.** It is tempting to think the cache could *guard* on
# `x.sum() > 0` and keep one graph per side. It cannot: guards run *before* the graph, on the
# inputs, and may only check what is known then — types, shapes, strides, constants. `x.sum() > 0`
# is a value the graph itself computes; checking it first would mean running the computation
# twice. So a data-dependent `if` is a graph break, never a guard. (An `if` on a Python `bool`
# argument *is* decided at trace time and guarded, with no break — see Exercise 4.1.)
#
# ## Exercise 4.1 — the branch handler
#
# `ch.branch_on(tx, inst, jump_when)` handles `POP_JUMP_IF_TRUE/FALSE`: it raises `Unsupported`
# ("data-dependent branch...") on a tensor condition — which the translator turns into a graph
# break — and jumps on anything else. Plug it in with `use_handlers`:

# %%
def flag_branch(x, flag):
    if flag:
        return x.sin()
    return x.cos()


with use_handlers(**ch.BRANCH_HANDLERS):
    for fn, args in [(branchy, (x,)), (flag_branch, (x, True))]:
        out = tinydynamo.explain(fn)(*args)
        reasons = [br.reason for br in out.break_reasons]
        print(f"{fn.__name__}: graphs={out.graph_count} breaks={out.graph_break_count} {reasons}")

# %% [markdown]
# ## 4. `fullgraph=True` and `TINY_LOGS=graph_breaks`
#
# With `fullgraph=True` (as in `torch.compile`) a break is an error that names the reason, the
# line, and a hint:

# %%
tinydynamo.reset()
try:
    tinydynamo.compile(branchy, backend="eager", fullgraph=True)(x)
except tinydynamo.exc.Unsupported as e:
    print(type(e).__name__ + ":", e)

# %% [markdown]
# Without it, breaks are silent by default. `TINY_LOGS=graph_breaks` (or `set_logs` in a notebook)
# logs each one with the user's source line:

# %%
tinydynamo.set_logs(graph_breaks=True)
logging.getLogger("tinydynamo.graph_breaks").handlers[0].setStream(sys.stdout)
tinydynamo.reset()
tinydynamo.compile(item_branch, backend="eager")(x)
tinydynamo.set_logs(graph_breaks=False)

# %% [markdown]
# **What crosses a break gets guarded.** The resume function's arguments are ordinary inputs to
# a new frame, so chapter 3's guards apply to them. In `print_between` the resume function
# guards `L['___stack0'] == None` (the result of `print`, see the guards in section 1) — harmless.
# In `item_branch` the stack value is the Python float from `.item()`, and a float argument is
# specialised like any constant: every new value is a new resume compile.

# %%
from tinydynamo.testing import CompileCounter  # noqa: E402

tinydynamo.reset()
cnt = CompileCounter()
gi = tinydynamo.optimize(cnt)(item_branch)
for _ in range(4):
    xi = torch.randn(4)
    assert torch.allclose(gi(xi), item_branch(xi))
print("4 calls of item_branch, frames compiled:", cnt.frame_count)
tinydynamo.reset()

# %% [markdown]
# One compile for the first graph plus one resume compile per call (until chapter 3's
# `recompile_limit` sends the frame to eager). Another reason to remove such breaks: below,
# `torch.where` does it.
#
# ## Exercise 4.2 — what a resume function receives
#
# A resume function gets the stack values and the *live* locals: those the rest of the code may
# still read. Fewer arguments mean fewer guards on it. `ch.resume_locals(instructions, offset,
# names)` computes them from tinydynamo's normalised instructions; in a loop (a jump back before
# the break) every local is live. Here we build the resume function of `straight` after its
# `print` by hand, with `tinydynamo.resume.make_resume_code`, and call it:

# %%
def straight(x, y, z):
    a = x + y
    print("break")
    return a * z


insts = get_instructions(straight)
call = next(i for i in insts if i.opname == "CALL" and i.argval == 1)
after = next(i.offset for i in insts if i.offset > call.offset)
names = ch.resume_locals(insts, after, list(straight.__code__.co_varnames))
print("resume at offset", after, "needs locals", names)
resume = type(straight)(make_resume_code(straight.__code__, after, ["value"], names), straight.__globals__)
xa, ya, za = torch.randn(3), torch.randn(3), torch.randn(3)
print("resume(None, z, a) == (x + y) * z:", torch.allclose(resume(None, za, xa + ya), (xa + ya) * za))

# %% [markdown]
# (`None` is the result of `print`, the value the `CALL` left on the stack.)
#
# ## Exercise 4.3 — removing a break with `torch.where`
#
# Both sides of `branchy` are cheap, so compute both and select with `torch.where`: one graph,
# `fullgraph=True` works, same values as eager.

# %%
tinydynamo.reset()
gw = tinydynamo.compile(ch.where_rewrite, backend="eager", fullgraph=True)
for sign in (1.0, -1.0):
    xs = sign * (torch.rand(4) + 0.1)
    print(f"sign {sign:+}: equals eager branchy: {torch.allclose(gw(xs), branchy(xs))}")
out = tinydynamo.explain(ch.where_rewrite)(x)
print("graphs:", out.graph_count, "breaks:", out.graph_break_count)

# %% [markdown]
# The same trick fixes `item_branch` (`torch.where(y.sum() > 0, y + 1, y - 1)`); a `print` can
# move out of the compiled function, or be removed.
#
# ## Exercise 4.4 — where did it break?
#
# `ch.break_sites(out)` turns an `explain()` result into `(function, line)` pairs. A break inside a
# loop shows an interesting detail: the second break happens *in the resume function*, which
# reports its own name.

# %%
def looped(x, n):
    acc = x
    for i in range(n):
        acc = acc * 2
        print(i)
        acc = acc + x
    return acc


out = tinydynamo.explain(looped)(x, 2)
first = looped.__code__.co_firstlineno
print("graphs:", out.graph_count, "breaks:", out.graph_break_count)
print([(name, line - first) for name, line in ch.break_sites(out)], "(lines relative to `def looped`)")

# %% [markdown]
# ## 5. Side effects are replayed after the graph
#
# Appending to a global list, filling a dict, `self.count += 1`, `global STEP; STEP = 3`: these
# change Python objects that outlive the frame, and the graph cannot hold them. They are *not*
# graph breaks, though. The translator records them in the OutputGraph's `SideEffects` tracker
# (TorchDynamo's name): the list's VariableTracker gets the new items, so later reads in the frame
# see them, and the transformed code, after calling the graph, writes the final state back into
# the real objects, in the order they were first changed. A `print` that breaks the graph sees
# the effects recorded before it, because they are replayed before the `print` runs.

# %%
history = []


def log_and_scale(x, stats):
    y = x.relu()
    history.append(y.sum())  # a global list
    stats["calls"] += 1  # a dict argument
    print("stats:", stats, "history:", len(history))  # a break: it must see both changes
    return y * 2


tinydynamo.reset()
stats, ref_stats = {"calls": 0}, {"calls": 0}
compiled = tinydynamo.compile(log_and_scale, backend="eager")
ours = compiled(x, stats)
ours_history = list(history)
history.clear()
ref = log_and_scale(x, ref_stats)
print("equal eager:", torch.equal(ours, ref), stats == ref_stats,
      all(torch.equal(a, b) for a, b in zip(ours_history, history)))
print(tinydynamo.cache_info(compiled).entries[0].code)

# %% [markdown]
# The first lines after the graph call are the replay: `G['history']` is read into `___s0` (every
# source is read before any store, so a store cannot change what a later line refers to), its
# contents are rebuilt in place with the graph's output, and the dict's new value is written
# back. Only then does `print` run natively. Counts agree with TorchDynamo: one break, at the print.

# %%
history.clear()
torch._dynamo.reset()
theirs = torch._dynamo.explain(log_and_scale)(x, {"calls": 0})
history.clear()
ours = tinydynamo.explain(log_and_scale)(x, {"calls": 0})
print(f"tinydynamo {ours.graph_count} graphs / {ours.graph_break_count} breaks | "
      f"torch {theirs.graph_count} graphs / {theirs.graph_break_count} breaks")
history.clear()
torch._dynamo.reset()

# %% [markdown]
# What cannot be replayed faithfully — an object with its own `__setattr__`, a list changed while a
# loop iterates over it, assigning a parameter or submodule — stays a graph break (or an eager
# frame) with a reason, never a silently wrong result.

# %% [markdown]
# ## From the package
#
# Everything above is `tinydynamo`'s own machinery: the translator stops at a `CALL`, a jump or a
# store it cannot trace (`symbolic_convert.BREAKABLE`), `OutputGraph` compiles the graph so far
# and writes the transformed code, `tinydynamo.resume` builds `__resume_at_<offset>` code objects
# with the `bytecode` package, and `tinydynamo.explain` counts it all. Breaks inside grad-mode
# `with` blocks resume (the appendix shows how), and so do breaks in frames with closures (the
# resume function gets the frame's real cells as its own closure); inside `try` blocks or other
# `with` blocks they are not resumable: that frame runs eagerly, and `explain` lists it. The
# package on the seeds' examples, once more:

# %%
inputs = [torch.rand(4) + 0.1, -(torch.rand(4) + 0.1)]
for fn in (item_branch, branchy, ch.where_rewrite):
    tinydynamo.reset()
    compiled = tinydynamo.compile(fn, backend="eager")
    same = all(torch.allclose(compiled(xi), fn(xi)) for xi in inputs)
    e = tinydynamo.explain(fn)(x)
    print(f"{fn.__name__:14s} graphs={e.graph_count} breaks={e.graph_break_count} equals eager on both signs: {same}")
tinydynamo.reset()

# %% [markdown]
# **What you built.** A graph break keeps the compiler useful on code it cannot fully capture:
# compile what you can, run the rest natively, resume in a new compiled frame. `explain()` tells
# you where the breaks are; `torch.where` removes them; side effects on lists, dicts, attributes
# and globals no longer cause them (they are replayed after the graph). Next
# (chapter 5): what the backend does with the graphs — decompositions into a small prim set.

# %% [markdown]
# ## Appendix — a break inside `with torch.no_grad()`
#
# Grad-mode blocks are the one kind of `with` that tinydynamo captures, as TorchDynamo does:
# entering `torch.no_grad()` adds a `torch._C._set_grad_enabled(False)` node to the graph, leaving
# it adds `_set_grad_enabled(True)`. A break *inside* such a block needs one more idea
# (TorchDynamo's `ReenterWith`): the graph leaves the block before the break, the transformed code
# runs the unsupported instruction inside `with torch.no_grad():` again, and the resume function
# starts by entering a fresh `no_grad()` — its prologue does `LOAD_FAST ___stack0; BEFORE_WITH` —
# so the rest of the block, its `__exit__` and its exception handler work as in the original.

# %%
def no_grad_print(x, w):
    y = x * w
    with torch.no_grad():
        z = y * 2
        print("inside no_grad")
        z = z + 1
    return y + z, z


wg = torch.randn(4, requires_grad=True)
ours = tinydynamo.explain(no_grad_print)(x, wg)
theirs = torch._dynamo.explain(no_grad_print)(x, wg)
print("tinydynamo graphs/breaks:", ours.graph_count, ours.graph_break_count,
      "| torch._dynamo:", theirs.graph_count, theirs.graph_break_count)
for gm in ours.graphs:
    print(gm.code.strip())

# %% [markdown]
# The transformed code, and the resume function decompiled back to Python (with the `depyf`
# package; `tinydynamo.show` and `TINY_COMPILE_DEBUG=1` show the same views):

# %%
shown = tinydynamo.show(no_grad_print, x, wg, backend="eager")
for title, text in shown.frames[0].get("transformed_code"):
    print(f"--- {title}\n{text}")

# %% [markdown]
# Gradients see the block too: `z` does not require grad, `y + z` does, as in eager.

# %%
tinydynamo.reset()
got, want = tinydynamo.compile(no_grad_print, backend="aot_eager")(x, wg), no_grad_print(x, wg)
print("equal:", all(torch.allclose(g, e) for g, e in zip(got, want)),
      "| requires_grad:", [t.requires_grad for t in got], "eager:", [t.requires_grad for t in want])
tinydynamo.reset()
