"""Reverse-mode AD over a prim graph: build the joint graph ``(primals, tangents) -> (outputs, grads)``.

(In PyTorch the joint graph is traced by ``torch/_functorch/aot_autograd.py``'s
``create_joint`` running eager autograd under ``make_fx``; ``torch/_inductor/fx_passes/joint_graph.py``
is something else, a pattern-rewriting pass over the joint graph.)

The pass is an interpreter. It runs the forward graph node by node, then walks the nodes
backwards, and for every node whose output has a gradient it calls that op's VJP rule
(vjp_rules.py) to get its inputs' gradients, adding up contributions of nodes with several
users. Traced on fake tensors, the interpreter *is* the compiler: what it records is the joint
graph, forward ops followed by backward ops, all prims. (The forward ops were traced once
already, by decompose(): with static shapes they are copied and only the backward walk is
recorded, by op_recorder.py's lean tracer; with symbolic sizes ``make_fx`` traces both halves.)

Which values need gradients is decided before tracing, as eager autograd does: a value
requires grad when it is a floating-point tensor computed from an input that requires grad.
Only outputs that require grad get a tangent input; others (integer or bool outputs, values
that do not depend on a trainable input) are *non-differentiable*.

Multi-output ops (``max.dim``, ``sort``, batch norm, the fused attention kernels...) are read
through ``getitem`` nodes; requires-grad is tracked per element, each ``getitem`` hands its
gradient back to its producer at its index, and the producer's rule gets one gradient per
output (``None`` where none arrived). The pass never drops a gradient silently: a gradient
that reaches an op without a rule, a rule that returns none for an input that needs one, or
an in-place op hiding a differentiable data flow raise :class:`AutogradCompileError` at
compile time, and the frame runs eagerly with a warning naming the op.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch.fx._lazy_graph_module import _make_graph_module
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

from tininductor.decompositions import DECOMPOSITIONS, allow_real_constants
from tininductor.op_recorder import OpRecorder, has_symbolic_sizes
from tininductor.vjp_rules import NON_DIFFERENTIABLE_MUTATIONS, NON_DIFFERENTIABLE_OUTPUTS, NOT_DIFFERENTIABLE, get_vjp


@dataclasses.dataclass
class JointGraph:
    """The joint graph and the bookkeeping the partitioners and the runtime wrapper need."""

    gm: fx.GraphModule            #: gm([primals], [tangents]) -> (*outputs, *grads)
    num_primals: int
    num_outputs: int              #: forward outputs (flattened)
    diff_outputs: list[bool]      #: which forward outputs get a tangent
    grad_mask: list[bool]         #: which primals get a gradient output (in order)
    out_spec: pytree.TreeSpec     #: to rebuild the forward's output structure

    @property
    def num_tangents(self) -> int:
        return sum(self.diff_outputs)


def _is_float_tensor(val) -> bool:
    return isinstance(val, torch.Tensor) and (val.dtype.is_floating_point or val.dtype.is_complex)


def _is_differentiable(val) -> bool:
    """A float tensor, or (a multi-output op) a tuple/list holding at least one float tensor."""
    if isinstance(val, (tuple, list)):
        return any(_is_float_tensor(v) for v in val)
    return _is_float_tensor(val)


class AutogradCompileError(NotImplementedError):
    """AOT autograd cannot build a correct backward for this graph: a compile error, so the
    frame runs eagerly with a warning (or the error is raised, under fullgraph=True)."""


class MissingVJPRule(AutogradCompileError):
    """An op on a path from a trainable input to a differentiable output has no VJP rule.

    Raised at compile time, so the frame falls back to eager (with a warning naming ``op``)
    instead of running with a gradient silently missing.
    """

    def __init__(self, op, node_name: str, argument: int | str | None = None):
        self.op = op
        packet = getattr(op, "overloadpacket", op)
        if argument is not None:  # the rule exists but cannot differentiate this argument
            super().__init__(
                f"the VJP rule of {op} (node {node_name}) returned no gradient for its argument "
                f"{argument}, which requires grad: extend the rule to differentiate it")
            return
        super().__init__(
            f"no VJP rule for {op} (node {node_name}), which is on a path from an input that "
            f"requires grad to a differentiable output: register one with "
            f"@tininductor.vjp_rules.register_vjp({packet}), or decompose the op into ops "
            f"that have rules")


def requires_grad_nodes(graph: fx.Graph, requires_grad: list[bool]) -> set[fx.Node]:
    """Nodes whose value needs a gradient: float tensors that depend on a trainable primal.

    A multi-output op (its value a tuple, read through ``getitem`` nodes) is in the set when
    one of its float outputs is; each ``getitem`` is then in the set when *its* element is a
    float tensor, so requires-grad is tracked per output element.
    """
    result: set[fx.Node] = set()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, flag in zip(placeholders, requires_grad):
        if flag and _is_float_tensor(node.meta.get("val")):
            result.add(node)
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.detach.default:  # gradients stop here
            continue
        packet = getattr(node.target, "overloadpacket", node.target)
        if packet in NOT_DIFFERENTIABLE:  # shape-only creation, random draws, rounding
            continue
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            producer = getattr(node.args[0].target, "overloadpacket", None)
            if node.args[1] in NON_DIFFERENTIABLE_OUTPUTS.get(producer, ()):  # saved stats, masks
                continue
        if any(arg in result for arg in node.all_input_nodes) and _is_differentiable(node.meta.get("val")):
            result.add(node)
    return result


def _written_args(node: fx.Node) -> list:
    """The arguments an in-place/out= op writes to (from its schema's alias annotations)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    written = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            written.append(value)
    return written


def check_no_differentiable_mutation(graph: fx.Graph, needs_grad: set[fx.Node]) -> None:
    """AD follows data flow; an in-place op that writes a value needing a gradient into another
    tensor (a ``copy_`` into a slice that functionalization left in place), or that modifies a
    tensor needing a gradient (``add_`` in a composite's Python code), would hide that flow and
    gradients would silently be lost or wrong. Refuse such graphs (the frame then runs eagerly).

    Ops whose writes are not differentiable in eager either (batch norm's running statistics,
    updated under no_grad) are fine.
    """
    for node in graph.nodes:
        if node.op != "call_function" or getattr(node.target, "overloadpacket", None) in NON_DIFFERENTIABLE_MUTATIONS:
            continue
        written = _written_args(node)
        if not written:
            continue
        sources = [a for a in node.all_input_nodes if a not in written]
        if any(a in needs_grad for a in sources):
            raise AutogradCompileError(
                f"in-place op {node.target} (node {node.name}) writes a value that requires grad into "
                f"another tensor; AOT autograd needs a functional graph there (the gradient would be lost)")
        if any(isinstance(a, fx.Node) and a in needs_grad for a in written):
            raise AutogradCompileError(
                f"in-place op {node.target} (node {node.name}) modifies a tensor that requires grad; "
                f"AOT autograd needs a functional graph there (later readers would get wrong gradients)")


def _like_input(grad, value):
    """``grad`` in the dtype of the input it is the gradient of, as autograd's engine makes it
    (``validate_outputs``): a rule mixing dtypes (``bf16 * fp32`` in T5's layer norm) computes
    ``bf16``'s gradient in fp32, and the eager backward rounds it to bf16 right there."""
    if not isinstance(grad, torch.Tensor) or not isinstance(value, torch.Tensor) or grad.dtype == value.dtype:
        return grad
    if not (value.is_floating_point() or value.is_complex()):
        return grad
    if grad.is_complex() and not value.is_complex():
        grad = torch.ops.aten.real(grad)
    return torch.ops.prims.convert_element_type(grad, value.dtype)


def _accumulate(grads: dict, node: fx.Node, grad: torch.Tensor) -> None:
    grads[node] = grad if node not in grads else torch.ops.aten.add(grads[node], grad)


def _accumulate_element(grads: dict, producer: fx.Node, index: int, grad: torch.Tensor,
                        num_outputs: int) -> None:
    """``getitem(producer, index)`` got ``grad``: add it to entry ``index`` of the producer's
    per-output gradient list (None where no gradient arrived)."""
    per_output = grads.setdefault(producer, [None] * num_outputs)
    per_output[index] = grad if per_output[index] is None else torch.ops.aten.add(per_output[index], grad)


def backward_pass(graph: fx.Graph, env: dict[fx.Node, object], needs_grad: set[fx.Node],
                  output_grads: dict[fx.Node, torch.Tensor], rules: dict | None = None
                  ) -> dict[fx.Node, torch.Tensor]:
    """Walk ``graph`` backwards from ``output_grads``, applying one VJP rule per node.

    ``env`` maps each node to its forward value. Returns the gradient of every node reached
    (placeholders included); a node no gradient reaches is simply absent. ``rules`` replaces
    the VJP registry (vjp_rules.VJP_RULES).

    Multi-output ops: a ``getitem`` node hands its gradient to its producer, at its index; the
    producer's rule is then called with a list of gradients, one per output (``None`` for an
    output no gradient reached). A node that a gradient reaches and that has no rule raises
    :class:`MissingVJPRule`; so does a rule that returns no gradient for an input needing one.
    """
    grads = dict(output_grads)
    for node in reversed(graph.nodes):
        if node.op != "call_function" or node not in grads or node not in needs_grad:
            continue
        if node.target is operator.getitem:
            producer, index = node.args
            value = env[producer]
            if isinstance(producer, fx.Node) and producer in needs_grad and isinstance(value, (tuple, list)):
                _accumulate_element(grads, producer, index, grads[node], len(value))
            continue
        try:
            rule = get_vjp(node.target, rules)
        except NotImplementedError:
            raise MissingVJPRule(node.target, node.name) from None
        args = fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
        input_grads = rule(grads[node], env[node], *args, **kwargs)
        # gradients of keyword arguments (SDPA's attn_mask) come last, as a dict
        kwarg_grads = {}
        if isinstance(input_grads, tuple) and input_grads and isinstance(input_grads[-1], dict):
            input_grads, kwarg_grads = input_grads[:-1], input_grads[-1]
        for name, arg in node.kwargs.items():
            if isinstance(arg, fx.Node) and arg in needs_grad:
                if kwarg_grads.get(name) is None:
                    raise MissingVJPRule(node.target, node.name, argument=name)
                _accumulate(grads, arg, _like_input(kwarg_grads[name], env[arg]))
        for i, (arg, grad) in enumerate(zip(node.args, input_grads)):
            if isinstance(arg, (list, tuple)) and isinstance(grad, (list, tuple)):  # cat's tensor list
                for a, g in zip(arg, grad):
                    if isinstance(a, fx.Node) and a in needs_grad:
                        _check_grad(node, i, g)
                        _accumulate(grads, a, _like_input(g, env[a]))
            elif isinstance(arg, fx.Node) and arg in needs_grad:
                _check_grad(node, i, grad)
                _accumulate(grads, arg, _like_input(grad, env[arg]))
    return grads


def _check_grad(node: fx.Node, index: int, grad) -> None:
    if grad is None:
        raise MissingVJPRule(node.target, node.name, argument=index)


def create_joint(fw_gm: fx.GraphModule, fake_primals: list, requires_grad: list[bool],
                 fake_mode, rules: dict | None = None, backward=None) -> JointGraph:
    """Forward + reverse-mode AD of the prim graph ``fw_gm``, as one joint graph.

    With static shapes the forward half is ``fw_gm``'s own nodes, copied (decompose() traced them
    already), and only the backward walk is recorded, by an :class:`OpRecorder` that knows each
    forward value's node. With symbolic sizes the whole interpreter (forward, then backward) runs
    under ``make_fx``, which keeps the size expressions in the graph. ``rules`` (a VJP registry)
    and ``backward`` (a :func:`backward_pass`) can be swapped, which is how the course plugs a
    learner's rule or pass into the real pipeline.
    """
    graph = fw_gm.graph
    needs_grad = requires_grad_nodes(graph, requires_grad)
    check_no_differentiable_mutation(graph, needs_grad)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    (out_node,) = [n for n in graph.nodes if n.op == "output"]
    flat_outs, out_spec = pytree.tree_flatten(out_node.args[0])
    diff_outputs = [isinstance(o, fx.Node) and o in needs_grad for o in flat_outs]
    primals = [p.detach() if isinstance(p, torch.Tensor) else p for p in fake_primals]
    with fake_mode:
        tangents = [torch.empty(o.meta["val"].shape, dtype=o.meta["val"].dtype, device=o.meta["val"].device)
                    for o, diff in zip(flat_outs, diff_outputs) if diff]
    grad_mask: list[bool] = []

    def backward_walk(env: dict):
        """Seed the differentiable outputs with the tangents, walk back: the primals' gradients."""
        seeds: dict = {}
        for o, diff, tangent in zip(flat_outs, diff_outputs, _iter_tangents(diff_outputs, tangents)):
            if diff:
                _accumulate(seeds, o, tangent)
        grads = (backward or backward_pass)(graph, env, needs_grad, seeds, rules)
        grad_mask[:] = [p in grads for p in placeholders]
        return [grads[p] for p in placeholders if p in grads]

    # recording binds each forward value to its node: every op's value must be known, sizes static
    recordable = all("val" in n.meta for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem) \
        and not has_symbolic_sizes([*primals, *(n.meta.get("val") for n in graph.nodes)])
    build = _record_joint if recordable else _trace_joint
    joint_gm = build(fw_gm, primals, tangents, flat_outs, backward_walk, fake_mode)
    # drop what no output reads (a rule may compute a gradient for an input that turns out to
    # need none); partitioners then see only real dependencies
    joint_gm.graph.eliminate_dead_code()
    joint_gm.recompile()
    return JointGraph(joint_gm, len(placeholders), len(flat_outs), diff_outputs, grad_mask, out_spec)


def _record_joint(fw_gm: fx.GraphModule, primals: list, tangents: list, flat_outs: list, backward_walk,
                  fake_mode) -> fx.GraphModule:
    """Static shapes: copy ``fw_gm``'s nodes, binding each one's fake value to its copy, then record
    the backward walk after them. An op with a decomposition is recorded again instead of copied:
    decompose() kept it for AD (batch norm's functional op, whose VJP rule is the fused formula),
    and after AD it decomposes, as every op a rule calls does."""
    joint = fx.Graph()
    constants: dict[str, torch.Tensor] = {}
    recorder = OpRecorder(joint, DECOMPOSITIONS.overload_table(), constants)
    env: dict[fx.Node, object] = {}  # forward node -> its value, as the rules read it
    copies: dict[fx.Node, fx.Node] = {}
    fw_placeholders = [n for n in fw_gm.graph.nodes if n.op == "placeholder"]
    for i, (node, value) in enumerate(zip(fw_placeholders, primals)):
        env[node], copies[node] = value, _placeholder(joint, f"primals_{i + 1}", node.meta, value)
        recorder.bind(value, copies[node])
    for i, value in enumerate(tangents):
        recorder.bind(value, _placeholder(joint, f"tangents_{i + 1}", {}, value))
    items = {(n.args[0], n.args[1]) for n in fw_gm.graph.nodes
             if n.op == "call_function" and n.target is operator.getitem}
    recorded: set[fx.Node] = set()  # forward ops run again through the recorder, not copied
    with fake_mode, allow_real_constants(fake_mode), torch.no_grad(), enable_python_dispatcher(), recorder:
        for node in fw_gm.graph.nodes:
            if node.op not in ("call_function", "get_attr"):
                continue
            producer = node.args[0] if node.target is operator.getitem else None
            if producer in recorded:  # an element of a re-recorded op: wherever the recorder put it
                env[node] = env[producer][node.args[1]]
                copies[node] = recorder.node(env[node])
                continue
            if node.op == "call_function" and node.target in recorder.decompositions:
                # an op decompose() kept for AD (batch norm's functional op): decomposed now, after it
                env[node] = node.target(*fx.node.map_arg(node.args, env.__getitem__),
                                        **fx.node.map_arg(node.kwargs, env.__getitem__))
                recorded.add(node)
                if not isinstance(env[node], (tuple, list)):
                    copies[node] = recorder.node(env[node])
                continue
            copies[node] = copy = joint.node_copy(node, copies.__getitem__)
            if node.op == "get_attr":
                env[node] = constants[node.target] = getattr(fw_gm, node.target)
            elif producer is not None and isinstance(env.get(producer), (tuple, list)):
                env[node] = env[producer][node.args[1]]  # the element itself (a rule may read the tuple)
            else:
                env[node] = node.meta["val"]
            recorder.bind(env[node], copy)
            if isinstance(env[node], (tuple, list)):  # a multi-output op: elements no getitem reads yet
                for i, element in enumerate(env[node]):
                    if isinstance(element, torch.Tensor) and (node, i) not in items:
                        item = joint.call_function(operator.getitem, (copy, i))
                        item.meta["val"] = element
                        recorder.bind(element, item)
        grads = backward_walk(env)
    outs = [copies[o] if isinstance(o, fx.Node) else o for o in flat_outs]
    out_node = joint.output([*outs, *(recorder.node(g) for g in grads)])
    out_node.meta["val"] = None
    joint._codegen = _PyTreeCodeGen(_PyTreeInfo(
        ["primals", "tangents"], pytree.tree_flatten((primals, tangents))[1],
        pytree.tree_flatten(tuple(out_node.args[0]))[1]))
    return _make_graph_module(constants, joint)


def _placeholder(graph: fx.Graph, name: str, meta: dict, value) -> fx.Node:
    node = graph.placeholder(name)
    node.meta = dict(meta)
    node.meta["val"] = value
    return node


def _trace_joint(fw_gm: fx.GraphModule, primals: list, tangents: list, flat_outs: list, backward_walk,
                 fake_mode) -> fx.GraphModule:
    """Symbolic sizes: run the forward graph node by node and then the backward walk, all under
    ``make_fx``, which records every op and every size expression."""
    graph = fw_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]

    def joint(primals, tangents):
        env: dict[fx.Node, object] = dict(zip(placeholders, primals))
        for node in graph.nodes:
            if node.op == "call_function":
                args = fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
                env[node] = node.target(*args, **kwargs)
            elif node.op == "get_attr":
                env[node] = getattr(fw_gm, node.target)
        outs = [env[o] if isinstance(o, fx.Node) else o for o in flat_outs]
        return (*outs, *backward_walk(env))

    with fake_mode, allow_real_constants(fake_mode):  # the graph's constants (get_attr) are real tensors
        # the Python dispatcher, as for decompose(): torch's Python meta kernels keep symbolic sizes
        # symbolic, where C++ composites read them as ints (specialising every size)
        with torch.no_grad(), enable_python_dispatcher():
            return make_fx(joint, decomposition_table=DECOMPOSITIONS.overload_table())(primals, tangents)


def _iter_tangents(diff_outputs, tangents):
    it = iter(tangents)
    for diff in diff_outputs:
        yield next(it) if diff else None
