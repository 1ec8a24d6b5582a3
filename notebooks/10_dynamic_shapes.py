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
# # Chapter 10 — Dynamic shapes: sizes as symbols, from guards to kernels
#
# Every graph so far was compiled for the exact sizes of its first inputs: chapter 3's
# TENSOR_MATCH guard checks them, chapter 7's loop IR has them as constants, chapters 8 and 9
# wrote them into the kernels. That is the right default — a compiler that knows every size
# picks the best tiles and drops the bounds checks — but real workloads change a size on every
# call: the sequence length of a text model, the batch of a server, the number of boxes left
# after a filter. This chapter makes sizes **symbols** through the whole stack, the way
# `torch.compile` does.
#
# **What you will learn**
#
# 1. the *recompile storm*: one graph per length, until `recompile_limit` gives up;
# 2. symbols for sizes, 0/1 specialisation, and guards that are *relations* over symbols — a
#    branch on a size guards the branch, not the size (Exercise 10.1);
# 3. sizes of results as expressions over symbols: broadcasting, `view(-1)` (Exercise 10.2);
# 4. the policy: `dynamic=None` (static first, then *automatic dynamic*), `dynamic=True`,
#    `dynamic=False`, `mark_dynamic` (Exercise 10.3);
# 5. a kernel that takes its sizes as arguments: index expressions over symbols (Exercise 10.4);
# 6. when to pad to a few buckets instead.
#
# Each piece is built small on sympy (the library torch's own symbolic shapes use), then the
# same thing is shown in `tinydynamo`/`tininductor` and in `torch.compile`.

# %%
import logging
import warnings

import sympy
import torch
import torch.nn.functional as F

import tinydynamo
from course import load
# the course's helpers for this chapter (not exercises): they run your functions
from course.chapters.ch10_dynamic_shapes import SymInt, check_fn, pointwise_kernel, run_pointwise, simulate_cache
from course.models import TinyBlock
from tinydynamo.testing import CompileCounter, CompileCounterWithBackend

ch = load("ch10", unfinished="package")
_ = torch.manual_seed(0)
logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # torch's recompile warnings: counted below instead
warnings.filterwarnings("ignore", message=".*recompile_limit.*")


def row_norm(x):
    return F.layer_norm(x, x.shape[-1:]) * 2 + 1


LENGTHS = [64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512]

# %% [markdown]
# ## 1. The recompile storm
#
# The seeds' experiment: one function, a sequence length that changes on every call. With
# shapes static (`dynamic=False`), every new length fails the shape guard and compiles a new
# graph. After `recompile_limit` (8) compiles of one code object, the compiler stops trying and
# runs the function eagerly for good — the last lengths below were not compiled at all.

# %%
def sweep(compile_fn, lengths=LENGTHS):
    """Call a compiled row_norm once per length; return how many graphs its backend received."""
    counter = CompileCounter()
    fn = compile_fn(row_norm, counter)
    for n in lengths:
        x = torch.randn(2, n, 32)
        torch.testing.assert_close(fn(x), row_norm(x))
    return counter.frame_count


for dynamic in (False, None, True):
    torch._dynamo.reset()
    count = sweep(lambda f, backend: torch.compile(f, backend=backend, dynamic=dynamic))
    print(f"torch.compile dynamic={dynamic!s:<5}: {len(LENGTHS)} lengths -> {count} graphs")

# %% [markdown]
# The default (`dynamic=None`) compiled twice: once for the first length, with every size a
# constant, and once more when the length changed — this time with the length as a symbol, a
# graph that serves every length after it. `dynamic=True` starts symbolic and compiles once.
# The same sweep through our own front end (the package; it grows these policies in this
# chapter):

# %%
for dynamic in (False, None, True):
    tinydynamo.reset()
    count = sweep(lambda f, backend: tinydynamo.compile(f, backend=backend, dynamic=dynamic))
    print(f"tinydynamo    dynamic={dynamic!s:<5}: {len(LENGTHS)} lengths -> {count} graphs")

# %% [markdown]
# ## 2. Symbols for sizes, and guards on them
#
# A **ShapeEnv** hands out a symbol per size it is asked to make dynamic and remembers two
# things about it: its *example value* (the size of the input being traced, called the hint)
# and its *sources* (where the compiled code reads it, `L['x'].size()[1]`). Two rules shape it:
#
# * **0/1 specialisation.** Sizes 0 and 1 never become symbols. A size-1 dim broadcasts and a
#   size-0 tensor is empty: so many rules ask "is it 1?" that keeping a symbol that might be 1
#   would split every one of them. A symbol therefore means "some size ≥ 2", a fact the guards
#   state, and inputs of size 0 or 1 get a graph of their own.
# * **Duck sizing.** Two sizes with the same example value get the *same* symbol, and a guard
#   that they are equal: usually they are the same dimension under two names (a sequence
#   length of a tensor and of its mask). `torch.compile` does this for `dynamic=True`.

# %%
env = ch.ShapeEnv()
s0, s1 = env.create_sizes("x", (6, 8))
y_sizes = env.create_sizes("y", (6, 1))
print("x:", (s0, s1), " y:", y_sizes)
print("example values:", env.var_to_val)
print("sources:", env.var_to_sources)

# %% [markdown]
# Tracing with symbols means Python code sees them: `x.shape[1] * 2 > 20` in user code is an
# expression over `s1`. When Python needs a real `bool` — an `if` — the tracer asks the
# ShapeEnv. It answers with the example value (the path the trace takes) and **records what it
# answered** as a guard: the graph is only right for sizes that would take the same path.
# Torch's `SymInt`/`SymBool` do exactly this; here is a small one:

# %%
def user_code(n):
    """What a model might do with x.shape[1]."""
    if n * 2 > 20:
        return "long path"
    return "short path"


n = SymInt(s1, env)
print(user_code(n), "| guards so far:", env.guards)

# %% [markdown]
# The guard is `2*s1 <= 20`, not `s1 == 8`: every length up to 10 reuses this graph, and only a
# length that would take the other branch recompiles. That is the whole point of symbols: a
# guard on a size *relation* instead of on a size.
#
# **Exercise 10.1** writes the two methods this rests on: `ShapeEnv.evaluate_expr` (answer the
# question at the example values, record what must stay true, once; nothing to record when no
# symbol is left in it) and `ShapeEnv.produce_guards` (every guard as Python over the sources:
# the duck-sizing equalities, `2 <= size` for each symbol, then the recorded relations).

# %%
env.evaluate_expr(sympy.Eq(s0, 8))  # e.g. a check `x.shape[0] == 8` in the model
guards = env.produce_guards()
for g in guards:
    print(g)
check = check_fn(guards)
for xs, ys in [((6, 9), (6, 1)), ((3, 5), (3, 1)), ((6, 12), (6, 1)), ((6, 9), (5, 1)), ((1, 9), (1, 1))]:
    print(f"x {xs}, y {ys}: reuse the graph = {check({'x': torch.empty(xs), 'y': torch.empty(ys)})}")

# %% [markdown]
# The check function is chapter 3's, with relations where the equalities were. When it fails,
# the recompile log names the relation that failed. In the package (`TINY_LOGS=guards`), a
# graph compiled with a dynamic dim carries these relations:

# %%
def pick(x):
    if x.shape[1] > 4:
        return x.sum(1)
    return x.mean(1)


tinydynamo.reset()
cnt = CompileCounter()
fp = tinydynamo.compile(pick, backend=cnt, dynamic=True)
x = torch.randn(6, 8)
torch.testing.assert_close(fp(x), pick(x))
for guard in tinydynamo.cache_info(fp).entries[0].check_fn.guards:
    print(guard)
for shape in [(6, 12), (3, 5), (6, 3), (6, 4)]:
    xs = torch.randn(shape)
    torch.testing.assert_close(fp(xs), pick(xs))
print("graphs for 5 calls, both sides of the branch:", cnt.frame_count)

# %% [markdown]
# ## 3. Sizes of results, over symbols
#
# While tracing, every op computes the sizes of its result — with symbols in them. Most rules
# are arithmetic (`cat` adds, `matmul` keeps the outer sizes, a reduction drops one); two are
# worth building because they show where guards and 0/1 specialisation come from.
#
# **Broadcasting** compares sizes from the right: a 1 takes the other size. Because a symbol
# is never 1, `s0` against `s1` cannot mean "one of them is 1": they must be equal, and that
# becomes a guard. Against a constant, the constant wins (the symbol is specialised).
# **`view(-1)`** divides the element count by the other sizes: `s0*s1*4` elements viewed as
# `(s0, -1)` are `(s0, 4*s1)`, which sympy finds by cancelling. **Exercise 10.2** writes both.

# %%
guards = []
print(ch.broadcast_shapes((s0, 1), (s1,), guards), guards)
print(ch.broadcast_shapes((s0, s1), (s1, s1), guards), guards)
print(ch.broadcast_shapes((s0, 3), (5, 1, 3), guards), guards)
print(ch.view_shape(s0 * s1 * 4, (s0, -1)))
print(ch.view_shape(s0 * 6, (-1, 3, 2)))
try:
    ch.view_shape(s0 * 6, (4, -1))
except ValueError as error:
    print("refused:", error)

# %% [markdown]
# In a captured graph, sizes become graph inputs: the graph takes the symbol as a `SymInt`
# placeholder (its value read from the tensor by the compiled frame), and a size the code
# computes with (`x.shape[0]` in a `view`) is an expression of those placeholders. The
# package's graph of a reshape by sizes:

# %%
def flatten_rows(x):
    b, t, c = x.shape
    return (x.view(b * t, c) * 2).view(b, -1)


tinydynamo.reset()
cnt = CompileCounter()
ff = tinydynamo.compile(flatten_rows, backend=cnt, dynamic=True)
for shape in [(2, 5, 4), (3, 7, 4)]:
    xs = torch.randn(shape)
    torch.testing.assert_close(ff(xs), flatten_rows(xs))
print(cnt.graphs[-1].code.strip())
print("graphs:", cnt.frame_count)

# %% [markdown]
# TorchDynamo's graph of the same function, for comparison. The package fakes its inputs with
# torch's own `ShapeEnv` (as TorchDynamo does), which names each symbol after a hash of its
# source, so the two graphs use the same names:

# %% tags=["nbval-ignore-output"]
def keep_graph(gm, example_inputs):
    keep_graph.gm = gm
    return gm.forward


torch._dynamo.reset()
torch.compile(flatten_rows, backend=keep_graph, dynamic=True)(torch.randn(2, 5, 4))
print(keep_graph.gm.code.strip())

# %% [markdown]
# ## 4. The policy: when does a size become a symbol?
#
# Symbols cost something: a kernel for unknown sizes cannot unroll or pick its tile for the
# size, and tracing with symbols is slower. So `torch.compile` does not make every size a
# symbol. Its policy, which the package follows:
#
# | setting | what becomes a symbol |
# | --- | --- |
# | `dynamic=None` (default) | nothing on the first compile; on a recompile because a size changed, the dims that changed (**automatic dynamic**), for good |
# | `dynamic=True` | every dim, from the first compile (with duck sizing) |
# | `dynamic=False` | nothing (except marked dims) |
# | `mark_dynamic(x, d)` | dim `d` of that input, from the first compile, under any setting |
# | `maybe_mark_dynamic(x, d)` | the same, but a guard may still specialise it without an error |
# | `mark_static(x, d)` | never dim `d` |
#
# Sizes 0 and 1 stay constants under every setting. To know "which dims changed", the frame
# keeps a small state per input, updated at each compile: the size each dim had, or "dynamic"
# once it has seen two. **Exercise 10.3** writes `update_frame_state` and `symbolic_dims`;
# `simulate_cache` then replays a cache over a sequence of input sizes and lists the graphs it
# compiles (an int: a static dim; a name: a symbol, `s0`, `s1`... shared by duck sizing, `u0`, `u1`...
# one per dim).

# %%
calls = [(4, 8), (4, 16), (4, 32), (8, 32), (1, 32), (4, 1), (4, 64), (1, 1), (8, 8)]
for dynamic in (None, True, False):
    patterns = simulate_cache(ch.update_frame_state, ch.symbolic_dims, calls, dynamic)
    print(f"dynamic={dynamic!s:<5} {len(patterns)} graphs: {patterns}")
print("mark_dynamic(x, 1):", simulate_cache(ch.update_frame_state, ch.symbolic_dims, calls, None, marked=[1]))

# %% [markdown]
# Read the default row: static `(4, 8)`; the length changes, so dim 1 becomes a symbol; the
# batch changes, so both do; `(1, 32)` fails `2 <= size` and compiles with the 1 specialised,
# and so on. `torch.compile` compiles the same number of graphs on these calls:

# %%
def double_sin(x):
    return (x * 2).sin()


for dynamic, marked in ((None, ()), (True, ()), (False, ()), (None, (1,))):
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    fn = torch.compile(double_sin, backend=counter, dynamic=dynamic)
    for sizes in calls:
        x = torch.randn(sizes)
        for d in marked:
            torch._dynamo.mark_dynamic(x, d)
        fn(x)
    ours = len(simulate_cache(ch.update_frame_state, ch.symbolic_dims, calls, dynamic, marked))
    print(f"dynamic={dynamic!s:<5} marked={marked!s:<5} torch.compile: {counter.frame_count}  simulate_cache: {ours}")

# %% [markdown]
# In the package, `TINY_LOGS=dynamic` (or `tinydynamo.set_logs(dynamic=True)`) says which dim
# became a symbol and why, and `tinydynamo.mark_dynamic` marks one ahead of time, so even the
# first compile is symbolic:

# %%
tinydynamo.set_logs(dynamic=True)
logging.getLogger("tinydynamo.dynamic").handlers[0].setStream(__import__("sys").stdout)
tinydynamo.reset()
cnt = CompileCounter()
fd = tinydynamo.compile(double_sin, backend=cnt)
for sizes in [(4, 8), (4, 16), (4, 32)]:
    fd(torch.randn(sizes))
tinydynamo.set_logs(dynamic=False)
print("default policy, 3 lengths:", cnt.frame_count, "graphs")

tinydynamo.reset()
cnt = CompileCounter()
fd = tinydynamo.compile(double_sin, backend=cnt)
for sizes in [(4, 8), (4, 16), (4, 32)]:
    x = torch.randn(sizes)
    tinydynamo.mark_dynamic(x, 1)
    fd(x)
print("mark_dynamic(x, 1), 3 lengths:", cnt.frame_count, "graph")

# %% [markdown]
# ## 5. A kernel that takes its sizes as arguments
#
# Chapters 8 and 9 printed kernels with the sizes written in: `xnumel = 4096`, a load at
# `x0 + 64*x1`. With symbols, the same code generators print *expressions*, and every symbol
# becomes a kernel argument that the wrapper reads from the input tensors on each call:
# `xnumel` (the number of elements, `s0*s1`) bounds the loop or the mask, and loads index
# with `xindex % s1` instead of `xindex % 64`. One kernel then serves every size.
#
# Two index rules are all a pointwise kernel needs. A contiguous tensor's **strides** are
# products of the sizes inside each dim. An output element's flat index `xindex` gives its
# coordinate in dim `d` as `xindex // stride_d`, modulo `size_d` (the outermost dim needs no
# modulo: `xindex < xnumel` bounds it). An input **broadcast** to the output reads at the sum
# of coordinate × its own stride, over its dims (aligned on the right) that are not 1.
# **Exercise 10.4** writes `contiguous_strides` and `broadcast_index`; `pointwise_kernel` turns
# them into a (Python) kernel.

# %%
S0, S1, S2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)
print("strides of (s0, s1, s2):", ch.contiguous_strides((S0, S1, S2)))
out_sizes, in_shapes = (S0, S1, S2), [(S0, S1, S2), (S0, 1, S2), (S1, 1)]
source = pointwise_kernel(ch.broadcast_index, "kernel_add_mul", out_sizes, in_shapes, "{0} + {1} * {2}")
print(source)

# %%
for a, b, c in [(2, 3, 4), (3, 5, 2), (4, 2, 7)]:
    x, y, z = torch.randn(a, b, c), torch.randn(a, 1, c), torch.randn(b, 1)
    out = run_pointwise(source, out_sizes, in_shapes, [x, y, z])
    print(f"sizes ({a}, {b}, {c}): one source, matches eager: {torch.allclose(out, x + y * z, atol=1e-6)}")

# %% [markdown]
# The Triton kernel of chapter 8 needs nothing new: the index expression goes into the load
# (`ch.pexpr` prints it), `xnumel` and the symbols join the kernel's arguments, and the mask
# `xindex < xnumel` was already there for the last block:

# %%
print("def triton_poi_fused_add_mul_0(in_ptr0, in_ptr1, in_ptr2, out_ptr0, xnumel, s0, s1, s2, XBLOCK: tl.constexpr):")
print("    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)")
print("    xmask = xindex < xnumel")
for i, shape in enumerate(in_shapes):
    print(f"    tmp{i} = tl.load(in_ptr{i} + ({ch.pexpr(ch.broadcast_index(out_sizes, shape))}), xmask)")
print("    tl.store(out_ptr0 + (xindex), tmp0 + tmp1 * tmp2, xmask)")

# %% [markdown]
# tininductor does this for real: with a dynamic dim, its kernels take `xnumel` (and `rnumel`
# for a reduction) and the size symbols as arguments, and the wrapper's `call()` computes them
# from the inputs. One refinement matters more with symbols than without: a load that walks
# the output's dims contiguously, `s1*s2*(xindex // (s1*s2)) + s2*((xindex // s2) % s1) +
# xindex % s2`, is just `xindex`, and its Triton kernel says so (`indexing.join_dimensions`):
# no division by a runtime size per element, and one size argument fewer. The instructor view
# of the seeds' block, length marked dynamic:

# %%
def show_kinds(result, kinds):
    for frame in result.frames:
        for kind in kinds:
            for title, value in frame.get(kind):
                print(f"--- {kind}: {title} ---")
                print(str(value).rstrip())


block = TinyBlock(hidden=32).eval()
x = torch.randn(2, 24, 32)
tinydynamo.mark_dynamic(x, 1)
with torch.no_grad():
    shown = tinydynamo.show(block, x)
    show_kinds(shown, ["graph", "output_code"])
    compiled = tinydynamo.compile(block)
    for t in (24, 40, 57):
        xs = torch.randn(2, t, 32)
        tinydynamo.mark_dynamic(xs, 1)
        torch.testing.assert_close(compiled(xs), block(xs), rtol=1e-4, atol=1e-4)
print("one compiled block, lengths 24, 40, 57: match eager")

# %% [markdown]
# ## 6. When to bucket or pad instead
#
# Dynamic shapes trade compile count for kernel quality: a static kernel knows its trip
# counts, can pick a tile that divides the size and can skip masks; a symbolic one cannot. For
# pointwise and row-wise work on a GPU the difference is usually small; for reductions whose
# length is unknown, a kernel may have to loop where a static one would keep the row in
# registers. Serving systems often prefer a third way: **pad every input up to one of a few
# bucket sizes** (64, 128, 256, 512...), compile once per bucket with static shapes, and slice
# the result back. The number of compiles is bounded by the number of buckets, every kernel is
# static, and the cost is the wasted work on padding (at most half with doubling buckets).
#
# Chapter 11 builds that wrapper (`bucketed`, Exercise 11.3) and measures it against per-length
# recompiles. A rule of thumb, from the seeds and from `torch.compile`'s own advice:
#
# * sizes that rarely change: static (the default does this by itself);
# * a few sizes known in advance: bucket and pad, or compile each;
# * a size that takes many values (sequence length, batch of a server): let the default mark it
#   dynamic after the first change, or `mark_dynamic` it ahead of time, and measure the
#   dynamic kernels against static ones;
# * padding must not change the answer: padded rows are harmless when each row is computed on
#   its own (a LayerNorm over the hidden dim, padded along the sequence) and sliced away after;
#   an op that reduces or attends *along* the padded dim needs a mask, or it reads the padding.
#
# `bench/dynamic_shapes.py` runs the seeds' experiment: the block at lengths 64..512, compiled
# with `dynamic=None` and `dynamic=True` by both compilers, counting compiles and compile
# seconds and timing each length against a static compile of that length. On the H100 (the
# README's table) both compilers compile 2 graphs with the default policy and 1 with
# `dynamic=True`, and the kernels of tiny's one dynamic graph take 0.98-1.02x the time of a
# static compile's at every length. The time per call of a block this small is set by the
# host, and it swings by more than that from run to run.

# %% [markdown]
# ## 7. From the package
#
# | piece | torch | here |
# |---|---|---|
# | symbols, hints, guards on them | `ShapeEnv`, `SymInt`, `guard_bool` | `ch.ShapeEnv` (Exercise 10.1); the package fakes inputs with torch's own `ShapeEnv` and checks its relations as `SHAPE_ENV` guards (`tinydynamo/symbolic_shapes.py`, `variables/sym_node.py`) |
# | size rules over symbols | meta functions over `SymInt` | Exercise 10.2; in the package, torch's meta functions on fake tensors with symbolic sizes |
# | automatic dynamic, `mark_dynamic` | `torch._dynamo` frame state | Exercise 10.3; `tinydynamo.compile(dynamic=...)`, `tinydynamo.mark_dynamic` (`tinydynamo/symbolic_shapes.py`) |
# | kernels over symbols | Inductor's `sympy` indexing, `xnumel` arguments | Exercise 10.4; `tininductor/indexing.py`, its Triton and C++ kernels and wrapper |
#
# Next chapter: the whole stack measured end to end against eager and `torch.compile`.
