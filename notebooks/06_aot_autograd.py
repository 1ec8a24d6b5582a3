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
# # Chapter 6: AOT autograd
#
# Training is where most compute goes, and most of a training step is the *backward*. Eager
# PyTorch builds the backward on the fly, op by op, while the forward runs. A compiler wants
# to see it **ahead of time**, as a graph it can fuse and generate code for, just like the
# forward. AOT (ahead-of-time) autograd does that: it differentiates the forward graph
# symbolically, producing a *joint* graph `(primals, tangents) -> (outputs, grads)`, splits it
# into a forward graph and a backward graph, and hides both behind a `torch.autograd.Function`
# so that `loss.backward()` runs the compiled backward.
#
# **What you will learn**
#
# 1. How to derive the backward of a small graph by hand, with vector-Jacobian products (VJPs).
# 2. Why broadcasting makes reverse mode subtle: `sum_to_size` (Exercise 6.1).
# 3. A registry of VJP rules, one per prim (Exercise 6.2 writes the rule for `mul`).
# 4. The reverse-mode pass that builds the joint graph (Exercise 6.3), and how tracing that pass
#    with `make_fx` *is* the compiler.
# 5. Partitioning the joint graph: which values to save for the backward (Exercise 6.4), and a
#    min-cut partitioner that recomputes cheap ops instead of saving them.
# 6. The runtime wrapper, and training real models through `torch.compile(backend=aot_eager)`.

# %%
import inspect

import matplotlib.pyplot as plt
import networkx as nx
import torch
import torch.fx as fx
from matplotlib_inline.backend_inline import set_matplotlib_formats

from course import load
from course.models import GPT, TinyBlock
from tininductor.decompositions import decompose, fake_inputs

ch = load("ch06", unfinished="package")  # your exercises (or the reference solutions when TINY_COURSE_MODE=solutions)
aten = torch.ops.aten
_ = torch.manual_seed(0)
set_matplotlib_formats("svg")
plt.rcParams["svg.fonttype"] = "none"  # keep text as text: small SVGs

# %% [markdown]
# ## 1. A backward by hand
#
# Take $y = \tanh(x \cdot w + b)$ with `x` of shape (3, 4), `w` of shape (4,) and `b` of shape
# (1,): `w` and `b` are *broadcast*. Reverse mode starts from the gradient of the output, the
# **tangent** $g_y = \partial L / \partial y$, and pushes it back through each op with that op's
# vector-Jacobian product:
#
# | forward | backward (VJP) |
# | --- | --- |
# | $y = \tanh(p)$ | $g_p = g_y \cdot (1 - y^2)$ |
# | $p = m + b$ | $g_m = g_p$, $g_b = g_p$ summed back to b's shape |
# | $m = x \cdot w$ | $g_x = g_m \cdot w$, $g_w = (g_m \cdot x)$ summed back to w's shape |
#
# "Summed back" is the one subtle step: broadcasting copied `w` to every row, so each copy's
# gradient adds up.

# %%
x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
w = torch.randn(4, dtype=torch.float64, requires_grad=True)
b = torch.randn(1, dtype=torch.float64, requires_grad=True)
y = torch.tanh(x * w + b)
g_y = torch.randn_like(y)  # any tangent: we compare vector-Jacobian products

with torch.no_grad():
    g_p = g_y * (1 - y * y)
    g_b = g_p.sum().reshape(1)
    g_x = g_p * w
    g_w = (g_p * x).sum(0)

auto = torch.autograd.grad(y, [x, w, b], g_y)
torch.testing.assert_close([g_x, g_w, g_b], list(auto))
print("hand-derived gradients match autograd")

# %% [markdown]
# ## 2. Undoing broadcasting: `sum_to_size`
#
# Broadcasting aligns shapes on the right, *prepends* dims and *stretches* size-1 dims. The
# gradient of a broadcast input is therefore the output gradient summed over the prepended dims
# and (keeping them) over the stretched ones. **Exercise 6.1**: write `sum_to_size(grad, shape)`.

# %%
for grad_shape, shape in [((3, 4), (4,)), ((3, 4), (1,)), ((2, 3, 4), (3, 1))]:
    grad = torch.randn(grad_shape, dtype=torch.float64)
    leaf = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(leaf.expand(grad_shape), leaf, grad)  # autograd's answer
    got = ch.sum_to_size(grad, shape)
    print(f"{str(grad_shape):10} -> {str(shape):7}: shape {tuple(got.shape)}, matches autograd: {torch.allclose(got, want)}")

# %% [markdown]
# ## 3. One VJP rule per prim
#
# Chapter 5 reduced every model to about sixty prims, so reverse mode needs only sixty rules.
# tininductor keeps them in a registry, `tininductor.vjp_rules.VJP_RULES` (op -> rule). A rule
# is called as `rule(grad, out, *args, **kwargs)` (the forward op's own arguments, plus its
# output, which `tanh`, `exp` and `sigmoid` reuse) and returns one gradient per positional
# argument, `None` where there is none (an int, a shape, a mask, an index).

# %%
from tininductor import vjp_rules

print(len(vjp_rules.VJP_RULES), "VJP rules, e.g.:\n")
print(inspect.getsource(vjp_rules.tanh_vjp))
print(inspect.getsource(vjp_rules.sum_vjp))
print(inspect.getsource(vjp_rules.mm_vjp))

# %% [markdown]
# **Exercise 6.2**: the rule for `mul`. Inputs can be tensors of different (broadcast) shapes
# or a Python number (no gradient); the chapter's `reduce_grad(g, x)` brings a gradient back to
# the input `x`'s shape with your `sum_to_size` from Exercise 6.1 and returns `None` for a number.
#
# ## 4. The reverse-mode pass and the joint graph
#
# The pass is an *interpreter*: run the forward graph node by node, keeping each value; then
# walk the nodes backwards and, for every node with a gradient, call its VJP rule and add the
# results to its inputs' gradients (a value used twice receives two contributions).
# **Exercise 6.3**: write that backward walk, `backward_pass`.
#
# Here is the trick that makes it a compiler: run the interpreter under `make_fx` on fake
# tensors. Every prim the rules call is recorded, so the trace *is* the joint graph: forward
# ops, then backward ops, with placeholders `primals_*` (the inputs) and `tangents_*` (the
# output gradients). `tininductor.joint_graph.create_joint` does this; we plug your pass in.
# (It saves a step: the forward half is the prim graph's own nodes, copied, since `decompose`
# traced them already; only the backward walk is traced. With static shapes both traces use
# `tininductor.op_recorder.OpRecorder`, a dispatch mode that appends one node per op and costs
# about a third of `make_fx`, whose proxies are needed only to keep symbolic sizes in the graph.)

# %%
from tininductor.joint_graph import create_joint


def small(x, w, b):
    return torch.tanh(x * w + b)


inputs = [x, w, b]
fakes, mode = fake_inputs(inputs)
prim_gm = decompose(small, fakes)
joint = create_joint(prim_gm, fakes, [True, True, True], mode, backward=ch.backward_pass)
print(joint.gm.code)

# %% [markdown]
# Compare with section 1: `mul_1 = tanh * tanh`, `1 - tanh^2`, the multiply by `tangents_1`,
# and the `sum` + `view` of `sum_to_size` for `w` and `b`. Running the joint graph gives the
# outputs and the gradients at once:

# %%
out, *grads = joint.gm([x, w, b], [g_y])
torch.testing.assert_close(grads, list(auto))
print("joint graph gradients match autograd; grad_mask:", joint.grad_mask)

# %% [markdown]
# ### How PyTorch really does it
#
# PyTorch's AOTAutograd (`torch._functorch.aot_autograd`) builds the same kind of joint graph,
# but it has no table of hand-written VJP rules for the compiler. It traces *autograd itself*:
# `create_joint` runs the forward under `make_fx` and then calls `torch.autograd.grad`, so the
# autograd engine runs each op's derivative formula, the ones generated from
# `tools/autograd/derivatives.yaml` (`tanh: tanh_backward(grad, result)`, `mul: grad * other`,
# ...), and every aten op those formulas call is recorded. Whatever eager autograd can
# differentiate, the compiler can, with the very same formulas.
#
# Here is torch's version for the same `small(x, w, b)`: `aot_function` hands the joint graph to
# a partition function and the two halves to the forward and backward compilers; ours just keep
# the graphs to print.

# %%
from functorch import compile as functorch_compile

torch_graphs = {}


def keep(name):
    def compiler(gm, example_inputs):
        torch_graphs[name] = gm
        return functorch_compile.make_boxed_func(gm.forward)  # run the graph as it is
    return compiler


def keep_joint(joint_module, joint_inputs, **kwargs):
    torch_graphs["joint"] = joint_module
    return functorch_compile.default_partition(joint_module, joint_inputs, **kwargs)


torch_small = functorch_compile.aot_function(small, fw_compiler=keep("forward"), bw_compiler=keep("backward"), partition_fn=keep_joint)
torch_out = torch_small(x, w, b)
torch_grads = torch.autograd.grad(torch_out, [x, w, b], g_y)
torch.testing.assert_close(list(torch_grads), list(auto))
print("torch's joint graph (the tangent is tangents_1):")
print(torch_graphs["joint"].code.strip())

# %% [markdown]
# The same shape as ours: forward ops, then the backward from `tangents_1`, with the `sum` +
# `view` that undo the broadcasts of `w` and `b`. One difference is visible: `tanh`'s backward
# is a single aten op, `tanh_backward(grad, y)`, where our rule spelled out `grad * (1 - y*y)`
# in prims (TorchInductor decomposes `tanh_backward` later, in its own lowering). `detach` marks
# the saved output. The partitioner then cuts it into the two graphs autograd runs:

# %%
for name in ("forward", "backward"):
    print(f"torch's {name} graph:")
    print(torch_graphs[name].code.strip(), end="\n\n")

# %% [markdown]
# What the real one handles that ours does not:
#
# - **Mutation and aliasing.** Before tracing the joint, AOTAutograd *functionalizes* the
#   program (`torch._subclasses.functional_tensor`): `x.add_(1)` becomes `add = x + 1` plus a
#   copy back into the input at the end, and outputs that alias inputs or each other are
#   regenerated from their base with `as_strided`/views. Our pass assumes a pure graph.
# - **The partitioner.** `min_cut_rematerialization_partition` (section 6 has our min-cut) also
#   weighs which ops are cheap to recompute (pointwise) against which must be saved
#   (matmuls, random ops with their seeds), and bounds the saved memory.
# - **Symbolic shapes** (chapter 10): the joint graph is traced with `SymInt` sizes, so one
#   compile serves many batch sizes.
# - **Everything else autograd knows**: tensor subclasses (DTensor, chapter 12), users'
#   `torch.autograd.Function`s, higher-order ops, and an inference-only graph (no joint at all)
#   when no input needs a gradient.

# %% [markdown]
# ## 5. Drawing the graphs
#
# A small helper draws a graph left to right (inputs first). Colours: blue forward, orange
# backward (depends on a tangent), green inputs.

# %%
def draw(gm, title, colour_of, width=11):
    g = nx.DiGraph()
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        g.add_node(node.name)
        for arg in node.all_input_nodes:
            g.add_edge(arg.name, node.name)
    layer = {}
    for node in gm.graph.nodes:
        if node.op != "output":
            layer[node.name] = 1 + max((layer[a.name] for a in node.all_input_nodes), default=-1)
    nx.set_node_attributes(g, layer, "layer")
    pos = nx.multipartite_layout(g, subset_key="layer")
    nodes = {n.name: n for n in gm.graph.nodes}
    fig, ax = plt.subplots(figsize=(width, 3.2))
    nx.draw_networkx(g, pos, ax=ax, node_size=260, font_size=7, arrowsize=8,
                     node_color=[colour_of(nodes[name]) for name in g.nodes])
    ax.set_title(title)
    ax.axis("off")
    plt.show()


tangent_dependent = set()
for node in joint.gm.graph.nodes:
    if node.name.startswith("tangents") or any(a in tangent_dependent for a in node.all_input_nodes):
        tangent_dependent.add(node)


def joint_colour(node):
    if node.op == "placeholder":
        return "#9fd49f"
    return "#f5b971" if node in tangent_dependent else "#8fb8e8"


# %% tags=["nbval-ignore-output"]
draw(joint.gm, "joint graph of tanh(x * w + b)", joint_colour)

# %% [markdown]
# ## 6. Partitioning: what to save for the backward
#
# The joint graph must be split: the forward runs now, the backward later (at
# `loss.backward()`). Whatever the backward reads from the forward must be **saved**, kept in
# memory between the two: the forward graph returns `(*outputs, *saved)`, the backward graph
# takes `(*saved, *tangents)`. The default rule saves every forward value the backward reads.
# **Exercise 6.4**: find those values, `default_saved(joint_gm, num_primals, num_outputs)`.

# %%
from tininductor.partitioners import default_partition, min_cut_partition, partition_with_saved

saved = ch.default_saved(joint.gm, joint.num_primals, joint.num_outputs)
part = partition_with_saved(joint, saved)
print(part)
print(part.fw_gm.code)
print(part.bw_gm.code)


# %% tags=["nbval-ignore-output"]
def part_colour(node):
    return "#9fd49f" if node.op == "placeholder" else "#8fb8e8"


draw(part.fw_gm, "forward graph: primals -> (output, *saved)", part_colour, width=6)
draw(part.bw_gm, "backward graph: (*saved, tangents) -> grads", lambda n: "#9fd49f" if n.op == "placeholder" else "#f5b971")

# %% [markdown]
# ### Min-cut: recompute instead of saving
#
# Saving is not free: in the LayerNorm-MLP block, the default saves the GELU's intermediate
# values, several tensors as large as the hidden activation. Pointwise ops are cheap to run
# again in the backward (and after fusion, chapter 7, recomputing them costs almost nothing),
# so a better partitioner saves *fewer bytes* and recomputes.
#
# Choosing the cheapest set of values to save is a **minimum cut**. Build a flow network: each
# value is an edge `in -> out` whose capacity is its size in bytes (cutting it = saving it);
# data edges cannot be cut; the source feeds the primals and every op that the forward runs
# anyway and that is not cheap to recompute (matmuls, reductions); every value the backward
# reads drains to the sink. A cut separates the forward from the backward, and whatever the
# backward needs beyond the cut it recomputes from the saved values. `networkx` finds the
# minimum cut with max-flow.

# %%
block = TinyBlock(64, 4)
xb = torch.randn(8, 16, 64, requires_grad=True)
names = [n for n, _ in block.named_parameters()]
fn = lambda x, *ps: torch.func.functional_call(block, dict(zip(names, ps)), (x,))  # noqa: E731
block_inputs = [xb, *block.parameters()]
fakes, mode = fake_inputs(block_inputs)
block_joint = create_joint(decompose(fn, fakes), fakes, [True] * len(block_inputs), mode)
rows = [("default", default_partition(block_joint)), ("min-cut", min_cut_partition(block_joint))]
print(f"TinyBlock(64, 4) on {tuple(xb.shape)}: joint graph of {len(block_joint.gm.graph.nodes)} nodes")
print(f"{'partitioner':12}{'saved values':>14}{'saved bytes':>14}")
for name, p in rows:
    print(f"{name:12}{len(p.saved):>14}{p.saved_bytes:>14,}")
print("\nmin-cut saves:", ", ".join(rows[1][1].saved))
print("default saves:", ", ".join(rows[0][1].saved))

# %% [markdown]
# The same min-cut as a picture: the forward side of the joint graph, each value coloured by
# what the partition does with it, and the whole backward folded into one box. Yellow values
# cross the cut (saved); purple ops run again inside the backward; blue ones only in the forward.

# %% tags=["nbval-ignore-output"]
from course.pictures import partition_dot  # noqa: E402
from tinydynamo import viz  # noqa: E402

min_cut = rows[1][1]
picture = partition_dot(block_joint, min_cut, f"min-cut partition of TinyBlock(64, 4): saves "
                        f"{len(min_cut.saved)} values, {min_cut.saved_bytes:,} bytes")
if viz.can_render():
    display(picture)  # noqa: F821 (Jupyter's display)
else:
    print("install Graphviz (apt install graphviz) to see the partition drawn")

# %% [markdown]
# The min-cut keeps the inputs, the first matmul's output and the LayerNorm statistics, and
# recomputes in the backward the LayerNorm normalisation and the whole GELU chain (`erf`, the
# multiplies and adds): all pointwise, all cheap. `bench/partitioners.py` prints the
# same table for larger sizes, next to PyTorch's own partitioners.
#
# Run eagerly (`aot_eager_min_cut` below), recomputing costs time: every recomputed op is one
# more kernel. Behind a code generator it is nearly free, because the recomputed ops fuse into
# kernels the backward runs anyway, while every saved byte is written once and read once more.
# So `tininductor.compile_fx` uses the min-cut, as TorchInductor does
# (`tininductor.config.partitioner = "default"` switches back).
#
# Fewest bytes is not the whole story. A value that the backward feeds to a matmul is written to
# memory there whether it was saved or recomputed, so recomputing it saves memory but no traffic.
# Worse, in a post-norm transformer (BERT) each LayerNorm output feeds the next layer's residual
# add: recomputed from the layer before, which is recomputed from the one before that, the whole
# residual stream becomes one backward kernel with a hundred inputs (9 s of Triton compile on
# BERT-base). The real partitioner cuts such chains: a value the backward materialises is not
# recomputed from another one (`chained_materializations`), at the price of one saved value per
# layer. PyTorch's min-cut bans recomputing every materialised value
# (`ban_recompute_materialized_backward`), which saves more.
#
# Two more rules keep the recomputation local. A pre-norm transformer (GPT-2) adds every layer's
# output to its residual stream; cut by bytes alone, the backward rebuilds the stream add after
# add through all the layers, so no chain of recomputed ops may be longer than
# `MAX_RECOMPUTE_DEPTH` (the cut saves a value inside a longer one). And the backward graph is
# ordered as the autograd engine would run it (`recompute_where_used`): a backward cut out of the
# joint graph would start with all of its recomputation, which the scheduler would fuse into one
# kernel; placed just before the op that needs it, each value is recomputed in that op's kernel.
#
# ## 7. The runtime: a `torch.autograd.Function`
#
# `tininductor.aot_autograd.aot_autograd(fw_compiler, bw_compiler, partition_fn)` puts it all
# together as a backend: lift parameters into primals, decompose, build the joint graph,
# partition, compile both graphs, and return a function that calls `CompiledFunction.apply`.
# Its `forward` runs the compiled forward and `ctx.save_for_backward(*saved)`; its `backward`
# runs the compiled backward. Here the compilers are identity functions (the `GraphModule`
# runs its ATen ops eagerly): that backend is `aot_eager`. In chapter 7 tininductor's
# `compile_fx` is this same AOT layer with real code generation.

# %%
from tininductor.aot_autograd import CompiledFunction

print(inspect.getsource(CompiledFunction))

# %% [markdown]
# Train the LayerNorm-MLP block and the GPT a few SGD steps, eagerly and through
# `torch.compile(model, backend=aot_eager)` (TorchDynamo captures the graph; our AOT layer
# does the rest), and compare the losses:

# %%
import copy

from tininductor.aot_autograd import aot_eager, aot_eager_min_cut


def train(model, batches, backend=None, lr=0.05):
    torch._dynamo.reset()
    run = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for batch in batches:
        opt.zero_grad()
        out = run(*batch)
        loss = out[1] if isinstance(out, tuple) else out.square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


torch.manual_seed(0)
gpt = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
gpt_batches = [(torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))) for _ in range(4)]
mlp = TinyBlock(64, 4)
mlp_batches = [(torch.randn(8, 16, 64),) for _ in range(4)]

results = {}
for name, model, batches in [("TinyBlock", mlp, mlp_batches), ("GPT", gpt, gpt_batches)]:
    eager = train(copy.deepcopy(model), batches)
    ours = train(copy.deepcopy(model), batches, backend=aot_eager)
    ours_min_cut = train(copy.deepcopy(model), batches, backend=aot_eager_min_cut)
    results[name] = (eager, ours, ours_min_cut)
    print(f"{name}:")
    print("  eager             ", " ".join(f"{v:.4f}" for v in eager))
    print("  aot_eager         ", " ".join(f"{v:.4f}" for v in ours))
    print("  aot_eager min-cut ", " ".join(f"{v:.4f}" for v in ours_min_cut))
    torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours_min_cut, eager, rtol=1e-4, atol=1e-5)
torch._dynamo.reset()

# %% [markdown]
# The compile also records its artefacts, which the instructor's view shows: the joint,
# forward and backward graphs of every compiled frame.

# %%
from tinydynamo import artifacts

with artifacts.collecting("tanh_example") as arts:
    compiled = aot_eager(small, inputs)
for kind in ("joint_graph", "forward_graph", "backward_graph"):
    print(kind, "->", [title for title, _ in arts.get(kind)])

# %% [markdown]
# ## Closing note
#
# - **Prim set**: 66 ATen ops (`tininductor.prims.PRIM_SET`); everything else decomposes
#   (chapter 5) or is a logged fallback.
# - **VJP rules**: one per prim in `tininductor.vjp_rules.VJP_RULES`, plus rules for the
#   fallback ops real models train through (`convolution`, group norm, batch norm when its
#   decomposition is off, the fused
#   attention kernels, `max(dim)`, `sort`, `topk`...), most of them a call of ATen's own
#   backward op; each is tested against eager autograd in float64 with broadcasting.
#   Multi-output ops get one gradient per output (`getitem` hands its gradient back), and a
#   gradient that reaches an op without a rule is a compile error naming the op, never a
#   silently missing gradient.
# - **Models**: the LayerNorm-MLP block and the GPT train through `aot_eager` with the same
#   losses as eager (table above), with both partitioners.
# - **Saved bytes**: on TinyBlock(64, 4), the min-cut partitioner saves less than half of
#   what the default saves (table in section 6).
#
# What the learner built: `sum_to_size` (6.1), the `mul` rule (6.2), the reverse-mode pass
# (6.3) and the default partitioner's choice (6.4) — each ran inside the real pipeline above.
