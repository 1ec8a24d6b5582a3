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
# # Chapter 5: FX graphs and decompositions
#
# TorchDynamo hands the backend a `torch.fx.GraphModule`: the ops your Python code ran, in
# order, as a graph. Before tininductor can differentiate that graph (chapter 6) or turn it into
# loops (chapter 7), it rewrites it into a *small* set of simple ops, the **prim set**. This
# chapter is about that graph and that rewrite.
#
# **What you will learn**
#
# 1. The anatomy of an FX graph: `Graph`, `Node`, the six node kinds, `args`, `users`, `meta`.
# 2. How to run a graph yourself, node by node (Exercise 5.2), and how to read one (Exercise 5.1).
# 3. How to write a pass that rewrites a graph.
# 4. Why compilers decompose, what tininductor's prim set is, and how `make_fx` re-traces a
#    graph down to ATen ops on fake tensors.
# 5. How to write decompositions for GELU, LayerNorm and softmax (Exercises 5.3 - 5.5) and check
#    them against eager PyTorch, then how `tininductor.decompositions.decompose` does it for
#    whole models, reporting any op it could not decompose.

# %%
import torch
import torch.fx as fx
import torch.nn.functional as F

from course import load
from course.models import TinyBlock

ch = load("ch05", unfinished="package")  # your exercises (or the reference solutions when TINY_COURSE_MODE=solutions)
aten = torch.ops.aten
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. Anatomy of an FX graph
#
# `torch.fx.symbolic_trace` runs a function on *proxies*: stand-ins that record every operation
# done to them. The record is a `Graph`, a doubly linked list of `Node`s, wrapped with the
# generated Python `forward` in a `GraphModule`. (TorchDynamo builds the same structure, from
# bytecode instead of proxies; chapter 2 onwards.)

# %%
def f(x, w):
    y = torch.relu(x @ w)
    return y * 2 + x.sum(), y.shape[0]


gm = fx.symbolic_trace(f)
print(gm.graph)

# %% [markdown]
# Every node has an `op` (its kind), a `target` (what it calls), `args`/`kwargs` (which may
# contain other nodes: these are the graph's edges) and `users` (the nodes that read it).
# The six kinds are `placeholder` (an input), `get_attr` (a parameter or buffer of the module),
# `call_function`, `call_method`, `call_module` and `output`.

# %%
for node in gm.graph.nodes:
    target = node.target if isinstance(node.target, str) else f"{node.target.__module__}.{node.target.__name__}"
    print(f"{node.op:14} {node.name:10} target={target:20} args={node.args}  users={list(node.users)}")

# %% [markdown]
# `GraphModule.code` is the Python that `forward` runs: a graph *is* a program.

# %%
print(gm.code)

# %% [markdown]
# ## 2. Running and reading a graph
#
# To run a graph by hand, keep an environment `node -> value`: placeholders take the arguments,
# each `call_function` node calls its target on its looked-up arguments, and the `output`
# node's argument is the result. `torch.fx.Interpreter` is exactly this loop with hooks.
# **Exercise 5.2**: write `interpret(gm, *args)` in `exercises/ch05_decompositions.py` (it only
# needs `placeholder`, `get_attr`, `call_function` and `output`: the ATen graphs of this chapter
# have no other kinds). **Exercise 5.1**: `count_ops(gm)`, the simplest analysis pass.
#
# To get an ATen-level graph, re-trace with `make_fx` (next section) — `tininductor`'s
# `decompose` does that:

# %%
from tininductor.decompositions import decompose

x, w = torch.randn(4, 3), torch.randn(3, 3)
aten_gm = decompose(lambda x, w: torch.relu(x @ w) * 2 + x.sum(), [x, w])
print(aten_gm.code)
torch.testing.assert_close(ch.interpret(aten_gm, x, w), aten_gm(x, w))
print("interpret matches the GraphModule:", True)
print(ch.count_ops(aten_gm))

# %% [markdown]
# ## 3. Writing a pass
#
# A pass walks the nodes and edits the graph in place. Here is one that rewrites `relu(x)`
# as `maximum(x, 0)`, as a backend that has `maximum` but no `relu` might want. Insert the
# new nodes *before* the old one, point the old node's users at the replacement, erase it,
# and `recompile()` so `forward` is regenerated.

# %%
def relu_to_maximum(gm: fx.GraphModule) -> int:
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.relu.default:
            with gm.graph.inserting_before(node):
                zero = gm.graph.call_function(aten.scalar_tensor.default, (0.0,))
                new = gm.graph.call_function(aten.maximum.default, (node.args[0], zero))
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            count += 1
    gm.graph.lint()
    gm.recompile()
    return count


expected = aten_gm(x, w)
print("rewritten:", relu_to_maximum(aten_gm))
print(aten_gm.code)
torch.testing.assert_close(aten_gm(x, w), expected)

# %% [markdown]
# ## 4. Why decompose, and into what
#
# PyTorch has over two thousand ATen ops. A compiler that had to differentiate, fuse and
# generate code for each would never be finished, so it first rewrites the graph into a small
# set it fully understands: tininductor's **prim set**. Every other op is a *decomposition*: a
# Python function that computes it from prims. One VJP rule per prim (chapter 6) and one
# lowering per prim (chapter 7) then cover every model. Matmul stays a single *extern* op:
# a library call beats any loop we could generate.

# %%
from tininductor import prims

for group in ["POINTWISE_UNARY", "POINTWISE_BINARY", "POINTWISE_OTHER", "VIEWS", "REDUCTIONS",
              "CREATION", "INDEXING", "EXTERN"]:
    ops = getattr(prims, group)
    print(f"{group:17} {len(ops):2}  " + " ".join(op.__name__ for op in ops))
print("prim set size:", len(prims.PRIM_SET))

# %% [markdown]
# `make_fx` (from `torch.fx.experimental.proxy_tensor`) re-traces any callable *below*
# autograd, at the ATen level, on **fake tensors** (shape, dtype, device and strides, no data),
# so tracing costs no compute. Give it a decomposition table and every op found in the table
# is replaced by its Python function, which is traced in turn. Ops that PyTorch itself
# implements as compositions (`linear`, `layer_norm`, `matmul`, `dropout`) are expanded by
# PyTorch before any table sees them: we decompose what they expand to
# (`addmm`, `native_layer_norm`, ...). Without our table, a TinyBlock traces to:

# %%
from torch.fx.experimental.proxy_tensor import make_fx

block = TinyBlock(8, 2)
xb = torch.randn(2, 8)
with torch.no_grad():
    raw = make_fx(block, tracing_mode="fake", _allow_non_fake_inputs=True)(xb)  # parameters stay real
print(sorted({str(n.target) for n in raw.graph.nodes if n.op == "call_function"}))

# %% [markdown]
# `native_layer_norm`, `addmm`, `t` and `gelu` are not prims. Let us write their
# decompositions.
#
# ## 5. Decompositions
#
# **Exercise 5.3** — GELU, exact and tanh forms:
# $\mathrm{gelu}(x) = \tfrac{x}{2}\,(1 + \mathrm{erf}(x/\sqrt 2))$ and
# $\tfrac{x}{2}\,(1 + \tanh(\sqrt{2/\pi}\,(x + 0.044715\,x^3)))$. Write it with `aten.*` prims;
# we swap it into the registry `DECOMPOSITIONS` in place of the package's own for the `with` block
# (every registry of the course swaps entries this way) and compare with eager:

# %%
from tininductor.decompositions import DECOMPOSITIONS
from tininductor.prims import is_prim


def check_decomposition(op, yours, fn, inputs, show=False):
    with DECOMPOSITIONS.swap({op: yours}):
        gm = decompose(fn, inputs)
    outside = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function" and not is_prim(n.target)})
    torch.testing.assert_close(gm(*inputs), fn(*inputs))
    if show:
        print(gm.code)
    print(f"{op}: matches eager, {len(gm.graph.nodes)} nodes, ops outside the prim set: {outside}")


xg = torch.randn(4, 16) * 3
check_decomposition(aten.gelu.default, ch.gelu, lambda x: F.gelu(x), [xg], show=True)
check_decomposition(aten.gelu.default, ch.gelu, lambda x: F.gelu(x, approximate="tanh"), [xg])

# %% [markdown]
# **Exercise 5.4** — LayerNorm. ATen's `native_layer_norm` returns three tensors: the output,
# and the `mean` and `rstd = 1/sqrt(var + eps)` it computed (autograd's formula for the
# backward uses them). Use the *biased* variance (`correction=0`) and keep the reduced dims.

# %%
w_ln, b_ln = torch.randn(16), torch.randn(16)
check_decomposition(aten.native_layer_norm.default, ch.native_layer_norm,
                    lambda x: F.layer_norm(x, (16,), w_ln, b_ln), [xg], show=True)

# %% [markdown]
# **Exercise 5.5** — softmax. `exp` overflows float32 above about 88, so subtract the row's
# maximum first: $\mathrm{softmax}(x) = e^{x - m} / \sum e^{x - m}$ with $m = \max x$ gives the
# same value and never overflows.

# %%
big = torch.tensor([[1000.0, 1001.0, 999.0], [3.0, 1.0, 2.0]])
check_decomposition(aten._softmax.default, ch.softmax, lambda x: torch.softmax(x, -1), [big])
naive = torch.exp(big) / torch.exp(big).sum(-1, keepdim=True)
print("without the max trick, row 0 is", naive[0].tolist())

# %% [markdown]
# ## 6. The package: `tininductor.decompositions.decompose`
#
# The package's table holds the same kind of functions (read
# `tininductor/decompositions.py`: `addmm`, `t`, `native_layer_norm`, `gelu`, `_softmax`,
# `_log_softmax`, `nll_loss_forward` for cross-entropy, `embedding`, `masked_fill`, `split`,
# `tril`, ...). `decompose(gm, example_inputs)` is the backend-contract function: it keeps the
# calling convention, and every node carries `meta["val"]`, a fake tensor with its shape.

# %%
prim_block = decompose(block, [xb])
print(ch.count_ops(prim_block))
torch.testing.assert_close(prim_block(xb), block(xb))
print("all prims:", all(is_prim(n.target) for n in prim_block.graph.nodes if n.op == "call_function"))
last = [n for n in prim_block.graph.nodes if n.op == "call_function"][-1]
print(last.name, "meta['val'] =", type(last.meta["val"]).__name__, tuple(last.meta["val"].shape))

# %% [markdown]
# An op with no decomposition is never silently wrong: it stays in the graph, run by torch,
# and is reported with the reason (`gm.meta["fallbacks"]`, and the `tininductor.decompositions`
# logger). The lowering in chapter 7 calls such ops as *fallback kernels*.

# %%
cumprod_gm = decompose(lambda a, b: torch.cumprod(a, 0) * b, [torch.randn(2, 3), torch.randn(2, 3)])
print(cumprod_gm.meta["fallbacks"])

# %% [markdown]
# ### How PyTorch really does it
#
# TorchInductor's decompositions are the same kind of Python functions: `torch/_decomp/`
# registers them with `@register_decomposition(aten.op)` (`core_aten_decompositions()` is the
# shared set, reaching the *Core ATen* op set of about 180 ops), and
# `torch/_inductor/decomposition.py` adds Inductor's own (`select_decomp_table()`). They are not
# applied by a pass over a finished graph as `decompose` does here: AOTAutograd traces the graph
# with `make_fx(fn, decomposition_table=...)`, so each ATen op is replaced while it is recorded
# (chapter 6). `torch/_prims` and `torch/_refs` (PrimTorch) hold a still smaller prim set with
# Python references for most of ATen. Graph passes live in `torch/_inductor/fx_passes/`
# (`joint_graph.py`, `post_grad.py`), written with a pattern matcher (`register_replacement`)
# rather than by hand. The core table keeps `_softmax` (it is a Core ATen op); Inductor's table
# decomposes it, with the same max trick as yours in section 5:

# %% tags=["nbval-ignore-output"]
from torch._decomp import core_aten_decompositions
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

torch_table = select_decomp_table()
print(len(core_aten_decompositions()), "ATen overloads in torch's core table,", len(torch_table), "in Inductor's")
print(make_fx(lambda x: torch.softmax(x, -1), decomposition_table=torch_table)(big).code)

# %% [markdown]
# ## Summary
#
# - An FX graph is a list of nodes; edges are the nodes inside `args`. Running one is a loop
#   over an environment; a pass is a loop that edits it (`inserting_before`,
#   `replace_all_uses_with`, `erase_node`, `recompile`).
# - tininductor decomposes every graph to a prim set of about sixty ATen ops: pointwise math,
#   comparisons, `where`, casts, views, `sum`/`amax`/`mean`/`var`, indexing and extern matmuls.
# - Decompositions are small Python functions over prims, traced by `make_fx` on fake tensors;
#   each is checked against eager, and anything left over is a logged fallback.
#
# Next, chapter 6 differentiates these prim graphs ahead of time: one VJP rule per prim.
