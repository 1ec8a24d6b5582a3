"""Chapter 7: the loop IR, the ops handler and fusion decisions.

Four pieces of tininductor's middle end, each plugged into the real pipeline by the course's
helpers in ``course/chapters/ch07_loop_ir.py`` (the graded tests and the notebook use them):

* Exercise 7.1 ``lower_silu``: a lowering, ``aten.silu`` -> a ``Pointwise`` node whose
  ``inner_fn(index)`` is written with ``ops``;
* Exercise 7.2 ``permute_reindex`` / ``expand_reindex``: views as index arithmetic
  (a view reads its base at ``reindex(index)``, no data moves);
* Exercise 7.3 ``fusion_is_legal``: may a candidate kernel share one set of loops?
* Exercise 7.4 ``ReadWritesHandler``: an ops handler that records which buffers a body
  loads and stores, and where (the scheduler's dependency information).
"""
from __future__ import annotations

from typing import Callable, Sequence

import sympy
import torch

from tininductor import ir, scheduler
from tininductor.virtualized import ops

# --------------------------------------------------------------------------- Exercise 7.1


def lower_silu(x: ir.IRNode) -> ir.StorageBox:
    """The lowering of ``aten.silu``: ``silu(x) = x * sigmoid(x)``, elementwise.

    ``x`` is an IR node (``x.make_loader()`` gives ``index -> value``; ``x.get_size()``,
    ``x.get_dtype()``, ``x.get_device()``). Return ``ir.StorageBox(ir.Pointwise(device,
    dtype, inner_fn, ranges))`` whose ``inner_fn(index)`` loads ``x`` at ``index`` and
    combines it with ``ops.sigmoid`` and ``ops.mul``. Like eager, compute float16/bfloat16
    in float32 (``ops.to_dtype``) and cast the result back to the input dtype.
    """
    # BEGIN SOLUTION (Exercise 7.1: the lowering of aten.silu, half inputs computed like eager; checked as one fused kernel against eager in three dtypes (notebook 07, Exercise 7.1))
    load = x.make_loader()
    dtype = x.get_dtype()
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

    def inner_fn(index):
        value = load(index)
        if compute != dtype:
            value = ops.to_dtype(value, compute)
        result = ops.mul(value, ops.sigmoid(value))
        if compute != dtype:
            result = ops.to_dtype(result, dtype)
        return result

    return ir.StorageBox(ir.Pointwise(x.get_device(), dtype, inner_fn, x.get_size()))
    # END SOLUTION


# --------------------------------------------------------------------------- Exercise 7.2


def permute_reindex(dims: Sequence[int]) -> Callable[[list], list]:
    """Index arithmetic of ``x.permute(dims)``.

    Output dimension ``i`` is input dimension ``dims[i]``. Return a function that takes an
    index into the *output* (a list of sympy expressions, one per output dim) and returns
    the index into the *input*. Example: ``dims=(1, 0)``: ``[i0, i1] -> [i1, i0]``;
    ``dims=(2, 0, 1)``: ``[a, b, c] -> [b, c, a]``.
    """
    # BEGIN SOLUTION (Exercise 7.2: the index arithmetic of permute; checked on symbols and in compiled kernels (notebook 07, Exercise 7.2))
    dims = list(dims)

    def reindex(index):
        out = [None] * len(dims)
        for i, d in enumerate(dims):
            out[d] = index[i]
        return out

    return reindex
    # END SOLUTION


def expand_reindex(old_size: Sequence[int], new_size: Sequence[int]) -> Callable[[list], list]:
    """Index arithmetic of broadcasting / ``x.expand(new_size)``.

    ``new_size`` may have more (leading) dimensions than ``old_size``; a size-1 input
    dimension that grows is read at index 0 (``sympy.Integer(0)``). Return a function from an
    output index (``len(new_size)`` expressions) to an input index (``len(old_size)``).
    Example: old ``[3, 1]``, new ``[2, 3, 4]``: ``[a, b, c] -> [b, 0]``.
    """
    # BEGIN SOLUTION (Exercise 7.2: the index arithmetic of expand/broadcasting; checked on symbols and in compiled kernels (notebook 07, Exercise 7.2))
    old, new = list(old_size), list(new_size)
    skip = len(new) - len(old)

    def reindex(index):
        return [sympy.Integer(0) if old[i] == 1 and new[skip + i] != 1 else index[skip + i] for i in range(len(old))]

    return reindex
    # END SOLUTION


# --------------------------------------------------------------------------- Exercise 7.3


def fusion_is_legal(candidate: scheduler.FusedGroup) -> bool:
    """May ``candidate`` (a kernel: ``candidate.nodes`` in program order) run as one set of loops?

    Two rules:

    1. every node fits the kernel's loops: ``candidate.kind(node)`` is not None (it is
       ``"pointwise"``, ``"reduction"``, ``"full"`` or ``"xonly"``);
    2. a node that reads a buffer written *in this kernel* reads it exactly where it was
       written: ``candidate.read_writes(node)`` gives ``.reads`` and ``.writes``, lists of
       ``(buffer_name, index)`` in the kernel's shared ``xindex``/``rindex`` variables. Any
       other index (a transpose, a shifted or broadcast read, a reduction result read
       before the loop that makes it has finished...) would read another program's
       element, which may not be stored yet.
    """
    # BEGIN SOLUTION (Exercise 7.3: decide whether a candidate kernel may run as one set of loops; checked by kernel counts against the package and on illegal candidates (notebook 07, Exercise 7.3))
    if any(candidate.kind(n) is None for n in candidate.nodes):
        return False
    written: dict[str, set] = {}
    reads = []
    for node in candidate.nodes:
        rw = candidate.read_writes(node)
        for name, index in rw.writes:
            written.setdefault(name, set()).add(index)
        reads.extend(rw.reads)
    return all(written[name] == {index} for name, index in reads if name in written)
    # END SOLUTION


# --------------------------------------------------------------------------- Exercise 7.4


class ReadWritesHandler:
    """An ops handler that records every ``load`` and ``store`` of a body.

    ``reads`` and ``writes`` are lists of ``(buffer_name, index)`` where ``index`` is the
    flat sympy index, normalised with ``sympy.expand`` (so equal indices compare equal).
    Every other op (``add``, ``reduction``, ``constant``...) just returns a placeholder
    value: only memory matters here.
    """

    def __init__(self):
        self.reads: list[tuple[str, sympy.Expr]] = []
        self.writes: list[tuple[str, sympy.Expr]] = []

    def load(self, name, index):
        # BEGIN SOLUTION (Exercise 7.4: record every load as the scheduler needs it; checked against the package's ReadWrites and by scheduling with it (notebook 07, Exercise 7.4))
        self.reads.append((name, sympy.expand(index)))
        return "v"
        # END SOLUTION

    def store(self, name, index, value):
        # BEGIN SOLUTION (Exercise 7.4: record every store as the scheduler needs it; checked against the package's ReadWrites and by scheduling with it (notebook 07, Exercise 7.4))
        self.writes.append((name, sympy.expand(index)))
        return None
        # END SOLUTION

    def __getattr__(self, name):
        return lambda *args: "v"

