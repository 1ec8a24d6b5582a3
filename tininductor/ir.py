"""The loop IR: buffers whose contents are defined by ``inner_fn(index)`` bodies.

Lowering (lowering.py) turns each prim into one of these nodes:

* ``Pointwise(ranges, inner_fn)`` — element ``index`` of the result is ``inner_fn(index)``,
  a function that calls the ``ops`` handler (see virtualized.py). Unrealized pointwise
  nodes are *inlined*: a consumer calls ``make_loader()`` and gets the producer's body, so a
  chain of pointwise ops becomes one expression, one kernel, with no memory traffic.
* ``Reduction(ranges, reduction_ranges, inner_fn, reduction_type)`` — element ``index`` is
  the reduction over ``rindex`` of ``inner_fn(index, rindex)``.
* ``View(base, size, reindex)`` — a view of something not in memory yet: index arithmetic
  on the way into the base's loader (permute, expand, slice, reshape...).
* ``ReinterpretView(buffer, layout)`` — a view of a buffer in memory: new size/strides/offset.
* ``StorageBox`` — the mutable cell lowering passes around. ``realize()`` turns its
  Pointwise/Reduction into a ``ComputedBuffer`` (a named buffer the scheduler will compute),
  after which every reader loads from memory instead of inlining.
* ``ExternKernel`` — a call into torch (mm, bmm, conv, or a fallback for anything we do not
  lower), with the reason logged.

Every node answers ``get_size()``, ``get_dtype()``, ``get_device()`` and ``make_loader()``.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Sequence

import sympy
import torch

from .indexing import contiguous_strides, host_expr, is_static, prod, size_expr, sym, tuple_source
from .virtualized import PlainTextHandler, V, ops


@functools.lru_cache(maxsize=65536)
def _flat_index(offset, size: tuple, stride: tuple, index: tuple) -> sympy.Expr:
    """``offset + sum(index_d * stride_d)`` over the dims of size > 1: cached, as a model's repeated
    layers index the same layouts at the same positions in every kernel."""
    expr = sympy.sympify(offset)  # an int, or an expression over sizes (a view from ``n - 3``)
    for i, n, stride in zip(index, size, stride):
        if n != 1:
            expr = expr + i * stride
    return expr


@dataclasses.dataclass
class Layout:
    """Where a buffer's elements live: ``element[i] = storage[offset + sum(i_d * stride_d)]``.

    Sizes, strides and offset are ints, or sympy expressions over size symbols (dynamic shapes).
    """

    device: torch.device
    dtype: torch.dtype
    size: list[int]
    stride: list[int]
    offset: int = 0

    @classmethod
    def contiguous(cls, device, dtype, size) -> "Layout":
        size = [size_expr(s) for s in size]
        return cls(device, dtype, size, contiguous_strides(size), 0)

    def is_static(self) -> bool:
        return all(is_static(x) for x in [*self.size, *self.stride, self.offset])

    def index(self, index: Sequence[sympy.Expr]) -> sympy.Expr:
        """The flat storage position of ``index`` (a sympy expression)."""
        assert len(index) == len(self.size), (index, self.size)
        return _flat_index(self.offset, tuple(self.size), tuple(self.stride), tuple(index))

    def storage_size(self) -> int:
        """Elements from the tensor's start to its last element (+1); an expression when symbolic."""
        if any(s == 0 for s in self.size):
            return 0
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))

    def __str__(self):
        dt = str(self.dtype).replace("torch.", "")
        off = f", offset={self.offset}" if self.offset else ""
        return f"{dt}{list(self.size)} stride={list(self.stride)}{off} on {self.device}"


class IRNode:
    """Base class: everything lowering produces answers these four questions."""

    def get_size(self) -> list[int]:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def get_device(self) -> torch.device:
        raise NotImplementedError

    def make_loader(self) -> Callable[[Sequence[sympy.Expr]], Any]:
        """A function ``index -> ops value`` reading this node at ``index``."""
        raise NotImplementedError

    def get_numel(self) -> int:
        return prod(self.get_size())

    def realize(self) -> "Buffer | ReinterpretView | None":
        """Make sure this is in memory; return the Buffer/ReinterpretView to read it from, or None."""
        return None


# --------------------------------------------------------------------------- loops


@dataclasses.dataclass
class Loops(IRNode):
    device: torch.device
    dtype: torch.dtype
    inner_fn: Callable
    ranges: list[int]

    def get_size(self):
        return list(self.ranges)

    def get_dtype(self):
        return self.dtype

    def get_device(self):
        return self.device

    def body_str(self) -> str:
        """The body printed with the plain-text handler: what the node computes at (i0, i1, ...)."""
        with V.set_ops_handler(PlainTextHandler()):
            return str(self._call_for_str())


@dataclasses.dataclass
class Pointwise(Loops):
    def make_loader(self):
        return self.inner_fn

    def store_output(self, name: str, indexer: Callable, index, rindex=()):
        return ops.store(name, indexer(index), self.inner_fn(index))

    def _call_for_str(self):
        return self.inner_fn([sym(f"i{d}") for d in range(len(self.ranges))])


@dataclasses.dataclass
class Reduction(Loops):
    reduction_ranges: list[int] = dataclasses.field(default_factory=list)
    reduction_type: str = "sum"
    src_dtype: torch.dtype = torch.float32

    def make_loader(self):
        raise RuntimeError("a Reduction is realized before anything reads it")

    def store_output(self, name: str, indexer: Callable, index, rindex):
        value = ops.reduction(self.dtype, self.src_dtype, self.reduction_type, self.inner_fn(index, rindex))
        return ops.store(name, indexer(index), value)

    def _call_for_str(self):
        index = [sym(f"i{d}") for d in range(len(self.ranges))]
        rindex = [sym(f"r{d}") for d in range(len(self.reduction_ranges))]
        return f"{self.reduction_type}(r={list(self.reduction_ranges)}: {self.inner_fn(index, rindex)})"


# --------------------------------------------------------------------------- buffers


class Buffer(IRNode):
    """A named tensor in memory with a fixed layout."""

    def __init__(self, name: str, layout: Layout):
        self.name = name
        self.layout = layout
        self.origins: list[str] = []  # FX node names this buffer came from (for kernel names/comments)

    def get_size(self):
        return list(self.layout.size)

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device

    def get_name(self) -> str:
        return self.name

    def make_loader(self):
        name, layout = self.name, self.layout
        return lambda index: ops.load(name, layout.index(index))

    def realize(self):
        return self

    def codegen_reference(self) -> str:
        return self.name

    def __repr__(self):
        return f"{type(self).__name__}({self.name}: {self.layout})"


class InputBuffer(Buffer):
    """A graph input (placeholder) or constant; its layout is the real tensor's."""


class ComputedBuffer(Buffer):
    """A realized Pointwise or Reduction: the unit the scheduler fuses into kernels."""

    def __init__(self, name: str, layout: Layout, data: Loops):
        super().__init__(name, layout)
        self.data = data
        #: the order the kernel walks the dims in (None: as they are). Channels-last buffers walk
        #: (N, H, W, C), ``[0, 2, 3, 1]``, so that consecutive elements of a kernel's block are
        #: neighbours in memory (graph.py's layout optimization)
        self.iteration_order: list[int] | None = None

    def get_ranges(self) -> list[int]:
        if self.iteration_order is not None:
            return [self.data.ranges[d] for d in self.iteration_order]
        return list(self.data.ranges)

    def get_reduction_ranges(self) -> list[int]:
        return list(getattr(self.data, "reduction_ranges", []))

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def get_group(self) -> tuple[int, int]:
        """(numel, reduction numel): nodes whose groups agree can share a kernel's loops."""
        return prod(self.get_ranges()), prod(self.get_reduction_ranges())

    def store_body(self, index, rindex=()):
        """Run the body for one element: ``ops.store(self.name, ..., value)`` under the current handler."""
        if self.iteration_order is not None:  # ``index`` walks the dims in iteration order
            logical = [None] * len(index)
            for position, d in enumerate(self.iteration_order):
                logical[d] = index[position]
            index = logical
        return self.data.store_output(self.name, self.layout.index, index, rindex)

    def __repr__(self):
        kind = type(self.data).__name__
        extra = ""
        if isinstance(self.data, Reduction):
            extra = f", {self.data.reduction_type} over {self.data.reduction_ranges}"
        return f"ComputedBuffer({self.name}: {kind}{extra}; {self.layout}; origins={self.origins})\n  {self.data.body_str()}"


class ScatterBuffer(ComputedBuffer):
    """Writes into another buffer at computed places: for every ``index`` in ``data.ranges``,
    ``target[output_indexer(index)] = value`` (``mode=None``) or ``+= value``
    (``mode="atomic_add"``), ``value`` being ``data.inner_fn(index)``.

    index_put, scatter_add and the embedding backward lower to a fresh ``target`` (a copy of the
    input, or zeros) and one of these. It has no memory of its own. The scheduler gives it a
    kernel of its own after the one that makes ``target`` (the adds need every initial value in
    place) and before anything reads ``target`` (they need every add done). Backends turn
    ``atomic_add`` into ``tl.atomic_add`` (Triton) or a serial loop (C++).
    """

    def __init__(self, name: str | None, target: Buffer, data: Pointwise, output_indexer: Callable,
                 mode: str | None = None):
        super().__init__(name, target.layout, data)
        self.target = target
        self.output_indexer = output_indexer
        self.mode = mode

    def get_numel(self) -> int:  # the elements it iterates over (its layout is the target's)
        return prod(self.get_ranges())

    def store_body(self, index, rindex=()):
        where = self.target.layout.index(self.output_indexer(index))
        value = self.data.inner_fn(index)
        if self.mode is None:
            return ops.store(self.target.get_name(), where, value)
        return ops.store(self.target.get_name(), where, value, mode=self.mode)

    def __repr__(self):
        return (f"ScatterBuffer({self.name}: {self.mode or 'store'} into {self.target.get_name()}; "
                f"over {self.data.ranges}; origins={self.origins})\n  {self.data.body_str()}")


#: library kernels, called through their public torch function: the same ATen kernel and schema,
#: without the OpOverload object's Python ``__call__`` (a few microseconds a call on a slow host).
#: Each returns a tensor it allocates itself.
LIBRARY_KERNELS = {"aten::mm": "torch.mm", "aten::bmm": "torch.bmm", "aten::addmm": "torch.addmm",
                   "aten::baddbmm": "torch.baddbmm", "aten::convolution": "torch.convolution"}


class ExternKernel(Buffer):
    """A call into torch: ``name = kernel(*args, **kwargs)``, args being buffers/views or constants.

    ``reason`` says why it is not generated code (extern by design for mm/bmm/conv,
    or a fallback for an op without a lowering). ``header``: the import line that defines
    ``kernel`` in the wrapper module, for a helper that is not in ``torch``
    (``from tininductor.runtime.conv_weights import channels_last_weight``).
    """

    def __init__(self, name, layout, kernel: str, args, kwargs, reason: str, fn=None, header: str | None = None):
        super().__init__(name, layout)
        self.kernel = kernel
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.reason = reason
        self.fn = fn  # the torch callable (OpOverload), so the wrapper can import it by name
        self.header = header

    @property
    def op_name(self) -> str:
        """The op's short name (``mm``, ``cumsum``), for listings of what runs where."""
        return getattr(self.fn, "_opname", None) or getattr(self.fn, "__name__", None) or self.kernel

    def input_names(self) -> list[str]:
        names = []
        for a in itertools.chain(self.args, self.kwargs.values()):
            for leaf in a if isinstance(a, (list, tuple)) else [a]:
                if isinstance(leaf, (Buffer, ReinterpretView)):
                    names.append(leaf.get_name())
        return names

    def __repr__(self):
        return f"ExternKernel({self.name} = {self.kernel}(...); {self.reason})"


class MultiOutput(Buffer):
    """Element ``index`` of a tuple-returning ExternKernel."""

    def __init__(self, name, layout, parent: ExternKernel, index: int):
        super().__init__(name, layout)
        self.parent = parent
        self.index = index


# --------------------------------------------------------------------------- views


class ReinterpretView(IRNode):
    """A buffer in memory read with a different size/stride/offset (no copy)."""

    def __init__(self, data: Buffer, layout: Layout):
        self.data = data
        self.layout = layout

    def get_size(self):
        return list(self.layout.size)

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device

    def get_name(self):
        return self.data.get_name()

    def make_loader(self):
        name, layout = self.data.get_name(), self.layout
        return lambda index: ops.load(name, layout.index(index))

    def realize(self):
        return self

    def codegen_reference(self) -> str:
        lay = self.layout
        return f"reinterpret_tensor({self.get_name()}, {tuple_source(lay.size)}, {tuple_source(lay.stride)}, {host_expr(lay.offset)})"


class View(IRNode):
    """A view of a not-yet-realized node: ``self[index] == base[reindex(index)]``."""

    def __init__(self, base: IRNode, size: Sequence[int], reindex: Callable, layout_fn: Callable | None = None):
        self.base = base
        self.size = [size_expr(s) for s in size]
        self.reindex = reindex
        # the same view as a layout change (Layout -> Layout, or None when strides cannot express it),
        # used once the base is realized
        self.layout_fn = layout_fn

    def get_size(self):
        return list(self.size)

    def get_dtype(self):
        return self.base.get_dtype()

    def get_device(self):
        return self.base.get_device()

    def make_loader(self):
        inner = self.base.make_loader()
        reindex = self.reindex
        return lambda index: inner(reindex(index))

    def unwrap_storage(self) -> "StorageBox | None":
        base = self.base
        while isinstance(base, View):
            base = base.base
        return base if isinstance(base, StorageBox) else None


class StorageBox(IRNode):
    """A mutable cell holding a Pointwise/Reduction until someone needs it in memory."""

    def __init__(self, data: IRNode, origins: Sequence[str] = ()):
        self.data = data
        self.origins = list(origins)

    def get_size(self):
        return self.data.get_size()

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self):
        return self.data.make_loader()

    def is_realized(self) -> bool:
        return isinstance(self.data, Buffer)

    def realize(self, order: list[int] | None = None) -> Buffer:
        """Store the value in a buffer (once), laid out in ``order`` (dims from outermost to
        innermost in memory) if given, else in the graph's preferred order (contiguous by default)."""
        if not isinstance(self.data, Buffer):
            assert isinstance(self.data, Loops), self.data
            if order is None and hasattr(V.graph, "preferred_order"):
                order = V.graph.preferred_order(self.data)
            layout = Layout.contiguous(self.data.get_device(), self.data.get_dtype(),
                                       [self.data.get_size()[d] for d in order or range(len(self.data.get_size()))])
            if order is not None:  # laid out in ``order`` (channels-last), read in the logical order
                stride = [None] * len(order)
                for position, d in enumerate(order):
                    stride[d] = layout.stride[position]
                layout = Layout(layout.device, layout.dtype, self.data.get_size(), stride, 0)
            buf = ComputedBuffer(None, layout, self.data)
            buf.iteration_order = order
            buf.origins = list(self.origins)
            V.graph.register_buffer(buf)
            self.data = buf
        return self.data

    # Realize-on-reuse thresholds: inlining a producer into several consumers recomputes it;
    # that is cheap for a few loads and ops, wasteful (and exponential in chains) for big bodies.
    REUSE_READS_THRESHOLD = 4
    REUSE_OPCOUNT_THRESHOLD = 30

    def mark_reuse(self, users: int) -> None:
        """Called with the FX user count: realize when inlining into every user costs too much."""
        if users <= 1 or not isinstance(self.data, Pointwise):
            return
        reads, opcount = count_body(self.data)
        if reads > self.REUSE_READS_THRESHOLD or opcount > self.REUSE_OPCOUNT_THRESHOLD:
            self.realize()


class _CountingHandler:
    def __init__(self):
        self.reads: set = set()
        self.opcount = 0

    def load(self, name, index):
        self.reads.add((name, index))
        self.opcount += 1
        return "v"

    def indirect_indexing(self, value, size, check=True):
        self.opcount += 1
        return sym("indirect")

    def __getattr__(self, name):
        def op(*args):
            self.opcount += 1
            return "v"

        return op


def count_body(loops: Loops) -> tuple[int, int]:
    """(distinct reads, op count) of a Pointwise body once fully inlined."""
    handler = _CountingHandler()
    with V.set_ops_handler(handler):
        loops.inner_fn([sym(f"i{d}") for d in range(len(loops.ranges))])
    return len(handler.reads), handler.opcount


def realize_input(x: IRNode) -> "Buffer | ReinterpretView":
    """Bring ``x`` into memory for an extern call or graph output (views of buffers stay views)."""
    if isinstance(x, (Buffer, ReinterpretView)):
        return x
    if isinstance(x, StorageBox):
        return x.realize()
    if isinstance(x, View) and x.layout_fn is not None:
        # realize the base in its own shape (so it fuses with its producers), then view it
        base = realize_input(x.base)
        layout = x.layout_fn(base.layout)
        if layout is not None:
            return ReinterpretView(base.data if isinstance(base, ReinterpretView) else base, layout)
    # a View not expressible as strides: copy it into a buffer
    box = StorageBox(Pointwise(x.get_device(), x.get_dtype(), x.make_loader(), x.get_size()))
    return box.realize()
