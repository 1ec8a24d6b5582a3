"""Partitioners on random graphs: both compute the joint graph's results; min-cut never saves more."""
from __future__ import annotations

import torch
from hypothesis import example, given, settings, strategies as st

from tininductor.decompositions import decompose, fake_inputs
from tininductor.joint_graph import create_joint
from tininductor.partitioners import default_partition, is_recomputable, min_cut_partition

UNARY = [torch.sin, torch.tanh, torch.exp, torch.sigmoid, lambda v: v * 1.5, lambda v: v.relu()]
BINARY = [torch.add, torch.mul, torch.sub, lambda a, b: a @ b.transpose(-2, -1) @ a]


def _program(steps):
    """A random straight-line program over a pool of values: unary, binary, sum and matmul steps."""
    def f(x, w):
        pool = [x, w]
        for kind, i, j in steps:
            a, b = pool[i % len(pool)], pool[j % len(pool)]
            if kind < len(UNARY):
                pool.append(UNARY[kind](a))
            elif kind < len(UNARY) + len(BINARY):
                pool.append(BINARY[kind - len(UNARY)](a, b))
            else:
                pool.append(a.sum(-1, keepdim=True) * b)
        return pool[-1].sum(), pool[-2]
    return f


@settings(max_examples=15, deadline=None, derandomize=True)  # the same examples on every run
@given(st.lists(st.tuples(st.integers(0, len(UNARY) + len(BINARY)), st.integers(0, 20), st.integers(0, 20)),
                min_size=1, max_size=8))
@example(steps=[(4, 0, 0)])  # x * 1.5: the mul rule's unused gradient once made min-cut save x
def test_partitions_agree_and_min_cut_saves_no_more(steps):
    f = _program(steps)
    x = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    inputs = [x, w]
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(f, fakes), fakes, [True, True], mode)
    tangents = [torch.randn(o.meta["val"].shape, dtype=torch.float64)
                for o, d in zip(list(joint.gm.graph.nodes)[-1].args[0], joint.diff_outputs) if d]
    expected = joint.gm(inputs, tangents)
    default, min_cut = default_partition(joint), min_cut_partition(joint)
    for part in (default, min_cut):
        fw = part.fw_gm(*inputs)
        grads = part.bw_gm(*fw[joint.num_outputs:], *tangents)
        torch.testing.assert_close(list(fw[: joint.num_outputs]) + list(grads), list(expected), equal_nan=True)
    assert min_cut.saved_bytes <= default.saved_bytes


def test_min_cut_recomputes_only_cheap_ops():
    def f(x, w):
        h = (x @ w).tanh()
        return (h.exp() * h.sin()).sum(-1).mean() + h.amax()

    inputs = [torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)]
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(f, fakes), fakes, [True, True], mode)
    part = min_cut_partition(joint)
    fw_ops = {n.name for n in part.fw_gm.graph.nodes if n.op == "call_function"}
    recomputed = [n for n in part.bw_gm.graph.nodes if n.op == "call_function" and n.name in fw_ops]
    assert recomputed, "expected the backward to recompute something"
    assert all(is_recomputable(n) for n in recomputed), [str(n.target) for n in recomputed]
    assert part.saved_bytes < default_partition(joint).saved_bytes


def test_default_partition_saves_tensors_of_a_multi_output_op():
    """CPU flash attention returns (out, logsumexp); only out feeds the forward's result, the
    backward reads both: the default partitioner saves the two tensors, not the op's tuple
    (which no compiled graph can take as an input)."""
    import torch.nn.functional as F

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    inputs = [torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3)]
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(f, fakes), fakes, [True] * 3, mode)
    part = default_partition(joint)
    saved = [n for n in part.bw_gm.graph.nodes if n.op == "placeholder"]
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in saved), saved
    fw = part.fw_gm(*inputs)
    tangent = torch.randn(fw[0].shape)
    grads = part.bw_gm(*fw[joint.num_outputs:], tangent)
    expected = torch.autograd.grad(f(*inputs), inputs, tangent)
    torch.testing.assert_close(list(grads), list(expected))


def _post_norm_stack(layers: int):
    """A post-norm residual stream (BERT's): each layer norm's output feeds the next layer's matmul
    and, through the residual add, the next layer norm."""
    def f(x, *ws):
        h = x
        for w in ws:
            h = torch.nn.functional.layer_norm(h + torch.tanh(h @ w), (h.shape[-1],))
        return h.sum()
    inputs = [torch.randn(8, 16, requires_grad=True)] + [torch.randn(16, 16, requires_grad=True)
                                                          for _ in range(layers)]
    return f, inputs


def _recompute_depth(part) -> int:
    """The longest chain of values the backward recomputes that it also materialises for a matmul."""
    from tininductor.partitioners import is_materialized_backwards

    bw = part.bw_gm.graph
    fw_ops = {n.name for n in part.fw_gm.graph.nodes if n.op == "call_function"}
    backward = {n for n in bw.nodes if n.name not in fw_ops}
    depth: dict = {}
    for node in bw.nodes:  # in topological order
        if node.op != "call_function" or node.name not in fw_ops:
            continue
        below = max((depth.get(a, 0) for a in node.all_input_nodes), default=0)
        depth[node] = below + (1 if is_materialized_backwards(node, backward) else 0)
    return max(depth.values(), default=0)


def test_min_cut_breaks_chains_of_recomputed_materialized_values():
    """Recomputing a residual stream end to end fuses every layer's norm into one backward kernel
    (slow to compile, BERT-base: 9 s); min-cut saves each link instead, and stays correct."""
    import tininductor.partitioners as partitioners

    f, inputs = _post_norm_stack(6)
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(f, fakes), fakes, [True] * len(inputs), mode)
    part = min_cut_partition(joint)
    assert _recompute_depth(part) <= 1
    fw = part.fw_gm(*inputs)
    grads = part.bw_gm(*fw[joint.num_outputs:], torch.ones(()))
    torch.testing.assert_close(list(grads), list(torch.autograd.grad(f(*inputs), inputs)))
    # without the rule the backward rebuilds the stream: the chain is as long as the stack
    original = partitioners.chained_materializations
    partitioners.chained_materializations = lambda recomputable, backward: set()
    try:
        assert _recompute_depth(min_cut_partition(joint)) >= 5
    finally:
        partitioners.chained_materializations = original
    # and the rule costs one saved value per link, not every materialised value
    assert part.saved_bytes <= default_partition(joint).saved_bytes


def _pre_norm_stack(layers: int):
    """A pre-norm residual stream (GPT-2's): every layer adds its output to the stream."""
    def f(x, *ws):
        h = x
        for w in ws:
            h = h + torch.tanh(torch.nn.functional.layer_norm(h, (h.shape[-1],)) @ w)
        return h.sum()
    inputs = [torch.randn(8, 16, dtype=torch.float64, requires_grad=True)] + [
        torch.randn(16, 16, dtype=torch.float64, requires_grad=True) / 4 for _ in range(layers)]
    return f, inputs


def _recomputed(part):
    """The backward's ops that recompute forward values (they read no tangent), and the graph's nodes in order."""
    nodes = list(part.bw_gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    grads = set(placeholders[len(part.saved):])
    for node in nodes:
        if node.op == "call_function" and any(a in grads for a in node.all_input_nodes):
            grads.add(node)
    return [n for n in nodes if n.op == "call_function" and n not in grads], grads, nodes


def _longest_recompute_run(part) -> int:
    """The most cheap ops (pointwise, not views) the backward recomputes one after another."""
    from tininductor.partitioners import _VIEWS, _packet

    recomputed, _, nodes = _recomputed(part)
    recomputed, run = {n for n in recomputed if is_recomputable(n)}, {}
    for node in nodes:
        if node in recomputed:
            below = max((run.get(a, 0) for a in node.all_input_nodes), default=0)
            run[node] = below + (_packet(node) not in _VIEWS)
    return max(run.values(), default=0)


def test_min_cut_bounds_the_chains_it_recomputes():
    """Cut only by bytes, a pre-norm residual stream is recomputed in the backward from every layer's
    output, one add after another through all the layers (GPT-2 small: one 117-input kernel, 3.5 s
    of Triton compile); the min cut keeps every recomputed chain within MAX_RECOMPUTE_DEPTH ops."""
    import tininductor.partitioners as partitioners

    f, inputs = _pre_norm_stack(24)
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(f, fakes), fakes, [True] * len(inputs), mode)
    part = min_cut_partition(joint)
    assert _longest_recompute_run(part) <= partitioners.MAX_RECOMPUTE_DEPTH
    fw = part.fw_gm(*inputs)
    grads = part.bw_gm(*fw[joint.num_outputs:], torch.ones(()))
    torch.testing.assert_close(list(grads), list(torch.autograd.grad(f(*inputs), inputs)))
    original = partitioners.long_recompute_chains
    partitioners.long_recompute_chains = lambda *args, **kwargs: set()
    try:
        assert _longest_recompute_run(min_cut_partition(joint)) > partitioners.MAX_RECOMPUTE_DEPTH
    finally:
        partitioners.long_recompute_chains = original


def test_backward_recomputes_each_value_just_before_it_is_needed():
    """As the autograd engine would run it: the gradient ops in order, each recomputed value placed
    right before the first gradient op that needs it, not the whole recomputation up front (where the
    scheduler would fuse every layer's into one kernel, alive for the whole backward)."""
    import tininductor.partitioners as partitioners

    f, inputs = _pre_norm_stack(4)
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(f, fakes), fakes, [True] * len(inputs), mode)

    def misplaced(part) -> list[str]:
        recomputed, grads, nodes = _recomputed(part)
        position = {n: i for i, n in enumerate(nodes)}
        late = []
        for node in recomputed:
            needs = [u for u in node.users if u in grads or u.op == "output"]
            first_use = min((position[u] for u in node.users), default=len(nodes))
            gradient_ops_between = [n for n in nodes[position[node] + 1:first_use] if n in grads]
            if needs and gradient_ops_between:
                late.append(node.name)
        return late

    part = min_cut_partition(joint)
    assert _recomputed(part)[0], "expected the backward to recompute something"
    assert misplaced(part) == []
    fw = part.fw_gm(*inputs)
    grads = part.bw_gm(*fw[joint.num_outputs:], torch.ones(()))
    torch.testing.assert_close(list(grads), list(torch.autograd.grad(f(*inputs), inputs)))
    original = partitioners.recompute_where_used
    partitioners.recompute_where_used = lambda gm, num_saved: gm
    try:
        assert misplaced(min_cut_partition(joint)), "without the reordering, recomputation runs up front"
    finally:
        partitioners.recompute_where_used = original
