"""Chapter 6: AOT autograd.

Four pieces of ``tininductor``'s AOT autograd, each plugged back into the real pipeline by
the graded tests: undoing broadcasting in a gradient (6.1), a VJP rule (6.2), the reverse-mode
pass that builds the joint graph (6.3), and the default partitioner's choice of saved values
(6.4). Everything is compared with eager autograd.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from tininductor.vjp_rules import get_vjp

aten = torch.ops.aten


def sum_to_size(grad: torch.Tensor, shape) -> torch.Tensor:
    """Sum ``grad`` down to ``shape``, undoing broadcasting.

    Broadcasting lines shapes up on the right, prepends dims and stretches size-1 dims, so:
    sum over the prepended (leading) dims, then, keeping the dim, over every dim where
    ``shape`` has 1 and ``grad`` does not. Return ``grad`` viewed with exactly ``shape``.
    """
    # BEGIN SOLUTION (Exercise 6.1: undo broadcasting in a gradient; checked against autograd on many shape pairs and inside the add rule (notebook 06, section 2))
    shape = list(shape)
    lead = grad.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1]
    if dims:
        grad = aten.sum(grad, dims, keepdim=True)
    return aten.view(grad, shape)
    # END SOLUTION


def reduce_grad(g: torch.Tensor, x):
    """``g`` summed back to the shape of the input ``x`` with your :func:`sum_to_size` (Exercise
    6.1); ``None`` when ``x`` is a Python number (a number gets no gradient)."""
    return sum_to_size(g, x.shape) if isinstance(x, torch.Tensor) else None


def mul_vjp(grad, out, a, b):
    """The VJP rule of ``aten.mul``: gradients of ``a`` and ``b`` given the output's ``grad``.

    Either input may be a Python number (its gradient is ``None``) or a tensor broadcast
    against the other (its gradient then has the broadcast shape: ``reduce_grad(g, x)`` brings
    it back to ``x``'s). Example: ``a`` of shape (3, 1), ``b`` of shape (4,): ``grad`` is (3, 4),
    the gradients are (3, 1) and (4,); ``mul_vjp(grad, out, a, 2.0)`` gives ``(grad * 2.0, None)``.
    """
    # BEGIN SOLUTION (Exercise 6.2: the VJP rule of mul, broadcasting and numbers included; checked against autograd in the joint graph (notebook 06, section 3))
    return reduce_grad(aten.mul(grad, b), a), reduce_grad(aten.mul(grad, a), b)
    # END SOLUTION


def backward_pass(graph: fx.Graph, env: dict, needs_grad: set, output_grads: dict, rules=None) -> dict:
    """Reverse-mode AD over ``graph``: return ``{node: gradient}`` for every node a gradient reaches.

    ``env[node]`` is each node's forward value, ``output_grads`` seeds the outputs' gradients
    (the tangents). Walk the nodes in reverse; for each ``call_function`` node that has a
    gradient and is in ``needs_grad``, call its rule ``get_vjp(node.target, rules)`` as
    ``rule(grad, env[node], *args, **kwargs)`` with the node's arguments looked up in ``env``.
    The rule returns one gradient (or ``None``) per positional argument; add each one to the
    gradient of that argument if it is a node in ``needs_grad`` (a node with several users
    collects one contribution per user: use ``aten.add``).
    """
    # BEGIN SOLUTION (Exercise 6.3: reverse-mode AD over an FX graph; checked against autograd on shared, unused and model graphs (notebook 06, section 4))
    grads = dict(output_grads)
    for node in reversed(graph.nodes):
        if node.op != "call_function" or node not in grads or node not in needs_grad:
            continue
        args = fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
        input_grads = get_vjp(node.target, rules)(grads[node], env[node], *args, **kwargs)
        for arg, g in zip(node.args, input_grads):
            if isinstance(arg, fx.Node) and arg in needs_grad and g is not None:
                grads[arg] = g if arg not in grads else aten.add(grads[arg], g)
    return grads
    # END SOLUTION


def default_saved(joint_gm: fx.GraphModule, num_primals: int, num_outputs: int) -> list[fx.Node]:
    """The values the default partitioner saves for the backward.

    The joint graph's placeholders are the primals (first ``num_primals``) then the tangents;
    its output node returns ``(*outputs, *grads)`` (the first ``num_outputs`` are the forward's).
    The *forward* is every node needed to compute the outputs, plus the primals. Save each
    forward node that the backward reads: walk back from the gradients, stopping at forward
    nodes and tangents; the forward nodes where the walk stops are the saved values.
    Return them in any order, without duplicates.
    """
    # BEGIN SOLUTION (Exercise 6.4: the values the default partitioner saves; checked against the package's partition and by training with it (notebook 06, section 6))
    nodes = list(joint_gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    primals, tangents = placeholders[:num_primals], placeholders[num_primals:]
    flat = list(nodes[-1].args[0])
    outputs, grads = flat[:num_outputs], flat[num_outputs:]

    def ancestors(roots, stop):
        seen, todo = set(), [r for r in roots if isinstance(r, fx.Node)]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                if n not in stop:
                    todo.extend(n.all_input_nodes)
        return seen

    forward = ancestors(outputs, set()) | set(primals)
    backward = ancestors(grads, forward | set(tangents))
    return [n for n in backward if n in forward]
    # END SOLUTION
