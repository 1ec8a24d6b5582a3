"""The scheduler: decide which realized buffers share a kernel (fusion).

Each ``ComputedBuffer`` iterates over a *group* ``(numel, rnumel)``: pointwise nodes over
``(numel, 1)``, reductions over ``(kept elements, reduced elements)``. A kernel is a
``FusedGroup`` of nodes that can share one set of loops:

* pointwise + pointwise with the same numel (a chain, or siblings);
* a reduction + pointwise nodes whose numel is ``numel * rnumel`` and whose dims split into
  (kept dims, reduced dims) — computed inside the reduction loop (*full* nodes, e.g. the
  normalisation of softmax after its max and sum);
* a reduction + pointwise nodes over just the kept elements (*x-only* nodes, e.g. ``mean``
  as ``sum / n``);
* reductions with the same group (LayerNorm's mean and variance).

Legality: every time a node reads a buffer written in the same kernel, it must read it at
exactly the index the writer wrote (in the kernel's shared ``xindex``/``rindex`` variables),
so the value can be taken from the writer's register instead of racing through memory. The
read/write sets come from running each body with a recording ``ops`` handler.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Iterable

import sympy

from . import config, ir
from .indexing import prod, sym, unflatten
from .virtualized import V

XINDEX = sym("xindex")
RINDEX = sym("rindex")


class ReadWrites:
    """An ops handler that records ``(buffer, index)`` pairs for every load and store."""

    def __init__(self):
        self.reads: list[tuple[str, sympy.Expr]] = []
        self.writes: list[tuple[str, sympy.Expr]] = []
        self.indirect = 0

    def load(self, name, index):
        self.reads.append((name, sympy.expand(index)))
        return "v"

    def store(self, name, index, value, mode=None):
        self.writes.append((name, sympy.expand(index)))
        return "v"

    def indirect_indexing(self, value, size, check=True):
        self.indirect += 1
        return sym(f"indirect{self.indirect}")

    def __getattr__(self, name):
        return lambda *args: "v"


class BodyRecorder(ReadWrites):
    """:class:`ReadWrites` that also records the body's structure: every op in order, its results
    numbered (``v0``, ``v1``, ...), the buffers it loads and stores left out of the ops and listed
    in :attr:`buffers` in order of use. Two bodies with the same structure, run on the same kind of
    loop, with their buffers in the same roles, generate the same kernel (:meth:`FusedGroup.structure`)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []  # (op, its arguments, Python numbers typed: see _typed)
        self.buffers: list[str] = []

    def _record(self, op: str, args: tuple) -> str:
        self.ops.append((op, args))
        return f"v{len(self.ops) - 1}"

    def load(self, name, index):
        super().load(name, index)
        self.buffers.append(name)
        return self._record("load", (self.reads[-1][1],))

    def store(self, name, index, value, mode=None):
        super().store(name, index, value, mode)
        self.buffers.append(name)
        return self._record("store", (self.writes[-1][1], value, mode))

    def indirect_indexing(self, value, size, check=True):
        symbol = super().indirect_indexing(value, size, check)
        self._record("indirect_indexing", (value, size, check, symbol))
        return symbol

    def masked(self, mask, body, other):
        """The body's ops between two markers (a backend may load nothing outside ``mask``)."""
        self._record("masked", (mask,))
        return self._record("end_masked", (body(), _typed(other)))

    def __getattr__(self, name):
        return lambda *args, **kwargs: self._record(name, tuple(map(_typed, args)) + tuple(
            (k, _typed(v)) for k, v in sorted(kwargs.items())))


def _typed(value):
    """``value`` as part of a key: a Python number with its type (``1``, ``1.0`` and ``True`` are
    equal in Python, not as literals in a kernel)."""
    return (type(value), value) if isinstance(value, (bool, int, float)) else value


def split_point(ranges, numel: int, rnumel: int) -> int | None:
    """The k with prod(ranges[:k]) == numel and prod(ranges[k:]) == rnumel, if any."""
    for k in range(len(ranges) + 1):
        if prod(ranges[:k]) == numel and prod(ranges[k:]) == rnumel:
            return k
    return None


def iteration_vars(node: ir.ComputedBuffer, kind: str, numel: int, rnumel: int):
    """(index, rindex) of ``node`` in a kernel over ``(numel, rnumel)``, in xindex/rindex."""
    ranges = node.get_ranges()
    if kind == "reduction":
        return unflatten(XINDEX, ranges), unflatten(RINDEX, node.get_reduction_ranges())
    if kind == "full":
        k = split_point(ranges, numel, rnumel)
        return unflatten(XINDEX, ranges[:k]) + unflatten(RINDEX, ranges[k:]), []
    return unflatten(XINDEX, ranges), []  # pointwise, xonly


def _new_read_writes() -> ReadWrites:
    return (FUSION_RULES["read_writes_handler"] or BodyRecorder)()


def read_writes(node: ir.ComputedBuffer, kind: str, numel: int, rnumel: int) -> ReadWrites:
    """What ``node``'s body loads and stores, each with its index, run as ``kind`` in a kernel over
    ``(numel, rnumel)``. Kept on the node: a node's body and the layouts it reads are fixed once
    lowered, and fusion asks again for every node of a group at each node it tries to add
    (read-only: callers must not change the record)."""
    key = (kind, numel, rnumel, FUSION_RULES["read_writes_handler"])
    known = node.__dict__.setdefault("_read_writes", {})
    if key not in known:
        rw = _new_read_writes()
        index, rindex = iteration_vars(node, kind, numel, rnumel)
        with V.set_ops_handler(rw):
            node.store_body(index, rindex)
        known[key] = rw
    return known[key]


@dataclasses.dataclass
class FusedGroup:
    """One generated kernel: ``nodes`` in program order over ``(numel, rnumel)``.

    PyTorch's inductor calls this a ``FusedSchedulerNode`` (torch/_inductor/scheduler.py).
    """

    device: object
    numel: int
    rnumel: int
    is_reduction: bool
    nodes: list[ir.ComputedBuffer]
    internal: set[str] = dataclasses.field(default_factory=set)  # buffers never written to memory

    def kind(self, node: ir.ComputedBuffer) -> str | None:
        """How ``node`` runs in this kernel, or None if its sizes do not fit."""
        if node.is_reduction():
            ok = self.is_reduction and node.get_group() == (self.numel, self.rnumel)
            return "reduction" if ok else None
        n = node.get_numel()
        if not self.is_reduction:
            return "pointwise" if n == self.numel else None
        if n == self.numel * self.rnumel and split_point(node.get_ranges(), self.numel, self.rnumel) is not None:
            return "full"
        if n == self.numel:
            return "xonly"
        return None

    def names(self) -> set[str]:
        return {n.get_name() for n in self.nodes}

    @functools.cached_property
    def reduction_hint(self) -> str:
        """``"outer"`` when the kept elements sit next to each other in memory and the reduced ones
        are strided (a column sum, like a bias gradient), else ``"inner"`` (a row sum).

        A kernel must read whole cache lines: for an outer reduction that means walking many
        columns side by side, not one column per program. (TorchInductor: ``ReductionHint``.)
        Decided by the loads' strides at the origin: d index / d rindex and d index / d xindex.
        """
        inner = outer = 0
        sizes = set(getattr(V.graph, "size_sources", ()))  # size symbols (dynamic shapes) are not indirect
        for node in self.nodes:
            if self.kind(node) not in ("reduction", "full"):
                continue
            for _, index in self.read_writes(node).reads:
                if index.free_symbols - {XINDEX, RINDEX} - sizes:
                    continue  # an indirect (gathered) load: no fixed stride
                # xreplace: a plain rebuild with the values put in (subs's general matching is
                # ten times slower, and here every key is a symbol)
                base = index.xreplace({XINDEX: 0, RINDEX: 0})
                r_stride = index.xreplace({XINDEX: 0, RINDEX: 1}) - base
                x_stride = index.xreplace({XINDEX: 1, RINDEX: 0}) - base
                inner += r_stride == 1
                outer += x_stride == 1 and r_stride != 1
        return "outer" if outer > inner else "inner"

    def read_writes(self, node) -> ReadWrites:
        return read_writes(node, self.kind(node), self.numel, self.rnumel)

    def structure(self) -> tuple[tuple, list[str]] | None:
        """``(key, the buffers it loads and stores in order of first use)``; None when a swapped-in
        read/write handler records no structure.

        A kernel is a function of what the key holds: the loops, each node's kind, ranges and
        body (its ops, loads and stores with their indices, as :class:`BodyRecorder` records them),
        which buffer plays which role, their dtypes, and which stay in registers. Groups with equal
        keys (the same block of a model's repeated layers) generate the same kernel, apart from
        the buffers it is called with: the wrapper generates it once (codegen/wrapper.py).
        """
        roles: dict[str, int] = {}
        nodes = []
        for node in self.nodes:
            kind = self.kind(node)
            rw = self.read_writes(node)
            if not isinstance(rw, BodyRecorder):
                return None
            nodes.append((kind, tuple(node.get_ranges()), tuple(node.get_reduction_ranges()), tuple(rw.ops),
                          tuple(roles.setdefault(name, len(roles)) for name in rw.buffers)))
        names = list(roles)
        dtypes = tuple(V.graph.get_buffer(name).get_dtype() for name in names)
        internal = tuple(sorted(roles[name] for name in self.internal if name in roles))
        return (self.device, self.numel, self.rnumel, self.is_reduction, tuple(nodes), dtypes, internal), names

    def loop_phases(self) -> list[tuple[str, list[ir.ComputedBuffer]]]:
        """The steps of a reduction kernel's body, shared by every backend.

        ``("loop", nodes)`` runs over the reduction dim; ``("outer", [node])`` is an x-only node
        computed once per row. A node starts a new loop when it reads a reduction finished in the
        current one (softmax: max, then sum of exp(x - max), then the normalised store).
        """
        phases: list[tuple[str, list[ir.ComputedBuffer]]] = []
        current: list[ir.ComputedBuffer] | None = None
        reduced_here: set[str] = set()
        for node in self.nodes:
            if self.kind(node) == "xonly":
                phases.append(("outer", [node]))
                current = None
                continue
            reads = {name for name, _ in self.read_writes(node).reads}
            if current is None or reads & reduced_here:
                current, reduced_here = [], set()
                phases.append(("loop", current))
            current.append(node)
            if node.is_reduction():
                reduced_here.add(node.get_name())
        return phases

    def __str__(self):
        shape = f"numel={self.numel}, rnumel={self.rnumel}" if self.is_reduction else f"numel={self.numel}"
        body = "\n".join(f"    {self.kind(n):9s} {n.get_name()}  (from {', '.join(n.origins)})" for n in self.nodes)
        return f"FusedGroup({shape}, internal={sorted(self.internal)})\n{body}"


@dataclasses.dataclass
class ExternNode:
    """A call into torch (extern kernel, fallback, or one output of a multi-output call)."""

    node: ir.Buffer

    def names(self) -> set[str]:
        return {self.node.get_name()}

    def __str__(self):
        return f"ExternNode({self.node.get_name()}: {getattr(self.node, 'kernel', 'getitem')})"


def _reads(node: ir.Buffer) -> set[str]:
    if isinstance(node, ir.ScatterBuffer):  # it updates its target in place: a read and a write
        return {node.target.get_name()} | _body_reads(node)
    if isinstance(node, ir.ExternKernel):
        return set(node.input_names())
    if isinstance(node, ir.MultiOutput):
        return {node.parent.get_name()}
    return _body_reads(node)


def _body_reads(node: ir.ComputedBuffer) -> set[str]:
    rw = _new_read_writes()
    index = [sym(f"i{d}") for d in range(len(node.get_ranges()))]
    rindex = [sym(f"r{d}") for d in range(len(node.get_reduction_ranges()))]
    with V.set_ops_handler(rw):
        node.store_body(index, rindex)
    return {name for name, _ in rw.reads}


def _group_for(node: ir.ComputedBuffer) -> FusedGroup:
    numel, rnumel = node.get_group()
    return FusedGroup(node.get_device(), numel, rnumel if node.is_reduction() else 1, node.is_reduction(), [node])


def fusion_candidate(group: FusedGroup, node: ir.ComputedBuffer) -> FusedGroup | None:
    """The kernel ``group`` becomes with ``node`` appended (a pointwise kernel that meets a reduction
    over the same elements becomes a reduction kernel: its pointwise nodes then run as ``full`` nodes
    inside the reduction loop); None when devices or sizes disagree, or a scatter is involved."""
    if group.device != node.get_device():
        return None
    if isinstance(node, ir.ScatterBuffer) or any(isinstance(n, ir.ScatterBuffer) for n in group.nodes):
        return None  # a scatter needs its target complete before it, and is complete only after it
    if node.is_reduction() and not group.is_reduction:
        numel, rnumel = node.get_group()
        if numel * rnumel != group.numel:
            return None
        return FusedGroup(group.device, numel, rnumel, True, group.nodes + [node])
    return FusedGroup(group.device, group.numel, group.rnumel, group.is_reduction, group.nodes + [node])


def fusion_is_legal(candidate: FusedGroup) -> bool:
    """May ``candidate`` run as one set of loops? Every node fits the kernel's loops (it has a kind),
    and a read of a buffer written in the kernel hits exactly the index written (else it would read
    another program's element, which may not be stored yet)."""
    if any(candidate.kind(n) is None for n in candidate.nodes):
        return False
    written: dict[str, set] = {}
    reads: list[tuple[str, sympy.Expr]] = []
    for n in candidate.nodes:
        rw = candidate.read_writes(n)
        for name, index in rw.writes:
            written.setdefault(name, set()).add(index)
        reads.extend(rw.reads)
    return all(written[name] == {index} for name, index in reads if name in written)


#: the scheduler's swappable rules (chapter 7 swaps a learner's in: ``with swap(FUSION_RULES, ...)``):
#: the fusion legality check, and the ops handler that records a body's reads and writes
FUSION_RULES: dict = {"is_legal": fusion_is_legal, "read_writes_handler": None}


def try_fuse(group: FusedGroup, node: ir.ComputedBuffer) -> FusedGroup | None:
    """``group`` with ``node`` appended, or None when sizes disagree or a read would race."""
    candidate = fusion_candidate(group, node)
    return candidate if candidate is not None and FUSION_RULES["is_legal"](candidate) else None


class Scheduler:
    """Turns GraphLowering's buffers into an ordered list of FusedGroup / ExternNode."""

    def __init__(self, buffers: Iterable[ir.Buffer], output_names: set[str]):
        self.output_names = output_names
        self.nodes: list = []
        producer: dict[str, int] = {}  # buffer name -> index into self.nodes
        self.reads: dict[str, set[str]] = {}
        self._readers: dict[str, set[int]] = {}  # buffer name -> the kernels that read it
        for buf in buffers:
            reads = _reads(buf)
            self.reads[buf.get_name()] = reads
            deps = [producer[r] for r in reads if r in producer]
            last_dep = max(deps, default=-1)
            placed = None
            if isinstance(buf, ir.ComputedBuffer):
                placed = self._place(buf, last_dep)
            if placed is None:
                self.nodes.append(_group_for(buf) if isinstance(buf, ir.ComputedBuffer) else ExternNode(buf))
                placed = len(self.nodes) - 1
            producer[buf.get_name()] = placed
            if isinstance(buf, ir.ScatterBuffer):  # readers of the target wait for the scatter
                producer[buf.target.get_name()] = placed
            if isinstance(self.nodes[placed], FusedGroup):
                for r in reads:
                    self._readers.setdefault(r, set()).add(placed)
        self._mark_internal()

    def _place(self, buf: ir.ComputedBuffer, last_dep: int) -> int | None:
        """The kernel ``buf`` joins, if any, in this order of preference:

        1. its producer's kernel (the value stays in registers);
        2. a kernel after every producer that reads the same buffers, the one sharing the most
           first (one load serves both; TorchInductor's ``score_fusion_memory``). A value the
           backward needs is computed inside a layer norm's kernel and stored a second time as a
           graph output: it goes back into that kernel, not into an unrelated one;
        3. the latest kernel after every producer (fewer launches).

        A kernel takes at most ``config.max_fusion_size`` nodes: one with hundreds of loads and
        stores gains nothing more at run time, and compiles for seconds.
        """
        shared: collections.Counter = collections.Counter()
        for r in self.reads[buf.get_name()]:
            shared.update(i for i in self._readers.get(r, ()) if i > last_dep)
        order = [last_dep] if last_dep >= 0 else []
        order += sorted(shared, key=lambda i: (-shared[i], -i))
        order += range(len(self.nodes) - 1, max(last_dep, -1), -1)
        for i in dict.fromkeys(order):
            group = self.nodes[i]
            if isinstance(group, FusedGroup) and len(group.nodes) < config.max_fusion_size:
                fused = try_fuse(group, buf)
                if fused is not None:
                    self.nodes[i] = fused
                    return i
        return None

    def _mark_internal(self) -> None:
        """Buffers read only inside their own kernel (and not outputs) need no memory."""
        readers: dict[str, set[int]] = {}
        for i, node in enumerate(self.nodes):
            members = node.nodes if isinstance(node, FusedGroup) else [node.node]
            for m in members:
                for r in self.reads[m.get_name()]:
                    readers.setdefault(r, set()).add(i)
        for i, node in enumerate(self.nodes):
            if isinstance(node, FusedGroup):
                node.internal = {
                    n.get_name() for n in node.nodes
                    if n.get_name() not in self.output_names and readers.get(n.get_name(), set()) <= {i}
                }

    def __str__(self):
        return "\n".join(str(n) for n in self.nodes)
