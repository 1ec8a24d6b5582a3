"""Chapter 10: end to end — measuring the whole compiler honestly, and writing code it likes.

Three pieces a performance engineer writes around any compiler: the ideal memory traffic of a
graph (the yardstick for "percent of bandwidth"), a tensor-only rewrite that removes a graph
break, and shape bucketing that bounds the number of recompiles.
"""
from __future__ import annotations

import math

import torch


def ideal_bytes(gm: torch.fx.GraphModule, example_inputs) -> int:
    """The fewest bytes any implementation of ``gm`` must move: read every input once, write every output once.

    ``example_inputs`` are tensors (or other values, which cost nothing). An output that is an
    input returned unchanged costs nothing extra; an output listed twice is written once.
    """
    # BEGIN SOLUTION (Exercise 10.1: sum the bytes of the tensor inputs plus the distinct tensor outputs that are not inputs)
    total = sum(t.numel() * t.element_size() for t in example_inputs if isinstance(t, torch.Tensor))
    outputs = gm(*example_inputs)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    seen = {id(t) for t in example_inputs}
    for out in outputs:
        if isinstance(out, torch.Tensor) and id(out) not in seen:
            seen.add(id(out))
            total += out.numel() * out.element_size()
    return total
    # END SOLUTION


def positive_branch(x: torch.Tensor) -> torch.Tensor:
    """A break-free rewrite of the seeds' ``bad_fn`` (print and logging dropped)::

        y = x.sin() + x.cos()
        if y.sum().item() > 0:
            return y * 2
        return y - 2

    Write it with tensor ops only, so ``tinydynamo.compile(..., fullgraph=True)`` captures it
    in one graph and it returns exactly what ``bad_fn`` returns.
    """
    # BEGIN SOLUTION (Exercise 10.2: compute both branches and choose with torch.where on the tensor condition)
    y = x.sin() + x.cos()
    return torch.where(y.sum() > 0, y * 2, y - 2)
    # END SOLUTION


def bucket_length(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``n``; past the largest bucket, the next multiple of it."""
    # BEGIN SOLUTION (Exercise 10.3: return the first bucket >= n, else round n up to a multiple of the largest bucket)
    for size in sorted(buckets):
        if size >= n:
            return size
    largest = max(buckets)
    return math.ceil(n / largest) * largest
    # END SOLUTION


def bucketed(fn, buckets: list[int], dim: int = 1):
    """Wrap ``fn(x)``, row-wise along ``dim``, so it only ever sees lengths from ``buckets``.

    Pads ``x`` with zeros along ``dim`` up to :func:`bucket_length`, calls ``fn`` and slices
    the result back, so a compiled ``fn`` recompiles once per bucket instead of once per length.
    """

    def wrapper(x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION (Exercise 10.3: pad x along dim to bucket_length, call fn, and narrow the result back to the original length)
        n = x.shape[dim]
        target = bucket_length(n, buckets)
        if target != n:
            pad_shape = list(x.shape)
            pad_shape[dim] = target - n
            x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
        return fn(x).narrow(dim, 0, n)
        # END SOLUTION

    return wrapper
