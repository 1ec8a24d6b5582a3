"""AOT autograd: capture the backward ahead of time and compile it like the forward.

``aot_autograd(fw_compiler, bw_compiler, partition_fn)`` returns a backend (the contract
``backend(gm, example_inputs) -> callable``) that

1. lifts the module's parameters and buffers into inputs (``primals``), so their gradients
   come out of the graph like any other,
2. decomposes the graph into prims (decompositions.py) on fake tensors,
3. if no input requires grad (or grad mode is off): compiles that forward graph and is done;
4. otherwise builds the joint graph ``(primals, tangents) -> (outputs, grads)`` by reverse-mode
   AD (joint_graph.py), splits it into a forward and a backward graph (partitioners.py),
   compiles both, and returns a function that runs them inside a ``torch.autograd.Function``,
   so ``loss.backward()`` calls the compiled backward and gradients land in ``.grad``.

Compilers are called as ``compiler(gm, example_inputs)``: ``gm`` is a prim-set GraphModule
whose nodes carry ``meta["val"]``, and ``example_inputs`` are *fake* tensors
(``torch._subclasses.FakeTensor``: shape, dtype, strides and device, no data). They return a
callable taking the graph's inputs as positional tensors and returning its outputs.

Dynamic shapes (TorchDynamo's convention: SymInt placeholders such as ``s0`` plus tensors whose
fake example values have symbolic sizes from one ShapeEnv) are compiled once for every size:
the graph is traced on those fake values (their fake mode is reused, so the symbols flow
through decompositions, the VJP rules and the partitioner: sizes the backward needs are saved
as SymInts, passed to it as ints), and the compilers receive SymInt example inputs. At run time
the callable takes concrete ints for the SymInt inputs. What cannot be compiled symbolically
(an output that is a view of an input, whose size/strides are rebuilt from constants) is
compiled per concrete shape instead, logged (``_specialize_per_shape``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import warnings
from typing import Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

from tininductor import aliasing, config, graph_cache
from tininductor.decompositions import decompose, fake_inputs
from tininductor.fx_passes.freezing import freeze
from tininductor.joint_graph import AutogradCompileError, JointGraph, create_joint
from tininductor.partitioners import Partition, default_partition, min_cut_partition
from tinydynamo import artifacts
from tinydynamo.exc import EagerFallbackWarning
from tinydynamo.utils import deferred_full_collections, dynamo_timed

log = logging.getLogger("tininductor.aot_autograd")

__all__ = ["aot_autograd", "aot_eager", "aot_eager_min_cut", "AOTOutput", "default_partition",
           "min_cut_partition"]


class ReadableGraph:
    """An artefact value: ``gm`` as readable code, printed when it is first shown, not while compiling
    (printing the 7,000 nodes of a large joint graph takes a fifth of a second). ``snapshot`` copies
    the graph first (half the cost), for a graph that later passes rewrite in place: the forward and
    backward graphs, which compile_fx_inner's graph passes change."""

    def __init__(self, gm: fx.GraphModule, snapshot: bool = False):
        if snapshot:
            graph = fx.Graph()
            graph.output(graph.graph_copy(gm.graph, {}))
            graph._codegen = gm.graph._codegen
            with _use_lazy_graph_module(True):
                gm = _make_graph_module(gm, graph, class_name=type(gm).__name__)
        self.gm = gm
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = self.gm.print_readable(print_output=False)
        return self._text


def _fake_vals(gm: fx.GraphModule, inputs: list | None = None) -> list:
    """The placeholders' example values; where one has none (an int input), ``inputs``'s."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if inputs is not None and len(inputs) == len(vals):
        vals = [x if v is None else v for v, x in zip(vals, inputs)]
    return vals


@dataclasses.dataclass
class AOTOutput:
    """What one compilation produced; kept on the returned callable as ``.aot`` for inspection."""

    prim_gm: fx.GraphModule
    joint: JointGraph | None = None
    partition: Partition | None = None


@dataclasses.dataclass
class _Runtime:
    compiled_fw: Callable
    compiled_bw: Callable
    num_outputs: int
    diff_outputs: list[bool]
    grad_mask: list[bool]
    #: the prim forward run by torch: what ``backward(create_graph=True)`` differentiates eagerly
    eager_forward: Callable | None = None
    #: why the eager re-run would not reproduce the forward (random ops), if it would not
    no_rerun_reason: str | None = None
    version_checked_inputs: list[int] = dataclasses.field(default_factory=list)  # see aliasing.AliasInfo
    mutated_inputs: list[int] = dataclasses.field(default_factory=list)  # written back after the call
    version_checked_outputs: list[int] = dataclasses.field(default_factory=list)
    saved_mutated_inputs: list[tuple[int, tuple[int, ...], int]] = dataclasses.field(default_factory=list)
    #: outputs the compiled forward returns as views of its own intermediates (found at the first call)
    intermediate_views: list[int] | None = None
    checked_deduplicated: bool = False


def _drop_saved_twice(runtime: _Runtime, tensors: list, primals, user_outs) -> None:
    """Leave out of the version-checked tensors those the compiled forward saves itself."""
    saved = {id(t) for t in tensors}
    runtime.version_checked_inputs = [i for i in runtime.version_checked_inputs if id(primals[i]) not in saved]
    runtime.version_checked_outputs = [j for j in runtime.version_checked_outputs if id(user_outs[j]) not in saved]
    runtime.checked_deduplicated = True


def views_of_intermediates(outs, primals) -> list[int]:
    """Which outputs are views of a tensor the forward made (not of an input).

    A compiler that runs torch ops (``aot_eager``) returns ``y.view(-1)`` as a view; autograd
    forbids writing in place into a view an ``autograd.Function`` returns, which eager allows. Such
    an output is returned as a plain alias of its memory instead, as a generated kernel's buffer
    is; the outputs that view each other are rebuilt as views after the call (aliasing.py).
    """
    inputs = {p.untyped_storage().data_ptr() for p in primals if isinstance(p, torch.Tensor)}
    return [j for j, o in enumerate(outs) if isinstance(o, torch.Tensor) and o._is_view()
            and o.untyped_storage().data_ptr() not in inputs]


class CompiledFunction(torch.autograd.Function):
    """Runs the compiled forward, saves what the partitioner chose, runs the compiled backward."""

    @staticmethod
    def forward(ctx, runtime: _Runtime, *primals):
        outs = runtime.compiled_fw(*primals)
        user_outs, saved = outs[: runtime.num_outputs], outs[runtime.num_outputs:]
        if runtime.intermediate_views is None:
            runtime.intermediate_views = views_of_intermediates(user_outs, primals)
        if runtime.intermediate_views:
            user_outs = list(user_outs)
            for j in runtime.intermediate_views:
                user_outs[j] = user_outs[j].detach()
        ctx.runtime = runtime
        # a CUDA graph replay's saved activations live in graph memory until the next replay
        # (runtime/cudagraphs.py); the token lets the backward check they are still there
        ctx.replay_token = getattr(runtime.compiled_fw, "replay_token", None)
        # tensors go through save_for_backward (autograd checks they are not modified in place);
        # a saved size (an int input of a dynamic-shape graph) is kept as it is
        tensors = [v for v in saved if isinstance(v, torch.Tensor)]
        if runtime.mutated_inputs:  # an input saved as it was, then written back: keep the old value
            old = {id(primals[i]) for i in runtime.mutated_inputs}
            tensors = [v.clone() if id(v) in old else v for v in tensors]
        # what eager would have saved, saved too: autograd then checks their versions at backward
        # (once: one the compiled forward saves anyway is left out, so a saved-tensor hook packs
        # it once, as in eager; the forward's code is fixed, so the first call tells)
        if not runtime.checked_deduplicated:
            _drop_saved_twice(runtime, tensors, primals, user_outs)
        checked = [primals[i] for i in runtime.version_checked_inputs] + \
                  [user_outs[j] for j in runtime.version_checked_outputs]
        ctx.num_checked = len(checked)
        # an input the graph writes and eager saves: its version at entry (it is written back once after)
        ctx.entry_versions = [primals[i]._version for i, _, _ in runtime.saved_mutated_inputs]
        ctx.save_for_backward(*tensors, *checked)
        ctx.saved_ints = [None if isinstance(v, torch.Tensor) else v for v in saved]
        ctx.primals = primals  # for a create_graph=True backward (double_backward); not copied
        ctx.mark_non_differentiable(*[
            o for o, diff in zip(user_outs, runtime.diff_outputs)
            if not diff and isinstance(o, torch.Tensor)])
        return tuple(user_outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        runtime = ctx.runtime
        if torch.is_grad_enabled():  # backward(create_graph=True): the gradient must be differentiable
            return (None, *double_backward(ctx, runtime, grad_outputs))
        if ctx.replay_token is not None:
            ctx.replay_token.check_saved_tensors()
        # the backward graph was traced with contiguous tangents; autograd may hand us expanded ones
        tangents = [g.contiguous() for g, diff in zip(grad_outputs, runtime.diff_outputs) if diff]
        all_saved = ctx.saved_tensors  # raises if a version-checked tensor was modified in place
        if runtime.saved_mutated_inputs:
            check_saved_mutated_versions(ctx.primals, runtime.saved_mutated_inputs, ctx.entry_versions)
        tensors = iter(all_saved[:len(all_saved) - ctx.num_checked])
        saved = [next(tensors) if v is None else v for v in ctx.saved_ints]
        grads = iter(runtime.compiled_bw(*saved, *tangents))
        return (None, *[next(grads) if has_grad else None for has_grad in runtime.grad_mask])


def check_saved_mutated_versions(primals, saved_mutated_inputs, entry_versions) -> None:
    """Raise eager's error where eager's backward would: an input the graph wrote in place, which
    eager saved at version ``entry + s``. Eager leaves it at ``entry + final`` after the call; the
    compiled call leaves it at ``entry + 1`` (one write-back), so the changes made since the call
    are ``now - entry - 1``, and eager would see version ``entry + final + changes``."""
    for (i, saved_at, final), entry in zip(saved_mutated_inputs, entry_versions):
        t = primals[i]
        eager_now = final + (t._version - entry - 1)
        for s in saved_at:
            if eager_now != s:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: [{t.type()} {list(t.shape)}] is at version {entry + eager_now}; expected "
                    f"version {entry + s} instead. Hint: the graph's input {i} was written in place after "
                    "(or before) autograd saved it, as eager's autograd would report.")


def double_backward(ctx, runtime: _Runtime, grad_outputs) -> list:
    """``backward(create_graph=True)`` through a compiled graph: differentiate it with eager autograd.

    The compiled backward computes numbers, not a graph, so a gradient that is to be
    differentiated again (gradient penalties, Hessian-vector products) comes from re-running
    the prim forward with torch ops on the same inputs and calling ``torch.autograd.grad`` with
    ``create_graph=True``. Slower (the forward runs twice) and said so with a warning; refused
    when the graph draws random numbers (the re-run would draw different ones). The re-run
    repeats the graph's side effects on buffers (a training BatchNorm's running statistics
    would be updated twice).
    """
    if runtime.eager_forward is None or runtime.no_rerun_reason:
        raise RuntimeError(
            "backward(create_graph=True) through a compiled graph needs an eager re-run of its forward"
            f", which is not possible here ({runtime.no_rerun_reason or 'no eager forward kept'}); "
            "run this function eagerly (outside tinydynamo.compile) for higher-order gradients")
    warnings.warn("tininductor: backward(create_graph=True) through a compiled graph: the gradient is "
                  "computed by eager autograd on a re-run of the graph's forward (double backward is not "
                  "compiled)", stacklevel=2)
    primals = ctx.primals
    wanted = [p for p, has_grad in zip(primals, runtime.grad_mask) if has_grad]
    outs = pytree.tree_leaves(runtime.eager_forward(*primals))
    pairs = [(o, g) for o, g, diff in zip(outs, grad_outputs, runtime.diff_outputs)
             if diff and g is not None and o.requires_grad]
    grads = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                     create_graph=True, allow_unused=True) if pairs else [None] * len(wanted))
    return [next(grads) if has_grad else None for has_grad in runtime.grad_mask]


def stop_gradients_in_no_grad_regions(gm: torch.nn.Module) -> torch.nn.Module:
    """Replace TorchDynamo-style ``torch._C._set_grad_enabled(b)`` nodes by ``detach`` of every
    tensor computed while grad is off, so AD and the partitioner see where gradients stop.

    ``with torch.no_grad(): z = y * 2`` arrives as ``_set_grad_enabled(False); mul; _set_grad_enabled(True)``.
    Our AD works on the decomposed graph, where those nodes would be lost (they change global
    state, they compute nothing); ``z = detach(y * 2)`` says the same thing in data flow. The
    mode the graph ends in is the caller's business (tinydynamo sets it after the call).
    """
    if not isinstance(gm, fx.GraphModule) or not any(
            n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    grad_on = torch.is_grad_enabled()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            grad_on = bool(node.args[0])
            continue
        new = graph.node_copy(node, lambda n: env[n])
        if not grad_on and node.op in ("call_function", "call_method", "call_module") and \
                isinstance(node.meta.get("example_value"), torch.Tensor):
            new = graph.call_function(torch.ops.aten.detach.default, (new,))
        env[node] = new
    return _make_graph_module(gm, graph)


def _lift_parameters(gm: torch.nn.Module):
    """``(fn, names)``: ``fn(*params_and_buffers, *args)`` calls ``gm`` with those tensors swapped in."""
    if not isinstance(gm, torch.nn.Module):
        return gm, []
    names = [name for name, _ in gm.named_parameters()] + [name for name, _ in gm.named_buffers()]
    if not names:
        return gm, names

    def flat_fn(*args):
        state = dict(zip(names, args[: len(names)]))
        return torch.func.functional_call(gm, state, args[len(names):])

    return flat_fn, names


class NeedsStaticShapes(Exception):
    """This graph cannot be compiled with symbolic sizes (the message says why)."""


def compile_aot(gm: torch.nn.Module, example_inputs, fw_compiler: Callable, bw_compiler: Callable,
                partition_fn: Callable = default_partition, inference_compiler: Callable | None = None,
                example_fakes: list | None = None) -> Callable:
    """The body of the backend :func:`aot_autograd` returns (see the module docstring).

    ``example_fakes``: fake values of ``example_inputs`` with symbolic sizes (dynamic shapes), to
    trace with instead of fresh fake copies.

    A graph of the same form as one compiled before (another block of the same class: only the
    parameters differ, and they are inputs here) binds its module to that compile (graph_cache.py).
    """
    key = _cache_key(gm, example_inputs, (fw_compiler, bw_compiler, partition_fn, inference_compiler)) \
        if example_fakes is None else None
    cached = graph_cache.cache.lookup(key) if key is not None else None
    if cached is not None:
        artifacts.record("forward_graph", "graph cache hit (graph_cache.py)",
                         "this graph has the form of one compiled before: its compiled forward (and backward) "
                         "run with this module's parameters")
        return cached.bind(gm, _owners(stop_gradients_in_no_grad_regions(gm)))
    try:
        prep = _prepare(gm, example_inputs, example_fakes)
    except _RunEagerly as e:
        return _run_graph_eagerly(gm, str(e))
    requires_grad = [isinstance(x, torch.Tensor) and x.requires_grad for x in prep.all_inputs]
    if not _needs_backward(prep.all_inputs, prep.grad_inside):
        compiled = _compile_inference(prep, inference_compiler or fw_compiler)
    else:
        compiled = _compile_training(prep, requires_grad, fw_compiler, bw_compiler, partition_fn)
    if key is not None:
        graph_cache.cache.store(key, compiled)
    return compiled.bind(prep.eager_gm, prep.owners)


def _cache_key(gm, example_inputs, compilers: tuple):
    """The graph cache's key for this compile, or None (the cache is off, or the graph has no key)."""
    if not config.graph_cache:
        return None
    _, names = _lift_parameters(gm)
    try:
        return graph_cache.graph_key(gm, names, [operator.attrgetter(n)(gm) for n in names], example_inputs, compilers)
    except graph_cache.Uncacheable as e:
        log.debug("graph cache: not cached (%s)", e)
        return None


def _owners(gm) -> list:
    """(submodule, attribute) per lifted parameter and buffer, in ``_lift_parameters``'s order."""
    _, names = _lift_parameters(gm)
    return [(gm.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]) for name in names]


def _needs_backward(inputs, grad_inside: bool) -> bool:
    """Whether a backward can differentiate the graph: grad mode on (outside, or switched on inside
    the graph) and some input requiring grad. Otherwise it is compiled as an inference graph."""
    return (torch.is_grad_enabled() or grad_inside) and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)


class _RunEagerly(Exception):
    """The graph's eager semantics are beyond a functional graph (the message says why)."""


@dataclasses.dataclass
class _Prepared:
    """What the inference and the training path share: the functional prims graph, its fake
    inputs, and eager's effects around it (mutated inputs written back, aliases rebuilt)."""

    eager_gm: torch.nn.Module  # the captured graph as it is: eager semantics, for what functionalization cannot do
    prim_gm: fx.GraphModule
    fakes: list
    mode: object  # their fake mode
    all_inputs: list  # parameters and buffers, then the graph's inputs
    owners: list  # (submodule, attribute) per parameter/buffer: read per call, so a replacement is seen
    alias_info: aliasing.AliasInfo
    mutated: list[int]  # inputs the graph writes in place
    user_spec: object  # the output structure
    tensor_positions: list[int]  # the inputs a mutation could alias at run time
    grad_inside: bool  # `with torch.enable_grad():` inside: a training graph even under no_grad
    aot: AOTOutput

    def current_state(self) -> list:
        return [getattr(owner, attr) for owner, attr in self.owners]

    @property
    def has_effects(self) -> bool:
        return bool(self.mutated) or any(a is not None for a in self.alias_info.outputs)

    def finish(self, inputs, outs):
        """Eager's effects around the functional call: write mutated inputs back, rebuild aliases,
        restore the output structure."""
        outs = list(outs)
        if self.mutated:
            n = len(self.mutated)
            aliasing.write_back(inputs, self.mutated, outs[len(outs) - n:], self.alias_info.grad_mutated)
            del outs[len(outs) - n:]
        if any(a is not None for a in self.alias_info.outputs):
            aliasing.regenerate_aliases(outs, inputs, self.alias_info.outputs)
        return pytree.tree_unflatten(outs, self.user_spec)

    def without_module(self) -> "_Prepared":
        """What a compile keeps (graph_cache.py): not the module it was made for, nor its tensors."""
        return dataclasses.replace(self, eager_gm=None, owners=[], all_inputs=[], fakes=[], mode=None)

    def aliased_mutation(self, inputs) -> bool:
        """A mutated input shares memory with another input: the functional graph would read stale values."""
        return bool(self.mutated) and aliasing.inputs_share_memory(inputs, self.tensor_positions)


def _prepare(gm, example_inputs, example_fakes) -> _Prepared:
    """Lift parameters to inputs, analyse aliasing, trace to a functional prims graph."""
    eager_gm = gm
    grad_inside = isinstance(gm, fx.GraphModule) and any(
        n.op == "call_function" and n.target is torch._C._set_grad_enabled and n.args[0] for n in gm.graph.nodes)
    gm = stop_gradients_in_no_grad_regions(gm)
    fn, state_names = _lift_parameters(gm)
    owners = _owners(gm)
    state = [getattr(owner, attr) for owner, attr in owners]
    all_inputs = [*state, *example_inputs]
    with dynamo_timed("aliasing"):  # how outputs alias inputs; what only eager can do
        alias_info = aliasing.analyze(_lift_parameters(eager_gm)[0], [_hint(x) for x in all_inputs])
    if alias_info.unsupported is not None:
        raise _RunEagerly(alias_info.unsupported)
    if example_fakes is not None:
        mode = _symbolic_fake_mode(example_fakes)
        fakes = [mode.from_tensor(p) for p in state] + list(example_fakes)
        if any(a is not None and a.kind != "input" for a in alias_info.outputs):
            # views are rebuilt after the call: their sizes, from this call's input sizes
            alias_info = aliasing.symbolic_views(_lift_parameters(eager_gm)[0], fakes, alias_info, all_inputs)
            if alias_info is None:
                raise NeedsStaticShapes("an output is a view whose sizes could not be written over the "
                                        "input sizes (rebuilt with constant sizes and strides)")
    else:
        fakes, mode = fake_inputs(all_inputs)
    inference = not _needs_backward(all_inputs, grad_inside)  # then nothing is kept for a backward
    with dynamo_timed("decompose"):
        prim_gm = decompose(fn, fakes, inference=inference)  # finds and reuses the fake mode of ``fakes``
    # the graph is functional inside: mutated inputs come out as extra outputs, copied back after
    mutated, user_spec = aliasing.strip_input_mutations(prim_gm)
    # the inputs a mutation could alias at run time: not the module state tinydynamo marked
    module_state = [True] * len(state) + [
        bool(n.meta.get("module_state")) for n in gm.graph.nodes if n.op == "placeholder"] \
        if isinstance(gm, fx.GraphModule) else []
    tensor_positions = [i for i, x in enumerate(all_inputs) if isinstance(x, torch.Tensor)
                        and not (i < len(module_state) and module_state[i])]
    if mutated and aliasing.inputs_share_memory(all_inputs, tensor_positions):
        raise _RunEagerly("a mutated input shares memory with another input")
    return _Prepared(eager_gm, prim_gm, fakes, mode, all_inputs, owners, alias_info, mutated, user_spec,
                     tensor_positions, grad_inside, AOTOutput(prim_gm))


def _module_state_positions(prep: _Prepared) -> list[int]:
    """The inputs that are parameters and buffers (lifted here, or marked by tinydynamo)."""
    runtime = set(prep.tensor_positions)
    return [i for i, x in enumerate(prep.all_inputs) if isinstance(x, torch.Tensor) and i not in runtime]


def mark_static_inputs(gm: fx.GraphModule, positions: list[int]) -> None:
    """Flag the placeholders at ``positions`` (parameters and buffers) ``meta["static_address"]``:
    they keep their memory from call to call, so a CUDA graph reads them where they are instead of
    copying them in before every replay (TorchInductor's static input indices; a moved one is
    recorded again: runtime/cudagraphs.py)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in positions:
        if i < len(placeholders):
            placeholders[i].meta["static_address"] = True


def _compile_inference(prep: _Prepared, compiler: Callable) -> graph_cache.CachedGraph:
    """No input needs a gradient: compile the prims graph as it is."""
    mark_static_inputs(prep.prim_gm, _module_state_positions(prep))
    if config.freezing:  # parameters and buffers as constants, folded (fx_passes/freezing.py)
        module_state = set(range(len(prep.all_inputs))) - set(prep.tensor_positions)
        freeze(prep.prim_gm, prep.all_inputs, sorted(module_state))
    artifacts.record("forward_graph", "inference graph (no input requires grad)",
                     ReadableGraph(prep.prim_gm, snapshot=True))
    compiled = compiler(prep.prim_gm, _fake_vals(prep.prim_gm, prep.fakes))
    tensors = [i for i, x in enumerate(prep.all_inputs) if isinstance(x, torch.Tensor)]
    core = prep.without_module()

    def bind(eager_gm, owners) -> Callable:
        prep = dataclasses.replace(core, eager_gm=eager_gm, owners=owners)
        stateful, effects = bool(owners), prep.has_effects

        def run_inference(*args):  # on every cached call: keep it lean
            inputs = [*prep.current_state(), *args] if stateful else args
            if torch.is_grad_enabled() and _any_requires_grad(inputs, tensors):
                raise RuntimeError(
                    "this function was compiled for inference (no input required grad, or grad "
                    "mode was off), but was called with inputs that require grad: its outputs "
                    "would have no gradients. Compile it again under these conditions")
            if effects:
                if prep.aliased_mutation(inputs):
                    return eager_gm(*args)
                return prep.finish(inputs, compiled(*inputs))
            return compiled(*inputs)

        run_inference.aot = prep.aot
        run_inference.compiled_graphs = [compiled]
        return run_inference

    return graph_cache.CachedGraph(bind)


def _compile_training(prep: _Prepared, requires_grad: list[bool], fw_compiler: Callable, bw_compiler: Callable,
                      partition_fn: Callable) -> graph_cache.CachedGraph:
    """Trace the joint graph, partition it, compile both halves; calls run through an autograd.Function."""
    with dynamo_timed("joint_graph"):
        joint = create_joint(prep.prim_gm, prep.fakes, requires_grad, prep.mode)
    artifacts.record("joint_graph", "joint graph (primals, tangents) -> (outputs, grads)",
                     ReadableGraph(joint.gm))  # the partitioners read it, never change it
    with dynamo_timed("partition"):
        part = partition_fn(joint)
    artifacts.record("forward_graph", f"forward graph ({partition_fn.__name__}: {part})",
                     ReadableGraph(part.fw_gm, snapshot=True))
    artifacts.record("backward_graph", "backward graph (saved, tangents) -> grads",
                     ReadableGraph(part.bw_gm, snapshot=True))
    prep.aot.joint, prep.aot.partition = joint, part
    mark_static_inputs(part.fw_gm, _module_state_positions(prep))  # the forward takes the primals first
    part.fw_gm.graph.output_node().meta["saved_from"] = joint.num_outputs
    compiled_fw = fw_compiler(part.fw_gm, _fake_vals(part.fw_gm, prep.fakes))
    runtime = _Runtime(
        compiled_fw=compiled_fw,
        compiled_bw=bw_compiler(part.bw_gm, _saved_layouts(part.bw_gm, compiled_fw, joint.num_outputs)),
        num_outputs=joint.num_outputs, diff_outputs=joint.diff_outputs, grad_mask=joint.grad_mask,
        eager_forward=prep.prim_gm, no_rerun_reason=_random_ops(prep.prim_gm),
        # an input the graph writes back is left out, as aliasing.analyze leaves out those it sees
        # written (a batch norm's running statistics, written by an op whose schema does not say so)
        version_checked_inputs=[i for i in prep.alias_info.saved_inputs
                                if isinstance(prep.all_inputs[i], torch.Tensor) and i not in prep.mutated],
        version_checked_outputs=prep.alias_info.saved_outputs, mutated_inputs=prep.mutated,
        saved_mutated_inputs=[m for m in prep.alias_info.saved_mutated_inputs if m[0] in prep.mutated])
    flat = is_flat_sequence(joint.out_spec)
    core = prep.without_module()
    # an input that requires grad but gets no gradient (``e.detach()`` is all the graph reads of it)
    # is passed detached, as AOTAutograd does: autograd then has no edge from this call into the
    # graph that made it, which may already have run its backward and freed what it saved
    no_grad_inputs = [i for i, (rg, has_grad) in enumerate(zip(requires_grad, joint.grad_mask)) if rg and not has_grad]

    def bind(eager_gm, owners) -> Callable:
        prep = dataclasses.replace(core, eager_gm=eager_gm, owners=owners)
        stateful, effects, mutated, grad_inside = bool(owners), prep.has_effects, bool(prep.mutated), prep.grad_inside

        def run_training(*args):  # on every cached call: keep it lean
            primals = [*prep.current_state(), *args] if stateful else args
            if mutated and prep.aliased_mutation(primals):
                return eager_gm(*args)
            inputs = primals
            if no_grad_inputs:
                inputs = list(primals)
                for i in no_grad_inputs:
                    inputs[i] = inputs[i].detach()
            if grad_inside:
                with torch.enable_grad():
                    outs = CompiledFunction.apply(runtime, *inputs)
            else:
                outs = CompiledFunction.apply(runtime, *inputs)
            if effects:
                return prep.finish(primals, outs)
            return joint.out_spec.type(outs) if flat else pytree.tree_unflatten(list(outs), joint.out_spec)

        run_training.aot = prep.aot
        run_training.compiled_graphs = [runtime.compiled_fw, runtime.compiled_bw]
        return run_training

    return graph_cache.CachedGraph(bind)


def _saved_layouts(bw_gm: fx.GraphModule, compiled_fw, num_outputs: int) -> list:
    """The backward's example inputs: each saved tensor with the strides the compiled forward stores
    it in (a channels-last activation under layout optimization, ``compiled_fw.output_strides``),
    so that the backward's kernels index it as it is; the tangents as traced."""
    vals = _fake_vals(bw_gm)
    strides = getattr(compiled_fw, "output_strides", None) or []
    saved = strides[num_outputs:]
    for i, stride in enumerate(saved[:len(vals)]):
        val = vals[i]
        if isinstance(val, torch.Tensor) and stride is not None and tuple(val.stride()) != stride \
                and len(stride) == val.dim():
            with detect_fake_mode([val]) or contextlib.nullcontext():
                vals[i] = torch.empty_strided(val.shape, stride, dtype=val.dtype, device=val.device)
    return vals


def _random_ops(gm: fx.GraphModule) -> str | None:
    """The random ops of ``gm``, if any (a graph whose re-run would not reproduce its values)."""
    found = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                    and isinstance(n.target, torch._ops.OpOverload)
                    and torch.Tag.nondeterministic_seeded in n.target.tags})
    return f"it draws random numbers: {', '.join(found)}" if found else None


def _run_graph_eagerly(gm, reason: str) -> Callable:
    """The captured graph run as it is (its ops eagerly), for a graph whose eager semantics a
    functional graph cannot reproduce; the warning says why."""
    warnings.warn(f"tininductor: running the graph eagerly: {reason}", EagerFallbackWarning)
    run = gm.forward if isinstance(gm, fx.GraphModule) else gm
    return run


def is_flat_sequence(spec) -> bool:
    """True for the pytree spec of a plain tuple/list of leaves (the usual output structure),
    which a cached call then rebuilds without walking the tree."""
    if spec.type not in (tuple, list):
        return False
    children = spec.children() if hasattr(spec, "children") else spec.children_specs  # torch < 2.12
    return all(child.is_leaf() for child in children)


def _any_requires_grad(inputs, positions) -> bool:
    for i in positions:
        if inputs[i].requires_grad:
            return True
    return False


def _hint(x):
    """A SymInt's example value (its ShapeEnv hint); anything else as it is."""
    if isinstance(x, torch.SymInt):
        hint = x.node.hint
        if hint is None:
            raise NeedsStaticShapes(f"size {x} has no example value")
        return hint
    return x


def _symbolic_fake_mode(fakes):
    mode = detect_fake_mode([f for f in fakes if isinstance(f, torch.Tensor)])
    if mode is None:
        raise NeedsStaticShapes("no fake mode found on the graph's example values")
    return mode


def dynamo_example_fakes(gm, example_inputs) -> list | None:
    """The fake example values TorchDynamo recorded on ``gm``'s placeholders (symbolic sizes), one
    per example input, or None when some are missing."""
    if not isinstance(gm, fx.GraphModule):
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return None
    fakes = []
    for node, x in zip(placeholders, example_inputs):
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(x, torch.SymInt):
            val = x
        elif isinstance(x, torch.Tensor) and isinstance(x, torch._subclasses.fake_tensor.FakeTensor):
            val = x
        if not isinstance(val, (torch.Tensor, torch.SymInt, int, float, bool)) and val is not None:
            return None
        fakes.append(x if val is None and not isinstance(x, torch.Tensor) else val)
    if any(isinstance(x, torch.Tensor) and not isinstance(f, torch.Tensor) for x, f in zip(example_inputs, fakes)):
        return None
    return fakes


def compile_dynamic(gm, example_inputs, fw_compiler, bw_compiler, partition_fn,
                    inference_compiler=None) -> Callable:
    """A graph with symbolic sizes (SymInt example inputs), compiled once for every size; per
    shape (logged) where that is not possible: a NeedsStaticShapes reason, or any error while
    compiling symbolically (the compilers raise instead of falling back to eager meanwhile, so
    a lowering that cannot handle a symbolic size is compiled per shape, not run eagerly)."""

    fakes = dynamo_example_fakes(gm, example_inputs)
    reason = "the graph's placeholders carry no fake example values"
    if fakes is not None:
        try:
            # trace in the fake mode of the recorded values (torch.compile hands the backend a
            # fresh mode on the same ShapeEnv in its tracing context: leave that one aside)
            with torch._guards.tracing(None), config.patch({"fallback_to_eager": False}):
                return compile_aot(gm, example_inputs, fw_compiler, bw_compiler, partition_fn, inference_compiler,
                                   example_fakes=fakes)
        except NeedsStaticShapes as e:
            reason = str(e)
        except AutogradCompileError:
            raise
        except Exception as e:  # noqa: BLE001 - logged, and the per-shape compile reports its own errors
            reason = f"{type(e).__name__}: {e}"
            log.debug("symbolic compile failure", exc_info=e)
    log.warning("dynamic shapes: compiling per concrete shape instead (%s)", reason)
    return _specialize_per_shape(gm, example_inputs, fw_compiler, bw_compiler, partition_fn, inference_compiler)


def _bake_int_inputs(gm, args):
    """``gm`` with its int inputs (sizes) replaced by their values in ``args``, and the positions
    of the inputs it still takes: a per-shape compile is specialised to them (they are in its key)."""
    if not isinstance(gm, fx.GraphModule) or not any(isinstance(a, int) for a in args):
        return gm, list(range(len(args)))
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    keep = []
    for i, node in enumerate([n for n in graph.nodes if n.op == "placeholder"]):
        if isinstance(args[i], int) and not isinstance(args[i], bool):
            for user in list(node.users):
                user.args, user.kwargs = pytree.tree_map(lambda a, n=node, v=args[i]: v if a is n else a,
                                                         (user.args, user.kwargs))
            graph.erase_node(node)
        else:
            keep.append(i)
    return _make_graph_module(gm, graph), keep


def _specialize_per_shape(gm, example_inputs, fw_compiler, bw_compiler, partition_fn,
                          inference_compiler=None) -> Callable:
    """The fallback for graphs with dynamic sizes that cannot be compiled symbolically
    (:func:`compile_dynamic` logs why): one specialised version per shape, compiled lazily at
    each call with a new combination of input shapes and sizes, from the real arguments, and
    cached by that key.
    """
    def key(args):
        return (torch.is_grad_enabled(),) + tuple(
            (tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args)

    cache: dict = {}

    def run(*args):
        k = key(args)
        if k not in cache:
            static_gm, keep = _bake_int_inputs(gm, args)
            try:
                with deferred_full_collections():
                    compiled = compile_aot(static_gm, [args[i] for i in keep], fw_compiler, bw_compiler,
                                           partition_fn, inference_compiler)
            except Exception as e:
                # this compile runs inside the call, where TorchDynamo can no longer fall back for
                # the frame: run this shape's graph eagerly (with the warning a frame would give)
                if not config.fallback_to_eager:
                    raise
                warnings.warn(f"tininductor failed to compile the graph for these shapes ({type(e).__name__}: {e}); "
                              "running it eagerly", EagerFallbackWarning)
                compiled = static_gm
            cache[k] = lambda *a, compiled=compiled: compiled(*[a[i] for i in keep])
        return cache[k](*args)

    run.cache = cache
    return run


def aot_autograd(fw_compiler: Callable, bw_compiler: Callable | None = None,
                 partition_fn: Callable = default_partition, inference_compiler: Callable | None = None) -> Callable:
    """A backend that traces forward and backward ahead of time and compiles both (see module doc).

    ``inference_compiler`` compiles graphs that need no backward (default: ``fw_compiler``).
    """
    bw_compiler = bw_compiler or fw_compiler

    def backend(gm: torch.nn.Module, example_inputs) -> Callable:
        # every GraphModule made on the way (traced, decomposed, joint, forward, backward) writes its
        # Python code only when something runs it or reads ``.code``: a compiler reads the graph, and
        # writing the code of a 10,000-node joint graph costs a tenth of a second each time
        # (TorchInductor compiles under the same switch)
        with _use_lazy_graph_module(True):
            if any(isinstance(x, torch.SymInt) for x in example_inputs):  # dynamic sizes
                return compile_dynamic(gm, example_inputs, fw_compiler, bw_compiler, partition_fn, inference_compiler)
            return compile_aot(gm, example_inputs, fw_compiler, bw_compiler, partition_fn, inference_compiler)

    backend.__name__ = f"aot_autograd({getattr(fw_compiler, '__name__', 'fw_compiler')})"
    return backend


def run_with_torch_ops(gm: fx.GraphModule, example_inputs) -> Callable:
    """The do-nothing compiler: the GraphModule itself runs its ATen ops eagerly."""
    return gm


#: joint graph -> default partition -> both graphs run with torch ops.
aot_eager = aot_autograd(run_with_torch_ops, run_with_torch_ops)
aot_eager.__name__ = "aot_eager"
#: the same, saving fewer bytes: recompute cheap ops in the backward.
aot_eager_min_cut = aot_autograd(run_with_torch_ops, run_with_torch_ops, min_cut_partition)
aot_eager_min_cut.__name__ = "aot_eager_min_cut"
