# GENERATED from solutions/ch11_end_to_end.py by `python -m course.exercises`: edit the marked parts.
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
    raise NotImplementedError("Exercise 11.1: the bytes any implementation must move; checked on graphs with several dtypes, repeated and returned-input outputs, and non-tensor inputs (notebook 11, section 2). Stuck? course.hint('11.1')")


def positive_branch(x: torch.Tensor) -> torch.Tensor:
    """A break-free rewrite of the seeds' ``bad_fn`` (print and logging dropped)::

        y = x.sin() + x.cos()
        if y.sum().item() > 0:
            return y * 2
        return y - 2

    Write it with tensor ops only, so ``tinydynamo.compile(..., fullgraph=True)`` captures it
    in one graph and it returns exactly what ``bad_fn`` returns.
    """
    raise NotImplementedError("Exercise 11.2: bad_fn's values in one graph; checked with fullgraph=True on inputs of both signs and mixed signs (notebook 11, section 4b). Stuck? course.hint('11.2')")


def bucket_length(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``n``; past the largest bucket, the next multiple of it."""
    raise NotImplementedError("Exercise 11.3: the bucket a length goes to; checked on lengths at, between and past the buckets (notebook 11, section 4c). Stuck? course.hint('11.3')")


def bucketed(fn, buckets: list[int], dim: int = 1):
    """Wrap ``fn(x)``, row-wise along ``dim``, so it only ever sees lengths from ``buckets``.

    Pads ``x`` with zeros along ``dim`` up to :func:`bucket_length`, calls ``fn`` and slices
    the result back, so a compiled ``fn`` recompiles once per bucket instead of once per length.
    """

    def wrapper(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Exercise 11.3: call fn only on bucket lengths and return what fn(x) would; checked by outputs and the number of compiles (notebook 11, section 4c). Stuck? course.hint('11.3')")

    return wrapper
