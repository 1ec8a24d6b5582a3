"""Reverse-mode AD over a prim graph: build the joint graph ``(primals, tangents) -> (outputs, grads)``.

The pass is an interpreter. It runs the forward graph node by node, then walks the nodes
backwards, and for every node whose output has a gradient it calls that op's VJP rule
(vjp_rules.py) to get its inputs' gradients, adding up contributions of nodes with several
users. Run under ``make_fx`` on fake tensors, the interpreter *is* the compiler: what it
records is the joint graph, forward ops followed by backward ops, all prims.

Which values need gradients is decided before tracing, as eager autograd does: a value
requires grad when it is a floating-point tensor computed from an input that requires grad.
Only outputs that require grad get a tangent input; others (integer or bool outputs, values
that do not depend on a trainable input) are *non-differentiable*.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from tininductor.decompositions import DECOMPOSITIONS
from tininductor.vjp_rules import get_vjp


@dataclasses.dataclass
class JointGraph:
    """The joint graph and the bookkeeping the partitioners and the runtime wrapper need."""

    gm: fx.GraphModule            #: gm([primals], [tangents]) -> (*outputs, *grads)
    num_primals: int
    num_outputs: int              #: forward outputs (flattened)
    diff_outputs: list[bool]      #: which forward outputs get a tangent
    grad_mask: list[bool]         #: which primals get a gradient output (in order)
    out_spec: pytree.TreeSpec     #: to rebuild the forward's output structure

    @property
    def num_tangents(self) -> int:
        return sum(self.diff_outputs)


def _is_float_tensor(val) -> bool:
    return isinstance(val, torch.Tensor) and (val.dtype.is_floating_point or val.dtype.is_complex)


def requires_grad_nodes(graph: fx.Graph, requires_grad: list[bool]) -> set[fx.Node]:
    """Nodes whose value needs a gradient: float tensors that depend on a trainable primal."""
    result: set[fx.Node] = set()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, flag in zip(placeholders, requires_grad):
        if flag and _is_float_tensor(node.meta.get("val")):
            result.add(node)
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.detach.default:  # gradients stop here
            continue
        if any(arg in result for arg in node.all_input_nodes) and _is_float_tensor(node.meta.get("val")):
            result.add(node)
    return result


def _accumulate(grads: dict, node: fx.Node, grad: torch.Tensor) -> None:
    grads[node] = grad if node not in grads else torch.ops.aten.add(grads[node], grad)


def backward_pass(graph: fx.Graph, env: dict[fx.Node, object], needs_grad: set[fx.Node],
                  output_grads: dict[fx.Node, torch.Tensor], rules: dict | None = None
                  ) -> dict[fx.Node, torch.Tensor]:
    """Walk ``graph`` backwards from ``output_grads``, applying one VJP rule per node.

    ``env`` maps each node to its forward value. Returns the gradient of every node reached
    (placeholders included); a node no gradient reaches is simply absent. ``rules`` replaces
    the VJP registry (vjp_rules.VJP_RULES).
    """
    grads = dict(output_grads)
    for node in reversed(graph.nodes):
        if node.op != "call_function" or node not in grads or node not in needs_grad:
            continue
        if node.target is operator.getitem:
            raise NotImplementedError(f"no VJP for multi-output op feeding {node.name}")
        args = fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
        input_grads = get_vjp(node.target, rules)(grads[node], env[node], *args, **kwargs)
        for arg, grad in zip(node.args, input_grads):
            if isinstance(arg, (list, tuple)) and isinstance(grad, (list, tuple)):  # cat's tensor list
                for a, g in zip(arg, grad):
                    if isinstance(a, fx.Node) and a in needs_grad and g is not None:
                        _accumulate(grads, a, g)
            elif isinstance(arg, fx.Node) and arg in needs_grad and grad is not None:
                _accumulate(grads, arg, grad)
    return grads


def create_joint(fw_gm: fx.GraphModule, fake_primals: list, requires_grad: list[bool],
                 fake_mode, rules: dict | None = None, backward=None) -> JointGraph:
    """Trace forward + reverse-mode AD of the prim graph ``fw_gm`` into one joint graph.

    ``rules`` (a VJP registry) and ``backward`` (a :func:`backward_pass`) can be swapped,
    which is how the course plugs a learner's rule or pass into the real pipeline.
    """
    backward = backward or backward_pass
    graph = fw_gm.graph
    needs_grad = requires_grad_nodes(graph, requires_grad)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    (out_node,) = [n for n in graph.nodes if n.op == "output"]
    flat_outs, out_spec = pytree.tree_flatten(out_node.args[0])
    diff_outputs = [isinstance(o, fx.Node) and o in needs_grad for o in flat_outs]
    grad_mask: list[bool] = []

    def joint(primals, tangents):
        env: dict[fx.Node, object] = dict(zip(placeholders, primals))
        for node in graph.nodes:
            if node.op == "call_function":
                args = fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
                env[node] = node.target(*args, **kwargs)
            elif node.op == "get_attr":
                env[node] = getattr(fw_gm, node.target)
        outs = [env[o] if isinstance(o, fx.Node) else o for o in flat_outs]
        seeds: dict = {}
        for o, diff, tangent in zip(flat_outs, diff_outputs, _iter_tangents(diff_outputs, tangents)):
            if diff:
                _accumulate(seeds, o, tangent)
        grads = backward(graph, env, needs_grad, seeds, rules)
        grad_mask[:] = [p in grads for p in placeholders]
        return (*outs, *[grads[p] for p in placeholders if p in grads])

    with fake_mode:
        tangents = [torch.empty(o.meta["val"].shape, dtype=o.meta["val"].dtype,
                                device=o.meta["val"].device)
                    for o, diff in zip(flat_outs, diff_outputs) if diff]
        with torch.no_grad():
            joint_gm = make_fx(joint, decomposition_table=DECOMPOSITIONS)(
                [p.detach() if isinstance(p, torch.Tensor) else p for p in fake_primals], tangents)
    # drop what no output reads (a rule may compute a gradient for an input that turns out to
    # need none); partitioners then see only real dependencies
    joint_gm.graph.eliminate_dead_code()
    joint_gm.recompile()
    return JointGraph(joint_gm, len(placeholders), len(flat_outs), diff_outputs, grad_mask, out_spec)


def _iter_tangents(diff_outputs, tangents):
    it = iter(tangents)
    for diff in diff_outputs:
        yield next(it) if diff else None
