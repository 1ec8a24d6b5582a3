"""Chapter 7's helpers: plug the exercises into tininductor's real pipeline, and draw and measure
what the scheduler did. Not exercises: read them to see where each piece sits in the pipeline.

A helper that runs the learner's code takes it as an argument, from the chapter module the caller
loaded (``ch``):

* ``use_lowering(aten.silu.default, ch.lower_silu)`` (Exercise 7.1);
* ``use_view_lowerings(ch.permute_reindex, ch.expand_reindex)`` (Exercise 7.2);
* ``use_fusion_check(ch.fusion_is_legal)`` (Exercise 7.3);
* ``use_read_writes(ch.ReadWritesHandler)`` (Exercise 7.4).

``compile_aten`` and ``lower_and_schedule`` run the pipeline; ``fusion_text``, ``fusion_dot``,
``draw_fusion`` and ``memory_traffic`` show what it did.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable

import torch
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from tininductor import config, ir, lowering, scheduler
from tininductor.compile_fx import _ensure_example_values, compile_fx_inner
from tininductor.decompositions import DECOMPOSITIONS, decompose
from tininductor.graph import GraphLowering
from tininductor.registry import overload_table
from tininductor.testing import patch_config
from tininductor.virtualized import V
from tinydynamo.registry import swap

aten = torch.ops.aten

Reindex = Callable[[list], list]


# --------------------------------------------------------------------------- plugging the exercises in


@contextlib.contextmanager
def use_lowering(target, fn):
    """Register ``fn`` as the lowering of ``target`` (an OpOverload) for the duration (a swap of the registry)."""
    with lowering.lowerings.swap({target: fn}):
        yield


def permute_lowering(permute_reindex: Callable[..., Reindex]):
    """``aten.permute`` as a View whose index arithmetic is ``permute_reindex(dims)`` (Exercise 7.2)."""
    def lower_permute(x, dims):
        dims = [d % len(x.get_size()) for d in dims]
        return ir.View(x, [x.get_size()[d] for d in dims], permute_reindex(dims))

    return lower_permute


def expand_lowering(expand_reindex: Callable[..., Reindex]):
    """``aten.expand`` as a View whose index arithmetic is ``expand_reindex(old, new)`` (``-1`` keeps a size)."""
    def lower_expand(x, size, implicit=False):
        old = x.get_size()
        skip = len(size) - len(old)
        size = [old[i - skip] if s == -1 else int(s) for i, s in enumerate(size)]
        return ir.View(x, size, expand_reindex(old, size))

    return lower_expand


@contextlib.contextmanager
def use_view_lowerings(permute_reindex, expand_reindex):
    """Lower permute and expand with the index arithmetic of Exercise 7.2 (the two functions given)."""
    with use_lowering(aten.permute.default, permute_lowering(permute_reindex)), \
            use_lowering(aten.expand.default, expand_lowering(expand_reindex)):
        yield


def use_fusion_check(fusion_is_legal: Callable[[scheduler.FusedGroup], bool]):
    """Make the package's Scheduler fuse only where ``fusion_is_legal`` allows (Exercise 7.3): the
    scheduler builds each candidate kernel (``scheduler.fusion_candidate``) and asks the rule."""
    return swap(scheduler.FUSION_RULES, {"is_legal": fusion_is_legal})


def use_read_writes(handler_class: type):
    """Make the package's Scheduler collect dependencies with ``handler_class`` (Exercise 7.4's
    ``ReadWritesHandler``: ``handler_class()`` has ``.reads`` and ``.writes`` after a body ran on it)."""
    return swap(scheduler.FUSION_RULES, {"read_writes_handler": handler_class})


# --------------------------------------------------------------------------- running the pipeline


def composite_decompositions() -> dict:
    """The decompositions of the ops that have no lowering now (softmax, layer_norm, gelu, silu
    ...), keyed by overload: an op with a lowering (the package's, or one a ``use_lowering`` put
    in) stays in the graph and is lowered as it is."""
    return {op: fn for op, fn in overload_table(DECOMPOSITIONS).items() if op not in lowering.lowerings}


def aten_graph(fn, args) -> torch.fx.GraphModule:
    """Trace ``fn`` to ATen ops, decomposing only the ops that have no lowering: ``aten.silu``
    stays ``aten.silu`` while a lowering is registered for it (Exercise 7.1), and becomes
    ``mul(x, sigmoid(x))``, its decomposition, otherwise. Each node records the op it came from
    (``meta["original_aten"]``), so a kernel can be named after the op the function called."""
    return traced_graph(fn, args, decompose_all=False)


def traced_graph(fn, args, decompose_all: bool) -> torch.fx.GraphModule:
    """``fn`` decomposed to prims as the backend does (``decompose_all``), or as :func:`aten_graph` says."""
    with torch.no_grad():
        if decompose_all:
            return decompose(torch.fx.symbolic_trace(fn), list(args))
        with fx_traceback.preserve_node_meta():  # each node records the op it came from
            return make_fx(fn, decomposition_table=composite_decompositions())(*args)


def compile_aten(fn, args, decompose=False):
    """Compile ``fn`` with tininductor's Triton path (the interpreter on CPU), raising on errors.
    Kernels are named after the ops ``fn`` calls (``triton_per_fused_softmax_0``).

    Returns the compiled callable (``.kernels``, ``.source``, ``.fallback_reasons``).
    """
    gm = traced_graph(fn, args, decompose)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    with patch_config(config, fallback_to_eager=False, cpu_backend="triton", descriptive_names="original_aten"):
        return compile_fx_inner(gm, list(args))


def lower_and_schedule(fn, args, decompose=True):
    """Lower ``fn`` to IR and run the Scheduler, without generating code.

    Returns ``(graph, sched)``: ``graph.buffers`` are the realized IR buffers,
    ``sched.nodes`` the kernels (``FusedGroup``) and extern calls in order.
    """
    gm = traced_graph(fn, args, decompose)
    _ensure_example_values(gm, list(args))
    graph = GraphLowering(gm, list(args))
    with V.set_graph_handler(graph):
        graph.run(*args)
        outputs = {o.get_name() for o in graph.graph_outputs if hasattr(o, "get_name")}
        sched = scheduler.Scheduler(graph.buffers, outputs)
    return graph, sched


# --------------------------------------------------------------------------- drawing and measuring the result


def _node_label(graph, buf) -> str:
    if isinstance(buf, ir.ComputedBuffer):
        ops_ = list(dict.fromkeys(graph.origin_ops(buf.origins)))
        kind = "reduction" if buf.is_reduction() else "pointwise"
        if len(ops_) > 4:
            ops_ = ops_[:3] + ["..."]
    else:
        kind, ops_ = "extern", [getattr(buf, "op_name", "extern")]
    return f"{buf.get_name()} [{kind}]: {'+'.join(ops_)}"


def fusion_text(graph, sched) -> str:
    """The fusion decisions as text: one block per kernel, its buffers, and what it reads."""
    lines = []
    for k, node in enumerate(sched.nodes):
        members = node.nodes if isinstance(node, scheduler.FusedGroup) else [node.node]
        head = f"kernel {k}" if isinstance(node, scheduler.FusedGroup) else f"extern {k}"
        if isinstance(node, scheduler.FusedGroup):
            head += f" (numel={node.numel}" + (f", rnumel={node.rnumel})" if node.is_reduction else ")")
        lines.append(head)
        names = {m.get_name() for m in members}
        for m in members:
            stored = "" if m.get_name() not in getattr(node, "internal", set()) else "  (kept in registers)"
            lines.append(f"    {_node_label(graph, m)}{stored}")
        reads = sorted({r for m in members for r in sched.reads[m.get_name()]} - names)
        lines.append(f"    reads: {', '.join(reads) or '-'}")
    return "\n".join(lines)


def fusion_dot(graph, sched) -> str:
    """The fusion decisions as Graphviz DOT: one cluster per kernel, edges for buffer reads."""
    lines = ["digraph fusion {", "  rankdir=LR; node [shape=box, fontsize=10];"]
    for name in graph.graph_inputs:
        lines.append(f'  "{name}" [shape=ellipse];')
    for k, node in enumerate(sched.nodes):
        members = node.nodes if isinstance(node, scheduler.FusedGroup) else [node.node]
        lines.append(f'  subgraph cluster_{k} {{ label="kernel {k}"; style=filled; color=lightgrey;')
        for m in members:
            lines.append(f'    "{m.get_name()}" [label="{_node_label(graph, m)}"];')
        lines.append("  }")
    for name, reads in sched.reads.items():
        for r in sorted(reads):
            lines.append(f'  "{r}" -> "{name}";')
    lines.append("}")
    return "\n".join(lines)


def draw_fusion(graph, sched, ax=None):
    """Draw kernels as columns of boxes (matplotlib): one colour per kernel, arrows for reads."""
    import matplotlib.pyplot as plt

    columns = []
    for node in sched.nodes:
        columns.append(node.nodes if isinstance(node, scheduler.FusedGroup) else [node.node])
    inputs = list(graph.graph_inputs)
    step = 2.4  # horizontal distance between columns
    pos = {name: (0, -i) for i, name in enumerate(inputs)}
    for k, members in enumerate(columns, 1):
        for j, m in enumerate(members):
            pos[m.get_name()] = (k * step, -j)
    if ax is None:
        height = max(2.0, 0.7 * max([len(inputs)] + [len(c) for c in columns]) + 0.8)
        _, ax = plt.subplots(figsize=(max(4.0, 1.7 * (len(columns) + 1)), height), dpi=80)
    colours = plt.get_cmap("tab10")
    for name in inputs:
        x, y = pos[name]
        ax.text(x, y, name.replace("_const__param_constant", "param"), ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round", fc="white", ec="black"))
    for k, members in enumerate(columns, 1):
        for m in members:
            x, y = pos[m.get_name()]
            ax.text(x, y, _node_label(graph, m).replace(": ", "\n"), ha="center", va="center", fontsize=7,
                    bbox=dict(boxstyle="round", fc=colours((k - 1) % 10), alpha=0.35))
        ax.text(k * step, 0.6, f"kernel {k - 1}" if isinstance(sched.nodes[k - 1], scheduler.FusedGroup) else "extern",
                ha="center", fontsize=8, weight="bold")
    for name, reads in sched.reads.items():
        for r in reads:
            if r in pos and name in pos:
                (x0, y0), (x1, y1) = pos[r], pos[name]
                same_column = x0 == x1
                ax.annotate("", xy=(x1 + (0.75 if same_column else -0.75), y1),
                            xytext=(x0 + 0.75, y0),
                            arrowprops=dict(arrowstyle="->", color="grey", lw=0.8,
                                            connectionstyle="arc3,rad=-0.5" if same_column else "arc3"))
    ax.set_xlim(-1.2, len(columns) * step + 1.2)
    low = min(y for _, y in pos.values()) if pos else 0
    ax.set_ylim(low - 0.7, 1.0)
    ax.axis("off")
    return ax


def _nbytes(layout) -> int:
    n = 1
    for s in layout.size:
        n *= int(s)
    return n * torch.empty((), dtype=layout.dtype).element_size()


def eager_traffic(gm: torch.fx.GraphModule, args) -> int:
    """Bytes moved running ``gm`` op by op, as eager does: each op reads its tensor inputs and writes its output.

    Views (an output sharing an input's storage) move nothing.
    """

    class Counter(torch.fx.Interpreter):
        total = 0

        def call_function(self, target, args_, kwargs):
            out = super().call_function(target, args_, kwargs)
            inputs = [a for a in torch.utils._pytree.tree_flatten((args_, kwargs))[0] if isinstance(a, torch.Tensor)]
            outs = [o for o in torch.utils._pytree.tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            storages = {t.untyped_storage().data_ptr() for t in inputs}
            if outs and all(o.untyped_storage().data_ptr() in storages for o in outs):
                return out  # a view
            Counter.total += sum(t.numel() * t.element_size() for t in inputs + outs)
            return out

    with torch.no_grad():
        Counter(gm).run(*args)
    return Counter.total


def memory_traffic(graph, sched) -> dict:
    """Bytes moved: op by op (``eager_bytes``: one kernel per op of the graph), and by the scheduled kernels.

    A fused kernel loads each buffer it reads from outside once and stores each buffer that
    leaves it; extern calls read their inputs and write their output.
    """
    fused = 0
    for node in sched.nodes:
        members = node.nodes if isinstance(node, scheduler.FusedGroup) else [node.node]
        names = {m.get_name() for m in members}
        internal = getattr(node, "internal", set())
        outside = {r for m in members for r in sched.reads[m.get_name()]} - names
        fused += sum(_nbytes(graph.get_buffer(r).layout) for r in outside)
        fused += sum(_nbytes(m.layout) for m in members
                     if m.get_name() not in internal and not isinstance(m, ir.MultiOutput) and m.layout.size != [0])
    return {"eager_bytes": eager_traffic(graph.module, graph.example_inputs), "fused_bytes": fused}
