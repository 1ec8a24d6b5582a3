"""Input mutation and output aliasing, the functionalization way (AOTAutograd's runtime wrappers).

The graphs AOT autograd compiles are *functional*: ``decompose`` functionalizes ``x.add_(1)``
into ``x1 = add(x, 1)`` plus a final ``copy_(x, x1)``. Eager semantics are then rebuilt
around the compiled call:

* **input mutations**: :func:`strip_input_mutations` removes the trailing ``copy_(input, new)``
  nodes and makes each ``new`` an extra graph output; :func:`write_back` copies it into the
  caller's tensor after the call, exactly once (``copy_`` bumps its version counter, and under
  grad mode records the op, so autograd sees the mutation as eager does);
* **output aliasing**: :func:`analyze` runs the *original* graph once on fake tensors and
  notes which outputs are an input (``return x.add_(1)``), a view of an input, or a view of
  another output; :func:`regenerate_aliases` returns those as the input itself or as views
  (``as_strided``) of the right base, so identity and storage sharing match eager;
* what functionalization cannot reproduce falls back to running the captured graph as it is
  (eager semantics, eager errors), with the reason logged: an in-place op whose source
  partially overlaps its destination (eager raises), an in-place op that changes an input's
  shape or strides, two outputs requiring grad that share elements of an intermediate no output
  owns (eager tracks a write into one through their common base), an output requiring grad that
  views one that does not (``y.detach()`` returned beside ``y[0]``), a write through an alias that
  does not require grad into memory that does (``x.detach().zero_()``: autograd does not see it),
  and, at run time, a mutated input that shares memory with another input (the same tensor passed
  twice, two overlapping views of one base).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import sympy
import torch
import torch.fx as fx
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from .indexing import host_expr, size_expr

log = logging.getLogger("tininductor.aliasing")


@dataclasses.dataclass(frozen=True)
class OutputAlias:
    """How to rebuild one user output: ``kind`` is "input" (the input itself), "input_view"
    (a view of input ``index``) or "output_view" (a view of output ``index``)."""

    kind: str
    index: int
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0
    requires_grad: bool = True  # False: eager's output is cut from autograd (``x.detach()``)
    #: dynamic shapes: ``inputs -> (size, stride, offset)`` at this call's sizes (see symbolic_views)
    at_sizes: Any = None
    #: a view of another dtype than its base (``x.view(torch.int32)``): the base is reinterpreted first
    dtype: Any = None
    #: "output_view" of a dense base that is not contiguous (``y = x.t().sin()``): the strides the base
    #: must have for the view's strides to mean the same elements (None: a contiguous base)
    base_stride: tuple[int, ...] | None = None


@dataclasses.dataclass
class AliasInfo:
    """What the fake run of the original graph found."""

    outputs: list[OutputAlias | None]  # per flat user output
    unsupported: str | None = None  # why only the eager graph reproduces eager here
    grad_mutated: set[int] = dataclasses.field(default_factory=set)  # inputs mutated with grad mode on
    # inputs / outputs that eager's autograd saves for backward: their version counters are
    # checked at backward (an in-place change after the forward raises, as in eager), even where
    # the compiled backward recomputes instead of saving them
    saved_inputs: list[int] = dataclasses.field(default_factory=list)
    saved_outputs: list[int] = dataclasses.field(default_factory=list)
    # inputs the graph writes in place AND eager saves: (input, the versions it was saved at, its
    # version at the end), both counted from the call's entry. Eager's backward raises unless the
    # input's version is then the saved one: saved before the write, or changed again after the call
    saved_mutated_inputs: list[tuple[int, tuple[int, ...], int]] = dataclasses.field(default_factory=list)


def _storage(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def _dense(t: torch.Tensor) -> bool:
    check = getattr(torch._prims_common, "is_non_overlapping_and_dense_or_false", None)
    return bool(check(t)) if check is not None else t.is_contiguous()


def partial_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True where eager's ``assert_no_partial_overlap`` raises: dense tensors of one storage whose
    memory ranges intersect without being the same range."""
    if a is b or _storage(a) != _storage(b) or not (_dense(a) and _dense(b)):
        return False
    a0, b0 = a.storage_offset(), b.storage_offset()
    a1, b1 = a0 + a.numel(), b0 + b.numel()
    return (a0, a1) != (b0, b1) and a0 < b1 and b0 < a1


def share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do two views of one storage read a common element? Exact for any strides: the elements of
    ``a`` are marked in a mask of the storage and looked up through ``b``'s view. Sizes not known
    (symbolic) or element types that differ count as sharing."""
    views = [(t.shape, t.stride(), t.storage_offset()) for t in (a, b)]
    nbytes = a.untyped_storage().nbytes()
    if a.dtype != b.dtype or not all(type(d) is int for v in views for d in (*v[0], *v[1], v[2])) \
            or not isinstance(nbytes, int):
        return True  # (int() of a symbolic size would specialize it: a guard the graph does not need)
    mask = torch.zeros(nbytes // a.element_size(), dtype=torch.bool)
    mask.as_strided(*views[0]).fill_(True)
    return bool(mask.as_strided(*views[1]).any())


def _overlapping_intermediate_views(flat: list, outputs: list, inputs: dict) -> str | None:
    """Two outputs that require grad, view one intermediate no output or input owns, and share
    elements: writing into one changes the other, which autograd tracks only through a base that
    eager has and the compiled call does not return. Such a graph runs as captured."""
    groups: dict[StorageWeakRef, list[int]] = {}
    for j, (o, a) in enumerate(zip(flat, outputs)):
        if a is None and isinstance(o, torch.Tensor) and o.requires_grad and o._is_view() and _storage(o) not in inputs:
            groups.setdefault(_storage(o), []).append(j)
    for js in groups.values():
        for k, i in enumerate(js):
            for j in js[k + 1:]:
                if share_elements(flat[i], flat[j]):
                    return (f"outputs {i} and {j} are overlapping views of an intermediate the graph does not "
                            "return (a write into one must show in the other's gradient)")
    return None


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place, by its schema's ``(a!)`` annotations: ``self`` of
    ``add_``, but also ``running_mean``/``running_var`` of batch norm and ``out=``."""
    if not func._schema.is_mutable:
        return []
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if isinstance(value, torch.Tensor):
                written.append(value)
    return written


class _InPlaceChecker(TorchDispatchMode):
    """Sees every ATen op of the fake run; records an in-place op that eager would refuse."""

    def __init__(self, training: bool):
        super().__init__()
        self.training = training  # grad mode was on when the graph was entered
        self.problem: str | None = None
        self.mutated: set[StorageWeakRef] = set()  # storages written in place
        self.mutated_with_grad: set[StorageWeakRef] = set()  # ... while grad mode was on
        self.grad_storages: set[StorageWeakRef] = set()  # memory of tensors that require grad, seen so far

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.training:
            self.grad_storages.update(_storage(a) for a in torch.utils._pytree.tree_leaves((args, kwargs))
                                      if isinstance(a, torch.Tensor) and a.requires_grad)
        for dest in _written(func, args, kwargs):
            self.mutated.add(_storage(dest))
            if torch.is_grad_enabled():
                self.mutated_with_grad.add(_storage(dest))
            if self.training and self.problem is None and (
                    dest.requires_grad if not torch.is_grad_enabled()
                    else not dest.requires_grad and _storage(dest) in self.grad_storages):
                # eager: autograd does not see this write, made under no_grad or through an alias
                # that does not require grad (``x.detach()``, ``x.data``): later uses differentiate
                # as if the old value were there; a functional graph would differentiate through it
                self.problem = (f"{func} changes a tensor that requires grad where autograd does not see it "
                                "(under no_grad, or through x.detach() / x.data), in a graph that computes gradients")
            for src in torch.utils._pytree.tree_leaves((args, kwargs)):
                if isinstance(src, torch.Tensor) and src is not dest and partial_overlap(dest, src):
                    self.problem = (f"{func} writes to memory that its input partially overlaps "
                                    "(eager raises 'unsupported operation: some elements of the input "
                                    "tensor and the written-to tensor refer to a single memory location')")
        return func(*args, **kwargs)


def analyze(fn, example_inputs: Sequence[Any]) -> AliasInfo:
    """Run ``fn`` (the captured graph, parameters lifted) on fresh fake copies of the inputs and
    find how its outputs alias its inputs and each other."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = fake_copies(mode, example_inputs)
    entry_versions = [x._version if isinstance(x, torch.Tensor) else None for x in fakes]
    before = [(x.shape, x.stride(), x.storage_offset()) if isinstance(x, torch.Tensor) else None for x in fakes]
    checker = _InPlaceChecker(torch.is_grad_enabled())
    if checker.training:
        checker.grad_storages.update(_storage(x) for x in fakes if isinstance(x, torch.Tensor) and x.requires_grad)
    try:
        out, saved, saved_versions = _run_on_fakes(fn, fakes, mode, checker)
    except Exception as e:  # noqa: BLE001 - eager raises it too: let eager say it
        return AliasInfo([], f"the graph raises on fake tensors: {type(e).__name__}: {e}")
    flat = torch.utils._pytree.tree_leaves(out)
    if checker.problem:
        return AliasInfo([None] * len(flat), checker.problem)
    for i, (x, meta) in enumerate(zip(fakes, before)):
        if meta is not None and (x.shape, x.stride(), x.storage_offset()) != meta:
            return AliasInfo([None] * len(flat), f"input {i} has its shape or strides changed in place")
    inputs = {_storage(x): i for i, x in reversed(list(enumerate(fakes))) if isinstance(x, torch.Tensor)}
    try:
        outputs = _output_aliases(fakes, flat, inputs, [meta[2] if meta is not None else 0 for meta in before])
    except _CannotRebuild as e:
        return AliasInfo([None] * len(flat), str(e))
    overlap = _overlapping_intermediate_views(flat, outputs, inputs)
    if overlap:
        return AliasInfo([None] * len(flat), overlap)
    for a in outputs:
        if a is not None and a.dtype is not None:
            base = fakes[a.index] if a.kind == "input_view" else flat[a.index]
            if base.element_size() != a.dtype.itemsize:
                return AliasInfo([None] * len(flat), f"an output views its base as {a.dtype}, of another "
                                                     "element size (its sizes and offset are in other units)")
    grad_mutated = {i for i, x in enumerate(fakes)
                    if isinstance(x, torch.Tensor) and _storage(x) in checker.mutated_with_grad}
    return AliasInfo(outputs, grad_mutated=grad_mutated, **_saved_for_backward(
        fakes, flat, outputs, inputs, checker.mutated, saved, saved_versions, entry_versions))


def fake_copies(mode: FakeTensorMode, inputs: Sequence[Any]) -> list:
    """Fake copies of ``inputs`` in ``mode`` (static sizes), sharing memory as the inputs do.

    ``from_tensor`` copies all that a tensor can carry (a view's base, a storage shared with other
    tensors, a subclass, autograd history), at about half a millisecond a tensor: a second per
    thousand parameters. A plain leaf tensor that alone owns its storage (every parameter of most
    models) is fully described by its sizes, strides, dtype, device and ``requires_grad``, and
    ``empty_strided`` makes its copy at a fraction of that."""
    owners: dict[StorageWeakRef, set[int]] = {}
    for x in inputs:
        if isinstance(x, torch.Tensor):
            owners.setdefault(_storage(x), set()).add(id(x))
    made: dict[int, Any] = {}
    for x in inputs:
        if not isinstance(x, torch.Tensor) or id(x) in made:
            continue
        if type(x) in (torch.Tensor, torch.nn.Parameter) and x.layout == torch.strided and x.is_leaf \
                and not x._is_view() and x.storage_offset() == 0 and len(owners[_storage(x)]) == 1 \
                and not (x.is_inference() or x.is_conj() or x.is_neg() or x.is_quantized):
            with mode:
                made[id(x)] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            made[id(x)].requires_grad_(x.requires_grad)
        else:
            made[id(x)] = mode.from_tensor(x, static_shapes=True)
    return [made[id(x)] if isinstance(x, torch.Tensor) else x for x in inputs]


def _run_on_fakes(fn, fakes: list, mode: FakeTensorMode, checker: "_InPlaceChecker"):
    """``(fn(*fakes), the tensors autograd saved for backward, storage -> the versions it was saved at)``,
    run in the caller's grad mode: an in-place op on a leaf that requires grad raises, as in eager."""
    grad_mode = torch.is_grad_enabled()
    saved: list[torch.Tensor] = []  # what eager's autograd saves for backward (version-checked there)
    saved_versions: dict[StorageWeakRef, set[int]] = {}

    def pack(t):
        saved.append(t)
        if isinstance(t, torch.Tensor):
            saved_versions.setdefault(_storage(t), set()).add(t._version)
        return t

    # (a compiling frame turns the user's saved-tensor hooks off, as TorchDynamo does: this one must run)
    set_tracing = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    prior = set_tracing(False) if set_tracing is not None else None
    try:
        with mode, checker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn(*fakes)
    finally:
        torch._C._set_grad_enabled(grad_mode)  # the graph may end in another mode (tinydynamo restores it)
        if set_tracing is not None:
            set_tracing(prior)
    return out, saved, saved_versions


class _CannotRebuild(Exception):
    """The outputs alias each other in a way no view of one output rebuilds."""


def _output_aliases(fakes: list, flat: list, inputs: dict, offsets: list[int]) -> list[OutputAlias | None]:
    """Per output: the input it is, or a view of an input or of another output (None: its own memory)."""
    outputs: list[OutputAlias | None] = []
    # the base the outputs that view it are rebuilt from: an output that owns its whole storage,
    # wherever it stands (``return y.view(-1), y``), one that requires grad first (``y.detach(), y``:
    # a view of the detached one would lose y's gradient), then one that is not itself a view
    # (outputs of one autograd function that are views of each other cannot be written in place)
    def rank(jo):
        o = jo[1]
        return (not o.requires_grad, o._is_view()) if isinstance(o, torch.Tensor) else (True, True)

    bases: dict[StorageWeakRef, int] = {}
    for j, o in sorted(enumerate(flat), key=rank):
        if isinstance(o, torch.Tensor) and _storage(o) not in inputs and _storage(o) not in bases \
                and o.storage_offset() == 0 and _dense(o) \
                and o.numel() * o.element_size() == o.untyped_storage().nbytes():
            bases[_storage(o)] = j
    for j, o in enumerate(flat):
        if not isinstance(o, torch.Tensor):
            outputs.append(None)
            continue
        view = (tuple(o.shape), tuple(o.stride()), o.storage_offset())
        rg = o.requires_grad
        same = [i for i, x in enumerate(fakes) if x is o]
        st = _storage(o)
        if same:
            outputs.append(OutputAlias("input", same[0]))
        elif st in inputs:
            i = inputs[st]  # the offset is kept relative to the input's (which is not guarded)
            rel = view[2] - offsets[i]
            dtype = o.dtype if o.dtype != fakes[i].dtype else None
            outputs.append(OutputAlias("input_view", i, view[0], view[1], rel, rg, dtype=dtype) if rel >= 0 else None)
        elif st in bases and bases[st] != j:
            if rg and not flat[bases[st]].requires_grad:
                raise _CannotRebuild(f"output {j} requires grad and views output {bases[st]}, which does not "
                                     "(y.detach() returned beside a view of y)")
            base = flat[bases[st]]
            dtype = o.dtype if o.dtype != base.dtype else None
            base_stride = None if base.is_contiguous() else tuple(base.stride())
            outputs.append(OutputAlias("output_view", bases[st], *view, rg, dtype=dtype, base_stride=base_stride))
        else:
            outputs.append(None)
    return outputs


def _saved_for_backward(fakes: list, flat: list, outputs: list, inputs: dict, mutated: set, saved: list,
                        saved_versions: dict, entry_versions: list) -> dict:
    """Which inputs and outputs autograd saved for backward, and the versions of mutated inputs it saved
    (AliasInfo's ``saved_*`` fields)."""
    saved_storages = {_storage(t) for t in saved if isinstance(t, torch.Tensor)}
    # (a mutated input is left out: which of its versions eager saved is not known here)
    saved_inputs = sorted({i for st, i in inputs.items() if st in saved_storages and st not in mutated})
    saved_outputs = [j for j, o in enumerate(flat) if isinstance(o, torch.Tensor) and outputs[j] is None
                     and _storage(o) in saved_storages]
    saved_mutated = [(i, tuple(sorted(v - entry_versions[i] for v in saved_versions[st])),
                      fakes[i]._version - entry_versions[i])
                     for st, i in inputs.items() if st in saved_storages and st in mutated]
    return dict(saved_inputs=saved_inputs, saved_outputs=saved_outputs, saved_mutated_inputs=sorted(saved_mutated))


def strip_input_mutations(gm: fx.GraphModule) -> tuple[list[int], Any]:
    """Turn ``copy_(placeholder_i, new)`` nodes of a functionalized graph into extra outputs.

    Returns ``(mutated input indices, user output spec)``: the graph then returns
    ``(*user outputs flattened, *new values)``, one per mutated input, in input order.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders)}
    new_value: dict[int, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0] in index and not node.users:
            new_value[index[node.args[0]]] = node.args[1]  # a later copy_ into the same input wins
            gm.graph.erase_node(node)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    flat, spec = torch.utils._pytree.tree_flatten(out_node.args[0])
    mutated = sorted(new_value)
    if mutated:
        out_node.args = (tuple(flat) + tuple(new_value[i] for i in mutated),)
        gm.graph.lint()
        gm.recompile()
    return mutated, spec


def write_back(inputs: Sequence[Any], mutated: list[int], new_values: Sequence[torch.Tensor],
               grad_mutated: set[int]) -> None:
    """Copy each mutated input's new value into the caller's tensor (eager's in-place effect).

    An input mutated with grad mode on, by a value that requires grad, is copied with autograd
    recording (a non-leaf input mutated by a differentiable op); otherwise the copy is a plain
    data update (a buffer's running statistics, a parameter changed under ``no_grad``).
    """
    batch_targets, batch_values = [], []
    for i, new in zip(mutated, new_values):
        target = inputs[i]
        if i in grad_mutated and new.requires_grad and torch.is_grad_enabled():
            target.copy_(new)
        elif target.shape == new.shape and target.device == new.device:
            batch_targets.append(target)
            batch_values.append(new)
        else:
            with torch.no_grad():
                target.copy_(new)
    # the plain data updates in one call: a ResNet's training step updates every batch norm's
    # running statistics and step count, which is one copy kernel launched per tensor otherwise
    if batch_targets:
        with torch.no_grad():
            torch._foreach_copy_(batch_targets, batch_values)


def inputs_share_memory(inputs: Sequence[Any], positions: list[int]) -> bool:
    """Do two of the tensor inputs at ``positions`` share a storage? (The functional graph took
    them as independent values: a mutation of one would not be seen through the other.)"""
    seen = set()
    for i in positions:
        ptr = inputs[i].untyped_storage().data_ptr()
        if ptr in seen:
            return True
        if ptr:
            seen.add(ptr)
    return False


def regenerate_aliases(outs: list, inputs: Sequence[Any], aliases: list[OutputAlias | None]) -> list:
    """Replace outputs that alias an input or another output by the input itself / a view."""
    for j, a in enumerate(aliases):
        if a is None:
            continue
        if a.kind == "input":
            outs[j] = inputs[a.index]
            continue
        size, stride, offset = a.at_sizes(inputs) if a.at_sizes is not None else (a.size, a.stride, a.offset)
        if a.kind == "input_view":
            base = inputs[a.index]
            if base.requires_grad and not a.requires_grad:
                base = base.detach()
            if a.dtype is not None:  # (the same element size: analyze runs other dtype views eagerly)
                base = base.view(a.dtype)
            outs[j] = base.as_strided(size, stride, base.storage_offset() + offset)
        else:
            base = outs[a.index]
            # the compiled graph returned the base with the layout the view's strides assume
            # (else the outputs stay apart: same values, not the same memory)
            if base.storage_offset() == 0 and (base.is_contiguous() if a.base_stride is None or a.at_sizes is not None
                                               else base.stride() == a.base_stride):
                if base.requires_grad and not a.requires_grad:
                    base = base.detach()
                if a.dtype is not None:
                    base = base.view(a.dtype)
                outs[j] = base.as_strided(size, stride, offset)
    return outs


def symbolic_views(fn, fakes: Sequence[Any], info: AliasInfo, inputs: Sequence[Any]) -> AliasInfo | None:
    """For a graph with symbolic sizes: ``info`` with each view output's size, stride and offset
    computed per call from the inputs' sizes (``at_sizes``), or None where that cannot be done
    (then the graph is compiled per shape).

    ``fn`` runs once more on ``fakes`` (symbolic sizes, TorchDynamo's fake mode): the views'
    sizes are then expressions over the size symbols, and each symbol is read from where it
    first appears among the inputs (``inputs[2].size(1)``). The generated function is checked
    against the example's own view sizes (``info``, found on ``inputs``)."""

    mode = detect_fake_mode([f for f in fakes if isinstance(f, torch.Tensor)])
    if mode is None or mode.shape_env is None:
        return None
    try:
        with mode, enable_python_dispatcher(), mode.shape_env.suppress_guards():
            flat = torch.utils._pytree.tree_leaves(fn(*fakes))
        sources = _symbol_sources(fakes, size_expr)
        outputs = list(info.outputs)
        for j, a in enumerate(info.outputs):
            if a is None or a.kind == "input":
                continue
            o = flat[j]
            base = size_expr(fakes[a.index].storage_offset()) if a.kind == "input_view" else 0
            exprs = ([size_expr(s) for s in o.shape], [size_expr(s) for s in o.stride()],
                     size_expr(o.storage_offset()) - base)
            at_sizes = _compile_view(exprs, sources, host_expr)
            if at_sizes is None or at_sizes([_example(x) for x in inputs]) != (a.size, a.stride, a.offset):
                return None
            outputs[j] = dataclasses.replace(a, at_sizes=at_sizes)
    except Exception as e:  # noqa: BLE001 - any surprise: the per-shape compile is always right
        log.debug("symbolic views: %s", e)
        return None
    return dataclasses.replace(info, outputs=outputs)


def _example(x):
    """An input as the example run saw it (a SymInt as its example value)."""
    return x.node.hint if isinstance(x, torch.SymInt) else x


def _symbol_sources(fakes, size_expr) -> dict:
    """size symbol -> Python expression over ``inputs`` that reads it at run time."""
    sources: dict = {}
    for k, f in enumerate(fakes):
        if isinstance(f, torch.SymInt):
            pairs = [(f, f"inputs[{k}]")]
        elif isinstance(f, torch.Tensor):
            pairs = [(s, f"inputs[{k}].size({d})") for d, s in enumerate(f.shape)] + \
                    [(s, f"inputs[{k}].stride({d})") for d, s in enumerate(f.stride())]
        else:
            continue
        for value, source in pairs:
            expr = size_expr(value)
            if isinstance(expr, sympy.Symbol):
                sources.setdefault(expr, source)
    return sources


def _compile_view(exprs, sources: dict, pexpr):
    """``inputs -> (size, stride, offset)`` from size expressions, or None when a symbol has no source."""
    size, stride, offset = exprs
    needed = set().union(*[sympy.sympify(e).free_symbols for e in [*size, *stride, offset]])
    if not needed <= sources.keys():
        return None

    def tup(es):
        return "(" + "".join(f"{pexpr(e)}, " for e in es) + ")"

    lines = ["def at_sizes(inputs):"] + [f"    {sym} = {sources[sym]}" for sym in sorted(needed, key=str)]
    lines.append(f"    return {tup(size)}, {tup(stride)}, {pexpr(offset)}")
    scope: dict = {}
    exec(compile("\n".join(lines), "<symbolic view>", "exec"), scope)
    return scope["at_sizes"]
