"""Chapter 11: end to end — measuring the whole compiler honestly, and writing code it likes.

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
    # BEGIN SOLUTION (Exercise 11.1: the bytes any implementation must move; checked on graphs with several dtypes, repeated and returned-input outputs, and non-tensor inputs (notebook 11, section 2))
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
    # BEGIN SOLUTION (Exercise 11.2: bad_fn's values in one graph; checked with fullgraph=True on inputs of both signs and mixed signs (notebook 11, section 4b))
    y = x.sin() + x.cos()
    return torch.where(y.sum() > 0, y * 2, y - 2)
    # END SOLUTION


def bucket_length(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``n``; past the largest bucket, the next multiple of it."""
    # BEGIN SOLUTION (Exercise 11.3: the bucket a length goes to; checked on lengths at, between and past the buckets (notebook 11, section 4c))
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
        # BEGIN SOLUTION (Exercise 11.3: call fn only on bucket lengths and return what fn(x) would; checked by outputs and the number of compiles (notebook 11, section 4c))
        n = x.shape[dim]
        target = bucket_length(n, buckets)
        if target != n:
            pad_shape = list(x.shape)
            pad_shape[dim] = target - n
            x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
        return fn(x).narrow(dim, 0, n)
        # END SOLUTION

    return wrapper
