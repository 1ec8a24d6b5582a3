"""Partitioners: split the joint graph into a forward graph and a backward graph.

Both sides of the split meet in the *saved values*: tensors the forward computes and keeps
alive until the backward runs (``ctx.save_for_backward``). The forward graph returns
``(*outputs, *saved)``; the backward graph takes ``(*saved, *tangents)`` and returns the
gradients. Partitioners differ only in *which* values they save:

* :func:`default_partition` saves every forward value the backward uses, as eager autograd does.
* :func:`min_cut_partition` saves as few bytes as it can, recomputing cheap pointwise and view
  ops in the backward instead of saving their outputs. Choosing the cheapest set of values
  that separates the primals from the backward is a minimum cut in a flow network.
"""
from __future__ import annotations

import dataclasses
import math
import operator

import networkx as nx
import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _make_graph_module

from tininductor import prims as P
from tininductor.joint_graph import JointGraph

#: Ops cheap enough to recompute in the backward instead of saving their output.
RECOMPUTABLE = frozenset(
    P.POINTWISE_UNARY + P.POINTWISE_BINARY + P.POINTWISE_OTHER + P.VIEWS + P.CREATION)

#: Ops that read their inputs inside a fused kernel (a recomputed input is computed in registers
#: there); any other consumer (a matmul, a convolution, indexing) reads a buffer in memory.
FUSIBLE = RECOMPUTABLE | frozenset(P.REDUCTIONS)

_VIEWS = frozenset(P.VIEWS)


@dataclasses.dataclass
class Partition:
    """A forward graph, a backward graph, and what passes between them."""

    fw_gm: fx.GraphModule    #: primals -> (*outputs, *saved)
    bw_gm: fx.GraphModule    #: (*saved, *tangents) -> grads
    saved: list[str]         #: names of the saved nodes, in order
    saved_bytes: int         #: their total size

    def __str__(self) -> str:
        return f"saved {len(self.saved)} values, {self.saved_bytes} bytes: {', '.join(self.saved)}"


def nbytes(node: fx.Node) -> int:
    """Bytes of the tensor a node produces (0 for non-tensors); for symbolic sizes, at the
    example's sizes (the ShapeEnv's hints)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    numel = val.numel()
    if isinstance(numel, torch.SymInt):
        numel = numel.node.hint if numel.node.hint is not None else 1 << 20
    return int(numel) * val.element_size()


def is_recomputable(node: fx.Node) -> bool:
    """Cheap to recompute: pointwise, view and creation ops (not reductions, matmuls, indexing)."""
    return node.op == "call_function" and getattr(node.target, "overloadpacket", None) in RECOMPUTABLE


@dataclasses.dataclass
class _Roles:
    primals: list[fx.Node]
    tangents: list[fx.Node]
    fw_outputs: list            # nodes (or constants) the forward returns
    grad_outputs: list[fx.Node]
    tangent_dependent: set[fx.Node]   # computed from a tangent: backward-only by nature


def _packet(node: fx.Node):
    return getattr(node.target, "overloadpacket", None) if node.op == "call_function" else None


def is_materialized_backwards(node: fx.Node, backward: set[fx.Node]) -> bool:
    """Whether the backward reads ``node`` (directly or through views) with an op that cannot fuse
    it (a matmul, a convolution): recomputed there, it is written to memory and read back, not
    computed in the registers of the kernel that needs it (``is_materialized_backwards`` in
    torch/_functorch/partitioners.py)."""
    if _packet(node) in _VIEWS:
        return False
    todo = [node]
    while todo:
        current = todo.pop()
        for user in current.users:
            if user in backward and _packet(user) not in FUSIBLE:
                return True
            if _packet(user) in _VIEWS:
                todo.append(user)
    return False


def chained_materializations(recomputable: set[fx.Node], backward: set[fx.Node]) -> set[fx.Node]:
    """The values the backward would materialise whose recomputation needs another such value
    recomputed first: these are not recomputed (the min-cut saves them or what they feed).

    Without this rule a chain of them is recomputed end to end. A transformer's residual stream is
    one: each layer norm's output feeds a matmul in the backward and, through the next residual add,
    the next layer norm. Recomputed, the backward's first kernel rebuilds every layer's norm, one
    after the other, with a hundred inputs and outputs (BERT-base: 9 s of Triton compile for that
    one kernel). Cutting each link saves one value per link. PyTorch's min-cut goes further and
    never recomputes a materialised value (``ban_recompute_materialized_backward``), which saves
    more memory than this: BERT-base's GELU outputs and attention heads would be saved as well.
    """
    materialized = {n for n in recomputable if is_materialized_backwards(n, backward)}
    chained = set()
    for node in materialized:
        todo, seen = list(node.all_input_nodes), set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            if current in materialized:
                chained.add(node)
                break
            if current in recomputable:  # recomputed too: what it reads is needed as well
                todo.extend(current.all_input_nodes)
    return chained


#: The longest run of ops (views not counted) a backward recomputes one after another from saved values.
MAX_RECOMPUTE_DEPTH = 16


def long_recompute_chains(graph: fx.Graph, recomputable: set[fx.Node], computed: set[fx.Node],
                          limit: int | None = None) -> set[fx.Node]:
    """The values where a chain of recomputable ops grows past ``limit`` (default
    :data:`MAX_RECOMPUTE_DEPTH`) counted from values the forward computes anyway (``computed``, and
    every op that is not recomputable): these are computed in the forward too, so the min cut saves
    them or what they feed, and no backward kernel recomputes more than ``limit`` ops in a row.

    A pre-norm transformer's residual stream is such a chain (GPT-2: every layer adds to it). Cut
    only by bytes, it is recomputed in the backward from each layer's outputs, and the scheduler
    fuses the whole stream, through every layer, into one kernel: GPT-2 small's had 117 inputs and
    took Triton 3.5 s to compile for sm_90. A layer's own recomputation (a LayerNorm, a GELU) is shorter.
    """
    limit = MAX_RECOMPUTE_DEPTH if limit is None else limit
    depth: dict[fx.Node, int] = {}
    cut = set()
    for node in graph.nodes:
        if node not in recomputable or node in computed:
            depth[node] = 0
            continue
        steps = max((depth.get(a, 0) for a in node.all_input_nodes), default=0) + (_packet(node) not in _VIEWS)
        if steps > limit:
            cut.add(node)
            steps = 0
        depth[node] = steps
    return cut


def _roles(joint: JointGraph) -> _Roles:
    graph = joint.gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    primals, tangents = placeholders[: joint.num_primals], placeholders[joint.num_primals:]
    (out,) = [n for n in graph.nodes if n.op == "output"]
    flat = list(out.args[0])
    dependent = set(tangents)
    for node in graph.nodes:
        if node.op != "output" and any(a in dependent for a in node.all_input_nodes):
            dependent.add(node)
    return _Roles(primals, tangents, flat[: joint.num_outputs], flat[joint.num_outputs:], dependent)


def _ancestors(outputs, stop: set[fx.Node]) -> set[fx.Node]:
    """Nodes needed to compute ``outputs``, not looking past the nodes in ``stop``."""
    seen: set[fx.Node] = set()
    todo = [o for o in outputs if isinstance(o, fx.Node)]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in stop:
            todo.extend(node.all_input_nodes)
    return seen


def extract_graph(joint_gm: fx.GraphModule, inputs: list[fx.Node], outputs: list,
                  effects: list[fx.Node] = ()) -> fx.GraphModule:
    """Copy the part of the joint graph that computes ``outputs`` from ``inputs`` into a new module,
    with the ops in ``effects`` (run for their effect: ``aten._assert_async``) and what they read."""
    needed = _ancestors([*outputs, *effects], set(inputs))
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in joint_gm.graph.nodes:
        if node not in needed or node in env:
            continue
        if node.op == "placeholder":
            raise RuntimeError(f"partition bug: {node.name} is needed but is not an input")
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    graph.eliminate_dead_code()
    return _make_graph_module(joint_gm, graph)


def partition_with_saved(joint: JointGraph, saved: list[fx.Node]) -> Partition:
    """Build the forward and backward graphs around a chosen list of saved values."""
    roles = _roles(joint)
    order = {n: i for i, n in enumerate(joint.gm.graph.nodes)}
    saved = sorted(set(saved), key=order.__getitem__)
    # ops with an effect and no result (a check that raises) run in the forward, as in eager
    effects = [n for n in joint.gm.graph.nodes if n.op == "call_function" and not n.users and n.is_impure()
               and n not in roles.tangent_dependent]
    fw = extract_graph(joint.gm, roles.primals, roles.fw_outputs + saved, effects)
    bw = recompute_where_used(extract_graph(joint.gm, saved + roles.tangents, roles.grad_outputs),
                              len(saved))
    return Partition(fw, bw, [n.name for n in saved], sum(nbytes(n) for n in saved))


def recompute_where_used(bw_gm: fx.GraphModule, num_saved: int) -> fx.GraphModule:
    """Order the backward graph as the autograd engine runs it: the gradient ops (those that read a
    tangent) in their order, each value the backward recomputes placed just before the first op
    that needs it (PyTorch's ``reordering_to_mimic_autograd_engine``).

    The joint graph lists every forward op before any gradient op, so a backward graph cut out of it
    starts with all of its recomputation, of every layer. The scheduler fuses ops over the same
    elements into one kernel, so that would be one kernel recomputing every layer's values, slow to
    compile, all of them alive from the backward's start. Placed where they are used, each layer's
    recomputation fuses into that layer's gradient kernels instead.
    """
    graph = bw_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchors = set(placeholders[num_saved:])  # the tangents, then everything computed from them
    for node in graph.nodes:
        if node.op != "placeholder" and any(a in anchors for a in node.all_input_nodes):
            anchors.add(node)
    new, env = fx.Graph(), {}
    for node in placeholders:
        env[node] = new.placeholder(node.name)
        env[node].meta = dict(node.meta)

    def place(node: fx.Node) -> None:
        todo = [node]
        while todo:
            current = todo[-1]
            missing = [a for a in current.all_input_nodes if a not in env]
            if missing:
                todo.extend(missing)
                continue
            todo.pop()
            if current not in env:
                env[current] = new.node_copy(current, lambda n: env[n])

    for node in graph.nodes:
        if node.op == "output" or node in anchors or not node.users:
            place(node)
    return _make_graph_module(bw_gm, new)


def default_partition(joint: JointGraph) -> Partition:
    """Run every forward op in the forward; save each forward value the backward reads."""
    return partition_with_saved(joint, default_saved(joint))


def default_saved(joint: JointGraph) -> list[fx.Node]:
    """The values the default partitioner saves: each forward value the backward reads (reads
    only ``joint.gm``, ``num_primals`` and ``num_outputs``)."""
    roles = _roles(joint)
    forward = _ancestors(roles.fw_outputs, set()) | set(roles.primals)
    # a multi-output op's other outputs (flash attention's logsumexp) are forward values too:
    # the backward saves them, never the op's tuple (a graph input must be a tensor)
    forward |= {u for n in list(forward) for u in n.users
                if u.target is operator.getitem and u not in roles.tangent_dependent}
    # walk back from the gradients; the forward values where the walk stops are the saved ones
    backward = _ancestors(roles.grad_outputs, forward | set(roles.tangents))
    return [n for n in backward if n in forward]


def _residual_reachable(net: nx.DiGraph, flow: dict, source) -> set:
    """Nodes reachable from ``source`` in the residual network: the source side of a min cut.

    (``nx.minimum_cut`` puts nodes that cannot reach the sink on the source side, which would
    also count dead-end values as cut; walking the residual network from the source does not.)
    """
    seen, todo = {source}, [source]
    while todo:
        u = todo.pop()
        for v, data in net[u].items():  # forward edges with spare capacity
            if v not in seen and flow[u][v] < data.get("capacity", math.inf):
                seen.add(v)
                todo.append(v)
        for v in net.predecessors(u):  # backward edges that carry flow
            if v not in seen and flow[v][u] > 0:
                seen.add(v)
                todo.append(v)
    return seen


def min_cut_partition(joint: JointGraph) -> Partition:
    """Save the fewest bytes: a minimum s-t cut between the primals and the backward.

    PyTorch's counterpart is ``min_cut_rematerialization_partition``
    (torch/_functorch/partitioners.py), which also weighs recomputation by op kind.

    Flow network: every tangent-independent node ``n`` becomes an edge ``n_in -> n_out`` whose
    capacity is its size (cutting it = saving it); data edges are uncuttable. The source feeds
    the primals and every op the forward must run anyway and that cannot be recomputed
    (matmuls, reductions); every value the backward reads flows to the sink. Any cut then
    leaves the backward able to recompute what it needs from the saved values alone. A value
    the backward materialises, whose recomputation would need another one recomputed first
    (:func:`chained_materializations`), is fed from the source too: the cut saves it or what it feeds.
    So is a value where a chain of recomputation would grow too long (:func:`long_recompute_chains`).
    """
    roles = _roles(joint)
    forward = _ancestors(roles.fw_outputs, set())
    recomputable = {n for n in forward if is_recomputable(n) and n not in roles.tangent_dependent}
    kept = chained_materializations(recomputable, roles.tangent_dependent)  # computed in the forward
    # the backward also recomputes tangent-independent values the forward never needed (a transpose
    # of a weight, a term only a gradient uses): they lengthen its chains too
    kept |= long_recompute_chains(joint.gm.graph, {n for n in joint.gm.graph.nodes if is_recomputable(n)
                                                   and n not in roles.tangent_dependent}, kept)
    net = nx.DiGraph()  # edges without a capacity are uncuttable (infinite)
    for node in joint.gm.graph.nodes:
        if node in roles.tangent_dependent or node.op == "output":
            continue
        is_tensor = isinstance(node.meta.get("val"), torch.Tensor)
        # a size (SymInt, dynamic shapes) is saved for the backward as an int: almost free
        is_size = isinstance(node.meta.get("val"), torch.SymInt)
        net.add_edge((node, "in"), (node, "out"),
                     capacity=nbytes(node) if is_tensor else 1 if is_size else math.inf)
        if node.op == "placeholder" or node in kept or (node in forward and not is_recomputable(node)):
            net.add_edge("source", (node, "in"))
        if node in roles.grad_outputs:
            net.add_edge((node, "out"), "sink")
        for user in node.users:
            if user.op == "output":
                continue  # a forward output is returned, not read by the backward
            if user in roles.tangent_dependent:
                net.add_edge((node, "out"), "sink")
            else:
                net.add_edge((node, "out"), (user, "in"))
    if "sink" not in net or "source" not in net:
        return partition_with_saved(joint, [])
    _, flow = nx.maximum_flow(net, "source", "sink")
    reachable = _residual_reachable(net, flow, "source")
    saved = [key[0] for key in reachable if key != "source" and key[1] == "in"
             and (key[0], "out") not in reachable]
    return partition_with_saved(joint, saved)
