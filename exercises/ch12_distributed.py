# GENERATED from solutions/ch12_distributed.py by `python -m course.exercises`: edit the marked parts.
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
    raise NotImplementedError("Exercise 12.1: DDP's buckets; checked on models with caps hit exactly, a small first bucket and a parameter larger than the cap (notebook 12, section 2). Stuck? course.hint('12.1')")


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
    raise NotImplementedError("Exercise 12.2: the pieces of a graph; checked against tinydynamo's DDP optimizer on an MLP, a tied weight and a transformer block (notebook 12, section 3). Stuck? course.hint('12.2')")


def step_time(backward_ms: list[float], allreduce_ms: list[float], split: bool) -> float:
    """When the backward and all gradient all-reduces of one step are done (ms after backward starts).

    ``backward_ms[i]`` / ``allreduce_ms[i]``: the backward time of piece ``i`` (forward order) and the
    all-reduce time of its bucket. Backward runs the pieces from the last to the first, one after
    the other; communication uses one channel, so all-reduces run one at a time, in the order
    their gradients become ready. ``split=True``: a bucket's all-reduce can start when its piece's
    backward is done. ``split=False`` (one compiled backward for the whole graph): every gradient
    comes out at the very end, so every all-reduce starts after the whole backward.
    """
    raise NotImplementedError("Exercise 12.3: the timeline of a step with and without the split; checked on compute-bound, communication-bound and uneven pieces (notebook 12, section 4). Stuck? course.hint('12.3')")
