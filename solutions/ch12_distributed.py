"""Chapter 12: distributed training — where a compiled graph must end so that communication overlaps.

Three pieces of TorchDynamo's DDP optimizer: DDP's gradient buckets (which parameters are
all-reduced together, and in which order), the split of a captured graph at those buckets, and a
timeline that shows what the split buys: the all-reduce of one bucket runs while the backward of
the next piece computes.
"""
from __future__ import annotations

import torch
import torch.fx


def ddp_buckets(params: list[tuple[str, int]], bucket_cap: int, first_bucket_cap: int) -> list[list[str]]:
    """DDP's gradient buckets, in the order DDP all-reduces them.

    ``params``: ``(name, nbytes)`` in the model's order (the forward uses them in this order, so
    backward produces their gradients in the *reverse* order). Walking the parameters in gradient
    order, add each one to the open bucket; once a bucket holds ``cap`` bytes or more it is closed
    and the next parameter opens a new one. The first bucket (the first to be all-reduced) uses
    ``first_bucket_cap`` (DDP's is 1 MiB, to start communicating early), the others ``bucket_cap``.
    """
    # BEGIN SOLUTION (Exercise 12.1: DDP's buckets; checked on models with caps hit exactly, a small first bucket and a parameter larger than the cap (notebook 12, section 2))
    buckets: list[list[str]] = []
    size = 0
    for name, nbytes in reversed(params):
        cap = first_bucket_cap if len(buckets) <= 1 else bucket_cap
        if not buckets or size >= cap:
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += nbytes
    return buckets
    # END SOLUTION


def split_points(gm: torch.fx.GraphModule, param_bytes: dict[str, int], bucket_cap: int,
                 first_bucket_cap: int) -> dict[str, int]:
    """The piece of every op node of ``gm`` (0: the first piece in forward order), as the DDP
    optimizer splits a graph captured inside a DDP forward.

    ``gm`` takes parameters as placeholders (as tinydynamo lifts them); ``param_bytes`` names those
    placeholders with their sizes. Walk the op nodes (``call_*`` / ``get_attr``) from the last to
    the first, filling the current piece: a parameter counts at its *first* use in forward order
    (its gradient is complete only when the backward of that use ends). Before a node, if the
    current piece holds ``cap`` bytes or more of parameters (``first_bucket_cap`` for the last
    piece, which backward runs first), start a new piece. Nodes before every parameter use (a
    preamble without parameters) join the piece after them.
    """
    # BEGIN SOLUTION (Exercise 12.2: the pieces of a graph; checked against tinydynamo's DDP optimizer on an MLP, a tied weight and a transformer block (notebook 12, section 3))
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    first_use: dict[torch.fx.Node, list[str]] = {}
    for p in gm.graph.nodes:
        if p.op == "placeholder" and p.name in param_bytes and p.users:
            first_use.setdefault(min(p.users, key=order.__getitem__), []).append(p.name)
    pieces: list[list[torch.fx.Node]] = [[]]
    sizes = [0]
    for node in reversed(nodes):
        cap = first_bucket_cap if len(pieces) == 1 else bucket_cap
        if sizes[-1] and sizes[-1] >= cap:
            pieces.append([])
            sizes.append(0)
        pieces[-1].append(node)
        sizes[-1] += sum(param_bytes[name] for name in first_use.get(node, ()))
    if len(pieces) > 1 and sizes[-1] == 0:
        preamble = pieces.pop()
        pieces[-1] += preamble
    pieces.reverse()
    return {n.name: i for i, piece in enumerate(pieces) for n in piece}
    # END SOLUTION


def step_time(backward_ms: list[float], allreduce_ms: list[float], split: bool) -> float:
    """When the backward and all gradient all-reduces of one step are done (ms after backward starts).

    ``backward_ms[i]`` / ``allreduce_ms[i]``: the backward time of piece ``i`` (forward order) and the
    all-reduce time of its bucket. Backward runs the pieces from the last to the first, one after
    the other; communication uses one channel, so all-reduces run one at a time, in the order
    their gradients become ready. ``split=True``: a bucket's all-reduce can start when its piece's
    backward is done. ``split=False`` (one compiled backward for the whole graph): every gradient
    comes out at the very end, so every all-reduce starts after the whole backward.
    """
    # BEGIN SOLUTION (Exercise 12.3: the timeline of a step with and without the split; checked on compute-bound, communication-bound and uneven pieces (notebook 12, section 4))
    compute_end = 0.0
    comm_end = 0.0
    total_backward = sum(backward_ms)
    for bw, ar in zip(reversed(backward_ms), reversed(allreduce_ms)):
        compute_end += bw
        ready = compute_end if split else total_backward
        comm_end = max(comm_end, ready) + ar
    return max(compute_end, comm_end)
    # END SOLUTION
