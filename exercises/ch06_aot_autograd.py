# GENERATED from solutions/ch06_aot_autograd.py by `python -m course.exercises`: edit the marked parts.
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
    raise NotImplementedError("Exercise 6.1: undo broadcasting in a gradient; checked against autograd on many shape pairs and inside the add rule (notebook 06, section 2). Stuck? course.hint('6.1')")


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
    raise NotImplementedError("Exercise 6.2: the VJP rule of mul, broadcasting and numbers included; checked against autograd in the joint graph (notebook 06, section 3). Stuck? course.hint('6.2')")


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
    raise NotImplementedError("Exercise 6.3: reverse-mode AD over an FX graph; checked against autograd on shared, unused and model graphs (notebook 06, section 4). Stuck? course.hint('6.3')")


def default_saved(joint_gm: fx.GraphModule, num_primals: int, num_outputs: int) -> list[fx.Node]:
    """The values the default partitioner saves for the backward.

    The joint graph's placeholders are the primals (first ``num_primals``) then the tangents;
    its output node returns ``(*outputs, *grads)`` (the first ``num_outputs`` are the forward's).
    The *forward* is every node needed to compute the outputs, plus the primals. Save each
    forward node that the backward reads: walk back from the gradients, stopping at forward
    nodes and tangents; the forward nodes where the walk stops are the saved values.
    Return them in any order, without duplicates.
    """
    raise NotImplementedError("Exercise 6.4: the values the default partitioner saves; checked against the package's partition and by training with it (notebook 06, section 6). Stuck? course.hint('6.4')")
