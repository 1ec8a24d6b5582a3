# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 7: the loop IR and fusion
#
# By now a captured function is an FX graph of small ATen ops (chapters 2-6). Running it op by
# op is what eager PyTorch does: every op reads its inputs from memory and writes its result
# back. For the cheap elementwise ops that fill real models (`x * scale + bias`, activations,
# residual adds, the edges of a normalisation) that memory traffic, not arithmetic, is the
# cost. Inductor's answer is **fusion**: compute a chain of ops in one kernel, keeping the
# intermediates in registers.
#
# To fuse, the compiler needs a representation in which "what element `i` of a result is"
# can be combined across ops. That is the **loop IR**. In this chapter you will:
#
# 1. describe a tensor as *ranges + `inner_fn(index)`*, and see why that makes fusion nearly free;
# 2. meet the **ops handler**: one `inner_fn`, three meanings (printed, dependency-collected, run);
# 3. lower a few ops by hand, including views and broadcasting as pure index arithmetic;
# 4. watch the scheduler's fusion decisions on a pointwise chain, softmax and LayerNorm, drawn,
#    with the memory traffic they save;
# 5. run the package (`tininductor`) on the LayerNorm-MLP block from the benchmarks.
#
# Exercises 7.1-7.4 are real pieces of `tininductor`: a lowering, view index arithmetic, the
# fusion legality check and the dependency-recording ops handler.

# %%
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # kernels run in Triton's CPU interpreter

from course import load
# the course's helpers for this chapter (not exercises): they plug your functions into the pipeline
from course.chapters.ch07_loop_ir import (compile_aten, draw_fusion, fusion_dot, fusion_text, lower_and_schedule,
                                          memory_traffic, use_fusion_check, use_lowering, use_view_lowerings)

ch = load("ch07", unfinished="package")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where the generated kernels run
torch.manual_seed(0)
print("kernels run on:", DEVICE)

# %% [markdown]
# ## 1. A buffer is ranges plus a function of the index
#
# Write `y = (x + 1) * 2` for a `[2, 3]` tensor `x` as a description, not a computation:
# *for every index `(i0, i1)` in `range(2) x range(3)`, element `(i0, i1)` of `y` is
# `(x[i0, i1] + 1) * 2`*. In code: a list of **ranges** and a Python function **`inner_fn(index)`**.

# %%
class Pointwise:
    """Element ``index`` of this tensor is ``inner_fn(index)``, for index in ``ranges``."""

    def __init__(self, ranges, inner_fn):
        self.ranges, self.inner_fn = list(ranges), inner_fn

    def make_loader(self):
        return self.inner_fn


class InputBuffer:
    """A tensor already in memory: reading it is a load."""

    def __init__(self, name, size):
        self.name, self.ranges = name, list(size)

    def make_loader(self):
        strides = [1] * len(self.ranges)
        for d in range(len(self.ranges) - 2, -1, -1):
            strides[d] = strides[d + 1] * self.ranges[d + 1]
        return lambda index: ops.load(self.name, sum(i * s for i, s in zip(index, strides)))


# %% [markdown]
# What do `ops.load`, `ops.add`, ... *do*? Nothing fixed: `ops` forwards every call to
# whichever **handler** is installed at the moment. That is the whole trick; here it is in
# a dozen lines (the package's version is `tininductor/virtualized.py`).

# %%
import contextlib


class _Ops:
    handler = None

    def __getattr__(self, name):
        return lambda *args: getattr(_Ops.handler, name)(*args)


ops = _Ops()


@contextlib.contextmanager
def set_handler(handler):
    old, _Ops.handler = _Ops.handler, handler
    try:
        yield handler
    finally:
        _Ops.handler = old


# %% [markdown]
# Lowering `add` and `mul` means building a `Pointwise` whose `inner_fn` calls its inputs'
# loaders. Notice what happens to `x + 1` inside `(x + 1) * 2`: the outer op calls the inner
# op's `inner_fn` directly. Nothing is stored in between: **the producer is inlined into
# the consumer**. That is fusion of a pointwise chain, for free.

# %%
def lower_pointwise(op_name, *inputs):
    loaders = [t.make_loader() if hasattr(t, "make_loader") else (lambda index, c=t: ops.constant(c)) for t in inputs]
    ranges = next(t.ranges for t in inputs if hasattr(t, "ranges"))
    return Pointwise(ranges, lambda index: getattr(ops, op_name)(*[load(index) for load in loaders]))


x = InputBuffer("x", [2, 3])
y = lower_pointwise("mul", lower_pointwise("add", x, 1.0), 2.0)

# %% [markdown]
# ## 2. One `inner_fn`, three handlers
#
# **Printing.** A handler whose ops return strings turns the body into text, for people.

# %%
import sympy


class TextHandler:
    def load(self, name, index):
        return f"load({name}, {index})"

    def constant(self, value):
        return repr(value)

    def __getattr__(self, op):
        return lambda *args: f"{op}({', '.join(map(str, args))})"


i0, i1 = sympy.symbols("i0 i1", integer=True, nonnegative=True)
with set_handler(TextHandler()):
    print(y.inner_fn([i0, i1]))

# %% [markdown]
# **Collecting dependencies.** A handler that only records loads tells the scheduler which
# buffers a kernel reads, and *where* (the index is a sympy expression, so it can compare
# `3*i0 + i1` with what a producer wrote). Exercise 7.4 is the package's version of it.

# %%
class Reads:
    def __init__(self):
        self.reads = []

    def load(self, name, index):
        self.reads.append((name, index))
        return "v"

    def __getattr__(self, op):
        return lambda *args: "v"


with set_handler(Reads()) as h:
    y.inner_fn([i0, i1])
print(h.reads)

# %% [markdown]
# **Running it.** A handler whose ops compute with real numbers evaluates the IR directly:
# an executable specification to check lowerings against eager, element by element.

# %%
import itertools
import math


class EvalHandler:
    def __init__(self, buffers):
        self.buffers = {name: t.flatten() for name, t in buffers.items()}

    def load(self, name, index):
        return self.buffers[name][int(index)].item()

    def constant(self, value):
        return value

    add = staticmethod(lambda a, b: a + b)
    sub = staticmethod(lambda a, b: a - b)
    mul = staticmethod(lambda a, b: a * b)
    truediv = staticmethod(lambda a, b: a / b)
    exp = staticmethod(math.exp)
    sin = staticmethod(math.sin)
    maximum = staticmethod(max)


def evaluate(node, **inputs):
    out = torch.empty(node.ranges)
    with set_handler(EvalHandler(inputs)):
        for index in itertools.product(*map(range, node.ranges)):
            out[index] = node.inner_fn(list(index))
    return out


xt = torch.randn(2, 3)
print(evaluate(y, x=xt))
torch.testing.assert_close(evaluate(y, x=xt), (xt + 1) * 2)
print("matches eager")

# %% [markdown]
# The code generators of chapter 8 are just two more handlers: one prints Triton, one prints
# C++. Each is little more than a table `op -> format string`.
#
# ## 3. Reductions, views and broadcasting
#
# A **reduction** has two sets of ranges: the kept ones (`index`) and the reduced ones
# (`rindex`). Its body is `inner_fn(index, rindex)`, combined over every `rindex` by a
# `reduction_type` (`sum`, `max`, ...). Unlike a pointwise node, a reduction is **realized**:
# written to a named buffer, because each of its elements depends on a whole row.

# %%
class Reduction:
    def __init__(self, ranges, reduction_ranges, inner_fn, reduction_type):
        self.ranges, self.reduction_ranges = list(ranges), list(reduction_ranges)
        self.inner_fn, self.reduction_type = inner_fn, reduction_type


def lower_sum_last_dim(x):
    *kept, last = x.ranges
    load = x.make_loader()
    return Reduction(kept, [last], lambda index, rindex: load(list(index) + list(rindex)), "sum")


r = lower_sum_last_dim(lower_pointwise("sin", x))
r0 = sympy.Symbol("r0", integer=True, nonnegative=True)
with set_handler(TextHandler()):
    print(f"{r.reduction_type} over r0 in range({r.reduction_ranges[0]}):", r.inner_fn([i0], [r0]))

# %% [markdown]
# A **view** moves no data. `x.permute(1, 0)` read at `[a, b]` is `x` read at `[b, a]`;
# `x.expand(4, 3)` of a `[1, 3]` tensor read at `[a, b]` is `x` read at `[0, b]`. So a view is a
# function from the view's index to the base's index, a `reindex`, and a lowering composes it
# with the base's loader. Broadcasting in `a + b` is the same expand, done implicitly.

# %%
def lower_view(base, size, reindex):
    load = base.make_loader()
    return Pointwise(size, lambda index: load(reindex(index)))


xt_view = lower_view(x, [3, 2], lambda index: [index[1], index[0]])  # x.permute(1, 0)
with set_handler(TextHandler()):
    print("x.permute(1, 0)[i0, i1] =", xt_view.inner_fn([i0, i1]))
row = InputBuffer("bias", [1, 3])
bias_b = lower_view(row, [2, 3], lambda index: [0, index[1]])  # bias.expand(2, 3)
with set_handler(TextHandler()):
    print("x + bias        [i0, i1] =", lower_pointwise("add", x, bias_b).inner_fn([i0, i1]))

# %% [markdown]
# The strides show up in the index: the transposed read walks `x` with stride 3 along `i1`.
# Chapter 8's kernels load exactly these expressions.
#
# ### Exercise 7.1: a lowering
#
# `tininductor.lowering` has one function per ATen op, registered in a table
# (`lowering.lowerings`). Write the lowering of `aten.silu` (`x * sigmoid(x)`) in
# `exercises/ch07_loop_ir.py::lower_silu`, using the package's `ir.Pointwise` and `ops`. The
# cell below plugs it into the registry and compiles a function through the whole pipeline.

# %%
from tininductor import ir
from tininductor.virtualized import PlainTextHandler, V

aten = torch.ops.aten
example = ir.InputBuffer("x", ir.Layout.contiguous(torch.device("cpu"), torch.float16, [4, 8]))
node = ch.lower_silu(example).data
print("silu body:", node.body_str())

xs = torch.randn(4, 8, device=DEVICE)
with use_lowering(aten.silu.default, ch.lower_silu):
    compiled = compile_aten(lambda x: torch.nn.functional.silu(x) * 2, [xs])
print("kernels:", compiled.kernels, "| fallbacks:", compiled.fallback_reasons)
torch.testing.assert_close(compiled(xs), torch.nn.functional.silu(xs) * 2)
print("silu(x) * 2 matches eager")

# %% [markdown]
# ### Exercise 7.2: views as index arithmetic
#
# Write `permute_reindex(dims)` and `expand_reindex(old_size, new_size)`. The course's
# `use_view_lowerings(permute_reindex, expand_reindex)` wraps them in `ir.View` and installs
# them as the lowerings of `aten.permute` and `aten.expand`.

# %%
from tininductor.indexing import sym

a, b, c = sym("a"), sym("b"), sym("c")
print("permute (2, 0, 1):", ch.permute_reindex((2, 0, 1))([a, b, c]))
print("expand [3, 1] -> [2, 3, 4]:", ch.expand_reindex([3, 1], [2, 3, 4])([a, b, c]))


def views(x, w):
    return x.permute(2, 0, 1).sin() + w.permute(1, 0).expand(5, 3, 4)


xv, wv = torch.randn(3, 4, 5, device=DEVICE), torch.randn(4, 3, device=DEVICE)
with use_view_lowerings(ch.permute_reindex, ch.expand_reindex):
    graph, _ = lower_and_schedule(views, [xv, wv], decompose=False)
    compiled = compile_aten(views, [xv, wv])
print(graph.ir_str())
torch.testing.assert_close(compiled(xv, wv), views(xv, wv))
print("matches eager")

# %% [markdown]
# ## 4. The scheduler: which buffers share a kernel
#
# Lowering inlines pointwise producers into their consumers, and realizes a buffer when it
# must exist in memory: a reduction's result, a graph output, a producer with several heavy
# users, the input of an extern call (matmul). The **scheduler** then walks the realized
# buffers in program order and decides which of them can share a kernel.
#
# Each buffer iterates over a *group* `(numel, rnumel)`: `numel` output elements, each
# reducing `rnumel` elements (1 for pointwise). A kernel is a `FusedGroup` of nodes that fit
# the same loops: pointwise nodes with the same numel; a reduction with the pointwise nodes
# over its input elements (*full* nodes, run inside the reduction loop) and over its output
# elements (*x-only* nodes); reductions of the same shape (LayerNorm's mean and variance).
#
# Each buffer joins the first kernel that can take it, in this order: its producer's kernel
# (the value never leaves registers); else a later kernel that reads the same buffers, the one
# sharing the most (one load serves both); else the latest kernel after all its producers (one
# launch fewer). A kernel stops growing at `config.max_fusion_size` nodes (64, TorchInductor's
# limit): a bigger one saves no more memory traffic, and Triton's compile time grows faster
# than the kernel.
#
# ### Exercise 7.4: dependencies from an ops handler
#
# The scheduler learns what each buffer reads and writes by running its body with a
# recording handler. Implement `ReadWritesHandler.load` / `.store`; below they run on the
# buffers of a softmax written op by op.

# %%
def softmax_by_hand(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


xs = torch.randn(8, 16)
graph, sched = lower_and_schedule(softmax_by_hand, [xs])
for buf in graph.buffers:
    h = ch.ReadWritesHandler()
    index = [sym(f"i{d}") for d in range(len(buf.get_ranges()))]
    rindex = [sym(f"r{d}") for d in range(len(buf.get_reduction_ranges()))]
    with V.set_ops_handler(h):
        buf.store_body(index, rindex)
    print(f"{buf.get_name()}: reads {h.reads}  writes {h.writes}")

# %% [markdown]
# ### Exercise 7.3: is a fusion legal?
#
# Fusing is only correct when every node of the kernel fits its loops *and* each in-kernel
# read of a buffer hits exactly the element this program just wrote. A GPU runs a kernel as
# many independent programs; a read of another program's element may happen before that
# program stored it. Implement `fusion_is_legal(candidate)`; `use_fusion_check(fusion_is_legal)`
# makes the package's `Scheduler` call it.

# %%
def transposed_read(x):
    y = x * 2
    for _ in range(11):  # long enough that lowering stores y instead of recomputing it per reader
        y = (y * 0.9).sin()
    return y, y.permute(1, 0) + 1


with use_fusion_check(ch.fusion_is_legal):
    g, s = lower_and_schedule(transposed_read, [torch.randn(6, 6)], decompose=False)
print(fusion_text(g, s))

# %% [markdown]
# The transposed reader lands in a second kernel: between kernels, every store of the first
# is finished.
#
# ## 5. Fusion decisions, drawn
#
# `draw_fusion` draws each kernel as a column (an extern call is a column of its own);
# arrows are buffer reads. `fusion_text` says the same in words, and `fusion_dot` emits
# Graphviz DOT when the `dot` program is installed. `memory_traffic` compares the bytes moved
# running the graph op by op, as eager does (each op reads its inputs and writes its output),
# with the bytes the fused kernels move.

# %%
import matplotlib.pyplot as plt


def show(fn, *args, title=""):
    g, s = lower_and_schedule(fn, list(args))
    ax = draw_fusion(g, s)
    ax.set_title(title, fontsize=9)
    plt.show()
    print(fusion_text(g, s))
    traffic = memory_traffic(g, s)
    print(f"memory traffic: op by op {traffic['eager_bytes']} bytes, fused {traffic['fused_bytes']} bytes")


def chain(x, w, b):
    return torch.relu(x * w + b).sin() * 0.5 + x


xs, ws, bs = torch.randn(64, 32), torch.randn(32), torch.randn(32)
show(chain, xs, ws, bs, title="pointwise chain: one kernel")

# %%
show(softmax_by_hand, torch.randn(64, 32), title="softmax: max, exp, sum, divide in one kernel")

# %% [markdown]
# Softmax needs two reductions, and the division needs both. All of them run over the same
# `(rows, row length)` loops, so they share one kernel: the row's maximum is computed, then
# `exp(x - max)` and its sum, then every element is divided, all while the row is in
# registers. Eager's `torch.softmax` is itself a hand-fused kernel; the compiler gets the
# same from five small ops.

# %%
def layer_norm_by_hand(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


show(layer_norm_by_hand, torch.randn(64, 32), torch.randn(32), torch.randn(32), title="LayerNorm: one kernel")

# %% [markdown]
# LayerNorm written op by op is ten eager kernels, each a full pass over memory; fused, it is
# one pass in (`x`, `w`, `b`) and one pass out. Mean and variance are two reductions with the
# same group, and the variance reads the mean at the same row index: legal in one kernel.

# %%
def saved_for_backward(x, y, u, w):
    a = x + y  # inlined into the sum; also an output, as a training graph saves it
    return a.sum(-1), torch.mm(u, w) * 2, a


show(saved_for_backward, torch.randn(8, 32), torch.randn(8, 32), torch.randn(8, 16), torch.randn(16, 32),
     title="a's stored copy joins the kernel that reads x and y")

# %% [markdown]
# `a` is realized last, as a graph output. The latest kernel (the `mul` after the matmul) could
# take it too, but shares no load with it; the sum's kernel already loads `x` and `y`, so `a`'s
# store costs no extra read there. In a transformer's training graph every residual sum the
# backward needs is such a buffer: placed by sharing, each lands in its layer norm's kernel;
# placed in the latest kernel, all of them piled into one kernel of 126 loads and 64 stores,
# which took Triton 13 s to compile.

# %%
g, s = lower_and_schedule(chain, [xs, ws, bs])
try:
    import graphviz

    graphviz.Source(fusion_dot(g, s)).pipe(format="svg")
    print("graphviz available: display(graphviz.Source(fusion_dot(g, s))) draws it")
except Exception as e:  # no `dot` binary here: the DOT text is still useful
    print(f"graphviz cannot render here ({type(e).__name__}); the DOT source:")
    print(fusion_dot(g, s))

# %% [markdown]
# ### How PyTorch really does it
#
# The same design, with the same names, in `torch/_inductor/`: `ir.py` has `Pointwise` and
# `Reduction` (ranges plus an `inner_fn`), realized into a `ComputedBuffer`; `lowering.py`
# registers one lowering per ATen op (`@register_lowering(aten.add)`, `make_pointwise`);
# `virtualized.py`'s `V.ops` is the swappable ops handler; `dependencies.py`'s
# `extract_read_writes` runs a body with a recording handler to get its `MemoryDep`s (exercise
# 7.4); `scheduler.py`'s `Scheduler` fuses (`can_fuse`, `score_fusion`, `FusedSchedulerNode`).
# What it handles that ours does not: a reduction fused with the pointwise work that follows it
# (an *epilogue*), loop reordering and tiling so that two nodes with different loop orders can
# still fuse, in-place mutation and aliasing of buffers, extern kernels and matmul *templates*
# (with a fused epilogue), symbolic sizes everywhere (chapter 10), and a memory planner that reuses
# buffers. Its fusion is ranked by a score (bytes saved) over all candidate pairs, not taken in
# order.

# %% [markdown]
# ## 6. From the package: the LayerNorm-MLP block
#
# The benchmark block of the course (`course.models.TinyBlock`: LayerNorm, Linear, GELU,
# scale-and-shift, Linear, residual add) through the package: decompose (LayerNorm becomes
# mean, var, sub, rsqrt...; GELU becomes erf arithmetic), lower, schedule, then generate and
# run kernels with `tininductor.compile_fx`. The matmuls are extern calls to torch; everything
# else is fused around them into three kernels: the whole LayerNorm, the bias + GELU +
# scale-and-shift after the first matmul, and the bias + residual add after the second.

# %%
from course.models import TinyBlock
from tininductor.testing import compile_graph

torch.manual_seed(0)
block = TinyBlock(hidden=16, expansion=2).eval().to(DEVICE)
xb = torch.randn(2, 4, 16, device=DEVICE)
with torch.no_grad():
    g, s = lower_and_schedule(block, [xb])
    ax = draw_fusion(g, s)
    ax.set_title("TinyBlock(hidden=16): kernels and extern matmuls", fontsize=9)
    plt.show()
    print(fusion_text(g, s))
    traffic = memory_traffic(g, s)
    print(f"memory traffic: op by op {traffic['eager_bytes']} bytes, fused {traffic['fused_bytes']} bytes")

# %%
with torch.no_grad():
    compiled = compile_graph(block, [xb])
    out = compiled(xb)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, block(xb), atol=1e-5, rtol=1e-4)
print("kernels:", compiled.kernels)
print("TinyBlock compiled by tininductor matches eager")

# %% [markdown]
# ## Summary
#
# * A loop-IR buffer is *ranges + `inner_fn(index)`*; pointwise producers are inlined into
#   consumers, so a chain becomes one expression.
# * `inner_fn` calls `ops.*`; the installed handler decides what that means: text,
#   read/write sets for the scheduler, Triton or C++ source.
# * Views and broadcasting are index arithmetic on the way into a loader.
# * The scheduler groups realized buffers into kernels over shared `(numel, rnumel)` loops,
#   and only when every in-kernel read hits the element just written.
#
# Next, chapter 8 reads the Triton these kernels become, line by line.
