"""Chapter 0, "Why compile?": instruments that measure what eager PyTorch costs.

Four small tools, each one a real measuring device used in the notebook:

* :func:`count_aten_ops` (Exercise 0.1) counts the ATen operators an eager function
  dispatches: in eager mode each one is a separate trip through the dispatcher and a
  separate kernel.
* :func:`intermediate_bytes` (Exercise 0.2) adds up the bytes of the temporary tensors a
  function allocates and throws away: the memory traffic a fusing compiler can save.
* :func:`benchmark` (Exercise 0.3) times a callable the way a compiler benchmark must: the
  first call (which compiles) reported apart, warmup, device synchronisation, the median.
* :class:`GraphRecorder` (Exercise 0.4) is a ``torch.compile`` backend that keeps every FX
  graph TorchDynamo hands it, so you can see how a function was cut into graphs.
"""
from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from typing import Any, Callable

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


# --------------------------------------------------------------------------------------
# Exercise 0.1: count the ATen ops an eager function dispatches
# --------------------------------------------------------------------------------------
class OpCounter(TorchDispatchMode):
    """A dispatch mode that counts every ATen operator call made while it is active.

    A ``TorchDispatchMode`` sees each call *after* autograd and composite operators have
    been unfolded, i.e. the ATen ops that actually run kernels. ``counts`` maps the
    overload's name (``"aten.add.Tensor"``) to how many times it ran.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """Record ``func`` (an ``OpOverload`` such as ``aten.sin.default``), then run it."""
        kwargs = kwargs or {}
        # BEGIN SOLUTION (Exercise 0.1: count each ATen overload under its full name (aten.sin.default) and still run it; checked against make_fx's trace of the same functions (notebook 00, section 3))
        self.counts[str(func)] += 1
        return func(*args, **kwargs)
        # END SOLUTION


def count_aten_ops(fn: Callable, *args, **kwargs) -> collections.Counter[str]:
    """Run ``fn(*args, **kwargs)`` eagerly and return a Counter of the ATen ops it dispatched."""
    with OpCounter() as counter:
        fn(*args, **kwargs)
    return counter.counts


# --------------------------------------------------------------------------------------
# Exercise 0.2: the bytes of intermediate tensors (what fusion would save)
# --------------------------------------------------------------------------------------
class AllocationTracker(TorchDispatchMode):
    """Remembers every tensor an op returns, keeping it alive (so no address is reused)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.outputs.extend(t for t in tree_leaves(result) if isinstance(t, torch.Tensor))
        return result


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    """Identifies the memory a tensor lives in: views and in-place results share it."""
    return (str(t.device), t.untyped_storage().data_ptr())


def intermediate_bytes(fn: Callable, *args, **kwargs) -> int:
    """Bytes of the fresh tensors ``fn`` allocates that are neither inputs nor returned.

    Each such tensor is written once by one kernel and read back by another: a compiler
    that fuses those kernels keeps the values in registers and never allocates it. Views
    (``t()``, ``view``, ``expand``) and in-place ops (``mul_``) allocate nothing new, so a
    storage is counted once, the first time an op returns it, and only if no input and no
    returned tensor lives in it.
    """
    with AllocationTracker() as tracker:
        result = fn(*args, **kwargs)
    inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    returned = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
    # BEGIN SOLUTION (Exercise 0.2: the bytes of the memory fn allocates and throws away (each storage once; inputs and returned tensors are not intermediates); checked on chains, views, in-place ops and tuple outputs (notebook 00, section 4))
    skip = {_storage_key(t) for t in inputs + returned}
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tracker.outputs:
        key = _storage_key(t)
        if key in skip or key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total
    # END SOLUTION


# --------------------------------------------------------------------------------------
# Exercise 0.3: a correct benchmark helper
# --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Timing:
    """What :func:`benchmark` measured, in seconds."""

    first_call_s: float  # the first call alone: for torch.compile this includes compiling
    median_s: float  # median of the timed calls (robust to the odd slow one)
    times_s: list[float]  # every timed call, in order

    def __str__(self) -> str:
        return f"median {self.median_s * 1e3:.3f} ms over {len(self.times_s)} calls (first call {self.first_call_s * 1e3:.1f} ms)"


def default_synchronize(*args) -> Callable[[], None]:
    """``torch.cuda.synchronize`` if any argument is a CUDA tensor, else a no-op.

    GPU kernels run asynchronously: a call returns as soon as its kernels are queued, so a
    clock read without synchronising first measures how fast Python queues work.
    """
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tree_leaves(args)):
        return torch.cuda.synchronize
    return lambda: None


def benchmark(
    fn: Callable,
    *args,
    warmup: int = 3,
    repeat: int = 10,
    clock: Callable[[], float] = time.perf_counter,
    synchronize: Callable[[], None] | None = None,
) -> Timing:
    """Time ``fn(*args)``: the first call apart, then ``warmup`` untimed calls, then ``repeat`` timed ones.

    Every clock read is preceded by ``synchronize()`` so queued device work is finished (and
    counted in the call that queued it). ``clock`` and ``synchronize`` are injectable so a
    test can drive the helper with a fake device.
    """
    if repeat < 1 or warmup < 0:
        raise ValueError(f"benchmark needs repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    sync = synchronize if synchronize is not None else default_synchronize(*args)
    # BEGIN SOLUTION (Exercise 0.3: time the first call apart, then warm up, then time each call so that queued device work is counted where it was queued; checked with a fake clock and device queue (notebook 00, sections 2 and 7))
    sync()
    start = clock()
    fn(*args)
    sync()
    first = clock() - start
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeat):
        sync()
        start = clock()
        fn(*args)
        sync()
        times.append(clock() - start)
    return Timing(first_call_s=first, median_s=statistics.median(times), times_s=times)
    # END SOLUTION


# --------------------------------------------------------------------------------------
# Exercise 0.4: a torch.compile backend that records the graphs it receives
# --------------------------------------------------------------------------------------
class GraphRecorder:
    """A ``torch.compile`` backend that keeps each FX graph and runs it unchanged.

    The backend contract: TorchDynamo calls ``backend(gm, example_inputs)`` once per
    captured graph (a function with graph breaks yields several) and runs whatever callable
    the backend returns in place of that piece of the function.
    """

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list[Any]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        # BEGIN SOLUTION (Exercise 0.4: keep each graph and its example inputs, and give Dynamo something to run; checked against torch._dynamo.explain on functions with 0, 1 and 2 breaks (notebook 00, section 6.1))
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        return gm.forward
        # END SOLUTION

    @property
    def ops_per_graph(self) -> list[list[Any]]:
        """The ``call_function`` / ``call_method`` / ``call_module`` targets of each graph, in order."""
        kinds = ("call_function", "call_method", "call_module")
        return [[node.target for node in gm.graph.nodes if node.op in kinds] for gm in self.graphs]
