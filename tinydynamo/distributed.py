"""Distributed training through tinydynamo: DDP and FSDP2 wrappers run natively, the model inside compiles.

**DDP.** ``DistributedDataParallel.forward`` is bookkeeping for the reducer (it prepares the gradient
buckets, broadcasts buffers, then calls the wrapped module); it is not traced. As under TorchDynamo,
whose PEP 523 hook skips DDP's frame and catches the wrapped module's ``forward`` frame, DDP's
forward runs natively and the wrapped module's ``forward`` is compiled as a frame of its own
(:func:`compiled_forward` puts the compiled function in its place for the duration of the call).
Gradients reach DDP as in eager: the compiled backward returns the parameters' gradients to
autograd, whose ``AccumulateGrad`` nodes fire the reducer's hooks.

**The DDP optimizer.** One compiled backward returns *every* gradient when it ends, so DDP could only
start its all-reduces after the whole backward: no overlap of communication with computation.
:class:`DDPOptimizer` (TorchDynamo's name) therefore splits each graph captured inside a DDP
forward at DDP's bucket boundaries: walking the graph backwards (the order in which backward
produces gradients), parameters are packed into buckets of ``bucket_bytes_cap`` bytes (the first,
reduced first, only ``first_bucket_cap``), as DDP's reducer packs them; each bucket's nodes become
one piece (``torch.fx.passes.split_module``), compiled by the chosen backend with its own backward.
When the last piece's backward ends, its bucket is all-reduced while the next piece's backward runs.
``tinydynamo.config.optimize_ddp = False`` turns the split off.

**FSDP2.** A module under ``fully_shard`` all-gathers its parameters in a forward pre-hook and frees
them in a post-hook; backward hooks reduce-scatter the gradients. Those hooks are not traced (as
with ``torch._dynamo.config.skip_fsdp_hooks``): calling such a module is a graph break, the hooks and
their collectives run natively around the module's compiled ``forward`` (one compiled frame per
block class), and the code between the blocks is compiled as resume functions.

Collectives are always ``torch.distributed``'s; this module only decides where the compiled graphs
end.
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch import nn
from torch.fx.passes.split_module import split_module
from torch.nn.parallel import DistributedDataParallel

from tinydynamo import artifacts, config, logs

log = logs.get_logger("ddp_graphs")


# ---- what runs natively ----------------------------------------------------------------------------
def wrapped_module(module: nn.Module) -> nn.Module | None:
    """The module a DDP wrapper runs (``ddp.module``), else None: the wrapper itself runs natively."""
    return module.module if isinstance(module, DistributedDataParallel) else None


def is_fsdp_managed(module: nn.Module) -> bool:
    """A module under FSDP2's ``fully_shard``: its hooks all-gather and free its parameters."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule  # lazy: importable only where torch.distributed is built

    return isinstance(module, FSDPModule)


def native_call_reason(module: nn.Module) -> str | None:
    """Why a call of ``module`` must not be traced (it runs natively at a graph break, its ``forward``
    compiled as its own frame), else None."""
    if is_fsdp_managed(module):
        return (f"{type(module).__name__} is managed by FSDP (fully_shard): its hooks all-gather and "
                "reshard parameters, so the call runs natively and its forward is compiled on its own")
    if wrapped_module(module) is not None:
        return "DistributedDataParallel runs natively; the module it wraps is compiled on its own"
    return None


@contextlib.contextmanager
def compiled_forward(module: nn.Module, forward: Callable) -> Iterator[None]:
    """For the duration of the block, ``module(...)`` runs ``forward`` in place of its own ``forward``
    (hooks and ``Module.__call__``'s work stay native), as if a frame hook had caught the forward."""
    d = module.__dict__
    had, old = "forward" in d, d.get("forward")
    d["forward"] = forward
    try:
        yield
    finally:
        if had:
            d["forward"] = old
        else:
            d.pop("forward", None)


# ---- the DDP optimizer: graph pieces at bucket boundaries ---------------------------------------
def active_ddp_module() -> nn.Module | None:
    """The DDP module whose forward is running (DDP sets it around the wrapped module's call)."""
    if not torch.distributed.is_available():
        return None
    return DistributedDataParallel._get_active_ddp_module()


def default_first_bucket_cap(bucket_bytes_cap: int) -> int:
    """DDP's first bucket (the first to be all-reduced) is small, to start communicating early."""
    first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if torch.distributed.is_available() else bucket_bytes_cap
    return min(first, bucket_bytes_cap)


def ddp_bucket_caps(ddp: nn.Module) -> tuple[int, int]:
    """``(bucket_bytes_cap, first_bucket_cap)`` of a DDP module, as its reducer uses them."""
    cap = int(ddp.bucket_bytes_cap)
    config_ = getattr(ddp, "_bucket_config", None)
    first = getattr(config_, "first_bucket_bytes_cap", None)
    return cap, (default_first_bucket_cap(cap) if first is None else min(int(first), cap))


@dataclasses.dataclass
class Bucket:
    """One piece of the split graph: its nodes and the parameters whose gradients it produces."""

    size: int = 0  # bytes of its parameters
    params: list[str] = dataclasses.field(default_factory=list)
    nodes: list[torch.fx.Node] = dataclasses.field(default_factory=list)


def assign_buckets(sizes: list[int], bucket_bytes_cap: int, first_bucket_cap: int | None = None) -> list[list[int]]:
    """Pack parameters into buckets as DDP's reducer does: ``sizes`` (bytes) in the order their
    gradients become ready (reverse forward order); a bucket closes once it holds ``cap`` bytes
    or more (the first one at ``first_bucket_cap``). Returns the indices of each bucket."""
    first_bucket_cap = bucket_bytes_cap if first_bucket_cap is None else first_bucket_cap
    buckets: list[list[int]] = [[]]
    size = 0
    for i, nbytes in enumerate(sizes):
        cap = first_bucket_cap if len(buckets) == 1 else bucket_bytes_cap
        if buckets[-1] and size >= cap:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


def _param_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class DDPOptimizer:
    """A backend wrapper that splits a graph at DDP's bucket boundaries and compiles each piece
    with ``backend`` (TorchDynamo: ``torch/_dynamo/backends/distributed.py``)."""

    def __init__(self, bucket_bytes_cap: int, backend: Callable, first_bucket_cap: int | None = None):
        self.bucket_bytes_cap = bucket_bytes_cap
        self.first_bucket_cap = default_first_bucket_cap(bucket_bytes_cap) if first_bucket_cap is None \
            else first_bucket_cap
        if self.first_bucket_cap > bucket_bytes_cap:
            raise ValueError(f"first_bucket_cap ({self.first_bucket_cap}) is larger than bucket_bytes_cap "
                             f"({bucket_bytes_cap}): DDP's first bucket is the smaller one")
        self.backend = backend
        self.buckets: list[Bucket] = []  # of the last graph compiled (forward order)
        self.__name__ = f"DDPOptimizer({getattr(backend, '__name__', type(backend).__name__)})"

    def split_points(self, gm: torch.fx.GraphModule, example_inputs: list) -> list[Bucket]:
        """The pieces of ``gm``, in forward order (see :func:`split_buckets`)."""
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        param_bytes = {n.name: _param_bytes(x) for n, x in zip(placeholders, example_inputs)
                       if isinstance(x, nn.Parameter) and x.requires_grad and not getattr(x, "_ddp_ignored", False)}
        return split_buckets(gm, param_bytes, self.bucket_bytes_cap, self.first_bucket_cap)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        if any(isinstance(x, torch.SymInt) for x in example_inputs):
            log.info("DDP optimizer: a graph with symbolic sizes is compiled whole (not split)")
            return self.backend(gm, example_inputs)
        self.buckets = buckets = self.split_points(gm, example_inputs)
        if len(buckets) == 1:
            artifacts.record("ddp_split", "DDP optimizer", describe_split(buckets, self, None))
            return self.backend(gm, example_inputs)
        piece_of = {n: i for i, b in enumerate(buckets) for n in b.nodes}
        split_gm = split_module(gm, None, lambda n: piece_of[n], keep_original_order=True)
        _compile_pieces(split_gm, gm, example_inputs, self.backend)
        artifacts.record("ddp_split", "DDP optimizer", describe_split(buckets, self, split_gm))
        log.info("DDP optimizer: %d pieces\n%s", len(buckets), describe_split(buckets, self, split_gm))
        return split_gm.forward


def split_buckets(gm: torch.fx.GraphModule, param_bytes: dict[str, int], bucket_bytes_cap: int,
                  first_bucket_cap: int) -> list[Bucket]:
    """Where the DDP optimizer splits ``gm`` (parameters as placeholders, named in ``param_bytes``):
    the pieces in forward order. Walking the nodes backwards (the order backward produces
    gradients), a piece is closed once its parameters reach the cap (``first_bucket_cap`` for the
    last piece, reduced first), as DDP closes a bucket. A parameter belongs to the piece of its
    *first* use: its gradient is complete (and DDP's hook fires) when that piece's backward ends.
    A piece is only closed where one of its values leaves it (else it would have no output); a
    preamble without parameters joins the piece after it."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    first_use: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for p in gm.graph.nodes:
        if p.op == "placeholder" and p.name in param_bytes and p.users:
            first_use.setdefault(min(p.users, key=order.__getitem__), []).append(p)
    buckets = [Bucket()]
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        cap = first_bucket_cap if len(buckets) == 1 else bucket_bytes_cap
        if buckets[0].params and buckets[0].size >= cap and _has_external_user(buckets[0]):
            buckets.insert(0, Bucket())
        for p in first_use.get(node, ()):
            buckets[0].size += param_bytes[p.name]
            buckets[0].params.append(p.meta.get("source", p.name))
        buckets[0].nodes.append(node)
    if len(buckets) > 1 and not buckets[0].params:  # a preamble without parameters: joins the next piece
        buckets[1].nodes += buckets.pop(0).nodes
    return buckets


def _has_external_user(bucket: Bucket) -> bool:
    """Some node of the bucket feeds a later piece or the output (else the piece would have no output)."""
    inside = set(bucket.nodes)
    return any(u not in inside for n in bucket.nodes for u in n.users)


class CompiledPiece(nn.Module):
    """A piece of the split graph, compiled: the split graph calls it like the submodule it replaces."""

    def __init__(self, name: str, graph_module: torch.fx.GraphModule, compiled: Callable, single: bool):
        super().__init__()
        self.name = name
        self.graph_module = graph_module  # the piece before compiling (for show/explain)
        self.compiled = compiled
        self.single = single  # the submodule returned one value, the compiled piece a 1-tuple

    def forward(self, *args):
        out = self.compiled(*args)
        return out[0] if self.single else out


def _compile_pieces(split_gm: torch.fx.GraphModule, gm: torch.fx.GraphModule, example_inputs: list,
                    backend: Callable) -> None:
    """Compile each submodule of ``split_gm`` with ``backend``. Example inputs: the graph's own inputs
    where a piece reads them, elsewhere empty tensors shaped like the values traced there."""
    traced = {n.name: n.meta.get("example_value") for n in gm.graph.nodes}
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(example_inputs)
    for node in split_gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "call_module":
            sub = getattr(split_gm, node.target)
            args = [env[a] if isinstance(a, torch.fx.Node) else a for a in node.args]
            outs = [_example_from_meta(n.meta.get("example_value", traced.get(n.name)))
                    if isinstance(n, torch.fx.Node) else n for n in _output_nodes(sub)]
            single = _tuple_output(sub)
            compiled = backend(sub, list(args))
            setattr(split_gm, node.target, CompiledPiece(node.target, sub, compiled, single))
            env[node] = outs[0] if single else tuple(outs)
        elif node.op == "call_function" and node.target is operator.getitem:
            env[node] = env[node.args[0]][node.args[1]]
    split_gm.recompile()


def _output_arg(gm: torch.fx.GraphModule):
    return next(n for n in gm.graph.nodes if n.op == "output").args[0]


def _output_nodes(gm: torch.fx.GraphModule) -> list:
    out = _output_arg(gm)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _tuple_output(sub: torch.fx.GraphModule) -> bool:
    """Backends expect a graph that returns a tuple (as captured frames do): a piece with one output
    returns a 1-tuple, unwrapped again by :class:`CompiledPiece`. True if it had one output."""
    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    single = not isinstance(out_node.args[0], (tuple, list))
    if single:
        out_node.args = ((out_node.args[0],),)
        sub.recompile()
    return single


def _example_from_meta(value: Any) -> Any:
    """A real tensor with the traced value's size, stride, dtype, device and requires_grad."""
    if not isinstance(value, torch.Tensor):
        return value
    t = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    return t.requires_grad_(value.requires_grad) if t.is_floating_point() or t.is_complex() else t


def describe_split(buckets: list[Bucket], opt: DDPOptimizer, split_gm: torch.fx.GraphModule | None) -> str:
    """A readable table of the pieces (forward order) and, if split, the graph that calls them."""
    mb = 1024 * 1024
    lines = [f"DDP optimizer: bucket_bytes_cap={opt.bucket_bytes_cap / mb:g} MiB, "
             f"first_bucket_cap={opt.first_bucket_cap / mb:g} MiB: {len(buckets)} piece(s), "
             "gradients all-reduced last piece first"]
    for i, b in enumerate(buckets):
        names = ", ".join(b.params) if b.params else "-"
        lines.append(f"  piece {i}: {len(b.nodes)} nodes, {b.size / mb:.3f} MiB of parameters: {names}")
    if split_gm is not None:
        lines.append(split_gm.print_readable(print_output=False).split("class submod_0")[0].rstrip())
    return "\n".join(lines)


def backend_for_graph(backend: Callable) -> Callable:
    """What compiles a graph captured now: inside a DDP forward (and with ``config.optimize_ddp``),
    the DDP optimizer around ``backend``; else ``backend``."""
    if not config.optimize_ddp:
        return backend
    ddp = active_ddp_module()
    if ddp is None:
        return backend
    cap, first = ddp_bucket_caps(ddp)
    return DDPOptimizer(cap, backend, first)
